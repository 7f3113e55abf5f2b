// Work: the completion handle of one asynchronous collective.
#ifndef FUSEBOX_COMM_WORK_H_
#define FUSEBOX_COMM_WORK_H_

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace fusebox::comm {

// A Work is created by a backend when a collective is issued and completed
// exactly once by that backend (from its progress thread). Any thread may
// Test or Wait; waiting never drives the backend, so a caller that never
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

  // A Work that completes when all of `parts` have; its status is the first
  // error among them, or OK.
  static std::shared_ptr<Work> All(std::vector<std::shared_ptr<Work>> parts);

  // A Work that is already complete with `status`.
  static std::shared_ptr<Work> Done(absl::Status status);

 private:
  std::atomic<bool> done_{false};
  std::function<bool()> driver_;  // set before sharing; immutable after
  std::atomic<int> sleepers_{0};  // threads blocked on cv_
  mutable std::mutex mu_;
  std::condition_variable cv_;
  absl::Status status_;  // guarded by mu_, immutable once done_
  std::vector<std::function<void(const absl::Status&)>> callbacks_;  // mu_
};

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_WORK_H_
