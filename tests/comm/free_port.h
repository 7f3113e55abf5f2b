// Test helper: a loopback TCP port that was free a moment ago, chosen below
// the kernel's ephemeral range so that no outgoing connection takes it before
// the test binds it (comm/free_port.h).
#ifndef FUSEBOX_TESTS_COMM_FREE_PORT_H_
#define FUSEBOX_TESTS_COMM_FREE_PORT_H_

#include "absl/status/statusor.h"
#include "comm/free_port.h"
#include "gtest/gtest.h"

namespace fusebox::comm::testing_util {

inline int FreePort() {
  absl::StatusOr<int> port = PickFreePort("127.0.0.1");
  EXPECT_TRUE(port.ok()) << port.status();
  return port.ok() ? *port : 0;
}

}  // namespace fusebox::comm::testing_util

#endif  // FUSEBOX_TESTS_COMM_FREE_PORT_H_
