# End-to-end CLI tests (python3, stdlib only).
find_package(Python3 REQUIRED COMPONENTS Interpreter)
add_test(NAME cli_run
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/cli/cli_test.py $<TARGET_FILE:kvfs>
          ${KVFS_SHARED_DIR} ${CMAKE_BINARY_DIR}/testmodels)
set_tests_properties(cli_run PROPERTIES FIXTURES_REQUIRED test_models)
add_test(NAME cli_perplexity
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/cli/perplexity_test.py $<TARGET_FILE:kvfs>
          ${KVFS_SHARED_DIR})
