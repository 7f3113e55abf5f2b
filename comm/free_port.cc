#include "comm/free_port.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/unique_fd.h"

namespace fusebox::comm {
namespace {

// The kernel's ephemeral port range (where connect() and bind(port 0) take
// their ports), from /proc/sys/net/ipv4/ip_local_port_range; {32768, 60999},
// Linux's default, where it cannot be read.
std::pair<int, int> EphemeralPortRange() {
  std::pair<int, int> range{32768, 60999};
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0, hi = 0;
  if (in >> lo >> hi && lo > 0 && lo <= hi && hi <= 65535) range = {lo, hi};
  return range;
}

// Whether `port` can be bound on `addr` now (tried and released).
bool CanBindOn(const sockaddr_in& addr_template, int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return false;
  sockaddr_in addr = addr_template;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
}

// On `addr` and on every address: a listener (torch's store) may bind the
// wildcard, which fails where any address holds the port.
bool CanBind(const sockaddr_in& addr_template, int port) {
  sockaddr_in any = addr_template;
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  return CanBindOn(addr_template, port) && CanBindOn(any, port);
}

}  // namespace

absl::StatusOr<int> PickFreePort(const std::string& bind_addr) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (::inet_pton(AF_INET, bind_addr.c_str(), &addr.sin_addr) != 1) {
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
  }
  constexpr int kLowest = 10000;  // above the well-known and most registered services
  const int below = EphemeralPortRange().first;
  if (below - kLowest >= 1000) {
    std::mt19937 rng(static_cast<uint32_t>(::getpid()) ^
                     static_cast<uint32_t>(absl::ToUnixNanos(absl::Now())));
    std::uniform_int_distribution<int> pick(kLowest, below - 1);
    for (int attempt = 0; attempt < 64; ++attempt) {
      const int port = pick(rng);
      if (CanBind(addr, port)) return port;
    }
  }
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  socklen_t len = sizeof(addr);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot find a free port on ", bind_addr, ": ", strerror(errno)));
  }
  return static_cast<int>(ntohs(addr.sin_port));
}

}  // namespace fusebox::comm
