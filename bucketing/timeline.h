// Timeline: an opt-in, bounded event log of one rank's iterations, written
// as Chrome trace event JSON (opens in Perfetto and chrome://tracing).
#ifndef FUSEBOX_BUCKETING_TIMELINE_H_
#define FUSEBOX_BUCKETING_TIMELINE_H_

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace fusebox::bucketing {

// Rows of the trace ("threads" in Chrome's terms).
enum class Track : int {
  kCompute = 1,    // forward / backward spans added by the caller
  kGradients = 2,  // gradient-ready instants and copies into fusion buffers
  kAllReduce = 3,  // each bucket from launch to completion
  kCopyBack = 4,   // copying reduced values back to the caller's gradients
};

class Timeline {
 public:
  // Keeps at most `max_events`; later events are counted as dropped.
  explicit Timeline(size_t max_events = size_t{1} << 20) : max_events_(max_events) {}

  // Thread-safe. Times are microseconds on the owner's clock.
  // `bucket`/`tensor`/`bytes` are recorded as args when >= 0.
  void Instant(std::string name, Track track, double ts_us, int64_t iteration,
               int64_t bucket = -1, int64_t tensor = -1, int64_t bytes = -1);
  void Span(std::string name, Track track, double start_us, double dur_us, int64_t iteration,
            int64_t bucket = -1, int64_t tensor = -1, int64_t bytes = -1);

  size_t size() const;
  size_t dropped() const;
  void Clear();

  // The trace as a JSON object {"traceEvents": [...], "displayTimeUnit": "ms"}
  // with process `pid` named `process_name` and the tracks named.
  std::string ToChromeTrace(int pid, const std::string& process_name) const;
  // Writes ToChromeTrace atomically (temp file + rename).
  absl::Status WriteChromeTrace(const std::string& path, int pid,
                                const std::string& process_name) const;

 private:
  struct Event {
    char phase;  // 'X' (span) or 'i' (instant)
    Track track;
    std::string name;
    double ts_us;
    double dur_us;
    int64_t iteration, bucket, tensor, bytes;
  };
  void Add(Event e);

  const size_t max_events_;
  mutable std::mutex mu_;
  std::vector<Event> events_;  // mu_
  size_t dropped_ = 0;         // mu_
};

}  // namespace fusebox::bucketing

#endif  // FUSEBOX_BUCKETING_TIMELINE_H_
