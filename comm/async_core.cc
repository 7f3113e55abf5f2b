#include "comm/async_core.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/communicator.h"
#include "comm/thread_sched.h"

namespace fusebox::comm {
namespace {

// The status of a call cancelled unrun because its communicator is being
// destroyed.
absl::Status NeverRan() {
  return absl::CancelledError("communicator destroyed before the collective ran");
}

// The status of a call its issuer began (Note [The issuer begins]) that was
// cancelled before the rest ran: its first step may have reached peers.
absl::Status CancelledAfterItBegan() {
  return absl::CancelledError(
      "communicator destroyed after the collective began on the issuing thread, before the rest "
      "ran (peers may have received this rank's first step)");
}

// The coarse clock's resolution (a scheduler tick, e.g. 4 ms), or zero where
// the kernel has none: then the precise clock is read instead.
absl::Duration CoarseClockResolution() {
  timespec res{};
  if (clock_getres(CLOCK_REALTIME_COARSE, &res) != 0) return absl::ZeroDuration();
  return absl::DurationFromTimespec(res);
}

}  // namespace

AsyncCore::AsyncCore(AsyncCoreOptions options)
    : options_(std::move(options)),
      coarse_resolution_(CoarseClockResolution()),
      window_ns_(options_.callers_execute
                     ? std::max<int64_t>(0, absl::ToInt64Nanoseconds(options_.waiter_window))
                     : 0) {}

AsyncCore::~AsyncCore() { Stop(); }

AsyncCore::ExecLock::ExecLock(ExecState& e) : e_(e), lock_(e.mu) {
  e_.holder.store(std::this_thread::get_id(), std::memory_order_relaxed);
}

AsyncCore::ExecLock::ExecLock(ExecState& e, std::try_to_lock_t)
    : e_(e), lock_(e.mu, std::try_to_lock) {
  if (lock_.owns_lock()) e_.holder.store(std::this_thread::get_id(), std::memory_order_relaxed);
}

void AsyncCore::ExecLock::unlock() {
  if (!lock_.owns_lock()) return;
  e_.holder.store(std::thread::id(), std::memory_order_relaxed);
  lock_.unlock();
}

void AsyncCore::Start(CollectiveExecutor* executor, int nice, absl::Duration slice,
                      bool issuer_begins) {
  executor_ = executor;
  exec_->self = this;
  issuer_begins_ = issuer_begins && options_.callers_execute;
  std::promise<std::pair<pid_t, absl::Status>> started;
  std::future<std::pair<pid_t, absl::Status>> thread_is = started.get_future();
  thread_ = std::thread([this, nice, slice, &started] {
    // Named for profilers and `top -H` (at most 15 characters).
    pthread_setname_np(pthread_self(), "fb-progress");
    const pid_t tid = static_cast<pid_t>(::syscall(SYS_gettid));
    // Note [Sharing a core with the progress thread].
    absl::Status applied = SetThisThreadScheduling(nice, slice);
    if (!applied.ok()) {
      applied = absl::Status(applied.code(), absl::StrCat("the progress thread ", applied.message(),
                                                          "; it runs with what was applied"));
    }
    started.set_value({tid, std::move(applied)});  // `started` is not touched after this
    Loop();
  });
  std::tie(progress_tid_, progress_priority_) = thread_is.get();
}

void AsyncCore::Stop() {
  if (stopped_) return;
  stopped_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  // kCancel: the executor's waits read aborted() and end the call running
  // (as Cancelled); queued calls are cancelled unrun.
  if (options_.on_stop == AsyncCoreOptions::OnStop::kCancel) abort_.store(true);
  cv_.notify_all();
  if (thread_.joinable()) {
    // Destroying the communicator from its own progress thread (from a Work
    // callback) is a caller bug; join() would throw inside a destructor.
    if (thread_.get_id() == std::this_thread::get_id()) {
      std::fprintf(stderr, "fusebox: %s communicator destroyed from its own progress thread\n",
                   options_.backend.c_str());
      std::abort();
    }
    thread_.join();
  }
  // Drivers from here on find no core. Calls still queued (issued while
  // stopping, from a completion callback or another thread) are cancelled
  // unrun, until the queue stays empty; Issue cancels any call after that.
  ExecLock exec(*exec_);
  exec_->self = nullptr;
  abort_.store(true);
  for (;;) {
    std::deque<CollectiveCall> left;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty()) {
        closed_ = true;
        break;
      }
      left.swap(queue_);
      queued_.store(0, std::memory_order_release);
    }
    cancelled_any_.store(true, std::memory_order_relaxed);
    for (CollectiveCall& c : left) {
      c.work->Complete(NeverRan());
    }
  }
}

absl::Status AsyncCore::Usable() const {
  if (!failed_.load(std::memory_order_acquire)) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

absl::StatusOr<CollectiveCall> AsyncCore::Prepare(const CollectiveArgs& args) const {
  // The arguments were checked at the front door (Note [One front door] in
  // comm/communicator.h); the executor adds its own limits.
  if (absl::Status s = Usable(); !s.ok()) return s;
  CollectiveCall call;
  static_cast<CollectiveArgs&>(call) = args;
  if (executor_ != nullptr) {
    if (absl::Status s = executor_->CheckLimits(call); !s.ok()) return s;
  }
  return call;
}

std::shared_ptr<Work> AsyncCore::NewWork() const {
  auto work = std::make_shared<Work>();
  if (options_.callers_execute) {
    work->SetDriver([exec = exec_] {
      // Never a second time on the thread that holds the lock.
      if (exec->HeldHere()) return false;
      ExecLock lock(*exec, std::try_to_lock);
      return lock.owns_lock() && exec->self != nullptr && exec->self->Step(/*waiter=*/true);
    });
  }
  return work;
}

absl::StatusOr<std::shared_ptr<Work>> AsyncCore::Issue(const CollectiveArgs& args) {
  absl::StatusOr<CollectiveCall> call = Prepare(args);
  if (!call.ok()) return call.status();
  if (issuer_begins_) {
    if (std::shared_ptr<Work> w = TryBegin(*call)) return w;
  }
  return Enqueue(*std::move(call));
}

std::shared_ptr<Work> AsyncCore::TryBegin(CollectiveCall& call) {
  // Never a second time on a thread that holds the lock (a completion
  // callback run by Step): it would deadlock, and it would not be idle.
  if (exec_->HeldHere()) return nullptr;
  ExecLock exec(*exec_, std::try_to_lock);
  if (!exec.owns_lock() || exec_->self == nullptr || broken_ || !in_flight_.empty() ||
      abort_.load(std::memory_order_relaxed)) {
    return nullptr;
  }
  std::shared_ptr<Work> w = NewWork();
  std::shared_ptr<Work> retired;  // dropped last, after the first step
  CollectiveCall* mine = nullptr;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || stopping_ || !queue_.empty()) return nullptr;
    call.work = w;
    wake = PushLocked(std::move(call), &retired);
    // Only a holder of the executor lock pops the queue, and issuers only
    // push behind: the element stays where it is until this thread lets go.
    mine = &queue_.back();
  }
  // Stamped as the first step starts, kept only if there was one.
  const int64_t began = Work::SteadyNowNs();
  mine->begun = executor_->Begin(*mine);
  if (mine->begun) mine->work->MarkStartedAt(began);
  exec.unlock();
  if (wake) cv_.notify_one();
  return w;
}

std::shared_ptr<Work> AsyncCore::Enqueue(CollectiveCall call) {
  call.work = NewWork();
  std::shared_ptr<Work> w = call.work;
  std::shared_ptr<Work> retired;  // dropped last, outside the lock
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) {
      return Work::Done(NeverRan());
    }
    wake = PushLocked(std::move(call), &retired);
  }
  // Note [Progress without sleeping]: a spinning thread sees queued_ itself.
  if (wake) cv_.notify_one();
  return w;
}

bool AsyncCore::PushLocked(CollectiveCall call, std::shared_ptr<Work>* retired) {
  const int64_t issued = call.work->issued_ns();
  const bool left =
      call.count * DataTypeSize(call.type) <= options_.waiter_max_bytes && WaitsAtOnce(issued);
  // The previous call's Work may be held by nobody else: the caller drops
  // it, not this lock's holder (nor before a begun call's first step).
  if (window_ns_ > 0) *retired = std::exchange(last_work_, call.work);
  if (left) {
    call.waiter_until_ns = issued + window_ns_;
    ++left_to_waiters_;
  }
  call.seq = next_seq_++;
  queue_.push_back(std::move(call));
  queued_.store(queue_.size(), std::memory_order_release);
  // Note [Progress without sleeping]: a spinning thread sees queued_ itself.
  if (!sleeping_) return false;
  // Note [Waiters first]: a thread asleep with a deadline takes a call left
  // to its waiter when the window has passed; any other call wakes it.
  if (!timed_sleep_) return true;
  if (left) return false;
  urgent_ = true;
  return true;
}

bool AsyncCore::WaitsAtOnce(int64_t now) const {
  if (window_ns_ == 0 || last_work_ == nullptr) return false;
  const int64_t waited = last_work_->waited_ns();
  return waited != 0 && waited - last_work_->issued_ns() < window_ns_ &&
         now - waited < window_ns_;
}

bool AsyncCore::LeftToWaiters(int64_t now) const {
  if (stopping_ || urgent_) return false;
  for (const CollectiveCall& c : queue_) {
    if (c.waiter_until_ns <= now) return false;
  }
  return true;
}

void AsyncCore::Sleep(std::unique_lock<std::mutex>& lock) {
  const auto busy = [&] {
    return stopping_ || in_flight_count_.load(std::memory_order_acquire) != 0;
  };
  // A deadline: the first queued call's window, or, while calls are being
  // left to waiters (some since the last timed sleep began), one window.
  int64_t until = 0;
  if (!queue_.empty()) {
    until = queue_.front().waiter_until_ns;
  } else if (left_to_waiters_ != left_seen_) {
    until = Work::SteadyNowNs() + window_ns_;
  }
  sleeping_ = true;
  if (until != 0) {
    timed_sleep_ = true;
    left_seen_ = left_to_waiters_;
    const auto deadline = std::chrono::steady_clock::time_point(std::chrono::nanoseconds(until));
    cv_.wait_until(lock, deadline, [&] { return urgent_ || busy(); });
    timed_sleep_ = false;
  } else {
    cv_.wait(lock, [&] { return !queue_.empty() || busy(); });
  }
  urgent_ = false;
  sleeping_ = false;
}

absl::Status AsyncCore::Run(const CollectiveArgs& args) {
  absl::StatusOr<CollectiveCall> call = Prepare(args);
  if (!call.ok()) return call.status();
  if (options_.callers_execute) {
    ExecLock exec(*exec_);  // behind whoever executes now
    bool mine = false;
    if (exec_->self != nullptr && in_flight_.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      // Nothing queued ahead and nothing in flight: under the executor lock
      // no other call can start before this one, and later ones queue
      // behind it with later sequence numbers.
      if (queue_.empty() && !stopping_) {
        call->seq = next_seq_++;
        mine = true;
      }
    }
    if (mine) {
      if (broken_) return Usable();
      StartOutcome o = StartCall(*call);
      if (o.in_flight) {
        // An executor that left it in flight: wait for it like an issued
        // call, the core polling it.
        call->work = NewWork();
        std::shared_ptr<Work> w = call->work;
        PushInFlight(InFlight{*std::move(call), false, absl::Status()});
        exec.unlock();
        return w->Wait();
      }
      if (o.fatal && !o.status.ok()) Fail(o.status, nullptr);
      return o.status;
    }
  }
  return Enqueue(*std::move(call))->Wait();
}

void AsyncCore::Loop() {
  const int64_t spin_ns = absl::ToInt64Nanoseconds(options_.idle_spin);
  for (;;) {
    if (queued_.load(std::memory_order_acquire) == 0 &&
        in_flight_count_.load(std::memory_order_acquire) == 0) {
      const int64_t until = Work::SteadyNowNs() + spin_ns;
      while (queued_.load(std::memory_order_acquire) == 0 && Work::SteadyNowNs() < until) {
        std::this_thread::yield();
      }
    }
    // Nothing in flight, and nothing queued or (Note [Waiters first])
    // perhaps only calls left to their waiters: sleep, unless stopping.
    if (in_flight_count_.load(std::memory_order_acquire) == 0 &&
        (window_ns_ > 0 || queued_.load(std::memory_order_acquire) == 0)) {
      std::unique_lock<std::mutex> lock(mu_);
      const bool idle = in_flight_count_.load(std::memory_order_acquire) == 0;
      if (idle && !queue_.empty() && LeftToWaiters(Work::SteadyNowNs())) {
        Sleep(lock);
        continue;
      }
      if (queue_.empty() && idle) {
        if (stopping_) {
          // Drained, unless a driving caller holds a call between the
          // queue and in_flight_: decided under the executor lock.
          lock.unlock();
          ExecLock exec(*exec_);
          std::lock_guard<std::mutex> relock(mu_);
          if (queue_.empty() && in_flight_.empty()) return;
          continue;
        }
        // A caller's Step that leaves a call in flight wakes the thread to
        // poll it (WakeToPoll).
        Sleep(lock);
        continue;
      }
    }
    bool progressed = false;
    {
      ExecLock exec(*exec_);  // behind a driving caller, if any
      progressed = Step(/*waiter=*/false);
    }
    if (!progressed) std::this_thread::yield();
  }
}

bool AsyncCore::Step(bool waiter) {
  bool progressed = false;
  // 1. Start queued calls in sequence order: those queued when the step
  //    began that go in flight, and at most one that runs to its end inside
  //    Start, so that a caller driving its own call is not kept running
  //    later ones. (A caller that keeps issuing must not keep this loop from
  //    polling and from timing out what is already in flight.)
  for (size_t budget = queued_.load(std::memory_order_acquire); budget > 0; --budget) {
    CollectiveCall call;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty()) break;
      // Not a caller's to run, where every queued call is (a call behind
      // them that is not starts them all, in order).
      if (!waiter && queue_.front().waiter_until_ns != 0 && LeftToWaiters(Work::SteadyNowNs())) {
        break;
      }
      call = std::move(queue_.front());
      queue_.pop_front();
      queued_.store(queue_.size(), std::memory_order_release);
    }
    progressed = true;
    // A call its issuer began was marked then (Note [The issuer begins]).
    if (!call.begun) call.work->MarkStarted();
    if (abort_.load(std::memory_order_relaxed)) {
      cancelled_any_.store(true, std::memory_order_relaxed);
      // A begun call's first step went out (Note [The issuer begins]).
      call.work->Complete(call.begun ? CancelledAfterItBegan() : NeverRan());
      continue;
    }
    if (broken_) {
      call.work->Complete(Usable());
      continue;
    }
    StartOutcome o = StartCall(call);
    if (o.in_flight) {
      PushInFlight(InFlight{std::move(call), false, absl::Status()});
      continue;
    }
    if (o.fatal && !o.status.ok()) {
      Fail(o.status, &call);
      return true;
    }
    if (in_flight_.empty()) {
      call.work->Complete(std::move(o.status));  // nothing earlier is pending
    } else {
      PushInFlight(InFlight{std::move(call), true, std::move(o.status)});
    }
    break;
  }
  if (in_flight_.empty()) return progressed;

  // 2. Poll what is in flight.
  finished_.clear();
  if (absl::Status s = executor_->Poll(&finished_); !s.ok()) {
    Fail(s, nullptr);
    return true;
  }
  for (FinishedCall& f : finished_) {
    for (InFlight& e : in_flight_) {
      if (e.call.seq == f.seq && !e.finished) {
        e.finished = true;
        e.status = std::move(f.status);
        progressed = true;
        break;
      }
    }
  }

  // 3. The oldest unfinished call holds back every later one: if it has
  //    been the oldest for longer than the timeout, some rank is not joining
  //    it.
  if (!in_flight_.front().finished) {
    const absl::Time now = absl::Now();
    const CollectiveCall& oldest = in_flight_.front().call;
    if (oldest.seq != head_seq_) {
      head_seq_ = oldest.seq;
      head_since_ = now;
    } else if (now - head_since_ > options_.timeout) {
      Fail(executor_->TimedOut(oldest), nullptr);
      return true;
    }
  }

  // 4. Complete in sequence order.
  while (!in_flight_.empty() && in_flight_.front().finished) {
    InFlight e = std::move(in_flight_.front());
    in_flight_.pop_front();
    in_flight_count_.store(in_flight_.size(), std::memory_order_release);
    e.call.work->Complete(std::move(e.status));
    progressed = true;
  }
  return progressed;
}

StartOutcome AsyncCore::StartCall(CollectiveCall& call) {
  call.deadline = StartDeadline();
  return executor_->Start(call);
}

// Note [The deadline's clock]
// Every collective reads the clock once for its deadline, on the critical
// path of a blocking 8 B allreduce that takes 0.2-0.6 us. The precise system
// clock costs 26 ns a read on this project's 2-vCPU VM (kvm-clock; absl::Now()
// more than twice that); the coarse one 4 ns, at a scheduler tick's
// resolution. Interleaved on 2 ranks, the coarse read took a blocking 8 B
// allreduce from 1.12x to 1.06x OpenMPI's time
// (commit 19e8dfa). A deadline of seconds needs no
// better, so it is read coarse, and two ticks are added: the kernel advances
// the coarse clock by whole ticks at each tick and keeps the remainder, so
// it lags the precise one by up to two. A deadline thus comes up to two
// ticks late, and early only where the kernel's tick itself stalls (by the
// stall). The waits compare it with absl::Now(): the same clock
// (CLOCK_REALTIME), read precisely.
absl::Time AsyncCore::StartDeadline() const {
  if (coarse_resolution_ > absl::ZeroDuration()) {
    timespec now{};
    if (clock_gettime(CLOCK_REALTIME_COARSE, &now) == 0) {
      return absl::TimeFromTimespec(now) + 2 * coarse_resolution_ + options_.timeout;
    }
  }
  return absl::FromChrono(std::chrono::system_clock::now()) + options_.timeout;
}

void AsyncCore::PushInFlight(InFlight e) {
  in_flight_.push_back(std::move(e));
  in_flight_count_.store(in_flight_.size(), std::memory_order_release);
  if (in_flight_.size() == 1) WakeToPoll();
}

void AsyncCore::WakeToPoll() {
  // A call left in flight by a caller driving Step must still be polled
  // once that caller stops (its Wait sleeps after a while): the progress
  // thread, if asleep, is woken. The predicate reads in_flight_count_,
  // stored before this takes mu_, so the wake-up cannot be lost.
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake = sleeping_;
  }
  if (wake) cv_.notify_one();
}

void AsyncCore::Fail(const absl::Status& s, CollectiveCall* current) {
  broken_ = true;
  const absl::Status unusable = absl::FailedPreconditionError(
      absl::StrCat(options_.backend, " communicator (rank ", options_.rank,
                   ") is unusable after an earlier error; recreate it. The error: ", s.message()));
  std::deque<CollectiveCall> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.ok()) {
      failure_ = unusable;
      failed_.store(true, std::memory_order_release);
    }
    queued.swap(queue_);
    queued_.store(0, std::memory_order_release);
  }
  executor_->AbandonInFlight();
  std::deque<InFlight> flight;
  flight.swap(in_flight_);
  in_flight_count_.store(0, std::memory_order_release);
  // In sequence order: the calls that were running report the error
  // itself; those that had finished, and those never started, that the
  // communicator is unusable.
  for (InFlight& e : flight) e.call.work->Complete(e.finished ? unusable : s);
  if (current != nullptr) current->work->Complete(s);
  // Stopping (kCancel) is why the call failed: the rest are cancelled.
  const bool cancelling = abort_.load(std::memory_order_relaxed);
  if (cancelling && !queued.empty()) cancelled_any_.store(true, std::memory_order_relaxed);
  const absl::Status never_ran = cancelling ? NeverRan() : unusable;
  for (CollectiveCall& c : queued) c.work->Complete(never_ran);
}

}  // namespace fusebox::comm
