#include "perf/explain.h"

#include <algorithm>

namespace fusebox::perf {

// Note [Where the gap goes]
// The engine completes buckets in launch order on one worker: bucket i (in
// launch order) is ready (its last slice marked), launched, started by the
// backend, done, noticed by the worker, copied back. The iteration ends
// after the last copy back (or after backward, when communication was
// hidden). Walking back from that end, each step waited either for
// something earlier in the same bucket or for an earlier bucket:
//   copied_i  <- noticed_i              copy back
//   noticed_i <- done_i                 launch-to-start (the worker's wake-up)
//          or <- copied_{i-1}           the worker was copying i-1 back: go there
//   done_i    <- start_i                t(m) alone + transfer excess
//   start_i   <- launch_i               launch-to-start
//          or <- done_{i-1}             queued behind i-1: go there
//   launch_i  <- ready_i                window (held after it was ready)
//          or <- freed_{i-W}            the window of W in flight was full: go there
//                                       (a slot frees when the collective is done,
//                                       on the completing thread or when the worker
//                                       sees it, before its copy back)
//          or <- launch_{i-1}           plan order held it behind i-1: go there
//   freed_i   <- done_i                 launch-to-start (whoever freed the slot:
//                                       its reaction)
// (the latest of the alternatives is the one it waited for). The chain ends
// at some bucket j's ready time, which the profile says should be forward +
// ready_j: the difference is late gradients. What is left, forward +
// ready_j + the chain's isolated t(m) - bound, is the plan's own cost at
// isolated speed (a latency per bucket, a first bucket that starts late).
// The steps telescope, so the terms sum to the gap exactly.
GapTerms ExplainGap(const GapInput& in) {
  GapTerms t;
  t.iteration_us = in.iteration_us;
  t.bound_us = in.bound_us;
  const std::vector<bucketing::BucketTiming>& b = in.stats->bucket_times;
  const double comm_end = b.empty() ? 0 : b.back().copied_us;
  if (b.empty() || comm_end <= in.backward_end_us) {
    t.late_gradients_us = in.backward_end_us - (in.forward_us + in.backward_us);
    t.plan_us = in.forward_us + in.backward_us - in.bound_us;
    t.tail_us = in.iteration_us - in.backward_end_us;
    return t;
  }
  t.tail_us = in.iteration_us - comm_end;
  const int w = std::max(1, in.max_in_flight);
  double isolated = 0;
  int i = static_cast<int>(b.size()) - 1;
  enum class At { kCopied, kNoticed, kDone, kLaunch } at = At::kCopied;
  for (;;) {
    const bucketing::BucketTiming& x = b[i];
    if (at == At::kCopied) {
      t.copy_back_us += x.copied_us - x.noticed_us;
      at = At::kNoticed;
    }
    if (at == At::kNoticed) {
      if (i > 0 && b[i - 1].copied_us > x.done_us) {
        t.launch_to_start_us += x.noticed_us - b[i - 1].copied_us;
        --i;
        at = At::kCopied;
        continue;  // enter i - 1 at its copy back's end
      }
      t.launch_to_start_us += x.noticed_us - x.done_us;
      at = At::kDone;
    }
    if (at == At::kDone) {
      ++t.chain_buckets;
      const double previous_done = i > 0 ? b[i - 1].done_us : -1;
      const double start = x.start_us >= 0 ? x.start_us : std::max(x.launch_us, previous_done);
      const double alone = in.isolated_us(x.bytes);
      isolated += alone;
      t.transfer_excess_us += (x.done_us - start) - alone;
      if (i > 0 && previous_done > x.launch_us) {
        t.launch_to_start_us += start - previous_done;
        --i;
        continue;  // queued behind i - 1: enter it at its done (at stays kDone)
      }
      t.launch_to_start_us += start - x.launch_us;
    }
    // At launch_i: what held it, the latest of its readiness, a window slot
    // and the previous launch. (Timings without freed_us: the worker's
    // notice freed the slot.)
    const auto freed = [&](const bucketing::BucketTiming& y) {
      return y.freed_us > 0 ? y.freed_us : y.noticed_us;
    };
    const double slot = i >= w ? freed(b[i - w]) : -1;
    const double order = i > 0 ? b[i - 1].launch_us : -1;
    if (slot > x.ready_us && slot >= order) {
      t.window_us += x.launch_us - slot;
      i -= w;
      if (b[i].freed_us > 0) {
        // freed_{i} <- done_{i}: the reaction of whoever freed it.
        t.launch_to_start_us += b[i].freed_us - b[i].done_us;
        at = At::kDone;
      } else {
        at = At::kNoticed;
      }
      continue;
    }
    if (order > x.ready_us) {
      t.window_us += x.launch_us - order;
      --i;
      at = At::kLaunch;
      continue;
    }
    t.window_us += x.launch_us - x.ready_us;
    const double profile_ready =
        x.bucket >= 0 && x.bucket < static_cast<int>(in.profile_ready_us.size())
            ? in.profile_ready_us[x.bucket]
            : 0;
    t.late_gradients_us = x.ready_us - (in.forward_us + profile_ready);
    t.plan_us = in.forward_us + profile_ready + isolated - in.bound_us;
    return t;
  }
}

GapTerms& GapTerms::operator+=(const GapTerms& o) {
  iteration_us += o.iteration_us;
  bound_us += o.bound_us;
  late_gradients_us += o.late_gradients_us;
  window_us += o.window_us;
  launch_to_start_us += o.launch_to_start_us;
  transfer_excess_us += o.transfer_excess_us;
  copy_back_us += o.copy_back_us;
  plan_us += o.plan_us;
  tail_us += o.tail_us;
  chain_buckets += o.chain_buckets;
  return *this;
}

GapTerms GapTerms::Scaled(double f) const {
  GapTerms s = *this;
  for (double* v : {&s.iteration_us, &s.bound_us, &s.late_gradients_us, &s.window_us,
                    &s.launch_to_start_us, &s.transfer_excess_us, &s.copy_back_us, &s.plan_us,
                    &s.tail_us}) {
    *v *= f;
  }
  s.chain_buckets = static_cast<int>(s.chain_buckets * f + 0.5);
  return s;
}

std::vector<std::pair<std::string, double>> GapTermList(const GapTerms& t) {
  return {{"late_gradients", t.late_gradients_us}, {"window", t.window_us},
          {"launch_to_start", t.launch_to_start_us}, {"transfer_excess", t.transfer_excess_us},
          {"copy_back", t.copy_back_us},            {"plan", t.plan_us},
          {"tail", t.tail_us}};
}

}  // namespace fusebox::perf
