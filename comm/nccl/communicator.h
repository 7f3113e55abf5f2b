// NCCL backend: device memory, one CUDA stream per communicator, grouped
// (ncclGroupStart/End) multi-tensor calls. Compiled wherever CUDA and NCCL
// are present; usable only where a GPU and driver are.
#ifndef FUSEBOX_COMM_NCCL_COMMUNICATOR_H_
#define FUSEBOX_COMM_NCCL_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "comm/options.h"
#include "comm/store.h"

namespace fusebox::comm {

// OK when at least one CUDA device is usable; otherwise Unavailable with the
// reason (no driver: cudaErrorInsufficientDriver; no device). Tests use it to
// print SKIPPED.
absl::Status CudaAvailable();

// Rank 0 creates the ncclUniqueId and publishes it in `store` under
// "nccl/id/<n>", n counting this process's NCCL communicators on the store
// (so a second communicator never reads a stale id); every rank then calls
// ncclCommInitRank on options.device (or local_rank). No per-call descriptor
// check (it would cost a device round trip per call): NCCL itself hangs or
// fails on mismatched calls.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    const NcclOptions& options, int rank, int size, int local_rank,
    Store& store);

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_NCCL_COMMUNICATOR_H_
