// A TCP port for a listener that another process will open (a launched
// command's own rendezvous, a test's server).
#ifndef FUSEBOX_COMM_FREE_PORT_H_
#define FUSEBOX_COMM_FREE_PORT_H_

#include <string>

#include "absl/status/statusor.h"

namespace fusebox::comm {

// A TCP port that can be bound on `bind_addr` (an IPv4 address; anything
// else means every address) now. The port is released before its listener
// binds it, so it is chosen *below* the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range): a port from bind(0) lies inside
// that range, where any process's next outgoing connection may take it first
// (a DDP job beside this one opens hundreds), and the listener then fails
// with EADDRINUSE. Only an explicit bind takes a port outside the range. The
// port is checked on `bind_addr` and on the wildcard address. Falls back to
// bind(0) (inside the range, with the race above) where the range leaves no
// room below it or 64 random ports below it were all taken.
absl::StatusOr<int> PickFreePort(const std::string& bind_addr);

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_FREE_PORT_H_
