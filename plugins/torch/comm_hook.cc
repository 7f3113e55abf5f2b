#include "plugins/torch/comm_hook.h"

#include <exception>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
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

absl::StatusOr<bucketing::Plan> FixedPlan(const std::string& spec,
                                          const bucketing::GradientLayout& layout) {
  if (spec == "ddp") return bucketing::DdpPlan(layout);
  if (spec == "per-tensor") return bucketing::PerTensorPlan(layout);
  return bucketing::ReadPlanFile(spec, layout);
}

const char* HookPhaseName(HookPhase phase) {
  switch (phase) {
    case HookPhase::kLearning: return "learning";
    case HookPhase::kMeasuring: return "measuring";
    case HookPhase::kTuned: return "tuned";
    case HookPhase::kFixed: return "fixed";
  }
  return "unknown";
}

HookState::HookState(std::shared_ptr<comm::Communicator> comm, ProcessGroupCommunicator* pg_comm,
                     HookOptions options)
    : comm_owner_(std::move(comm)),
      comm_(*comm_owner_),
      pg_comm_(pg_comm),
      options_(std::move(options)) {
  if (!options_.cache_dir.empty() && options_.fixed_plan.empty()) {
    autotune::PolicyCacheOptions cache_options;
    cache_options.dir = options_.cache_dir;
    cache_options.warn = options_.log;
    cache_ = std::make_unique<autotune::PolicyCache>(std::move(cache_options));
  }
  options_.engine.on_tensor_reduced = [this](int id) { OnTensorReduced(id); };
  options_.tuner.cache = cache_.get();
  if (!options_.tuner.log) options_.tuner.log = options_.log;
  if (options_.tuner.backend == "unknown") options_.tuner.backend = comm_.backend();
}

HookState::~HookState() = default;

void HookState::Log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

bucketing::Engine* HookState::engine() const {
  if (tuner_) return &tuner_->engine();
  return fixed_.get();
}

void HookState::OnTensorReduced(int id) {
  FuturePtr future;
  at::Tensor buffer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (id < 0 || id >= static_cast<int>(futures_.size()) || !futures_[id]) return;
    future = std::move(futures_[id]);
    buffer = std::move(buffers_[id]);
    if (++reduced_ == static_cast<int>(futures_.size()) && pg_comm_ != nullptr) {
      // Every bucket of the engine iteration is reduced: every AllReduce it
      // issued is in the log, and the tuner's own have not started.
      last_counts_ = pg_comm_->AllReduceCountsSince(calls_mark_);
    }
  }
  // Outside the lock: completion runs the future's callbacks inline.
  future->markCompleted(c10::IValue(std::move(buffer)));
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

absl::Status HookState::StartEngine() {
  std::vector<bucketing::TensorSpec> specs;
  for (size_t i = 0; i < layout_.size(); ++i) {
    specs.push_back(bucketing::TensorSpec{absl::StrCat("ddp_bucket_", i), layout_[i].first,
                                          layout_[i].second, comm::MemoryKind::kHost});
  }
  absl::StatusOr<bucketing::GradientLayout> layout =
      bucketing::GradientLayout::Create(std::move(specs));
  if (!layout.ok()) return layout.status();
  std::unique_ptr<autotune::OnlineTuner> tuner;
  std::unique_ptr<bucketing::Engine> fixed;
  if (options_.fixed_plan.empty()) {
    absl::StatusOr<std::unique_ptr<autotune::OnlineTuner>> t =
        autotune::OnlineTuner::Create(comm_, *layout, options_.engine, options_.tuner);
    if (!t.ok()) return t.status();
    tuner = std::move(*t);
  } else {
    absl::StatusOr<bucketing::Plan> plan = FixedPlan(options_.fixed_plan, *layout);
    if (!plan.ok()) return plan.status();
    absl::StatusOr<std::unique_ptr<bucketing::Engine>> e =
        bucketing::Engine::Create(comm_, *layout, *std::move(plan), options_.engine);
    if (!e.ok()) return e.status();
    fixed = std::move(*e);
  }
  std::lock_guard<std::mutex> lock(mu_);
  tuner_ = std::move(tuner);
  fixed_ = std::move(fixed);
  return absl::OkStatus();
}

absl::Status HookState::BeginIteration(const at::Tensor& first) {
  seen_.clear();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++iterations_;
  }
  absl::StatusOr<comm::DataType> type = FromScalarType(first.scalar_type());
  const bool matches = !layout_.empty() && type.ok() && layout_[0].first == first.numel() &&
                       layout_[0].second == *type;
  if (!matches) {
    if (engine() != nullptr) {
      Log("fusebox DDP hook: DDP's buckets changed; relearning the layout");
      std::lock_guard<std::mutex> lock(mu_);
      tuner_.reset();
      fixed_.reset();
    }
    engine_mode_ = false;
    std::lock_guard<std::mutex> lock(mu_);
    ++passthrough_;
    return absl::OkStatus();
  }
  if (engine() == nullptr) {
    if (absl::Status s = StartEngine(); !s.ok()) return s;
  }
  engine_mode_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  futures_.assign(layout_.size(), FuturePtr());
  buffers_.assign(layout_.size(), at::Tensor());
  reduced_ = 0;
  calls_mark_ = pg_comm_ != nullptr ? pg_comm_->allreduce_calls() : 0;
  return absl::OkStatus();
}

absl::Status HookState::FinishEngine() {
  absl::Status s = tuner_ ? tuner_->Finish() : fixed_->Finish();
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < futures_.size(); ++i) {
    if (futures_[i]) {
      return absl::InternalError(absl::StrFormat(
          "DDP bucket %d was not reported reduced although the iteration finished", i));
    }
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
    if (absl::Status s = BeginIteration(buffer); !s.ok()) return fail(s);
  } else if (seen_.size() != index) {
    return fail(absl::InternalError(absl::StrFormat(
        "DDP handed bucket %d after %d buckets of this iteration (expected bucket order)", index,
        seen_.size())));
  }
  seen_.emplace_back(buffer.numel(), *type);

  if (!engine_mode_) {
    // Pass-through: DDP's own allreduce, averaged (Note [DDP buckets as
    // fusebox tensors]), after checking that every rank has this bucket.
    if (absl::Status s = CheckBucketAcrossRanks(index, seen_.back()); !s.ok()) return fail(s);
    if (last) layout_ = seen_;
    absl::StatusOr<std::shared_ptr<comm::Work>> work = comm_.AllReduce(
        buffer.data_ptr(), buffer.data_ptr(), buffer.numel(), *type, comm::ReduceOp::kAvg);
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

  if (index >= layout_.size() || layout_[index] != seen_.back() ||
      (last && index + 1 != layout_.size())) {
    return fail(absl::FailedPreconditionError(absl::StrFormat(
        "DDP's bucket %d (%d elements) does not match the layout fusebox is running (%d buckets"
        "%s); DDP changed its buckets in the middle of an iteration",
        index, buffer.numel(), layout_.size(),
        index < layout_.size() ? absl::StrFormat(", bucket %d has %d elements", index,
                                                 layout_[index].first)
                               : "")));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    futures_[index] = future;
    buffers_[index] = buffer;
  }
  if (absl::Status s = engine()->MarkReady(static_cast<int>(index), buffer.data_ptr(),
                                           buffer.numel());
      !s.ok()) {
    return fail(s);
  }
  if (last) {
    if (absl::Status s = FinishEngine(); !s.ok()) return fail(s);
  }
  return future;
}

HookSnapshot HookState::Snapshot() const {
  HookSnapshot snap;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [numel, type] : layout_) snap.layout.push_back(numel);
  snap.iterations = iterations_;
  snap.passthrough_iterations = passthrough_;
  snap.last_allreduce_counts = last_counts_;
  snap.backend = comm_.backend();
  const bucketing::Engine* e = tuner_ ? &tuner_->engine() : fixed_.get();
  if (e != nullptr) {
    snap.plan = e->plan();
    snap.stats = e->stats();
  }
  if (tuner_) {
    snap.phase = tuner_->phase() == autotune::TunerPhase::kTuned ? HookPhase::kTuned
                                                                 : HookPhase::kMeasuring;
    snap.cache_hit = tuner_->cache_hit();
    snap.derived_from_cache = tuner_->derived_from_cache();
    snap.tuning_iterations = tuner_->tuning_iterations();
    snap.retunes = tuner_->retunes();
    snap.measured = tuner_->measured();
    snap.chosen = tuner_->chosen();
    snap.cache_key = tuner_->key().FileName();
  } else if (fixed_) {
    snap.phase = HookPhase::kFixed;
  }
  return snap;
}

absl::Status HookState::WriteTimeline(const std::string& path) const {
  std::lock_guard<std::mutex> lock(mu_);
  bucketing::Engine* e = tuner_ ? &tuner_->engine() : fixed_.get();
  if (e == nullptr) {
    return absl::FailedPreconditionError("no engine iteration has run yet (the hook is learning "
                                         "DDP's bucket layout)");
  }
  if (e->timeline() == nullptr) {
    return absl::FailedPreconditionError("the timeline was not enabled at registration");
  }
  return e->timeline()->WriteChromeTrace(path, comm_.rank(),
                                         absl::StrCat("rank ", comm_.rank()));
}

absl::StatusOr<std::shared_ptr<HookState>> RegisterCommHook(::c10d::Reducer& reducer,
                                                            std::shared_ptr<comm::Communicator> comm,
                                                            ProcessGroupCommunicator* pg_comm,
                                                            HookOptions options) {
  auto state = std::make_shared<HookState>(std::move(comm), pg_comm, std::move(options));
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
