# NCCL backend: single-process tests; each prints "SKIPPED: <reason>" and
# skips where no GPU or driver is present (e.g. the build machines).
if(FUSEBOX_WITH_NCCL)
  add_executable(nccl_communicator_test nccl_communicator_test.cc)
  target_include_directories(nccl_communicator_test PRIVATE ${NCCL_INCLUDE_DIR})
  target_link_libraries(nccl_communicator_test PRIVATE
    fusebox::comm_nccl fusebox::comm_testing CUDA::cudart GTest::gtest_main)
  gtest_discover_tests(nccl_communicator_test
    PROPERTIES SKIP_REGULAR_EXPRESSION "SKIPPED" LABELS "gpu")
  # The device seam on CUDA (the emulated device's rules, on a real GPU).
  add_executable(cuda_device_test cuda_device_test.cc)
  target_link_libraries(cuda_device_test PRIVATE fusebox::comm_nccl GTest::gtest_main)
  gtest_discover_tests(cuda_device_test
    PROPERTIES SKIP_REGULAR_EXPRESSION "SKIPPED" LABELS "gpu")
endif()
