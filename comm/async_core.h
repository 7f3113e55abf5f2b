// AsyncCore: what every host backend needs between a call and its transport.
//
// Note [Asynchronous core]
// A host backend (UCX, MPI) owns an AsyncCore and implements
// CollectiveExecutor, the execution of one collective; the core owns the
// rest, so that it is written, tested and fixed once:
// * Issue (any thread): the checks of comm/communicator.h's contract, in the
//   same words on every backend, then the backend's own limits
//   (CheckLimits); the sequence number; the queue. Returns the Work at once.
// * Who executes (Note [Who executes a collective]): calls enter the
//   executor one at a time, under the core's executor lock, in sequence
//   order, on the core's progress thread or, when the backend allows it, on
//   a caller blocked in Work::Wait().
// * Start and poll: Start(call) either runs the call to its end (UCX: one
//   collective at a time, its waits inside Start) or issues it and leaves it
//   in flight (MPI: several at once); Poll advances what is in flight. Works
//   complete in sequence order, on the executing thread, whatever order the
//   transport finishes them in.
// * Deadlines: every call is given call.deadline = start + timeout (up to two
//   scheduler ticks later; Note [The deadline's clock]) for the
//   waits an executor makes inside Start. A call left in flight is timed
//   from when it became the oldest unfinished one (a long queue must not
//   time out its tail); past the timeout the executor words the error
//   (TimedOut: what was stuck, and the post-mortem of comm/fault.h).
// * Sticky failure: an outcome marked fatal (every error on UCX; transport
//   errors and timeouts on MPI, not a descriptor mismatch) makes the
//   communicator unusable. The call that failed and every call still
//   unfinished in flight fail with the error itself; those already finished
//   but not yet completed, and every queued one, with "<backend>
//   communicator (rank r) is unusable after an earlier error; recreate it.
//   The error: ..."; later calls are refused synchronously with that status.
// * Stop (the backend's destructor, first): kCancel raises aborted() (which
//   the executor's waits read, ending the call running) and cancels queued
//   calls unrun; kDrain lets every queued and in-flight call finish first
//   (MPI, whose buffers are in use until the library is done with them).
//   Then the thread is joined; callers still waiting on a Work find no
//   core, and calls issued after that complete at once as Cancelled.
//
// Note [Progress without sleeping]
// A collective nobody waits for (a gradient bucket launched from backward)
// is executed by the progress thread, so the time from its issue to its
// first byte moving is that thread's reaction time. The loop therefore never
// naps on a timer: while anything is in flight it polls (yielding the core
// when a pass did nothing); once idle it keeps looking for new calls for
// `idle_spin` (yielding on each look, so compute and peers sharing the core
// are not starved), then blocks on a condition variable that Issue signals
// whenever the thread is blocked, so a call issued to an idle communicator
// waits one futex wake-up, and one issued within the spin window none
// (where the backend lets the issuer begin the call, its first step waits
// for none: Note [The issuer begins]).
// Why a condition variable and not the UCP worker's event fd (block on the
// fd, Issue waking it): UCX runs each collective to its end inside Start
// (its waits poll the worker and, where ranks outnumber cores, sleep on
// that fd: ucx::Channel::Sleep), so while the thread is idle no request of
// its communicator is outstanding and the fd has nothing to report that a
// collective needs before the next Issue; an eventfd write would be the
// same one kernel wake-up as the futex; and on one host the worker has no
// such fd (shared-memory transports have no wake-up events; the worker asks
// for them only where every transport is TCP). Watching the fd while idle
// would only take in peers' early messages on a core that backward is
// using. (Reasoned, not measured.)
// Sharing cores with compute (the design decision): the thread is bound as
// its process is, busy-waits only while a collective is in flight (or within
// the spin window, 0 for UCX), and where its machine is not oversubscribed
// runs at a higher priority than compute (Note [Sharing a core with the
// progress thread]).
// A caller that blocks on its collective executes it itself where the
// backend allows (polling in the caller, as MPI's blocking calls do), which
// keeps small blocking collectives fast when every core is busy: no thread
// has to be scheduled for them.
//
// Note [Sharing a core with the progress thread]
// fusebox-run binds each rank to one CPU, so the progress thread shares it
// with the caller's threads and the engine's worker. Linux's scheduler
// (EEVDF since 6.6) runs, among the threads that have not had more than
// their share, the one with the earliest deadline; a thread that sleeps
// keeps what it is owed and gets a fresh deadline when it wakes, while each
// sched_yield pushes the yielding thread's deadline back. The progress
// thread polls while a collective is in flight and, spinning with yields,
// after it; the core's other threads sleep and wake every few microseconds
// (backward marking gradients ready, the worker). Traced with perf sched on
// 2 local ranks, per-tensor buckets of ResNet-50: when a bucket was
// launched, the progress thread was runnable (spinning or preempted) with a
// late deadline, and every wake-up of the others went first for 50-130 us;
// that set the launch-to-start p99 (about 60 us).
// So the UCX progress thread blocks as soon as it runs out of work (idle
// spin 0), and a launch wakes it with a fresh deadline, and it runs at nice
// -10 (UcxOptions::progress_nice), so that it takes the core when it wakes.
// Either alone leaves the p99 at 47-64 us (medians of rounds); together
// 6-18 us, with the same iteration times in that replay
// (commit 450785a). A spin of even 5 us, or two yields, before
// blocking undoes it: the launch then finds the thread runnable rather than
// asleep. Where many buckets queue (communication-bound, 1-5 MiB buckets),
// the thread goes from one queued collective to the next and the engine's
// worker, at nice 0, waits for the core to see them finish: the gap
// report's launch-to-start term grew to 5-29 ms there; iterations were
// 12-13% shorter on ResNet-50 and 9% longer on ViT-B/16 at t(all) = 2 T_b
// (commit 37bf07f). The worker at nice -10 too undid the p99.
// Since then a completed collective frees its window slot and launches the
// next bucket on the completing thread itself (Note [Freeing a slot where
// the collective completes] in bucketing/engine.h): that term fell from
// 4-15 to 0-3 ms there, iteration times within the noise
// (commit bbc8a60).
// The costs: (1) a run of small non-blocking calls issued back to back from
// a thread on the same core pays a futex wake-up and two switches per call
// (8 B to 4 KiB on 2 ranks: 5-8 us a call where spinning took 0.5-3 us;
// blocking calls run on the caller and are unaffected);
// UcxOptions::progress_spin and progress_nice = 0 restore the spinning
// thread. (2) While a collective is in flight the thread may take, by the
// scheduler's weights for nice -10 and 0, about nine tenths of a core it
// shares with a busy compute thread, where it took half (not measured: the
// replay sleeps); it sleeps whenever nothing is in flight. Where this machine's ranks outnumber its
// cores, a rank's peers may need the same core while it polls for them, so the nice value is left
// alone there. A negative nice value needs CAP_SYS_NICE or RLIMIT_NICE;
// without them the thread runs at the caller's (Communicator::SetupNotes).
//
// Note [Blocking calls]
// Run is Issue and Wait in one, for callers that block anyway (a blocking
// allreduce, a barrier, the engine's votes). Where callers execute, a call
// that finds nothing queued ahead of it and nothing in flight runs at once
// on the calling thread under the executor lock: no Work, no queue, no
// clock reads beyond its deadline, and no wake-up of the progress thread,
// which would otherwise compete for the caller's core while it spins idle
// (on 2 ranks bound to a core each, the spinning thread took about 15% of
// the samples of a blocking 8 B loop in context switches). Calls issued
// meanwhile from other threads queue behind it with later sequence numbers,
// so the order of Note [Asynchronous core] holds. Otherwise (something
// queued or in flight, callers that do not execute, a stopping core) Run
// issues the call and waits on its Work.
//
// Note [Who executes a collective]
// With callers_execute, a Work's driver (Work::SetDriver) tries the
// executor lock and, when it gets it, runs one step of the core (start the
// next queued call, or poll what is in flight) on the waiting caller's
// thread instead of waiting for a hand-off: a caller that issues and waits
// runs its own collective when the progress thread has not already taken
// it, while one that does not wait has it run by the progress thread. The
// progress thread takes the executor lock behind a driving caller and picks
// up whatever is left the moment the caller lets go. Drivers share the lock
// through a shared_ptr, so one that outlives the core finds it gone
// (self == nullptr) instead of a dangling pointer.
//
// Note [The issuer begins]
// A collective issued to an idle core waits for the progress thread to wake
// before anything of it moves: 5-9 us on this project's 2-vCPU VM even
// where the issuer gives up its core at once (commit 48a7039,
// commit bcc911e). Where the backend can run a call's first step
// without waiting for anyone (CollectiveExecutor::Begin; Start(...,
// issuer_begins)), Issue runs it on the issuing thread instead, when it can
// do so at once: it tries the executor lock (never waits for it), and with
// nothing queued or in flight it queues the call with the next sequence
// number, lets the executor begin it (call.begun; the Work is marked
// started when the first step began), then lets go of the lock and wakes the
// progress thread, which runs the rest in Start. What launch-to-start then
// measures for such a call is the issue up to its first step, not the
// wake-up that the rest still waits for; its time to completion is the
// end-to-end figure (fusebox-perf allreduce --launch reports both). A begun
// call cancelled by Stop before its rest ran says so: its first step may
// have reached peers. Order holds: the call took its sequence number and its place in
// the queue under mu_, and no call can start before it while the issuer
// holds the executor lock. A thread that already holds the executor lock (a
// completion callback that issues, run by Step on the progress thread or on
// a driving caller: ExecState::holder) queues its call as before; so does
// every issue that finds the lock taken or the core busy. What it costs:
// the issuing thread does the first step's work itself (UCX: up to one
// round of the shared-memory allreduce's staging), which a progress thread
// with a core of its own would have done beside it; so the UCX backend
// begins on the issuer only where its machine's ranks and their progress
// threads outnumber the cores (UcxOptions::issuer_begins).
//
// Note [Waiters first]
// A caller that issues a non-blocking call and waits for it at once (a
// user's AllReduce(...)->Wait(), a loop of them) would pay for the
// progress thread twice: the issue wakes it (a futex wake-up and, on a
// core it shares with the caller, a switch to it), and its end wakes the
// caller (a switch back): 2.5-3 us on this project's 2-vCPU VM, where the
// blocking call takes 0.4 us at 8 B. The core cannot know at issue whether
// anybody will wait, but it can tell a caller that does from the last call:
// where that call's Wait began within `waiter_window` of its issue and this
// call comes within `waiter_window` of that Wait, the call is left to its
// waiter. It is queued in order as ever but the progress thread is not
// woken; Wait's driver (Note [Who executes a collective]) runs it on the
// caller's thread, as the blocking call would. So that a call nobody waits
// for still runs, the thread sleeps with a deadline while such calls come:
// it takes a call left to its waiter once the window has passed (the call
// then waited `waiter_window` longer than a woken thread would have), and
// an issue that is not left to a waiter cuts the sleep short. Once a whole
// window passes with no call left to a waiter, the thread sleeps until
// woken again, as before.
// Only small calls are left to their waiters (waiter_max_bytes, 64 KiB by
// default): there the wake-ups are most of the call's time. At 256 KiB, 2
// local ranks, a call its waiter ran took 1.4x the blocking call and one the
// woken progress thread ran 1.2x (docs/results/allreduce-nonblocking.md).
// Overlap is untouched: a gradient bucket is waited for at the end of
// backward, milliseconds after its issue, so every launch from backward
// wakes the thread at once (Note [Sharing a core with the progress
// thread]); at most the first bucket after a wait-at-once call can wait a
// window, and only where it is issued within a window of that wait.
// The costs: a clock read per Wait; while callers wait at once, one timed
// wake-up of the progress thread per window (about 3 us per 200 us).

#ifndef FUSEBOX_COMM_ASYNC_CORE_H_
#define FUSEBOX_COMM_ASYNC_CORE_H_

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/types.h"
#include "comm/work.h"

namespace fusebox::comm {

// One collective as issued.
struct CollectiveCall : CollectiveArgs {
  uint64_t seq = 0;  // 0, 1, 2, ... per communicator: the same call on every rank
  // Set when the call starts: start + timeout, for waits inside Start.
  absl::Time deadline = absl::InfiniteFuture();
  std::shared_ptr<Work> work;
  // The executor's Begin ran the call's first step on the issuing thread
  // (Note [The issuer begins]); Start runs the rest.
  bool begun = false;
  // Note [Waiters first]: until then (Work::SteadyNowNs), the call is left
  // to whoever waits for it; 0: the progress thread runs it at once.
  int64_t waiter_until_ns = 0;
};

// What Start made of a call.
struct StartOutcome {
  // True: the call is in flight and Poll reports its end. False: it ran to
  // its end in Start and `status` is its result.
  bool in_flight = false;
  absl::Status status;
  // The error makes the communicator unusable (Note [Asynchronous core]).
  bool fatal = false;
};

// A call in flight that Poll found finished.
struct FinishedCall {
  uint64_t seq = 0;
  absl::Status status;  // its own result; not fatal (Poll returns those)
};

// The backend's half (Note [Asynchronous core]). Start, Poll, TimedOut and
// AbandonInFlight run on the executing thread under the executor lock;
// CheckLimits on the issuing thread.
class CollectiveExecutor {
 public:
  virtual ~CollectiveExecutor() = default;
  // The backend's own limits beyond the shared checks (MPI's int counts):
  // InvalidArgument naming the call, or OK.
  virtual absl::Status CheckLimits(const CollectiveCall& /*call*/) const {
    return absl::OkStatus();
  }
  // Note [The issuer begins]: the first step of `call` on the issuing
  // thread, under the executor lock, with nothing queued ahead of it or in
  // flight; it must not wait for peers. True: it began, and Start (called
  // next, with call.begun set) runs the rest. False: nothing was done.
  virtual bool Begin(CollectiveCall& /*call*/) { return false; }
  // Begins `call` (calls arrive in sequence order), or runs the rest of a
  // call that Begin began. call.work is null for a blocking call run on its
  // caller (Note [Blocking calls]).
  virtual StartOutcome Start(CollectiveCall& call) = 0;
  // Advances the calls in flight and appends those that finished. A non-OK
  // return is a fatal error of the communicator.
  virtual absl::Status Poll(std::vector<FinishedCall>* /*finished*/) { return absl::OkStatus(); }
  // The error for `oldest`, still in flight after the timeout: what it was
  // waiting for and who is gone. Fatal.
  virtual absl::Status TimedOut(const CollectiveCall& oldest) = 0;
  // After a fatal error: forget every call in flight (the core completes
  // their Works; MPI must keep what the library may still write).
  virtual void AbandonInFlight() {}
};

struct AsyncCoreOptions {
  std::string backend;  // "UCX", "MPI": names the communicator in errors
  int rank = 0;
  int size = 1;
  absl::Duration timeout = absl::Seconds(300);  // must be positive
  absl::Duration idle_spin = absl::Microseconds(50);
  bool callers_execute = false;  // Note [Who executes a collective]
  // Note [Waiters first]; zero: never. Applies where callers execute, to
  // calls of at most waiter_max_bytes (count x element size).
  absl::Duration waiter_window = absl::Microseconds(200);
  size_t waiter_max_bytes = size_t{64} << 10;
  enum class OnStop { kCancel, kDrain };
  OnStop on_stop = OnStop::kCancel;
};

class AsyncCore {
 public:
  explicit AsyncCore(AsyncCoreOptions options);
  ~AsyncCore();  // Stop()
  AsyncCore(const AsyncCore&) = delete;
  AsyncCore& operator=(const AsyncCore&) = delete;

  // Starts the progress thread on `executor`, which must outlive Stop().
  // A `nice` other than 0 is set as the thread's nice value and a positive
  // `slice` as its requested slice (comm/thread_sched.h; Note [Sharing a
  // core with the progress thread]); where the process may not (a negative
  // value needs CAP_SYS_NICE or RLIMIT_NICE) the thread keeps the caller's,
  // and progress_priority() says why. With `issuer_begins` (and
  // callers_execute) Issue lets the executor begin calls to an idle core on
  // the issuing thread (Note [The issuer begins]). Returns once the thread
  // runs.
  void Start(CollectiveExecutor* executor, int nice = 0,
             absl::Duration slice = absl::ZeroDuration(), bool issuer_begins = false);
  // After Start: OK, or why the requested nice value was not applied.
  const absl::Status& progress_priority() const { return progress_priority_; }
  // After Start: the progress thread's id (for tests and diagnostics).
  pid_t progress_tid() const { return progress_tid_; }
  // Note [Asynchronous core]. Idempotent. Must not be called from a Work's
  // completion callback: on the progress thread it aborts the process (the
  // thread cannot join itself); on a caller driving its Wait it deadlocks
  // (that caller holds the executor lock). Calls issued once Stop has
  // finished complete at once as Cancelled.
  void Stop();

  // Issue (any thread). The arguments are the front door's, already checked
  // (Note [One front door] in comm/communicator.h); the core adds the
  // executor's limits (CheckLimits) and refuses calls once the communicator
  // has failed.
  absl::StatusOr<std::shared_ptr<Work>> Issue(const CollectiveArgs& args);
  // The blocking form (Note [Blocking calls]): returns once the collective
  // has finished, with its status (refusals as Issue reports them).
  absl::Status Run(const CollectiveArgs& args);

  // OK, or the status later calls are refused with.
  absl::Status Usable() const;
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // Raised by Stop in kCancel mode: the executor's waits end at once.
  const std::atomic<bool>& aborted() const { return abort_; }
  // Whether any call was cancelled unrun (after Stop: read it then).
  bool cancelled_any() const { return cancelled_any_.load(std::memory_order_relaxed); }

 private:
  struct InFlight {
    CollectiveCall call;
    bool finished = false;
    absl::Status status;
  };
  struct ExecState {
    std::mutex mu;
    AsyncCore* self = nullptr;  // null once the core has stopped
    // The thread holding mu (none: std::thread::id()), so that a thread
    // that holds it never tries it again (Note [The issuer begins]).
    std::atomic<std::thread::id> holder{};
    bool HeldHere() const {
      return holder.load(std::memory_order_relaxed) == std::this_thread::get_id();
    }
  };
  // Holds (or tries) an ExecState's mu and names this thread its holder
  // meanwhile.
  class ExecLock {
   public:
    explicit ExecLock(ExecState& e);
    ExecLock(ExecState& e, std::try_to_lock_t);
    ~ExecLock() { unlock(); }
    ExecLock(const ExecLock&) = delete;
    ExecLock& operator=(const ExecLock&) = delete;
    bool owns_lock() const { return lock_.owns_lock(); }
    void unlock();

   private:
    ExecState& e_;
    std::unique_lock<std::mutex> lock_;
  };

  // Issue's checks (Usable, CheckLimits): the call, or why not.
  absl::StatusOr<CollectiveCall> Prepare(const CollectiveArgs& args) const;
  // A Work with the core's driver where callers execute.
  std::shared_ptr<Work> NewWork() const;
  // Gives `call` its Work and sequence number and queues it.
  std::shared_ptr<Work> Enqueue(CollectiveCall call);
  // Queues `call` (its Work set; mu_ held) with the next sequence number,
  // left to its waiter where Note [Waiters first] says so. True: the
  // progress thread must be woken (after mu_ is let go). The previous
  // call's Work goes to `retired`, for the caller to drop after the lock.
  bool PushLocked(CollectiveCall call, std::shared_ptr<Work>* retired);
  // Note [Waiters first] (mu_ held): whether a call issued at `now` is left
  // to its waiter.
  bool WaitsAtOnce(int64_t now) const;
  // (mu_ held) Every queued call is left to its waiter and within its
  // window at `now`.
  bool LeftToWaiters(int64_t now) const;
  // The idle progress thread's sleep (mu_ held by `lock`): until woken, or
  // with a deadline while calls are left to waiters (Note [Waiters first]).
  void Sleep(std::unique_lock<std::mutex>& lock);
  // Note [The issuer begins]: queues `call` and has the executor begin it on
  // this thread, if the executor lock is free and nothing is queued or in
  // flight; its Work, or null (nothing done, `call` untouched).
  std::shared_ptr<Work> TryBegin(CollectiveCall& call);
  void Loop();
  // One step on the executing thread (exec_->mu held): start the next
  // queued call(s), poll, time out the oldest, complete in order. True if
  // anything changed. The progress thread (`waiter` false) leaves queued
  // calls left to their waiters alone until their window has passed (Note
  // [Waiters first]).
  bool Step(bool waiter);
  // Gives `call` its deadline (start + timeout) and starts it on the
  // executor (exec_->mu held).
  StartOutcome StartCall(CollectiveCall& call);
  // Start + timeout, up to two ticks later (Note [The deadline's clock]).
  absl::Time StartDeadline() const;
  // Appends to in_flight_ (exec_->mu held); the first entry wakes a sleeping
  // progress thread to poll it.
  void PushInFlight(InFlight e);
  // Wakes a sleeping progress thread to poll a call left in flight.
  void WakeToPoll();
  // The fatal path (exec_->mu held): `current`, when not null, is the call
  // that failed inside Start (completed with `s` after those before it).
  void Fail(const absl::Status& s, CollectiveCall* current);

  const AsyncCoreOptions options_;
  const absl::Duration coarse_resolution_;  // of CLOCK_REALTIME_COARSE; zero: none
  CollectiveExecutor* executor_ = nullptr;
  std::shared_ptr<ExecState> exec_ = std::make_shared<ExecState>();

  // Issue side.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<CollectiveCall> queue_;        // guarded by mu_
  uint64_t next_seq_ = 0;                   // guarded by mu_
  bool stopping_ = false;                   // guarded by mu_
  bool sleeping_ = false;                   // guarded by mu_: the thread is in cv_.wait
  // Note [Waiters first], all guarded by mu_.
  const int64_t window_ns_;                 // waiter_window; 0 where callers do not execute
  std::shared_ptr<Work> last_work_;         // the latest issued call's
  bool timed_sleep_ = false;                // the thread's sleep has a deadline
  bool urgent_ = false;                     // a call not left to a waiter ends it
  uint64_t left_to_waiters_ = 0;            // calls left to their waiters so far
  uint64_t left_seen_ = 0;                  // left_to_waiters_ when a timed sleep began
  bool closed_ = false;                     // guarded by mu_: Stop is done, Issue cancels
  std::atomic<size_t> queued_{0};           // queue_.size(), for the spinning thread
  std::atomic<size_t> in_flight_count_{0};  // in_flight_.size()
  std::atomic<bool> abort_{false};
  std::atomic<bool> cancelled_any_{false};
  std::atomic<bool> failed_{false};
  absl::Status failure_;  // guarded by mu_; set once, with failed_

  // Executor side (exec_->mu).
  std::deque<InFlight> in_flight_;
  std::vector<FinishedCall> finished_;
  uint64_t head_seq_ = UINT64_MAX;
  absl::Time head_since_;
  bool broken_ = false;
  bool issuer_begins_ = false;  // set by Start

  std::thread thread_;
  pid_t progress_tid_ = 0;          // set by Start
  absl::Status progress_priority_;  // set by Start
  bool stopped_ = false;  // Stop() ran (owner's thread only)
};

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_ASYNC_CORE_H_
