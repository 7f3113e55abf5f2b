// The device seam's ordering rules (Note [Device seam] in comm/device.h) on
// the emulated device, with streams made to run late so that a missing or
// broken event shows up as wrong data instead of passing by luck.
#include "comm/device.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusebox::comm {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::vector<uint32_t> Pattern(size_t n, uint32_t salt) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>(i * 2654435761u) ^ salt;
  return v;
}

// Device memory that is freed with its device.
struct Buffer {
  Buffer(Device& d, size_t bytes) : dev(d), ptr(d.Allocate(bytes).value()) {}
  ~Buffer() { dev.Free(ptr); }
  Device& dev;
  void* ptr;
};

// Streams created later run later: stream k sleeps 1 ms * (1 + 20k) per
// operation.
EmulatedDeviceOptions Staggered() {
  EmulatedDeviceOptions o;
  o.op_delay = absl::Milliseconds(1);
  o.stagger = 20;
  return o;
}

TEST(EmulatedDeviceTest, AnEventOrdersWorkAcrossStreams) {
  auto dev = CreateEmulatedDevice(Staggered());
  auto consumer = dev->CreateStream().value();  // fast: 1 ms per operation
  auto producer = dev->CreateStream().value();  // slow: 21 ms per operation
  const std::vector<uint32_t> src = Pattern(4096, 7);
  const size_t bytes = src.size() * sizeof(uint32_t);
  Buffer d1(*dev, bytes), d2(*dev, bytes);
  std::vector<uint32_t> zeros(src.size(), 0), out(src.size(), 1);
  ASSERT_TRUE(dev->CopyAsync(d1.ptr, zeros.data(), bytes, *consumer).ok());
  ASSERT_TRUE(dev->SynchronizeStream(*consumer).ok());

  ASSERT_TRUE(dev->CopyAsync(d1.ptr, src.data(), bytes, *producer).ok());
  std::shared_ptr<DeviceEvent> uploaded = dev->RecordEvent(*producer).value();
  ASSERT_TRUE(dev->WaitEvent(*consumer, *uploaded).ok());
  ASSERT_TRUE(dev->CopyAsync(d2.ptr, d1.ptr, bytes, *consumer).ok());
  ASSERT_TRUE(dev->CopyAsync(out.data(), d2.ptr, bytes, *consumer).ok());
  ASSERT_TRUE(dev->SynchronizeStream(*consumer).ok());
  EXPECT_EQ(out, src) << "the consumer read d1 before the producer's copy landed";
}

TEST(EmulatedDeviceTest, AStreamRunsItsWorkInEnqueueOrder) {
  EmulatedDeviceOptions o;
  o.max_random_delay = absl::Microseconds(300);
  auto dev = CreateEmulatedDevice(o);
  auto s = dev->CreateStream().value();
  std::vector<int> seen;  // written by the stream's thread only
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(dev->LaunchHostFunc(*s, [&seen, i] { seen.push_back(i); }).ok());
  }
  ASSERT_TRUE(dev->SynchronizeStream(*s).ok());
  std::vector<int> want(100);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_THAT(seen, ElementsAreArray(want));
}

TEST(EmulatedDeviceTest, EventIsDoneOnlyOnceTheWorkBeforeItIs) {
  EmulatedDeviceOptions o;
  o.op_delay = absl::Milliseconds(30);
  auto dev = CreateEmulatedDevice(o);
  auto s = dev->CreateStream().value();
  std::atomic<bool> ran{false};
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(dev->LaunchHostFunc(*s, [&ran] { ran = true; }).ok());
  std::shared_ptr<DeviceEvent> e = dev->RecordEvent(*s).value();
  EXPECT_FALSE(dev->EventDone(*e).value());  // 60 ms of delays are ahead of it
  ASSERT_TRUE(dev->SynchronizeEvent(*e).ok());
  EXPECT_TRUE(ran.load());
  EXPECT_TRUE(dev->EventDone(*e).value());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(60));
}

TEST(EmulatedDeviceTest, CopiesRoundTripAtEverySize) {
  auto dev = CreateEmulatedDevice({});
  auto s = dev->CreateStream().value();
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{4096}, size_t{1} << 20}) {
    const std::vector<uint32_t> src = Pattern(n, static_cast<uint32_t>(n));
    std::vector<uint32_t> back(n, 0xdeadbeef);
    Buffer d(*dev, n * sizeof(uint32_t));
    ASSERT_TRUE(dev->CopyAsync(d.ptr, src.data(), n * sizeof(uint32_t), *s).ok());
    ASSERT_TRUE(dev->CopyAsync(back.data(), d.ptr, n * sizeof(uint32_t), *s).ok());
    ASSERT_TRUE(dev->SynchronizeStream(*s).ok());
    EXPECT_EQ(back, src) << n << " elements";
  }
}

TEST(EmulatedDeviceTest, DestroyingAStreamFinishesItsWork) {
  EmulatedDeviceOptions o;
  o.op_delay = absl::Milliseconds(10);
  auto dev = CreateEmulatedDevice(o);
  std::atomic<int> ran{0};
  {
    auto s = dev->CreateStream().value();
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(dev->LaunchHostFunc(*s, [&ran] { ++ran; }).ok());
  }
  EXPECT_EQ(ran.load(), 3);
}

TEST(EmulatedDeviceTest, AWaitHoldsTheEventAfterTheCallerDropsIt) {
  auto dev = CreateEmulatedDevice(Staggered());
  auto consumer = dev->CreateStream().value();
  auto producer = dev->CreateStream().value();
  std::atomic<bool> produced{false};
  bool seen_produced = false;
  ASSERT_TRUE(dev->LaunchHostFunc(*producer, [&produced] { produced = true; }).ok());
  {
    std::shared_ptr<DeviceEvent> e = dev->RecordEvent(*producer).value();
    ASSERT_TRUE(dev->WaitEvent(*consumer, *e).ok());
  }  // the only reference the caller had
  ASSERT_TRUE(dev->LaunchHostFunc(*consumer, [&] { seen_produced = produced.load(); }).ok());
  ASSERT_TRUE(dev->SynchronizeStream(*consumer).ok());
  EXPECT_TRUE(seen_produced);
}

TEST(EmulatedDeviceTest, RefusesAnotherDevicesStreamsAndEvents) {
  auto a = CreateEmulatedDevice({});
  auto b = CreateEmulatedDevice({});
  EXPECT_EQ(a->name(), "emulated");
  auto sa = a->CreateStream().value();
  struct Foreign : DeviceStream {} foreign_stream;
  struct ForeignEvent : DeviceEvent {} foreign_event;
  int x = 0, y = 0;
  absl::Status s = a->CopyAsync(&x, &y, sizeof(x), foreign_stream);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("stream belongs to another device"));
  EXPECT_EQ(a->WaitEvent(*sa, foreign_event).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->EventDone(foreign_event).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->CopyAsync(nullptr, &y, 4, *sa).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->LaunchHostFunc(*sa, nullptr).code(), absl::StatusCode::kInvalidArgument);
  // Events of one emulated device order streams of another: both are host
  // threads (CUDA allows it too, within a context).
  auto sb = b->CreateStream().value();
  std::shared_ptr<DeviceEvent> e = a->RecordEvent(*sa).value();
  EXPECT_TRUE(b->WaitEvent(*sb, *e).ok());
  EXPECT_TRUE(b->SynchronizeStream(*sb).ok());
}

// The engine's device path in miniature, over many iterations with random
// delays on every stream: the producer writes a gradient, the copy stream
// moves it into a fusion buffer after the producer's event, the
// "collective" stream reduces (here: doubles) it after the copy's event, the
// copy stream copies it back after the collective's event, and the host
// reads it after the last event. Every iteration's result is exact only if
// every event is honoured.
TEST(EmulatedDeviceTest, ThePipelineOfEventsHoldsUnderRandomDelays) {
  EmulatedDeviceOptions o;
  o.max_random_delay = absl::Microseconds(500);
  o.seed = 42;
  auto dev = CreateEmulatedDevice(o);
  auto producer = dev->CreateStream().value();
  auto copy = dev->CreateStream().value();
  auto collective = dev->CreateStream().value();
  constexpr size_t kN = 1024;
  const size_t bytes = kN * sizeof(uint32_t);
  Buffer grad(*dev, bytes), fusion(*dev, bytes), result(*dev, bytes);
  for (uint32_t it = 0; it < 40; ++it) {
    const std::vector<uint32_t> src = Pattern(kN, it);
    std::vector<uint32_t> out(kN, 0);
    ASSERT_TRUE(dev->CopyAsync(grad.ptr, src.data(), bytes, *producer).ok());
    auto ready = dev->RecordEvent(*producer).value();
    ASSERT_TRUE(dev->WaitEvent(*copy, *ready).ok());
    ASSERT_TRUE(dev->CopyAsync(fusion.ptr, grad.ptr, bytes, *copy).ok());
    auto copied_in = dev->RecordEvent(*copy).value();
    ASSERT_TRUE(dev->WaitEvent(*collective, *copied_in).ok());
    uint32_t* f = static_cast<uint32_t*>(fusion.ptr);
    ASSERT_TRUE(dev->LaunchHostFunc(*collective, [f] {
      for (size_t i = 0; i < kN; ++i) f[i] *= 2;
    }).ok());
    auto reduced = dev->RecordEvent(*collective).value();
    ASSERT_TRUE(dev->WaitEvent(*copy, *reduced).ok());
    ASSERT_TRUE(dev->CopyAsync(result.ptr, fusion.ptr, bytes, *copy).ok());
    ASSERT_TRUE(dev->CopyAsync(out.data(), result.ptr, bytes, *copy).ok());
    auto done = dev->RecordEvent(*copy).value();
    // The producer may overwrite its gradient once the copy-in is done.
    ASSERT_TRUE(dev->WaitEvent(*producer, *copied_in).ok());
    ASSERT_TRUE(dev->SynchronizeEvent(*done).ok());
    std::vector<uint32_t> want(kN);
    for (size_t i = 0; i < kN; ++i) want[i] = src[i] * 2;
    ASSERT_EQ(out, want) << "iteration " << it;
  }
}

}  // namespace
}  // namespace fusebox::comm
