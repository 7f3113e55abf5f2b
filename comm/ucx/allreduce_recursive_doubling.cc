#include "comm/ucx/allreduce_recursive_doubling.h"

#include "comm/reduce.h"

namespace fusebox::comm::ucx {

absl::Status RecursiveDoublingAllReduce(Channel& channel, const AllReduceArgs& args,
                                        std::vector<unsigned char>* staging) {
  const size_t bytes = args.count * DataTypeSize(args.type);
  if (bytes == 0) return absl::OkStatus();
  const int p = channel.size(), rank = channel.rank();
  int q = 1, rounds = 0;
  while (q * 2 <= p) {
    q *= 2;
    ++rounds;
  }
  const int extra = p - q;  // ranks 0 .. 2*extra-1 pair up around the exchanges
  if (staging->size() < bytes) staging->resize(bytes);
  unsigned char* staged = staging->data();
  auto* out = static_cast<unsigned char*>(args.recv);
  const void* mine = args.send;  // this rank's partial
  const auto reduce = [&](const void* first, const void* second) {
    Reduce(first, second, out, args.count, args.type, args.op);
    mine = out;
  };
  // Tag steps: 1 before, 2 .. rounds+1 the exchanges, rounds+2 after.
  const bool paired = rank < 2 * extra;
  const bool sits_out = paired && rank % 2 == 0;
  if (paired) {
    const ucp_tag_t tag = MakeTag(args.seq, 1, 0);
    if (sits_out) {
      if (absl::Status s =
              channel.SendRecv(rank + 1, mine, nullptr, bytes, tag, "recursive doubling hand-over");
          !s.ok()) {
        return s;
      }
    } else {
      if (absl::Status s = channel.SendRecv(rank - 1, nullptr, staged, bytes, tag,
                                            "recursive doubling hand-over");
          !s.ok()) {
        return s;
      }
      reduce(staged, mine);  // rank - 1 first
    }
  }
  if (!sits_out) {
    const int me = paired ? rank / 2 : rank - extra;  // among the q
    for (int k = 0; k < rounds; ++k) {
      const int other = me ^ (1 << k);
      const int peer = other < extra ? 2 * other + 1 : other + extra;
      if (absl::Status s = channel.SendRecv(peer, mine, staged, bytes, MakeTag(args.seq, 2 + k, 0),
                                            "recursive doubling exchange");
          !s.ok()) {
        return s;
      }
      if (rank < peer) {
        reduce(mine, staged);
      } else {
        reduce(staged, mine);
      }
    }
    if (args.op == ReduceOp::kAvg) FinishAvg(out, args.count, args.type, p);
  }
  if (paired) {
    const ucp_tag_t tag = MakeTag(args.seq, 2 + rounds, 0);
    return sits_out
               ? channel.SendRecv(rank + 1, nullptr, out, bytes, tag, "recursive doubling result")
               : channel.SendRecv(rank - 1, out, nullptr, bytes, tag, "recursive doubling result");
  }
  return absl::OkStatus();
}

}  // namespace fusebox::comm::ucx
