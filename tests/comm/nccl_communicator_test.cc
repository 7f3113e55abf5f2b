// Single-process tests of the NCCL backend on device memory. Where no GPU or
// driver is present every GPU test prints "SKIPPED: <reason>" and skips;
// the availability checks themselves run everywhere.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/memory_store.h"
#include "comm/nccl/communicator.h"
#include "comm/testing/exact_data.h"
#include "gtest/gtest.h"

namespace fusebox::comm {
namespace {

using testing::CountMismatches;
using testing::FillExpected;
using testing::FillInput;


// Owns a device allocation.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes != 0 && cudaMalloc(&p_, bytes) != cudaSuccess) p_ = nullptr;
  }
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  bool ok() const { return bytes_ == 0 || p_ != nullptr; }
  void Upload(const std::vector<unsigned char>& host) {
    if (bytes_ != 0) {
      ASSERT_EQ(cudaMemcpy(p_, host.data(), bytes_, cudaMemcpyHostToDevice), cudaSuccess);
      // Landed before a collective on NCCL's non-blocking stream reads it
      // (Note [Device copies before NCCL] in comm/backends.cc).
      ASSERT_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
    }
  }
  std::vector<unsigned char> Download() const {
    std::vector<unsigned char> host(bytes_);
    if (bytes_ != 0) {
      EXPECT_EQ(cudaMemcpy(host.data(), p_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return host;
  }

 private:
  size_t bytes_;
  void* p_ = nullptr;
};

// Skips the current test with a visible line when no GPU is usable.
#define FUSEBOX_SKIP_WITHOUT_GPU()                                   \
  do {                                                               \
    const absl::Status _gpu = CudaAvailable();                       \
    if (!_gpu.ok()) {                                                \
      std::printf("SKIPPED: %s\n", std::string(_gpu.message()).c_str()); \
      GTEST_SKIP() << _gpu.message();                                \
    }                                                                \
  } while (0)

TEST(NcclAvailabilityTest, CudaAvailableIsOkOrUnavailableWithReason) {
  const absl::Status s = CudaAvailable();
  if (!s.ok()) {
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_NE(s.message().find("cudaGetDeviceCount"), absl::string_view::npos) << s;
  }
  // Asking twice gives the same answer (the first call's error is cleared).
  EXPECT_EQ(CudaAvailable().code(), s.code());
}

TEST(NcclAvailabilityTest, CreateWithoutGpuFailsCleanly) {
  if (CudaAvailable().ok()) GTEST_SKIP() << "a GPU is present";
  MemoryStore store;
  auto c = CreateNcclCommunicator(NcclOptions{}, 0, 1, 0, store);
  EXPECT_TRUE(absl::IsUnavailable(c.status())) << c.status();
}

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FUSEBOX_SKIP_WITHOUT_GPU();
    auto c = CreateNcclCommunicator(NcclOptions{}, 0, 1, 0, store_);
    ASSERT_TRUE(c.ok()) << c.status();
    comm_ = *std::move(c);
  }

  MemoryStore store_;
  std::unique_ptr<Communicator> comm_;
};

TEST_F(NcclCommunicatorTest, ReportsRankSizeAndBackend) {
  EXPECT_EQ(comm_->rank(), 0);
  EXPECT_EQ(comm_->size(), 1);
  EXPECT_EQ(comm_->backend(), "nccl");
  EXPECT_EQ(comm_->memory(), MemoryKind::kDevice);
}

TEST_F(NcclCommunicatorTest, AllReduceEveryTypeAndOp) {
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1023}, size_t{4096},
                       (size_t{1} << 20) + 3}) {
    for (DataType t : kAllDataTypes) {
      for (ReduceOp op : kAllReduceOps) {
        for (bool in_place : {false, true}) {
          const size_t bytes = count * DataTypeSize(t);
          std::vector<unsigned char> in(bytes), want(bytes);
          FillInput(in.data(), count, t, op, 0, count);
          FillExpected(want.data(), count, t, op, 1, count);
          DeviceBuffer send(bytes), recv(bytes);
          ASSERT_TRUE(send.ok() && recv.ok());
          send.Upload(in);
          void* dst = in_place ? send.get() : recv.get();
          auto w = comm_->AllReduce(send.get(), dst, count, t, op);
          ASSERT_TRUE(w.ok()) << w.status();
          ASSERT_TRUE((*w)->Wait().ok()) << (*w)->status();
          const std::vector<unsigned char> got = in_place ? send.Download() : recv.Download();
          EXPECT_EQ(CountMismatches(got.data(), want.data(), count, t), 0u)
              << "count " << count << " " << DataTypeName(t) << " " << ReduceOpName(op)
              << (in_place ? " in-place" : " out-of-place");
        }
      }
    }
  }
}

TEST_F(NcclCommunicatorTest, AllReduceMultiReducesEveryTensor) {
  struct Case {
    size_t count;
    DataType type;
  };
  const std::vector<Case> cases = {{7, DataType::kFloat32}, {1023, DataType::kBFloat16},
                                   {0, DataType::kInt64}, {4096, DataType::kFloat16}};
  std::vector<std::unique_ptr<DeviceBuffer>> bufs;
  std::vector<TensorRef> refs;
  for (const Case& c : cases) {
    std::vector<unsigned char> in(c.count * DataTypeSize(c.type));
    FillInput(in.data(), c.count, c.type, ReduceOp::kSum, 0, 1);
    bufs.push_back(std::make_unique<DeviceBuffer>(in.size()));
    ASSERT_TRUE(bufs.back()->ok());
    bufs.back()->Upload(in);
    refs.push_back(TensorRef{bufs.back()->get(), c.count, c.type});
  }
  auto w = comm_->AllReduceMulti(refs, ReduceOp::kSum);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Wait().ok()) << (*w)->status();
  for (size_t i = 0; i < cases.size(); ++i) {
    std::vector<unsigned char> want(cases[i].count * DataTypeSize(cases[i].type));
    FillExpected(want.data(), cases[i].count, cases[i].type, ReduceOp::kSum, 1, 1);
    const std::vector<unsigned char> got = bufs[i]->Download();
    EXPECT_EQ(CountMismatches(got.data(), want.data(), cases[i].count, cases[i].type), 0u)
        << "tensor " << i;
  }
}

TEST_F(NcclCommunicatorTest, BroadcastAllGatherAndBarrier) {
  constexpr size_t kCount = 1023;
  std::vector<unsigned char> in(kCount * sizeof(float));
  FillInput(in.data(), kCount, DataType::kFloat32, ReduceOp::kMax, 0);
  DeviceBuffer a(in.size()), b(in.size());
  ASSERT_TRUE(a.ok() && b.ok());
  a.Upload(in);
  auto w = comm_->Broadcast(a.get(), kCount, DataType::kFloat32, 0);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Wait().ok()) << (*w)->status();
  EXPECT_EQ(a.Download(), in);
  w = comm_->AllGather(a.get(), b.get(), kCount, DataType::kFloat32);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Wait().ok()) << (*w)->status();
  EXPECT_EQ(b.Download(), in);
  w = comm_->Barrier();
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE((*w)->Wait().ok()) << (*w)->status();
}

// Note [Device communicators]: AllReduceAfter's collective waits on the
// GPU for an event of another stream. The input is written there behind a
// gate (a host function that spins until the test opens it), out of
// place: a collective that ran before the write would leave the zeros of
// the output's memset, not the input, and its Work would complete while
// the gate is closed.
TEST_F(NcclCommunicatorTest, AllReduceAfterWaitsForAnEventOfAnotherStream) {
  Device* device = comm_->device();
  ASSERT_NE(device, nullptr);
  constexpr size_t kCount = 4096;
  std::vector<unsigned char> in(kCount * sizeof(float)), want(in.size());
  FillInput(in.data(), kCount, DataType::kFloat32, ReduceOp::kSum, 0, 9);
  FillExpected(want.data(), kCount, DataType::kFloat32, ReduceOp::kSum, 1, 9);
  DeviceBuffer send(in.size()), recv(in.size());
  ASSERT_TRUE(send.ok() && recv.ok());
  ASSERT_EQ(cudaMemset(send.get(), 0, in.size()), cudaSuccess);
  ASSERT_EQ(cudaMemset(recv.get(), 0, in.size()), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto producer = device->CreateStream();
  ASSERT_TRUE(producer.ok()) << producer.status();
  std::atomic<bool> open{false};
  ASSERT_TRUE(device->LaunchHostFunc(**producer, [&] {
    while (!open.load()) std::this_thread::yield();
  }).ok());
  ASSERT_TRUE(device->CopyAsync(send.get(), in.data(), in.size(), **producer).ok());
  auto ready = device->RecordEvent(**producer);
  ASSERT_TRUE(ready.ok()) << ready.status();
  auto w = comm_->AllReduceAfter(**ready, send.get(), recv.get(), kCount, DataType::kFloat32,
                                 ReduceOp::kSum);
  ASSERT_TRUE(w.ok()) << w.status();
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE((*w)->Test()) << "the allreduce completed before its input was written";
  open.store(true);
  ASSERT_TRUE((*w)->Wait().ok()) << (*w)->status();
  const std::vector<unsigned char> got = recv.Download();
  EXPECT_EQ(CountMismatches(got.data(), want.data(), kCount, DataType::kFloat32), 0u);
  ASSERT_TRUE(device->SynchronizeStream(**producer).ok());
}

TEST_F(NcclCommunicatorTest, InvalidArgumentsAreRejectedSynchronously) {
  EXPECT_TRUE(absl::IsInvalidArgument(
      comm_->AllReduce(nullptr, nullptr, 4, DataType::kFloat32, ReduceOp::kSum).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      comm_->Broadcast(nullptr, 4, DataType::kFloat32, 0).status()));
  DeviceBuffer a(16);
  EXPECT_TRUE(absl::IsInvalidArgument(
      comm_->Broadcast(a.get(), 4, DataType::kFloat32, 1).status()));
}

}  // namespace
}  // namespace fusebox::comm
