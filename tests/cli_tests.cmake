# End-to-end CLI tests (python3, stdlib only).
find_package(Python3 REQUIRED COMPONENTS Interpreter)
add_test(NAME cli_run
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/cli/cli_test.py $<TARGET_FILE:kvfs>
          ${KVFS_SHARED_DIR} ${CMAKE_BINARY_DIR}/testmodels)
set_tests_properties(cli_run PROPERTIES FIXTURES_REQUIRED test_models)
add_test(NAME cli_perplexity
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/cli/perplexity_test.py $<TARGET_FILE:kvfs>
          ${KVFS_SHARED_DIR})

# kv.safetensors seen by an independent reader: a test-only program writes f16/q8/q4/q4k exports
# whose values follow a closed form, then check_safetensors.py (stdlib only) validates the
# container, the tensor set and shapes, every element, and a few values at offsets it computes.
add_executable(make_safetensors_sample ${CMAKE_CURRENT_SOURCE_DIR}/store/make_safetensors_sample.cpp)
target_link_libraries(make_safetensors_sample PRIVATE kvfs_engine)
set(KVFS_ST_SAMPLES ${CMAKE_BINARY_DIR}/safetensors_samples)
add_test(NAME safetensors_sample_export
  COMMAND $<TARGET_FILE:make_safetensors_sample> ${KVFS_ST_SAMPLES})
set_tests_properties(safetensors_sample_export PROPERTIES FIXTURES_SETUP safetensors_samples)
set(KVFS_ST_EXPECT_q4 --expect layers.1.v.scales 3,1 7.1875 --expect layers.0.k.mins 4,0 -0.25
                      --expect layers.1.k.codes 2,1,3 66)
set(KVFS_ST_EXPECT_q8 --expect layers.0.v.codes 1,1,5 63 --expect layers.1.k.scales 0,1 5)
set(KVFS_ST_EXPECT_f16 --expect layers.1.v 4,1,7 9.25)
set(KVFS_ST_EXPECT_q4k --expect layers.1.k.staged 1,1,3 7.0625 --expect layers.1.k.mins 1,5 -5.0625
                       --expect layers.0.v.sub_fields 9,0,4 92 --expect layers.0.k.codes 1,2,1 22)
foreach(type f16 q8 q4 q4k)
  add_test(NAME safetensors_python_check_${type}
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/store/check_safetensors.py
            ${KVFS_ST_SAMPLES}/${type}.safetensors --pattern ${KVFS_ST_EXPECT_${type}})
  set_tests_properties(safetensors_python_check_${type} PROPERTIES FIXTURES_REQUIRED safetensors_samples)
endforeach()
