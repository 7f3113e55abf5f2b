// comm/fault.h: the timeout post-mortem over a store (Note [Timeout
// post-mortem]), ranks as calls on one in-memory store.
#include "comm/fault.h"

#include <atomic>
#include <string>

#include "absl/strings/str_cat.h"
#include "comm/memory_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusebox::comm {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A MemoryStore whose host goes away when a rank starts waiting: the wait
// and every call after it fail, as a TCP store's do once the rank hosting
// it (rank 0 under mpirun) has given up and exited.
class HostLeavesDuringTheWait final : public Store {
 public:
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
    gone_ = true;
    return Gone();
  }
  absl::StatusOr<bool> Check(absl::string_view key) override {
    if (gone_) return Gone();
    return inner_.Check(key);
  }
  MemoryStore& inner() { return inner_; }

 private:
  static absl::Status Gone() {
    return absl::UnavailableError("connection unusable: server closed the connection");
  }
  MemoryStore inner_;
  std::atomic<bool> gone_{false};
};

TEST(TimeoutPostMortemTest, NamesTheSilentRanksAndQuotesTheOthers) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("job/fault/0", "AllReduce #3 waiting for rank 1").ok());
  const std::string m = TimeoutPostMortem(store, "job", 2, 4, "AllReduce #3 waiting for rank 1",
                                          absl::Milliseconds(50));
  EXPECT_THAT(m, HasSubstr("post-mortem: ranks 1, 3 did not report within 50ms"));
  EXPECT_THAT(m, HasSubstr("rank 0 reports: AllReduce #3 waiting for rank 1"));
  EXPECT_EQ(store.Get("job/fault/2", absl::Now()).value(), "AllReduce #3 waiting for rank 1");
}

TEST(TimeoutPostMortemTest, EveryRankReported) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("job/fault/0", "waiting").ok());
  ASSERT_TRUE(store.Set("job/fault/2", "waiting").ok());
  const std::string m = TimeoutPostMortem(store, "job", 1, 3, "waiting", absl::Milliseconds(50));
  EXPECT_THAT(m, HasSubstr("every rank is alive and reported"));
  EXPECT_THAT(m, HasSubstr("rank 0 reports: waiting; rank 2 reports: waiting"));
}

// Rank 0 hosted the store, reported, gave up on the others and exited while
// rank 2, later to the stuck collective, waited for rank 1: rank 2 still
// names rank 1 and quotes rank 0.
TEST(TimeoutPostMortemTest, AStoreThatFailsDuringTheWaitStillNamesTheSilentRanks) {
  HostLeavesDuringTheWait store;
  ASSERT_TRUE(store.inner().Set("job/fault/0", "AllReduce #3 waiting for rank 1").ok());
  const std::string m =
      TimeoutPostMortem(store, "job", 2, 3, "AllReduce #3 waiting for rank 1", absl::Seconds(5));
  EXPECT_THAT(m, HasSubstr("post-mortem incomplete: the job's store failed (connection unusable"));
  EXPECT_THAT(m, HasSubstr("until then rank 1 did not report"));
  EXPECT_THAT(m, HasSubstr("rank 0 reports: AllReduce #3 waiting for rank 1"));
  EXPECT_THAT(m, Not(HasSubstr("rank 2 reports")));
}

TEST(TimeoutPostMortemTest, AStoreUnreachableBeforeTheReportSaysSo) {
  HostLeavesDuringTheWait store;
  (void)store.Wait({}, absl::Now());  // gone before anything
  const std::string m = TimeoutPostMortem(store, "job", 1, 3, "waiting", absl::Seconds(5));
  EXPECT_THAT(m, HasSubstr("post-mortem unavailable: the job's store is unreachable"));
}

}  // namespace
}  // namespace fusebox::comm
