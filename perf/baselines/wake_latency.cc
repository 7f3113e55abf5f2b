// fusebox-wake-latency: the floor under a sleeping progress thread's
// reaction time. One thread blocks on a std::condition_variable, as the
// communicator's progress thread does when idle (comm/async_core.h, Note
// [Progress without sleeping]); another, on the same CPU (fusebox-run binds
// each rank to one), takes the lock, sets the flag, notifies, and then either
// blocks itself (as a backward replay sleeping to its next gradient does:
// --issuer blocks), yields in a loop until the woken thread has run (as
// fusebox-perf's launch-to-start loop polls its Work: --issuer yields), or
// keeps the CPU busy for 200 us (--issuer spins). The woken thread reads the
// clock as soon as its wait returns: the time from just before the notify to
// then is what no progress thread that sleeps can beat on this machine.
//
//   fusebox-wake-latency [--samples 2000] [--nice 0] [--issuer blocks|yields|spins]
//                        [--idle_us 100] [--through cv|core]
//
// --through core wakes fusebox's own progress thread instead: an AsyncCore
// (comm/async_core.h) whose executor does nothing, idle spin 0 as the UCX
// backend's, and a non-blocking barrier issued to it; the time is the
// Work's, from its creation to the progress thread taking it from the queue
// (what fusebox-perf's launch-to-start reports), so the core's own cost
// above the bare wake-up shows. Its issuer always yields.
//
// --nice sets the woken thread's nice value (the UCX progress thread runs at
// -10 where it may); a negative value needs CAP_SYS_NICE. Prints p50, p90,
// p99 and the maximum in microseconds.
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/async_core.h"

namespace {

using Clock = std::chrono::steady_clock;

void Usage(FILE* f) {
  std::fprintf(f,
               "usage: fusebox-wake-latency [options]\n"
               "  --samples N              wake-ups timed (default 2000)\n"
               "  --nice N                 the woken thread's nice value, -20..19 (default 0)\n"
               "  --issuer blocks|yields|spins\n"
               "                           after notifying, the issuer blocks, yields until the\n"
               "                           woken thread has run, or keeps the CPU for 200 us\n"
               "                           (default blocks)\n"
               "  --idle_us N              the issuer sleeps this long before each wake-up\n"
               "                           (default 100)\n"
               "  --through cv|core        a bare condition variable, or fusebox's AsyncCore\n"
               "                           with an executor that does nothing (issuer yields)\n"
               "                           (default cv)\n"
               "  -h, --help\n");
}

bool ParseInt(const char* s, long lo, long hi, long* out) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool PinToCpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

// Starts nothing: every call is done at once.
class NoOpExecutor final : public fusebox::comm::CollectiveExecutor {
 public:
  fusebox::comm::StartOutcome Start(fusebox::comm::CollectiveCall&) override { return {}; }
  absl::Status TimedOut(const fusebox::comm::CollectiveCall&) override {
    return absl::InternalError("a no-op call timed out");
  }
};

// --through core: the Work's issue-to-start over `samples` non-blocking
// calls, each issued `idle_us` after the last finished; empty if the core
// could not be used (printed).
std::vector<double> ThroughCore(long samples, long nice_value, long idle_us, bool* nice_ok) {
  fusebox::comm::AsyncCoreOptions o;
  o.backend = "no-op";
  o.idle_spin = absl::ZeroDuration();
  fusebox::comm::AsyncCore core(o);
  NoOpExecutor executor;
  core.Start(&executor, static_cast<int>(nice_value));
  *nice_ok = core.progress_priority().ok();
  std::vector<double> us;
  for (long i = 0; i < samples; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(idle_us));
    auto w = core.Issue({fusebox::comm::CollectiveKind::kBarrier, nullptr, nullptr, 0,
                        fusebox::comm::DataType::kUInt8, fusebox::comm::ReduceOp::kSum, 0});
    if (!w.ok()) {
      std::fprintf(stderr, "fusebox-wake-latency: %s\n", w.status().ToString().c_str());
      return {};
    }
    while (!(*w)->Test()) std::this_thread::yield();
    us.push_back(static_cast<double>((*w)->started_ns() - (*w)->issued_ns()) / 1e3);
  }
  core.Stop();
  return us;
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  return v[i];
}

struct Args {
  long samples = 2000;
  long nice_value = 0;
  long idle_us = 100;
  std::string issuer = "blocks";
  std::string through = "cv";
};

// The exit status when the command line says to stop (help, or an error
// printed); nullopt to run.
std::optional<int> ParseArgs(int argc, char** argv, Args* a) {
  bool issuer_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      Usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "fusebox-wake-latency: %s needs a value\n", flag.c_str());
      return 2;
    }
    const char* v = argv[++i];
    if (flag == "--samples") {
      if (!ParseInt(v, 1, 10'000'000, &a->samples)) {
        std::fprintf(stderr, "fusebox-wake-latency: --samples must be 1..10000000, got '%s'\n", v);
        return 2;
      }
    } else if (flag == "--nice") {
      if (!ParseInt(v, -20, 19, &a->nice_value)) {
        std::fprintf(stderr, "fusebox-wake-latency: --nice must be -20..19, got '%s'\n", v);
        return 2;
      }
    } else if (flag == "--issuer") {
      a->issuer = v;
      issuer_given = true;
      if (a->issuer != "blocks" && a->issuer != "yields" && a->issuer != "spins") {
        std::fprintf(stderr,
                     "fusebox-wake-latency: --issuer must be blocks, yields or spins, got '%s'\n",
                     v);
        return 2;
      }
    } else if (flag == "--idle_us") {
      if (!ParseInt(v, 10, 1'000'000, &a->idle_us)) {
        std::fprintf(stderr, "fusebox-wake-latency: --idle_us must be 10..1000000, got '%s'\n", v);
        return 2;
      }
    } else if (flag == "--through") {
      a->through = v;
      if (a->through != "cv" && a->through != "core") {
        std::fprintf(stderr, "fusebox-wake-latency: --through must be cv or core, got '%s'\n", v);
        return 2;
      }
    } else {
      std::fprintf(stderr, "fusebox-wake-latency: unknown option %s\n", flag.c_str());
      Usage(stderr);
      return 2;
    }
  }
  if (a->through == "core" && issuer_given && a->issuer != "yields") {
    std::fprintf(stderr,
                 "fusebox-wake-latency: --through core always yields; --issuer %s is not "
                 "available there\n",
                 a->issuer.c_str());
    return 2;
  }
  return std::nullopt;
}

// --through cv: a plain condition variable, the woken thread pinned to
// `cpu` beside the issuer; the wake-to-run times, in us.
std::vector<double> ThroughCv(const Args& a, int cpu, bool* nice_ok) {
  const long samples = a.samples, nice_value = a.nice_value, idle_us = a.idle_us;
  const std::string& issuer = a.issuer;
  std::mutex mu;
  std::condition_variable wake_cv, ack_cv;
  bool wake = false, acked = false, sleeping = false, stop = false;
  std::atomic<bool> ran{false};  // the yielding issuer's poll, outside the lock
  Clock::time_point issued;
  std::vector<double> us;
  us.reserve(static_cast<size_t>(samples));

  std::thread woken([&] {
    PinToCpu(cpu);
    if (nice_value != 0 &&
        setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), nice_value) != 0) {
      *nice_ok = false;
    }
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      sleeping = true;
      ack_cv.notify_one();
      wake_cv.wait(lock, [&] { return wake || stop; });
      const Clock::time_point now = Clock::now();
      sleeping = false;
      if (stop) return;
      us.push_back(std::chrono::duration<double, std::micro>(now - issued).count());
      ran.store(true, std::memory_order_release);
      wake = false;
      acked = true;
    }
  });

  for (long i = 0; i < samples; ++i) {
    {
      std::unique_lock<std::mutex> lock(mu);
      ack_cv.wait(lock, [&] { return sleeping; });
      acked = false;
      ran.store(false, std::memory_order_relaxed);
    }
    // Let the woken thread settle into its futex wait.
    std::this_thread::sleep_for(std::chrono::microseconds(idle_us));
    {
      std::lock_guard<std::mutex> lock(mu);
      wake = true;
      issued = Clock::now();
    }
    wake_cv.notify_one();
    if (issuer == "spins") {
      const Clock::time_point until = Clock::now() + std::chrono::microseconds(200);
      while (Clock::now() < until) {
      }
    } else if (issuer == "yields") {
      while (!ran.load(std::memory_order_acquire)) std::this_thread::yield();
    }
    std::unique_lock<std::mutex> lock(mu);
    ack_cv.wait(lock, [&] { return acked && sleeping; });
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
  }
  wake_cv.notify_one();
  woken.join();
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (std::optional<int> exit_now = ParseArgs(argc, argv, &args)) return *exit_now;
  const long nice_value = args.nice_value, idle_us = args.idle_us, samples = args.samples;
  const int cpu = sched_getcpu();
  if (cpu < 0 || !PinToCpu(cpu)) {
    std::fprintf(stderr, "fusebox-wake-latency: cannot bind to CPU %d\n", cpu);
    return 1;
  }
  const bool core = args.through == "core";
  bool nice_ok = true;
  const std::vector<double> us = core ? ThroughCore(samples, nice_value, idle_us, &nice_ok)
                                      : ThroughCv(args, cpu, &nice_ok);
  if (!nice_ok) {
    std::fprintf(stderr, "fusebox-wake-latency: could not set nice %ld (needs CAP_SYS_NICE)\n",
                 nice_value);
    return 1;
  }
  if (us.empty()) return 1;
  if (core) {
    std::printf(
        "# fusebox-wake-latency: cpu %d, through fusebox's AsyncCore, progress thread "
        "nice %ld, issuer yields, idle %ld us, %ld samples\n",
        cpu, nice_value, idle_us, samples);
  } else {
    std::printf(
        "# fusebox-wake-latency: cpu %d, woken thread nice %ld, issuer %s, idle %ld us, %ld "
        "samples\n",
        cpu, nice_value, args.issuer.c_str(), idle_us, samples);
  }
  std::printf("wake-to-run us: p50 %.2f p90 %.2f p99 %.2f max %.2f\n", Percentile(us, 0.5),
              Percentile(us, 0.9), Percentile(us, 0.99), Percentile(us, 1.0));
  return 0;
}
