// Creates a communicator by backend name over a connected rendezvous.
#ifndef FUSEBOX_COMM_BACKENDS_H_
#define FUSEBOX_COMM_BACKENDS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/communicator.h"
#include "comm/options.h"
#include "comm/rendezvous.h"

namespace fusebox::comm {

// Backends compiled into this build ("ucx", "mpi", "nccl").
std::vector<std::string> AvailableBackends();

// `backend` is "ucx", "mpi" or "nccl". The MPI backend ignores `rdv` (it
// uses MPI_COMM_WORLD; MPI must be initialised). Unimplemented names the
// backends this build has.
absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    absl::string_view backend, const BackendOptions& options, Rendezvous& rdv);

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_BACKENDS_H_
