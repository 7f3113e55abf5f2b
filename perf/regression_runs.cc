#include "perf/regression_runs.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "autotune/decision.h"
#include "nlohmann/json.hpp"

namespace fusebox::perf {
namespace {

using autotune::RegressionCheck;

// SplitMix64: the same numbers on every platform and standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  int Below(int n) { return static_cast<int>(Uniform() * n); }

 private:
  uint64_t state_;
};

uint64_t Mix(uint64_t a, uint64_t b) {
  Rng r(a * 0x9e3779b97f4a7c15ULL + b);
  return r.Next();
}

double MedianOf(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A trace resampled in blocks of consecutive steps, each step possibly a
// non-training one.
class Stream {
 public:
  Stream(const StepTrace& trace, const RegressionSimOptions& o, Rng& rng)
      : trace_(trace), o_(o), rng_(rng) {}
  double Next() {
    const int n = static_cast<int>(trace_.ratio.size());
    const int block = std::min(o_.block, n);
    if (left_ == 0) {
      pos_ = rng_.Below(n - block + 1);
      left_ = block;
    }
    double t = trace_.ratio[pos_++];
    --left_;
    if (rng_.Uniform() < o_.outlier_rate) {
      t *= o_.outlier_low + (o_.outlier_high - o_.outlier_low) * rng_.Uniform();
    }
    return t;
  }

 private:
  const StepTrace& trace_;
  const RegressionSimOptions& o_;
  Rng& rng_;
  int pos_ = 0;
  int left_ = 0;
};

void Add(SimCell& to, const SimCell& c) {
  to.null_runs += c.null_runs;
  to.false_alarms += c.false_alarms;
  to.window_false_alarms += c.window_false_alarms;
  to.power_runs += c.power_runs;
  to.detected += c.detected;
  to.early += c.early;
  to.window_detected += c.window_detected;
  to.delay_pairs.insert(to.delay_pairs.end(), c.delay_pairs.begin(), c.delay_pairs.end());
  to.delay_steps.insert(to.delay_steps.end(), c.delay_steps.begin(), c.delay_steps.end());
  to.expected_steps.insert(to.expected_steps.end(), c.expected_steps.begin(),
                           c.expected_steps.end());
}

void Count(SimCell& c, const RunOutcome& r, bool regression) {
  if (!regression) {
    ++c.null_runs;
    c.false_alarms += r.alarm;
    c.window_false_alarms += r.window_alarm;
    return;
  }
  ++c.power_runs;
  c.detected += r.in_time;
  c.early += r.early;
  c.window_detected += r.window_in_time;
  c.expected_steps.push_back(r.expected_steps);
  if (r.delay_pairs >= 0) {
    c.delay_pairs.push_back(r.delay_pairs);
    c.delay_steps.push_back(r.delay_steps);
  }
}

std::string Percent(double v) { return absl::StrFormat("%.1f%%", 100 * v); }
std::string Median0(const std::vector<double>& v) {
  return v.empty() ? "-" : absl::StrFormat("%.0f", MedianOf(v));
}
std::string Rate(int k, int n) { return n > 0 ? Percent(static_cast<double>(k) / n) : "-"; }
std::string GainLabel(double g) { return absl::StrFormat("%g%%", 100 * g); }

}  // namespace

absl::StatusOr<std::vector<StepTrace>> LoadStepTraces(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  nlohmann::json doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("traces") ||
      !doc["traces"].is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a step-traces file"));
  }
  std::vector<StepTrace> out;
  for (const nlohmann::json& t : doc["traces"]) {
    if (!t.is_object() || !t.contains("ms") || !t.contains("group") || !t["ms"].is_array() ||
        !t["group"].is_array() || t["ms"].size() != t["group"].size() || t["ms"].size() < 32) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": a trace needs \"ms\" and \"group\" of the same length (>= 32)"));
    }
    StepTrace trace;
    trace.id = t.value("id", std::string("?"));
    trace.source = t.value("source", std::string("?"));
    trace.commit = t.value("commit", std::string("?"));
    std::map<int64_t, std::vector<double>> groups;
    std::vector<double> ms;
    std::vector<int64_t> group;
    for (size_t i = 0; i < t["ms"].size(); ++i) {
      if (!t["ms"][i].is_number() || !t["group"][i].is_number_integer() ||
          !(t["ms"][i].get<double>() > 0)) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": trace ", trace.id, " step ", i,
                                                       ": not a positive time and a group"));
      }
      ms.push_back(t["ms"][i].get<double>());
      group.push_back(t["group"][i].get<int64_t>());
      groups[group.back()].push_back(ms.back());
    }
    std::map<int64_t, double> median;
    for (auto& [g, v] : groups) median[g] = MedianOf(v);
    for (size_t i = 0; i < ms.size(); ++i) trace.ratio.push_back(ms[i] / median[group[i]]);
    std::vector<double> a(trace.ratio.begin(), trace.ratio.end() - 1);
    std::vector<double> b(trace.ratio.begin() + 1, trace.ratio.end());
    trace.sigma = autotune::NoiseFromPairs(a, b);
    out.push_back(std::move(trace));
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no traces"));
  return out;
}

RunOutcome SimulateRun(const StepTrace& trace, double gain, bool regression, uint64_t seed,
                       const RegressionSimOptions& o) {
  Rng rng(seed);
  Stream stream(trace, o, rng);
  RunOutcome r;
  // The tuner's interval (Note [Checking more often once the gain is
  // gone]): CheckEvery(gain) while the pairs show the gain, the least once
  // they do not.
  autotune::CheckInterval interval(gain, autotune::kMinCheckEvery, o.max_cost);
  r.check_every = interval.every();
  const double kept_ratio = 1 - gain;
  const double regressed_ratio = 1 + o.injected;

  // The tuner's verification pairs, just before the run.
  std::vector<double> vb, vk;
  for (int i = 0; i < o.verify_pairs; ++i) {
    vb.push_back(stream.Next());
    vk.push_back(stream.Next() * kept_ratio);
  }
  r.sigma0 = autotune::NoiseFromPairs(vb, vk, o.detector.clip);
  RegressionCheck check(o.detector, r.sigma0);

  const autotune::SwitchRule rule;  // the window rule: 95%, more than 2% slower
  constexpr int kWindow = 8;
  std::vector<double> wb, wk;

  const int change = regression ? o.steps / 2 : -1;
  r.change_step = change;
  double end = o.steps;  // a power run's end is set at the change
  auto enter = [&](int t) {
    if (t != change) return;
    r.sigma_at_change = check.sigma();
    r.expected_pairs = autotune::ExpectedDetectionPairs(o.detector, r.sigma_at_change, o.injected);
    // About 2 pairs at the first interval show the gain gone; the rest come
    // at the least one.
    const double slow_pairs = std::min(r.expected_pairs, 2.0);
    r.expected_steps = slow_pairs * r.check_every +
                       (r.expected_pairs - slow_pairs) * autotune::kMinCheckEvery;
    r.allowed_steps = o.stated_factor * r.expected_steps;
    end = std::max<double>(o.steps, change + r.allowed_steps);
  };
  int next_check = rng.Below(r.check_every);
  int post_change_pairs = 0;
  for (int t = 0; t < end && t < o.max_steps; ++t) {
    enter(t);
    const double base = stream.Next();
    if (t != next_check) continue;
    // The check: the baseline runs step t, the kept plan step t + 1.
    enter(++t);
    const bool regressed = regression && t >= change;
    const double kept = stream.Next() * (regressed ? regressed_ratio : kept_ratio);
    interval.Add(base, kept);
    next_check = t - 1 + interval.every();
    ++r.pairs;
    post_change_pairs += regressed;
    const bool was = check.detected();
    if (check.Add(base, kept) && !was) {
      r.alarm = true;
      r.alarm_step = t;
      if (regression && !regressed) {
        r.early = true;
      } else if (regression) {
        r.delay_pairs = post_change_pairs;
        r.delay_steps = t - change;
        r.in_time = r.delay_steps <= r.allowed_steps;
      }
    }
    if (!r.window_alarm) {
      wb.push_back(base);
      wk.push_back(kept);
      if (static_cast<int>(wb.size()) == kWindow) {
        if (autotune::ProvenSlower(wb, wk, rule)) {
          r.window_alarm = true;
          // A window alarm before the change is a false alarm, never in time.
          r.window_in_time = regressed && t - change <= r.allowed_steps;
        }
        wb.clear();
        wk.clear();
      }
    }
    if (check.detected() && r.window_alarm) break;
  }
  return r;
}

SimResult RunRegressionSim(const std::vector<StepTrace>& traces, const RegressionSimOptions& o) {
  SimResult res;
  res.options = o;
  res.traces = traces;
  res.class_edges = {0.10, 0.16};
  const size_t classes = res.class_edges.size() + 1;
  auto class_of = [&](double sigma) {
    size_t c = 0;
    while (c < res.class_edges.size() && sigma >= res.class_edges[c]) ++c;
    return c;
  };
  res.by_gain_class.assign(o.gains.size(), std::vector<SimCell>(classes));
  res.by_gain.assign(o.gains.size(), SimCell{});
  res.by_trace.assign(traces.size(), SimCell{});
  for (size_t g = 0; g < o.gains.size(); ++g) {
    for (int kind = 0; kind < 2; ++kind) {
      for (int i = 0; i < o.runs; ++i) {
        const size_t ti = static_cast<size_t>(i) % traces.size();
        const uint64_t seed = Mix(Mix(Mix(o.seed, g), kind), static_cast<uint64_t>(i));
        const RunOutcome r = SimulateRun(traces[ti], o.gains[g], kind == 1, seed, o);
        SimCell one;
        Count(one, r, kind == 1);
        Add(res.by_gain_class[g][class_of(traces[ti].sigma)], one);
        Add(res.by_gain[g], one);
        Add(res.by_trace[ti], one);
        Add(res.total, one);
      }
    }
  }
  return res;
}

double FalseAlarmRate(const SimCell& c) {
  return c.null_runs > 0 ? static_cast<double>(c.false_alarms) / c.null_runs : 0;
}
double Power(const SimCell& c) {
  return c.power_runs > 0 ? static_cast<double>(c.detected) / c.power_runs : 0;
}
bool TargetsMet(const SimResult& r) {
  if (r.by_gain.empty()) return false;
  for (const SimCell& c : r.by_gain) {
    if (c.null_runs == 0 || c.power_runs == 0) return false;
    if (!(FalseAlarmRate(c) < kMaxFalseAlarmRate) || !(Power(c) >= kMinPower)) return false;
  }
  return true;
}

std::string MarkdownReport(const SimResult& r, const std::string& traces_path) {
  const RegressionSimOptions& o = r.options;
  const autotune::RegressionOptions& d = o.detector;
  std::ostringstream out;
  std::vector<std::string> commits;
  for (const StepTrace& t : r.traces) {
    if (std::find(commits.begin(), commits.end(), t.commit) == commits.end()) {
      commits.push_back(t.commit);
    }
  }
  out << absl::StrFormat(
      "# Regression checks on resampled recorded step times\n\n"
      "Traces: %s (%d recorded traces of real PyTorch DDP steps, from the files of commit %s); "
      "%d null and %d power runs per gain; seeds: run i (0..%d) of each gain and kind is seeded "
      "from (base seed %d, gain, kind, i).\n\n",
      traces_path, r.traces.size(), absl::StrJoin(commits, ", "), o.runs, o.runs, o.runs - 1,
      o.seed);
  out << absl::StrFormat(
      "Setup: a run resamples one trace in blocks of %d steps; 1 step in %.0f is a non-training "
      "step %g-%gx slower (either plan); sigma0 from %d verification pairs; a check pair (baseline "
      "step, next kept step) every CheckEvery(gain, %g) steps while the last 3 pairs show the "
      "gain, every 5 once they do not. Null runs: %d steps, the kept plan "
      "(1 - gain) x the baseline. Power runs: from step %d the kept plan is %g%% slower than the "
      "baseline; detected = alarm after the change within %gx the expected delay that the "
      "detector states (ExpectedDetectionPairs at its sigma then: 2 pairs at the gain's "
      "interval, the rest every 5 steps); an alarm before "
      "the change is a miss. Delays count from the change. Detector: CUSUM of winsorised "
      "log-ratios, regression %g%%, clip %g "
      "sigma, false_alarm_pairs %g, sigma_floor %g, window %d, prior_pairs %g.\n\n",
      o.block, 1 / o.outlier_rate, o.outlier_low, o.outlier_high, o.verify_pairs, o.max_cost,
      o.steps, o.steps / 2, 100 * o.injected, o.stated_factor, 100 * d.regression, d.clip,
      d.false_alarm_pairs, d.sigma_floor, d.window, d.prior_pairs);

  const size_t classes = r.class_edges.size() + 1;
  auto class_label = [&](size_t c) {
    if (c == 0) return absl::StrFormat("sigma < %.2f", r.class_edges[0]);
    if (c == classes - 1) return absl::StrFormat("sigma >= %.2f", r.class_edges[c - 1]);
    return absl::StrFormat("%.2f <= sigma < %.2f", r.class_edges[c - 1], r.class_edges[c]);
  };
  auto traces_in = [&](size_t c) {
    int n = 0;
    for (const StepTrace& t : r.traces) {
      size_t k = 0;
      while (k < r.class_edges.size() && t.sigma >= r.class_edges[k]) ++k;
      n += k == c;
    }
    return n;
  };
  out << "## Runs by kept-plan gain and trace noise\n\n"
         "| gain | trace noise (sigma of adjacent log-ratios) | traces | check every (steps) | "
         "check cost % | null runs | false alarms | false-alarm rate | power runs | detected in "
         "time | power | median delay pairs | median delay steps | median expected delay steps |\n"
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  auto row = [&](const std::string& gain, const std::string& cls, const std::string& traces,
                 int every, double g, const SimCell& c) {
    out << absl::StrFormat(
        "| %s | %s | %s | %d | %.2f | %d | %d | %s | %d | %d | %s | %s | %s | %s |\n", gain, cls,
        traces, every, 100 * std::max(0.0, g) / every, c.null_runs, c.false_alarms,
        Rate(c.false_alarms, c.null_runs), c.power_runs, c.detected, Rate(c.detected, c.power_runs),
        Median0(c.delay_pairs), Median0(c.delay_steps), Median0(c.expected_steps));
  };
  for (size_t g = 0; g < o.gains.size(); ++g) {
    const int every = autotune::CheckEvery(o.gains[g], o.max_cost);
    for (size_t c = 0; c < classes; ++c) {
      row(GainLabel(o.gains[g]), class_label(c), absl::StrCat(traces_in(c)), every, o.gains[g],
          r.by_gain_class[g][c]);
    }
    row(GainLabel(o.gains[g]), "all", absl::StrCat(r.traces.size()), every, o.gains[g],
        r.by_gain[g]);
  }

  // The targets hold at every gain: the worst gain's figure is the one judged.
  size_t worst_fa = 0, worst_power = 0;
  for (size_t g = 1; g < r.by_gain.size(); ++g) {
    if (FalseAlarmRate(r.by_gain[g]) > FalseAlarmRate(r.by_gain[worst_fa])) worst_fa = g;
    if (Power(r.by_gain[g]) < Power(r.by_gain[worst_power])) worst_power = g;
  }
  const SimCell& fa = r.by_gain[worst_fa];
  const SimCell& pw = r.by_gain[worst_power];
  const bool fa_ok = fa.null_runs > 0 && FalseAlarmRate(fa) < kMaxFalseAlarmRate;
  const bool power_ok = pw.power_runs > 0 && Power(pw) >= kMinPower;
  out << "\n## Targets (at every gain: the worst gain is judged)\n\n"
         "| target | runs per gain | worst gain | measured there | all gains | result |\n"
         "|---|---|---|---|---|---|\n";
  out << absl::StrFormat(
      "| false alarms in < %.0f%% of %d-step runs without a regression | %d | %s | %s (%d) | %s "
      "(%d of %d) | %s |\n",
      100 * kMaxFalseAlarmRate, o.steps, o.runs, GainLabel(o.gains[worst_fa]),
      Rate(fa.false_alarms, fa.null_runs), fa.false_alarms,
      Rate(r.total.false_alarms, r.total.null_runs), r.total.false_alarms, r.total.null_runs,
      fa_ok ? "PASS" : "FAIL");
  out << absl::StrFormat(
      "| a %g%% regression detected within %gx the expected delay in >= %.0f%% of runs | %d | %s | "
      "%s (%d) | %s (%d of %d; %d alarmed before the change) | %s |\n",
      100 * o.injected, o.stated_factor, 100 * kMinPower, o.runs, GainLabel(o.gains[worst_power]),
      Rate(pw.detected, pw.power_runs), pw.detected, Rate(r.total.detected, r.total.power_runs),
      r.total.detected, r.total.power_runs, r.total.early, power_ok ? "PASS" : "FAIL");

  out << "\n## For comparison: windows of 8 pairs, slower by more than 2% with 95% confidence "
         "(ProvenSlower), on the same pairs\n\n"
         "| gain | false-alarm rate | power (within the same delay) |\n|---|---|---|\n";
  for (size_t g = 0; g < o.gains.size(); ++g) {
    const SimCell& c = r.by_gain[g];
    out << absl::StrFormat("| %s | %s | %s |\n", GainLabel(o.gains[g]),
                           Rate(c.window_false_alarms, c.null_runs),
                           Rate(c.window_detected, c.power_runs));
  }
  out << absl::StrFormat("| all | %s | %s |\n",
                         Rate(r.total.window_false_alarms, r.total.null_runs),
                         Rate(r.total.window_detected, r.total.power_runs));

  out << "\n## By trace (all gains)\n\n"
         "| trace | steps | sigma | null runs | false alarms | power runs | power | median delay "
         "steps | median expected delay steps |\n|---|---|---|---|---|---|---|---|---|\n";
  for (size_t t = 0; t < r.traces.size(); ++t) {
    const SimCell& c = r.by_trace[t];
    out << absl::StrFormat("| %s | %d | %.3f | %d | %d | %d | %s | %s | %s |\n", r.traces[t].id,
                           r.traces[t].ratio.size(), r.traces[t].sigma, c.null_runs, c.false_alarms,
                           c.power_runs, Rate(c.detected, c.power_runs), Median0(c.delay_steps),
                           Median0(c.expected_steps));
  }
  return out.str();
}

}  // namespace fusebox::perf
