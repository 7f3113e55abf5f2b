// The UCX backend's descriptor round. See descriptor_round.h.
#include "comm/ucx/descriptor_round.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "comm/reduce.h"
#include "comm/types.h"

namespace fusebox::comm::ucx {
namespace {

// Recursive doubling's layout of p ranks: q the largest power of two <= p;
// ranks 0 .. 2*extra-1 pair up, the odd one of each pair exchanging for
// both. Virtual rank v (0 .. q-1) speaks for real ranks Lo(v) .. Hi(v) and
// exchanges from Real(v); the map keeps rank order.
struct Layout {
  explicit Layout(int size) : p(size) {
    while (q * 2 <= p) {
      q *= 2;
      ++rounds;
    }
    extra = p - q;
  }
  int Lo(int v) const { return v < extra ? 2 * v : v + extra; }
  int Hi(int v) const { return v < extra ? 2 * v + 1 : v + extra; }
  int Real(int v) const { return Hi(v); }

  int p;
  int q = 1;
  int rounds = 0;
  int extra = 0;
};

// What a step does with the message it receives.
enum class Take {
  kNothing,     // receives none
  kMergeLower,  // the peer's block comes before this rank's
  kMergeUpper,  // after it
  kAdopt,       // the hand-back: the whole world's verdict and result
};

// A received verdict must speak for the peer's block, ranks lo .. hi.
absl::Status CheckVerdict(const Verdict& v, int lo, int hi, int from) {
  const bool ok = v.first.magic == kHeaderMagic && v.first.sender == lo &&
                  (Clean(v) || (v.differ.magic == kHeaderMagic && v.differ.sender > lo &&
                                v.differ.sender <= hi));
  if (ok) return absl::OkStatus();
  return absl::DataLossError(
      absl::StrCat("rank ", from, " sent a malformed collective descriptor"));
}

}  // namespace

Verdict Merge(const Verdict& lower, const Verdict& upper) {
  Verdict v = lower;
  if (Clean(lower)) v.differ = SameCall(upper.first, lower.first) ? upper.differ : upper.first;
  return v;
}

absl::Status VerdictStatus(const Verdict& v) {
  if (Clean(v)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "collective mismatch across ranks: rank ", v.first.sender, " called ", Describe(v.first),
      " but rank ", v.differ.sender, " called ", Describe(v.differ)));
}

absl::Status DescriptorRound(Channel& channel, const Header& header, const Carried* carried,
                             size_t max_carried_bytes, DescriptorStaging* staging) {
  const Layout layout(channel.size());
  const int rank = channel.rank();
  const auto type = static_cast<DataType>(header.type);
  const auto op = static_cast<ReduceOp>(header.op);
  const size_t bytes = carried != nullptr ? header.count * DataTypeSize(type) : 0;
  if (bytes > max_carried_bytes) {
    return absl::InternalError(absl::StrCat("descriptor round asked to carry ", bytes,
                                            " bytes, more than its limit ", max_carried_bytes));
  }
  std::vector<unsigned char>& tx = staging->tx;
  std::vector<unsigned char>& rx = staging->rx;
  if (tx.size() < sizeof(Verdict) + bytes) tx.resize(sizeof(Verdict) + bytes);
  if (rx.size() < sizeof(Verdict) + max_carried_bytes)
    rx.resize(sizeof(Verdict) + max_carried_bytes);
  unsigned char* partial = tx.data() + sizeof(Verdict);  // this block's, while clean
  if (bytes > 0) std::memcpy(partial, carried->send, bytes);
  Verdict v{header, Header{}};

  // Sends this block's verdict (and partial, while clean) to `peer` when
  // `send`, and takes in the peer's message, whose verdict must speak for
  // ranks lo .. hi.
  const auto step = [&](int peer, uint64_t index, bool send, Take take, int lo,
                        int hi) -> absl::Status {
    const ucp_tag_t tag = MakeTag(header.seq, 0, index);
    std::memcpy(tx.data(), &v, sizeof(v));
    const size_t out = sizeof(Verdict) + (Clean(v) ? bytes : 0);
    Pending r, s;
    if (take != Take::kNothing) channel.PostRecv(peer, rx.data(), rx.size(), tag, &r);
    if (send) channel.PostSend(peer, tx.data(), out, tag, &s);
    absl::Status status;
    if (take != Take::kNothing) status = channel.Finish(&r, "descriptor receive");
    if (status.ok() && send) status = channel.Finish(&s, "descriptor send");
    if (!status.ok()) {
      channel.Release(&r, /*is_recv=*/true);
      channel.Release(&s, /*is_recv=*/false);
      return status;
    }
    if (take == Take::kNothing) return absl::OkStatus();
    if (r.length < sizeof(Verdict)) {
      return absl::DataLossError(absl::StrCat(
          "rank ", peer, " sent a short collective descriptor (", r.length, " bytes)"));
    }
    Verdict theirs;
    std::memcpy(&theirs, rx.data(), sizeof(theirs));
    if (absl::Status c = CheckVerdict(theirs, lo, hi, peer); !c.ok()) return c;
    const Verdict merged = take == Take::kAdopt        ? theirs
                           : take == Take::kMergeLower ? Merge(theirs, v)
                                                       : Merge(v, theirs);
    if (carried != nullptr && Clean(merged)) {
      // Equal headers: the peer carried as many bytes as this rank.
      if (r.length != sizeof(Verdict) + bytes) {
        return absl::DataLossError(absl::StrCat("rank ", peer, " sent ", r.length - sizeof(Verdict),
                                                " bytes of partial result for ", Describe(header)));
      }
      const unsigned char* other = rx.data() + sizeof(Verdict);
      if (bytes > 0 && take == Take::kAdopt) std::memcpy(partial, other, bytes);
      if (bytes > 0 && take == Take::kMergeLower) {
        Reduce(other, partial, partial, header.count, type, op);
      }
      if (bytes > 0 && take == Take::kMergeUpper) {
        Reduce(partial, other, partial, header.count, type, op);
      }
    }
    v = merged;
    return absl::OkStatus();
  };

  const int p = layout.p;
  const bool paired = rank < 2 * layout.extra;
  const bool sits_out = paired && rank % 2 == 0;
  if (paired) {
    absl::Status s = sits_out ? step(rank + 1, 0, true, Take::kNothing, 0, 0)
                              : step(rank - 1, 0, false, Take::kMergeLower, rank - 1, rank - 1);
    if (!s.ok()) return s;
  }
  if (!sits_out) {
    const int me = paired ? rank / 2 : rank - layout.extra;
    for (int k = 0; k < layout.rounds; ++k) {
      const int other = me ^ (1 << k);
      const int base = other & ~((1 << k) - 1);  // the peer's block, virtual ranks
      const Take take = other < me ? Take::kMergeLower : Take::kMergeUpper;
      if (absl::Status s = step(layout.Real(other), 1 + k, true, take, layout.Lo(base),
                                layout.Hi(base + (1 << k) - 1));
          !s.ok()) {
        return s;
      }
    }
    if (bytes > 0 && Clean(v) && op == ReduceOp::kAvg) FinishAvg(partial, header.count, type, p);
  }
  if (paired) {
    const uint64_t last = layout.rounds + 1;
    absl::Status s = sits_out ? step(rank + 1, last, false, Take::kAdopt, 0, p - 1)
                              : step(rank - 1, last, true, Take::kNothing, 0, 0);
    if (!s.ok()) return s;
  }
  if (absl::Status m = VerdictStatus(v); !m.ok()) return m;
  if (bytes > 0) std::memcpy(carried->recv, partial, bytes);
  return absl::OkStatus();
}

}  // namespace fusebox::comm::ucx
