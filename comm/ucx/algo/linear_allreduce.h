// AllReduce carried inside the linear round (Note [Linear round] in
// comm/ucx/descriptor_round.h): every rank sends its header and data to
// rank 0, which reduces in rank order and answers each rank with the
// verdict and the result; 2(p-1) messages. It serves AllReduce up to
// linear_bytes where the linear round opens collectives, and is a measured
// candidate in small worlds where some machine runs more ranks than cores
// (Note [Algorithm table] in comm/ucx/algorithms.h).
#ifndef FUSEBOX_COMM_UCX_ALGO_LINEAR_ALLREDUCE_H_
#define FUSEBOX_COMM_UCX_ALGO_LINEAR_ALLREDUCE_H_

#include "comm/ucx/algo/unit.h"

namespace fusebox::comm::ucx {

extern const AlgorithmUnit kLinearAllReduceUnit;

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_ALGO_LINEAR_ALLREDUCE_H_
