#include "comm/ucx/algo/registry.h"

#include <ucp/api/ucp.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/reduce.h"
#include "comm/ucx/ranges.h"

namespace fusebox::comm::ucx {
namespace {

std::vector<Served> Serves(const Situation& s) {
  return EverySizeFromTwoRanks(s, Kind::kAllReduce, kScoreLarge);
}

// Note [Algorithm table]: the ring is a measured candidate (as the table's
// algorithm above the carried range) in classes from kMeasuredRingFromBytes.
bool Measured(const Situation& s, size_t lo, size_t) {
  return !s.in.shm_allreduce && lo >= kMeasuredRingFromBytes;
}

// One rank's ring: receives in the order they are consumed (reduce-scatter
// steps 0..p-2, then allgather steps 0..p-2, chunk-major within a step; step
// s of the tag is 1 + index), at most kRingSlots posted at a time.
class Ring {
 public:
  Ring(Context& ctx, const Request& req)
      : ch_(*ctx.channel),
        req_(req),
        type_(req.type()),
        op_(req.op()),
        esize_(DataTypeSize(type_)),
        p_(ctx.size()),
        rank_(ctx.rank()),
        in_(static_cast<const unsigned char*>(req.send)),
        out_(static_cast<unsigned char*>(req.recv)),
        seg_(SplitEven(req.header.count, esize_, p_)),
        chunk_(std::max(esize_, ctx.chunk_bytes / esize_ * esize_)),
        slots_(ctx.ring_slots->data()),
        slot_bytes_(ctx.chunk_bytes),
        rs_steps_(p_ - 1),
        steps_(2 * (p_ - 1)) {
    size_t max_seg = 0;
    for (const Range& r : seg_) max_seg = std::max(max_seg, r.len);
    nchunks_ = (max_seg + chunk_ - 1) / chunk_;
    total_ = static_cast<size_t>(steps_) * nchunks_;
  }

  absl::Status Run();

 private:
  int Mod(int x) const { return ((x % p_) + p_) % p_; }
  Range RecvRange(int step, size_t j) const {
    const int s = step < rs_steps_ ? Mod(rank_ - step - 1) : Mod(rank_ - (step - rs_steps_));
    return ChunkOf(seg_[s], chunk_, j);
  }
  Range SendRange(int step, size_t j) const {
    const int s = step < rs_steps_ ? Mod(rank_ - step) : Mod(rank_ + 1 - (step - rs_steps_));
    return ChunkOf(seg_[s], chunk_, j);
  }
  void Send(int step, size_t j, const unsigned char* base);
  // Reaps finished sends from the front so the deque stays short.
  void Reap();
  // Posts receive `idx` into its window slot.
  void Post(size_t idx);
  // Takes in receive `idx` (reducing it in the reduce-scatter) and sends
  // its chunk on.
  absl::Status Take(size_t idx);

  Channel& ch_;
  const Request& req_;
  const DataType type_;
  const ReduceOp op_;
  const size_t esize_;
  const int p_;
  const int rank_;
  const unsigned char* const in_;
  unsigned char* const out_;
  const std::vector<Range> seg_;
  const size_t chunk_;
  unsigned char* const slots_;  // kRingSlots slots of slot_bytes_
  const size_t slot_bytes_;
  const int rs_steps_;
  const int steps_;
  size_t nchunks_ = 0;
  size_t total_ = 0;
  size_t posted_ = 0;
  std::deque<Pending> sends_;  // stable addresses
  std::vector<Pending> recvs_ = std::vector<Pending>(kRingSlots);
  absl::Status first_;
};

void Ring::Send(int step, size_t j, const unsigned char* base) {
  const Range r = SendRange(step, j);
  if (r.len == 0) return;
  sends_.emplace_back();
  ch_.PostSend((rank_ + 1) % p_, base + r.off, r.len, MakeTag(req_.header.seq, 1 + step, j),
               &sends_.back());
}

void Ring::Reap() {
  while (!sends_.empty() && sends_.front().done) {
    if (sends_.front().request != nullptr) ucp_request_free(sends_.front().request);
    if (sends_.front().status != UCS_OK && first_.ok()) {
      first_ = absl::UnavailableError(
          absl::StrCat("UCX ring send failed: ", UcsError(sends_.front().status)));
    }
    sends_.pop_front();
  }
}

void Ring::Post(size_t idx) {
  const int step = static_cast<int>(idx / nchunks_);
  const size_t j = idx % nchunks_;
  const size_t w = idx % kRingSlots;
  const Range r = RecvRange(step, j);
  if (r.len == 0) {
    recvs_[w] = Pending{};
    recvs_[w].done = true;
    return;
  }
  unsigned char* dst = step < rs_steps_ ? slots_ + w * slot_bytes_ : out_ + r.off;
  ch_.PostRecv((rank_ - 1 + p_) % p_, dst, r.len, MakeTag(req_.header.seq, 1 + step, j),
               &recvs_[w]);
}

absl::Status Ring::Take(size_t idx) {
  const int step = static_cast<int>(idx / nchunks_);
  const size_t j = idx % nchunks_;
  const size_t w = idx % kRingSlots;
  if (absl::Status s = ch_.Finish(&recvs_[w], "ring receive"); !s.ok()) return s;
  const Range r = RecvRange(step, j);
  if (r.len != 0 && recvs_[w].length != r.len) {
    return absl::DataLossError(absl::StrCat("ring step ", step, " chunk ", j, ": got ",
                                            recvs_[w].length, " bytes, expected ", r.len));
  }
  if (step < rs_steps_ && r.len != 0) {
    // out = in (op) received; in-place safe: each segment is written once.
    const unsigned char* staged = slots_ + w * slot_bytes_;
    Reduce(in_ + r.off, staged, out_ + r.off, r.len / esize_, type_, op_);
    if (step == rs_steps_ - 1 && op_ == ReduceOp::kAvg) {
      FinishAvg(out_ + r.off, r.len / esize_, type_, p_);
    }
  }
  // The slot is free again: keep the window full before sending on.
  if (posted_ < total_) Post(posted_++);
  if (step + 1 < steps_) Send(step + 1, j, out_);
  return absl::OkStatus();
}

absl::Status Ring::Run() {
  // Reduce-scatter step 0 sends straight from the input.
  for (size_t j = 0; j < nchunks_; ++j) Send(0, j, in_);
  for (; posted_ < std::min<size_t>(kRingSlots, total_); ++posted_) Post(posted_);
  for (size_t idx = 0; idx < total_; ++idx) {
    if (absl::Status s = Take(idx); !s.ok()) {
      first_ = s;
      break;
    }
    Reap();
    if (!first_.ok()) break;
  }
  // Drain outstanding sends (and receives, on error) before the buffers can
  // be reused by the caller.
  while (!sends_.empty() && first_.ok()) {
    if (absl::Status s = ch_.WaitFor(&sends_.front()); !s.ok()) first_ = s;
    Reap();
  }
  if (!first_.ok()) {
    for (Pending& r : recvs_) ch_.Release(&r, /*is_recv=*/true);
    for (Pending& snd : sends_) ch_.Release(&snd, /*is_recv=*/false);
  }
  return first_;
}

absl::Status Run(Context& ctx, const Request& req) { return Ring(ctx, req).Run(); }

}  // namespace

const AlgorithmUnit kRingAllReduceUnit = {
    Algorithm::kRingAllReduce, "ring-allreduce", Serves, Measured, /*trial_order=*/1,
    Carrier::kNone,            /*open=*/nullptr, /*payload=*/nullptr, Run};

}  // namespace fusebox::comm::ucx
