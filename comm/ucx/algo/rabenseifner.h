// AllReduce by Rabenseifner's algorithm, carried inside the descriptor
// round over messages (Note [Rabenseifner] in comm/ucx/descriptor_round.h):
// a reduce-scatter by recursive halving in the round's exchanges, then an
// allgather by recursive doubling; 2(p-1)/p of the data per rank in
// 2 log2(p) rounds, with recursive doubling's bits. It serves worlds of a
// power of two of at least 4 ranks, above rabenseifner_from_bytes (at most
// recursive doubling's end) up to rabenseifner_bytes (Note [Recursive
// doubling or Rabenseifner] in comm/ucx/algorithms.h).
#ifndef FUSEBOX_COMM_UCX_ALGO_RABENSEIFNER_H_
#define FUSEBOX_COMM_UCX_ALGO_RABENSEIFNER_H_

#include "comm/ucx/algo/unit.h"

namespace fusebox::comm::ucx {

extern const AlgorithmUnit kRabenseifnerUnit;

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_ALGO_RABENSEIFNER_H_
