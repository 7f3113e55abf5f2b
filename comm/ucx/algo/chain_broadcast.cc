#include "comm/ucx/algo/registry.h"

#include <cstdint>
#include <cstring>
#include <deque>
#include <utility>
#include <vector>

#include "comm/ucx/ranges.h"

namespace fusebox::comm::ucx {
namespace {

std::vector<Served> Serves(const Situation& s) {
  return EverySizeFromTwoRanks(s, Kind::kBroadcast, kScoreLarge);
}

absl::Status Run(Context& ctx, const Request& req) {
  Channel& ch = *ctx.channel;
  const int rank = ctx.rank();
  const Header& h = req.header;
  const size_t bytes = req.bytes();
  const int p = ctx.size();
  const int pos = (rank - h.root + p) % p;  // position along the chain
  const int next = (rank + 1) % p;
  const bool has_next = pos != p - 1;
  auto* buf = static_cast<unsigned char*>(req.recv);
  const size_t chunk = ctx.chunk_bytes;
  const size_t nchunks = (bytes + chunk - 1) / chunk;
  const Range all{0, bytes};
  std::deque<Pending> sends;
  std::vector<Pending> recvs(nchunks);
  if (pos != 0) {
    for (size_t j = 0; j < nchunks; ++j) {
      const Range r = ChunkOf(all, chunk, j);
      ch.PostRecv((rank - 1 + p) % p, buf + r.off, r.len, MakeTag(h.seq, 1, j), &recvs[j]);
    }
  }
  absl::Status first;
  for (size_t j = 0; j < nchunks && first.ok(); ++j) {
    const Range r = ChunkOf(all, chunk, j);
    if (pos != 0) first = ch.Finish(&recvs[j], "broadcast receive");
    if (first.ok() && has_next) {
      sends.emplace_back();
      ch.PostSend(next, buf + r.off, r.len, MakeTag(h.seq, 1, j), &sends.back());
    }
  }
  return FinishSends(ch, std::move(first), &sends, &recvs, "broadcast send");
}


}  // namespace

const AlgorithmUnit kChainBroadcastUnit = {
    Algorithm::kChainBroadcast, "chain-broadcast", Serves, /*measured=*/nullptr, /*trial_order=*/0,
    Carrier::kNone, /*open=*/nullptr, /*payload=*/nullptr, Run};

}  // namespace fusebox::comm::ucx
