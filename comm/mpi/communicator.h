// MPI backend: host memory, OpenMPI non-blocking collectives
// (MPI_Iallreduce, MPI_Ibcast, MPI_Iallgather; Barrier is the descriptor
// check itself, an MPI_Iallreduce every rank must join) on a duplicate
// of MPI_COMM_WORLD, issued and tested by one progress thread per
// communicator. The baseline, and the usual way to run under mpirun.
#ifndef FUSEBOX_COMM_MPI_COMMUNICATOR_H_
#define FUSEBOX_COMM_MPI_COMMUNICATOR_H_

#include <memory>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "comm/options.h"
#include "comm/store.h"

namespace fusebox::comm {

// Initialises MPI with MPI_THREAD_SERIALIZED (or better) unless it already
// is; an error if the library cannot give that level. Call at an edge.
absl::Status InitMpi(int* argc, char*** argv);
// Finalises MPI if InitMpi initialised it and it is not finalised yet.
void FinalizeMpi();
// True when this process was started by mpirun (OMPI_COMM_WORLD_SIZE set) --
// decided by the caller from its environment; this only inspects MPI state.
bool MpiIsInitialized();

// Collective over MPI_COMM_WORLD. A collective that some rank does not join
// within options.timeout fails with DeadlineExceeded; `store` (may be null;
// if given it must outlive the communicator) lets that error say which ranks
// are gone (Note [Timeout post-mortem] in comm/fault.h). After any failure
// every later call returns FailedPrecondition: recreate the communicator
// (MPI cannot cancel a collective, so the buffers of those that were in
// flight may still be written; the process should report and exit).
absl::StatusOr<std::unique_ptr<Communicator>> CreateMpiCommunicator(
    const MpiOptions& options, Store* store = nullptr);

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_MPI_COMMUNICATOR_H_
