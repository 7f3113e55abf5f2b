// TCP Store: one server (hosted by rank 0, or by the fusebox-run launcher)
// and one client per rank. The wire protocol is fusebox's own, documented in
// tcp_store_wire.cc; every message is length-prefixed and bounded, and a
// malformed message closes only the connection that sent it.
#ifndef FUSEBOX_COMM_TCP_STORE_H_
#define FUSEBOX_COMM_TCP_STORE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/store.h"

namespace fusebox::comm {

// Serves the store on a background thread until destroyed.
class TcpStoreServer {
 public:
  virtual ~TcpStoreServer() = default;
  // The bound port (useful when started on port 0).
  virtual int port() const = 0;
  // Number of connections closed because they sent a malformed message or
  // lacked the job token.
  virtual int64_t rejected_connections() const = 0;
  // Number of connections closed by a timeout of TcpStoreServerOptions
  // (handshake, read or idle).
  virtual int64_t timed_out_connections() const = 0;
};

struct TcpStoreServerOptions {
  std::string bind_addr = "0.0.0.0";
  int port = 0;  // 0: pick a free port
  int max_connections = 4096;
  // When non-empty, a connection must present this token (HELLO) before any
  // other request; see Note [TCP store wire protocol]. At most 1024 bytes.
  std::string token;
  // Timeouts that close a connection (Note [TCP store timeouts] in
  // tcp_store_server.cc); each must be positive, absl::InfiniteDuration()
  // turns it off. A rank's client keeps one connection for the whole job and
  // may be silent for hours between requests, or parked in a long WAIT:
  // neither is cut by the defaults.
  //
  // From accept until the connection's first request has arrived whole
  // (the HELLO when a token is required).
  absl::Duration handshake_timeout = absl::Seconds(30);
  // From the first byte of a request until its last (a peer that trickles
  // or stalls mid-message; 30 s admits a 16 MiB value at 0.6 MB/s).
  absl::Duration read_timeout = absl::Seconds(30);
  // Silence (no byte received, no reply sent) while nothing is parked or
  // being sent. Off by default: the client does not reconnect, so a
  // connection closed this way fails the client's next request.
  absl::Duration idle_timeout = absl::InfiniteDuration();
};

absl::StatusOr<std::unique_ptr<TcpStoreServer>> StartTcpStoreServer(
    const TcpStoreServerOptions& options);

struct TcpStoreClientOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  // How long to keep retrying the initial connection (the server may start
  // after the client).
  absl::Duration connect_timeout = absl::Seconds(60);
  // Presented to the server right after connecting (empty: none). A wrong
  // token fails ConnectTcpStore with PermissionDenied.
  std::string token;
};

absl::StatusOr<std::unique_ptr<Store>> ConnectTcpStore(
    const TcpStoreClientOptions& options);

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_TCP_STORE_H_
