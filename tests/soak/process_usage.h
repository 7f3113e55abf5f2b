// Resident memory and open file descriptors of this process (Linux /proc),
// and a watch that judges whether they stayed flat after a warm-up.
#ifndef FUSEBOX_TESTS_SOAK_PROCESS_USAGE_H_
#define FUSEBOX_TESTS_SOAK_PROCESS_USAGE_H_

#include <cstdint>
#include <deque>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fusebox::soak {

struct UsageSample {
  int64_t iteration = 0;
  int64_t rss_bytes = 0;  // resident set size (/proc/self/statm)
  int fds = 0;            // entries of /proc/self/fd (the directory's own fd included)
};

// Reads both figures now; Unavailable when /proc cannot be read.
absl::StatusOr<UsageSample> SampleUsage(int64_t iteration);

// Samples taken during the warm-up set the baseline: the largest RSS and the
// largest fd count seen (allocators and transports settle there: pools,
// caches, lazily opened endpoints). The end of the run is judged by the
// median RSS of the last kRecent samples (a sliding window) and the last fd
// count: RSS moves by several MiB from plan to plan (fusion buffers of other
// sizes, the allocator's free lists), which a median of several plans
// smooths out, while a leak grows with the iterations and lifts the whole
// window. Bounded memory: the baseline, the peak and the window are kept.
class UsageWatch {
 public:
  static constexpr int kRecent = 8;

  void Add(const UsageSample& sample, bool warmup);

  // The baseline and the newest sample (both zero before the first Add).
  const UsageSample& baseline() const { return baseline_; }
  const UsageSample& last() const { return last_; }
  int64_t peak_rss_bytes() const { return peak_rss_bytes_; }
  // The median RSS of the window after the warm-up (the newest sample's
  // when there is none).
  int64_t final_rss_bytes() const;

  // The largest RSS growth allowed: max(slack_bytes, slack_fraction x baseline).
  int64_t Bound(int64_t slack_bytes, double slack_fraction) const;
  // OK when final_rss_bytes() exceeds the baseline by at most Bound() and
  // the newest fd count exceeds it by at most `fd_slack`; otherwise
  // ResourceExhausted saying by how much, with the samples.
  absl::Status Check(int64_t slack_bytes, double slack_fraction, int fd_slack) const;

  // "iteration:MiB/fds" for the baseline and the recent samples, e.g.
  // "baseline 150:61.2MiB/27fd; 900:61.3MiB/27fd 910:61.3MiB/27fd".
  std::string Describe() const;

 private:
  bool has_baseline_ = false;  // the first sample always counts as warm-up
  UsageSample baseline_;
  UsageSample last_;
  int64_t peak_rss_bytes_ = 0;
  std::deque<UsageSample> recent_;  // after the warm-up, newest last
};

}  // namespace fusebox::soak

#endif  // FUSEBOX_TESTS_SOAK_PROCESS_USAGE_H_
