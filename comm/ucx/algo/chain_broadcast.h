// Broadcast as a pipelined chain from the root: each rank receives chunk j
// of chunk_bytes from the rank before it and sends it on to the next while
// later chunks are in flight.
#ifndef FUSEBOX_COMM_UCX_ALGO_CHAIN_BROADCAST_H_
#define FUSEBOX_COMM_UCX_ALGO_CHAIN_BROADCAST_H_

#include "comm/ucx/algo/unit.h"

namespace fusebox::comm::ucx {

extern const AlgorithmUnit kChainBroadcastUnit;

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_ALGO_CHAIN_BROADCAST_H_
