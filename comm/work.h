// Work: the completion handle of one asynchronous collective.
#ifndef FUSEBOX_COMM_WORK_H_
#define FUSEBOX_COMM_WORK_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace fusebox::comm {

// A Work is created by a backend when a collective is issued and completed
// exactly once by that backend (from its progress thread, or from a caller
// that runs it: SetDriver). Any thread may Test or Wait; a caller that never
// waits still sees its collective finish. Cheap to share (shared_ptr).
class Work {
 public:
  Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // True once the collective has finished (successfully or not). Never
  // blocks.
  bool Test() const { return done_.load(std::memory_order_acquire); }

  // Blocks until finished and returns the collective's status.
  absl::Status Wait();

  // Like Wait, but gives up at `deadline` and returns DeadlineExceeded naming
  // `what`; the collective is NOT cancelled and a later Wait may still succeed.
  absl::Status WaitUntil(absl::Time deadline);
  absl::Status WaitFor(absl::Duration timeout) {
    return WaitUntil(absl::Now() + timeout);
  }

  // The final status; only meaningful once Test() is true.
  absl::Status status() const;

  // Backend side: records the outcome and wakes waiters. Must be called
  // exactly once.
  void Complete(absl::Status status);

  // Runs `fn(status)` once the Work is complete: immediately on the calling
  // thread if it already is, otherwise on the completing (backend) thread,
  // which `fn` must not block: in particular it must not Wait() on a Work.
  void OnComplete(std::function<void(const absl::Status&)> fn);

  // Backend side, before the Work is handed out: `driver` runs one step of
  // the backend's pending work on the calling thread and returns true if it
  // did something. Wait() (not WaitUntil, which must honour its deadline)
  // calls it instead of idling, so a caller that blocks on a collective can
  // execute it itself rather than wait for a hand-off from the backend's
  // thread. The driver must be safe to call after the backend is gone.
  void SetDriver(std::function<bool()> driver) { driver_ = std::move(driver); }

  // Launch-to-start: when the Work was issued (made) and when the backend
  // began executing it (MarkStarted; steady clock, ns since its epoch; 0
  // until then, and for backends that do not say). The difference is what a
  // collective waited for an executor: queueing behind earlier collectives,
  // and a sleeping progress thread's wake-up.
  int64_t issued_ns() const { return issued_ns_; }
  int64_t started_ns() const { return started_ns_.load(std::memory_order_acquire); }
  // Backend side: the collective starts executing now (or at `ns`, a
  // SteadyNowNs() taken when it did). Once.
  void MarkStarted() { MarkStartedAt(SteadyNowNs()); }
  void MarkStartedAt(int64_t ns) { started_ns_.store(ns, std::memory_order_release); }
  // When Complete() was called (0 before): with the previous collective's,
  // it splits launch-to-start into queueing behind earlier collectives and
  // the executor's own reaction.
  int64_t completed_ns() const { return completed_ns_.load(std::memory_order_acquire); }
  // When Wait() was last entered on a Work with a driver (0: never), so that
  // the backend can tell a caller that waits as soon as it issues from one
  // that overlaps (Note [Waiters first] in comm/async_core.h).
  int64_t waited_ns() const { return waited_ns_.load(std::memory_order_relaxed); }
  static int64_t SteadyNowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // A Work that completes when all of `parts` have; its status is the first
  // error among them, or OK.
  static std::shared_ptr<Work> All(std::vector<std::shared_ptr<Work>> parts);

  // A Work that is already complete with `status`.
  static std::shared_ptr<Work> Done(absl::Status status);

 private:
  std::atomic<bool> done_{false};
  const int64_t issued_ns_ = SteadyNowNs();
  std::atomic<int64_t> started_ns_{0};
  std::atomic<int64_t> completed_ns_{0};
  std::atomic<int64_t> waited_ns_{0};
  std::function<bool()> driver_;  // set before sharing; immutable after
  std::atomic<int> sleepers_{0};  // threads blocked on cv_
  mutable std::mutex mu_;
  std::condition_variable cv_;
  absl::Status status_;  // guarded by mu_, immutable once done_
  std::vector<std::function<void(const absl::Status&)>> callbacks_;  // mu_
};

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_WORK_H_
