// TcpStoreServer and its client over loopback, including peers that speak
// the wire protocol badly (see Note [TCP store wire protocol] in
// comm/tcp_store_wire.cc; the raw-socket tests re-encode it independently).
#include "comm/tcp_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/free_port.h"

namespace fusebox::comm {
namespace {

using ::testing::HasSubstr;

absl::Time In(absl::Duration d) { return absl::Now() + d; }

using testing_util::FreePort;

// --- An independent encoder for the wire protocol. ---
std::string U32(uint32_t v) {
  return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
}
constexpr uint32_t kMagic = 0x46425831;  // "FBX1"
constexpr uint8_t kSetCmd = 1, kCheckCmd = 5;

std::string Frame(uint8_t cmd, const std::vector<std::string>& args,
                  uint32_t magic = kMagic) {
  std::string out = U32(magic) + std::string(1, static_cast<char>(cmd)) +
                    U32(static_cast<uint32_t>(args.size()));
  for (const std::string& a : args) out += U32(a.size()) + a;
  return out;
}

// A client of the server on `port` (loopback), presenting `token`.
std::unique_ptr<Store> ConnectTo(int port, const std::string& token = "") {
  TcpStoreClientOptions options;
  options.port = port;
  options.token = token;
  options.connect_timeout = absl::Seconds(5);
  auto store = ConnectTcpStore(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

// Waits (up to 2 s) for `count()` to reach `want`; returns its last value.
int64_t AwaitCount(const std::function<int64_t()>& count, int64_t want) {
  const absl::Time deadline = In(absl::Seconds(2));
  while (count() < want && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  return count();
}

// A blocking socket to the server, with a 2 s receive timeout.
class RawConn {
 public:
  explicit RawConn(int port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    connected_ =
        ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    timeval tv{2, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~RawConn() { ::close(fd_); }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;

  bool connected() const { return connected_; }
  bool Send(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  // Reads exactly n bytes, or fewer if the peer closes or 2 s pass.
  std::string Recv(size_t n) {
    std::string out;
    char buf[4096];
    while (out.size() < n) {
      const ssize_t got =
          ::recv(fd_, buf, std::min(sizeof(buf), n - out.size()), 0);
      if (got <= 0) break;
      out.append(buf, got);
    }
    return out;
  }
  // True if the server closed (FIN or RST) within 2 s.
  bool ClosedByPeer() {
    char c;
    const ssize_t n = ::recv(fd_, &c, 1, 0);
    return n == 0 || (n < 0 && errno == ECONNRESET);
  }

 private:
  int fd_;
  bool connected_ = false;
};

class TcpStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TcpStoreServerOptions options;
    options.bind_addr = "127.0.0.1";
    auto server = StartTcpStoreServer(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_GT(server_->port(), 0);
  }

  std::unique_ptr<Store> Connect() { return ConnectTo(server_->port()); }

  int64_t AwaitRejected(int64_t want) {
    return AwaitCount([this] { return server_->rejected_connections(); }, want);
  }

  std::unique_ptr<TcpStoreServer> server_;
};

TEST_F(TcpStoreTest, SetGetAddCheckRoundTrip) {
  auto store = Connect();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Set("k", "v").ok());
  EXPECT_EQ(store->Get("k", absl::Now()).value(), "v");
  const std::string binary(
      "\0\x01\xff"
      "FBX1",
      7);
  ASSERT_TRUE(store->Set(binary, binary).ok());
  EXPECT_EQ(store->Get(binary, absl::Now()).value(), binary);
  ASSERT_TRUE(store->Set("empty", "").ok());
  EXPECT_EQ(store->Get("empty", absl::Now()).value(), "");
  EXPECT_TRUE(store->Check("k").value());
  EXPECT_FALSE(store->Check("nope").value());
  EXPECT_EQ(store->Add("n", 40).value(), 40);
  EXPECT_EQ(store->Add("n", 2).value(), 42);
  EXPECT_EQ(store->Add("neg", -5).value(), -5);
  EXPECT_EQ(store->Get("n", absl::Now()).value(), "42");
  EXPECT_TRUE(store->Wait({"k", "n", "empty"}, absl::Now()).ok());
}

TEST_F(TcpStoreTest, LargestValueRoundTripsAndLargerIsRejected) {
  auto store = Connect();
  ASSERT_NE(store, nullptr);
  std::string big(kMaxStoreValueBytes, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
  ASSERT_TRUE(store->Set("big", big).ok());
  EXPECT_EQ(store->Get("big", absl::Now()).value(), big);

  absl::Status s = store->Set("big", big + "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(kMaxStoreValueBytes + 1)));
  EXPECT_EQ(store->Set(std::string(kMaxStoreKeyBytes + 1, 'k'), "").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(store->Set("after", "ok").ok());  // connection still fine
}

TEST_F(TcpStoreTest, AddOnNonIntegerFailsAndConnectionSurvives) {
  auto store = Connect();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Set("word", "hello").ok());
  absl::StatusOr<int64_t> r = store->Add("word", 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("'word'"));
  EXPECT_EQ(store->Get("word", absl::Now()).value(), "hello");
}

TEST_F(TcpStoreTest, ManyClientThreadsSetAddAndWait) {
  constexpr int kClients = 8, kAdds = 50;
  std::vector<std::unique_ptr<Store>> stores;
  for (int i = 0; i < kClients; ++i) {
    stores.push_back(Connect());
    ASSERT_NE(stores.back(), nullptr);
  }
  std::vector<std::string> done_keys;
  for (int i = 0; i < kClients; ++i)
    done_keys.push_back(absl::StrCat("done/", i));
  std::vector<std::string> seen(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      Store& s = *stores[i];
      for (int a = 0; a < kAdds; ++a) ASSERT_TRUE(s.Add("counter", 1).ok());
      ASSERT_TRUE(s.Set(done_keys[i], absl::StrCat("client", i)).ok());
      ASSERT_TRUE(s.Wait(done_keys, In(absl::Seconds(5))).ok());
      // Everyone has finished adding once every done key is set.
      seen[i] = s.Get("counter", absl::Now()).value();
      EXPECT_EQ(s.Get(done_keys[(i + 1) % kClients], absl::Now()).value(),
                absl::StrCat("client", (i + 1) % kClients));
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(seen[i], absl::StrCat(kClients * kAdds)) << "client " << i;
  }
}

TEST_F(TcpStoreTest, SharedClientIsThreadSafe) {
  auto store = Connect();
  ASSERT_NE(store, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) {
        const std::string key = absl::StrCat("t", t, "/", i);
        ASSERT_TRUE(store->Set(key, key).ok());
        ASSERT_EQ(store->Get(key, absl::Now()).value(), key);
      }
    });
  }
  for (auto& t : threads) t.join();
}

TEST_F(TcpStoreTest, GetBlocksUntilAnotherClientSets) {
  auto getter = Connect();
  auto setter = Connect();
  ASSERT_NE(getter, nullptr);
  ASSERT_NE(setter, nullptr);
  std::thread t([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(setter->Set("late", "value").ok());
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> v = getter->Get("late", In(absl::Seconds(5)));
  t.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "value");
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(45));
}

TEST_F(TcpStoreTest, GetHonoursDeadlineOnMissingKey) {
  auto store = Connect();
  ASSERT_NE(store, nullptr);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> v =
      store->Get("missing/key", start + absl::Milliseconds(150));
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(v.status().message(), HasSubstr("'missing/key'"));
  EXPECT_GE(took, absl::Milliseconds(140));
  EXPECT_LT(took, absl::Seconds(1));
  // A deadline already past still returns a key that is set.
  ASSERT_TRUE(store->Set("present", "p").ok());
  EXPECT_EQ(store->Get("present", absl::Now() - absl::Seconds(1)).value(), "p");
}

TEST_F(TcpStoreTest, WaitNamesMissingKeys) {
  auto store = Connect();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Set("r/0", "").ok());
  ASSERT_TRUE(store->Set("r/2", "").ok());
  absl::Status s =
      store->Wait({"r/0", "r/1", "r/2", "r/3"}, In(absl::Milliseconds(100)));
  ASSERT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("2 of 4 keys not set"));
  EXPECT_THAT(s.message(), HasSubstr("'r/1', 'r/3'"));
  EXPECT_TRUE(store->Check("r/0").value());  // still usable
}

TEST_F(TcpStoreTest, StoreAllGatherNamesMissingRanksOverTcp) {
  auto a = Connect();
  auto b = Connect();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  PrefixStore pa("ucx/addr", *a), pb("ucx/addr", *b);
  const absl::Time deadline = In(absl::Milliseconds(200));
  absl::StatusOr<std::vector<std::string>> r1;
  std::thread t(
      [&] { r1 = StoreAllGather(pb, "ucx/addr", 1, 4, "B", deadline); });
  auto r0 = StoreAllGather(pa, "ucx/addr", 0, 4, "A", deadline);
  t.join();
  for (const auto* r : {&r0, &r1}) {
    ASSERT_EQ(r->status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(r->status().message(),
                HasSubstr("rendezvous 'ucx/addr': ranks 2, 3 of 4 did not "
                          "arrive within"));
  }
}

// Each malformed message closes its own connection only.
struct Malformed {
  const char* name;
  std::string bytes;
};

TEST_F(TcpStoreTest, RejectsMalformedMessage) {
  auto good = Connect();
  ASSERT_NE(good, nullptr);
  ASSERT_TRUE(good->Set("survivor", "1").ok());
  const std::vector<Malformed> cases = {
      {"http", "GET / HTTP/1.1\r\nHost: x\r\n\r\n"},
      {"bad magic", Frame(kSetCmd, {"k", "v"}, 0x46425832)},
      {"unknown command", Frame(99, {"k"})},
      {"wrong arg count", Frame(kSetCmd, {"k"})},
      {"huge length",
       U32(kMagic) + std::string(1, kSetCmd) + U32(2) + U32(1u << 30)},
      {"oversized key",
       Frame(kCheckCmd, {std::string(kMaxStoreKeyBytes + 1, 'k')})},
      {"too many args", U32(kMagic) + std::string(1, 4) + U32(0xffffffffu)},
  };
  int64_t rejected = server_->rejected_connections();
  EXPECT_EQ(rejected, 0);
  for (const Malformed& m : cases) {
    RawConn raw(server_->port());
    ASSERT_TRUE(raw.connected()) << m.name;
    raw.Send(m.bytes);  // may fail part-way once the server has closed
    EXPECT_TRUE(raw.ClosedByPeer()) << m.name;
    EXPECT_EQ(AwaitRejected(rejected + 1), rejected + 1) << m.name;
    rejected = server_->rejected_connections();
    // The server keeps serving everyone else.
    EXPECT_EQ(good->Add("survivor", 1).value(), rejected + 1) << m.name;
  }
}

TEST_F(TcpStoreTest, SlowClientIsBufferedAndDoesNotBlockOthers) {
  auto good = Connect();
  ASSERT_NE(good, nullptr);
  RawConn slow(server_->port());
  ASSERT_TRUE(slow.connected());
  const std::string request = Frame(kSetCmd, {"slow", "value"});
  // Trickle the request a few bytes at a time while another client works.
  for (size_t i = 0; i < request.size(); i += 3) {
    ASSERT_TRUE(slow.Send(request.substr(i, 3)));
    ASSERT_TRUE(good->Set(absl::StrCat("fast", i), "x").ok());
    if (i + 3 < request.size()) {
      EXPECT_FALSE(good->Check("slow").value())
          << "after " << i + 3 << " bytes";
    }
  }
  // Reply: magic, status 0 (OK), no arguments.
  EXPECT_EQ(slow.Recv(9), U32(kMagic) + std::string(1, 0) + U32(0));
  EXPECT_EQ(good->Get("slow", absl::Now()).value(), "value");
  EXPECT_EQ(server_->rejected_connections(), 0);
}

TEST_F(TcpStoreTest, PeerClosingMidRequestIsHandled) {
  auto good = Connect();
  ASSERT_NE(good, nullptr);
  {
    RawConn raw(server_->port());
    ASSERT_TRUE(raw.connected());
    const std::string request =
        Frame(kSetCmd, {"half", std::string(1000, 'v')});
    ASSERT_TRUE(raw.Send(request.substr(0, request.size() / 2)));
  }  // closes
  {
    // A client parked in WAIT that goes away is forgotten too.
    RawConn raw(server_->port());
    ASSERT_TRUE(raw.Send(Frame(4, {std::string(8, '\xff'), "never"})));
  }
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(good->Check("half").value());
  ASSERT_TRUE(good->Set("never", "now").ok());
  EXPECT_EQ(good->Get("never", absl::Now()).value(), "now");
  EXPECT_EQ(server_->rejected_connections(), 0);
}

TEST_F(TcpStoreTest, ServerShutdownWakesParkedClient) {
  auto store = Connect();
  ASSERT_NE(store, nullptr);
  absl::Status waited;
  std::thread t(
      [&] { waited = store->Wait({"forever"}, absl::InfiniteFuture()); });
  absl::SleepFor(absl::Milliseconds(30));
  server_.reset();  // must not hang on the parked request
  t.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable);
  // The connection stays broken, with a clear error.
  absl::Status again = store->Set("x", "y");
  EXPECT_EQ(again.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(again.message(), HasSubstr("TCP store 127.0.0.1:"));
}

TEST(TcpStoreConnectTest, ClientConnectingBeforeServerStartsSucceeds) {
  const int port = FreePort();
  absl::StatusOr<std::unique_ptr<Store>> store;
  std::thread client([&] {
    TcpStoreClientOptions options;
    options.port = port;
    options.connect_timeout = absl::Seconds(5);
    store = ConnectTcpStore(options);
  });
  absl::SleepFor(absl::Milliseconds(100));
  TcpStoreServerOptions server_options;
  server_options.port = port;
  auto server = StartTcpStoreServer(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->port(), port);
  client.join();
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Set("k", "v").ok());
  EXPECT_EQ((*store)->Get("k", absl::Now()).value(), "v");
}

TEST(TcpStoreConnectTest, ConnectTimesOutNamingHostAndPort) {
  const int port = FreePort();
  TcpStoreClientOptions options;
  options.port = port;
  options.connect_timeout = absl::Milliseconds(150);
  const absl::Time start = absl::Now();
  auto store = ConnectTcpStore(options);
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(store.status().message(),
              HasSubstr(absl::StrCat("127.0.0.1:", port)));
  EXPECT_GE(took, absl::Milliseconds(140));
  EXPECT_LT(took, absl::Seconds(1));
}

TEST(TcpStoreConnectTest, FullServerClosesExtraConnections) {
  TcpStoreServerOptions server_options;
  server_options.bind_addr = "127.0.0.1";
  server_options.max_connections = 1;
  auto server = StartTcpStoreServer(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  TcpStoreClientOptions options;
  options.port = (*server)->port();
  auto first = ConnectTcpStore(options);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE((*first)->Set("a", "1").ok());  // accepted before the second
  auto second = ConnectTcpStore(options);
  ASSERT_TRUE(second.ok());  // TCP connects; the server then hangs up
  EXPECT_EQ((*second)->Check("a").status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE((*first)->Check("a").value());
}

TEST(TcpStoreServerTest, RejectsBadOptions) {
  TcpStoreServerOptions options;
  options.port = 70000;
  EXPECT_EQ(StartTcpStoreServer(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  TcpStoreClientOptions client;
  client.port = 0;
  EXPECT_EQ(ConnectTcpStore(client).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fusebox::comm

namespace fusebox::comm {
namespace {

// A server with a job token admits only clients that present it.
class TcpStoreTokenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TcpStoreServerOptions options;
    options.bind_addr = "127.0.0.1";
    options.token = "s3cret-job";
    auto server = StartTcpStoreServer(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  absl::StatusOr<std::unique_ptr<Store>> Connect(const std::string& token) {
    TcpStoreClientOptions o;
    o.port = server_->port();
    o.token = token;
    o.connect_timeout = absl::Seconds(5);
    return ConnectTcpStore(o);
  }
  std::unique_ptr<TcpStoreServer> server_;
};

TEST_F(TcpStoreTokenTest, TheRightTokenWorks) {
  auto a = Connect("s3cret-job");
  auto b = Connect("s3cret-job");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Set("k", "v").ok());
  EXPECT_EQ((*b)->Get("k", In(absl::Seconds(2))).value(), "v");
  EXPECT_EQ(server_->rejected_connections(), 0);
}

TEST_F(TcpStoreTokenTest, AWrongTokenCannotJoin) {
  auto good = Connect("s3cret-job");
  ASSERT_TRUE(good.ok());
  ASSERT_TRUE((*good)->Set("secret", "42").ok());
  for (const char* wrong : {"s3cret-jo", "s3cret-job!", "x"}) {
    auto bad = Connect(wrong);
    ASSERT_FALSE(bad.ok()) << wrong;
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("wrong job token"));
    EXPECT_THAT(std::string(bad.status().message()), ::testing::Not(HasSubstr("s3cret")));
  }
  EXPECT_EQ(server_->rejected_connections(), 3);
  EXPECT_EQ((*good)->Get("secret", In(absl::Seconds(2))).value(), "42");  // still served
}

TEST_F(TcpStoreTokenTest, WithoutATokenNothingCanBeReadOrWritten) {
  auto good = Connect("s3cret-job");
  ASSERT_TRUE(good.ok());
  ASSERT_TRUE((*good)->Set("secret", "42").ok());
  // A client that presents no token: its first request is refused and the
  // connection closed.
  auto anon = Connect("");
  ASSERT_TRUE(anon.ok());
  absl::Status s = (*anon)->Set("secret", "evil");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("requires the job token"));
  EXPECT_FALSE((*anon)->Check("secret").ok());
  // A raw CHECK (command 5) gets the refusal, then the connection closes.
  RawConn raw(server_->port());
  ASSERT_TRUE(raw.connected());
  ASSERT_TRUE(raw.Send(Frame(kCheckCmd, {"secret"})));
  const std::string head = raw.Recv(5);
  ASSERT_EQ(head.size(), 5u);
  EXPECT_EQ(static_cast<uint8_t>(head[4]),
            static_cast<uint8_t>(absl::StatusCode::kPermissionDenied));
  raw.Recv(1 << 16);  // the message
  EXPECT_TRUE(raw.ClosedByPeer());
  EXPECT_EQ((*good)->Get("secret", In(absl::Seconds(2))).value(), "42");
}

TEST(TcpStoreTokenLimitTest, OversizedTokensAreRejected) {
  TcpStoreServerOptions so;
  so.token = std::string(1025, 't');
  EXPECT_EQ(StartTcpStoreServer(so).status().code(), absl::StatusCode::kInvalidArgument);
  TcpStoreClientOptions co;
  co.port = 1;
  co.token = std::string(1025, 't');
  EXPECT_EQ(ConnectTcpStore(co).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TcpStoreTokenLimitTest, ATokenClientWorksWithATokenlessServer) {
  TcpStoreServerOptions so;
  so.bind_addr = "127.0.0.1";
  auto server = StartTcpStoreServer(so);
  ASSERT_TRUE(server.ok());
  TcpStoreClientOptions co;
  co.port = (*server)->port();
  co.token = "anything";
  auto c = ConnectTcpStore(co);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE((*c)->Set("k", "v").ok());
}

}  // namespace
}  // namespace fusebox::comm

namespace fusebox::comm {
namespace {

// Note [TCP store timeouts], with short timeouts.
class TcpStoreTimeoutTest : public ::testing::Test {
 protected:
  static constexpr absl::Duration kTimeout = absl::Milliseconds(200);

  void Start(TcpStoreServerOptions options) {
    options.bind_addr = "127.0.0.1";
    auto server = StartTcpStoreServer(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void StartWithShortTimeouts() {
    TcpStoreServerOptions options;
    options.handshake_timeout = kTimeout;
    options.read_timeout = kTimeout;
    Start(options);
  }
  std::unique_ptr<Store> Connect(const std::string& token = "") {
    return ConnectTo(server_->port(), token);
  }
  int64_t AwaitTimedOut(int64_t want) {
    return AwaitCount([this] { return server_->timed_out_connections(); }, want);
  }

  std::unique_ptr<TcpStoreServer> server_;
};

TEST_F(TcpStoreTimeoutTest, ConnectionThatSendsNothingIsClosed) {
  StartWithShortTimeouts();
  auto good = Connect();
  ASSERT_NE(good, nullptr);
  ASSERT_TRUE(good->Set("k", "v").ok());
  const absl::Time start = absl::Now();
  RawConn silent(server_->port());
  ASSERT_TRUE(silent.connected());
  EXPECT_TRUE(silent.ClosedByPeer());
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, kTimeout - absl::Milliseconds(10));
  EXPECT_LT(took, absl::Seconds(1));
  EXPECT_EQ(AwaitTimedOut(1), 1);
  EXPECT_EQ(server_->rejected_connections(), 0);
  EXPECT_EQ(good->Get("k", absl::Now()).value(), "v");  // others unaffected
}

TEST_F(TcpStoreTimeoutTest, TokenServerClosesConnectionThatNeverSaysHello) {
  TcpStoreServerOptions options;
  options.token = "s3cret-job";
  options.handshake_timeout = kTimeout;
  Start(options);
  RawConn silent(server_->port());
  ASSERT_TRUE(silent.connected());
  // Half a HELLO: the handshake clock is not reset by bytes, only by a
  // whole first request.
  const std::string hello = Frame(6, {"s3cret-job"});
  ASSERT_TRUE(silent.Send(hello.substr(0, 5)));
  EXPECT_TRUE(silent.ClosedByPeer());
  EXPECT_EQ(AwaitTimedOut(1), 1);
  // A client that presents the token at once is admitted and kept.
  auto good = Connect("s3cret-job");
  ASSERT_NE(good, nullptr);
  absl::SleepFor(kTimeout * 2);
  EXPECT_TRUE(good->Set("k", "v").ok());
  EXPECT_EQ(server_->timed_out_connections(), 1);
}

TEST_F(TcpStoreTimeoutTest, HalfAMessageThenSilenceIsClosed) {
  StartWithShortTimeouts();
  RawConn raw(server_->port());
  ASSERT_TRUE(raw.connected());
  // A whole first request (the handshake), answered.
  ASSERT_TRUE(raw.Send(Frame(kSetCmd, {"a", "1"})));
  EXPECT_EQ(raw.Recv(9), U32(kMagic) + std::string(1, 0) + U32(0));
  const std::string request = Frame(kSetCmd, {"half", std::string(1000, 'v')});
  const absl::Time start = absl::Now();
  ASSERT_TRUE(raw.Send(request.substr(0, request.size() / 2)));
  EXPECT_TRUE(raw.ClosedByPeer());
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, kTimeout - absl::Milliseconds(10));
  EXPECT_LT(took, absl::Seconds(1));
  EXPECT_EQ(AwaitTimedOut(1), 1);
  auto good = Connect();
  ASSERT_NE(good, nullptr);
  EXPECT_FALSE(good->Check("half").value());
  EXPECT_TRUE(good->Check("a").value());
}

TEST_F(TcpStoreTimeoutTest, TricklingCannotExtendTheReadTimeout) {
  StartWithShortTimeouts();
  RawConn raw(server_->port());
  ASSERT_TRUE(raw.connected());
  ASSERT_TRUE(raw.Send(Frame(kSetCmd, {"a", "1"})));
  ASSERT_EQ(raw.Recv(9).size(), 9u);
  // One byte every 40 ms: each gap is well inside the timeout, the message
  // is not.
  const std::string request = Frame(kSetCmd, {"slow", std::string(100, 'v')});
  const absl::Time start = absl::Now();
  bool sent_all = true;
  for (char byte : request) {
    if (!raw.Send(std::string(1, byte))) {
      sent_all = false;
      break;
    }
    absl::SleepFor(absl::Milliseconds(40));
    if (server_->timed_out_connections() > 0) {
      sent_all = false;
      break;
    }
  }
  EXPECT_FALSE(sent_all);
  EXPECT_EQ(AwaitTimedOut(1), 1);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

TEST_F(TcpStoreTimeoutTest, SilentClientBetweenRequestsKeepsWorking) {
  StartWithShortTimeouts();
  auto store = Connect();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Set("k", "v").ok());
  absl::SleepFor(kTimeout * 3);  // longer than every timeout
  EXPECT_EQ(store->Get("k", absl::Now()).value(), "v");
  absl::SleepFor(kTimeout * 3);
  EXPECT_EQ(store->Add("n", 1).value(), 1);
  EXPECT_EQ(server_->timed_out_connections(), 0);
}

TEST_F(TcpStoreTimeoutTest, ClientInALongWaitIsNotCut) {
  TcpStoreServerOptions options;
  options.handshake_timeout = kTimeout;
  options.read_timeout = kTimeout;
  options.idle_timeout = kTimeout;  // even with the idle timeout on
  Start(options);
  auto waiter = Connect();
  ASSERT_NE(waiter, nullptr);
  ASSERT_TRUE(waiter->Set("hello", "").ok());  // the handshake
  absl::Status waited;
  absl::StatusOr<std::string> got;
  std::thread t([&] {
    waited = waiter->Wait({"late"}, In(absl::Seconds(5)));
    got = waiter->Get("later", In(absl::Seconds(5)));
  });
  for (const char* key : {"late", "later"}) {
    absl::SleepFor(kTimeout * 4);
    // A fresh setter each time: a silent one would be cut by the idle
    // timeout, as it should.
    auto setter = Connect();
    ASSERT_NE(setter, nullptr);
    ASSERT_TRUE(setter->Set(key, "now").ok());
  }
  t.join();
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_EQ(got.value_or("(failed)"), "now");
  EXPECT_EQ(server_->timed_out_connections(), 0);
}

TEST_F(TcpStoreTimeoutTest, IdleTimeoutWhenEnabledClosesSilentClients) {
  TcpStoreServerOptions options;
  options.idle_timeout = kTimeout;
  Start(options);
  auto store = Connect();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Set("k", "v").ok());
  EXPECT_EQ(AwaitTimedOut(1), 1);
  absl::Status s = store->Set("k", "w");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

TEST(TcpStoreTimeoutOptionsTest, NonPositiveTimeoutsAreRejected) {
  for (absl::Duration bad : {absl::ZeroDuration(), absl::Milliseconds(-1)}) {
    TcpStoreServerOptions options;
    options.read_timeout = bad;
    auto server = StartTcpStoreServer(options);
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(server.status().message()), HasSubstr("read_timeout"));
  }
  TcpStoreServerOptions off;
  off.bind_addr = "127.0.0.1";
  off.handshake_timeout = off.read_timeout = off.idle_timeout = absl::InfiniteDuration();
  EXPECT_TRUE(StartTcpStoreServer(off).ok());
}

}  // namespace
}  // namespace fusebox::comm
