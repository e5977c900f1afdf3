# sluice_library(NAME name [FOLDER folder] SOURCES ... DEPS ... [INTERNAL] [FUZZED] [COLD]): one
# static library per layer, exported as sluice::<name>, with the public headers
# under include/.
# FOLDER: the layer's folder under src/ (docs/design.md's layer table). The
# library and whatever links it see include/ and that folder, as
# "folder/header.h", and nothing else of src/: a header of a layer the
# library does not link is not found. (The folder's headers are reached
# through <build>/layers/<name>/<folder>/, a link to each; the folders of
# other layers below it, such as store/memory under store, are not.) Without FOLDER
# (the fuzz targets' libraries, above every layer) the library sees all of
# src/.
# FUZZED: it parses outside input, and with SLUICE_FUZZ it is compiled with
# the fuzzer's coverage (fuzz/). The rest (the algorithms, the stores, the
# limiter) runs in the fuzz targets without it: coverage hooks on every
# comparison would slow their hot loops in the tests of the same build.
# COLD: parsing and wiring, no hot loop: in the sanitizer builds it is
# compiled at -O0, in about half the time of -O1 (the sanitizers check it
# the same). Not where the fuzzers run it (FUZZED with SLUICE_FUZZ): at -O0
# they ran 3 to 9 times fewer inputs a second. The layers with hot loops
# (the algorithms, the stores, the limiter and the Redis client, which the
# load tests drive) keep the preset's -O1: the Redis layers at -O0 made the
# ASan suite about a quarter slower. The server is cold: at -O0 it builds in
# half the time and the suites that drive it took no longer (measured).
function(sluice_library)
  cmake_parse_arguments(ARG "INTERNAL;FUZZED;COLD" "NAME;FOLDER" "SOURCES;DEPS" ${ARGN})
  add_library(sluice_${ARG_NAME} STATIC ${ARG_SOURCES})
  add_library(sluice::${ARG_NAME} ALIAS sluice_${ARG_NAME})
  set_target_properties(sluice_${ARG_NAME} PROPERTIES EXPORT_NAME ${ARG_NAME} OUTPUT_NAME sluice_${ARG_NAME})
  target_include_directories(sluice_${ARG_NAME} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  if(ARG_FOLDER)
    set(_root ${PROJECT_BINARY_DIR}/layers/${ARG_NAME})
    file(REMOVE_RECURSE ${_root})
    file(MAKE_DIRECTORY ${_root}/${ARG_FOLDER})
    # A header added to the folder configures again.
    file(GLOB _headers CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/${ARG_FOLDER}/*.h)
    foreach(_h IN LISTS _headers)
      cmake_path(GET _h FILENAME _name)
      file(CREATE_LINK ${_h} ${_root}/${ARG_FOLDER}/${_name} SYMBOLIC)
    endforeach()
    target_include_directories(sluice_${ARG_NAME} PUBLIC $<BUILD_INTERFACE:${_root}>)
  else()
    target_include_directories(sluice_${ARG_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/src)
  endif()
  target_link_libraries(sluice_${ARG_NAME} PUBLIC ${ARG_DEPS})
  if(SLUICE_FUZZ AND ARG_FUZZED)
    # Coverage counters and comparison hooks for libFuzzer; in the tests,
    # which do not link libFuzzer, the sanitizer runtime's empty hooks.
    target_compile_options(sluice_${ARG_NAME} PRIVATE -fsanitize=fuzzer-no-link)
  endif()
  if(ARG_COLD AND NOT (SLUICE_FUZZ AND ARG_FUZZED))
    sluice_cold(sluice_${ARG_NAME})
  endif()
  if(NOT ARG_INTERNAL)  # INTERNAL: part of the binary, not of the installed library
    set_property(GLOBAL APPEND PROPERTY SLUICE_LIBRARIES sluice_${ARG_NAME})
  endif()
endfunction()

# sluice_cold(target): COLD above, for an executable too.
function(sluice_cold target)
  if(SLUICE_SANITIZE)
    target_compile_options(${target} PRIVATE -O0)
  endif()
endfunction()

# sluice_test_pch: GoogleTest, gMock, the standard library and absl's Status
# precompiled once, with the options of the tests' own code (-O0), for every
# test that reuses it: they are most of what a test unit parses (about 2 of
# its 2.5 s at -O0).
function(_sluice_test_pch)
  if(TARGET sluice_test_pch)
    return()
  endif()
  set(_source ${PROJECT_BINARY_DIR}/sluice_test_pch.cc)
  # An executable, as the tests are (the header is compiled as position
  # independent executable code).
  file(WRITE ${_source} "// The tests' precompiled header (cmake/SluiceTargets.cmake).\nint main() {}\n")
  add_executable(sluice_test_pch ${_source})
  target_link_libraries(sluice_test_pch PRIVATE GTest::gtest GTest::gmock absl::statusor)
  target_compile_options(sluice_test_pch PRIVATE -Wno-missing-field-initializers -O0 -pthread)
  target_precompile_headers(sluice_test_pch PRIVATE
    <gtest/gtest.h> <gmock/gmock.h> <absl/status/statusor.h>
    <algorithm> <array> <atomic> <chrono> <cstdint> <cstdio> <cstring> <deque> <fstream>
    <functional> <map> <memory> <mutex> <optional> <string> <string_view> <thread>
    <utility> <variant> <vector>)
endfunction()

# sluice_test(NAME name SOURCES ... DEPS ... [LABELS ...] [SHARDS n] [OPTIMIZED]): a
# GoogleTest binary, registered with ctest as one test that runs all of it.
# (One ctest test per GoogleTest case started a process per case, and the
# suites' fixtures, a redis-server among them, once per case: under ASan
# that was about half of the suite's CPU time.) `NAME --gtest_filter=...`
# runs a part.
# SHARDS n: a long binary, started before the short tests (COST) so that it
# does not finish the suite alone; with n > 1, run as n ctest tests name.0 ..
# name.<n-1>, each a GoogleTest shard (GTEST_TOTAL_SHARDS, GTEST_SHARD_INDEX).
# OPTIMIZED: its own code is compiled as the preset says (a test whose own
# loops are hot), not at -O0.
function(sluice_test)
  cmake_parse_arguments(ARG "OPTIMIZED" "NAME;SHARDS" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  # Its layers' folders come with the libraries it links (FOLDER above).
  target_include_directories(${ARG_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  # Tests write options as designated initializers that leave the other
  # fields to their defaults ({.url = ..., .timeout = ...}), which GCC 12
  # warns about.
  target_compile_options(${ARG_NAME} PRIVATE -Wno-missing-field-initializers)
  # The tests' own code at -O0 in every preset: it is about half of what a
  # build compiles, and at -O0 it compiles in up to half the time of -O1;
  # the code under test is still compiled as the preset says.
  if(NOT ARG_OPTIMIZED)
    # -pthread as some dependencies ask for it: the precompiled header
    # must be compiled with it.
    target_compile_options(${ARG_NAME} PRIVATE -O0 -pthread)
    # The headers every test parses, parsed once per build (sluice_test_pch).
    _sluice_test_pch()
    target_precompile_headers(${ARG_NAME} REUSE_FROM sluice_test_pch)
  endif()
  if(ARG_SHARDS GREATER 1)
    set(_tests)
    math(EXPR _last "${ARG_SHARDS} - 1")
    foreach(_i RANGE ${_last})
      add_test(NAME ${ARG_NAME}.${_i} COMMAND ${ARG_NAME})
      set_tests_properties(${ARG_NAME}.${_i} PROPERTIES
        ENVIRONMENT "GTEST_TOTAL_SHARDS=${ARG_SHARDS};GTEST_SHARD_INDEX=${_i}")
      list(APPEND _tests ${ARG_NAME}.${_i})
    endforeach()
  else()
    add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME})
    set(_tests ${ARG_NAME})
  endif()
  if(ARG_LABELS)
    set_tests_properties(${_tests} PROPERTIES LABELS "${ARG_LABELS}")
  endif()
  if(ARG_SHARDS)
    set_tests_properties(${_tests} PROPERTIES COST 100)
  endif()
  if("concurrency" IN_LIST ARG_LABELS)
    # `cmake --build ... --target concurrency_tests` builds what TSan runs.
    if(NOT TARGET concurrency_tests)
      add_custom_target(concurrency_tests)
    endif()
    add_dependencies(concurrency_tests ${ARG_NAME})
  endif()
endfunction()
