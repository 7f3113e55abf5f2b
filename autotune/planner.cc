#include "autotune/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "bucketing/planners.h"

namespace fusebox::autotune {

namespace {

using bucketing::Bucket;
using bucketing::GradientLayout;
using bucketing::Plan;
using bucketing::Slice;

// A piece of a gradient (Note [Optimal partition]).
struct Atom {
  int tensor;
  int64_t offset;
  int64_t count;
  int64_t bytes;
  double ready_us;
  comm::DataType dtype;
};

std::vector<Atom> MakeAtoms(const Profile& profile, const GradientLayout& layout,
                            const PlannerOptions& o) {
  std::vector<Atom> atoms;
  // Staged device gradients: a piece is ready for its bucket when its
  // gradient is on the host, which no bucket boundary changes.
  const std::vector<double> staged_in =
      o.sim.staging_gbps > 0 ? StagedInUs(profile, o.sim) : std::vector<double>();
  for (int id = 0; id < layout.size(); ++id) {
    const bucketing::TensorSpec& t = layout.tensor(id);
    const int64_t bytes = layout.bytes(id);
    const int64_t esize = static_cast<int64_t>(comm::DataTypeSize(t.dtype));
    int64_t pieces = 1;
    if (o.max_pieces > 1 && o.split_min_bytes > 0 && bytes >= 2 * o.split_min_bytes) {
      pieces = std::min<int64_t>({o.max_pieces, bytes / o.split_min_bytes, t.numel});
    }
    const int64_t base = t.numel / pieces;
    const double ready = staged_in.empty() ? profile.tensors[id].ready_us : staged_in[id];
    int64_t offset = 0;
    for (int64_t p = 0; p < pieces; ++p) {
      const int64_t count = p + 1 == pieces ? t.numel - offset : base;
      atoms.push_back({id, offset, count, count * esize, ready, t.dtype});
      offset += count;
    }
  }
  return atoms;
}

// Bucket from atoms [begin, end): consecutive atoms of one tensor become
// one slice.
Bucket MakeBucket(const std::vector<Atom>& atoms, size_t begin, size_t end) {
  Bucket b;
  b.dtype = atoms[begin].dtype;
  for (size_t a = begin; a < end; ++a) {
    const Atom& x = atoms[a];
    if (!b.slices.empty() && b.slices.back().tensor == x.tensor &&
        b.slices.back().offset + b.slices.back().count == x.offset) {
      b.slices.back().count += x.count;
    } else {
      b.slices.push_back(Slice{x.tensor, x.offset, x.count});
    }
  }
  return b;
}

int RanksPerNode(const CostModel& cost, const SimOptions& o) {
  return o.ranks_per_node > 0 ? o.ranks_per_node : cost.ranks_per_node;
}

absl::Status CheckInputs(const Profile& profile, const CostModel& cost, const SimOptions& o) {
  if (absl::Status s = ValidateProfile(profile); !s.ok()) return s;
  if (absl::Status s = cost.Validate(); !s.ok()) return s;
  return ValidateSimOptions(o);
}

// Ties within this relative margin count as equal (then fewer buckets win).
bool Less(double a, double b) { return a < b - 1e-9 * std::max(std::abs(a), std::abs(b)); }

// The search's pieces on a layout converted, and inputs checked, once
// (CheckPlannerInputs): OfflineTune and RankCandidates call them many times.
absl::Status CheckPlannerInputs(const Profile& profile, const CostModel& cost,
                                const PlannerOptions& o) {
  if (absl::Status s = CheckInputs(profile, cost, o.sim); !s.ok()) return s;
  if (o.max_bucket_bytes < 0 || o.split_min_bytes < 0) {
    return absl::InvalidArgumentError("planner: byte limits must be non-negative");
  }
  return absl::OkStatus();
}

Plan OptimalPartitionOn(const Profile& profile, const GradientLayout& layout,
                        const CostModel& cost, const PlannerOptions& o) {
  const std::vector<Atom> atoms = MakeAtoms(profile, layout, o);
  const size_t n = atoms.size();
  const CostCurve t = cost.Curve(o.sim.world_size, RanksPerNode(cost, o.sim));
  const double overhead = o.sim.launch_overhead_us;
  auto bucket_us = [&](int64_t bytes) { return t(bytes) + overhead; };

  std::vector<int64_t> prefix(n + 1, 0);
  for (size_t a = 0; a < n; ++a) prefix[a + 1] = prefix[a] + atoms[a].bytes;
  std::vector<double> f(n + 1, 0);
  std::vector<int> count(n + 1, 0);
  std::vector<size_t> from(n + 1, 0);
  for (size_t j = 1; j <= n; ++j) {
    const double r = atoms[j - 1].ready_us;
    double best = std::numeric_limits<double>::max();  // finite: Less() scales by it
    int best_count = 0;
    size_t best_i = j - 1;
    for (size_t i = j; i-- > 0;) {
      if (atoms[i].dtype != atoms[j - 1].dtype) break;  // one dtype per bucket
      const int64_t bytes = prefix[j] - prefix[i];
      if (o.max_bucket_bytes > 0 && bytes > o.max_bucket_bytes && i + 1 < j) break;
      const double tb = bucket_us(bytes);
      if (Less(best, r + tb)) break;  // every smaller i is at least r + tb
      const double cand = std::max(r, f[i]) + tb;
      if (Less(cand, best) || (!Less(best, cand) && count[i] + 1 < best_count)) {
        best = cand;
        best_count = count[i] + 1;
        best_i = i;
      }
    }
    f[j] = best;
    count[j] = best_count;
    from[j] = best_i;
  }
  std::vector<std::pair<size_t, size_t>> segments;
  for (size_t j = n; j > 0; j = from[j]) segments.emplace_back(from[j], j);
  std::reverse(segments.begin(), segments.end());
  Plan plan;
  plan.name = "tuned";
  for (const auto& [b, e] : segments) plan.buckets.push_back(MakeBucket(atoms, b, e));
  return plan;
}

Plan MgWfbpOn(const Profile& profile, const GradientLayout& layout, const CostModel& cost,
             const SimOptions& o) {
  const CostCurve t = cost.Curve(o.world_size, RanksPerNode(cost, o));
  const double startup = t(1) + o.launch_overhead_us;  // the model's a
  Plan plan;
  plan.name = "mg-wfbp";
  double channel_free = 0;  // when the previous bucket's allreduce ends
  double start = 0;         // when the open bucket's allreduce could start
  int64_t open_bytes = 0;
  for (int id = 0; id < layout.size(); ++id) {
    const double r = profile.tensors[id].ready_us;
    const bucketing::TensorSpec& spec = layout.tensor(id);
    const bool can_merge = !plan.buckets.empty() &&
                           plan.buckets.back().dtype == spec.dtype && r < start + startup;
    if (!can_merge) {
      if (!plan.buckets.empty()) {
        channel_free = start + t(open_bytes) + o.launch_overhead_us;
      }
      plan.buckets.push_back(Bucket{spec.dtype, {}});
      open_bytes = 0;
    }
    plan.buckets.back().slices.push_back(Slice{id, 0, spec.numel});
    open_bytes += layout.bytes(id);
    start = std::max(channel_free, r);
  }
  return plan;
}

absl::StatusOr<Plan> BaselineOn(const std::string& name, const Profile& profile,
                                const GradientLayout& layout, const CostModel& cost,
                                const SimOptions& options) {
  if (name == "per-tensor") return bucketing::PerTensorPlan(layout);
  if (name == "ddp") return bucketing::DdpPlan(layout);
  if (name == "horovod") {
    std::vector<double> ready;
    for (const ProfileTensor& t : profile.tensors) ready.push_back(t.ready_us);
    return bucketing::HorovodPlan(layout, ready);
  }
  if (name == "hccl") {
    auto p = bucketing::SplitBytesPlan(layout, bucketing::kHcclDefaultSplit);
    if (p.ok()) p->name = "hccl";
    return p;
  }
  if (name == "mg-wfbp") return MgWfbpOn(profile, layout, cost, options);
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown baseline plan \"", name, "\": expected per-tensor, ddp, horovod, hccl or mg-wfbp"));
}

}  // namespace

absl::StatusOr<Plan> OptimalPartitionPlan(const Profile& profile, const CostModel& cost,
                                          const PlannerOptions& o) {
  if (absl::Status s = CheckPlannerInputs(profile, cost, o); !s.ok()) return s;
  auto layout = LayoutFromProfile(profile);
  if (!layout.ok()) return layout.status();
  return OptimalPartitionOn(profile, *layout, cost, o);
}

absl::StatusOr<Plan> MgWfbpPlan(const Profile& profile, const CostModel& cost,
                                const SimOptions& o) {
  if (absl::Status s = CheckInputs(profile, cost, o); !s.ok()) return s;
  auto layout = LayoutFromProfile(profile);
  if (!layout.ok()) return layout.status();
  return MgWfbpOn(profile, *layout, cost, o);
}

std::vector<std::string> BaselineNames() {
  return {"per-tensor", "ddp", "horovod", "hccl", "mg-wfbp"};
}

absl::StatusOr<Plan> BaselinePlan(const std::string& name, const Profile& profile,
                                  const CostModel& cost, const SimOptions& options) {
  if (name == "mg-wfbp") return MgWfbpPlan(profile, cost, options);
  auto layout = LayoutFromProfile(profile);
  if (!layout.ok()) return layout.status();
  return BaselineOn(name, profile, *layout, cost, options);
}

namespace {

absl::Status CheckModelError(double model_error) {
  if (!(model_error >= 0 && model_error <= 10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "planner: the model error must be a fraction in [0, 10], got ", model_error));
  }
  return absl::OkStatus();
}

}  // namespace

size_t ChooseWithinModelError(const std::vector<PlanPrediction>& plans, double model_error,
                              double margin, std::string* why) {
  size_t best = 0;
  for (size_t c = 1; c < plans.size(); ++c) {
    const double a = plans[c].sim.iteration_us, b = plans[best].sim.iteration_us;
    if (Less(a, b) || (!Less(b, a) && plans[c].plan.buckets.size() <
                                          plans[best].plan.buckets.size())) {
      best = c;
    }
  }
  const double best_us = plans[best].sim.iteration_us;
  size_t chosen = best;
  int within = 0;
  for (size_t c = 0; c < plans.size(); ++c) {
    const PlanPrediction& p = plans[c];
    const double allowed = std::max(margin * best_us, model_error * p.sim.exposed_us);
    if (Less(best_us + allowed, p.sim.iteration_us)) continue;
    ++within;
    const size_t nb = p.plan.buckets.size(), cb = plans[chosen].plan.buckets.size();
    if (nb < cb || (nb == cb && Less(p.sim.iteration_us, plans[chosen].sim.iteration_us))) {
      chosen = c;
    }
  }
  if (why != nullptr) {
    const std::string tolerance =
        absl::StrFormat("model error %.0f%% of exposed communication, margin %.1f%%",
                        100 * model_error, 100 * margin);
    const PlanPrediction& b = plans[best];
    if (chosen == best) {
      *why = absl::StrFormat(
          "the best predicted plan (%s, %zu buckets, %.3f ms); none with fewer buckets is "
          "predicted within the model's error of it (%s)",
          b.name, b.plan.buckets.size(), best_us / 1e3, tolerance);
    } else {
      const PlanPrediction& c = plans[chosen];
      *why = absl::StrFormat(
          "the fewest buckets (%zu) of %d plans predicted within the model's error of the best "
          "predicted (%s, %zu buckets, %.3f ms; this plan %.3f ms, +%.2f%%; %s)",
          c.plan.buckets.size(), within, b.name, b.plan.buckets.size(), best_us / 1e3,
          c.sim.iteration_us / 1e3, 100 * (c.sim.iteration_us / best_us - 1), tolerance);
    }
  }
  return chosen;
}

absl::StatusOr<OfflineTuneResult> OfflineTune(const Profile& profile, const CostModel& cost,
                                              const PlannerOptions& o) {
  if (absl::Status s = CheckModelError(o.model_error); !s.ok()) return s;
  if (absl::Status s = CheckPlannerInputs(profile, cost, o); !s.ok()) return s;
  auto sim_of = PreparedSimulation::Create(profile, cost, o.sim);
  if (!sim_of.ok()) return sim_of.status();
  const GradientLayout& layout = sim_of->layout();
  OfflineTuneResult result;
  std::vector<PlanPrediction> candidates;
  // The DP optima, with and without splitting, at the model's latency and,
  // when the model's error is to be allowed for, at dearer ones (fewer
  // buckets: what a choice within the error picks from; without it they
  // could only tie with the best).
  const double max_latency = o.model_error > 0 ? 64 : 1;
  for (double latency = 1; latency <= max_latency; latency *= 2) {
    const CostModel scaled = cost.Scaled(latency, 1);
    for (int pieces : {o.max_pieces, 1}) {
      PlannerOptions po = o;
      po.max_pieces = pieces;
      Plan p = OptimalPartitionOn(profile, layout, scaled, po);
      auto sim = sim_of->Run(p);
      if (!sim.ok()) return sim.status();
      candidates.push_back({latency == 1 ? "tuned" : absl::StrFormat("tuned@lat%g", latency),
                            std::move(p), *std::move(sim), ""});
      if (o.max_pieces <= 1) break;
    }
  }
  for (const std::string& name : BaselineNames()) {
    auto p = BaselineOn(name, profile, layout, cost, o.sim);
    if (!p.ok()) return p.status();
    auto sim = sim_of->Run(*p);
    if (!sim.ok()) return sim.status();
    result.baselines.push_back({name, *p, *sim, ""});
    candidates.push_back({name, *std::move(p), *std::move(sim), ""});
  }
  std::string why;
  const size_t chosen = ChooseWithinModelError(candidates, o.model_error, 0, &why);
  result.tuned = candidates[chosen];
  result.tuned.plan.name = "tuned";
  result.tuned.name = absl::StartsWith(candidates[chosen].name, "tuned")
                          ? "tuned"
                          : absl::StrCat("tuned (= ", candidates[chosen].name, ")");
  result.tuned.why = std::move(why);
  result.lower_bound_us = LowerBoundUs(profile, cost, o.sim);
  return result;
}

absl::StatusOr<std::vector<PlanPrediction>> RankCandidates(const Profile& profile,
                                                           const CostModel& cost,
                                                           const PlannerOptions& o, int count,
                                                           const std::vector<Plan>& extra) {
  if (count < 1) return absl::InvalidArgumentError("planner: candidate count must be at least 1");
  if (absl::Status s = CheckModelError(o.model_error); !s.ok()) return s;
  if (absl::Status s = CheckPlannerInputs(profile, cost, o); !s.ok()) return s;
  auto sim_of = PreparedSimulation::Create(profile, cost, o.sim);
  if (!sim_of.ok()) return sim_of.status();
  const GradientLayout& layout = sim_of->layout();
  std::vector<PlanPrediction> out;
  absl::flat_hash_set<uint64_t> seen;
  auto predict = [&](std::string name, Plan plan) -> absl::StatusOr<PlanPrediction> {
    auto sim = sim_of->Run(plan);
    if (!sim.ok()) return sim.status();
    plan.name = name;
    return PlanPrediction{std::move(name), std::move(plan), *std::move(sim), ""};
  };
  auto add = [&](PlanPrediction p) {
    if (static_cast<int>(out.size()) < count && seen.insert(bucketing::PlanHash(p.plan)).second) {
      out.push_back(std::move(p));
    }
  };
  for (const Plan& p : extra) {
    auto c = predict(p.name.empty() ? "extra" : p.name, p);
    if (!c.ok()) return c.status();
    add(*std::move(c));
  }
  // The DP optimum with the latency scaled: the better of split and whole.
  auto dp_at = [&](double latency) -> absl::StatusOr<PlanPrediction> {
    const CostModel m = cost.Scaled(latency, 1);
    std::optional<PlanPrediction> best;
    for (int pieces : {o.max_pieces, 1}) {
      PlannerOptions po = o;
      po.max_pieces = pieces;
      auto c = predict(latency == 1 ? "tuned" : absl::StrFormat("tuned@lat%g", latency),
                       OptimalPartitionOn(profile, layout, m, po));
      if (!c.ok()) return c.status();
      if (!best || Less(c->sim.iteration_us, best->sim.iteration_us)) best = *std::move(c);
      if (o.max_pieces <= 1) break;
    }
    return *best;
  };
  std::vector<PlanPrediction> baselines;
  for (const std::string& name : BaselineNames()) {
    auto p = BaselineOn(name, profile, layout, cost, o.sim);
    if (!p.ok()) return p.status();
    auto c = predict(name, *std::move(p));
    if (!c.ok()) return c.status();
    baselines.push_back(*std::move(c));
  }
  std::stable_sort(baselines.begin(), baselines.end(),
                   [](const PlanPrediction& a, const PlanPrediction& b) {
                     return Less(a.sim.iteration_us, b.sim.iteration_us);
                   });
  // "tuned": among the optima at latency x1, x2, x4, ... x64 (fewer and
  // fewer buckets), the one chosen within the model's error, with a margin
  // of kRobustMargin of the best at least (Note [Choosing under the model's
  // error]): buckets that buy less than that under the model are not worth
  // what it misses per bucket (a launch, a completion and a wake-up).
  constexpr double kRobustMargin = 0.005;
  std::vector<PlanPrediction> optima;
  for (double latency = 1; latency <= 64; latency *= 2) {
    auto c = dp_at(latency);
    if (!c.ok()) return c.status();
    optima.push_back(*std::move(c));
  }
  std::string why;
  PlanPrediction robust =
      std::move(optima[ChooseWithinModelError(optima, o.model_error, kRobustMargin, &why)]);
  robust.name = "tuned";
  robust.plan.name = "tuned";
  robust.why = std::move(why);
  add(std::move(robust));
  for (double latency : {0.125, 8.0}) {
    auto c = dp_at(latency);
    if (!c.ok()) return c.status();
    add(*std::move(c));
  }
  add(baselines[0]);
  for (double latency : {1.0, 0.5, 2.0, 1.0 / 32, 32.0}) {
    auto c = dp_at(latency);
    if (!c.ok()) return c.status();
    if (latency == 1) c->name = c->plan.name = "tuned@exact";
    add(*std::move(c));
  }
  for (size_t i = 1; i < baselines.size(); ++i) add(baselines[i]);
  return out;
}

}  // namespace fusebox::autotune
