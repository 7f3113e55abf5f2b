#include "autotune/scaling.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "autotune/simulator.h"
#include "nlohmann/json.hpp"

namespace fusebox::autotune {
namespace {

ScalingPoint Point(const Profile& profile, const CostModel& cost, int world, int rpn,
                   const std::string& plan, int buckets, const SimResult& sim, double bound_us,
                   double batch_per_rank) {
  ScalingPoint p;
  p.model = profile.model;
  p.network = cost.name;
  p.plan = plan;
  p.world = world;
  p.nodes = (world + rpn - 1) / rpn;
  p.buckets = buckets;
  p.compute_us = profile.forward_us + profile.backward_us;
  p.iteration_us = sim.iteration_us;
  p.exposed_us = sim.exposed_us;
  p.lower_bound_us = bound_us;
  p.efficiency = p.compute_us / p.iteration_us;
  p.throughput = world * batch_per_rank / (p.iteration_us / 1e6);
  return p;
}

// RFC 4180: a field with a comma, quote or line break is quoted.
std::string CsvField(const std::string& f) {
  if (f.find_first_of(",\"\r\n") == std::string::npos) return f;
  std::string q = "\"";
  for (char c : f) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

}  // namespace

absl::StatusOr<std::vector<ScalingPoint>> PredictScaling(const Profile& profile,
                                                         const CostModel& cost,
                                                         absl::Span<const int> worlds,
                                                         const ScalingOptions& options) {
  if (absl::Status s = ValidateProfile(profile); !s.ok()) return s;
  if (worlds.empty()) return absl::InvalidArgumentError("no world sizes");
  if (!(options.batch_per_rank > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch per rank must be > 0, got ", options.batch_per_rank));
  }
  std::vector<ScalingPoint> out;
  for (int world : worlds) {
    if (world < 1 || world > (1 << 20)) {
      return absl::InvalidArgumentError(absl::StrCat("world size ", world, " is not in [1, 2^20]"));
    }
    PlannerOptions o = options.planner;
    o.sim.world_size = world;
    const int rpn = std::max(1, o.sim.ranks_per_node > 0 ? o.sim.ranks_per_node
                                                         : cost.ranks_per_node);
    if (world == 1) {
      // One rank does not communicate (DDP and fusebox leave it alone):
      // every plan costs the computation.
      SimResult alone;
      alone.forward_us = profile.forward_us;
      alone.backward_end_us = profile.backward_us;
      alone.iteration_us = profile.forward_us + profile.backward_us;
      const double compute = alone.iteration_us;
      out.push_back(Point(profile, cost, 1, rpn, "tuned", 0, alone, compute,
                          options.batch_per_rank));
      for (const std::string& b : BaselineNames()) {
        out.push_back(Point(profile, cost, 1, rpn, b, 0, alone, compute, options.batch_per_rank));
      }
      continue;
    }
    auto r = OfflineTune(profile, cost, o);
    if (!r.ok()) return r.status();
    out.push_back(Point(profile, cost, world, rpn, "tuned",
                        static_cast<int>(r->tuned.plan.buckets.size()), r->tuned.sim,
                        r->lower_bound_us, options.batch_per_rank));
    for (const PlanPrediction& b : r->baselines) {
      out.push_back(Point(profile, cost, world, rpn, b.name,
                          static_cast<int>(b.plan.buckets.size()), b.sim, r->lower_bound_us,
                          options.batch_per_rank));
    }
  }
  return out;
}

std::string ScalingCsv(absl::Span<const ScalingPoint> points) {
  std::string out =
      "model,network,plan,world,nodes,buckets,compute_ms,iteration_ms,exposed_ms,"
      "lower_bound_ms,efficiency,throughput\n";
  for (const ScalingPoint& p : points) {
    absl::StrAppendFormat(&out, "%s,%s,%s,%d,%d,%d,%.6f,%.6f,%.6f,%.6f,%.6f,%.3f\n",
                          CsvField(p.model), CsvField(p.network), p.plan, p.world, p.nodes, p.buckets, p.compute_us / 1e3,
                          p.iteration_us / 1e3, p.exposed_us / 1e3, p.lower_bound_us / 1e3,
                          p.efficiency, p.throughput);
  }
  return out;
}

std::string ScalingJson(absl::Span<const ScalingPoint> points) {
  nlohmann::json a = nlohmann::json::array();
  for (const ScalingPoint& p : points) {
    a.push_back({{"model", p.model},
                 {"network", p.network},
                 {"plan", p.plan},
                 {"world", p.world},
                 {"nodes", p.nodes},
                 {"buckets", p.buckets},
                 {"compute_ms", p.compute_us / 1e3},
                 {"iteration_ms", p.iteration_us / 1e3},
                 {"exposed_ms", p.exposed_us / 1e3},
                 {"lower_bound_ms", p.lower_bound_us / 1e3},
                 {"efficiency", p.efficiency},
                 {"throughput", p.throughput}});
  }
  return a.dump(1) + "\n";
}

}  // namespace fusebox::autotune
