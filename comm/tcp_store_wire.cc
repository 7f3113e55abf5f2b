// The TCP store's wire protocol: the framing, its encoder and its decoder
// (comm/tcp_store_wire.h), shared by the server (tcp_store_server.cc) and
// the client (tcp_store_client.cc).
//
// Note [TCP store wire protocol]
// ------------------------------
// Every message, in both directions, has the same framing; all integers are
// unsigned big-endian:
//
//   [u32 magic = 0x46425831 ("FBX1")][u8 code][u32 nargs]
//   nargs times: [u32 len][len bytes]
//
// In a request `code` is the command; in a reply it is an absl::StatusCode
// (0 = OK). A non-OK reply carries one argument, the error message. Commands
// (timeouts are relative, u64 milliseconds, 2^64-1 = no deadline):
//
//   1 SET   [key][value]           -> OK []
//   2 GET   [u64 timeout][key]     -> OK [value] | DEADLINE_EXCEEDED [msg]
//   3 ADD   [key][i64 delta]       -> OK [i64 new value] | INVALID_ARGUMENT
//   4 WAIT  [u64 timeout][key]...  -> OK [] | DEADLINE_EXCEEDED [msg]
//   5 CHECK [key]                  -> OK [u8 0|1]
//   6 HELLO [token]                -> OK [] | PERMISSION_DENIED [msg]
//
// Job token: a server started with a token (FUSEBOX_JOB_TOKEN at the edges)
// answers every request on a connection with PERMISSION_DENIED, and closes
// it, until that connection's first request is a HELLO carrying the same
// token (compared in constant time). A wrong token is answered the same way
// and counted in rejected_connections(). A server without a token accepts
// any HELLO. The token keeps out processes that do not know it (a stray
// job, a port scanner); it travels in clear text, so on an untrusted network
// the store needs a private network or a tunnel as well.
//
// Bounds, checked by the server as soon as each length field arrives, before
// buffering the bytes it announces: keys <= kMaxStoreKeyBytes, values <=
// kMaxStoreValueBytes, fixed-width arguments exactly their width, exactly the
// argument count above (WAIT: 0..kMaxWaitKeys keys), and the whole message
// <= kMaxMessageBytes. A message with a bad magic, an unknown command, a wrong
// argument count or an out-of-bounds length is malformed: the server closes
// that connection (and only that one) without replying and counts it in
// rejected_connections(). The decoder that enforces all this is
// tcp_store_wire.h's ParseRequest / ParseReply (fuzzed by
// tests/fuzz/store_wire_fuzzer.cc).
//
// GET and WAIT wait on the server: the request is parked until its keys are
// set or its timeout expires, and the server then replies. A client sends
// one request at a time and reads its reply before sending the next; the
// server processes a connection's requests strictly in order and reads no
// further request from it while a reply is pending (parked or unsent).

#include "comm/tcp_store_wire.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "comm/store.h"

namespace fusebox::comm::tcp_store_wire {
namespace {

// ---------------------------------------------------------------------------
// Big-endian integers (the framing's u32 fields).

void PutU32(std::string* out, uint32_t v) {
  const char b[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
  out->append(b, 4);
}

uint32_t GetU32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return (uint32_t{u[0]} << 24) | (uint32_t{u[1]} << 16) |
         (uint32_t{u[2]} << 8) | uint32_t{u[3]};
}

// ---------------------------------------------------------------------------
// Framing.

// What one kind of message may look like. `header` validates the code and
// argument count, `arg` the length of argument `index`; both return a
// reason on violation.
struct Framing {
  std::function<absl::Status(uint8_t code, uint32_t nargs)> header;
  std::function<absl::Status(uint8_t code, uint32_t index, uint32_t len)> arg;
};

// Parses one message from the front of `buf`. kDone fills `out` and
// `*consumed`; kMalformed fills `*error`. Rejects as early as possible: a
// wrong magic byte as soon as it arrives, a bad length as soon as its length
// field does, so a malformed peer never makes us buffer what it announces.
ParseResult TryParse(absl::string_view buf, const Framing& framing,
                     Message* out, size_t* consumed, std::string* error) {
  const char magic[4] = {'F', 'B', 'X', '1'};
  for (size_t i = 0; i < 4 && i < buf.size(); ++i) {
    if (buf[i] != magic[i]) {
      *error = "bad magic";
      return ParseResult::kMalformed;
    }
  }
  if (buf.size() < kHeaderBytes) return ParseResult::kNeedMore;
  const uint8_t code = static_cast<uint8_t>(buf[4]);
  const uint32_t nargs = GetU32(buf.data() + 5);
  if (absl::Status s = framing.header(code, nargs); !s.ok()) {
    *error = std::string(s.message());
    return ParseResult::kMalformed;
  }
  size_t pos = kHeaderBytes;
  for (uint32_t i = 0; i < nargs; ++i) {
    if (buf.size() < pos + 4) return ParseResult::kNeedMore;
    const uint32_t len = GetU32(buf.data() + pos);
    if (absl::Status s = framing.arg(code, i, len); !s.ok()) {
      *error = std::string(s.message());
      return ParseResult::kMalformed;
    }
    if (pos + 4 + len > kMaxMessageBytes) {
      *error = absl::StrCat("message exceeds ", kMaxMessageBytes, " bytes");
      return ParseResult::kMalformed;
    }
    if (buf.size() < pos + 4 + len) return ParseResult::kNeedMore;
    pos += 4 + len;
  }
  out->code = code;
  out->args.clear();
  out->args.reserve(nargs);
  size_t p = kHeaderBytes;
  for (uint32_t i = 0; i < nargs; ++i) {
    const uint32_t len = GetU32(buf.data() + p);
    out->args.emplace_back(buf.substr(p + 4, len));
    p += 4 + len;
  }
  *consumed = pos;
  return ParseResult::kDone;
}

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(what);
}

absl::Status CheckLen(uint32_t len, size_t max, absl::string_view what) {
  if (len > max) {
    return Malformed(absl::StrCat(what, " of ", len, " bytes exceeds ", max));
  }
  return absl::OkStatus();
}

absl::Status CheckExact(uint32_t len, size_t want, absl::string_view what) {
  if (len != want) {
    return Malformed(absl::StrCat(what, " has ", len, " bytes, not ", want));
  }
  return absl::OkStatus();
}

const Framing& RequestFraming() {
  static const Framing* const kFraming = new Framing{
      [](uint8_t cmd, uint32_t nargs) -> absl::Status {
        switch (cmd) {
          case kSet:
          case kGet:
          case kAdd:
            if (nargs == 2) return absl::OkStatus();
            break;
          case kCheck:
          case kHello:
            if (nargs == 1) return absl::OkStatus();
            break;
          case kWait:
            if (nargs >= 1 && nargs - 1 <= kMaxWaitKeys) {
              return absl::OkStatus();
            }
            break;
          default:
            return Malformed(absl::StrCat("unknown command ", cmd));
        }
        return Malformed(
            absl::StrCat("command ", cmd, " with ", nargs, " arguments"));
      },
      [](uint8_t cmd, uint32_t i, uint32_t len) -> absl::Status {
        switch (cmd) {
          case kSet:
            return i == 0 ? CheckLen(len, kMaxStoreKeyBytes, "key")
                          : CheckLen(len, kMaxStoreValueBytes, "value");
          case kGet:
          case kWait:
            return i == 0 ? CheckExact(len, 8, "timeout")
                          : CheckLen(len, kMaxStoreKeyBytes, "key");
          case kAdd:
            return i == 0 ? CheckLen(len, kMaxStoreKeyBytes, "key")
                          : CheckExact(len, 8, "delta");
          case kHello:
            return CheckLen(len, kMaxTokenBytes, "token");
          default:  // kCheck
            return CheckLen(len, kMaxStoreKeyBytes, "key");
        }
      }};
  return *kFraming;
}

// The replies a client accepts to command `cmd`.
Framing ReplyFraming(uint8_t cmd) {
  return Framing{
      [cmd](uint8_t code, uint32_t nargs) -> absl::Status {
        if (code > static_cast<uint8_t>(absl::StatusCode::kUnauthenticated)) {
          return Malformed(absl::StrCat("unknown status code ", code));
        }
        uint32_t want = 1;
        if (code == 0 && (cmd == kSet || cmd == kWait || cmd == kHello)) want = 0;
        if (nargs != want) {
          return Malformed(absl::StrCat("reply with ", nargs, " arguments"));
        }
        return absl::OkStatus();
      },
      [cmd](uint8_t code, uint32_t, uint32_t len) -> absl::Status {
        if (code != 0) return CheckLen(len, kMaxErrorBytes, "error message");
        switch (cmd) {
          case kGet:
            return CheckLen(len, kMaxStoreValueBytes, "value");
          case kAdd:
            return CheckExact(len, 8, "sum");
          default:  // kCheck
            return CheckExact(len, 1, "flag");
        }
      }};
}

}  // namespace

size_t EncodedSize(absl::Span<const absl::string_view> args) {
  size_t n = kHeaderBytes;
  for (absl::string_view a : args) n += 4 + a.size();
  return n;
}

std::string Encode(uint8_t code, absl::Span<const absl::string_view> args) {
  std::string out;
  out.reserve(EncodedSize(args));
  PutU32(&out, kMagic);
  out.push_back(static_cast<char>(code));
  PutU32(&out, static_cast<uint32_t>(args.size()));
  for (absl::string_view a : args) {
    PutU32(&out, static_cast<uint32_t>(a.size()));
    out.append(a.data(), a.size());
  }
  return out;
}

ParseResult ParseRequest(absl::string_view buf, Message* out, size_t* consumed,
                         std::string* error) {
  return TryParse(buf, RequestFraming(), out, consumed, error);
}

ParseResult ParseReply(uint8_t cmd, absl::string_view buf, Message* out,
                       size_t* consumed, std::string* error) {
  return TryParse(buf, ReplyFraming(cmd), out, consumed, error);
}

}  // namespace fusebox::comm::tcp_store_wire
