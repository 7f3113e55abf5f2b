#include "comm/ucx/algo/registry.h"

namespace fusebox::comm::ucx {
namespace {

std::vector<Served> Serves(const Situation& s) {
  if (!s.messages || !s.linear) return {};
  return {{Kind::kAllReduce, 0, s.in.linear_bytes, kScoreLinear}};
}

// Rank 0 receives p - 1 messages of up to kMeasuredLinearMaxBytes, in
// worlds of at most kMeasuredLinearMaxRanks, unless the opening is forced
// to recursive doubling.
bool Measured(const Situation& s, size_t, size_t hi) {
  const bool candidate = s.in.world <= kMeasuredLinearMaxRanks &&
                         s.in.opening != UcxOptions::Opening::kRecursiveDoubling &&
                         (s.linear || s.in.machine_oversubscribed);
  return candidate && hi <= kMeasuredLinearMaxBytes;
}

absl::Status Open(Context& ctx, const Request& req) {
  const Carried carried{req.send, req.recv, /*halving=*/false};
  return LinearRound(*ctx.channel, req.header, &carried, ctx.limits.linear_bytes,
                     ctx.descriptor_staging);
}

}  // namespace

const AlgorithmUnit kLinearAllReduceUnit = {
    Algorithm::kLinearAllReduce,
    "linear",
    Serves,
    Measured,
    /*trial_order=*/3,
    Carrier::kLinearRound,
    Open,
    /*payload=*/nullptr,
    /*run=*/nullptr};

}  // namespace fusebox::comm::ucx
