// fusebox_soak: the soak test's binary, the edge where flags and the
// environment are read (tests/soak/README.md).
//
//   fusebox-run -n 3 -- fusebox_soak                       # the CTest run
//   fusebox-run -n 4 -- fusebox_soak --iterations 0 --seconds 3600
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "comm/backends.h"
#include "tests/soak/await.h"
#include "tests/soak/soak.h"

ABSL_FLAG(int64_t, iterations, 1000, "stop after this many iterations (0: no limit)");
ABSL_FLAG(double, seconds, 0, "stop after this many seconds (0: no limit); with --iterations, "
                              "whichever comes first");
ABSL_FLAG(double, warmup, 0.25, "fraction of the run whose usage samples set the baseline");
ABSL_FLAG(uint64_t, seed, 1, "seed of the layout, plans, engines and direct calls");
ABSL_FLAG(int, tensors, 40, "gradients in the layout");
ABSL_FLAG(int64_t, max_tensor_kib, 4096, "size of the largest gradient, KiB");
ABSL_FLAG(int, threads, 2, "threads calling MarkReady per rank");
ABSL_FLAG(int, direct, 6, "direct communicator calls per iteration");
ABSL_FLAG(int64_t, max_direct_elements, 1 << 17, "largest direct allreduce, elements");
ABSL_FLAG(int, plan_every, 10, "swap the plan every this many iterations (0: never)");
ABSL_FLAG(int, cache_every, 50, "policy-cache round every this many iterations (0: never)");
ABSL_FLAG(int, rebuild_every, 200, "new engine every this many iterations (0: never)");
ABSL_FLAG(int, sample_every, 10, "RSS and fd sample every this many iterations");
ABSL_FLAG(bool, log_samples, false, "print every usage sample, with the plan in use");
ABSL_FLAG(std::string, cache_dir, "",
          "policy cache directory shared by the ranks (default: a fresh one under $TMPDIR or "
          "/tmp, removed at the end)");
ABSL_FLAG(double, rss_slack_mib, 8, "RSS may grow after the warm-up by max(this, --rss_slack_pct)");
ABSL_FLAG(double, rss_slack_pct, 5, "... or by this percentage of the baseline RSS");
ABSL_FLAG(int, fd_slack, 0, "open file descriptors may grow after the warm-up by this many");
ABSL_FLAG(double, timeout, 120, "seconds any one collective or engine iteration may take");
ABSL_FLAG(std::string, backend, "ucx", "communication backend: ucx, mpi or nccl");
ABSL_FLAG(int64_t, corrupt_at, -1,
          "fault injection: the last rank corrupts one result at this iteration (-1: off)");
ABSL_FLAG(int64_t, leak_kib, 0, "fault injection: leak this many KiB per iteration (0: off)");

namespace fusebox::soak {
namespace {

constexpr size_t kMaxPathBytes = 4096;

constexpr char kUsage[] =
    "fusebox_soak [flags]\n"
    "\n"
    "Many iterations of the bucketing engine and direct allreduces on real ranks, with plan\n"
    "swaps, engine rebuilds and concurrent policy-cache writes; every result is checked bit\n"
    "for bit, RSS and open fds must stay flat after the warm-up. Start it under fusebox-run:\n"
    "\n"
    "  fusebox-run -n 3 -- fusebox_soak\n"
    "  fusebox-run -n 4 -- fusebox_soak --iterations 0 --seconds 3600\n"
    "\n"
    "Every rank prints one summary line; exits non-zero on a wrong result, a failed\n"
    "collective or cache operation, or growth beyond the bounds.";

int Fail(int rank, const std::string& message) {
  std::fprintf(stderr, "fusebox_soak rank %d: FAILED: %s\n", rank, message.c_str());
  return 1;
}

absl::StatusOr<SoakOptions> OptionsFromFlags() {
  SoakOptions o;
  o.iterations = absl::GetFlag(FLAGS_iterations);
  o.seconds = absl::GetFlag(FLAGS_seconds);
  o.warmup_fraction = absl::GetFlag(FLAGS_warmup);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.tensors = absl::GetFlag(FLAGS_tensors);
  o.max_tensor_bytes = absl::GetFlag(FLAGS_max_tensor_kib) << 10;
  o.marking_threads = absl::GetFlag(FLAGS_threads);
  o.direct_calls = absl::GetFlag(FLAGS_direct);
  o.max_direct_elements = absl::GetFlag(FLAGS_max_direct_elements);
  o.plan_every = absl::GetFlag(FLAGS_plan_every);
  o.cache_every = absl::GetFlag(FLAGS_cache_every);
  o.rebuild_every = absl::GetFlag(FLAGS_rebuild_every);
  o.sample_every = absl::GetFlag(FLAGS_sample_every);
  o.log_samples = absl::GetFlag(FLAGS_log_samples);
  o.rss_slack_bytes = static_cast<int64_t>(absl::GetFlag(FLAGS_rss_slack_mib) * (1 << 20));
  o.rss_slack_fraction = absl::GetFlag(FLAGS_rss_slack_pct) / 100;
  o.fd_slack = absl::GetFlag(FLAGS_fd_slack);
  o.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout));
  o.corrupt_at = absl::GetFlag(FLAGS_corrupt_at);
  o.leak_kib_per_iteration = absl::GetFlag(FLAGS_leak_kib);
  if (o.iterations < 0 || o.seconds < 0 || (o.iterations == 0 && o.seconds == 0)) {
    return absl::InvalidArgumentError("--iterations and --seconds must be >= 0, one of them > 0");
  }
  if (!(o.warmup_fraction > 0 && o.warmup_fraction < 1)) {
    return absl::InvalidArgumentError("--warmup must be in (0, 1)");
  }
  if (o.tensors < 1 || o.tensors > 4096 || o.max_tensor_bytes < 16 || o.max_tensor_bytes > (1 << 30) ||
      o.marking_threads < 1 || o.marking_threads > 64 || o.direct_calls < 0 ||
      o.direct_calls > 1024 || o.max_direct_elements < 1 || o.max_direct_elements > (1 << 26) ||
      o.plan_every < 0 || o.cache_every < 0 || o.rebuild_every < 0 || o.sample_every < 1 ||
      o.fd_slack < 0 || o.rss_slack_bytes < 0 || o.rss_slack_fraction < 0 ||
      !(o.timeout > absl::ZeroDuration()) || o.leak_kib_per_iteration < 0) {
    return absl::InvalidArgumentError(
        "a flag is out of range: --tensors [1, 4096], --max_tensor_kib [1, 1M], --threads "
        "[1, 64], --direct [0, 1024], --max_direct_elements [1, 64M], --*_every >= 0 "
        "(--sample_every >= 1), slacks and --leak_kib >= 0, --timeout > 0");
  }
  return o;
}

// Rank 0 makes the cache directory (unless --cache_dir names one) and every
// rank learns its path from rank 0.
absl::StatusOr<std::string> SharedCacheDir(comm::Communicator& c, const std::string& flag,
                                           absl::Duration timeout) {
  std::vector<char> path(kMaxPathBytes, '\0');
  if (c.rank() == 0) {
    std::string dir = flag;
    if (dir.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      std::string tmpl = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                      "/fusebox-soak-XXXXXX");
      if (mkdtemp(tmpl.data()) != nullptr) dir = tmpl;
    }
    if (dir.size() < kMaxPathBytes) dir.copy(path.data(), dir.size());
  }
  absl::Status s = Await(c.Broadcast(path.data(), path.size(), comm::DataType::kUInt8, 0),
                         timeout, "sharing the cache directory");
  if (!s.ok()) return s;
  if (path[0] == '\0') {
    return absl::UnavailableError("rank 0 could not make a cache directory (TMPDIR, or a "
                                  "--cache_dir shorter than 4096 bytes)");
  }
  return std::string(path.data());
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    std::fprintf(stderr, "fusebox_soak: unexpected argument '%s' (--help for the flags)\n",
                 positional[1]);
    return 2;
  }
  absl::StatusOr<SoakOptions> options = OptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "fusebox_soak: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  comm::BackendOptions backend;
  // A user's UCX_TLS is honoured, as by fusebox-perf.
  if (const char* tls = std::getenv("UCX_TLS"); tls != nullptr && *tls != '\0') {
    backend.ucx.transports = tls;
  }
  auto launch = comm::ConnectFromEnvironment(::getenv, &argc, &argv);
  if (!launch.ok()) return Fail(-1, std::string(launch.status().message()));
  int rc = 0;
  {
    auto c = comm::CreateCommunicator(absl::GetFlag(FLAGS_backend), backend, launch->rdv);
    if (!c.ok()) {
      rc = Fail(launch->rdv.rank, std::string(c.status().message()));
    } else {
      comm::Communicator& comm = **c;
      const std::string flag_dir = absl::GetFlag(FLAGS_cache_dir);
      absl::StatusOr<std::string> dir = SharedCacheDir(comm, flag_dir, options->timeout);
      absl::StatusOr<SoakReport> report = absl::UnknownError("not run");
      if (dir.ok()) {
        options->cache_dir = *dir;
        options->exclusive_cache_dir = flag_dir.empty();
        report = RunSoak(comm, *options);
      } else {
        report = dir.status();
      }
      if (!report.ok()) {
        rc = Fail(comm.rank(), std::string(report.status().message()));
      } else {
        const absl::Status usage = report->usage.Check(
            options->rss_slack_bytes, options->rss_slack_fraction, options->fd_slack);
        std::printf("fusebox_soak %s %s\n", usage.ok() ? "OK" : "FAILED",
                    SummaryLine(comm, *options, *report).c_str());
        std::printf("fusebox_soak rank %d usage samples (iteration:RSS/fds): %s\n", comm.rank(),
                    report->usage.Describe().c_str());
        std::fflush(stdout);
        if (!usage.ok()) rc = Fail(comm.rank(), std::string(usage.message()));
        // Nobody uses the directory any more once every rank is here.
        absl::Status s = Await(comm.Barrier(), options->timeout, "the final barrier");
        if (!s.ok()) rc = Fail(comm.rank(), std::string(s.message()));
      }
      if (comm.rank() == 0 && dir.ok() && flag_dir.empty()) {
        std::error_code ec;
        std::filesystem::remove_all(*dir, ec);
      }
    }
  }
  comm::ShutdownLaunch(*launch);
  return rc;
}

}  // namespace
}  // namespace fusebox::soak

int main(int argc, char** argv) { return fusebox::soak::Main(argc, argv); }
