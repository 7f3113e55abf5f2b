#include "comm/work.h"

#include <chrono>
#include <functional>
#include <thread>
#include <utility>

namespace fusebox::comm {
namespace {

// Poll briefly before sleeping: a small collective finishes within a few
// microseconds and a futex round trip would dominate its latency. The poll
// yields the core on every turn, so the progress thread that is completing
// the Work (often on the same core) is never starved by its waiter.
// With a driver, each turn first tries to execute pending work on this
// thread; a turn that did something restarts the count.
bool PollUntilDone(const std::atomic<bool>& done,
                   const std::function<bool()>* driver = nullptr) {
  for (int i = 0; i < 256; ++i) {
    if (done.load(std::memory_order_acquire)) return true;
    if (driver != nullptr && (*driver)()) {
      i = 0;
      continue;
    }
    std::this_thread::yield();
  }
  return done.load(std::memory_order_acquire);
}

}  // namespace

absl::Status Work::Wait() {
  if (driver_) waited_ns_.store(SteadyNowNs(), std::memory_order_relaxed);
  if (!PollUntilDone(done_, driver_ ? &driver_ : nullptr)) {
    std::unique_lock<std::mutex> lock(mu_);
    sleepers_.fetch_add(1, std::memory_order_relaxed);
    cv_.wait(lock, [&] { return done_.load(std::memory_order_acquire); });
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
  }
  return status();
}

absl::Status Work::WaitUntil(absl::Time deadline) {
  if (!PollUntilDone(done_)) {
    std::unique_lock<std::mutex> lock(mu_);
    const auto tp = absl::ToChronoTime(deadline);
    sleepers_.fetch_add(1, std::memory_order_relaxed);
    const bool done =
        cv_.wait_until(lock, tp, [&] { return done_.load(std::memory_order_acquire); });
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
    if (!done) {
      return absl::DeadlineExceededError(
          "collective did not complete before the deadline (a peer may be "
          "slow, stuck, or gone)");
    }
  }
  return status();
}

absl::Status Work::status() const {
  // Complete() writes status_ before it sets done_ (release), and never again.
  if (done_.load(std::memory_order_acquire)) return status_;
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

void Work::Complete(absl::Status status) {
  completed_ns_.store(SteadyNowNs(), std::memory_order_release);
  std::vector<std::function<void(const absl::Status&)>> callbacks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(status);
    callbacks.swap(callbacks_);
    done_.store(true, std::memory_order_release);
  }
  // Sleepers register under mu_, so none can be missed; skipping the futex
  // wake when nobody sleeps keeps completion cheap for spinning waiters.
  if (sleepers_.load(std::memory_order_relaxed) > 0) cv_.notify_all();
  for (auto& fn : callbacks) fn(status_);  // status_ is immutable from here
}

void Work::OnComplete(std::function<void(const absl::Status&)> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_.load(std::memory_order_relaxed)) {
      callbacks_.push_back(std::move(fn));
      return;
    }
  }
  fn(status_);
}

std::shared_ptr<Work> Work::All(std::vector<std::shared_ptr<Work>> parts) {
  struct Joint {
    std::mutex mu;
    size_t remaining;
    absl::Status first_error;
  };
  auto out = std::make_shared<Work>();
  if (parts.empty()) {
    out->Complete(absl::OkStatus());
    return out;
  }
  // Waiting on the whole drives its parts, as waiting on each part would.
  std::vector<std::function<bool()>> drivers;
  for (const auto& p : parts) {
    if (p->driver_) drivers.push_back(p->driver_);
  }
  if (!drivers.empty()) {
    out->SetDriver([drivers = std::move(drivers)] {
      for (const auto& d : drivers) {
        if (d()) return true;
      }
      return false;
    });
  }
  auto joint = std::make_shared<Joint>();
  joint->remaining = parts.size();
  for (const auto& p : parts) {
    p->OnComplete([joint, out](const absl::Status& s) {
      absl::Status final_status;
      {
        std::lock_guard<std::mutex> lock(joint->mu);
        if (!s.ok() && joint->first_error.ok()) joint->first_error = s;
        if (--joint->remaining != 0) return;
        final_status = joint->first_error;
      }
      out->Complete(std::move(final_status));
    });
  }
  return out;
}

std::shared_ptr<Work> Work::Done(absl::Status status) {
  auto w = std::make_shared<Work>();
  w->Complete(std::move(status));
  return w;
}

}  // namespace fusebox::comm
