#include "autotune/measure.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "comm/host_pages.h"

namespace fusebox::autotune {

namespace {

using Clock = std::chrono::steady_clock;

absl::Status Run(absl::StatusOr<std::shared_ptr<comm::Work>> work, absl::Duration timeout) {
  if (!work.ok()) return work.status();
  return (*work)->WaitFor(timeout);
}

}  // namespace

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<int64_t> CalibrationSizes(int64_t max_bytes) {
  max_bytes = std::max<int64_t>(4, max_bytes / 4 * 4);
  std::vector<int64_t> sizes;
  for (int64_t m = 4096; m < max_bytes; m *= 8) sizes.push_back(m);
  sizes.push_back(max_bytes);
  return sizes;
}

absl::Status MaxAcrossRanks(comm::Communicator& comm, std::vector<double>& v) {
  if (v.empty()) return absl::OkStatus();
  return comm::AllReduceSync(comm, v.data(), v.data(), v.size(), comm::DataType::kFloat64,
                             comm::ReduceOp::kMax);
}

namespace {

// Collective: every rank learns whether any rank's `local` step failed,
// before the next collective. A rank that returned alone would leave the
// others waiting in that collective until its deadline, and they would
// report a timeout instead of the failure. Returns `local` where it failed,
// an error naming `what` where another rank's did, else OK.
absl::Status OnEveryRank(comm::Communicator& comm, const absl::Status& local,
                         absl::string_view what) {
  std::vector<double> failed = {local.ok() ? 0.0 : 1.0};
  if (absl::Status s = MaxAcrossRanks(comm, failed); !s.ok()) return s;
  if (!local.ok()) return local;
  if (failed[0] > 0)
    return absl::AbortedError(absl::StrCat("measure: another rank's ", what, " failed"));
  return absl::OkStatus();
}

// Collective: comm::AllocateHostPages on every rank (OnEveryRank).
absl::StatusOr<comm::HostPages> AllocateOnEveryRank(comm::Communicator& comm, size_t bytes,
                                                    absl::string_view what) {
  absl::StatusOr<comm::HostPages> pages = comm::AllocateHostPages(bytes);
  if (absl::Status s = OnEveryRank(comm, pages.status(),
                                   absl::StrCat("allocation of its ", bytes, "-byte ", what));
      !s.ok()) {
    return s;
  }
  return pages;
}

}  // namespace

absl::StatusOr<double> MeasureCopyGbps(comm::Communicator& comm, int64_t bytes) {
  if (bytes < 1) return absl::InvalidArgumentError("measure: copy size must be positive");
  // Aligned and resident before timing, as the engine's copies are
  // (Note [Timing on aligned buffers]).
  absl::StatusOr<comm::HostPages> src =
      AllocateOnEveryRank(comm, static_cast<size_t>(bytes), "copy source");
  if (!src.ok()) return src.status();
  absl::StatusOr<comm::HostPages> dst =
      AllocateOnEveryRank(comm, static_cast<size_t>(bytes), "copy destination");
  if (!dst.ok()) return dst.status();
  std::memset(src->get(), 1, bytes);
  std::vector<double> worst = {0};
  for (int r = 0; r < 3; ++r) {
    if (absl::Status s = comm::BarrierSync(comm); !s.ok()) return s;
    const auto t0 = Clock::now();
    std::memcpy(dst->get(), src->get(), bytes);
    worst[0] = std::max(worst[0], std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  if (absl::Status s = MaxAcrossRanks(comm, worst); !s.ok()) return s;
  return static_cast<double>(bytes) / std::max(worst[0], 1e-3) / 1e3;  // B/us -> GB/s
}

absl::StatusOr<double> MeasureStagingGbps(comm::Communicator& comm, comm::Device& device,
                                          int64_t bytes) {
  if (bytes < 1) return absl::InvalidArgumentError("measure: staging copy size must be positive");
  const size_t n = static_cast<size_t>(bytes);
  // Every step that can fail on one rank alone (the device's allocations,
  // stream and copies) is followed by OnEveryRank's agreement, and a rank
  // whose copy failed still takes part in the remaining barriers, so that
  // no rank is left in a collective its peer never joins.
  void* dev = nullptr;
  void* host = nullptr;
  std::unique_ptr<comm::DeviceStream> stream;
  absl::Status local = [&]() -> absl::Status {
    auto d = device.Allocate(n);
    if (!d.ok()) return d.status();
    dev = *d;
    auto h = device.AllocateHost(n);
    if (!h.ok()) return h.status();
    host = *h;
    auto st = device.CreateStream();
    if (!st.ok()) return st.status();
    stream = *std::move(st);
    std::memset(host, 1, n);
    // Untimed: both buffers touched and the stream warm.
    if (absl::Status s = device.CopyAsync(dev, host, n, *stream); !s.ok()) return s;
    return device.SynchronizeStream(*stream);
  }();
  absl::Status agreed = OnEveryRank(comm, local, "staging set-up on its device");
  std::vector<double> worst = {0};  // the slowest copy, us
  for (int r = 0; r < 3 && agreed.ok(); ++r) {
    for (const bool to_host : {true, false}) {
      if (absl::Status s = comm::BarrierSync(comm); !s.ok()) {
        agreed = s;
        break;
      }
      if (!local.ok()) continue;
      const auto t0 = Clock::now();
      local = to_host ? device.CopyAsync(host, dev, n, *stream)
                      : device.CopyAsync(dev, host, n, *stream);
      if (local.ok()) local = device.SynchronizeStream(*stream);
      worst[0] =
          std::max(worst[0], std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
  }
  if (agreed.ok()) agreed = OnEveryRank(comm, local, "staging copy on its device");
  if (agreed.ok()) agreed = MaxAcrossRanks(comm, worst);
  stream.reset();
  if (host != nullptr) device.FreeHost(host);
  if (dev != nullptr) device.Free(dev);
  if (!agreed.ok()) return agreed;
  return static_cast<double>(bytes) / std::max(worst[0], 1e-3) / 1e3;  // B/us -> GB/s
}

// Note [Timing on aligned buffers]
// The cost model, the lower bound and the overlap calibration are all timed
// here, and they describe the collectives the engine runs on its fusion
// buffers (64-byte aligned) and a framework runs on its tensors (a CPU
// allocator aligns them to 64 bytes or more). A buffer from new[] is
// 16-byte aligned: on a 2-core EPYC VM, 2 local ranks over the shared-memory
// path took 40-47 ms for a 97.5 MiB allreduce from such a buffer and 22-27
// ms from one 64-byte aligned or more (offsets of 0, 64 and 256 bytes from
// a page alike), so the bound came out above plans that then beat it
// (iteration / bound 0.72-0.86 at t(all) = 2 T_b) and every prediction was
// pessimistic. The buffer is page-aligned and faulted in before any timing
// (comm::AllocateHostPages), as are MeasureCopyGbps's two, which time the
// copy rate behind the model's copy-in and copy-back terms.
//
// Note [Timing on data out of cache]
// A plan's buckets walk through all of a model's gradients once an
// iteration, so unless the model fits in the caches each collective finds
// its bytes in memory. A size timed again and again on the same bytes finds
// them in the cache instead: on a 2-vCPU EPYC VM (1 MiB of L2 per core, 32
// MiB of L3), 2 local ranks over the shared-memory path, ResNet-50's last
// gradient (37632 bytes) timed that way took 6.6 us (the median of three;
// 4.7 us at the least), 5.7 GB/s, where one 97.5 MiB allreduce took 22.1
// ms, 4.6 GB/s. The lower bound's t*(m), the least time per byte of any
// size, then charged all 97.5 MiB at the small size's rate, 17.9 ms, and
// the simulator charged small buckets a rate they do not get in a plan.
// So with a working set (the model's gradient bytes, capped by the caller)
// every call runs on the next page-aligned part of a buffer that large, in
// turn: a part is used again only after the rest of the buffer has been. A
// model that fits in the caches is timed in the cache, as its plans run.
absl::StatusOr<std::vector<AllReduceSample>> MeasureAllReduce(comm::Communicator& comm,
                                                              const std::vector<int64_t>& sizes,
                                                              int reps, int64_t working_set_bytes) {
  if (reps < 1) return absl::InvalidArgumentError("measure: repetitions must be at least 1");
  // Far above any buffer a host allocates, and far from overflowing when
  // rounded up to a page.
  constexpr int64_t kMaxBytes = int64_t{1} << 48;
  if (working_set_bytes < 0 || working_set_bytes > kMaxBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("measure: working set of ", working_set_bytes, " bytes is not in [0, 2^48]"));
  }
  constexpr int64_t kPage = 4096;
  const auto round_up = [](int64_t bytes) { return (bytes + kPage - 1) / kPage * kPage; };
  int64_t largest = 4;
  for (int64_t s : sizes) {
    if (s < 4 || s % 4 != 0 || s > kMaxBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("measure: size ", s, " is not a positive multiple of 4 bytes up to 2^48"));
    }
    largest = std::max(largest, s);
  }
  // Note [Timing on aligned buffers]; Note [Timing on data out of cache].
  const int64_t pool = std::max(round_up(largest), round_up(working_set_bytes));
  absl::StatusOr<comm::HostPages> pages =
      AllocateOnEveryRank(comm, static_cast<size_t>(pool), "timing buffer");
  if (!pages.ok()) return pages.status();
  std::byte* base = pages->get();
  const int64_t walk = working_set_bytes > 0 ? pool : 0;  // 0: every call at the start
  int64_t cursor = 0;                                     // where the next call's data starts
  std::vector<AllReduceSample> out;
  for (int64_t bytes : sizes) {
    std::vector<double> times;
    for (int r = -1; r < reps; ++r) {
      if (cursor + bytes > walk) cursor = 0;
      auto* buf = reinterpret_cast<float*>(base + cursor);
      cursor += round_up(bytes);
      if (absl::Status s = comm::BarrierSync(comm); !s.ok()) return s;
      const auto t0 = Clock::now();
      if (absl::Status s = comm::AllReduceSync(comm, buf, buf, static_cast<size_t>(bytes / 4),
                                               comm::DataType::kFloat32, comm::ReduceOp::kAvg);
          !s.ok()) {
        return s;
      }
      std::vector<double> t = {
          std::chrono::duration<double, std::micro>(Clock::now() - t0).count()};
      if (absl::Status s = MaxAcrossRanks(comm, t); !s.ok()) return s;
      if (r >= 0) times.push_back(t[0]);
    }
    out.push_back({comm.size(), bytes, Median(times)});
  }
  return out;
}

absl::Status BroadcastBytes(comm::Communicator& comm, std::string& data, int root,
                            size_t max_bytes, absl::Duration timeout) {
  int64_t size = comm.rank() == root ? static_cast<int64_t>(data.size()) : 0;
  if (absl::Status s = Run(comm.Broadcast(&size, 1, comm::DataType::kInt64, root), timeout);
      !s.ok()) {
    return s;
  }
  if (size < 0 || static_cast<uint64_t>(size) > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("broadcast from rank ", root, ": ", size,
                                                   " bytes is more than the limit of ", max_bytes));
  }
  if (comm.rank() != root) data.assign(static_cast<size_t>(size), '\0');
  if (size == 0) return absl::OkStatus();
  return Run(comm.Broadcast(data.data(), data.size(), comm::DataType::kUInt8, root), timeout);
}

}  // namespace fusebox::autotune
