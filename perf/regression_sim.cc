// fusebox-regression-sim: the regression checks of autotune/regression.h
// (Note [Catching small regressions]) on synthetic runs that resample
// recorded step times (perf/regression_runs.h), as a markdown report:
// false alarms without a regression, detections of a 3% regression and
// their delays, by kept-plan gain and trace noise, and the targets.
//
//   fusebox-regression-sim                      # 1000 null + 1000 power runs per gain
//   fusebox-regression-sim --runs 250 --seed 7 --traces my_traces.json
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "autotune/regression.h"
#include "perf/regression_runs.h"
#include "tools/cli.h"

ABSL_FLAG(std::string, traces, FUSEBOX_SOURCE_DIR "/tests/autotune/data/step_traces.json",
          "recorded step times (JSON of tests/autotune/data/extract_step_traces.py)");
ABSL_FLAG(int, runs, 1000, "null runs, and as many power runs, per gain");
ABSL_FLAG(uint64_t, seed, 1, "base seed (every run's seed derives from it)");
ABSL_FLAG(std::string, gains, "0,0.02,0.05,0.1",
          "the kept plan's gains over the baseline, comma-separated fractions in [0, 0.5]");
ABSL_FLAG(int, steps, 1000, "steps of a null run; a power run's regression starts at half");
ABSL_FLAG(double, regression, 0.03,
          "the regression injected in power runs (fraction; the detector looks for "
          "--detect)");
ABSL_FLAG(double, detect, 0.03, "the detector's regression (RegressionOptions.regression)");
ABSL_FLAG(double, false_alarm_pairs, fusebox::autotune::RegressionOptions{}.false_alarm_pairs,
          "the detector's average pairs to a false alarm (RegressionOptions.false_alarm_pairs)");
ABSL_FLAG(double, clip, fusebox::autotune::RegressionOptions{}.clip,
          "the detector's winsorising point in sigmas (RegressionOptions.clip)");
ABSL_FLAG(double, max_cost, 0.01, "checks' share of the run: CheckEvery(gain, max_cost)");
ABSL_FLAG(double, outlier_rate, 0.02, "share of non-training steps (2-5x slower)");
ABSL_FLAG(double, stated_factor, 3,
          "detections count within this x the expected delay that the detector states");

int main(int argc, char** argv) {
  const std::vector<char*> rest = fusebox::tools::ParseToolCommandLine(
      argc, argv, "fusebox-regression-sim",
      "runs the regression detector (autotune/regression.h) on seeded synthetic runs that "
      "resample recorded step times, and prints a markdown report; exit status 1 when a target "
      "is missed, 2 on bad input.\n  fusebox-regression-sim [--runs N] [--seed S] [--traces "
      "FILE] [--gains 0,0.02,...]",
      "perf/regression_sim");
  if (rest.size() > 1) {
    std::fprintf(stderr, "fusebox-regression-sim: unexpected argument \"%s\" (see --help)\n",
                 rest[1]);
    return 2;
  }
  fusebox::perf::RegressionSimOptions o;
  o.runs = absl::GetFlag(FLAGS_runs);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.injected = absl::GetFlag(FLAGS_regression);
  o.max_cost = absl::GetFlag(FLAGS_max_cost);
  o.outlier_rate = absl::GetFlag(FLAGS_outlier_rate);
  o.stated_factor = absl::GetFlag(FLAGS_stated_factor);
  o.detector.regression = absl::GetFlag(FLAGS_detect);
  o.detector.false_alarm_pairs = absl::GetFlag(FLAGS_false_alarm_pairs);
  o.detector.clip = absl::GetFlag(FLAGS_clip);
  o.gains.clear();
  for (absl::string_view g : absl::StrSplit(absl::GetFlag(FLAGS_gains), ',')) {
    double v;
    if (!absl::SimpleAtod(g, &v) || !(v >= 0 && v <= 0.5)) {
      std::fprintf(stderr,
                   "fusebox-regression-sim: --gains: \"%s\" is not a fraction in [0, 0.5]\n",
                   std::string(g).c_str());
      return 2;
    }
    o.gains.push_back(v);
  }
  auto bad = [](const char* what) {
    std::fprintf(stderr, "fusebox-regression-sim: %s\n", what);
    return 2;
  };
  if (o.runs < 1) return bad("--runs must be at least 1");
  if (o.steps < 100) return bad("--steps must be at least 100");
  if (!(o.injected > 0 && o.injected < 1)) return bad("--regression must be in (0, 1)");
  if (!(o.max_cost > 0 && o.max_cost <= 0.5)) return bad("--max_cost must be in (0, 0.5]");
  if (!(o.outlier_rate >= 0 && o.outlier_rate < 1)) return bad("--outlier_rate must be in [0, 1)");
  if (!(o.stated_factor >= 1)) return bad("--stated_factor must be at least 1");
  if (absl::Status s = fusebox::autotune::Validate(o.detector); !s.ok()) {
    std::fprintf(stderr, "fusebox-regression-sim: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  const std::string path = absl::GetFlag(FLAGS_traces);
  auto traces = fusebox::perf::LoadStepTraces(path);
  if (!traces.ok()) {
    std::fprintf(stderr, "fusebox-regression-sim: %s\n",
                 std::string(traces.status().message()).c_str());
    return 2;
  }
  const fusebox::perf::SimResult r = fusebox::perf::RunRegressionSim(*traces, o);
  // The header names the shipped file by its path in the repository.
  const std::string root = FUSEBOX_SOURCE_DIR "/";
  const std::string label = path.rfind(root, 0) == 0 ? path.substr(root.size()) : path;
  std::fputs(fusebox::perf::MarkdownReport(r, label).c_str(), stdout);
  return fusebox::perf::TargetsMet(r) ? 0 : 1;
}
