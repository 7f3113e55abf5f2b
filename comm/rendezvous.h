// How a rank learns who it is and reaches the others: the torchrun-style
// variables RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, read only
// at the edges (binaries, plugin entry points) into RendezvousOptions.
#ifndef FUSEBOX_COMM_RENDEZVOUS_H_
#define FUSEBOX_COMM_RENDEZVOUS_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/store.h"
#include "comm/tcp_store.h"

namespace fusebox::comm {

struct RendezvousOptions {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // True when the launcher (fusebox-run, FUSEBOX_AGENT_STORE=1) hosts the
  // store server; otherwise rank 0 hosts it on master_port.
  bool agent_store = false;
  absl::Duration timeout = absl::Seconds(300);
  // Shared secret of the job (FUSEBOX_JOB_TOKEN): the store admits only
  // connections that present it. Empty: none.
  std::string job_token;
};

// Reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT,
// FUSEBOX_STORE_ADDR and FUSEBOX_STORE_PORT (which win over MASTER_*: Note
// [Whose port] in rendezvous.cc; under torchrun's agent store without them,
// MASTER_PORT + 1), FUSEBOX_AGENT_STORE, FUSEBOX_RENDEZVOUS_TIMEOUT_S (seconds) and
// FUSEBOX_JOB_TOKEN (at most 1024 bytes) through
// `getenv` (pass ::getenv at an edge; tests pass a map). Errors name the
// variable and the bad value. Returns NotFound if RANK or WORLD_SIZE is unset.
absl::StatusOr<RendezvousOptions> RendezvousOptionsFromEnv(
    const std::function<const char*(const char*)>& getenv);

// Reads the variable `name` through `getenv` as seconds in (0, 1e7]; an
// unset variable is nullopt, a bad value an error naming it. An edge helper
// for FUSEBOX_RENDEZVOUS_TIMEOUT_S and FUSEBOX_TIMEOUT_S.
absl::StatusOr<std::optional<absl::Duration>> SecondsFromEnv(
    const std::function<const char*(const char*)>& getenv, const char* name);

// A connected rendezvous: the store, plus the server if this rank hosts it
// (the server must outlive every client; keep this object alive as long as
// the communicators built from it).
struct Rendezvous {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  std::unique_ptr<TcpStoreServer> server;  // only on the hosting rank
  std::unique_ptr<Store> store;
};

// Where a store hosted for ranks that reach it at `master_addr` listens:
// that loopback address for a local job (the store is then not exposed to
// the network), otherwise every interface.
std::string StoreBindAddressFor(absl::string_view master_addr);

// Starts the server if this rank hosts it (bound by StoreBindAddressFor), connects the client, and checks
// that every rank arrives within options.timeout (the error names the
// missing ranks) and agrees on the world size. On failure the hosting rank
// keeps its server up for min(timeout / 4, 2s) before returning, so that
// peers failing at about the same moment can still name the missing ranks.
absl::StatusOr<Rendezvous> ConnectTcpRendezvous(const RendezvousOptions& options);

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_RENDEZVOUS_H_
