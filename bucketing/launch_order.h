// LaunchOrder: which bucket an engine launches next (the engine's launch
// order, decided from facts alone: which buckets are complete on this rank,
// what the ranks agreed on, the window). No communicator, threads or
// clocks: the same calls on every rank give the same sequence, which is
// what keeps ranks' collectives in step (comm Note [Collective ordering]).
//
// Note [Launch order]
// Ranks must issue collectives in the same order (comm Note [Collective
// ordering]), but gradients become ready in different orders and at
// different times on different ranks and threads. So the engine never picks
// among buckets by local readiness alone. At most `max_in_flight` (W)
// buckets are launched and not yet complete (a slot frees when the
// allreduce finishes, on the thread that completed it or when the worker
// sees it, before the bucket is copied back, so no launch waits behind that
// copy: Note [Freeing a slot where the collective completes] in
// bucketing/engine.h); the k-th launch of an iteration is chosen by the
// schedule:
// * kPlanOrder: bucket k, once it is complete on this rank. The plan's
//   bucket order is the launch order (and is covered by its hash).
// * kForwardPriority (ByteScheduler's idea, made deterministic): every
//   bucket's allreduce carries one vote per bucket of the plan: 1 if that
//   bucket was complete on this rank when it launched, else 0, averaged
//   like the data. A vote that comes back exactly 1 means "complete on every
//   rank". Launch k (k >= W) may start only after launch k-W has completed
//   (the window), so every rank knows the same votes of launch k-W: among
//   the buckets they show complete everywhere and not yet launched, it takes
//   the one the next forward pass needs first (the one holding the
//   latest-ready tensor: the earliest layers); when there is none, the next
//   bucket in plan order, once it is complete here. The first W launches go
//   in plan order. Every input to the choice is identical on every rank, so
//   the sequence is too. Cost: one vote element per bucket in each bucket's
//   allreduce (limited to 8192 buckets, and to world sizes where a vote
//   average is exact: 256 ranks in bfloat16, 2048 in half).
// Whatever order gradients arrive in, every rank issues the same sequence,
// and results do not depend on timing.
//
// In this unit: LaunchOrder keeps one iteration's launch state (complete
// here, launched, slots freed, agreed votes) and answers Next(); the vote
// elements' encoding (WriteVotes / ReadVotes) and the limits that keep a
// vote exact. The engine (bucketing/engine.cc) owns the buffers, issues the
// collectives, and tells LaunchOrder what happened, under its lock.
#ifndef FUSEBOX_BUCKETING_LAUNCH_ORDER_H_
#define FUSEBOX_BUCKETING_LAUNCH_ORDER_H_

#include <cstdint>
#include <vector>

#include "bucketing/plan.h"
#include "comm/types.h"

namespace fusebox::bucketing {

enum class Schedule : uint8_t { kPlanOrder, kForwardPriority };
// The most buckets kForwardPriority handles (each allreduce carries one vote
// per bucket).
inline constexpr int kMaxPriorityBuckets = 8192;

// The most ranks whose votes in `type` average (or sum) exactly: 256 in
// bfloat16, 2048 in half, 2^24 otherwise.
int MaxVotingRanks(comm::DataType type);

// kForwardPriority's priority per bucket of `plan`: the highest tensor id in
// it (its latest-ready tensor: what the next forward pass needs first); -1
// for a bucket without slices. Larger goes first.
std::vector<int> ForwardPriorities(const Plan& plan);

class LaunchOrder {
 public:
  // No buckets: Next() is always -1.
  LaunchOrder() = default;
  // `priority`: one per bucket of the plan (ForwardPriorities; used by
  // kForwardPriority only, ties go to the lower bucket). `max_in_flight`
  // (W) is at least 1. Starts as Reset() leaves it.
  LaunchOrder(Schedule schedule, int max_in_flight, std::vector<int> priority);

  // A new iteration: no bucket complete, nothing launched, no votes.
  void Reset();

  int buckets() const { return static_cast<int>(state_.size()); }
  // k of the next launch: launches so far this iteration.
  int launches() const { return launched_; }
  // Launched and their slot not yet freed (at most W).
  int in_window() const { return launched_ - freed_; }
  // Complete on this rank (launched or not): what its vote says, and what
  // the engine writes into each launch's vote elements.
  bool complete_here(int bucket) const { return state_[bucket] != State::kFilling; }
  bool launched(int bucket) const { return state_[bucket] == State::kLaunched; }

  // Every slice of `bucket` is in on this rank. Ignored once launched.
  void Complete(int bucket);

  // The bucket to launch next (launch launches()), or -1 to wait: every
  // bucket launched, the window full, or the one whose turn it is not yet
  // complete here (Note [Launch order]). Under kForwardPriority launch
  // k >= W needs launch k - W's slot freed and its votes agreed (Agreed);
  // until then it is -1.
  int Next() const;
  // `bucket`, which must be Next(), was launched; returns its index k.
  int Launched(int bucket);
  // Frees launch `index`'s window slot when it is the next to free (slots
  // free in launch order); false when it is not (freed before, or an
  // earlier launch has not freed yet).
  bool Free(int index);
  // Launch `index`'s votes as they came back: per bucket of the plan,
  // whether every rank voted it complete (ReadVotes).
  void Agreed(int index, std::vector<uint8_t> everywhere);

 private:
  enum class State : uint8_t { kFilling, kReady, kLaunched };
  Schedule schedule_ = Schedule::kPlanOrder;
  int max_in_flight_ = 1;
  std::vector<int> priority_;  // per bucket
  // Per iteration.
  std::vector<State> state_;   // per bucket
  int next_in_plan_ = 0;       // lowest bucket not yet launched
  int launched_ = 0;
  int freed_ = 0;              // launches whose slot is free: a prefix
  std::vector<std::vector<uint8_t>> votes_;  // per launch index, once agreed
};

// The vote elements of one launch (Note [Launch order]): one element of
// `type` per bucket of `order`, 1 where the bucket is complete here, else
// 0, written at `out` (buckets() elements of DataTypeSize(type) bytes).
void WriteVotes(const LaunchOrder& order, comm::DataType type, char* out);
// Reads back `n` vote elements of `type` at `in`, reduced across ranks: 1
// where an element is bit for bit what every rank voting 1 gives, `all`
// (1 when averaged, the world size when summed), else 0.
std::vector<uint8_t> ReadVotes(const char* in, int n, comm::DataType type, double all);

}  // namespace fusebox::bucketing

#endif  // FUSEBOX_BUCKETING_LAUNCH_ORDER_H_
