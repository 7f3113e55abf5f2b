#include "perf/allreduce.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/testing/exact_data.h"

namespace fusebox::perf {
namespace {

using comm::DataType;
using comm::ReduceOp;
using comm::Work;

// Allreduce moves 2(n-1)/n of the data over the busiest link (nccl-tests).
double BusFactor(int n) { return n > 1 ? 2.0 * (n - 1) / n : 1.0; }

nlohmann::json ToJson(const Timing& t) {
  return {{"time_us", t.time_us}, {"algbw", t.algbw}, {"busbw", t.busbw}, {"wrong", t.wrong}};
}

// One measured column: how to issue the collective for timing, and how to
// run it once on verifiable data.
struct Column {
  std::function<absl::StatusOr<std::shared_ptr<Work>>()> issue;
  // Prepares inputs for a check run (uploads into the right buffers).
  std::function<absl::Status()> prepare;
  // Runs once and downloads the result into `host`.
  std::function<absl::Status(std::vector<unsigned char>& host)> run_and_fetch;
  // The blocking call (-z 1), where the column has one: the communicator's
  // blocking form, as MPI_Allreduce is MPI's.
  std::function<absl::Status()> run = nullptr;
};

class AllReduceRow {
 public:
  AllReduceRow(Context& ctx, const PerfOptions& o, size_t bytes, DataType type, ReduceOp op)
      : ctx_(ctx), o_(o), bytes_(bytes), type_(type), op_(op),
        count_(bytes / comm::DataTypeSize(type)) {}

  absl::StatusOr<Timing> Measure(const std::string& key, const Column& col) {
    Timing t;
    t.wrong = -1;
    if (o_.check) {
      if (absl::Status s = col.prepare(); !s.ok()) return s;
      std::vector<unsigned char> got(bytes_);
      if (absl::Status s = col.run_and_fetch(got); !s.ok()) return s;
      std::vector<unsigned char> want(bytes_);
      comm::testing::FillExpected(want.data(), count_, type_, op_, ctx_.size());
      const int64_t wrong = static_cast<int64_t>(
          comm::testing::CountMismatches(got.data(), want.data(), count_, type_));
      auto total = ctx_.Sum(key + "/wrong", wrong);
      if (!total.ok()) return total.status();
      t.wrong = *total;
    }
    // Multi-tensor mode waits for every call: the fused column unpacks after
    // its collective, so letting the separate column overlap iterations
    // would compare unlike things.
    auto us = o_.blocking && col.run
                  ? ctx_.TimeBlocking(col.run, o_.iters, o_.warmup)
                  : ctx_.Time(col.issue, o_.iters, o_.warmup,
                                o_.blocking || o_.wait_each || o_.tensors > 1);
    if (!us.ok()) return us.status();
    auto mean = ctx_.Mean(key + "/time", *us);
    if (!mean.ok()) return mean.status();
    t.time_us = *mean;
    t.algbw = t.time_us > 0 ? static_cast<double>(bytes_) / (t.time_us * 1e3) : 0;
    t.busbw = t.algbw * BusFactor(ctx_.size());
    return t;
  }

  absl::Status UploadInput(void* dst) {
    std::vector<unsigned char> host(bytes_);
    comm::testing::FillInput(host.data(), count_, type_, op_, ctx_.rank());
    return ctx_.buffers().Upload(dst, host.data(), bytes_);
  }

  absl::Status Poison(void* dst) {
    std::vector<unsigned char> host(bytes_, 0xA5);
    return ctx_.buffers().Upload(dst, host.data(), bytes_);
  }

  size_t count() const { return count_; }

 private:
  Context& ctx_;
  const PerfOptions& o_;
  const size_t bytes_;
  const DataType type_;
  const ReduceOp op_;
  const size_t count_;
};

// Launch-to-start is measured for single non-blocking calls only: in a
// blocking loop the caller executes its own collective, and a multi-tensor
// call is several.
bool LaunchColumns(const PerfOptions& o) {
  return o.launch_samples > 0 && !o.blocking && o.tensors <= 1;
}

absl::Status WaitOn(absl::StatusOr<std::shared_ptr<Work>> w) {
  if (!w.ok()) return w.status();
  return (*w)->Wait();
}

// The launch-to-start columns of one row (and launch-to-done in its JSON),
// timed on `issue` after a pause longer than any progress spin: the
// communicator is idle, as it is when backward hands it the first bucket.
absl::StatusOr<std::string> MeasureLaunch(
    Context& ctx, const PerfOptions& o, const std::string& key,
    const std::function<absl::StatusOr<std::shared_ptr<Work>>()>& issue, nlohmann::json& jrow) {
  auto d = ctx.LaunchToStart(issue, o.launch_samples, absl::Milliseconds(1));
  if (!d.ok()) return d.status();
  if (!d->has_value()) return std::string("       n/a     n/a");
  auto m50 = ctx.Mean(key + "/launch50", (*d)->p50_us);
  if (!m50.ok()) return m50.status();
  auto m99 = ctx.Mean(key + "/launch99", (*d)->p99_us);
  if (!m99.ok()) return m99.status();
  jrow["launch_us"] = {{"p50", *m50}, {"p99", *m99}, {"samples", o.launch_samples}};
  // End to end: issue to completion, the same calls.
  auto d50 = ctx.Mean(key + "/done50", (*d)->done_p50_us);
  if (!d50.ok()) return d50.status();
  auto d99 = ctx.Mean(key + "/done99", (*d)->done_p99_us);
  if (!d99.ok()) return d99.status();
  jrow["launch_done_us"] = {{"p50", *d50}, {"p99", *d99}, {"samples", o.launch_samples}};
  return absl::StrFormat("  %7.1f %7.1f", *m50, *m99);
}

}  // namespace

void PrintAllReduceHeader(std::FILE* out, const PerfOptions& o) {
  if (out == nullptr) return;
  const char* left = o.tensors > 1 ? "separate calls" : "out-of-place";
  const char* right = o.tensors > 1 ? "fused buffer" : "in-place";
  const bool launch = LaunchColumns(o);
  std::fprintf(out, "#\n");
  std::fprintf(out, "# %10s %12s %8s %6s %7s %30s   %30s%s\n", "", "", "", "", "",
               left, right, o.tensors > 1 ? "  speedup" : launch ? "  launch-to-start" : "");
  std::fprintf(out, "# %10s %12s %8s %6s %7s %9s %7s %7s %6s  %9s %7s %7s %6s%s\n", "size",
               "count", "type", "redop", o.tensors > 1 ? "tensors" : "root", "time", "algbw",
               "busbw", "#wrong", "time", "algbw", "busbw", "#wrong",
               o.tensors > 1 ? "  sep/fused" : launch ? "      p50     p99" : "");
  std::fprintf(out, "# %10s %12s %8s %6s %7s %9s %7s %7s %6s  %9s %7s %7s %6s%s\n", "(B)",
               "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
               "(GB/s)", "", launch ? "     (us)    (us)" : "");
}

absl::StatusOr<AllReduceSummary> RunAllReduce(Context& ctx, const PerfOptions& o,
                                              std::FILE* out) {
  AllReduceSummary summary;
  double busbw_sum = 0;
  int busbw_n = 0;
  size_t total_rows = 0;
  for (DataType type : o.types) total_rows += SweepSizes(o, comm::DataTypeSize(type)).size() * o.ops.size();
  ProgressLine progress(o.progress && ctx.rank() == 0, total_rows, o.progress_lines);
  size_t done = 0;
  comm::Communicator& comm = ctx.comm();
  comm::BufferOps& bufs = ctx.buffers();

  for (DataType type : o.types) {
    const size_t esize = comm::DataTypeSize(type);
    for (ReduceOp op : o.ops) {
      for (size_t bytes : SweepSizes(o, esize)) {
        progress.Step(done++, bytes);
        AllReduceRow row(ctx, o, bytes, type, op);
        const size_t count = row.count();
        // Buffers are page-aligned; --offset moves both past the boundary.
        const size_t offset = o.tensors <= 1 ? static_cast<size_t>(o.offset) : 0;
        auto in = Buffer::Make(bufs, bytes + offset);
        if (!in.ok()) return in.status();
        auto outb = Buffer::Make(bufs, bytes + offset);
        if (!outb.ok()) return outb.status();
        void* a = in->bytes() + offset;
        void* b = outb->bytes() + offset;
        const std::string key = absl::StrCat("perf/", comm::DataTypeName(type), "/",
                                             comm::ReduceOpName(op), "/", bytes);
        nlohmann::json jrow = {{"bytes", bytes},
                               {"count", count},
                               {"type", std::string(comm::DataTypeName(type))},
                               {"redop", std::string(comm::ReduceOpName(op))}};
        Timing left, right;
        std::string launch_cols;
        if (o.tensors <= 1) {
          // The check run goes through the path that is timed (-z 1: the blocking call).
          const auto run_once = [&](const void* send, void* recv) {
            return o.blocking ? comm.AllReduceBlocking(send, recv, count, type, op)
                              : WaitOn(comm.AllReduce(send, recv, count, type, op));
          };
          Column oop{[&] { return comm.AllReduce(a, b, count, type, op); },
                     [&] {
                       if (absl::Status s = row.UploadInput(a); !s.ok()) return s;
                       return row.Poison(b);
                     },
                     [&](std::vector<unsigned char>& host) {
                       if (absl::Status s = run_once(a, b); !s.ok()) return s;
                       return bufs.Download(host.data(), b, bytes);
                     },
                     [&] { return run_once(a, b); }};
          Column ip{[&] { return comm.AllReduce(b, b, count, type, op); },
                    [&] { return row.UploadInput(b); },
                    [&](std::vector<unsigned char>& host) {
                      if (absl::Status s = run_once(b, b); !s.ok()) return s;
                      return bufs.Download(host.data(), b, bytes);
                    },
                    [&] { return run_once(b, b); }};
          auto l = row.Measure(key + "/oop", oop);
          if (!l.ok()) return l.status();
          auto r = row.Measure(key + "/ip", ip);
          if (!r.ok()) return r.status();
          left = *l;
          right = *r;
          jrow["oop"] = ToJson(left);
          jrow["ip"] = ToJson(right);
          if (LaunchColumns(o)) {
            absl::StatusOr<std::string> cols = MeasureLaunch(ctx, o, key, ip.issue, jrow);
            if (!cols.ok()) return cols.status();
            launch_cols = *std::move(cols);
          }
        } else {
          // K equal tensors laid out in `a` (as gradients would be). Separate:
          // one in-place AllReduce per tensor, issued back to back. Fused:
          // pack into `b`, one AllReduce, unpack: what a bucket costs.
          const size_t k = static_cast<size_t>(o.tensors);
          const size_t per = count / k, per_bytes = per * esize;
          const auto separate = [&]() -> absl::StatusOr<std::shared_ptr<Work>> {
            std::vector<comm::TensorRef> ts(k);
            for (size_t i = 0; i < k; ++i) ts[i] = {static_cast<char*>(a) + i * per_bytes, per, type};
            return comm.AllReduceMulti(ts, op);
          };
          const auto fused = [&]() -> absl::StatusOr<std::shared_ptr<Work>> {
            for (size_t i = 0; i < k; ++i) {
              absl::Status s = bufs.Copy(static_cast<char*>(b) + i * per_bytes,
                                         static_cast<char*>(a) + i * per_bytes, per_bytes);
              if (!s.ok()) return s;
            }
            auto w = comm.AllReduce(b, b, count, type, op);
            if (!w.ok()) return w.status();
            if (absl::Status s = (*w)->Wait(); !s.ok()) return s;
            for (size_t i = 0; i < k; ++i) {
              absl::Status s = bufs.Copy(static_cast<char*>(a) + i * per_bytes,
                                         static_cast<char*>(b) + i * per_bytes, per_bytes);
              if (!s.ok()) return s;
            }
            return Work::Done(absl::OkStatus());
          };
          const auto fetch = [&](const std::function<absl::StatusOr<std::shared_ptr<Work>>()>& f) {
            return [&, f](std::vector<unsigned char>& host) -> absl::Status {
              if (absl::Status s = WaitOn(f()); !s.ok()) return s;
              return bufs.Download(host.data(), a, bytes);
            };
          };
          Column sep{separate, [&] { return row.UploadInput(a); }, fetch(separate)};
          Column fus{fused, [&] { return row.UploadInput(a); }, fetch(fused)};
          auto l = row.Measure(key + "/sep", sep);
          if (!l.ok()) return l.status();
          auto r = row.Measure(key + "/fused", fus);
          if (!r.ok()) return r.status();
          left = *l;
          right = *r;
          jrow["tensors"] = k;
          jrow["separate"] = ToJson(left);
          jrow["fused"] = ToJson(right);
          jrow["speedup"] = right.time_us > 0 ? left.time_us / right.time_us : 0;
        }
        if (o.check) summary.wrong += left.wrong + right.wrong;
        busbw_sum += left.busbw + right.busbw;
        busbw_n += 2;
        if (out != nullptr) {
          std::string extra;
          if (o.tensors > 1) {
            extra = absl::StrFormat("  %9.2fx", right.time_us > 0 ? left.time_us / right.time_us : 0);
          } else {
            extra = launch_cols;
          }
          std::fprintf(out, "  %10zu %12zu %8s %6s %7d %s  %s%s\n", bytes, count,
                       std::string(comm::DataTypeName(type)).c_str(),
                       std::string(comm::ReduceOpName(op)).c_str(),
                       o.tensors > 1 ? o.tensors : -1,
                       FormatTimingColumns(left, o.check).c_str(),
                       FormatTimingColumns(right, o.check).c_str(), extra.c_str());
          std::fflush(out);
        }
        summary.rows.push_back(std::move(jrow));
      }
    }
  }
  summary.avg_busbw = busbw_n > 0 ? busbw_sum / busbw_n : 0;
  return summary;
}

}  // namespace fusebox::perf
