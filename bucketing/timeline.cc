#include "bucketing/timeline.h"

#include <utility>

#include "bucketing/file_io.h"
#include "nlohmann/json.hpp"

namespace fusebox::bucketing {

void Timeline::Add(Event e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.size() >= max_events_) {
    ++dropped_;
    return;
  }
  events_.push_back(std::move(e));
}

void Timeline::Instant(std::string name, Track track, double ts_us, int64_t iteration,
                       int64_t bucket, int64_t tensor, int64_t bytes) {
  Add(Event{'i', track, std::move(name), ts_us, 0, iteration, bucket, tensor, bytes});
}

void Timeline::Span(std::string name, Track track, double start_us, double dur_us,
                    int64_t iteration, int64_t bucket, int64_t tensor, int64_t bytes) {
  Add(Event{'X', track, std::move(name), start_us, dur_us, iteration, bucket, tensor, bytes});
}

size_t Timeline::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

size_t Timeline::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

void Timeline::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  events_.clear();
  dropped_ = 0;
}

std::string Timeline::ToChromeTrace(int pid, const std::string& process_name) const {
  using json = nlohmann::json;
  json events = json::array();
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid},
                    {"args", {{"name", process_name}}}});
  const std::pair<Track, const char*> tracks[] = {{Track::kCompute, "compute"},
                                                  {Track::kGradients, "gradients"},
                                                  {Track::kAllReduce, "allreduce"},
                                                  {Track::kCopyBack, "copy back"}};
  for (const auto& [track, name] : tracks) {
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid},
                      {"tid", static_cast<int>(track)}, {"args", {{"name", name}}}});
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const Event& e : events_) {
    json args = {{"iteration", e.iteration}};
    if (e.bucket >= 0) args["bucket"] = e.bucket;
    if (e.tensor >= 0) args["tensor"] = e.tensor;
    if (e.bytes >= 0) args["bytes"] = e.bytes;
    json j = {{"ph", std::string(1, e.phase)}, {"name", e.name}, {"pid", pid},
              {"tid", static_cast<int>(e.track)}, {"ts", e.ts_us}, {"args", std::move(args)}};
    if (e.phase == 'X') j["dur"] = e.dur_us;
    if (e.phase == 'i') j["s"] = "t";
    events.push_back(std::move(j));
  }
  json doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  if (dropped_ > 0) doc["otherData"] = {{"dropped_events", dropped_}};
  return doc.dump();
}

absl::Status Timeline::WriteChromeTrace(const std::string& path, int pid,
                                        const std::string& process_name) const {
  return WriteFileAtomically(path, ToChromeTrace(pid, process_name));
}

}  // namespace fusebox::bucketing
