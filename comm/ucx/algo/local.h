// One rank: the collective is a local copy (and Avg's division by 1).
#ifndef FUSEBOX_COMM_UCX_ALGO_LOCAL_H_
#define FUSEBOX_COMM_UCX_ALGO_LOCAL_H_

#include "comm/ucx/algo/unit.h"

namespace fusebox::comm::ucx {

extern const AlgorithmUnit kLocalUnit;

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_ALGO_LOCAL_H_
