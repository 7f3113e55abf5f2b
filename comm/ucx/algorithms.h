// The UCX backend's choice of algorithm per collective: a table built once
// per communicator from what every rank knows alike, then looked up by kind
// and size for each collective.
//
//   AlgorithmTable t = BuildAlgorithmTable(inputs);   // at Init
//   Algorithm a = t.Select(Kind::kAllReduce, bytes);  // per collective
//
// Note [Algorithm table]
// As UCC's score maps do, the choice is data, not control flow: for each
// collective kind, consecutive byte ranges covering [0, SIZE_MAX], each
// naming one algorithm. The ranges depend only on the inputs below, which
// are the same on every rank of a communicator (the world size, the
// published options that Init checks agree, and whether shared memory came
// up, which Init decides collectively), so every rank picks the same
// algorithm for the same collective and none can wait for a message its
// peers never send.
// The rows are not written here: each algorithm is a unit in algo/ that
// says which bytes of which kind it serves, with what score, and which
// measured classes it may run (Note [Algorithm units] in algo/unit.h);
// BuildAlgorithmTable takes, for every size, the unit of the highest score,
// then adds the measured classes as a layer over the ranges. What follows
// is what the units' registrations add up to.
// Where the shared-memory exchange carries the header round (one host), or
// the world is one rank, the rows, in the order they are tried:
// * Barrier: the header round alone (kNone).
// * Up to small_bytes: one-shot. The payload rides in the header round and
//   each rank combines every rank's contribution in rank order.
//   small_bytes is the option, or kOversubscribedSmallBytes where ranks
//   outnumber the host's cores, the shared-memory exchange carries the
//   header round, the option did not turn one-shot off (0) and there are at
//   most kOversubscribedSmallMaxRanks ranks: there every synchronisation
//   costs a round of context switches, so one round (each rank reducing
//   every rank's copy) beats the three of the shared-memory allreduce.
// * One rank, above small_bytes: a local copy (kLocal).
// * AllReduce: the shared-memory allreduce. Broadcast: the pipelined chain.
//   AllGather: the ring.
// Over messages (ranks on several hosts) the descriptor round opens every
// collective instead (Note [Descriptor round] in descriptor_round.h):
// * Barrier: the descriptor round alone (kNone).
// * AllReduce up to max(small_message_bytes, recursive_doubling_bytes)
//   (less Rabenseifner's range below): recursive doubling inside the descriptor
//   round, log2(p) rounds (two more where p is not a power of two) where
//   the ring needs 2(p-1), each a round trip of latency across hosts.
//   Where the world is a power of two of at least 4 ranks, AllReduce above
//   rabenseifner_from_bytes (Note [Recursive doubling or Rabenseifner]) up
//   to rabenseifner_bytes: Rabenseifner's algorithm inside the descriptor
//   round (Note [Rabenseifner] in descriptor_round.h), the ring's bytes in
//   2 log2(p) rounds instead of 2(p-1).
//   Above it the ring, which moves 2(p-1)/p of the data per rank where
//   recursive doubling moves log2(p) times all of it (or the shared-memory
//   allreduce, where every rank mapped every segment but the mailboxes
//   were too large for the exchange).
// * Broadcast: the pipelined chain; AllGather: the ring.
// Where the linear round opens instead (UcxOptions::opening: forced, or by
// default where some machine runs more ranks than it has cores and the
// world has at least kLinearMinRanks ranks; Note [Linear round]):
// * AllReduce up to linear_bytes: inside the linear round (kLinearAllReduce);
//   above it recursive doubling (and Rabenseifner) inside the descriptor
//   round, the linear round watched beside it, then the ring. The rest as
//   above.
// Over messages in a world of at least 3 ranks, AllReduce of kMeasuredFromBytes
// up to UcxOptions::measured_choice_bytes (512 KiB by default; 0: none) is split into size
// classes (each twice the last) whose algorithm is measured (Note [Measured choice] in
// measured_choice.h); the ranges above are the choice until then. Each class's
// candidates, in this order: Rabenseifner where the world is a power of
// two of at least 4 ranks (and rabenseifner_bytes reaches the class); the
// ring (the table's algorithm above the carried range) in classes from
// kMeasuredRingFromBytes; recursive doubling; the linear round in classes
// up to kMeasuredLinearMaxBytes where some machine runs more ranks than it
// has cores (or the linear round opens), the opening is not forced to
// recursive doubling and the world has at most kMeasuredLinearMaxRanks
// ranks. A class with one candidate is left to the table; one beyond what
// the table carries in a round ends the classes (above it the ring alone).
// Where the linear round is a candidate it carries up to its last class's
// end and is watched beside every descriptor round.
#ifndef FUSEBOX_COMM_UCX_ALGORITHMS_H_
#define FUSEBOX_COMM_UCX_ALGORITHMS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "comm/options.h"
#include "comm/types.h"

namespace fusebox::comm::ucx {

using Kind = CollectiveKind;  // its values are part of the header's wire format
inline absl::string_view KindName(Kind k) { return CollectiveKindName(k); }

enum class Algorithm : uint8_t {
  kNone,                        // the opening round (header or descriptor) is the whole collective
  kOneShot,                     // payload in the header round; every rank combines all
  kLocal,                       // one rank: a local copy
  kShmAllReduce,                // shm_allreduce.h
  kRingAllReduce,               // ring reduce-scatter + allgather, pipelined in chunks
  kRecursiveDoublingAllReduce,  // inside the descriptor round (descriptor_round.h)
  kLinearAllReduce,             // inside the linear round (descriptor_round.h)
  kRabenseifnerAllReduce,       // recursive halving + doubling in the descriptor round
  kChainBroadcast,              // pipelined chain from the root
  kRingAllGather,
};
const char* AlgorithmName(Algorithm a);

// The small-message threshold where ranks outnumber cores (Note [Algorithm
// table]; measured at 4 ranks on 2 cores), and up to how many ranks.
inline constexpr size_t kOversubscribedSmallBytes = size_t{32} << 10;
inline constexpr int kOversubscribedSmallMaxRanks = 8;

// The smallest world where the linear round opens by default. Below it
// the linear round saves too few messages: at 2 ranks it sends as many as
// recursive doubling in twice the rounds; at 4, 6 against 8 in as many
// rounds, and on 4 emulated hosts sharing 2 cores it was no faster
// (8-512 B: 126-132 us against 120-122, medians of 8 interleaved runs). At
// 5-7 ranks recursive doubling adds a hand-over and a hand-back; at 6
// hosts the linear round took 198-245 us against 222-282 (64 B-4 KiB), and
// at 8 hosts 240-360 against 410-530.
inline constexpr int kLinearMinRanks = 5;

// Note [Algorithm table]: where the measured classes start (exclusive);
// the largest world, and the largest class, where the linear round is a
// candidate (rank 0 receives p - 1 messages of up to 64 KiB; OpenMPI's
// linear allreduce already lost to recursive doubling and Rabenseifner at
// 32 KiB, commit 2a2c117); and the
// smallest class where the ring is. The ring's 2(p-1) rounds lose to
// Rabenseifner's 2 log2(p) where rounds dominate, but its bytes arrive
// steadily in chunks where Rabenseifner's halves arrive in bursts: on 8
// emulated hosts over 1 Gbit it took about 0.6-0.8x Rabenseifner's time
// at 128-512 KiB, and about 2x over 4 Gbit at 128 KiB
// (commit 2147d62).
inline constexpr size_t kMeasuredFromBytes = size_t{4} << 10;
inline constexpr int kMeasuredLinearMaxRanks = 16;
inline constexpr size_t kMeasuredLinearMaxBytes = size_t{64} << 10;
inline constexpr size_t kMeasuredRingFromBytes = size_t{32} << 10;

// Note [Recursive doubling or Rabenseifner]
// Where the world is a power of two of at least 4 ranks, AllReduce over
// messages can run recursive doubling (log2(p) rounds, each sending the
// whole vector: L (a + m b), L = log2 p) or Rabenseifner (2L rounds moving
// 2(p-1)/p of it in all: 2 L a + 2 (p-1)/p m b), a the cost of a round and
// b the time per byte. Rabenseifner wins above m* = L a / ((L - 2(p-1)/p) b),
// which depends on the link: on 4 emulated hosts (a ~ 35 us on shared
// cores) about 17 KB over 1 Gbit and 70 KB over 4 Gbit. Measured, fusebox's
// own two (blocking, 2 interleaved rounds, perf/cluster hosts sharing 2
// cores, commit f1c0d16): at 8 KiB neither was
// faster in 3 of 4 settings (recursive doubling at 8 hosts over 1 Gbit);
// recursive doubling was faster up to 16 KiB at 8 hosts over 1 Gbit, 32
// KiB at 4 hosts over 4 Gbit and 64 KiB at 8 hosts over 4 Gbit;
// Rabenseifner from 16 KiB at 4 hosts over 1 Gbit. Rabenseifner therefore
// runs above UcxOptions::rabenseifner_from_bytes, 32 KiB by default: of 8,
// 16, 32 and 64 KiB it left the fewest and smallest losses at 16-64 KiB
// (64 KiB, recursive doubling's whole range before, took 1.33x
// Rabenseifner's time at 64 KiB at 4 hosts over 1 Gbit, 1.7x at 8 hosts,
// and 1.7-4.1x at 4 hosts over 4 Gbit). Rabenseifner ends at
// rabenseifner_bytes; where that is inside recursive doubling's range,
// recursive doubling resumes above it. A switch point measured per
// communicator (a and b from exchanges between rank pairs, then m*) was
// tried: on these shared cores the measured m* moved between 8 and 64 KiB
// from one communicator to the next on the same links, and chose worse.

// Everything the table depends on; equal on every rank (Note [Algorithm
// table]).
struct AlgorithmInputs {
  int world = 1;
  unsigned cores = 1;               // on this host
  size_t small_message_bytes = 0;   // UcxOptions::small_message_bytes
  size_t recursive_doubling_bytes = 0;  // UcxOptions::recursive_doubling_bytes
  size_t rabenseifner_bytes = 0;        // UcxOptions::rabenseifner_bytes
  // Where both apply, Rabenseifner above this many bytes instead of
  // recursive doubling (Note [Recursive doubling or Rabenseifner]);
  // SIZE_MAX: recursive doubling over its whole range.
  size_t rabenseifner_from_bytes = SIZE_MAX;
  bool shm_exchange = false;        // the header round goes through shared memory
  bool shm_allreduce = false;       // every rank mapped every segment
  UcxOptions::Opening opening = UcxOptions::Opening::kAuto;  // UcxOptions::opening
  size_t linear_bytes = 0;                                   // UcxOptions::linear_bytes
  bool machine_oversubscribed = false;  // some rank's machine runs more ranks than cores
  size_t measured_bytes = 0;            // UcxOptions::measured_choice_bytes
};

// The one-shot threshold those inputs give.
size_t SmallMessageBytes(const AlgorithmInputs& in);

class AlgorithmTable {
 public:
  struct Range {
    size_t max_bytes;  // inclusive; the last range of a kind ends at SIZE_MAX
    Algorithm algorithm;
  };
  // AllReduce of (lo, hi] bytes whose algorithm is measured among
  // `candidates` (Note [Measured choice] in measured_choice.h).
  struct MeasuredClass {
    size_t lo = 0;
    size_t hi = 0;
    std::vector<Algorithm> candidates;
  };

  Algorithm Select(Kind kind, size_t bytes) const;
  // The ranges of one kind, ascending.
  const std::vector<Range>& ranges(Kind kind) const;
  size_t small_bytes() const { return small_bytes_; }
  // The largest AllReduce the descriptor round carries (Note [Descriptor
  // round] in descriptor_round.h), by recursive doubling or Rabenseifner;
  // 0 where the header round opens instead.
  size_t carried_bytes() const { return carried_bytes_; }
  // Whether the linear round opens collectives instead of the descriptor
  // round (Note [Linear round]), and the largest AllReduce it carries
  // (what it carries where the opening, or the measured choice, has it).
  bool linear() const { return linear_; }
  size_t linear_bytes() const { return linear_bytes_; }
  // Whether the linear round is watched beside every descriptor round: it
  // opens collectives, or a measured class may run it.
  bool linear_watched() const { return linear_watched_; }
  // The size classes whose algorithm is measured, ascending.
  const std::vector<MeasuredClass>& measured() const { return measured_; }
  // One line per kind, e.g. "AllReduce: 0-4096 B one-shot, 4097 B+ shm-allreduce",
  // then, where the linear round opens, "Opening: linear round", and where
  // classes are measured, "Measured: (4096, 8192] B recursive-doubling|linear, ...".
  std::string Describe() const;

 private:
  friend AlgorithmTable BuildAlgorithmTable(const AlgorithmInputs& in);
  size_t small_bytes_ = 0;
  size_t carried_bytes_ = 0;
  bool linear_ = false;
  size_t linear_bytes_ = 0;
  bool linear_watched_ = false;
  std::vector<MeasuredClass> measured_;
  std::vector<Range> ranges_[4];  // by Kind - 1
};

AlgorithmTable BuildAlgorithmTable(const AlgorithmInputs& in);

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_ALGORITHMS_H_
