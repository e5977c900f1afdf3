# `cmake --install build/release` puts the headers, the libraries, the binary
# and a CMake package (find_package(sluice) -> sluice::sluice) in place.
# Everything here is the install component "dev" (the sluice-dev package,
# cmake/SluicePackage.cmake); the binary is "server".
include(CMakePackageConfigHelpers)

get_property(_sluice_libs GLOBAL PROPERTY SLUICE_LIBRARIES)
add_library(sluice_all INTERFACE)
add_library(sluice::sluice ALIAS sluice_all)
set_target_properties(sluice_all PROPERTIES EXPORT_NAME sluice)
target_link_libraries(sluice_all INTERFACE ${_sluice_libs})

install(TARGETS ${_sluice_libs} sluice_all EXPORT sluiceTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/sluice DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT dev)
install(EXPORT sluiceTargets NAMESPACE sluice:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/sluice
        COMPONENT dev)

file(WRITE ${PROJECT_BINARY_DIR}/sluiceConfig.cmake.in [[
@PACKAGE_INIT@
include(CMakeFindDependencyMacro)
find_dependency(absl)
find_dependency(yaml-cpp)
find_dependency(Threads)
find_dependency(Boost 1.74 COMPONENTS system)  # Asio, in the Redis store's client
include("${CMAKE_CURRENT_LIST_DIR}/sluiceTargets.cmake")
]])
configure_package_config_file(${PROJECT_BINARY_DIR}/sluiceConfig.cmake.in
  ${PROJECT_BINARY_DIR}/sluiceConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/sluice)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/sluiceConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/sluiceConfig.cmake ${PROJECT_BINARY_DIR}/sluiceConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/sluice COMPONENT dev)

# sluice.pc, for builds that use pkg-config rather than CMake:
#   c++ -std=c++20 app.cc $(pkg-config --cflags --libs sluice)
# The libraries are static, so every dependency goes in Libs / Requires (not
# the .private fields, which `pkg-config --libs` leaves out). They are
# listed dependents first, the order a static link needs: each sluice
# library only links those defined before it, so the reverse of the
# definition order is such an order. The third-party dependencies are read
# from the targets and named by their Debian .pc files.
set(_pc_libs)
set(_pc_requires)
set(_pc_extra)
set(_pc_seen)
foreach(_lib IN LISTS _sluice_libs)
  get_target_property(_name ${_lib} OUTPUT_NAME)
  list(PREPEND _pc_libs "-l${_name}")
  get_target_property(_deps ${_lib} INTERFACE_LINK_LIBRARIES)
  foreach(_dep IN LISTS _deps)
    if(_dep MATCHES "^sluice" OR _dep IN_LIST _pc_seen)
      continue()
    endif()
    list(APPEND _pc_seen ${_dep})
    if(_dep MATCHES "^absl::(.+)$")
      list(APPEND _pc_requires "absl_${CMAKE_MATCH_1}")
    elseif(_dep MATCHES "^PkgConfig::(.+)$")
      list(APPEND _pc_requires "${CMAKE_MATCH_1}")
    elseif(_dep MATCHES "^\\$<BUILD_INTERFACE:PkgConfig::(.+)>$")
      list(APPEND _pc_requires "${CMAKE_MATCH_1}")  # hiredis: linked by name once installed
    elseif(_dep MATCHES "^\\$<INSTALL_INTERFACE:")
      continue()
    elseif(_dep MATCHES "^(yaml-cpp|spdlog::spdlog|nlohmann_json::nlohmann_json)$")
      string(REGEX REPLACE "::.*" "" _pc_name "${_dep}")
      list(APPEND _pc_requires "${_pc_name}")
    elseif(_dep STREQUAL "Threads::Threads")
      list(APPEND _pc_extra "-pthread")
    elseif(_dep MATCHES "^Boost::(.+)$")
      list(APPEND _pc_extra "-lboost_${CMAKE_MATCH_1}")  # Debian ships no .pc for Boost
    else()
      message(WARNING "sluice.pc: no pkg-config name known for ${_dep} (a dependency of ${_lib})")
    endif()
  endforeach()
endforeach()
list(REMOVE_DUPLICATES _pc_requires)
list(REMOVE_DUPLICATES _pc_extra)
list(JOIN _pc_libs " " SLUICE_PC_LIBS)
list(JOIN _pc_requires ", " SLUICE_PC_REQUIRES)
list(JOIN _pc_extra " " SLUICE_PC_EXTRA)
# Relative to the .pc file, so an install moved elsewhere still works.
file(RELATIVE_PATH SLUICE_PC_PREFIX "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
string(REGEX REPLACE "/$" "" SLUICE_PC_PREFIX "${SLUICE_PC_PREFIX}")
file(WRITE ${PROJECT_BINARY_DIR}/sluice.pc.in [[
prefix=${pcfiledir}/@SLUICE_PC_PREFIX@
includedir=${prefix}/@CMAKE_INSTALL_INCLUDEDIR@
libdir=${prefix}/@CMAKE_INSTALL_LIBDIR@

Name: sluice
Description: @PROJECT_DESCRIPTION@ (C++20: compile with -std=c++20)
Version: @PROJECT_VERSION@
Requires: @SLUICE_PC_REQUIRES@
Cflags: -I${includedir}
Libs: -L${libdir} @SLUICE_PC_LIBS@ @SLUICE_PC_EXTRA@
]])
configure_file(${PROJECT_BINARY_DIR}/sluice.pc.in ${PROJECT_BINARY_DIR}/sluice.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/sluice.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
        COMPONENT dev)
