// UCX backend: host memory, UCP tag messaging, collectives of fusebox's own
// (ring reduce-scatter + allgather pipelined in chunks for large messages,
// recursive doubling for small ones), progressed by one thread per
// communicator so the caller never blocks.
#ifndef FUSEBOX_COMM_UCX_COMMUNICATOR_H_
#define FUSEBOX_COMM_UCX_COMMUNICATOR_H_

#include <memory>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "comm/options.h"
#include "comm/store.h"

namespace fusebox::comm {

// Creates this rank's UCP context and worker, exchanges worker addresses
// through `store` (keys under "ucx/"), and connects to every peer. Blocks
// until all `size` ranks have arrived or options.rendezvous_timeout passes
// (the error names the missing ranks). `store` must outlive the
// communicator: a collective that times out (options.timeout) uses it again
// to find out which ranks are gone (Note [Timeout post-mortem]). A failed
// collective leaves the communicator unusable: every later call returns
// FailedPrecondition with the first error; destroying it is the abort path
// (in-flight work is cancelled, endpoints are closed without waiting on
// peers that may be gone, the worker and context are torn down).
absl::StatusOr<std::unique_ptr<Communicator>> CreateUcxCommunicator(
    const UcxOptions& options, int rank, int size, Store& store);

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_UCX_COMMUNICATOR_H_
