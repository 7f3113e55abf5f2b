// Ranks as threads for tests: RunRanks(world, fn) runs fn(rank, communicator)
// on `world` threads over one in-process loopback group
// (comm/testing/loopback.h: no transport needed). Tests of a real backend
// use their backend's variant (run_ranks_ucx.h) with the same RankFn.
#ifndef FUSEBOX_TESTS_COMMON_RUN_RANKS_H_
#define FUSEBOX_TESTS_COMMON_RUN_RANKS_H_

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/testing/loopback.h"
#include "gtest/gtest.h"

namespace fusebox::testing {

using RankFn = std::function<void(int rank, comm::Communicator& comm)>;

// Runs `fn` once per rank, each on its own thread, and joins them. The
// communicators are made before any thread starts and destroyed after all
// have returned.
inline void RunRanks(int world, const RankFn& fn, const comm::testing::LoopbackOptions& options = {}) {
  auto comms = comm::testing::CreateLoopbackGroup(world, options);
  ASSERT_TRUE(comms.ok()) << comms.status();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] { fn(r, *(*comms)[r]); });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace fusebox::testing

#endif  // FUSEBOX_TESTS_COMMON_RUN_RANKS_H_
