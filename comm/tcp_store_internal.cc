#include "comm/tcp_store_internal.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <string>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/tcp_store_wire.h"

namespace fusebox::comm::tcp_store_internal {

using tcp_store_wire::kMaxTokenBytes;

std::string ErrnoString(int err) {
  return std::error_code(err, std::generic_category()).message();
}

bool SetNonBlocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  return flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string Endpoint(absl::string_view host, int port) {
  if (host.find(':') != absl::string_view::npos) {
    return absl::StrCat("[", host, "]:", port);  // IPv6 literal
  }
  return absl::StrCat(host, ":", port);
}

int PollTimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  const int64_t ms =
      absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)));
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

std::string EncodeU64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) s[i] = static_cast<char>(v & 0xff);
  return s;
}

uint64_t GetU64(absl::string_view s) {  // s.size() == 8, checked by framing
  uint64_t v = 0;
  for (char c : s) v = (v << 8) | static_cast<unsigned char>(c);
  return v;
}

std::string EncodeTimeout(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return EncodeU64(kNoTimeout);
  absl::Duration left = deadline - absl::Now();
  if (left < absl::ZeroDuration()) left = absl::ZeroDuration();
  const int64_t ms =
      absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)));
  return EncodeU64(static_cast<uint64_t>(std::min<int64_t>(ms, INT64_MAX - 1)));
}

absl::Duration DecodeTimeout(uint64_t ms) {
  if (ms == kNoTimeout) return absl::InfiniteDuration();
  return absl::Milliseconds(static_cast<int64_t>(
      std::min<uint64_t>(ms, static_cast<uint64_t>(INT64_MAX))));
}

absl::Status CheckTokenSize(const std::string& token) {
  if (token.size() <= kMaxTokenBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "job token of ", token.size(), " bytes exceeds the limit of ", kMaxTokenBytes));
}

}  // namespace fusebox::comm::tcp_store_internal
