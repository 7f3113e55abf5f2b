#include "tests/soak/process_usage.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fusebox::soak {
namespace {

std::string MiB(int64_t bytes) { return absl::StrFormat("%.1fMiB", bytes / 1048576.0); }

std::string Format(const UsageSample& s) {
  return absl::StrCat(s.iteration, ":", MiB(s.rss_bytes), "/", s.fds, "fd");
}

}  // namespace

absl::StatusOr<UsageSample> SampleUsage(int64_t iteration) {
  UsageSample s;
  s.iteration = iteration;
  std::FILE* statm = std::fopen("/proc/self/statm", "r");
  long long size_pages = 0, resident_pages = 0;
  const bool read = statm != nullptr && std::fscanf(statm, "%lld %lld", &size_pages,
                                                    &resident_pages) == 2;
  if (statm != nullptr) std::fclose(statm);
  if (!read) return absl::UnavailableError("cannot read /proc/self/statm");
  s.rss_bytes = resident_pages * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return absl::UnavailableError("cannot list /proc/self/fd");
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++s.fds;
  }
  closedir(dir);
  return s;
}

void UsageWatch::Add(const UsageSample& sample, bool warmup) {
  last_ = sample;
  if (warmup || !has_baseline_) {
    has_baseline_ = true;
    baseline_.iteration = sample.iteration;
    baseline_.rss_bytes = std::max(baseline_.rss_bytes, sample.rss_bytes);
    baseline_.fds = std::max(baseline_.fds, sample.fds);
    return;
  }
  peak_rss_bytes_ = std::max(peak_rss_bytes_, sample.rss_bytes);
  recent_.push_back(sample);
  if (recent_.size() > kRecent) recent_.pop_front();
}

int64_t UsageWatch::final_rss_bytes() const {
  if (recent_.empty()) return last_.rss_bytes;
  std::vector<int64_t> rss;
  for (const UsageSample& s : recent_) rss.push_back(s.rss_bytes);
  std::nth_element(rss.begin(), rss.begin() + rss.size() / 2, rss.end());
  return rss[rss.size() / 2];
}

int64_t UsageWatch::Bound(int64_t slack_bytes, double slack_fraction) const {
  return std::max(slack_bytes, static_cast<int64_t>(slack_fraction * baseline_.rss_bytes));
}

absl::Status UsageWatch::Check(int64_t slack_bytes, double slack_fraction, int fd_slack) const {
  const int64_t grew = final_rss_bytes() - baseline_.rss_bytes;
  const int64_t bound = Bound(slack_bytes, slack_fraction);
  std::string problems;
  if (grew > bound) {
    absl::StrAppend(&problems, "RSS grew by ", MiB(grew), " (from ", MiB(baseline_.rss_bytes),
                    " in the warm-up to a median of ", MiB(final_rss_bytes()),
                    " over the last samples), more than the bound ", MiB(bound), "; ");
  }
  if (last_.fds - baseline_.fds > fd_slack) {
    absl::StrAppend(&problems, "open file descriptors grew from ", baseline_.fds, " to ",
                    last_.fds, " (allowed: +", fd_slack, "); ");
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(problems, "samples: ", Describe()));
}

std::string UsageWatch::Describe() const {
  std::string out = absl::StrCat("baseline ", Format(baseline_), ";");
  for (const UsageSample& s : recent_) absl::StrAppend(&out, " ", Format(s));
  return out;
}

}  // namespace fusebox::soak
