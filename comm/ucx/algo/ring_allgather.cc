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
  return EverySizeFromTwoRanks(s, Kind::kAllGather, kScoreLarge);
}

absl::Status Run(Context& ctx, const Request& req) {
  Channel& ch = *ctx.channel;
  const int rank = ctx.rank();
  const Header& h = req.header;
  const size_t bytes = req.bytes();
  const int p = ctx.size();
  const int next = (rank + 1) % p;
  auto* out = static_cast<unsigned char*>(req.recv);
  if (out + rank * bytes != req.send) std::memmove(out + rank * bytes, req.send, bytes);
  const size_t chunk = ctx.chunk_bytes;
  const size_t nchunks = (bytes + chunk - 1) / chunk;
  const auto block = [&](int step) {  // the block received at `step`
    return Range{static_cast<size_t>((rank - 1 - step + 2 * p) % p) * bytes, bytes};
  };
  std::deque<Pending> sends;
  std::vector<Pending> recvs(static_cast<size_t>(p - 1) * nchunks);
  for (int step = 0; step < p - 1; ++step) {
    for (size_t j = 0; j < nchunks; ++j) {
      const Range r = ChunkOf(block(step), chunk, j);
      ch.PostRecv((rank - 1 + p) % p, out + r.off, r.len, MakeTag(h.seq, 1 + step, j),
                        &recvs[step * nchunks + j]);
    }
  }
  const Range own{static_cast<size_t>(rank) * bytes, bytes};
  for (size_t j = 0; j < nchunks; ++j) {
    const Range r = ChunkOf(own, chunk, j);
    sends.emplace_back();
    ch.PostSend(next, out + r.off, r.len, MakeTag(h.seq, 1, j), &sends.back());
  }
  absl::Status first;
  for (int step = 0; step < p - 1 && first.ok(); ++step) {
    for (size_t j = 0; j < nchunks && first.ok(); ++j) {
      first = ch.Finish(&recvs[step * nchunks + j], "allgather receive");
      if (first.ok() && step + 1 < p - 1) {
        const Range r = ChunkOf(block(step), chunk, j);
        sends.emplace_back();
        ch.PostSend(next, out + r.off, r.len, MakeTag(h.seq, 2 + step, j), &sends.back());
      }
    }
  }
  return FinishSends(ch, std::move(first), &sends, &recvs, "allgather send");
}


}  // namespace

const AlgorithmUnit kRingAllGatherUnit = {
    Algorithm::kRingAllGather, "ring-allgather", Serves, /*measured=*/nullptr, /*trial_order=*/0,
    Carrier::kNone, /*open=*/nullptr, /*payload=*/nullptr, Run};

}  // namespace fusebox::comm::ucx
