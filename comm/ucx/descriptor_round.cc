// The UCX backend's descriptor round. See descriptor_round.h.
#include "comm/ucx/descriptor_round.h"

#include <cstring>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

// The bytes this rank carries, at most the round's limit.
absl::StatusOr<size_t> CarriedBytes(const Header& header, const Carried* carried,
                                    size_t max_carried_bytes) {
  const size_t bytes =
      carried != nullptr ? header.count * DataTypeSize(static_cast<DataType>(header.type)) : 0;
  if (bytes > max_carried_bytes) {
    return absl::InternalError(absl::StrCat("descriptor round asked to carry ", bytes,
                                            " bytes, more than its limit ", max_carried_bytes));
  }
  return bytes;
}

// The verdict in a received message of `length` bytes from `from`, which
// must speak for ranks lo .. hi.
absl::StatusOr<Verdict> ReceivedVerdict(const unsigned char* message, size_t length, int lo, int hi,
                                        int from) {
  if (length < sizeof(Verdict)) {
    return absl::DataLossError(
        absl::StrCat("rank ", from, " sent a short collective descriptor (", length, " bytes)"));
  }
  Verdict theirs;
  std::memcpy(&theirs, message, sizeof(theirs));
  if (absl::Status c = CheckVerdict(theirs, lo, hi, from); !c.ok()) return c;
  return theirs;
}

// A clean verdict means equal headers: a peer's message then carries as
// many bytes as this rank's.
absl::Status CheckCarried(size_t length, size_t bytes, int from, const Header& header) {
  if (length == sizeof(Verdict) + bytes) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("rank ", from, " sent ", length - sizeof(Verdict),
                                          " bytes of partial result for ", Describe(header)));
}

// A message slot of the linear round: a Verdict and `bytes` of payload,
// rounded up to whole cache lines so that every rank's payload at rank 0
// is aligned for any element type.
size_t SlotBytes(size_t bytes) { return (sizeof(Verdict) + bytes + 63) / 64 * 64; }

// Note [Watching the linear round]: rank 0's request for a rank's
// descriptor, on the answer's tag (a wire format: a Verdict whose first
// header has this magic and the collective's seq).
inline constexpr uint32_t kRequestMagic = 0x46425852;  // "FBXR"

bool IsRequest(const unsigned char* message, size_t length, uint64_t seq) {
  if (length != sizeof(Verdict)) return false;
  Verdict v;
  std::memcpy(&v, message, sizeof(v));
  return v.first.magic == kRequestMagic && v.first.seq == seq;
}

// One rank's side of the linear round (Note [Linear round]): rank 0
// receives every rank's message and answers each; every other rank sends
// its message and receives the answer. Posting, taking in and answering
// are separate so that rank 0 and the others can watch the round beside
// the descriptor round (Note [Watching the linear round]).
class LinearSide {
 public:
  // `slot`: the largest message any rank sends (a Verdict and the largest
  // payload carried). `carried`/`bytes`/`partial`: this rank's AllReduce
  // in the round (rank 0 reduces into `partial`), or nullptr/0.
  LinearSide(Channel& channel, const Header& header, size_t slot, const Carried* carried,
             size_t bytes, unsigned char* partial, DescriptorStaging* staging)
      : channel_(channel),
        header_(header),
        p_(channel.size()),
        slot_(slot),
        carried_(carried),
        bytes_(bytes),
        partial_(partial),
        st_(*staging),
        verdict_{header, Header{}} {}
  ~LinearSide() { Release(); }

  // Rank 0 posts every rank's receive; another rank its answer's receive
  // and, where `send` (it opened the linear round), its message (`message`,
  // `length` bytes, kept valid until the side is done). A rank watching
  // the round sends its message only when rank 0 asks for it.
  void Post(const unsigned char* message, size_t length, bool send) {
    if (channel_.rank() == 0) {
      st_.pending.assign(p_ - 1, Pending{});
      st_.requests.assign(p_ - 1, Pending{});
      if (st_.gather.size() < slot_ * (p_ - 1)) st_.gather.resize(slot_ * (p_ - 1));
      for (int r = 1; r < p_; ++r) {
        channel_.PostRecv(r, Message(r), slot_, MakeTag(header_.seq, 0, kLinearGather + r),
                          &st_.pending[r - 1]);
      }
      return;
    }
    message_ = message;
    length_ = length;
    if (st_.gather.size() < slot_) st_.gather.resize(slot_);
    PostAnswer();
    if (send) Send();
  }

  // Rank 0: whether any rank's message has arrived.
  bool AnyArrived() const {
    for (const Pending& q : st_.pending) {
      if (q.done) return true;
    }
    return false;
  }
  // Rank 0: asks every rank whose message has not arrived for it (once).
  void Request() {
    if (requested_) return;
    requested_ = true;
    Verdict ask{};
    ask.first.magic = kRequestMagic;
    ask.first.seq = header_.seq;
    std::memcpy(&st_.request, &ask, sizeof(ask));
    for (int r = 1; r < p_; ++r) {
      if (st_.pending[r - 1].done) continue;
      channel_.PostSend(r, &st_.request, sizeof(st_.request),
                        MakeTag(header_.seq, 0, kLinearAnswer), &st_.requests[r - 1]);
    }
  }

  // Rank 0: takes in, in rank order, the messages that have arrived (all of
  // them, waiting, where `wait`). Returns the first malformed message or
  // failed wait; *all: every rank's is in, and verdict() is the world's.
  absl::Status Gather(bool wait, bool* all) {
    while (next_ < p_) {
      Pending& q = st_.pending[next_ - 1];
      if (!wait && !q.done) break;
      if (absl::Status s = channel_.Finish(&q, "descriptor receive"); !s.ok()) return s;
      const unsigned char* message = Message(next_);
      const absl::StatusOr<Verdict> theirs =
          ReceivedVerdict(message, q.length, next_, next_, next_);
      if (!theirs.ok()) return theirs.status();
      const Verdict merged = Merge(verdict_, *theirs);
      if (carried_ != nullptr && Clean(merged)) {
        if (absl::Status c = CheckCarried(q.length, bytes_, next_, header_); !c.ok()) return c;
        if (bytes_ > 0) {
          Reduce(partial_, message + sizeof(Verdict), partial_, header_.count,
                 static_cast<DataType>(header_.type), static_cast<ReduceOp>(header_.op));
        }
      }
      verdict_ = merged;
      ++next_;
    }
    *all = next_ == p_;
    return absl::OkStatus();
  }

  // Rank 0 in the linear round: Gather, waiting; asks the ranks still
  // missing for their messages once `after` has passed.
  absl::Status GatherAll(absl::Duration after) {
    const absl::Time ask_at = absl::Now() + after;
    bool all = false;
    while (!requested_) {
      if (absl::Status s = Gather(/*wait=*/false, &all); !s.ok() || all) return s;
      if (absl::Now() >= ask_at) {  // every poll: a poll may have slept (Channel::Progress)
        Request();
        break;
      }
      if (absl::Status s = channel_.Progress(next_); !s.ok()) {
        if (!absl::IsDeadlineExceeded(s)) return s;  // as Channel::Finish words it
        return absl::DeadlineExceededError(absl::StrCat(s.message(), " (descriptor receive)"));
      }
    }
    return Gather(/*wait=*/true, &all);
  }

  // Rank 0, once every rank's message is in: sends every rank the verdict
  // and, while clean, `bytes` of `partial` (the result).
  absl::Status Answer() {
    std::memcpy(&st_.out, &verdict_, sizeof(verdict_));
    st_.answers.assign(p_ - 1, Pending{});
    std::vector<unsigned char>& tx = st_.tx;
    const size_t out = sizeof(Verdict) + (Clean(verdict_) ? bytes_ : 0);
    if (out > sizeof(Verdict)) {
      std::memcpy(tx.data(), &verdict_, sizeof(verdict_));  // partial_ follows it in tx
    }
    const void* message = out > sizeof(Verdict) ? static_cast<const void*>(tx.data())
                                                : static_cast<const void*>(&st_.out);
    for (int r = 1; r < p_; ++r) {
      channel_.PostSend(r, message, out, MakeTag(header_.seq, 0, kLinearAnswer),
                        &st_.answers[r - 1]);
    }
    for (Pending& q : st_.requests) {
      if (q.peer < 0) continue;  // not asked
      if (absl::Status s = channel_.Finish(&q, "descriptor send"); !s.ok()) return s;
    }
    for (Pending& q : st_.answers) {
      if (absl::Status s = channel_.Finish(&q, "descriptor send"); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Another rank: whether something came on the answer's tag (an answer or
  // a request), without waiting.
  bool Answered() const { return answer_.done; }
  // Another rank: waits for the answer and takes it in: the world's
  // verdict, and where `carried_` and clean, the result into
  // carried_->recv. A request met on the way sends this rank's message,
  // where it has not gone yet.
  absl::Status TakeAnswer() {
    for (;;) {
      if (absl::Status s = channel_.Finish(&answer_, "descriptor receive"); !s.ok()) return s;
      if (!IsRequest(st_.gather.data(), answer_.length, header_.seq)) break;
      if (requested_) {
        return absl::DataLossError("rank 0 asked twice for this rank's collective descriptor");
      }
      requested_ = true;
      if (sent_.peer < 0) Send();
      PostAnswer();
    }
    if (sent_.peer < 0) {
      return absl::DataLossError(
          "rank 0 answered a rank whose collective descriptor it had not received");
    }
    if (absl::Status s = channel_.Finish(&sent_, "descriptor send"); !s.ok()) return s;
    const absl::StatusOr<Verdict> world =
        ReceivedVerdict(st_.gather.data(), answer_.length, 0, p_ - 1, 0);
    if (!world.ok()) return world.status();
    verdict_ = *world;
    if (carried_ == nullptr || !Clean(verdict_)) return absl::OkStatus();
    if (absl::Status c = CheckCarried(answer_.length, bytes_, 0, header_); !c.ok()) return c;
    if (bytes_ > 0) std::memcpy(carried_->recv, st_.gather.data() + sizeof(Verdict), bytes_);
    return absl::OkStatus();
  }

  const Verdict& verdict() const { return verdict_; }

  // Hands back whatever is still posted: a watching rank's unanswered
  // receives once the exchanges have decided, and error paths (idempotent).
  void Release() {
    channel_.Release(&answer_, /*is_recv=*/true);
    channel_.Release(&sent_, /*is_recv=*/false);
    if (channel_.rank() != 0) return;
    for (Pending& q : st_.pending) channel_.Release(&q, /*is_recv=*/true);
    for (Pending& q : st_.requests) channel_.Release(&q, /*is_recv=*/false);
    for (Pending& q : st_.answers) channel_.Release(&q, /*is_recv=*/false);
  }

 private:
  unsigned char* Message(int r) { return st_.gather.data() + slot_ * (r - 1); }
  void PostAnswer() {
    channel_.PostRecv(0, st_.gather.data(), slot_, MakeTag(header_.seq, 0, kLinearAnswer),
                      &answer_);
  }
  void Send() {
    channel_.PostSend(0, message_, length_,
                      MakeTag(header_.seq, 0, kLinearGather + channel_.rank()), &sent_);
  }

  Channel& channel_;
  const Header& header_;
  const int p_;
  const size_t slot_;
  const Carried* const carried_;
  const size_t bytes_;
  unsigned char* const partial_;
  DescriptorStaging& st_;
  Verdict verdict_;
  int next_ = 1;  // rank 0: the next rank whose message to take in
  // Rank 0: it has asked; another rank: it was asked.
  bool requested_ = false;
  const unsigned char* message_ = nullptr;  // another rank's message, and its length
  size_t length_ = 0;
  Pending answer_, sent_;  // sent_.peer < 0 until the message is posted
};

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

namespace {

// Element ranges of the partial.
struct Span {
  size_t lo, hi;
  size_t count() const { return hi - lo; }
};

// One rank's part of the descriptor round (DescriptorRound): the state its
// exchanges share, and each kind of exchange as a method.
class DescriptorExchange {
 public:
  DescriptorExchange(Channel& channel, const Header& header, const Carried* carried, size_t bytes,
                     size_t max_carried_bytes, DescriptorStaging* staging)
      : channel_(channel),
        header_(header),
        carried_(carried),
        layout_(channel.size()),
        rank_(channel.rank()),
        type_(static_cast<DataType>(header.type)),
        op_(static_cast<ReduceOp>(header.op)),
        bytes_(bytes),
        esz_(DataTypeSize(type_)),
        whole_{0, bytes > 0 ? static_cast<size_t>(header.count) : 0},
        staging_(*staging),
        v_{header, Header{}} {
    std::vector<unsigned char>& tx = staging_.tx;
    std::vector<unsigned char>& rx = staging_.rx;
    if (tx.size() < sizeof(Verdict) + bytes) tx.resize(sizeof(Verdict) + bytes);
    if (rx.size() < sizeof(Verdict) + max_carried_bytes) {
      rx.resize(sizeof(Verdict) + max_carried_bytes);
    }
    partial_ = tx.data() + sizeof(Verdict);  // this block's, while clean
    if (bytes > 0) std::memcpy(partial_, carried->send, bytes);
    staging_.rank0_pad = 0;
  }

  // Note [Watching the linear round]: where it may open or carry another
  // collective, rank 0 watches for its messages and every other rank for
  // rank 0's request or answer; Settled() tells when the linear round has
  // decided the collective (a mismatch) before the exchanges could, and
  // settled_ how.
  void WatchLinearRound(int64_t linear_bytes) {
    side_.emplace(channel_, header_, SlotBytes(static_cast<size_t>(linear_bytes)), nullptr, 0,
                  nullptr, &staging_);
    staging_.out = v_;
    side_->Post(reinterpret_cast<const unsigned char*>(&staging_.out), sizeof(Verdict),
                /*send=*/false);
  }

  absl::Status Run();

 private:
  bool Settled();
  absl::Status Finish(Pending* q, const char* what);
  absl::Status Exchange(int peer, ucp_tag_t tag, bool recv, void* in, size_t in_cap, bool send,
                        const void* out, size_t out_bytes, Pending* r, const char* recv_what,
                        const char* send_what);
  absl::Status Step(int peer, uint64_t index, bool send, Take take, int lo, int hi, Span give,
                    Span keep);
  absl::Status Halve(int me);
  absl::Status Double(int me);

  Channel& channel_;
  const Header& header_;
  const Carried* const carried_;
  const Layout layout_;
  const int rank_;
  const DataType type_;
  const ReduceOp op_;
  const size_t bytes_;
  const size_t esz_;
  const Span whole_;
  DescriptorStaging& staging_;
  unsigned char* partial_ = nullptr;
  Verdict v_;
  std::optional<LinearSide> side_;
  absl::Status settled_;
};

bool DescriptorExchange::Settled() {
  if (rank_ != 0) {
    if (!side_->Answered()) return false;
    settled_ = side_->TakeAnswer();
  } else {
    // A message of the linear round: some rank opened it, so the
    // exchanges cannot finish; rank 0 gathers every rank's descriptor.
    if (!side_->AnyArrived()) return false;
    side_->Request();
    bool all = false;
    settled_ = side_->Gather(/*wait=*/true, &all);
    if (settled_.ok()) settled_ = side_->Answer();
  }
  if (settled_.ok()) {
    settled_ = Clean(side_->verdict())
                   ? absl::DataLossError(
                         "the linear round gave a clean verdict beside recursive doubling")
                   : VerdictStatus(side_->verdict());
  }
  return true;
}

// Finishes `q`, watching the linear round where it may run instead.
absl::Status DescriptorExchange::Finish(Pending* q, const char* what) {
  while (side_.has_value() && !q->done) {
    if (Settled()) return settled_;
    if (absl::Status s = channel_.Progress(q->peer); !s.ok()) {
      // As Channel::Finish words it.
      if (!absl::IsDeadlineExceeded(s)) return s;
      return absl::DeadlineExceededError(absl::StrCat(s.message(), " (", what, ")"));
    }
  }
  // Note [A peer that left first]: a send that failed because its partner
  // has its verdict and left; rank 0's answer may still be on its way.
  if (side_.has_value() && q->done && q->status != UCS_OK) {
    const absl::Time until = absl::Now() + kPeerGoneGrace;
    while (absl::Now() < until) {
      if (Settled()) return settled_;
      if (absl::Status s = channel_.Progress(-1); !s.ok()) return s;
    }
  }
  return channel_.Finish(q, what);
}

// Posts the receive of up to `in_cap` bytes into `in` (when `recv`) and
// the send of `out_bytes` from `out` (when `send`) on `tag`, and finishes
// both; a failure releases both.
absl::Status DescriptorExchange::Exchange(int peer, ucp_tag_t tag, bool recv, void* in,
                                          size_t in_cap, bool send, const void* out,
                                          size_t out_bytes, Pending* r, const char* recv_what,
                                          const char* send_what) {
  Pending s;
  if (recv) channel_.PostRecv(peer, in, in_cap, tag, r);
  if (send) channel_.PostSend(peer, out, out_bytes, tag, &s);
  absl::Status status;
  if (recv) status = Finish(r, recv_what);
  if (status.ok() && send) status = Finish(&s, send_what);
  if (!status.ok()) {
    channel_.Release(r, /*is_recv=*/true);
    channel_.Release(&s, /*is_recv=*/false);
  }
  return status;
}

// Sends this block's verdict, and while clean the partial's elements
// `give`, to `peer` when `send`; takes in the peer's message, whose
// verdict must speak for ranks lo .. hi, and while the merged verdict is
// clean combines the elements it carries into the partial's `keep` (as
// `take` says: the lower block's partial first, or adopted).
absl::Status DescriptorExchange::Step(int peer, uint64_t index, bool send, Take take, int lo,
                                      int hi, Span give, Span keep) {
  std::vector<unsigned char>& rx = staging_.rx;
  const size_t give_bytes = Clean(v_) ? give.count() * esz_ : 0;
  // The verdict and the elements, contiguous: tx holds the whole
  // partial behind the verdict; a part of it goes through staging's half.
  unsigned char* message = staging_.tx.data();
  if (give_bytes > 0 && give.lo != whole_.lo) {
    std::vector<unsigned char>& half = staging_.half;
    if (half.size() < sizeof(Verdict) + give_bytes) half.resize(sizeof(Verdict) + give_bytes);
    std::memcpy(half.data() + sizeof(Verdict), partial_ + give.lo * esz_, give_bytes);
    message = half.data();
  }
  std::memcpy(message, &v_, sizeof(v_));
  Pending r;
  if (absl::Status s = Exchange(peer, MakeTag(header_.seq, 0, index), take != Take::kNothing,
                                rx.data(), rx.size(), send, message, sizeof(Verdict) + give_bytes,
                                &r, "descriptor receive", "descriptor send");
      !s.ok()) {
    return s;
  }
  if (take == Take::kNothing) return absl::OkStatus();
  const absl::StatusOr<Verdict> theirs = ReceivedVerdict(rx.data(), r.length, lo, hi, peer);
  if (!theirs.ok()) return theirs.status();
  const Verdict merged = take == Take::kAdopt        ? *theirs
                         : take == Take::kMergeLower ? Merge(*theirs, v_)
                                                     : Merge(v_, *theirs);
  if (carried_ != nullptr && Clean(merged)) {
    const size_t keep_bytes = keep.count() * esz_;
    if (absl::Status c = CheckCarried(r.length, keep_bytes, peer, header_); !c.ok()) return c;
    const unsigned char* other = rx.data() + sizeof(Verdict);
    unsigned char* mine = partial_ + keep.lo * esz_;
    if (keep_bytes > 0 && take == Take::kAdopt) std::memcpy(mine, other, keep_bytes);
    if (keep_bytes > 0 && take == Take::kMergeLower) {
      Reduce(other, mine, mine, keep.count(), type_, op_);
    }
    if (keep_bytes > 0 && take == Take::kMergeUpper) {
      Reduce(mine, other, mine, keep.count(), type_, op_);
    }
  }
  v_ = merged;
  return absl::OkStatus();
}

// Note [Rabenseifner]: the exchanges as a reduce-scatter by recursive
// halving, then, while clean, the allgather by recursive doubling.
// Segments are in elements; seg[k] is this rank's before exchange k.
absl::Status DescriptorExchange::Halve(int me) {
  Span seg[32];
  Span mine = whole_;
  for (int k = 0; k < layout_.rounds; ++k) {
    const int other = me ^ (1 << k);
    const int base = other & ~((1 << k) - 1);
    const bool lower_peer = other < me;  // the peer keeps the lower half
    const size_t mid = mine.lo + mine.count() / 2;
    const Span keep = lower_peer ? Span{mid, mine.hi} : Span{mine.lo, mid};
    const Span give = lower_peer ? Span{mine.lo, mid} : Span{mid, mine.hi};
    seg[k] = mine;
    if (absl::Status s = Step(layout_.Real(other), 1 + k, true,
                              lower_peer ? Take::kMergeLower : Take::kMergeUpper, layout_.Lo(base),
                              layout_.Hi(base + (1 << k) - 1), give, keep);
        !s.ok()) {
      return s;
    }
    mine = keep;
  }
  if (!Clean(v_)) return absl::OkStatus();
  if (op_ == ReduceOp::kAvg && mine.count() > 0) {
    FinishAvg(partial_ + mine.lo * esz_, mine.count(), type_, layout_.p);
  }
  for (int k = layout_.rounds - 1; k >= 0; --k) {
    const int peer = layout_.Real(me ^ (1 << k));
    const size_t mid = seg[k].lo + seg[k].count() / 2;
    const bool kept_lower = ((me >> k) & 1) == 0;
    const Span theirs = kept_lower ? Span{mid, seg[k].hi} : Span{seg[k].lo, mid};
    const size_t in = theirs.count() * esz_, out = mine.count() * esz_;
    Pending r;
    if (absl::Status s = Exchange(peer, MakeTag(header_.seq, 0, layout_.rounds + 2 + k), in > 0,
                                  partial_ + theirs.lo * esz_, in, out > 0,
                                  partial_ + mine.lo * esz_, out, &r, "allgather receive",
                                  "allgather send");
        !s.ok()) {
      return s;
    }
    if (in > 0 && r.length != in) {
      return absl::DataLossError(absl::StrCat("rank ", peer, " sent ", r.length, " bytes of ", in,
                                              " in the allgather of ", Describe(header_)));
    }
    mine = seg[k];
  }
  return absl::OkStatus();
}

// Recursive doubling: every exchange carries the whole partial.
absl::Status DescriptorExchange::Double(int me) {
  for (int k = 0; k < layout_.rounds; ++k) {
    const int other = me ^ (1 << k);
    const int base = other & ~((1 << k) - 1);  // the peer's block, virtual ranks
    const Take take = other < me ? Take::kMergeLower : Take::kMergeUpper;
    if (absl::Status s = Step(layout_.Real(other), 1 + k, true, take, layout_.Lo(base),
                              layout_.Hi(base + (1 << k) - 1), whole_, whole_);
        !s.ok()) {
      return s;
    }
  }
  if (bytes_ > 0 && Clean(v_) && op_ == ReduceOp::kAvg) {
    FinishAvg(partial_, header_.count, type_, layout_.p);
  }
  return absl::OkStatus();
}

absl::Status DescriptorExchange::Run() {
  const int p = layout_.p;
  const bool paired = rank_ < 2 * layout_.extra;
  const bool sits_out = paired && rank_ % 2 == 0;
  if (paired) {
    absl::Status s = sits_out ? Step(rank_ + 1, 0, true, Take::kNothing, 0, 0, whole_, whole_)
                              : Step(rank_ - 1, 0, false, Take::kMergeLower, rank_ - 1, rank_ - 1,
                                     whole_, whole_);
    if (!s.ok()) return s;
  }
  if (!sits_out) {
    const int me = paired ? rank_ / 2 : rank_ - layout_.extra;
    const bool halving = carried_ != nullptr && carried_->halving && bytes_ > 0;
    if (absl::Status s = halving ? Halve(me) : Double(me); !s.ok()) return s;
  }
  if (paired) {
    const uint64_t last = layout_.rounds + 1;
    absl::Status s = sits_out ? Step(rank_ + 1, last, false, Take::kAdopt, 0, p - 1, whole_, whole_)
                              : Step(rank_ - 1, last, true, Take::kNothing, 0, 0, whole_, whole_);
    if (!s.ok()) return s;
  }
  if (side_.has_value()) {
    // Every rank ran the exchanges (each needs every rank's message), so
    // no rank opened the linear round: nothing was sent on its tags, and
    // what this rank posted for them is cancelled.
    if (rank_ == 0 && side_->AnyArrived()) {
      return absl::DataLossError(
          "a rank opened the linear round while every rank ran recursive doubling");
    }
    side_->Release();
  }
  if (absl::Status m = VerdictStatus(v_); !m.ok()) return m;
  if (bytes_ > 0) std::memcpy(carried_->recv, partial_, bytes_);
  staging_.rank0_pad = v_.first.pad;
  return absl::OkStatus();
}

}  // namespace

absl::Status DescriptorRound(Channel& channel, const Header& header, const Carried* carried,
                             size_t max_carried_bytes, DescriptorStaging* staging,
                             int64_t linear_bytes) {
  const absl::StatusOr<size_t> bytes = CarriedBytes(header, carried, max_carried_bytes);
  if (!bytes.ok()) return bytes.status();
  DescriptorExchange x(channel, header, carried, *bytes, max_carried_bytes, staging);
  if (linear_bytes >= 0) x.WatchLinearRound(linear_bytes);
  return x.Run();
}

absl::Status LinearRound(Channel& channel, const Header& header, const Carried* carried,
                         size_t max_carried_bytes, DescriptorStaging* staging) {
  static_assert(kLinearGather + kMaxWorld <= kLinearAnswer, "linear round tags overlap");
  const absl::StatusOr<size_t> carried_bytes = CarriedBytes(header, carried, max_carried_bytes);
  if (!carried_bytes.ok()) return carried_bytes.status();
  const size_t bytes = *carried_bytes;
  std::vector<unsigned char>& tx = staging->tx;
  if (tx.size() < sizeof(Verdict) + bytes) tx.resize(sizeof(Verdict) + bytes);
  unsigned char* partial = tx.data() + sizeof(Verdict);
  if (bytes > 0) std::memcpy(partial, carried->send, bytes);
  const Verdict mine{header, Header{}};
  std::memcpy(tx.data(), &mine, sizeof(mine));
  LinearSide side(channel, header, SlotBytes(max_carried_bytes), carried, bytes, partial, staging);
  side.Post(tx.data(), sizeof(Verdict) + bytes, /*send=*/true);
  staging->rank0_pad = 0;
  if (channel.rank() != 0) {
    if (absl::Status s = side.TakeAnswer(); !s.ok()) return s;
    staging->rank0_pad = side.verdict().first.pad;
    return VerdictStatus(side.verdict());
  }
  if (absl::Status s = side.GatherAll(kRequestAfter); !s.ok()) return s;
  const bool clean = Clean(side.verdict());
  if (bytes > 0 && clean && static_cast<ReduceOp>(header.op) == ReduceOp::kAvg) {
    FinishAvg(partial, header.count, static_cast<DataType>(header.type), channel.size());
  }
  if (absl::Status s = side.Answer(); !s.ok()) return s;
  if (!clean) return VerdictStatus(side.verdict());
  if (bytes > 0) std::memcpy(carried->recv, partial, bytes);
  staging->rank0_pad = header.pad;
  return absl::OkStatus();
}

}  // namespace fusebox::comm::ucx
