# ctest driver: install the build tree to a scratch prefix, then compile and
# run tests/consumer/main.cc with nothing but the compiler and
#   pkg-config --cflags --libs sluice
# -D BUILD_DIR=... -D SOURCE=.../main.cc -D WORK_DIR=... -D LIBDIR=... -D CXX=...
file(REMOVE_RECURSE "${WORK_DIR}")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix"
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed: ${rc}")
endif()
set(ENV{PKG_CONFIG_PATH} "${WORK_DIR}/prefix/${LIBDIR}/pkgconfig")
execute_process(COMMAND pkg-config --cflags --libs sluice
                OUTPUT_VARIABLE flags ERROR_VARIABLE error RESULT_VARIABLE rc
                OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config --cflags --libs sluice failed: ${error}")
endif()
message(STATUS "pkg-config --cflags --libs sluice: ${flags}")
separate_arguments(flags UNIX_COMMAND "${flags}")
execute_process(COMMAND ${CXX} -std=c++20 -O1 "${SOURCE}" ${flags} -o "${WORK_DIR}/consumer"
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "compiling the consumer with pkg-config's flags failed: ${rc}")
endif()
execute_process(COMMAND "${WORK_DIR}/consumer" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the consumer failed: ${rc}")
endif()
