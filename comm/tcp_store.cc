// TCP Store server and client.
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
//
// Note [TCP store timeouts]
// -------------------------
// The server closes a connection, without replying, and counts it in
// timed_out_connections() when (TcpStoreServerOptions; each can be off):
//
//   handshake  its first request has not arrived whole within
//              handshake_timeout (30 s) of accept. With a token that
//              request is the HELLO (any other first request is refused
//              anyway), so a connection that never authenticates cannot
//              hold a slot. ConnectTcpStore sends the HELLO at once when
//              it has a token, and fusebox's rendezvous makes its first
//              request right after connecting.
//   read       a request has begun but not arrived whole within
//              read_timeout (30 s) of its first byte: a peer that trickles
//              a byte at a time (slowloris) or stalls mid-message. The
//              clock is per message, not per byte, so trickling cannot
//              extend it.
//   idle       nothing received and no reply sent for idle_timeout, while
//              no request is parked and no reply is pending. Off by
//              default: a rank's connection lives as long as the job and
//              may be silent for hours between requests, and the client
//              does not reconnect.
//
// Silence between requests is therefore never cut by the defaults, nor is
// a client parked in a GET or WAIT, however long its timeout: only
// connections that never complete a first request, or that stop in the
// middle of one, are closed. A reply the peer does not read is not timed
// (the server holds at most one per connection and reads no further request
// until it is sent).
//
// Server: one background thread runs a poll() loop over non-blocking
// sockets: the listening socket, a wakeup pipe (written by the destructor)
// and every connection. Partial reads and writes are buffered per
// connection, so a slow or stalled client never blocks the others. All
// server state is owned by that thread; nothing is locked.

#include "comm/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <functional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "comm/tcp_store_wire.h"
#include "comm/unique_fd.h"

namespace fusebox::comm {
namespace {

using tcp_store_wire::EncodedSize;
using tcp_store_wire::Encode;
using tcp_store_wire::kAdd;
using tcp_store_wire::kCheck;
using tcp_store_wire::kGet;
using tcp_store_wire::kHello;
using tcp_store_wire::kMaxErrorBytes;
using tcp_store_wire::kMaxMessageBytes;
using tcp_store_wire::kMaxTokenBytes;
using tcp_store_wire::kMaxWaitKeys;
using tcp_store_wire::kSet;
using tcp_store_wire::kWait;
using tcp_store_wire::Message;
using tcp_store_wire::ParseReply;
using tcp_store_wire::ParseRequest;
using tcp_store_wire::ParseResult;

// ---------------------------------------------------------------------------
// Protocol constants (see Note [TCP store wire protocol]; the framing's are
// in tcp_store_wire.h).

constexpr uint64_t kNoTimeout = ~uint64_t{0};

// A client gives up on a reply this long after the request's own deadline
// (or after sending, for requests that do not wait): the server is then
// presumed hung or gone, and the connection is marked broken.
constexpr absl::Duration kReplyGrace = absl::Seconds(10);

// ---------------------------------------------------------------------------
// Small utilities.

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

// Milliseconds from now until `deadline`, rounded up; <= 0 means now; -1
// means forever (poll()'s convention), capped at INT_MAX.
int PollTimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  const int64_t ms =
      absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)));
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

void PutU32(std::string* out, uint32_t v) {
  const char b[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
  out->append(b, 4);
}

std::string EncodeU64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) s[i] = static_cast<char>(v & 0xff);
  return s;
}

uint32_t GetU32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return (uint32_t{u[0]} << 24) | (uint32_t{u[1]} << 16) |
         (uint32_t{u[2]} << 8) | uint32_t{u[3]};
}

uint64_t GetU64(absl::string_view s) {  // s.size() == 8, checked by framing
  uint64_t v = 0;
  for (char c : s) v = (v << 8) | static_cast<unsigned char>(c);
  return v;
}

// Encodes a relative timeout for `deadline` (kNoTimeout for none).
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

}  // namespace

// ---------------------------------------------------------------------------
// Framing (comm/tcp_store_wire.h).

namespace tcp_store_wire {
namespace {

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

}  // namespace tcp_store_wire

namespace {

// ---------------------------------------------------------------------------
// Server.

class Server final : public TcpStoreServer {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Start(
      const TcpStoreServerOptions& options);

  ~Server() override {
    const char byte = 1;
    // Cannot fail in a way that matters: the pipe is empty or already
    // readable, and the loop exits on either.
    (void)!::write(wake_write_.get(), &byte, 1);
    thread_.join();
  }

  int port() const override { return port_; }
  int64_t rejected_connections() const override {
    return rejected_.load(std::memory_order_relaxed);
  }
  int64_t timed_out_connections() const override {
    return timed_out_.load(std::memory_order_relaxed);
  }

 private:
  struct Conn {
    uint64_t id = 0;
    UniqueFd fd;
    std::string in;      // received, not yet parsed
    std::string out;     // reply bytes not yet sent
    size_t out_pos = 0;  // first unsent byte of `out`
    // May have a complete request in `in` that it is free to process.
    bool runnable = false;
    bool dead = false;  // close at the end of this loop iteration
    // Close once `out` is sent (a refusal's reply goes out first).
    bool close_after_reply = false;
    // Sent the job token (or the server has none).
    bool authenticated = false;
    // A parked GET or WAIT (parked == true): the keys as requested, those
    // still missing, and when to give up.
    bool parked = false;
    uint8_t parked_cmd = 0;
    std::vector<std::string> keys;
    absl::flat_hash_set<std::string> missing;
    absl::Time deadline;
    absl::Duration budget;
    // Note [TCP store timeouts]: until the first request is complete; while
    // a request is partly received; since the last byte in or reply out.
    absl::Time handshake_deadline = absl::InfiniteFuture();
    absl::Time message_deadline = absl::InfiniteFuture();
    absl::Time last_active;
  };

  Server(UniqueFd listen_fd, UniqueFd wake_read, UniqueFd wake_write, int port,
         const TcpStoreServerOptions& options)
      : listen_(std::move(listen_fd)),
        wake_read_(std::move(wake_read)),
        wake_write_(std::move(wake_write)),
        port_(port),
        max_connections_(options.max_connections),
        token_(options.token),
        handshake_timeout_(options.handshake_timeout),
        read_timeout_(options.read_timeout),
        idle_timeout_(options.idle_timeout) {}

  // When `c` is to be closed for a timeout (InfiniteFuture: never, as
  // things stand).
  absl::Time TimeoutAt(const Conn& c) const;

  void Run();
  void AcceptAll();
  void ReadFrom(Conn& c);
  void Flush(Conn& c);
  void Pump(Conn& c);
  void Handle(Conn& c, Message& m);
  void Park(Conn& c, uint8_t cmd, std::vector<std::string> keys,
            absl::Duration timeout);
  void Finish(Conn& c);
  void Expire(Conn& c);
  void Unpark(Conn& c);
  void Notify(const std::string& key);
  void Reply(Conn& c, absl::StatusCode code,
             absl::Span<const absl::string_view> args);
  void ReplyError(Conn& c, const absl::Status& s);

  const UniqueFd listen_;
  const UniqueFd wake_read_;
  const UniqueFd wake_write_;
  const int port_;
  const int max_connections_;
  const std::string token_;  // empty: no job token
  const absl::Duration handshake_timeout_;
  const absl::Duration read_timeout_;
  const absl::Duration idle_timeout_;
  std::atomic<int64_t> rejected_{0};
  std::atomic<int64_t> timed_out_{0};
  std::thread thread_;

  // Owned by the server thread.
  uint64_t next_id_ = 1;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Conn>> conns_;
  absl::flat_hash_map<std::string, std::string> data_;
  // Key -> ids of connections parked on it. May hold ids of connections
  // that were since closed or unparked; Notify skips those.
  absl::flat_hash_map<std::string, absl::flat_hash_set<uint64_t>> waiters_;
};

absl::StatusOr<std::unique_ptr<Server>> Server::Start(
    const TcpStoreServerOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("TCP store port ", options.port, " is out of range"));
  }
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("TCP store max_connections must be >= 1, got ",
                     options.max_connections));
  }
  for (const auto& [name, timeout] :
       {std::pair{"handshake_timeout", options.handshake_timeout},
        std::pair{"read_timeout", options.read_timeout},
        std::pair{"idle_timeout", options.idle_timeout}}) {
    if (timeout <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TCP store ", name, " must be positive (InfiniteDuration for none), got ",
          absl::FormatDuration(timeout)));
    }
  }
  const std::string where = Endpoint(options.bind_addr, options.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port_str = absl::StrCat(options.port);
  if (int rc = ::getaddrinfo(options.bind_addr.c_str(), port_str.c_str(),
                             &hints, &res);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("TCP store cannot resolve bind address ", where, ": ",
                     ::gai_strerror(rc)));
  }
  UniqueFd listen_fd;
  std::string last_error = "no address";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
                         ai->ai_protocol));
    if (!fd.valid()) {
      last_error = ErrnoString(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 ||
        ::listen(fd.get(), SOMAXCONN) != 0 || !SetNonBlocking(fd.get())) {
      last_error = ErrnoString(errno);
      continue;
    }
    listen_fd = std::move(fd);
    break;
  }
  ::freeaddrinfo(res);
  if (!listen_fd.valid()) {
    return absl::UnavailableError(
        absl::StrCat("TCP store cannot listen on ", where, ": ", last_error));
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(listen_fd.get(), reinterpret_cast<sockaddr*>(&addr),
                    &len) != 0) {
    return absl::InternalError(
        absl::StrCat("getsockname on ", where, ": ", ErrnoString(errno)));
  }
  const int port =
      addr.ss_family == AF_INET6
          ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
          : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_NONBLOCK | O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", ErrnoString(errno)));
  }
  std::unique_ptr<Server> server(
      new Server(std::move(listen_fd), UniqueFd(pipe_fds[0]),
                 UniqueFd(pipe_fds[1]), port, options));
  server->thread_ = std::thread([s = server.get()] { s->Run(); });
  return server;
}

void Server::Run() {
  std::vector<pollfd> fds;
  std::vector<Conn*> polled;
  int timeout_ms = -1;
  while (true) {
    fds.clear();
    polled.clear();
    fds.push_back({wake_read_.get(), POLLIN, 0});
    fds.push_back({listen_.get(), POLLIN, 0});
    for (auto& [id, conn] : conns_) {
      short events = 0;
      // Backpressure: stop reading once a full message's worth is buffered.
      if (conn->in.size() < kMaxMessageBytes) events |= POLLIN;
      if (conn->out_pos < conn->out.size()) events |= POLLOUT;
      fds.push_back({conn->fd.get(), events, 0});
      polled.push_back(conn.get());
    }
    const int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) {
      // Out of kernel memory or similar: back off rather than spin.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (n > 0) {
      if (fds[0].revents != 0) return;  // destructor asked us to stop
      for (size_t i = 0; i < polled.size(); ++i) {
        Conn& c = *polled[i];
        const short rev = fds[i + 2].revents;
        if (rev & (POLLERR | POLLNVAL)) {
          c.dead = true;
          continue;
        }
        if (rev & (POLLIN | POLLHUP)) ReadFrom(c);
        if ((rev & POLLOUT) && !c.dead) Flush(c);
      }
      if (fds[1].revents & POLLIN) AcceptAll();
    }

    const absl::Time now = absl::Now();
    for (auto& [id, conn] : conns_) {
      if (conn->parked && !conn->dead && conn->deadline <= now) Expire(*conn);
    }
    for (auto& [id, conn] : conns_) {
      if (conn->runnable && !conn->dead) Pump(*conn);
    }

    // Close dead and timed-out connections, then decide how long the next
    // poll may sleep.
    absl::Time next_deadline = absl::InfiniteFuture();
    bool runnable = false;
    for (auto it = conns_.begin(); it != conns_.end();) {
      Conn& c = *it->second;
      const absl::Time timeout_at = TimeoutAt(c);
      if (!c.dead && timeout_at <= now) {
        timed_out_.fetch_add(1, std::memory_order_relaxed);
        c.dead = true;
      }
      if (c.dead) {
        if (c.parked) Unpark(c);
        conns_.erase(it++);
        continue;
      }
      runnable |= c.runnable;
      if (c.parked) next_deadline = std::min(next_deadline, c.deadline);
      next_deadline = std::min(next_deadline, timeout_at);
      ++it;
    }
    timeout_ms = runnable ? 0 : PollTimeoutMs(next_deadline);
  }
}

absl::Time Server::TimeoutAt(const Conn& c) const {
  absl::Time at = std::min(c.handshake_deadline, c.message_deadline);
  if (!c.parked && c.out_pos >= c.out.size()) {
    at = std::min(at, c.last_active + idle_timeout_);
  }
  return at;
}

void Server::AcceptAll() {
  while (true) {
    UniqueFd fd(::accept4(listen_.get(), nullptr, nullptr,
                          SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) return;  // EAGAIN, or a transient error: retry on poll
    if (conns_.size() >= static_cast<size_t>(max_connections_)) {
      continue;  // full: close at once so the client fails fast
    }
    SetNoDelay(fd.get());
    auto conn = std::make_unique<Conn>();
    conn->id = next_id_++;
    conn->fd = std::move(fd);
    conn->authenticated = token_.empty();
    conn->last_active = absl::Now();
    conn->handshake_deadline = conn->last_active + handshake_timeout_;
    conns_.emplace(conn->id, std::move(conn));
  }
}

void Server::ReadFrom(Conn& c) {
  // Read at most 1 MiB per round so that one fast sender cannot starve the
  // others.
  char buf[64 << 10];
  for (size_t total = 0;
       total < (1u << 20) && c.in.size() < kMaxMessageBytes;) {
    const ssize_t n = ::recv(c.fd.get(), buf, sizeof(buf), 0);
    if (n > 0) {
      c.in.append(buf, static_cast<size_t>(n));
      c.runnable = true;
      c.last_active = absl::Now();
      total += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    // EOF (possibly in the middle of a request) or a reset: drop the
    // connection and whatever it had parked.
    c.dead = true;
    return;
  }
}

void Server::Flush(Conn& c) {
  while (c.out_pos < c.out.size()) {
    const ssize_t n =
        ::send(c.fd.get(), c.out.data() + c.out_pos, c.out.size() - c.out_pos,
               MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out_pos += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    } else {
      c.dead = true;
      return;
    }
  }
  c.out.clear();
  c.out_pos = 0;
  c.last_active = absl::Now();
  if (c.close_after_reply) {
    c.dead = true;
    return;
  }
  c.runnable = true;  // the next buffered request may proceed
}

void Server::Pump(Conn& c) {
  std::string error;
  Message m;
  while (!c.dead && !c.parked && c.out.empty()) {
    size_t consumed = 0;
    switch (ParseRequest(c.in, &m, &consumed, &error)) {
      case ParseResult::kNeedMore:
        // A request has begun: it must arrive whole within read_timeout.
        if (c.in.empty()) {
          c.message_deadline = absl::InfiniteFuture();
        } else if (c.message_deadline == absl::InfiniteFuture()) {
          c.message_deadline = absl::Now() + read_timeout_;
        }
        c.runnable = false;
        return;
      case ParseResult::kMalformed:
        rejected_.fetch_add(1, std::memory_order_relaxed);
        c.dead = true;
        return;
      case ParseResult::kDone:
        c.in.erase(0, consumed);
        c.handshake_deadline = absl::InfiniteFuture();
        c.message_deadline = absl::InfiniteFuture();
        Handle(c, m);
        break;
    }
  }
  // Blocked on a parked request or an unsent reply; Unpark / Flush make the
  // connection runnable again.
  c.runnable = false;
}

// Equal strings, in time that depends only on their lengths.
bool ConstantTimeEqual(absl::string_view a, absl::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0;
    const unsigned char y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

void Server::Handle(Conn& c, Message& m) {
  if (!c.authenticated || m.code == kHello) {
    if (m.code == kHello && (token_.empty() || ConstantTimeEqual(m.args[0], token_))) {
      c.authenticated = true;
      Reply(c, absl::StatusCode::kOk, {});
      return;
    }
    ++rejected_;
    c.close_after_reply = true;
    ReplyError(c, absl::PermissionDeniedError(
                      m.code == kHello
                          ? "wrong job token (FUSEBOX_JOB_TOKEN differs from the job's)"
                          : "this store requires the job token (set FUSEBOX_JOB_TOKEN)"));
    return;
  }
  switch (m.code) {
    case kSet: {
      std::string& key = m.args[0];
      data_[key] = std::move(m.args[1]);
      Notify(key);
      Reply(c, absl::StatusCode::kOk, {});
      return;
    }
    case kGet: {
      const absl::Duration timeout = DecodeTimeout(GetU64(m.args[0]));
      std::vector<std::string> keys;
      keys.push_back(std::move(m.args[1]));
      Park(c, kGet, std::move(keys), timeout);
      return;
    }
    case kAdd: {
      const std::string& key = m.args[0];
      const int64_t delta = static_cast<int64_t>(GetU64(m.args[1]));
      int64_t current = 0;
      auto it = data_.find(key);
      if (it != data_.end() && !absl::SimpleAtoi(it->second, &current)) {
        ReplyError(c,
                   absl::InvalidArgumentError(absl::StrCat(
                       "store add: key '",
                       absl::CHexEscape(absl::string_view(key).substr(0, 128)),
                       "' holds a value that is not a decimal integer (",
                       it->second.size(), " bytes)")));
        return;
      }
      int64_t result = 0;
      if (__builtin_add_overflow(current, delta, &result)) {
        ReplyError(
            c, absl::OutOfRangeError(absl::StrCat("store add: ", current, " + ",
                                                  delta, " overflows int64")));
        return;
      }
      data_[key] = absl::StrCat(result);
      Notify(key);
      const std::string sum = EncodeU64(static_cast<uint64_t>(result));
      Reply(c, absl::StatusCode::kOk, {sum});
      return;
    }
    case kWait: {
      const absl::Duration timeout = DecodeTimeout(GetU64(m.args[0]));
      std::vector<std::string> keys(std::make_move_iterator(m.args.begin() + 1),
                                    std::make_move_iterator(m.args.end()));
      Park(c, kWait, std::move(keys), timeout);
      return;
    }
    case kCheck: {
      const char flag = data_.contains(m.args[0]) ? 1 : 0;
      Reply(c, absl::StatusCode::kOk, {absl::string_view(&flag, 1)});
      return;
    }
  }
  // Unreachable: RequestFraming admits only the commands above.
  c.dead = true;
}

void Server::Park(Conn& c, uint8_t cmd, std::vector<std::string> keys,
                  absl::Duration timeout) {
  c.parked_cmd = cmd;
  c.keys = std::move(keys);
  c.missing.clear();
  for (const std::string& k : c.keys) {
    if (!data_.contains(k)) c.missing.insert(k);
  }
  c.budget = timeout;
  c.deadline = absl::Now() + timeout;
  c.parked = true;
  if (c.missing.empty()) {
    Finish(c);
  } else if (timeout <= absl::ZeroDuration()) {
    Expire(c);
  } else {
    for (const std::string& k : c.missing) waiters_[k].insert(c.id);
  }
}

void Server::Unpark(Conn& c) {
  for (const std::string& k : c.missing) {
    auto it = waiters_.find(k);
    if (it == waiters_.end()) continue;
    it->second.erase(c.id);
    if (it->second.empty()) waiters_.erase(it);
  }
  c.missing.clear();
  c.keys.clear();
  c.parked = false;
  c.runnable = true;
}

void Server::Finish(Conn& c) {
  if (c.parked_cmd == kGet) {
    // Unpark leaves data_ alone, so the reference stays valid; Reply copies
    // the value into the connection's output buffer.
    const std::string& value = data_.find(c.keys[0])->second;
    Unpark(c);
    Reply(c, absl::StatusCode::kOk, {value});
  } else {
    Unpark(c);
    Reply(c, absl::StatusCode::kOk, {});
  }
}

void Server::Expire(Conn& c) {
  std::vector<std::string> missing;  // in request order, without repeats
  absl::flat_hash_set<absl::string_view> seen;
  for (const std::string& k : c.keys) {
    if (c.missing.contains(k) && seen.insert(k).second) missing.push_back(k);
  }
  const absl::Status s = MissingKeysError(c.parked_cmd == kGet ? "get" : "wait",
                                          missing, c.keys.size(), c.budget);
  Unpark(c);
  ReplyError(c, s);
}

void Server::Notify(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  const absl::flat_hash_set<uint64_t> ids = std::move(it->second);
  waiters_.erase(it);
  for (uint64_t id : ids) {
    auto c = conns_.find(id);
    if (c == conns_.end()) continue;
    Conn& conn = *c->second;
    if (conn.dead || !conn.parked || conn.missing.erase(key) == 0) continue;
    if (conn.missing.empty()) Finish(conn);
  }
}

void Server::Reply(Conn& c, absl::StatusCode code,
                   absl::Span<const absl::string_view> args) {
  c.out.append(Encode(static_cast<uint8_t>(code), args));
  Flush(c);
}

void Server::ReplyError(Conn& c, const absl::Status& s) {
  const absl::string_view msg = s.message().substr(0, kMaxErrorBytes);
  Reply(c, s.code(), {msg});
}

// ---------------------------------------------------------------------------
// Client.

// Tries each address of host:port once; on success returns a connected,
// non-blocking socket. Gives up on an attempt at `deadline`.
absl::StatusOr<UniqueFd> TryConnect(const std::string& host, int port,
                                    absl::Time deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port_str = absl::StrCat(port);
  if (int rc = ::getaddrinfo(host.c_str(), port_str.c_str(), &hints, &res);
      rc != 0) {
    return absl::UnavailableError(::gai_strerror(rc));
  }
  std::string last_error = "no address";
  UniqueFd result;
  for (addrinfo* ai = res; ai != nullptr && !result.valid(); ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
                         ai->ai_protocol));
    if (!fd.valid() || !SetNonBlocking(fd.get())) {
      last_error = ErrnoString(errno);
      continue;
    }
    if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last_error = ErrnoString(errno);
        continue;
      }
      pollfd p{fd.get(), POLLOUT, 0};
      int n;
      do {
        n = ::poll(&p, 1, PollTimeoutMs(deadline));
      } while (n < 0 && errno == EINTR);
      if (n <= 0) {
        last_error = n == 0 ? "connect timed out" : ErrnoString(errno);
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last_error = ErrnoString(err);
        continue;
      }
    }
    SetNoDelay(fd.get());
    result = std::move(fd);
  }
  ::freeaddrinfo(res);
  if (!result.valid()) return absl::UnavailableError(last_error);
  return result;
}

class Client final : public Store {
 public:
  Client(UniqueFd fd, std::string endpoint)
      : endpoint_(std::move(endpoint)), fd_(std::move(fd)) {}

  absl::Status Set(absl::string_view key, absl::string_view value) override {
    if (absl::Status s = ValidateStoreKey(key); !s.ok()) return s;
    if (absl::Status s = ValidateStoreValue(key, value); !s.ok()) return s;
    return Call(kSet, {key, value}, absl::Now()).status();
  }

  absl::StatusOr<std::string> Get(absl::string_view key,
                                  absl::Time deadline) override {
    if (absl::Status s = ValidateStoreKey(key); !s.ok()) return s;
    const std::string timeout = EncodeTimeout(deadline);
    absl::StatusOr<Message> reply = Call(kGet, {timeout, key}, deadline);
    if (!reply.ok()) return reply.status();
    return std::move(reply->args[0]);
  }

  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override {
    if (absl::Status s = ValidateStoreKey(key); !s.ok()) return s;
    const std::string d = EncodeU64(static_cast<uint64_t>(delta));
    absl::StatusOr<Message> reply = Call(kAdd, {key, d}, absl::Now());
    if (!reply.ok()) return reply.status();
    return static_cast<int64_t>(GetU64(reply->args[0]));
  }

  absl::Status Wait(absl::Span<const std::string> keys,
                    absl::Time deadline) override {
    if (keys.size() > kMaxWaitKeys) {
      return absl::InvalidArgumentError(
          absl::StrCat("store wait: ", keys.size(),
                       " keys exceed the limit of ", kMaxWaitKeys));
    }
    const std::string timeout = EncodeTimeout(deadline);
    std::vector<absl::string_view> args;
    args.reserve(keys.size() + 1);
    args.push_back(timeout);
    for (const std::string& k : keys) {
      if (absl::Status s = ValidateStoreKey(k); !s.ok()) return s;
      args.push_back(k);
    }
    return Call(kWait, args, deadline).status();
  }

  absl::StatusOr<bool> Check(absl::string_view key) override {
    if (absl::Status s = ValidateStoreKey(key); !s.ok()) return s;
    absl::StatusOr<Message> reply = Call(kCheck, {key}, absl::Now());
    if (!reply.ok()) return reply.status();
    return reply->args[0][0] != 0;
  }

  // Presents the job token; PermissionDenied when the server's differs.
  absl::Status Hello(absl::string_view token) {
    absl::Status s = Call(kHello, {token}, absl::Now()).status();
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("TCP store ", endpoint_, ": ", s.message()));
    }
    return s;
  }

 private:
  // Sends one request and reads its reply, waiting at most until
  // `deadline` + kReplyGrace. A non-OK reply becomes the returned status
  // (the connection stays usable); an I/O or protocol error breaks the
  // connection for good.
  absl::StatusOr<Message> Call(uint8_t cmd,
                               absl::Span<const absl::string_view> args,
                               absl::Time deadline) {
    if (EncodedSize(args) > kMaxMessageBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "store request of ", EncodedSize(args),
          " bytes exceeds the limit of ", kMaxMessageBytes, " bytes"));
    }
    const std::string request = Encode(cmd, args);
    const absl::Time io_deadline = deadline + kReplyGrace;
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    absl::StatusOr<Message> reply = RoundTrip(cmd, request, io_deadline);
    if (!reply.ok()) {
      broken_ = absl::UnavailableError(
          absl::StrCat("TCP store ", endpoint_,
                       ": connection unusable: ", reply.status().message()));
      fd_.reset();
      return broken_;
    }
    if (reply->code != 0) {
      return absl::Status(static_cast<absl::StatusCode>(reply->code),
                          reply->args[0]);
    }
    return reply;
  }

  absl::StatusOr<Message> RoundTrip(uint8_t cmd, absl::string_view request,
                                    absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int fd = fd_.get();
    for (size_t sent = 0; sent < request.size();) {
      const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent,
                               MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (absl::Status s = PollFor(fd, POLLOUT, deadline); !s.ok()) return s;
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        return absl::UnavailableError(
            absl::StrCat("send: ", ErrnoString(errno)));
      }
    }
    std::string buf;
    char chunk[64 << 10];
    while (true) {
      Message m;
      size_t consumed = 0;
      std::string error;
      switch (ParseReply(cmd, buf, &m, &consumed, &error)) {
        case ParseResult::kDone:
          if (consumed != buf.size()) {
            return absl::DataLossError("unexpected bytes after the reply");
          }
          return m;
        case ParseResult::kMalformed:
          return absl::DataLossError(absl::StrCat("malformed reply: ", error));
        case ParseResult::kNeedMore:
          break;
      }
      const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
      if (n > 0) {
        buf.append(chunk, static_cast<size_t>(n));
      } else if (n == 0) {
        return absl::UnavailableError("server closed the connection");
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (absl::Status s = PollFor(fd, POLLIN, deadline); !s.ok()) return s;
      } else if (errno != EINTR) {
        return absl::UnavailableError(
            absl::StrCat("recv: ", ErrnoString(errno)));
      }
    }
  }

  static absl::Status PollFor(int fd, short events, absl::Time deadline) {
    pollfd p{fd, events, 0};
    while (true) {
      const int n = ::poll(&p, 1, PollTimeoutMs(deadline));
      if (n > 0) return absl::OkStatus();  // ready, or an error recv reports
      if (n == 0) {
        return absl::DeadlineExceededError(
            "no reply from the server within the deadline plus grace");
      }
      if (errno != EINTR) {
        return absl::UnavailableError(
            absl::StrCat("poll: ", ErrnoString(errno)));
      }
    }
  }

  const std::string endpoint_;
  absl::Mutex mu_;
  UniqueFd fd_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

// Server and client refuse a job token the HELLO could not carry.
absl::Status CheckTokenSize(const std::string& token) {
  if (token.size() <= kMaxTokenBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "job token of ", token.size(), " bytes exceeds the limit of ", kMaxTokenBytes));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpStoreServer>> StartTcpStoreServer(
    const TcpStoreServerOptions& options) {
  if (absl::Status s = CheckTokenSize(options.token); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
  if (!server.ok()) return server.status();
  return std::unique_ptr<TcpStoreServer>(*std::move(server));
}

absl::StatusOr<std::unique_ptr<Store>> ConnectTcpStore(
    const TcpStoreClientOptions& options) {
  const std::string where = Endpoint(options.host, options.port);
  if (options.host.empty() || options.port < 1 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid TCP store address ", where));
  }
  if (absl::Status s = CheckTokenSize(options.token); !s.ok()) return s;
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  absl::Duration backoff = absl::Milliseconds(10);
  while (true) {
    absl::StatusOr<UniqueFd> fd =
        TryConnect(options.host, options.port, deadline);
    if (fd.ok()) {
      auto client = std::make_unique<Client>(*std::move(fd), where);
      if (!options.token.empty()) {
        if (absl::Status s = client->Hello(options.token); !s.ok()) return s;
      }
      return std::unique_ptr<Store>(std::move(client));
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "could not connect to the TCP store at ", where, " within ",
          absl::FormatDuration(options.connect_timeout), ": ",
          fd.status().message()));
    }
    absl::SleepFor(std::min(backoff, left));
    backoff = std::min(backoff * 2, absl::Milliseconds(500));
  }
}

}  // namespace fusebox::comm
