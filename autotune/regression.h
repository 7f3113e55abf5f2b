// Catching a kept plan that has become slower than the user's baseline: a
// sequential test on the tuner's check pairs, and the check interval that
// keeps the checks' cost bounded. Pure: no clocks, no I/O, no randomness.
//
// Note [Catching small regressions]
// After the decision the tuner keeps a plan and checks it: every
// `check_every` steps one step of the baseline runs, paired with the next
// step of the kept plan (Note [Decisions under noise] in decision.h). A
// regression is the kept plan becoming `regression` (3%) or more slower
// than the baseline. Judging each window of 8 pairs alone for proof of
// "slower by more than 2%" (ProvenSlower in decision.h) wastes evidence and
// multiplies chances: under the 5-25% step-to-step noise of a shared
// machine one window rarely shows 3%, and every window is a fresh chance of
// a false alarm (on the recorded traces below, a quarter of 1000-step runs
// with equal plans fell back). A sequential test accumulates the evidence
// of every pair instead, at a false-alarm rate it sets.
//
// The statistic: a one-sided CUSUM on the paired log-ratios
//   x_i = log(kept_i / baseline_i)
// (0 for equal plans, log(1 - gain) < 0 for a plan that still gains,
// d = log(1 + regression) = 0.0296 after a 3% regression), standardised by
// the per-pair noise sigma and winsorised:
//   z_i = clamp((x_i - k) / sigma, -c, +c)   k = d / 2 (the reference),
//                                            c = `clip` (2.5)
//   S_i = max(0, S_{i-1} + z_i)
// and a regression is detected when S_i > h(sigma). Detection is sticky.
// The clip is centred on the reference, halfway between "no regression"
// and "regression", so it treats both alike, and a slow step on the
// baseline's side cancels one on the kept side.
// Why winsorised and not sign-based: a non-training step (evaluation,
// checkpointing, a long batch; 5x slower) adds at most c to S, and h is
// never below c + 1, so one such step never alarms and several count as
// no more than as many pairs c sigma above the reference; yet within c
// sigma a pair's size counts, which a sign (Bernoulli) CUSUM throws away (it needs about 1.6x
// the pairs under Gaussian noise).
//
// The threshold: h is set so that, with no regression (mean x <= 0), the
// average run length to a false alarm is `false_alarm_pairs` (50000 pairs),
// by Siegmund's approximation for a CUSUM with standardised increments:
//   ARL0 = (exp(2 k' b) - 2 k' b - 1) / (2 k'^2),  k' = k / sigma,
//   b = h + 1.166 (the overshoot correction),
// solved for h (then h >= c + 1). A run of n pairs false-alarms with
// probability about n / ARL0: 0.4% for the 200 pairs of 1000 steps with a
// check every 5 steps. Only a kept plan that gains about nothing comes
// near that: one that gains g has mean x = log(1 - g), and from 2% on S
// drifts down faster than noise lifts it; and a false fallback from a plan
// that gains nothing costs nothing. Runs of many more pairs than
// ARL0 / 100 want a larger false_alarm_pairs (the delay grows with its
// logarithm).
//
// The noise: sigma is the spread the statistic sees: the standard deviation
// of the log-ratios winsorised at their median +- c * sigma, for the sigma
// it returns (a fixed point from 1.4826 * MAD up, Huber's "proposal 2";
// NoiseFromPairs). A 5x step counts as c sigma at most, yet a bimodal
// machine (spells of steps 20% slower) reads as wide as it is. The MAD reads
// such a trace narrow (cnn-300mbit: 0.042; this estimate 0.063; standard
// deviation 0.085); with the deviation winsorised at 2.5 MADs instead, runs
// with equal plans false-alarmed in 1.0% of 1000-step runs, not 0.4%, most
// of them on such traces. The tuner passes sigma0 from its verification
// pairs (NoiseFromPairs); the check pairs update it:
//   sigma^2 = (p * sigma0^2 + n * s_n^2) / (p + n),
// s_n the same estimate over the last `window` (64) check pairs (n of
// them, from 4 on), p the weight `prior_pairs` (8, the verification
// pairs), never below `sigma_floor` (0.005). A regression moves
// the log-ratios' median, not their spread; but while the window holds
// pairs from both sides of the change (up to `window` pairs) their spread
// reads wider, by about the shift over the noise, which slows the
// detection of a plan that had gained much somewhat beyond the table below.
// Each pair is standardised with the sigma of the pairs before it; without
// sigma0 the statistic waits for 4 pairs.
//
// The delay: with a true regression r (x's mean moves to D = log(1 + r)),
// the drift per pair is mu = E[clamp(Z + (D - k) / sigma, -c, c)] for a
// standard normal Z (about (D - k) / sigma while that is well below c),
// and Siegmund gives the expected detection delay
//   pairs(sigma, r) = (exp(-2 mu b) + 2 mu b - 1) / (2 mu^2)  (about b / mu)
//   steps(sigma, r, check_every) = check_every * pairs(sigma, r)
// (ExpectedDetectionPairs). As b grows like log(ARL0) / (2 k') and mu = k'
// for r = regression, the delay grows like sigma^2 (up to a log): halving
// the noise quarters it. For r = 3% (defaults: false_alarm_pairs 50000,
// clip 2.5):
//   sigma   h      pairs   steps at check_every 5 / 10 / 25
//   0.01    3.5      3.1      15 /     31 /     77
//   0.02    6.2      9.2      46 /     92 /    231
//   0.05   14.2     47       234 /    468 /   1170
//   0.10   24.9    155       774 /   1549 /   3872
//   0.20   41.6    492      2460 /   4919 /  12298
// A 6% regression takes about a third of those pairs (0.10: 58).
// The tuner checks a plan that gains g every CheckEvery(g) steps while it
// gains, and every kMinCheckEvery once the last check pairs show the gain
// gone (Note [Checking more often once the gain is gone] below): after
// a regression the steps are about 3 pairs at the first interval plus the
// pairs above at kMinCheckEvery + 1 steps each.
// The recorded runs of tests/autotune/data/step_traces.json have sigma
// 0.06-0.29 (PyTorch DDP on CPUs, one thread per rank, 2 ranks; a steadier
// machine is checked faster, as the table says). On 1000-step runs resampled
// from them (fusebox-regression-sim, perf/regression_runs.h; asserted by
// RegressionCheckTest.CatchesThreePercentOnRecordedTraces) false alarms came
// in 0.2-0.4% of runs with equal plans (5000 runs, two seeds) and in none of
// 3000 with gains of 2-10%; a 3% regression was detected within 3x the
// expected delay in about 99% of runs, the median delay about 0.85x the
// expected one.
//
// Large regressions: the clip that makes the CUSUM robust also caps what
// one pair adds (c), so even a plan 4x slower needs h / c pairs (at sigma
// 0.12, about 12). So `large_pairs` (5) consecutive pairs each slower than
// both `large_regression` (10%) and 3 sigma alarm at once. With no
// regression a pair passes 3 sigma with probability about 0.1% under
// Gaussian noise (a few percent on the recorded traces' heavy tails), so 5
// in a row come about never; a plan that turned several times slower is
// dropped after 5 pairs.
//
// The interval: a check step runs the baseline instead of the kept plan,
// so it costs about `gain` (the kept plan's relative gain) of a step; at
// most `max_cost` of the run goes to checks when check_every >=
// gain / max_cost (CheckEvery; at least 5 steps apart, so pairs are nearly
// independent, and at most 200, so a regression is still seen).
#ifndef FUSEBOX_AUTOTUNE_REGRESSION_H_
#define FUSEBOX_AUTOTUNE_REGRESSION_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace fusebox::autotune {

struct RegressionOptions {
  // The slowdown to catch: the kept plan this fraction (or more) slower than
  // the baseline, in (0, 1).
  double regression = 0.03;
  // Winsorise each standardised log-ratio at +- clip, in [1, 10].
  double clip = 2.5;
  // Average pairs to a false alarm with no regression (ARL0), >= 100.
  double false_alarm_pairs = 50000;
  // Lower bound on sigma, in (0, 1).
  double sigma_floor = 0.005;
  // Check pairs in the running estimate of sigma, in [8, 4096].
  int window = 64;
  // Weight of sigma0 in pairs (the tuner's verification pairs), >= 0.
  double prior_pairs = 8;
  // A large regression is caught without waiting for the CUSUM, whose
  // clipped increments need threshold / clip pairs at least: `large_pairs`
  // consecutive pairs each slower than both `large_regression` and 3 sigma
  // (sigma known) alarm at once. 0 pairs: off.
  double large_regression = 0.10;
  int large_pairs = 5;
};

// OK, or InvalidArgument naming the field ("regression.clip must be ...").
absl::Status Validate(const RegressionOptions& options);

class RegressionCheck {
 public:
  // sigma0: the per-pair log-ratio noise measured before (NoiseFromPairs of
  // the verification pairs); <= 0 or not finite: unknown. `options` must
  // pass Validate.
  RegressionCheck(RegressionOptions options, double sigma0);

  // One pair of adjacent steps: the baseline's time and the kept plan's
  // (any unit, the same for both). Returns true once a regression is
  // detected, and from then on (sticky). A pair with a time that is not a
  // positive finite number is ignored.
  bool Add(double baseline, double kept);

  bool detected() const { return detected_; }
  // Pairs added (ignored ones not counted); the pair that detected (1-based,
  // 0 while none).
  int pairs() const { return pairs_; }
  int detected_at() const { return detected_at_; }
  // S (in units of sigma) and the threshold h it is compared with.
  double statistic() const { return s_; }
  double threshold() const;
  // The current per-pair noise (0 while unknown).
  double sigma() const { return sigma_; }
  // One line for logs: statistic, threshold, sigma, pairs.
  std::string Describe() const;

 private:
  void UpdateSigma();

  RegressionOptions options_;
  double sigma0_;
  double sigma_;
  std::vector<double> window_;  // the last options_.window log-ratios (ring)
  int next_ = 0;                // next slot of window_ once full
  int pairs_ = 0;
  int detected_at_ = 0;
  int large_run_ = 0;           // consecutive pairs beyond the large-regression bar
  bool large_ = false;          // detected by the large-regression rule
  double s_ = 0;
  bool detected_ = false;
};

// The robust per-pair noise of log(kept_i / baseline_i): the standard
// deviation of the log-ratios winsorised at their median +- clip * 1.4826 *
// MAD (clip: RegressionOptions::clip, whose default it is). Pairs with a
// non-positive or non-finite time are left out; fewer than 2 pairs left (or
// different lengths): 0, unknown.
double NoiseFromPairs(const std::vector<double>& baseline, const std::vector<double>& kept,
                      double clip = 2.5);

// h(sigma) of Note [Catching small regressions] (sigma below the floor: the
// floor).
double RegressionThreshold(const RegressionOptions& options, double sigma);

// Expected pairs from the start of a true regression `true_regression`
// (e.g. 0.03) to its detection, for the per-pair noise `sigma` (Note
// [Catching small regressions]); infinity when true_regression is not
// above regression / 2 (the statistic's reference). Multiply by
// check_every for steps.
double ExpectedDetectionPairs(const RegressionOptions& options, double sigma,
                              double true_regression);

// Steps between check steps so that checks cost at most max_cost_fraction of
// the run: ceil(gain / max_cost_fraction), at least kMinCheckEvery and at
// most kMaxCheckEvery (gain <= 0: the minimum; max_cost_fraction <= 0: the
// maximum).
inline constexpr int kMinCheckEvery = 5;
inline constexpr int kMaxCheckEvery = 200;
int CheckEvery(double gain, double max_cost_fraction);

// Note [Checking more often once the gain is gone]
// A check step runs the baseline, so it costs the kept plan's gain g (a
// fraction of a step); one every CheckEvery(g) = g / 1% steps keeps the
// checks under 1% of the run. That makes a plan that gained much checked
// rarely: at g = 30%, one pair every 31 steps, and a 3% regression, which
// needs tens of pairs at a few percent of noise (Note [Catching small
// regressions] above), would wait well over a thousand steps. But once the
// kept plan has lost its gain, a check step costs nothing (the baseline is
// no slower than the kept plan), so the budget allows the minimum interval.
// The interval therefore follows the gain the last kRecentPairs check pairs
// show, 1 - exp(median log-ratio), when that is below the verified gain
// (never above: a lucky spell never thins the checks). With a plan that
// still gains g, the median of 3 pairs stays near g at the noise of a few
// percent, and the checks stay as rare as before; after a regression the
// interval drops to its minimum within about 2 pairs, and the delay in
// steps becomes about 2 pairs at the first interval plus the detector's
// pairs at min_every + 1 steps each.
class CheckInterval {
 public:
  static constexpr int kRecentPairs = 3;

  // `gain`: the kept plan's verified gain; `min_every`: the least interval
  // (the user's check_every, at least kMinCheckEvery by CheckEvery);
  // `max_cost_fraction` as for CheckEvery.
  CheckInterval(double gain, int min_every, double max_cost_fraction);

  // Steps between two check steps now.
  int every() const { return every_; }
  // One check pair (times of the baseline and of the kept plan; a pair
  // that is not two positive finite numbers is ignored).
  void Add(double baseline, double kept);

 private:
  double gain_;
  int min_every_;
  double max_cost_;
  int every_;
  std::vector<double> recent_;  // the last kRecentPairs log-ratios, oldest first
};

}  // namespace fusebox::autotune

#endif  // FUSEBOX_AUTOTUNE_REGRESSION_H_
