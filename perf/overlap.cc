#include "perf/overlap.h"

#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bucketing/engine.h"
#include "bucketing/plan_io.h"
#include "bucketing/planners.h"

namespace fusebox::perf {

namespace {

using Clock = std::chrono::steady_clock;
using bucketing::Engine;
using bucketing::GradientLayout;
using bucketing::Plan;

// The largest allreduce measured directly for the cost model.
constexpr int64_t kMaxMeasuredBytes = int64_t{512} << 20;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double UsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

void SleepUntil(Clock::time_point t) {
  if (Clock::now() < t) std::this_thread::sleep_until(t);
}

Clock::time_point Plus(Clock::time_point t, double us) {
  return t + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::micro>(us));
}

// Element-wise maximum across ranks of `v` (in place).
absl::Status MaxAcrossRanks(comm::Communicator& comm, std::vector<double>& v) {
  return comm::AllReduceSync(comm, v.data(), v.data(), v.size(), comm::DataType::kFloat64,
                             comm::ReduceOp::kMax);
}

// Median over `reps` of the slowest rank's time for one allreduce of
// `bytes` (fp32, averaged), after one warm-up.
absl::StatusOr<double> TimeAllReduce(comm::Communicator& comm, float* buf, int64_t bytes,
                                     int reps) {
  std::vector<double> times;
  for (int r = -1; r < reps; ++r) {
    if (absl::Status s = comm::BarrierSync(comm); !s.ok()) return s;
    const auto t0 = Clock::now();
    absl::Status s = comm::AllReduceSync(comm, buf, buf, static_cast<size_t>(bytes / 4),
                                         comm::DataType::kFloat32, comm::ReduceOp::kAvg);
    if (!s.ok()) return s;
    std::vector<double> t = {UsSince(t0)};
    if (absl::Status m = MaxAcrossRanks(comm, t); !m.ok()) return m;
    if (r >= 0) times.push_back(t[0]);
  }
  return Median(times);
}

// t(m) = a + b*m fitted to the measured points by least squares on relative
// error (weights 1/t^2), so that small and large sizes count alike.
void FitLine(const std::vector<std::pair<double, double>>& pts, double* a, double* b) {
  double sw = 0, swm = 0, swmm = 0, swt = 0, swmt = 0;
  for (const auto& [m, t] : pts) {
    const double w = 1.0 / (t * t);
    sw += w;
    swm += w * m;
    swmm += w * m * m;
    swt += w * t;
    swmt += w * m * t;
  }
  const double det = sw * swmm - swm * swm;
  if (pts.size() < 2 || det <= 0) {
    *a = pts.empty() ? 0 : pts[0].second;
    *b = 0;
    return;
  }
  *b = (sw * swmt - swm * swt) / det;
  *a = (swt - *b * swm) / sw;
  if (*a < 0) *a = 0;
  if (*b < 0) *b = 0;
}

absl::StatusOr<CommModel> MeasureComm(comm::Communicator& comm, int64_t last_bytes,
                                      int64_t total_bytes) {
  const int64_t cap = std::min(std::max(last_bytes, total_bytes), kMaxMeasuredBytes);
  const int64_t buf_bytes = std::max<int64_t>(4, cap / 4 * 4);
  std::unique_ptr<float[]> buf(new float[buf_bytes / 4]());
  std::vector<std::pair<double, double>> pts;
  for (int64_t m = 4096; m <= buf_bytes; m *= 8) {
    auto t = TimeAllReduce(comm, buf.get(), m, 3);
    if (!t.ok()) return t.status();
    pts.emplace_back(static_cast<double>(m), *t);
  }
  CommModel model;
  auto measure = [&](int64_t bytes, double* out) -> absl::Status {
    const int64_t m = std::max<int64_t>(4, bytes / 4 * 4);
    auto t = TimeAllReduce(comm, buf.get(), m, 3);
    if (!t.ok()) return t.status();
    pts.emplace_back(static_cast<double>(m), *t);
    *out = *t;
    return absl::OkStatus();
  };
  const bool last_fits = last_bytes <= buf_bytes;
  model.total_measured = total_bytes <= buf_bytes;
  if (last_fits) {
    if (absl::Status s = measure(last_bytes, &model.t_last_us); !s.ok()) return s;
  }
  if (model.total_measured) {
    if (absl::Status s = measure(total_bytes, &model.t_total_us); !s.ok()) return s;
  }
  FitLine(pts, &model.alpha_us, &model.beta_us_per_byte);
  if (!last_fits) model.t_last_us = model.alpha_us + model.beta_us_per_byte * last_bytes;
  if (!model.total_measured) {
    model.t_total_us = model.alpha_us + model.beta_us_per_byte * total_bytes;
  }
  return model;
}

// A plan name usable in a file name (plan files are named by their path).
std::string FileLabel(std::string name) {
  std::replace_if(name.begin(), name.end(), [](char c) { return c == '/' || c == ' '; }, '_');
  return name;
}

absl::StatusOr<Plan> MakePlan(const std::string& spec, const GradientLayout& layout,
                              const autotune::Profile& profile) {
  if (spec == "per-tensor") return bucketing::PerTensorPlan(layout);
  if (spec == "ddp") return bucketing::DdpPlan(layout);
  if (spec == "horovod") {
    std::vector<double> ready;
    for (const auto& t : profile.tensors) ready.push_back(t.ready_us);
    return bucketing::HorovodPlan(layout, ready);
  }
  if (spec == "hccl") {
    auto p = bucketing::SplitBytesPlan(layout, bucketing::kHcclDefaultSplit);
    if (p.ok()) p->name = "hccl";
    return p;
  }
  if (absl::EndsWith(spec, ".json")) return bucketing::ReadPlanFile(spec, layout);
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown plan \"", spec, "\": expected per-tensor, ddp, horovod, hccl or a .json plan file"));
}

}  // namespace

double LowerBoundUs(double forward_us, double backward_us, double first_ready_us,
                    double t_last_us, double t_total_us) {
  return forward_us + std::max(backward_us + t_last_us, first_ready_us + t_total_us);
}

absl::StatusOr<OverlapReport> RunOverlap(comm::Communicator& comm,
                                         const autotune::Profile& base_profile,
                                         const OverlapOptions& options, std::FILE* out) {
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
  auto base_layout = autotune::LayoutFromProfile(base_profile);
  if (!base_layout.ok()) return base_layout.status();
  const GradientLayout& layout = *base_layout;

  OverlapReport report;
  report.model = base_profile.model;
  report.ranks = comm.size();
  report.total_bytes = layout.total_bytes();
  const int64_t last_bytes = layout.bytes(layout.size() - 1);
  auto model = MeasureComm(comm, last_bytes, report.total_bytes);
  if (!model.ok()) return model.status();
  report.comm = *model;
  report.compute_scale = options.compute_scale > 0
                             ? options.compute_scale
                             : report.comm.t_total_us / base_profile.backward_us;
  const autotune::Profile profile = autotune::ScaleCompute(base_profile, report.compute_scale);
  if (absl::Status s = autotune::ValidateProfile(profile); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("overlap: scaled profile: ", s.message()));
  }
  report.forward_us = profile.forward_us;
  report.backward_us = profile.backward_us;

  for (const std::string* dir : {&options.save_plans_dir, &options.timeline_dir}) {
    std::error_code ec;
    if (!dir->empty()) std::filesystem::create_directories(*dir, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create directory ", *dir, ": ", ec.message()));
    }
  }
  std::vector<Plan> plans;
  for (const std::string& spec : options.plans) {
    auto p = MakePlan(spec, layout, profile);
    if (!p.ok()) return p.status();
    plans.push_back(*std::move(p));
    if (!options.save_plans_dir.empty() && comm.rank() == 0) {
      const std::string path = absl::StrFormat("%s/%s-%s.json", options.save_plans_dir,
                                               profile.model, FileLabel(plans.back().name));
      if (absl::Status s = bucketing::WritePlanFile(path, plans.back(), &layout); !s.ok()) {
        return s;
      }
    }
  }

  if (out != nullptr) {
    std::fprintf(out,
                 "# fusebox-perf overlap: model %s, %d gradients, %.1f MiB; backend %s, %d "
                 "ranks; iters %d, warmup %d; %s; max in flight %d, %s schedule\n",
                 profile.model.c_str(), layout.size(), report.total_bytes / 1048576.0,
                 comm.backend().c_str(), comm.size(), options.iters, options.warmup,
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
                 "MiB) = %.2f ms (%s), t(last) = %.3f ms\n",
                 report.comm.alpha_us, report.comm.beta_us_per_byte * 1e3,
                 report.total_bytes / 1048576.0, report.comm.t_total_us / 1e3,
                 report.comm.total_measured ? "measured" : "fitted", report.comm.t_last_us / 1e3);
    std::fprintf(out, "# lower bound = forward + max(T_b + t(last), T_first + t(all)) "
                      "(ANCHORS.md); times are medians over iterations of the slowest rank\n");
    std::fprintf(out, "#\n# %-14s %7s %10s %10s %10s %9s %10s %10s %8s\n", "plan", "buckets",
                 "iter(ms)", "bwd(ms)", "exposed", "copy(ms)", "bound(ms)", "iter/bound",
                 "iter/cmp");
  }

  bucketing::EngineOptions eopts;
  eopts.max_in_flight = options.max_in_flight;
  eopts.schedule = options.schedule;
  eopts.record_timeline = !options.timeline_dir.empty();
  std::unique_ptr<Engine> engine;
  // Per-tensor gradient buffers where the engine's storage is not used.
  std::vector<std::unique_ptr<char[]>> own(layout.size());
  std::vector<void*> grads(layout.size(), nullptr);
  prctl(PR_SET_TIMERSLACK, 1000UL);  // 1 us wake-up precision for the replay

  for (Plan& plan : plans) {
    if (engine == nullptr) {
      auto e = Engine::Create(comm, layout, plan, eopts);
      if (!e.ok()) return e.status();
      engine = *std::move(e);
    } else if (absl::Status s = engine->SetPlan(plan); !s.ok()) {
      return s;
    }
    for (int id = 0; id < layout.size(); ++id) {
      const int64_t bytes = layout.bytes(id);
      void* storage = engine->TensorStorage(id);
      if (options.views && storage != nullptr) {
        std::memset(storage, 0, bytes);  // a computed gradient, in place
        grads[id] = storage;
        own[id].reset();
      } else {
        if (own[id] == nullptr) own[id].reset(new char[std::max<int64_t>(bytes, 1)]());
        grads[id] = own[id].get();
      }
    }
    std::vector<double> iter, bwd, exposed, copy;
    for (int it = 0; it < options.warmup + options.iters; ++it) {
      if (absl::Status s = comm::BarrierSync(comm); !s.ok()) return s;
      const auto t0 = Clock::now();
      const double t0_us = engine->NowUs();
      SleepUntil(Plus(t0, profile.forward_us));
      const auto bstart = Clock::now();
      engine->StartIteration();
      for (int id = 0; id < layout.size(); ++id) {
        SleepUntil(Plus(bstart, profile.tensors[id].ready_us));
        if (absl::Status s = engine->MarkReady(id, grads[id], layout.tensor(id).numel); !s.ok()) {
          return s;
        }
      }
      SleepUntil(Plus(bstart, profile.backward_us));
      const double bend = UsSince(t0);
      if (absl::Status s = engine->Finish(); !s.ok()) return s;
      const double end = UsSince(t0);
      const bucketing::IterationStats st = engine->last_stats();
      if (auto* tl = engine->timeline()) {
        tl->Span("forward", bucketing::Track::kCompute, t0_us, profile.forward_us, it);
        tl->Span("backward", bucketing::Track::kCompute, t0_us + profile.forward_us,
                 bend - profile.forward_us, it);
      }
      std::vector<double> v = {end, bend - profile.forward_us, end - bend,
                               st.copy_in_us + st.copy_back_us};
      if (absl::Status s = MaxAcrossRanks(comm, v); !s.ok()) return s;
      if (it < options.warmup) continue;
      iter.push_back(v[0]);
      bwd.push_back(v[1]);
      exposed.push_back(v[2]);
      copy.push_back(v[3]);
    }
    OverlapResult r;
    r.plan = plan.name;
    r.buckets = static_cast<int>(plan.buckets.size());
    r.plan_hash = bucketing::PlanHash(plan);
    r.iteration_us = Median(iter);
    r.backward_us = Median(bwd);
    r.exposed_us = Median(exposed);
    r.copy_us = Median(copy);
    r.compute_us = profile.forward_us + profile.backward_us;
    r.bound_us = LowerBoundUs(profile.forward_us, profile.backward_us,
                              profile.tensors.front().ready_us, report.comm.t_last_us,
                              report.comm.t_total_us);
    if (out != nullptr) {
      std::fprintf(out, "  %-14s %7d %10.2f %10.2f %10.2f %9.2f %10.2f %10.3f %8.3f\n",
                   r.plan.c_str(), r.buckets, r.iteration_us / 1e3, r.backward_us / 1e3,
                   r.exposed_us / 1e3, r.copy_us / 1e3, r.bound_us / 1e3,
                   r.iteration_us / r.bound_us, r.iteration_us / r.compute_us);
      std::fflush(out);
    }
    if (auto* tl = engine->timeline()) {
      const std::string path = absl::StrFormat("%s/%s-%s-rank%d.json", options.timeline_dir,
                                               profile.model, FileLabel(plan.name), comm.rank());
      if (absl::Status s = tl->WriteChromeTrace(
              path, comm.rank(), absl::StrFormat("rank %d, plan %s", comm.rank(), plan.name));
          !s.ok()) {
        return s;
      }
      tl->Clear();
    }
    report.results.push_back(std::move(r));
  }
  return report;
}

}  // namespace fusebox::perf
