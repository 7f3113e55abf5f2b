// The UCX backend's algorithm table (comm/ucx/algorithms.h, Note [Algorithm
// table]): every kind's ranges cover every size once, and the choice follows
// the world, the cores, the option and what shared memory offers.
#include "comm/ucx/algorithms.h"

#include <cstdint>

#include "comm/options.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusebox::comm::ucx {
namespace {

using ::testing::HasSubstr;

// UcxOptions' default recursive-doubling limit, which the tables below use.
const size_t kDefaultRecursiveDoubling = UcxOptions{}.recursive_doubling_bytes;

constexpr Kind kKinds[] = {Kind::kAllReduce, Kind::kBroadcast, Kind::kAllGather, Kind::kBarrier};

AlgorithmInputs Inputs(int world, unsigned cores, size_t option, bool exchange, bool shm) {
  AlgorithmInputs in;
  in.world = world;
  in.cores = cores;
  in.small_message_bytes = option;
  in.recursive_doubling_bytes = kDefaultRecursiveDoubling;
  in.shm_exchange = exchange;
  in.shm_allreduce = shm;
  return in;
}

TEST(AlgorithmTableTest, EveryKindsRangesAscendAndEndAtTheLargestSize) {
  for (int world : {1, 2, 3, 8, 9}) {
    for (unsigned cores : {1u, 2u, 16u}) {
      for (size_t option : {size_t{0}, size_t{4096}, size_t{1} << 20}) {
        for (bool exchange : {false, true}) {
          for (bool shm : {false, true}) {
            const AlgorithmTable t =
                BuildAlgorithmTable(Inputs(world, cores, option, exchange, shm));
            for (Kind k : kKinds) {
              const auto& r = t.ranges(k);
              ASSERT_FALSE(r.empty()) << KindName(k);
              for (size_t i = 1; i < r.size(); ++i) EXPECT_GT(r[i].max_bytes, r[i - 1].max_bytes);
              EXPECT_EQ(r.back().max_bytes, SIZE_MAX) << KindName(k);
              // A range's last byte and the next one's first pick its own.
              for (size_t i = 0; i + 1 < r.size(); ++i) {
                EXPECT_EQ(t.Select(k, r[i].max_bytes), r[i].algorithm);
                EXPECT_EQ(t.Select(k, r[i].max_bytes + 1), r[i + 1].algorithm);
              }
            }
          }
        }
      }
    }
  }
}

TEST(AlgorithmTableTest, OneShotUpToTheOptionThenTheLargeAlgorithmOfTheWorld) {
  const AlgorithmTable shm = BuildAlgorithmTable(Inputs(2, 2, 4096, true, true));
  EXPECT_EQ(shm.small_bytes(), 4096u);
  EXPECT_EQ(shm.Select(Kind::kAllReduce, 0), Algorithm::kOneShot);
  EXPECT_EQ(shm.Select(Kind::kAllReduce, 4096), Algorithm::kOneShot);
  EXPECT_EQ(shm.Select(Kind::kAllReduce, 4097), Algorithm::kShmAllReduce);
  EXPECT_EQ(shm.Select(Kind::kBroadcast, 4097), Algorithm::kChainBroadcast);
  EXPECT_EQ(shm.Select(Kind::kAllGather, 4097), Algorithm::kRingAllGather);
  EXPECT_EQ(shm.Select(Kind::kBarrier, 0), Algorithm::kNone);

  // Messages (across hosts): recursive doubling, then the ring; only for
  // AllReduce.
  const AlgorithmTable net = BuildAlgorithmTable(Inputs(2, 2, 4096, false, false));
  EXPECT_EQ(net.Select(Kind::kAllReduce, 4096), Algorithm::kOneShot);
  EXPECT_EQ(net.Select(Kind::kAllReduce, 4097), Algorithm::kRecursiveDoublingAllReduce);
  EXPECT_EQ(net.Select(Kind::kAllReduce, kDefaultRecursiveDoubling),
            Algorithm::kRecursiveDoublingAllReduce);
  EXPECT_EQ(net.Select(Kind::kAllReduce, kDefaultRecursiveDoubling + 1),
            Algorithm::kRingAllReduce);
  EXPECT_EQ(net.Select(Kind::kBroadcast, 4097), Algorithm::kChainBroadcast);
  EXPECT_EQ(net.Select(Kind::kAllGather, 4097), Algorithm::kRingAllGather);
  // A one-shot limit at or above it leaves no room for it.
  const AlgorithmTable big = BuildAlgorithmTable(Inputs(5, 16, 1 << 20, false, false));
  EXPECT_EQ(big.Select(Kind::kAllReduce, 1 << 20), Algorithm::kOneShot);
  EXPECT_EQ(big.Select(Kind::kAllReduce, (1 << 20) + 1), Algorithm::kRingAllReduce);

  const AlgorithmTable one = BuildAlgorithmTable(Inputs(1, 2, 4096, false, false));
  EXPECT_EQ(one.Select(Kind::kAllReduce, 100), Algorithm::kOneShot);
  EXPECT_EQ(one.Select(Kind::kAllReduce, 1 << 20), Algorithm::kLocal);
  EXPECT_EQ(one.Select(Kind::kAllGather, 1 << 20), Algorithm::kLocal);

  // One-shot off: only empty collectives ride in the header round.
  const AlgorithmTable off = BuildAlgorithmTable(Inputs(3, 2, 0, true, true));
  EXPECT_EQ(off.Select(Kind::kAllReduce, 0), Algorithm::kOneShot);
  EXPECT_EQ(off.Select(Kind::kAllReduce, 1), Algorithm::kShmAllReduce);
}

TEST(AlgorithmTableTest, OversubscribedHostsRaiseTheOneShotLimitOnlyWhereItPays) {
  // 4 ranks on 2 cores with the shared-memory exchange: 32 KiB.
  EXPECT_EQ(SmallMessageBytes(Inputs(4, 2, 4096, true, true)), kOversubscribedSmallBytes);
  EXPECT_EQ(BuildAlgorithmTable(Inputs(4, 2, 4096, true, true)).Select(Kind::kAllReduce, 32768),
            Algorithm::kOneShot);
  // A larger option stays.
  EXPECT_EQ(SmallMessageBytes(Inputs(4, 2, 1 << 20, true, true)), size_t{1} << 20);
  // Not when the ranks fit the cores, without the exchange, with one-shot
  // off, or beyond kOversubscribedSmallMaxRanks ranks.
  EXPECT_EQ(SmallMessageBytes(Inputs(2, 2, 4096, true, true)), 4096u);
  EXPECT_EQ(SmallMessageBytes(Inputs(4, 2, 4096, false, false)), 4096u);
  EXPECT_EQ(SmallMessageBytes(Inputs(4, 2, 0, true, true)), 0u);
  EXPECT_EQ(SmallMessageBytes(Inputs(kOversubscribedSmallMaxRanks + 1, 2, 4096, true, true)),
            4096u);
  EXPECT_EQ(SmallMessageBytes(Inputs(kOversubscribedSmallMaxRanks, 2, 4096, true, true)),
            kOversubscribedSmallBytes);
  // Zero cores reported counts as one.
  EXPECT_EQ(SmallMessageBytes(Inputs(2, 0, 4096, true, true)), kOversubscribedSmallBytes);
}

TEST(AlgorithmTableTest, DescribeNamesEveryRange) {
  const std::string d = BuildAlgorithmTable(Inputs(2, 2, 4096, true, true)).Describe();
  EXPECT_THAT(d, HasSubstr("AllReduce: 0-4096 B one-shot, 4097 B+ shm-allreduce"));
  EXPECT_THAT(d, HasSubstr("Broadcast: 0-4096 B one-shot, 4097 B+ chain-broadcast"));
  EXPECT_THAT(d, HasSubstr("Barrier: 0 B+ header-round"));
  EXPECT_THAT(BuildAlgorithmTable(Inputs(4, 2, 4096, false, false)).Describe(),
              HasSubstr("AllReduce: 0-4096 B one-shot, 4097-65536 B recursive-doubling, "
                        "65537 B+ ring-allreduce"));
}

}  // namespace
}  // namespace fusebox::comm::ucx
