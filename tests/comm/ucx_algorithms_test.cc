// The UCX backend's algorithm table (comm/ucx/algorithms.h, Note [Algorithm
// table]): every kind's ranges cover every size once, and the choice follows
// the world, the cores, the option and what shared memory offers.
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/options.h"
#include "comm/ucx/algorithms.h"
#include "comm/ucx/descriptor_round.h"
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
  for (int world : {1, 2, 3, 4, 8, 9}) {
    for (unsigned cores : {1u, 2u, 16u}) {
      for (size_t option : {size_t{0}, size_t{4096}, size_t{1} << 20}) {
        for (bool exchange : {false, true}) {
          for (bool shm : {false, true}) {
            for (bool linear : {false, true}) {
              AlgorithmInputs in = Inputs(world, cores, option, exchange, shm);
              in.rabenseifner_bytes = option * 3;  // below, at or above the others
              if (linear) {
                in.opening = UcxOptions::Opening::kLinear;
                in.linear_bytes = option / 2;
              }
              const AlgorithmTable t = BuildAlgorithmTable(in);
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

  // Messages (across hosts): the descriptor round opens every collective
  // and carries AllReduce up to the larger of the two limits; then the
  // ring. Nothing rides in a header round.
  const AlgorithmTable net = BuildAlgorithmTable(Inputs(2, 2, 4096, false, false));
  EXPECT_EQ(net.carried_bytes(), kDefaultRecursiveDoubling);
  EXPECT_EQ(net.Select(Kind::kAllReduce, 0), Algorithm::kRecursiveDoublingAllReduce);
  EXPECT_EQ(net.Select(Kind::kAllReduce, 4097), Algorithm::kRecursiveDoublingAllReduce);
  EXPECT_EQ(net.Select(Kind::kAllReduce, kDefaultRecursiveDoubling),
            Algorithm::kRecursiveDoublingAllReduce);
  EXPECT_EQ(net.Select(Kind::kAllReduce, kDefaultRecursiveDoubling + 1),
            Algorithm::kRingAllReduce);
  EXPECT_EQ(net.Select(Kind::kBroadcast, 0), Algorithm::kChainBroadcast);
  EXPECT_EQ(net.Select(Kind::kAllGather, 0), Algorithm::kRingAllGather);
  EXPECT_EQ(net.Select(Kind::kBarrier, 0), Algorithm::kNone);
  // A one-shot limit above it raises what the round carries.
  const AlgorithmTable big = BuildAlgorithmTable(Inputs(5, 16, 1 << 20, false, false));
  EXPECT_EQ(big.carried_bytes(), size_t{1} << 20);
  EXPECT_EQ(big.Select(Kind::kAllReduce, 1 << 20), Algorithm::kRecursiveDoublingAllReduce);
  EXPECT_EQ(big.Select(Kind::kAllReduce, (1 << 20) + 1), Algorithm::kRingAllReduce);
  // Every rank mapped every segment but the mailboxes were too large for the
  // exchange: the descriptor round, then the shared-memory allreduce.
  const AlgorithmTable mapped = BuildAlgorithmTable(Inputs(2, 2, 4096, false, true));
  EXPECT_EQ(mapped.Select(Kind::kAllReduce, kDefaultRecursiveDoubling + 1),
            Algorithm::kShmAllReduce);
  // The shared-memory exchange carries no descriptor round.
  EXPECT_EQ(shm.carried_bytes(), 0u);

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

// Note [Linear round]: it opens collectives over messages where forced, or
// by default where some machine runs more ranks than cores and the world
// has at least kLinearMinRanks ranks; AllReduce up to linear_bytes rides in it, then
// recursive doubling up to the carried limit, then the ring.
TEST(AlgorithmTableTest, TheLinearRoundOpensWhereAMachineHasMoreRanksThanCores) {
  using Opening = UcxOptions::Opening;
  const auto inputs = [](int world, Opening opening, bool oversubscribed, bool exchange) {
    AlgorithmInputs in = Inputs(world, 2, 4096, exchange, false);
    in.opening = opening;
    in.linear_bytes = 4096;
    in.machine_oversubscribed = oversubscribed;
    return in;
  };
  const AlgorithmTable t = BuildAlgorithmTable(inputs(8, Opening::kAuto, true, false));
  EXPECT_TRUE(t.linear());
  EXPECT_EQ(t.linear_bytes(), 4096u);
  EXPECT_EQ(t.Select(Kind::kAllReduce, 0), Algorithm::kLinearAllReduce);
  EXPECT_EQ(t.Select(Kind::kAllReduce, 4096), Algorithm::kLinearAllReduce);
  EXPECT_EQ(t.Select(Kind::kAllReduce, 4097), Algorithm::kRecursiveDoublingAllReduce);
  EXPECT_EQ(t.Select(Kind::kAllReduce, kDefaultRecursiveDoubling),
            Algorithm::kRecursiveDoublingAllReduce);
  EXPECT_EQ(t.Select(Kind::kAllReduce, kDefaultRecursiveDoubling + 1), Algorithm::kRingAllReduce);
  EXPECT_EQ(t.Select(Kind::kBroadcast, 0), Algorithm::kChainBroadcast);
  EXPECT_EQ(t.Select(Kind::kBarrier, 0), Algorithm::kNone);
  EXPECT_THAT(t.Describe(), HasSubstr("AllReduce: 0-4096 B linear, 4097-65536 B "
                                      "recursive-doubling, 65537 B+ ring-allreduce"));
  EXPECT_THAT(t.Describe(), HasSubstr("Opening: linear round"));
  // Not by default where every machine has the cores, below kLinearMinRanks
  // ranks, or on one host's shared-memory exchange; forced, at any size of
  // world over messages.
  EXPECT_FALSE(BuildAlgorithmTable(inputs(8, Opening::kAuto, false, false)).linear());
  EXPECT_FALSE(BuildAlgorithmTable(inputs(2, Opening::kAuto, true, false)).linear());
  EXPECT_FALSE(
      BuildAlgorithmTable(inputs(kLinearMinRanks - 1, Opening::kAuto, true, false)).linear());
  EXPECT_TRUE(BuildAlgorithmTable(inputs(kLinearMinRanks, Opening::kAuto, true, false)).linear());
  EXPECT_FALSE(BuildAlgorithmTable(inputs(8, Opening::kAuto, true, true)).linear());
  EXPECT_FALSE(BuildAlgorithmTable(inputs(8, Opening::kRecursiveDoubling, true, false)).linear());
  EXPECT_TRUE(BuildAlgorithmTable(inputs(2, Opening::kLinear, false, false)).linear());
  EXPECT_EQ(
      BuildAlgorithmTable(inputs(8, Opening::kAuto, false, false)).Select(Kind::kAllReduce, 8),
      Algorithm::kRecursiveDoublingAllReduce);
  // A linear limit above the carried one leaves no recursive doubling.
  AlgorithmInputs wide = inputs(4, Opening::kLinear, false, false);
  wide.linear_bytes = kDefaultRecursiveDoubling * 2;
  const AlgorithmTable w = BuildAlgorithmTable(wide);
  ASSERT_EQ(w.ranges(Kind::kAllReduce).size(), 2u);
  EXPECT_EQ(w.Select(Kind::kAllReduce, wide.linear_bytes), Algorithm::kLinearAllReduce);
  EXPECT_EQ(w.Select(Kind::kAllReduce, wide.linear_bytes + 1), Algorithm::kRingAllReduce);
}

TEST(AlgorithmTableTest, RabenseifnerTakesTheMiddleSizesWhereTheWorldIsAPowerOfTwo) {
  constexpr size_t kRabenseifner = size_t{4} << 20;
  for (int world : {2, 3, 4, 5, 6, 8, 12, 16}) {
    for (bool linear : {false, true}) {
      AlgorithmInputs in = Inputs(world, 64, 4096, /*exchange=*/false, /*shm=*/false);
      in.rabenseifner_bytes = kRabenseifner;
      if (linear) {
        in.opening = UcxOptions::Opening::kLinear;
        in.linear_bytes = 4096;
      }
      const AlgorithmTable t = BuildAlgorithmTable(in);
      const bool halving = world >= 4 && (world & (world - 1)) == 0;
      SCOPED_TRACE(absl::StrCat("world ", world, linear ? " linear" : ""));
      EXPECT_EQ(t.Select(Kind::kAllReduce, 4096),
                linear ? Algorithm::kLinearAllReduce : Algorithm::kRecursiveDoublingAllReduce);
      EXPECT_EQ(t.Select(Kind::kAllReduce, kDefaultRecursiveDoubling),
                Algorithm::kRecursiveDoublingAllReduce);
      EXPECT_EQ(t.Select(Kind::kAllReduce, kDefaultRecursiveDoubling + 1),
                halving ? Algorithm::kRabenseifnerAllReduce : Algorithm::kRingAllReduce);
      EXPECT_EQ(t.Select(Kind::kAllReduce, kRabenseifner),
                halving ? Algorithm::kRabenseifnerAllReduce : Algorithm::kRingAllReduce);
      EXPECT_EQ(t.Select(Kind::kAllReduce, kRabenseifner + 1), Algorithm::kRingAllReduce);
      // The staging and the linear round's watch cover what Rabenseifner carries.
      EXPECT_EQ(t.carried_bytes(), halving ? kRabenseifner : kDefaultRecursiveDoubling);
    }
  }
  // Off (0), or not above recursive doubling's range: none.
  AlgorithmInputs off = Inputs(8, 64, 4096, false, false);
  off.rabenseifner_bytes = 0;
  EXPECT_EQ(BuildAlgorithmTable(off).Select(Kind::kAllReduce, kDefaultRecursiveDoubling + 1),
            Algorithm::kRingAllReduce);
  off.rabenseifner_bytes = kDefaultRecursiveDoubling;
  EXPECT_EQ(BuildAlgorithmTable(off).carried_bytes(), kDefaultRecursiveDoubling);
  // One host's shared-memory exchange has its own allreduce.
  AlgorithmInputs shm = Inputs(8, 64, 4096, true, true);
  shm.rabenseifner_bytes = kRabenseifner;
  EXPECT_EQ(BuildAlgorithmTable(shm).Select(Kind::kAllReduce, kDefaultRecursiveDoubling + 1),
            Algorithm::kShmAllReduce);
}

// Note [Recursive doubling or Rabenseifner]: where both run, recursive
// doubling up to the switch point and Rabenseifner above it; the linear
// round keeps its own range; other worlds and Rabenseifner off are
// unchanged.
TEST(AlgorithmTableTest, TheSwitchPointEndsRecursiveDoublingWhereBothRun) {
  for (bool linear : {false, true}) {
    AlgorithmInputs in = Inputs(8, 64, 4096, /*exchange=*/false, /*shm=*/false);
    in.rabenseifner_bytes = 512 << 10;
    in.rabenseifner_from_bytes = 10500;
    if (linear) {
      in.opening = UcxOptions::Opening::kLinear;
      in.linear_bytes = 4096;
    }
    const AlgorithmTable t = BuildAlgorithmTable(in);
    SCOPED_TRACE(linear ? "linear" : "descriptor round");
    EXPECT_EQ(t.Select(Kind::kAllReduce, 4096),
              linear ? Algorithm::kLinearAllReduce : Algorithm::kRecursiveDoublingAllReduce);
    EXPECT_EQ(t.Select(Kind::kAllReduce, 10500), Algorithm::kRecursiveDoublingAllReduce);
    EXPECT_EQ(t.Select(Kind::kAllReduce, 10501), Algorithm::kRabenseifnerAllReduce);
    EXPECT_EQ(t.Select(Kind::kAllReduce, 512 << 10), Algorithm::kRabenseifnerAllReduce);
    EXPECT_EQ(t.Select(Kind::kAllReduce, (512 << 10) + 1), Algorithm::kRingAllReduce);
    EXPECT_EQ(t.carried_bytes(), size_t{512} << 10);
  }
  // A switch point below the linear round's range: linear, then Rabenseifner.
  AlgorithmInputs low = Inputs(8, 64, 4096, false, false);
  low.rabenseifner_bytes = 512 << 10;
  low.rabenseifner_from_bytes = 2048;
  low.opening = UcxOptions::Opening::kLinear;
  low.linear_bytes = 4096;
  EXPECT_EQ(BuildAlgorithmTable(low).Select(Kind::kAllReduce, 4096), Algorithm::kLinearAllReduce);
  EXPECT_EQ(BuildAlgorithmTable(low).Select(Kind::kAllReduce, 4097),
            Algorithm::kRabenseifnerAllReduce);
  // Not a power of two, or Rabenseifner off: recursive doubling to its end, then the ring.
  for (int world : {6, 8}) {
    AlgorithmInputs in = Inputs(world, 64, 4096, false, false);
    in.rabenseifner_bytes = world == 8 ? 0 : 512 << 10;
    in.rabenseifner_from_bytes = 10500;
    EXPECT_EQ(BuildAlgorithmTable(in).Select(Kind::kAllReduce, kDefaultRecursiveDoubling),
              Algorithm::kRecursiveDoublingAllReduce);
    EXPECT_EQ(BuildAlgorithmTable(in).Select(Kind::kAllReduce, kDefaultRecursiveDoubling + 1),
              Algorithm::kRingAllReduce);
  }
}

// Rabenseifner runs above the switch point up to rabenseifner_bytes and no
// further: where that ends inside recursive doubling's range, recursive
// doubling resumes; where it does not reach above the switch point, there
// is none; a switch point of 0 gives recursive doubling empty messages only.
TEST(AlgorithmTableTest, RabenseifnerStaysBetweenTheSwitchPointAndItsOwnLimit) {
  const auto table = [](size_t from, size_t rab) {
    AlgorithmInputs in = Inputs(4, 64, 4096, /*exchange=*/false, /*shm=*/false);
    in.rabenseifner_from_bytes = from;
    in.rabenseifner_bytes = rab;
    return BuildAlgorithmTable(in);
  };
  const size_t rd = kDefaultRecursiveDoubling;  // 64 KiB
  // Inside: 32 KiB to 48 KiB Rabenseifner, recursive doubling around it.
  AlgorithmTable t = table(32 << 10, 48 << 10);
  EXPECT_EQ(t.Select(Kind::kAllReduce, 32 << 10), Algorithm::kRecursiveDoublingAllReduce);
  EXPECT_EQ(t.Select(Kind::kAllReduce, (32 << 10) + 1), Algorithm::kRabenseifnerAllReduce);
  EXPECT_EQ(t.Select(Kind::kAllReduce, 48 << 10), Algorithm::kRabenseifnerAllReduce);
  EXPECT_EQ(t.Select(Kind::kAllReduce, (48 << 10) + 1), Algorithm::kRecursiveDoublingAllReduce);
  EXPECT_EQ(t.Select(Kind::kAllReduce, rd), Algorithm::kRecursiveDoublingAllReduce);
  EXPECT_EQ(t.Select(Kind::kAllReduce, rd + 1), Algorithm::kRingAllReduce);
  EXPECT_EQ(t.carried_bytes(), rd);
  // Below the switch point: none (recursive doubling to its end, then the ring).
  t = table(32 << 10, 16 << 10);
  EXPECT_EQ(t.Select(Kind::kAllReduce, rd), Algorithm::kRecursiveDoublingAllReduce);
  EXPECT_EQ(t.Select(Kind::kAllReduce, rd + 1), Algorithm::kRingAllReduce);
  // A switch point above recursive doubling's range: Rabenseifner from its end.
  t = table(1 << 20, 512 << 10);
  EXPECT_EQ(t.Select(Kind::kAllReduce, rd), Algorithm::kRecursiveDoublingAllReduce);
  EXPECT_EQ(t.Select(Kind::kAllReduce, rd + 1), Algorithm::kRabenseifnerAllReduce);
  // 0: only empty messages by recursive doubling.
  t = table(0, 512 << 10);
  EXPECT_EQ(t.Select(Kind::kAllReduce, 0), Algorithm::kRecursiveDoublingAllReduce);
  EXPECT_EQ(t.Select(Kind::kAllReduce, 1), Algorithm::kRabenseifnerAllReduce);
  EXPECT_EQ(t.Select(Kind::kAllReduce, 512 << 10), Algorithm::kRabenseifnerAllReduce);
  EXPECT_EQ(t.Select(Kind::kAllReduce, (512 << 10) + 1), Algorithm::kRingAllReduce);
}

TEST(AlgorithmTableTest, DescribeNamesEveryRange) {
  const std::string d = BuildAlgorithmTable(Inputs(2, 2, 4096, true, true)).Describe();
  EXPECT_THAT(d, HasSubstr("AllReduce: 0-4096 B one-shot, 4097 B+ shm-allreduce"));
  EXPECT_THAT(d, HasSubstr("Broadcast: 0-4096 B one-shot, 4097 B+ chain-broadcast"));
  EXPECT_THAT(d, HasSubstr("Barrier: 0 B+ opening-round"));
  EXPECT_THAT(BuildAlgorithmTable(Inputs(4, 2, 4096, false, false)).Describe(),
              HasSubstr("AllReduce: 0-65536 B recursive-doubling, 65537 B+ ring-allreduce"));
}

// Note [Descriptor round]: merging the verdicts of adjacent blocks, in
// whatever bracketing, gives the world's: rank 0's header and the lowest
// rank whose call differs from it in any field.
TEST(DescriptorRoundTest, MergingAdjacentBlocksFindsTheLowestRankThatDiffersFromRankZero) {
  std::mt19937 rng(7);
  int mismatches = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int p = 1 + static_cast<int>(rng() % 9);
    std::vector<Header> h(p);
    for (int r = 0; r < p; ++r) {
      h[r] = Header{kHeaderMagic, 1, 0, 0, 0, 0, r, 10, 3};
      switch (rng() % 12) {  // mostly equal; else one field differs
        case 0:
          h[r].kind = 2;
          break;
        case 1:
          h[r].type = 1;
          break;
        case 2:
          h[r].op = 1;
          break;
        case 3:
          h[r].root = 1;
          break;
        case 4:
          h[r].count = 11;
          break;
        case 5:
          h[r].seq = 4;
          break;
        default:
          break;
      }
    }
    int want = -1;
    for (int r = 1; r < p && want < 0; ++r) {
      if (!SameCall(h[r], h[0])) want = r;
    }
    std::function<Verdict(int, int)> merged = [&](int lo, int hi) {
      if (lo == hi) return Verdict{h[lo], Header{}};
      const int mid = lo + static_cast<int>(rng() % (hi - lo));  // [lo, mid] then [mid+1, hi]
      return Merge(merged(lo, mid), merged(mid + 1, hi));
    };
    const Verdict v = merged(0, p - 1);
    ASSERT_EQ(v.first.sender, 0);
    if (want < 0) {
      EXPECT_TRUE(Clean(v)) << "p=" << p << " trial " << trial;
      EXPECT_TRUE(VerdictStatus(v).ok());
      continue;
    }
    ++mismatches;
    ASSERT_FALSE(Clean(v)) << "p=" << p << " trial " << trial;
    EXPECT_EQ(v.differ.sender, want) << "p=" << p << " trial " << trial;
    const absl::Status s = VerdictStatus(v);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("rank 0 called ", Describe(h[0]), " but rank ",
                                                    want, " called ", Describe(h[want]))));
  }
  EXPECT_GT(mismatches, 1000);  // both outcomes were exercised
}

}  // namespace
}  // namespace fusebox::comm::ucx
