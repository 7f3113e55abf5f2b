#include "comm/ucx/algo/recursive_doubling.h"

#include <algorithm>

namespace fusebox::comm::ucx {
namespace {

std::vector<Served> Serves(const Situation& s) {
  if (!s.messages) return {};
  return {{Kind::kAllReduce, 0, RecursiveDoublingEnd(s), kScoreRecursiveDoubling}};
}

// A candidate in every measured class (they exist only over messages).
bool Measured(const Situation&, size_t, size_t) { return true; }

absl::Status Open(Context& ctx, const Request& req) {
  return CarryInDescriptorRound(ctx, req, /*halving=*/false);
}

}  // namespace

size_t RecursiveDoublingEnd(const Situation& s) {
  return std::max(s.small_bytes, s.in.recursive_doubling_bytes);
}

absl::Status CarryInDescriptorRound(Context& ctx, const Request& req, bool halving) {
  const Carried carried{req.send, req.recv, halving};
  return DescriptorRound(*ctx.channel, req.header, &carried, ctx.limits.carried_bytes,
                         ctx.descriptor_staging, ctx.limits.watch());
}

const AlgorithmUnit kRecursiveDoublingUnit = {
    Algorithm::kRecursiveDoublingAllReduce,
    "recursive-doubling",
    Serves,
    Measured,
    /*trial_order=*/2,
    Carrier::kDescriptorRound,
    Open,
    /*payload=*/nullptr,
    /*run=*/nullptr};

}  // namespace fusebox::comm::ucx
