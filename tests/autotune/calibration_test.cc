// The cost-model calibration recovers what it measures: over a communicator
// whose allreduce is made to cost exactly d + m / B (an in-process loopback
// allreduce underneath, delayed to a set launch delay d and bandwidth B, one
// collective at a time as on one channel), MeasureAllReduce + FitCostModel
// recover d and B within 10%.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "autotune/cost_model.h"
#include "autotune/measure.h"
#include "comm/device.h"
#include "gtest/gtest.h"
#include "tests/common/forwarding_communicator.h"
#include "tests/common/run_ranks.h"

namespace fusebox::autotune {
namespace {

using Clock = std::chrono::steady_clock;

// AllReduce completes no earlier than d + m / B after it may start (its
// issue, or the previous allreduce's completion: one channel); everything
// else is the inner communicator's.
class SetCostCommunicator final : public fusebox::testing::ForwardingCommunicator {
 public:
  SetCostCommunicator(comm::Communicator& inner, double delay_us, double bytes_per_us)
      : ForwardingCommunicator(inner, "set-cost"),
        delay_us_(delay_us),
        bytes_per_us_(bytes_per_us),
        thread_([this] { Loop(); }) {}
  ~SetCostCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  absl::StatusOr<std::shared_ptr<comm::Work>> DoIssue(const comm::CollectiveArgs& a) override {
    auto inner = ForwardingCommunicator::DoIssue(a);
    if (a.kind != comm::CollectiveKind::kAllReduce || !inner.ok()) return inner;
    auto outer = std::make_shared<comm::Work>();
    const double cost_us =
        delay_us_ + static_cast<double>(a.count * comm::DataTypeSize(a.type)) / bytes_per_us_;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({*std::move(inner), outer, Clock::now(), cost_us});
    }
    cv_.notify_all();
    return outer;
  }

 private:
  struct Pending {
    std::shared_ptr<comm::Work> inner, outer;
    Clock::time_point issued;
    double cost_us;
  };
  void Loop() {
    Clock::time_point channel_free;
    for (;;) {
      Pending p;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        p = std::move(queue_.front());
        queue_.pop_front();
      }
      absl::Status s = p.inner->Wait();
      const Clock::time_point start = std::max(p.issued, channel_free);
      channel_free = start + std::chrono::microseconds(static_cast<int64_t>(p.cost_us));
      std::this_thread::sleep_until(channel_free);
      p.outer->Complete(std::move(s));
    }
  }

  const double delay_us_, bytes_per_us_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

// The costs are large (a 100 ms launch delay, 20 MB/s) so that a busy
// machine's scheduling delays (a few milliseconds for a woken thread while
// other tests keep both cores busy) stay well inside the 10%.
TEST(CalibrationTest, RecoversASetLaunchDelayAndBandwidthWithinTenPercent) {
  constexpr double kDelayUs = 100'000;
  constexpr double kBytesPerUs = 20;  // 20 MB/s: 4 MiB take 210 ms
  constexpr int kWorld = 2;
  std::vector<absl::StatusOr<CostModel>> fits(kWorld, absl::UnknownError("not run"));
  fusebox::testing::RunRanks(kWorld, [&](int r, comm::Communicator& inner) {
    SetCostCommunicator comm(inner, kDelayUs, kBytesPerUs);
    auto samples = MeasureAllReduce(comm, CalibrationSizes(int64_t{4} << 20), 3);
    ASSERT_TRUE(samples.ok()) << samples.status();
    fits[r] = FitCostModel(*samples, kWorld, "set-cost test");
  });
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(fits[r].ok()) << fits[r].status();
    const CostModel& m = *fits[r];
    // The launch delay: the fitted time of the smallest message.
    EXPECT_NEAR(m.AllReduceUs(4, kWorld), kDelayUs, 0.10 * kDelayUs) << m.Describe();
    // The bandwidth: the fitted time per byte between 4 KiB and 4 MiB.
    const double slope = (m.AllReduceUs(int64_t{4} << 20, kWorld) - m.AllReduceUs(4096, kWorld)) /
                         static_cast<double>((int64_t{4} << 20) - 4096);
    EXPECT_NEAR(1 / slope, kBytesPerUs, 0.10 * kBytesPerUs) << m.Describe();
  }
}

// Note [Timing on aligned buffers]: every allreduce MeasureAllReduce times
// runs on a page-aligned buffer (in place), as the engine's fusion buffers
// and a framework's tensors are at least line-aligned; from new[]'s 16-byte
// alignment the shared-memory path ran up to 2x slower than what it models.
class AlignmentRecorder final : public fusebox::testing::ForwardingCommunicator {
 public:
  explicit AlignmentRecorder(comm::Communicator& inner)
      : ForwardingCommunicator(inner, "alignment-recorder") {}
  absl::StatusOr<std::shared_ptr<comm::Work>> DoIssue(const comm::CollectiveArgs& a) override {
    // Allreduces of fp32 (not MaxAcrossRanks's doubles).
    if (a.kind == comm::CollectiveKind::kAllReduce && a.type == comm::DataType::kFloat32) {
      offsets_.push_back(reinterpret_cast<uintptr_t>(a.recv) % 4096);
      calls_.push_back({reinterpret_cast<uintptr_t>(a.recv), a.count * 4});
      in_place_ = in_place_ && a.send == a.recv;
    }
    return ForwardingCommunicator::DoIssue(a);
  }

  const std::vector<uintptr_t>& offsets() const { return offsets_; }
  // Every fp32 call's [address, address + bytes), in call order.
  const std::vector<std::pair<uintptr_t, size_t>>& calls() const { return calls_; }
  bool in_place() const { return in_place_; }

 private:
  std::vector<uintptr_t> offsets_;
  std::vector<std::pair<uintptr_t, size_t>> calls_;
  bool in_place_ = true;
};

TEST(CalibrationTest, TimesAllReducesOnPageAlignedBuffers) {
  constexpr int kWorld = 2;
  // Large enough that new[] takes the buffer from mmap (16 bytes past a page).
  const std::vector<int64_t> sizes = {4096, int64_t{1} << 20, int64_t{8} << 20};
  fusebox::testing::RunRanks(kWorld, [&](int r, comm::Communicator& inner) {
    AlignmentRecorder comm(inner);
    auto samples = MeasureAllReduce(comm, sizes, 2);
    ASSERT_TRUE(samples.ok()) << samples.status();
    ASSERT_EQ(samples->size(), sizes.size());
    // One warm-up and two timed per size, all from a page boundary.
    EXPECT_EQ(comm.offsets(), std::vector<uintptr_t>(3 * sizes.size(), 0)) << "rank " << r;
    EXPECT_TRUE(comm.in_place()) << "rank " << r;
  });
}

// Note [Timing on data out of cache]: with a working set, each call runs on
// the next page-aligned part of one buffer of that many bytes, so a call's
// bytes are used again only after the rest of the buffer has been (with 16
// KiB and 4 KiB calls: every fourth call). Without one, every call runs on
// the same bytes, which then stay in the cache.
TEST(CalibrationTest, WalksTheWorkingSetSoThatNoCallFindsItsBytesJustUsed) {
  constexpr int kWorld = 2;
  constexpr int64_t kWorkingSet = 16 << 10;
  const std::vector<int64_t> sizes = {4096, 4096};
  fusebox::testing::RunRanks(kWorld, [&](int r, comm::Communicator& inner) {
    AlignmentRecorder walking(inner);
    ASSERT_TRUE(MeasureAllReduce(walking, sizes, 5, kWorkingSet).ok());
    const auto& calls = walking.calls();
    ASSERT_EQ(calls.size(), 12u) << "rank " << r;  // a warm-up and 5 per size
    const uintptr_t base = calls.front().first;
    for (size_t i = 0; i < calls.size(); ++i) {
      // The parts in turn: 0, 4, 8, 12 KiB, then from the start again.
      EXPECT_EQ(calls[i].first - base, (i % 4) * 4096) << "rank " << r << ", call " << i;
      EXPECT_LE(calls[i].first + calls[i].second, base + kWorkingSet);
    }

    AlignmentRecorder fixed(inner);
    ASSERT_TRUE(MeasureAllReduce(fixed, sizes, 2).ok());
    for (const auto& [address, bytes] : fixed.calls()) {
      EXPECT_EQ(address, fixed.calls().front().first) << "rank " << r;
    }
  });
}

// Calls of different sizes share the walk, each part page-aligned and none
// past the buffer (the largest size where that exceeds the working set).
TEST(CalibrationTest, TheWalkKeepsEveryCallPageAlignedAndInsideItsBuffer) {
  constexpr int kWorld = 2;
  const std::vector<int64_t> sizes = {4, 5000, 40000, 100000};
  for (const int64_t working_set : {int64_t{0}, int64_t{12} << 10, int64_t{1} << 20}) {
    fusebox::testing::RunRanks(kWorld, [&](int r, comm::Communicator& inner) {
      AlignmentRecorder comm(inner);
      ASSERT_TRUE(MeasureAllReduce(comm, sizes, 3, working_set).ok());
      const auto& calls = comm.calls();
      ASSERT_EQ(calls.size(), 16u);
      uintptr_t low = calls.front().first, high = 0;
      for (const auto& [address, bytes] : calls) {
        EXPECT_EQ(address % 4096, 0u) << "rank " << r << ", working set " << working_set;
        // No working set: every size at the start of its buffer.
        if (working_set == 0) {
          EXPECT_EQ(address, calls.front().first) << "rank " << r;
        }
        low = std::min(low, address);
        high = std::max(high, address + bytes);
      }
      const uintptr_t buffer =
          std::max<uintptr_t>((100000 + 4095) / 4096 * 4096, (working_set + 4095) / 4096 * 4096);
      EXPECT_LE(high - low, buffer) << "rank " << r << ", working set " << working_set;
    });
  }
}

TEST(CalibrationTest, AWorkingSetOutOfRangeIsRefused) {
  fusebox::testing::RunRanks(2, [&](int, comm::Communicator& comm) {
    auto samples = MeasureAllReduce(comm, {4096}, 1, -1);
    EXPECT_EQ(samples.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(samples.status().message().find("working set of -1 bytes"), std::string::npos)
        << samples.status();
    // Beyond 2^48 (where rounding up to a page could overflow) too.
    EXPECT_EQ(
        MeasureAllReduce(comm, {4096}, 1, std::numeric_limits<int64_t>::max()).status().code(),
        absl::StatusCode::kInvalidArgument);
  });
}

// The staging calibration waits for each copy to finish: on an emulated
// device whose every operation first sleeps 40 ms, 1 MiB cannot appear to
// move faster than 1 MiB / 40 ms, and both ranks report the slowest rank's
// figure.
TEST(CalibrationTest, StagingBandwidthWaitsForTheCopies) {
  constexpr int kWorld = 2;
  constexpr int64_t kBytes = int64_t{1} << 20;
  const absl::Duration delay = absl::Milliseconds(40);
  std::vector<absl::StatusOr<double>> gbps(kWorld, absl::UnknownError("not run"));
  fusebox::testing::RunRanks(kWorld, [&](int r, comm::Communicator& comm) {
    comm::EmulatedDeviceOptions o;
    o.op_delay = delay;
    auto device = comm::CreateEmulatedDevice(o);
    EXPECT_EQ(MeasureStagingGbps(comm, *device, 0).status().code(),
              absl::StatusCode::kInvalidArgument);
    gbps[r] = MeasureStagingGbps(comm, *device, kBytes);
  });
  const double most = kBytes / absl::ToDoubleMicroseconds(delay) / 1e3;  // GB/s
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(gbps[r].ok()) << gbps[r].status();
    EXPECT_GT(*gbps[r], 0);
    EXPECT_LE(*gbps[r], most);
    EXPECT_EQ(*gbps[r], *gbps[0]);
  }
}

// An emulated device whose `fail_at`-th operation of kind `what`
// ("allocate", "host", "stream", "copy"; counted from 1) fails.
class FailingDevice : public comm::Device {
 public:
  FailingDevice(std::string what, int fail_at)
      : inner_(comm::CreateEmulatedDevice({})), what_(std::move(what)), fail_at_(fail_at) {}

  std::string name() const override { return "failing"; }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    if (Fails("allocate")) return absl::ResourceExhaustedError("injected: device allocation");
    return inner_->Allocate(bytes);
  }
  void Free(void* ptr) override { inner_->Free(ptr); }
  absl::StatusOr<void*> AllocateHost(size_t bytes) override {
    if (Fails("host")) return absl::ResourceExhaustedError("injected: pinned allocation");
    return inner_->AllocateHost(bytes);
  }
  void FreeHost(void* ptr) override { inner_->FreeHost(ptr); }
  absl::StatusOr<std::unique_ptr<comm::DeviceStream>> CreateStream() override {
    if (Fails("stream")) return absl::InternalError("injected: stream");
    return inner_->CreateStream();
  }
  absl::Status CopyAsync(void* dst, const void* src, size_t bytes,
                         comm::DeviceStream& stream) override {
    if (Fails("copy")) return absl::InternalError("injected: copy");
    return inner_->CopyAsync(dst, src, bytes, stream);
  }
  absl::Status LaunchHostFunc(comm::DeviceStream& stream, std::function<void()> fn) override {
    return inner_->LaunchHostFunc(stream, std::move(fn));
  }
  absl::StatusOr<std::shared_ptr<comm::DeviceEvent>> RecordEvent(
      comm::DeviceStream& stream) override {
    return inner_->RecordEvent(stream);
  }
  absl::Status WaitEvent(comm::DeviceStream& stream, const comm::DeviceEvent& event) override {
    return inner_->WaitEvent(stream, event);
  }
  absl::StatusOr<bool> EventDone(const comm::DeviceEvent& event) override {
    return inner_->EventDone(event);
  }
  absl::Status SynchronizeEvent(const comm::DeviceEvent& event) override {
    return inner_->SynchronizeEvent(event);
  }
  absl::Status SynchronizeStream(comm::DeviceStream& stream) override {
    return inner_->SynchronizeStream(stream);
  }

 private:
  bool Fails(absl::string_view kind) { return kind == what_ && ++seen_ == fail_at_; }

  std::unique_ptr<comm::Device> inner_;
  std::string what_;
  int fail_at_;
  int seen_ = 0;
};

// A device that fails on one rank, at set-up or at any of the timed copies,
// fails the calibration on every rank: that rank with the device's error,
// the other with one that says so, both before the collectives' deadline
// (a rank that returned alone would leave its peer waiting there).
TEST(CalibrationTest, ADeviceFailureOnOneRankFailsEveryRankAtOnce) {
  constexpr int kWorld = 2;
  struct Case {
    std::string what;
    int fail_at;
  };
  // copy 1 is the untimed warm-up; 2-7 the timed ones.
  const std::vector<Case> cases = {{"allocate", 1}, {"host", 1}, {"stream", 1},
                                   {"copy", 1},     {"copy", 2}, {"copy", 7}};
  comm::testing::LoopbackOptions lo;
  lo.timeout = absl::Seconds(30);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what + " " + std::to_string(c.fail_at));
    std::vector<absl::Status> got(kWorld);
    const auto t0 = Clock::now();
    fusebox::testing::RunRanks(
        kWorld,
        [&](int r, comm::Communicator& comm) {
          std::unique_ptr<comm::Device> device =
              r == 1 ? std::unique_ptr<comm::Device>(new FailingDevice(c.what, c.fail_at))
                     : comm::CreateEmulatedDevice({});
          got[r] = MeasureStagingGbps(comm, *device, 4096).status();
        },
        lo);
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(20));
    EXPECT_NE(got[1].message().find("injected"), std::string::npos) << got[1];
    EXPECT_EQ(got[0].code(), absl::StatusCode::kAborted) << got[0];
    EXPECT_NE(got[0].message().find("another rank's"), std::string::npos) << got[0];
  }
}

}  // namespace
}  // namespace fusebox::autotune
