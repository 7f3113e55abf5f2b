// Recursive-doubling AllReduce on the UCX channel (channel.h). The
// algorithm table (Note [Algorithm table] in algorithms.h) picks it for
// AllReduce over messages between the one-shot limit and
// UcxOptions::recursive_doubling_bytes.
#ifndef FUSEBOX_COMM_UCX_ALLREDUCE_RECURSIVE_DOUBLING_H_
#define FUSEBOX_COMM_UCX_ALLREDUCE_RECURSIVE_DOUBLING_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "comm/types.h"
#include "comm/ucx/channel.h"

namespace fusebox::comm::ucx {

// One AllReduce as issued on this rank, its descriptor already agreed by
// every rank (the header round); `seq` numbers its tags.
struct AllReduceArgs {
  const void* send = nullptr;
  void* recv = nullptr;  // may equal send (in place)
  size_t count = 0;
  DataType type = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  uint64_t seq = 0;
};

// log2(q) pairwise exchanges of the whole vector among q ranks, q the
// largest power of two <= the channel's size; where the size is not one,
// the first 2(size - q) ranks pair up before (the even one hands its data
// to the odd one and sits the exchanges out) and after (the odd one hands
// it the result). Every combination puts the lower rank's partial first, so
// both partners of an exchange compute the same bits and every rank ends
// with the same result. Tag steps 1 .. log2(q) + 2 of `seq`. `staging`
// holds a received partial and grows to the message's size.
absl::Status RecursiveDoublingAllReduce(Channel& channel, const AllReduceArgs& args,
                                        std::vector<unsigned char>* staging);

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_ALLREDUCE_RECURSIVE_DOUBLING_H_
