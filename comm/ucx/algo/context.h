// What a UCX algorithm runs on: one collective (its header and buffers) and
// the channel and staging the executing communicator lends it. Every
// algorithm of comm/ucx/algo/ takes a Context, never the communicator, and
// runs on the core's executing thread (Note [UCX collective protocol] in
// comm/ucx/communicator.h).
#ifndef FUSEBOX_COMM_UCX_ALGO_CONTEXT_H_
#define FUSEBOX_COMM_UCX_ALGO_CONTEXT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/options.h"
#include "comm/types.h"
#include "comm/ucx/channel.h"
#include "comm/ucx/descriptor_round.h"
#include "comm/ucx/header.h"
#include "comm/ucx/shm_allreduce.h"

namespace fusebox::comm::ucx {

// One collective being executed: its header (the wire descriptor) and
// buffers.
struct Request {
  Header header{};
  const void* send = nullptr;
  void* recv = nullptr;

  DataType type() const { return static_cast<DataType>(header.type); }
  ReduceOp op() const { return static_cast<ReduceOp>(header.op); }
  CollectiveKind kind() const { return static_cast<CollectiveKind>(header.kind); }
  size_t bytes() const { return header.count * DataTypeSize(type()); }
};

// What this rank contributes to the header round behind its header.
struct HeaderPayload {
  size_t bytes = 0;
  const void* data = nullptr;
};

// What the issuing thread did for a call (Note [Beginning on the issuing
// thread] in comm/ucx/communicator.cc).
struct Begun {
  uint64_t seq = 0;        // the call's
  uint64_t exchange = 0;   // its header round (ShmCollect)
  bool staged = false;     // its first shared-memory round (ShmBeginAllReduce)
  bool stream = false;     // how it was staged (Note [Choosing how to stage])
  absl::Duration staging;  // how long the staging took, for the chooser
};

// The shared-memory allreduce's state on one communicator (Note [UCX
// shared-memory allreduce] in comm/ucx/shm_allreduce.h).
struct ShmState {
  ShmGroup group;                            // every rank's segment, mapped here
  uint64_t round = 0;                        // rounds staged (all ranks agree)
  StagingChooser staging;                    // Note [Choosing how to stage]
  UcxOptions::ShmStores stores = UcxOptions::ShmStores::kAuto;  // UcxOptions::shm_stores
  const std::atomic<bool>* aborted = nullptr;  // the core's abort flag
  std::vector<unsigned char> cma_scratch;      // CmaAllReduce's pieces
  // Whether an allreduce of `bytes` runs CmaAllReduce (Note [Single-copy
  // allreduce]): where every rank can read every other, from
  // group.cma_min_bytes to group.cma_max_bytes.
  bool SingleCopy(size_t bytes) const {
    return !group.pids.empty() && bytes >= group.cma_min_bytes && bytes <= group.cma_max_bytes;
  }
};

// The limits of the opening rounds over messages, from the algorithm table
// (the same on every rank; Note [Algorithm table] in comm/ucx/algorithms.h).
struct RoundLimits {
  size_t carried_bytes = 0;    // AlgorithmTable::carried_bytes
  size_t linear_bytes = 0;     // AlgorithmTable::linear_bytes
  bool linear_watched = false;  // AlgorithmTable::linear_watched
  // The descriptor round's argument: linear_bytes where watched, else -1.
  int64_t watch() const { return linear_watched ? static_cast<int64_t>(linear_bytes) : -1; }
};

// The ring's staging: kRingSlots chunks of chunk_bytes.
inline constexpr int kRingSlots = 8;

// Everything an algorithm may use; the pointers are the communicator's and
// outlive the call. Members an algorithm does not need may be null.
struct Context {
  Channel* channel = nullptr;  // rank, size, tags, the call's deadline
  size_t chunk_bytes = 0;      // UcxOptions::chunk_bytes: the pipelines' chunk
  std::vector<unsigned char>* ring_slots = nullptr;  // kRingSlots * chunk_bytes
  // After the header round: every rank's message (a Header, then its
  // payload), valid until the next header round.
  const std::vector<const unsigned char*>* received = nullptr;
  // Over messages: the opening rounds' limits and staging.
  RoundLimits limits;
  DescriptorStaging* descriptor_staging = nullptr;
  ShmState* shm = nullptr;
  const Begun* begun = nullptr;  // what Begin did for this call (null: nothing)

  int rank() const { return channel->rank(); }
  int size() const { return channel->size(); }
};

// The end of a pipelined algorithm: unless `first` is an error already,
// finishes every send (`send_what` names them in an error); on any error
// hands back every send and receive still posted, so that the buffers can
// be reused. Returns the first error.
absl::Status FinishSends(Channel& channel, absl::Status first, std::deque<Pending>* sends,
                         std::vector<Pending>* recvs, const char* send_what);

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_ALGO_CONTEXT_H_
