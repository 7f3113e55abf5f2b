#include "autotune/tuner.h"

#include <algorithm>
#include <cmath>
#include <random>
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
// Calibration runs inside a training step, and a user pays for it in every
// run that tunes: sizes up to 8 MiB fix the alpha-beta fit (at 8 MiB the
// bandwidth term is several times the latency even at 400 Gbit/s); larger
// ones only make that step longer. With sizes up to 32 MiB that step was
// the largest single tuning cost in the trust benchmark's runs
// (perf/bench_trust.py: about 0.8 s at 4 Gbit/s); at 8 MiB it moves a fifth
// of the bytes.
constexpr int64_t kMaxCalibrationBytes = int64_t{8} << 20;
constexpr int64_t kMinCalibrationBytes = int64_t{1} << 20;
// Every calibration call walks a buffer as large as the model's gradients,
// up to this (Note [Timing on data out of cache] in measure.cc): memory
// each rank holds only while it calibrates.
constexpr int64_t kMaxCalibrationWorkingSet = int64_t{256} << 20;

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

std::string CapName(int64_t cap) {
  return cap % (int64_t{1} << 20) == 0 ? absl::StrCat("ddp-cap", cap >> 20, "mb")
                                       : absl::StrCat("ddp-cap", cap, "b");
}

// Splits `v` (concatenated lists of the given sizes) back into lists.
std::vector<std::vector<double>> Split(const std::vector<double>& v,
                                       const std::vector<size_t>& sizes) {
  std::vector<std::vector<double>> out;
  size_t at = 0;
  for (size_t n : sizes) {
    out.emplace_back(v.begin() + at, v.begin() + at + n);
    at += n;
  }
  return out;
}

// Max-reduces several local lists element-wise across ranks (one collective).
absl::StatusOr<std::vector<std::vector<double>>> SlowestRank(
    comm::Communicator& comm, const std::vector<std::vector<double>>& lists) {
  std::vector<double> v;
  std::vector<size_t> sizes;
  for (const auto& l : lists) {
    v.insert(v.end(), l.begin(), l.end());
    sizes.push_back(l.size());
  }
  if (absl::Status s = MaxAcrossRanks(comm, v); !s.ok()) return s;
  return Split(v, sizes);
}

}  // namespace

const char* TunerPhaseName(TunerPhase phase) {
  switch (phase) {
    case TunerPhase::kCheckingHit: return "checking-cache-hit";
    case TunerPhase::kProfiling: return "profiling";
    case TunerPhase::kScreening: return "screening";
    case TunerPhase::kVerifying: return "verifying";
    case TunerPhase::kTuned: return "tuned";
  }
  return "unknown";
}

std::string TuningSummary::Line() const {
  return absl::StrFormat("tuning took %.1f s; the kept plan saves %.1f ms a step (%.1f s so far)",
                         tuning_s, saved_ms_per_step, saved_s_so_far);
}

namespace {

std::string MiB(int64_t bytes) {
  return bytes % (int64_t{1} << 20) == 0 ? absl::StrCat(bytes >> 20, " MiB")
                                         : absl::StrCat(bytes, " B");
}

// "95% CI [a, b]" or "range [a, b]" (too few samples for an interval).
std::string Interval(const MeasuredPlan& m) {
  return absl::StrFormat("%s [%.3f, %.3f]", m.interval_exact ? "95% CI" : "range",
                         m.ci_low_us / 1e3, m.ci_high_us / 1e3);
}

void SetFigures(MeasuredPlan& m, const std::vector<double>& samples, double confidence) {
  const MedianInterval ci = MedianCI(samples, confidence);
  m.measured_us = ci.median;
  m.ci_low_us = ci.low;
  m.ci_high_us = ci.high;
  m.interval_exact = ci.exact;
  m.samples = static_cast<int>(samples.size());
}

}  // namespace

OnlineTuner::OnlineTuner(comm::Communicator& comm, bucketing::GradientLayout layout,
                         TunerOptions options, absl::Duration timeout)
    : comm_(comm), layout_(std::move(layout)), options_(std::move(options)), timeout_(timeout) {}

void OnlineTuner::Log(const std::string& line) const {
  if (options_.log && comm_.rank() == 0) options_.log(line);
}

namespace {

// The options' own checks (Create's first step).
absl::Status ValidateTunerOptions(const TunerOptions& options) {
  if (options.candidates < 0 || options.candidates_when_derived < 0 ||
      options.profile_iterations < 1 || options.screening_blocks < 1) {
    return absl::InvalidArgumentError(
        "tuner: needs candidates >= 0, candidates_when_derived >= 0, profile_iterations >= 1 "
        "and screening_blocks >= 1");
  }
  const int need = MinimumPairs(options.rule.confidence);
  if (!(options.rule.confidence > 0.5 && options.rule.confidence < 1) ||
      !(options.rule.min_effect >= 0 && options.rule.min_effect < 1) ||
      !(options.rule.min_gain >= 0 && options.rule.min_gain < 1)) {
    return absl::InvalidArgumentError(
        "tuner: the switch rule needs a confidence in (0.5, 1) and a minimum gain and effect "
        "in [0, 1)");
  }
  if (options.verify_pairs < need || options.verify_pairs > kMaxSignedRankPairs ||
      (options.check_every > 0 && options.check_pairs < 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tuner: verify_pairs (%d) must be in [%d, %d] (fewer pairs cannot "
                        "show %.0f%% confidence) and check_pairs (%d) at least 1",
                        options.verify_pairs, need, kMaxSignedRankPairs,
                        options.rule.confidence * 100, options.check_pairs));
  }
  if (!(options.early_share >= 0 && options.early_share < 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tuner: early_share (%g) must be in [0, 1)", options.early_share));
  }
  if (options.check_every < 0 || options.verify_look_every < 0 || options.profile_cap_bytes < 0 ||
      options.hit_check_pairs < 0) {
    return absl::InvalidArgumentError(
        "tuner: check_every, verify_look_every, hit_check_pairs and profile_cap_bytes must be "
        ">= 0");
  }
  if (!(options.max_check_cost > 0 && options.max_check_cost <= 0.5)) {
    return absl::InvalidArgumentError("tuner: max_check_cost must be in (0, 0.5]");
  }
  if (std::isnan(options.skip_predicted_slower)) {
    return absl::InvalidArgumentError("tuner: skip_predicted_slower is not a number");
  }
  if (absl::Status s = Validate(options.regression); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tuner: regression: ", s.message()));
  }
  if (options.baseline_cap_bytes <= 0 || options.baseline_first_bucket_bytes <= 0) {
    return absl::InvalidArgumentError(
        "tuner: the baseline's bucket cap and first bucket size must be positive");
  }
  for (int64_t cap : options.ddp_caps) {
    if (cap <= 0) return absl::InvalidArgumentError("tuner: a DDP cap must be positive");
  }
  if (options.cost_model.has_value()) {
    if (absl::Status s = options.cost_model->Validate(); !s.ok()) return s;
  }
  if (options.calibration_max_bytes < 0) {
    return absl::InvalidArgumentError("tuner: calibration_max_bytes is negative");
  }
  return absl::OkStatus();
}

// Every rank must tune the same model: checked first, so that a rank whose
// model differs fails everywhere before any plan is looked at.
absl::Status CheckSameModel(comm::Communicator& comm, const bucketing::GradientLayout& layout,
                            absl::Duration timeout) {
  const int64_t mine = static_cast<int64_t>(layout.Hash());
  std::vector<int64_t> all(comm.size(), 0);
  auto work = comm.AllGather(&mine, all.data(), 1, comm::DataType::kInt64);
  if (!work.ok()) return work.status();
  if (absl::Status s = (*work)->WaitFor(timeout); !s.ok()) return s;
  std::string differ;
  for (int r = 1; r < comm.size(); ++r) {
    if (all[r] != all[0]) absl::StrAppend(&differ, differ.empty() ? "" : ", ", r);
  }
  if (!differ.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tuner (rank ", comm.rank(), "): the gradient layout of rank(s) ", differ,
        " differs from rank 0's: every rank must register the same model"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<OnlineTuner>> OnlineTuner::Create(
    comm::Communicator& comm, bucketing::GradientLayout layout, TunerOptions options,
    absl::Duration timeout, std::unique_ptr<PolicyCache> owned_cache) {
  if (absl::Status s = ValidateTunerOptions(options); !s.ok()) return s;
  if (layout.size() == 0) return absl::InvalidArgumentError("tuner: the layout has no gradients");
  options.planner.sim.world_size = comm.size();
  if (options.ranks_per_node <= 0) options.ranks_per_node = comm.size();
  if (owned_cache != nullptr) options.cache = owned_cache.get();
  std::unique_ptr<OnlineTuner> t(
      new OnlineTuner(comm, std::move(layout), std::move(options), timeout));
  t->owned_cache_ = std::move(owned_cache);
  t->key_ = CacheKey{ModelSignature(t->layout_), comm.size(), t->options_.ranks_per_node,
                     BackendFamily(t->options_.backend), t->options_.network};
  if (absl::Status s = t->key_.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tuner: cache key: ", s.message()));
  }
  t->SetBaseline();
  if (absl::Status s = CheckSameModel(comm, t->layout_, timeout); !s.ok()) return s;
  absl::StatusOr<std::string> message = t->ShareSeedAndCache(timeout);
  if (!message.ok()) return message.status();
  t->Log(absl::StrFormat("fusebox tuner: baseline %s (%d buckets); seed %u (TunerOptions::seed, "
                         "the hook's seed=, replays this run's order)",
                         t->baseline_label_, t->default_.buckets.size(), t->seed_));
  absl::Status s;
  if (!message->empty() && (*message)[0] == 'H') s = t->StartFromHit(message->substr(1));
  if (!message->empty() && (*message)[0] == 'N') s = t->SeedFromNearest(message->substr(1));
  if (!s.ok()) return s;
  return t;
}

// The baseline: the user's DDP (Note [The user's DDP is the baseline]),
// and the plan the run starts on.
void OnlineTuner::SetBaseline() {
  bucketing::DdpOptions o;
  o.bucket_cap_bytes = options_.baseline_cap_bytes;
  o.first_bucket_bytes = std::min(options_.baseline_first_bucket_bytes, o.bucket_cap_bytes);
  const bucketing::DdpOptions defaults;
  const bool is_default = o.bucket_cap_bytes == defaults.bucket_cap_bytes &&
                          o.first_bucket_bytes == defaults.first_bucket_bytes;
  default_ = bucketing::DdpPlan(layout_, o);
  default_.name = is_default ? "ddp" : CapName(o.bucket_cap_bytes);
  baseline_label_ =
      is_default ? "DDP's default"
                 : absl::StrCat("your DDP buckets (", MiB(o.bucket_cap_bytes),
                                o.first_bucket_bytes != defaults.first_bucket_bytes
                                    ? absl::StrCat(", first ", MiB(o.first_bucket_bytes))
                                    : std::string(),
                                ")");
  initial_ = default_;
  if (options_.profile_cap_bytes > 0) {
    bucketing::DdpOptions p;
    p.bucket_cap_bytes = options_.profile_cap_bytes;
    p.first_bucket_bytes = std::min(p.first_bucket_bytes, p.bucket_cap_bytes);
    initial_ = bucketing::DdpPlan(layout_, p);
    initial_.name = "profile";
  }
  profile_plan_ = initial_;
}

// Step 1: rank 0 draws the seed and consults the cache; every rank gets
// both ("<seed>\n" then the cache's answer: "H" and a cache entry, "N" and
// the nearest world size's plan, or nothing). Returns the answer.
absl::StatusOr<std::string> OnlineTuner::ShareSeedAndCache(absl::Duration timeout) {
  std::string message;
  PolicyCache* cache = options_.cache;
  if (comm_.rank() == 0) {
    uint64_t seed = options_.seed;
    if (seed == 0) {
      std::random_device rd;
      seed = (static_cast<uint64_t>(rd()) << 32 | rd()) | 1;
    }
    message = absl::StrCat(seed, "\n");
    if (cache != nullptr && cache->enabled()) {
      if (auto hit = cache->Lookup(key_, layout_)) {
        absl::StrAppend(&message, "H", SerializeCacheEntry(*hit));
      } else if (auto near = cache->Nearest(key_, layout_)) {
        absl::StrAppend(&message, "N", near->key.world_size, "\n",
                        bucketing::SerializePlan(near->plan, &layout_));
      }
    }
  }
  if (absl::Status s = BroadcastBytes(comm_, message, 0, kMaxBroadcastBytes, timeout); !s.ok()) {
    return s;
  }
  {
    const size_t nl = message.find('\n');
    if (nl == std::string::npos || !absl::SimpleAtoi(message.substr(0, nl), &seed_)) {
      return absl::DataLossError("tuner: malformed seed from rank 0");
    }
    message.erase(0, nl + 1);
  }
  return message;
}

// A hit (Note [Closed-loop tuning], step 1): installed at once, checked
// before it is trusted.
absl::Status OnlineTuner::StartFromHit(absl::string_view serialized) {
  auto entry = ParseCacheEntry(serialized);
  if (!entry.ok()) return entry.status();
  if (absl::Status s = bucketing::ValidatePlan(layout_, entry->plan); !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("tuner: the cached plan from rank 0 does not fit this rank's model: ",
                     s.message()));
  }
  entry->plan.name = "cached";
  cache_hit_ = true;
  const bool measured = entry->measured_iteration_us > 0;
  const int pairs = measured ? options_.hit_check_pairs : options_.verify_pairs;
  const bool same = bucketing::PlanHash(entry->plan) == bucketing::PlanHash(default_);
  if (same || pairs == 0) {
    initial_ = same ? default_ : entry->plan;
    chosen_plan_ = initial_;
    phase_ = TunerPhase::kTuned;
    decision_ = same ? absl::StrCat("from the policy cache: ", baseline_label_)
                     : "from the policy cache (unchecked: hit_check_pairs is 0)";
    if (!same) StartChecks(0, 0);  // the checks after a decision still run
    Log(absl::StrCat("fusebox tuner: cache hit ", key_.FileName(), ": ", decision_,
                     "; 0 tuning iterations"));
    return absl::OkStatus();
  }
  // Checked before trusted: the baseline and the cached plan in
  // interleaved rounds, the first of them a warm-up of each (below).
  initial_ = entry->plan;
  hit_simulated_ = !measured;
  plans_ = {default_, entry->plan};
  measured_.assign(2, MeasuredPlan{});
  measured_[0].name = default_.name;
  measured_[0].hash = bucketing::PlanHash(default_);
  measured_[0].buckets = static_cast<int>(default_.buckets.size());
  measured_[1].name = "cached";
  measured_[1].hash = bucketing::PlanHash(entry->plan);
  measured_[1].buckets = static_cast<int>(entry->plan.buckets.size());
  arms_ = {1, 0};
  active_.assign(2, true);
  arm_samples_.assign(2, {});
  rounds_wanted_ = pairs + 1;  // round 0 warms both up and is not measured
  running_ = 1;
  round_ = {0, 1};  // unmeasured: the cached plan (initial_), then the baseline
  phase_ = TunerPhase::kCheckingHit;
  Log(absl::StrFormat(
      "fusebox tuner: cache hit %s: %d buckets, %s%s; checking it against %s in %d "
      "interleaved pairs before trusting it",
      key_.FileName(), entry->plan.buckets.size(),
      measured ? absl::StrFormat("measured %.3f ms when tuned",
                                 entry->measured_iteration_us / 1e3)
               : std::string("never measured (simulated only)"),
      measured ? absl::StrFormat(" (baseline then %.3f ms)", entry->ddp_iteration_us / 1e3)
               : std::string(),
      baseline_label_, pairs));
  return absl::OkStatus();
}

// No entry for this size: the plan cached for the nearest size joins the
// candidates.
absl::Status OnlineTuner::SeedFromNearest(absl::string_view message) {
  const size_t nl = message.find('\n');
  int world = 0;
  if (nl == absl::string_view::npos || !absl::SimpleAtoi(message.substr(0, nl), &world)) {
    return absl::InvalidArgumentError("tuner: malformed seed plan from rank 0");
  }
  auto plan = bucketing::ParsePlan(message.substr(nl + 1));
  if (!plan.ok()) return plan.status();
  if (absl::Status s = bucketing::ValidatePlan(layout_, *plan); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tuner: the seed plan from rank 0 does not fit this rank's model: ", s.message()));
  }
  plan->name = absl::StrCat("cached-w", world);
  nearest_plan_ = *std::move(plan);
  derived_ = true;
  Log(absl::StrFormat("fusebox tuner: no entry for %d ranks; seeding the search with the "
                      "plan cached for %d ranks",
                      comm_.size(), world));
  return absl::OkStatus();
}

void OnlineTuner::ForceChosen(Plan plan, bool checks) {
  chosen_plan_ = std::move(plan);
  phase_ = TunerPhase::kTuned;
  control_ = false;
  control_sample_.reset();
  since_check_ = 0;
  check_default_.clear();
  check_chosen_.clear();
  StartChecks(kept_gain_, regression_.has_value() ? regression_->sigma() : 0.0);
  if (!checks) interval_.reset();  // check_interval() 0: no control steps
  forced_ = true;
}

std::optional<Plan> OnlineTuner::Visit(int candidate) {
  running_ = candidate;
  return plans_[candidate];
}

void OnlineTuner::StartBlock() {
  const uint64_t seed = seed_ * 1000003 + static_cast<uint64_t>(blocks_started_++);
  warming_ = options_.warmup_block && blocks_started_ == 1;
  if (warming_) {
    // Every candidate but the plan profiling ran (already warm): the
    // baseline, or the profile cap's plan when it is a candidate too.
    std::vector<int> cold;
    for (int c : screen_) {
      if (measured_[c].hash != bucketing::PlanHash(profile_plan_)) cold.push_back(c);
    }
    block_.clear();
    for (int i : RandomizedBlock(static_cast<int>(cold.size()), seed, -1)) {
      block_.push_back(cold[i]);
    }
    if (!block_.empty()) return;
    warming_ = false;
  }
  const auto at = std::find(screen_.begin(), screen_.end(), running_);
  const int avoid = at == screen_.end() ? -1 : static_cast<int>(at - screen_.begin());
  block_.clear();
  for (int i : RandomizedBlock(static_cast<int>(screen_.size()), seed, avoid)) {
    block_.push_back(screen_[i]);
  }
}

int OnlineTuner::NextArm() {
  if (round_.empty()) {
    // Every measured visit follows a switch (a repeated plan would skip the
    // re-bucketing every other visit pays), and each arm takes each place in
    // a round equally often: for three arms the rounds rotate (A B C, B C A,
    // C A B, ...: a round never starts with the arm that ended the last);
    // for two they alternate (A B A B ...), from a start drawn from the seed.
    std::vector<int> live;
    for (size_t a = 0; a < arms_.size(); ++a) {
      if (active_[a]) live.push_back(static_cast<int>(a));
    }
    const int k = static_cast<int>(live.size());
    const int start = static_cast<int>((seed_ * 2654435761u + 17) % static_cast<uint64_t>(k));
    const int shift = k > 2 ? rounds_ : 0;
    for (int i = 0; i < k; ++i) round_.push_back(live[(start + shift + i) % k]);
  }
  const int arm = round_.front();
  return arm;
}

absl::StatusOr<std::optional<Plan>> OnlineTuner::OnIterationEnd(const bucketing::IterationStats& last,
                                                               const Plan& current) {
  const double sample = last.whole_us();
  switch (phase_) {
    case TunerPhase::kCheckingHit:
      ++hit_check_iterations_;
      return CheckHit(sample);
    case TunerPhase::kProfiling: {
      ++tuning_iterations_;
      tuning_samples_.push_back(sample);
      backward_.push_back(last.backward_us());
      ready_.push_back(last.ready_us);
      if (static_cast<int>(backward_.size()) < options_.profile_iterations) return std::nullopt;
      // The first iteration on a new plan pays for its buffers; the profile
      // is the median of the others when there are others.
      const size_t skip = backward_.size() > 1 ? 1 : 0;
      std::vector<double> v;
      v.push_back(Median(std::vector<double>(backward_.begin() + skip, backward_.end())));
      for (int id = 0; id < layout_.size(); ++id) {
        std::vector<double> r;
        for (size_t i = skip; i < ready_.size(); ++i) {
          r.push_back(id < static_cast<int>(ready_[i].size()) ? ready_[i][id] : 0);
        }
        v.push_back(Median(std::move(r)));
      }
      if (absl::Status s = MaxAcrossRanks(comm_, v); !s.ok()) return s;
      if (absl::Status s = Search(v[0], std::vector<double>(v.begin() + 1, v.end())); !s.ok()) {
        return s;
      }
      if (screen_.size() == 1) {
        chosen_ = 0;
        chosen_plan_ = default_;
        phase_ = TunerPhase::kTuned;
        decision_ = plans_.size() == 1
                        ? absl::StrCat("no candidate besides ", baseline_label_, "; kept it")
                        : absl::StrFormat("kept %s: the cost model predicts every other "
                                          "candidate %.0f%% or more slower (none measured)",
                                          baseline_label_, options_.skip_predicted_slower * 100);
        Log("fusebox tuner: " + decision_);
        if (absl::Status s = StoreEntry(); !s.ok()) return s;
        // Profiling may have run another plan (the hook's 1 MiB buckets).
        if (bucketing::PlanHash(current) == bucketing::PlanHash(default_)) return std::nullopt;
        return default_;
      }
      phase_ = TunerPhase::kScreening;
      running_ = 0;
      StartBlock();
      return Visit(block_.front());
    }
    case TunerPhase::kScreening: {
      ++tuning_iterations_;
      tuning_samples_.push_back(sample);
      if (!warming_) samples_[running_].push_back(sample);
      block_.erase(block_.begin());
      if (block_.empty()) {
        if (!warming_ && ++blocks_done_ >= options_.screening_blocks) return EndScreening();
        StartBlock();
      }
      return Visit(block_.front());
    }
    case TunerPhase::kVerifying: {
      ++tuning_iterations_;
      tuning_samples_.push_back(sample);
      arm_samples_[round_.front()].push_back(sample);
      round_.erase(round_.begin());
      if (round_.empty()) return EndRound();
      return Visit(arms_[NextArm()]);
    }
    case TunerPhase::kTuned:
      ++steps_since_decision_;
      if (forced_) {  // ForceChosen: install it now; this sample was the old plan's
        forced_ = false;
        return *chosen_plan_;
      }
      return Check(sample);
  }
  return std::nullopt;
}

absl::StatusOr<std::optional<Plan>> OnlineTuner::CheckHit(double sample) {
  // Round 0 warms both plans up (each first run pays for its buffers).
  if (rounds_ > 0) arm_samples_[round_.front()].push_back(sample);
  round_.erase(round_.begin());
  if (!round_.empty() || ++rounds_ < rounds_wanted_) {
    if (round_.empty()) NextArm();
    return plans_[arms_[round_.front()]];
  }
  // arms_ = {cached, baseline}: arm 1's samples are the baseline's.
  auto slow = SlowestRank(comm_, {arm_samples_[1], arm_samples_[0]});
  if (!slow.ok()) return slow.status();
  const std::vector<double>& base = (*slow)[0];
  const std::vector<double>& cached = (*slow)[1];
  SetFigures(measured_[0], base, options_.rule.confidence);
  SetFigures(measured_[1], cached, options_.rule.confidence);
  const std::vector<double> g = RelativeGains(base, cached);
  const double gain = g.empty() ? 0 : Median(g);
  // Lost: slower than the baseline by more than the minimum effect at the
  // rule's confidence (with fewer pairs than that needs: in every pair). An
  // entry that was only simulated must beat the baseline as a candidate does.
  const bool lost =
      hit_simulated_
          ? !DecideReplace(base, cached, options_.rule).replace
          : !g.empty() && MedianUpperBound(g, options_.rule.confidence) < -options_.rule.min_effect;
  if (!lost) {
    phase_ = TunerPhase::kTuned;
    chosen_ = 1;
    chosen_plan_ = plans_[1];
    baseline_us_ = measured_[0].measured_us;
    decision_ = absl::StrFormat(
        "from the policy cache, checked: median gain %+.1f%% over %s in %d interleaved pairs",
        gain * 100, baseline_label_, static_cast<int>(g.size()));
    Log(absl::StrCat("fusebox tuner: ", decision_, "; 0 tuning iterations, ",
                     hit_check_iterations_, " check iterations"));
    StartChecks(gain, NoiseFromPairs(base, cached));
    // An entry that was only simulated is now measured: store its figures.
    if (hit_simulated_) {
      if (absl::Status s = StoreEntry(); !s.ok()) return s;
    }
    return *chosen_plan_;
  }
  // The hit lost: forget it (a run that stops before tuning ends must not
  // leave it for the next) and tune afresh, from the profiling plan.
  cache_hit_ = false;
  ForgetEntry();
  Log(absl::StrFormat(
      "fusebox tuner: the cached plan (%s) %s %s (median gain %+.1f%%, upper bound %+.1f%% over "
      "%d pairs): not trusted; tuning afresh",
      hit_simulated_ ? "simulated only" : "measured when tuned",
      hit_simulated_ ? "did not beat" : "measured slower than", baseline_label_, gain * 100,
      MedianUpperBound(g, options_.rule.confidence) * 100, static_cast<int>(g.size())));
  chosen_plan_.reset();
  plans_.clear();
  measured_.clear();
  arms_.clear();
  round_.clear();
  rounds_ = 0;
  phase_ = TunerPhase::kProfiling;
  return profile_plan_;
}

absl::StatusOr<std::optional<Plan>> OnlineTuner::EndScreening() {
  auto slow = SlowestRank(comm_, samples_);
  if (!slow.ok()) return slow.status();
  for (size_t i = 0; i < plans_.size(); ++i) {
    if (!measured_[i].screened) continue;
    SetFigures(measured_[i], (*slow)[i], options_.rule.confidence);
    Log(absl::StrFormat("fusebox tuner: %-18s %4d buckets: %9.3f ms %s measured in screening%s",
                        measured_[i].name, measured_[i].buckets, measured_[i].measured_us / 1e3,
                        Interval(measured_[i]),
                        measured_[i].predicted_us > 0
                            ? absl::StrFormat(", %.3f ms predicted", measured_[i].predicted_us / 1e3)
                            : ""));
  }
  // The leader and the runner-up of screening (the baseline excluded).
  pick_ = screen_[1];
  runner_ = -1;
  for (size_t i = 2; i < screen_.size(); ++i) {
    const int c = screen_[i];
    if (measured_[c].measured_us < measured_[pick_].measured_us) {
      runner_ = pick_;
      pick_ = c;
    } else if (runner_ < 0 || measured_[c].measured_us < measured_[runner_].measured_us) {
      runner_ = c;
    }
  }
  // Screening only ranks (a few samples each); the verification decides.
  // It is skipped only when even the leader's fastest screening sample was
  // slower than the baseline's slowest: a median of two samples on a noisy
  // machine once hid a plan 12% faster, and then tuning kept the baseline
  // without ever comparing them properly.
  if (options_.screening_blocks >= 2 && measured_[pick_].ci_low_us > measured_[0].ci_high_us) {
    chosen_ = 0;
    chosen_plan_ = default_;
    phase_ = TunerPhase::kTuned;
    decision_ = absl::StrFormat(
        "kept %s: the fastest candidate in screening was slower in every sample than the "
        "baseline in any (%s %.3f ms %s vs %.3f ms %s)",
        baseline_label_, measured_[pick_].name, measured_[pick_].measured_us / 1e3,
        Interval(measured_[pick_]), measured_[0].measured_us / 1e3, Interval(measured_[0]));
    Log(absl::StrCat("fusebox tuner: ", decision_, "; after ", tuning_iterations_,
                     " tuning iterations"));
    tuning_cost_us_ = 0;
    for (double t : tuning_samples_) {
      tuning_wall_us_ += t;
      tuning_cost_us_ += std::max(0.0, t - measured_[0].measured_us);
    }
    if (absl::Status s = StoreEntry(); !s.ok()) return s;
    return Visit(0);
  }
  phase_ = TunerPhase::kVerifying;
  // The runner-up is verified too where the rounds can show the split
  // confidence (ChallengerRule); else the leader alone.
  arms_ = {0, pick_, runner_};
  if (runner_ <= 0 ||
      options_.verify_pairs < MinimumPairs(ChallengerRule(/*interim=*/false).confidence)) {
    arms_.pop_back();
  }
  active_.assign(arms_.size(), true);
  dropped_why_.assign(arms_.size(), "");
  won_.assign(arms_.size(), false);
  won_early_ = false;
  arm_samples_.assign(arms_.size(), {});
  rounds_ = 0;
  rounds_wanted_ = options_.verify_pairs;
  round_.clear();
  Log(absl::StrFormat("fusebox tuner: verifying %s%s against %s in %d interleaved rounds",
                      measured_[pick_].name,
                      arms_.size() > 2 ? absl::StrCat(" and ", measured_[runner_].name) : "",
                      baseline_label_, rounds_wanted_));
  NextArm();
  // A round never starts with the plan that ran last when it can help it.
  if (arms_[round_.front()] == running_ && round_.size() > 1) std::swap(round_[0], round_[1]);
  return Visit(arms_[round_.front()]);
}

absl::StatusOr<std::optional<Plan>> OnlineTuner::EndRound() {
  bool done = ++rounds_ >= rounds_wanted_;
  if (!done) {
    absl::StatusOr<bool> open = ChallengersStillOpen();
    if (!open.ok()) return open.status();
    done = !*open;
  }
  if (!done) return Visit(arms_[NextArm()]);
  if (absl::Status s = Decide(); !s.ok()) return s;
  running_ = chosen_;
  return *chosen_plan_;
}

int OnlineTuner::InterimLooks() const {
  const int look = options_.verify_look_every;
  if (look <= 0 || options_.early_share <= 0) return 0;
  return (options_.verify_pairs - 1) / look;
}

SwitchRule OnlineTuner::ChallengerRule(bool interim) const {
  SwitchRule rule = options_.rule;
  const int challengers = std::max(static_cast<int>(arms_.size()) - 1, 1);
  const double alpha = (1 - rule.confidence) / challengers;
  const int looks = InterimLooks();
  const double early = looks > 0 ? options_.early_share : 0;
  rule.confidence = interim ? 1 - early * alpha / std::max(looks, 1) : 1 - (1 - early) * alpha;
  return rule;
}

absl::StatusOr<bool> OnlineTuner::ChallengersStillOpen() {
  // arms_[0] is the baseline; every arm's samples are shared (a dropped
  // arm's stay as they were), so that all ranks drop the same arms.
  auto slow = SlowestRank(comm_, arm_samples_);
  if (!slow.ok()) return slow.status();
  const SwitchRule rule = ChallengerRule(/*interim=*/false);
  const SwitchRule early = ChallengerRule(/*interim=*/true);
  const int look = options_.verify_look_every;
  const bool at_look = look > 0 && rounds_ % look == 0;
  bool open = false;
  for (size_t a = 1; a < arms_.size(); ++a) {
    if (!active_[a]) continue;
    if (at_look && InterimLooks() > 0 && DecideReplace((*slow)[0], (*slow)[a], early).replace) {
      won_early_ = true;
      won_[a] = true;
      dropped_why_[a] = absl::StrFormat("won after %d rounds at %g%%", rounds_,
                                        early.confidence * 100);
      continue;
    }
    if (at_look && ShowsNoGainYet((*slow)[0], (*slow)[a], rule)) {
      dropped_why_[a] = absl::StrCat("showed no gain after ", rounds_, " rounds");
    } else if (!ReplacementStillPossible((*slow)[0], (*slow)[a], rounds_wanted_, rule)) {
      dropped_why_[a] = absl::StrCat("could no longer win after ", rounds_, " rounds");
    }
    active_[a] = dropped_why_[a].empty();
    open = open || active_[a];
  }
  // A win at a look ends verification: only the arms that won there may
  // replace the baseline (Decide), at the look's confidence.
  return open && !won_early_;
}

absl::Status OnlineTuner::Decide() {
  std::vector<std::vector<double>> local = arm_samples_;
  local.push_back(tuning_samples_);
  auto slow = SlowestRank(comm_, local);
  if (!slow.ok()) return slow.status();
  const std::vector<double>& base = (*slow)[0];
  const std::vector<double>& tuning = slow->back();
  for (size_t a = 0; a < arms_.size(); ++a) {
    SetFigures(measured_[arms_[a]], (*slow)[a], options_.rule.confidence);
    measured_[arms_[a]].verified = true;
  }
  // Each challenger against the baseline at its share of the confidence
  // (ChallengerRule), then two winners against each other: of two plans
  // that beat the baseline, the faster in the same rounds (median paired
  // gain) is kept. A dropped challenger cannot win.
  const SwitchRule rule = ChallengerRule(/*interim=*/won_early_);
  std::vector<Verdict> verdicts;
  for (size_t a = 1; a < arms_.size(); ++a) {
    verdicts.push_back(DecideReplace(base, (*slow)[a], rule));
    if (won_early_ ? !won_[a] : !active_[a]) verdicts.back().replace = false;
  }
  int kept = 0;  // index into arms_
  for (size_t a = 1; a < arms_.size(); ++a) {
    if (!verdicts[a - 1].replace) continue;
    if (kept == 0) {
      kept = static_cast<int>(a);
      continue;
    }
    const std::vector<double> g = RelativeGains((*slow)[kept], (*slow)[a]);
    if (!g.empty() && Median(g) > 0) kept = static_cast<int>(a);
  }
  verdict_ = kept > 0 ? verdicts[kept - 1] : verdicts[0];
  chosen_ = arms_[kept];
  chosen_plan_ = plans_[chosen_];
  phase_ = TunerPhase::kTuned;
  const double def_median = Median(base);
  baseline_us_ = def_median;
  tuning_cost_us_ = 0;
  for (double t : tuning) {
    tuning_cost_us_ += std::max(0.0, t - def_median);
    tuning_wall_us_ += t;
  }
  std::string against;
  for (size_t a = 1; a < arms_.size(); ++a) {
    absl::StrAppend(&against, a > 1 ? "; " : "", measured_[arms_[a]].name, " ",
                    verdicts[a - 1].why);
  }
  decision_ = kept > 0 ? absl::StrCat("replaced ", baseline_label_, " with ",
                                      measured_[chosen_].name, ": ", against)
                       : absl::StrCat("kept ", baseline_label_, ": ", against);
  if (rounds_ < rounds_wanted_) {
    absl::StrAppend(&decision_, " (verification stopped after ", rounds_, " of ", rounds_wanted_,
                    " rounds:");
    for (size_t a = 1; a < arms_.size(); ++a) {
      absl::StrAppend(&decision_, a > 1 ? ";" : "", " ", measured_[arms_[a]].name, " ",
                      dropped_why_[a].empty() ? "still open" : dropped_why_[a]);
    }
    absl::StrAppend(&decision_, ")");
  }
  Log(absl::StrFormat(
      "fusebox tuner: %s; %s (%d buckets) %.3f ms %s vs %s %.3f ms %s in verification; %d tuning "
      "iterations, %.1f ms slower than the baseline in all",
      decision_, measured_[chosen_].name, plans_[chosen_].buckets.size(),
      measured_[chosen_].measured_us / 1e3, Interval(measured_[chosen_]), default_.name,
      measured_[0].measured_us / 1e3, Interval(measured_[0]), tuning_iterations_,
      tuning_cost_us_ / 1e3));
  if (kept > 0) {
    StartChecks(verdict_.gain, NoiseFromPairs(base, (*slow)[kept]));
    Log("fusebox tuner: " + Summary().Line());
  }
  return StoreEntry();
}

void OnlineTuner::StartChecks(double gain, double noise) {
  kept_gain_ = std::max(0.0, gain);
  interval_.reset();
  if (options_.check_every > 0) {
    interval_.emplace(kept_gain_, options_.check_every, options_.max_check_cost);
  }
  regression_.emplace(options_.regression, noise);
  since_check_ = 0;
}

absl::Status OnlineTuner::StoreEntry() {
  if (comm_.rank() != 0 || options_.cache == nullptr || !options_.cache->writable()) {
    return absl::OkStatus();
  }
  CacheEntry entry;
  entry.key = key_;
  entry.model = options_.model_label;
  entry.layout_hash = layout_.Hash();
  entry.plan = *chosen_plan_;
  const int c = std::max(chosen_, 0);
  entry.measured_iteration_us = c < static_cast<int>(measured_.size()) ? measured_[c].measured_us : 0;
  entry.ddp_iteration_us = measured_.empty() ? 0 : measured_[0].measured_us;
  entry.predicted_iteration_us = c < static_cast<int>(measured_.size()) ? measured_[c].predicted_us : 0;
  entry.tuning_iterations = tuning_iterations_;
  entry.cost_model = absl::StrCat(cost_.Describe(), "; decision: ", decision_);
  entry.fusebox_version = FUSEBOX_VERSION;
  entry.created_unix_s = options_.wall_clock_s ? options_.wall_clock_s() : 0;
  if (absl::Status s = options_.cache->Store(entry); !s.ok()) {
    Log(absl::StrCat("fusebox tuner: warning: the plan was not cached: ", s.message()));
  }
  return absl::OkStatus();
}

void OnlineTuner::ForgetEntry() {
  if (comm_.rank() != 0 || options_.cache == nullptr || !options_.cache->writable()) return;
  absl::Status s = options_.cache->Remove(key_.FileName());
  if (!s.ok() && !absl::IsNotFound(s)) {
    Log(absl::StrCat("fusebox tuner: warning: the entry of the plan that lost was not removed: ",
                     s.message()));
  }
}

bool OnlineTuner::TimesNextBoundary() const {
  if (phase_ != TunerPhase::kTuned) return true;
  if (forced_) return true;
  if (!chosen_plan_.has_value() || check_interval() <= 0 ||
      bucketing::PlanHash(*chosen_plan_) == bucketing::PlanHash(default_)) {
    return false;
  }
  // The step ending is a control (the baseline), or the kept plan's step
  // after one; or the step starting is a control.
  return control_ || control_sample_.has_value() || since_check_ + 1 >= check_interval();
}

TuningSummary OnlineTuner::Summary() const {
  TuningSummary s;
  s.tuning_s = tuning_wall_us_ / 1e6;
  s.tuning_cost_s = tuning_cost_us_ / 1e6;
  if (chosen_ > 0 && baseline_us_ > 0) s.saved_ms_per_step = kept_gain_ * baseline_us_ / 1e3;
  s.steps_since_decision = steps_since_decision_;
  // The check steps ran the baseline: they saved nothing.
  s.saved_s_so_far = s.saved_ms_per_step / 1e3 *
                         static_cast<double>(std::max<int64_t>(0, steps_since_decision_ - controls_)) -
                     s.tuning_cost_s;
  return s;
}

absl::StatusOr<std::optional<Plan>> OnlineTuner::Check(double sample) {
  if (!chosen_plan_.has_value()) return std::nullopt;
  if (control_) {  // the baseline just ran as a control: back to the kept plan
    control_ = false;
    control_sample_ = sample;
    return *chosen_plan_;
  }
  if (control_sample_.has_value()) {
    check_default_.push_back(*control_sample_);
    check_chosen_.push_back(sample);
    control_sample_.reset();
    if (static_cast<int>(check_default_.size()) >= options_.check_pairs) {
      auto slow = SlowestRank(comm_, {check_default_, check_chosen_});
      check_default_.clear();
      check_chosen_.clear();
      if (!slow.ok()) return slow.status();
      ++checks_;
      if (!regression_.has_value()) regression_.emplace(options_.regression, 0.0);
      bool caught = false;
      for (size_t i = 0; i < (*slow)[0].size() && !caught; ++i) {
        caught = regression_->Add((*slow)[0][i], (*slow)[1][i]);
        if (interval_.has_value()) interval_->Add((*slow)[0][i], (*slow)[1][i]);
      }

      if (caught) {
        ++fallbacks_;
        decision_ = absl::StrFormat(
            "fell back to %s: plan \"%s\" became slower than it (%s)", baseline_label_,
            chosen_plan_->name, regression_->Describe());
        // A warning: shown by default, so that a user told what the plan
        // saves also learns that it stopped.
        Log(absl::StrCat("fusebox tuner: warning: ", decision_));
        chosen_plan_ = default_;
        chosen_ = 0;
        kept_gain_ = 0;
        ForgetEntry();
        return default_;
      }
    }
  }
  if (check_interval() <= 0 || bucketing::PlanHash(*chosen_plan_) == bucketing::PlanHash(default_)) {
    return std::nullopt;
  }
  if (++since_check_ >= check_interval()) {
    since_check_ = 0;
    control_ = true;
    ++controls_;
    return default_;
  }
  return std::nullopt;
}

absl::Status OnlineTuner::Search(double backward_us, const std::vector<double>& ready_us) {
  // The cost model: given, or fitted to this communicator (every rank
  // takes part in the measurement and gets the same samples).
  bool have_model = true;
  if (options_.cost_model.has_value()) {
    cost_ = *options_.cost_model;
  } else if (options_.candidates > 0 || nearest_plan_.has_value()) {
    // At least 1 MiB even for a small model: below that, latency and
    // noise hide the bandwidth term the fit needs.
    const int64_t cap =
        options_.calibration_max_bytes > 0
            ? options_.calibration_max_bytes
            : std::clamp(layout_.total_bytes(), kMinCalibrationBytes, kMaxCalibrationBytes);
    // A busy machine can make one small allreduce slower than the largest
    // (a progress thread descheduled, a rank's compute on the same core),
    // and then no line fits: measure again with more repetitions before
    // giving up on a model. Every rank sees the same (slowest rank's)
    // samples, so every rank retries alike.
    absl::StatusOr<std::vector<AllReduceSample>> samples;
    absl::StatusOr<CostModel> fitted;
    for (int reps : {3, 7, 15}) {
      samples = options_.measure_allreduce
                    ? options_.measure_allreduce(CalibrationSizes(cap), reps)
                    : MeasureAllReduce(comm_, CalibrationSizes(cap), reps,
                                       std::min(layout_.total_bytes(), kMaxCalibrationWorkingSet));
      if (!samples.ok()) return samples.status();
      fitted = FitCostModel(
          *samples, options_.ranks_per_node,
          absl::StrCat("measured on ",
                       options_.measured_on.empty() ? options_.backend : options_.measured_on,
                       ", ", comm_.size(), " ranks, by the online tuner"));
      if (fitted.ok()) break;
      Log(absl::StrCat("fusebox tuner: calibration with ", reps,
                       " repetitions per size fits no cost model (", fitted.status().message(),
                       ")", reps < 15 ? "; measuring again" : ""));
    }
    if (fitted.ok()) {
      cost_ = MeasuredAt(*fitted, *samples, comm_.size());
    } else {
      // Every rank has the same samples (slowest rank), so every rank gets
      // here: the DDP caps are still measured.
      Log(absl::StrCat("fusebox tuner: warning: no cost model fits this communicator's "
                       "allreduce times (",
                       fitted.status().message(), "); measuring DDP's caps only"));
      have_model = false;
    }
  } else {
    have_model = false;
  }
  // Rank 0 builds the candidate list and broadcasts it with hashes.
  std::string message;
  if (comm_.rank() == 0) {
    json list = json::array();
    absl::flat_hash_set<uint64_t> hashes;
    auto push = [&](const Plan& plan, const std::string& name, double predicted_us) {
      if (!hashes.insert(bucketing::PlanHash(plan)).second) return false;
      list.push_back({{"name", name},
                      {"hash", absl::StrFormat("%016x", bucketing::PlanHash(plan))},
                      {"predicted_us", predicted_us},
                      {"plan", bucketing::SerializePlan(plan, &layout_)}});
      return true;
    };
    const Profile profile =
        ProfileFromMeasurement(layout_, options_.model_label, backward_us, ready_us);
    auto predict = [&](const Plan& p) {
      if (!have_model) return 0.0;
      auto sim = Simulate(profile, p, cost_, options_.planner.sim);
      return sim.ok() ? sim->iteration_us - sim->forward_us : 0.0;
    };
    push(default_, default_.name, predict(default_));
    push(bucketing::DdpPlan(layout_), "ddp", predict(bucketing::DdpPlan(layout_)));
    for (int64_t cap : options_.ddp_caps) {
      bucketing::DdpOptions o;
      o.bucket_cap_bytes = cap;
      o.first_bucket_bytes = std::min<int64_t>(o.first_bucket_bytes, cap);
      Plan p = bucketing::DdpPlan(layout_, o);
      push(p, CapName(cap), predict(p));
    }
    if (nearest_plan_.has_value()) push(*nearest_plan_, nearest_plan_->name, predict(*nearest_plan_));
    const int want = derived_ ? options_.candidates_when_derived : options_.candidates;
    if (have_model && want > 0) {
      auto ranked = RankCandidates(profile, cost_, options_.planner, want + 8);
      if (!ranked.ok()) return ranked.status();
      int added = 0;
      for (const PlanPrediction& c : *ranked) {
        if (added >= want) break;
        if (push(c.plan, c.name, c.sim.iteration_us - c.sim.forward_us)) ++added;
      }
    }
    message = json{{"cost_model", have_model ? SerializeCostModel(cost_) : std::string()},
                   {"candidates", list}}
                  .dump();
  }
  if (absl::Status s = BroadcastBytes(comm_, message, 0, kMaxBroadcastBytes, timeout_); !s.ok()) {
    return s;
  }
  // Every rank (rank 0 too) decodes the same bytes and checks each hash.
  plans_.clear();
  measured_.clear();
  try {
    const json j = json::parse(message);
    if (!j.at("cost_model").get<std::string>().empty()) {
      auto cm = ParseCostModel(j.at("cost_model").get<std::string>());
      if (!cm.ok()) return cm.status();
      cost_ = *cm;
    }
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
      MeasuredPlan m;
      m.name = plan->name;
      m.hash = bucketing::PlanHash(*plan);
      m.buckets = static_cast<int>(plan->buckets.size());
      m.predicted_us = c.at("predicted_us").get<double>();
      measured_.push_back(m);
      plans_.push_back(*std::move(plan));
    }
  } catch (const json::exception& e) {
    return absl::DataLossError(
        absl::StrCat("tuner: malformed candidate list from rank 0: ", e.what()));
  }
  if (plans_.empty() || measured_[0].hash != bucketing::PlanHash(default_)) {
    return absl::DataLossError("tuner: rank 0's candidate list does not start with the baseline");
  }
  samples_.assign(plans_.size(), {});
  ScreenCandidates();
  Log(absl::StrFormat("fusebox tuner: %s; %d candidates besides %s (%d screened), %d screening "
                      "blocks",
                      have_model ? cost_.Describe() : std::string("no cost model"),
                      plans_.size() - 1, baseline_label_, screen_.size() - 1,
                      options_.screening_blocks));
  return absl::OkStatus();
}

void OnlineTuner::ScreenCandidates() {
  // Every rank decodes the same list, so every rank screens the same ones.
  screen_ = {0};
  const double base = measured_[0].predicted_us;
  const double skip = options_.skip_predicted_slower;
  for (int c = 1; c < static_cast<int>(measured_.size()); ++c) {
    MeasuredPlan& m = measured_[c];
    m.screened = !(skip > 0 && base > 0 && m.predicted_us >= (1 + skip) * base);
    if (m.screened) {
      screen_.push_back(c);
      continue;
    }
    Log(absl::StrFormat("fusebox tuner: %s not screened: predicted %.3f ms, %.0f%% slower than "
                        "%s (%.3f ms)",
                        m.name, m.predicted_us / 1e3, (m.predicted_us / base - 1) * 100,
                        baseline_label_, base / 1e3));
  }
}

absl::StatusOr<bucketing::Plan> FixedPlan(const std::string& spec,
                                          const bucketing::GradientLayout& layout) {
  if (spec == "ddp") return bucketing::DdpPlan(layout);
  if (spec == "per-tensor") return bucketing::PerTensorPlan(layout);
  return bucketing::ReadPlanFile(spec, layout);
}

absl::StatusOr<PlanAndPolicy> CreatePlanPolicy(comm::Communicator& comm,
                                               const bucketing::GradientLayout& layout,
                                               absl::Duration timeout, PlanChoice choice) {
  PlanAndPolicy out;
  if (!choice.fixed_plan.empty()) {
    auto plan = FixedPlan(choice.fixed_plan, layout);
    if (!plan.ok()) return plan.status();
    out.initial = *std::move(plan);
    return out;
  }
  std::unique_ptr<PolicyCache> cache;
  if (!choice.cache_dir.empty()) {
    PolicyCacheOptions co;
    co.dir = choice.cache_dir;
    co.warn = choice.warn;
    cache = std::make_unique<PolicyCache>(std::move(co));
  }
  auto tuner = OnlineTuner::Create(comm, layout, std::move(choice.tuner), timeout,
                                   std::move(cache));
  if (!tuner.ok()) return tuner.status();
  out.initial = (*tuner)->initial_plan();
  out.tuner = *std::move(tuner);
  return out;
}

absl::StatusOr<EngineWithPolicy> CreateEngineWithPolicy(comm::Communicator& comm,
                                                        bucketing::GradientLayout layout,
                                                        bucketing::EngineOptions engine_options,
                                                        PlanChoice choice) {
  const bool tuning = choice.fixed_plan.empty();
  if (tuning) {
    engine_options.record_ready_times = true;
    // The tuner alternates candidates: keep their buffers (when they fit) so
    // that a switch costs what it would in steady state.
    if (engine_options.retain_plans == 0 && !engine_options.external_buffers) {
      engine_options.retain_plans = layout.total_bytes() <= (int64_t{512} << 20) ? 8 : 1;
    }
  }
  auto made = CreatePlanPolicy(comm, layout, engine_options.timeout, std::move(choice));
  if (!made.ok()) return made.status();
  auto e = bucketing::Engine::Create(comm, std::move(layout), std::move(made->initial),
                                     engine_options);
  if (!e.ok()) return e.status();
  EngineWithPolicy out;
  out.tuner = made->tuner.get();
  out.engine = *std::move(e);
  if (made->tuner != nullptr) out.engine->SetPolicy(std::move(made->tuner));
  return out;
}

}  // namespace fusebox::autotune
