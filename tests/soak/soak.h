// The soak: a bounded run of many iterations on real ranks, each a
// backward pass through the bucketing engine plus direct allreduces, with
// plan swaps, engine rebuilds and policy-cache rounds in between; every
// result is checked bit for bit on every rank, and memory and file
// descriptors must stay flat. tests/soak/README.md has the how and why.
#ifndef FUSEBOX_TESTS_SOAK_SOAK_H_
#define FUSEBOX_TESTS_SOAK_SOAK_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "tests/soak/process_usage.h"

namespace fusebox::soak {

struct SoakOptions {
  // Stop after this many iterations (0: no limit) or this long (0: no
  // limit), whichever comes first; at least one must be set. The ranks agree
  // on the last iteration (a vote each iteration), so a time limit is safe.
  int64_t iterations = 1000;
  double seconds = 0;
  // The first fraction of the run (of each limit set) is warm-up: its usage
  // samples set the baseline that later ones are judged against.
  double warmup_fraction = 0.25;
  uint64_t seed = 1;
  // The gradient layout (plan_mix.h MixedLayout).
  int tensors = 40;
  int64_t max_tensor_bytes = int64_t{4} << 20;
  // Threads calling MarkReady in each iteration, in a per-rank random order.
  int marking_threads = 2;
  // Direct communicator calls per iteration (AllReduce in or out of place,
  // or AllReduceMulti), each of up to this many elements, every dtype and op.
  int direct_calls = 6;
  int64_t max_direct_elements = int64_t{1} << 17;
  // Every this many iterations: a new plan (SetPlan), a policy-cache round
  // (whose winning plan is installed next), a new engine (other options).
  int plan_every = 10;
  int cache_every = 50;
  int rebuild_every = 200;
  // RSS and fd samples every this many iterations (and at the end).
  int sample_every = 10;
  // Print every sample (with the plan in use) on stdout as it is taken.
  bool log_samples = false;
  // Policy cache directory, the same on every rank; `exclusive_cache_dir`
  // when the soak owns it (then it must hold exactly the soak's entries).
  std::string cache_dir;
  bool exclusive_cache_dir = true;
  // The memory bound: the end RSS may exceed the warm-up's by
  // max(rss_slack_bytes, rss_slack_fraction x baseline); fds by fd_slack.
  int64_t rss_slack_bytes = int64_t{8} << 20;
  double rss_slack_fraction = 0.05;
  int fd_slack = 0;
  // Engine timeout and the deadline of every collective wait.
  absl::Duration timeout = absl::Minutes(2);
  // Fault injection, to show that the checks bite: at this iteration the
  // last rank flips a bit of one reduced gradient before checking (-1: off);
  // every iteration, keep this many more KiB allocated and touched (0: off).
  int64_t corrupt_at = -1;
  int64_t leak_kib_per_iteration = 0;
};

struct SoakCounts {
  int64_t iterations = 0;
  int64_t engine_allreduces = 0;  // buckets issued by the engine
  int64_t direct_allreduces = 0;  // tensors reduced by direct calls
  int64_t vote_allreduces = 0;    // the per-iteration stop/failure votes
  int64_t plan_swaps = 0;
  int64_t engine_rebuilds = 0;
  int64_t cache_rounds = 0;
  int64_t cache_writes = 0;
  int64_t cache_reads = 0;
  int64_t bytes_reduced = 0;  // gradient bytes through the engine + direct call bytes
  int64_t allreduces() const { return engine_allreduces + direct_allreduces + vote_allreduces; }
};

struct SoakReport {
  SoakCounts counts;
  UsageWatch usage;
  double wall_seconds = 0;
};

// Runs the soak on this rank; collective (every rank of `comm` calls it with
// the same options). A wrong result anywhere stops every rank at the end of
// that iteration: the rank that saw it returns DataLoss describing it, the
// others Aborted naming it. A failing collective or cache returns its error.
// The memory verdict is the caller's (report.usage.Check).
absl::StatusOr<SoakReport> RunSoak(comm::Communicator& comm, const SoakOptions& options);

// One line for the log: the counts, RSS and fds at baseline and end, time.
std::string SummaryLine(const comm::Communicator& comm, const SoakOptions& options,
                        const SoakReport& report);

}  // namespace fusebox::soak

#endif  // FUSEBOX_TESTS_SOAK_SOAK_H_
