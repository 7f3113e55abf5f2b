// Every UCX algorithm unit (comm/ucx/algo/unit.h), listed once, and the
// units that export nothing else, each defined in the file named beside it
// (recursive doubling and the shared-memory allreduce, which Rabenseifner and
// the communicator call into, have headers of their own).
#ifndef FUSEBOX_COMM_UCX_ALGO_REGISTRY_H_
#define FUSEBOX_COMM_UCX_ALGO_REGISTRY_H_

#include "absl/types/span.h"
#include "comm/ucx/algo/unit.h"

namespace fusebox::comm::ucx {

// Barrier: the opening round alone (the header round on one host, the
// descriptor or linear round over messages), which no rank leaves before
// every rank has entered it.
// In comm/ucx/algo/barrier.cc.
extern const AlgorithmUnit kBarrierUnit;

// One-shot: on one host (or one rank), a collective of up to the table's
// small_bytes rides in the header round (Note [UCX collective protocol] in
// comm/ucx/communicator.h); each rank then reads every rank's payload where
// it arrived and, for AllReduce, combines them in rank order, so every rank
// computes bit-identical results.
// In comm/ucx/algo/one_shot.cc.
extern const AlgorithmUnit kOneShotUnit;

// One rank: the collective is a local copy (and Avg's division by 1).
// In comm/ucx/algo/local.cc.
extern const AlgorithmUnit kLocalUnit;

// AllReduce as a ring reduce-scatter + allgather, pipelined in chunks of
// chunk_bytes (Note [UCX collective protocol] in comm/ucx/communicator.h):
// a chunk received in step k is reduced while later chunks are in flight
// and is sent on in step k+1 as soon as it is reduced; received chunks land
// in a small ring of staging slots (kRingSlots) that stays in cache. Each
// rank moves 2(p-1)/p of the data in 2(p-1) steps, hence at most kMaxWorld
// ranks (the steps must fit the tags).
// In comm/ucx/algo/ring_allreduce.cc.
extern const AlgorithmUnit kRingAllReduceUnit;

// AllReduce carried inside the linear round (Note [Linear round] in
// comm/ucx/descriptor_round.h): every rank sends its header and data to
// rank 0, which reduces in rank order and answers each rank with the
// verdict and the result; 2(p-1) messages. It serves AllReduce up to
// linear_bytes where the linear round opens collectives, and is a measured
// candidate in small worlds where some machine runs more ranks than cores
// (Note [Algorithm table] in comm/ucx/algorithms.h).
// In comm/ucx/algo/linear_allreduce.cc.
extern const AlgorithmUnit kLinearAllReduceUnit;

// AllReduce by Rabenseifner's algorithm, carried inside the descriptor
// round over messages (Note [Rabenseifner] in comm/ucx/descriptor_round.h):
// a reduce-scatter by recursive halving in the round's exchanges, then an
// allgather by recursive doubling; 2(p-1)/p of the data per rank in
// 2 log2(p) rounds, with recursive doubling's bits. It serves worlds of a
// power of two of at least 4 ranks, above rabenseifner_from_bytes (at most
// recursive doubling's end) up to rabenseifner_bytes (Note [Recursive
// doubling or Rabenseifner] in comm/ucx/algorithms.h).
// In comm/ucx/algo/rabenseifner.cc.
extern const AlgorithmUnit kRabenseifnerUnit;

// Broadcast as a pipelined chain from the root: each rank receives chunk j
// of chunk_bytes from the rank before it and sends it on to the next while
// later chunks are in flight.
// In comm/ucx/algo/chain_broadcast.cc.
extern const AlgorithmUnit kChainBroadcastUnit;

// AllGather as a ring: in step k each rank sends the block it received in
// step k - 1 (its own first) to the next rank, in chunks of chunk_bytes.
// In comm/ucx/algo/ring_allgather.cc.
extern const AlgorithmUnit kRingAllGatherUnit;

// Every unit, in the order of Algorithm's values.
absl::Span<const AlgorithmUnit* const> AlgorithmUnits();

// The unit of `a` (every Algorithm has one; registry_test checks it).
const AlgorithmUnit& UnitOf(Algorithm a);

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_ALGO_REGISTRY_H_
