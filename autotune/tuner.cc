#include "autotune/tuner.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "autotune/measure.h"
#include "bucketing/plan_io.h"
#include "bucketing/planners.h"
#include "fusebox/config.h"
#include "nlohmann/json.hpp"

namespace fusebox::autotune {

namespace {

using bucketing::Plan;
using json = nlohmann::json;

constexpr size_t kMaxBroadcastBytes = size_t{256} << 20;
constexpr int64_t kMaxCalibrationBytes = int64_t{256} << 20;
constexpr int64_t kMinCalibrationBytes = int64_t{1} << 20;

// The profile rank 0 searches with: the layout's gradients with the slowest
// rank's median ready times (made non-decreasing: the layout is in ready
// order by contract, clocks jitter).
Profile ProfileFromMeasurement(const bucketing::GradientLayout& layout, const std::string& model,
                               double backward_us, const std::vector<double>& ready_us) {
  Profile p;
  p.model = model.empty() ? "online" : model;
  p.description = "measured online by fusebox's tuner";
  p.forward_us = 1;  // not observed; plans do not change it
  double clock = 0;
  for (int id = 0; id < layout.size(); ++id) {
    ProfileTensor t;
    t.name = layout.tensor(id).name;
    t.shape = {layout.tensor(id).numel};
    t.dtype = layout.tensor(id).dtype;
    clock = std::max(clock, std::max(0.0, ready_us[id]));
    t.ready_us = clock;
    p.tensors.push_back(std::move(t));
  }
  p.backward_us = std::max({backward_us, clock, 1.0});
  return p;
}

}  // namespace

OnlineTuner::OnlineTuner(comm::Communicator& comm, bucketing::GradientLayout layout,
                         TunerOptions options)
    : comm_(comm), layout_(std::move(layout)), options_(std::move(options)) {}

void OnlineTuner::Log(const std::string& line) const {
  if (options_.log && comm_.rank() == 0) options_.log(line);
}

absl::StatusOr<std::unique_ptr<OnlineTuner>> OnlineTuner::Create(
    comm::Communicator& comm, bucketing::GradientLayout layout,
    bucketing::EngineOptions engine_options, TunerOptions options) {
  if (options.candidates < 1 || options.candidates_when_derived < 0 ||
      options.warmup_iterations < 0 || options.measure_iterations < 1) {
    return absl::InvalidArgumentError(
        "tuner: needs candidates >= 1, candidates_when_derived >= 0, warm-up >= 0 and measured "
        "iterations >= 1");
  }
  if (options.drift_window < 0 || options.drift_windows < 1 || !(options.drift_threshold >= 0)) {
    return absl::InvalidArgumentError(
        "tuner: drift window must be >= 0, windows >= 1 and the threshold >= 0");
  }
  if (options.cost_model.has_value()) {
    if (absl::Status s = options.cost_model->Validate(); !s.ok()) return s;
  }
  if (options.calibration_max_bytes < 0) {
    return absl::InvalidArgumentError("tuner: calibration_max_bytes is negative");
  }
  if (layout.size() == 0) return absl::InvalidArgumentError("tuner: the layout has no gradients");
  options.planner.sim.world_size = comm.size();
  if (options.ranks_per_node <= 0) options.ranks_per_node = comm.size();
  std::unique_ptr<OnlineTuner> t(new OnlineTuner(comm, std::move(layout), std::move(options)));
  t->key_ = CacheKey{ModelSignature(t->layout_), comm.size(), t->options_.ranks_per_node,
                     t->options_.backend, t->options_.network};
  if (absl::Status s = t->key_.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tuner: cache key: ", s.message()));
  }
  engine_options.record_ready_times = true;
  t->engine_options_ = engine_options;

  // Every rank must tune the same model: checked first, so that a rank
  // whose model differs fails everywhere before any plan is looked at (a
  // plan that fits rank 0 but not this rank would otherwise fail here only).
  {
    const int64_t mine = static_cast<int64_t>(t->layout_.Hash());
    std::vector<int64_t> all(comm.size(), 0);
    auto work = comm.AllGather(&mine, all.data(), 1, comm::DataType::kInt64);
    if (!work.ok()) return work.status();
    if (absl::Status s = (*work)->WaitFor(engine_options.timeout); !s.ok()) return s;
    std::string differ;
    for (int r = 1; r < comm.size(); ++r) {
      if (all[r] != all[0]) absl::StrAppend(&differ, differ.empty() ? "" : ", ", r);
    }
    if (!differ.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tuner (rank ", comm.rank(), "): the gradient layout of rank(s) ", differ,
          " differs from rank 0's: every rank must register the same model"));
    }
  }

  // Step 1: rank 0 consults the cache; every rank gets its answer.
  std::string message;
  if (comm.rank() == 0 && t->options_.cache != nullptr && t->options_.cache->enabled()) {
    if (auto hit = t->options_.cache->Lookup(t->key_, t->layout_)) {
      message = "H" + SerializeCacheEntry(*hit);
    } else if (auto near = t->options_.cache->Nearest(t->key_, t->layout_)) {
      message = absl::StrCat("N", near->key.world_size, "\n",
                             bucketing::SerializePlan(near->plan, &t->layout_));
    }
  }
  if (absl::Status s = BroadcastBytes(comm, message, 0, kMaxBroadcastBytes, engine_options.timeout);
      !s.ok()) {
    return s;
  }
  if (!message.empty() && message[0] == 'H') {
    auto entry = ParseCacheEntry(absl::string_view(message).substr(1));
    if (!entry.ok()) return entry.status();
    if (absl::Status s = bucketing::ValidatePlan(t->layout_, entry->plan); !s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("tuner: the cached plan from rank 0 does not fit this rank's model: ",
                       s.message()));
    }
    entry->plan.name = "cached";
    auto e = bucketing::Engine::Create(comm, t->layout_, entry->plan, engine_options);
    if (!e.ok()) return e.status();
    t->engine_ = *std::move(e);
    t->cache_hit_ = true;
    t->phase_ = TunerPhase::kTuned;
    t->reference_us_ = entry->measured_iteration_us;
    t->Log(absl::StrFormat("fusebox tuner: cache hit %s: %d buckets, measured %.3f ms when tuned; "
                           "0 tuning iterations",
                           t->key_.FileName(), entry->plan.buckets.size(),
                           entry->measured_iteration_us / 1e3));
    return t;
  }
  if (!message.empty() && message[0] == 'N') {
    const size_t nl = message.find('\n');
    int world = 0;
    if (nl == std::string::npos || !absl::SimpleAtoi(message.substr(1, nl - 1), &world)) {
      return absl::InvalidArgumentError("tuner: malformed seed plan from rank 0");
    }
    auto plan = bucketing::ParsePlan(absl::string_view(message).substr(nl + 1));
    if (!plan.ok()) return plan.status();
    if (absl::Status s = bucketing::ValidatePlan(t->layout_, *plan); !s.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tuner: the seed plan from rank 0 does not fit this rank's model: ", s.message()));
    }
    plan->name = absl::StrCat("cached-w", world);
    t->nearest_plan_ = *std::move(plan);
    t->derived_ = true;
    t->Log(absl::StrFormat("fusebox tuner: no entry for %d ranks; seeding the search with the "
                           "plan cached for %d ranks",
                           comm.size(), world));
  }
  if (absl::Status s = t->StartTuning(); !s.ok()) return s;
  return t;
}

absl::Status OnlineTuner::SwitchTo(Plan plan) {
  if (engine_ == nullptr) {
    auto e = bucketing::Engine::Create(comm_, layout_, std::move(plan), engine_options_);
    if (!e.ok()) return e.status();
    engine_ = *std::move(e);
    return absl::OkStatus();
  }
  if (plan == engine_->plan()) return absl::OkStatus();
  return engine_->SetPlan(std::move(plan));
}

absl::Status OnlineTuner::StartTuning() {
  phase_ = TunerPhase::kMeasuring;
  tuning_iterations_ = 0;
  Plan ddp = bucketing::DdpPlan(layout_);
  plans_ = {ddp};
  measured_ = {MeasuredPlan{"ddp", bucketing::PlanHash(ddp), 0, 0}};
  current_ = 0;
  steps_ = 0;
  times_.clear();
  backward_.clear();
  ready_.clear();
  chosen_ = -1;
  window_.clear();
  windows_over_ = 0;
  return SwitchTo(std::move(ddp));
}

absl::Status OnlineTuner::Finish() {
  if (absl::Status s = engine_->Finish(); !s.ok()) return s;
  const bucketing::IterationStats st = engine_->last_stats();
  if (phase_ == TunerPhase::kTuned) return CheckDrift(st.iteration_us());
  ++tuning_iterations_;
  if (++steps_ > options_.warmup_iterations) {
    times_.push_back(st.iteration_us());
    if (current_ == 0) {
      backward_.push_back(st.backward_us());
      ready_.push_back(st.ready_us);
    }
  }
  if (steps_ < options_.warmup_iterations + options_.measure_iterations) return absl::OkStatus();
  return EndOfPlan();
}

absl::Status OnlineTuner::EndOfPlan() {
  const int m = static_cast<int>(times_.size());
  std::vector<double> v = times_;
  if (current_ == 0) {
    v.push_back(Median(backward_));
    for (int id = 0; id < layout_.size(); ++id) {
      std::vector<double> r;
      for (const std::vector<double>& it : ready_) r.push_back(id < static_cast<int>(it.size()) ? it[id] : 0);
      v.push_back(Median(std::move(r)));
    }
  }
  if (absl::Status s = MaxAcrossRanks(comm_, v); !s.ok()) return s;
  measured_[current_].measured_us = Median(std::vector<double>(v.begin(), v.begin() + m));
  Log(absl::StrFormat("fusebox tuner: %-16s %4d buckets: %.3f ms measured%s", measured_[current_].name,
                      plans_[current_].buckets.size(), measured_[current_].measured_us / 1e3,
                      measured_[current_].predicted_us > 0
                          ? absl::StrFormat(", %.3f ms predicted",
                                            measured_[current_].predicted_us / 1e3)
                          : ""));
  if (current_ == 0) {
    std::vector<double> ready(v.begin() + m + 1, v.end());
    if (absl::Status s = Search(v[m], ready); !s.ok()) return s;
  }
  times_.clear();
  ++current_;
  steps_ = 0;
  if (current_ < static_cast<int>(plans_.size())) return SwitchTo(plans_[current_]);
  return Conclude();
}

absl::Status OnlineTuner::Search(double backward_us, const std::vector<double>& ready_us) {
  const absl::Duration timeout = engine_options_.timeout;
  // The cost model: given, or fitted to this communicator (every rank
  // takes part in the measurement and gets the same samples).
  if (options_.cost_model.has_value()) {
    cost_ = *options_.cost_model;
  } else {
    // At least 1 MiB even for a small model: below that, latency and
    // noise hide the bandwidth term the fit needs.
    const int64_t cap =
        options_.calibration_max_bytes > 0
            ? options_.calibration_max_bytes
            : std::clamp(layout_.total_bytes(), kMinCalibrationBytes, kMaxCalibrationBytes);
    auto samples = MeasureAllReduce(comm_, CalibrationSizes(cap), 3);
    if (!samples.ok()) return samples.status();
    auto fitted = FitCostModel(*samples, options_.ranks_per_node,
                               absl::StrCat("measured on ", options_.backend, ", ", comm_.size(),
                                            " ranks, by the online tuner"));
    if (!fitted.ok()) {
      // Every rank has the same samples (slowest rank), so every rank gets
      // here: no candidates, and the measured default is kept.
      Log(absl::StrCat("fusebox tuner: warning: no cost model fits this communicator's "
                       "allreduce times (",
                       fitted.status().message(), "); keeping DDP's default plan"));
      return absl::OkStatus();
    }
    cost_ = MeasuredAt(*fitted, *samples, comm_.size());
  }
  // Rank 0 searches and broadcasts the candidates with their hashes.
  std::string message;
  if (comm_.rank() == 0) {
    const Profile profile =
        ProfileFromMeasurement(layout_, options_.model_label, backward_us, ready_us);
    std::vector<Plan> seeds;
    if (nearest_plan_.has_value()) seeds.push_back(*nearest_plan_);
    if (retunes_ > 0 && chosen_plan_.has_value()) {
      seeds.push_back(*chosen_plan_);
      seeds.back().name = "previous";
    }
    const int want = (derived_ ? options_.candidates_when_derived : options_.candidates) +
                     static_cast<int>(seeds.size());
    auto ranked = RankCandidates(profile, cost_, options_.planner, want + 1, seeds);
    if (!ranked.ok()) return ranked.status();
    const uint64_t ddp_hash = measured_[0].hash;
    absl::flat_hash_set<uint64_t> seed_hashes;
    for (const Plan& s : seeds) seed_hashes.insert(bucketing::PlanHash(s));
    json list = json::array();
    auto push = [&](const PlanPrediction& c) {
      list.push_back({{"name", c.name},
                      {"hash", absl::StrFormat("%016x", bucketing::PlanHash(c.plan))},
                      {"predicted_us", c.sim.iteration_us - c.sim.forward_us},
                      {"plan", bucketing::SerializePlan(c.plan, &layout_)}});
    };
    // Seeds first (always measured), then the others in RankCandidates' order.
    for (const PlanPrediction& c : *ranked) {
      const uint64_t h = bucketing::PlanHash(c.plan);
      if (seed_hashes.contains(h) && h != ddp_hash) push(c);
    }
    for (const PlanPrediction& c : *ranked) {
      const uint64_t h = bucketing::PlanHash(c.plan);
      if (static_cast<int>(list.size()) >= want) break;
      if (h != ddp_hash && !seed_hashes.contains(h)) push(c);
    }
    auto ddp_sim = Simulate(profile, plans_[0], cost_, options_.planner.sim);
    if (!ddp_sim.ok()) return ddp_sim.status();
    message = json{{"default_predicted_us", ddp_sim->iteration_us - ddp_sim->forward_us},
                   {"cost_model", SerializeCostModel(cost_)},
                   {"candidates", list}}
                  .dump();
  }
  if (absl::Status s = BroadcastBytes(comm_, message, 0, kMaxBroadcastBytes, timeout); !s.ok()) {
    return s;
  }
  // Every rank (rank 0 too) decodes the same bytes and checks each hash.
  json j;
  try {
    j = json::parse(message);
    measured_[0].predicted_us = j.at("default_predicted_us").get<double>();
    auto cm = ParseCostModel(j.at("cost_model").get<std::string>());
    if (!cm.ok()) return cm.status();
    cost_ = *cm;
    for (const json& c : j.at("candidates")) {
      auto plan = bucketing::ParsePlan(c.at("plan").get<std::string>());
      if (!plan.ok()) return plan.status();
      if (absl::Status s = bucketing::ValidatePlan(layout_, *plan); !s.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "tuner (rank ", comm_.rank(), "): candidate from rank 0 does not fit this model: ",
            s.message()));
      }
      const std::string hash = absl::StrFormat("%016x", bucketing::PlanHash(*plan));
      if (hash != c.at("hash").get<std::string>()) {
        return absl::DataLossError(absl::StrCat("tuner (rank ", comm_.rank(), "): candidate \"",
                                                c.at("name").get<std::string>(), "\" hashes to ",
                                                hash, ", rank 0 sent ",
                                                c.at("hash").get<std::string>()));
      }
      plan->name = c.at("name").get<std::string>();
      measured_.push_back(MeasuredPlan{plan->name, bucketing::PlanHash(*plan),
                                       c.at("predicted_us").get<double>(), 0});
      plans_.push_back(*std::move(plan));
    }
  } catch (const json::exception& e) {
    return absl::DataLossError(
        absl::StrCat("tuner: malformed candidate list from rank 0: ", e.what()));
  }
  Log(absl::StrFormat("fusebox tuner: cost model %s; %d candidates to measure",
                      cost_.Describe(), plans_.size() - 1));
  return absl::OkStatus();
}

absl::Status OnlineTuner::Conclude() {
  // The guard: the default is among the measured plans, so the winner is
  // never slower than it as measured.
  int best = 0;
  for (int i = 1; i < static_cast<int>(measured_.size()); ++i) {
    if (measured_[i].measured_us < measured_[best].measured_us) best = i;
  }
  chosen_ = best;
  chosen_plan_ = plans_[best];
  if (absl::Status s = SwitchTo(plans_[best]); !s.ok()) return s;
  reference_us_ = measured_[best].measured_us;
  phase_ = TunerPhase::kTuned;
  Log(absl::StrFormat(
      "fusebox tuner: chose %s (%d buckets): %.3f ms vs DDP default %.3f ms (%.3fx) after %d "
      "tuning iterations",
      measured_[best].name, plans_[best].buckets.size(), measured_[best].measured_us / 1e3,
      measured_[0].measured_us / 1e3, measured_[0].measured_us / measured_[best].measured_us,
      tuning_iterations_));
  if (comm_.rank() == 0 && options_.cache != nullptr && options_.cache->enabled()) {
    CacheEntry entry;
    entry.key = key_;
    entry.model = options_.model_label;
    entry.layout_hash = layout_.Hash();
    entry.plan = plans_[best];
    entry.measured_iteration_us = measured_[best].measured_us;
    entry.ddp_iteration_us = measured_[0].measured_us;
    entry.predicted_iteration_us = measured_[best].predicted_us;
    entry.tuning_iterations = tuning_iterations_;
    entry.cost_model = cost_.Describe();
    entry.fusebox_version = FUSEBOX_VERSION;
    entry.created_unix_s = options_.wall_clock_s ? options_.wall_clock_s() : 0;
    if (absl::Status s = options_.cache->Store(entry); !s.ok()) {
      Log(absl::StrCat("fusebox tuner: warning: the plan was not cached: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status OnlineTuner::CheckDrift(double iteration_us) {
  if (options_.drift_window <= 0 || reference_us_ <= 0) return absl::OkStatus();
  window_.push_back(iteration_us);
  if (static_cast<int>(window_.size()) < options_.drift_window) return absl::OkStatus();
  std::vector<double> v = {Median(window_)};
  window_.clear();
  if (absl::Status s = MaxAcrossRanks(comm_, v); !s.ok()) return s;
  if (v[0] > reference_us_ * (1 + options_.drift_threshold)) {
    ++windows_over_;
  } else {
    windows_over_ = 0;
  }
  if (windows_over_ < options_.drift_windows) return absl::OkStatus();
  Log(absl::StrFormat("fusebox tuner: drift: %d windows at %.3f ms vs %.3f ms recorded (> +%.0f%%); "
                      "retuning",
                      windows_over_, v[0] / 1e3, reference_us_ / 1e3,
                      options_.drift_threshold * 100));
  ++retunes_;
  cache_hit_ = false;
  if (!chosen_plan_.has_value()) chosen_plan_ = engine_->plan();
  return StartTuning();
}

}  // namespace fusebox::autotune
