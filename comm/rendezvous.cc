#include "comm/rendezvous.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/tcp_store_wire.h"

namespace fusebox::comm {
namespace {

using GetEnv = std::function<const char*(const char*)>;

std::optional<std::string> Lookup(const GetEnv& getenv, const char* name) {
  const char* v = getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

absl::Status BadVar(const char* name, absl::string_view value,
                    absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("environment variable ", name, "='", value, "' ", why));
}

// Parses `value` of variable `name` as a decimal int in [lo, hi].
absl::StatusOr<int> ParseIntVar(const char* name, const std::string& value,
                                int lo, int hi, absl::string_view range) {
  int v = 0;
  if (!absl::SimpleAtoi(value, &v)) {
    return BadVar(name, value, "is not an integer");
  }
  if (v < lo || v > hi) {
    return BadVar(name, value, absl::StrCat("is out of range ", range));
  }
  return v;
}

}  // namespace

absl::StatusOr<RendezvousOptions> RendezvousOptionsFromEnv(
    const std::function<const char*(const char*)>& getenv) {
  RendezvousOptions o;
  const std::optional<std::string> rank = Lookup(getenv, "RANK");
  const std::optional<std::string> world = Lookup(getenv, "WORLD_SIZE");
  if (!rank.has_value() || !world.has_value()) {
    return absl::NotFoundError(absl::StrCat(
        "environment variable ", rank.has_value() ? "WORLD_SIZE" : "RANK",
        " is not set (not started by a launcher such as torchrun, mpirun "
        "or fusebox-run?)"));
  }
  absl::StatusOr<int> w =
      ParseIntVar("WORLD_SIZE", *world, 1, INT_MAX, "[1, 2^31)");
  if (!w.ok()) return w.status();
  o.world_size = *w;
  const std::string rank_range = absl::StrCat("[0, WORLD_SIZE=", *w, ")");
  absl::StatusOr<int> r = ParseIntVar("RANK", *rank, 0, *w - 1, rank_range);
  if (!r.ok()) return r.status();
  o.rank = *r;

  if (std::optional<std::string> v = Lookup(getenv, "LOCAL_RANK")) {
    absl::StatusOr<int> lr =
        ParseIntVar("LOCAL_RANK", *v, 0, *w - 1, rank_range);
    if (!lr.ok()) return lr.status();
    o.local_rank = *lr;
  }
  if (std::optional<std::string> v = Lookup(getenv, "MASTER_ADDR")) {
    if (v->empty()) return BadVar("MASTER_ADDR", *v, "is empty");
    o.master_addr = *v;
  }
  if (std::optional<std::string> v = Lookup(getenv, "MASTER_PORT")) {
    absl::StatusOr<int> port =
        ParseIntVar("MASTER_PORT", *v, 1, 65535, "[1, 65535]");
    if (!port.ok()) return port.status();
    o.master_port = *port;
  }
  // Note [Whose port]: fusebox's store has variables of its own, so that
  // MASTER_ADDR/MASTER_PORT stay free for the job's own rendezvous (torch's
  // env:// binds MASTER_PORT on rank 0). fusebox-run sets both. Under
  // torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE), torch's store
  // already holds MASTER_PORT: rank 0 hosts fusebox's on the next port.
  const std::optional<std::string> store_addr = Lookup(getenv, "FUSEBOX_STORE_ADDR");
  const std::optional<std::string> store_port = Lookup(getenv, "FUSEBOX_STORE_PORT");
  if (store_addr.has_value()) {
    if (store_addr->empty()) return BadVar("FUSEBOX_STORE_ADDR", *store_addr, "is empty");
    o.master_addr = *store_addr;
  }
  if (store_port.has_value()) {
    absl::StatusOr<int> port =
        ParseIntVar("FUSEBOX_STORE_PORT", *store_port, 1, 65535, "[1, 65535]");
    if (!port.ok()) return port.status();
    o.master_port = *port;
  } else if (std::optional<std::string> v = Lookup(getenv, "TORCHELASTIC_USE_AGENT_STORE");
             v.has_value() && (*v == "True" || *v == "true" || *v == "1")) {
    if (o.master_port >= 65535) {
      return BadVar("MASTER_PORT", absl::StrCat(o.master_port),
                    "leaves no next port for fusebox's store under torchrun's agent store "
                    "(set FUSEBOX_STORE_PORT)");
    }
    o.master_port += 1;
  }
  if (std::optional<std::string> v = Lookup(getenv, "FUSEBOX_AGENT_STORE")) {
    if (!absl::SimpleAtob(*v, &o.agent_store)) {
      return BadVar("FUSEBOX_AGENT_STORE", *v, "is not a boolean (0 or 1)");
    }
  }
  if (std::optional<std::string> v = Lookup(getenv, "FUSEBOX_JOB_TOKEN")) {
    if (v->size() > tcp_store_wire::kMaxTokenBytes) {
      return absl::InvalidArgumentError(absl::StrCat("FUSEBOX_JOB_TOKEN is ", v->size(),
                                                     " bytes long; the limit is ",
                                                     tcp_store_wire::kMaxTokenBytes));
    }
    o.job_token = *v;
  }
  auto timeout = SecondsFromEnv(getenv, "FUSEBOX_RENDEZVOUS_TIMEOUT_S");
  if (!timeout.ok()) return timeout.status();
  if (timeout->has_value()) o.timeout = **timeout;
  return o;
}

absl::StatusOr<std::optional<absl::Duration>> SecondsFromEnv(
    const std::function<const char*(const char*)>& getenv, const char* name) {
  std::optional<std::string> v = Lookup(getenv, name);
  if (!v.has_value()) return std::optional<absl::Duration>();
  double seconds = 0;
  if (!absl::SimpleAtod(*v, &seconds)) return BadVar(name, *v, "is not a number");
  if (!std::isfinite(seconds) || seconds <= 0 || seconds > 1e7) {
    return BadVar(name, *v, "is out of range (0, 1e7] seconds");
  }
  return std::optional<absl::Duration>(absl::Seconds(seconds));
}

std::string StoreBindAddressFor(absl::string_view master_addr) {
  if (master_addr == "localhost") return "127.0.0.1";
  if (absl::StartsWith(master_addr, "127.")) return std::string(master_addr);
  return "0.0.0.0";
}

absl::StatusOr<Rendezvous> ConnectTcpRendezvous(
    const RendezvousOptions& options) {
  if (options.world_size < 1 || options.rank < 0 ||
      options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous: rank ", options.rank,
                     " is out of range for world size ", options.world_size));
  }
  if (options.master_port < 1 || options.master_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous: master port ", options.master_port, " is out of range"));
  }
  const absl::Time deadline = absl::Now() + options.timeout;
  Rendezvous rdv;
  rdv.rank = options.rank;
  rdv.size = options.world_size;
  rdv.local_rank = options.local_rank;

  if (!options.agent_store && options.rank == 0) {
    TcpStoreServerOptions server_options;
    server_options.port = options.master_port;
    server_options.bind_addr = StoreBindAddressFor(options.master_addr);
    server_options.token = options.job_token;
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> server =
        StartTcpStoreServer(server_options);
    if (!server.ok()) {
      return absl::Status(
          server.status().code(),
          absl::StrCat("rendezvous: rank 0 could not host the store: ",
                       server.status().message()));
    }
    rdv.server = *std::move(server);
  }

  TcpStoreClientOptions client_options;
  client_options.host = options.master_addr;
  client_options.port = options.master_port;
  client_options.connect_timeout = deadline - absl::Now();
  client_options.token = options.job_token;
  absl::StatusOr<std::unique_ptr<Store>> store =
      ConnectTcpStore(client_options);
  if (!store.ok()) {
    return absl::Status(store.status().code(),
                        absl::StrCat("rendezvous: rank ", options.rank, ": ",
                                     store.status().message()));
  }
  rdv.store = *std::move(store);

  // Every rank publishes its world size: the gather is the barrier, and
  // agreeing on the size is checked before anyone acts on it.
  PrefixStore scoped("rdv", *rdv.store);
  const std::string mine = absl::StrCat(options.world_size);
  absl::Status failed = absl::OkStatus();
  absl::StatusOr<std::vector<std::string>> sizes = StoreAllGather(
      scoped, "rdv", options.rank, options.world_size, mine, deadline);
  if (!sizes.ok()) {
    failed = sizes.status();
  } else {
    for (int r = 0; r < options.world_size && failed.ok(); ++r) {
      if ((*sizes)[r] != mine) {
        failed = absl::FailedPreconditionError(absl::StrCat(
            "rendezvous: rank ", r, " has WORLD_SIZE=", (*sizes)[r],
            " but rank ", options.rank, " has ", mine));
      }
    }
  }
  if (!failed.ok() && rdv.server != nullptr) {
    // Peers time out at about the same moment and then ask the store which
    // ranks are missing; keep serving briefly so that they can report that
    // rather than a closed connection.
    absl::SleepFor(std::min(options.timeout / 4, absl::Seconds(2)));
  }
  if (!failed.ok()) return failed;
  return rdv;
}

}  // namespace fusebox::comm
