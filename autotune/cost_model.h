// CostModel: how long one allreduce of `bytes` takes on `world` ranks.
//
// The form is NCCL's own tuning model (src/graph/tuning.cc, summarised in
// docs/design.md "Cost models"): for each algorithm and protocol,
//
//   time = latency + bytes / algbw
//   ring: latency = base + (2(p-1) - 2(n-1)) * intra_hop + 2(n-1) * inter_hop
//         algbw   = busbw * p / (2(p-1))
//   tree: latency = base + 2 * ((p/n - 1) * intra_hop + ceil(log2 n) * tree_hop)
//         algbw   = busbw * 0.9 / 2         (double binary tree, NCCL's 0.9)
//   and, where the ranks share one machine (shared_gbps > 0), every line's
//   time per byte gains 2(p-1) / shared.
//
// with p ranks on n = ceil(p / ranks_per_node) nodes, busbw the intra-node
// bus bandwidth on one node and the smaller of intra and inter otherwise,
// and the protocols Simple (full bandwidth) and LL (low latency, 1/4 of the
// ring bandwidth, 1/3.8 of the tree's). The model takes the fastest
// (algorithm, protocol), as NCCL's tuner does. So latency grows with the
// number of ranks and of nodes; one constant alpha is wrong at scale.
//
// Models come from presets (PresetCostModel: parameters cited at each one)
// or are fitted to measurements on the actual cluster (FitCostModel, fed by
// `fusebox-perf allreduce --json` or by MeasureCostModel on a live
// communicator). A fitted model has one protocol and one algorithm (ring)
// whose parameters are those that best explain the measurements.
//
// Pure values; no I/O except the JSON helpers' text.
#ifndef FUSEBOX_AUTOTUNE_COST_MODEL_H_
#define FUSEBOX_AUTOTUNE_COST_MODEL_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fusebox::autotune {

// One measured allreduce: `world` ranks, `bytes`, median `time_us`.
struct AllReduceSample {
  int world = 0;
  int64_t bytes = 0;
  double time_us = 0;
};

// Latencies of one protocol, microseconds.
struct ProtocolLatency {
  double base_us = 0;       // per collective
  double intra_hop_us = 0;  // one ring step (or tree level) inside a node
  double inter_hop_us = 0;  // one ring step across nodes
  double tree_hop_us = 0;   // one tree level across nodes
};

// The cost model at one world size: the minimum of a few lines
// latency + bytes * us_per_byte (one per algorithm and protocol), cheap to
// evaluate in a planner's inner loop.
struct CostCurve {
  int lines = 0;
  double latency_us[4] = {};
  double us_per_byte[4] = {};
  // When set (a model measured at this very world size): piecewise-linear
  // through these (bytes, us) points instead of the lines; below the first
  // point its time, beyond the last point that time plus the lines' slope.
  std::vector<std::pair<double, double>> table;
  double operator()(int64_t bytes) const {
    if (lines == 0 || bytes <= 0) return 0;
    if (!table.empty()) return Interpolate(static_cast<double>(bytes));
    double best = latency_us[0] + us_per_byte[0] * static_cast<double>(bytes);
    for (int i = 1; i < lines; ++i) {
      const double t = latency_us[i] + us_per_byte[i] * static_cast<double>(bytes);
      if (t < best) best = t;
    }
    return best;
  }
  double Interpolate(double bytes) const;
  // A lower bound on the total time of any set of allreduces whose sizes
  // sum to `bytes` (one collective or many, any split): the cheapest single
  // collective, and `bytes` at the best time per byte of any size up to
  // `bytes`. Equals t(bytes) when t(m)/m does not grow with m (lines with
  // non-negative latency); smaller where a measured table is not
  // subadditive. Note [A bound that holds] in cost_model.cc.
  double PartitionLowerBound(int64_t bytes) const;
};

struct CostModel {
  std::string name;         // preset name or "fitted"
  std::string source;       // where the numbers come from (citation or measurement)
  int ranks_per_node = 1;
  double intra_busbw_gbps = 0;  // GB/s (1e9 B/s), nccl-tests' busbw on one node
  double inter_busbw_gbps = 0;  // GB/s per rank across nodes
  ProtocolLatency simple;       // full-bandwidth protocol
  bool has_ll = false;          // a low-latency protocol (NCCL LL)
  ProtocolLatency ll;
  bool has_tree = false;        // double binary tree besides the ring
  // The ranks share one machine (emulated hosts: network namespaces on one
  // box, Note [Hosts that share a machine] in cost_model.cc): every byte any
  // rank moves also costs that machine's CPU, at this many GB/s for all the
  // ranks together. Each line's time per byte gains 2(p-1) / shared, the
  // bytes a ring allreduce moves over all ranks. 0: independent hosts.
  double shared_gbps = 0;
  // Optional measurements at one world size (MeasuredAt): at exactly that
  // size AllReduceUs interpolates them, which follows a real transport's
  // protocol switches and cache effects better than any line. Sorted by
  // bytes, times non-decreasing.
  std::vector<AllReduceSample> measured;

  // Microseconds for one allreduce; 0 for world <= 1 or bytes <= 0.
  double AllReduceUs(int64_t bytes, int world) const;
  // Same with the number of ranks per node overridden (for derivations).
  double AllReduceUs(int64_t bytes, int world, int ranks_per_node) const;
  // The lines behind AllReduceUs at one world size (no lines for world <= 1).
  CostCurve Curve(int world, int ranks_per_node) const;

  // A copy with every latency multiplied by `latency` and every bandwidth
  // (intra, inter, shared) divided by `time_per_byte` (for sensitivity and
  // candidate generation).
  CostModel Scaled(double latency, double time_per_byte) const;

  // OK when intra and inter bandwidths are in [1e-6, 1e6] GB/s, the shared
  // one is 0 or in that range, latencies finite and >= 0,
  // 1 <= ranks_per_node <= 1<<20, name non-empty.
  absl::Status Validate() const;

  // Stable text of the parameters (for cache keys and reports).
  std::string Fingerprint() const;
  // One line: name, ranks per node, bandwidths, latencies.
  std::string Describe() const;
};

// The named presets: "nvlink-h100", "ib-400g", "100gbe", "25gbe", "10gbe".
std::vector<std::string> PresetNames();
absl::StatusOr<CostModel> PresetCostModel(absl::string_view name);

struct FitOptions {
  // Fit CostModel::shared_gbps too: the measured ranks share one machine's
  // cores (perf/cluster's emulated hosts). Needs samples at two or more
  // world sizes, where the term grows as p and the ring's as (p-1)/p.
  bool shared_machine = false;
};

// Least-squares fit (on relative error, so that small and large messages
// count alike) of a ring/Simple model to the samples:
//   time = base + 2(p-1) * hop + bytes * 2(p-1)/p / busbw
//          [+ bytes * 2(p-1) / shared, with options.shared_machine].
// With one world size in the samples, base and hop cannot be told apart:
// the whole latency is charged to the hops (base 0), which extrapolates
// the latency linearly in p as the ring does. Needs samples at two or more
// sizes, with world >= 2; intra and inter parameters are set equal (one
// kind of link was measured). Errors name what is missing.
absl::StatusOr<CostModel> FitCostModel(const std::vector<AllReduceSample>& samples,
                                       int ranks_per_node, std::string source,
                                       FitOptions options = {});

// `model` with `samples` of one world size attached as its measured table
// (CostModel::measured): the median time per size, sorted, and made
// non-decreasing from the large end (a smaller allreduce is never charged
// more than a larger one). Samples of other world sizes are ignored.
CostModel MeasuredAt(CostModel model, const std::vector<AllReduceSample>& samples, int world);

// The samples in a `fusebox-perf allreduce --json` file's text: one per
// result row, the faster of its out-of-place and in-place median times.
// Bounded and type-checked; errors name the field.
absl::StatusOr<std::vector<AllReduceSample>> ParsePerfAllReduceJson(absl::string_view json_text);

// Cost-model files ({"format": "fusebox-cost-model", "version": 1, ...}),
// for fusebox-tune --cost_model. Parsing validates.
std::string SerializeCostModel(const CostModel& model);
absl::StatusOr<CostModel> ParseCostModel(absl::string_view json_text);

}  // namespace fusebox::autotune

#endif  // FUSEBOX_AUTOTUNE_COST_MODEL_H_
