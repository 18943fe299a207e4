# Helpers: one function per kind of target, so every module is built the same way.

set(GRANARY_WARNINGS -Wall -Wextra)

# granary_library(NAME SOURCES ... DEPS ...): a static library for one module.
function(granary_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_compile_options(${name} PRIVATE ${GRANARY_WARNINGS})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  # Every module's locks are annotated (common/thread_annotations.h): with GRANARY_THREAD_SAFETY,
  # clang checks them as errors (scripts/thread-safety.sh).
  if(GRANARY_THREAD_SAFETY)
    target_compile_options(${name} PRIVATE -Wthread-safety -Werror=thread-safety)
  endif()
endfunction()

# granary_binary(NAME SOURCES ... DEPS ...): a thin executable.
function(granary_binary name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_compile_options(${name} PRIVATE ${GRANARY_WARNINGS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
endfunction()

# granary_test(NAME SOURCES ... DEPS ... [LABELS ...]): a GoogleTest binary registered with ctest.
function(granary_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_compile_options(${name} PRIVATE ${GRANARY_WARNINGS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${ARG_LABELS}"
    ENVIRONMENT "GRANARY_BIN_DIR=${PROJECT_BINARY_DIR}/bin;GRANARY_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endfunction()

set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
