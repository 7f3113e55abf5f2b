// One-shot: on one host (or one rank), a collective of up to the table's
// small_bytes rides in the header round (Note [UCX collective protocol] in
// comm/ucx/communicator.h); each rank then reads every rank's payload where
// it arrived and, for AllReduce, combines them in rank order, so every rank
// computes bit-identical results.
#ifndef FUSEBOX_COMM_UCX_ALGO_ONE_SHOT_H_
#define FUSEBOX_COMM_UCX_ALGO_ONE_SHOT_H_

#include "comm/ucx/algo/unit.h"

namespace fusebox::comm::ucx {

extern const AlgorithmUnit kOneShotUnit;

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_ALGO_ONE_SHOT_H_
