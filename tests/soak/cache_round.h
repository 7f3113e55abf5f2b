// One round of the policy cache under load: every rank writes at once, then
// every rank reads everything back and checks it to the byte.
#ifndef FUSEBOX_TESTS_SOAK_CACHE_ROUND_H_
#define FUSEBOX_TESTS_SOAK_CACHE_ROUND_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "autotune/policy_cache.h"
#include "bucketing/layout.h"
#include "bucketing/plan.h"
#include "comm/communicator.h"

namespace fusebox::soak {

struct CacheRoundCounts {
  int64_t writes = 0;
  int64_t reads = 0;  // Lookup, Nearest and List calls
};

struct CacheRoundOptions {
  uint64_t seed = 0;
  int64_t round = 0;
  // The soak owns the directory: it must hold exactly the soak's entries.
  bool exclusive_dir = true;
  absl::Duration timeout = absl::Minutes(2);
};

// Collective (every rank, between iterations). Each rank stores, without
// waiting for the others, an entry under a key all ranks share (its own
// plan and figures: concurrent writers of one file) and one under its own
// key; after a barrier it checks that
// * the shared entry equals, byte for byte, one of the ranks' entries (one
//   complete write won; none was torn or mixed),
// * every rank's own entry reads back exactly as that rank wrote it
//   (Lookup, and Nearest from twice the world size),
// * List() finds no unusable file, no temporary file is left, and (with
//   exclusive_dir) the directory holds world + 1 entries.
// `warnings` is what the cache reported through its warn sink: any is a
// failure. Returns the winning shared entry's plan (the same on every rank;
// the caller installs it, so the engine's agreement check confirms it).
absl::StatusOr<bucketing::Plan> RunCacheRound(autotune::PolicyCache& cache,
                                              std::vector<std::string>& warnings,
                                              comm::Communicator& comm,
                                              const bucketing::GradientLayout& layout,
                                              const CacheRoundOptions& options,
                                              CacheRoundCounts& counts);

}  // namespace fusebox::soak

#endif  // FUSEBOX_TESTS_SOAK_CACHE_ROUND_H_
