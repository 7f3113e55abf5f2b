// The shared harness of fusebox-perf (nccl-tests' conventions, none of its
// globals): size sweep, warm-up and timing, cross-rank averaging, checking,
// table and JSON output. Each measured collective lives in its own file
// (allreduce.cc) and drives this harness.
#ifndef FUSEBOX_PERF_HARNESS_H_
#define FUSEBOX_PERF_HARNESS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/backends.h"
#include "comm/communicator.h"
#include "comm/store.h"
#include "comm/types.h"
#include "perf/sizes.h"

namespace fusebox::perf {

struct PerfOptions {
  size_t min_bytes = 8;
  size_t max_bytes = 64u << 20;
  double factor = 2.0;       // -f: multiply the size by this each step
  size_t step_bytes = 0;     // -i: or add this (wins when non-zero)
  int iters = 20;            // -n
  int warmup = 5;            // -w
  bool check = true;         // -c
  bool blocking = false;     // -z: wait for each collective before the next
  // --wait_each: non-blocking calls, each waited as soon as it is issued
  // (launch-to-done per call, to set beside -z 1's blocking call).
  bool wait_each = false;
  std::vector<comm::DataType> types = {comm::DataType::kFloat32};  // -d
  std::vector<comm::ReduceOp> ops = {comm::ReduceOp::kSum};          // -o
  int tensors = 1;           // --tensors: K tensors per call (multi-tensor mode)
  // --offset: the buffers start this many bytes past a page boundary (one
  // tensor per call); a framework's tensors are 64-byte aligned, malloc's
  // large blocks 16 bytes past a page.
  int64_t offset = 0;
  // --launch: samples of launch-to-start per size (non-blocking, one tensor;
  // 0: not measured).
  int launch_samples = 20;
  std::string json_path;     // --json (written by rank 0)
  bool progress = false;     // progress on stderr (rank 0)
  bool progress_lines = false;  // as whole lines (under fusebox-run) instead of one line in place
};


// The byte sizes of the sweep, aligned down to whole elements of `type_size`
// (and, in multi-tensor mode, to `tensors` equal tensors); deduplicated.
std::vector<size_t> SweepSizes(const PerfOptions& o, size_t type_size);

// One timed measurement, already averaged across ranks.
struct Timing {
  double time_us = 0;
  double algbw = 0;  // GB/s, GB = 1e9 bytes
  double busbw = 0;
  int64_t wrong = 0;  // summed across ranks; -1 when not checked
};

// Everything a collective's table needs at run time.
class Context {
 public:
  Context(comm::Communicator& comm, comm::Store& store, comm::BufferOps& buffers)
      : comm_(comm), store_(store), buffers_(buffers) {}
  comm::Communicator& comm() { return comm_; }
  comm::BufferOps& buffers() { return buffers_; }
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }

  // Times `issue` (one collective per call, returning its Work): `warmup`
  // calls waited one by one, a barrier, then `iters` calls back to back
  // (waited each when `blocking`), then all waited. Returns the mean time per
  // call in microseconds on this rank.
  absl::StatusOr<double> Time(
      const std::function<absl::StatusOr<std::shared_ptr<comm::Work>>()>& issue,
      int iters, int warmup, bool blocking);

  // Times `run` (one blocking collective per call): `warmup` calls, a
  // barrier, then `iters` calls. Returns the mean time per call in
  // microseconds on this rank.
  absl::StatusOr<double> TimeBlocking(const std::function<absl::Status()>& run, int iters,
                                      int warmup);

  // Launch-to-start of non-blocking calls issued to an idle communicator:
  // `samples` times, a barrier, a pause of `idle`, one call, then polled
  // with Test() (never driven) until done; each sample is the Work's
  // started_ns - issued_ns. Returns this rank's median and 99th percentile
  // in microseconds, or nullopt when the backend does not mark starts.
  struct LaunchDelay {
    double p50_us = 0;  // issue to start (Work::started_ns)
    double p99_us = 0;
    double done_p50_us = 0;  // issue to completion (Work::completed_ns): end to end
    double done_p99_us = 0;
  };
  absl::StatusOr<std::optional<LaunchDelay>> LaunchToStart(
      const std::function<absl::StatusOr<std::shared_ptr<comm::Work>>()>& issue, int samples,
      absl::Duration idle);

  // Mean of `value` across ranks (through the store; `key` must be unique
  // within the run and the same on every rank).
  absl::StatusOr<double> Mean(absl::string_view key, double value);
  absl::StatusOr<int64_t> Sum(absl::string_view key, int64_t value);

 private:
  comm::Communicator& comm_;
  comm::Store& store_;
  comm::BufferOps& buffers_;
};

// A device or host buffer owned for the duration of a measurement.
class Buffer {
 public:
  static absl::StatusOr<Buffer> Make(comm::BufferOps& ops, size_t bytes);
  Buffer(Buffer&& o) noexcept : ops_(o.ops_), p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; }
  Buffer& operator=(Buffer&&) = delete;
  ~Buffer() { if (p_ != nullptr) ops_->Free(p_); }
  void* get() const { return p_; }
  unsigned char* bytes() const { return static_cast<unsigned char*>(p_); }
  size_t size() const { return bytes_; }

 private:
  Buffer(comm::BufferOps* ops, void* p, size_t bytes) : ops_(ops), p_(p), bytes_(bytes) {}
  comm::BufferOps* ops_;
  void* p_;
  size_t bytes_;
};

// Progress on stderr: one line rewritten in place on a terminal, or whole
// lines (at most one a second, and the last) where output is piped through
// a launcher that prefixes every line (PerfOptions::progress_lines).
class ProgressLine {
 public:
  ProgressLine(bool enabled, size_t total, bool lines = false)
      : enabled_(enabled), lines_(lines), total_(total) {}
  ~ProgressLine();
  void Step(size_t done, size_t bytes);

 private:
  bool enabled_;
  bool lines_;
  size_t total_;
  bool printed_ = false;
  int64_t last_line_ns_ = 0;
};

std::string FormatTimingColumns(const Timing& t, bool checked);

}  // namespace fusebox::perf

#endif  // FUSEBOX_PERF_HARNESS_H_
