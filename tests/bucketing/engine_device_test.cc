// The engine on device gradients over a host communicator (Note [Device
// gradients over a host communicator] in bucketing/engine.h), on the
// emulated device (comm/device.h): real UCX ranks as threads, "device"
// memory that only streams write, and streams that run late at random, so
// that a missing event between producer, copy-in, collective, copy-out and
// consumer shows up as a wrong result instead of passing by luck.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "bucketing/engine.h"
#include "bucketing/planners.h"
#include "comm/device.h"
#include "comm/testing/device_communicator.h"
#include "comm/testing/exact_data.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/bucketing/engine_testing.h"
#include "tests/bucketing/test_layouts.h"

namespace fusebox::bucketing {
namespace {

using comm::testing::CountMismatches;
using comm::testing::FillInput;
using ::testing::HasSubstr;
using testing::BaselinePlans;
using testing::Expected;
using testing::RandomLayout;
using testing::RunRanks;
using testing::Seed;

constexpr unsigned char kPoison = 0xA5;

GradientLayout OnDevice(const GradientLayout& host) {
  std::vector<TensorSpec> specs = host.tensors();
  for (TensorSpec& t : specs) t.memory = comm::MemoryKind::kDevice;
  auto layout = GradientLayout::Create(std::move(specs));
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *std::move(layout);
}

// Late streams: every operation waits 20 us plus up to 300 us at random,
// and each stream created later runs slower (stagger), so the engine's own
// streams (created first) race ahead of the producers and consumer.
comm::EmulatedDeviceOptions LateStreams(uint64_t seed) {
  comm::EmulatedDeviceOptions o;
  o.op_delay = absl::Microseconds(20);
  o.max_random_delay = absl::Microseconds(300);
  o.stagger = 1.0;
  o.seed = seed;
  return o;
}

// One rank's device gradients: allocated once, poisoned before each
// iteration, written only by the producer streams.
class DeviceGrads {
 public:
  DeviceGrads(comm::Device& device, const GradientLayout& layout) : device_(device) {
    for (const TensorSpec& t : layout.tensors()) {
      auto p = device.Allocate(t.numel * comm::DataTypeSize(t.dtype));
      EXPECT_TRUE(p.ok()) << p.status();
      ptrs_.push_back(*p);
      bytes_.push_back(t.numel * comm::DataTypeSize(t.dtype));
    }
  }
  ~DeviceGrads() {
    for (void* p : ptrs_) device_.Free(p);
  }
  void* at(int id) const { return ptrs_[id]; }
  // The emulated device's memory is host memory: poisoning it directly
  // (with every stream idle) is what a fresh cudaMalloc of garbage is.
  void Poison() {
    for (size_t i = 0; i < ptrs_.size(); ++i) std::memset(ptrs_[i], kPoison, bytes_[i]);
  }

 private:
  comm::Device& device_;
  std::vector<void*> ptrs_;
  std::vector<size_t> bytes_;
};

// `iterations` iterations of one rank: each gradient is produced on one of
// `threads` producer streams (an async copy of this rank's exact input,
// then an event), marked ready with that event from that thread in a
// random order; after Finish a consumer stream waits on finished_event()
// and copies every gradient out; each must equal the exact average.
// With `views`, a gradient that lies whole in one bucket is produced in
// place there (TensorStorage) and marked with that address.
void RunDeviceIterations(Engine& engine, comm::Device& device, DeviceGrads& grads, int rank,
                         int world, int first_iteration, int iterations, int threads,
                         bool views = false) {
  const GradientLayout& layout = engine.layout();
  auto at = [&](int id) {
    void* storage = views ? engine.TensorStorage(id) : nullptr;
    return storage != nullptr ? storage : grads.at(id);
  };
  std::vector<std::unique_ptr<comm::DeviceStream>> producers;
  for (int th = 0; th < threads; ++th) producers.push_back(*device.CreateStream());
  auto consumer = *device.CreateStream();
  for (int it = first_iteration; it < first_iteration + iterations; ++it) {
    grads.Poison();
    for (int id = 0; id < layout.size(); ++id) {  // (emulated device memory, every stream idle)
      const TensorSpec& t = layout.tensor(id);
      std::memset(at(id), kPoison, t.numel * comm::DataTypeSize(t.dtype));
    }
    std::vector<std::vector<unsigned char>> inputs(layout.size()), outputs(layout.size());
    for (int id = 0; id < layout.size(); ++id) {
      const TensorSpec& t = layout.tensor(id);
      inputs[id].assign(t.numel * comm::DataTypeSize(t.dtype) + 1, 0);
      outputs[id].assign(inputs[id].size(), kPoison);
      FillInput(inputs[id].data(), t.numel, t.dtype, comm::ReduceOp::kSum, rank, Seed(it, id));
    }
    std::vector<int> order(layout.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(rank * 7777 + it));
    std::atomic<size_t> next{0};
    std::vector<std::thread> markers;
    for (int th = 0; th < threads; ++th) {
      markers.emplace_back([&, th] {
        comm::DeviceStream& producer = *producers[th];
        for (size_t k; (k = next.fetch_add(1)) < order.size();) {
          const int id = order[k];
          const TensorSpec& t = layout.tensor(id);
          ASSERT_TRUE(device.CopyAsync(at(id), inputs[id].data(),
                                       t.numel * comm::DataTypeSize(t.dtype), producer)
                          .ok());
          auto ready = device.RecordEvent(producer);
          ASSERT_TRUE(ready.ok()) << ready.status();
          absl::Status s = engine.MarkReadyOnDevice(id, at(id), t.numel, ready->get());
          EXPECT_TRUE(s.ok()) << s;
        }
      });
    }
    for (auto& m : markers) m.join();
    absl::Status s = engine.Finish();
    ASSERT_TRUE(s.ok()) << s;
    std::shared_ptr<comm::DeviceEvent> finished = engine.finished_event();
    ASSERT_NE(finished, nullptr);
    ASSERT_TRUE(device.WaitEvent(*consumer, *finished).ok());
    for (int id = 0; id < layout.size(); ++id) {
      const TensorSpec& t = layout.tensor(id);
      ASSERT_TRUE(device.CopyAsync(outputs[id].data(), at(id),
                                   t.numel * comm::DataTypeSize(t.dtype), *consumer)
                      .ok());
    }
    ASSERT_TRUE(device.SynchronizeStream(*consumer).ok());
    for (auto& p : producers) ASSERT_TRUE(device.SynchronizeStream(*p).ok());
    for (int id = 0; id < layout.size(); ++id) {
      const TensorSpec& t = layout.tensor(id);
      std::vector<unsigned char> want = Expected(t, world, Seed(it, id));
      EXPECT_EQ(CountMismatches(outputs[id].data(), want.data(), t.numel, t.dtype), 0u)
          << "rank " << rank << "/" << world << " iteration " << it << " plan \""
          << engine.plan().name << "\" tensor " << id << " (" << t.numel << " "
          << comm::DataTypeName(t.dtype) << ")";
    }
  }
}

class DeviceEngineTest : public ::testing::TestWithParam<int> {};

// Every baseline plan (per-tensor, DDP, Horovod, HCCL split, fixed size
// splitting one tensor into many slices, split indices), mixed dtypes and
// zero-size tensors, 2 producer threads, late random streams, 2 iterations
// per plan (the second's copies in must wait for the first's copies back),
// and the plan swaps between them; both schedules.
TEST_P(DeviceEngineTest, StagedResultsAreExactForEveryBaselinePlan) {
  const int world = GetParam();
  const GradientLayout layout =
      OnDevice(RandomLayout(world * 17 + 3, 16, 2000, 12000, /*mixed=*/true));
  const std::vector<Plan> plans = BaselinePlans(layout);
  for (Schedule schedule : {Schedule::kPlanOrder, Schedule::kForwardPriority}) {
    RunRanks(world, [&](int rank, comm::Communicator& comm) {
      std::unique_ptr<comm::Device> device = comm::CreateEmulatedDevice(LateStreams(rank + 1));
      EngineOptions options;
      options.max_in_flight = 2;
      options.timeout = absl::Seconds(60);
      options.schedule = schedule;
      options.device = device.get();
      auto engine = Engine::Create(comm, layout, plans[0], options);
      ASSERT_TRUE(engine.ok()) << engine.status();
      for (int id = 0; id < layout.size(); ++id) EXPECT_EQ((*engine)->TensorStorage(id), nullptr);
      DeviceGrads grads(*device, layout);
      int it = 0;
      for (const Plan& plan : plans) {
        ASSERT_TRUE((*engine)->SetPlan(plan).ok());
        RunDeviceIterations(**engine, *device, grads, rank, world, it, 2, /*threads=*/2);
        it += 2;
      }
      EXPECT_EQ((*engine)->stats().size(), 2 * plans.size());
      engine->reset();  // before the device and the gradients go
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, DeviceEngineTest, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return "Np" + std::to_string(info.param); });

// Marking ready does not wait for the producer: with the producer stream
// held back behind a gate, MarkReadyOnDevice returns at once, and the
// buckets become complete only after the gate opens and the producer runs.
TEST(DeviceEngineOrderTest, MarkReadyDoesNotWaitForTheProducer) {
  const GradientLayout layout = OnDevice(testing::MakeLayout({64, 64}));
  RunRanks(1, [&](int, comm::Communicator& comm) {
    std::unique_ptr<comm::Device> device = comm::CreateEmulatedDevice({});
    EngineOptions options;
    options.device = device.get();
    auto engine = Engine::Create(comm, layout, PerTensorPlan(layout), options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    DeviceGrads grads(*device, layout);
    grads.Poison();
    auto gate_stream = *device->CreateStream();
    auto producer = *device->CreateStream();
    std::atomic<bool> open{false};
    // The producer waits behind a host function that spins until `open`.
    ASSERT_TRUE(device->LaunchHostFunc(*gate_stream, [&] {
      while (!open.load()) std::this_thread::yield();
    }).ok());
    auto gate = *device->RecordEvent(*gate_stream);
    ASSERT_TRUE(device->WaitEvent(*producer, *gate).ok());
    std::vector<float> in(64, 3.0f), out(64, 0.0f);
    for (int id = 0; id < 2; ++id) {
      ASSERT_TRUE(device->CopyAsync(grads.at(id), in.data(), 64 * 4, *producer).ok());
    }
    auto ready = *device->RecordEvent(*producer);
    for (int id = 0; id < 2; ++id) {
      ASSERT_TRUE((*engine)->MarkReadyOnDevice(id, grads.at(id), 64, ready.get()).ok());
    }
    // Both calls returned while the producer is still held back.
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_FALSE(device->EventDone(*ready).value());
    const double opened_us = (*engine)->NowUs();
    open.store(true);
    ASSERT_TRUE((*engine)->Finish().ok());
    auto consumer = *device->CreateStream();
    ASSERT_TRUE(device->WaitEvent(*consumer, *(*engine)->finished_event()).ok());
    ASSERT_TRUE(device->CopyAsync(out.data(), grads.at(1), 64 * 4, *consumer).ok());
    ASSERT_TRUE(device->SynchronizeStream(*consumer).ok());
    EXPECT_EQ(out, in);  // one rank: the average is the input
    // The buckets were complete (copied in) only after the producer ran.
    const IterationStats st = (*engine)->last_stats();
    ASSERT_EQ(st.bucket_times.size(), 2u);
    for (const BucketTiming& b : st.bucket_times) {
      EXPECT_GE(st.start_us + b.ready_us, opened_us) << "bucket " << b.bucket;
    }
    EXPECT_EQ(st.copy_in_us, 0.0);  // no CPU thread copied anything in
    engine->reset();
  });
}

// The staging buffers are reused across iterations, so the next
// iteration's copies in must wait for this one's copies back even when
// nothing else orders them: here each iteration's gradients are fresh
// device memory, complete when marked (no producer event), the consumer of
// iteration 0 has not synchronised yet, and the engine's copy-out stream
// runs far behind its copy-in stream. Without the wait, iteration 1's
// inputs reach iteration 0's results through the staging buffers.
TEST(DeviceEngineOrderTest, NextIterationWaitsForTheCopiesBack) {
  const GradientLayout layout =
      OnDevice(RandomLayout(/*seed=*/11, 12, 3000, 6000, /*mixed=*/false));
  for (const Plan& plan : {PerTensorPlan(layout), DdpPlan(layout, DdpOptions{4096, 16384})}) {
    RunRanks(2, [&](int rank, comm::Communicator& comm) {
      comm::EmulatedDeviceOptions late;
      late.op_delay = absl::Microseconds(20);
      late.max_random_delay = absl::Microseconds(30);
      late.stagger = 100;  // each stream created later runs 101x later per operation
      late.seed = rank + 7;
      std::unique_ptr<comm::Device> device = comm::CreateEmulatedDevice(late);
      EngineOptions options;
      options.device = device.get();
      options.timeout = absl::Seconds(60);
      // The engine's streams first: copy-in 20 us per operation, copy-out 2 ms.
      auto engine = Engine::Create(comm, layout, plan, options);
      ASSERT_TRUE(engine.ok()) << engine.status();
      auto consumer = *device->CreateStream();
      std::vector<std::unique_ptr<DeviceGrads>> grads;  // one set per iteration
      std::vector<std::vector<std::vector<unsigned char>>> outputs(2);
      for (int it = 0; it < 2; ++it) {
        grads.push_back(std::make_unique<DeviceGrads>(*device, layout));
        for (int id = 0; id < layout.size(); ++id) {
          const TensorSpec& t = layout.tensor(id);
          outputs[it].emplace_back(t.numel * comm::DataTypeSize(t.dtype) + 1, kPoison);
          // Written directly (emulated device memory is host memory): complete now.
          FillInput(grads[it]->at(id), t.numel, t.dtype, comm::ReduceOp::kSum, rank,
                    Seed(it, id));
          ASSERT_TRUE(
              (*engine)->MarkReadyOnDevice(id, grads[it]->at(id), t.numel, nullptr).ok());
        }
        ASSERT_TRUE((*engine)->Finish().ok());
        // The consumer reads this iteration's results, and nobody waits.
        ASSERT_TRUE(device->WaitEvent(*consumer, *(*engine)->finished_event()).ok());
        for (int id = 0; id < layout.size(); ++id) {
          const TensorSpec& t = layout.tensor(id);
          ASSERT_TRUE(device->CopyAsync(outputs[it][id].data(), grads[it]->at(id),
                                        t.numel * comm::DataTypeSize(t.dtype), *consumer)
                          .ok());
        }
      }
      ASSERT_TRUE(device->SynchronizeStream(*consumer).ok());
      for (int it = 0; it < 2; ++it) {
        for (int id = 0; id < layout.size(); ++id) {
          const TensorSpec& t = layout.tensor(id);
          std::vector<unsigned char> want = Expected(t, 2, Seed(it, id));
          EXPECT_EQ(CountMismatches(outputs[it][id].data(), want.data(), t.numel, t.dtype), 0u)
              << "rank " << rank << " iteration " << it << " plan \"" << plan.name
              << "\" tensor " << id;
        }
      }
      engine->reset();
    });
  }
}

// Note [A device communicator]: fusion buffers in device memory and the
// collective on the communicator's stream (the emulated device
// communicator over the loopback, comm/testing/device_communicator.h).
// Each rank's device runs its streams late at random, later the later they
// were made: the communicator's stream first (fastest), then the engine's
// copy streams, then the producers and the consumer (slowest), so a
// collective that does not wait for its copies in, or copies in that do
// not wait for their producer, read poison.
class DeviceCommunicatorEngineTest : public ::testing::TestWithParam<int> {};

TEST_P(DeviceCommunicatorEngineTest, ResultsAreExactForEveryBaselinePlanCopiedAndInPlace) {
  const int world = GetParam();
  const GradientLayout layout =
      OnDevice(RandomLayout(world * 29 + 5, 16, 2000, 12000, /*mixed=*/true));
  const std::vector<Plan> plans = BaselinePlans(layout);
  for (bool views : {false, true}) {
    RunRanks(world, [&](int rank, comm::Communicator& host) {
      std::unique_ptr<comm::Device> device = comm::CreateEmulatedDevice(LateStreams(rank + 1));
      auto comm = comm::testing::CreateEmulatedDeviceCommunicator(host, *device);
      ASSERT_TRUE(comm.ok()) << comm.status();
      EngineOptions options;
      options.max_in_flight = 2;
      options.timeout = absl::Seconds(60);
      auto engine = Engine::Create(**comm, layout, plans[0], options);
      ASSERT_TRUE(engine.ok()) << engine.status();
      DeviceGrads grads(*device, layout);
      int it = 0;
      int in_place = 0;  // tensors offered a place in device memory, over the plans
      for (const Plan& plan : plans) {
        ASSERT_TRUE((*engine)->SetPlan(plan).ok());
        for (int id = 0; id < layout.size(); ++id) in_place += (*engine)->TensorStorage(id) != nullptr;
        RunDeviceIterations(**engine, *device, grads, rank, world, it, 2, /*threads=*/2, views);
        it += 2;
      }
      EXPECT_GT(in_place, 0);  // fusion buffers are device memory: views are offered
      const std::vector<IterationStats> stats = (*engine)->stats();
      ASSERT_EQ(stats.size(), 2 * plans.size());
      EXPECT_EQ(stats.back().copy_in_us, 0.0);  // no CPU thread copied anything
      engine->reset();  // before the communicator, the device and the gradients
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, DeviceCommunicatorEngineTest, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return "Np" + std::to_string(info.param); });

// The collective waits for its bucket's producer on the device, not on the
// host: with the producer held behind a gate, marking returns at once and
// the engine launches (the bucket is complete as far as the host knows),
// yet the reduced value is the producer's, written after the launch.
TEST(DeviceCommunicatorEngineOrderTest, TheCollectiveWaitsForTheProducerOnTheDevice) {
  const GradientLayout layout = OnDevice(testing::MakeLayout({64, 64}));
  RunRanks(2, [&](int rank, comm::Communicator& host) {
    std::unique_ptr<comm::Device> device = comm::CreateEmulatedDevice({});
    auto comm = comm::testing::CreateEmulatedDeviceCommunicator(host, *device);
    ASSERT_TRUE(comm.ok()) << comm.status();
    auto engine = Engine::Create(**comm, layout, DdpPlan(layout), EngineOptions{});
    ASSERT_TRUE(engine.ok()) << engine.status();
    auto gate_stream = *device->CreateStream();
    auto producer = *device->CreateStream();
    std::atomic<bool> open{false};
    ASSERT_TRUE(device->LaunchHostFunc(*gate_stream, [&] {
      while (!open.load()) std::this_thread::yield();
    }).ok());
    ASSERT_TRUE(device->WaitEvent(*producer, **device->RecordEvent(*gate_stream)).ok());
    std::vector<float> in(64, 1.0f + rank), out(64, 0.0f);
    std::vector<void*> where;
    for (int id = 0; id < 2; ++id) {
      where.push_back((*engine)->TensorStorage(id));
      ASSERT_NE(where.back(), nullptr);
      std::memset(where.back(), kPoison, 64 * 4);
      ASSERT_TRUE(device->CopyAsync(where.back(), in.data(), 64 * 4, *producer).ok());
    }
    auto ready = *device->RecordEvent(*producer);
    for (int id = 0; id < 2; ++id) {
      ASSERT_TRUE((*engine)->MarkReadyOnDevice(id, where[id], 64, ready.get()).ok());
    }
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_FALSE(device->EventDone(*ready).value());  // marking did not wait for it
    open.store(true);
    ASSERT_TRUE((*engine)->Finish().ok());
    auto consumer = *device->CreateStream();
    ASSERT_TRUE(device->WaitEvent(*consumer, *(*engine)->finished_event()).ok());
    for (int id = 0; id < 2; ++id) {
      ASSERT_TRUE(device->CopyAsync(out.data(), where[id], 64 * 4, *consumer).ok());
      ASSERT_TRUE(device->SynchronizeStream(*consumer).ok());
      EXPECT_EQ(out, std::vector<float>(64, 1.5f)) << "tensor " << id;  // (1 + 2) / 2
    }
    engine->reset();
  });
}

TEST(DeviceCommunicatorEngineErrorsTest, WhatADeviceCommunicatorRefuses) {
  const GradientLayout dev = OnDevice(testing::MakeLayout({4, 4}));
  RunRanks(1, [&](int, comm::Communicator& host) {
    std::unique_ptr<comm::Device> device = comm::CreateEmulatedDevice({});
    std::unique_ptr<comm::Device> other = comm::CreateEmulatedDevice({});
    auto comm = comm::testing::CreateEmulatedDeviceCommunicator(host, *device);
    ASSERT_TRUE(comm.ok()) << comm.status();
    EXPECT_EQ((*comm)->device(), device.get());
    EXPECT_EQ((*comm)->memory(), comm::MemoryKind::kDevice);
    // Another device than the communicator's.
    EngineOptions foreign;
    foreign.device = other.get();
    auto e1 = Engine::Create(**comm, dev, PerTensorPlan(dev), foreign);
    EXPECT_EQ(e1.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(e1.status().message()), HasSubstr("not the"));
    // Votes are host data.
    EngineOptions priority;
    priority.schedule = Schedule::kForwardPriority;
    auto e2 = Engine::Create(**comm, dev, PerTensorPlan(dev), priority);
    EXPECT_EQ(e2.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(e2.status().message()), HasSubstr("plan order"));
    // Host tensors, and the host entry point.
    const GradientLayout host_layout = testing::MakeLayout({4, 4});
    EXPECT_EQ(Engine::Create(**comm, host_layout, PerTensorPlan(host_layout), EngineOptions{})
                  .status()
                  .code(),
              absl::StatusCode::kInvalidArgument);
    auto engine = Engine::Create(**comm, dev, PerTensorPlan(dev), EngineOptions{});
    ASSERT_TRUE(engine.ok()) << engine.status();
    float g[4] = {};
    EXPECT_EQ((*engine)->MarkReady(0, g, 4).code(), absl::StatusCode::kFailedPrecondition);
    // A host communicator takes no device events.
    auto event = *device->RecordEvent(**device->CreateStream());
    auto w = host.AllReduceAfter(*event, g, g, 4, comm::DataType::kFloat32, comm::ReduceOp::kSum);
    EXPECT_EQ(w.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_EQ(host.device(), nullptr);
    engine->reset();
  });
}

// Agreement is checked through device memory: ranks with different plans
// fail on every rank, naming the other's plan.
TEST(DeviceCommunicatorEngineErrorsTest, PlanMismatchFailsOnEveryRank) {
  const GradientLayout dev = OnDevice(testing::MakeLayout({64, 64, 64}));
  RunRanks(2, [&](int rank, comm::Communicator& host) {
    std::unique_ptr<comm::Device> device = comm::CreateEmulatedDevice({});
    auto comm = comm::testing::CreateEmulatedDeviceCommunicator(host, *device);
    ASSERT_TRUE(comm.ok()) << comm.status();
    EngineOptions options;
    options.timeout = absl::Seconds(30);
    auto engine = Engine::Create(**comm, dev, rank == 0 ? PerTensorPlan(dev) : DdpPlan(dev),
                                 options);
    ASSERT_FALSE(engine.ok());
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(engine.status().message()), HasSubstr("rank 1 has layout"));
  });
}

TEST(DeviceEngineErrorsTest, MemoryKindsAndEntryPointsMustAgree) {
  const GradientLayout host = testing::MakeLayout({4, 4});
  const GradientLayout dev = OnDevice(host);
  RunRanks(1, [&](int, comm::Communicator& comm) {
    std::unique_ptr<comm::Device> device = comm::CreateEmulatedDevice({});
    EngineOptions with_device;
    with_device.device = device.get();
    // Device tensors without a device, host tensors with one.
    auto e1 = Engine::Create(comm, dev, PerTensorPlan(dev), EngineOptions{});
    EXPECT_EQ(e1.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(e1.status().message()), HasSubstr("EngineOptions::device"));
    EXPECT_THAT(std::string(e1.status().message()), HasSubstr("\"t0\""));
    auto e2 = Engine::Create(comm, host, PerTensorPlan(host), with_device);
    EXPECT_EQ(e2.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(e2.status().message()), HasSubstr("host memory"));
    // The host-only options.
    EngineOptions callbacks = with_device;
    callbacks.on_tensor_reduced = [](int) {};
    EXPECT_EQ(Engine::Create(comm, dev, PerTensorPlan(dev), callbacks).status().code(),
              absl::StatusCode::kInvalidArgument);
    // The wrong entry point, each way.
    auto on_device = Engine::Create(comm, dev, PerTensorPlan(dev), with_device);
    ASSERT_TRUE(on_device.ok()) << on_device.status();
    float g[4] = {};
    absl::Status s = (*on_device)->MarkReady(0, g, 4);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(s.message()), HasSubstr("MarkReadyOnDevice"));
    auto on_host = Engine::Create(comm, host, PerTensorPlan(host), EngineOptions{});
    ASSERT_TRUE(on_host.ok()) << on_host.status();
    s = (*on_host)->MarkReadyOnDevice(0, g, 4, nullptr);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ((*on_host)->finished_event(), nullptr);
    on_device->reset();
  });
}

}  // namespace
}  // namespace fusebox::bucketing
