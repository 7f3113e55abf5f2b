// MemoryStore, PrefixStore and StoreAllGather, with ranks as threads.
#include "comm/store.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/memory_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusebox::comm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::Time In(absl::Duration d) { return absl::Now() + d; }

TEST(MemoryStoreTest, SetThenGetReturnsValue) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("k", "v1").ok());
  EXPECT_EQ(store.Get("k", absl::Now()).value(), "v1");
  ASSERT_TRUE(store.Set("k", std::string("a\0b", 3)).ok());  // overwrite
  EXPECT_EQ(store.Get("k", absl::Now()).value(), std::string("a\0b", 3));
  ASSERT_TRUE(store.Set("empty", "").ok());
  EXPECT_EQ(store.Get("empty", absl::Now()).value(), "");
}

TEST(MemoryStoreTest, GetWaitsForALaterSet) {
  MemoryStore store;
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(30));
    ASSERT_TRUE(store.Set("late", "here").ok());
  });
  absl::StatusOr<std::string> v = store.Get("late", In(absl::Seconds(5)));
  setter.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "here");
}

TEST(MemoryStoreTest, GetTimesOutNamingTheKey) {
  MemoryStore store;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> v =
      store.Get("nobody/sets/this", start + absl::Milliseconds(50));
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(v.status().message(), HasSubstr("'nobody/sets/this'"));
  EXPECT_GE(took, absl::Milliseconds(49));
  EXPECT_LT(took, absl::Seconds(1));
}

TEST(MemoryStoreTest, WaitNamesOnlyTheMissingKeys) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("a", "1").ok());
  ASSERT_TRUE(store.Set("c", "1").ok());
  absl::Status s = store.Wait({"a", "b", "c", "d"}, In(absl::Milliseconds(30)));
  ASSERT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("2 of 4 keys not set"));
  EXPECT_THAT(s.message(), HasSubstr("'b', 'd'"));
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("'a'")));
  EXPECT_TRUE(store.Wait({"a", "c"}, absl::Now()).ok());
  EXPECT_TRUE(store.Wait({}, absl::Now()).ok());
}

TEST(MemoryStoreTest, AddStartsAtZeroAndIsAtomicAcrossThreads) {
  MemoryStore store;
  EXPECT_EQ(store.Add("n", 5).value(), 5);
  EXPECT_EQ(store.Add("n", -7).value(), -2);
  EXPECT_EQ(store.Get("n", absl::Now()).value(), "-2");

  constexpr int kThreads = 8, kAdds = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kAdds; ++i) ASSERT_TRUE(store.Add("c", 1).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(store.Add("c", 0).value(), kThreads * kAdds);
}

TEST(MemoryStoreTest, AddRejectsNonIntegerAndOverflow) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("text", "12abc").ok());
  absl::StatusOr<int64_t> r = store.Add("text", 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("'text'"));
  EXPECT_EQ(store.Get("text", absl::Now()).value(), "12abc");  // unchanged

  ASSERT_TRUE(store.Set("big", "9223372036854775807").ok());
  EXPECT_EQ(store.Add("big", 1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(MemoryStoreTest, RejectsOversizedKeyAndValueNamingSizes) {
  MemoryStore store;
  const std::string long_key(kMaxStoreKeyBytes + 1, 'k');
  absl::Status s = store.Set(long_key, "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(kMaxStoreKeyBytes + 1)));
  EXPECT_EQ(store.Get(long_key, absl::Now()).status().code(),
            absl::StatusCode::kInvalidArgument);

  s = store.Set("k", std::string(kMaxStoreValueBytes + 1, 'v'));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(kMaxStoreValueBytes + 1)));
  EXPECT_FALSE(store.Check("k").value());

  // Exactly at the limits is fine.
  EXPECT_TRUE(store
                  .Set(std::string(kMaxStoreKeyBytes, 'k'),
                       std::string(kMaxStoreValueBytes, 'v'))
                  .ok());
}

TEST(MemoryStoreTest, CheckNeverBlocks) {
  MemoryStore store;
  EXPECT_FALSE(store.Check("x").value());
  ASSERT_TRUE(store.Set("x", "").ok());
  EXPECT_TRUE(store.Check("x").value());
}

TEST(PrefixStoreTest, ScopesEveryOperation) {
  MemoryStore base;
  PrefixStore outer("job", base);
  PrefixStore inner("ucx", outer);
  ASSERT_TRUE(inner.Set("addr", "A").ok());
  EXPECT_TRUE(base.Check("job/ucx/addr").value());
  EXPECT_FALSE(base.Check("addr").value());
  EXPECT_EQ(inner.Get("addr", absl::Now()).value(), "A");
  EXPECT_EQ(outer.Get("ucx/addr", absl::Now()).value(), "A");
  EXPECT_EQ(inner.Add("n", 3).value(), 3);
  EXPECT_EQ(base.Get("job/ucx/n", absl::Now()).value(), "3");
  EXPECT_TRUE(inner.Wait({"addr", "n"}, absl::Now()).ok());
  absl::Status s = inner.Wait({"addr", "gone"}, In(absl::Milliseconds(10)));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("'job/ucx/gone'"));
}

// Runs StoreAllGather on `size` threads, rank r contributing "v<r>".
std::vector<absl::StatusOr<std::vector<std::string>>> GatherOnThreads(
    Store& store, int size, int ranks_present, absl::Duration timeout) {
  std::vector<absl::StatusOr<std::vector<std::string>>> results(
      ranks_present, absl::UnknownError("not run"));
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks_present; ++r) {
    threads.emplace_back([&, r] {
      results[r] = StoreAllGather(store, "ucx/addr", r, size,
                                  absl::StrCat("v", r), deadline);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

TEST(StoreAllGatherTest, GathersInRankOrderForManyWorldSizes) {
  for (int size : {1, 2, 3, 7, 11, 16}) {
    MemoryStore base;
    PrefixStore store(absl::StrCat("size", size), base);
    auto results = GatherOnThreads(store, size, size, absl::Seconds(10));
    std::vector<std::string> want;
    for (int r = 0; r < size; ++r) want.push_back(absl::StrCat("v", r));
    for (int r = 0; r < size; ++r) {
      ASSERT_TRUE(results[r].ok())
          << "size " << size << " rank " << r << ": " << results[r].status();
      EXPECT_EQ(*results[r], want) << "size " << size << " rank " << r;
    }
  }
}

TEST(StoreAllGatherTest, CarriesEmptyAndBinaryValues) {
  MemoryStore store;
  const std::string binary("\0\xff\n", 3);
  std::thread other([&] {
    ASSERT_TRUE(
        StoreAllGather(store, "g", 1, 2, binary, In(absl::Seconds(5))).ok());
  });
  auto got = StoreAllGather(store, "g", 0, 2, "", In(absl::Seconds(5)));
  other.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, ElementsAre("", binary));
}

TEST(StoreAllGatherTest, DeadlineErrorNamesTheMissingRanks) {
  MemoryStore store;
  const absl::Time start = absl::Now();
  auto results = GatherOnThreads(store, /*size=*/4, /*ranks_present=*/2,
                                 absl::Milliseconds(100));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(results[r].status().code(), absl::StatusCode::kDeadlineExceeded);
    // The budget is measured when the rank enters, a little under 100ms.
    EXPECT_THAT(std::string(results[r].status().message()),
                ::testing::MatchesRegex("rendezvous 'ucx/addr': ranks 2, 3 of "
                                        "4 did not arrive within [0-9.]+ms"));
  }
}

TEST(StoreAllGatherTest, OneMissingRankIsSingular) {
  MemoryStore store;
  // Ranks 0, 1, 3 of 4 arrive; publish rank 3 directly.
  ASSERT_TRUE(store.Set("3", "v3").ok());
  auto results = GatherOnThreads(store, 4, 2, absl::Milliseconds(50));
  ASSERT_EQ(results[0].status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(results[0].status().message(),
              HasSubstr("': rank 2 of 4 did not arrive within"));
}

TEST(StoreAllGatherTest, RejectsBadRankAndSize) {
  MemoryStore store;
  const absl::Time d = In(absl::Seconds(1));
  EXPECT_EQ(StoreAllGather(store, "g", 0, 0, "", d).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StoreAllGather(store, "g", -1, 2, "", d).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status s = StoreAllGather(store, "g", 2, 2, "", d).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("rank 2 is out of range [0, 2)"));
  EXPECT_FALSE(store.Check("2").value());  // nothing published
}

}  // namespace
}  // namespace fusebox::comm
