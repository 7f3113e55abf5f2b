// The UCX channel (comm/ucx/channel.h) on its own, without the algorithms:
// two channels in one process, each driven by one thread at a time.
#include <stdlib.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "comm/ucx/channel.h"
#include "gtest/gtest.h"

namespace fusebox::comm::ucx {
namespace {

// Two connected channels, ranks 0 and 1 (ranks 2.. of a larger world are
// not created: a test must not wait on them).
struct Pair {
  std::atomic<bool> abort0{false}, abort1{false};
  std::unique_ptr<Channel> ch[2];

  explicit Pair(int world = 2) {
    ch[0] = std::make_unique<Channel>(0, world, &abort0);
    ch[1] = std::make_unique<Channel>(1, world, &abort1);
  }
  absl::Status Connect(const UcxOptions& options = UcxOptions{}) {
    std::vector<std::string> addresses(2);
    for (int r = 0; r < 2; ++r) {
      absl::StatusOr<std::string> a = ch[r]->Open(options, /*rma=*/false);
      if (!a.ok()) return a.status();
      addresses[r] = *a;
    }
    for (int r = 0; r < 2; ++r) {
      if (absl::Status s = ch[r]->Connect(addresses, false); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
};

TEST(UcxChannelTest, TaggedMessagesArriveWholeAndMatchTheirTag) {
  Pair p;
  ASSERT_TRUE(p.Connect().ok());
  // Two messages with different tags, received in the opposite order from
  // the one they were sent in: each receive gets exactly its own.
  std::vector<int> a(1000), b(10);
  for (int i = 0; i < 1000; ++i) a[i] = 3 * i + 1;
  for (int i = 0; i < 10; ++i) b[i] = -i;
  std::vector<int> got_a(1000, 0), got_b(16, 7);
  absl::Status recv_status, send_status;
  size_t len_a = 0, len_b = 0;
  std::thread receiver([&] {
    Channel& c = *p.ch[0];
    c.set_deadline(absl::Now() + absl::Seconds(30));
    Pending rb, ra;
    c.PostRecv(1, got_b.data(), got_b.size() * sizeof(int), MakeTag(5, 2, 0), &rb);
    c.PostRecv(1, got_a.data(), got_a.size() * sizeof(int), MakeTag(5, 1, 0), &ra);
    recv_status = c.Finish(&rb, "b");
    if (recv_status.ok()) recv_status = c.Finish(&ra, "a");
    len_a = ra.length;
    len_b = rb.length;
  });
  std::thread sender([&] {
    Channel& c = *p.ch[1];
    c.set_deadline(absl::Now() + absl::Seconds(30));
    Pending sa, sb;
    c.PostSend(0, a.data(), a.size() * sizeof(int), MakeTag(5, 1, 0), &sa);
    c.PostSend(0, b.data(), b.size() * sizeof(int), MakeTag(5, 2, 0), &sb);
    send_status = c.Finish(&sa, "a");
    if (send_status.ok()) send_status = c.Finish(&sb, "b");
  });
  receiver.join();
  sender.join();
  ASSERT_TRUE(recv_status.ok()) << recv_status;
  ASSERT_TRUE(send_status.ok()) << send_status;
  EXPECT_EQ(got_a, a);
  EXPECT_EQ(len_a, a.size() * sizeof(int));
  EXPECT_EQ(len_b, b.size() * sizeof(int));
  EXPECT_EQ(std::vector<int>(got_b.begin(), got_b.begin() + 10), b);
  EXPECT_EQ(got_b[10], 7) << "wrote past the message";
}

TEST(UcxChannelTest, AWaitPastTheDeadlineNamesThePeerAndWhat) {
  Pair p;
  ASSERT_TRUE(p.Connect().ok());
  Channel& c = *p.ch[0];
  int buf = 0;
  Pending r;
  c.set_deadline(absl::Now() + absl::Milliseconds(50));
  const absl::Time start = absl::Now();
  c.PostRecv(1, &buf, sizeof(buf), MakeTag(1, 1, 0), &r);
  absl::Status s = c.Finish(&r, "ring receive");
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_NE(s.message().find("still waiting for rank 1 (ring receive)"), std::string::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  c.Release(&r, /*is_recv=*/true);
  EXPECT_EQ(r.request, nullptr);
}

// Over TCP only, a channel told to sleep when idle waits on the worker's
// event fd: a message sent while it sleeps still wakes it (long before the
// 10 ms bound runs out 100 times), and a deadline still ends a wait that
// nothing will end.
TEST(UcxChannelTest, ASleepingChannelWakesForAMessageAndStillMeetsItsDeadline) {
  Pair p;
  UcxOptions tcp;
  tcp.transports = "tcp";
  ASSERT_TRUE(p.Connect(tcp).ok());
  for (auto& c : p.ch) {
    c->set_sleep_when_idle(true);  // no yields first: sleeps at every idle poll
    c->set_deadline(absl::Now() + absl::Seconds(30));
  }
  const absl::Time rounds_start = absl::Now();
  for (int round = 0; round < 100; ++round) {
    int got = -1;
    const int sent = 1000 + round;
    absl::Status recv_status, send_status;
    std::thread receiver([&] {
      Pending r;
      p.ch[0]->PostRecv(1, &got, sizeof(got), MakeTag(round, 1, 0), &r);
      recv_status = p.ch[0]->Finish(&r, "receive");
    });
    std::thread sender([&] {
      absl::SleepFor(absl::Microseconds(200));  // the receiver is asleep by now
      Pending s;
      p.ch[1]->PostSend(0, &sent, sizeof(sent), MakeTag(round, 1, 0), &s);
      send_status = p.ch[1]->Finish(&s, "send");
    });
    receiver.join();
    sender.join();
    ASSERT_TRUE(recv_status.ok()) << recv_status;
    ASSERT_TRUE(send_status.ok()) << send_status;
    ASSERT_EQ(got, sent);
  }
  // Woken by the message, not by the bound: 100 rounds that each waited out
  // a 10 ms sleep would take a second at least.
  EXPECT_LT(absl::Now() - rounds_start, absl::Seconds(1));
  // No yields before sleeping were asked for.
  EXPECT_EQ(p.ch[0]->idle_yields(), 0u);
  EXPECT_GT(p.ch[0]->idle_sleeps(), 0u);
  Channel& c = *p.ch[0];
  int buf = 0;
  Pending r;
  c.set_deadline(absl::Now() + absl::Milliseconds(50));
  const absl::Time start = absl::Now();
  c.PostRecv(1, &buf, sizeof(buf), MakeTag(1, 2, 0), &r);
  const absl::Status s = c.Finish(&r, "receive");
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  c.Release(&r, /*is_recv=*/true);
}

// Note [Waiting where ranks outnumber cores]: sleeping when idle after 3
// yields, a wait first yields (3 times per run of idle polls) and then
// sleeps, instead of yielding at every poll or sleeping at once; a message
// sent once it sleeps still wakes it.
TEST(UcxChannelTest, ASleepingChannelYieldsAFewTimesBeforeItSleeps) {
  Pair p;
  UcxOptions tcp;
  tcp.transports = "tcp";
  ASSERT_TRUE(p.Connect(tcp).ok());
  for (auto& c : p.ch) c->set_deadline(absl::Now() + absl::Seconds(30));
  Channel& waiter = *p.ch[0];
  waiter.set_sleep_when_idle(true, /*yields=*/3);
  int got = -1;
  const int sent = 42;
  absl::Status recv_status, send_status;
  std::atomic<bool> asleep{false};
  std::thread receiver([&] {
    Pending r;
    waiter.PostRecv(1, &got, sizeof(got), MakeTag(1, 1, 0), &r);
    // Wait (as Finish does) until it has slept once; nothing is sent before.
    while (recv_status.ok() && waiter.idle_sleeps() == 0) recv_status = waiter.Progress(1);
    asleep = true;
    if (recv_status.ok()) recv_status = waiter.Finish(&r, "receive");
  });
  std::thread sender([&] {
    while (!asleep) absl::SleepFor(absl::Microseconds(100));
    Pending s;
    p.ch[1]->PostSend(0, &sent, sizeof(sent), MakeTag(1, 1, 0), &s);
    send_status = p.ch[1]->Finish(&s, "send");
  });
  receiver.join();
  sender.join();
  ASSERT_TRUE(recv_status.ok()) << recv_status;
  ASSERT_TRUE(send_status.ok()) << send_status;
  EXPECT_EQ(got, sent);
  EXPECT_GE(waiter.idle_yields(), 3u);
  EXPECT_GE(waiter.idle_sleeps(), 1u);
  // At most 3 yields per run of idle polls, and a run ends only when a poll
  // progresses: far fewer than a wait that yields at every poll makes.
  EXPECT_LT(waiter.idle_yields(), 600u);
}

TEST(UcxChannelTest, AFailureNoticeAbortsAPeerWaitingOnSomeoneElse) {
  // Rank 0 waits for rank 2 (which never sends); rank 1 gives up on
  // collective 7 and says so: rank 0's wait ends as Aborted naming rank 1
  // and the collective, long before its own deadline.
  Pair p(/*world=*/3);
  std::vector<std::string> addresses(3);
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<std::string> a = p.ch[r]->Open(UcxOptions{}, false);
    ASSERT_TRUE(a.ok()) << a.status();
    addresses[r] = *a;
  }
  addresses[2] = addresses[1];  // an endpoint that nobody answers on behalf of rank 2
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(p.ch[r]->Connect(addresses, false).ok());
  std::atomic<bool> stop{false};
  absl::Status waited;
  const absl::Time start = absl::Now();
  std::thread waiter([&] {
    Channel& c = *p.ch[0];
    c.set_deadline(absl::Now() + absl::Seconds(60));
    int buf = 0;
    Pending r;
    c.PostRecv(2, &buf, sizeof(buf), MakeTag(7, 1, 0), &r);
    waited = c.Finish(&r, "receive");
    c.Release(&r, true);
    stop = true;
  });
  std::thread quitter([&] {
    Channel& c = *p.ch[1];
    c.NotifyPeers(7);
    while (!stop) (void)c.Progress(-1);  // deliver what is still queued
  });
  waiter.join();
  quitter.join();
  EXPECT_TRUE(absl::IsAborted(waited)) << waited;
  EXPECT_NE(waited.message().find("rank 1 gave up on collective seq=7"), std::string::npos)
      << waited;
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

// Note [A peer that left first]: rank 0 waits for rank 1, which never
// sends, and watches for rank 2's message, which decides the call. Rank 1
// leaves (its endpoints close) and rank 2 sends only 300 ms later: rank 0's
// wait must still end with rank 2's message, not with rank 1 unreachable,
// and rank 1's failure is still reported once the grace has run out.
TEST(UcxChannelTest, APeerThatLeftFirstDoesNotFailAWaitAnotherPeerSettles) {
  constexpr int kWorld = 3;
  std::atomic<bool> abort[kWorld] = {false, false, false};
  std::unique_ptr<Channel> ch[kWorld];
  std::vector<std::string> addresses(kWorld);
  UcxOptions tcp;
  tcp.transports = "tcp";
  for (int r = 0; r < kWorld; ++r) {
    ch[r] = std::make_unique<Channel>(r, kWorld, &abort[r]);
    absl::StatusOr<std::string> a = ch[r]->Open(tcp, /*rma=*/false);
    ASSERT_TRUE(a.ok()) << a.status();
    addresses[r] = *a;
  }
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(ch[r]->Connect(addresses, /*detect_peer_failure=*/true).ok());
    ch[r]->set_deadline(absl::Now() + absl::Seconds(30));
  }
  std::atomic<bool> hello_in{false};
  std::atomic<int64_t> left_at_ns{0};
  int64_t settled_at_ns = 0, reported_at_ns = 0;
  absl::Status waited, later;
  int from2 = -1;
  absl::Duration reported_after;
  std::thread waiter([&] {
    Channel& c = *ch[0];
    int hello = 0, never = 0;
    Pending h, r1, r2;
    // Rank 1's hello first, so that a connection to it exists to close.
    c.PostRecv(1, &hello, sizeof(hello), MakeTag(1, 1, 0), &h);
    waited = c.Finish(&h, "hello");
    hello_in = true;
    if (!waited.ok()) return;
    c.PostRecv(1, &never, sizeof(never), MakeTag(1, 2, 0), &r1);
    c.PostRecv(2, &from2, sizeof(from2), MakeTag(1, 3, 0), &r2);
    while (!r2.done && waited.ok()) waited = c.Progress(1);
    settled_at_ns = absl::GetCurrentTimeNanos();
    while (later.ok()) later = c.Progress(1);
    reported_at_ns = absl::GetCurrentTimeNanos();
    reported_after = absl::Now() - absl::FromUnixNanos(left_at_ns.load());
    c.Release(&r1, /*is_recv=*/true);
    c.Release(&r2, /*is_recv=*/true);
  });
  std::thread leaver([&] {
    Channel& c = *ch[1];
    const int hello = 1;
    Pending s;
    c.PostSend(0, &hello, sizeof(hello), MakeTag(1, 1, 0), &s);
    const absl::Status sent = c.Finish(&s, "hello");
    EXPECT_TRUE(sent.ok()) << sent;  // and leave anyway: the others must not wait forever
    while (sent.ok() && !hello_in) (void)c.Progress(-1);
    c.Close(/*force=*/true);
    ch[1].reset();
    left_at_ns = absl::GetCurrentTimeNanos();
  });
  std::thread settler([&] {
    while (left_at_ns.load() == 0) absl::SleepFor(absl::Milliseconds(1));
    absl::SleepFor(absl::Milliseconds(300));  // rank 0 has long seen rank 1 gone
    Channel& c = *ch[2];
    const int verdict = 42;
    Pending s;
    c.PostSend(0, &verdict, sizeof(verdict), MakeTag(1, 3, 0), &s);
    EXPECT_TRUE(c.Finish(&s, "verdict").ok());
  });
  leaver.join();
  settler.join();
  waiter.join();
  ASSERT_TRUE(waited.ok()) << waited;
  EXPECT_EQ(from2, 42);
  EXPECT_TRUE(absl::IsUnavailable(later)) << later;
  EXPECT_NE(later.message().find("rank 1 is unreachable"), std::string::npos) << later;
  EXPECT_GE(reported_after, absl::Milliseconds(900));
  EXPECT_LT(reported_after, absl::Seconds(10));
  // The failure was reported about a grace after it was seen, which was
  // before rank 2's message settled the wait: reported less than a grace
  // after the settling, so the grace was running while rank 0 waited.
  EXPECT_LT(absl::FromUnixNanos(reported_at_ns) - absl::FromUnixNanos(settled_at_ns),
            absl::Seconds(1));
}

TEST(UcxChannelTest, TheAbortFlagCancelsAWait) {
  Pair p;
  ASSERT_TRUE(p.Connect().ok());
  Channel& c = *p.ch[0];
  int buf = 0;
  Pending r;
  c.PostRecv(1, &buf, sizeof(buf), MakeTag(2, 1, 0), &r);
  p.abort0 = true;
  absl::Status s = c.Finish(&r, "receive");
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  c.Release(&r, true);
}

TEST(UcxChannelTest, BadAddressesAreRefusedNamingTheRank) {
  Pair p;
  absl::StatusOr<std::string> a0 = p.ch[0]->Open(UcxOptions{}, false);
  ASSERT_TRUE(a0.ok()) << a0.status();
  absl::Status s = p.ch[0]->Connect({*a0}, false);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  s = p.ch[0]->Connect({*a0, ""}, false);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("rank 1 published a malformed UCX address (0 bytes)"),
            std::string::npos)
      << s;
}

TEST(UcxChannelTest, ABadUcxOptionIsNamed) {
  std::atomic<bool> abort{false};
  Channel c(0, 1, &abort);
  UcxOptions o;
  o.ucx_config = {{"RNDV_THRESH", "lots"}};
  absl::StatusOr<std::string> a = c.Open(o, false);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("UCX option RNDV_THRESH=lots"), std::string::npos)
      << a.status();
}

// Unsets UCX's environment variables for the settings below and puts back
// what was there when it goes.
class UcxEnvironmentGuard {
 public:
  UcxEnvironmentGuard() {
    for (const char* name : kNames) {
      const char* v = std::getenv(name);
      saved_.push_back(v != nullptr ? std::optional<std::string>(v) : std::nullopt);
      unsetenv(name);
    }
  }
  ~UcxEnvironmentGuard() {
    for (size_t i = 0; i < saved_.size(); ++i) {
      if (saved_[i].has_value()) {
        setenv(kNames[i], saved_[i]->c_str(), 1);
      } else {
        unsetenv(kNames[i]);
      }
    }
  }

 private:
  static constexpr const char* kNames[] = {"UCX_RNDV_THRESH", "UCX_TCP_RX_SEG_SIZE",
                                           "UCX_RX_SEG_SIZE"};
  std::vector<std::optional<std::string>> saved_;
};

TEST(UcxChannelTest, TcpOnlyTransportsSendChunksEagerlyUnlessTheUserSetTheThreshold) {
  UcxEnvironmentGuard environment;
  using Settings = std::vector<std::pair<std::string, std::string>>;
  UcxOptions o;
  o.tcp_eager_bytes = 262144;
  // Where every transport is TCP: eager up to 256 KiB, in receive segments
  // that large.
  const Settings eager = {{"RNDV_THRESH", "262144"}, {"RX_SEG_SIZE", "262144"}};
  const auto with = [](Settings head, const Settings& tail) {
    head.insert(head.end(), tail.begin(), tail.end());
    return head;
  };
  // The default transports include shared memory: UCX's own settings.
  EXPECT_EQ(UcxSettings(o), (Settings{{"TLS", o.transports}}));
  o.transports = "tcp";
  EXPECT_EQ(UcxSettings(o), with({{"TLS", "tcp"}}, eager));
  o.transports = "self,tcp";
  EXPECT_EQ(UcxSettings(o), with({{"TLS", "self,tcp"}}, eager));
  o.transports = "tcp,rc";  // RDMA: rendezvous is its zero-copy path
  EXPECT_EQ(UcxSettings(o), (Settings{{"TLS", "tcp,rc"}}));
  o.transports = "";  // UCX's choice of transports, hence of threshold
  EXPECT_EQ(UcxSettings(o), Settings{});
  o.transports = "tcp";
  o.ucx_config = {{"rndv_thresh", "8k"}};  // the user's wins, whatever its case
  EXPECT_EQ(UcxSettings(o),
            (Settings{{"TLS", "tcp"}, {"RX_SEG_SIZE", "262144"}, {"rndv_thresh", "8k"}}));
  o.ucx_config = {{"RX_SEG_SIZE", "64k"}};
  EXPECT_EQ(UcxSettings(o),
            (Settings{{"TLS", "tcp"}, {"RNDV_THRESH", "262144"}, {"RX_SEG_SIZE", "64k"}}));
  o.ucx_config.clear();
  // Segments only where the limit is above UCX's 64 KiB, and at most 1 MiB.
  o.tcp_eager_bytes = 4096;
  EXPECT_EQ(UcxSettings(o), (Settings{{"TLS", "tcp"}, {"RNDV_THRESH", "4096"}}));
  o.tcp_eager_bytes = size_t{8} << 20;
  EXPECT_EQ(UcxSettings(o),
            (Settings{{"TLS", "tcp"}, {"RNDV_THRESH", "8388608"}, {"RX_SEG_SIZE", "1048576"}}));
  o.tcp_eager_bytes = 0;
  EXPECT_EQ(UcxSettings(o), (Settings{{"TLS", "tcp"}}));
  o.tcp_eager_bytes = 262144;
  // ucx_config's TLS is the one UCX gets: it decides, either way.
  o.transports = "tcp";
  o.ucx_config = {{"TLS", "rc,tcp"}};
  EXPECT_EQ(UcxSettings(o), (Settings{{"TLS", "tcp"}, {"TLS", "rc,tcp"}}));
  o.transports = "sysv,tcp";
  o.ucx_config = {{"tls", " TCP , self"}};
  EXPECT_EQ(UcxSettings(o), with(with({{"TLS", "sysv,tcp"}}, eager), {{"tls", " TCP , self"}}));
  // UCX's own environment variables, already read, stand.
  o.ucx_config.clear();
  o.transports = "tcp";
  ASSERT_EQ(setenv("UCX_RNDV_THRESH", "16k", 1), 0);
  ASSERT_EQ(setenv("UCX_TCP_RX_SEG_SIZE", "32k", 1), 0);
  EXPECT_EQ(UcxSettings(o), (Settings{{"TLS", "tcp"}}));
  ASSERT_EQ(unsetenv("UCX_RNDV_THRESH"), 0);
  ASSERT_EQ(unsetenv("UCX_TCP_RX_SEG_SIZE"), 0);
  EXPECT_EQ(UcxSettings(o), with({{"TLS", "tcp"}}, eager));
}

}  // namespace
}  // namespace fusebox::comm::ucx
