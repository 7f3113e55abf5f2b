#include "comm/ucx/algo/shm_allreduce.h"

#include <chrono>
#include <cstdint>

namespace fusebox::comm::ucx {
namespace {

// Where every rank mapped every segment; above the ring in score.
std::vector<Served> Serves(const Situation& s) {
  if (s.in.world < 2 || !s.in.shm_allreduce) return {};
  return {{Kind::kAllReduce, 0, SIZE_MAX, kScoreShm}};
}

// Note [Algorithm table]: in the ring's place, as the table's algorithm
// above the carried range.
bool Measured(const Situation& s, size_t lo, size_t) {
  return s.in.shm_allreduce && lo >= kMeasuredRingFromBytes;
}

absl::Status Run(Context& ctx, const Request& req) {
  ShmState& shm = *ctx.shm;
  const Begun* begun = ctx.begun;
  const size_t bytes = req.bytes();
  // BeginShmAllReduce stages nothing for these (all ranks decide alike).
  if (shm.SingleCopy(bytes)) {
    return CmaAllReduce(shm.group, req.send, req.recv, req.header.count, req.type(), req.op(),
                        &shm.round, *shm.aborted, &shm.cma_scratch, ctx.channel->deadline());
  }
  const bool choose = shm.stores == UcxOptions::ShmStores::kAuto;
  // A begun call keeps the kind of store its first round was staged with,
  // and is charged that staging's time.
  const bool stream = begun != nullptr ? begun->stream : StreamsInto(shm, bytes);
  shm.group.stream_bytes = stream ? kStreamMinCopyBytes : 0;
  const auto start = std::chrono::steady_clock::now();
  absl::Duration waited;
  absl::Status s = ShmAllReduce(shm.group, req.send, req.recv, req.header.count, req.type(),
                                req.op(), &shm.round, *shm.aborted, ctx.channel->deadline(),
                                &waited, begun != nullptr && begun->staged);
  if (choose && s.ok()) {
    const absl::Duration before = begun != nullptr ? begun->staging : absl::ZeroDuration();
    shm.staging.Record(
        bytes, stream,
        before + absl::FromChrono(std::chrono::steady_clock::now() - start) - waited);
  }
  return s;
}

}  // namespace

bool StreamsInto(ShmState& shm, size_t bytes) {
  return shm.stores == UcxOptions::ShmStores::kStreamed ||
         (shm.stores == UcxOptions::ShmStores::kAuto && shm.staging.Stream(bytes));
}

void BeginShmAllReduce(ShmState& shm, const Request& req, Begun* begun) {
  if (shm.SingleCopy(req.bytes())) return;  // nothing to stage: Run reads in place
  begun->stream = StreamsInto(shm, req.bytes());
  shm.group.stream_bytes = begun->stream ? kStreamMinCopyBytes : 0;
  const auto start = std::chrono::steady_clock::now();
  begun->staged = ShmBeginAllReduce(shm.group, req.send, req.header.count, req.type(), &shm.round);
  begun->staging = absl::FromChrono(std::chrono::steady_clock::now() - start);
}

const AlgorithmUnit kShmAllReduceUnit = {
    Algorithm::kShmAllReduce, "shm-allreduce",  Serves, Measured, /*trial_order=*/1,
    Carrier::kNone,           /*open=*/nullptr, /*payload=*/nullptr, Run};

}  // namespace fusebox::comm::ucx
