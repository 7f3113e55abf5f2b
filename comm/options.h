// Per-backend options, filled at the edges (flags, environment) and passed
// down. Plain data, no dependency on any backend's headers.
#ifndef FUSEBOX_COMM_OPTIONS_H_
#define FUSEBOX_COMM_OPTIONS_H_

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace fusebox::comm {

struct UcxOptions {
  // AllReduce messages up to this many bytes use recursive doubling
  // (latency-optimised); larger ones use the pipelined ring.
  size_t small_message_bytes = 16 << 10;
  // Pipeline chunk of the ring algorithm. Small enough that a received chunk
  // is still in cache when it is reduced.
  size_t chunk_bytes = 256 << 10;
  // UCX configuration overrides applied with ucp_config_modify, e.g.
  // {"TLS", "tcp,cma"}; UCX_* environment variables still apply underneath.
  std::vector<std::pair<std::string, std::string>> ucx_config;
  // Ask UCX to report failed peers (UCP_ERR_HANDLING_MODE_PEER): a collective
  // waiting on a rank that died then fails with Unavailable instead of
  // waiting for the caller's deadline. UCX 1.13 supports this only over TCP,
  // so it turns off the shared-memory transports and costs most of the
  // bandwidth on one host; off by default.
  bool detect_peer_failure = false;
  // Deadline for exchanging worker addresses.
  absl::Duration rendezvous_timeout = absl::Seconds(300);
};

struct MpiOptions {
  // Nothing yet: the communicator duplicates MPI_COMM_WORLD.
};

struct NcclOptions {
  // CUDA device ordinal; -1 means the local rank.
  int device = -1;
  absl::Duration rendezvous_timeout = absl::Seconds(300);
};

struct BackendOptions {
  UcxOptions ucx;
  MpiOptions mpi;
  NcclOptions nccl;
};

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_OPTIONS_H_
