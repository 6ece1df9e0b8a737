# ctest fixture: regenerate the random-weight test models if ../shared is present.
# Without shared data it succeeds with a message (the tests that need the data then skip),
# except under CI=true, where missing data is an error.
if(NOT EXISTS "${SHARED}/tools/make_test_models.sh")
  if("$ENV{CI}" STREQUAL "true")
    message(FATAL_ERROR "CI=true but the shared test data is missing at ${SHARED}")
  endif()
  message(STATUS "shared test data not found at ${SHARED}: model tests will skip")
  return()
endif()
execute_process(COMMAND bash "${SHARED}/tools/make_test_models.sh" "${OUT}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "make_test_models.sh failed (${rc})")
endif()
