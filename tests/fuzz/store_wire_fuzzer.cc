// Fuzz target: the TCP store's message decoder (comm/tcp_store_wire.h),
// which the server runs on every byte a peer sends and a client on every
// reply. The first input byte picks the direction: 0 (mod 8) decodes
// requests as the server does, 1..7 replies to that command (7: an unknown
// command, read as CHECK's). The rest is the byte stream, decoded message
// after message as a connection would be.
//
// Invariants: a decoded message lies within the stream and within
// kMaxMessageBytes, re-encodes to exactly the bytes consumed, and obeys the
// protocol's counts and bounds (Note [TCP store wire protocol]); every
// proper prefix of it decodes as "need more" (the decoder never rejects or
// accepts early).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "comm/store.h"
#include "comm/tcp_store_wire.h"
#include "tests/fuzz/fuzz_check.h"

namespace fusebox::comm::tcp_store_wire {
namespace {

// 0: requests; otherwise replies to command `cmd`.
ParseResult Parse(uint8_t cmd, absl::string_view buf, Message* m, size_t* consumed,
                  std::string* error) {
  return cmd == 0 ? ParseRequest(buf, m, consumed, error)
                  : ParseReply(cmd, buf, m, consumed, error);
}

void CheckRequest(const Message& m) {
  const size_t n = m.args.size();
  auto arg = [&m](size_t i) { return m.args[i].size(); };
  switch (m.code) {
    case kSet:
      FUZZ_CHECK(n == 2 && arg(0) <= kMaxStoreKeyBytes && arg(1) <= kMaxStoreValueBytes);
      break;
    case kGet:
      FUZZ_CHECK(n == 2 && arg(0) == 8 && arg(1) <= kMaxStoreKeyBytes);
      break;
    case kAdd:
      FUZZ_CHECK(n == 2 && arg(0) <= kMaxStoreKeyBytes && arg(1) == 8);
      break;
    case kWait:
      FUZZ_CHECK(n >= 1 && n - 1 <= kMaxWaitKeys && arg(0) == 8);
      for (size_t i = 1; i < n; ++i) FUZZ_CHECK(arg(i) <= kMaxStoreKeyBytes);
      break;
    case kCheck:
      FUZZ_CHECK(n == 1 && arg(0) <= kMaxStoreKeyBytes);
      break;
    case kHello:
      FUZZ_CHECK(n == 1 && arg(0) <= kMaxTokenBytes);
      break;
    default:
      FUZZ_CHECK(false, "request with unknown command ", m.code, " accepted");
  }
}

void CheckReply(uint8_t cmd, const Message& m) {
  FUZZ_CHECK(m.code <= 16, "status code ", m.code);
  if (m.code != 0) {
    FUZZ_CHECK(m.args.size() == 1 && m.args[0].size() <= kMaxErrorBytes);
    return;
  }
  switch (cmd) {
    case kSet:
    case kWait:
    case kHello:
      FUZZ_CHECK(m.args.empty());
      break;
    case kGet:
      FUZZ_CHECK(m.args.size() == 1 && m.args[0].size() <= kMaxStoreValueBytes);
      break;
    case kAdd:
      FUZZ_CHECK(m.args.size() == 1 && m.args[0].size() == 8);
      break;
    default:  // CHECK, and what an unknown command is read as
      FUZZ_CHECK(m.args.size() == 1 && m.args[0].size() == 1);
  }
}

void CheckPrefixesNeedMore(uint8_t cmd, absl::string_view message) {
  std::vector<size_t> lengths;
  for (size_t i = 0; i < std::min<size_t>(message.size(), 24); ++i) lengths.push_back(i);
  lengths.push_back(message.size() / 2);
  lengths.push_back(message.size() - 1);
  for (size_t len : lengths) {
    Message m;
    size_t consumed = 0;
    std::string error;
    const ParseResult r = Parse(cmd, message.substr(0, len), &m, &consumed, &error);
    FUZZ_CHECK(r == ParseResult::kNeedMore, "a ", len, "-byte prefix of a ", message.size(),
               "-byte message is not 'need more': ", error);
  }
}

}  // namespace
}  // namespace fusebox::comm::tcp_store_wire

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace wire = fusebox::comm::tcp_store_wire;
  if (size == 0) return 0;
  const uint8_t cmd = data[0] % 8;
  absl::string_view stream(reinterpret_cast<const char*>(data) + 1, size - 1);
  while (true) {
    wire::Message m;
    size_t consumed = 0;
    std::string error;
    const wire::ParseResult r = wire::Parse(cmd, stream, &m, &consumed, &error);
    if (r == wire::ParseResult::kMalformed) {
      FUZZ_CHECK(!error.empty());
      return 0;
    }
    if (r == wire::ParseResult::kNeedMore) {
      FUZZ_CHECK(stream.size() < wire::kMaxMessageBytes);
      return 0;
    }
    FUZZ_CHECK(consumed >= wire::kHeaderBytes && consumed <= stream.size() &&
                   consumed <= wire::kMaxMessageBytes,
               consumed, " of ", stream.size());
    std::vector<absl::string_view> args(m.args.begin(), m.args.end());
    FUZZ_CHECK(wire::EncodedSize(args) == consumed);
    FUZZ_CHECK(wire::Encode(m.code, args) == stream.substr(0, consumed),
               "the message does not re-encode to the bytes it came from");
    if (cmd == 0) {
      wire::CheckRequest(m);
    } else {
      wire::CheckReply(cmd, m);
    }
    wire::CheckPrefixesNeedMore(cmd, stream.substr(0, consumed));
    stream.remove_prefix(consumed);
  }
}
