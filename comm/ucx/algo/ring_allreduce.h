// AllReduce as a ring reduce-scatter + allgather, pipelined in chunks of
// chunk_bytes (Note [UCX collective protocol] in comm/ucx/communicator.h):
// a chunk received in step k is reduced while later chunks are in flight
// and is sent on in step k+1 as soon as it is reduced; received chunks land
// in a small ring of staging slots (kRingSlots) that stays in cache. Each
// rank moves 2(p-1)/p of the data in 2(p-1) steps, hence at most kMaxWorld
// ranks (the steps must fit the tags).
#ifndef FUSEBOX_COMM_UCX_ALGO_RING_ALLREDUCE_H_
#define FUSEBOX_COMM_UCX_ALGO_RING_ALLREDUCE_H_

#include "comm/ucx/algo/unit.h"

namespace fusebox::comm::ucx {

extern const AlgorithmUnit kRingAllReduceUnit;

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_ALGO_RING_ALLREDUCE_H_
