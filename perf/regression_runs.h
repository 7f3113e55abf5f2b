// Synthetic check streams from recorded step times, for the regression
// detector of autotune/regression.h (Note [Catching small regressions]):
// shared by fusebox-regression-sim (perf/regression_sim.cc) and its test
// (tests/autotune/regression_test.cc). Deterministic from seeds.
//
// A run: a recorded trace (tests/autotune/data/step_traces.json; each step
// divided by the median of its plan in its round) resampled in blocks of
// `block` consecutive steps to the run's length, so that slow spells and
// step-to-step structure stay as recorded. Step t of the baseline takes
// r_t, the kept plan r_t * (1 - gain); a step is a non-training step (2-5x
// slower) with probability `outlier_rate`, on whichever plan runs it. Before
// the run, `verify_pairs` adjacent (baseline, kept) pairs give sigma0 (the
// tuner's verification); then every CheckInterval::every() steps (from a
// random phase; CheckEvery(gain, max_cost) while the pairs show the gain,
// kMinCheckEvery once they do not, as the tuner checks) the baseline runs
// step t and the kept plan step t + 1: that pair goes to RegressionCheck.
// Null runs: `steps` steps, no regression: any alarm is a false alarm.
// Power runs: from step steps / 2 the kept plan takes r_t * (1 + injected)
// (a 3% regression from a plan that gained `gain`); the run goes on until
// `stated_factor` x the expected delay (ExpectedDetectionPairs for the
// detector's sigma at the change; 2 of them at the gain's interval, the rest
// at kMinCheckEvery: the delay the detector states) has passed. A detection within it counts; one before the change
// counts as a miss.
// The same pairs also go, in windows of 8, to the rule the checks used
// before (ProvenSlower of decision.h: slower by more than 2% with 95%
// confidence), for comparison.
#ifndef FUSEBOX_PERF_REGRESSION_RUNS_H_
#define FUSEBOX_PERF_REGRESSION_RUNS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "autotune/regression.h"

namespace fusebox::perf {

struct StepTrace {
  std::string id;             // e.g. "ddp-hook/20261124-041924/cnn-1gbit"
  std::string source;         // the trace's group, e.g. "ddp-hook"
  std::string commit;         // the commit whose files it was read from
  std::vector<double> ratio;  // each step's time / its group's median
  double sigma = 0;           // NoiseFromPairs of its adjacent steps
};

// Reads step_traces.json (tests/autotune/data/extract_step_traces.py).
absl::StatusOr<std::vector<StepTrace>> LoadStepTraces(const std::string& path);

struct RegressionSimOptions {
  autotune::RegressionOptions detector;
  std::vector<double> gains = {0, 0.02, 0.05, 0.10};
  int runs = 1000;  // null runs, and as many power runs, per gain
  uint64_t seed = 1;
  int steps = 1000;            // a null run; a power run's regression starts at steps / 2
  double injected = 0.03;      // the power runs' regression
  double max_cost = 0.01;      // check interval: CheckEvery(gain, max_cost)
  int verify_pairs = 8;        // pairs before the run that give sigma0
  int block = 16;              // resampled blocks of consecutive recorded steps
  double outlier_rate = 0.02;  // non-training steps: 1 in 50 ...
  double outlier_low = 2;      // ... this many times ...
  double outlier_high = 5;     // ... to this many times slower
  double stated_factor = 3;    // detections count within this x the stated delay
  int max_steps = 200000;      // a power run stops here whatever the stated delay
};

struct RunOutcome {
  int check_every = 0;
  int pairs = 0;        // check pairs of the run
  double sigma0 = 0;    // from the verification pairs
  bool alarm = false;   // the detector alarmed during the run
  int alarm_step = -1;  // step of the kept half of the pair that alarmed
  // Power runs only.
  int change_step = -1;
  double sigma_at_change = 0;  // the detector's sigma when the regression starts
  double expected_pairs = 0;   // ExpectedDetectionPairs at that sigma
  double expected_steps = 0;   // the stated delay: 2 pairs at check_every, the rest at the least
  double allowed_steps = 0;    // stated_factor x expected_steps
  bool early = false;          // alarm before the change (counts as a miss)
  bool in_time = false;        // detected after the change within allowed_steps
  int delay_pairs = -1;        // pairs after the change up to detection
  int delay_steps = -1;
  // The 8-pair window rule on the same pairs.
  bool window_alarm = false;
  bool window_in_time = false;  // power runs: after the change, within allowed_steps
};

RunOutcome SimulateRun(const StepTrace& trace, double gain, bool regression, uint64_t seed,
                       const RegressionSimOptions& options);

// Aggregates over runs.
struct SimCell {
  int null_runs = 0;
  int false_alarms = 0;
  int window_false_alarms = 0;
  int power_runs = 0;
  int detected = 0;  // in time
  int early = 0;
  int window_detected = 0;                       // in time
  std::vector<double> delay_pairs, delay_steps;  // of detections after the change
  std::vector<double> expected_steps;            // of every power run
};

struct SimResult {
  RegressionSimOptions options;
  std::vector<StepTrace> traces;
  std::vector<double> class_edges;                  // noise classes by trace sigma
  std::vector<std::vector<SimCell>> by_gain_class;  // [gain][class]
  std::vector<SimCell> by_gain;                     // [gain]
  std::vector<SimCell> by_trace;                    // [trace], all gains
  SimCell total;
};

// null and power runs, options.runs of each per gain; run i uses trace i % traces.size().
SimResult RunRegressionSim(const std::vector<StepTrace>& traces,
                           const RegressionSimOptions& options);

// The targets: false alarms < 1% of null runs, power >= 90%.
inline constexpr double kMaxFalseAlarmRate = 0.01;
inline constexpr double kMinPower = 0.90;
double FalseAlarmRate(const SimCell& c);
double Power(const SimCell& c);
bool TargetsMet(const SimResult& r);

// The markdown report of fusebox-regression-sim (`traces_path` for its
// header).
std::string MarkdownReport(const SimResult& r, const std::string& traces_path);

}  // namespace fusebox::perf

#endif  // FUSEBOX_PERF_REGRESSION_RUNS_H_
