// TCP Store server (StartTcpStoreServer); the protocol it serves is
// Note [TCP store wire protocol] in tcp_store_wire.cc.
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
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "comm/store.h"
#include "comm/tcp_store_internal.h"
#include "comm/tcp_store_wire.h"
#include "comm/unique_fd.h"

namespace fusebox::comm {
namespace {

using tcp_store_internal::CheckTokenSize;
using tcp_store_internal::DecodeTimeout;
using tcp_store_internal::EncodeU64;
using tcp_store_internal::Endpoint;
using tcp_store_internal::ErrnoString;
using tcp_store_internal::GetU64;
using tcp_store_internal::PollTimeoutMs;
using tcp_store_internal::SetNoDelay;
using tcp_store_internal::SetNonBlocking;
using tcp_store_wire::Encode;
using tcp_store_wire::kAdd;
using tcp_store_wire::kCheck;
using tcp_store_wire::kGet;
using tcp_store_wire::kHello;
using tcp_store_wire::kMaxErrorBytes;
using tcp_store_wire::kMaxMessageBytes;
using tcp_store_wire::kSet;
using tcp_store_wire::kWait;
using tcp_store_wire::Message;
using tcp_store_wire::ParseRequest;
using tcp_store_wire::ParseResult;

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

}  // namespace

absl::StatusOr<std::unique_ptr<TcpStoreServer>> StartTcpStoreServer(
    const TcpStoreServerOptions& options) {
  if (absl::Status s = CheckTokenSize(options.token); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
  if (!server.ok()) return server.status();
  return std::unique_ptr<TcpStoreServer>(*std::move(server));
}

}  // namespace fusebox::comm
