// fusebox-perf allreduce: the allreduce table on the shared harness.
#ifndef FUSEBOX_PERF_ALLREDUCE_H_
#define FUSEBOX_PERF_ALLREDUCE_H_

#include <cstdio>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "perf/harness.h"

namespace fusebox::perf {

struct AllReduceSummary {
  double avg_busbw = 0;   // mean bus bandwidth over every timed column
  int64_t wrong = 0;      // wrong elements over every checked column
  nlohmann::json rows = nlohmann::json::array();
};

// Prints the column header (rank 0 passes `out`, others nullptr).
void PrintAllReduceHeader(std::FILE* out, const PerfOptions& o);

// Runs the sweep for every (type, op) in `o` and prints one line per size on
// `out` (rank 0 only; nullptr elsewhere). Collective: every rank calls it.
absl::StatusOr<AllReduceSummary> RunAllReduce(Context& ctx, const PerfOptions& o,
                                              std::FILE* out);

}  // namespace fusebox::perf

#endif  // FUSEBOX_PERF_ALLREDUCE_H_
