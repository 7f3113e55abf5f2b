// AllGather as a ring: in step k each rank sends the block it received in
// step k - 1 (its own first) to the next rank, in chunks of chunk_bytes.
#ifndef FUSEBOX_COMM_UCX_ALGO_RING_ALLGATHER_H_
#define FUSEBOX_COMM_UCX_ALGO_RING_ALLGATHER_H_

#include "comm/ucx/algo/unit.h"

namespace fusebox::comm::ucx {

extern const AlgorithmUnit kRingAllGatherUnit;

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_ALGO_RING_ALLGATHER_H_
