#include "comm/ucx/algo/registry.h"

#include <cstdint>
#include <cstring>

#include "comm/reduce.h"

namespace fusebox::comm::ucx {
namespace {

std::vector<Served> Serves(const Situation& s) {
  if (s.in.world != 1) return {};
  return {{Kind::kAllReduce, 0, SIZE_MAX, kScoreLocal},
          {Kind::kBroadcast, 0, SIZE_MAX, kScoreLocal},
          {Kind::kAllGather, 0, SIZE_MAX, kScoreLocal}};
}

absl::Status Run(Context&, const Request& req) {
  const size_t bytes = req.bytes();
  if (req.kind() == Kind::kAllReduce) {
    if (req.recv != req.send) std::memcpy(req.recv, req.send, bytes);
    if (req.op() == ReduceOp::kAvg) FinishAvg(req.recv, req.header.count, req.type(), 1);
  } else if (req.kind() == Kind::kAllGather && req.recv != req.send) {
    std::memmove(req.recv, req.send, bytes);
  }
  return absl::OkStatus();
}

}  // namespace

const AlgorithmUnit kLocalUnit = {
    Algorithm::kLocal, "local",          Serves, /*measured=*/nullptr, /*trial_order=*/0,
    Carrier::kNone,    /*open=*/nullptr, /*payload=*/nullptr, Run};

}  // namespace fusebox::comm::ucx
