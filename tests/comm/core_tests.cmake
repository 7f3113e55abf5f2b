add_executable(comm_core_test
  ${CMAKE_CURRENT_SOURCE_DIR}/async_core_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/front_door_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/host_pages_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/log_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/types_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/reduce_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/thread_sched_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/work_test.cc)
target_link_libraries(comm_core_test PRIVATE fusebox::comm_testing GTest::gmock GTest::gtest_main)
gtest_discover_tests(comm_core_test DISCOVERY_TIMEOUT 60)

# The device seam on the emulated device (comm/device.h): ordering rules
# under delays that expose a missing event.
add_executable(device_emulated_test ${CMAKE_CURRENT_SOURCE_DIR}/device_test.cc)
target_link_libraries(device_emulated_test PRIVATE fusebox::comm GTest::gmock GTest::gtest_main)
gtest_discover_tests(device_emulated_test DISCOVERY_TIMEOUT 60
  PROPERTIES TIMEOUT 120 LABELS device-emulated)

if(FUSEBOX_WITH_UCX)
  add_executable(ucx_communicator_test ${CMAKE_CURRENT_SOURCE_DIR}/ucx_communicator_test.cc)
  target_link_libraries(ucx_communicator_test PRIVATE
    fusebox::comm_ucx fusebox::comm_testing GTest::gtest_main)
  target_include_directories(ucx_communicator_test PRIVATE ${PROJECT_SOURCE_DIR})
  gtest_discover_tests(ucx_communicator_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300)

  # The UCX channel alone (comm/ucx/channel.h): tags, deadlines, notices.
  add_executable(ucx_channel_test ${CMAKE_CURRENT_SOURCE_DIR}/ucx_channel_test.cc)
  target_link_libraries(ucx_channel_test PRIVATE fusebox::comm_ucx ucx::ucp ucx::ucs
    GTest::gtest_main)
  target_include_directories(ucx_channel_test PRIVATE ${PROJECT_SOURCE_DIR})
  gtest_discover_tests(ucx_channel_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 120)

  # The descriptor round on bare channels (comm/ucx/descriptor_round.h).
  add_executable(ucx_descriptor_round_test ${CMAKE_CURRENT_SOURCE_DIR}/ucx_descriptor_round_test.cc)
  target_link_libraries(ucx_descriptor_round_test PRIVATE fusebox::comm_ucx ucx::ucp ucx::ucs
    GTest::gtest_main)
  target_include_directories(ucx_descriptor_round_test PRIVATE ${PROJECT_SOURCE_DIR})
  gtest_discover_tests(ucx_descriptor_round_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 120)

  # The measured choice of algorithm (comm/ucx/measured_choice.h): its
  # schedule and decisions alone, then over real UCX.
  add_executable(ucx_measured_choice_test ${CMAKE_CURRENT_SOURCE_DIR}/ucx_measured_choice_test.cc)
  target_link_libraries(ucx_measured_choice_test PRIVATE fusebox::comm_ucx fusebox::comm_testing
    GTest::gtest_main)
  target_include_directories(ucx_measured_choice_test PRIVATE ${PROJECT_SOURCE_DIR})
  gtest_discover_tests(ucx_measured_choice_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300)
endif()

# Real multi-process runs: one process per rank, under fusebox-run (TCP
# rendezvous) and under mpirun (MPI rendezvous), world sizes 1..5.
add_executable(comm_multiprocess_test ${CMAKE_CURRENT_SOURCE_DIR}/multiprocess_test.cc)
target_link_libraries(comm_multiprocess_test PRIVATE fusebox::comm_backends fusebox::comm_testing)
if(FUSEBOX_WITH_UCX)
  foreach(_n 1 2 3 4 5)
    add_test(NAME MultiProcess.UcxUnderFuseboxRunNp${_n}
             COMMAND fusebox-run -n ${_n} -- $<TARGET_FILE:comm_multiprocess_test> --backend=ucx)
    set_tests_properties(MultiProcess.UcxUnderFuseboxRunNp${_n} PROPERTIES TIMEOUT 300 LABELS multiprocess)
    if(FUSEBOX_WITH_MPI)
      add_test(NAME MultiProcess.UcxUnderMpirunNp${_n}
               COMMAND ${MPIEXEC_EXECUTABLE} -n ${_n} --oversubscribe
                       $<TARGET_FILE:comm_multiprocess_test> --backend=ucx)
      set_tests_properties(MultiProcess.UcxUnderMpirunNp${_n} PROPERTIES TIMEOUT 300 LABELS "multiprocess;mpi"
        ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
    endif()
  endforeach()
  # Note [Single-copy allreduce]: one rank refuses cross-memory reads (a
  # seccomp filter, as in a container): every rank stages, and is exact.
  add_test(NAME MultiProcess.UcxSingleCopyRefusedOnOneRankNp3
           COMMAND fusebox-run -n 3 -- $<TARGET_FILE:comm_multiprocess_test> --backend=ucx
                   --refuse-cma-on-rank=1 --expect-single-copy=off)
  set_tests_properties(MultiProcess.UcxSingleCopyRefusedOnOneRankNp3 PROPERTIES TIMEOUT 300
                       LABELS multiprocess)
endif()

if(FUSEBOX_WITH_UCX)
  add_executable(shm_allreduce_test ${CMAKE_CURRENT_SOURCE_DIR}/shm_allreduce_test.cc)
  target_link_libraries(shm_allreduce_test PRIVATE fusebox::comm_ucx fusebox::comm_testing GTest::gtest_main)
  gtest_discover_tests(shm_allreduce_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300)
  # Note [Algorithm table]: the UCX backend's choice of algorithm (pure).
  add_executable(ucx_algorithms_test ${CMAKE_CURRENT_SOURCE_DIR}/ucx_algorithms_test.cc)
  target_link_libraries(ucx_algorithms_test PRIVATE fusebox::comm_ucx ucx::ucp ucx::ucs GTest::gmock
    GTest::gtest_main)
  gtest_discover_tests(ucx_algorithms_test DISCOVERY_TIMEOUT 60)
  # Note [Algorithm units]: the units' registration, and the table they
  # build against the one recorded before them.
  add_executable(ucx_algorithm_units_test ${CMAKE_CURRENT_SOURCE_DIR}/ucx_algorithm_units_test.cc)
  target_link_libraries(ucx_algorithm_units_test PRIVATE fusebox::comm_ucx ucx::ucp ucx::ucs
    GTest::gtest_main)
  target_include_directories(ucx_algorithm_units_test PRIVATE ${PROJECT_SOURCE_DIR})
  gtest_discover_tests(ucx_algorithm_units_test DISCOVERY_TIMEOUT 60)
endif()

# The in-process loopback communicator the tests above the communication
# layer run on (comm/testing/loopback.h).
add_executable(comm_loopback_test ${CMAKE_CURRENT_SOURCE_DIR}/loopback_test.cc)
target_link_libraries(comm_loopback_test PRIVATE fusebox::comm_testing GTest::gmock GTest::gtest_main)
target_include_directories(comm_loopback_test PRIVATE ${PROJECT_SOURCE_DIR})
gtest_discover_tests(comm_loopback_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 120)
