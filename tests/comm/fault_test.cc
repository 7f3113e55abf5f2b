// comm/fault.h: the timeout post-mortem over a store (Note [Timeout
// post-mortem]), ranks as calls on one in-memory store.
#include "comm/fault.h"

#include <atomic>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/memory_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusebox::comm {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A MemoryStore whose host can go away, as a TCP store's does once the
// rank hosting it (rank 0 under mpirun) has given up and exited: then every
// call fails, also a wait in progress (waits poll). Close() takes it away;
// with leave_on_wait, so does the first wait.
class HostedStore final : public Store {
 public:
  explicit HostedStore(bool leave_on_wait = false) : leave_on_wait_(leave_on_wait) {}

  absl::Status Set(absl::string_view key, absl::string_view value) override {
    if (gone_) return Gone();
    return inner_.Set(key, value);
  }
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Time deadline) override {
    if (gone_) return Gone();
    return inner_.Get(key, deadline);
  }
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override {
    if (gone_) return Gone();
    return inner_.Add(key, delta);
  }
  absl::Status Wait(absl::Span<const std::string> keys, absl::Time deadline) override {
    if (leave_on_wait_) Close();
    for (;;) {
      if (gone_) return Gone();
      bool all = true;
      for (const std::string& k : keys) all = all && inner_.Check(k).value_or(false);
      if (all) return absl::OkStatus();
      if (absl::Now() >= deadline) return absl::DeadlineExceededError("store wait");
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  absl::StatusOr<bool> Check(absl::string_view key) override {
    if (gone_) return Gone();
    return inner_.Check(key);
  }
  MemoryStore& inner() { return inner_; }
  void Close() { gone_ = true; }

 private:
  static absl::Status Gone() {
    return absl::UnavailableError("connection unusable: server closed the connection");
  }
  const bool leave_on_wait_;
  MemoryStore inner_;
  std::atomic<bool> gone_{false};
};

TEST(TimeoutPostMortemTest, NamesTheSilentRanksAndQuotesTheOthers) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("job/fault/0", "AllReduce #3 waiting for rank 1").ok());
  const std::string m = TimeoutPostMortem(store, "job", 2, 4, "AllReduce #3 waiting for rank 1",
                                          absl::Milliseconds(50), absl::Milliseconds(50));
  EXPECT_THAT(m, HasSubstr("post-mortem: ranks 1, 3 did not report within 50ms"));
  EXPECT_THAT(m, HasSubstr("rank 0 reports: AllReduce #3 waiting for rank 1"));
  EXPECT_EQ(store.Get("job/fault/2", absl::Now()).value(), "AllReduce #3 waiting for rank 1");
}

TEST(TimeoutPostMortemTest, EveryRankReported) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("job/fault/0", "waiting").ok());
  ASSERT_TRUE(store.Set("job/fault/2", "waiting").ok());
  const std::string m = TimeoutPostMortem(store, "job", 1, 3, "waiting", absl::Milliseconds(50),
                                          absl::Milliseconds(50));
  EXPECT_THAT(m, HasSubstr("every rank is alive and reported"));
  EXPECT_THAT(m, HasSubstr("rank 0 reports: waiting; rank 2 reports: waiting"));
}

// Rank 0 hosted the store, reported, gave up on the others and exited while
// rank 2, later to the stuck collective, waited for rank 1: rank 2 still
// names rank 1 and quotes rank 0.
TEST(TimeoutPostMortemTest, AStoreThatFailsDuringTheWaitStillNamesTheSilentRanks) {
  HostedStore store(/*leave_on_wait=*/true);
  ASSERT_TRUE(store.inner().Set("job/fault/0", "AllReduce #3 waiting for rank 1").ok());
  const std::string m = TimeoutPostMortem(store, "job", 2, 3, "AllReduce #3 waiting for rank 1",
                                          absl::Seconds(5), absl::Seconds(5));
  EXPECT_THAT(m, HasSubstr("post-mortem incomplete: the job's store failed (connection unusable"));
  EXPECT_THAT(m, HasSubstr("until then rank 1 did not report"));
  EXPECT_THAT(m, HasSubstr("rank 0 reports: AllReduce #3 waiting for rank 1"));
  EXPECT_THAT(m, Not(HasSubstr("rank 2 reports")));
}

// Rank 0 hosts the store and exits as soon as its post-mortem returns; it
// was told of the failure by a peer, so it waits 1 s for reports, while
// rank 2, a timed-out rank, waits 2 s; rank 1 is dead. Rank 2 reports while
// rank 0 still waits, and its wait for rank 1 ends after rank 0's. Rank 0
// stays (up to 3 s, the longest grace and a second) until rank 2 has read
// the reports, so rank 2's answer is whole: it names rank 1 within its
// grace, quotes rank 0, and no store failure.
TEST(TimeoutPostMortemTest, TheHostStaysUntilTheRanksThatReportedHaveRead) {
  HostedStore store;
  const absl::Duration stay = absl::Seconds(3);
  std::string m0, m2;
  const absl::Time t0 = absl::Now();
  std::thread host([&] {
    m0 = TimeoutPostMortem(store, "job", 0, 3, "AllReduce #3 told that rank 2 gave up",
                           absl::Seconds(1), stay);
    store.Close();
  });
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(500));
    m2 = TimeoutPostMortem(store, "job", 2, 3, "AllReduce #3 waiting for rank 1", absl::Seconds(2),
                           stay);
  });
  host.join();
  late.join();
  EXPECT_THAT(m0, HasSubstr("rank 1 did not report within 1s"));
  EXPECT_THAT(m0, HasSubstr("rank 2 reports: AllReduce #3 waiting for rank 1"));
  EXPECT_THAT(m2, Not(HasSubstr("store failed"))) << m2;
  EXPECT_THAT(m2, HasSubstr("post-mortem: rank 1 did not report within 2s"));
  EXPECT_THAT(m2, HasSubstr("rank 0 reports: AllReduce #3 told that rank 2 gave up"));
  // Bounded: rank 0's wait and its stay at most.
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
}

TEST(TimeoutPostMortemTest, AStoreUnreachableBeforeTheReportSaysSo) {
  HostedStore store(/*leave_on_wait=*/true);
  (void)store.Wait({}, absl::Now());  // gone before anything
  const std::string m =
      TimeoutPostMortem(store, "job", 1, 3, "waiting", absl::Seconds(5), absl::Seconds(5));
  EXPECT_THAT(m, HasSubstr("post-mortem unavailable: the job's store is unreachable"));
}

}  // namespace
}  // namespace fusebox::comm
