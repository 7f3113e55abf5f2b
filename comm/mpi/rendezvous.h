// Rendezvous under mpirun: rank 0 starts a TCP store server on a free port,
// MPI_Bcast's its address, and every rank connects, so that backends that
// rendezvous through a Store (UCX, NCCL) also work under mpirun.
#ifndef FUSEBOX_COMM_MPI_RENDEZVOUS_H_
#define FUSEBOX_COMM_MPI_RENDEZVOUS_H_

#include "absl/status/statusor.h"
#include "comm/rendezvous.h"

namespace fusebox::comm {

// Requires InitMpi. Collective over MPI_COMM_WORLD.
absl::StatusOr<Rendezvous> ConnectMpiRendezvous(absl::Duration timeout);

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_MPI_RENDEZVOUS_H_
