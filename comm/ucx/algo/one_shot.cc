#include "comm/ucx/algo/registry.h"

#include <cstring>

#include "comm/reduce.h"

namespace fusebox::comm::ucx {
namespace {

std::vector<Served> Serves(const Situation& s) {
  if (s.messages) return {};  // the header round opens only on one host, or one rank
  return {{Kind::kAllReduce, 0, s.small_bytes, kScoreOneShot},
          {Kind::kBroadcast, 0, s.small_bytes, kScoreOneShot},
          {Kind::kAllGather, 0, s.small_bytes, kScoreOneShot}};
}

// The data rides in the header round: every rank's, but only the root's
// for Broadcast.
HeaderPayload Payload(const Request& req, int rank) {
  if (req.kind() == Kind::kBroadcast && req.header.root != rank) return {};
  return {req.bytes(), req.send};
}

void SmallAllReduce(const Context& ctx, const Request& req) {
  const Header& h = req.header;
  const DataType type = req.type();
  const ReduceOp op = req.op();
  const size_t bytes = req.bytes();
  if (bytes == 0) return;
  const std::vector<const unsigned char*>& received = *ctx.received;
  const auto slot = [&](int r) { return received[r] + sizeof(Header); };
  // Rank order on every rank: bit-identical results everywhere. Own data is
  // read from the slot (a copy), so in-place is safe.
  if (ctx.size() == 1) {
    std::memcpy(req.recv, slot(0), bytes);
  } else {
    Reduce(slot(0), slot(1), req.recv, h.count, type, op);
    for (int r = 2; r < ctx.size(); ++r) Reduce(req.recv, slot(r), req.recv, h.count, type, op);
  }
  if (op == ReduceOp::kAvg) FinishAvg(req.recv, h.count, type, ctx.size());
}

absl::Status Run(Context& ctx, const Request& req) {
  const size_t bytes = req.bytes();
  const auto slot = [&](int r) { return (*ctx.received)[r] + sizeof(Header); };
  switch (req.kind()) {
    case Kind::kAllReduce:
      SmallAllReduce(ctx, req);
      break;
    case Kind::kBroadcast:
      if (ctx.rank() != req.header.root && bytes > 0) {
        std::memcpy(req.recv, slot(req.header.root), bytes);
      }
      break;
    case Kind::kAllGather: {
      auto* out = static_cast<unsigned char*>(req.recv);
      for (int r = 0; r < ctx.size(); ++r) {
        if (bytes > 0) std::memmove(out + r * bytes, slot(r), bytes);
      }
      break;
    }
    case Kind::kBarrier:
      break;
  }
  return absl::OkStatus();
}

}  // namespace

const AlgorithmUnit kOneShotUnit = {
    Algorithm::kOneShot, "one-shot",       Serves, /*measured=*/nullptr, /*trial_order=*/0,
    Carrier::kNone,      /*open=*/nullptr, Payload, Run};

}  // namespace fusebox::comm::ucx
