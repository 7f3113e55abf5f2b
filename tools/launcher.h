// Pure logic of the fusebox-run launcher: command-line parsing, the per-rank
// environment, the "[rank]: " line prefixer and exit-status wording. No I/O
// here, so that unit tests can call all of it; the process handling lives in
// fusebox_run.cc.
#ifndef FUSEBOX_TOOLS_LAUNCHER_H_
#define FUSEBOX_TOOLS_LAUNCHER_H_

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace fusebox::tools {

inline constexpr int kMaxLocalRanks = 1024;

// Where a rank's stdout and stderr go.
enum class OutputMode {
  kPrefix,    // through the launcher, each line prefixed with "[rank]: "
  kSeparate,  // to <output_dir>/rank.<r>.out and rank.<r>.err
  kPlain,     // inherited from the launcher, unprefixed
};

// Where ranks run. kAuto binds rank r to the r-th CPU the launcher may use
// when there are at least as many CPUs as ranks (as mpirun does for small
// jobs), and does not bind otherwise.
enum class Binding { kAuto, kCore, kNone };

inline constexpr int kMaxNodes = 4096;

struct LaunchOptions {
  int nproc = 0;  // required, 1..kMaxLocalRanks
  // Several launchers, one per host, form one job: node `node_rank` of
  // `nnodes` runs global ranks node_rank * nproc .. + nproc - 1. Node 0's
  // launcher hosts the store on master_addr:master_port (a fixed port is
  // then required); the others' ranks connect to it.
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: the hosted store picks a free port
  OutputMode output = OutputMode::kPrefix;
  std::string output_dir;  // only with kSeparate
  // Wall-clock limit for the whole job; InfiniteDuration() means none.
  absl::Duration timeout = absl::InfiniteDuration();
  // Time between SIGTERM and SIGKILL when ranks are being shut down.
  absl::Duration grace = absl::Seconds(5);
  // After a rank fails, how long the others may run on to exit by
  // themselves (reporting the failure as they see it: fusebox's collectives
  // time out naming the ranks they waited for) before they are stopped.
  // Zero (the default): stop them at once, as torchrun and mpirun do.
  absl::Duration failure_grace = absl::ZeroDuration();
  // --env K=V in command-line order (a later K overrides an earlier one).
  std::vector<std::pair<std::string, std::string>> env;
  // The program and its arguments; never empty in a successful parse
  // unless `help` is set.
  std::vector<std::string> command;
  bool help = false;  // -h / --help: print LaunchUsage() and exit 0
  // --log-level as given (empty: none); resolved with FUSEBOX_LOG_LEVEL by
  // the launcher's main (comm/log.h).
  std::string log_level;
  Binding bind = Binding::kAuto;  // --bind auto|core|none
};

// The CPU each of `nproc` ranks is bound to, given the CPUs the launcher may
// use; empty when ranks are not bound. kCore binds round-robin even when
// ranks outnumber CPUs.
std::vector<int> RankCpus(const std::vector<int>& allowed_cpus, int nproc,
                          Binding bind);

// Parses the arguments after argv[0]. Options come first; the first argument
// that is not an option (or everything after "--") is the command, so the
// command's own flags pass through untouched. Long options accept both
// "--opt value" and "--opt=value"; "-n" also accepts "-n4". Errors are
// InvalidArgument with a message fit for the user (the caller exits 2).
absl::StatusOr<LaunchOptions> ParseLaunchArgs(
    absl::Span<const std::string> args);

// The --help text: usage, options and examples.
std::string LaunchUsage();

// Variables the launcher sets for every rank; --env may not set them.
inline constexpr const char* kReservedEnvVars[] = {
    "RANK",        "WORLD_SIZE",  "LOCAL_RANK",         "LOCAL_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT", "FUSEBOX_AGENT_STORE"};

// The global rank of local rank `local_rank` (node_rank * nproc + local).
int GlobalRank(const LaunchOptions& options, int local_rank);

// The environment ("K=V" strings) of local rank `rank`: `base` (usually the
// launcher's own environment) with options.env applied on top and then the
// launcher's variables (RANK = GlobalRank, WORLD_SIZE = nnodes * nproc,
// LOCAL_RANK, LOCAL_WORLD_SIZE = nproc; FUSEBOX_STORE_ADDR and
// FUSEBOX_STORE_PORT = `store_port`, where fusebox's store listens, with
// FUSEBOX_AGENT_STORE=1; MASTER_ADDR and MASTER_PORT = `torch_port`, left
// free for the job's own rendezvous, such as torch.distributed's env://).
// Every variable appears once. Entries of `base` without '=' are dropped.
std::vector<std::string> BuildRankEnvironment(
    absl::Span<const std::string> base, const LaunchOptions& options, int rank,
    int store_port, int torch_port);

// The address the hosted store binds to: loopback when ranks reach it over
// loopback (the usual single-host case, so the store is not exposed to the
// network), otherwise every interface.
std::string StoreBindAddress(absl::string_view master_addr);

// Splits a byte stream into whole lines and prefixes each. Feed() may be
// given any fragments (a line split across reads, many lines in one read);
// it returns only complete, prefixed, '\n'-terminated lines and keeps the
// rest. A line longer than `max_line_bytes` is emitted in pieces of that size
// (each prefixed and terminated), so memory stays bounded whatever a rank
// writes. Not thread-safe; one per (rank, stream).
class LinePrefixer {
 public:
  static constexpr size_t kDefaultMaxLineBytes = 1 << 20;

  explicit LinePrefixer(std::string prefix,
                        size_t max_line_bytes = kDefaultMaxLineBytes);

  // Returns the prefixed complete lines now available (maybe empty).
  std::string Feed(absl::string_view data);

  // At end of stream: returns the unterminated last line, prefixed and with
  // a '\n' appended, or "" if nothing is pending.
  std::string Flush();

  size_t pending_bytes() const { return partial_.size(); }

 private:
  void EmitLine(absl::string_view line, std::string& out) const;

  std::string prefix_;
  size_t max_line_bytes_;
  std::string partial_;  // bytes after the last '\n' seen
};

// "[<rank>]: ", the prefix of rank `rank`'s lines in OutputMode::kPrefix.
std::string RankPrefix(int rank);

// Describes a waitpid() status, e.g. "exited with status 3" or
// "killed by signal SIGKILL".
std::string DescribeWaitStatus(int wait_status);

// The launcher's exit code for a failed rank's wait status: the rank's own
// exit code when it exited non-zero, 128 + signal when it was killed, and 0
// only for a clean exit.
int ExitCodeForWaitStatus(int wait_status);

// Name of a signal, e.g. "SIGTERM"; "signal 42" when it has none.
std::string SignalName(int sig);

}  // namespace fusebox::tools

#endif  // FUSEBOX_TOOLS_LAUNCHER_H_
