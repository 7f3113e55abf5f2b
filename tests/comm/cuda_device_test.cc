// The device seam's ordering rules on a real CUDA device (comm/nccl/
// cuda_device.h). Where no GPU or driver is present every test prints
// "SKIPPED: <reason>" and skips. A stream is made late with a host function
// that sleeps, so a missing event shows up as wrong data.
#include "comm/nccl/cuda_device.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace fusebox::comm {
namespace {

std::unique_ptr<Device> DeviceOrSkip() {
  absl::StatusOr<std::unique_ptr<Device>> d = CreateCudaDevice(0);
  if (!d.ok()) {
    std::printf("SKIPPED: %s\n", std::string(d.status().message()).c_str());
    return nullptr;
  }
  return *std::move(d);
}

#define FUSEBOX_DEVICE_OR_SKIP(dev)                       \
  std::unique_ptr<Device> dev = DeviceOrSkip();           \
  if (dev == nullptr) GTEST_SKIP() << "no CUDA device"

void Sleep(Device& dev, DeviceStream& s, int ms) {
  ASSERT_TRUE(dev.LaunchHostFunc(s, [ms] {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }).ok());
}

TEST(CudaDeviceTest, AnEventOrdersACopyAcrossStreams) {
  FUSEBOX_DEVICE_OR_SKIP(dev);
  auto producer = dev->CreateStream().value();
  auto consumer = dev->CreateStream().value();
  constexpr size_t kN = 1 << 20;
  std::vector<uint32_t> src(kN), zeros(kN, 0), out(kN, 1);
  for (size_t i = 0; i < kN; ++i) src[i] = static_cast<uint32_t>(i * 2654435761u);
  void* d1 = dev->Allocate(kN * 4).value();
  void* d2 = dev->Allocate(kN * 4).value();
  ASSERT_TRUE(dev->CopyAsync(d1, zeros.data(), kN * 4, *consumer).ok());
  ASSERT_TRUE(dev->SynchronizeStream(*consumer).ok());
  void* staging = dev->Allocate(kN * 4).value();
  ASSERT_TRUE(dev->CopyAsync(staging, src.data(), kN * 4, *consumer).ok());
  ASSERT_TRUE(dev->SynchronizeStream(*consumer).ok());
  Sleep(*dev, *producer, 50);  // the producer runs late
  ASSERT_TRUE(dev->CopyAsync(d1, staging, kN * 4, *producer).ok());
  auto e = dev->RecordEvent(*producer).value();
  ASSERT_TRUE(dev->WaitEvent(*consumer, *e).ok());
  ASSERT_TRUE(dev->CopyAsync(d2, d1, kN * 4, *consumer).ok());
  ASSERT_TRUE(dev->SynchronizeStream(*consumer).ok());
  ASSERT_TRUE(dev->CopyAsync(out.data(), d2, kN * 4, *consumer).ok());
  ASSERT_TRUE(dev->SynchronizeStream(*consumer).ok());
  EXPECT_EQ(out, src);
  dev->Free(d1);
  dev->Free(d2);
  dev->Free(staging);
}

TEST(CudaDeviceTest, EventDoneAndHostFunctionsInStreamOrder) {
  FUSEBOX_DEVICE_OR_SKIP(dev);
  auto s = dev->CreateStream().value();
  std::vector<int> seen;
  Sleep(*dev, *s, 30);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(dev->LaunchHostFunc(*s, [&seen, i] { seen.push_back(i); }).ok());
  auto e = dev->RecordEvent(*s).value();
  EXPECT_FALSE(dev->EventDone(*e).value());
  ASSERT_TRUE(dev->SynchronizeEvent(*e).ok());
  EXPECT_TRUE(dev->EventDone(*e).value());
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_NE(CudaStreamOf(*s), nullptr);
}

}  // namespace
}  // namespace fusebox::comm
