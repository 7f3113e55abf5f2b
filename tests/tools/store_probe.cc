// Run under fusebox-run: connects to the store the launcher hosts (from
// FUSEBOX_STORE_ADDR / FUSEBOX_STORE_PORT), all-gathers "rank-<RANK>" over WORLD_SIZE ranks
// and checks every rank's value arrived, in order. Exits 0 on success, 1 with
// a message on stderr otherwise.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/store.h"
#include "comm/tcp_store.h"

namespace {

int Fail(const std::string& message) {
  fprintf(stderr, "store_probe: %s\n", message.c_str());
  return 1;
}

bool IntFromEnv(const char* name, int* out) {
  const char* value = getenv(name);
  return value != nullptr && absl::SimpleAtoi(value, out);
}

}  // namespace

int main() {
  int rank = -1, size = -1, port = -1;
  if (!IntFromEnv("RANK", &rank) || !IntFromEnv("WORLD_SIZE", &size) ||
      !IntFromEnv("FUSEBOX_STORE_PORT", &port)) {
    return Fail("RANK, WORLD_SIZE and FUSEBOX_STORE_PORT must be set to integers");
  }
  const char* addr = getenv("FUSEBOX_STORE_ADDR");
  const char* agent = getenv("FUSEBOX_AGENT_STORE");
  if (addr == nullptr) return Fail("FUSEBOX_STORE_ADDR is not set");
  if (agent == nullptr || std::string(agent) != "1") {
    return Fail("FUSEBOX_AGENT_STORE is not 1");
  }
  if (rank < 0 || rank >= size || port <= 0) {
    return Fail(absl::StrCat("bad RANK ", rank, " / WORLD_SIZE ", size,
                             " / FUSEBOX_STORE_PORT ", port));
  }

  fusebox::comm::TcpStoreClientOptions options;
  options.host = addr;
  options.port = port;
  options.connect_timeout = absl::Seconds(10);
  if (const char* token = getenv("FUSEBOX_JOB_TOKEN"); token != nullptr) options.token = token;
  absl::StatusOr<std::unique_ptr<fusebox::comm::Store>> store =
      fusebox::comm::ConnectTcpStore(options);
  if (!store.ok()) return Fail(std::string(store.status().message()));

  fusebox::comm::PrefixStore scoped("store_probe", **store);
  absl::StatusOr<std::vector<std::string>> values =
      fusebox::comm::StoreAllGather(scoped, "store_probe", rank, size,
                                    absl::StrCat("rank-", rank),
                                    absl::Now() + absl::Seconds(10));
  if (!values.ok()) return Fail(std::string(values.status().message()));
  if (static_cast<int>(values->size()) != size) {
    return Fail(
        absl::StrCat("gathered ", values->size(), " values, want ", size));
  }
  for (int r = 0; r < size; ++r) {
    if ((*values)[r] != absl::StrCat("rank-", r)) {
      return Fail(
          absl::StrCat("value of rank ", r, " is '", (*values)[r], "'"));
    }
  }
  printf("store_probe: rank %d gathered %d ranks\n", rank, size);
  return 0;
}
