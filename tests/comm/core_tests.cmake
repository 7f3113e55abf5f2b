add_executable(comm_core_test
  ${CMAKE_CURRENT_SOURCE_DIR}/types_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/reduce_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/work_test.cc)
target_link_libraries(comm_core_test PRIVATE fusebox::comm_testing GTest::gtest_main)
gtest_discover_tests(comm_core_test DISCOVERY_TIMEOUT 60)

if(FUSEBOX_WITH_UCX)
  add_executable(ucx_communicator_test ${CMAKE_CURRENT_SOURCE_DIR}/ucx_communicator_test.cc)
  target_link_libraries(ucx_communicator_test PRIVATE
    fusebox::comm_ucx fusebox::comm_testing GTest::gtest_main)
  gtest_discover_tests(ucx_communicator_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300)
endif()
