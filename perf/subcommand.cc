#include "perf/subcommand.h"

#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <string>
#include <utility>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "comm/options.h"
#include "perf/sizes.h"

ABSL_FLAG(
    int, n, -1,
    "-n: timed iterations per size (allreduce; default 20), or rounds of every plan (overlap; "
    "default 10)");
ABSL_FLAG(int, w, -1,
          "-w: warm-up iterations per size (allreduce; default 5), or per visit of a plan after "
          "switching to it (overlap; default 1)");
ABSL_FLAG(std::string, backend, "ucx", "communication backend: ucx, mpi or nccl");
ABSL_FLAG(std::string, json, "", "also write the results as JSON to this file (rank 0)");
ABSL_FLAG(double, ucx_waiter_window_us, 200,
          "ucx backend: a non-blocking call issued right after its issuer waited at once for the "
          "previous one is left to its waiter's Wait for this long before the progress thread "
          "takes it (comm/async_core.h, Note [Waiters first]; 0: every call wakes the progress "
          "thread)");
ABSL_FLAG(double, ucx_spin_us, 0,
          "ucx backend: microseconds the progress thread keeps looking for work before it "
          "blocks until woken (0: at once, which lets a bucket launched during backward start "
          "sooner; 50 with --ucx_progress_nice 0 suits back-to-back small non-blocking calls)");
ABSL_FLAG(int, ucx_progress_nice, -10,
          "ucx backend: the progress thread's nice value where ranks do not outnumber cores (0: "
          "the caller's; a negative value needs CAP_SYS_NICE, else it is left and --log_level "
          "info says so)");
ABSL_FLAG(double, ucx_progress_slice_us, 0,
          "ucx backend: the progress thread's requested scheduler slice in microseconds where "
          "ranks do not outnumber cores (Linux 6.12+, clamped to 100-100000; a shorter slice "
          "runs a thread sooner when it wakes without a larger share; 0: the kernel's default)");
ABSL_FLAG(std::string, ucx_tls, "",
          "UCX transports for the ucx backend (as UCX_TLS; default: $UCX_TLS, else "
          "sysv,cma,self,tcp with the shared-memory allreduce)");
ABSL_FLAG(std::string, ucx_chunk, "256K", "ucx backend: ring pipeline chunk size");
ABSL_FLAG(std::string, ucx_shm_chunk, "128K",
          "ucx backend: bytes each rank owns per round of the shared-memory allreduce "
          "(a multiple of 64)");
ABSL_FLAG(std::string, ucx_issuer_begins, "auto",
          "ucx backend, one host: whether the thread that issues a non-blocking allreduce to "
          "an idle communicator publishes its descriptor and stages its first shared-memory "
          "round itself before the progress thread wakes: on, off, or auto (where this "
          "machine's ranks and their progress threads outnumber its cores)");
ABSL_FLAG(std::string, ucx_shm_stores, "auto",
          "ucx backend: how each rank writes the shared-memory allreduce's staging: cached "
          "(ordinary stores: fastest where the ranks' cores share a cache), streamed "
          "(non-temporal: where they do not), or auto (times both on the run's own "
          "allreduces of 256 KiB and more and runs the faster)");
ABSL_FLAG(std::string, ucx_cma_min, "2M",
          "ucx backend, one host: AllReduce of --ucx_cma_min to --ucx_cma_max bytes reads the "
          "peers' buffers in place by cross-memory attach (one kernel copy instead of "
          "staging) where the kernel lets every rank read every other; 0: never");
ABSL_FLAG(std::string, ucx_cma_max, "8M",
          "ucx backend, one host: the largest AllReduce that reads its peers in place "
          "(--ucx_cma_min)");
ABSL_FLAG(std::string, ucx_recursive_doubling, "64K",
          "ucx backend: AllReduce over messages (no shared memory: across hosts) up to this "
          "size (or --ucx_small, if larger) runs recursive doubling inside the round that "
          "compares the ranks' descriptors (where the world is a power of two of at least 4 "
          "ranks, only up to --ucx_rabenseifner_from); above it Rabenseifner (up to "
          "--ucx_rabenseifner) or the ring");
ABSL_FLAG(std::string, ucx_rabenseifner, "512K",
          "ucx backend: where the world is a power of two of at least 4 ranks, AllReduce over "
          "messages above --ucx_rabenseifner_from up to this size runs Rabenseifner's "
          "algorithm (reduce-scatter by recursive halving carrying the descriptors, then "
          "allgather by recursive doubling); above it the ring. 0: off (at most 64M)");
ABSL_FLAG(std::string, ucx_rabenseifner_from, "32K",
          "ucx backend: where both run (a power-of-two world of at least 4 ranks, over "
          "messages), AllReduce above this size runs Rabenseifner instead of recursive "
          "doubling");
ABSL_FLAG(std::string, ucx_opening, "auto",
          "ucx backend, over messages: how collectives open. rd: the descriptors compared by "
          "recursive doubling; linear: every descriptor to rank 0 and the verdict back "
          "(2(p-1) messages); auto: linear where some machine runs more ranks than it has "
          "cores and there are at least 5 ranks, rd otherwise");
ABSL_FLAG(std::string, ucx_linear, "4K",
          "ucx backend: where the linear round opens, AllReduce up to this size rides in it "
          "(at most 1M)");
ABSL_FLAG(std::string, ucx_measured_choice, "512K",
          "ucx backend: over messages, in a world of at least 3 ranks, AllReduce above 4K up to "
          "this size times its candidate algorithms (Rabenseifner, above 32K the ring, recursive "
          "doubling, and up to 64K, where ranks outnumber a machine's cores, the linear round) "
          "on its first calls, per size class, and every rank runs the one fastest on rank 0 "
          "from then on, switching to the next where rank 0 times it 1.5x dearer in use (a "
          "class's trial takes up to 135 calls and a first switch 81 more: give -w about 300); "
          "the choices are printed after the sweep (at most 1M; 0: the static table)");
ABSL_FLAG(std::string, ucx_small, "4K",
          "ucx backend: on one host, messages up to this size ride in the header round "
          "(one-shot; raised to 32K where up to 8 ranks outnumber the host's cores; 0: never)");
ABSL_FLAG(double, timeout_s, 0,
          "seconds one collective may wait for its peers before it fails naming them "
          "(0: $FUSEBOX_TIMEOUT_S, else 300)");

namespace fusebox::perf {
namespace {

// The value of the choice flag --`flag` named `value`; otherwise an error
// listing the names ("--flag must be a, b or c, got 'value'").
template <typename E>
absl::StatusOr<E> ParseChoice(const char* flag, const std::string& value,
                              std::initializer_list<std::pair<const char*, E>> choices) {
  std::string names;
  size_t i = 0;
  for (const auto& [name, e] : choices) {
    if (value == name) return e;
    absl::StrAppend(&names, i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ", name);
    ++i;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, " must be ", names, ", got '", value, "'"));
}

absl::StatusOr<comm::BackendOptions> BackendOptionsFromFlags() {
  comm::BackendOptions b;
  // The byte-valued settings, each from its flag.
  using Ucx = comm::UcxOptions;
  const std::pair<const absl::Flag<std::string>*, size_t Ucx::*> bytes_flags[] = {
      {&FLAGS_ucx_chunk, &Ucx::chunk_bytes},
      {&FLAGS_ucx_small, &Ucx::small_message_bytes},
      {&FLAGS_ucx_recursive_doubling, &Ucx::recursive_doubling_bytes},
      {&FLAGS_ucx_rabenseifner, &Ucx::rabenseifner_bytes},
      {&FLAGS_ucx_rabenseifner_from, &Ucx::rabenseifner_from_bytes},
      {&FLAGS_ucx_linear, &Ucx::linear_bytes},
      {&FLAGS_ucx_measured_choice, &Ucx::measured_choice_bytes},
      {&FLAGS_ucx_shm_chunk, &Ucx::shm_chunk_bytes},
      {&FLAGS_ucx_cma_min, &Ucx::cma_min_bytes},
      {&FLAGS_ucx_cma_max, &Ucx::cma_max_bytes},
  };
  for (const auto& [flag, field] : bytes_flags) {
    absl::StatusOr<size_t> value = ParseBytes(absl::GetFlag(*flag));
    if (!value.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", absl::GetFlagReflectionHandle(*flag).Name(), ": ", value.status().message()));
    }
    b.ucx.*field = *value;
  }
  using Opening = comm::UcxOptions::Opening;
  auto opening = ParseChoice<Opening>("ucx_opening", absl::GetFlag(FLAGS_ucx_opening),
                                      {{"auto", Opening::kAuto},
                                       {"rd", Opening::kRecursiveDoubling},
                                       {"linear", Opening::kLinear}});
  if (!opening.ok()) return opening.status();
  b.ucx.opening = *opening;
  using ShmStores = comm::UcxOptions::ShmStores;
  auto stores = ParseChoice<ShmStores>("ucx_shm_stores", absl::GetFlag(FLAGS_ucx_shm_stores),
                                       {{"auto", ShmStores::kAuto},
                                        {"cached", ShmStores::kCached},
                                        {"streamed", ShmStores::kStreamed}});
  if (!stores.ok()) return stores.status();
  b.ucx.shm_stores = *stores;
  using IssuerBegins = comm::UcxOptions::IssuerBegins;
  auto begins = ParseChoice<IssuerBegins>(
      "ucx_issuer_begins", absl::GetFlag(FLAGS_ucx_issuer_begins),
      {{"auto", IssuerBegins::kAuto}, {"on", IssuerBegins::kOn}, {"off", IssuerBegins::kOff}});
  if (!begins.ok()) return begins.status();
  b.ucx.issuer_begins = *begins;
  const double window_us = absl::GetFlag(FLAGS_ucx_waiter_window_us);
  if (!(window_us >= 0 && window_us <= 1e6)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ucx_waiter_window_us must be in [0, 1e6] microseconds, got ", window_us));
  }
  b.ucx.waiter_window = absl::Microseconds(window_us);
  const double spin_us = absl::GetFlag(FLAGS_ucx_spin_us);
  if (!(spin_us >= 0 && spin_us <= 1e6)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ucx_spin_us must be in [0, 1e6] microseconds, got ", spin_us));
  }
  b.ucx.progress_spin = absl::Microseconds(spin_us);
  absl::StatusOr<int> nice =
      NiceFromFlag("ucx_progress_nice", absl::GetFlag(FLAGS_ucx_progress_nice));
  if (!nice.ok()) return nice.status();
  b.ucx.progress_nice = *nice;
  absl::StatusOr<absl::Duration> slice =
      SliceFromFlag("ucx_progress_slice_us", absl::GetFlag(FLAGS_ucx_progress_slice_us));
  if (!slice.ok()) return slice.status();
  b.ucx.progress_slice = *slice;
  if (absl::Status s = comm::CollectiveTimeoutFromEnv(::getenv, &b); !s.ok()) return s;
  const double timeout_s = absl::GetFlag(FLAGS_timeout_s);
  if (!(timeout_s >= 0 && timeout_s <= 1e7)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout_s must be in [0, 1e7] seconds, got ", timeout_s));
  }
  if (timeout_s > 0) comm::SetCollectiveTimeout(absl::Seconds(timeout_s), &b);
  // A user's UCX_TLS is honoured (it turns the shared-memory path off unless
  // it names the default set); --ucx_tls wins over it.
  std::string tls = absl::GetFlag(FLAGS_ucx_tls);
  if (tls.empty() && std::getenv("UCX_TLS") != nullptr) tls = std::getenv("UCX_TLS");
  if (!tls.empty()) b.ucx.transports = tls;
  return b;
}

}  // namespace

absl::StatusOr<int> NiceFromFlag(const char* flag, int nice) {
  if (nice < -20 || nice > 19) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " must be a nice value in [-20, 19], got ", nice));
  }
  return nice;
}

absl::StatusOr<absl::Duration> SliceFromFlag(const char* flag, double us) {
  if (!(us >= 0 && us <= 1e5)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " must be in [0, 100000] microseconds, got ", us));
  }
  return absl::Microseconds(us);
}

int Fail(const comm::Logger& log, const absl::Status& s) {
  log.Error(s.message());
  return 1;
}

int WriteJson(const comm::Logger& log, const std::string& path, const nlohmann::json& j) {
  std::ofstream f(path);
  f << j.dump(1) << "\n";
  return f ? 0 : Fail(log, absl::UnavailableError("cannot write " + path));
}

int WithCommunicator(
    comm::Logger log, int argc, char** argv,
    const std::function<int(comm::Communicator&, comm::Launch&, const comm::Logger&)>& body) {
  auto backend_options = BackendOptionsFromFlags();
  if (!backend_options.ok()) {
    log.Error(backend_options.status().message());
    return 2;
  }
  auto launch = comm::ConnectFromEnvironment(::getenv, &argc, &argv);
  if (!launch.ok()) return Fail(log, launch.status());
  log.set_rank(launch->rdv.rank);
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (log.Enabled(comm::LogLevel::kDebug)) {
    const comm::UcxOptions& u = backend_options->ucx;
    log.Debug(absl::StrCat(
        "rank ", launch->rdv.rank, " of ", launch->rdv.size, " (",
        launch->mpi_initialized ? "MPI rendezvous" : "TCP rendezvous or single rank", "), backend ",
        backend, ", collective timeout ", absl::FormatDuration(u.timeout),
        backend == "ucx"
            ? absl::StrCat(", UCX transports ", u.transports, ", shared memory ",
                           u.use_shared_memory ? "on" : "off", ", chunk ", u.chunk_bytes,
                           " B, small messages <= ", u.small_message_bytes,
                           " B, recursive doubling <= ", u.recursive_doubling_bytes,
                           " B, Rabenseifner <= ", u.rabenseifner_bytes, " B from ",
                           u.rabenseifner_from_bytes, " B, opening ",
                           absl::GetFlag(FLAGS_ucx_opening), ", linear <= ", u.linear_bytes,
                           " B, measured choice <= ", u.measured_choice_bytes, " B, spin ",
                           absl::FormatDuration(u.progress_spin), ", progress thread nice ",
                           u.progress_nice, ", slice ", absl::FormatDuration(u.progress_slice),
                           ", issuer begins ", absl::GetFlag(FLAGS_ucx_issuer_begins))
            : ""));
  }
  int rc = 0;
  {
    auto communicator = comm::CreateCommunicator(backend, *backend_options, launch->rdv);
    if (!communicator.ok()) {
      rc = Fail(log, communicator.status());
    } else {
      for (const std::string& note : (*communicator)->SetupNotes()) log.Info(note);
      rc = body(**communicator, *launch, log);
    }
  }
  comm::ShutdownLaunch(*launch, /*after_failure=*/rc != 0);
  return rc;
}

}  // namespace fusebox::perf
