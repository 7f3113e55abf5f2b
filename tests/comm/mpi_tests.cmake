# MPI backend: one gtest binary run under mpirun with 1..5 ranks (odd and
# prime sizes included; more ranks than cores need --oversubscribe).
if(FUSEBOX_WITH_MPI)
  add_executable(mpi_communicator_test mpi_communicator_test.cc)
  target_link_libraries(mpi_communicator_test PRIVATE
    fusebox::comm_mpi fusebox::comm_testing MPI::MPI_C GTest::gtest)
  foreach(_np 1 2 3 4 5)
    add_test(NAME mpi_communicator_np${_np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${_np} --oversubscribe
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:mpi_communicator_test>
              ${MPIEXEC_POSTFLAGS})
    set_tests_properties(mpi_communicator_np${_np} PROPERTIES
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
      TIMEOUT 300
      PROCESSORS ${_np}
      LABELS "mpi")
  endforeach()
endif()
