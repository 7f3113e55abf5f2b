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

}  // namespace
}  // namespace fusebox::comm::ucx
