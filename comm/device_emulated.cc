// The emulated device of comm/device.h: a worker thread per stream.
#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/device.h"

namespace fusebox::comm {
namespace {

// Done once the stream's worker has run everything before it.
class EmulatedEvent final : public DeviceEvent,
                            public std::enable_shared_from_this<EmulatedEvent> {
 public:
  void Signal() {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    cv_.notify_all();
  }
  bool Done() const {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  void Wait() const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
};

class EmulatedStream final : public DeviceStream {
 public:
  EmulatedStream(absl::Duration delay, absl::Duration max_random, uint64_t seed)
      : delay_(delay), max_random_(max_random), rng_(seed), worker_([this] { Run(); }) {}

  ~EmulatedStream() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      cv_.notify_all();
    }
    worker_.join();  // runs what is queued first
  }

  void Enqueue(std::function<void()> op) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(op));
    cv_.notify_all();
  }

 private:
  void Run() {
    for (;;) {
      std::function<void()> op;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and nothing left
        op = std::move(queue_.front());
        queue_.pop_front();
      }
      absl::Duration d = delay_;
      if (max_random_ > absl::ZeroDuration()) {
        std::uniform_int_distribution<int64_t> us(0, absl::ToInt64Microseconds(max_random_));
        d += absl::Microseconds(us(rng_));
      }
      if (d > absl::ZeroDuration()) std::this_thread::sleep_for(absl::ToChronoNanoseconds(d));
      op();
    }
  }

  const absl::Duration delay_;
  const absl::Duration max_random_;
  std::mt19937_64 rng_;  // the worker's only
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::thread worker_;  // last: starts once the members above exist
};

class EmulatedDevice final : public Device {
 public:
  explicit EmulatedDevice(EmulatedDeviceOptions options) : options_(options) {}

  std::string name() const override { return "emulated"; }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    void* p = std::malloc(bytes == 0 ? 1 : bytes);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("emulated device: cannot allocate ", bytes, " bytes"));
    }
    return p;
  }
  void Free(void* ptr) override { std::free(ptr); }
  absl::StatusOr<void*> AllocateHost(size_t bytes) override {
    const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("emulated device: cannot allocate ", bytes, " bytes of host memory"));
    }
    return p;
  }
  void FreeHost(void* ptr) override { std::free(ptr); }

  absl::StatusOr<std::unique_ptr<DeviceStream>> CreateStream() override {
    std::lock_guard<std::mutex> lock(mu_);
    const double scale = 1.0 + options_.stagger * static_cast<double>(streams_);
    const uint64_t seed = options_.seed * 0x9E3779B97F4A7C15ull + streams_;
    ++streams_;
    return std::unique_ptr<DeviceStream>(
        new EmulatedStream(options_.op_delay * scale, options_.max_random_delay, seed));
  }

  absl::Status CopyAsync(void* dst, const void* src, size_t bytes, DeviceStream& stream) override {
    if (bytes > 0 && (dst == nullptr || src == nullptr)) {
      return absl::InvalidArgumentError("emulated device: copy with a null pointer");
    }
    EmulatedStream* s = Own(stream);
    if (s == nullptr) return NotOurs("stream");
    s->Enqueue([dst, src, bytes] {
      if (bytes > 0) std::memmove(dst, src, bytes);
    });
    return absl::OkStatus();
  }

  absl::Status LaunchHostFunc(DeviceStream& stream, std::function<void()> fn) override {
    if (!fn) return absl::InvalidArgumentError("emulated device: empty host function");
    EmulatedStream* s = Own(stream);
    if (s == nullptr) return NotOurs("stream");
    s->Enqueue(std::move(fn));
    return absl::OkStatus();
  }

  absl::StatusOr<std::shared_ptr<DeviceEvent>> RecordEvent(DeviceStream& stream) override {
    EmulatedStream* s = Own(stream);
    if (s == nullptr) return NotOurs("stream");
    auto event = std::make_shared<EmulatedEvent>();
    s->Enqueue([event] { event->Signal(); });
    return std::shared_ptr<DeviceEvent>(event);
  }

  absl::Status WaitEvent(DeviceStream& stream, const DeviceEvent& event) override {
    EmulatedStream* s = Own(stream);
    if (s == nullptr) return NotOurs("stream");
    const auto* e = dynamic_cast<const EmulatedEvent*>(&event);
    if (e == nullptr) return NotOurs("event");
    // The worker blocks on the event (the stream waits, its caller does
    // not), holding it: the caller's reference may be gone by then.
    std::shared_ptr<const EmulatedEvent> held = e->shared_from_this();
    s->Enqueue([held] { held->Wait(); });
    return absl::OkStatus();
  }

  absl::StatusOr<bool> EventDone(const DeviceEvent& event) override {
    const auto* e = dynamic_cast<const EmulatedEvent*>(&event);
    if (e == nullptr) return NotOurs("event");
    return e->Done();
  }

  absl::Status SynchronizeEvent(const DeviceEvent& event) override {
    const auto* e = dynamic_cast<const EmulatedEvent*>(&event);
    if (e == nullptr) return NotOurs("event");
    e->Wait();
    return absl::OkStatus();
  }

  absl::Status SynchronizeStream(DeviceStream& stream) override {
    absl::StatusOr<std::shared_ptr<DeviceEvent>> e = RecordEvent(stream);
    if (!e.ok()) return e.status();
    return SynchronizeEvent(**e);
  }

 private:
  static EmulatedStream* Own(DeviceStream& stream) {
    return dynamic_cast<EmulatedStream*>(&stream);
  }
  static absl::Status NotOurs(const char* what) {
    return absl::InvalidArgumentError(
        absl::StrCat("emulated device: the ", what, " belongs to another device"));
  }

  const EmulatedDeviceOptions options_;
  std::mutex mu_;
  uint64_t streams_ = 0;  // guarded by mu_
};

}  // namespace

std::unique_ptr<Device> CreateEmulatedDevice(EmulatedDeviceOptions options) {
  return std::make_unique<EmulatedDevice>(options);
}

}  // namespace fusebox::comm
