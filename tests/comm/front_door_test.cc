// Note [One front door] (comm/communicator.h): every public call checks its
// arguments once, in the same words for every backend, and hands only valid
// ones to the backend's Do... hooks.
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusebox::comm {
namespace {

using ::testing::HasSubstr;

// A backend of 4 ranks that records what reaches it and completes at once.
class RecordingBackend final : public Communicator {
 public:
  int rank() const override { return 1; }
  int size() const override { return 4; }
  std::string backend() const override { return "recording"; }
  MemoryKind memory() const override { return MemoryKind::kHost; }

  std::vector<CollectiveArgs> issued;
  int runs = 0;

 protected:
  absl::StatusOr<std::shared_ptr<Work>> DoIssue(const CollectiveArgs& args) override {
    issued.push_back(args);
    auto w = std::make_shared<Work>();
    w->Complete(absl::OkStatus());
    return w;
  }
  absl::Status DoRun(const CollectiveArgs& args) override {
    ++runs;
    issued.push_back(args);
    return absl::OkStatus();
  }
};

std::string Refusal(const absl::StatusOr<std::shared_ptr<Work>>& w) {
  EXPECT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << w.status();
  return std::string(w.status().message());
}

TEST(FrontDoorTest, BadArgumentsAreRefusedInTheSharedWordsAndNeverReachTheBackend) {
  RecordingBackend c;
  float buf[16] = {};
  EXPECT_THAT(Refusal(c.AllReduce(nullptr, buf, 4, DataType::kFloat32, ReduceOp::kSum)),
              HasSubstr("AllReduce send: null buffer with a count of 4"));
  EXPECT_THAT(Refusal(c.AllReduce(buf, nullptr, 4, DataType::kFloat32, ReduceOp::kSum)),
              HasSubstr("AllReduce recv: null buffer"));
  EXPECT_THAT(
      Refusal(c.AllReduce(buf, buf, 4, DataType::kFloat32, static_cast<ReduceOp>(99))),
      HasSubstr("AllReduce: "));
  EXPECT_THAT(Refusal(c.AllReduce(buf, buf, SIZE_MAX / 2, DataType::kFloat32, ReduceOp::kSum)),
              HasSubstr("overflows the address space"));
  EXPECT_THAT(Refusal(c.Broadcast(buf, 4, DataType::kFloat32, 4)),
              HasSubstr("root 4 is out of range for a communicator of size 4"));
  EXPECT_THAT(Refusal(c.Broadcast(buf, 4, DataType::kFloat32, -1)), HasSubstr("root -1"));
  EXPECT_THAT(Refusal(c.AllGather(buf, nullptr, 4, DataType::kFloat32)),
              HasSubstr("AllGather recv: null buffer with a count of 16"));
  EXPECT_THAT(Refusal(c.AllGather(buf, buf, SIZE_MAX / 3, DataType::kUInt8)),
              HasSubstr("per rank overflows over 4 ranks"));
  const TensorRef tensors[] = {{buf, 4, DataType::kFloat32}, {nullptr, 2, DataType::kFloat32}};
  EXPECT_THAT(Refusal(c.AllReduceMulti(tensors, ReduceOp::kSum)),
              HasSubstr("tensor 1: AllReduceMulti: null buffer"));
  // The blocking forms refuse the same way.
  EXPECT_THAT(std::string(c.AllReduceBlocking(nullptr, buf, 4, DataType::kFloat32,
                                              ReduceOp::kSum)
                              .message()),
              HasSubstr("AllReduce send: null buffer"));
  EXPECT_THAT(std::string(c.BroadcastBlocking(buf, 4, DataType::kFloat32, 9).message()),
              HasSubstr("root 9"));
  // A host communicator takes no device events: Unimplemented, after the
  // arguments are checked.
  DeviceEvent none;
  EXPECT_THAT(Refusal(c.AllReduceAfter(none, nullptr, buf, 4, DataType::kFloat32,
                                       ReduceOp::kSum)),
              HasSubstr("null buffer"));
  EXPECT_EQ(c.AllReduceAfter(none, buf, buf, 4, DataType::kFloat32, ReduceOp::kSum)
                .status()
                .code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(c.issued.empty());
}

TEST(FrontDoorTest, ValidCallsReachTheBackendAsOneArgumentRecord) {
  RecordingBackend c;
  float a[16] = {}, b[16] = {};
  ASSERT_TRUE(c.AllReduce(a, b, 16, DataType::kFloat32, ReduceOp::kMax).ok());
  ASSERT_TRUE(c.Broadcast(a, 0, DataType::kFloat32, 3).ok());  // zero count: no buffer needed
  ASSERT_TRUE(c.AllGather(a + 4, a, 4, DataType::kFloat32).ok());
  ASSERT_TRUE(c.Barrier().ok());
  ASSERT_TRUE(c.AllReduceBlocking(a, a, 16, DataType::kInt32, ReduceOp::kSum).ok());
  const TensorRef tensors[] = {{a, 4, DataType::kFloat32}, {b, 8, DataType::kFloat16}};
  ASSERT_TRUE(c.AllReduceMulti(tensors, ReduceOp::kAvg).ok());
  ASSERT_EQ(c.issued.size(), 7u);
  EXPECT_EQ(c.issued[0].kind, CollectiveKind::kAllReduce);
  EXPECT_EQ(c.issued[0].send, a);
  EXPECT_EQ(c.issued[0].recv, b);
  EXPECT_EQ(c.issued[0].op, ReduceOp::kMax);
  EXPECT_EQ(c.issued[1].kind, CollectiveKind::kBroadcast);
  EXPECT_EQ(c.issued[1].send, c.issued[1].recv);  // one buffer, both ways
  EXPECT_EQ(c.issued[1].root, 3);
  EXPECT_EQ(c.issued[2].kind, CollectiveKind::kAllGather);
  EXPECT_EQ(c.issued[3].kind, CollectiveKind::kBarrier);
  EXPECT_EQ(c.issued[4].type, DataType::kInt32);
  EXPECT_EQ(c.runs, 1);  // the blocking form went to DoRun
  // AllReduceMulti's default: one in-place allreduce per tensor.
  EXPECT_EQ(c.issued[5].recv, a);
  EXPECT_EQ(c.issued[5].send, a);
  EXPECT_EQ(c.issued[5].count, 4u);
  EXPECT_EQ(c.issued[6].count, 8u);
  EXPECT_EQ(c.issued[6].type, DataType::kFloat16);
  EXPECT_EQ(c.issued[6].op, ReduceOp::kAvg);
}

}  // namespace
}  // namespace fusebox::comm
