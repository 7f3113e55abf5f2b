#include "perf/overlap.h"

#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "autotune/decision.h"
#include "autotune/measure.h"
#include "autotune/planner.h"
#include "autotune/policy_cache.h"
#include "autotune/simulator.h"
#include "autotune/tuner.h"
#include "bucketing/engine.h"
#include "bucketing/plan_io.h"
#include "bucketing/planners.h"

namespace fusebox::perf {

namespace {

using Clock = std::chrono::steady_clock;
using bucketing::Engine;
using bucketing::GradientLayout;
using autotune::MaxAcrossRanks;
using autotune::Median;
using bucketing::Plan;

// The largest allreduce measured directly for the cost model.
constexpr int64_t kMaxMeasuredBytes = int64_t{512} << 20;

double UsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

void SleepUntil(Clock::time_point t) {
  if (Clock::now() < t) std::this_thread::sleep_until(t);
}

Clock::time_point Plus(Clock::time_point t, double us) {
  return t + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::micro>(us));
}

// t*(m) of docs/design.md from the times measured alone
// (CostCurve::PartitionLowerBound over the least time of each size, t(m)
// among them): at most t(m) itself, and less where the measured table is not
// subadditive (on this VM a 330 MiB plan in 25 MiB buckets beat the bound
// that took t(330 MiB) alone).
double SplitLowerBoundUs(int64_t m, double t_m, const std::vector<autotune::AllReduceSample>& s) {
  if (m <= 0 || !(t_m > 0)) return t_m;
  std::map<int64_t, double> least = {{m, t_m}};
  for (const autotune::AllReduceSample& x : s) {
    if (x.bytes <= 0 || !(x.time_us > 0)) continue;
    auto [it, fresh] = least.emplace(x.bytes, x.time_us);
    if (!fresh) it->second = std::min(it->second, x.time_us);
  }
  autotune::CostCurve curve;
  curve.lines = 1;
  for (const auto& [bytes, us] : least) curve.table.emplace_back(bytes, us);
  return curve.PartitionLowerBound(m);
}

// Times the lower bound's measured sizes once more (every rank), keeping
// the least time of each.
absl::Status RemeasureBound(comm::Communicator& comm, CommModel* model) {
  if (model->bound_sizes.empty()) return absl::OkStatus();
  auto again = autotune::MeasureAllReduce(comm, model->bound_sizes, 1, model->working_set_bytes);
  if (!again.ok()) return again.status();
  size_t i = 0;
  if (model->last_measured) model->t_last_us = std::min(model->t_last_us, (*again)[i++].time_us);
  if (model->total_measured) {
    model->t_total_us = std::min(model->t_total_us, (*again)[i++].time_us);
  }
  return absl::OkStatus();
}

// Note [The cost model beside the plans]
// This VM's allreduce speed changes for seconds at a time (Note [A bound
// measured beside the plans]): t(all) timed before the rounds was up to 1.6x
// the least time the rounds later saw (commit bbc8a60). A
// prediction under sizes timed then describes another phase of the machine
// than the plans' iterations, so every round times every size of the cost
// model again (RetimeBesidePlans), and the prediction uses the median of
// each size over the rounds, the statistic the plans' iterations are
// reported by. The online
// tuner cannot wait for the rounds and searches under the sizes timed
// before them, as before; so does the calibration of the overlap, whose
// slowdown is a ratio of times taken together.
// Times every size of the cost model's samples (every rank; the median of
// three after a warm-up, as autotune::MeasureAllReduce does): the bound's
// two sizes keep their least time, and each size's time is appended to
// (*beside)[i], i the sample's index.
absl::Status RetimeBesidePlans(comm::Communicator& comm, CommModel* model,
                               std::vector<std::vector<double>>* beside) {
  std::vector<int64_t> sizes;
  for (const autotune::AllReduceSample& s : model->samples) sizes.push_back(s.bytes);
  if (sizes.empty()) return absl::OkStatus();
  auto again = autotune::MeasureAllReduce(comm, sizes, 3, model->working_set_bytes);
  if (!again.ok()) return again.status();
  beside->resize(sizes.size());
  const int64_t last = model->last_measured ? model->bound_sizes.front() : -1;
  const int64_t total = model->total_measured ? model->bound_sizes.back() : -1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const double t = (*again)[i].time_us;
    (*beside)[i].push_back(t);
    if (sizes[i] == last) model->t_last_us = std::min(model->t_last_us, t);
    if (sizes[i] == total) model->t_total_us = std::min(model->t_total_us, t);
  }
  return absl::OkStatus();
}

// Times allreduces of 4 KiB x 8^k up to the larger of the two sizes the
// lower bound needs (capped at kMaxMeasuredBytes), and those two sizes
// where they fit; t(m) = a + b*m is the least-squares fit of those times
// (autotune::FitCostModel, on relative error).
absl::StatusOr<CommModel> MeasureComm(comm::Communicator& comm, int64_t last_bytes,
                                      int64_t total_bytes) {
  const int64_t cap = std::min(std::max(last_bytes, total_bytes), kMaxMeasuredBytes);
  const int64_t buf_bytes = std::max<int64_t>(4, cap / 4 * 4);
  auto round = [](int64_t bytes) { return std::max<int64_t>(4, bytes / 4 * 4); };
  std::vector<int64_t> sizes;
  for (int64_t m = 4096; m <= buf_bytes; m *= 8) sizes.push_back(m);
  CommModel model;
  model.working_set_bytes = buf_bytes;
  const bool last_fits = last_bytes <= buf_bytes;
  model.total_measured = total_bytes <= buf_bytes;
  if (last_fits) sizes.push_back(round(last_bytes));
  if (model.total_measured) sizes.push_back(round(total_bytes));
  auto samples = autotune::MeasureAllReduce(comm, sizes, 3, model.working_set_bytes);
  if (!samples.ok()) return samples.status();
  model.samples = *samples;
  size_t next = sizes.size() - (last_fits ? 1 : 0) - (model.total_measured ? 1 : 0);
  if (last_fits) model.t_last_us = model.samples[next++].time_us;
  if (model.total_measured) model.t_total_us = model.samples[next++].time_us;
  // The bound's two sizes five more times, keeping the least: a lower bound
  // wants the cost without interference, and interference only adds (on a
  // busy machine the median of 3 above once doubled t(all), and with it the
  // "bound", which measured plans then beat). The plans' rounds measure
  // them again (RemeasureBound).
  model.last_measured = last_fits;
  if (last_fits) model.bound_sizes.push_back(round(last_bytes));
  if (model.total_measured) model.bound_sizes.push_back(round(total_bytes));
  for (int k = 0; k < 5; ++k) {
    if (absl::Status s = RemeasureBound(comm, &model); !s.ok()) return s;
  }
  if (comm.size() > 1) {
    auto fit = autotune::FitCostModel(model.samples, comm.size(), "");
    if (fit.ok()) {
      const autotune::CostCurve line = fit->Curve(comm.size(), comm.size());
      model.alpha_us = line.latency_us[0];
      model.beta_us_per_byte = line.us_per_byte[0];
    }
  }
  if (!last_fits) model.t_last_us = model.alpha_us + model.beta_us_per_byte * last_bytes;
  if (!model.total_measured) {
    model.t_total_us = model.alpha_us + model.beta_us_per_byte * total_bytes;
  }
  model.t_last_first_us = model.t_last_us;
  model.t_total_first_us = model.t_total_us;
  return model;
}

// The cost model fitted to `samples` (this communicator's, of `world`
// ranks) with them attached as its measured table (autotune::MeasuredAt).
absl::StatusOr<autotune::CostModel> FitAndAttach(
    const std::vector<autotune::AllReduceSample>& samples, int world, std::string source) {
  auto fitted = autotune::FitCostModel(samples, world, std::move(source));
  if (!fitted.ok()) return fitted.status();
  return autotune::MeasuredAt(*std::move(fitted), samples, world);
}

// A plan name usable in a file name (plan files are named by their path).
std::string FileLabel(std::string name) {
  std::replace_if(name.begin(), name.end(), [](char c) { return c == '/' || c == ' '; }, '_');
  return name;
}

absl::StatusOr<Plan> MakePlan(const std::string& spec, const GradientLayout& layout,
                              const autotune::Profile& profile, const autotune::CostModel* cost,
                              const autotune::SimOptions& sim) {
  if (absl::EndsWith(spec, ".json")) return bucketing::ReadPlanFile(spec, layout);
  // DDP with a hand-set cap ("ddp-cap1mb"): what users run instead of 25 MiB.
  if (absl::StartsWith(spec, "ddp-cap") && absl::EndsWith(spec, "mb")) {
    double mb = 0;
    if (!absl::SimpleAtod(spec.substr(7, spec.size() - 9), &mb) || !(mb > 0) || mb > 1e6) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan \"", spec, "\": expected ddp-cap<MiB>mb with a positive size, e.g. ddp-cap1mb"));
    }
    bucketing::DdpOptions o;
    o.bucket_cap_bytes = std::max<int64_t>(1, static_cast<int64_t>(mb * (1 << 20)));
    o.first_bucket_bytes = std::min(o.first_bucket_bytes, o.bucket_cap_bytes);
    Plan p = bucketing::DdpPlan(layout, o);
    p.name = spec;
    return p;
  }
  if (spec == "mg-wfbp" && cost == nullptr) {
    return absl::FailedPreconditionError(
        "plan mg-wfbp needs a cost model, and the allreduce times measured here did not fit one");
  }
  for (const std::string& name : autotune::BaselineNames()) {
    if (spec == name) {
      static const autotune::CostModel kUnused;
      return autotune::BaselinePlan(name, profile, cost != nullptr ? *cost : kUnused, sim);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown plan \"", spec,
      "\": expected per-tensor, ddp, ddp-cap<MiB>mb, horovod, hccl, mg-wfbp, tuned or a .json plan "
      "file"));
}

// One rank's replay of the profile: gradient buffers (views into the
// engine's fusion buffers, or its own) and the timed iteration.
class Replay {
 public:
  Replay(comm::Communicator& comm, const GradientLayout& layout, const autotune::Profile& profile,
         bool views)
      : comm_(comm), layout_(layout), profile_(profile), views_(views), own_(layout.size()),
        grads_(layout.size(), nullptr) {}

  // The slowest rank's {iteration, backward, exposed, copy} in us.
  absl::StatusOr<std::vector<double>> Iterate(Engine& engine,
                                              const std::function<absl::Status()>& finish, int it) {
    if (absl::Status s = comm::BarrierSync(comm_); !s.ok()) return s;
    const auto t0 = Clock::now();
    const double t0_us = engine.NowUs();
    // The iteration starts with forward (where a training step starts):
    // a policy attached to the engine acts here, inside the timed step, and
    // may install another plan, which moves the fusion buffers: gradients
    // are pointed at their places after it.
    if (absl::Status s = engine.StartIteration(); !s.ok()) return s;
    Prepare(engine);
    SleepUntil(Plus(t0, profile_.forward_us));
    const auto bstart = Clock::now();
    for (int id = 0; id < layout_.size(); ++id) {
      SleepUntil(Plus(bstart, profile_.tensors[id].ready_us));
      if (absl::Status s = engine.MarkReady(id, grads_[id], layout_.tensor(id).numel); !s.ok()) {
        return s;
      }
    }
    SleepUntil(Plus(bstart, profile_.backward_us));
    const double bend = UsSince(t0);
    if (absl::Status s = finish(); !s.ok()) return s;
    const double end = UsSince(t0);
    const bucketing::IterationStats st = engine.last_stats();
    if (auto* tl = engine.timeline()) {
      tl->Span("forward", bucketing::Track::kCompute, t0_us, profile_.forward_us, it);
      tl->Span("backward", bucketing::Track::kCompute, t0_us + profile_.forward_us,
               bend - profile_.forward_us, it);
    }
    std::vector<double> v = {end, bend - profile_.forward_us, end - bend,
                             st.copy_in_us + st.copy_back_us};
    if (absl::Status s = MaxAcrossRanks(comm_, v); !s.ok()) return s;
    last_start_delays_ = st.start_delay_us;
    last_reactions_ = st.start_reaction_us;
    // This rank's own times for the gap report, from the engine's origin.
    const double shift = st.start_us - t0_us;
    last_stats_ = st;
    last_end_us_ = end - shift;
    last_bend_us_ = bend - shift;
    last_forward_us_ = profile_.forward_us - shift;
    return v;
  }

  // This rank's last Iterate: the engine's record and its iteration end,
  // backward end and backward start, after the engine's start.
  const bucketing::IterationStats& last_stats() const { return last_stats_; }
  double last_end_us() const { return last_end_us_; }
  double last_backward_end_us() const { return last_bend_us_; }
  double last_forward_us() const { return last_forward_us_; }

  // This rank's launch-to-start of every bucket of the last Iterate.
  const std::vector<double>& last_start_delays() const { return last_start_delays_; }
  const std::vector<double>& last_reactions() const { return last_reactions_; }

 private:
  std::vector<double> last_start_delays_;
  std::vector<double> last_reactions_;
  bucketing::IterationStats last_stats_;
  double last_end_us_ = 0, last_bend_us_ = 0, last_forward_us_ = 0;
  // Points each gradient at its place in the fusion buffers (views) or at
  // its own buffer; redone whenever those places move (a new engine or
  // plan; compared by address, since a new engine may reuse a freed one's).
  void Prepare(Engine& engine) {
    bool same = !storage_.empty();
    for (int id = 0; id < layout_.size() && same; ++id) {
      same = engine.TensorStorage(id) == storage_[id];
    }
    if (same) return;
    storage_.assign(layout_.size(), nullptr);
    for (int id = 0; id < layout_.size(); ++id) storage_[id] = engine.TensorStorage(id);
    for (int id = 0; id < layout_.size(); ++id) {
      const int64_t bytes = layout_.bytes(id);
      void* storage = engine.TensorStorage(id);
      if (views_ && storage != nullptr) {
        // A computed gradient, in place: zeroed once per place (a retained
        // plan's buffers come back to the same places).
        if (zeroed_.insert(storage).second) std::memset(storage, 0, bytes);
        grads_[id] = storage;
        own_[id].reset();
      } else {
        if (own_[id] == nullptr) own_[id].reset(new char[std::max<int64_t>(bytes, 1)]());
        grads_[id] = own_[id].get();
      }
    }
  }

  comm::Communicator& comm_;
  const GradientLayout& layout_;
  const autotune::Profile& profile_;
  const bool views_;
  std::vector<std::unique_ptr<char[]>> own_;
  std::vector<void*> grads_;
  std::vector<void*> storage_;  // the engine's TensorStorage when last prepared
  std::set<void*> zeroed_;
};

// On every rank, `values` as the rank with the largest `key` holds them (the
// lowest such rank on a tie): every other rank contributes the smallest
// double, so the maximum is the chosen rank's, negative values included.
absl::StatusOr<std::vector<double>> ValuesOfRankWithLargest(comm::Communicator& comm, double key,
                                                            std::vector<double> values) {
  std::vector<double> largest = {key};
  if (absl::Status s = MaxAcrossRanks(comm, largest); !s.ok()) return s;
  std::vector<double> who = {key == largest[0] ? -static_cast<double>(comm.rank())
                                               : -static_cast<double>(comm.size())};
  if (absl::Status s = MaxAcrossRanks(comm, who); !s.ok()) return s;
  if (comm.rank() != static_cast<int>(-who[0])) {
    std::fill(values.begin(), values.end(), std::numeric_limits<double>::lowest());
  }
  if (absl::Status s = MaxAcrossRanks(comm, values); !s.ok()) return s;
  return values;
}

// What transfers cost beyond t(m) alone while backward runs and after it.
struct OverlapCalibration {
  autotune::OverlapCost during;  // SimOptions::overlap_*
  autotune::OverlapCost after;   // SimOptions::after_backward_*
};

// Every rank gets the fit of the rank whose fit predicts the most transfer
// time for its own samples (one rank's slowdown and overhead together, not
// the larger of each).
absl::StatusOr<autotune::OverlapCost> FitOnEveryRank(
    comm::Communicator& comm, const std::vector<autotune::OverlapSample>& samples) {
  const autotune::OverlapCost fit = autotune::FitOverlapCost(samples);
  double predicted = 0;
  for (const autotune::OverlapSample& p : samples) {
    // Only the samples the fit used (a NaN key would match no rank).
    if (autotune::IsFittable(p)) predicted += fit.slowdown * p.alone_us + fit.overhead_us;
  }
  auto f = ValuesOfRankWithLargest(comm, predicted, {fit.slowdown, fit.overhead_us});
  if (!f.ok()) return f.status();
  return autotune::OverlapCost{(*f)[0], (*f)[1]};
}

// Replays DDP's default plan and DDP with 2 MiB buckets (one warm-up each,
// then `iterations` recorded) and fits, over the buckets that started and
// finished while backward ran, their transfer time against t(m) alone
// (autotune::FitOverlapCost, Note [Calibrating the overlap] in
// autotune/simulator.cc), and the same over the buckets that started after
// backward's end (FitOnEveryRank for each). Neither plan is one of the
// benchmark's held-out plans (perf/bench_gap.py). One rank: no overlap to
// calibrate.
absl::StatusOr<OverlapCalibration> CalibrateOverlap(
    comm::Communicator& comm, Replay& replay, const GradientLayout& layout,
    const bucketing::EngineOptions& eopts, const std::function<double(int64_t)>& isolated_us,
    int iterations = 3) {
  if (comm.size() < 2) return OverlapCalibration{};
  bucketing::EngineOptions o = eopts;
  o.record_timeline = false;
  bucketing::DdpOptions small;
  small.bucket_cap_bytes = 2 * bucketing::kMiB;
  autotune::OverlapSamples samples;
  for (const bucketing::Plan& plan :
       {bucketing::DdpPlan(layout), bucketing::DdpPlan(layout, small)}) {
    auto engine = Engine::Create(comm, layout, plan, o);
    if (!engine.ok()) return engine.status();
    Engine* e = engine->get();
    for (int it = 0; it <= iterations; ++it) {
      auto v = replay.Iterate(
          *e, [e] { return e->Finish(); }, it);
      if (!v.ok()) return v.status();
      if (it == 0) continue;
      autotune::AddOverlapSamples(replay.last_stats().bucket_times, replay.last_backward_end_us(),
                                  isolated_us, &samples);
    }
  }
  OverlapCalibration c;
  auto d = FitOnEveryRank(comm, samples.during);
  if (!d.ok()) return d.status();
  c.during = *d;
  auto a = FitOnEveryRank(comm, samples.after);
  if (!a.ok()) return a.status();
  c.after = *a;
  return c;
}

// The gap terms of the rank whose iteration was longest (the one the
// table's time of that iteration describes: the slowest rank's; the lowest
// such rank on a tie), on every rank. Called per iteration, so that the
// terms summed over iterations describe the same steps as the table, also
// when the slowest rank changes from one iteration to the next.
absl::StatusOr<GapTerms> GapOfSlowestRank(comm::Communicator& comm, const GapTerms& mine) {
  std::vector<double> mine_v = {mine.iteration_us, mine.bound_us,
                                static_cast<double>(mine.chain_buckets)};
  for (const auto& [name, value] : GapTermList(mine)) mine_v.push_back(value);
  auto chosen = ValuesOfRankWithLargest(comm, mine.iteration_us, std::move(mine_v));
  if (!chosen.ok()) return chosen.status();
  const std::vector<double>& v = *chosen;
  GapTerms g;
  g.iteration_us = v[0];
  g.bound_us = v[1];
  g.chain_buckets = static_cast<int>(v[2]);
  g.late_gradients_us = v[3];
  g.window_us = v[4];
  g.launch_to_start_us = v[5];
  g.transfer_excess_us = v[6];
  g.copy_back_us = v[7];
  g.plan_us = v[8];
  g.tail_us = v[9];
  return g;
}

// RunOverlap's stages, in the order it calls them: (1) fit
// (MeasureAndFit, MakePlans, PrintHeader), (2) calibrate (CalibrateStage)
// and tune (TuneStage), (3) replay (ReplayRounds), (4) report
// (ReportStage). Every stage is collective where the run is: each rank
// calls them in this order, and each issues its collectives in the same
// order on every rank.

// What the fit hands on to the later stages.
struct FitOutput {
  autotune::Profile profile;  // the given profile, its compute scaled
  // The simulator's view of this run; its overlap terms are set by
  // CalibrateStage.
  autotune::SimOptions sim;
  // Fitted to the sizes timed before the rounds (CommModel::samples); none
  // with one rank or where they fit none.
  std::optional<autotune::CostModel> cost;
};

// Every plan of OverlapOptions::plans, in order, and the tuner's figures.
struct PlanSet {
  // Empty at "tuned" until TuneStage fills it.
  std::vector<std::optional<Plan>> plans;
  // The tuner's figures for the "tuned" row (tuning_iterations -1: none).
  OverlapResult tuned;
};

// What every stage after the fit reads: fixed for the rest of the run.
struct OverlapRun {
  comm::Communicator& comm;
  const OverlapOptions& options;
  const GradientLayout& layout;
  const autotune::Profile& profile;  // scaled (FitOutput::profile)
  std::FILE* out;                    // rank 0's table; nullptr elsewhere
  Replay& replay;
  bucketing::EngineOptions eopts;
  // t(m) alone on this communicator (IsolatedUs).
  std::function<double(int64_t)> isolated_us;
};

// What the plans' rounds measured (ReplayRounds), per plan where a vector
// is indexed by plan.
struct RoundsOutput {
  // The lower bound before the rounds, and the last one, from the least
  // times over the rounds (Note [A bound measured beside the plans]).
  double first_bound_us = 0;
  double bound_us = 0;
  std::vector<GapTerms> gaps;  // per plan: this rank's sum over measured iterations
  std::vector<std::vector<std::vector<double>>> samples;  // per plan: iterations x 4
  std::vector<std::vector<double>> delays;  // per plan: this rank's launch-to-start, us
  std::vector<std::vector<double>> reactions;  // the same less queueing
  // Note [The cost model beside the plans]: per sample size, its time in
  // every round.
  std::vector<std::vector<double>> beside;
  std::unique_ptr<Engine> engine;  // the plans' engine, after the last round
};

// The cost models fitted to the sizes timed beside the plans.
struct BesideCosts {
  // Note [The cost model beside the plans]: the medians over the rounds.
  std::optional<autotune::CostModel> median;
  // Each round's own sizes as a cost model, for the per-round predictions
  // (OverlapResult::predicted_rounds_exposed_us).
  std::vector<autotune::CostModel> rounds;
};

absl::Status ValidateOptions(const OverlapOptions& options, const autotune::Profile& base_profile) {
  if (options.iters < 1 || options.warmup < 0) {
    return absl::InvalidArgumentError("overlap: iterations must be >= 1 and warm-up >= 0");
  }
  if (options.plans.empty()) return absl::InvalidArgumentError("overlap: no plans to run");
  if (!std::isfinite(options.compute_scale) || options.compute_scale > 1e6) {
    return absl::InvalidArgumentError("overlap: compute scale must be finite and at most 1e6");
  }
  if (base_profile.tensors.empty()) {
    return absl::InvalidArgumentError("overlap: the profile has no gradients");
  }
  return absl::OkStatus();
}

// Stage 1, fit: times allreduces on the communicator (MeasureComm) and
// memcpy (every rank), scales the profile's compute and fits the cost
// model; fills the report's description of the run.
absl::StatusOr<FitOutput> MeasureAndFit(comm::Communicator& comm,
                                        const autotune::Profile& base_profile,
                                        const GradientLayout& layout, const OverlapOptions& options,
                                        OverlapReport* report) {
  report->model = base_profile.model;
  report->ranks = comm.size();
  report->total_bytes = layout.total_bytes();
  const int64_t last_bytes = layout.bytes(layout.size() - 1);
  auto model = MeasureComm(comm, last_bytes, report->total_bytes);
  if (!model.ok()) return model.status();
  report->comm = *model;
  if (options.compute_scale <= 0 && !(options.comm_ratio > 0 && options.comm_ratio <= 1e6)) {
    return absl::InvalidArgumentError("overlap: the communication ratio must be in (0, 1e6]");
  }
  report->compute_scale =
      options.compute_scale > 0
          ? options.compute_scale
          : report->comm.t_total_us / (options.comm_ratio * base_profile.backward_us);
  FitOutput fit;
  fit.profile = autotune::ScaleCompute(base_profile, report->compute_scale);
  if (absl::Status s = autotune::ValidateProfile(fit.profile); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("overlap: scaled profile: ", s.message()));
  }
  report->forward_us = fit.profile.forward_us;
  report->backward_us = fit.profile.backward_us;

  // The simulator's view of this run: the cost model fitted to the sizes
  // just measured (the same samples on every rank), the engine's settings.
  autotune::SimOptions& sim = fit.sim;
  sim.world_size = comm.size();
  sim.ranks_per_node = options.ranks_per_node > 0 ? std::min(options.ranks_per_node, comm.size())
                                                 : comm.size();
  sim.max_in_flight = options.max_in_flight;
  sim.schedule = options.schedule;
  sim.views = options.views;
  // Copies (without views, and of split gradients) compete for the host's
  // memory bandwidth with every other rank: measured so, not assumed.
  auto copy_gbps = autotune::MeasureCopyGbps(comm, int64_t{64} << 20);
  if (!copy_gbps.ok()) return copy_gbps.status();
  sim.copy_gbps = *copy_gbps;
  report->copy_gbps = *copy_gbps;
  if (comm.size() > 1) {
    auto fitted = FitAndAttach(report->comm.samples, comm.size(),
                               absl::StrCat("fusebox-perf overlap on ", comm.backend()));
    if (fitted.ok()) {
      fit.cost = *std::move(fitted);
      report->cost_model = fit.cost->Describe();
    }
  }

  if (options.predict_with.has_value()) {
    report->cost_model = absl::StrCat("given: ", options.predict_with->Describe());
  }
  return fit;
}

// Creates the directories the run writes to, then makes the plans.
absl::StatusOr<PlanSet> MakePlans(const OverlapOptions& options, const GradientLayout& layout,
                                  const FitOutput& fit) {
  for (const std::string* dir : {&options.save_plans_dir, &options.timeline_dir}) {
    std::error_code ec;
    if (!dir->empty()) std::filesystem::create_directories(*dir, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create directory ", *dir, ": ", ec.message()));
    }
  }
  // Plans made up front (so that a bad name fails before anything runs);
  // "tuned" is found by the tuner when its turn comes.
  PlanSet set;
  for (const std::string& spec : options.plans) {
    if (spec == "tuned") {
      set.plans.emplace_back();
      continue;
    }
    auto p = MakePlan(spec, layout, fit.profile, fit.cost ? &*fit.cost : nullptr, fit.sim);
    if (!p.ok()) return p.status();
    set.plans.push_back(*std::move(p));
  }
  return set;
}

// The table's header: the run, the communicator's times, the columns.
void PrintHeader(const OverlapRun& run, const OverlapReport& report) {
  std::FILE* const out = run.out;
  if (out == nullptr) return;
  const OverlapOptions& options = run.options;
  const autotune::Profile& profile = run.profile;
  const int64_t last_bytes = run.layout.bytes(run.layout.size() - 1);
  std::fprintf(out,
               "# fusebox-perf overlap: model %s, %d gradients, %.1f MiB; backend %s, %d "
               "ranks; iters %d, warmup %d; %s; max in flight %d, %s schedule\n",
               profile.model.c_str(), run.layout.size(), report.total_bytes / 1048576.0,
               run.comm.backend().c_str(), run.comm.size(), options.iters, options.warmup,
               options.views ? "gradients in place in fusion buffers (views)"
                             : "gradients copied in and out",
               options.max_in_flight,
               options.schedule == bucketing::Schedule::kPlanOrder ? "plan-order"
                                                                   : "forward-priority");
  std::fprintf(out,
               "# compute scale %.4g: forward %.2f ms, backward %.2f ms, first gradient at "
               "%.2f ms, last (%.2f MiB) at %.2f ms\n",
               report.compute_scale, profile.forward_us / 1e3, profile.backward_us / 1e3,
               profile.tensors.front().ready_us / 1e3, last_bytes / 1048576.0,
               profile.tensors.back().ready_us / 1e3);
  std::fprintf(out,
               "# allreduce on this communicator: t(m) = %.1f us + m * %.4f ns/B; t(all %.1f "
               "MiB) = %.2f ms (%s), t(last) = %.3f ms, each call on the next part of %.1f "
               "MiB (data out of cache); memcpy %.2f GB/s per rank, all copying\n",
               report.comm.alpha_us, report.comm.beta_us_per_byte * 1e3,
               report.total_bytes / 1048576.0, report.comm.t_total_us / 1e3,
               report.comm.total_measured ? "measured" : "fitted", report.comm.t_last_us / 1e3,
               report.comm.working_set_bytes / 1048576.0, report.copy_gbps);
  std::fprintf(out, "# lower bound = forward + max(T_b, T_last + t(last), T_first + t(all)) "
                    "(docs/design.md); times are medians over iterations of the slowest rank;\n");
  if (options.predict_with.has_value()) {
    std::fprintf(out, "# pred = autotune::Simulate under the given cost model: %s\n",
                 options.predict_with->Describe().c_str());
  } else {
    std::fprintf(out,
                 "# pred = autotune::Simulate under the cost model fitted to the sizes above, "
                 "timed again in every round (their medians are printed after the rounds)\n");
  }
  std::fprintf(out,
               "# plans measured in %d randomised blocks (each visit: %d warm-up iterations "
               "after the switch, then one measured); iter = median [95%% CI]\n",
               options.iters, options.warmup);
  std::fprintf(out,
               "# start p50/p99 = launch-to-start of every bucket (us), less the time it "
               "queued behind the previous bucket's allreduce: the executor's reaction\n");
  std::fprintf(out, "#\n# %-14s %7s %10s %17s %10s %10s %9s %10s %10s %8s %10s %9s %17s\n",
               "plan", "buckets", "iter(ms)", "95% CI", "bwd(ms)", "exposed", "copy(ms)",
               "bound(ms)", "iter/bound", "iter/cmp", "pred(ms)", "pred/iter",
               "start p50/p99(us)");
}

bucketing::EngineOptions EngineOptionsFor(const OverlapOptions& options) {
  bucketing::EngineOptions eopts;
  eopts.max_in_flight = options.max_in_flight;
  eopts.worker_nice = options.worker_nice;
  eopts.launch_on_completion = options.launch_on_completion;
  eopts.worker_slice = options.worker_slice;
  eopts.schedule = options.schedule;
  eopts.record_timeline = !options.timeline_dir.empty();
  return eopts;
}

// t(m) alone on this communicator: the measured sizes where there are
// some (interpolated), else the fitted line (`model`'s a and b, which
// nothing changes after MeasureComm).
std::function<double(int64_t)> IsolatedUs(const CommModel& model, const FitOutput& fit, int world) {
  std::function<double(int64_t)> isolated_us = [alpha_us = model.alpha_us,
                                                beta = model.beta_us_per_byte](int64_t m) {
    return alpha_us + beta * static_cast<double>(m);
  };
  if (fit.cost.has_value()) {
    isolated_us = [curve = fit.cost->Curve(world, fit.sim.ranks_per_node)](int64_t m) {
      return curve(m);
    };
  }
  return isolated_us;
}

// A line of progress, on rank 0 (OverlapOptions::progress).
void Progress(const OverlapRun& run, const std::string& line) {
  if (run.options.progress && run.comm.rank() == 0) run.options.progress(line);
}

// Stage 2, calibrate: the overlap terms into the report and `sim`, and
// printed.
absl::Status CalibrateStage(const OverlapRun& run, autotune::SimOptions* sim,
                            OverlapReport* report) {
  const OverlapOptions& options = run.options;
  // How much slower transfers run while backward does, and what each
  // collective started then pays (the simulator's overlap_slowdown and
  // overlap_overhead_us), and the same two after backward: given, or
  // measured on a calibration replay of DDP's default plan and DDP with 2 MiB
  // buckets before anything else runs.
  report->overlap_slowdown = options.overlap_slowdown;
  report->overlap_overhead_us = options.overlap_overhead_us;  // validated by the simulator
  report->after_backward_slowdown = options.after_backward_slowdown;
  report->after_backward_overhead_us = options.after_backward_overhead_us;
  if (report->overlap_slowdown <= 0) {
    Progress(run,
             "calibrating the overlap (DDP's default plan and 2 MiB buckets, 4 iterations each)");
    auto f = CalibrateOverlap(run.comm, run.replay, run.layout, run.eopts, run.isolated_us);
    if (!f.ok()) return f.status();
    report->overlap_slowdown = f->during.slowdown;
    report->overlap_overhead_us = f->during.overhead_us;
    report->after_backward_slowdown = f->after.slowdown;
    report->after_backward_overhead_us = f->after.overhead_us;
  }
  sim->overlap_slowdown = report->overlap_slowdown;
  sim->overlap_overhead_us = report->overlap_overhead_us;
  sim->after_backward_slowdown = report->after_backward_slowdown;
  sim->after_backward_overhead_us = report->after_backward_overhead_us;
  if (run.out != nullptr) {
    std::fprintf(run.out,
                 "# overlap: transfers while backward runs take %.2f times t(m) alone plus %.0f us "
                 "per collective, after backward %.2f times plus %.0f us (%s); pred uses them\n",
                 report->overlap_slowdown, report->overlap_overhead_us,
                 report->after_backward_slowdown, report->after_backward_overhead_us,
                 options.overlap_slowdown > 0
                     ? "given"
                     : "calibrated on 3 replayed iterations each of DDP's default plan and DDP "
                       "with 2 MiB buckets");
    std::fflush(run.out);
  }
  return absl::OkStatus();
}

// The rest of stage 2, tune: runs the online tuner where a plan is "tuned"
// and puts the plan it keeps in every "tuned" slot of `set`, its figures
// in set->tuned.
absl::Status TuneStage(const OverlapRun& run, const FitOutput& fit, PlanSet* set) {
  const OverlapOptions& options = run.options;
  std::FILE* const out = run.out;
  std::vector<std::optional<Plan>>& plans = set->plans;
  // The online tuner first, on its own engine: its iterations and their
  // cost are reported, and the plan it keeps is then measured like every
  // other plan (below), not in a slot of its own after its own warm-up.
  OverlapResult& tuned_info = set->tuned;
  for (size_t pi = 0; pi < plans.size(); ++pi) {
    if (plans[pi].has_value()) continue;
    autotune::PlanChoice choice;
    choice.cache_dir = options.cache_dir;
    choice.warn = [out](const std::string& w) {
      if (out != nullptr) std::fprintf(out, "# warning: %s\n", w.c_str());
    };
    autotune::TunerOptions& to = choice.tuner;
    to.planner.sim = fit.sim;
    if (!options.tune_split) to.planner.max_pieces = 1;
    to.candidates = options.tune_candidates;
    to.screening_blocks = options.tune_blocks;
    to.verify_pairs = options.tune_pairs;
    to.cost_model = fit.cost;
    to.backend = run.comm.backend();
    to.network = options.network;
    to.ranks_per_node = fit.sim.ranks_per_node;
    to.model_label = run.profile.model;
    to.check_every = 0;  // a benchmark measures the kept plan below; it does not monitor
    to.log = [out](const std::string& line) {
      if (out != nullptr) std::fprintf(out, "# %s\n", line.c_str());
    };
    to.wall_clock_s = [] { return static_cast<int64_t>(std::time(nullptr)); };
    bucketing::EngineOptions topts = run.eopts;
    topts.record_timeline = false;
    auto made = autotune::CreateEngineWithPolicy(run.comm, run.layout, topts, std::move(choice));
    if (!made.ok()) return made.status();
    autotune::OnlineTuner* tuner = made->tuner;
    constexpr int kMaxTuningIterations = 1000;
    // One more iteration after the decision: the policy installs the kept
    // plan at the start of the next one.
    for (int it = 0; tuner->phase() != autotune::TunerPhase::kTuned; ++it) {
      if (it == kMaxTuningIterations) {
        return absl::InternalError("overlap: the tuner did not finish in 1000 iterations");
      }
      Engine& te = *made->engine;
      if (it % 10 == 0) {
        Progress(run, absl::StrFormat("tuning: iteration %d (%d plans to measure)", it,
                                      static_cast<int>(tuner->measured().size())));
      }
      auto v = run.replay.Iterate(te, [&te] { return te.Finish(); }, it);
      if (!v.ok()) return v.status();
    }
    auto v = run.replay.Iterate(*made->engine, [&made] { return made->engine->Finish(); }, 0);
    if (!v.ok()) return v.status();
    tuned_info.tuning_iterations = tuner->tuning_iterations();
    tuned_info.tuning_cost_us = tuner->tuning_cost_us();
    tuned_info.cache_hit = tuner->cache_hit();
    tuned_info.chosen = tuner->cache_hit() ? std::string("cached")
                                           : tuner->measured()[tuner->chosen()].name;
    tuned_info.decision = tuner->decision();
    Plan kept = made->engine->plan();
    kept.name = "tuned";
    made->engine.reset();  // one set of fusion buffers at a time
    plans[pi] = std::move(kept);
    break;  // one tuner per run: a second "tuned" measures the same plan
  }
  for (size_t pi = 0; pi < plans.size(); ++pi) {
    if (!plans[pi].has_value()) {
      plans[pi] = *plans[std::find(options.plans.begin(), options.plans.end(), "tuned") -
                         options.plans.begin()];
    }
  }
  return absl::OkStatus();
}

// The lower bound under the communicator's times as they stand (Note [A
// bound measured beside the plans]).
double BoundNowUs(const OverlapRun& run, const OverlapReport& report) {
  const GradientLayout& layout = run.layout;
  const autotune::Profile& profile = run.profile;
  return LowerBoundUs(
      profile.forward_us, profile.backward_us, profile.tensors.front().ready_us,
      profile.tensors.back().ready_us,
      SplitLowerBoundUs(layout.bytes(layout.size() - 1), report.comm.t_last_us,
                        report.comm.samples),
      SplitLowerBoundUs(report.total_bytes, report.comm.t_total_us, report.comm.samples));
}

// Per bucket of `plan`, the profile's time its last gradient is ready.
std::vector<double> ProfileReadyUs(const Plan& plan, const autotune::Profile& profile) {
  std::vector<double> ready_us;
  for (const bucketing::Bucket& b : plan.buckets) {
    double ready = 0;
    for (const bucketing::Slice& sl : b.slices) {
      ready = std::max(ready, profile.tensors[sl.tensor].ready_us);
    }
    ready_us.push_back(ready);
  }
  return ready_us;
}

// Records plan `pi`'s measured iteration `v` (Replay::Iterate's, just
// run): its times, this rank's launch-to-start of its buckets, and the gap
// terms of the slowest rank (every rank: GapOfSlowestRank).
absl::Status RecordVisit(const OverlapRun& run, int pi, const std::vector<double>& v,
                         const std::vector<double>& profile_ready, RoundsOutput* rounds) {
  const Replay& replay = run.replay;
  rounds->samples[pi].push_back(v);
  const std::vector<double>& d = replay.last_start_delays();
  rounds->delays[pi].insert(rounds->delays[pi].end(), d.begin(), d.end());
  const std::vector<double>& a = replay.last_reactions();
  rounds->reactions[pi].insert(rounds->reactions[pi].end(), a.begin(), a.end());
  GapInput gi;
  gi.stats = &replay.last_stats();
  gi.forward_us = replay.last_forward_us();
  gi.iteration_us = replay.last_end_us();
  gi.backward_end_us = replay.last_backward_end_us();
  gi.backward_us = run.profile.backward_us;
  gi.bound_us = rounds->bound_us;
  gi.profile_ready_us = profile_ready;
  gi.isolated_us = run.isolated_us;
  gi.max_in_flight = run.options.max_in_flight;
  auto slowest = GapOfSlowestRank(run.comm, ExplainGap(gi));
  if (!slowest.ok()) return slowest.status();
  rounds->gaps[pi] += *slowest;
  return absl::OkStatus();
}

// Writes this rank's timeline of the plan labelled `label` and clears it.
absl::Status WriteTimeline(const OverlapRun& run, Engine* e, const std::string& label) {
  const int rank = run.comm.rank();
  const std::string path = absl::StrFormat("%s/%s-%s-rank%d.json", run.options.timeline_dir,
                                           run.profile.model, FileLabel(label), rank);
  if (absl::Status s = e->timeline()->WriteChromeTrace(
          path, rank, absl::StrFormat("rank %d, plan %s", rank, label));
      !s.ok()) {
    return s;
  }
  e->timeline()->Clear();
  return absl::OkStatus();
}

// Stage 3, replay: the plans' rounds on one engine, the cost model's sizes
// timed again at the start of each (into report->comm).
absl::StatusOr<RoundsOutput> ReplayRounds(const OverlapRun& run,
                                          const std::vector<std::optional<Plan>>& plans,
                                          OverlapReport* report) {
  const OverlapOptions& options = run.options;
  // Every plan in randomised blocks (Note [Decisions under noise] in
  // autotune/decision.h): each round visits every plan once in a fresh
  // order, each visit runs `warmup` iterations after the switch and then
  // one measured iteration, so every plan gets the same warm-up and slow
  // drift of the machine falls on all plans alike.
  const int np = static_cast<int>(plans.size());
  // Note [A bound measured beside the plans]: the bound's allreduces are
  // timed again at the start of every round, and the least time over the
  // whole run is the bound. On a machine whose speed changes for seconds at
  // a time (this project's VM: commit 328fdce) a bound
  // taken once, before the plans, was beaten by plans measured in a faster
  // phase (best/bound 0.82-0.96); taken beside them, it holds in the phase
  // they ran in. Gap terms are computed against the bound known at each
  // iteration; the difference to the final one goes to their plan term.
  // t(last) and t(all) enter as t*: the least any split of them costs.
  RoundsOutput rounds;
  rounds.first_bound_us = BoundNowUs(run, *report);
  rounds.bound_us = rounds.first_bound_us;
  rounds.gaps.resize(np);
  std::vector<std::vector<double>> profile_ready(np);
  for (int pi = 0; pi < np; ++pi) profile_ready[pi] = ProfileReadyUs(*plans[pi], run.profile);
  rounds.samples.resize(np);
  rounds.delays.resize(np);
  rounds.reactions.resize(np);
  auto created = Engine::Create(run.comm, run.layout, *plans[0], run.eopts);
  if (!created.ok()) return created.status();
  rounds.engine = *std::move(created);
  int last = -1;
  for (int round = 0; round < options.iters; ++round) {
    Progress(run, absl::StrFormat("round %d/%d of %d plans", round + 1, options.iters, np));
    if (absl::Status s = RetimeBesidePlans(run.comm, &report->comm, &rounds.beside); !s.ok()) {
      return s;
    }
    rounds.bound_us = BoundNowUs(run, *report);
    for (int pi : autotune::RandomizedBlock(np, 7919 + round, last)) {
      if (absl::Status s = rounds.engine->SetPlan(*plans[pi]); !s.ok()) return s;
      last = pi;
      Engine* e = rounds.engine.get();
      const bool timed_visit = round + 1 == options.iters;  // the timeline shows the last visit
      for (int w = 0; w <= options.warmup; ++w) {
        if (timed_visit && w == options.warmup && e->timeline() != nullptr) e->timeline()->Clear();
        auto v = run.replay.Iterate(*e, [e] { return e->Finish(); }, round);
        if (!v.ok()) return v.status();
        if (w == options.warmup) {
          if (absl::Status s = RecordVisit(run, pi, *v, profile_ready[pi], &rounds); !s.ok()) {
            return s;
          }
        }
      }
      if (timed_visit && e->timeline() != nullptr) {
        if (absl::Status s = WriteTimeline(run, e, plans[pi]->name); !s.ok()) return s;
      }
    }
  }
  return rounds;
}

// Note [The cost model beside the plans]: fits the sizes timed beside the
// plans, their medians into report->comm.
BesideCosts FitBesideCosts(const OverlapRun& run, const std::vector<std::vector<double>>& beside,
                           OverlapReport* report) {
  comm::Communicator& comm = run.comm;
  BesideCosts costs;
  // Note [The cost model beside the plans].
  std::optional<autotune::CostModel>& beside_cost = costs.median;
  if (comm.size() > 1 && beside.size() == report->comm.samples.size() && !beside.empty()) {
    std::vector<autotune::AllReduceSample> med = report->comm.samples;
    for (size_t i = 0; i < med.size(); ++i) med[i].time_us = Median(beside[i]);
    auto fitted = FitAndAttach(
        med, comm.size(),
        absl::StrCat("fusebox-perf overlap on ", comm.backend(), ", timed beside the plans"));
    if (fitted.ok()) {
      beside_cost = *std::move(fitted);
      report->comm.beside_samples = std::move(med);
      report->comm.beside_rounds_us = beside;
      if (!run.options.predict_with.has_value()) report->cost_model = beside_cost->Describe();
    }
  }
  // Each round's own sizes as a cost model, for the per-round predictions
  // (OverlapResult::predicted_rounds_exposed_us).
  std::vector<autotune::CostModel>& round_costs = costs.rounds;
  if (beside_cost.has_value()) {
    for (int round = 0; round < run.options.iters; ++round) {
      std::vector<autotune::AllReduceSample> at = report->comm.samples;
      for (size_t i = 0; i < at.size(); ++i) at[i].time_us = beside[i][round];
      auto fitted = FitAndAttach(at, comm.size(), "");
      if (!fitted.ok()) {
        round_costs.clear();
        break;
      }
      round_costs.push_back(*std::move(fitted));
    }
  }
  return costs;
}

// The lines between the header and the table's rows: the sizes timed
// beside the plans, the bound, the engine's worker.
void PrintAfterRounds(const OverlapRun& run, const OverlapReport& report,
                      const RoundsOutput& rounds) {
  std::FILE* const out = run.out;
  if (out == nullptr) return;
  if (!report.comm.beside_samples.empty()) {
    std::string sizes;
    for (size_t i = 0; i < report.comm.beside_samples.size(); ++i) {
      absl::StrAppendFormat(&sizes, "%s%d B %.3g ms (%.3g before)", i == 0 ? "" : ", ",
                            report.comm.beside_samples[i].bytes,
                            report.comm.beside_samples[i].time_us / 1e3,
                            report.comm.samples[i].time_us / 1e3);
    }
    std::fprintf(out, "# allreduce timed beside the plans (median of %d rounds): %s%s\n",
                 run.options.iters, sizes.c_str(),
                 run.options.predict_with.has_value() ? "" : "; pred uses these");
  }
  std::fprintf(out,
               "# lower bound %.2f ms: its allreduces timed again in every round, the least kept "
               "(%.2f ms before the rounds); t(all) %.2f ms, t(last) %.3f ms\n",
               rounds.bound_us / 1e3, rounds.first_bound_us / 1e3, report.comm.t_total_us / 1e3,
               report.comm.t_last_us / 1e3);
  if (absl::Status s = rounds.engine->worker_scheduling(); !s.ok()) {
    std::fprintf(out, "# warning: the engine's worker %s\n", std::string(s.message()).c_str());
  }
}

// Plan `pi`'s measured figures (collective: the launch-to-start quantiles
// are the worst rank's), and its plan file, written by rank 0. Sorts
// rounds->delays[pi] and rounds->reactions[pi].
absl::StatusOr<OverlapResult> MeasuredResult(const OverlapRun& run, const PlanSet& set, int pi,
                                             RoundsOutput* rounds) {
  OverlapResult r;
  const Plan& plan = *set.plans[pi];
  const std::string label = run.options.plans[pi] == "tuned" ? std::string("tuned") : plan.name;
  if (label == "tuned") r = set.tuned;
  if (!run.options.save_plans_dir.empty() && run.comm.rank() == 0) {
    const std::string path = absl::StrFormat("%s/%s-%s.json", run.options.save_plans_dir,
                                             run.profile.model, FileLabel(label));
    if (absl::Status s = bucketing::WritePlanFile(path, plan, &run.layout); !s.ok()) return s;
  }
  std::vector<double> iter, bwd, exposed, copy;
  for (const std::vector<double>& v : rounds->samples[pi]) {
    iter.push_back(v[0]);
    bwd.push_back(v[1]);
    exposed.push_back(v[2]);
    copy.push_back(v[3]);
  }
  const autotune::MedianInterval ci = autotune::MedianCI(iter, 0.95);
  r.plan = label;
  r.buckets = static_cast<int>(plan.buckets.size());
  r.plan_hash = bucketing::PlanHash(plan);
  r.iteration_us = ci.median;
  r.iteration_low_us = ci.low;
  r.iteration_high_us = ci.high;
  r.iterations_us = iter;
  r.exposed_rounds_us = exposed;
  r.backward_us = Median(bwd);
  r.exposed_us = Median(exposed);
  r.copy_us = Median(copy);
  {
    // Over every bucket of the measured iterations, the worst rank's
    // median and 99th percentile (-1: the backend does not mark starts).
    auto quantiles = [](std::vector<double>& d) {
      std::sort(d.begin(), d.end());
      if (d.empty()) return std::pair<double, double>(-1, -1);
      return std::pair<double, double>(
          d[d.size() / 2], d[std::min(d.size() - 1, static_cast<size_t>(0.99 * d.size()))]);
    };
    const auto [d50, d99] = quantiles(rounds->delays[pi]);
    const auto [a50, a99] = quantiles(rounds->reactions[pi]);
    std::vector<double> q = {d50, d99, a50, a99};
    if (absl::Status s = MaxAcrossRanks(run.comm, q); !s.ok()) return s;
    r.start_p50_us = q[0];
    r.start_p99_us = q[1];
    r.reaction_p50_us = q[2];
    r.reaction_p99_us = q[3];
  }
  r.compute_us = run.profile.forward_us + run.profile.backward_us;
  const double bound_us = rounds->bound_us;
  r.bound_us = bound_us;
  r.gap = rounds->gaps[pi].Scaled(1.0 / std::max<size_t>(1, rounds->samples[pi].size()));
  // Against the final bound (Note [A bound measured beside the plans]).
  r.gap.plan_us += r.gap.bound_us - bound_us;
  r.gap.bound_us = bound_us;
  return r;
}

// `plan`'s predictions under every cost model of the run into `r`.
void Predict(const OverlapRun& run, const FitOutput& fit, const BesideCosts& costs,
             const Plan& plan, OverlapResult* r) {
  const autotune::Profile& profile = run.profile;
  const autotune::SimOptions& sim = fit.sim;
  // Each model simulated once. `pred` is the given model's, else the one
  // timed beside the plans, else the one timed before the rounds.
  const auto simulate = [&](const std::optional<autotune::CostModel>& model, double* iteration_us,
                            double* exposed_us) {
    if (!model.has_value()) return;
    auto p = autotune::Simulate(profile, plan, *model, sim);
    if (!p.ok()) return;
    *iteration_us = p->iteration_us;
    *exposed_us = p->exposed_us;
  };
  simulate(fit.cost, &r->predicted_before_us, &r->predicted_before_exposed_us);
  simulate(costs.median, &r->predicted_beside_us, &r->predicted_beside_exposed_us);
  for (const autotune::CostModel& c : costs.rounds) {
    auto p = autotune::Simulate(profile, plan, c, sim);
    if (!p.ok()) {  // all rounds or none: a gap would shift the rounds
      r->predicted_rounds_exposed_us.clear();
      break;
    }
    r->predicted_rounds_exposed_us.push_back(p->exposed_us);
  }
  if (run.options.predict_with.has_value()) {
    simulate(run.options.predict_with, &r->predicted_us, &r->predicted_exposed_us);
  } else if (costs.median.has_value()) {
    r->predicted_us = r->predicted_beside_us;
    r->predicted_exposed_us = r->predicted_beside_exposed_us;
  } else if (fit.cost.has_value()) {
    r->predicted_us = r->predicted_before_us;
    r->predicted_exposed_us = r->predicted_before_exposed_us;
  } else if (run.comm.size() == 1) {
    r->predicted_us = r->compute_us;
  }
}

// One row of the table (and the tuner's line under the "tuned" row).
void PrintResult(const OverlapResult& r, std::FILE* out) {
  std::fprintf(out,
               "  %-14s %7d %10.2f %17s %10.2f %10.2f %9.2f %10.2f %10.3f %8.3f %10.2f %9.3f "
               "%17s\n",
               r.plan.c_str(), r.buckets, r.iteration_us / 1e3,
               absl::StrFormat("[%.2f, %.2f]", r.iteration_low_us / 1e3,
                               r.iteration_high_us / 1e3).c_str(),
               r.backward_us / 1e3, r.exposed_us / 1e3, r.copy_us / 1e3, r.bound_us / 1e3,
               r.iteration_us / r.bound_us, r.iteration_us / r.compute_us,
               r.predicted_us / 1e3, r.predicted_us / r.iteration_us,
               r.reaction_p50_us < 0 ? "n/a"
                                     : absl::StrFormat("%.1f / %.1f", r.reaction_p50_us,
                                                       r.reaction_p99_us).c_str());
  if (r.tuning_iterations >= 0) {
    std::fprintf(out,
                 "#   tuned: %d tuning iterations (%s, %.1f ms slower than DDP's default in "
                 "all), kept %s: %s\n",
                 r.tuning_iterations, r.cache_hit ? "policy-cache hit" : "searched and measured",
                 r.tuning_cost_us / 1e3, r.chosen.c_str(), r.decision.c_str());
  }
  std::fflush(out);
}

// Stage 4, report: the cost models timed beside the plans, then every
// plan's result (collective, in plan order) into the report, printed.
absl::Status ReportStage(const OverlapRun& run, const FitOutput& fit, const PlanSet& set,
                         RoundsOutput* rounds, OverlapReport* report) {
  const BesideCosts costs = FitBesideCosts(run, rounds->beside, report);
  PrintAfterRounds(run, *report, *rounds);
  for (int pi = 0; pi < static_cast<int>(set.plans.size()); ++pi) {
    auto r = MeasuredResult(run, set, pi, rounds);
    if (!r.ok()) return r.status();
    Predict(run, fit, costs, *set.plans[pi], &*r);
    if (run.out != nullptr) PrintResult(*r, run.out);
    report->results.push_back(*std::move(r));
  }
  if (run.options.explain && run.out != nullptr) PrintGapTable(*report, run.out);
  return absl::OkStatus();
}

}  // namespace

double LowerBoundUs(double forward_us, double backward_us, double first_ready_us,
                    double last_ready_us, double t_last_us, double t_total_us) {
  return forward_us +
         std::max({backward_us, last_ready_us + t_last_us, first_ready_us + t_total_us});
}

absl::StatusOr<OverlapReport> RunOverlap(comm::Communicator& comm,
                                         const autotune::Profile& base_profile,
                                         const OverlapOptions& options, std::FILE* out) {
  if (absl::Status s = ValidateOptions(options, base_profile); !s.ok()) return s;
  auto base_layout = autotune::LayoutFromProfile(base_profile);
  if (!base_layout.ok()) return base_layout.status();
  const GradientLayout& layout = *base_layout;

  // (1) fit.
  OverlapReport report;
  auto fit = MeasureAndFit(comm, base_profile, layout, options, &report);
  if (!fit.ok()) return fit.status();
  auto set = MakePlans(options, layout, *fit);
  if (!set.ok()) return set.status();
  Replay replay(comm, layout, fit->profile, options.views);
  const OverlapRun run{comm, options, layout, fit->profile, out, replay, EngineOptionsFor(options),
                       IsolatedUs(report.comm, *fit, comm.size())};
  PrintHeader(run, report);
  prctl(PR_SET_TIMERSLACK, 1000UL);  // 1 us wake-up precision for the replay

  // (2) calibrate, and tune where a plan is "tuned".
  if (absl::Status s = CalibrateStage(run, &fit->sim, &report); !s.ok()) return s;
  if (absl::Status s = TuneStage(run, *fit, &*set); !s.ok()) return s;
  // (3) replay.
  auto rounds = ReplayRounds(run, set->plans, &report);
  if (!rounds.ok()) return rounds.status();
  // (4) report.
  if (absl::Status s = ReportStage(run, *fit, *set, &*rounds, &report); !s.ok()) return s;
  return report;
}

void PrintGapTable(const OverlapReport& report, std::FILE* out) {
  std::fprintf(out,
               "#\n# where iteration - bound goes (ms; mean over the measured iterations of the "
               "slowest rank; docs/design.md \"Where the gap goes\"):\n"
               "#   late grads = the chain's first gradient reached the engine after the profile's "
               "time (copy-in, replay slip)\n"
               "#   window     = ready but held by the in-flight window or plan order\n"
               "#   launch->start = launch (or the previous bucket's end) to the backend starting "
               "it, and done to noticed or to its window slot freed\n"
               "#   transfer+  = transfers on the chain beyond t(m) measured alone (contention)\n"
               "#   copy back  = the worker after it saw a bucket done on the chain: launches the "
               "freed slot admits, then the copy back\n"
               "#   plan       = the plan at isolated speed vs the "
               "bound; tail = after the last copy back\n");
  std::fprintf(out, "# %-14s %9s %9s %10s %9s %13s %10s %9s %9s %9s %9s %6s %9s %9s %8s\n",
               "plan", "iter", "gap", "late grads", "window", "launch->start", "transfer+",
               "copy back", "plan", "tail", "sum", "chain", "exposed", "pred exp", "exp err");
  for (const OverlapResult& r : report.results) {
    const GapTerms& g = r.gap;
    const std::string err =
        r.predicted_us > 0 && r.exposed_us > 0
            ? absl::StrFormat("%+.0f%%", 100 * (r.predicted_exposed_us - r.exposed_us) / r.exposed_us)
            : std::string("n/a");
    std::fprintf(out,
                 "  %-14s %9.3f %9.3f %10.3f %9.3f %13.3f %10.3f %9.3f %9.3f %9.3f %9.3f %6d %9.3f "
                 "%9.3f %8s\n",
                 r.plan.c_str(), g.iteration_us / 1e3, g.gap_us() / 1e3,
                 g.late_gradients_us / 1e3, g.window_us / 1e3, g.launch_to_start_us / 1e3,
                 g.transfer_excess_us / 1e3, g.copy_back_us / 1e3, g.plan_us / 1e3,
                 g.tail_us / 1e3, g.sum_us() / 1e3, g.chain_buckets, r.exposed_us / 1e3,
                 r.predicted_exposed_us / 1e3, err.c_str());
  }
  std::fprintf(out,
               "# exposed = measured iteration end - backward end (median); pred exp = the "
               "simulator's, with the overlap terms above; exp err = (pred - measured) / "
               "measured\n");
  std::fflush(out);
}

}  // namespace fusebox::perf
