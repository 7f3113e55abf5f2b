#include "comm/backends.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fusebox/config.h"

#if FUSEBOX_WITH_UCX
#include "comm/ucx/communicator.h"
#endif
#if FUSEBOX_WITH_MPI
#include "comm/mpi/communicator.h"
#endif
#if FUSEBOX_WITH_NCCL
#include "comm/nccl/communicator.h"
#endif

namespace fusebox::comm {

std::vector<std::string> AvailableBackends() {
  std::vector<std::string> out;
#if FUSEBOX_WITH_UCX
  out.push_back("ucx");
#endif
#if FUSEBOX_WITH_MPI
  out.push_back("mpi");
#endif
#if FUSEBOX_WITH_NCCL
  out.push_back("nccl");
#endif
  return out;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    absl::string_view backend, const BackendOptions& options, Rendezvous& rdv) {
#if FUSEBOX_WITH_UCX
  if (backend == "ucx") {
    return CreateUcxCommunicator(options.ucx, rdv.rank, rdv.size, *rdv.store);
  }
#endif
#if FUSEBOX_WITH_MPI
  if (backend == "mpi") return CreateMpiCommunicator(options.mpi);
#endif
#if FUSEBOX_WITH_NCCL
  if (backend == "nccl") {
    return CreateNcclCommunicator(options.nccl, rdv.rank, rdv.size,
                                  rdv.local_rank, *rdv.store);
  }
#endif
  return absl::UnimplementedError(
      absl::StrCat("backend '", backend, "' is not available in this build (have: ",
                   absl::StrJoin(AvailableBackends(), ", "), ")"));
}

}  // namespace fusebox::comm
