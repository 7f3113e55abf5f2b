// The UCX backend's shared-memory segments (Note [UCX shared-memory
// allreduce] in shm_allreduce.h), set up collectively at Init: each rank
// allocates its segment with ucp_mem_map(ALLOCATE), publishes it as a
// packed rkey, and maps every peer's with ucp_rkey_ptr (UCX's sysv memory
// domain). The segments carry the shared-memory allreduce and, where the
// mailboxes fit, the header round (Note [Shared-memory exchange]).
#ifndef FUSEBOX_COMM_UCX_SHM_SETUP_H_
#define FUSEBOX_COMM_UCX_SHM_SETUP_H_

#include <ucp/api/ucp.h>

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "comm/options.h"
#include "comm/store.h"
#include "comm/ucx/channel.h"
#include "comm/ucx/shm_allreduce.h"

namespace fusebox::comm::ucx {

// This rank's segment and its keys to its peers' (raw handles, released by
// the communicator in UCX's order: the keys before the endpoints close, the
// segment after).
struct ShmSegments {
  ucp_mem_h memh = nullptr;
  std::vector<ucp_rkey_h> rkeys;
  bool enabled = false;   // every rank mapped every segment (all ranks agree)
  bool exchange = false;  // and the mailboxes carry the header round
  // "cma ok" where every rank reads every other by cross-memory attach (the
  // group's pids are then set), else the first rank's reason why not.
  std::string cma_verdict;
  void DestroyKeys();
  void Unmap(ucp_context_h context);
};

// Collective over the channel's ranks (connected already) and `store`
// (keys under `prefix`): maps every rank's segment, sized for the
// shared-memory allreduce's chunks and for mailboxes of a header and
// `small_bytes` of payload, into *group. Every rank says whether it could,
// and the path is used only if all could with the same layout
// (segments->enabled, the same on every rank). Errors are the store's.
absl::Status SetUpSharedMemory(Channel& channel, Store& store, const std::string& prefix,
                               const UcxOptions& options, size_t small_bytes, ShmGroup* group,
                               ShmSegments* segments);

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_SHM_SETUP_H_
