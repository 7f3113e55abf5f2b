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

absl::Duration PostMortemStay(absl::Duration collective_timeout) {
  return PostMortemGrace(collective_timeout) + absl::Seconds(1);
}

std::string TimeoutPostMortem(Store& store, absl::string_view scope, int rank, int size,
                              absl::string_view doing, absl::Duration grace, absl::Duration stay) {
  const auto key = [&](int r) { return absl::StrCat(scope, "/fault/", r); };
  if (absl::Status s = store.Set(key(rank), Printable(doing)); !s.ok()) {
    return absl::StrCat("post-mortem unavailable: the job's store is unreachable (",
                        s.message(), "); if rank 0 hosts it, rank 0 may be the rank that failed");
  }
  // What has been learned so far, so that a store that fails during the
  // wait (the rank hosting it gave up first and exited) still leaves an
  // answer: reports already in are read before waiting for the rest.
  std::vector<bool> reported(size, false);
  std::vector<std::string> reports(size);
  absl::Status store_failed;
  const auto look = [&](int r) {
    if (r == rank || reported[r] || !store_failed.ok()) return;
    auto set = store.Check(key(r));
    if (!set.ok()) {
      store_failed = set.status();
      return;
    }
    if (!*set) return;
    reported[r] = true;
    auto report = store.Get(key(r), absl::Now() + absl::Seconds(1));
    reports[r] = report.ok() ? Printable(*report) : "(unreadable)";
  };
  for (int r = 0; r < size; ++r) look(r);
  std::vector<std::string> others;
  for (int r = 0; r < size; ++r) {
    if (r != rank && !reported[r]) others.push_back(key(r));
  }
  if (store_failed.ok() && !others.empty()) {
    // Missing keys are the answer, not an error.
    (void)store.Wait(others, absl::Now() + grace);
    for (int r = 0; r < size; ++r) look(r);
  }
  std::vector<int> silent;
  for (int r = 0; r < size; ++r) {
    if (r != rank && !reported[r]) silent.push_back(r);
  }
  // "rank 1" or "ranks 1, 3".
  const std::string named =
      absl::StrCat(silent.size() == 1 ? "rank " : "ranks ", absl::StrJoin(silent, ", "));
  std::string out;
  if (!store_failed.ok()) {
    absl::StrAppend(&out, "post-mortem incomplete: the job's store failed (",
                    store_failed.message(), ")");
    if (!silent.empty()) {
      absl::StrAppend(&out, "; until then ", named,
                      " did not report (dead, stalled, or not in a collective)");
    }
  } else if (silent.empty()) {
    out =
        "post-mortem: every rank is alive and reported (the collective itself stalled, "
        "or ranks issued different collectives)";
  } else {
    absl::StrAppend(&out, "post-mortem: ", named, " did not report within ",
                    absl::FormatDuration(grace), " (dead, stalled, or not in a collective)");
  }
  for (int r = 0; r < size; ++r) {
    if (reported[r]) absl::StrAppend(&out, "; rank ", r, " reports: ", reports[r]);
  }
  // Note [Timeout post-mortem]: this rank may host the store, so it stays
  // until every rank it saw report has read the reports too (or `stay`
  // runs out), instead of taking the store away from a rank still waiting.
  if (store_failed.ok()) {
    const auto read_key = [&](int r) { return absl::StrCat(scope, "/fault/read/", r); };
    std::vector<std::string> readers;
    for (int r = 0; r < size; ++r) {
      if (r != rank && reported[r]) readers.push_back(read_key(r));
    }
    if (store.Set(read_key(rank), "1").ok() && !readers.empty()) {
      (void)store.Wait(readers, absl::Now() + stay);
    }
  }
  return out;
}

}  // namespace fusebox::comm
