// The UCX backend's choice of algorithm per collective: the table (Note
// [Algorithm table] in algorithms.h, built from the units of algo/), with
// the measured choice (Note [Measured choice] in measured_choice.h) as a
// layer over it. Built at Init from inputs equal on every rank; then used
// by the executing thread, and described on any thread.
//
//   AlgorithmChoice::Made m = choice.Choose(kind, bytes);
//   ... the opening round; rank 0's pad byte -> choice.Apply(pad)
//   ... the unit runs; choice.Record(m, ...) where rank 0 times it
#ifndef FUSEBOX_COMM_UCX_CHOICE_H_
#define FUSEBOX_COMM_UCX_CHOICE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "comm/options.h"
#include "comm/ucx/algorithms.h"
#include "comm/ucx/measured_choice.h"

namespace fusebox::comm::ucx {

// The table's inputs from the options (shared memory not yet known: the
// exchange assumed, no shared-memory allreduce).
AlgorithmInputs TableInputs(const UcxOptions& options, int world, unsigned cores,
                            bool machine_oversubscribed);

class AlgorithmChoice {
 public:
  void Init(const AlgorithmInputs& inputs, int rank);
  const AlgorithmTable& table() const { return table_; }
  // Whether any size class is measured (then the table does not decide
  // every AllReduce; nothing is begun on the issuing thread).
  bool measuring() const { return measured_->classes() > 0; }

  // One collective's choice: the table's, or, in a measured class, the
  // trial's candidate or the one chosen. Rank 0 times it where classes are
  // measured (timed, from began).
  struct Made {
    Algorithm algorithm = Algorithm::kNone;
    std::optional<MeasuredChoice::Pick> pick;
    bool timed = false;
    absl::Time began = absl::InfinitePast();
  };
  Made Choose(Kind kind, size_t bytes);
  // Rank 0, where timed: keeps the time of `m` up to now, with its pick
  // (MeasuredChoice::Record).
  void Record(const Made& m);

  // Rank 0's byte for its next header (Note [Measured choice]).
  uint8_t TakeAnnouncement() { return measured_->TakeAnnouncement(); }
  // Every rank, after a clean round whose rank 0 announced `pad` (not 0):
  // the decision applies from the next collective.
  absl::Status Apply(uint8_t pad);

  // The table, then the measured choices made so far (any thread).
  std::string Describe() const;

 private:
  AlgorithmTable table_;
  std::optional<MeasuredChoice> measured_;  // the executing thread's
  // measured_->Describe(), for Describe() on any thread.
  mutable absl::Mutex chosen_mu_;
  std::string chosen_ ABSL_GUARDED_BY(chosen_mu_);
  bool rank_zero_ = false;  // rank 0 decides and times
};

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_CHOICE_H_
