// Test helper: a loopback TCP port that was free a moment ago.
#ifndef FUSEBOX_TESTS_COMM_FREE_PORT_H_
#define FUSEBOX_TESTS_COMM_FREE_PORT_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace fusebox::comm::testing_util {

inline int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace fusebox::comm::testing_util

#endif  // FUSEBOX_TESTS_COMM_FREE_PORT_H_
