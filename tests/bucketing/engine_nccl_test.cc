// The engine on the NCCL communicator (Note [A device communicator] in
// bucketing/engine.h) on a real GPU: one rank (NCCL takes one rank per
// GPU), fusion buffers in device memory, gradients produced on a stream of
// their own and marked with its event. Prints "SKIPPED: <reason>" and skips
// where no GPU or driver is present (the build machines); the same rules
// run everywhere on the emulated device (engine_device_test.cc).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bucketing/engine.h"
#include "comm/device.h"
#include "comm/memory_store.h"
#include "comm/nccl/communicator.h"
#include "comm/testing/exact_data.h"
#include "gtest/gtest.h"
#include "tests/bucketing/engine_testing.h"
#include "tests/bucketing/test_layouts.h"

namespace fusebox::bucketing {
namespace {

using comm::testing::CountMismatches;
using comm::testing::FillInput;
using testing::BaselinePlans;
using testing::Expected;
using testing::RandomLayout;
using testing::Seed;

TEST(NcclEngineTest, ExactForEveryBaselinePlanCopiedAndInPlace) {
  if (const absl::Status gpu = comm::CudaAvailable(); !gpu.ok()) {
    std::printf("SKIPPED: %s\n", std::string(gpu.message()).c_str());
    GTEST_SKIP() << gpu.message();
  }
  comm::MemoryStore store;
  auto comm = comm::CreateNcclCommunicator(comm::NcclOptions{}, 0, 1, 0, store);
  ASSERT_TRUE(comm.ok()) << comm.status();
  comm::Device* device = (*comm)->device();
  ASSERT_NE(device, nullptr);
  std::vector<TensorSpec> specs = RandomLayout(41, 16, 2000, 12000, /*mixed=*/true).tensors();
  for (TensorSpec& t : specs) t.memory = comm::MemoryKind::kDevice;
  auto layout = GradientLayout::Create(std::move(specs));
  ASSERT_TRUE(layout.ok()) << layout.status();
  const std::vector<Plan> plans = BaselinePlans(*layout);
  auto engine = Engine::Create(**comm, *layout, plans[0], EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<void*> grads;
  for (const TensorSpec& t : layout->tensors()) {
    auto p = device->Allocate(t.numel * comm::DataTypeSize(t.dtype));
    ASSERT_TRUE(p.ok()) << p.status();
    grads.push_back(*p);
  }
  auto producer = *device->CreateStream();
  auto consumer = *device->CreateStream();
  int it = 0;
  for (const Plan& plan : plans) {
    ASSERT_TRUE((*engine)->SetPlan(plan).ok());
    for (bool views : {false, true}) {
      ++it;
      std::vector<std::vector<unsigned char>> inputs, outputs;
      std::vector<void*> at;
      for (int id = 0; id < layout->size(); ++id) {
        const TensorSpec& t = layout->tensor(id);
        void* storage = views ? (*engine)->TensorStorage(id) : nullptr;
        at.push_back(storage != nullptr ? storage : grads[id]);
        inputs.emplace_back(t.numel * comm::DataTypeSize(t.dtype) + 1);
        outputs.emplace_back(inputs.back().size(), 0xA5);
        FillInput(inputs[id].data(), t.numel, t.dtype, comm::ReduceOp::kSum, 0, Seed(it, id));
        ASSERT_TRUE(device->CopyAsync(at[id], inputs[id].data(),
                                      t.numel * comm::DataTypeSize(t.dtype), *producer)
                        .ok());
        auto ready = device->RecordEvent(*producer);
        ASSERT_TRUE(ready.ok()) << ready.status();
        ASSERT_TRUE((*engine)->MarkReadyOnDevice(id, at[id], t.numel, ready->get()).ok());
      }
      ASSERT_TRUE((*engine)->Finish().ok());
      ASSERT_TRUE(device->WaitEvent(*consumer, *(*engine)->finished_event()).ok());
      for (int id = 0; id < layout->size(); ++id) {
        const TensorSpec& t = layout->tensor(id);
        ASSERT_TRUE(device->CopyAsync(outputs[id].data(), at[id],
                                      t.numel * comm::DataTypeSize(t.dtype), *consumer)
                        .ok());
      }
      ASSERT_TRUE(device->SynchronizeStream(*consumer).ok());
      ASSERT_TRUE(device->SynchronizeStream(*producer).ok());
      for (int id = 0; id < layout->size(); ++id) {
        const TensorSpec& t = layout->tensor(id);
        const std::vector<unsigned char> want = Expected(t, 1, Seed(it, id));
        EXPECT_EQ(CountMismatches(outputs[id].data(), want.data(), t.numel, t.dtype), 0u)
            << "plan \"" << plan.name << "\"" << (views ? " in place" : " copied") << " tensor "
            << id;
      }
    }
  }
  engine->reset();
  for (void* p : grads) device->Free(p);
}

}  // namespace
}  // namespace fusebox::bucketing
