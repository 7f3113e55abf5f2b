// The UCX backend's algorithm units and their registration (comm/ucx/algo/,
// Note [Algorithm units] in comm/ucx/algo/unit.h): every Algorithm has one
// unit, every unit's ranges are consistent, and the table built from the
// units chooses what the table written as one function chose before them.
#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/options.h"
#include "comm/ucx/algo/registry.h"
#include "comm/ucx/algo/unit.h"
#include "comm/ucx/algorithms.h"
#include "comm/ucx/choice.h"
#include "gtest/gtest.h"

namespace fusebox::comm::ucx {
namespace {

using Opening = UcxOptions::Opening;

constexpr Algorithm kAlgorithms[] = {
    Algorithm::kNone,          Algorithm::kOneShot,
    Algorithm::kLocal,         Algorithm::kShmAllReduce,
    Algorithm::kRingAllReduce, Algorithm::kRecursiveDoublingAllReduce,
    Algorithm::kLinearAllReduce, Algorithm::kRabenseifnerAllReduce,
    Algorithm::kChainBroadcast, Algorithm::kRingAllGather};

// UcxOptions' defaults, as Init gives them to the table.
AlgorithmInputs Defaults(int world, unsigned cores, bool exchange, bool shm, Opening opening,
                         bool oversubscribed) {
  UcxOptions options;
  options.opening = opening;
  AlgorithmInputs in = TableInputs(options, world, cores, oversubscribed);
  in.shm_exchange = exchange;
  in.shm_allreduce = shm;
  return in;
}

TEST(AlgorithmUnitsTest, EveryAlgorithmHasOneUnitAndItsName) {
  std::set<std::string> names;
  for (Algorithm a : kAlgorithms) {
    int units = 0;
    for (const AlgorithmUnit* u : AlgorithmUnits()) units += u->algorithm == a ? 1 : 0;
    EXPECT_EQ(units, 1) << AlgorithmName(a);
    EXPECT_EQ(UnitOf(a).algorithm, a);
    EXPECT_STREQ(UnitOf(a).name, AlgorithmName(a));
    names.insert(AlgorithmName(a));
  }
  EXPECT_EQ(names.size(), std::size(kAlgorithms));
  EXPECT_EQ(AlgorithmUnits().size(), std::size(kAlgorithms));
}

TEST(AlgorithmUnitsTest, EachUnitRunsOneWay) {
  for (const AlgorithmUnit* u : AlgorithmUnits()) {
    // Carried in an opening round over messages: it opens, and nothing runs
    // after it; otherwise it does not open.
    EXPECT_EQ(u->open != nullptr, u->carrier != Carrier::kNone) << u->name;
    if (u->open != nullptr) {
      EXPECT_EQ(u->run, nullptr) << u->name;
    }
    // What rides in the header round is read after it.
    if (u->payload != nullptr) {
      EXPECT_NE(u->run, nullptr) << u->name;
    }
  }
}

// Over a grid of inputs: every range is well formed and of a kind the unit
// serves; units serving the same size of the same kind differ in score, so
// the choice never depends on the order of the list; and the candidates of
// a measured class are units that say so, in their trial order.
TEST(AlgorithmUnitsTest, RangesAreConsistentAndNeverTie) {
  for (int world : {1, 2, 3, 4, 5, 8, 11, 16, 17}) {
    for (int ex = 0; ex < 4; ++ex) {
      for (Opening opening : {Opening::kAuto, Opening::kRecursiveDoubling, Opening::kLinear}) {
        for (bool over : {false, true}) {
          const AlgorithmInputs in = Defaults(world, 2, ex & 1, ex & 2, opening, over);
          const Situation s(in);
          std::vector<std::pair<const AlgorithmUnit*, Served>> all;
          for (const AlgorithmUnit* u : AlgorithmUnits()) {
            for (const Served& r : u->serves(s)) {
              EXPECT_LE(r.lo, r.hi) << u->name;
              all.emplace_back(u, r);
            }
          }
          for (size_t i = 0; i < all.size(); ++i) {
            for (size_t j = i + 1; j < all.size(); ++j) {
              const Served& a = all[i].second;
              const Served& b = all[j].second;
              const bool overlap = a.kind == b.kind && a.lo <= b.hi && b.lo <= a.hi;
              if (overlap) {
                EXPECT_NE(a.score, b.score) << all[i].first->name << " and " << all[j].first->name
                                            << " tie at world " << world;
              }
            }
          }
          const AlgorithmTable t = BuildAlgorithmTable(in);
          for (const AlgorithmTable::MeasuredClass& c : t.measured()) {
            int last = -1;
            for (Algorithm a : c.candidates) {
              const AlgorithmUnit& u = UnitOf(a);
              ASSERT_NE(u.measured, nullptr) << u.name;
              EXPECT_TRUE(u.measured(s, c.lo, c.hi)) << u.name;
              EXPECT_GE(u.trial_order, last) << u.name;
              last = u.trial_order;
            }
          }
        }
      }
    }
  }
}

// The table of every situation below, with UcxOptions' defaults, as the
// table written as one function (comm/ucx/algorithms.cc before the units,
// commit e2dad219) described it: recorded from that build by calling
// BuildAlgorithmTable and Describe() for each row, not written by hand.
// (Beside these rows, the old and the new build were compared on 404,352
// combinations of world, cores, options and openings, and agreed on every
// range, measured class and limit.)
struct Expected {
  int world;
  unsigned cores;
  bool exchange;
  bool shm;
  Opening opening;
  bool oversubscribed;
  const char* table;  // Describe()
  size_t small_bytes;
  size_t carried_bytes;
  size_t linear_bytes;
  bool linear_watched;
};

const Expected kBeforeTheUnits[] = {
    {1, 2, false, false, Opening::kAuto, false,
     "AllReduce: 0-4096 B one-shot, 4097 B+ local\n"
     "Broadcast: 0-4096 B one-shot, 4097 B+ local\n"
     "AllGather: 0-4096 B one-shot, 4097 B+ local\n"
     "Barrier: 0 B+ opening-round",
     4096, 0, 0, false},
    {1, 2, true, false, Opening::kAuto, false,
     "AllReduce: 0-4096 B one-shot, 4097 B+ local\n"
     "Broadcast: 0-4096 B one-shot, 4097 B+ local\n"
     "AllGather: 0-4096 B one-shot, 4097 B+ local\n"
     "Barrier: 0 B+ opening-round",
     4096, 0, 0, false},
    {2, 16, true, true, Opening::kAuto, false,
     "AllReduce: 0-4096 B one-shot, 4097 B+ shm-allreduce\n"
     "Broadcast: 0-4096 B one-shot, 4097 B+ chain-broadcast\n"
     "AllGather: 0-4096 B one-shot, 4097 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round",
     4096, 0, 0, false},
    {3, 16, true, true, Opening::kAuto, false,
     "AllReduce: 0-4096 B one-shot, 4097 B+ shm-allreduce\n"
     "Broadcast: 0-4096 B one-shot, 4097 B+ chain-broadcast\n"
     "AllGather: 0-4096 B one-shot, 4097 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round",
     4096, 0, 0, false},
    {4, 2, true, true, Opening::kAuto, false,
     "AllReduce: 0-32768 B one-shot, 32769 B+ shm-allreduce\n"
     "Broadcast: 0-32768 B one-shot, 32769 B+ chain-broadcast\n"
     "AllGather: 0-32768 B one-shot, 32769 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round",
     32768, 0, 0, false},
    {8, 2, true, true, Opening::kAuto, false,
     "AllReduce: 0-32768 B one-shot, 32769 B+ shm-allreduce\n"
     "Broadcast: 0-32768 B one-shot, 32769 B+ chain-broadcast\n"
     "AllGather: 0-32768 B one-shot, 32769 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round",
     32768, 0, 0, false},
    {9, 2, true, true, Opening::kAuto, false,
     "AllReduce: 0-4096 B one-shot, 4097 B+ shm-allreduce\n"
     "Broadcast: 0-4096 B one-shot, 4097 B+ chain-broadcast\n"
     "AllGather: 0-4096 B one-shot, 4097 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round",
     4096, 0, 0, false},
    {2, 16, false, false, Opening::kAuto, false,
     "AllReduce: 0-65536 B recursive-doubling, 65537 B+ ring-allreduce\n"
     "Broadcast: 0 B+ chain-broadcast\n"
     "AllGather: 0 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round",
     4096, 65536, 0, false},
    {3, 16, false, false, Opening::kAuto, false,
     "AllReduce: 0-65536 B recursive-doubling, 65537 B+ ring-allreduce\n"
     "Broadcast: 0 B+ chain-broadcast\n"
     "AllGather: 0 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round\n"
     "Measured: (32768, 65536] B ring-allreduce|recursive-doubling",
     4096, 65536, 0, false},
    {4, 16, false, false, Opening::kAuto, false,
     "AllReduce: 0-32768 B recursive-doubling, 32769-524288 B rabenseifner, 524289 B+ ring-allreduce\n"
     "Broadcast: 0 B+ chain-broadcast\n"
     "AllGather: 0 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round\n"
     "Measured: (4096, 8192] B rabenseifner|recursive-doubling, (8192, 16384] B rabenseifner|recursive-doubling, (16384, 32768] B rabenseifner|recursive-doubling, (32768, 65536] B rabenseifner|ring-allreduce|recursive-doubling, (65536, 131072] B rabenseifner|ring-allreduce|recursive-doubling, (131072, 262144] B rabenseifner|ring-allreduce|recursive-doubling, (262144, 524288] B rabenseifner|ring-allreduce|recursive-doubling",
     4096, 524288, 0, false},
    {5, 16, false, false, Opening::kAuto, false,
     "AllReduce: 0-65536 B recursive-doubling, 65537 B+ ring-allreduce\n"
     "Broadcast: 0 B+ chain-broadcast\n"
     "AllGather: 0 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round\n"
     "Measured: (32768, 65536] B ring-allreduce|recursive-doubling",
     4096, 65536, 0, false},
    {7, 16, false, false, Opening::kAuto, false,
     "AllReduce: 0-65536 B recursive-doubling, 65537 B+ ring-allreduce\n"
     "Broadcast: 0 B+ chain-broadcast\n"
     "AllGather: 0 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round\n"
     "Measured: (32768, 65536] B ring-allreduce|recursive-doubling",
     4096, 65536, 0, false},
    {8, 16, false, false, Opening::kAuto, false,
     "AllReduce: 0-32768 B recursive-doubling, 32769-524288 B rabenseifner, 524289 B+ ring-allreduce\n"
     "Broadcast: 0 B+ chain-broadcast\n"
     "AllGather: 0 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round\n"
     "Measured: (4096, 8192] B rabenseifner|recursive-doubling, (8192, 16384] B rabenseifner|recursive-doubling, (16384, 32768] B rabenseifner|recursive-doubling, (32768, 65536] B rabenseifner|ring-allreduce|recursive-doubling, (65536, 131072] B rabenseifner|ring-allreduce|recursive-doubling, (131072, 262144] B rabenseifner|ring-allreduce|recursive-doubling, (262144, 524288] B rabenseifner|ring-allreduce|recursive-doubling",
     4096, 524288, 0, false},
    {11, 16, false, false, Opening::kAuto, false,
     "AllReduce: 0-65536 B recursive-doubling, 65537 B+ ring-allreduce\n"
     "Broadcast: 0 B+ chain-broadcast\n"
     "AllGather: 0 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round\n"
     "Measured: (32768, 65536] B ring-allreduce|recursive-doubling",
     4096, 65536, 0, false},
    {16, 16, false, false, Opening::kAuto, false,
     "AllReduce: 0-32768 B recursive-doubling, 32769-524288 B rabenseifner, 524289 B+ ring-allreduce\n"
     "Broadcast: 0 B+ chain-broadcast\n"
     "AllGather: 0 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round\n"
     "Measured: (4096, 8192] B rabenseifner|recursive-doubling, (8192, 16384] B rabenseifner|recursive-doubling, (16384, 32768] B rabenseifner|recursive-doubling, (32768, 65536] B rabenseifner|ring-allreduce|recursive-doubling, (65536, 131072] B rabenseifner|ring-allreduce|recursive-doubling, (131072, 262144] B rabenseifner|ring-allreduce|recursive-doubling, (262144, 524288] B rabenseifner|ring-allreduce|recursive-doubling",
     4096, 524288, 0, false},
    {32, 64, false, false, Opening::kAuto, false,
     "AllReduce: 0-32768 B recursive-doubling, 32769-524288 B rabenseifner, 524289 B+ ring-allreduce\n"
     "Broadcast: 0 B+ chain-broadcast\n"
     "AllGather: 0 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round\n"
     "Measured: (4096, 8192] B rabenseifner|recursive-doubling, (8192, 16384] B rabenseifner|recursive-doubling, (16384, 32768] B rabenseifner|recursive-doubling, (32768, 65536] B rabenseifner|ring-allreduce|recursive-doubling, (65536, 131072] B rabenseifner|ring-allreduce|recursive-doubling, (131072, 262144] B rabenseifner|ring-allreduce|recursive-doubling, (262144, 524288] B rabenseifner|ring-allreduce|recursive-doubling",
     4096, 524288, 0, false},
    {4, 16, false, true, Opening::kAuto, false,
     "AllReduce: 0-32768 B recursive-doubling, 32769-524288 B rabenseifner, 524289 B+ shm-allreduce\n"
     "Broadcast: 0 B+ chain-broadcast\n"
     "AllGather: 0 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round\n"
     "Measured: (4096, 8192] B rabenseifner|recursive-doubling, (8192, 16384] B rabenseifner|recursive-doubling, (16384, 32768] B rabenseifner|recursive-doubling, (32768, 65536] B rabenseifner|shm-allreduce|recursive-doubling, (65536, 131072] B rabenseifner|shm-allreduce|recursive-doubling, (131072, 262144] B rabenseifner|shm-allreduce|recursive-doubling, (262144, 524288] B rabenseifner|shm-allreduce|recursive-doubling",
     4096, 524288, 0, false},
    {4, 2, false, false, Opening::kAuto, true,
     "AllReduce: 0-32768 B recursive-doubling, 32769-524288 B rabenseifner, 524289 B+ ring-allreduce\n"
     "Broadcast: 0 B+ chain-broadcast\n"
     "AllGather: 0 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round\n"
     "Measured: (4096, 8192] B rabenseifner|recursive-doubling|linear, (8192, 16384] B rabenseifner|recursive-doubling|linear, (16384, 32768] B rabenseifner|recursive-doubling|linear, (32768, 65536] B rabenseifner|ring-allreduce|recursive-doubling|linear, (65536, 131072] B rabenseifner|ring-allreduce|recursive-doubling, (131072, 262144] B rabenseifner|ring-allreduce|recursive-doubling, (262144, 524288] B rabenseifner|ring-allreduce|recursive-doubling",
     4096, 524288, 65536, true},
    {5, 2, false, false, Opening::kAuto, true,
     "AllReduce: 0-4096 B linear, 4097-65536 B recursive-doubling, 65537 B+ ring-allreduce\n"
     "Broadcast: 0 B+ chain-broadcast\n"
     "AllGather: 0 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round\n"
     "Opening: linear round\n"
     "Measured: (4096, 8192] B recursive-doubling|linear, (8192, 16384] B recursive-doubling|linear, (16384, 32768] B recursive-doubling|linear, (32768, 65536] B ring-allreduce|recursive-doubling|linear",
     4096, 65536, 65536, true},
    {8, 2, false, false, Opening::kAuto, true,
     "AllReduce: 0-4096 B linear, 4097-32768 B recursive-doubling, 32769-524288 B rabenseifner, 524289 B+ ring-allreduce\n"
     "Broadcast: 0 B+ chain-broadcast\n"
     "AllGather: 0 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round\n"
     "Opening: linear round\n"
     "Measured: (4096, 8192] B rabenseifner|recursive-doubling|linear, (8192, 16384] B rabenseifner|recursive-doubling|linear, (16384, 32768] B rabenseifner|recursive-doubling|linear, (32768, 65536] B rabenseifner|ring-allreduce|recursive-doubling|linear, (65536, 131072] B rabenseifner|ring-allreduce|recursive-doubling, (131072, 262144] B rabenseifner|ring-allreduce|recursive-doubling, (262144, 524288] B rabenseifner|ring-allreduce|recursive-doubling",
     4096, 524288, 65536, true},
    {17, 2, false, false, Opening::kAuto, true,
     "AllReduce: 0-4096 B linear, 4097-65536 B recursive-doubling, 65537 B+ ring-allreduce\n"
     "Broadcast: 0 B+ chain-broadcast\n"
     "AllGather: 0 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round\n"
     "Opening: linear round\n"
     "Measured: (32768, 65536] B ring-allreduce|recursive-doubling",
     4096, 65536, 4096, true},
    {8, 2, false, false, Opening::kLinear, false,
     "AllReduce: 0-4096 B linear, 4097-32768 B recursive-doubling, 32769-524288 B rabenseifner, 524289 B+ ring-allreduce\n"
     "Broadcast: 0 B+ chain-broadcast\n"
     "AllGather: 0 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round\n"
     "Opening: linear round\n"
     "Measured: (4096, 8192] B rabenseifner|recursive-doubling|linear, (8192, 16384] B rabenseifner|recursive-doubling|linear, (16384, 32768] B rabenseifner|recursive-doubling|linear, (32768, 65536] B rabenseifner|ring-allreduce|recursive-doubling|linear, (65536, 131072] B rabenseifner|ring-allreduce|recursive-doubling, (131072, 262144] B rabenseifner|ring-allreduce|recursive-doubling, (262144, 524288] B rabenseifner|ring-allreduce|recursive-doubling",
     4096, 524288, 65536, true},
    {3, 2, false, false, Opening::kLinear, true,
     "AllReduce: 0-4096 B linear, 4097-65536 B recursive-doubling, 65537 B+ ring-allreduce\n"
     "Broadcast: 0 B+ chain-broadcast\n"
     "AllGather: 0 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round\n"
     "Opening: linear round\n"
     "Measured: (4096, 8192] B recursive-doubling|linear, (8192, 16384] B recursive-doubling|linear, (16384, 32768] B recursive-doubling|linear, (32768, 65536] B ring-allreduce|recursive-doubling|linear",
     4096, 65536, 65536, true},
    {8, 2, false, false, Opening::kRecursiveDoubling, true,
     "AllReduce: 0-32768 B recursive-doubling, 32769-524288 B rabenseifner, 524289 B+ ring-allreduce\n"
     "Broadcast: 0 B+ chain-broadcast\n"
     "AllGather: 0 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round\n"
     "Measured: (4096, 8192] B rabenseifner|recursive-doubling, (8192, 16384] B rabenseifner|recursive-doubling, (16384, 32768] B rabenseifner|recursive-doubling, (32768, 65536] B rabenseifner|ring-allreduce|recursive-doubling, (65536, 131072] B rabenseifner|ring-allreduce|recursive-doubling, (131072, 262144] B rabenseifner|ring-allreduce|recursive-doubling, (262144, 524288] B rabenseifner|ring-allreduce|recursive-doubling",
     4096, 524288, 0, false},
    {8, 16, false, false, Opening::kRecursiveDoubling, false,
     "AllReduce: 0-32768 B recursive-doubling, 32769-524288 B rabenseifner, 524289 B+ ring-allreduce\n"
     "Broadcast: 0 B+ chain-broadcast\n"
     "AllGather: 0 B+ ring-allgather\n"
     "Barrier: 0 B+ opening-round\n"
     "Measured: (4096, 8192] B rabenseifner|recursive-doubling, (8192, 16384] B rabenseifner|recursive-doubling, (16384, 32768] B rabenseifner|recursive-doubling, (32768, 65536] B rabenseifner|ring-allreduce|recursive-doubling, (65536, 131072] B rabenseifner|ring-allreduce|recursive-doubling, (131072, 262144] B rabenseifner|ring-allreduce|recursive-doubling, (262144, 524288] B rabenseifner|ring-allreduce|recursive-doubling",
     4096, 524288, 0, false},
};

TEST(AlgorithmUnitsTest, TheTableChoosesWhatItChoseBeforeTheUnits) {
  for (const Expected& e : kBeforeTheUnits) {
    const AlgorithmTable t = BuildAlgorithmTable(
        Defaults(e.world, e.cores, e.exchange, e.shm, e.opening, e.oversubscribed));
    const std::string where =
        absl::StrCat("world ", e.world, ", cores ", e.cores, ", exchange ", e.exchange, ", shm ",
                     e.shm, ", opening ", static_cast<int>(e.opening), ", oversubscribed ",
                     e.oversubscribed);
    EXPECT_EQ(t.Describe(), e.table) << where;
    EXPECT_EQ(t.small_bytes(), e.small_bytes) << where;
    EXPECT_EQ(t.carried_bytes(), e.carried_bytes) << where;
    EXPECT_EQ(t.linear_bytes(), e.linear_bytes) << where;
    EXPECT_EQ(t.linear_watched(), e.linear_watched) << where;
  }
}

}  // namespace
}  // namespace fusebox::comm::ucx
