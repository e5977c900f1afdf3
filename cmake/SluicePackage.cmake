# Debian packages, made by `cpack` in a build folder (docs/deploy.md):
#
#   cmake --build build/release && (cd build/release && cpack)
#
#   sluice_<version>_amd64.deb      the service: /usr/bin/sluice,
#                                   /etc/sluice/sluice.yaml (a conffile),
#                                   /lib/systemd/system/sluice.service, and the
#                                   docs and examples in /usr/share/doc/sluice
#   sluice-dev_<version>_amd64.deb  the library: headers, static libraries,
#                                   the CMake package and sluice.pc
#
# Two packages because they are for different machines: a host that runs
# the service needs no headers and no -dev packages, and a program built
# on the library needs no daemon. Each is one install component: "server"
# (apps/sluice and below) and "dev" (cmake/SluiceInstall.cmake).

# The service's files at absolute paths. EXCLUDE_FROM_ALL: a plain
# `cmake --install build/release --prefix DIR` leaves /etc and /lib alone;
# cpack (and `cmake --install ... --component server`) installs them.
install(FILES ${PROJECT_SOURCE_DIR}/examples/quickstart.yaml
        DESTINATION /etc/sluice RENAME sluice.yaml COMPONENT server EXCLUDE_FROM_ALL)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/sluice.service
        DESTINATION /lib/systemd/system COMPONENT server EXCLUDE_FROM_ALL)
# The docs as in the repository, so that README.md's links hold.
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT server)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs ${PROJECT_SOURCE_DIR}/examples
        DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT server
        PATTERN CMakeLists.txt EXCLUDE)

set(SLUICE_PACKAGE_CONTACT "sluice maintainers" CACHE STRING
    "The Maintainer field of the Debian packages")

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME sluice)
set(CPACK_PACKAGE_CONTACT "${SLUICE_PACKAGE_CONTACT}")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/packages)
set(CPACK_STRIP_FILES ON)

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL server dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # <name>_<version>_<arch>.deb

# The service. Its dependencies are the shared libraries the binary links,
# read by dpkg-shlibdeps (libsystemd0, libyaml-cpp0.7, libabsl20220623, ...;
# gRPC and protobuf are linked in, src/envoy/CMakeLists.txt).
set(CPACK_DEBIAN_SERVER_PACKAGE_NAME sluice)
set(CPACK_DEBIAN_SERVER_PACKAGE_SECTION net)
set(CPACK_DEBIAN_SERVER_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_SERVER_PACKAGE_CONTROL_EXTRA
    ${PROJECT_SOURCE_DIR}/packaging/deb/conffiles ${PROJECT_SOURCE_DIR}/packaging/deb/postinst
    ${PROJECT_SOURCE_DIR}/packaging/deb/prerm ${PROJECT_SOURCE_DIR}/packaging/deb/postrm)
set(CPACK_DEBIAN_SERVER_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# The synopsis of both is the project's description; these follow it.
set(CPACK_COMPONENT_SERVER_DESCRIPTION "The sluice binary, its config and its systemd unit.
sluice serve is an HTTP gateway and decision service (POST /v1/check,
NGINX auth_request, Prometheus metrics) and Envoy's rate limit and quota
service, with six exactly specified algorithms, its state in memory or in
Redis. A sandboxed systemd unit (Type=notify) serves /etc/sluice/sluice.yaml.")

# The library: static, so a program that links it needs the -dev packages
# of what it uses, as sluiceConfig.cmake and sluice.pc find them.
set(CPACK_DEBIAN_DEV_PACKAGE_NAME sluice-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
    "libabsl-dev, libyaml-cpp-dev, libboost-system-dev, libhiredis-dev, libssl-dev")
set(CPACK_COMPONENT_DEV_DESCRIPTION "The sluice library for C++20: headers and static libraries.
The algorithms as pure functions, an in-process store shared by all
threads, a Redis store, and a limiter that combines several limits on one
key. find_package(sluice) gives sluice::sluice; pkg-config sluice too.")

include(CPack)
