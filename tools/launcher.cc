#include "tools/launcher.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "comm/rendezvous.h"

namespace fusebox::tools {
namespace {

absl::Status UsageError(absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat(message, " (see 'fusebox-run --help')"));
}

// Seconds as a plain number ("2.5") or an absl duration ("500ms", "2m").
absl::StatusOr<absl::Duration> ParseSeconds(absl::string_view option,
                                            absl::string_view text) {
  double seconds = 0;
  absl::Duration d;
  if (absl::SimpleAtod(text, &seconds)) {
    if (!std::isfinite(seconds) || seconds < 0) {
      return UsageError(absl::StrCat(option,
                                     " must be a non-negative number "
                                     "of seconds, got '",
                                     text, "'"));
    }
    d = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(text, &d) || d < absl::ZeroDuration() ||
             d == absl::InfiniteDuration()) {
    return UsageError(absl::StrCat(option,
                                   " expects seconds (e.g. 30, 2.5, "
                                   "500ms, 2m), got '",
                                   text, "'"));
  }
  return d;
}

absl::StatusOr<int> ParseIntInRange(absl::string_view option,
                                    absl::string_view text, int lo, int hi) {
  int value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < lo || value > hi) {
    return UsageError(absl::StrCat(option, " expects an integer in [", lo, ", ",
                                   hi, "], got '", text, "'"));
  }
  return value;
}

bool IsReserved(absl::string_view name) {
  for (const char* reserved : kReservedEnvVars) {
    if (name == reserved) return true;
  }
  return false;
}

bool IsValidEnvName(absl::string_view name) {
  if (name.empty() || absl::ascii_isdigit(name[0])) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_') return false;
  }
  return true;
}

// One option with its value (ParseLaunchArgs has checked the name takes
// one) into `options`.
absl::Status ApplyOption(const std::string& name, const std::string& value,
                         LaunchOptions* options, bool* nproc_given, bool* output_given) {
  if (name == "-n" || name == "--nproc" || name == "--nproc-per-node") {
    auto n = ParseIntInRange(name, value, 1, kMaxLocalRanks);
    if (!n.ok()) return n.status();
    options->nproc = *n;
    *nproc_given = true;
  } else if (name == "--nnodes") {
    auto n = ParseIntInRange(name, value, 1, kMaxNodes);
    if (!n.ok()) return n.status();
    options->nnodes = *n;
  } else if (name == "--node-rank") {
    auto n = ParseIntInRange(name, value, 0, kMaxNodes - 1);
    if (!n.ok()) return n.status();
    options->node_rank = *n;
  } else if (name == "--master-addr") {
    if (value.empty()) return UsageError("--master-addr must not be empty");
    options->master_addr = value;
  } else if (name == "--master-port") {
    auto port = ParseIntInRange(name, value, 0, 65535);
    if (!port.ok()) return port.status();
    options->master_port = *port;
  } else if (name == "--output") {
    if (value == "prefix") {
      options->output = OutputMode::kPrefix;
    } else if (value == "separate") {
      options->output = OutputMode::kSeparate;
    } else if (value == "plain") {
      options->output = OutputMode::kPlain;
    } else {
      return UsageError(absl::StrCat(
          "--output must be prefix, separate or plain, got '", value, "'"));
    }
    *output_given = true;
  } else if (name == "--output-dir") {
    if (value.empty()) return UsageError("--output-dir must not be empty");
    options->output_dir = value;
  } else if (name == "--timeout") {
    auto d = ParseSeconds(name, value);
    if (!d.ok()) return d.status();
    options->timeout =
        *d == absl::ZeroDuration() ? absl::InfiniteDuration() : *d;
  } else if (name == "--bind") {
    if (value == "auto") {
      options->bind = Binding::kAuto;
    } else if (value == "core") {
      options->bind = Binding::kCore;
    } else if (value == "none") {
      options->bind = Binding::kNone;
    } else {
      return UsageError(absl::StrCat("--bind takes auto, core or none, not '", value, "'"));
    }
  } else if (name == "--grace") {
    auto d = ParseSeconds(name, value);
    if (!d.ok()) return d.status();
    options->grace = *d;
  } else if (name == "--failure-grace") {
    auto d = ParseSeconds(name, value);
    if (!d.ok()) return d.status();
    options->failure_grace = *d;
  } else if (name == "--log-level") {
    if (value.empty()) return UsageError("--log-level must not be empty");
    options->log_level = value;
  } else if (name == "--env") {
    size_t eq = value.find('=');
    if (eq == std::string::npos) {
      return UsageError(
          absl::StrCat("--env expects NAME=VALUE, got '", value, "'"));
    }
    std::string key = value.substr(0, eq);
    if (!IsValidEnvName(key)) {
      return UsageError(
          absl::StrCat("--env: '", key, "' is not a valid variable name"));
    }
    if (IsReserved(key)) {
      return UsageError(absl::StrCat("--env may not set ", key,
                                     "; fusebox-run sets it for each rank"));
    }
    options->env.emplace_back(std::move(key), value.substr(eq + 1));
  }
  return absl::OkStatus();
}

// The checks across options, once all are read; --output-dir alone
// implies --output separate.
absl::Status CheckLaunchOptions(LaunchOptions* options, bool nproc_given, bool output_given) {
  if (!nproc_given) {
    return UsageError("the number of ranks is required: -n N");
  }
  if (options->command.empty()) {
    return UsageError("no command given");
  }
  if (options->node_rank >= options->nnodes) {
    return UsageError(absl::StrCat("--node-rank ", options->node_rank,
                                   " is out of range for --nnodes ", options->nnodes));
  }
  if (options->nnodes > 1 && options->master_port == 0) {
    return UsageError("--nnodes > 1 needs a fixed --master-port (every node's ranks must "
                      "find node 0's store)");
  }
  if (options->output == OutputMode::kSeparate && options->output_dir.empty()) {
    return UsageError("--output separate needs --output-dir DIR");
  }
  if (!options->output_dir.empty() && options->output != OutputMode::kSeparate) {
    if (output_given) {
      return UsageError("--output-dir applies only to --output separate");
    }
    options->output = OutputMode::kSeparate;  // --output-dir alone implies it
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LaunchOptions> ParseLaunchArgs(
    absl::Span<const std::string> args) {
  LaunchOptions options;
  bool nproc_given = false;
  bool output_given = false;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // first word of the command

    // Split "--name=value"; short options take "-n4" or "-n 4".
    std::string name = arg;
    std::string inline_value;
    bool has_inline_value = false;
    if (absl::StartsWith(arg, "--")) {
      size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        name = arg.substr(0, eq);
        inline_value = arg.substr(eq + 1);
        has_inline_value = true;
      }
      // torchrun's spelling (--nproc-per-node); the absl tools' (--nproc_per_node)
      // is accepted as well.
      std::replace(name.begin() + 2, name.end(), '_', '-');
    } else if (arg == "-np") {  // mpirun's spelling
      name = "-n";
    } else if (arg.size() > 2 && arg[1] == 'n') {
      name = "-n";
      inline_value = arg.substr(2);
      has_inline_value = true;
    }

    if (name == "-h" || name == "--help") {
      if (has_inline_value) {
        return UsageError(absl::StrCat(name, " takes no value"));
      }
      options.help = true;
      return options;
    }

    static const absl::flat_hash_set<std::string> kWithValue = {
        "-n",
        "--nproc",
        "--nproc-per-node",
        "--nnodes",
        "--node-rank",
        "--master-addr",
        "--master-port",
        "--output",
        "--output-dir",
        "--timeout",
        "--grace",
        "--failure-grace",
        "--bind",
        "--env",
        "--log-level"};
    if (!kWithValue.contains(name)) {
      return UsageError(absl::StrCat("unknown option '", name, "'"));
    }
    std::string value;
    if (has_inline_value) {
      value = inline_value;
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return UsageError(absl::StrCat("option ", name, " needs a value"));
    }

    if (absl::Status s = ApplyOption(name, value, &options, &nproc_given, &output_given);
        !s.ok()) {
      return s;
    }
  }

  options.command.assign(args.begin() + i, args.end());
  if (absl::Status s = CheckLaunchOptions(&options, nproc_given, output_given); !s.ok()) return s;
  return options;
}

std::string LaunchUsage() {
  return R"(Usage: fusebox-run -n N [options] [--] COMMAND [ARGS...]

Starts N local ranks of COMMAND (like torchrun --standalone or mpirun on one
host). The launcher hosts the rendezvous TCP store itself and gives every rank:
  RANK, LOCAL_RANK            0..N-1
  WORLD_SIZE, LOCAL_WORLD_SIZE N
  FUSEBOX_STORE_ADDR, FUSEBOX_STORE_PORT
                              where the hosted store listens (fusebox's tools
                              and libraries rendezvous there)
  FUSEBOX_AGENT_STORE=1       the store is hosted by the launcher, not rank 0
  MASTER_ADDR, MASTER_PORT    a port left free for the command's own
                              rendezvous: torch.distributed's env:// (rank 0
                              binds it); with --nnodes > 1, --master-port + 1
  FUSEBOX_PROGRESS=1          when the launcher's stderr is a terminal:
                              fusebox's tools print progress as lines
Options end at "--" or at the first argument that is not an option, so the
command's own flags are passed through untouched.

Options:
  -n, --nproc N           number of local ranks, 1..1024 (required; also
                          -nN, -np N, --nproc-per-node N)
      --nnodes N          launchers (hosts) in the job, 1..4096 (default 1)
      --node-rank K       this launcher's node, 0..N-1 (default 0); its ranks
                          are K*nproc .. K*nproc+nproc-1, WORLD_SIZE is
                          N*nproc; node 0 hosts the store, the others' ranks
                          connect to it (give --master-addr as the other
                          hosts reach node 0; node 0's store lives as long
                          as node 0's launcher, i.e. until its ranks exit)
      --master-addr ADDR  address ranks use to reach the store
                          (default 127.0.0.1)
      --master-port PORT  port of the hosted store (default: a free port;
                          required with --nnodes > 1)
      --output MODE       prefix   (default) each line of a rank's stdout and
                                   stderr is written whole, prefixed "[rank]: "
                          separate write rank r's output to DIR/rank.r.out and
                                   DIR/rank.r.err (needs --output-dir)
                          plain    ranks inherit the launcher's stdout/stderr
      --output-dir DIR    directory for --output separate (created if needed;
                          implies --output separate)
      --timeout SECONDS   stop all ranks and fail (exit 124) if the job is not
                          finished in time; 0 = no limit (default)
      --grace SECONDS     time between SIGTERM and SIGKILL when stopping
                          ranks (default 5)
      --failure-grace SECONDS
                          after a rank fails, let the others run this long
                          to exit on their own, reporting the failure as they
                          see it (a collective times out naming the ranks it
                          waited for: set FUSEBOX_TIMEOUT_S below this),
                          before stopping them (default 0: at once)
      --bind auto|core|none
                          auto (default): bind rank r to the r-th usable CPU
                          when there are at least as many CPUs as ranks;
                          core: always, round-robin; none: never
      --env NAME=VALUE    set a variable for every rank (repeatable)
      --log-level LEVEL   error, warning (default), info or debug; else
                          FUSEBOX_LOG_LEVEL. Ranks that fail are errors;
                          stopping and forwarding signals are warnings; info
                          adds each rank's start (pid, CPU) and exit; debug
                          the store's address and the command
  -h, --help              show this help

Seconds may be a number (30, 2.5) or a duration (500ms, 2m).

Behaviour:
  Each rank runs in its own process group with stdin from /dev/null, and is
  killed if the launcher dies. SIGINT, SIGTERM and SIGHUP are forwarded to
  every rank (unless ignored when the launcher started, as under nohup);
  ranks still running after the grace period get SIGKILL, and a second signal
  sends SIGKILL at once. When a rank exits non-zero or is killed by a signal,
  the launcher reports it, stops the other ranks the same way (SIGTERM, then
  SIGKILL; after --failure-grace if given) and exits non-zero.

Exit status:
  0        every rank exited 0
  S        the first failing rank exited with status S
  128+SIG  the first failing rank was killed by signal SIG, or the launcher
           received SIG
  124      --timeout expired
  2        bad command line (or FUSEBOX_LOG_LEVEL);  1  the launcher itself failed

Examples:
  fusebox-run -n 4 ./train --epochs 3
  fusebox-run -n 8 --timeout 10m --output separate --output-dir logs -- ./bench
  fusebox-run -n 2 --env OMP_NUM_THREADS=4 -- sh -c 'echo $RANK $WORLD_SIZE'
  # two hosts, 4 ranks each (run one on each host):
  fusebox-run -n 4 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 -- ./bench
  fusebox-run -n 4 --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29500 -- ./bench
)";
}

int GlobalRank(const LaunchOptions& options, int local_rank) {
  return options.node_rank * options.nproc + local_rank;
}

std::vector<std::string> BuildRankEnvironment(
    absl::Span<const std::string> base, const LaunchOptions& options, int rank,
    int store_port, int torch_port) {
  std::vector<std::pair<std::string, std::string>> overrides = options.env;
  overrides.emplace_back("RANK", absl::StrCat(GlobalRank(options, rank)));
  overrides.emplace_back("WORLD_SIZE", absl::StrCat(options.nnodes * options.nproc));
  overrides.emplace_back("LOCAL_RANK", absl::StrCat(rank));
  overrides.emplace_back("LOCAL_WORLD_SIZE", absl::StrCat(options.nproc));
  overrides.emplace_back("FUSEBOX_STORE_ADDR", options.master_addr);
  overrides.emplace_back("FUSEBOX_STORE_PORT", absl::StrCat(store_port));
  overrides.emplace_back("FUSEBOX_AGENT_STORE", "1");
  overrides.emplace_back("MASTER_ADDR", options.master_addr);
  overrides.emplace_back("MASTER_PORT", absl::StrCat(torch_port));

  // Later overrides win; each name is emitted once, base order first.
  absl::flat_hash_set<std::string> overridden;
  for (const auto& [key, value] : overrides) overridden.insert(key);

  std::vector<std::string> env;
  env.reserve(base.size() + overrides.size());
  absl::flat_hash_set<std::string> seen;
  for (const std::string& entry : base) {
    size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    std::string key = entry.substr(0, eq);
    if (overridden.contains(key) || !seen.insert(key).second) continue;
    env.push_back(entry);
  }
  for (size_t j = 0; j < overrides.size(); ++j) {
    bool later_wins = false;
    for (size_t k = j + 1; k < overrides.size(); ++k) {
      if (overrides[k].first == overrides[j].first) later_wins = true;
    }
    if (later_wins) continue;
    env.push_back(absl::StrCat(overrides[j].first, "=", overrides[j].second));
  }
  return env;
}

std::string StoreBindAddress(absl::string_view master_addr) {
  return comm::StoreBindAddressFor(master_addr);
}

LinePrefixer::LinePrefixer(std::string prefix, size_t max_line_bytes)
    : prefix_(std::move(prefix)),
      max_line_bytes_(max_line_bytes == 0 ? 1 : max_line_bytes) {}

void LinePrefixer::EmitLine(absl::string_view line, std::string& out) const {
  out.append(prefix_);
  out.append(line.data(), line.size());
  out.push_back('\n');
}

std::string LinePrefixer::Feed(absl::string_view data) {
  std::string out;
  while (!data.empty()) {
    size_t nl = data.find('\n');
    if (nl == absl::string_view::npos) {
      partial_.append(data.data(), data.size());
      data = {};
    } else {
      partial_.append(data.data(), nl);
      data.remove_prefix(nl + 1);
      // A complete line: emit it (in pieces if it is over-long).
      absl::string_view line = partial_;
      while (line.size() > max_line_bytes_) {
        EmitLine(line.substr(0, max_line_bytes_), out);
        line.remove_prefix(max_line_bytes_);
      }
      EmitLine(line, out);
      partial_.clear();
      continue;
    }
    // Bound the unterminated tail.
    while (partial_.size() > max_line_bytes_) {
      EmitLine(absl::string_view(partial_).substr(0, max_line_bytes_), out);
      partial_.erase(0, max_line_bytes_);
    }
  }
  return out;
}

std::string LinePrefixer::Flush() {
  if (partial_.empty()) return "";
  std::string out;
  EmitLine(partial_, out);
  partial_.clear();
  return out;
}

std::string RankPrefix(int rank) { return absl::StrCat("[", rank, "]: "); }

std::string SignalName(int sig) {
  // A table rather than sigabbrev_np(), which needs glibc 2.32.
  static constexpr std::pair<int, const char*> kNames[] = {
      {SIGHUP, "SIGHUP"},       {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"},
      {SIGILL, "SIGILL"},       {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"},
      {SIGBUS, "SIGBUS"},       {SIGFPE, "SIGFPE"},   {SIGKILL, "SIGKILL"},
      {SIGUSR1, "SIGUSR1"},     {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"},     {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"},
      {SIGCHLD, "SIGCHLD"},     {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"},
      {SIGTSTP, "SIGTSTP"},     {SIGTTIN, "SIGTTIN"}, {SIGTTOU, "SIGTTOU"},
      {SIGURG, "SIGURG"},       {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"},
      {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"}, {SIGWINCH, "SIGWINCH"},
      {SIGIO, "SIGIO"},         {SIGSYS, "SIGSYS"},
  };
  for (const auto& [number, name] : kNames) {
    if (number == sig) return name;
  }
  return absl::StrCat("signal ", sig);
}

std::string DescribeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) {
    return absl::StrCat("exited with status ", WEXITSTATUS(wait_status));
  }
  if (WIFSIGNALED(wait_status)) {
    return absl::StrCat("killed by signal ", SignalName(WTERMSIG(wait_status)),
                        WCOREDUMP(wait_status) ? " (core dumped)" : "");
  }
  return absl::StrCat("ended with wait status ", wait_status);
}

int ExitCodeForWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

std::vector<int> RankCpus(const std::vector<int>& allowed_cpus, int nproc,
                          Binding bind) {
  if (bind == Binding::kNone || allowed_cpus.empty() || nproc <= 0) return {};
  if (bind == Binding::kAuto && static_cast<size_t>(nproc) > allowed_cpus.size()) return {};
  std::vector<int> out(nproc);
  for (int r = 0; r < nproc; ++r) out[r] = allowed_cpus[r % allowed_cpus.size()];
  return out;
}

}  // namespace fusebox::tools
