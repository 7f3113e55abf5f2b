// The TCP store's message decoder (Note [TCP store wire protocol] in
// tcp_store_wire.cc), exposed so that a fuzz target (tests/fuzz/) and tests
// can feed it bytes directly. Internal to comm/: the server
// (tcp_store_server.cc) and client (tcp_store_client.cc) are its only other
// users.
#ifndef FUSEBOX_COMM_TCP_STORE_WIRE_H_
#define FUSEBOX_COMM_TCP_STORE_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace fusebox::comm::tcp_store_wire {

inline constexpr uint32_t kMagic = 0x46425831;  // "FBX1"
inline constexpr size_t kHeaderBytes = 9;       // magic + code + nargs
inline constexpr uint32_t kMaxWaitKeys = 1u << 16;
inline constexpr size_t kMaxMessageBytes = 32u << 20;
inline constexpr size_t kMaxErrorBytes = 64u << 10;
inline constexpr size_t kMaxTokenBytes = 1024;

enum Command : uint8_t {
  kSet = 1,
  kGet = 2,
  kAdd = 3,
  kWait = 4,
  kCheck = 5,
  kHello = 6,
};

// One decoded message: a command (request) or an absl::StatusCode (reply),
// and its arguments.
struct Message {
  uint8_t code = 0;
  std::vector<std::string> args;
};

enum class ParseResult { kNeedMore, kDone, kMalformed };

// Decodes one message from the front of `buf`. kDone fills `*out` and
// `*consumed` (the message's encoded size, <= kMaxMessageBytes); kNeedMore
// means `buf` is a proper prefix of a message that may still turn out valid;
// kMalformed fills `*error`. Rejects as early as the bytes allow (a wrong
// magic byte, a bad command or count, an out-of-bounds length), so that a
// malformed peer never makes the caller buffer what it announces. Pure;
// any thread.
//
// ParseRequest accepts what the server accepts from a client: the commands
// above with their exact argument counts and bounded lengths.
ParseResult ParseRequest(absl::string_view buf, Message* out, size_t* consumed,
                         std::string* error);
// ParseReply accepts what a client accepts as the reply to command `cmd`.
ParseResult ParseReply(uint8_t cmd, absl::string_view buf, Message* out,
                       size_t* consumed, std::string* error);

// The encoding of a message (any code, any arguments; no bounds checked).
std::string Encode(uint8_t code, absl::Span<const absl::string_view> args);
size_t EncodedSize(absl::Span<const absl::string_view> args);

}  // namespace fusebox::comm::tcp_store_wire

#endif  // FUSEBOX_COMM_TCP_STORE_WIRE_H_
