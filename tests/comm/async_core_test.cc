// The shared asynchronous core (comm/async_core.h) on an executor made for
// the test: order, sticky failure, deadlines, stop, and who executes.
#include "comm/async_core.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusebox::comm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Records what the core hands it. Synchronous by default (Start runs the
// call to its end); with `async`, calls stay in flight until the test
// releases them (Finish), and Poll reports them.
class FakeExecutor : public CollectiveExecutor {
 public:
  explicit FakeExecutor(bool async = false) : async_(async) {}

  absl::Status CheckLimits(const CollectiveCall& call) const override {
    if (call.count > 1000) return absl::InvalidArgumentError("count over the fake's limit");
    return absl::OkStatus();
  }

  bool Begin(CollectiveCall& call) override {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(absl::StrCat("begin ", call.seq));
    begin_threads_.push_back(std::this_thread::get_id());
    return begin_result_;
  }

  StartOutcome Start(CollectiveCall& call) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back(absl::StrCat(call.begun ? "rest " : "start ", call.seq));
      started_.push_back(call.seq);
      start_threads_.push_back(std::this_thread::get_id());
      deadlines_.push_back(call.deadline);
    }
    StartOutcome o;
    if (gate_ != nullptr && call.seq == 0) {
      while (!gate_->load()) std::this_thread::yield();
    }
    if (block_until_abort_ && call.seq == 0) {
      while (!core_->aborted().load()) std::this_thread::yield();
      o.status = absl::CancelledError("aborted while running");
      o.fatal = true;
      return o;
    }
    if (call.seq == fail_seq_) {
      o.status = fail_status_;
      o.fatal = fail_fatal_;
      return o;
    }
    if (async_ && (!only_first_in_flight_ || call.seq == 0)) {
      o.in_flight = true;
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_.insert(call.seq);
    }
    return o;
  }

  absl::Status Poll(std::vector<FinishedCall>* finished) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!poll_error_.ok()) return poll_error_;
    for (auto it = released_.begin(); it != released_.end();) {
      if (in_flight_.erase(it->seq) == 1) {
        finished->push_back(*it);
        it = released_.erase(it);
      } else {
        ++it;
      }
    }
    return absl::OkStatus();
  }

  absl::Status TimedOut(const CollectiveCall& oldest) override {
    return absl::DeadlineExceededError(absl::StrCat("fake: #", oldest.seq, " is stuck"));
  }

  void AbandonInFlight() override {
    std::lock_guard<std::mutex> lock(mu_);
    abandoned_ += in_flight_.size();
    in_flight_.clear();
  }

  // Test side.
  void Finish(uint64_t seq, absl::Status s = absl::OkStatus()) {
    std::lock_guard<std::mutex> lock(mu_);
    released_.push_back(FinishedCall{seq, std::move(s)});
  }
  void FailPolls(absl::Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    poll_error_ = std::move(s);
  }
  // Released calls that Poll has not reported yet.
  size_t unreported() {
    std::lock_guard<std::mutex> lock(mu_);
    return released_.size();
  }
  std::vector<uint64_t> started() {
    std::lock_guard<std::mutex> lock(mu_);
    return started_;
  }
  std::vector<std::thread::id> start_threads() {
    std::lock_guard<std::mutex> lock(mu_);
    return start_threads_;
  }
  std::vector<absl::Time> deadlines() {
    std::lock_guard<std::mutex> lock(mu_);
    return deadlines_;
  }
  // "begin N" (Begin), "rest N" (Start of a begun call), "start N".
  std::vector<std::string> events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  std::vector<std::thread::id> begin_threads() {
    std::lock_guard<std::mutex> lock(mu_);
    return begin_threads_;
  }

  size_t abandoned() {
    std::lock_guard<std::mutex> lock(mu_);
    return abandoned_;
  }

  uint64_t fail_seq_ = UINT64_MAX;
  absl::Status fail_status_;
  bool fail_fatal_ = true;
  bool block_until_abort_ = false;
  bool only_first_in_flight_ = false;        // async: later calls run to their end in Start
  bool begin_result_ = true;                 // what Begin returns
  const std::atomic<bool>* gate_ = nullptr;  // call #0 waits in Start until it is set
  AsyncCore* core_ = nullptr;

 private:
  const bool async_;
  std::mutex mu_;
  std::vector<uint64_t> started_;
  std::vector<std::thread::id> start_threads_;
  std::vector<absl::Time> deadlines_;
  std::vector<std::string> events_;
  std::vector<std::thread::id> begin_threads_;
  std::set<uint64_t> in_flight_;
  std::vector<FinishedCall> released_;
  absl::Status poll_error_;
  size_t abandoned_ = 0;
};

AsyncCoreOptions Options(bool callers_execute = true,
                         AsyncCoreOptions::OnStop on_stop = AsyncCoreOptions::OnStop::kCancel,
                         absl::Duration timeout = absl::Seconds(60)) {
  AsyncCoreOptions o;
  o.backend = "TEST";
  o.rank = 1;
  o.size = 2;
  o.timeout = timeout;
  o.callers_execute = callers_execute;
  o.on_stop = on_stop;
  return o;
}

std::shared_ptr<Work> IssueAllReduce(AsyncCore& core, float* buf, size_t count = 4) {
  auto w = core.Issue({CollectiveKind::kAllReduce, buf, buf, count, DataType::kFloat32,
                      ReduceOp::kSum, 0});
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? *w : nullptr;
}

// The arguments are checked at the front door (front_door_test.cc); the
// core refuses what the executor's own limits do, and nothing it refuses
// reaches the executor.
TEST(AsyncCoreTest, CallsOverTheExecutorsLimitsAreRefusedAndNeverReachIt) {
  FakeExecutor ex;
  AsyncCore core(Options());
  core.Start(&ex);
  float buf[4] = {};
  auto over_limit =
      core.Issue({CollectiveKind::kAllReduce, buf, buf, 5000, DataType::kFloat32, ReduceOp::kSum});
  ASSERT_FALSE(over_limit.ok());
  EXPECT_THAT(over_limit.status().message(), HasSubstr("over the fake's limit"));
  EXPECT_THAT(core.Run({CollectiveKind::kAllReduce, buf, buf, 5000, DataType::kFloat32,
                       ReduceOp::kSum, 0})
                  .message(),
              HasSubstr("over the fake's limit"));
  ASSERT_TRUE(IssueAllReduce(core, buf)->Wait().ok());
  // Only the valid call reached the executor, and it was call #0.
  EXPECT_THAT(ex.started(), ElementsAre(0u));
}

// The nice value of thread `tid` of this process, read back from the kernel.
int NiceOf(pid_t tid) {
  errno = 0;
  return ::getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
}

TEST(AsyncCoreTest, TheProgressThreadTakesTheNiceValueItIsGivenAndOnlyIt) {
  // Raising one's nice value needs no privilege: the thread must take it,
  // and the caller's must not change (the value is per thread on Linux).
  const int caller = NiceOf(static_cast<pid_t>(::syscall(SYS_gettid)));
  const int higher = std::min(caller + 3, 19);
  FakeExecutor ex;
  AsyncCore core(Options());
  core.Start(&ex, higher);
  EXPECT_TRUE(core.progress_priority().ok()) << core.progress_priority();
  ASSERT_GT(core.progress_tid(), 0);
  EXPECT_NE(core.progress_tid(), static_cast<pid_t>(::syscall(SYS_gettid)));
  EXPECT_EQ(NiceOf(core.progress_tid()), higher);
  EXPECT_EQ(NiceOf(static_cast<pid_t>(::syscall(SYS_gettid))), caller);
  float buf[4] = {};
  ASSERT_TRUE(IssueAllReduce(core, buf)->Wait().ok());

  // 0 leaves the thread at the caller's value.
  FakeExecutor ex0;
  AsyncCore core0(Options());
  core0.Start(&ex0);
  EXPECT_TRUE(core0.progress_priority().ok());
  EXPECT_EQ(NiceOf(core0.progress_tid()), caller);
}

TEST(AsyncCoreTest, ANiceValueThatMayNotBeTakenLeavesTheCallersAndSaysWhy) {
  // Lowering it needs CAP_SYS_NICE or RLIMIT_NICE. Whether this process may
  // is found out on a thread of the test's own, then the core must agree.
  const int caller = NiceOf(static_cast<pid_t>(::syscall(SYS_gettid)));
  const int lower = std::max(caller - 5, -20);
  bool may = false;
  std::thread probe([&] {
    may = ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), lower) == 0;
  });
  probe.join();
  FakeExecutor ex;
  AsyncCore core(Options());
  core.Start(&ex, lower);
  if (may) {
    EXPECT_TRUE(core.progress_priority().ok()) << core.progress_priority();
    EXPECT_EQ(NiceOf(core.progress_tid()), lower);
  } else {
    EXPECT_EQ(core.progress_priority().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(core.progress_priority().message(),
                HasSubstr(absl::StrCat("could not take nice ", lower)));
    EXPECT_THAT(core.progress_priority().message(), HasSubstr("CAP_SYS_NICE"));
    EXPECT_EQ(NiceOf(core.progress_tid()), caller);
  }
  // Either way the core works.
  float buf[4] = {};
  ASSERT_TRUE(IssueAllReduce(core, buf)->Wait().ok());
}

TEST(AsyncCoreTest, CallsStartInIssueOrderWithSequenceNumbersAndADeadline) {
  FakeExecutor ex;
  AsyncCore core(Options());
  core.Start(&ex);
  float buf[4] = {};
  std::vector<std::shared_ptr<Work>> works;
  const absl::Time before = absl::Now();
  for (int i = 0; i < 50; ++i) works.push_back(IssueAllReduce(core, buf));
  for (auto& w : works) ASSERT_TRUE(w->Wait().ok());
  std::vector<uint64_t> want(50);
  for (uint64_t i = 0; i < 50; ++i) want[i] = i;
  EXPECT_EQ(ex.started(), want);
  for (const auto& w : works) {
    EXPECT_GE(w->started_ns(), w->issued_ns());
    EXPECT_GE(w->completed_ns(), w->started_ns());
  }
  // Each call's deadline is its start plus the timeout, read off a clock
  // that moves by scheduler ticks (Note [The deadline's clock]): up to two
  // ticks (1-10 ms each) late, early only where the tick stalls. 50 ms and
  // 100 ms are room to spare; a missing or doubled timeout is a minute out.
  ASSERT_EQ(ex.deadlines().size(), 50u);
  for (absl::Time d : ex.deadlines()) {
    EXPECT_GE(d, before + absl::Seconds(60) - absl::Milliseconds(50));
    EXPECT_LE(d, absl::Now() + absl::Seconds(60) + absl::Milliseconds(100));
  }
}

TEST(AsyncCoreTest, CallsInFlightCompleteInSequenceOrderWhateverOrderTheyFinishIn) {
  FakeExecutor ex(/*async=*/true);
  AsyncCore core(Options(/*callers_execute=*/false));
  core.Start(&ex);
  float buf[4] = {};
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 3; ++i) {
    works.push_back(IssueAllReduce(core, buf));
    works.back()->OnComplete([&, i](const absl::Status&) {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
    });
  }
  while (ex.started().size() < 3) std::this_thread::yield();
  ex.Finish(2);
  ex.Finish(1, absl::InvalidArgumentError("mismatch in #1"));
  // Once Poll has reported #2 and #1, they wait behind #0.
  while (ex.unreported() != 0) std::this_thread::yield();
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(works[1]->Test());
  EXPECT_FALSE(works[2]->Test());
  ex.Finish(0);
  for (auto& w : works) w->Wait().IgnoreError();
  EXPECT_TRUE(works[0]->status().ok());
  EXPECT_THAT(works[1]->status().message(), HasSubstr("mismatch in #1"));
  EXPECT_TRUE(works[2]->status().ok());
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_THAT(order, ElementsAre(0, 1, 2));
  // A call's own (non-fatal) error leaves the communicator usable.
  EXPECT_TRUE(core.Usable().ok());
}

TEST(AsyncCoreTest, AFatalErrorFailsLaterCallsAndRefusesNewOnes) {
  FakeExecutor ex;
  ex.fail_seq_ = 1;
  ex.fail_status_ = absl::UnavailableError("peer 0 is gone");
  AsyncCore core(Options());
  core.Start(&ex);
  float buf[4] = {};
  auto w0 = IssueAllReduce(core, buf);
  auto w1 = IssueAllReduce(core, buf);
  auto w2 = IssueAllReduce(core, buf);
  EXPECT_TRUE(w0->Wait().ok());
  absl::Status s1 = w1->Wait();
  EXPECT_EQ(s1.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s1.message(), "peer 0 is gone");
  absl::Status s2 = w2->Wait();
  EXPECT_EQ(s2.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s2.message(),
            "TEST communicator (rank 1) is unusable after an earlier error; recreate it. "
            "The error: peer 0 is gone");
  EXPECT_TRUE(core.failed());
  auto later = core.Issue({CollectiveKind::kBarrier, nullptr, nullptr, 0, DataType::kUInt8,
                          ReduceOp::kSum, 0});
  ASSERT_FALSE(later.ok());
  EXPECT_EQ(later.status(), s2);
  // #2 never reached the executor.
  EXPECT_THAT(ex.started(), ElementsAre(0u, 1u));
}

TEST(AsyncCoreTest, TheOldestCallInFlightTimesOutAndTheExecutorWordsIt) {
  FakeExecutor ex(/*async=*/true);
  AsyncCore core(Options(false, AsyncCoreOptions::OnStop::kDrain, absl::Milliseconds(300)));
  core.Start(&ex);
  float buf[4] = {};
  auto w0 = IssueAllReduce(core, buf);
  auto w1 = IssueAllReduce(core, buf);
  absl::Status s0 = w0->Wait();
  EXPECT_EQ(s0.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s0.message(), "fake: #0 is stuck");
  // #1 was in flight too: it fails with the same error.
  EXPECT_EQ(w1->Wait(), s0);
  EXPECT_EQ(ex.abandoned(), 2u);
  EXPECT_THAT(core.Usable().message(), HasSubstr("The error: fake: #0 is stuck"));
}

TEST(AsyncCoreTest, TheTimeoutCountsFromWhenACallBecameTheOldest) {
  // Each call is the oldest for 1 s of a 1.6 s timeout; together they are
  // in flight for 2 s. Timed from its issue, #1 would time out.
  FakeExecutor ex(/*async=*/true);
  AsyncCore core(Options(false, AsyncCoreOptions::OnStop::kDrain, absl::Milliseconds(1600)));
  core.Start(&ex);
  float buf[4] = {};
  auto w0 = IssueAllReduce(core, buf);
  auto w1 = IssueAllReduce(core, buf);
  absl::SleepFor(absl::Seconds(1));
  ex.Finish(0);
  ASSERT_TRUE(w0->Wait().ok());
  absl::SleepFor(absl::Seconds(1));
  ex.Finish(1);
  EXPECT_TRUE(w1->Wait().ok());
}

TEST(AsyncCoreTest, StopCancelsTheRunningAndTheQueuedCalls) {
  FakeExecutor ex;
  ex.block_until_abort_ = true;
  auto core = std::make_unique<AsyncCore>(Options(/*callers_execute=*/false));
  ex.core_ = core.get();
  core->Start(&ex);
  float buf[4] = {};
  auto w0 = IssueAllReduce(*core, buf);
  while (ex.started().empty()) std::this_thread::yield();
  auto w1 = IssueAllReduce(*core, buf);
  core->Stop();
  ASSERT_TRUE(w0->Test());
  ASSERT_TRUE(w1->Test());
  EXPECT_EQ(w0->status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(w1->status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(w1->status().message(), HasSubstr("destroyed before the collective ran"));
  EXPECT_THAT(ex.started(), ElementsAre(0u));
}

TEST(AsyncCoreTest, StopInDrainModeLetsEveryCallFinish) {
  FakeExecutor ex(/*async=*/true);
  AsyncCore core(Options(false, AsyncCoreOptions::OnStop::kDrain));
  core.Start(&ex);
  float buf[4] = {};
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 3; ++i) works.push_back(IssueAllReduce(core, buf));
  std::thread finisher([&] {
    absl::SleepFor(absl::Milliseconds(50));
    for (uint64_t i = 0; i < 3; ++i) ex.Finish(i);
  });
  core.Stop();  // returns only once all three have finished
  for (auto& w : works) {
    ASSERT_TRUE(w->Test());
    EXPECT_TRUE(w->status().ok());
  }
  finisher.join();
}

TEST(AsyncCoreTest, APollErrorFailsEveryCallInFlightAndTheCommunicator) {
  FakeExecutor ex(/*async=*/true);
  AsyncCore core(Options(false, AsyncCoreOptions::OnStop::kDrain));
  core.Start(&ex);
  float buf[4] = {};
  auto w0 = IssueAllReduce(core, buf);
  auto w1 = IssueAllReduce(core, buf);
  while (ex.started().size() < 2) std::this_thread::yield();
  ex.FailPolls(absl::InternalError("transport broke"));
  EXPECT_EQ(w0->Wait(), absl::InternalError("transport broke"));
  EXPECT_EQ(w1->Wait(), absl::InternalError("transport broke"));
  EXPECT_EQ(ex.abandoned(), 2u);
  EXPECT_THAT(core.Usable().message(), HasSubstr("The error: transport broke"));
}

TEST(AsyncCoreTest, ACallIssuedAfterStopIsCancelledNotLost) {
  FakeExecutor ex;
  AsyncCore core(Options());
  core.Start(&ex);
  core.Stop();
  float buf[4] = {};
  auto w = IssueAllReduce(core, buf);
  ASSERT_TRUE(w->Test());
  EXPECT_EQ(w->status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(ex.started().empty());
}

TEST(AsyncCoreTest, ACallerThatLeavesItsCallInFlightIsNotLeftWithoutAPoller) {
  // A caller that drives Step may leave a call in flight (an executor that
  // issues and polls) and then sleep in Wait: the progress thread must be
  // woken to poll it, or the call would never complete.
  FakeExecutor ex(/*async=*/true);
  AsyncCore core(Options(/*callers_execute=*/true, AsyncCoreOptions::OnStop::kDrain));
  core.Start(&ex);
  float buf[4] = {};
  for (int i = 0; i < 20; ++i) {
    std::atomic<bool> done{false};
    // Issues and waits at once, so that it usually runs Start itself.
    std::thread caller([&] {
      auto w = IssueAllReduce(core, buf);
      EXPECT_TRUE(w->Wait().ok());
      done.store(true);
    });
    while (ex.started().size() < static_cast<size_t>(i + 1)) std::this_thread::yield();
    absl::SleepFor(absl::Milliseconds(5));  // long enough for Wait to go to sleep
    ex.Finish(static_cast<uint64_t>(i));
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (!done.load() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
    if (!done.load()) {
      caller.detach();  // stuck for good: the process is failing anyway
      FAIL() << "call #" << i << " was never completed";
    }
    caller.join();
  }
}

TEST(AsyncCoreTest, OnlyACoreThatAllowsItLetsBlockedCallersExecute) {
  float buf[4] = {};
  for (bool callers_execute : {false, true}) {
    FakeExecutor ex;
    AsyncCore core(Options(callers_execute));
    core.Start(&ex);
    for (int i = 0; i < 200; ++i) ASSERT_TRUE(IssueAllReduce(core, buf)->Wait().ok());
    const std::vector<std::thread::id> threads = ex.start_threads();
    const auto on_caller = std::count(threads.begin(), threads.end(), std::this_thread::get_id());
    if (callers_execute) {
      // A caller that issues and waits runs its call itself (almost always:
      // the progress thread can take it first).
      EXPECT_GT(on_caller, 0) << "callers_execute";
    } else {
      EXPECT_EQ(on_caller, 0);
    }
  }
}

absl::Status RunAllReduce(AsyncCore& core, float* buf, size_t count = 4) {
  return core.Run({CollectiveKind::kAllReduce, buf, buf, count, DataType::kFloat32, ReduceOp::kSum,
                  0});
}

TEST(AsyncCoreTest, ABlockingCallRunsOnTheCallerWhenNothingIsAheadOfIt) {
  float buf[4] = {};
  for (bool callers_execute : {false, true}) {
    FakeExecutor ex;
    AsyncCore core(Options(callers_execute));
    core.Start(&ex);
    for (int i = 0; i < 200; ++i) ASSERT_TRUE(RunAllReduce(core, buf).ok());
    std::vector<uint64_t> want(200);
    for (uint64_t i = 0; i < 200; ++i) want[i] = i;
    EXPECT_EQ(ex.started(), want);
    const std::vector<std::thread::id> threads = ex.start_threads();
    const auto on_caller = std::count(threads.begin(), threads.end(), std::this_thread::get_id());
    // Every one, not almost every one: the progress thread never sees them.
    EXPECT_EQ(on_caller, callers_execute ? 200 : 0) << "callers_execute " << callers_execute;
  }
}

TEST(AsyncCoreTest, ABlockingCallQueuesBehindCallsInFlightAndCompletesInOrder) {
  for (bool only_first : {false, true}) {
    SCOPED_TRACE(only_first ? "the blocking call runs to its end in Start"
                            : "the blocking call stays in flight");
    FakeExecutor ex(/*async=*/true);
    ex.only_first_in_flight_ = only_first;
    AsyncCore core(Options(/*callers_execute=*/true, AsyncCoreOptions::OnStop::kDrain));
    core.Start(&ex);
    float buf[4] = {};
    auto w0 = IssueAllReduce(core, buf);
    while (ex.started().size() < 1) std::this_thread::yield();
    std::atomic<bool> returned{false};
    absl::Status s1;
    std::thread caller([&] {
      s1 = RunAllReduce(core, buf);
      returned.store(true);
    });
    while (ex.started().size() < 2) std::this_thread::yield();
    if (!only_first) {
      ex.Finish(1);
      while (ex.unreported() != 0) std::this_thread::yield();
    }
    absl::SleepFor(absl::Milliseconds(20));
    EXPECT_FALSE(returned.load())
        << "the blocking call finished before the call issued ahead of it";
    ex.Finish(0);
    caller.join();
    EXPECT_TRUE(s1.ok()) << s1;
    EXPECT_TRUE(w0->Test());
    EXPECT_THAT(ex.started(), ElementsAre(0u, 1u));
  }
}

TEST(AsyncCoreTest, ACallIssuedWhileABlockingCallRunsGetsTheNextSequenceNumber) {
  FakeExecutor ex;
  std::atomic<bool> gate{false};
  ex.gate_ = &gate;
  AsyncCore core(Options());
  core.Start(&ex);
  float buf[4] = {};
  std::thread::id runner;
  absl::Status s0;
  std::thread caller([&] {
    runner = std::this_thread::get_id();
    s0 = RunAllReduce(core, buf);
  });
  while (ex.started().size() < 1) std::this_thread::yield();
  auto w1 = IssueAllReduce(core, buf);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(ex.started().size(), 1u) << "a call started while a blocking call was running";
  gate.store(true);
  caller.join();
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(w1->Wait().ok());
  EXPECT_THAT(ex.started(), ElementsAre(0u, 1u));
  EXPECT_EQ(ex.start_threads()[0], runner);
}

TEST(AsyncCoreTest, ABlockingCallWaitsBehindACallQueuedWhileAnotherRan) {
  // #0 runs on a caller (gated); a second blocking call waits for the
  // executor lock; #1 is issued and queued behind them (the progress thread
  // then waits for the lock too, after the second caller). Once #0 ends,
  // the second caller gets the lock first and must not run ahead of #1.
  FakeExecutor ex;
  std::atomic<bool> gate{false};
  ex.gate_ = &gate;
  AsyncCore core(Options());
  core.Start(&ex);
  float buf[4] = {};
  absl::Status s0, s2;
  std::thread first([&] { s0 = RunAllReduce(core, buf); });
  while (ex.started().size() < 1) std::this_thread::yield();
  std::thread second([&] { s2 = RunAllReduce(core, buf); });
  absl::SleepFor(absl::Milliseconds(20));  // let it block on the executor lock
  auto w1 = IssueAllReduce(core, buf);
  absl::SleepFor(absl::Milliseconds(20));
  gate.store(true);
  first.join();
  second.join();
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(w1->Wait().ok());
  ASSERT_TRUE(s2.ok()) << s2;
  EXPECT_THAT(ex.started(), ElementsAre(0u, 1u, 2u));
}

TEST(AsyncCoreTest, ABlockingCallThatTheExecutorLeavesInFlightEndsWhenPollReportsIt) {
  FakeExecutor ex(/*async=*/true);
  AsyncCore core(Options(/*callers_execute=*/true, AsyncCoreOptions::OnStop::kDrain));
  core.Start(&ex);
  float buf[4] = {};
  std::atomic<bool> returned{false};
  absl::Status s0;
  std::thread::id runner;
  std::thread caller([&] {
    runner = std::this_thread::get_id();
    s0 = RunAllReduce(core, buf);
    returned.store(true);
  });
  while (ex.started().size() < 1) std::this_thread::yield();
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(returned.load()) << "returned while its call was still in flight";
  ex.Finish(0, absl::InvalidArgumentError("mismatch in #0"));
  caller.join();
  EXPECT_EQ(s0, absl::InvalidArgumentError("mismatch in #0"));
  // Nothing was ahead of it: it started on the caller, not the progress thread.
  EXPECT_EQ(ex.start_threads()[0], runner);
  // A call's own (non-fatal) error leaves the communicator usable.
  EXPECT_TRUE(core.Usable().ok());
}

TEST(AsyncCoreTest, ABlockingCallChecksTheExecutorsLimitsAndFailsTheCommunicatorOnAFatalError) {
  FakeExecutor ex;
  ex.fail_seq_ = 0;
  ex.fail_status_ = absl::UnavailableError("peer 0 is gone");
  AsyncCore core(Options());
  core.Start(&ex);
  float buf[4] = {};
  absl::Status bad = core.Run({CollectiveKind::kAllReduce, buf, buf, 5000, DataType::kFloat32,
                              ReduceOp::kSum, 0});
  EXPECT_THAT(bad.message(), HasSubstr("over the fake's limit"));
  EXPECT_EQ(RunAllReduce(core, buf), absl::UnavailableError("peer 0 is gone"));
  EXPECT_TRUE(core.failed());
  absl::Status later = RunAllReduce(core, buf);
  EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(later.message(), HasSubstr("The error: peer 0 is gone"));
  auto issued = core.Issue({CollectiveKind::kBarrier, nullptr, nullptr, 0, DataType::kUInt8,
                           ReduceOp::kSum, 0});
  EXPECT_EQ(issued.status(), later);
  EXPECT_THAT(ex.started(), ElementsAre(0u));
}

TEST(AsyncCoreTest, ABlockingCallAfterStopIsCancelled) {
  FakeExecutor ex;
  AsyncCore core(Options());
  core.Start(&ex);
  core.Stop();
  float buf[4] = {};
  EXPECT_EQ(RunAllReduce(core, buf).code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(ex.started().empty());
}

// Note [The issuer begins]: a call issued to an idle core is begun on the
// issuing thread, marked started as Begin began, and its rest runs in Start
// next (call.begun); without issuer_begins nothing is begun, and where Begin
// declines the call starts as before and the progress thread marks it.
// (After a pause the core is idle, but the progress thread may still hold
// the executor lock on a loaded machine: such a call is queued, not begun.
// So most calls, not all, must have been begun.)
TEST(AsyncCoreTest, ACallIssuedToAnIdleCoreIsBegunOnTheIssuingThread) {
  float buf[4] = {};
  constexpr int kCalls = 20;
  for (bool enabled : {false, true}) {
    for (bool accepts : {false, true}) {
      SCOPED_TRACE(absl::StrCat("issuer_begins ", enabled, ", Begin returns ", accepts));
      FakeExecutor ex;
      ex.begin_result_ = accepts;
      AsyncCore core(Options());
      core.Start(&ex, 0, absl::ZeroDuration(), enabled);
      std::vector<int64_t> issued(kCalls), returned(kCalls), started(kCalls);
      for (int i = 0; i < kCalls; ++i) {
        absl::SleepFor(absl::Milliseconds(1));  // the progress thread idle, asleep
        issued[i] = Work::SteadyNowNs();
        auto w = IssueAllReduce(core, buf);
        returned[i] = Work::SteadyNowNs();
        ASSERT_TRUE(w->Wait().ok());
        started[i] = w->started_ns();
      }
      // Per call: "begin i" then "rest i" (begun), "begin i" then "start i"
      // (declined), or "start i" alone (not tried).
      const std::vector<std::string> events = ex.events();
      size_t e = 0;
      int begun = 0, tried = 0;
      for (int i = 0; i < kCalls; ++i) {
        ASSERT_LT(e, events.size());
        if (events[e] == absl::StrCat("begin ", i)) {
          ++tried;
          ++e;
          ASSERT_LT(e, events.size());
          if (events[e] == absl::StrCat("rest ", i)) {
            ++begun;
            // Marked on this thread as Begin began, before Issue returned.
            EXPECT_GE(started[i], issued[i]);
            EXPECT_LE(started[i], returned[i]);
          } else {
            EXPECT_EQ(events[e], absl::StrCat("start ", i));
          }
        } else {
          EXPECT_EQ(events[e], absl::StrCat("start ", i));
        }
        ++e;
      }
      EXPECT_EQ(e, events.size());
      if (!enabled) {
        EXPECT_EQ(tried, 0);
      }
      if (enabled) {
        EXPECT_GE(tried, kCalls / 2);
      }
      EXPECT_EQ(begun, accepts ? tried : 0);
      for (std::thread::id t : ex.begin_threads()) EXPECT_EQ(t, std::this_thread::get_id());
    }
  }
}

// A call issued while another is queued or in flight is never begun: it
// could not start before them. It starts, in order, once they are done.
TEST(AsyncCoreTest, ACallIssuedBehindAnotherIsNotBegun) {
  FakeExecutor ex(/*async=*/true);
  ex.only_first_in_flight_ = true;
  AsyncCore core(Options(/*callers_execute=*/true, AsyncCoreOptions::OnStop::kDrain));
  core.Start(&ex, 0, absl::ZeroDuration(), /*issuer_begins=*/true);
  float buf[4] = {};
  auto w0 = IssueAllReduce(core, buf);
  while (ex.started().size() < 1) std::this_thread::yield();
  auto w1 = IssueAllReduce(core, buf);
  auto w2 = IssueAllReduce(core, buf);
  absl::SleepFor(absl::Milliseconds(20));
  ex.Finish(0);
  ASSERT_TRUE(w2->Wait().ok());
  ASSERT_TRUE(w0->Test() && w1->Test());
  EXPECT_THAT(ex.events(), ElementsAre("begin 0", "rest 0", "start 1", "start 2"));
}

// Calls issued from several threads at once keep one order: every begun
// call's rest is the next thing the executor starts after its Begin, and
// the sequence numbers start in order. A completion callback that issues
// (on the progress thread, or on a caller driving its Wait, both holding
// the executor lock) queues its call instead of beginning it, and does not
// deadlock.
TEST(AsyncCoreTest, BegunCallsKeepTheOrderAndCallbacksThatIssueDoNotBegin) {
  FakeExecutor ex;
  AsyncCore core(Options());
  core.Start(&ex, 0, absl::ZeroDuration(), /*issuer_begins=*/true);
  constexpr int kThreads = 3, kCalls = 300;
  std::mutex mu;
  std::vector<std::shared_ptr<Work>> from_callbacks;
  std::set<std::thread::id> issuers;
  std::vector<std::vector<std::shared_ptr<Work>>> works(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      {
        std::lock_guard<std::mutex> lock(mu);
        issuers.insert(std::this_thread::get_id());
      }
      float buf[4] = {};
      for (int i = 0; i < kCalls; ++i) {
        auto w = IssueAllReduce(core, buf);
        ASSERT_NE(w, nullptr);
        if (i % 10 == t) {
          w->OnComplete([&](const absl::Status&) {
            auto again = core.Issue(CollectiveArgs{});  // a Barrier
            std::lock_guard<std::mutex> lock(mu);
            if (again.ok()) from_callbacks.push_back(*again);
          });
        }
        if (i % 2 == 0) {
          ASSERT_TRUE(w->Wait().ok());
        }
        works[t].push_back(std::move(w));
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& mine : works) {
    for (auto& w : mine) ASSERT_TRUE(w->Wait().ok());
  }
  // Behind every call queued so far, and after every callback still
  // running on the progress thread (it holds the executor lock).
  float buf[4] = {};
  ASSERT_TRUE(RunAllReduce(core, buf).ok());
  std::vector<std::shared_ptr<Work>> extra;
  {
    std::lock_guard<std::mutex> lock(mu);
    extra = from_callbacks;
  }
  for (auto& w : extra) ASSERT_TRUE(w->Wait().ok());
  const std::vector<uint64_t> started = ex.started();
  for (size_t i = 0; i < started.size(); ++i) EXPECT_EQ(started[i], i);
  const std::vector<std::string> events = ex.events();
  int begun = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].rfind("begin ", 0) != 0) continue;
    ++begun;
    ASSERT_LT(i + 1, events.size());
    EXPECT_EQ(events[i + 1], "rest " + events[i].substr(6)) << "at event " << i;
  }
  EXPECT_GT(begun, 0);
  EXPECT_EQ(started.size(), kThreads * kCalls + extra.size() + 1);
  // Only the issuing threads began calls, never the progress thread in a
  // callback.
  for (std::thread::id id : ex.begin_threads()) EXPECT_EQ(issuers.count(id), 1u);
}


// Note [Waiters first].
AsyncCoreOptions WindowOptions(absl::Duration window) {
  AsyncCoreOptions o = Options();
  o.waiter_window = window;
  return o;
}

// Issues one call and waits for it at once, so that the next call issued
// soon after is left to its waiter.
void IssueAndWait(AsyncCore& core, float* buf) {
  std::shared_ptr<Work> w = IssueAllReduce(core, buf);
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->Wait().ok());
}

TEST(AsyncCoreTest, CallsWaitedAtOnceRunOnTheirWaiterWithoutWakingTheProgressThread) {
  float buf[4] = {};
  constexpr int kCalls = 40;
  for (bool window : {false, true}) {
    SCOPED_TRACE(absl::StrCat("window ", window));
    FakeExecutor ex;
    // A window far longer than the test: the progress thread cannot take a
    // call left to its waiter, so who runs each call is decided, not raced.
    AsyncCore core(WindowOptions(window ? absl::Seconds(30) : absl::ZeroDuration()));
    core.Start(&ex);
    for (int i = 0; i < kCalls; ++i) {
      std::shared_ptr<Work> w = IssueAllReduce(core, buf);
      // Time for a woken progress thread to take the call first.
      absl::SleepFor(absl::Milliseconds(2));
      ASSERT_TRUE(w->Wait().ok());
    }
    const std::vector<std::thread::id> threads = ex.start_threads();
    ASSERT_EQ(threads.size(), static_cast<size_t>(kCalls));
    const auto on_caller =
        std::count(threads.begin() + 1, threads.end(), std::this_thread::get_id());
    if (window) {
      // Every call after the first: the first had no earlier wait to go by.
      EXPECT_EQ(on_caller, kCalls - 1);
    } else {
      EXPECT_LT(on_caller, kCalls / 2);
    }
    std::vector<uint64_t> want(kCalls);
    for (int i = 0; i < kCalls; ++i) want[i] = static_cast<uint64_t>(i);
    EXPECT_EQ(ex.started(), want);
  }
}

// Calls over waiter_max_bytes wake the progress thread as ever, waited at
// once or not; the small ones between them are still left to their waiters.
TEST(AsyncCoreTest, OnlySmallCallsAreLeftToTheirWaiters) {
  float buf[4] = {};
  constexpr int kCalls = 40;
  FakeExecutor ex;
  AsyncCoreOptions o = WindowOptions(absl::Seconds(30));
  o.waiter_max_bytes = sizeof(float);  // one element
  AsyncCore core(o);
  core.Start(&ex);
  for (int i = 0; i < kCalls; ++i) {
    std::shared_ptr<Work> w = IssueAllReduce(core, buf, i % 2 == 0 ? 4 : 1);
    absl::SleepFor(absl::Milliseconds(2));
    ASSERT_TRUE(w->Wait().ok());
  }
  const std::vector<std::thread::id> threads = ex.start_threads();
  ASSERT_EQ(threads.size(), static_cast<size_t>(kCalls));
  int large_on_caller = 0, small_on_caller = 0;
  for (int i = 1; i < kCalls; ++i) {
    const bool on_caller = threads[i] == std::this_thread::get_id();
    (i % 2 == 0 ? large_on_caller : small_on_caller) += on_caller;
  }
  // A woken thread had 2 ms to take each large call first; with a window
  // of 30 s nobody but the waiter could take a small one.
  EXPECT_LT(large_on_caller, kCalls / 4);
  EXPECT_EQ(small_on_caller, kCalls / 2);
}

TEST(AsyncCoreTest, ACallLeftToAWaiterThatNobodyWaitsForRunsOnceTheWindowHasPassed) {
  float buf[4] = {};
  const absl::Duration window = absl::Milliseconds(50);
  FakeExecutor ex;
  AsyncCore core(WindowOptions(window));
  core.Start(&ex);
  IssueAndWait(core, buf);
  // Issued at once after a wait: left to a waiter, who never comes.
  std::shared_ptr<Work> w = IssueAllReduce(core, buf);
  const absl::Time issued = absl::Now();
  const absl::Time give_up = issued + absl::Seconds(20);
  while (!w->Test() && absl::Now() < give_up) absl::SleepFor(absl::Microseconds(100));
  ASSERT_TRUE(w->Test()) << "a call left to a waiter that never came was never run";
  EXPECT_TRUE(w->status().ok());
  // Not before the window (it was left), by the progress thread.
  EXPECT_GE(absl::Nanoseconds(w->started_ns() - w->issued_ns()), window * 0.9);
  EXPECT_NE(ex.start_threads().back(), std::this_thread::get_id());
}

// Started well before `window` has passed since its issue, or never.
bool StartsBeforeTheWindow(const std::shared_ptr<Work>& w, absl::Duration window) {
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!w->Test() && absl::Now() < give_up) absl::SleepFor(absl::Microseconds(50));
  return w->Test() && absl::Nanoseconds(w->started_ns() - w->issued_ns()) < window / 2;
}

TEST(AsyncCoreTest, ACallNotWaitedAtOnceWakesTheProgressThreadAtOnce) {
  float buf[4] = {};
  const absl::Duration window = absl::Milliseconds(100);
  FakeExecutor ex;
  AsyncCore core(WindowOptions(window));
  core.Start(&ex);
  // Issued a window after a wait at once: not left to a waiter.
  IssueAndWait(core, buf);
  absl::SleepFor(2 * window);
  EXPECT_TRUE(StartsBeforeTheWindow(IssueAllReduce(core, buf), window));
  // Issued at once behind a call that nobody waited for (as backward leaves
  // its buckets): not left either.
  IssueAndWait(core, buf);
  std::shared_ptr<Work> unwaited = IssueAllReduce(core, buf);  // left to a waiter...
  std::shared_ptr<Work> next = IssueAllReduce(core, buf);      // ...and this one is not
  EXPECT_TRUE(StartsBeforeTheWindow(next, window));
  EXPECT_TRUE(unwaited->Test());  // it ran ahead of `next`, in order
}

TEST(AsyncCoreTest, AnUnwaitedCallBehindOneLeftToAWaiterRunsBothAtOnceInOrder) {
  float buf[4] = {};
  FakeExecutor ex;
  AsyncCore core(WindowOptions(absl::Seconds(30)));
  core.Start(&ex);
  IssueAndWait(core, buf);
  // Left to its waiter (issued at once after a wait)...
  std::shared_ptr<Work> left = IssueAllReduce(core, buf);
  // ...and, from another thread that will not wait, a call the progress
  // thread must run now: it runs the one ahead of it first.
  std::shared_ptr<Work> other;
  std::thread([&] {
    absl::SleepFor(absl::Milliseconds(1));
    other = IssueAllReduce(core, buf);
  }).join();
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!other->Test() && absl::Now() < give_up) absl::SleepFor(absl::Microseconds(50));
  ASSERT_TRUE(other->Test());
  EXPECT_TRUE(left->Test());
  EXPECT_THAT(ex.started(), ElementsAre(0, 1, 2));
}

TEST(AsyncCoreTest, StopCancelsACallLeftToAWaiterWithoutWaitingForTheWindow) {
  float buf[4] = {};
  FakeExecutor ex;
  std::shared_ptr<Work> left;
  const absl::Time t0 = absl::Now();
  {
    AsyncCore core(WindowOptions(absl::Seconds(30)));
    core.Start(&ex);
    IssueAndWait(core, buf);
    left = IssueAllReduce(core, buf);
  }
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
  ASSERT_TRUE(left->Test());
  // Begun on this thread or not, it never ran: cancelled.
  EXPECT_EQ(left->status().code(), absl::StatusCode::kCancelled) << left->status();
}

}  // namespace
}  // namespace fusebox::comm
