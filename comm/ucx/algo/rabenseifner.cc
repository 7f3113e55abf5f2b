#include "comm/ucx/algo/registry.h"

#include <algorithm>

#include "comm/ucx/algo/recursive_doubling.h"

namespace fusebox::comm::ucx {
namespace {

// Where every rank exchanges (p a power of two) and halving saves bytes
// (recursive doubling moves log2(p) copies: 1 at p = 2).
std::vector<Served> Serves(const Situation& s) {
  if (!s.messages || !s.halving_world) return {};
  const size_t from = std::min(RecursiveDoublingEnd(s), s.in.rabenseifner_from_bytes);
  if (s.in.rabenseifner_bytes <= from) return {};
  return {{Kind::kAllReduce, from + 1, s.in.rabenseifner_bytes, kScoreRabenseifner}};
}

bool Measured(const Situation& s, size_t, size_t hi) {
  return s.halving_world && s.in.rabenseifner_bytes >= hi;
}

absl::Status Open(Context& ctx, const Request& req) {
  return CarryInDescriptorRound(ctx, req, /*halving=*/true);
}

}  // namespace

const AlgorithmUnit kRabenseifnerUnit = {
    Algorithm::kRabenseifnerAllReduce,
    "rabenseifner",
    Serves,
    Measured,
    /*trial_order=*/0,
    Carrier::kDescriptorRound,
    Open,
    /*payload=*/nullptr,
    /*run=*/nullptr};

}  // namespace fusebox::comm::ucx
