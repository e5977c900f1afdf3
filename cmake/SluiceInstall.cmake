# `cmake --install build/release` puts the headers, the libraries, the binary
# and a CMake package (find_package(sluice) -> sluice::sluice) in place.
include(CMakePackageConfigHelpers)

get_property(_sluice_libs GLOBAL PROPERTY SLUICE_LIBRARIES)
add_library(sluice_all INTERFACE)
add_library(sluice::sluice ALIAS sluice_all)
set_target_properties(sluice_all PROPERTIES EXPORT_NAME sluice)
target_link_libraries(sluice_all INTERFACE ${_sluice_libs})

install(TARGETS ${_sluice_libs} sluice_all EXPORT sluiceTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/sluice DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT sluiceTargets NAMESPACE sluice:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/sluice)

file(WRITE ${PROJECT_BINARY_DIR}/sluiceConfig.cmake.in [[
@PACKAGE_INIT@
include(CMakeFindDependencyMacro)
find_dependency(absl)
find_dependency(yaml-cpp)
find_dependency(Threads)
include("${CMAKE_CURRENT_LIST_DIR}/sluiceTargets.cmake")
]])
configure_package_config_file(${PROJECT_BINARY_DIR}/sluiceConfig.cmake.in
  ${PROJECT_BINARY_DIR}/sluiceConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/sluice)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/sluiceConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/sluiceConfig.cmake ${PROJECT_BINARY_DIR}/sluiceConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/sluice)
