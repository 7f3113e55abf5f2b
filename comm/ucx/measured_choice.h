// The UCX backend's choice among AllReduce algorithms over messages where
// the best one depends on the links, measured on the collectives themselves
// and agreed through rank 0's descriptor.
//
//   MeasuredChoice choice(table.measured(), /*decides=*/rank == 0);
//   std::optional<MeasuredChoice::Pick> pick = choice.Next(bytes);  // before each AllReduce
//   header.pad = choice.TakeAnnouncement();                         // rank 0, every round
//   ... the round; on a clean verdict, every rank:
//   absl::Status s = choice.Apply(rank0_pad);
//   ... after every collective over messages, rank 0 (where a measured call
//   ... runs the ring after its round, once the ring has ended):
//   choice.Record(pick /*nullopt: not a measured call*/, start, end);
//
// Note [Measured choice]
// Over messages, which AllReduce algorithm is fastest at 4-512 KiB depends on
// the link's rate and on how many ranks share a core, which no rank knows:
// on emulated hosts sharing 2 cores, recursive doubling was best at 16-32
// KiB over 4 Gbit and lost 1.3-1.7x to Rabenseifner (or OpenMPI's ring)
// over 1 Gbit, and at 8 hosts OpenMPI's linear allreduce beat both at 8
// KiB over 4 Gbit while fusebox's linear round lost 1.5-2.3x over 1 Gbit
// (commit 7e1ba59); at 128-512 KiB the ring beat
// Rabenseifner on 8 hosts over 1 Gbit and lost to it over 4 Gbit (Note
// [Algorithm table] in algorithms.h). A switch point derived from a probe
// between rank pairs at creation moved between 8 and 64 KiB from one
// communicator to the next on the same links (Note [Recursive doubling or
// Rabenseifner] in algorithms.h). So each size class of the table's
// measured range (AlgorithmTable::MeasuredClass) times its candidates on the
// collectives the user runs:
// * Warm-up. A class's first kTrialWarmCalls calls run the table's choice,
//   untimed: they pay what a first call pays (staging grown, pages
//   touched).
// * Trial. Then the class's calls run its live candidates one block of
//   kTrialBlock consecutive calls each, the candidate with the fewest
//   blocks next (the class's order among equals). Which candidate a call
//   runs follows from the class's state (live candidates, blocks begun,
//   calls into the block), which every rank changes at the same calls
//   while the ranks agree (a call where they do not fails every rank, and
//   the communicator with them), so every rank runs the same algorithm
//   without a message.
// * Settling. Only a block's calls from kTrialSettle on count for the
//   decision. Links whose rate is enforced by a token bucket (tc tbf, as
//   perf/cluster shapes its hosts; policers and many virtual NICs do the
//   same) let a burst pass above the rate after an idle spell, so a
//   candidate's first calls after one that moved fewer bytes run faster
//   than that candidate can go on running, and the calls after a candidate
//   that drained the bucket run slower. With blocks of 6 calls in turn, the
//   linear round at 8 KiB on 8 emulated hosts over 1 Gbit timed 260-308 us
//   a call and was chosen, and the loop then ran 1.35x slower than
//   recursive doubling, which the same trial had timed at 378-479 us where
//   the loop takes about 300 (commit 43d56e7).
//   There rank 0's link needs about 12 calls of the linear round to drain
//   a 256 KB burst, and recursive doubling about 19 to fill it again.
//   What settling cannot undo is a candidate timed on the bucket the one
//   before drained: on 4 hosts over 4 Gbit, recursive doubling at 64 KiB
//   sends a little more than the rate and empties the bucket slowly, and
//   Rabenseifner, timed after it, came out dearer than its own loop runs,
//   and lost (1.18-1.22x the static table in two of four runs). So the
//   table lists a class's candidates in the order of the bytes they send
//   through a rank's link, fewest first (Rabenseifner, the ring, recursive
//   doubling, the linear round): each runs on a bucket the lighter one
//   before it left full, which can flatter it but never wrongs the lighter
//   one. Over 9 rounds there, Rabenseifner was then chosen at 64 KiB in 7
//   (4 before).
// * Timing. Rank 0 times each call: from the end of the call before it
//   where that was the previous call of the class (nothing else ran
//   on the communicator between), else from the start of its round, to the
//   end of the algorithm. Timing only from the start of its own round was
//   tried and chose badly: where ranks share cores, rank 0 is often
//   descheduled between calls and arrives last, finds its peers' messages
//   waiting, and timed recursive doubling at 49 us per 8 KiB call on 4
//   emulated hosts over 4 Gbit where the loop took 105 us per call. Back to
//   back includes what the caller did between the calls (a training step's
//   compute between two buckets of a class), which flattens the
//   differences but is the same for every candidate in turn. The first call
//   of each block (which also pays for the last block's algorithm) is not
//   kept. A candidate's cost is the mean of its samples less the largest
//   (a loop pays the mean; one rank descheduled for milliseconds should not
//   decide).
// * Drops. A candidate whose cost is more than kDropRatio times the
//   cheapest settled cost is dropped and not run again: once settled, or
//   already on kTrialEarlyDrop calls of its block before it settles (a
//   burst makes a candidate look cheaper, never dearer, so a candidate
//   that looks dear then is dear). The linear round at 64 KiB over 1 Gbit
//   took 4x Rabenseifner's time; it now costs a few calls, not a block.
// * Decision. Once every live candidate that is not dropped has a block's
//   settled samples, rank 0 decides for the cheapest, and announces that
//   before the drops it makes with it. The class's calls run the trial
//   until the decision arrives, one call after the last sample where no
//   other announcement is queued ahead: a class's first 6 + 3 x 32 + 1 =
//   103 calls at most, with three candidates (135 with four).
// * Announcements. Rank 0 announces each drop and decision in the pad byte
//   of its next header (which SameCall ignores): 0x80 | drop << 6 |
//   class << 2 | candidate. Every round over messages ends with rank 0's
//   header in every rank's verdict (the lowest rank's; Note [Descriptor
//   round]), so every rank applies it after the same collective: the
//   class's next call runs the new state. One announcement rides each
//   collective, of any kind; until a decision arrives the trial goes on.
// All candidates give every rank the same bits within a call; recursive
// doubling and Rabenseifner give the same bits as each other, while the
// linear round sums in rank order and the ring in ring order, so where
// either is a candidate the last bits of a class's result may differ
// between the trial and later calls (the results are exact wherever the
// sum is).
// A choice is watched after it is made, and changed where it has become
// dear (Note [Watching the choice]); a switch, like the trial, may change
// those last bits.
// On by default up to 512 KiB (UcxOptions::measured_choice_bytes; 0 keeps
// the static table); up to 64 KiB before the ring was a candidate. Against
// that (6 interleaved rounds on 4 and 8 emulated hosts over 1 and 4 Gbit,
// 32-512 KiB, commit 9af7b3e): 0.47-0.49x the time
// at 256-512 KiB on 8 hosts over 1 Gbit and 0.79-0.91x on 4 hosts, every
// round faster; in the other 16 cells each 95% CI includes 1 (medians
// 0.83-1.18x, and 0.48x at 128 KiB on 8 hosts over 1 Gbit, where
// Rabenseifner's slowdown above scattered the rounds 0.16-2.52x).
// With blocks of 6 calls in turn and no settling it had
// been off: against the static table on emulated hosts sharing 2 cores it
// took 0.80-0.84x the time at 8-16 KiB on 4 hosts over 4 Gbit, but 1.35x
// and 1.49x at 8 and 16 KiB and 1.25x at 64 KiB on 8 hosts over 1 Gbit,
// where the burst fooled the trial and its dear candidates ran inside the
// timed loop (commit 43d56e7). As above, 6
// interleaved rounds on 4 and 8 hosts over 1 and 4 Gbit, 8-64 KiB, the
// trial inside the warm-up (commit 42df609, 10
// rounds on this build): faster than the static table in 7 of 16 cells
// (0.75-0.95x; 5 with a 95% CI below 1), level in 6 (0.99-1.01x), slower
// in 3 (1.04-1.10x, 4 hosts over 4 Gbit at 8-32 KiB, faster in 3-4 of 10
// rounds; each CI includes 1).
//
// Note [Watching the choice]
// A trial times each candidate for one block, and a candidate can slow down
// only after its block: on 8 emulated hosts over 1 Gbit, Rabenseifner at
// exactly 128 KiB ran at the link's rate for its first calls and about 3x
// slower from some 40 calls on (the kernel's TCP autocorking holds the last
// few bytes of each 64 KiB message; commit 9af7b3e), so the trial chose it in 4 of 6 rounds and the loop then
// ran at about 3x the ring's time. Links and neighbours change too. So rank
// 0 goes on timing the class's calls once decided, as in the trial (back to
// back from the end of the call before), from kTrialSettle calls after the
// decision took effect, in windows of kWatchWindow calls whose cost is
// their plain mean: that slowdown came as a few calls a window held for
// 10-110 ms among calls at the trial's pace (commit 376fcee), which a mean without the largest
// samples leaves out (a first version without the 4 largest of 32 kept
// Rabenseifner at 6.5 ms a call in one of the three rounds where the trial
// chose it, same commit). A window is dear where it
// costs more than kSwitchRatio times both the cheapest other live
// candidate's last known cost (what it cost in use where the class left it
// before, else its trial's plain mean) and the candidate's own trial plain
// mean. Plain means on both sides, and the second condition, keep a
// slowdown every candidate shares from looking like one: a rank descheduled
// every few calls, or a gap between training steps that falls into the
// back-to-back timing of a class's first call each step, which a trimmed
// mean would halve in the trial and a window would not. Where
// kWatchDearWindows windows in a row are dear (one alone may hold a rank
// descheduled for long once), rank 0 announces that candidate as the
// class's choice in the byte a decision rides in, and every rank applies it
// after the same collective: a switch needs no message of its own. The
// candidate left keeps the mean of the windows it was left for, so the
// class returns to it only if the new one costs kSwitchRatio times that; a
// class switches at most kMaxSwitches times and is not watched after.
// Rank 0 already reads the clock around every measured call; watching adds
// a sample per call there, and nothing on the other ranks.
#ifndef FUSEBOX_COMM_UCX_MEASURED_CHOICE_H_
#define FUSEBOX_COMM_UCX_MEASURED_CHOICE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/ucx/algorithms.h"

namespace fusebox::comm::ucx {

// Note [Measured choice]: calls per block, the call of a block from which
// its samples count, calls of a class before its trial (the table's
// choice, untimed), the samples of an unsettled block that may drop its
// candidate, and how much dearer than the cheapest a candidate is dropped.
inline constexpr int kTrialBlock = 32;
inline constexpr int kTrialSettle = 16;
inline constexpr int kTrialWarmCalls = 6;
inline constexpr int kTrialEarlyDrop = 4;
inline constexpr double kDropRatio = 1.5;
// Note [Watching the choice]: samples per window of the candidate in use
// (after kTrialSettle calls of it), how many windows in a row must cost more
// than kSwitchRatio times the cheapest other candidate's last known cost for
// the class to switch, and how often a class may switch.
inline constexpr int kWatchWindow = 32;
inline constexpr int kWatchDearWindows = 2;
inline constexpr double kSwitchRatio = 1.5;
inline constexpr int kMaxSwitches = 3;
inline constexpr int kMaxMeasuredClasses = 16;
inline constexpr int kMaxMeasuredCandidates = 4;

class MeasuredChoice {
 public:
  // What one call runs.
  struct Pick {
    Algorithm algorithm = Algorithm::kNone;
    int cls = -1;         // index into the classes
    int candidate = -1;   // index into the class's candidates
    bool sample = false;  // rank 0 keeps its time (a trial call, not first in its block)
    bool settled = false;  // ... and it counts for the decision (kTrialSettle on)
    bool watch = false;    // rank 0 keeps its time to watch the choice in use
    int64_t pos = -1;      // calls of the class before it, from its trial's first
  };

  // `decides`: this rank times the trials and announces (rank 0).
  MeasuredChoice(std::vector<AlgorithmTable::MeasuredClass> classes, bool decides);

  // The algorithm the AllReduce of `bytes` about to start runs: nullopt
  // where no class covers it or the class is warming up (the table's
  // choice). Counts the call.
  std::optional<Pick> Next(size_t bytes);
  // Rank 0, after every collective that ran a round over messages (`pick`
  // where the collective was a measured AllReduce): when its round started
  // and when it ended (a measured call that runs the ring after its round:
  // when the ring ended). Keeps the sample where pick->sample (the trial)
  // or pick->watch (the choice in use), and queues the drops, the decision
  // and the switches it makes.
  void Record(const std::optional<Pick>& pick, absl::Time start, absl::Time end);
  // Rank 0: the byte its next header carries (0: nothing to announce).
  // Each queued announcement is taken once.
  uint8_t TakeAnnouncement();
  // Every rank, after a clean round: rank 0's pad byte. DataLoss where it
  // names a class or candidate this rank does not have, drops the last live
  // candidate, or chooses a dropped one.
  absl::Status Apply(uint8_t pad);

  // One line per decided class: "(4096, 8192] B: linear" and, on rank 0,
  // the costs it measured, e.g. " (rank 0, mean per call: rabenseifner 290
  // us, recursive-doubling 310 us, linear 250 us)"; a dropped candidate's
  // cost is the one it was dropped for. Where the class switched (Note
  // [Watching the choice]), what each candidate it left cost in use, e.g.
  // " (left in use: rabenseifner 5804 us)".
  std::string Describe() const;
  // The candidate a class runs until it switches; -1: not decided.
  int decided(int cls) const { return classes_[cls].decided; }
  // How often a decided class switched to another candidate.
  int switches(int cls) const { return classes_[cls].switches; }
  // Whether a class's candidate is not dropped: in its trial, or once the
  // class is decided, one it may switch to.
  bool live(int cls, int candidate) const { return classes_[cls].live[candidate]; }
  size_t classes() const { return classes_.size(); }

 private:
  struct State {
    AlgorithmTable::MeasuredClass spec;
    int64_t calls = 0;        // calls of the class so far
    int current = -1;         // the candidate of the block running
    int in_block = 0;         // calls of that block so far
    std::vector<int> blocks;  // blocks begun, by candidate
    std::vector<bool> live;   // by candidate
    int decided = -1;
    int64_t decided_calls = 0;  // calls of the decided candidate since Apply chose it
    int switches = 0;           // decisions after the first
    // Rank 0's, by candidate, microseconds.
    std::vector<std::vector<double>> samples;  // settled
    std::vector<std::vector<double>> early;    // this block's before it settled
    std::vector<double> costs;                 // by candidate, when last judged
    std::vector<double> plain;                 // the settled samples' plain means, then
    std::vector<double> left;                  // in use, when switched from; 0: never
    std::vector<double> window;                // the decided candidate's, this window
    std::vector<double> dear;                  // the means of the dear windows in a row
    std::vector<bool> drop_queued;
    bool decision_queued = false;  // the first decision, or a switch
  };
  // Rank 0: judges class `cls` on the samples so far.
  void Judge(int cls);
  // Rank 0: adds a sample of the decided candidate of class `cls`, and at
  // the end of a window switches where it has become dear.
  void Watch(int cls, double us);
  std::vector<State> classes_;
  // Rank 0: the last collective recorded (cls -1: not a measured one).
  int last_cls_ = -1;
  int64_t last_pos_ = -1;
  absl::Time last_end_ = absl::InfinitePast();
  const bool decides_;
  std::vector<uint8_t> announcements_;  // rank 0, queued
};

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_MEASURED_CHOICE_H_
