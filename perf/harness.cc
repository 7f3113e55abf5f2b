#include "perf/harness.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace fusebox::perf {

std::vector<size_t> SweepSizes(const PerfOptions& o, size_t type_size) {
  const size_t unit = type_size * static_cast<size_t>(std::max(1, o.tensors));
  std::vector<size_t> out;
  double b = static_cast<double>(std::max<size_t>(o.min_bytes, 0));
  for (size_t guard = 0; guard < 100000; ++guard) {
    const size_t bytes = static_cast<size_t>(b);
    if (bytes > o.max_bytes) break;
    const size_t aligned = bytes / unit * unit;
    if (out.empty() || out.back() != aligned) out.push_back(aligned);
    const double next = o.step_bytes != 0 ? b + static_cast<double>(o.step_bytes) : b * o.factor;
    if (next <= b) break;  // factor <= 1 and no step: a single size
    b = next;
  }
  return out;
}

absl::StatusOr<double> Context::Time(
    const std::function<absl::StatusOr<std::shared_ptr<comm::Work>>()>& issue,
    int iters, int warmup, bool blocking) {
  for (int i = 0; i < warmup; ++i) {
    auto w = issue();
    if (!w.ok()) return w.status();
    if (absl::Status s = (*w)->Wait(); !s.ok()) return s;
  }
  if (absl::Status s = comm::BarrierSync(comm_); !s.ok()) return s;
  std::vector<std::shared_ptr<comm::Work>> works;
  works.reserve(iters);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    auto w = issue();
    if (!w.ok()) return w.status();
    if (blocking) {
      if (absl::Status s = (*w)->Wait(); !s.ok()) return s;
    } else {
      works.push_back(*std::move(w));
    }
  }
  // A communicator completes collectives in issue order: waiting for the
  // last one waits for all with one wake-up instead of `iters`.
  for (auto it = works.rbegin(); it != works.rend(); ++it) {
    if (absl::Status s = (*it)->Wait(); !s.ok()) return s;
  }
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / std::max(1, iters);
}

absl::StatusOr<double> Context::TimeBlocking(const std::function<absl::Status()>& run, int iters,
                                             int warmup) {
  for (int i = 0; i < warmup; ++i) {
    if (absl::Status s = run(); !s.ok()) return s;
  }
  if (absl::Status s = comm::BarrierSync(comm_); !s.ok()) return s;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    if (absl::Status s = run(); !s.ok()) return s;
  }
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / std::max(1, iters);
}

absl::StatusOr<std::optional<Context::LaunchDelay>> Context::LaunchToStart(
    const std::function<absl::StatusOr<std::shared_ptr<comm::Work>>()>& issue, int samples,
    absl::Duration idle) {
  std::vector<double> us, done_us;
  bool marked = true;
  for (int i = 0; i < samples; ++i) {
    if (absl::Status s = comm::BarrierSync(comm_); !s.ok()) return s;
    absl::SleepFor(idle);
    auto w = issue();
    if (!w.ok()) return w.status();
    while (!(*w)->Test()) std::this_thread::yield();
    if (absl::Status s = (*w)->status(); !s.ok()) return s;
    const int64_t start = (*w)->started_ns();
    if (start == 0) marked = false;
    us.push_back(static_cast<double>(start - (*w)->issued_ns()) / 1e3);
    done_us.push_back(static_cast<double>((*w)->completed_ns() - (*w)->issued_ns()) / 1e3);
  }
  if (!marked || us.empty()) return std::optional<LaunchDelay>();
  const auto percentile = [](std::vector<double>& v, double q) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
  };
  LaunchDelay d;
  d.p50_us = percentile(us, 0.5);
  d.p99_us = percentile(us, 0.99);
  d.done_p50_us = percentile(done_us, 0.5);
  d.done_p99_us = percentile(done_us, 0.99);
  return std::optional<LaunchDelay>(d);
}

absl::StatusOr<double> Context::Mean(absl::string_view key, double value) {
  comm::PrefixStore scoped(std::string(key), store_);
  auto all = comm::StoreAllGather(scoped, key, rank(), size(),
                                  absl::StrFormat("%.17g", value),
                                  absl::Now() + absl::Seconds(300));
  if (!all.ok()) return all.status();
  double sum = 0;
  for (const std::string& s : *all) {
    double v = 0;
    if (!absl::SimpleAtod(s, &v)) {
      return absl::DataLossError(absl::StrCat("bad timing '", s, "' under '", key, "'"));
    }
    sum += v;
  }
  return sum / size();
}

absl::StatusOr<int64_t> Context::Sum(absl::string_view key, int64_t value) {
  comm::PrefixStore scoped(std::string(key), store_);
  auto all = comm::StoreAllGather(scoped, key, rank(), size(), absl::StrCat(value),
                                  absl::Now() + absl::Seconds(300));
  if (!all.ok()) return all.status();
  int64_t sum = 0;
  for (const std::string& s : *all) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(s, &v)) {
      return absl::DataLossError(absl::StrCat("bad count '", s, "' under '", key, "'"));
    }
    sum += v;
  }
  return sum;
}

absl::StatusOr<Buffer> Buffer::Make(comm::BufferOps& ops, size_t bytes) {
  auto p = ops.Allocate(bytes);
  if (!p.ok()) return p.status();
  return Buffer(&ops, *p, bytes);
}

ProgressLine::~ProgressLine() {
  if (printed_ && !lines_) std::fprintf(stderr, "\r\033[K");
}

void ProgressLine::Step(size_t done, size_t bytes) {
  if (!enabled_) return;
  if (lines_) {
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    if (done < total_ && printed_ && now - last_line_ns_ < 1'000'000'000) return;
    last_line_ns_ = now;
    std::fprintf(stderr, "[fusebox-perf] %zu/%zu sizes, now %zu bytes\n", done, total_, bytes);
  } else {
    std::fprintf(stderr, "\r\033[K[fusebox-perf] %zu/%zu sizes, now %zu bytes", done, total_,
                 bytes);
  }
  std::fflush(stderr);
  printed_ = true;
}

std::string FormatTimingColumns(const Timing& t, bool checked) {
  std::string wrong = checked ? absl::StrCat(t.wrong) : "N/A";
  return absl::StrFormat("%9.2f %7.2f %7.2f %6s", t.time_us, t.algbw, t.busbw, wrong);
}

}  // namespace fusebox::perf
