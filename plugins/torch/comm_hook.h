// fusebox in DDP: the plan fusebox chooses (tuned online, or remembered by
// the policy cache) becomes DDP's own bucket assignment. Two data paths:
// * DDP's own (HookOptions::native, RegisterDdpBuckets): no communication
//   hook at all. DDP reduces its buckets through its process group exactly
//   as it does without fusebox; fusebox learns the gradient ready order and
//   times from tensor hooks that exist only while it needs them, times whole
//   steps from a forward pre-hook, and installs its plan between steps.
//   Nothing runs per bucket, so a plan costs what plain DDP with those
//   buckets costs (Note [Why no hook by default]).
// * A communication hook (RegisterCommHook): each DDP bucket is reduced in
//   place through a fusebox communicator (UCX, or a separate process group).
//
//   auto state = fusebox::torch_plugin::RegisterCommHook(reducer, params, comm, pg, options);
//   // each step: state->OnForwardStart() (a forward pre-hook), then backward
//
// Note [Why no hook by default]
// With a communication hook registered, DDP 1.13 copies each gradient into
// its bucket and leaves the division by the world size to the hook (without
// one it fuses the division into that copy: one pass instead of two), and
// every bucket's future crosses into the hook and back. Measured on a CNN
// over gloo on one host, the hook path running DDP's own plan costs 4-6% of
// the step (docs/results/ddp-hook.md). Where fusebox reduces through the process
// group anyway, nothing justifies that: the native path has DDP do exactly
// what it does without fusebox, on fusebox's buckets. The hook remains the
// way to reduce through another communicator (UCX), where the
// communicator's speed can pay for it.
//
// Note [DDP buckets are the plan's buckets]
// A fusebox plan over the model's parameters (in gradient-ready order, no
// tensor split) is exactly a DDP bucket assignment. So the hook does not
// copy DDP's buckets into buffers of its own: it installs the plan in DDP
// (Reducer::initialize_buckets, between iterations, when no backward is in
// flight) and reduces each bucket DDP hands it in place, through the
// engine with caller-owned buffers (EngineOptions::external_buffers). Every
// candidate the tuner measures, DDP's hand-set caps included, therefore
// runs exactly as DDP would run it, and the one that wins is what DDP runs
// from then on. The autograd thread never waits in the hook: each bucket's
// future completes when its allreduce does, and DDP waits for them as it
// waits for its own.
// * Learning: DDP's first iteration has one bucket, and DDP rebuilds its
//   buckets in gradient-ready order for the second. Until the ready order is
//   known, each bucket is checked to be the same on every rank (a small
//   AllGather: ranks whose buckets differ fail before anything is reduced)
//   and averaged by one AllReduce, as DDP would. The second iteration's
//   buckets give the ready order.
// * At the next forward start the engine is made (the one factory,
//   autotune::CreateEngineWithPolicy) on the layout of parameters in ready
//   order; its plan goes into DDP. Every forward start then closes the
//   previous iteration (whole: forward to forward), lets the policy act,
//   and installs a new plan in DDP when it changed.
#ifndef FUSEBOX_PLUGINS_TORCH_COMM_HOOK_H_
#define FUSEBOX_PLUGINS_TORCH_COMM_HOOK_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
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
  // DDP reduces its own buckets (no communication hook; Note [Why no hook
  // by default]): the communicator carries only the tuner's agreements.
  bool native = false;
  // Empty: tune online (cache first). Otherwise a fixed plan by name
  // ("ddp", "per-tensor") or a plan file for the parameter layout.
  std::string fixed_plan;
  std::string cache_dir;               // policy cache directory; empty: no cache
  autotune::TunerOptions tuner;        // cache and log are filled in here
  bucketing::EngineOptions engine;     // external buffers and callbacks are the hook's
  // Receives warnings and progress lines (rank 0's tuner lines); may be empty.
  std::function<void(const std::string&)> log;
};

using autotune::FixedPlan;

enum class HookPhase { kLearning, kProfiling, kScreening, kVerifying, kTuned, kFixed };
const char* HookPhaseName(HookPhase phase);

// A copy of what the hook knows, for the Python handle and tests.
struct HookSnapshot {
  HookPhase phase = HookPhase::kLearning;
  std::vector<int64_t> layout;          // elements per parameter, in ready order
  std::vector<std::string> names;       // parameter names, in ready order
  std::optional<bucketing::Plan> plan;  // the plan DDP runs, once there is one
  bool cache_hit = false;
  bool derived_from_cache = false;
  int tuning_iterations = 0;
  double tuning_cost_ms = 0;
  int checks = 0;
  int fallbacks = 0;
  std::string decision;
  // "tuning took X s; the kept plan saves Y ms a step (Z s so far)"; empty
  // before a decision or without a tuner.
  std::string summary;
  int hit_check_iterations = 0;
  uint64_t seed = 0;                    // the tuner's (replays its order)
  std::string cost_model;               // the last search's model, described (empty before)
  int64_t iterations = 0;               // backward passes seen
  int64_t passthrough_iterations = 0;
  int64_t plan_installs = 0;            // times a plan was installed in DDP
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
  // The state owns the communicator. `params` are DDP's reducer parameters
  // (DistributedDataParallel._build_params_for_reducer order) and `names`
  // theirs. `reducer` is used only from OnForwardStart, which DDP's own
  // forward pre-hook calls, so the reducer is alive whenever it runs (the
  // handle holds no reference to the DDP model: no cycle keeps DDP, its
  // process group and their threads alive until interpreter exit).
  HookState(::c10d::Reducer* reducer, std::vector<at::Tensor> params,
            std::vector<std::string> names, std::shared_ptr<comm::Communicator> comm,
            ProcessGroupCommunicator* pg_comm, HookOptions options);
  ~HookState();
  const comm::Communicator& comm() const { return *comm_owner_; }

  // CommHookInterface::runHook. Never throws: errors fail the future.
  c10::intrusive_ptr<c10::ivalue::Future> RunHook(::c10d::GradBucket& bucket);

  // From a forward pre-hook on the DDP module (with grad enabled): the
  // training step starts. Collective once the engine exists (every rank
  // steps together, as DDP requires). Errors are sticky.
  absl::Status OnForwardStart();

  HookSnapshot Snapshot() const;
  absl::Status WriteTimeline(const std::string& path) const;
  // Test and benchmark hook: make the tuner adopt `spec` as its chosen plan
  // from the next step: a FixedPlan spec, or "candidate:<i>" for the plan of
  // the tuner's measured()[i] (0: your buckets). `checks`: as
  // OnlineTuner::ForceChosen.
  absl::Status ForcePlan(const std::string& spec, bool checks = true);

  // Native path: a tensor hook on parameter `param` (an index into the
  // parameters given at registration) fired: its gradient is ready. On the
  // autograd thread.
  void OnGradReady(int param);
  // Native path: the parameters that want such a hook now (all of them while
  // the ready order or the tuner's profile is being learned; the first and
  // the last to become ready afterwards, which mark a backward and its end),
  // and a version that changes whenever the set does.
  std::pair<int64_t, std::vector<int>> GradHooks() const;
  // Native path: the parameter whose gradient is ready last (the ready
  // order's last; -1 while it is learned). Its hook queues an autograd
  // callback that runs after DDP's own (which waits for every bucket's
  // allreduce) and calls OnBackwardEnd: where the step's communication
  // ends, so that a step's exposed communication and its tail after it are
  // seen (IterationStats::finish_us).
  int LastReadyParam() const;
  void OnBackwardEnd();
  // Whether the next step boundary is measured (OnlineTuner::
  // TimesNextBoundary; true before the tuner exists): where a model runs on
  // a device, the caller synchronises it there and nowhere else.
  bool TimesNextBoundary() const;
  // TuningSummary::Line() once a plan other than the baseline is kept, else
  // empty; cheap (no snapshot), for a per-step check.
  std::string SummaryLine() const;
  // The hash of the plan DDP runs (bucketing::PlanHash; 0 while there is
  // none); cheap (no snapshot), for a per-step check.
  uint64_t PlanHash() const;
  // Native path: `us` microseconds between two steps were not training
  // (evaluation, a checkpoint, a wait the caller knows of): the step they
  // follow is measured without them, so that the tuner and the regression
  // checks see the step's own time. Called between a backward and the next
  // forward; sums until that forward. Refused with communicator="ucx" or
  // "group" (the engine times its own iterations) and for us < 0.
  absl::Status ExcludeFromStep(double us);

 private:
  absl::Status OnForwardStartNative();
  absl::Status StartPolicy();
  absl::Status InstallNativePlan(bucketing::Plan plan);
  absl::Status VerifyPlanAcrossRanks(const bucketing::Plan& plan);
  double NowUs() const;
  absl::Status CheckBucketAcrossRanks(size_t index,
                                      const std::pair<int64_t, comm::DataType>& bucket);
  // The layout of the parameters in `order` (ready order), and the plan
  // choice of the options: what both data paths start from.
  absl::StatusOr<bucketing::GradientLayout> LayoutInOrder(const std::vector<int>& order) const;
  autotune::PlanChoice Choice() const;
  absl::Status StartEngine();
  absl::Status InstallPlan();
  absl::StatusOr<std::vector<int>> BucketParams(::c10d::GradBucket& bucket) const;
  void OnBucketReduced(int bucket, const absl::Status& status);
  void FailPending(const absl::Status& status);
  void Log(const std::string& line) const;

  ::c10d::Reducer* const reducer_;
  const std::vector<at::Tensor> params_;
  const std::vector<std::string> names_;
  absl::flat_hash_map<const void*, int> param_index_;  // TensorImpl -> index in params_
  const std::shared_ptr<comm::Communicator> comm_owner_;
  comm::Communicator& comm_;
  ProcessGroupCommunicator* const pg_comm_;  // may be null
  HookOptions options_;

  // Touched by the autograd thread and the forward pre-hook (never at once:
  // DDP runs them in sequence).
  std::vector<std::pair<int64_t, comm::DataType>> seen_;  // this iteration's buckets
  std::vector<int> seen_params_;   // this iteration's parameters, in bucket order
  int learned_iterations_ = 0;
  std::vector<int> order_;         // ready position -> parameter index (learned; mu_)
  bool start_engine_ = false;      // the order is known: make the engine at the next forward
  std::unique_ptr<bucketing::Engine> engine_;
  autotune::OnlineTuner* tuner_ = nullptr;  // owned by engine_
  uint64_t installed_hash_ = 0;
  int marked_ = 0;                 // buckets handed to the engine this iteration
  int64_t installs_ = 0;           // guarded by mu_
  absl::Status failed_;            // sticky

  // Held while the engine steps between iterations (Finish, the policy,
  // SetPlan) and by Snapshot/WriteTimeline, so that a snapshot taken on
  // another thread never reads the tuner or the plan mid-change. Never
  // taken by completion callbacks (Finish waits for them). Order: step_mu_,
  // then the engine's lock; mu_ is never held while calling the engine.
  mutable std::mutex step_mu_;
  // Shared with the completion callbacks (on_bucket_reduced), which run
  // inside the engine's lock; guards what they touch and what Snapshot
  // reads besides the engine and the tuner (order_, the counters).
  mutable std::mutex mu_;
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> futures_;
  std::vector<at::Tensor> buffers_;
  int reduced_ = 0;
  int64_t calls_mark_ = 0;
  std::vector<int64_t> last_counts_;
  int64_t iterations_ = 0;
  int64_t passthrough_ = 0;

  // Native path. The policy and the plan change under step_mu_; what the
  // tensor hooks write is guarded by mu_.
  const std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();
  std::optional<bucketing::GradientLayout> layout_;
  std::unique_ptr<autotune::OnlineTuner> policy_;
  bucketing::Plan plan_;
  uint64_t plan_hash_ = 0;
  double start_us_ = 0;                     // this step's forward start
  double excluded_us_ = 0;                  // ExcludeFromStep since the last forward
  std::deque<bucketing::IterationStats> history_;
  std::vector<int> grad_order_;             // params in the order their hooks fired (mu_)
  std::vector<double> grad_us_;             // per param: when it fired, -1 if not (mu_)
  double backward_done_us_ = -1;            // OnBackwardEnd this step, -1 if not (mu_)
  std::vector<int> hooked_;                 // params that want a hook (mu_)
  int64_t hooks_version_ = 0;               // (mu_)
};

// The native path: no hook is registered; `comm` carries the tuner's
// agreements between steps only. DDP keeps whatever hook it has.
absl::StatusOr<std::shared_ptr<HookState>> RegisterDdpBuckets(
    ::c10d::Reducer& reducer, std::vector<at::Tensor> params, std::vector<std::string> names,
    std::shared_ptr<comm::Communicator> comm, HookOptions options);

// Registers the hook on `reducer` (one hook per reducer, as DDP requires).
// FailedPrecondition when the reducer already has a hook.
absl::StatusOr<std::shared_ptr<HookState>> RegisterCommHook(
    ::c10d::Reducer& reducer, std::vector<at::Tensor> params, std::vector<std::string> names,
    std::shared_ptr<comm::Communicator> comm, ProcessGroupCommunicator* pg_comm,
    HookOptions options);

}  // namespace fusebox::torch_plugin

#endif  // FUSEBOX_PLUGINS_TORCH_COMM_HOOK_H_
