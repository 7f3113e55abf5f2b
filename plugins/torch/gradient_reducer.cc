#include "plugins/torch/gradient_reducer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "plugins/torch/comm_hook.h"
#include "plugins/torch/process_group_communicator.h"

namespace fusebox::torch_plugin {
namespace {

// Runs `fn` after a gradient accumulator has accumulated this backward's
// gradient into its parameter's .grad().
class PostHook final : public ::torch::autograd::FunctionPostHook {
 public:
  explicit PostHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  ::torch::autograd::variable_list operator()(
      const ::torch::autograd::variable_list& outputs,
      const ::torch::autograd::variable_list& /*inputs*/) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

uint64_t Fnv1a(uint64_t h, int64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= static_cast<uint8_t>(v >> (8 * i));
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

struct GradientReducer::Hooked {
  std::shared_ptr<::torch::autograd::Node> accumulator;
  uintptr_t key = 0;
};

GradientReducer::GradientReducer(comm::Communicator& comm, std::vector<at::Tensor> parameters,
                                 GradientReducerOptions options)
    : comm_(comm), params_(std::move(parameters)), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<GradientReducer>> GradientReducer::Create(
    comm::Communicator& comm, std::vector<at::Tensor> parameters, GradientReducerOptions options) {
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const at::Tensor& p = parameters[i];
    if (!p.defined() || !p.requires_grad()) continue;
    if (!p.is_leaf()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("parameter %d is not a leaf tensor (it has no gradient accumulator)", i));
    }
    if (!p.device().is_cpu() || p.is_sparse()) {
      return absl::UnimplementedError(absl::StrFormat(
          "parameter %d is on %s; GradientReducer reduces dense CPU tensors in this build", i,
          p.device().str()));
    }
    absl::StatusOr<comm::DataType> type = FromScalarType(p.scalar_type());
    if (!type.ok() || !at::isFloatingType(p.scalar_type())) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "parameter %d has dtype %s; gradients must be float, double, half or bfloat16", i,
          c10::toString(p.scalar_type())));
    }
    params.push_back(p);
  }
  if (params.empty()) {
    return absl::InvalidArgumentError("GradientReducer: no parameter requires a gradient");
  }
  std::unique_ptr<GradientReducer> r(
      new GradientReducer(comm, std::move(params), std::move(options)));
  if (!r->options_.tuner.log) r->options_.tuner.log = r->options_.log;
  if (r->options_.tuner.backend == "unknown") r->options_.tuner.backend = comm.backend();
  r->marked_.assign(r->params_.size(), 0);
  for (size_t i = 0; i < r->params_.size(); ++i) {
    auto hooked = std::make_unique<Hooked>();
    hooked->accumulator = ::torch::autograd::impl::grad_accumulator(r->params_[i]);
    if (!hooked->accumulator) {
      return absl::InternalError(absl::StrFormat("parameter %d has no gradient accumulator", i));
    }
    GradientReducer* self = r.get();
    const int id = static_cast<int>(i);
    hooked->key =
        hooked->accumulator->add_post_hook(std::make_unique<PostHook>([self, id] { self->OnGradReady(id); }));
    r->hooks_.push_back(std::move(hooked));
  }
  return r;
}

GradientReducer::~GradientReducer() {
  for (const auto& h : hooks_) h->accumulator->del_post_hook(h->key);
}

bucketing::Engine* GradientReducer::engine() const { return engine_.get(); }

void GradientReducer::OnGradReady(int param) {
  bucketing::Engine* e = nullptr;
  at::Tensor grad;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.ok()) return;
    if (marked_[param]) {
      failed_ = absl::FailedPreconditionError(absl::StrFormat(
          "the gradient of parameter %d became ready twice before Finish() (call Finish() after "
          "every backward; accumulating several backward passes is not supported)",
          param));
      return;
    }
    marked_[param] = 1;
    if (order_.empty()) {  // learning (Note [Learning the ready order])
      seen_.push_back(param);
      return;
    }
    e = engine();
    grad = params_[param].grad();
  }
  const at::Tensor& p = params_[param];
  absl::Status s;
  if (!grad.defined() || !grad.is_contiguous() || grad.scalar_type() != p.scalar_type() ||
      grad.numel() != p.numel() || grad.is_sparse()) {
    s = absl::FailedPreconditionError(absl::StrFormat(
        "the gradient of parameter %d is not a dense contiguous tensor like the parameter", param));
  } else {
    s = e->MarkReady(position_[param], grad.data_ptr(), grad.numel());
  }
  if (!s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.ok()) failed_ = s;
  }
}

absl::Status GradientReducer::StartEngine() {
  std::vector<bucketing::TensorSpec> specs;
  for (int pos = 0; pos < static_cast<int>(order_.size()); ++pos) {
    const at::Tensor& p = params_[order_[pos]];
    specs.push_back(bucketing::TensorSpec{absl::StrCat("param_", order_[pos]), p.numel(),
                                          *FromScalarType(p.scalar_type()),
                                          comm::MemoryKind::kHost});
  }
  absl::StatusOr<bucketing::GradientLayout> layout =
      bucketing::GradientLayout::Create(std::move(specs));
  if (!layout.ok()) return layout.status();
  autotune::PlanChoice choice;
  choice.fixed_plan = options_.fixed_plan;
  choice.cache_dir = options_.cache_dir;
  choice.tuner = options_.tuner;
  // The cache's warnings (a directory it cannot use, an unreadable entry)
  // are warnings wherever the log goes.
  if (options_.log) {
    choice.warn = [log = options_.log](const std::string& w) { log("warning: " + w); };
  }
  auto made = autotune::CreateEngineWithPolicy(comm_, *std::move(layout), options_.engine, choice);
  if (!made.ok()) return made.status();
  engine_ = std::move(made->engine);
  tuner_ = made->tuner;
  // The first engine iteration starts now (one Finish() to the next).
  return engine_->StartIteration();
}

absl::Status GradientReducer::FinishLearning() {
  const int n = static_cast<int>(params_.size());
  // Parameters that got no gradient go last, in parameter order.
  std::vector<int> order = seen_;
  for (int i = 0; i < n; ++i) {
    if (!marked_[i]) order.push_back(i);
  }
  // Every rank must have the same parameters (count, sizes, dtypes).
  uint64_t hash = 1469598103934665603ull;
  for (const at::Tensor& p : params_) {
    hash = Fnv1a(Fnv1a(hash, p.numel()), static_cast<int64_t>(p.scalar_type()));
  }
  const int64_t mine[2] = {n, static_cast<int64_t>(hash)};
  std::vector<int64_t> all(2 * comm_.size());
  auto gathered = comm_.AllGather(mine, all.data(), 2, comm::DataType::kInt64);
  if (!gathered.ok()) return gathered.status();
  if (absl::Status s = (*gathered)->WaitFor(options_.engine.timeout); !s.ok()) return s;
  std::vector<std::string> differ;
  for (int r = 0; r < comm_.size(); ++r) {
    if (all[2 * r] != mine[0] || all[2 * r + 1] != mine[1]) {
      differ.push_back(absl::StrFormat("rank %d (%d parameters)", r, all[2 * r]));
    }
  }
  if (!differ.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "GradientReducer: ranks have different parameters: rank %d has %d parameters, unlike %s",
        comm_.rank(), n, absl::StrJoin(differ, ", ")));
  }
  // Rank 0's ready order becomes everyone's.
  std::vector<int32_t> agreed(order.begin(), order.end());
  auto bcast = comm_.Broadcast(agreed.data(), agreed.size(), comm::DataType::kInt32, 0);
  if (!bcast.ok()) return bcast.status();
  if (absl::Status s = (*bcast)->WaitFor(options_.engine.timeout); !s.ok()) return s;
  std::vector<int> check(agreed.begin(), agreed.end());
  std::sort(check.begin(), check.end());
  for (int i = 0; i < n; ++i) {
    if (check[i] != i) return absl::InternalError("rank 0's ready order is not a permutation");
  }
  // This iteration: every gradient averaged at once.
  std::vector<comm::TensorRef> refs;
  for (int i = 0; i < n; ++i) {
    at::Tensor p = params_[i];
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    at::Tensor g = p.grad();
    if (!g.is_contiguous()) {
      return absl::FailedPreconditionError(
          absl::StrFormat("the gradient of parameter %d is not contiguous", i));
    }
    refs.push_back(comm::TensorRef{g.data_ptr(), static_cast<size_t>(g.numel()),
                                   *FromScalarType(g.scalar_type())});
  }
  auto work = comm_.AllReduceMulti(refs, comm::ReduceOp::kAvg);
  if (!work.ok()) return work.status();
  if (absl::Status s = (*work)->WaitFor(options_.engine.timeout); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  order_.assign(agreed.begin(), agreed.end());
  position_.assign(n, 0);
  for (int pos = 0; pos < n; ++pos) position_[order_[pos]] = pos;
  return StartEngine();
}

absl::Status GradientReducer::Finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.ok()) return failed_;
  }
  ++iterations_;
  absl::Status s;
  if (order_.empty()) {
    s = FinishLearning();
  } else {
    // Parameters that got no gradient this iteration: reduced as zeros.
    for (size_t i = 0; i < params_.size() && s.ok(); ++i) {
      if (marked_[i]) continue;
      at::Tensor p = params_[i];
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      s = engine()->MarkReady(position_[i], p.grad().data_ptr(), p.grad().numel());
    }
    if (s.ok()) s = engine_->Finish();
    // The next step starts now: the policy acts between the two.
    if (s.ok()) s = engine_->StartIteration();
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::fill(marked_.begin(), marked_.end(), 0);
  seen_.clear();
  if (!s.ok() && failed_.ok()) failed_ = s;
  return failed_;
}

std::string GradientReducer::phase() const {
  if (tuner_) return autotune::TunerPhaseName(tuner_->phase());
  return engine_ ? "fixed" : "learning";
}

bool GradientReducer::cache_hit() const { return tuner_ && tuner_->cache_hit(); }

int GradientReducer::tuning_iterations() const { return tuner_ ? tuner_->tuning_iterations() : 0; }

const bucketing::Plan* GradientReducer::plan() const {
  const bucketing::Engine* e = engine();
  return e ? &e->plan() : nullptr;
}

bucketing::IterationStats GradientReducer::last_stats() const {
  const bucketing::Engine* e = engine();
  return e ? e->last_stats() : bucketing::IterationStats{};
}

}  // namespace fusebox::torch_plugin
