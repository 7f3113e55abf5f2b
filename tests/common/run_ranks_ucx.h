// RunRanksUcx(world, fn, options): tests/common/run_ranks.h over real UCX
// communicators, one per thread, rendezvous through an in-memory store.
#ifndef FUSEBOX_TESTS_COMMON_RUN_RANKS_UCX_H_
#define FUSEBOX_TESTS_COMMON_RUN_RANKS_UCX_H_

#include <thread>
#include <vector>

#include "comm/memory_store.h"
#include "comm/ucx/communicator.h"
#include "gtest/gtest.h"
#include "tests/common/run_ranks.h"

namespace fusebox::testing {

// Creation is collective: every rank makes its communicator on its own
// thread, concurrently, then runs `fn` on it.
inline void RunRanksUcx(int world, const RankFn& fn, const comm::UcxOptions& options = {}) {
  comm::MemoryStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto c = comm::CreateUcxCommunicator(options, r, world, store);
      ASSERT_TRUE(c.ok()) << c.status();
      fn(r, **c);
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace fusebox::testing

#endif  // FUSEBOX_TESTS_COMMON_RUN_RANKS_UCX_H_
