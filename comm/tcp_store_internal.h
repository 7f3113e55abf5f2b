// Helpers that the TCP store's server (tcp_store_server.cc) and client
// (tcp_store_client.cc) share; the framing itself is tcp_store_wire.h.
// Internal to comm/.
#ifndef FUSEBOX_COMM_TCP_STORE_INTERNAL_H_
#define FUSEBOX_COMM_TCP_STORE_INTERNAL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace fusebox::comm::tcp_store_internal {

// ---------------------------------------------------------------------------
// Protocol constants (see Note [TCP store wire protocol]; the framing's are
// in tcp_store_wire.h).

inline constexpr uint64_t kNoTimeout = ~uint64_t{0};

// ---------------------------------------------------------------------------
// Small utilities.

std::string ErrnoString(int err);

bool SetNonBlocking(int fd);

void SetNoDelay(int fd);

std::string Endpoint(absl::string_view host, int port);

// Milliseconds from now until `deadline`, rounded up; <= 0 means now; -1
// means forever (poll()'s convention), capped at INT_MAX.
int PollTimeoutMs(absl::Time deadline);

// The u64 / i64 arguments: 8 bytes, big-endian. GetU64 needs s.size() == 8,
// which the framing checks.
std::string EncodeU64(uint64_t v);
uint64_t GetU64(absl::string_view s);

// Encodes a relative timeout for `deadline` (kNoTimeout for none).
std::string EncodeTimeout(absl::Time deadline);

absl::Duration DecodeTimeout(uint64_t ms);

// Server and client refuse a job token the HELLO could not carry.
absl::Status CheckTokenSize(const std::string& token);

}  // namespace fusebox::comm::tcp_store_internal

#endif  // FUSEBOX_COMM_TCP_STORE_INTERNAL_H_
