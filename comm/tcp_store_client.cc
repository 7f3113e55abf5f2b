// TCP Store client (ConnectTcpStore); the protocol it speaks is
// Note [TCP store wire protocol] in tcp_store_wire.cc.

#include "comm/tcp_store.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
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
using tcp_store_internal::EncodeTimeout;
using tcp_store_internal::EncodeU64;
using tcp_store_internal::Endpoint;
using tcp_store_internal::ErrnoString;
using tcp_store_internal::GetU64;
using tcp_store_internal::PollTimeoutMs;
using tcp_store_internal::SetNoDelay;
using tcp_store_internal::SetNonBlocking;
using tcp_store_wire::EncodedSize;
using tcp_store_wire::Encode;
using tcp_store_wire::kAdd;
using tcp_store_wire::kCheck;
using tcp_store_wire::kGet;
using tcp_store_wire::kHello;
using tcp_store_wire::kMaxMessageBytes;
using tcp_store_wire::kMaxWaitKeys;
using tcp_store_wire::kSet;
using tcp_store_wire::kWait;
using tcp_store_wire::Message;
using tcp_store_wire::ParseReply;
using tcp_store_wire::ParseResult;

// A client gives up on a reply this long after the request's own deadline
// (or after sending, for requests that do not wait): the server is then
// presumed hung or gone, and the connection is marked broken.
constexpr absl::Duration kReplyGrace = absl::Seconds(10);

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

}  // namespace

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
