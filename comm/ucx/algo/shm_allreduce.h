// The shared-memory allreduce as a unit of the UCX backend: between ranks
// on one host that mapped every rank's segment, AllReduce above the
// one-shot range (and over messages, above what the opening rounds carry)
// runs the rounds of Note [UCX shared-memory allreduce] (the kernel in
// comm/ucx/shm_allreduce.h), staging with streaming or cached stores as
// UcxOptions::shm_stores and the chooser say (Note [Choosing how to stage]).
#ifndef FUSEBOX_COMM_UCX_ALGO_SHM_ALLREDUCE_H_
#define FUSEBOX_COMM_UCX_ALGO_SHM_ALLREDUCE_H_

#include <cstddef>

#include "comm/ucx/algo/unit.h"

namespace fusebox::comm::ucx {

extern const AlgorithmUnit kShmAllReduceUnit;

// Whether this rank's next shared-memory allreduce of `bytes` stages with
// streaming stores (UcxOptions::shm_stores; kAuto asks the chooser, once
// per collective).
bool StreamsInto(ShmState& shm, size_t bytes);

// Note [Beginning on the issuing thread] in comm/ucx/communicator.h:
// stages the first round of `req` where its slot is free now, recording
// how in *begun (stream, staged, staging). Never waits.
void BeginShmAllReduce(ShmState& shm, const Request& req, Begun* begun);

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_ALGO_SHM_ALLREDUCE_H_
