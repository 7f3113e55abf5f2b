// UCX backend with ranks as threads of one process over an in-memory store.
// Every result is compared bit for bit with an independent reference
// (comm/testing/exact_data.h).
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "comm/memory_store.h"
#include "comm/testing/exact_data.h"
#include "comm/ucx/communicator.h"
#include "comm/ucx/shm_allreduce.h"
#include "gtest/gtest.h"
#include "tests/common/run_ranks_ucx.h"

namespace fusebox::comm {
namespace {

using testing::CountMismatches;
using testing::FillExpected;
using testing::FillInput;

using fusebox::testing::RankFn;

// Creates `world` communicators concurrently (creation is collective) and
// runs `fn` on each in its own thread.
void RunRanks(int world, const UcxOptions& options, const RankFn& fn) {
  fusebox::testing::RunRanksUcx(world, fn, options);
}

// Ring for everything: tiny chunks, no one-shot path, so empty segments,
// partial chunks and many pipeline steps are exercised on small buffers.
UcxOptions RingOnly() {
  UcxOptions o;
  o.small_message_bytes = 0;
  o.recursive_doubling_bytes = 0;
  o.chunk_bytes = 64;
  o.use_shared_memory = false;
  // The descriptor round opens on every machine (by default the linear one
  // would where ranks outnumber cores; LinearOpening() covers it).
  o.opening = UcxOptions::Opening::kRecursiveDoubling;
  return o;
}

// Recursive doubling for every AllReduce, as across hosts (no shared
// memory, no one-shot): world sizes that are not powers of two exercise the
// hand-over before and after the exchanges.
UcxOptions RecursiveDoublingOnly() {
  UcxOptions o;
  o.small_message_bytes = 0;
  o.recursive_doubling_bytes = 64 << 20;
  o.use_shared_memory = false;
  o.opening = UcxOptions::Opening::kRecursiveDoubling;
  o.measured_choice_bytes = 0;  // no other candidate
  return o;
}

// Rabenseifner for every AllReduce where the world is a power of two of at
// least 4 ranks (Note [Rabenseifner]): counts below the world leave some
// segments empty. Other worlds run the ring.
UcxOptions RabenseifnerOnly() {
  UcxOptions o;
  o.small_message_bytes = 0;
  o.recursive_doubling_bytes = 0;
  o.rabenseifner_bytes = 64 << 20;
  o.use_shared_memory = false;
  o.opening = UcxOptions::Opening::kRecursiveDoubling;
  o.measured_choice_bytes = 0;  // no other candidate
  return o;
}

// The linear round opening every collective, as where a machine runs more
// ranks than cores (Note [Linear round]): AllReduce up to 4 KiB inside it,
// larger recursive doubling with the linear round watched beside it.
UcxOptions LinearOpening() {
  UcxOptions o;
  o.use_shared_memory = false;
  o.opening = UcxOptions::Opening::kLinear;
  o.linear_bytes = 4 << 10;
  o.measured_choice_bytes = 0;  // the static table's algorithms
  return o;
}

// The shared-memory allreduce for everything, in tiny rounds, so that slot
// reuse across rounds and collectives, empty sub-blocks and partial rounds
// are exercised on small buffers.
UcxOptions ShmOnly() {
  UcxOptions o;
  o.small_message_bytes = 0;
  o.shm_chunk_bytes = 64;
  return o;
}

void CheckAllReduce(int rank, int world, Communicator& comm, size_t count,
                    DataType type, ReduceOp op, bool in_place) {
  const size_t bytes = count * DataTypeSize(type);
  std::vector<unsigned char> in(bytes + 1), out(bytes + 1, 0xAB), want(bytes + 1);
  FillInput(in.data(), count, type, op, rank);
  FillExpected(want.data(), count, type, op, world);
  absl::Status s;
  if (in_place) {
    s = AllReduceSync(comm, in.data(), in.data(), count, type, op);
    out = in;
  } else {
    s = AllReduceSync(comm, in.data(), out.data(), count, type, op);
    EXPECT_EQ(out[bytes], 0xAB) << "wrote past the end";
  }
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(CountMismatches(out.data(), want.data(), count, type), 0u)
      << "rank " << rank << "/" << world << " count=" << count << " "
      << DataTypeName(type) << " " << ReduceOpName(op) << (in_place ? " in-place" : " out-of-place");
}

class UcxAllReduceTest : public ::testing::TestWithParam<int> {};

TEST_P(UcxAllReduceTest, EveryTypeAndOpSmallSizes) {
  const int world = GetParam();
  for (const UcxOptions& options : {UcxOptions{}, RingOnly(), ShmOnly(), RecursiveDoublingOnly(),
                                    RabenseifnerOnly(), LinearOpening()}) {
    RunRanks(world, options, [&](int rank, Communicator& comm) {
      // 4096 and 4097 doubles lie either side of the 32 KiB that ride in the
      // shared-memory exchange where ranks outnumber cores.
      for (size_t count : {0, 1, 7, 1023, 4096, 4097}) {
        for (int t = 0; t < kNumDataTypes; ++t) {
          for (int o = 0; o < kNumReduceOps; ++o) {
            for (bool in_place : {false, true}) {
              CheckAllReduce(rank, world, comm, count, static_cast<DataType>(t),
                             static_cast<ReduceOp>(o), in_place);
            }
          }
        }
      }
    });
  }
}

// Every type (sum) and every op (float32) on (1 << 20) + 3 elements, in
// place and out of place by turns.
void CheckMillionPlusThree(int world, const UcxOptions& options) {
  constexpr size_t kCount = (1u << 20) + 3;
  RunRanks(world, options, [&](int rank, Communicator& comm) {
    for (int t = 0; t < kNumDataTypes; ++t) {
      CheckAllReduce(rank, world, comm, kCount, static_cast<DataType>(t), ReduceOp::kSum,
                     t % 2 == 0);
    }
    for (int o = 0; o < kNumReduceOps; ++o) {
      CheckAllReduce(rank, world, comm, kCount, DataType::kFloat32, static_cast<ReduceOp>(o),
                     o % 2 == 1);
    }
  });
}

TEST_P(UcxAllReduceTest, MillionPlusThreeElements) {
  CheckMillionPlusThree(GetParam(), UcxOptions{});
}

TEST_P(UcxAllReduceTest, MillionPlusThreeElementsOverTheRing) {
  UcxOptions ring;
  ring.use_shared_memory = false;
  CheckMillionPlusThree(GetParam(), ring);
  CheckMillionPlusThree(GetParam(), LinearOpening());  // the ring after the linear round
}

TEST_P(UcxAllReduceTest, MillionPlusThreeElementsByRecursiveDoubling) {
  CheckMillionPlusThree(GetParam(), RecursiveDoublingOnly());
}

TEST_P(UcxAllReduceTest, MillionPlusThreeElementsByRabenseifner) {
  CheckMillionPlusThree(GetParam(), RabenseifnerOnly());
  // The linear round watched beside the halving exchanges.
  UcxOptions linear = LinearOpening();
  linear.rabenseifner_bytes = 64 << 20;
  CheckMillionPlusThree(GetParam(), linear);
}

// Floats whose sums are not exact, different on every rank.
std::vector<float> InexactInput(int rank, size_t count) {
  std::vector<float> x(count);
  uint32_t state = 2654435761u * static_cast<uint32_t>(rank + 1);
  for (float& v : x) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<float>(state >> 8) * 1e-7f * ((state & 1) ? 1.0f : -3.0f);
  }
  return x;
}

// Sums of floats that are not exact: every rank must still hold the same
// bits (both partners of an exchange combine in the same order; in the
// linear round rank 0 reduces and sends its bits).
TEST_P(UcxAllReduceTest, RecursiveDoublingGivesEveryRankTheSameBits) {
  const int world = GetParam();
  constexpr size_t kCount = 3001;
  UcxOptions linear = LinearOpening();
  linear.linear_bytes = kCount * sizeof(float);
  for (const UcxOptions& options : {RecursiveDoublingOnly(), RabenseifnerOnly(), linear}) {
    RunRanks(world, options, [&](int rank, Communicator& comm) {
      std::vector<float> x = InexactInput(rank, kCount);
      ASSERT_TRUE(
          AllReduceSync(comm, x.data(), x.data(), kCount, DataType::kFloat32, ReduceOp::kSum).ok());
      std::vector<float> all(kCount * world);
      auto w = comm.AllGather(x.data(), all.data(), kCount, DataType::kFloat32);
      ASSERT_TRUE(w.ok()) << w.status();
      ASSERT_TRUE((*w)->Wait().ok());
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(std::memcmp(all.data() + r * kCount, x.data(), kCount * sizeof(float)), 0)
            << "rank " << rank << " and rank " << r << " differ";
      }
      // The linear round reduces at rank 0 in rank order: (x0 + x1) + x2 ...
      if (options.opening == UcxOptions::Opening::kLinear) {
        std::vector<float> want = InexactInput(0, kCount);
        for (int r = 1; r < world; ++r) {
          const std::vector<float> in = InexactInput(r, kCount);
          for (size_t i = 0; i < kCount; ++i) want[i] += in[i];
        }
        EXPECT_EQ(std::memcmp(want.data(), x.data(), kCount * sizeof(float)), 0)
            << "rank " << rank << ": not the sum in rank order";
      }
    });
  }
}

// Eight ranks, three halvings: every type and op (Avg divides each segment
// once), counts below, at and above the world and an odd split.
TEST(UcxCommunicatorTest, RabenseifnerIsExactAtEightRanks) {
  RunRanks(8, RabenseifnerOnly(), [&](int rank, Communicator& comm) {
    for (size_t count : {1, 7, 8, 9, 30011}) {
      for (int t = 0; t < kNumDataTypes; ++t) {
        for (int o = 0; o < kNumReduceOps; ++o) {
          CheckAllReduce(rank, 8, comm, count, static_cast<DataType>(t), static_cast<ReduceOp>(o),
                         (t + o) % 2 == 0);
        }
      }
    }
  });
}

// Rabenseifner combines every element by recursive doubling's tree (block
// 2^k with block 2^k, the lower first), once: on sums that are not exact it
// must give recursive doubling's bits, in every segment of an uneven split.
TEST(UcxCommunicatorTest, RabenseifnerGivesRecursiveDoublingsBits) {
  for (int world : {4, 8}) {
    for (size_t count : {size_t{7}, size_t{30011}}) {
      std::vector<std::vector<float>> by_doubling(world), by_halving(world);
      for (const bool halving : {false, true}) {
        RunRanks(world, halving ? RabenseifnerOnly() : RecursiveDoublingOnly(),
                 [&](int rank, Communicator& comm) {
                   std::vector<float> x = InexactInput(rank, count);
                   ASSERT_TRUE(AllReduceSync(comm, x.data(), x.data(), count, DataType::kFloat32,
                                             ReduceOp::kSum)
                                   .ok());
                   (halving ? by_halving : by_doubling)[rank] = std::move(x);
                 });
      }
      // The tree itself, computed here: what both must give.
      std::vector<std::vector<float>> block(world);
      for (int r = 0; r < world; ++r) block[r] = InexactInput(r, count);
      for (int width = 1; width < world; width *= 2) {
        for (int lo = 0; lo < world; lo += 2 * width) {
          for (size_t i = 0; i < count; ++i) block[lo][i] += block[lo + width][i];
        }
      }
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ(by_halving[r].size(), count);
        EXPECT_EQ(std::memcmp(by_halving[r].data(), block[0].data(), count * sizeof(float)), 0)
            << "world " << world << " count " << count << " rank " << r << ": Rabenseifner";
        EXPECT_EQ(std::memcmp(by_doubling[r].data(), block[0].data(), count * sizeof(float)), 0)
            << "world " << world << " count " << count << " rank " << r << ": doubling";
      }
    }
  }
}

TEST(UcxCommunicatorTest, SixtyFourMegabytes) {
  // Two and three ranks: an even and an odd split of 64 MB into segments.
  constexpr size_t kCount = (64u << 20) / 4;
  UcxOptions ring;
  ring.use_shared_memory = false;
  for (int world : {2, 3}) {
    for (const UcxOptions& options : {UcxOptions{}, ring}) {
      RunRanks(world, options, [&](int rank, Communicator& comm) {
        CheckAllReduce(rank, world, comm, kCount, DataType::kFloat32, ReduceOp::kSum, false);
        CheckAllReduce(rank, world, comm, kCount, DataType::kFloat32, ReduceOp::kSum, true);
      });
    }
  }
}

TEST_P(UcxAllReduceTest, BroadcastFromEveryRoot) {
  const int world = GetParam();
  for (const UcxOptions& options : {UcxOptions{}, RingOnly(), LinearOpening()}) {
    RunRanks(world, options, [&](int rank, Communicator& comm) {
      for (size_t count : {0, 1, 1023, 300000}) {
        for (int root = 0; root < world; ++root) {
          std::vector<int32_t> buf(count), want(count);
          for (size_t i = 0; i < count; ++i) want[i] = static_cast<int32_t>(i * 31 + root);
          if (rank == root) buf = want;
          auto w = comm.Broadcast(buf.data(), count, DataType::kInt32, root);
          ASSERT_TRUE(w.ok()) << w.status();
          absl::Status ws = (*w)->Wait();
          ASSERT_TRUE(ws.ok()) << ws;
          EXPECT_EQ(buf, want) << "root " << root << " count " << count;
        }
      }
    });
  }
}

TEST_P(UcxAllReduceTest, AllGatherInPlaceAndOutOfPlace) {
  const int world = GetParam();
  for (const UcxOptions& options : {UcxOptions{}, RingOnly(), LinearOpening()}) {
    RunRanks(world, options, [&](int rank, Communicator& comm) {
      for (size_t count : {0, 1, 7, 5000, 200003}) {
        std::vector<double> want(count * world);
        for (int r = 0; r < world; ++r) {
          for (size_t i = 0; i < count; ++i) want[r * count + i] = r * 1000.0 + i;
        }
        std::vector<double> mine(want.begin() + rank * count, want.begin() + (rank + 1) * count);
        std::vector<double> out(count * world, -1);
        auto w = comm.AllGather(mine.data(), out.data(), count, DataType::kFloat64);
        ASSERT_TRUE(w.ok() && (*w)->Wait().ok());
        EXPECT_EQ(out, want) << "out-of-place count " << count;
        std::vector<double> inplace(count * world, -1);
        std::copy(mine.begin(), mine.end(), inplace.begin() + rank * count);
        w = comm.AllGather(inplace.data() + rank * count, inplace.data(), count, DataType::kFloat64);
        ASSERT_TRUE(w.ok() && (*w)->Wait().ok());
        EXPECT_EQ(inplace, want) << "in-place count " << count;
      }
    });
  }
}

TEST_P(UcxAllReduceTest, ManyOutstandingCollectivesCompleteInOrder) {
  const int world = GetParam();
  RunRanks(world, UcxOptions{}, [&](int rank, Communicator& comm) {
    constexpr int kOps = 40;
    std::vector<std::vector<int64_t>> bufs(kOps);
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < kOps; ++k) {
      bufs[k].assign(k % 2 == 0 ? 3 : 70000, rank + k);
      auto w = comm.AllReduce(bufs[k].data(), bufs[k].data(), bufs[k].size(),
                              DataType::kInt64, ReduceOp::kSum);
      ASSERT_TRUE(w.ok());
      works.push_back(*w);
    }
    ASSERT_TRUE(BarrierSync(comm).ok());
    for (int k = 0; k < kOps; ++k) {
      ASSERT_TRUE(works[k]->Test()) << "op " << k << " not done after a later barrier";
      ASSERT_TRUE(works[k]->status().ok());
      const int64_t want = static_cast<int64_t>(world) * (world - 1) / 2 + int64_t{world} * k;
      for (int64_t v : bufs[k]) ASSERT_EQ(v, want);
    }
  });
}

TEST_P(UcxAllReduceTest, BlockingFormsAreExactAndFinishAfterCallsIssuedBeforeThem) {
  const int world = GetParam();
  RunRanks(world, UcxOptions{}, [&](int rank, Communicator& comm) {
    // A large call issued first is still running when the blocking ones
    // come; they queue behind it. Later ones find nothing ahead and run on
    // this thread.
    std::vector<int64_t> big(70000, rank);
    auto w = comm.AllReduce(big.data(), big.data(), big.size(), DataType::kInt64, ReduceOp::kSum);
    ASSERT_TRUE(w.ok());
    for (int round = 0; round < 3; ++round) {
      std::vector<int64_t> small(3, rank + round), sum(3, -1);
      ASSERT_TRUE(
          comm.AllReduceBlocking(small.data(), sum.data(), 3, DataType::kInt64, ReduceOp::kMax)
              .ok());
      if (round == 0) {
        ASSERT_TRUE((*w)->Test()) << "the blocking call finished before an earlier one";
      }
      for (int64_t v : sum) ASSERT_EQ(v, world - 1 + round);
      std::vector<int32_t> b(5, rank == world - 1 ? 7 + round : -1);
      ASSERT_TRUE(comm.BroadcastBlocking(b.data(), 5, DataType::kInt32, world - 1).ok());
      for (int32_t v : b) ASSERT_EQ(v, 7 + round);
      std::vector<int64_t> all(world, -1);
      const int64_t mine = 10 * rank + round;
      ASSERT_TRUE(comm.AllGatherBlocking(&mine, all.data(), 1, DataType::kInt64).ok());
      for (int r = 0; r < world; ++r) ASSERT_EQ(all[r], 10 * r + round);
      ASSERT_TRUE(comm.BarrierBlocking().ok());
    }
    for (int64_t v : big) ASSERT_EQ(v, int64_t{world} * (world - 1) / 2);
  });
}

// What one rank calls differently in the mismatch tests below.
enum class Odd {
  kLinearCount,
  kRecursiveDoublingCount,
  kRabenseifnerCount,  // the ring where the world is not a power of two
  kRingCount,
  kBarrier,
  kBroadcast
};

// Runs `world` ranks over TCP messages under `opening`, where every rank
// calls AllReduce of `common` floats except `odd_rank`, which calls `odd`,
// and expects every rank to fail with the same message naming rank 0's
// call and that of the lowest rank whose call differs, with no buffer
// written.
void ExpectMismatchFailsEveryRank(int world, UcxOptions::Opening opening, size_t common,
                                  int odd_rank, Odd odd) {
  const size_t kOddCounts[] = {100, 5000, 100000, 2000000, 0, 0};
  const bool data = odd < Odd::kBarrier;
  const size_t odd_count = kOddCounts[static_cast<int>(odd)];
  UcxOptions o;
  o.use_shared_memory = false;
  o.opening = opening;
  o.linear_bytes = 4 << 10;  // 10 floats ride in the linear round, 4000 do not
  // 30000 floats (120 KB) run Rabenseifner where the world is a power of
  // two of 4 or more; 2000000 (8 MB) the ring.
  o.recursive_doubling_bytes = 64 << 10;
  o.rabenseifner_bytes = 512 << 10;
  // TCP, as across hosts. (Over UCX's SysV transport, ranks that are threads
  // of one process write into one receiver's FIFO elements, handed over by
  // atomics inside uninstrumented libuct, which TSan reports as a race.)
  o.transports = "tcp,self";
  o.timeout = absl::Seconds(60);  // a rank left waiting fails the test, not hangs it
  std::vector<std::string> messages(world);
  RunRanks(world, o, [&](int rank, Communicator& comm) {
    const bool me = rank == odd_rank;
    const size_t count = me && data ? odd_count : common;
    std::vector<float> buf(count, static_cast<float>(rank + 1));
    absl::Status s;
    if (me && odd == Odd::kBarrier) {
      s = BarrierSync(comm);
    } else if (me && odd == Odd::kBroadcast) {
      auto w = comm.Broadcast(buf.data(), count, DataType::kFloat32, 0);
      s = w.ok() ? (*w)->Wait() : w.status();
    } else {
      std::vector<float> out(count, -1.0f);
      s = AllReduceSync(comm, buf.data(), out.data(), count, DataType::kFloat32, ReduceOp::kSum);
      for (float v : out) ASSERT_EQ(v, -1.0f) << "rank " << rank << ": output written";
    }
    for (float v : buf) ASSERT_EQ(v, static_cast<float>(rank + 1)) << "rank " << rank;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "rank " << rank << ": " << s;
    messages[rank] = std::string(s.message());
  });
  const std::string called =
      absl::StrCat("AllReduce(count=", common, ", type=float, op=sum, seq=0)");
  const std::string other = odd == Odd::kBarrier ? "Barrier(count=0, seq=0)"
                            : odd == Odd::kBroadcast
                                ? absl::StrCat("Broadcast(count=", common, ", type=float, root=0")
                                : absl::StrCat("AllReduce(count=", odd_count, ", type=float");
  const std::string want = odd_rank == 0 ? absl::StrCat("rank 0 called ", other)
                                         : absl::StrCat("rank 0 called ", called, " but rank ",
                                                        odd_rank, " called ", other);
  SCOPED_TRACE(absl::StrCat("opening ", static_cast<int>(opening), ", common count ", common,
                            ", world ", world, ", rank ", odd_rank, " odd, case ",
                            static_cast<int>(odd)));
  EXPECT_NE(messages[0].find(want), std::string::npos) << messages[0];
  if (odd_rank == 0) {
    EXPECT_NE(messages[0].find(absl::StrCat("but rank 1 called ", called)), std::string::npos)
        << messages[0];
  }
  for (int r = 1; r < world; ++r) EXPECT_EQ(messages[r], messages[0]) << "rank " << r;
}

// Over messages (the descriptor round, or the linear round where it opens),
// a collective that one rank calls differently (rank 0 included) fails on
// every rank with one message, naming rank 0's call and that of the lowest
// rank whose call differs, and no buffer is written: for counts that differ
// inside and across the algorithms' ranges (linear, recursive doubling,
// Rabenseifner, ring), and a Barrier or a Broadcast against an AllReduce.
// Under the linear opening the others call a linear count, then a
// recursive-doubling one, so that both a rank 0 that judges in the linear
// round and one that watches it beside recursive doubling are met.
TEST_P(UcxAllReduceTest, OverMessagesAMismatchFailsEveryRankWithTheSameMessage) {
  const int world = GetParam();
  if (world < 2) GTEST_SKIP() << "a mismatch needs two ranks";
  struct Case {
    UcxOptions::Opening opening;
    size_t common;  // what the other ranks call
  };
  for (const Case c :
       {Case{UcxOptions::Opening::kRecursiveDoubling, 10}, Case{UcxOptions::Opening::kLinear, 10},
        Case{UcxOptions::Opening::kLinear, 4000},
        Case{UcxOptions::Opening::kRecursiveDoubling, 30000},
        Case{UcxOptions::Opening::kLinear, 30000}}) {
    for (int odd_rank = 0; odd_rank < world; ++odd_rank) {
      for (Odd odd : {Odd::kLinearCount, Odd::kRecursiveDoublingCount, Odd::kRabenseifnerCount,
                      Odd::kRingCount, Odd::kBarrier, Odd::kBroadcast}) {
        if (odd >= Odd::kBarrier && odd_rank != world - 1) continue;
        ExpectMismatchFailsEveryRank(world, c.opening, c.common, odd_rank, odd);
      }
    }
  }
}

// At 8 ranks Rabenseifner halves three times, so a rank that calls
// something else sits in a block of 1, 2 or 4 at each exchange: the odd
// rank at either end and in the middle of each half, against a common
// Rabenseifner count, under both openings.
TEST(UcxCommunicatorTest, AMismatchBesideRabenseifnerFailsEveryRankAtEightRanks) {
  for (UcxOptions::Opening opening :
       {UcxOptions::Opening::kRecursiveDoubling, UcxOptions::Opening::kLinear}) {
    for (int odd_rank : {0, 3, 4, 7}) {
      for (Odd odd : {Odd::kRecursiveDoublingCount, Odd::kRabenseifnerCount, Odd::kRingCount}) {
        ExpectMismatchFailsEveryRank(8, opening, 30000, odd_rank, odd);
      }
    }
    ExpectMismatchFailsEveryRank(8, opening, 30000, 7, Odd::kBarrier);
  }
}

// Note [Beginning on the issuing thread]: non-blocking AllReduces issued to
// an idle communicator on one host, begun by their issuer (issuer_begins
// on) or not (off), give the exact result at sizes that ride in the header
// round, that take one shared-memory round and several, in place and out
// of place.
TEST_P(UcxAllReduceTest, NonBlockingCallsBegunByTheirIssuerAreExact) {
  const int world = GetParam();
  for (auto begins : {UcxOptions::IssuerBegins::kOn, UcxOptions::IssuerBegins::kOff}) {
    for (UcxOptions options : {UcxOptions{}, ShmOnly()}) {
      options.issuer_begins = begins;
      RunRanks(world, options, [&](int rank, Communicator& comm) {
        for (size_t count : {0, 1, 7, 1023, 4097, 70000}) {
          for (int t = 0; t < kNumDataTypes; ++t) {
            const auto type = static_cast<DataType>(t);
            const ReduceOp op = t % 2 == 0 ? ReduceOp::kSum : ReduceOp::kAvg;
            const bool in_place = (t + count) % 2 == 0;
            const size_t bytes = count * DataTypeSize(type);
            std::vector<unsigned char> in(bytes + 1), out(bytes + 1, 0xAB), want(bytes + 1);
            FillInput(in.data(), count, type, op, rank);
            FillExpected(want.data(), count, type, op, world);
            unsigned char* dst = in_place ? in.data() : out.data();
            // Run on its caller: the core is idle when the next call comes.
            ASSERT_TRUE(BarrierSync(comm).ok());
            auto w = comm.AllReduce(in.data(), dst, count, type, op);
            ASSERT_TRUE(w.ok()) << w.status();
            ASSERT_TRUE((*w)->Wait().ok()) << (*w)->status();
            EXPECT_EQ(CountMismatches(dst, want.data(), count, type), 0u)
                << "rank " << rank << "/" << world << " count " << count << " "
                << DataTypeName(type) << (in_place ? " in place" : " out of place");
            if (!in_place) {
              EXPECT_EQ(out[bytes], 0xAB) << "wrote past the end";
            }
          }
        }
      });
    }
  }
}

// Shared-memory rounds of `chunk` bytes a rank, so that staging the first
// round copies (p - 1) chunks: where the issuer begins, Issue does that copy
// itself, on the issuing thread's own CPU time (at least the time of such a
// copy at 100 GB/s). Where the progress thread starts the call, Issue only
// queues it (a few microseconds of CPU; time the issuer spends preempted
// does not count).
UcxOptions BigShmRounds(size_t chunk) {
  UcxOptions o;
  o.shm_chunk_bytes = chunk;
  o.cma_min_bytes = 0;  // staged rounds at every size (no single copy)
  o.issuer_begins = UcxOptions::IssuerBegins::kOn;
  return o;
}
int64_t FirstRoundCopyNs(int world, size_t chunk) {
  return static_cast<int64_t>((world - 1) * chunk / 100);  // ns at 100 GB/s
}

int64_t ThreadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// Whether this communicator runs the shared-memory allreduce (UCX may come
// up without it where the machine has no shared-memory transport).
bool HasShmAllReduce(const Communicator& comm) {
  return absl::StrContains(comm.Algorithms(), "shm-allreduce");
}

// Note [Single-copy allreduce]: from cma_min_bytes on, where every rank can
// read every other by cross-memory attach (here ranks are threads of one
// process, so the kernel allows it wherever it allows a process to read
// itself), AllReduce reads the peers in place; Algorithms() says so, and
// the results are exact at 2 and 3 ranks, in place and not, around the
// threshold. With cma_min_bytes 0 every call stages, and Algorithms() says
// why.
TEST(UcxCommunicatorTest, LargeAllReducesReadThePeersInPlaceWhereTheKernelAllowsIt) {
  const int word = 7;
  const bool allowed =
      ucx::ProbeCrossMemoryAttach(getpid(), reinterpret_cast<uintptr_t>(&word), &word, sizeof(word))
          .ok();
  UcxOptions single;
  single.cma_min_bytes = 256 << 10;
  UcxOptions staged;
  staged.cma_min_bytes = 0;
  for (int world : {2, 3}) {
    RunRanks(world, single, [&](int rank, Communicator& comm) {
      if (!HasShmAllReduce(comm)) return;
      EXPECT_TRUE(absl::StrContains(comm.Algorithms(),
                                    allowed ? "Single copy: on, shm-allreduce of 262144 to "
                                            : "Single copy: off"))
          << comm.Algorithms();
      for (size_t count : {size_t{(256 << 10) / 4 - 1}, size_t{(256 << 10) / 4},
                           size_t{(1 << 20) + 3}}) {
        CheckAllReduce(rank, world, comm, count, DataType::kFloat32, ReduceOp::kSum, false);
        CheckAllReduce(rank, world, comm, count, DataType::kFloat32, ReduceOp::kSum, true);
      }
      CheckAllReduce(rank, world, comm, (1 << 20) + 3, DataType::kFloat64, ReduceOp::kAvg, true);
      CheckAllReduce(rank, world, comm, (1 << 20) + 3, DataType::kInt32, ReduceOp::kMax, false);
    });
  }
  RunRanks(2, staged, [&](int rank, Communicator& comm) {
    if (!HasShmAllReduce(comm)) return;
    EXPECT_TRUE(absl::StrContains(comm.Algorithms(), "Single copy: off (cma off on rank "))
        << comm.Algorithms();
    CheckAllReduce(rank, 2, comm, (1 << 20) + 3, DataType::kFloat32, ReduceOp::kSum, true);
  });
}

TEST(UcxCommunicatorTest, TheIssuerStagesTheFirstRoundOfACallToAnIdleCommunicator) {
  constexpr size_t kChunk = 4 << 20;
  RunRanks(2, BigShmRounds(kChunk), [&](int rank, Communicator& comm) {
    if (!HasShmAllReduce(comm)) GTEST_SKIP() << "no shared-memory allreduce: " << comm.Algorithms();
    constexpr size_t kCount = (8 << 20) / sizeof(float) + 5;  // two rounds and a bit
    for (int i = 0; i < 5; ++i) {
      std::vector<float> buf(kCount, static_cast<float>(rank + i));
      ASSERT_TRUE(BarrierSync(comm).ok());
      const int64_t before = Work::SteadyNowNs();
      const int64_t cpu = ThreadCpuNs();
      auto w = comm.AllReduce(buf.data(), buf.data(), kCount, DataType::kFloat32, ReduceOp::kSum);
      const int64_t issue_cpu = ThreadCpuNs() - cpu;
      ASSERT_TRUE(w.ok()) << w.status();
      ASSERT_TRUE((*w)->Wait().ok()) << (*w)->status();
      EXPECT_GE(issue_cpu, FirstRoundCopyNs(2, kChunk)) << "rank " << rank << " call " << i;
      // Marked started by the issuer as it began.
      EXPECT_GE((*w)->started_ns(), before);
      const float want = static_cast<float>(1 + 2 * i);
      size_t wrong = 0;
      for (float v : buf) wrong += v != want;
      EXPECT_EQ(wrong, 0u) << "rank " << rank << " call " << i;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, UcxAllReduceTest, ::testing::Values(1, 2, 3, 4, 5),
                         [](const auto& info) { return absl::StrCat("World", info.param); });

TEST(UcxCommunicatorTest, MismatchedCountsFailOnEveryRankNamingBoth) {
  for (size_t big : {100, 1000000}) {  // one-shot and ring sizes
    RunRanks(3, UcxOptions{}, [&](int rank, Communicator& comm) {
      const size_t count = rank == 1 ? big : 10;
      std::vector<float> buf(count, 1.0f);
      absl::Status s = AllReduceSync(comm, buf.data(), buf.data(), count,
                                     DataType::kFloat32, ReduceOp::kSum);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_NE(s.message().find("count=10"), std::string::npos) << s;
      EXPECT_NE(s.message().find(absl::StrCat("count=", big)), std::string::npos) << s;
      EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s;
    });
  }
}

// A mismatch is found on every rank when the calls were begun by their
// issuers (Note [Beginning on the issuing thread]): the headers published
// by Begin are compared in Start as always, also by a rank whose first
// round is staged (rank 1 at the larger size: checked as in the test
// above).
TEST(UcxCommunicatorTest, MismatchedCountsBegunByTheirIssuersFailOnEveryRankNamingBoth) {
  constexpr size_t kChunk = 2 << 20;
  for (size_t big : {100, 3000000}) {  // one-shot and shared-memory sizes
    RunRanks(3, BigShmRounds(kChunk), [&](int rank, Communicator& comm) {
      ASSERT_TRUE(BarrierSync(comm).ok());
      const size_t count = rank == 1 ? big : 10;
      std::vector<float> buf(count, 1.0f);
      const int64_t cpu = ThreadCpuNs();
      auto w = comm.AllReduce(buf.data(), buf.data(), count, DataType::kFloat32, ReduceOp::kSum);
      const int64_t issue_cpu = ThreadCpuNs() - cpu;
      ASSERT_TRUE(w.ok()) << w.status();
      absl::Status s = (*w)->Wait();
      if (rank == 1 && big > 100 && HasShmAllReduce(comm)) {
        EXPECT_GE(issue_cpu, FirstRoundCopyNs(3, kChunk));
      }
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_NE(s.message().find("count=10"), std::string::npos) << s;
      EXPECT_NE(s.message().find(absl::StrCat("count=", big)), std::string::npos) << s;
      EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s;
    });
  }
}

// Note [Recursive doubling or Rabenseifner]: over messages at 4 ranks,
// AllReduce runs recursive doubling up to the switch point (32 KiB by
// default, or as given) and Rabenseifner above it, on every rank alike, and
// both give every rank the exact sum.
TEST(UcxCommunicatorTest, TheSwitchPointSplitsRecursiveDoublingAndRabenseifner) {
  for (size_t given : {size_t{0}, size_t{12345}}) {
    UcxOptions o;
    o.use_shared_memory = false;
    o.transports = "tcp,self";
    if (given > 0) o.rabenseifner_from_bytes = given;
    const size_t from = given > 0 ? given : size_t{32} << 10;
    constexpr int kWorld = 4;
    std::vector<std::string> tables(kWorld);
    RunRanks(kWorld, o, [&](int rank, Communicator& comm) {
      tables[rank] = comm.Algorithms();
      for (size_t count : {from / 4, from / 4 + 1, size_t{20000}}) {
        std::vector<float> in(count), out(count, -1.0f), want(count);
        for (size_t i = 0; i < count; ++i) {
          in[i] = static_cast<float>((rank + 1) * (i % 7));
          want[i] = static_cast<float>(10 * (i % 7));  // (1 + 2 + 3 + 4) * (i % 7)
        }
        absl::Status s =
            AllReduceSync(comm, in.data(), out.data(), count, DataType::kFloat32, ReduceOp::kSum);
        ASSERT_TRUE(s.ok()) << s;
        ASSERT_EQ(out, want) << "rank " << rank << ", count " << count;
      }
    });
    for (int r = 1; r < kWorld; ++r) EXPECT_EQ(tables[r], tables[0]) << "rank " << r;
    EXPECT_NE(tables[0].find(absl::StrCat("0-", from, " B recursive-doubling, ", from + 1,
                                          "-524288 B rabenseifner")),
              std::string::npos)
        << tables[0];
  }
}

TEST(UcxCommunicatorTest, MismatchedTypesFailNamingBoth) {
  RunRanks(2, UcxOptions{}, [&](int rank, Communicator& comm) {
    std::vector<double> buf(16, 1.0);
    const DataType type = rank == 0 ? DataType::kFloat64 : DataType::kInt64;
    absl::Status s = AllReduceSync(comm, buf.data(), buf.data(), 16, type, ReduceOp::kSum);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("type=double"), std::string::npos) << s;
    EXPECT_NE(s.message().find("type=int64"), std::string::npos) << s;
  });
}

TEST(UcxCommunicatorTest, BadArgumentsAreRejectedBeforeIssuing) {
  RunRanks(2, UcxOptions{}, [&](int rank, Communicator& comm) {
    auto w = comm.AllReduce(nullptr, nullptr, 5, DataType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(w.status().message().find("null buffer"), std::string::npos);
    float x = 1;
    w = comm.AllReduce(&x, &x, 1, static_cast<DataType>(17), ReduceOp::kSum);
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
    w = comm.AllReduce(&x, &x, 1, DataType::kFloat32, static_cast<ReduceOp>(17));
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
    w = comm.Broadcast(&x, 1, DataType::kFloat32, 2);
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
    // Nothing was issued: the sequence stays aligned and a real call works.
    EXPECT_TRUE(AllReduceSync(comm, &x, &x, 1, DataType::kFloat32, ReduceOp::kSum).ok());
    EXPECT_EQ(x, 2.0f);
  });
}

TEST(UcxCommunicatorTest, MissingPeerAtRendezvousNamesIt) {
  MemoryStore store;
  UcxOptions options;
  options.rendezvous_timeout = absl::Milliseconds(300);
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(2);
  for (int r = 0; r < 2; ++r) {  // world of 3; rank 2 never arrives
    threads.emplace_back([&, r] {
      results[r] = CreateUcxCommunicator(options, r, 3, store).status();
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : results) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_NE(s.message().find("2"), std::string::npos) << s;
  }
}

TEST(UcxCommunicatorTest, DestroyingWithAStuckCollectiveDoesNotHang) {
  // Rank 0 issues an AllReduce that rank 1 never joins: waiting with a
  // deadline times out, and destroying rank 0's communicator cancels the
  // collective instead of hanging.
  RunRanks(2, UcxOptions{}, [&](int rank, Communicator& comm) {
    if (rank == 0) {
      float x = 1;
      auto w = comm.AllReduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum);
      ASSERT_TRUE(w.ok());
      EXPECT_EQ((*w)->WaitFor(absl::Milliseconds(100)).code(),
                absl::StatusCode::kDeadlineExceeded);
    } else {
      absl::SleepFor(absl::Milliseconds(400));  // outlive rank 0's wait
    }
  });
}

TEST(UcxCommunicatorTest, PeerThatLeavesFailsTheCollective) {
  UcxOptions options;
  options.detect_peer_failure = true;
  RunRanks(2, options, [&](int rank, Communicator& comm) {
    if (rank == 1) return;  // destroys its communicator at once
    std::vector<float> x(1 << 20, 1.0f);  // ring path
    absl::Time start = absl::Now();
    auto w = comm.AllReduce(x.data(), x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
    ASSERT_TRUE(w.ok());
    absl::Status s = (*w)->WaitFor(absl::Seconds(20));
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
    // The communicator stays failed rather than desynchronised.
    float y = 1;
    EXPECT_EQ(AllReduceSync(comm, &y, &y, 1, DataType::kFloat32, ReduceOp::kSum).code(),
              absl::StatusCode::kFailedPrecondition);
  });
}

// Whether a failure's post-mortem says rank 1 did not report, alone ("rank 1
// did not report") or in a list ("ranks 1, 2, 3 did not report").
bool PostMortemNamesRankOne(absl::string_view m) {
  if (absl::StrContains(m, "post-mortem: rank 1 did not report")) return true;
  constexpr absl::string_view kList = "post-mortem: ranks ";
  const size_t at = m.find(kList);
  if (at == absl::string_view::npos) return false;
  const size_t end = m.find(" did not report", at);
  if (end == absl::string_view::npos) return false;
  const std::vector<absl::string_view> ranks =
      absl::StrSplit(m.substr(at + kList.size(), end - at - kList.size()), ", ");
  return std::find(ranks.begin(), ranks.end(), "1") != ranks.end();
}

TEST(UcxCommunicatorTest, PostMortemCheckWantsRankOneItself) {
  EXPECT_TRUE(PostMortemNamesRankOne("...; post-mortem: rank 1 did not report within 2s"));
  EXPECT_TRUE(PostMortemNamesRankOne("...; post-mortem: ranks 1, 2, 3 did not report within 2s"));
  EXPECT_TRUE(PostMortemNamesRankOne("...; post-mortem: ranks 0, 1 did not report within 2s"));
  EXPECT_FALSE(PostMortemNamesRankOne("...; post-mortem: ranks 0, 2 did not report within 2s"));
  EXPECT_FALSE(PostMortemNamesRankOne("...; post-mortem: ranks 11, 21 did not report"));
  EXPECT_FALSE(PostMortemNamesRankOne("...; post-mortem: rank 2 did not report"));
}

TEST(UcxCommunicatorTest, PeerThatLeavesFailsTheCollectiveOnEveryRank) {
  // Four ranks, rank 1 leaves: ranks that are not its ring neighbours must
  // fail too, not wait for their deadline: the failure spreads through the
  // ring (Unavailable) or a neighbour's failure notice (Aborted), and the
  // post-mortem names rank 1 on every rank.
  UcxOptions options;
  options.detect_peer_failure = true;
  RunRanks(4, options, [&](int rank, Communicator& comm) {
    if (rank == 1) return;
    std::vector<float> x(1 << 20, 1.0f);
    const absl::Time start = absl::Now();
    auto w = comm.AllReduce(x.data(), x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
    ASSERT_TRUE(w.ok());
    absl::Status s = (*w)->WaitFor(absl::Seconds(30));
    EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsAborted(s)) << "rank " << rank << ": " << s;
    // On a slow machine (ThreadSanitizer, 4 ranks on 2 cores) a survivor
    // that notices the failure late can miss the post-mortem's grace too and
    // be listed beside rank 1 ("ranks 1, 2, 3 did not report"); rank 1 must
    // be in the list.
    EXPECT_TRUE(PostMortemNamesRankOne(s.message())) << "rank " << rank << ": " << s;
    EXPECT_LT(absl::Now() - start, absl::Seconds(15)) << "rank " << rank;
  });
}

// Rank 1 of 3 never joins (stalled): the others fail within the timeout plus
// the post-mortem grace, naming the collective and rank 1, each quoting the
// other's report; afterwards their communicators refuse work at once. The
// survivor that times out first tells the other (Note [Failure notices]),
// which then fails as Aborted rather than DeadlineExceeded.
// `waits_name_it`: each survivor's own wait is on rank 1 (in the linear
// round rank 2 waits for rank 0's answer, and only the post-mortem, which
// rank 1 never answers, names it).
void ExpectTimeoutNamesTheStalledRank(UcxOptions options, bool waits_name_it = true,
                                      size_t count = 1 << 18) {
  options.timeout = absl::Milliseconds(500);
  RunRanks(3, options, [&](int rank, Communicator& comm) {
    if (rank == 1) {
      absl::SleepFor(absl::Seconds(7));  // > timeout + grace (5 s)
      return;
    }
    std::vector<float> x(count, 1.0f);
    const absl::Time start = absl::Now();
    absl::Status s =
        AllReduceSync(comm, x.data(), x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
    const absl::Duration took = absl::Now() - start;
    EXPECT_TRUE(absl::IsDeadlineExceeded(s) || absl::IsAborted(s)) << s;
    const std::string m(s.message());
    EXPECT_NE(m.find(absl::StrCat("rank ", rank, ": UCX AllReduce(count=", count)),
              std::string::npos)
        << m;
    if (waits_name_it) {
      EXPECT_NE(m.find("waiting for rank 1"), std::string::npos) << m;
    }
    EXPECT_NE(m.find("post-mortem: rank 1 did not report"), std::string::npos) << m;
    EXPECT_NE(m.find(absl::StrCat("rank ", 2 - rank, " reports: AllReduce")), std::string::npos)
        << m;
    EXPECT_GE(took, absl::Milliseconds(500));
    EXPECT_LT(took, absl::Milliseconds(6500));
    float y = 1;
    auto refused = comm.AllReduce(&y, &y, 1, DataType::kFloat32, ReduceOp::kSum);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(refused.status().message().find(waits_name_it ? "waiting for rank 1"
                                                            : "rank 1 did not report"),
              std::string::npos)
        << refused.status();
    EXPECT_EQ(comm.Barrier().status().code(), absl::StatusCode::kFailedPrecondition);
  });
}

TEST(UcxCommunicatorTest, TimeoutNamesTheStalledRankOnTheSharedMemoryPath) {
  ExpectTimeoutNamesTheStalledRank(UcxOptions{});
}

TEST(UcxCommunicatorTest, TimeoutNamesTheStalledRankOnTheRingPath) {
  ExpectTimeoutNamesTheStalledRank(RingOnly());
}

TEST(UcxCommunicatorTest, TimeoutUnderTheLinearRoundNamesTheStalledRankInThePostMortem) {
  UcxOptions o = RingOnly();
  o.opening = UcxOptions::Opening::kLinear;
  ExpectTimeoutNamesTheStalledRank(o, /*waits_name_it=*/false);
  // Recursive doubling with the linear round watched beside it (16 KB).
  ExpectTimeoutNamesTheStalledRank(LinearOpening(), /*waits_name_it=*/false, 4000);
}

// Note [Failure notices]: rank 1 of 3 stalls; rank 2 gives up after 500 ms
// and tells the others, so rank 0, whose own deadline is a minute away,
// fails within seconds too, names rank 2 as the one that gave up and, by
// the post-mortem, rank 1 as the silent one. Without the notice rank 0
// would wait out its minute and be named silent by rank 2.
TEST(UcxCommunicatorTest, ARankThatGivesUpTellsThePeersThatAreStillWaiting) {
  MemoryStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      UcxOptions options = RingOnly();
      options.timeout = r == 2 ? absl::Milliseconds(500) : absl::Seconds(60);
      auto comm = CreateUcxCommunicator(options, r, 3, store);
      ASSERT_TRUE(comm.ok()) << comm.status();
      if (r == 1) {
        absl::SleepFor(absl::Seconds(7));  // > rank 2's timeout + grace (5 s)
        return;
      }
      std::vector<float> x(1 << 16, 1.0f);
      const absl::Time start = absl::Now();
      absl::Status s = AllReduceSync(**comm, x.data(), x.data(), x.size(), DataType::kFloat32,
                                     ReduceOp::kSum);
      const absl::Duration took = absl::Now() - start;
      const std::string m(s.message());
      EXPECT_NE(m.find("post-mortem: rank 1 did not report"), std::string::npos) << m;
      if (r == 0) {
        EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
        EXPECT_NE(m.find("rank 2 gave up on collective seq=0"), std::string::npos) << m;
        EXPECT_NE(m.find("rank 2 reports: AllReduce(count=65536"), std::string::npos) << m;
        EXPECT_LT(took, absl::Seconds(10));
      } else {
        EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
        EXPECT_NE(m.find("rank 0 reports: AllReduce(count=65536"), std::string::npos) << m;
      }
    });
  }
  for (auto& t : threads) t.join();
}

// Options that pick algorithms must agree: ranks that picked different ones
// would wait for messages their peers never send.
void ExpectOptionsThatDifferAreRefused(const std::function<void(int rank, UcxOptions&)>& set,
                                       const std::string& rank0, const std::string& rank1) {
  MemoryStore store;
  std::vector<absl::Status> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      UcxOptions o;
      set(r, o);
      results[r] = CreateUcxCommunicator(o, r, 2, store).status();
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : results) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(rank0), std::string::npos) << s;
    EXPECT_NE(s.message().find(rank1), std::string::npos) << s;
  }
}

TEST(UcxCommunicatorTest, OptionsThatDifferAcrossRanksAreAnErrorNamingBoth) {
  ExpectOptionsThatDifferAreRefused(
      [](int r, UcxOptions& o) { o.small_message_bytes = r == 0 ? 16384 : 4096; },
      "small_message_bytes=16384", "small_message_bytes=4096");
  ExpectOptionsThatDifferAreRefused(
      [](int r, UcxOptions& o) { o.recursive_doubling_bytes = r == 0 ? 0 : 65536; },
      "recursive_doubling_bytes=0", "recursive_doubling_bytes=65536");
  ExpectOptionsThatDifferAreRefused(
      [](int r, UcxOptions& o) { o.rabenseifner_from_bytes = r == 0 ? 8192 : 32768; },
      "rabenseifner_from_bytes=8192", "rabenseifner_from_bytes=32768");
}

TEST(UcxCommunicatorTest, CountsThatOverflowAreRejected) {
  RunRanks(1, UcxOptions{}, [&](int, Communicator& comm) {
    float x = 0;
    auto w = comm.AllReduce(&x, &x, SIZE_MAX / 2, DataType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(w.status().message().find("overflows"), std::string::npos) << w.status();
  });
}

TEST(UcxCommunicatorTest, RejectsBadOptions) {
  MemoryStore store;
  UcxOptions o;
  o.chunk_bytes = 1;
  EXPECT_EQ(CreateUcxCommunicator(o, 0, 1, store).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateUcxCommunicator(UcxOptions{}, 3, 2, store).status().code(), absl::StatusCode::kInvalidArgument);
  UcxOptions no_timeout;
  no_timeout.timeout = absl::ZeroDuration();
  EXPECT_EQ(CreateUcxCommunicator(no_timeout, 0, 1, store).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateUcxCommunicator(UcxOptions{}, 0, 2049, store).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = UcxOptions{};
  o.small_message_bytes = 1u << 30;
  EXPECT_EQ(CreateUcxCommunicator(o, 0, 1, store).status().code(), absl::StatusCode::kInvalidArgument);
  o = UcxOptions{};
  o.linear_bytes = (1u << 20) + 1;
  EXPECT_EQ(CreateUcxCommunicator(o, 0, 1, store).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.linear_bytes = 1u << 20;  // staged from 1023 ranks: more than 256 MiB
  EXPECT_EQ(CreateUcxCommunicator(o, 0, 1024, store).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = UcxOptions{};
  o.recursive_doubling_bytes = (64u << 20) + 1;
  EXPECT_EQ(CreateUcxCommunicator(o, 0, 1, store).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = UcxOptions{};
  o.rabenseifner_bytes = (64u << 20) + 1;
  EXPECT_EQ(CreateUcxCommunicator(o, 0, 1, store).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A shared-memory round that is not whole cache lines would misalign the
  // segments' elements and flags.
  o = UcxOptions{};
  o.shm_chunk_bytes = 100;
  const absl::Status s = CreateUcxCommunicator(o, 0, 1, store).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("shm_chunk_bytes must be a multiple of 64"), std::string::npos) << s;
}

}  // namespace
}  // namespace fusebox::comm
