// Barrier: the opening round alone (the header round on one host, the
// descriptor or linear round over messages), which no rank leaves before
// every rank has entered it.
#ifndef FUSEBOX_COMM_UCX_ALGO_BARRIER_H_
#define FUSEBOX_COMM_UCX_ALGO_BARRIER_H_

#include "comm/ucx/algo/unit.h"

namespace fusebox::comm::ucx {

extern const AlgorithmUnit kBarrierUnit;

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_ALGO_BARRIER_H_
