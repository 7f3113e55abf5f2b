// Environment parsing and TCP rendezvous with ranks as threads over loopback.
#include "comm/rendezvous.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/free_port.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/free_port.h"

namespace fusebox::comm {
namespace {

using ::testing::HasSubstr;

// A fake environment; the returned getenv borrows `vars`.
using Env = std::map<std::string, std::string>;
std::function<const char*(const char*)> GetEnvOf(const Env& vars) {
  return [&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

using testing_util::FreePort;

TEST(RendezvousEnvTest, ParsesEveryVariable) {
  const Env env = {{"RANK", "3"},
                   {"WORLD_SIZE", "8"},
                   {"LOCAL_RANK", "1"},
                   {"MASTER_ADDR", "node17"},
                   {"MASTER_PORT", "1234"},
                   {"FUSEBOX_AGENT_STORE", "1"},
                   {"FUSEBOX_RENDEZVOUS_TIMEOUT_S", "2.5"},
                   {"FUSEBOX_JOB_TOKEN", "tok"}};
  auto o = RendezvousOptionsFromEnv(GetEnvOf(env));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->job_token, "tok");
  EXPECT_EQ(o->rank, 3);
  EXPECT_EQ(o->world_size, 8);
  EXPECT_EQ(o->local_rank, 1);
  EXPECT_EQ(o->master_addr, "node17");
  EXPECT_EQ(o->master_port, 1234);
  EXPECT_TRUE(o->agent_store);
  EXPECT_EQ(o->timeout, absl::Milliseconds(2500));
}

TEST(RendezvousEnvTest, FuseboxStoreVariablesLeaveMasterPortToTheJob) {
  // fusebox-run: its store on FUSEBOX_STORE_*, MASTER_* free for torch.
  const Env env = {{"RANK", "1"},          {"WORLD_SIZE", "2"},
                   {"MASTER_ADDR", "a"},   {"MASTER_PORT", "1234"},
                   {"FUSEBOX_STORE_ADDR", "b"}, {"FUSEBOX_STORE_PORT", "4321"},
                   {"FUSEBOX_AGENT_STORE", "1"}};
  auto o = RendezvousOptionsFromEnv(GetEnvOf(env));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->master_addr, "b");
  EXPECT_EQ(o->master_port, 4321);
  EXPECT_TRUE(o->agent_store);
  auto bad = RendezvousOptionsFromEnv(
      GetEnvOf({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"FUSEBOX_STORE_PORT", "0"}}));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("FUSEBOX_STORE_PORT='0'"), std::string::npos)
      << bad.status();
}

TEST(RendezvousEnvTest, UnderTorchrunsAgentStoreRankZeroHostsOnTheNextPort) {
  // torchrun's agent already serves torch's store on MASTER_PORT.
  const Env env = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", "29500"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  auto o = RendezvousOptionsFromEnv(GetEnvOf(env));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->master_port, 29501);
  EXPECT_FALSE(o->agent_store);
  Env last = env;
  last["MASTER_PORT"] = "65535";
  EXPECT_FALSE(RendezvousOptionsFromEnv(GetEnvOf(last)).ok());
}

TEST(RendezvousEnvTest, DefaultsWhenOptionalVariablesAreUnset) {
  const Env env = {{"RANK", "0"}, {"WORLD_SIZE", "1"}};
  auto o = RendezvousOptionsFromEnv(GetEnvOf(env));
  ASSERT_TRUE(o.ok()) << o.status();
  const RendezvousOptions defaults;
  EXPECT_EQ(o->rank, 0);
  EXPECT_EQ(o->world_size, 1);
  EXPECT_EQ(o->local_rank, 0);
  EXPECT_EQ(o->master_addr, defaults.master_addr);
  EXPECT_EQ(o->master_port, defaults.master_port);
  EXPECT_FALSE(o->agent_store);
  EXPECT_EQ(o->timeout, defaults.timeout);
}

TEST(RendezvousEnvTest, NotFoundWhenRankOrWorldSizeIsUnset) {
  auto no_rank = RendezvousOptionsFromEnv(GetEnvOf({{"WORLD_SIZE", "2"}}));
  EXPECT_EQ(no_rank.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(no_rank.status().message(), HasSubstr("RANK"));
  auto no_world = RendezvousOptionsFromEnv(GetEnvOf({{"RANK", "0"}}));
  EXPECT_EQ(no_world.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(no_world.status().message(), HasSubstr("WORLD_SIZE"));
  EXPECT_EQ(RendezvousOptionsFromEnv(GetEnvOf({})).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(RendezvousEnvTest, RejectsBadValuesNamingVariableAndValue) {
  struct Case {
    std::string var, value;
  };
  const std::vector<Case> cases = {
      {"RANK", "abc"},
      {"RANK", "4"},
      {"RANK", "-1"},
      {"RANK", ""},
      {"WORLD_SIZE", "0"},
      {"WORLD_SIZE", "2x"},
      {"WORLD_SIZE", "99999999999"},
      {"LOCAL_RANK", "4"},
      {"LOCAL_RANK", "one"},
      {"MASTER_ADDR", ""},
      {"MASTER_PORT", "0"},
      {"MASTER_PORT", "65536"},
      {"MASTER_PORT", "29500a"},
      {"FUSEBOX_AGENT_STORE", "maybe"},
      {"FUSEBOX_RENDEZVOUS_TIMEOUT_S", "-1"},
      {"FUSEBOX_RENDEZVOUS_TIMEOUT_S", "0"},
      {"FUSEBOX_RENDEZVOUS_TIMEOUT_S", "soon"},
      {"FUSEBOX_RENDEZVOUS_TIMEOUT_S", "inf"},
  };
  for (const Case& c : cases) {
    Env env = {{"RANK", "1"}, {"WORLD_SIZE", "4"}};
    env[c.var] = c.value;
    auto o = RendezvousOptionsFromEnv(GetEnvOf(env));
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument)
        << c.var << "=" << c.value;
    EXPECT_THAT(o.status().message(),
                HasSubstr(absl::StrCat(c.var, "='", c.value, "'")));
  }
}

// Runs ConnectTcpRendezvous for each of `ranks` on its own thread.
std::vector<absl::StatusOr<Rendezvous>> ConnectRanks(
    const std::vector<RendezvousOptions>& ranks) {
  std::vector<absl::StatusOr<Rendezvous>> out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    out.emplace_back(absl::UnknownError("not run"));
  }
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] { out[i] = ConnectTcpRendezvous(ranks[i]); });
  }
  for (auto& t : threads) t.join();
  return out;
}

RendezvousOptions Rank(int rank, int world, int port, absl::Duration timeout) {
  RendezvousOptions o;
  o.rank = rank;
  o.world_size = world;
  o.local_rank = rank;
  o.master_addr = "127.0.0.1";
  o.master_port = port;
  o.timeout = timeout;
  return o;
}

TEST(RendezvousTest, ThreeRanksConnectOverLoopback) {
  const int port = FreePort();
  std::vector<RendezvousOptions> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.push_back(Rank(r, 3, port, absl::Seconds(10)));
  auto rdv = ConnectRanks(ranks);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(rdv[r].ok()) << "rank " << r << ": " << rdv[r].status();
    EXPECT_EQ(rdv[r]->rank, r);
    EXPECT_EQ(rdv[r]->size, 3);
    EXPECT_EQ(rdv[r]->local_rank, r);
    EXPECT_EQ(rdv[r]->server != nullptr, r == 0) << "rank " << r;
    ASSERT_NE(rdv[r]->store, nullptr);
  }
  EXPECT_EQ(rdv[0]->server->port(), port);
  // The stores reach one another.
  ASSERT_TRUE(rdv[2]->store->Set("from2", "hello").ok());
  EXPECT_EQ(rdv[1]->store->Get("from2", absl::Now() + absl::Seconds(1)).value(),
            "hello");
  EXPECT_TRUE(rdv[0]->store->Check("rdv/2").value());
}

TEST(RendezvousTest, ARankWithTheWrongJobTokenCannotJoin) {
  const int port = FreePort();
  std::vector<RendezvousOptions> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(Rank(r, 2, port, absl::Seconds(3)));
    ranks.back().job_token = r == 0 ? "job-a" : "job-b";
  }
  auto rdv = ConnectRanks(ranks);
  ASSERT_FALSE(rdv[1].ok());
  EXPECT_EQ(rdv[1].status().code(), absl::StatusCode::kPermissionDenied) << rdv[1].status();
  EXPECT_THAT(std::string(rdv[1].status().message()), HasSubstr("wrong job token"));
  // Rank 0 waited for a rank 1 that never got in, and says so.
  ASSERT_FALSE(rdv[0].ok());
  EXPECT_THAT(std::string(rdv[0].status().message()), HasSubstr("1"));
}

TEST(RendezvousTest, ALocalJobsStoreListensOnLoopbackOnly) {
  EXPECT_EQ(StoreBindAddressFor("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(StoreBindAddressFor("localhost"), "127.0.0.1");
  EXPECT_EQ(StoreBindAddressFor("10.1.2.3"), "0.0.0.0");
}

TEST(RendezvousTest, AgentHostedStoreIsUsedByEveryRank) {
  TcpStoreServerOptions server_options;
  server_options.bind_addr = "127.0.0.1";
  auto server = StartTcpStoreServer(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<RendezvousOptions> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(Rank(r, 2, (*server)->port(), absl::Seconds(10)));
    ranks.back().agent_store = true;
  }
  auto rdv = ConnectRanks(ranks);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(rdv[r].ok()) << "rank " << r << ": " << rdv[r].status();
    EXPECT_EQ(rdv[r]->server, nullptr);
  }
}

TEST(RendezvousTest, MissingRankIsNamedWithinTheTimeout) {
  const int port = FreePort();
  // Ranks 0 and 1 of 3 start; rank 2 never does.
  std::vector<RendezvousOptions> ranks = {
      Rank(0, 3, port, absl::Milliseconds(300)),
      Rank(1, 3, port, absl::Milliseconds(300))};
  const absl::Time start = absl::Now();
  auto rdv = ConnectRanks(ranks);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(rdv[r].status().code(), absl::StatusCode::kDeadlineExceeded)
        << "rank " << r << ": " << rdv[r].status();
    EXPECT_THAT(rdv[r].status().message(),
                HasSubstr("rank 2 of 3 did not arrive within"));
  }
}

TEST(RendezvousTest, DisagreementOnWorldSizeIsReported) {
  const int port = FreePort();
  // Rank 1 believes the world has 3 ranks; rank 0 believes 2.
  auto rdv = ConnectRanks({Rank(0, 2, port, absl::Milliseconds(300)),
                           Rank(1, 3, port, absl::Milliseconds(300))});
  EXPECT_EQ(rdv[0].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(rdv[0].status().message(),
              HasSubstr("rank 1 has WORLD_SIZE=3 but rank 0 has 2"));
  EXPECT_FALSE(rdv[1].ok());
}

TEST(RendezvousTest, RejectsInvalidOptions) {
  EXPECT_EQ(
      ConnectTcpRendezvous(Rank(3, 3, 1234, absl::Seconds(1))).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ConnectTcpRendezvous(Rank(0, 1, 0, absl::Seconds(1))).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(RendezvousTest, ConnectFailureNamesTheMaster) {
  const int port = FreePort();
  auto rdv = ConnectTcpRendezvous(Rank(1, 2, port, absl::Milliseconds(100)));
  ASSERT_FALSE(rdv.ok());
  EXPECT_THAT(rdv.status().message(),
              HasSubstr(absl::StrCat("127.0.0.1:", port)));
}

// A port picked for another process's listener lies below the ephemeral
// range, where no outgoing connection can take it, and can be bound.
TEST(PickFreePortTest, PicksABindablePortBelowTheEphemeralRange) {
  int ephemeral_low = 32768;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d", &ephemeral_low) != 1) ephemeral_low = 32768;
    std::fclose(f);
  }
  if (ephemeral_low < 11000) GTEST_SKIP() << "ephemeral range starts at " << ephemeral_low;
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<int> port = PickFreePort("127.0.0.1");
    ASSERT_TRUE(port.ok()) << port.status();
    EXPECT_GE(*port, 10000);
    EXPECT_LT(*port, ephemeral_low);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(*port));
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << *port;
    ::close(fd);
  }
}

}  // namespace
}  // namespace fusebox::comm
