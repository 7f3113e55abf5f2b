// AllReduce by recursive doubling, carried inside the descriptor round over
// messages (Note [Descriptor round] in comm/ucx/descriptor_round.h): while
// the verdict is clean each exchange also carries its sender's partial, the
// lower block's combined first, so every rank ends with the same bits in
// log2(p) rounds (two more where p is not a power of two). It serves
// AllReduce up to max(small_message_bytes, recursive_doubling_bytes)
// (less Rabenseifner's range, which outscores it: Note [Recursive doubling
// or Rabenseifner] in comm/ucx/algorithms.h).
#ifndef FUSEBOX_COMM_UCX_ALGO_RECURSIVE_DOUBLING_H_
#define FUSEBOX_COMM_UCX_ALGO_RECURSIVE_DOUBLING_H_

#include <cstddef>

#include "comm/ucx/algo/unit.h"

namespace fusebox::comm::ucx {

extern const AlgorithmUnit kRecursiveDoublingUnit;

// The largest AllReduce recursive doubling carries over messages.
size_t RecursiveDoublingEnd(const Situation& s);

// Runs the descriptor round carrying `req` (Rabenseifner's halving where
// `halving`): the whole collective.
absl::Status CarryInDescriptorRound(Context& ctx, const Request& req, bool halving);

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_ALGO_RECURSIVE_DOUBLING_H_
