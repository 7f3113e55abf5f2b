#include "comm/testing/device_communicator.h"

#include <functional>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fusebox::comm::testing {
namespace {

using IssueFn = std::function<absl::StatusOr<std::shared_ptr<Work>>(Communicator&)>;

class EmulatedDeviceCommunicator final : public Communicator {
 public:
  EmulatedDeviceCommunicator(Communicator& host, Device& device,
                             std::unique_ptr<DeviceStream> stream)
      : host_(host), device_(device), stream_(std::move(stream)) {}
  // Destroying the stream runs what is still queued on it first.
  ~EmulatedDeviceCommunicator() override = default;

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::string backend() const override { return "emulated-device:" + host_.backend(); }
  std::string Algorithms() const override { return host_.Algorithms(); }
  MemoryKind memory() const override { return MemoryKind::kDevice; }
  Device* device() const override { return &device_; }

 protected:
  // The host communicator checks the arguments again: it is a front door
  // of its own.
  absl::StatusOr<std::shared_ptr<Work>> DoIssue(const CollectiveArgs& a) override {
    return Enqueue(nullptr, [a](Communicator& h) { return h.Issue(a); });
  }
  absl::StatusOr<std::shared_ptr<Work>> DoAllReduceAfter(const DeviceEvent& ready,
                                                         const CollectiveArgs& a) override {
    return Enqueue(&ready, [a](Communicator& h) { return h.Issue(a); });
  }

 private:
  // Behind `ready` (if any), a host function on the stream issues the
  // collective through the host communicator, waits for it and completes
  // the Work. Under mu_, so that calls from several threads enter the
  // stream, and so the host communicator, in one order.
  absl::StatusOr<std::shared_ptr<Work>> Enqueue(const DeviceEvent* ready, IssueFn issue) {
    std::lock_guard<std::mutex> lock(mu_);
    if (ready != nullptr) {
      if (absl::Status s = device_.WaitEvent(*stream_, *ready); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("AllReduceAfter: ", s.message()));
      }
    }
    auto work = std::make_shared<Work>();
    absl::Status s = device_.LaunchHostFunc(
        *stream_, [&host = host_, issue = std::move(issue), work] {
          work->MarkStarted();
          absl::StatusOr<std::shared_ptr<Work>> w = issue(host);
          work->Complete(w.ok() ? (*w)->Wait() : w.status());
        });
    if (!s.ok()) return s;
    return work;
  }

  Communicator& host_;
  Device& device_;
  std::mutex mu_;
  const std::unique_ptr<DeviceStream> stream_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateEmulatedDeviceCommunicator(
    Communicator& host, Device& device) {
  if (host.memory() != MemoryKind::kHost) {
    return absl::InvalidArgumentError(absl::StrCat(
        "emulated device communicator: the host communicator (", host.backend(),
        ") must reduce host memory"));
  }
  if (device.name() != "emulated") {
    return absl::InvalidArgumentError(absl::StrCat(
        "emulated device communicator: ", device.name(),
        " is not the emulated device (its memory must be host memory)"));
  }
  absl::StatusOr<std::unique_ptr<DeviceStream>> stream = device.CreateStream();
  if (!stream.ok()) return stream.status();
  return std::unique_ptr<Communicator>(
      new EmulatedDeviceCommunicator(host, device, *std::move(stream)));
}

}  // namespace fusebox::comm::testing
