// The in-process loopback communicator (comm/testing/loopback.h): exact
// results for every collective, and the contract the real backends keep
// (Note [Loopback semantics]): completion off the caller's thread, mismatch
// on every rank, sticky failures, deadlines naming the missing ranks.
#include "comm/testing/loopback.h"

#include <chrono>
#include <mutex>
#include <utility>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/testing/exact_data.h"
#include "comm/types.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/run_ranks.h"

namespace fusebox::comm::testing {
namespace {

using fusebox::testing::RunRanks;
using ::testing::HasSubstr;

TEST(LoopbackTest, AllReduceIsExactForEveryTypeOpAndWorld) {
  const DataType types[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                            DataType::kBFloat16, DataType::kInt32, DataType::kInt64,
                            DataType::kUInt8};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
                          ReduceOp::kAvg};
  for (int world : {1, 2, 3, 5}) {
    RunRanks(world, [&](int rank, Communicator& comm) {
      EXPECT_EQ(comm.rank(), rank);
      EXPECT_EQ(comm.size(), world);
      EXPECT_EQ(comm.backend(), "loopback");
      for (DataType type : types) {
        for (ReduceOp op : ops) {
          if (!CheckSupported(type, op).ok()) continue;
          for (bool in_place : {false, true}) {
            const size_t count = 1000;
            const size_t bytes = count * DataTypeSize(type);
            std::vector<unsigned char> in(bytes), out(bytes, 0xAB), want(bytes);
            FillInput(in.data(), count, type, op, rank, /*seed=*/7);
            FillExpected(want.data(), count, type, op, world, /*seed=*/7);
            void* recv = in_place ? in.data() : out.data();
            ASSERT_TRUE(AllReduceSync(comm, in.data(), recv, count, type, op).ok());
            EXPECT_EQ(CountMismatches(recv, want.data(), count, type), 0u)
                << DataTypeName(type) << " " << ReduceOpName(op) << " world " << world
                << (in_place ? " in place" : "");
          }
        }
      }
    });
  }
}

TEST(LoopbackTest, BroadcastAndAllGatherMoveEveryRanksBytes) {
  RunRanks(4, [](int rank, Communicator& comm) {
    std::vector<int32_t> buf(33, rank == 2 ? 1234 : -rank);
    auto w = comm.Broadcast(buf.data(), buf.size(), DataType::kInt32, 2);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Wait().ok());
    for (int32_t v : buf) ASSERT_EQ(v, 1234);

    // In place: each rank's contribution already sits in its slot.
    std::vector<int64_t> all(4 * 3, -1);
    for (int i = 0; i < 3; ++i) all[rank * 3 + i] = rank * 10 + i;
    w = comm.AllGather(all.data() + rank * 3, all.data(), 3, DataType::kInt64);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Wait().ok());
    for (int r = 0; r < 4; ++r) {
      for (int i = 0; i < 3; ++i) EXPECT_EQ(all[r * 3 + i], r * 10 + i);
    }
    ASSERT_TRUE(BarrierSync(comm).ok());
  });
}

TEST(LoopbackTest, CollectivesCompleteOnTheGroupsThreadInIssueOrder) {
  auto comms = CreateLoopbackGroup(2);
  ASSERT_TRUE(comms.ok());
  std::vector<float> a0(8, 1.0f), b0(8, 2.0f), a1(8, 1.0f), b1(8, 2.0f);
  auto w1 = (*comms)[0]->AllReduce(a0.data(), a0.data(), 8, DataType::kFloat32, ReduceOp::kSum);
  auto w2 = (*comms)[0]->AllReduce(b0.data(), b0.data(), 8, DataType::kFloat32, ReduceOp::kSum);
  ASSERT_TRUE(w1.ok() && w2.ok());
  // Rank 1 has issued nothing yet, so neither can have completed: both
  // callbacks are registered before completion and run where it happens.
  ASSERT_FALSE((*w1)->Test());
  std::mutex mu;
  std::vector<std::pair<int, std::thread::id>> done;
  (*w1)->OnComplete([&](const absl::Status&) {
    std::lock_guard<std::mutex> lock(mu);
    done.emplace_back(1, std::this_thread::get_id());
  });
  (*w2)->OnComplete([&](const absl::Status&) {
    std::lock_guard<std::mutex> lock(mu);
    done.emplace_back(2, std::this_thread::get_id());
  });
  std::thread::id rank1;
  std::thread t([&] {
    rank1 = std::this_thread::get_id();
    auto v1 = (*comms)[1]->AllReduce(a1.data(), a1.data(), 8, DataType::kFloat32, ReduceOp::kSum);
    auto v2 = (*comms)[1]->AllReduce(b1.data(), b1.data(), 8, DataType::kFloat32, ReduceOp::kSum);
    ASSERT_TRUE(v1.ok() && v2.ok());
    EXPECT_TRUE((*v2)->Wait().ok());
  });
  ASSERT_TRUE((*w2)->Wait().ok());
  t.join();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].first, 1);
  EXPECT_EQ(done[1].first, 2);
  for (const auto& d : done) {
    EXPECT_NE(d.second, std::this_thread::get_id());
    EXPECT_NE(d.second, rank1);
  }
  EXPECT_EQ(a0[0], 2.0f);
  EXPECT_EQ(b1[0], 4.0f);
  EXPECT_GT((*w1)->started_ns(), 0);
}

TEST(LoopbackTest, MismatchFailsEveryRankWithTheSameMessageAndSticks) {
  std::vector<std::string> messages(3);
  RunRanks(3, [&](int rank, Communicator& comm) {
    std::vector<float> buf(rank == 1 ? 5 : 4, 1.0f);
    auto w = comm.AllReduce(buf.data(), buf.data(), buf.size(), DataType::kFloat32,
                            ReduceOp::kSum);
    ASSERT_TRUE(w.ok());
    const absl::Status s = (*w)->Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    messages[rank] = std::string(s.message());
    EXPECT_EQ(buf[0], 1.0f) << "no buffer is touched on a mismatch";
    // Sticky: the next call fails at once with the same status.
    auto next = comm.Barrier();
    ASSERT_FALSE(next.ok());
    EXPECT_EQ(next.status().code(), absl::StatusCode::kInvalidArgument);
  });
  EXPECT_THAT(messages[0], HasSubstr("collective mismatch across ranks: rank 0 called "
                                     "AllReduce(count=4, type=float, op=sum, seq=0) but rank 1 "
                                     "called AllReduce(count=5"));
  EXPECT_EQ(messages[1], messages[0]);
  EXPECT_EQ(messages[2], messages[0]);
}

TEST(LoopbackTest, ACollectiveARankNeverIssuesTimesOutNamingIt) {
  LoopbackOptions o;
  o.timeout = absl::Milliseconds(200);
  RunRanks(
      3,
      [](int rank, Communicator& comm) {
        if (rank == 2) return;  // never issues it, but stays in the group
        std::vector<double> buf(3, 1.0);
        auto w = comm.AllReduce(buf.data(), buf.data(), 3, DataType::kFloat64, ReduceOp::kMax);
        ASSERT_TRUE(w.ok());
        const auto t0 = std::chrono::steady_clock::now();
        const absl::Status s = (*w)->Wait();
        EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(150));
        EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
        EXPECT_THAT(std::string(s.message()), HasSubstr("rank(s) 2 never issued it"));
      },
      o);
}

TEST(LoopbackTest, ARankThatLeavesFailsWhatWaitsForItAtOnce) {
  LoopbackOptions o;
  o.timeout = absl::Minutes(5);  // the failure must not come from the deadline
  auto comms = CreateLoopbackGroup(2, o);
  ASSERT_TRUE(comms.ok());
  std::vector<float> buf(4, 1.0f);
  auto w = (*comms)[0]->AllReduce(buf.data(), buf.data(), 4, DataType::kFloat32, ReduceOp::kSum);
  ASSERT_TRUE(w.ok());
  (*comms)[1].reset();
  const absl::Status s = (*w)->WaitFor(absl::Seconds(30));
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank(s) 1 left the group"));
}

TEST(LoopbackTest, ACommunicatorDestroyedWithWorkPendingFailsIt) {
  auto comms = CreateLoopbackGroup(2);
  ASSERT_TRUE(comms.ok());
  std::vector<float> buf(4, 1.0f);
  auto w = (*comms)[0]->AllReduce(buf.data(), buf.data(), 4, DataType::kFloat32, ReduceOp::kSum);
  ASSERT_TRUE(w.ok());
  (*comms)[0].reset();
  const absl::Status s = (*w)->WaitFor(absl::Seconds(30));
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("destroyed with 1 collective(s) pending"));
  EXPECT_EQ(buf[0], 1.0f);
  // The failure is the group's: the surviving rank cannot start anything.
  EXPECT_EQ((*comms)[1]->Barrier().status().code(), absl::StatusCode::kAborted);
}

TEST(LoopbackTest, RefusesBadArgumentsSynchronously) {
  EXPECT_EQ(CreateLoopbackGroup(0).status().code(), absl::StatusCode::kInvalidArgument);
  LoopbackOptions o;
  o.timeout = absl::ZeroDuration();
  EXPECT_EQ(CreateLoopbackGroup(2, o).status().code(), absl::StatusCode::kInvalidArgument);
  RunRanks(2, [](int, Communicator& comm) {
    float x = 0;
    EXPECT_EQ(comm.AllReduce(nullptr, &x, 1, DataType::kFloat32, ReduceOp::kSum).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(comm.Broadcast(&x, 1, DataType::kFloat32, 2).status().code(),
              absl::StatusCode::kInvalidArgument);
    // The per-rank count times the world overflows (comm::ValidateAllGather).
    const auto gather = comm.AllGather(&x, &x, SIZE_MAX / 2 + 1, DataType::kUInt8);
    EXPECT_EQ(gather.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(gather.status().message()), HasSubstr("overflows over 2 ranks"));
    EXPECT_THAT(std::string(comm.AllReduce(&x, &x, 1, static_cast<DataType>(200), ReduceOp::kSum)
                                .status()
                                .message()),
                HasSubstr("AllReduce: unsupported data type code 200"));
    // Nothing was issued: the group still works.
    ASSERT_TRUE(AllReduceSync(comm, &x, &x, 1, DataType::kFloat32, ReduceOp::kSum).ok());
  });
}

}  // namespace
}  // namespace fusebox::comm::testing
