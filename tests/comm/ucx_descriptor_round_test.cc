// The descriptor round (comm/ucx/descriptor_round.h) on bare channels, one
// thread per rank over TCP, as across hosts: what it sends, not only what
// it computes (the communicator tests check results and mismatches).
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "comm/options.h"
#include "comm/types.h"
#include "comm/ucx/channel.h"
#include "comm/ucx/descriptor_round.h"
#include "comm/ucx/header.h"
#include "gtest/gtest.h"

namespace fusebox::comm::ucx {
namespace {

// `n` connected channels over TCP.
struct World {
  explicit World(int n) : abort(false) {
    UcxOptions options;
    options.transports = "tcp,self";
    std::vector<std::string> addresses(n);
    for (int r = 0; r < n; ++r) {
      ch.push_back(std::make_unique<Channel>(r, n, &abort));
      absl::StatusOr<std::string> a = ch[r]->Open(options, /*rma=*/false);
      EXPECT_TRUE(a.ok()) << a.status();
      if (a.ok()) addresses[r] = *a;
    }
    for (int r = 0; r < n; ++r) {
      absl::Status s = ch[r]->Connect(addresses, /*detect_peer_failure=*/false);
      EXPECT_TRUE(s.ok()) << s;
      ch[r]->set_yield_mask(0);  // threads outnumber cores: yield on every idle poll
    }
  }
  ~World() {
    for (auto& c : ch) c->Close(/*force=*/true);  // peers are not progressing here
  }
  std::atomic<bool> abort;
  std::vector<std::unique_ptr<Channel>> ch;
};

Header AllReduceHeader(int rank, uint64_t count) {
  Header h{};
  h.magic = kHeaderMagic;
  h.kind = static_cast<uint8_t>(CollectiveKind::kAllReduce);
  h.type = static_cast<uint8_t>(DataType::kFloat32);
  h.op = static_cast<uint8_t>(ReduceOp::kSum);
  h.root = -1;
  h.sender = rank;
  h.count = count;
  h.seq = 0;
  return h;
}

// Note [Watching the linear round]: where every rank runs the exchanges,
// the linear round watched beside them sends nothing. Each rank posts
// exactly recursive doubling's messages (one per exchange, and the
// hand-over or hand-back where the world is not a power of two), and every
// rank holds the exact sum. Sending every descriptor to rank 0 as well, as
// the linear round's messages alongside did, adds one message per rank.
TEST(DescriptorRoundTest, WatchingTheLinearRoundSendsNothingWhereEveryRankRunsTheExchanges) {
  constexpr uint64_t kCount = 3000;  // 12 KB: above the linear round's 4 KiB
  constexpr int64_t kLinearBytes = 4 << 10;
  struct Case {
    int world;
    std::vector<uint64_t> sends;  // per rank
  };
  // 5 ranks: rank 0 hands over to rank 1 and sits out; rank 1 exchanges
  // twice and hands back.
  for (const Case& c : {Case{4, {2, 2, 2, 2}}, Case{5, {1, 3, 2, 2, 2}}, Case{2, {1, 1}}}) {
    World w(c.world);
    std::vector<absl::Status> status(c.world);
    std::vector<std::vector<float>> out(c.world, std::vector<float>(kCount, -1.0f));
    std::vector<std::thread> threads;
    for (int r = 0; r < c.world; ++r) {
      threads.emplace_back([&, r] {
        Channel& ch = *w.ch[r];
        ch.set_deadline(absl::Now() + absl::Seconds(60));
        const std::vector<float> in(kCount, static_cast<float>(r + 1));
        const Header h = AllReduceHeader(r, kCount);
        const Carried carried{in.data(), out[r].data(), /*halving=*/false};
        DescriptorStaging staging;
        status[r] = DescriptorRound(ch, h, &carried, 64 << 10, &staging, kLinearBytes);
      });
    }
    for (auto& t : threads) t.join();
    const float want = static_cast<float>(c.world * (c.world + 1) / 2);
    for (int r = 0; r < c.world; ++r) {
      SCOPED_TRACE(testing::Message() << "world " << c.world << ", rank " << r);
      ASSERT_TRUE(status[r].ok()) << status[r];
      EXPECT_EQ(w.ch[r]->sends(), c.sends[r]);
      for (float v : out[r]) ASSERT_EQ(v, want);
    }
  }
}

// How each rank opens in the tests below.
enum class Round { kLinear, kDescriptor };
constexpr uint64_t kLinearCount = 100;       // 400 B: inside the linear round
constexpr uint64_t kExchangeCount = 3000;    // 12 KB: recursive doubling
constexpr size_t kLinearBytes = 4 << 10;     // what the linear round carries
constexpr size_t kExchangeBytes = 64 << 10;  // what the descriptor round carries

struct RankResult {
  absl::Status status;
  std::vector<float> out;
};

// Runs one AllReduce of (rank + 1)s on every rank of `w`, rank r opening
// with rounds[r] after sleeping delays[r].
std::vector<RankResult> RunRound(World& w, const std::vector<Round>& rounds,
                                 const std::vector<absl::Duration>& delays) {
  const int n = static_cast<int>(rounds.size());
  std::vector<RankResult> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Channel& ch = *w.ch[r];
      ch.set_deadline(absl::Now() + absl::Seconds(60));
      absl::SleepFor(delays[r]);
      const uint64_t count = rounds[r] == Round::kLinear ? kLinearCount : kExchangeCount;
      const std::vector<float> in(count, static_cast<float>(r + 1));
      results[r].out.assign(count, -1.0f);
      const Header h = AllReduceHeader(r, count);
      const Carried carried{in.data(), results[r].out.data(), /*halving=*/false};
      DescriptorStaging staging;
      results[r].status =
          rounds[r] == Round::kLinear
              ? LinearRound(ch, h, &carried, kLinearBytes, &staging)
              : DescriptorRound(ch, h, &carried, kExchangeBytes, &staging, kLinearBytes);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

// A rank that reaches a clean linear round after rank 0 has waited
// kRequestAfter is asked for its message, which it had sent (or sends on
// entering): it ignores the request, sends nothing more, and every rank
// gets the exact sum.
TEST(DescriptorRoundTest, ALateRankInTheLinearRoundIgnoresRankZerosRequest) {
  constexpr int kWorld = 4, kLate = 2;
  World w(kWorld);
  std::vector<absl::Duration> delays(kWorld, absl::ZeroDuration());
  delays[kLate] = 3 * kRequestAfter;
  const std::vector<RankResult> results =
      RunRound(w, std::vector<Round>(kWorld, Round::kLinear), delays);
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE(testing::Message() << "rank " << r);
    ASSERT_TRUE(results[r].status.ok()) << results[r].status;
    for (float v : results[r].out) ASSERT_EQ(v, 10.0f);
    if (r > 0) {
      EXPECT_EQ(w.ch[r]->sends(), 1u);
    }
  }
  // The answers, and a request at least to the late rank (others may have
  // been late too on a loaded machine).
  EXPECT_GE(w.ch[0]->sends(), uint64_t{kWorld});
  EXPECT_LE(w.ch[0]->sends(), uint64_t{2 * (kWorld - 1)});
}

// Ranks that called different things, some opening with the linear round
// and some with the exchanges: with rank 0 in either, every rank fails
// with the same message, naming rank 0's call and the lowest rank's that
// differs, and no output is written.
TEST(DescriptorRoundTest, AMixOfRoundsFailsEveryRankWithTheSameMessage) {
  constexpr Round L = Round::kLinear, D = Round::kDescriptor;
  struct Case {
    std::vector<Round> rounds;
    std::string want;
  };
  const std::string linear = "AllReduce(count=100, type=float, op=sum";
  const std::string exchanges = "AllReduce(count=3000, type=float, op=sum";
  for (const Case& c : {
           // Rank 0 beside the exchanges; two linear ranks, so that a request
           // can reach one whose message is on its way.
           Case{{D, L, L, D, L}, "rank 0 called " + exchanges},
           // Rank 0 in the linear round, every other rank in the exchanges.
           Case{{L, D, D, D, D}, "rank 0 called " + linear},
           Case{{L, D, L, D}, "rank 0 called " + linear},
           Case{{D, D, D, L}, "rank 0 called " + exchanges},
       }) {
    const int n = static_cast<int>(c.rounds.size());
    World w(n);
    const std::vector<RankResult> results =
        RunRound(w, c.rounds, std::vector<absl::Duration>(n, absl::ZeroDuration()));
    int differ = 1;
    while (c.rounds[differ] == c.rounds[0]) ++differ;
    const std::string other = c.rounds[differ] == L ? linear : exchanges;
    const std::string want =
        c.want + ", seq=0) but rank " + std::to_string(differ) + " called " + other;
    for (int r = 0; r < n; ++r) {
      SCOPED_TRACE(testing::Message() << "case " << c.want << " x" << n << ", rank " << r);
      EXPECT_EQ(results[r].status.code(), absl::StatusCode::kInvalidArgument) << results[r].status;
      EXPECT_NE(std::string(results[r].status.message()).find(want), std::string::npos)
          << results[r].status.message();
      EXPECT_EQ(results[r].status.message(), results[0].status.message());
      for (float v : results[r].out) ASSERT_EQ(v, -1.0f) << "output written";
    }
  }
}

}  // namespace
}  // namespace fusebox::comm::ucx
