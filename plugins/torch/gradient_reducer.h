// GradientReducer: data-parallel gradient averaging for LibTorch programs,
// which have no DDP. It attaches to a module's parameters and reduces their
// gradients through the fusebox engine while backward runs, under the plan
// the online tuner chose (or the policy cache remembered).
//
//   auto comm = ...;                                   // e.g. UCX via fusebox-run
//   auto reducer = fusebox::torch::GradientReducer::Create(*comm, model->parameters(), {});
//   for (...) {
//     optimizer.zero_grad();
//     loss.backward();            // gradients are reduced as they become ready
//     (*reducer)->Finish();       // every gradient now holds the average
//     optimizer.step();
//   }
//
// Note [Learning the ready order]
// A post hook on each parameter's gradient accumulator fires once the
// parameter's gradient for this backward is complete: that is when fusebox
// marks it ready. The order in which gradients become ready is the layout
// the planner needs, and it is only known by running backward, so the first
// iteration records it while nothing is reduced; its Finish() takes rank
// 0's order (and checks that every rank has the same parameters), averages
// every gradient at once, and creates the tuner on the learned layout.
// Later iterations overlap reduction with backward. An iteration, for the
// statistics and the tuner, is one Finish() to the next: the whole step
// (optimizer, forward and backward). A parameter that gets no
// gradient in an iteration is reduced as zeros in Finish(), as DDP does with
// find_unused_parameters, so every rank issues the same collectives.
#ifndef FUSEBOX_PLUGINS_TORCH_GRADIENT_REDUCER_H_
#define FUSEBOX_PLUGINS_TORCH_GRADIENT_REDUCER_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "autotune/policy_cache.h"
#include "autotune/tuner.h"
#include "bucketing/engine.h"
#include "comm/communicator.h"

namespace fusebox::torch_plugin {

struct GradientReducerOptions {
  // Empty: tune online (cache first); else a fixed plan (FixedPlan in
  // comm_hook.h: "ddp", "per-tensor" or a plan file).
  std::string fixed_plan;
  std::string cache_dir;  // empty: no cache
  autotune::TunerOptions tuner;
  bucketing::EngineOptions engine;
  std::function<void(const std::string&)> log;
};

class GradientReducer {
 public:
  // `parameters`: those whose gradients are averaged (typically
  // module->parameters()); the ones that do not require grad are skipped.
  // The communicator must outlive the reducer. Not collective; the first
  // Finish() is.
  static absl::StatusOr<std::unique_ptr<GradientReducer>> Create(
      comm::Communicator& comm, std::vector<at::Tensor> parameters,
      GradientReducerOptions options = {});
  // Removes the hooks it added.
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // After backward, before the optimizer step: returns once every
  // parameter's .grad() holds the average over ranks. Collective. Errors
  // (a rank with different parameters, a communication failure or timeout)
  // are sticky.
  absl::Status Finish();

  // "learning" (first iteration), "profiling", "screening", "verifying",
  // "tuned" or "fixed".
  std::string phase() const;
  int64_t iterations() const { return iterations_; }
  bool cache_hit() const;
  int tuning_iterations() const;
  // The plan in use (nullptr while learning).
  const bucketing::Plan* plan() const;
  bucketing::IterationStats last_stats() const;

 private:
  struct Hooked;  // one per parameter: the accumulator and the hook key
  GradientReducer(comm::Communicator& comm, std::vector<at::Tensor> parameters,
                  GradientReducerOptions options);
  void OnGradReady(int param);
  absl::Status FinishLearning();
  absl::Status StartEngine();
  bucketing::Engine* engine() const;

  comm::Communicator& comm_;
  const std::vector<at::Tensor> params_;
  GradientReducerOptions options_;
  std::vector<std::unique_ptr<Hooked>> hooks_;

  std::mutex mu_;  // guards what hooks touch (backward may run on several threads)
  std::vector<int> order_;     // layout position -> parameter (once learned)
  std::vector<int> position_;  // parameter -> layout position
  std::vector<int> seen_;      // learning: parameters in ready order
  std::vector<uint8_t> marked_;  // this iteration, per parameter
  absl::Status failed_;
  int64_t iterations_ = 0;
  std::unique_ptr<bucketing::Engine> engine_;  // owns the tuner (its policy)
  autotune::OnlineTuner* tuner_ = nullptr;
};

}  // namespace fusebox::torch_plugin

// The name LibTorch users write: fusebox::torch::GradientReducer. (Code
// inside namespace fusebox must then spell LibTorch's namespace ::torch.)
namespace fusebox::torch {
using GradientReducer = ::fusebox::torch_plugin::GradientReducer;
using GradientReducerOptions = ::fusebox::torch_plugin::GradientReducerOptions;
}  // namespace fusebox::torch

#endif  // FUSEBOX_PLUGINS_TORCH_GRADIENT_REDUCER_H_
