#include "comm/fault.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fusebox::comm {
namespace {

// Reports are the peers' own words: bounded and printable before they are
// quoted in this rank's error.
constexpr size_t kMaxReportBytes = 512;

std::string Printable(absl::string_view s) {
  std::string out(s.substr(0, kMaxReportBytes));
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return out;
}

}  // namespace

absl::Duration PostMortemGrace(absl::Duration collective_timeout) {
  return std::clamp(collective_timeout / 4, absl::Seconds(5), absl::Seconds(10));
}

std::string TimeoutPostMortem(Store& store, absl::string_view scope, int rank,
                              int size, absl::string_view doing,
                              absl::Duration grace) {
  const auto key = [&](int r) { return absl::StrCat(scope, "/fault/", r); };
  if (absl::Status s = store.Set(key(rank), Printable(doing)); !s.ok()) {
    return absl::StrCat("post-mortem unavailable: the job's store is unreachable (",
                        s.message(), "); if rank 0 hosts it, rank 0 may be the rank that failed");
  }
  std::vector<std::string> others;
  for (int r = 0; r < size; ++r) {
    if (r != rank) others.push_back(key(r));
  }
  // Missing keys are the answer, not an error.
  (void)store.Wait(others, absl::Now() + grace);
  std::vector<int> silent;
  std::vector<std::string> reports;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    auto set = store.Check(key(r));
    if (!set.ok()) {
      return absl::StrCat("post-mortem incomplete: the job's store failed (",
                          set.status().message(), ")");
    }
    if (!*set) {
      silent.push_back(r);
      continue;
    }
    auto report = store.Get(key(r), absl::Now() + absl::Seconds(1));
    reports.push_back(absl::StrCat("rank ", r, " reports: ",
                                   report.ok() ? Printable(*report) : "(unreadable)"));
  }
  std::string out = "post-mortem: ";
  if (silent.empty()) {
    absl::StrAppend(&out, "every rank is alive and reported (the collective itself stalled, "
                          "or ranks issued different collectives)");
  } else {
    absl::StrAppend(&out, silent.size() == 1 ? "rank " : "ranks ", absl::StrJoin(silent, ", "),
                    " did not report within ",
                    absl::FormatDuration(grace), " (dead, stalled, or not in a collective)");
  }
  for (const std::string& r : reports) absl::StrAppend(&out, "; ", r);
  return out;
}

}  // namespace fusebox::comm
