// ProcessGroupCommunicator: comm::Communicator over a c10d::ProcessGroup
// (gloo on CPU here, NCCL on GPUs), so that fusebox's engine and tuner can
// reduce through the very process group a DDP job already has.
//
// Note [A process group of its own]
// c10d pairs collectives across ranks by issue order (gloo tags each with a
// per-group counter; NCCL enqueues in order). The engine issues from the
// autograd thread, from its worker thread and from the thread that
// completed an earlier collective (Note [Freeing a slot where the collective
// completes] in bucketing/engine.h), always under its own lock and in its
// launch order; DDP issues its own
// collectives (buffer broadcasts, the unused-parameter map) from the
// training thread; on one shared group those could interleave differently
// on different ranks and pair the wrong calls. So the DDP hook gives fusebox
// a group of its own by default (same backend, same ranks: a
// `dist.new_group` over DDP's group), and this class serialises its own
// calls under one lock, which is the order Note [Collective ordering] in
// comm/communicator.h refers to.
#ifndef FUSEBOX_PLUGINS_TORCH_PROCESS_GROUP_COMMUNICATOR_H_
#define FUSEBOX_PLUGINS_TORCH_PROCESS_GROUP_COMMUNICATOR_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "plugins/torch/torch_compat.h"

namespace fusebox::torch_plugin {

// at::ScalarType for a comm::DataType and back (InvalidArgument names the
// type fusebox cannot reduce).
at::ScalarType ToScalarType(comm::DataType type);
absl::StatusOr<comm::DataType> FromScalarType(at::ScalarType type);

class ProcessGroupCommunicator final : public comm::Communicator {
 public:
  // How many recent AllReduce element counts are kept (oldest dropped).
  static constexpr size_t kCallLogLimit = 1 << 16;

  explicit ProcessGroupCommunicator(c10::intrusive_ptr<::c10d::ProcessGroup> group);
  ~ProcessGroupCommunicator() override = default;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // "torch-" + the group's backend name ("torch-gloo", "torch-nccl").
  std::string backend() const override { return backend_; }
  comm::MemoryKind memory() const override { return comm::MemoryKind::kHost; }

  // AllReduce calls issued so far, and the element counts of those with
  // index >= `first` that are still in the log (what a test compares with a
  // plan's bucket sizes).
  int64_t allreduce_calls() const;
  std::vector<int64_t> AllReduceCountsSince(int64_t first) const;

 protected:
  // Note [One front door] (comm/communicator.h): the arguments are checked.
  absl::StatusOr<std::shared_ptr<comm::Work>> DoIssue(const comm::CollectiveArgs& a) override;

 private:
  // Issues `issue()` under the lock and completes the returned Work from
  // the group's future (running `after` first on success).
  absl::StatusOr<std::shared_ptr<comm::Work>> Submit(
      const char* what, const std::function<c10::intrusive_ptr<compat::Work>()>& issue,
      std::function<void()> after);

  // kAvg is a sum through the group, then one division by the world size
  // in the element type (truncating for integers) before the Work
  // completes: what every fusebox backend computes.
  absl::StatusOr<std::shared_ptr<comm::Work>> StartAllReduce(const comm::CollectiveArgs& a);
  absl::StatusOr<std::shared_ptr<comm::Work>> StartBroadcast(const comm::CollectiveArgs& a);
  absl::StatusOr<std::shared_ptr<comm::Work>> StartAllGather(const comm::CollectiveArgs& a);
  absl::StatusOr<std::shared_ptr<comm::Work>> StartBarrier();

  const c10::intrusive_ptr<::c10d::ProcessGroup> group_;
  const int rank_;
  const int size_;
  const std::string backend_;
  mutable std::mutex mu_;  // issue order; guards the log
  int64_t calls_ = 0;
  std::deque<int64_t> counts_;  // the last kCallLogLimit AllReduce counts
};

}  // namespace fusebox::torch_plugin

#endif  // FUSEBOX_PLUGINS_TORCH_PROCESS_GROUP_COMMUNICATOR_H_
