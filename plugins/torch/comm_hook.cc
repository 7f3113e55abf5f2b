#include "plugins/torch/comm_hook.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <stdexcept>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "bucketing/plan_io.h"
#include "bucketing/planners.h"
#include "plugins/torch/process_group_communicator.h"
#include "torch/csrc/distributed/c10d/reducer.hpp"

namespace fusebox::torch_plugin {
namespace {

using FuturePtr = c10::intrusive_ptr<c10::ivalue::Future>;

void SetError(const FuturePtr& future, const absl::Status& status) {
  if (future->completed()) return;
  future->setError(std::make_exception_ptr(
      std::runtime_error(absl::StrCat("fusebox DDP hook: ", status.ToString()))));
}

FuturePtr NewFuture() { return c10::make_intrusive<c10::ivalue::Future>(c10::TensorType::get()); }

// What runs as DDP's comm hook: a thin shell around the shared state, which
// the Python handle also holds.
class FuseboxCommHook final : public ::c10d::CommHookInterface {
 public:
  explicit FuseboxCommHook(std::shared_ptr<HookState> state) : state_(std::move(state)) {}
  FuturePtr runHook(::c10d::GradBucket& bucket) override { return state_->RunHook(bucket); }
  // The future holds the reduced bucket buffer itself.
  at::Tensor parseHookResult(const c10::IValue& result) override { return result.toTensor(); }

 private:
  std::shared_ptr<HookState> state_;
};

}  // namespace

const char* HookPhaseName(HookPhase phase) {
  switch (phase) {
    case HookPhase::kLearning: return "learning";
    case HookPhase::kProfiling: return "profiling";
    case HookPhase::kScreening: return "screening";
    case HookPhase::kVerifying: return "verifying";
    case HookPhase::kTuned: return "tuned";
    case HookPhase::kFixed: return "fixed";
  }
  return "unknown";
}

HookState::HookState(::c10d::Reducer* reducer, std::vector<at::Tensor> params,
                     std::vector<std::string> names, std::shared_ptr<comm::Communicator> comm,
                     ProcessGroupCommunicator* pg_comm, HookOptions options)
    : reducer_(reducer),
      params_(std::move(params)),
      names_(std::move(names)),
      comm_owner_(std::move(comm)),
      comm_(*comm_owner_),
      pg_comm_(pg_comm),
      options_(std::move(options)) {
  for (size_t i = 0; i < params_.size(); ++i) {
    param_index_[params_[i].unsafeGetTensorImpl()] = static_cast<int>(i);
  }
  options_.engine.external_buffers = true;
  options_.engine.schedule = bucketing::Schedule::kPlanOrder;
  options_.engine.on_tensor_reduced = nullptr;
  options_.engine.on_bucket_reduced = [this](int b, const absl::Status& s) {
    OnBucketReduced(b, s);
  };
  // DDP's own arithmetic: each bucket divided by the world size on the
  // autograd thread, then summed (bit for bit what DDP computes without a
  // hook, at any world size; and no division after the allreduce, on the
  // critical path of the last bucket).
  options_.engine.average = false;
  // DDP buckets hold whole parameters: no plan may split one.
  options_.tuner.planner.max_pieces = 1;
  // Through the hook, ready times are known per DDP bucket: profile with
  // small ones. The native path times each gradient and profiles on DDP's
  // default.
  if (!options_.native && options_.tuner.profile_cap_bytes == 0) {
    options_.tuner.profile_cap_bytes = int64_t{1} << 20;
  }
  if (options_.native) {
    grad_us_.assign(params_.size(), -1.0);
    for (size_t i = 0; i < params_.size(); ++i) hooked_.push_back(static_cast<int>(i));
    hooks_version_ = 1;
  }
  if (!options_.tuner.log) options_.tuner.log = options_.log;
  if (options_.tuner.backend == "unknown") options_.tuner.backend = comm_.backend();
}

HookState::~HookState() = default;

void HookState::Log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

void HookState::OnBucketReduced(int bucket, const absl::Status& status) {
  FuturePtr future;
  at::Tensor buffer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (bucket < 0 || bucket >= static_cast<int>(futures_.size()) || !futures_[bucket]) return;
    future = std::move(futures_[bucket]);
    buffer = std::move(buffers_[bucket]);
    if (++reduced_ == static_cast<int>(futures_.size()) && pg_comm_ != nullptr) {
      last_counts_ = pg_comm_->AllReduceCountsSince(calls_mark_);
    }
  }
  // Outside the lock: completion runs the future's callbacks inline.
  if (status.ok()) {
    future->markCompleted(c10::IValue(std::move(buffer)));
  } else {
    SetError(future, status);  // DDP's wait for this bucket fails instead of hanging
  }
}

void HookState::FailPending(const absl::Status& status) {
  std::vector<FuturePtr> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (FuturePtr& f : futures_) {
      if (f) pending.push_back(std::move(f));
    }
    buffers_.assign(buffers_.size(), at::Tensor());
  }
  for (const FuturePtr& f : pending) SetError(f, status);
}

absl::StatusOr<std::vector<int>> HookState::BucketParams(::c10d::GradBucket& bucket) const {
  std::vector<int> out;
  for (const at::Tensor& p : bucket.getParameters()) {
    auto it = param_index_.find(p.unsafeGetTensorImpl());
    if (it == param_index_.end()) {
      return absl::FailedPreconditionError(
          "a DDP bucket holds a parameter that is not among the model's parameters given at "
          "registration");
    }
    out.push_back(it->second);
  }
  return out;
}

absl::StatusOr<bucketing::GradientLayout> HookState::LayoutInOrder(
    const std::vector<int>& order) const {
  std::vector<bucketing::TensorSpec> specs;
  for (int p : order) {
    absl::StatusOr<comm::DataType> type = FromScalarType(params_[p].scalar_type());
    if (!type.ok()) return type.status();
    specs.push_back(bucketing::TensorSpec{names_[p], params_[p].numel(), *type,
                                          comm::MemoryKind::kHost});
  }
  return bucketing::GradientLayout::Create(std::move(specs));
}

autotune::PlanChoice HookState::Choice() const {
  autotune::PlanChoice choice;
  choice.fixed_plan = options_.fixed_plan;
  choice.cache_dir = options_.cache_dir;
  choice.tuner = options_.tuner;
  // The cache's warnings (a directory it cannot use, an unreadable entry)
  // are warnings wherever the log goes.
  if (options_.log) {
    choice.warn = [log = options_.log](const std::string& w) { log("warning: " + w); };
  }
  return choice;
}

absl::Status HookState::StartEngine() {
  absl::StatusOr<bucketing::GradientLayout> layout = LayoutInOrder(order_);
  if (!layout.ok()) return layout.status();
  absl::StatusOr<autotune::EngineWithPolicy> made =
      autotune::CreateEngineWithPolicy(comm_, *std::move(layout), options_.engine, Choice());
  if (!made.ok()) return made.status();
  std::lock_guard<std::mutex> lock(mu_);
  engine_ = std::move(made->engine);
  tuner_ = made->tuner;
  return absl::OkStatus();
}

absl::Status HookState::InstallPlan() {
  const bucketing::Plan& plan = engine_->plan();
  if (engine_->plan_hash() == installed_hash_) return absl::OkStatus();
  std::vector<std::vector<size_t>> indices;
  for (const bucketing::Bucket& b : plan.buckets) {
    std::vector<size_t> bucket;
    for (const bucketing::Slice& s : b.slices) bucket.push_back(static_cast<size_t>(order_[s.tensor]));
    indices.push_back(std::move(bucket));
  }
  try {
    reducer_->initialize_buckets(std::move(indices));
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("DDP refused the bucket assignment of plan \"", plan.name, "\": ", e.what()));
  }
  installed_hash_ = engine_->plan_hash();
  std::lock_guard<std::mutex> lock(mu_);
  ++installs_;
  futures_.assign(plan.buckets.size(), FuturePtr());
  buffers_.assign(plan.buckets.size(), at::Tensor());
  return absl::OkStatus();
}

absl::Status HookState::OnForwardStart() {
  if (!failed_.ok()) return failed_;
  std::lock_guard<std::mutex> step(step_mu_);
  if (options_.native) {
    absl::Status s = OnForwardStartNative();
    if (!s.ok()) failed_ = s;
    return s;
  }
  absl::Status s;
  if (engine_ == nullptr) {
    if (!start_engine_) return absl::OkStatus();  // still learning
    s = StartEngine();
  } else if (marked_ == 0) {
    // A forward with no backward since the last one (evaluation with grad
    // enabled, or gradient accumulation without sync): the step goes on.
    return absl::OkStatus();
  } else {
    // DDP waited for every bucket's future before the optimizer ran, so
    // this returns at once; it closes the engine's iteration.
    s = engine_->Finish();
  }
  if (s.ok()) s = engine_->StartIteration();
  if (s.ok()) s = InstallPlan();
  if (s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    reduced_ = 0;
    calls_mark_ = pg_comm_ != nullptr ? pg_comm_->allreduce_calls() : 0;
  }
  marked_ = 0;
  if (!s.ok()) {
    failed_ = s;
    FailPending(s);
  }
  return s;
}

double HookState::NowUs() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - epoch_)
      .count();
}

void HookState::OnGradReady(int param) {
  const double now = NowUs();
  std::lock_guard<std::mutex> lock(mu_);
  if (param < 0 || param >= static_cast<int>(grad_us_.size()) || grad_us_[param] >= 0) return;
  grad_us_[param] = now;
  grad_order_.push_back(param);
}

void HookState::OnBackwardEnd() {
  const double now = NowUs();
  std::lock_guard<std::mutex> lock(mu_);
  backward_done_us_ = now;
}

std::pair<int64_t, std::vector<int>> HookState::GradHooks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {hooks_version_, hooked_};
}

int HookState::LastReadyParam() const {
  std::lock_guard<std::mutex> lock(mu_);
  return order_.empty() ? -1 : order_.back();
}

absl::Status HookState::VerifyPlanAcrossRanks(const bucketing::Plan& plan) {
  // What Engine::SetPlan checks: every rank is about to give DDP the same
  // buckets (DDP itself would hang or fail inside gloo on a mismatch).
  const int n = comm_.size();
  const int64_t mine = static_cast<int64_t>(bucketing::PlanHash(plan));
  std::vector<int64_t> all(n, 0);
  absl::StatusOr<std::shared_ptr<comm::Work>> work =
      comm_.AllGather(&mine, all.data(), 1, comm::DataType::kInt64);
  if (!work.ok()) return work.status();
  if (absl::Status s = (*work)->WaitFor(options_.engine.timeout); !s.ok()) return s;
  std::vector<int> differ;
  for (int r = 0; r < n; ++r) {
    if (all[r] != mine) differ.push_back(r);
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat(
      "ranks disagree on the plan to install in DDP (\"%s\", %d buckets, on rank %d); ranks %s "
      "have another",
      plan.name, plan.buckets.size(), comm_.rank(), absl::StrJoin(differ, ",")));
}

absl::Status HookState::InstallNativePlan(bucketing::Plan plan) {
  const uint64_t hash = bucketing::PlanHash(plan);
  if (hash == plan_hash_ && !plan_.buckets.empty()) {
    plan_.name = plan.name;
    return absl::OkStatus();
  }
  std::vector<std::vector<size_t>> indices;
  for (const bucketing::Bucket& b : plan.buckets) {
    std::vector<size_t> bucket;
    for (const bucketing::Slice& s : b.slices) {
      if (s.offset != 0 || s.count != layout_->tensor(s.tensor).numel) {
        return absl::InternalError(absl::StrFormat(
            "plan \"%s\" splits parameter %s; DDP buckets hold whole parameters", plan.name,
            layout_->tensor(s.tensor).name));
      }
      bucket.push_back(static_cast<size_t>(order_[s.tensor]));
    }
    indices.push_back(std::move(bucket));
  }
  if (absl::Status s = VerifyPlanAcrossRanks(plan); !s.ok()) return s;
  try {
    reducer_->initialize_buckets(std::move(indices));
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("DDP refused the bucket assignment of plan \"", plan.name, "\": ", e.what()));
  }
  plan_ = std::move(plan);
  plan_hash_ = hash;
  std::lock_guard<std::mutex> lock(mu_);
  ++installs_;
  return absl::OkStatus();
}

absl::Status HookState::StartPolicy() {
  // Rank 0's order, as DDP itself rebuilds its buckets from rank 0's.
  std::vector<int64_t> order(order_.begin(), order_.end());
  absl::StatusOr<std::shared_ptr<comm::Work>> work =
      comm_.Broadcast(order.data(), order.size(), comm::DataType::kInt64, 0);
  if (!work.ok()) return work.status();
  if (absl::Status s = (*work)->WaitFor(options_.engine.timeout); !s.ok()) return s;
  std::vector<bool> seen(params_.size(), false);
  for (int64_t p : order) {
    if (p < 0 || p >= static_cast<int64_t>(params_.size()) || seen[p]) {
      return absl::InternalError("rank 0's gradient ready order is not a permutation of the "
                                 "parameters (do all ranks build the same model?)");
    }
    seen[p] = true;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    order_.assign(order.begin(), order.end());
  }
  absl::StatusOr<bucketing::GradientLayout> layout = LayoutInOrder(order_);
  if (!layout.ok()) return layout.status();
  layout_ = *std::move(layout);
  absl::StatusOr<autotune::PlanAndPolicy> made =
      autotune::CreatePlanPolicy(comm_, *layout_, options_.engine.timeout, Choice());
  if (!made.ok()) return made.status();
  policy_ = std::move(made->tuner);
  tuner_ = policy_.get();
  bucketing::Plan initial = std::move(made->initial);
  return InstallNativePlan(std::move(initial));
}

absl::Status HookState::ExcludeFromStep(double us) {
  if (!options_.native) {
    return absl::FailedPreconditionError(
        "excluding time from a step needs communicator=\"ddp\" (the engine of \"ucx\" and "
        "\"group\" times its own iterations)");
  }
  if (!(us >= 0) || !std::isfinite(us)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the time to exclude from a step must be finite and >= 0, not %g us", us));
  }
  std::lock_guard<std::mutex> step(step_mu_);
  excluded_us_ += us;
  return absl::OkStatus();
}

absl::Status HookState::OnForwardStartNative() {
  const double now = NowUs();
  const double excluded = std::exchange(excluded_us_, 0.0);
  std::vector<int> fired;
  std::vector<double> at;
  double backward_done = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fired.swap(grad_order_);
    at.swap(grad_us_);
    grad_us_.assign(params_.size(), -1.0);
    backward_done = std::exchange(backward_done_us_, -1.0);
    if (!fired.empty()) {
      ++iterations_;
      if (policy_ == nullptr && layout_ == std::nullopt) ++passthrough_;
    }
  }
  if (fired.empty()) {
    // The first step, or a forward with no backward since the last one
    // (evaluation with grad enabled): the step goes on.
    if (layout_ == std::nullopt) return absl::OkStatus();
    if (start_us_ > 0) return absl::OkStatus();
    start_us_ = now;
    return absl::OkStatus();
  }
  if (layout_ == std::nullopt) {
    // Learning: DDP rebuilds its buckets in ready order at its second
    // forward; fusebox installs its own from the third on, so that the
    // rebuild never replaces them.
    if (++learned_iterations_ < 2) return absl::OkStatus();
    std::vector<bool> seen(params_.size(), false);
    std::vector<int> order = fired;
    for (int p : fired) seen[p] = true;
    for (size_t p = 0; p < params_.size(); ++p) {  // unused ones: last, as DDP places them
      if (!seen[p]) order.push_back(static_cast<int>(p));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);  // Snapshot reads order_ under mu_
      order_ = std::move(order);
    }
    if (absl::Status s = StartPolicy(); !s.ok()) return s;
    start_us_ = now;
  } else {
    bucketing::IterationStats st;
    st.iteration = history_.empty() ? 0 : history_.back().iteration + 1;
    st.start_us = start_us_;
    st.buckets = static_cast<int>(plan_.buckets.size());
    st.ready_us.assign(order_.size(), 0.0);
    double last = start_us_;
    for (size_t pos = 0; pos < order_.size(); ++pos) {
      const double t = at[order_[pos]];
      if (t < 0) continue;
      st.ready_us[pos] = t - start_us_;
      last = std::max(last, t);
    }
    st.backward_end_us = last;
    // DDP's backward returns once its buckets are reduced (OnBackwardEnd);
    // without that mark the communication left is not seen: 0.
    st.finish_us = backward_done >= last ? backward_done : last;
    // Time the caller excluded (ExcludeFromStep) came after this step's
    // backward: the step ends that much earlier, never before its backward.
    st.next_start_us = std::max(last, now - excluded);
    if (policy_ != nullptr) {
      absl::StatusOr<std::optional<bucketing::Plan>> next = policy_->OnIterationEnd(st, plan_);
      if (!next.ok()) return next.status();
      if (next->has_value()) {
        if (absl::Status s = InstallNativePlan(**std::move(next)); !s.ok()) return s;
      }
    }
    history_.push_back(std::move(st));
    while (history_.size() > options_.engine.stats_history) history_.pop_front();
    start_us_ = now;
  }
  // Every gradient is timed while the order or the tuner's profile is being
  // learned; afterwards only the first and the last to become ready.
  std::vector<int> want;
  if (tuner_ != nullptr && tuner_->phase() == autotune::TunerPhase::kProfiling) {
    want = order_;
  } else {
    want = {order_.front(), order_.back()};
    if (want[0] == want[1]) want.pop_back();
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (want != hooked_) {
    hooked_ = std::move(want);
    ++hooks_version_;
  }
  return absl::OkStatus();
}

absl::Status HookState::CheckBucketAcrossRanks(size_t index,
                                               const std::pair<int64_t, comm::DataType>& bucket) {
  const int n = comm_.size();
  const int64_t mine[3] = {static_cast<int64_t>(index), bucket.first,
                           static_cast<int64_t>(bucket.second)};
  std::vector<int64_t> all(3 * n);
  absl::StatusOr<std::shared_ptr<comm::Work>> work =
      comm_.AllGather(mine, all.data(), 3, comm::DataType::kInt64);
  if (!work.ok()) return work.status();
  if (absl::Status s = (*work)->WaitFor(options_.engine.timeout); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("checking DDP bucket ", index,
                                               " across ranks: ", s.message()));
  }
  std::vector<std::string> differ;
  for (int r = 0; r < n; ++r) {
    if (all[3 * r] != mine[0] || all[3 * r + 1] != mine[1] || all[3 * r + 2] != mine[2]) {
      differ.push_back(absl::StrFormat("rank %d has bucket %d with %d elements of %s", r,
                                       all[3 * r], all[3 * r + 1],
                                       comm::DataTypeName(static_cast<comm::DataType>(all[3 * r + 2]))));
    }
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "ranks disagree on DDP's buckets: rank %d has bucket %d with %d elements of %s, but %s "
      "(do all ranks build the same model with the same DDP options?)",
      comm_.rank(), index, bucket.first, comm::DataTypeName(bucket.second),
      absl::StrJoin(differ, "; ")));
}

FuturePtr HookState::RunHook(::c10d::GradBucket& bucket) {
  FuturePtr future = NewFuture();
  const size_t index = compat::BucketIndex(bucket);
  const bool last = compat::BucketIsLast(bucket);
  at::Tensor& buffer = compat::BucketBuffer(bucket);
  auto fail = [&](const absl::Status& s) {
    if (failed_.ok()) failed_ = s;
    FailPending(s);
    SetError(future, s);
    return future;
  };
  if (!failed_.ok()) return fail(failed_);
  if (!buffer.device().is_cpu() || !buffer.is_contiguous() || buffer.is_sparse()) {
    return fail(absl::UnimplementedError(absl::StrFormat(
        "DDP bucket %d is %s%s; this build reduces dense contiguous CPU buckets only", index,
        buffer.device().str(), buffer.is_contiguous() ? "" : " and not contiguous")));
  }
  absl::StatusOr<comm::DataType> type = FromScalarType(buffer.scalar_type());
  if (!type.ok()) return fail(type.status());
  if (index == 0) {
    seen_.clear();
    seen_params_.clear();
    std::lock_guard<std::mutex> lock(mu_);
    ++iterations_;
    if (engine_ == nullptr) ++passthrough_;
  } else if (seen_.size() != index) {
    return fail(absl::InternalError(absl::StrFormat(
        "DDP handed bucket %d after %d buckets of this iteration (expected bucket order)", index,
        seen_.size())));
  }
  seen_.emplace_back(buffer.numel(), *type);

  if (engine_ == nullptr) {
    // Learning (Note [DDP buckets are the plan's buckets]): DDP's own
    // allreduce, averaged, after checking that every rank has this bucket.
    if (absl::Status s = CheckBucketAcrossRanks(index, seen_.back()); !s.ok()) return fail(s);
    absl::StatusOr<std::vector<int>> params = BucketParams(bucket);
    if (!params.ok()) return fail(params.status());
    seen_params_.insert(seen_params_.end(), params->begin(), params->end());
    if (last && ++learned_iterations_ >= 2 && seen_params_.size() == params_.size()) {
      // DDP rebuilt its buckets in ready order for its second iteration.
      std::lock_guard<std::mutex> lock(mu_);
      order_ = seen_params_;
      start_engine_ = true;
    }
    buffer.div_(comm_.size());  // as DDP does: divide, then sum
    absl::StatusOr<std::shared_ptr<comm::Work>> work = comm_.AllReduce(
        buffer.data_ptr(), buffer.data_ptr(), buffer.numel(), *type, comm::ReduceOp::kSum);
    if (!work.ok()) return fail(work.status());
    (*work)->OnComplete([future, buffer](const absl::Status& s) {
      if (s.ok()) {
        future->markCompleted(c10::IValue(buffer));
      } else {
        SetError(future, s);
      }
    });
    return future;
  }

  {
    std::lock_guard<std::mutex> lock(mu_);
    if (index >= futures_.size()) {
      return fail(absl::FailedPreconditionError(absl::StrFormat(
          "DDP handed bucket %d but plan \"%s\" installed in it has %d buckets (was the DDP "
          "model called without its forward pre-hook?)",
          index, engine_->plan().name, futures_.size())));
    }
    futures_[index] = future;
    buffers_[index] = buffer;
  }
  ++marked_;
  buffer.div_(comm_.size());  // then summed by the engine (see the constructor)
  if (absl::Status s = engine_->MarkBucketReady(static_cast<int>(index), buffer.data_ptr(),
                                                buffer.numel());
      !s.ok()) {
    return fail(s);
  }
  return future;
}

absl::Status HookState::ForcePlan(const std::string& spec, bool checks) {
  std::lock_guard<std::mutex> step(step_mu_);
  if (tuner_ == nullptr) return absl::FailedPreconditionError("no tuner is running");
  absl::StatusOr<bucketing::Plan> plan;
  if (absl::string_view index = spec; absl::ConsumePrefix(&index, "candidate:")) {
    int i = -1;
    const bucketing::Plan* measured =
        absl::SimpleAtoi(index, &i) ? tuner_->measured_plan(i) : nullptr;
    if (measured == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "force plan \"%s\": the tuner measured %d plans (candidate:0 .. candidate:%d)", spec,
          tuner_->measured().size(), static_cast<int>(tuner_->measured().size()) - 1));
    }
    plan = *measured;
  } else {
    plan = FixedPlan(spec, engine_ != nullptr ? engine_->layout() : *layout_);
    if (!plan.ok()) return plan.status();
  }
  plan->name = absl::StrCat("forced-", spec);
  tuner_->ForceChosen(*std::move(plan), checks);
  return absl::OkStatus();
}

bool HookState::TimesNextBoundary() const {
  std::lock_guard<std::mutex> step(step_mu_);
  if (!options_.fixed_plan.empty()) return false;
  return tuner_ == nullptr || tuner_->TimesNextBoundary();
}

std::string HookState::SummaryLine() const {
  std::lock_guard<std::mutex> step(step_mu_);
  if (tuner_ == nullptr || tuner_->phase() != autotune::TunerPhase::kTuned ||
      tuner_->chosen() <= 0) {
    return "";
  }
  return tuner_->Summary().Line();
}

uint64_t HookState::PlanHash() const {
  std::lock_guard<std::mutex> step(step_mu_);
  if (engine_ != nullptr) return bucketing::PlanHash(engine_->plan());
  if (layout_ != std::nullopt) return bucketing::PlanHash(plan_);
  return 0;
}

HookSnapshot HookState::Snapshot() const {
  HookSnapshot snap;
  // The engine and the tuner change only under step_mu_ (their accessors
  // take the engine's own lock). mu_ is taken last and alone: completion
  // callbacks take it inside the engine's lock, so holding it while
  // calling into the engine could deadlock.
  std::lock_guard<std::mutex> step(step_mu_);
  if (engine_ != nullptr) {
    snap.plan = engine_->plan();
    snap.stats = engine_->stats();
    snap.phase = HookPhase::kFixed;
  } else if (layout_ != std::nullopt) {
    snap.plan = plan_;
    snap.stats.assign(history_.begin(), history_.end());
    snap.phase = HookPhase::kFixed;
  }
  if (tuner_ != nullptr) {
    switch (tuner_->phase()) {
      case autotune::TunerPhase::kCheckingHit: snap.phase = HookPhase::kVerifying; break;
      case autotune::TunerPhase::kProfiling: snap.phase = HookPhase::kProfiling; break;
      case autotune::TunerPhase::kScreening: snap.phase = HookPhase::kScreening; break;
      case autotune::TunerPhase::kVerifying: snap.phase = HookPhase::kVerifying; break;
      case autotune::TunerPhase::kTuned: snap.phase = HookPhase::kTuned; break;
    }
    snap.cache_hit = tuner_->cache_hit();
    snap.derived_from_cache = tuner_->derived_from_cache();
    snap.tuning_iterations = tuner_->tuning_iterations();
    snap.tuning_cost_ms = tuner_->tuning_cost_us() / 1e3;
    snap.checks = tuner_->checks();
    snap.fallbacks = tuner_->fallbacks();
    snap.decision = tuner_->decision();
    const autotune::CostModel& model = tuner_->cost_model();
    if (!model.name.empty()) snap.cost_model = absl::StrCat(model.Describe(), "; ", model.source);
    if (tuner_->phase() == autotune::TunerPhase::kTuned && tuner_->chosen() > 0) {
      snap.summary = tuner_->Summary().Line();
    }
    snap.hit_check_iterations = tuner_->hit_check_iterations();
    snap.seed = tuner_->seed();
    snap.measured = tuner_->measured();
    snap.chosen = tuner_->chosen();
    snap.cache_key = tuner_->key().FileName();
  }
  snap.backend = comm_.backend();
  std::lock_guard<std::mutex> lock(mu_);
  for (int p : order_) {
    snap.layout.push_back(params_[p].numel());
    snap.names.push_back(names_[p]);
  }
  snap.iterations = iterations_;
  snap.passthrough_iterations = passthrough_;
  snap.plan_installs = installs_;
  snap.last_allreduce_counts = last_counts_;
  return snap;
}

absl::Status HookState::WriteTimeline(const std::string& path) const {
  std::lock_guard<std::mutex> step(step_mu_);
  if (options_.native) {
    return absl::FailedPreconditionError(
        "communicator='ddp' runs DDP's own reduction and records no per-bucket timeline; "
        "register with communicator='process_group' or 'ucx' for one");
  }
  if (engine_ == nullptr) {
    return absl::FailedPreconditionError("no engine iteration has run yet (the hook is learning "
                                         "DDP's gradient order)");
  }
  if (engine_->timeline() == nullptr) {
    return absl::FailedPreconditionError("the timeline was not enabled at registration");
  }
  return engine_->timeline()->WriteChromeTrace(path, comm_.rank(),
                                               absl::StrCat("rank ", comm_.rank()));
}

absl::StatusOr<std::shared_ptr<HookState>> RegisterDdpBuckets(
    ::c10d::Reducer& reducer, std::vector<at::Tensor> params, std::vector<std::string> names,
    std::shared_ptr<comm::Communicator> comm, HookOptions options) {
  if (params.empty() || names.size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fusebox needs DDP's parameters and one name each (got %d parameters, %d names)",
        params.size(), names.size()));
  }
  options.native = true;
  return std::make_shared<HookState>(&reducer, std::move(params), std::move(names),
                                     std::move(comm), nullptr, std::move(options));
}

absl::StatusOr<std::shared_ptr<HookState>> RegisterCommHook(
    ::c10d::Reducer& reducer, std::vector<at::Tensor> params, std::vector<std::string> names,
    std::shared_ptr<comm::Communicator> comm, ProcessGroupCommunicator* pg_comm,
    HookOptions options) {
  if (params.empty() || names.size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the hook needs DDP's parameters and one name each (got %d parameters, %d names)",
        params.size(), names.size()));
  }
  auto state = std::make_shared<HookState>(&reducer, std::move(params), std::move(names),
                                           std::move(comm), pg_comm, std::move(options));
  try {
    reducer.register_comm_hook(std::make_unique<FuseboxCommHook>(state));
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(
        absl::StrCat("DDP refused the fusebox hook (a model takes one communication hook, "
                     "registered before the first backward): ",
                     e.what()));
  }
  return state;
}

}  // namespace fusebox::torch_plugin
