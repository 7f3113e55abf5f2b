// The shared-memory allreduce algorithm on its own: ranks are threads whose
// "segments" are plain memory of this process, so every protocol detail
// (rounds, slot reuse across collectives, empty sub-blocks, in-place, abort)
// is checked without UCX.
#include "comm/ucx/shm_allreduce.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "comm/testing/exact_data.h"
#include "gtest/gtest.h"

namespace fusebox::comm::ucx {
namespace {

struct Segments {
  Segments(int size, size_t chunk, size_t mailbox = 0) {
    for (int r = 0; r < size; ++r) {
      mem.emplace_back(static_cast<unsigned char*>(std::aligned_alloc(
                           4096, (ShmSegmentBytes(size, chunk, mailbox) + 4095) / 4096 * 4096)),
                       &std::free);
      InitShmSegment(mem.back().get(), size, chunk, mailbox);
      bases.push_back(mem.back().get());
    }
  }
  std::vector<std::unique_ptr<unsigned char, void (*)(void*)>> mem;
  std::vector<unsigned char*> bases;
};

// The allreduce under test, as rank g.rank calls it for its `call`-th
// collective (`scratch`: the rank's own, for CmaAllReduce).
using AllReduceCall = std::function<absl::Status(
    const ShmGroup& g, int call, const void* send, void* recv, size_t count, DataType type,
    ReduceOp op, uint64_t* rounds, const std::atomic<bool>& abort,
    std::vector<unsigned char>* scratch)>;

// Every type and op at counts across rounds (many rounds of a 64-byte
// chunk: slot reuse, empty sub-blocks), in place and not, for worlds 1, 2,
// 3 and 5 of threads (with cross-memory attach: every "peer" is this
// process); every result is checked bit for bit.
void ExpectExactForEveryTypeAndOp(const AllReduceCall& allreduce, bool cma) {
  for (int world : {1, 2, 3, 5}) {
    constexpr size_t kChunk = 64;
    Segments seg(world, kChunk);
    std::atomic<bool> abort{false};
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        ShmGroup g{r, world, kChunk, seg.bases};
        if (cma) g.pids.assign(world, getpid());
        uint64_t rounds = 0;
        std::vector<unsigned char> scratch;
        int call = 0;
        for (size_t count : {0, 1, 7, 1023, 4099}) {
          for (int t = 0; t < kNumDataTypes; ++t) {
            for (int o = 0; o < kNumReduceOps; ++o, ++call) {
              const auto type = static_cast<DataType>(t);
              const auto op = static_cast<ReduceOp>(o);
              const size_t bytes = count * DataTypeSize(type);
              std::vector<unsigned char> in(bytes + 1), out(bytes + 1), want(bytes + 1);
              testing::FillInput(in.data(), count, type, op, r);
              testing::FillExpected(want.data(), count, type, op, world);
              const bool in_place = (t + o) % 2 == 0;
              unsigned char* dst = in_place ? in.data() : out.data();
              const absl::Status s =
                  allreduce(g, call, in.data(), dst, count, type, op, &rounds, abort, &scratch);
              ASSERT_TRUE(s.ok()) << s;
              EXPECT_EQ(testing::CountMismatches(dst, want.data(), count, type), 0u)
                  << "world " << world << " rank " << r << " count " << count << " "
                  << DataTypeName(type) << " " << ReduceOpName(op) << " call " << call;
            }
          }
        }
      });
    }
    for (auto& t : threads) t.join();
  }
}

TEST(ShmAllReduceTest, EveryTypeAndOpAcrossRoundsAndCollectives) {
  ExpectExactForEveryTypeAndOp(
      [](const ShmGroup& g, int, const void* send, void* recv, size_t count, DataType type,
         ReduceOp op, uint64_t* rounds, const std::atomic<bool>& abort,
         std::vector<unsigned char>*) {
        return ShmAllReduce(g, send, recv, count, type, op, rounds, abort);
      },
      /*cma=*/false);
}

// Note [Single-copy allreduce]: with cross-memory attach (the ranks are
// threads here, so every "peer" is this process's pid), every type and op,
// in place and not, with pieces smaller than a sub-block (a chunk of 64
// bytes), empty sub-blocks (count < world) and calls mixed with the staged
// rounds on the same counters, give the exact result.
TEST(CmaAllReduceTest, EveryTypeAndOpMixedWithStagedCallsGivesTheExactResult) {
  const int word = 42;
  if (absl::Status s = ProbeCrossMemoryAttach(getpid(), reinterpret_cast<uintptr_t>(&word), &word,
                                              sizeof(word));
      !s.ok()) {
    GTEST_SKIP() << "SKIPPED: cross-memory attach is refused here: " << s;
  }
  // Every third call staged, the rest single-copy, on the same counters.
  ExpectExactForEveryTypeAndOp(
      [](const ShmGroup& g, int call, const void* send, void* recv, size_t count, DataType type,
         ReduceOp op, uint64_t* rounds, const std::atomic<bool>& abort,
         std::vector<unsigned char>* scratch) {
        return call % 3 == 2 ? ShmAllReduce(g, send, recv, count, type, op, rounds, abort)
                             : CmaAllReduce(g, send, recv, count, type, op, rounds, abort, scratch);
      },
      /*cma=*/true);
}

// Cross-memory attach can be refused (a ptrace scope, seccomp, a process
// gone): the probe says so, and a group without pids has no single copy;
// a read that fails mid-call (a peer published an address it has not
// mapped) fails that rank, and its peers learn why instead of waiting.
TEST(CmaAllReduceTest, ARefusedOrFailedReadIsReportedAndNothingHangs) {
  const int word = 42, other = 43;
  const auto at = reinterpret_cast<uintptr_t>(&word);
  if (absl::Status s = ProbeCrossMemoryAttach(getpid(), at, &word, sizeof(word)); !s.ok()) {
    GTEST_SKIP() << "SKIPPED: cross-memory attach is refused here: " << s;
  }
  // No such process (pid_max is at most 2^22).
  absl::Status gone = ProbeCrossMemoryAttach((1 << 22) + 1, at, &word, sizeof(word));
  EXPECT_FALSE(gone.ok());
  EXPECT_NE(gone.message().find("process_vm_readv"), std::string::npos) << gone;
  // Mapped nowhere in this process: the kernel answers EFAULT.
  EXPECT_FALSE(ProbeCrossMemoryAttach(getpid(), 8, &word, sizeof(word)).ok());
  // Read, but not what the shared mapping shows: another process's memory.
  absl::Status stranger = ProbeCrossMemoryAttach(getpid(), at, &other, sizeof(other));
  EXPECT_FALSE(stranger.ok());
  EXPECT_NE(stranger.message().find("other bytes"), std::string::npos) << stranger;

  constexpr int kWorld = 2;
  constexpr size_t kChunk = 4096;
  Segments seg(kWorld, kChunk);
  std::atomic<bool> abort{false};
  {
    ShmGroup g{0, kWorld, kChunk, seg.bases};  // no pids
    std::vector<float> x(64, 1.0f);
    uint64_t rounds = 0;
    std::vector<unsigned char> scratch;
    EXPECT_EQ(CmaAllReduce(g, x.data(), x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum,
                           &rounds, abort, &scratch)
                  .code(),
              absl::StatusCode::kFailedPrecondition);
  }
  // Rank 1 names a pid that does not exist for rank 0 to read: rank 0's
  // read fails, and rank 1, waiting on rank 0, is told.
  std::vector<absl::Status> status(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      ShmGroup g{r, kWorld, kChunk, seg.bases};
      g.pids = {getpid(), (1 << 22) + 1};
      std::vector<float> x(1 << 12, 1.0f);
      uint64_t rounds = 0;
      std::vector<unsigned char> scratch;
      status[r] = CmaAllReduce(g, x.data(), x.data(), x.size(), DataType::kFloat32,
                               ReduceOp::kSum, &rounds, abort, &scratch,
                               absl::Now() + absl::Seconds(20));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(status[0].code(), absl::StatusCode::kInternal) << status[0];
  EXPECT_NE(status[0].message().find("rank 1"), std::string::npos) << status[0];
  EXPECT_EQ(status[1].code(), absl::StatusCode::kAborted) << status[1];
  EXPECT_NE(status[1].message().find("cross-memory read failed"), std::string::npos)
      << status[1];
}

// Note [The issuer begins] (comm/async_core.h): an allreduce whose first
// round ShmBeginAllReduce staged, and whose rest ShmAllReduce ran with
// first_round_staged, gives the exact result; ranks that begin and ranks
// that do not mix in the same collectives (every third collective, by rank,
// is run whole); the staging is skipped, and nothing done, where the slot
// is not free yet, and where there is nothing to reduce. (On the
// algorithm's own schedule the slot is always free by then: a rank that
// finished a collective saw every peer reduce its last round, so every
// peer has consumed the round kSlots - 1 before the next. The end of the
// test reaches the check by beginning without finishing.)
TEST(ShmAllReduceTest, ACollectiveBegunByItsFirstRoundGivesTheExactResult) {
  for (int world : {1, 2, 3, 5}) {
    constexpr size_t kChunk = 64;  // tiny rounds: many rounds, slot reuse
    Segments seg(world, kChunk);
    std::atomic<bool> abort{false};
    std::vector<int> begun(world, 0);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        ShmGroup g{r, world, kChunk, seg.bases};
        uint64_t rounds = 0;
        int n = 0;
        for (size_t count : {0, 1, 7, 16, 17, 1023, 4099}) {
          for (int t = 0; t < kNumDataTypes; ++t) {
            for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
              const auto type = static_cast<DataType>(t);
              const size_t bytes = count * DataTypeSize(type);
              std::vector<unsigned char> in(bytes + 1), out(bytes + 1), want(bytes + 1);
              testing::FillInput(in.data(), count, type, op, r);
              testing::FillExpected(want.data(), count, type, op, world);
              const bool in_place = (t + n) % 2 == 0;
              unsigned char* dst = in_place ? in.data() : out.data();
              const uint64_t before = rounds;
              bool staged = false;
              if ((n + r) % 3 != 0) {
                staged = ShmBeginAllReduce(g, in.data(), count, type, &rounds);
                EXPECT_EQ(rounds, before + (staged ? 1 : 0));
                if (count == 0) {
                  EXPECT_FALSE(staged);
                }
                begun[r] += staged;
              }
              ASSERT_TRUE(ShmAllReduce(g, in.data(), dst, count, type, op, &rounds, abort,
                                       absl::Now() + absl::Seconds(60), nullptr, staged)
                              .ok());
              EXPECT_EQ(testing::CountMismatches(dst, want.data(), count, type), 0u)
                  << "world " << world << " rank " << r << " count " << count << " "
                  << DataTypeName(type) << " " << ReduceOpName(op) << " begun " << staged;
              ++n;
            }
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    // Beginning was tried in two collectives of three (all but the empty
    // ones staged: the slot is free by then).
    for (int r = 0; r < world; ++r) EXPECT_GT(begun[r], 0) << "world " << world << " rank " << r;
  }
  // The slot of the round after kSlots more is busy until every rank has
  // consumed the round before: nothing is staged and the counter stays.
  constexpr size_t kChunk = 64;
  Segments seg(2, kChunk);
  ShmGroup g{0, 2, kChunk, seg.bases};
  uint64_t rounds = 0;
  std::vector<float> buf(16, 1.0f);  // one round per collective on 2 ranks
  int staged = 0;
  while (ShmBeginAllReduce(g, buf.data(), buf.size(), DataType::kFloat32, &rounds)) ++staged;
  EXPECT_EQ(staged, 4) << "kSlots rounds staged before the first slot is needed again";
  EXPECT_EQ(rounds, 4u);
}

// Note [Faulting the segments in]: the owner's Init writes every byte (a
// segment that held anything before comes out all zero), so each of its
// pages is faulted in before any allreduce.
TEST(ShmSegmentTest, InitWritesTheWholeSegment) {
  for (size_t mailbox : {size_t{0}, size_t{4096}}) {
    const size_t bytes = ShmSegmentBytes(3, 128 << 10, mailbox);
    std::vector<unsigned char> seg(bytes, 0xab);
    InitShmSegment(seg.data(), 3, 128 << 10, mailbox);
    EXPECT_EQ(std::count(seg.begin(), seg.end(), 0), static_cast<std::ptrdiff_t>(bytes))
        << "mailbox " << mailbox;
  }
}

// This thread's minor page faults so far.
long MinorFaults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

size_t PageBytes() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

// Touching every page of `p` (reads): the faults that took.
long FaultsToRead(const unsigned char* p, size_t bytes) {
  const long before = MinorFaults();
  const volatile unsigned char* v = p;
  unsigned sum = 0;
  for (size_t off = 0; off < bytes; off += PageBytes()) sum += v[off];
  (void)sum;
  return MinorFaults() - before;
}

// A peer's segment read in once costs no fault when the allreduce reads it;
// one not read in costs one a page (the measurement can see the faults).
TEST(ShmSegmentTest, FaultInLeavesNoPageToFaultOnFirstUse) {
  constexpr size_t kPages = 64;
  const size_t kBytes = kPages * PageBytes();
  auto map = [&] {
    void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : static_cast<unsigned char*>(p);
  };
  unsigned char* faulted = map();
  unsigned char* cold = map();
  ASSERT_NE(faulted, nullptr);
  ASSERT_NE(cold, nullptr);
  FaultInShmSegment(faulted, kBytes);
  EXPECT_LE(FaultsToRead(faulted, kBytes), 2);
  EXPECT_GE(FaultsToRead(cold, kBytes), static_cast<long>(kPages / 2));
  munmap(faulted, kBytes);
  munmap(cold, kBytes);
}

// Note [Streaming into the staging]: with every copy into the staging
// streamed (down to a byte, so that heads and tails around the 16-byte
// stores are covered), with some, and with one rank streaming and the
// others not, from inputs and into outputs off 16-byte lines, the result is
// the exact one, as with cached stores.
TEST(ShmAllReduceTest, StreamedStagingGivesTheExactResult) {
  for (int world : {2, 3}) {
    constexpr size_t kChunk = 4096;
    Segments seg(world, kChunk);
    std::atomic<bool> abort{false};
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        uint64_t rounds = 0;
        // Every copy streamed, copies of 100 bytes and more, and rank 0 alone
        // streaming (ranks choose apart: Note [Choosing how to stage]).
        for (int how = 0; how < 3; ++how) {
          const size_t stream_bytes = how == 0 ? 1 : how == 1 ? 100 : r == 0 ? 1 : 0;
          ShmGroup g{r, world, kChunk, seg.bases};
          g.stream_bytes = stream_bytes;
          for (size_t count : {1, 5, 17, 1000, 9001}) {
            for (DataType type : {DataType::kFloat32, DataType::kUInt8, DataType::kFloat64}) {
              const ReduceOp op = ReduceOp::kSum;
              const size_t bytes = count * DataTypeSize(type);
              // 3 and 5 elements in: aligned for the type, not to 16 bytes.
              const size_t esize = DataTypeSize(type);
              std::vector<double> in((bytes + 8 * esize) / 8 + 1), out(in.size());
              std::vector<unsigned char> want(bytes);
              unsigned char* src = reinterpret_cast<unsigned char*>(in.data()) + 3 * esize;
              unsigned char* dst = reinterpret_cast<unsigned char*>(out.data()) + 5 * esize;
              testing::FillInput(src, count, type, op, r);
              testing::FillExpected(want.data(), count, type, op, world);
              ASSERT_TRUE(ShmAllReduce(g, src, dst, count, type, op, &rounds, abort).ok());
              EXPECT_EQ(testing::CountMismatches(dst, want.data(), count, type), 0u)
                  << "world " << world << " rank " << r << " count " << count << " "
                  << DataTypeName(type) << " streaming from " << stream_bytes << " bytes";
            }
          }
        }
      });
    }
    for (auto& t : threads) t.join();
  }
}

// Note [Staging in the buffer's phase]: each rank stages at its input's
// offset within a cache line, and its peers read it there. With every rank's
// input at another offset (and its output at yet another, or in place),
// over many rounds and reused slots, the result is the exact one, and
// nothing is written past the slots: the mailboxes' heads stay zero. With
// 2 ranks of 2048-byte chunks a slot's data fills whole pages, so a full
// round staged at offset 56 needs the slot's spare room (the last slot's
// overrun would land on the first mailbox's head); 64-byte chunks give many
// rounds and mixed offsets across ranks.
TEST(ShmAllReduceTest, InputsAtDifferentOffsetsInALineGiveTheExactResult) {
  for (const std::pair<int, size_t>& geometry :
       {std::pair<int, size_t>{2, 2048}, {2, 64}, {3, 64}}) {
    const int world = geometry.first;
    const size_t kChunk = geometry.second;
    constexpr size_t kMailbox = 256;
    Segments seg(world, kChunk, kMailbox);
    std::atomic<bool> abort{false};
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        ShmGroup g{r, world, kChunk, seg.bases, kMailbox};
        uint64_t rounds = 0;
        for (size_t phase : {size_t{0}, size_t{8}, size_t{16}, size_t{56}}) {
          // Rank r's input at phase + 24 r within a line, its output 40 further.
          const size_t in_off = (phase + 24 * r) % 64, out_off = (in_off + 40) % 64;
          // Up to 9 full rounds of 2 x 2048 bytes: every slot, the last included.
          for (size_t count : {1, 15, 63, 1000, 4608}) {
            for (bool in_place : {true, false}) {
              const DataType type = DataType::kFloat64;
              const ReduceOp op = ReduceOp::kSum;
              const size_t bytes = count * DataTypeSize(type);
              const size_t room = (bytes + 64) / 64 * 64 + 64;  // a multiple of 64
              std::unique_ptr<unsigned char, void (*)(void*)> in(
                  static_cast<unsigned char*>(std::aligned_alloc(64, room)), &std::free);
              std::unique_ptr<unsigned char, void (*)(void*)> out(
                  static_cast<unsigned char*>(std::aligned_alloc(64, room)), &std::free);
              unsigned char* src = in.get() + in_off;
              unsigned char* dst = in_place ? src : out.get() + out_off;
              std::vector<unsigned char> want(bytes);
              testing::FillInput(src, count, type, op, r);
              testing::FillExpected(want.data(), count, type, op, world);
              ASSERT_TRUE(ShmAllReduce(g, src, dst, count, type, op, &rounds, abort).ok());
              EXPECT_EQ(testing::CountMismatches(dst, want.data(), count, type), 0u)
                  << "world " << world << " rank " << r << " count " << count << " input at "
                  << in_off << (in_place ? " in place" : " out of place");
            }
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < world; ++r) {
      ShmGroup g{r, world, kChunk, seg.bases, kMailbox};
      for (uint64_t which : {0, 1}) {
        const unsigned char* head = ShmOutbox(g, which) - 16;  // MailboxHead: flag, length
        EXPECT_TRUE(std::all_of(head, head + 16, [](unsigned char b) { return b == 0; }))
            << "world " << world << " rank " << r << " mailbox " << which;
      }
    }
  }
}

// Note [Staging in the buffer's phase]: what a rank stages lands in its
// slot at its input's offset within a cache line. Rank 0's input (16 bytes
// past a line, as malloc's large blocks are) holds a pattern of period 256
// bytes; its sub-block for rank 1 is found in rank 0's segment at that
// offset, however far into the segment the slot is.
TEST(ShmAllReduceTest, StagesAtTheInputsOffsetInALine) {
  constexpr int kWorld = 2;
  constexpr size_t kChunk = 4096;
  constexpr size_t kBytes = 4096;  // one round: sub-blocks of 2048 bytes
  for (size_t in_off : {size_t{16}, size_t{40}}) {
    Segments seg(kWorld, kChunk);
    std::atomic<bool> abort{false};
    std::unique_ptr<unsigned char, void (*)(void*)> in0(
        static_cast<unsigned char*>(std::aligned_alloc(64, kBytes + 64)), &std::free);
    unsigned char* src0 = in0.get() + in_off;
    for (size_t i = 0; i < kBytes; ++i) src0[i] = static_cast<unsigned char>(i * 7 + 3);
    std::vector<unsigned char> in1(kBytes, 0);
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        ShmGroup g{r, kWorld, kChunk, seg.bases};
        uint64_t rounds = 0;
        unsigned char* buf = r == 0 ? src0 : in1.data();
        std::vector<unsigned char> out(kBytes);
        ASSERT_TRUE(ShmAllReduce(g, buf, out.data(), kBytes, DataType::kUInt8, ReduceOp::kSum,
                                 &rounds, abort)
                        .ok());
        EXPECT_EQ(std::memcmp(out.data(), src0, kBytes), 0) << "rank " << r;
      });
    }
    for (auto& t : threads) t.join();
    // 64 bytes from the middle of the sub-block rank 0 staged for rank 1.
    const unsigned char* window = src0 + 3072;
    const unsigned char* base = seg.bases[0];
    const size_t seg_bytes = ShmSegmentBytes(kWorld, kChunk);
    int found = 0;
    for (size_t at = 0; at + 64 <= seg_bytes; ++at) {
      if (std::memcmp(base + at, window, 64) != 0) continue;
      ++found;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(base + at) % 64,
                reinterpret_cast<uintptr_t>(window) % 64)
          << "input " << in_off << " bytes past a line: staged at segment offset " << at;
    }
    EXPECT_GT(found, 0) << "input " << in_off << " bytes past a line: not staged";
  }
}

// Note [Choosing how to stage]
TEST(StagingChooserTest, RunsTheFasterKindAndFollowsAChange) {
  constexpr size_t kBytes = 24 << 20;
  constexpr uint64_t kE = StagingChooser::kExplore;
  StagingChooser c;
  uint64_t calls = 0;
  // Streamed 3x faster: every call streams but the first cached one (call 1,
  // when cached has no figure yet) and the cached explorations.
  for (; calls < 4 * kE; ++calls) {
    const bool stream = c.Stream(kBytes);
    EXPECT_EQ(stream, !(calls == 1 || calls % kE == kE / 2)) << "call " << calls;
    c.Record(kBytes, stream, absl::Milliseconds(stream ? 5 : 15));
  }
  EXPECT_NEAR(c.NsPerByte(kBytes, true), 5e6 / kBytes, 1e-9);
  EXPECT_NEAR(c.NsPerByte(kBytes, false), 15e6 / kBytes, 1e-9);
  // Now cached is 3x faster (the ranks' cores came to share a cache): from
  // the next cached exploration on, every call is cached but the streamed
  // explorations.
  uint64_t switched = 0;
  for (; calls < 8 * kE; ++calls) {
    const bool stream = c.Stream(kBytes);
    if (!stream && switched == 0) switched = calls;
    if (switched != 0) {
      EXPECT_EQ(stream, calls % kE == 0) << "call " << calls;
    }
    c.Record(kBytes, stream, absl::Milliseconds(stream ? 15 : 5));
  }
  EXPECT_EQ(switched, 4 * kE + kE / 2);
}

TEST(StagingChooserTest, SmallAllReducesStayCachedAndSizeClassesAreApart) {
  StagingChooser c;
  for (int n = 0; n < 40; ++n) {
    EXPECT_FALSE(c.Stream(StagingChooser::kMinBytes - 1));
    c.Record(StagingChooser::kMinBytes - 1, false, absl::Milliseconds(1));
  }
  EXPECT_EQ(c.NsPerByte(StagingChooser::kMinBytes - 1, false), 0);
  // 1 MiB: streamed faster; 16 MiB: cached faster. Each class runs its own.
  for (int n = 0; n < 3 * static_cast<int>(StagingChooser::kExplore); ++n) {
    const bool a = c.Stream(1 << 20);
    c.Record(1 << 20, a, absl::Microseconds(a ? 200 : 600));
    const bool b = c.Stream(16 << 20);
    c.Record(16 << 20, b, absl::Microseconds(b ? 9000 : 3000));
    if (n % StagingChooser::kExplore > 1 &&
        n % StagingChooser::kExplore != StagingChooser::kExplore / 2) {
      EXPECT_TRUE(a) << "call " << n;
      EXPECT_FALSE(b) << "call " << n;
    }
  }
  // 3 MiB shares 1 MiB's class; 64 MiB and more share the last.
  EXPECT_EQ(c.NsPerByte(3 << 20, true), c.NsPerByte(1 << 20, true));
  EXPECT_EQ(c.NsPerByte(64 << 20, true), 0);
  c.Record(64 << 20, true, absl::Milliseconds(12));
  EXPECT_GT(c.NsPerByte(64 << 20, true), 0);
  EXPECT_EQ(c.NsPerByte(size_t{1} << 30, true), c.NsPerByte(64 << 20, true));
  EXPECT_EQ(c.NsPerByte(16 << 20, true), 9000e3 / (16 << 20));
}

// A faster sample replaces the figure; a slower one counts for a quarter,
// at most 4x the figure; a sample of no time is ignored.
TEST(StagingChooserTest, AFasterTimeReplacesASlowerOneCountsForAQuarter) {
  constexpr size_t kBytes = 1000000;
  StagingChooser c;
  c.Record(kBytes, true, absl::Milliseconds(10));
  EXPECT_DOUBLE_EQ(c.NsPerByte(kBytes, true), 10.0);
  c.Record(kBytes, true, absl::Milliseconds(30));
  EXPECT_DOUBLE_EQ(c.NsPerByte(kBytes, true), 15.0);
  c.Record(kBytes, true, absl::Milliseconds(1000));  // counts as 4 x 15
  EXPECT_DOUBLE_EQ(c.NsPerByte(kBytes, true), 15.0 + 0.25 * 45.0);
  c.Record(kBytes, true, absl::ZeroDuration());
  c.Record(kBytes, true, absl::Milliseconds(-1));
  EXPECT_DOUBLE_EQ(c.NsPerByte(kBytes, true), 15.0 + 0.25 * 45.0);
  c.Record(kBytes, true, absl::Milliseconds(5));
  EXPECT_DOUBLE_EQ(c.NsPerByte(kBytes, true), 5.0);
  EXPECT_EQ(c.NsPerByte(kBytes, false), 0);
}

TEST(ShmAllReduceTest, PeersOfARankThatGivesUpFailInsteadOfHanging) {
  constexpr int kWorld = 3;
  constexpr size_t kChunk = 256;
  Segments seg(kWorld, kChunk);
  std::atomic<bool> abort_rank2{true};  // rank 2's communicator is being destroyed
  std::atomic<bool> no_abort{false};
  std::vector<absl::Status> results(kWorld);
  const auto run = [&](int r) {
    ShmGroup g{r, kWorld, kChunk, seg.bases};
    uint64_t rounds = 0;
    std::vector<float> buf(10000, 1.0f);
    results[r] = ShmAllReduce(g, buf.data(), buf.data(), buf.size(), DataType::kFloat32,
                              ReduceOp::kSum, &rounds, r == 2 ? abort_rank2 : no_abort);
  };
  // Rank 2 starts alone and gives up while waiting for the others (its
  // communicator is being destroyed); ranks 0 and 1 come later and must
  // fail rather than wait for it forever.
  std::thread(run, 2).join();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) threads.emplace_back(run, r);
  for (auto& t : threads) t.join();
  EXPECT_EQ(results[2].code(), absl::StatusCode::kCancelled) << results[2];
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kAborted) << results[r];
    EXPECT_NE(results[r].message().find("rank 2"), std::string::npos) << results[r];
  }
}

TEST(ShmAllReduceTest, ADeadlineNamesTheRanksBehindAndPeersLearnWhoWasBlamed) {
  // Rank 1 never arrives (dead or stalled). Rank 0 has a short deadline and
  // must name rank 1 (and not rank 2, which did arrive); rank 2, with a long
  // deadline, must then fail at once naming rank 0 and whom it blamed.
  constexpr int kWorld = 3;
  constexpr size_t kChunk = 256;
  Segments seg(kWorld, kChunk);
  std::atomic<bool> no_abort{false};
  std::vector<absl::Status> results(kWorld);
  std::vector<absl::Duration> took(kWorld);
  const auto run = [&](int r, absl::Duration timeout) {
    ShmGroup g{r, kWorld, kChunk, seg.bases};
    uint64_t rounds = 0;
    std::vector<float> buf(10000, 1.0f);
    const absl::Time start = absl::Now();
    results[r] = ShmAllReduce(g, buf.data(), buf.data(), buf.size(), DataType::kFloat32,
                              ReduceOp::kSum, &rounds, no_abort, start + timeout);
    took[r] = absl::Now() - start;
  };
  std::thread late(run, 2, absl::Seconds(60));
  absl::SleepFor(absl::Milliseconds(50));  // rank 2 is waiting before rank 0 starts
  run(0, absl::Milliseconds(300));
  late.join();
  EXPECT_EQ(results[0].code(), absl::StatusCode::kDeadlineExceeded) << results[0];
  EXPECT_NE(results[0].message().find("waiting for rank 1"), std::string::npos) << results[0];
  EXPECT_EQ(results[0].message().find("rank 2"), std::string::npos) << results[0];
  EXPECT_EQ(results[0].message().find("ranks"), std::string::npos) << results[0];
  EXPECT_GE(took[0], absl::Milliseconds(300));
  EXPECT_LT(took[0], absl::Seconds(5));
  EXPECT_EQ(results[2].code(), absl::StatusCode::kAborted) << results[2];
  EXPECT_NE(results[2].message().find("rank 0 abandoned"), std::string::npos) << results[2];
  EXPECT_NE(results[2].message().find("timing out waiting for rank 1"), std::string::npos)
      << results[2];
  EXPECT_LT(took[2], absl::Seconds(10));
}

// The header exchange (Note [Reading the mailboxes in place]): a message
// built in ShmOutbox and posted is read by every rank where it arrived, in
// its sender's segment, of its own length, intact until the reader posts
// again (while peers may already be building their next message), exchange
// after exchange (mailboxes reused every other exchange), interleaved with
// allreduces on the same segments.
TEST(ShmExchangeTest, PostedMessagesAreReadInTheSendersSegmentUntilTheNextPost) {
  for (int world : {2, 3, 5}) {
    constexpr size_t kChunk = 64, kMailbox = 100;
    Segments seg(world, kChunk, kMailbox);
    const size_t seg_bytes = ShmSegmentBytes(world, kChunk, kMailbox);
    std::atomic<bool> abort{false};
    std::vector<int> wrong(world, 0);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        ShmGroup g{r, world, kChunk, seg.bases, kMailbox};
        uint64_t exchanges = 0, rounds = 0;
        std::vector<const unsigned char*> messages;
        std::vector<size_t> lengths;
        for (int n = 1; n <= 2000; ++n) {
          const size_t mine = (n + r) % 97;
          unsigned char* box = ShmOutbox(g, exchanges);
          for (size_t i = 0; i < mine; ++i) box[i] = static_cast<unsigned char>(n * r + i);
          ASSERT_TRUE(ShmPost(g, mine, &messages, &lengths, &exchanges, abort,
                              absl::Now() + absl::Seconds(60))
                          .ok());
          // Peers may be building exchange n + 1 meanwhile: n's must stay.
          std::this_thread::yield();
          for (int q = 0; q < world; ++q) {
            const size_t len = (n + q) % 97;
            const unsigned char* m = messages[q];
            if (m < seg.bases[q] || m + len > seg.bases[q] + seg_bytes) ++wrong[r];
            if (lengths[q] != len) ++wrong[r];
            for (size_t i = 0; i < len && lengths[q] == len; ++i) {
              if (m[i] != static_cast<unsigned char>(n * q + i)) ++wrong[r];
            }
          }
          if (n % 100 == 0) {  // an allreduce between exchanges, on the same segments
            std::vector<float> buf(300, 1.0f);
            ASSERT_TRUE(ShmAllReduce(g, buf.data(), buf.data(), buf.size(), DataType::kFloat32,
                                     ReduceOp::kSum, &rounds, abort)
                            .ok());
            for (float v : buf) wrong[r] += v != static_cast<float>(world);
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < world; ++r) EXPECT_EQ(wrong[r], 0) << "world " << world << " rank " << r;
  }
}

TEST(ShmExchangeTest, TooLongAMessageIsRefusedAndAMissingRankTimesOutByName) {
  constexpr int kWorld = 2;
  Segments seg(kWorld, 64, 32);
  std::atomic<bool> abort{false};
  ShmGroup g{0, kWorld, 64, seg.bases, 32};
  uint64_t exchanges = 0;
  std::vector<const unsigned char*> messages;
  std::vector<size_t> lengths;
  absl::Status s = ShmPost(g, 33, &messages, &lengths, &exchanges, abort);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // Rank 1 never posts: rank 0 gives up at its deadline and names it.
  s = ShmPost(g, 8, &messages, &lengths, &exchanges, abort, absl::Now() + absl::Milliseconds(100));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("waiting for rank 1"), std::string::npos) << s;
}

// Oversubscribed ranks yield at every poll; the deadline and a peer that
// gave up are still noticed, in the exchange and in the allreduce.
TEST(ShmExchangeTest, YieldingAtEveryPollStillHonoursDeadlinesAndAborts) {
  constexpr int kWorld = 2;
  Segments seg(kWorld, 64, 32);
  std::atomic<bool> abort{false};
  ShmGroup g{0, kWorld, 64, seg.bases, 32};
  g.yield_mask = 0;
  uint64_t exchanges = 0, rounds = 0;
  std::vector<const unsigned char*> messages;
  std::vector<size_t> lengths;
  const absl::Time start = absl::Now();
  absl::Status s =
      ShmPost(g, 8, &messages, &lengths, &exchanges, abort, start + absl::Milliseconds(100));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  // Rank 1 of a fresh group gives up on rank 0 (which never comes); rank 0,
  // waiting on rank 1 with no deadline, learns it from rank 1's segment.
  Segments fresh(kWorld, 64, 32);
  std::atomic<bool> never{false};
  std::thread quitter([&] {
    ShmGroup g1{1, kWorld, 64, fresh.bases, 32};
    g1.yield_mask = 0;
    uint64_t n = 0;
    std::vector<const unsigned char*> m;
    std::vector<size_t> l;
    EXPECT_EQ(ShmPost(g1, 8, &m, &l, &n, never, absl::Now() + absl::Milliseconds(50)).code(),
              absl::StatusCode::kDeadlineExceeded);
  });
  quitter.join();
  ShmGroup g0{0, kWorld, 64, fresh.bases, 32};
  g0.yield_mask = 0;
  std::vector<float> buf(100, 1.0f);
  s = ShmAllReduce(g0, buf.data(), buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum,
                   &rounds, never);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s;
}

}  // namespace
}  // namespace fusebox::comm::ucx
