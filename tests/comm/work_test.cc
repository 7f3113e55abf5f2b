#include "comm/work.h"

#include <thread>

#include "gtest/gtest.h"

namespace fusebox::comm {
namespace {

TEST(WorkTest, WaitReturnsTheCompletedStatus) {
  auto w = std::make_shared<Work>();
  EXPECT_FALSE(w->Test());
  std::thread t([w] { w->Complete(absl::DataLossError("boom")); });
  absl::Status s = w->Wait();
  t.join();
  EXPECT_TRUE(w->Test());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "boom");
}

TEST(WorkTest, WaitUntilTimesOutWithoutCancelling) {
  auto w = std::make_shared<Work>();
  const absl::Time start = absl::Now();
  absl::Status s = w->WaitFor(absl::Milliseconds(50));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(45));
  w->Complete(absl::OkStatus());
  EXPECT_TRUE(w->WaitFor(absl::Milliseconds(1)).ok());
}

TEST(WorkTest, AllCompletesAfterEveryPartWithFirstError) {
  auto a = std::make_shared<Work>(), b = std::make_shared<Work>();
  auto all = Work::All({a, b});
  a->Complete(absl::OkStatus());
  EXPECT_FALSE(all->Test());
  b->Complete(absl::UnavailableError("peer gone"));
  ASSERT_TRUE(all->Test());
  EXPECT_EQ(all->status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Work::All({})->Test());
}

}  // namespace
}  // namespace fusebox::comm
