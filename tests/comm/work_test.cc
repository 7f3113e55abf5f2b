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

namespace fusebox::comm {
namespace {

TEST(WorkTest, WaitingOnAllDrivesTheParts) {
  // Each part completes only when its driver runs: waiting on the combined
  // Work must call the parts' drivers (nothing else would complete them).
  auto a = std::make_shared<Work>(), b = std::make_shared<Work>();
  int driven = 0;
  a->SetDriver([&] {
    if (a->Test()) return false;
    ++driven;
    a->Complete(absl::OkStatus());
    return true;
  });
  b->SetDriver([&] {
    if (b->Test()) return false;
    ++driven;
    b->Complete(absl::OkStatus());
    return true;
  });
  auto all = Work::All({a, b});
  EXPECT_TRUE(all->WaitFor(absl::Milliseconds(1)).code() == absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(all->Wait().ok());
  EXPECT_EQ(driven, 2);
}

}  // namespace
}  // namespace fusebox::comm
