#include "autotune/cost_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "autotune/json_fields.h"

namespace fusebox::autotune {

namespace {

using json = json_fields::Json;

constexpr int kMaxJsonDepth = 8;
constexpr size_t kMaxSamples = 1 << 16;
constexpr double kMaxLatencyUs = 1e7;    // 10 s per hop is no network
constexpr double kMaxBusbwGbps = 1e6;    // 1 PB/s
constexpr double kMinBusbwGbps = 1e-6;   // 1 kB/s: below it a model's times overflow

int CeilLog2(int64_t n) {
  int l = 0;
  while ((int64_t{1} << l) < n) ++l;
  return l;
}

// NCCL's double binary tree runs at 0.9 of the bus bandwidth and moves the
// data up and down (algbw = busbw / 2); LL costs bandwidth (tuning.cc).
constexpr double kTreeBwFactor = 0.9;
constexpr double kRingLlBwFactor = 1.0 / 4.0;
constexpr double kTreeLlBwFactor = 1.0 / 3.8;

void AddRing(CostCurve& c, const ProtocolLatency& lat, double busbw_bps, int p, int nodes) {
  const double steps = 2.0 * (p - 1);
  const double inter_steps = 2.0 * (nodes - 1);
  c.latency_us[c.lines] =
      lat.base_us + (steps - inter_steps) * lat.intra_hop_us + inter_steps * lat.inter_hop_us;
  c.us_per_byte[c.lines] = 1e6 * steps / (busbw_bps * p);  // 1 / algbw
  ++c.lines;
}

void AddTree(CostCurve& c, const ProtocolLatency& lat, double busbw_bps, int p, int nodes) {
  const double per_node = static_cast<double>(p) / nodes;
  c.latency_us[c.lines] =
      lat.base_us + 2.0 * ((per_node - 1) * lat.intra_hop_us + CeilLog2(nodes) * lat.tree_hop_us);
  c.us_per_byte[c.lines] = 1e6 * 2 / (busbw_bps * kTreeBwFactor);
  ++c.lines;
}

bool FiniteNonNegative(double v, double max) { return std::isfinite(v) && v >= 0 && v <= max; }

absl::Status CheckLatency(const ProtocolLatency& l, absl::string_view what) {
  for (auto [v, field] : {std::pair{l.base_us, "base_us"}, {l.intra_hop_us, "intra_hop_us"},
                          {l.inter_hop_us, "inter_hop_us"}, {l.tree_hop_us, "tree_hop_us"}}) {
    if (!FiniteNonNegative(v, kMaxLatencyUs)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cost model: ", what, ".", field, " = ", v, " is not in [0, 1e7] us"));
    }
  }
  return absl::OkStatus();
}

// A protocol with the same latency everywhere (a fitted or simple model).
ProtocolLatency Uniform(double base_us, double hop_us) {
  return ProtocolLatency{base_us, hop_us, hop_us, hop_us};
}

}  // namespace

double CostModel::AllReduceUs(int64_t bytes, int world) const {
  return AllReduceUs(bytes, world, ranks_per_node);
}

double CostModel::AllReduceUs(int64_t bytes, int world, int rpn) const {
  return Curve(world, rpn)(bytes);
}

double CostCurve::Interpolate(double bytes) const {
  if (bytes <= table.front().first) return table.front().second;
  if (bytes >= table.back().first) {
    double slope = us_per_byte[0];
    for (int i = 1; i < lines; ++i) slope = std::min(slope, us_per_byte[i]);
    return table.back().second + (bytes - table.back().first) * slope;
  }
  auto hi = std::lower_bound(table.begin(), table.end(), std::make_pair(bytes, 0.0));
  auto lo = hi - 1;
  const double f = (bytes - lo->first) / (hi->first - lo->first);
  return lo->second + f * (hi->second - lo->second);
}

// Note [A bound that holds]
// The lower bound on an iteration charges the bytes that must move after
// some instant with the time of one collective of all of them, t(G). That
// holds only if splitting never helps: t(a) + t(b) >= t(a + b). Lines with
// non-negative latency are subadditive, and so is their minimum, but a
// table measured on one machine need not be (a 1 MiB allreduce may take
// longer than two of 512 KiB), and a plan that splits there would beat the
// "bound". So the bound uses, for m bytes moved in any pieces m_i,
//   sum t(m_i) = sum m_i * (t(m_i) / m_i) >= m * min_{0 < x <= m} t(x) / x,
// and sum t(m_i) >= min_x t(x) (at least one collective). The curve is
// piecewise linear in x between its breakpoints (table points; lines are
// linear throughout), and on a linear piece a + c*x the ratio a/x + c is
// monotone, so its minimum over (0, m] is at x = 1, at a breakpoint or at m.
double CostCurve::PartitionLowerBound(int64_t bytes) const {
  if (lines == 0 || bytes <= 0) return 0;
  std::vector<double> xs = {1.0, static_cast<double>(bytes)};
  for (const auto& [x, t] : table) {
    if (x >= 1 && x <= static_cast<double>(bytes)) xs.push_back(x);
  }
  double min_t = std::numeric_limits<double>::infinity();
  double min_ratio = std::numeric_limits<double>::infinity();
  for (double x : xs) {
    const double t = (*this)(static_cast<int64_t>(x));
    min_t = std::min(min_t, t);
    min_ratio = std::min(min_ratio, t / x);
  }
  return std::max(min_t, min_ratio * static_cast<double>(bytes));
}

CostModel MeasuredAt(CostModel model, const std::vector<AllReduceSample>& samples, int world) {
  std::map<int64_t, std::vector<double>> by_size;
  for (const AllReduceSample& s : samples) {
    if (s.world == world && s.bytes > 0 && std::isfinite(s.time_us) && s.time_us > 0) {
      by_size[s.bytes].push_back(s.time_us);
    }
  }
  model.measured.clear();
  for (auto& [bytes, times] : by_size) {
    std::sort(times.begin(), times.end());
    model.measured.push_back({world, bytes, times[times.size() / 2]});
  }
  for (size_t i = model.measured.size(); i-- > 1;) {
    model.measured[i - 1].time_us = std::min(model.measured[i - 1].time_us, model.measured[i].time_us);
  }
  return model;
}

CostCurve CostModel::Curve(int world, int rpn) const {
  CostCurve c;
  if (world <= 1) return c;
  if (!measured.empty() && measured.front().world == world) {
    for (const AllReduceSample& s : measured) {
      c.table.emplace_back(static_cast<double>(s.bytes), s.time_us);
    }
  }
  rpn = std::max(1, std::min(rpn, world));
  const int nodes = (world + rpn - 1) / rpn;
  const double busbw =
      1e9 * (nodes == 1 ? intra_busbw_gbps : std::min(intra_busbw_gbps, inter_busbw_gbps));
  AddRing(c, simple, busbw, world, nodes);
  if (has_tree) AddTree(c, simple, busbw, world, nodes);
  if (has_ll) {
    AddRing(c, ll, busbw * kRingLlBwFactor, world, nodes);
    if (has_tree) AddTree(c, ll, busbw * kTreeLlBwFactor, world, nodes);
  }
  if (shared_gbps > 0) {
    // Note [Hosts that share a machine].
    const double shared_us_per_byte = 1e6 * 2.0 * (world - 1) / (1e9 * shared_gbps);
    for (int i = 0; i < c.lines; ++i) c.us_per_byte[i] += shared_us_per_byte;
  }
  return c;
}

// Note [Hosts that share a machine]
// perf/cluster emulates hosts as network namespaces on one machine: each
// rank's link is shaped to the emulated rate, but every byte that crosses
// a link also passes the kernel's TCP stack (a copy out, a copy in, the
// shaper) on that machine's few cores, which all ranks share. A ring
// allreduce of m bytes moves 2(p-1)/p m bytes per rank, 2(p-1) m over all
// of them, so on p ranks sharing the machine
//   time = latency + 2(p-1)/p m / busbw + 2(p-1) m / shared.
// The first bandwidth is each link's, the second the machine's. With one
// bandwidth fitted across 2, 4 and 8 such hosts at 4 Gbit, the 8-host
// allreduces took 1.5-2.2x the model from 256 KiB up and 3.8x at 64 KiB
// (commit 51b4832); the
// two terms are told apart by the world size (one grows as (p-1)/p, the
// other as p - 1). Real clusters (independent hosts) leave the term at 0; a
// fit adds it only when asked (FitOptions::shared_machine).

CostModel CostModel::Scaled(double latency, double time_per_byte) const {
  CostModel m = *this;
  for (ProtocolLatency* l : {&m.simple, &m.ll}) {
    l->base_us *= latency;
    l->intra_hop_us *= latency;
    l->inter_hop_us *= latency;
    l->tree_hop_us *= latency;
  }
  m.intra_busbw_gbps /= time_per_byte;
  m.inter_busbw_gbps /= time_per_byte;
  m.shared_gbps /= time_per_byte;
  for (AllReduceSample& s : m.measured) {  // small sizes are latency, large ones bandwidth
    s.time_us *= s.bytes < (int64_t{64} << 10) ? latency : time_per_byte;
  }
  for (size_t i = m.measured.size(); i-- > 1;) {
    m.measured[i - 1].time_us = std::min(m.measured[i - 1].time_us, m.measured[i].time_us);
  }
  return m;
}

absl::Status CostModel::Validate() const {
  if (name.empty()) return absl::InvalidArgumentError("cost model: name is empty");
  if (ranks_per_node < 1 || ranks_per_node > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cost model: ranks_per_node = ", ranks_per_node, " is not in [1, 2^20]"));
  }
  // shared_gbps may also be 0 (no shared machine).
  for (auto [v, field, may_be_zero] : {std::tuple{intra_busbw_gbps, "intra_busbw_gbps", false},
                                       {inter_busbw_gbps, "inter_busbw_gbps", false},
                                       {shared_gbps, "shared_gbps", true}}) {
    if ((v != 0 || !may_be_zero) && !(v >= kMinBusbwGbps && v <= kMaxBusbwGbps)) {
      return absl::InvalidArgumentError(absl::StrCat("cost model: ", field, " = ", v, " is ",
                                                     may_be_zero ? "neither 0 nor " : "not ",
                                                     "in [1e-6, 1e6] GB/s"));
    }
  }
  if (absl::Status s = CheckLatency(simple, "simple"); !s.ok()) return s;
  if (has_ll) return CheckLatency(ll, "ll");
  return absl::OkStatus();
}

std::string CostModel::Fingerprint() const {
  std::string s = absl::StrFormat("%s/rpn%d/bw%.4g,%.4g/s%.4g,%.4g,%.4g,%.4g", name, ranks_per_node,
                                  intra_busbw_gbps, inter_busbw_gbps, simple.base_us,
                                  simple.intra_hop_us, simple.inter_hop_us, simple.tree_hop_us);
  if (has_ll) {
    absl::StrAppendFormat(&s, "/ll%.4g,%.4g,%.4g,%.4g", ll.base_us, ll.intra_hop_us,
                          ll.inter_hop_us, ll.tree_hop_us);
  }
  if (has_tree) s += "/tree";
  if (shared_gbps > 0) absl::StrAppendFormat(&s, "/shared%.4g", shared_gbps);
  if (!measured.empty()) {
    absl::StrAppendFormat(&s, "/measured%d@%d", measured.size(), measured.front().world);
  }
  return s;
}

std::string CostModel::Describe() const {
  std::string s = absl::StrFormat(
      "%s: %d ranks/node, busbw %.4g GB/s intra, %.4g GB/s inter; ring/Simple latency %.3g us + "
      "%.3g us/step intra, %.3g us/step inter",
      name, ranks_per_node, intra_busbw_gbps, inter_busbw_gbps, simple.base_us, simple.intra_hop_us,
      simple.inter_hop_us);
  if (has_tree) s += "; double binary tree";
  if (has_ll) s += "; LL protocol";
  if (shared_gbps > 0) {
    absl::StrAppendFormat(&s, "; ranks share one machine at %.4g GB/s in all", shared_gbps);
  }
  if (!measured.empty()) {
    absl::StrAppendFormat(&s, "; at %d ranks: interpolates %d measured sizes",
                          measured.front().world, measured.size());
  }
  return s;
}

std::vector<std::string> PresetNames() {
  return {"nvlink-h100", "ib-400g", "100gbe", "25gbe", "10gbe"};
}

absl::StatusOr<CostModel> PresetCostModel(absl::string_view name) {
  // NCCL's latencies (docs/design.md "Cost models", from src/graph/tuning.cc):
  // base 8.4 us (Simple) / 6.6 us (LL, ring) / 6.8 us (LL, tree); per ring
  // step over NVLink 3.4 us Simple / 0.6 us LL; over the network 14 us
  // Simple / 2.7 us LL; per tree level over the network 14 / 5.0 us.
  const ProtocolLatency nccl_simple_nvlink{8.4, 3.4, 14.0, 14.0};
  const ProtocolLatency nccl_ll_nvlink{6.6, 0.6, 2.7, 5.0};
  CostModel m;
  m.name = std::string(name);
  m.has_tree = true;
  m.has_ll = true;
  if (name == "nvlink-h100") {
    // DGX H100: 8 GPUs on NVLink (ring busbw ~370 GB/s, docs/design.md), one
    // 400 Gb NDR InfiniBand NIC per GPU between nodes (~46 GB/s).
    m.source = "docs/design.md: 8x H100 NVLink ring busbw ~370 GB/s, NDR 400 Gb IB ~46 GB/s/NIC; "
               "NCCL tuning.cc latencies";
    m.ranks_per_node = 8;
    m.intra_busbw_gbps = 370;
    m.inter_busbw_gbps = 46;
    m.simple = nccl_simple_nvlink;
    m.ll = nccl_ll_nvlink;
    return m;
  }
  if (name == "ib-400g") {
    // One rank per node, every ring step over NDR 400 Gb InfiniBand.
    m.source = "docs/design.md: NDR 400 Gb IB ~46 GB/s per NIC; NCCL tuning.cc network latencies";
    m.ranks_per_node = 1;
    m.intra_busbw_gbps = 46;
    m.inter_busbw_gbps = 46;
    m.simple = nccl_simple_nvlink;
    m.ll = nccl_ll_nvlink;
    return m;
  }
  // Ethernet over TCP sockets, one rank per node. Bandwidth: line rate at
  // the ~93% that TCP payload leaves of an Ethernet frame. Latency: the
  // MG-WFBP fit on 10 GbE, p = 16 (docs/design.md: a = 908 us for a ring of
  // 2(p-1) = 30 steps, ~30 us per step, the "30-50 us across nodes" floor),
  // with NCCL's 8.4 us base; no LL over sockets, no tree.
  double line_gbit = 0;
  if (name == "100gbe") line_gbit = 100;
  if (name == "25gbe") line_gbit = 25;
  if (name == "10gbe") line_gbit = 10;
  if (line_gbit == 0) {
    std::string known;
    for (const std::string& n : PresetNames()) absl::StrAppend(&known, known.empty() ? "" : ", ", n);
    return absl::NotFoundError(
        absl::StrCat("unknown cost-model preset \"", name, "\"; presets: ", known));
  }
  m.source = "line rate x 0.93 (TCP payload); latency from MG-WFBP's 10 GbE fit (docs/design.md): "
             "908 us / 30 ring steps";
  m.ranks_per_node = 1;
  m.intra_busbw_gbps = line_gbit / 8 * 0.93;
  m.inter_busbw_gbps = m.intra_busbw_gbps;
  m.simple = Uniform(8.4, 908.0 / 30);
  m.has_tree = false;
  m.has_ll = false;
  return m;
}

absl::StatusOr<CostModel> FitCostModel(const std::vector<AllReduceSample>& samples,
                                       int ranks_per_node, std::string source, FitOptions options) {
  if (ranks_per_node < 1) {
    return absl::InvalidArgumentError("fit: ranks_per_node must be at least 1");
  }
  std::set<int> worlds;
  std::set<int64_t> sizes;
  for (size_t i = 0; i < samples.size(); ++i) {
    const AllReduceSample& s = samples[i];
    if (s.world < 2 || s.bytes <= 0 || !std::isfinite(s.time_us) || s.time_us <= 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "fit: sample %d (world %d, %d bytes, %g us) is unusable: needs world >= 2, bytes > 0 "
          "and a positive time",
          i, s.world, s.bytes, s.time_us));
    }
    worlds.insert(s.world);
    sizes.insert(s.bytes);
  }
  if (sizes.size() < 2) {
    return absl::InvalidArgumentError(
        "fit: needs measurements at two or more message sizes (got " +
        std::to_string(sizes.size()) + ")");
  }
  const bool one_world = worlds.size() == 1;
  if (options.shared_machine && one_world) {
    return absl::InvalidArgumentError(
        "fit: a machine shared by the ranks is told from the links only across world sizes: "
        "needs measurements at two or more (got one)");
  }
  // Features: base, ring steps 2(p-1), ring bytes 2(p-1)/p * m (in bytes,
  // coefficient = 1/busbw in us/B), and where asked, the bytes all ranks
  // move 2(p-1) * m (coefficient = 1/shared; Note [Hosts that share a
  // machine]). Weighted least squares with weights 1/t^2, non-negative by
  // trying every subset of the features.
  constexpr int kFeatures = 4;
  auto feature = [](const AllReduceSample& s, int k) -> double {
    const double steps = 2.0 * (s.world - 1);
    if (k == 0) return 1.0;
    if (k == 1) return steps;
    if (k == 2) return steps / s.world * static_cast<double>(s.bytes);
    return steps * static_cast<double>(s.bytes);
  };
  double best_err = std::numeric_limits<double>::infinity();
  std::array<double, kFeatures> best = {0, 0, 0, 0};
  for (int mask = 1; mask < (1 << kFeatures); ++mask) {
    if (!(mask & 4)) continue;                            // the links' bandwidth is always there
    if (one_world && (mask & 1)) continue;                // base is not identifiable
    if (!options.shared_machine && (mask & 8)) continue;  // independent hosts
    std::vector<int> ks;
    for (int k = 0; k < kFeatures; ++k) {
      if (mask & (1 << k)) ks.push_back(k);
    }
    const size_t d = ks.size();
    // Normal equations A^T W A x = A^T W t, solved by Gaussian elimination.
    double a[kFeatures][kFeatures + 1] = {};
    for (const AllReduceSample& s : samples) {
      const double w = 1.0 / (s.time_us * s.time_us);
      for (size_t i = 0; i < d; ++i) {
        for (size_t j = 0; j < d; ++j) a[i][j] += w * feature(s, ks[i]) * feature(s, ks[j]);
        a[i][d] += w * feature(s, ks[i]) * s.time_us;
      }
    }
    bool singular = false;
    for (size_t c = 0; c < d && !singular; ++c) {
      size_t piv = c;
      for (size_t r = c + 1; r < d; ++r) {
        if (std::abs(a[r][c]) > std::abs(a[piv][c])) piv = r;
      }
      if (std::abs(a[piv][c]) < 1e-300) {
        singular = true;
        break;
      }
      std::swap(a[c], a[piv]);
      for (size_t r = 0; r < d; ++r) {
        if (r == c) continue;
        const double f = a[r][c] / a[c][c];
        for (size_t k = c; k <= d; ++k) a[r][k] -= f * a[c][k];
      }
    }
    if (singular) continue;
    std::array<double, kFeatures> x = {0, 0, 0, 0};
    bool negative = false;
    for (size_t i = 0; i < d; ++i) {
      x[ks[i]] = a[i][d] / a[i][i];
      if (x[ks[i]] < 0) negative = true;
    }
    if (negative || x[2] <= 0) continue;
    double err = 0;
    for (const AllReduceSample& s : samples) {
      double pred = 0;
      for (int k = 0; k < kFeatures; ++k) pred += x[k] * feature(s, k);
      const double r = (pred - s.time_us) / s.time_us;
      err += r * r;
    }
    if (err < best_err) {
      best_err = err;
      best = x;
    }
  }
  // Per world size, the largest message must not be faster than the
  // smallest: then no bandwidth explains the data.
  for (int w : worlds) {
    const AllReduceSample* small = nullptr;
    const AllReduceSample* large = nullptr;
    for (const AllReduceSample& s : samples) {
      if (s.world != w) continue;
      if (small == nullptr || s.bytes < small->bytes) small = &s;
      if (large == nullptr || s.bytes > large->bytes) large = &s;
    }
    if (small->bytes < large->bytes && large->time_us < small->time_us) best_err = INFINITY;
  }
  if (!std::isfinite(best_err)) {
    return absl::InvalidArgumentError(
        "fit: the measurements do not fit time = latency + bytes / bandwidth with a positive "
        "bandwidth (do larger messages take longer?)");
  }
  CostModel m;
  m.name = "fitted";
  m.source = std::move(source);
  m.ranks_per_node = ranks_per_node;
  m.intra_busbw_gbps = 1e-3 / best[2];  // us/B -> GB/s
  m.inter_busbw_gbps = m.intra_busbw_gbps;
  m.simple = Uniform(best[0], best[1]);
  // A shared machine faster than any bandwidth this model admits is none.
  m.shared_gbps = best[3] > 1e-3 / kMaxBusbwGbps ? 1e-3 / best[3] : 0;
  if (absl::Status s = m.Validate(); !s.ok()) return s;
  return m;
}

namespace {

absl::StatusOr<json> ParseBounded(absl::string_view text, absl::string_view what) {
  absl::StatusOr<json> j = json_fields::ParseObject(text, kMaxJsonDepth);
  if (!j.ok()) return absl::Status(j.status().code(), absl::StrCat(what, ": ", j.status().message()));
  return j;
}

// Whether `obj` has a string member `key` equal to `want`. (json::value()
// would throw on a member of another type: a hostile file must not crash.)
bool StringMemberIs(const json& obj, const char* key, absl::string_view want) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() && it->get_ref<const std::string&>() == want;
}

absl::StatusOr<double> GetNumber(const json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return absl::InvalidArgumentError(absl::StrCat(where, key, ": missing"));
  if (!it->is_number()) {
    return absl::InvalidArgumentError(absl::StrCat(where, key, ": not a number"));
  }
  const double v = it->get<double>();
  if (!std::isfinite(v)) return absl::InvalidArgumentError(absl::StrCat(where, key, ": not finite"));
  return v;
}

}  // namespace

absl::StatusOr<std::vector<AllReduceSample>> ParsePerfAllReduceJson(absl::string_view text) {
  auto j = ParseBounded(text, "fusebox-perf JSON");
  if (!j.ok()) return j.status();
  if (!StringMemberIs(*j, "collective", "allreduce")) {
    return absl::InvalidArgumentError(
        "fusebox-perf JSON: \"collective\" is not \"allreduce\" (is this fusebox-perf "
        "allreduce --json output?)");
  }
  auto nranks = GetNumber(*j, "nranks", "fusebox-perf JSON: ");
  if (!nranks.ok()) return nranks.status();
  if (*nranks < 1 || *nranks > (1 << 24) || *nranks != std::floor(*nranks)) {
    return absl::InvalidArgumentError("fusebox-perf JSON: nranks is not a rank count");
  }
  auto rows = j->find("results");
  if (rows == j->end() || !rows->is_array()) {
    return absl::InvalidArgumentError("fusebox-perf JSON: results: missing or not an array");
  }
  if (rows->size() > kMaxSamples) {
    return absl::InvalidArgumentError("fusebox-perf JSON: results: too many rows");
  }
  std::vector<AllReduceSample> out;
  for (size_t i = 0; i < rows->size(); ++i) {
    const json& row = (*rows)[i];
    const std::string where = absl::StrCat("fusebox-perf JSON: results[", i, "].");
    if (!row.is_object()) return absl::InvalidArgumentError(where + " not an object");
    auto bytes = GetNumber(row, "bytes", where);
    if (!bytes.ok()) return bytes.status();
    if (*bytes < 0 || *bytes > 1e15) return absl::InvalidArgumentError(where + "bytes: out of range");
    if (*bytes != std::floor(*bytes)) {
      return absl::InvalidArgumentError(where + "bytes: not a whole number of bytes");
    }
    double best = std::numeric_limits<double>::infinity();
    for (const char* col : {"oop", "ip"}) {
      auto c = row.find(col);
      if (c == row.end()) continue;
      if (!c->is_object()) return absl::InvalidArgumentError(where + col + ": not an object");
      auto t = GetNumber(*c, "time_us", where + col + ".");
      if (!t.ok()) return t.status();
      if (*t > 0) best = std::min(best, *t);
    }
    if (*bytes == 0 || !std::isfinite(best)) continue;  // nothing timed
    out.push_back({static_cast<int>(*nranks), static_cast<int64_t>(*bytes), best});
  }
  return out;
}

std::string SerializeCostModel(const CostModel& m) {
  auto lat = [](const ProtocolLatency& l) {
    return json{{"base_us", l.base_us}, {"intra_hop_us", l.intra_hop_us},
                {"inter_hop_us", l.inter_hop_us}, {"tree_hop_us", l.tree_hop_us}};
  };
  json j = {{"format", "fusebox-cost-model"},
            {"version", 1},
            {"name", m.name},
            {"source", m.source},
            {"ranks_per_node", m.ranks_per_node},
            {"intra_busbw_gbps", m.intra_busbw_gbps},
            {"inter_busbw_gbps", m.inter_busbw_gbps},
            {"simple", lat(m.simple)},
            {"tree", m.has_tree}};
  if (m.shared_gbps > 0) j["shared_gbps"] = m.shared_gbps;
  if (m.has_ll) j["ll"] = lat(m.ll);
  if (!m.measured.empty()) {
    json table = json::array();
    for (const AllReduceSample& s : m.measured) table.push_back({s.world, s.bytes, s.time_us});
    j["measured"] = table;
  }
  return j.dump(2) + "\n";
}

absl::StatusOr<CostModel> ParseCostModel(absl::string_view text) {
  if (text.size() > (size_t{1} << 20)) {
    return absl::InvalidArgumentError("cost model file: larger than 1 MiB");
  }
  auto j = ParseBounded(text, "cost model file");
  if (!j.ok()) return j.status();
  if (!StringMemberIs(*j, "format", "fusebox-cost-model")) {
    return absl::InvalidArgumentError("cost model file: format is not \"fusebox-cost-model\"");
  }
  auto version = GetNumber(*j, "version", "cost model file: ");
  if (!version.ok()) return version.status();
  if (*version != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cost model file: version ", *version, " is not supported (expected 1)"));
  }
  CostModel m;
  auto str = [&](const char* key, std::string* out) -> absl::Status {
    auto it = j->find(key);
    if (it == j->end() || !it->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cost model file: ", key, ": missing or not a string"));
    }
    *out = it->get<std::string>();
    if (out->size() > 4096) {
      return absl::InvalidArgumentError(absl::StrCat("cost model file: ", key, ": too long"));
    }
    return absl::OkStatus();
  };
  if (absl::Status s = str("name", &m.name); !s.ok()) return s;
  if (j->contains("source")) {
    if (absl::Status s = str("source", &m.source); !s.ok()) return s;
  }
  auto rpn = GetNumber(*j, "ranks_per_node", "cost model file: ");
  if (!rpn.ok()) return rpn.status();
  if (*rpn < 1 || *rpn > (1 << 20) || *rpn != std::floor(*rpn)) {
    return absl::InvalidArgumentError("cost model file: ranks_per_node: not an integer in [1, 2^20]");
  }
  m.ranks_per_node = static_cast<int>(*rpn);
  for (auto [key, out] : {std::pair{"intra_busbw_gbps", &m.intra_busbw_gbps},
                          {"inter_busbw_gbps", &m.inter_busbw_gbps}}) {
    auto v = GetNumber(*j, key, "cost model file: ");
    if (!v.ok()) return v.status();
    *out = *v;
  }
  auto lat = [&](const char* key, ProtocolLatency* out) -> absl::Status {
    auto it = j->find(key);
    if (it == j->end() || !it->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cost model file: ", key, ": missing or not an object"));
    }
    const std::string where = absl::StrCat("cost model file: ", key, ".");
    for (auto [field, dst] : {std::pair{"base_us", &out->base_us},
                              {"intra_hop_us", &out->intra_hop_us},
                              {"inter_hop_us", &out->inter_hop_us},
                              {"tree_hop_us", &out->tree_hop_us}}) {
      auto v = GetNumber(*it, field, where);
      if (!v.ok()) return v.status();
      *dst = *v;
    }
    return absl::OkStatus();
  };
  if (absl::Status s = lat("simple", &m.simple); !s.ok()) return s;
  if (j->contains("ll")) {
    m.has_ll = true;
    if (absl::Status s = lat("ll", &m.ll); !s.ok()) return s;
  }
  if (j->contains("shared_gbps")) {
    auto v = GetNumber(*j, "shared_gbps", "cost model file: ");
    if (!v.ok()) return v.status();
    m.shared_gbps = *v;
  }
  auto tree = j->find("tree");
  if (tree != j->end()) {
    if (!tree->is_boolean()) return absl::InvalidArgumentError("cost model file: tree: not a boolean");
    m.has_tree = tree->get<bool>();
  }
  auto table = j->find("measured");
  if (table != j->end()) {
    if (!table->is_array() || table->size() > kMaxSamples) {
      return absl::InvalidArgumentError("cost model file: measured: not an array of at most 65536");
    }
    for (size_t i = 0; i < table->size(); ++i) {
      const json& row = (*table)[i];
      if (!row.is_array() || row.size() != 3 || !row[0].is_number_integer() ||
          !row[1].is_number_integer() || !row[2].is_number()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cost model file: measured[", i, "]: expected [world, bytes, time_us]"));
      }
      // Unsigned values above INT64_MAX read as negative and are refused;
      // the world is range-checked before it is narrowed to int.
      const int64_t world = row[0].get<int64_t>();
      if (world < 2 || world > (1 << 24)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cost model file: measured[", i, "]: world ", world, " is not in [2, 2^24]"));
      }
      const AllReduceSample s{static_cast<int>(world), row[1].get<int64_t>(), row[2].get<double>()};
      if (s.bytes <= 0 || !std::isfinite(s.time_us) || s.time_us <= 0 ||
          (!m.measured.empty() && (s.world != m.measured[0].world ||
                                   s.bytes <= m.measured.back().bytes ||
                                   s.time_us < m.measured.back().time_us))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cost model file: measured[", i, "]: needs world >= 2 (one world), increasing bytes "
            "and non-decreasing positive times"));
      }
      m.measured.push_back(s);
    }
  }
  if (absl::Status s = m.Validate(); !s.ok()) return s;
  return m;
}

}  // namespace fusebox::autotune
