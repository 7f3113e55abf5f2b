// Where an iteration's time beyond the lower bound goes: the per-bucket
// steps the engine records (bucketing::BucketTiming), attributed to named
// terms along the critical chain (Note [Where the gap goes] in explain.cc).
#ifndef FUSEBOX_PERF_EXPLAIN_H_
#define FUSEBOX_PERF_EXPLAIN_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bucketing/engine.h"

namespace fusebox::perf {

// iteration - bound = the sum of the terms below, exactly, for one
// iteration (and for averages of iterations). Microseconds.
struct GapTerms {
  double iteration_us = 0;
  double bound_us = 0;
  // The gradients that start the chain reached the engine later than the
  // profile says (copy-in, MarkReady, the replay's own slip); with all
  // communication hidden, backward's end later than the profile's.
  double late_gradients_us = 0;
  // Ready but not launched: the in-flight window or plan order held it.
  double window_us = 0;
  // Launched (or the previous collective done) to the backend starting it,
  // and the backend done to the engine's worker noticing: queues, thread
  // wake-ups, header rounds.
  double launch_to_start_us = 0;
  // Transfers on the chain beyond t(m) measured alone: contention with
  // compute and with other buckets (negative when faster).
  double transfer_excess_us = 0;
  // Copying results back on the chain.
  double copy_back_us = 0;
  // This plan at isolated speed: from the chain's first gradient (as the
  // profile has it) through its buckets' t(m), against the bound; with all
  // communication hidden, backward's end against the bound (<= 0).
  double plan_us = 0;
  // After the last copy back (or backward's end) until the iteration ended.
  double tail_us = 0;
  int chain_buckets = 0;  // buckets on the critical chain

  double gap_us() const { return iteration_us - bound_us; }
  double sum_us() const {
    return late_gradients_us + window_us + launch_to_start_us + transfer_excess_us +
           copy_back_us + plan_us + tail_us;
  }
  GapTerms& operator+=(const GapTerms& o);
  GapTerms Scaled(double f) const;
};

struct GapInput {
  const bucketing::IterationStats* stats = nullptr;  // bucket_times relative to its start
  double forward_us = 0;        // backward starts this long after the engine's start
  double iteration_us = 0;      // measured end, same origin
  double backward_end_us = 0;   // measured end of backward, same origin
  double backward_us = 0;       // the profile's backward
  double bound_us = 0;
  // Per plan bucket: the profile's ready time of its last gradient, after
  // backward start.
  std::vector<double> profile_ready_us;
  // An allreduce of m bytes measured alone on this communicator.
  std::function<double(int64_t)> isolated_us;
  int max_in_flight = 4;  // the engine's window (EngineOptions::max_in_flight)
};

GapTerms ExplainGap(const GapInput& in);

// Names and values in print order (for tables and JSON).
std::vector<std::pair<std::string, double>> GapTermList(const GapTerms& t);

}  // namespace fusebox::perf

#endif  // FUSEBOX_PERF_EXPLAIN_H_
