// The UCX backend's opening round over messages: the ranks' descriptors
// compared by recursive doubling, with small and medium AllReduce carried in
// the same messages.
//
//   DescriptorStaging staging;   // per communicator, reused
//   absl::Status s = DescriptorRound(channel, header, &carry /*or nullptr*/,
//                                    table.carried_bytes(), &staging);
//
// Note [Descriptor round]
// Over messages (no shared-memory exchange: ranks on several hosts, or on
// one with shared memory off, other transports or peer-failure detection)
// every collective opens with recursive doubling over the ranks' headers
// instead of an all-to-all header round: log2(q) pairwise exchanges among q ranks,
// q the largest power of two <= p; where p is not one, the first 2(p - q)
// ranks pair up before and after (the even one hands its message to the
// odd one and sits the exchanges out). That is q log2(q) + 2(p - q)
// messages where the header round sends p(p - 1): 24 instead of 56 at 8
// ranks, and over TCP each message costs both ends kernel time.
// Each message carries a Verdict on the block of ranks its sender speaks
// for (itself, then 2, 4, ... ranks): the header of the block's lowest rank,
// and that of the block's lowest rank whose header differs from it. Merging
// two adjacent blocks' verdicts gives the union's (Merge), so after the last
// exchange every rank holds the verdict on the whole world, rank 0's header
// and the lowest rank that called something else, and every rank fails a
// mismatch with the same message as the header round's, before any
// algorithm moves data and with no user buffer written.
// AllReduce up to the table's carried size rides in the same messages:
// while the verdict is clean, a message also carries its sender's partial,
// and each exchange combines the lower block's partial first, so both
// partners compute the same bits and every rank ends with the same result.
// The round is then the whole collective (log2(q) rounds of latency, one
// more on each side where p is not a power of two). Every other collective
// runs its algorithm after a clean round; for Barrier the round is the
// whole collective (no rank leaves it before every rank has entered).
// Every collective, whatever its kind and size, opens with the same
// exchanges (tag step 0, index: 0 the hand-over, 1 + k exchange k,
// log2(q) + 1 the hand-back), so ranks that called different things still
// meet there and fail together: none waits for a message that a peer's
// algorithm never sends. Receives are sized for the largest partial any
// rank may carry, so a longer message than expected is read and judged,
// never truncated. (Rabenseifner's allgather, index log2(q) + 2 + k, runs
// only after a clean verdict, which every rank holds alike.)
//
// Note [Linear round]
// Where messages cost CPU time the ranks do not have (a machine running more
// ranks than cores, every message kernel time on both ends), the number of
// messages matters more than rounds of latency. There the ranks open every
// collective with the linear round instead (UcxOptions::opening): every
// rank sends its header (and, for AllReduce up to linear_bytes, its data) to
// rank 0, which merges the verdicts in rank order (Merge with a block of one
// rank at a time), reduces the data in rank order, and sends each rank the
// world's verdict and, while clean, the result: 2(p-1) messages, 14 at 8
// ranks where the descriptor round sends 24. Every rank gets rank 0's bits.
// Rank r's message has tag index kLinearGather + r, so rank 0 matches each
// rank's message to that rank (UCX matches tags, not senders), and the
// answer kLinearAnswer; the descriptor round's indexes stay below both, so
// one collective may run both (recursive doubling for AllReduce above
// linear_bytes, with the linear round watched beside it). As with the descriptor round, every
// collective opens with the same messages, receives are sized for the
// largest payload any rank may carry, and a mismatch fails every rank with
// the same message before any user buffer is written.
// AllReduce above linear_bytes that recursive doubling carries runs the
// descriptor round, with the linear round watched beside it so that it
// still fails like every other collective where ranks called different
// things (Note [Watching the linear round]).
// Rank 0's receives are whole cache lines apart, so every payload it
// reduces is aligned.
//
// Note [Watching the linear round]
// Where the linear round opens collectives (or carries a measured class's
// AllReduce, Note [Measured choice] in measured_choice.h), a rank that runs
// the descriptor round (an AllReduce in recursive doubling's or
// Rabenseifner's range, or any collective where the linear round only
// carries measured classes) could meet ranks in the linear round: they send only to
// rank 0 and wait for its answer, while it waits for exchanges they never
// send. So beside the exchanges rank 0 posts the linear round's receives
// and every other rank the answer's, and nothing more is sent while every
// rank runs the exchanges: they finish (each needs every rank's message,
// so no rank opened the linear round) and the receives are cancelled.
// Otherwise someone asks for the descriptors the linear round lacks:
// * Rank 0 beside the exchanges, once any linear message arrives (a
//   mismatch, then), sends a request on the answer's tag to every rank
//   whose message has not arrived, gathers every rank's, and answers the
//   world's verdict.
// * Rank 0 in the linear round, once it has waited kRequestAfter (50 ms)
//   for the rest, asks those still missing: only then, as a rank that is
//   merely late, or whose message is still arriving, costs a message and a
//   wake-up when asked, while a rank running the exchanges is stuck until
//   asked (a mismatch, which may take that long to report).
// A rank asked sends its descriptor if it has not yet (a rank in the
// linear round has; its request is then ignored), re-posts the answer's
// receive and waits for the verdict, which comes after any request on the
// same tag (UCX matches one sender's messages on a tag in order). Every
// rank then fails with the message either round would give. A rank asked
// has always posted, or will post, the answer's receive the request meets,
// so no message is left unmatched where the ranks agree.
// The earlier design sent every rank's descriptor to rank 0 beside the
// exchanges whatever happened: 7 more messages at 8 ranks, each kernel time
// on cores the ranks share, and rank 0 took them all in before it
// finished. Against it, on 8 emulated hosts sharing 2 cores (blocking
// AllReduce, per-round ratios of interleaved runs,
// commit 7e1ba59): 0.85x the time at 8 KiB, 0.84x at
// 16 KiB and 0.89x at 32 KiB over 4 Gbit (faster in 16, 15 and 13 of 16
// rounds); 0.84x at 8 KiB over 1 Gbit (12 of 12), 0.98-0.99x at 16-32 KiB;
// unchanged at 8 B-4 KiB, where the linear round carries the data.
//
// Note [Rabenseifner]
// Recursive doubling sends every rank's whole partial in each of its
// log2(q) exchanges; above a few tens of KiB across hosts the bytes cost
// more than the rounds. There (Carried::halving; the table's range, where
// p is a power of two of at least 4) the same exchanges run a reduce-scatter by
// recursive halving: in exchange k the partners (virtual ranks that differ
// in bit k, and so hold the same segment) split their segment in two, the
// lower rank keeping the lower half; each sends the half it gives up
// behind its verdict and combines the half it keeps, the lower block's
// partial first. After log2(q) exchanges each rank holds its segment of
// the result (1/q of it, give or take an element; empty where the count is
// below q) and, as before, the world's verdict. While clean, an allgather by
// recursive doubling (index log2(q) + 2 + k, the exchanges in reverse)
// sends each rank's segment to the partner of each exchange, doubling it,
// with no verdict (every rank holds the same). Every element is combined
// by the tree recursive doubling uses (block 2^k with block 2^k in rank
// order), once, so the bits are recursive doubling's and every rank's are
// the same. 2(q-1)/q of the data leaves each rank in 2 log2(q) rounds.
// A mismatch is judged as in recursive doubling: the verdicts ride in the
// same exchanges, a clean merge means the partners split the same count,
// and a dirty one ends the data (every rank then skips the allgather, as
// every rank holds the same verdict).
#ifndef FUSEBOX_COMM_UCX_DESCRIPTOR_ROUND_H_
#define FUSEBOX_COMM_UCX_DESCRIPTOR_ROUND_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/ucx/channel.h"
#include "comm/ucx/header.h"

namespace fusebox::comm::ucx {

// What a block of consecutive ranks found (a wire format).
struct Verdict {
  Header first;   // the header of the block's lowest rank
  Header differ;  // of its lowest rank whose call differs from `first`'s; magic 0: none
};
static_assert(sizeof(Verdict) == 64, "Verdict is a wire format");

inline bool Clean(const Verdict& v) { return v.differ.magic == 0; }
// The verdict of a block that `lower` and then `upper` make up.
Verdict Merge(const Verdict& lower, const Verdict& upper);
// OK for a clean verdict; else InvalidArgument naming both calls, e.g.
// "collective mismatch across ranks: rank 0 called AllReduce(count=10, ...)
// but rank 2 called AllReduce(count=100, ...)".
absl::Status VerdictStatus(const Verdict& v);

// The AllReduce carried by a round: `header` gives count, type and op.
struct Carried {
  const void* send = nullptr;
  void* recv = nullptr;  // may equal send (in place); written only after a clean round
  bool halving = false;  // Note [Rabenseifner]: reduce-scatter in the exchanges, then allgather
};

// Buffers of the round, kept across collectives.
struct DescriptorStaging {
  std::vector<unsigned char> tx;  // Verdict + this rank's partial
  std::vector<unsigned char> rx;  // Verdict + the largest partial a peer may carry
  // Rabenseifner: Verdict + the half this rank gives up, where that half
  // does not start the partial (otherwise it goes from tx).
  std::vector<unsigned char> half;
  // The linear round's (Note [Linear round]): rank 0's receives of every
  // rank's message, or another rank's receive of the answer; rank 0's
  // receives in flight; and the verdict this rank sends.
  std::vector<unsigned char> gather;
  std::vector<Pending> pending;
  // Rank 0's sends of its request for a rank's descriptor and of the
  // answer, and the request itself (Note [Watching the linear round]).
  std::vector<Pending> requests;
  std::vector<Pending> answers;
  Verdict out{};
  Verdict request{};
  // After a clean round: the pad byte of rank 0's header, which every rank
  // holds in the world's verdict (Note [Measured choice] in
  // measured_choice.h).
  uint8_t rank0_pad = 0;
};

// Tag indexes of the linear round (step 0): rank r's message to rank 0 is
// kLinearGather + r, rank 0's answers kLinearAnswer.
inline constexpr uint64_t kLinearGather = uint64_t{1} << 20;
inline constexpr uint64_t kLinearAnswer = uint64_t{1} << 21;

// Note [Watching the linear round]: how long rank 0, in the linear round,
// waits for every rank's message before it asks the ranks still missing.
// Only ranks that called something else need asking, so it is long enough
// that a rank merely late (descheduled, or still computing) is rarely asked.
inline constexpr absl::Duration kRequestAfter = absl::Milliseconds(50);

// Runs the round for this rank's `header` (its sender must be the channel's
// rank), carrying `carried` when not null. `max_carried_bytes`: the largest
// AllReduce any rank carries (the same on every rank; the table's). Returns
// the verdict's status, or the first transport error, deadline or malformed
// message (DataLoss). Where the linear round opens the other collectives
// or may carry a measured AllReduce (Note [Measured choice] in
// measured_choice.h), `linear_bytes` is its limit (the table's) and the
// linear round is watched beside the exchanges (Note [Watching the linear
// round]); otherwise -1.
absl::Status DescriptorRound(Channel& channel, const Header& header, const Carried* carried,
                             size_t max_carried_bytes, DescriptorStaging* staging,
                             int64_t linear_bytes = -1);

// Note [Linear round]: as DescriptorRound, with every rank's message going
// to rank 0 and rank 0 answering each; `max_carried_bytes` is the largest
// AllReduce any rank carries in it (the table's linear_bytes).
absl::Status LinearRound(Channel& channel, const Header& header, const Carried* carried,
                         size_t max_carried_bytes, DescriptorStaging* staging);

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_DESCRIPTOR_ROUND_H_
