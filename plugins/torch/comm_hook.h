// The fusebox DDP communication hook: DDP's gradient buckets go through the
// fusebox engine, under a plan the online tuner chose (or the policy cache
// remembered) for this model and cluster size.
//
//   auto state = fusebox::torch_plugin::RegisterCommHook(reducer, comm, options);
//   // train as usual; state->Snapshot() tells what the hook did.
//
// Note [DDP buckets as fusebox tensors]
// DDP decides its own buckets and hands the hook one flat buffer per bucket,
// in bucket order, once every gradient in it is ready. fusebox treats each
// DDP bucket as one tensor of its layout, so its plan coalesces small DDP
// buckets (set DDP's bucket_cap_mb small to let fusebox decide the whole
// layout) and splits large ones. DDP changes its buckets after the first
// iteration (torch 1.13: one bucket holding every gradient, then buckets
// rebuilt in ready order), so the hook learns the layout as it goes:
// * an iteration whose first bucket does not match the known layout runs
//   "pass-through": each DDP bucket is checked to be the same on every rank
//   (a small AllGather: ranks whose buckets differ fail before any gradient
//   is reduced), then averaged by one AllReduce of its own (what DDP does
//   without a hook), and its bucket sizes become the known layout;
// * the next iteration whose first bucket matches runs through the engine:
//   the tuner is created there (collective: every rank is at the same
//   bucket of the same iteration, since DDP keeps buckets identical across
//   ranks), and each later bucket is checked against the layout; a layout
//   that changes in the middle of an iteration fails it on every rank.
// Each DDP bucket's future completes when its last slice is reduced and
// copied back into DDP's buffer (EngineOptions::on_tensor_reduced); the
// last bucket flushes: it calls Finish (and with it one tuning step), so
// every future is complete, or failed with the reason, when it returns.
#ifndef FUSEBOX_PLUGINS_TORCH_COMM_HOOK_H_
#define FUSEBOX_PLUGINS_TORCH_COMM_HOOK_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "autotune/policy_cache.h"
#include "autotune/tuner.h"
#include "bucketing/engine.h"
#include "comm/communicator.h"
#include "plugins/torch/torch_compat.h"

namespace c10d {
class Reducer;
}

namespace fusebox::torch_plugin {

class ProcessGroupCommunicator;

struct HookOptions {
  // Empty: tune online (cache first). Otherwise a fixed baseline plan by
  // name ("ddp", "per-tensor", "horovod", ...; autotune::BaselineNames) and
  // no tuning.
  std::string fixed_plan;
  // Policy cache directory; empty: no cache.
  std::string cache_dir;
  autotune::TunerOptions tuner;        // cache and log are filled in here
  bucketing::EngineOptions engine;     // on_tensor_reduced is the hook's
  // Receives warnings and progress lines (rank 0's tuner lines); may be empty.
  std::function<void(const std::string&)> log;
};

// The plan a fixed `spec` names: "ddp" (DDP's 25 MiB buckets),
// "per-tensor", or a plan file (bucketing/plan_io.h) made for `layout`.
absl::StatusOr<bucketing::Plan> FixedPlan(const std::string& spec,
                                          const bucketing::GradientLayout& layout);

enum class HookPhase { kLearning, kMeasuring, kTuned, kFixed };
const char* HookPhaseName(HookPhase phase);

// A copy of what the hook knows, for the Python handle and tests.
struct HookSnapshot {
  HookPhase phase = HookPhase::kLearning;
  std::vector<int64_t> layout;          // elements per DDP bucket (known layout)
  std::optional<bucketing::Plan> plan;  // the engine's plan, once there is one
  bool cache_hit = false;
  bool derived_from_cache = false;
  int tuning_iterations = 0;
  int retunes = 0;
  int64_t iterations = 0;               // backward passes seen
  int64_t passthrough_iterations = 0;
  std::vector<autotune::MeasuredPlan> measured;
  int chosen = -1;
  std::string cache_key;
  std::string backend;
  // Element counts of the AllReduce calls the last engine iteration issued
  // through the process group, in issue order (empty when the communicator
  // is not a process group).
  std::vector<int64_t> last_allreduce_counts;
  std::vector<bucketing::IterationStats> stats;  // engine iterations, oldest first
};

class HookState {
 public:
  // The state owns the communicator: DDP's reducer keeps the state (and so
  // the communicator) alive as long as the hook can run. `pg_comm` is the
  // same object when it is a process group, else null.
  HookState(std::shared_ptr<comm::Communicator> comm, ProcessGroupCommunicator* pg_comm,
            HookOptions options);
  const comm::Communicator& comm() const { return *comm_owner_; }
  ~HookState();

  // CommHookInterface::runHook. Never throws: errors fail the future.
  c10::intrusive_ptr<c10::ivalue::Future> RunHook(::c10d::GradBucket& bucket);

  HookSnapshot Snapshot() const;
  // Writes the engine's timeline (chrome://tracing JSON); requires
  // options.engine.record_timeline.
  absl::Status WriteTimeline(const std::string& path) const;

 private:
  absl::Status BeginIteration(const at::Tensor& first);
  // Blocking: the same bucket (index, size, dtype) on every rank, else an
  // error naming the ranks that differ.
  absl::Status CheckBucketAcrossRanks(size_t index,
                                      const std::pair<int64_t, comm::DataType>& bucket);
  absl::Status StartEngine();
  bucketing::Engine* engine() const;
  absl::Status FinishEngine();
  void OnTensorReduced(int id);
  void FailPending(const absl::Status& status);
  void Log(const std::string& line) const;

  const std::shared_ptr<comm::Communicator> comm_owner_;
  comm::Communicator& comm_;
  ProcessGroupCommunicator* const pg_comm_;  // may be null
  HookOptions options_;
  std::unique_ptr<autotune::PolicyCache> cache_;

  // Touched by the autograd thread only (RunHook runs under DDP's lock).
  std::vector<std::pair<int64_t, comm::DataType>> layout_;  // known
  std::vector<std::pair<int64_t, comm::DataType>> seen_;    // this iteration
  bool engine_mode_ = false;
  int64_t calls_mark_ = 0;
  std::unique_ptr<autotune::OnlineTuner> tuner_;
  std::unique_ptr<bucketing::Engine> fixed_;
  absl::Status failed_;  // sticky: an engine error ends the hook's service

  // Shared with the engine's worker (on_tensor_reduced).
  mutable std::mutex mu_;
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> futures_;
  std::vector<at::Tensor> buffers_;
  int reduced_ = 0;
  std::vector<int64_t> last_counts_;
  int64_t iterations_ = 0;
  int64_t passthrough_ = 0;
};

// Registers the hook on `reducer` (DDP's; one hook per reducer, as DDP
// requires) and returns the state it shares with the caller.
// FailedPrecondition when the reducer already has a hook.
absl::StatusOr<std::shared_ptr<HookState>> RegisterCommHook(::c10d::Reducer& reducer,
                                                            std::shared_ptr<comm::Communicator> comm,
                                                            ProcessGroupCommunicator* pg_comm,
                                                            HookOptions options);

}  // namespace fusebox::torch_plugin

#endif  // FUSEBOX_PLUGINS_TORCH_COMM_HOOK_H_
