// fusebox-run: starts N local ranks of a command around a TCP store that the
// launcher hosts itself (torchrun --standalone / mpirun on one host). See
// LaunchUsage() in launcher.cc for the user-facing contract.
//
// Note [fusebox-run process model]
// - Signals: SIGINT/SIGTERM/SIGHUP/SIGCHLD are blocked before any thread
//   exists (the store server runs a thread, which inherits the mask) and
//   read from a signalfd in the single event loop, together with the rank
//   output pipes. No signal handlers, no races with waitpid. One of the
//   three that is ignored on entry (nohup) is left ignored and not forwarded.
// - Every rank is the leader of its own process group, so "signal a rank"
//   means kill(-pgid): a rank that is a shell script takes its children with
//   it. Ranks also get PR_SET_PDEATHSIG = SIGKILL so they die if the
//   launcher is killed outright.
// - Children run only async-signal-safe code between fork and exec;
//   everything they need (argv, envp, fds) is prepared before fork. An exec
//   failure is reported to the parent through a close-on-exec pipe.
// - Shutdown (first failure, a forwarded signal, --timeout, a launch error)
//   sends SIGTERM (or the forwarded signal) to every rank's group, then
//   SIGKILL once --grace has passed; a second signal escalates at once.

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/free_port.h"
#include "comm/log.h"
#include "comm/tcp_store.h"
#include "comm/unique_fd.h"
#include "tools/launcher.h"

extern char** environ;

namespace fusebox::tools {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kExitLauncherError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitTimeout = 124;
constexpr size_t kReadChunk = 64 * 1024;

// Writes all of `data`; false on an error other than EINTR.
bool WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    ssize_t n = write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string ErrnoText(absl::string_view what, int err) {
  return absl::StrCat(what, ": ", strerror(err));
}

using fusebox::comm::UniqueFd;

absl::Status MakePipe(UniqueFd& read_end, UniqueFd& write_end) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(ErrnoText("pipe", errno));
  }
  read_end.reset(fds[0]);
  write_end.reset(fds[1]);
  return absl::OkStatus();
}

// Makes sure fds 0-2 are open, so that no pipe or file we create lands on
// them and gets clobbered by a child's dup2.
void EnsureStdFdsOpen() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
      int null_fd = open("/dev/null", O_RDWR);
      if (null_fd >= 0 && null_fd != fd) {
        dup2(null_fd, fd);
        close(null_fd);
      }
    }
  }
}

// Closes every fd >= 3 except `keep` (async-signal-safe; for the child).
void CloseFdsExcept(int keep) {
#ifdef SYS_close_range
  if (keep > 3)
    syscall(SYS_close_range, 3u, static_cast<unsigned>(keep - 1), 0u);
  if (syscall(SYS_close_range, static_cast<unsigned>(keep + 1), ~0u, 0u) == 0) {
    return;
  }
#endif
  struct rlimit lim;
  int max_fd = 65536;
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY &&
      lim.rlim_cur < static_cast<rlim_t>(max_fd)) {
    max_fd = static_cast<int>(lim.rlim_cur);
  }
  for (int fd = 3; fd < max_fd; ++fd) {
    if (fd != keep) close(fd);
  }
}

// One rank's stdout or stderr being forwarded in OutputMode::kPrefix.
struct Stream {
  UniqueFd fd;
  int target_fd;  // STDOUT_FILENO or STDERR_FILENO
  LinePrefixer prefixer;
};

struct Rank {
  pid_t pid = -1;  // also the id of its process group; -1 until started
  bool running = false;
  int wait_status = 0;
};

class Launcher {
 public:
  // Messages go to `log` (comm/log.h): a rank that fails is an error;
  // stopping ranks and forwarding signals are warnings.
  Launcher(LaunchOptions options, comm::Logger log)
      : options_(std::move(options)), log_(std::move(log)), ranks_(options_.nproc) {}
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  // Runs the job to the end; returns the launcher's exit code.
  int Run();

 private:
  absl::Status SetUp();
  absl::Status StartRank(int rank);
  void EventLoop();
  void HandleSignals();
  void ReapChildren();
  void OnRankExit(int rank, int wait_status);
  void BeginShutdown(int sig, int exit_code);
  void SignalAll(int sig);
  // Reads once from `stream`; false at end of stream (the stream is then
  // flushed and closed).
  bool ReadStream(Stream& stream);
  void Forward(int target_fd, absl::string_view data);
  void DrainStreams();
  int RunningCount() const;
  std::string RunningRanks() const;

  const LaunchOptions options_;
  const comm::Logger log_;
  std::vector<int> rank_cpus_;  // CPU per rank; empty: ranks are not bound
  std::vector<Rank> ranks_;
  std::vector<Stream> streams_;

  sigset_t blocked_;
  sigset_t original_mask_;
  struct rlimit original_nofile_ = {};
  UniqueFd signal_fd_;
  UniqueFd dev_null_;
  std::unique_ptr<comm::TcpStoreServer> store_;
  int store_port_ = 0;
  int torch_port_ = 0;  // MASTER_PORT for the command's own rendezvous
  std::vector<std::string> base_env_;
  bool target_broken_[3] = {false, false, false};

  Clock::time_point started_at_;
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point kill_at_;
  int exit_code_ = 0;  // set by the first BeginShutdown
  // With --failure-grace: the first failure, waiting for the others to
  // report it themselves until stop_at_.
  bool failed_ = false;
  int failure_exit_code_ = 0;
  Clock::time_point stop_at_ = Clock::time_point::max();
};

int Launcher::RunningCount() const {
  return static_cast<int>(std::count_if(
      ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; }));
}

std::string Launcher::RunningRanks() const {
  std::vector<int> running;
  for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
    if (ranks_[r].running) running.push_back(GlobalRank(options_, r));
  }
  return absl::StrJoin(running, ", ");
}

absl::Status Launcher::SetUp() {
  EnsureStdFdsOpen();

  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) {
    std::vector<int> cpus;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
    }
    rank_cpus_ = RankCpus(cpus, options_.nproc, options_.bind);
  }

  // Before the store starts its thread: see Note [fusebox-run process model].
  // A signal ignored on entry (nohup, a shell's background job) stays
  // ignored, for the launcher and the ranks alike, as a shell would do.
  // SIGCHLD inherited as ignored would make the kernel reap the ranks
  // before we can see how they ended.
  signal(SIGCHLD, SIG_DFL);
  sigemptyset(&blocked_);
  sigaddset(&blocked_, SIGCHLD);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction current = {};
    if (sigaction(sig, nullptr, &current) == 0 &&
        current.sa_handler == SIG_IGN) {
      continue;
    }
    sigaddset(&blocked_, sig);
  }
  if (sigprocmask(SIG_BLOCK, &blocked_, &original_mask_) != 0) {
    return absl::InternalError(ErrnoText("sigprocmask", errno));
  }
  signal_fd_.reset(signalfd(-1, &blocked_, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!signal_fd_.valid()) {
    return absl::InternalError(ErrnoText("signalfd", errno));
  }
  // A closed stdout must not kill the launcher (and with it every rank).
  signal(SIGPIPE, SIG_IGN);

  // Two pipes per rank in prefix mode, and on the node hosting the store a
  // connection per rank of the job: raise the soft fd limit if needed.
  getrlimit(RLIMIT_NOFILE, &original_nofile_);
  rlim_t need = static_cast<rlim_t>(options_.nproc) * 2 + 64;
  if (options_.node_rank == 0) need += static_cast<rlim_t>(options_.nproc) * options_.nnodes;
  if (original_nofile_.rlim_cur != RLIM_INFINITY &&
      original_nofile_.rlim_cur < need) {
    struct rlimit raised = original_nofile_;
    raised.rlim_cur = std::min(need, original_nofile_.rlim_max);
    setrlimit(RLIMIT_NOFILE, &raised);
  }

  dev_null_.reset(open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!dev_null_.valid()) {
    return absl::InternalError(ErrnoText("open /dev/null", errno));
  }

  if (options_.output == OutputMode::kSeparate) {
    std::error_code ec;
    std::filesystem::create_directories(options_.output_dir, ec);
    if (ec) {
      return absl::InternalError(absl::StrCat("cannot create --output-dir '",
                                              options_.output_dir,
                                              "': ", ec.message()));
    }
  }

  if (options_.nnodes > 1) {
    // Every node must give its ranks the same MASTER_PORT: the next one.
    if (options_.master_port >= 65535) {
      return absl::InvalidArgumentError(
          "--master-port must be below 65535 with --nnodes > 1 (the command's own rendezvous "
          "gets --master-port + 1)");
    }
    torch_port_ = options_.master_port + 1;
  } else {
    // The command's own rendezvous (torch's env://) listens there; never on
    // the port this launcher's store is about to bind (--master-port, also
    // below the ephemeral range).
    for (int attempt = 0; torch_port_ == 0 || torch_port_ == options_.master_port; ++attempt) {
      absl::StatusOr<int> port =
          fusebox::comm::PickFreePort(StoreBindAddress(options_.master_addr));
      if (!port.ok()) {
        return absl::InternalError(absl::StrCat("MASTER_PORT: ", port.status().message()));
      }
      if (attempt == 8) {
        return absl::InternalError(absl::StrCat(
            "MASTER_PORT: no free port other than --master-port ", options_.master_port));
      }
      torch_port_ = *port;
    }
  }
  if (options_.node_rank != 0) {
    // Node 0's launcher hosts the store; this node's ranks connect to it.
    store_port_ = options_.master_port;
    for (char** e = environ; *e != nullptr; ++e) base_env_.emplace_back(*e);
    return absl::OkStatus();
  }
  comm::TcpStoreServerOptions store_options;
  store_options.bind_addr = StoreBindAddress(options_.master_addr);
  // The job token, if the job has one: the ranks inherit it and present it.
  if (const char* token = std::getenv("FUSEBOX_JOB_TOKEN"); token != nullptr) {
    store_options.token = token;
  }
  store_options.port = options_.master_port;
  store_options.max_connections =
      std::max(store_options.max_connections, 4 * options_.nproc * options_.nnodes);
  auto store = comm::StartTcpStoreServer(store_options);
  if (!store.ok()) {
    return absl::Status(
        store.status().code(),
        absl::StrCat("cannot start the rendezvous store on ",
                     store_options.bind_addr, ":", options_.master_port, ": ",
                     store.status().message()));
  }
  store_ = *std::move(store);
  store_port_ = store_->port();
  log_.Debug(absl::StrCat("rendezvous store on ", store_options.bind_addr, ":", store_port_,
                          "; MASTER_PORT ", torch_port_, " left to the command"));

  for (char** e = environ; *e != nullptr; ++e) base_env_.emplace_back(*e);
  return absl::OkStatus();
}

absl::Status Launcher::StartRank(int rank) {
  // Everything the child needs is built here, before fork.
  std::vector<std::string> env =
      BuildRankEnvironment(base_env_, options_, rank, store_port_, torch_port_);
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = options_.command;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  UniqueFd out_read, out_write, err_read, err_write;
  if (options_.output == OutputMode::kPrefix) {
    if (auto s = MakePipe(out_read, out_write); !s.ok()) return s;
    if (auto s = MakePipe(err_read, err_write); !s.ok()) return s;
  } else if (options_.output == OutputMode::kSeparate) {
    for (auto [fd, ext] : {std::pair<UniqueFd*, const char*>{&out_write, "out"},
                           {&err_write, "err"}}) {
      std::string path =
          absl::StrCat(options_.output_dir, "/rank.", GlobalRank(options_, rank), ".", ext);
      fd->reset(
          open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
      if (!fd->valid()) {
        return absl::InternalError(
            ErrnoText(absl::StrCat("open ", path), errno));
      }
    }
  }
  UniqueFd exec_read, exec_write;
  if (auto s = MakePipe(exec_read, exec_write); !s.ok()) return s;

  // Prepared before fork: the child may only make async-signal-safe calls.
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const bool bind = static_cast<size_t>(rank) < rank_cpus_.size();
  if (bind) CPU_SET(rank_cpus_[rank], &cpus);

  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(ErrnoText("fork", errno));
  if (pid == 0) {
    // Child: async-signal-safe calls only.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the launcher is already gone
    if (bind) sched_setaffinity(0, sizeof(cpus), &cpus);
    dup2(dev_null_.get(), STDIN_FILENO);
    if (out_write.valid()) dup2(out_write.get(), STDOUT_FILENO);
    if (err_write.valid()) dup2(err_write.get(), STDERR_FILENO);
    setrlimit(RLIMIT_NOFILE, &original_nofile_);
    struct sigaction dfl = {};
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGPIPE, &dfl, nullptr);
    sigprocmask(SIG_SETMASK, &original_mask_, nullptr);
    CloseFdsExcept(exec_write.get());
    execvpe(argv[0], argv.data(), envp.data());
    int err = errno;
    ssize_t ignored = write(exec_write.get(), &err, sizeof(err));
    (void)ignored;
    _exit(127);
  }

  // Parent. Also set the group here so that it exists before any kill().
  setpgid(pid, pid);
  ranks_[rank].pid = pid;
  ranks_[rank].running = true;
  exec_write.reset();
  out_write.reset();
  err_write.reset();

  int exec_errno = 0;
  ssize_t n;
  do {
    n = read(exec_read.get(), &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof(exec_errno))) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    ranks_[rank] = Rank{};  // reaped: its id must not be signalled later
    return absl::FailedPreconditionError(
        ErrnoText(absl::StrCat("cannot execute '", options_.command[0], "'"),
                  exec_errno));
  }

  if (options_.output == OutputMode::kPrefix) {
    for (auto [fd, target] :
         {std::pair<UniqueFd*, int>{&out_read, STDOUT_FILENO},
          {&err_read, STDERR_FILENO}}) {
      fcntl(fd->get(), F_SETFL, fcntl(fd->get(), F_GETFL) | O_NONBLOCK);
      streams_.push_back(
          Stream{std::move(*fd), target, LinePrefixer(RankPrefix(GlobalRank(options_, rank)))});
    }
  }
  if (log_.Enabled(comm::LogLevel::kInfo)) {
    log_.Info(absl::StrCat("rank ", GlobalRank(options_, rank), " started: pid ", pid,
                           bind ? absl::StrCat(", CPU ", rank_cpus_[rank]) : ", not bound"));
    log_.Debug(absl::StrCat("rank ", GlobalRank(options_, rank),
                            " runs: ", absl::StrJoin(options_.command, " ")));
  }
  return absl::OkStatus();
}

void Launcher::SignalAll(int sig) {
  // Exited ranks too: their group may still hold children of theirs. While
  // such members exist the id cannot be reused, so this reaches nobody else.
  for (const Rank& r : ranks_) {
    if (r.pid > 0) kill(-r.pid, sig);
  }
}

void Launcher::BeginShutdown(int sig, int exit_code) {
  if (stopping_) return;
  stopping_ = true;
  exit_code_ = exit_code;
  kill_at_ = Clock::now() + absl::ToChronoNanoseconds(
                                std::min(options_.grace, absl::Hours(24)));
  SignalAll(sig);
}

void Launcher::OnRankExit(int rank, int wait_status) {
  ranks_[rank].running = false;
  ranks_[rank].wait_status = wait_status;
  const bool clean = WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0;
  if (clean || stopping_) {
    log_.Info(
        absl::StrCat("rank ", GlobalRank(options_, rank), " ", DescribeWaitStatus(wait_status)));
    return;
  }
  log_.Error(
      absl::StrCat("rank ", GlobalRank(options_, rank), " ", DescribeWaitStatus(wait_status)));
  if (failed_) return;  // within --failure-grace of an earlier failure
  // (Ranks not started yet still are: a rank can fail before the last one
  // is launched.)
  if (options_.failure_grace > absl::ZeroDuration()) {
    failed_ = true;
    failure_exit_code_ = std::max(1, ExitCodeForWaitStatus(wait_status));
    stop_at_ = Clock::now() + absl::ToChronoNanoseconds(
                                  std::min(options_.failure_grace, absl::Hours(24)));
    log_.Warning(absl::StrCat("the other ranks may exit on their own for ",
                              absl::FormatDuration(options_.failure_grace),
                              " (--failure-grace) before they are stopped"));
    return;
  }
  if (RunningCount() > 0) {
    log_.Warning(absl::StrCat("stopping ranks ", RunningRanks(), " (SIGTERM, then ",
                              "SIGKILL after ", absl::FormatDuration(options_.grace), ")"));
  }
  BeginShutdown(SIGTERM, std::max(1, ExitCodeForWaitStatus(wait_status)));
}

void Launcher::ReapChildren() {
  for (;;) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      if (pid < 0 && errno == EINTR) continue;
      return;
    }
    for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
      if (ranks_[r].pid == pid && ranks_[r].running) {
        OnRankExit(r, status);
        break;
      }
    }
  }
}

void Launcher::HandleSignals() {
  struct signalfd_siginfo info;
  bool child = false;
  for (;;) {
    ssize_t n = read(signal_fd_.get(), &info, sizeof(info));
    if (n != static_cast<ssize_t>(sizeof(info))) {
      if (n < 0 && errno == EINTR) continue;
      break;
    }
    const int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGCHLD) {
      child = true;
      continue;
    }
    if (!stopping_) {
      log_.Warning(absl::StrCat("got ", SignalName(sig), "; forwarding it to all ",
                                "ranks (SIGKILL after ", absl::FormatDuration(options_.grace),
                                ")"));
      BeginShutdown(sig, 128 + sig);
    } else if (!killed_) {
      log_.Warning(absl::StrCat("got ", SignalName(sig), " again; killing all ranks"));
      SignalAll(SIGKILL);
      killed_ = true;
    }
  }
  if (child) ReapChildren();
}

void Launcher::Forward(int target_fd, absl::string_view data) {
  if (data.empty() || target_broken_[target_fd]) return;
  // Keep reading the ranks even if our own output is gone, so that they
  // never block on a full pipe.
  if (!WriteAll(target_fd, data)) target_broken_[target_fd] = true;
}

bool Launcher::ReadStream(Stream& stream) {
  char buf[kReadChunk];
  ssize_t n = read(stream.fd.get(), buf, sizeof(buf));
  if (n > 0) {
    Forward(stream.target_fd, stream.prefixer.Feed(absl::string_view(
                                  buf, static_cast<size_t>(n))));
    return true;
  }
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
  Forward(stream.target_fd, stream.prefixer.Flush());
  stream.fd.reset();
  return false;
}

void Launcher::DrainStreams() {
  // Every rank has exited, so what it wrote is already in the pipes; read
  // until empty rather than until EOF (a rank's own children may still
  // hold the write end), and at most a full pipe's worth, so that such a
  // child writing without pause cannot keep the launcher here.
  constexpr size_t kMaxDrainBytes = 2 << 20;  // > the largest pipe buffer
  for (Stream& stream : streams_) {
    size_t drained = 0;
    while (drained < kMaxDrainBytes) {
      char buf[kReadChunk];
      ssize_t n = read(stream.fd.get(), buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      drained += static_cast<size_t>(n);
      Forward(stream.target_fd, stream.prefixer.Feed(absl::string_view(
                                    buf, static_cast<size_t>(n))));
    }
    Forward(stream.target_fd, stream.prefixer.Flush());
    stream.fd.reset();
  }
  streams_.clear();
}

void Launcher::EventLoop() {
  // Beyond ~100 years a limit is no limit (and would overflow the clock).
  const bool has_timeout = options_.timeout < absl::Hours(24 * 365 * 100);
  const Clock::time_point timeout_at =
      has_timeout ? started_at_ + absl::ToChronoNanoseconds(options_.timeout)
                  : Clock::time_point::max();
  std::vector<pollfd> fds;
  while (RunningCount() > 0) {
    const Clock::time_point now = Clock::now();
    if (!stopping_ && now >= timeout_at) {
      log_.Error(absl::StrCat("timeout of ", absl::FormatDuration(options_.timeout),
                              " expired; stopping ranks ", RunningRanks()));
      BeginShutdown(SIGTERM, kExitTimeout);
    }
    if (!stopping_ && failed_ && now >= stop_at_) {
      log_.Warning(absl::StrCat("stopping ranks ", RunningRanks(), " (--failure-grace of ",
                                absl::FormatDuration(options_.failure_grace), " expired)"));
      BeginShutdown(SIGTERM, failure_exit_code_);
    }
    if (stopping_ && !killed_ && Clock::now() >= kill_at_) {
      log_.Warning(absl::StrCat("ranks ", RunningRanks(), " still running ",
                                absl::FormatDuration(options_.grace),
                                " after SIGTERM; sending SIGKILL"));
      SignalAll(SIGKILL);
      killed_ = true;
    }

    Clock::time_point wake = Clock::time_point::max();
    if (!stopping_) wake = std::min(timeout_at, stop_at_);
    if (stopping_ && !killed_) wake = kill_at_;
    int poll_ms = -1;
    if (wake != Clock::time_point::max()) {
      auto ms =
          std::chrono::ceil<std::chrono::milliseconds>(wake - Clock::now())
              .count();
      poll_ms = static_cast<int>(std::clamp<int64_t>(ms, 0, INT_MAX));
    }

    fds.clear();
    fds.push_back({signal_fd_.get(), POLLIN, 0});
    for (const Stream& s : streams_) fds.push_back({s.fd.get(), POLLIN, 0});
    int ready = poll(fds.data(), fds.size(), poll_ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      log_.Error(ErrnoText("poll", errno));
      BeginShutdown(SIGTERM, kExitLauncherError);
      SignalAll(SIGKILL);
      killed_ = true;
      ReapChildren();
      continue;
    }
    // Output first, so that a rank's last lines come before its exit report.
    bool closed_any = false;
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0 && !ReadStream(streams_[i - 1]))
        closed_any = true;
    }
    if (closed_any) {
      streams_.erase(
          std::remove_if(streams_.begin(), streams_.end(),
                         [](const Stream& s) { return !s.fd.valid(); }),
          streams_.end());
    }
    if (fds[0].revents != 0) HandleSignals();
  }
  DrainStreams();
}

int Launcher::Run() {
  started_at_ = Clock::now();
  if (absl::Status s = SetUp(); !s.ok()) {
    log_.Error(s.message());
    return kExitLauncherError;
  }
  for (int r = 0; r < options_.nproc && !stopping_; ++r) {
    if (absl::Status s = StartRank(r); !s.ok()) {
      log_.Error(absl::StrCat("rank ", GlobalRank(options_, r), ": ", s.message()));
      if (RunningCount() > 0) {
        log_.Warning(absl::StrCat("stopping ranks ", RunningRanks()));
      }
      BeginShutdown(SIGTERM, s.code() == absl::StatusCode::kFailedPrecondition
                                 ? 127
                                 : kExitLauncherError);
      break;
    }
    HandleSignals();  // a rank may already have failed, or ^C come in
  }
  EventLoop();
  store_.reset();
  if (stopping_) return exit_code_;
  return failed_ ? failure_exit_code_ : 0;
}

}  // namespace
}  // namespace fusebox::tools

int main(int argc, char** argv) {
  using fusebox::tools::LaunchOptions;
  std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<LaunchOptions> options = fusebox::tools::ParseLaunchArgs(args);
  if (!options.ok()) {
    fprintf(stderr, "fusebox-run: %s\n",
            std::string(options.status().message()).c_str());
    return fusebox::tools::kExitUsage;
  }
  if (options->help) {
    fputs(fusebox::tools::LaunchUsage().c_str(), stdout);
    return 0;
  }
  // Someone watches the terminal: the ranks print progress as whole lines
  // (a carriage-return progress line cannot pass through the prefixing).
  if (isatty(STDERR_FILENO) && std::getenv("FUSEBOX_PROGRESS") == nullptr) {
    options->env.emplace_back("FUSEBOX_PROGRESS", "1");
  }
  absl::StatusOr<fusebox::comm::LogLevel> level = fusebox::comm::ResolveLogLevel(
      options->log_level, std::getenv("FUSEBOX_LOG_LEVEL"), "--log-level");
  if (!level.ok()) {
    fprintf(stderr, "fusebox-run: %s\n", std::string(level.status().message()).c_str());
    return fusebox::tools::kExitUsage;
  }
  fusebox::tools::Launcher launcher(*std::move(options),
                                    fusebox::comm::Logger("fusebox-run", *level));
  return launcher.Run();
}
