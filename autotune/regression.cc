#include "autotune/regression.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_format.h"

namespace fusebox::autotune {
namespace {

// Siegmund's correction of the threshold for a CUSUM's overshoot (2 x 0.583).
constexpr double kOvershoot = 1.166;
constexpr double kPi = 3.14159265358979323846;
// Check pairs before the running estimate of sigma counts.
constexpr int kMinSigmaPairs = 4;

double Median(std::vector<double>& v) {
  const size_t n = v.size();
  std::nth_element(v.begin(), v.begin() + n / 2, v.end());
  const double hi = v[n / 2];
  if (n % 2 == 1) return hi;
  return 0.5 * (hi + *std::max_element(v.begin(), v.begin() + n / 2));
}

// The spread that the statistic sees: the standard deviation of `x`
// winsorised at median +- clip * sigma, for the sigma that it returns (a
// fixed point, Huber's "proposal 2" scale). It starts from the MAD
// (1.4826 * MAD: sigma for a normal sample) and grows while the tails
// inside the clip add to the spread, so that a bimodal machine (spells of
// steps 20% slower) reads as wide as it is, while a 5x step counts as clip
// sigmas at most. x.size() >= 2; takes a copy: it reorders.
double WinsorisedSd(std::vector<double> x, double clip) {
  const size_t n = x.size();
  std::vector<double> work = x;
  const double med = Median(work);
  for (double& v : work) v = std::abs(v - med);  // a permutation of x: the same deviations
  double sigma = 1.4826 * Median(work);
  for (int iteration = 0; iteration < 30; ++iteration) {
    const double lo = med - clip * sigma, hi = med + clip * sigma;
    double sum = 0, ss = 0;
    for (double v : x) sum += std::clamp(v, lo, hi);
    const double mean = sum / static_cast<double>(n);
    for (double v : x) {
      const double d = std::clamp(v, lo, hi) - mean;
      ss += d * d;
    }
    const double next = std::sqrt(ss / static_cast<double>(n - 1));
    const bool done = std::abs(next - sigma) <= 1e-3 * sigma;
    sigma = next;
    if (done) break;
  }
  return sigma;
}

// Siegmund's average run length of a CUSUM with standardised increments of
// mean `drift` (negative: in control) and effective threshold b.
double SiegmundArl(double drift, double b) {
  if (std::abs(drift) < 1e-9) return b * b;
  const double a = 2 * drift * b;
  return (std::exp(-a) + a - 1) / (2 * drift * drift);
}

bool Positive(double v) { return std::isfinite(v) && v > 0; }

// E[clamp(Z + m, -c, c)] for a standard normal Z: the drift per pair of the
// winsorised statistic when the log-ratios' mean is m sigmas above the
// reference.
double ClippedNormalMean(double m, double c) {
  const auto cdf = [](double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); };
  const auto pdf = [](double x) { return std::exp(-0.5 * x * x) / std::sqrt(2 * kPi); };
  const double a = -c - m, b = c - m;  // the clip points, in Z
  return -c * cdf(a) + c * (1 - cdf(b)) + m * (cdf(b) - cdf(a)) + pdf(a) - pdf(b);
}

}  // namespace

absl::Status Validate(const RegressionOptions& o) {
  auto bad = [](const char* field, const char* want, double got) {
    return absl::InvalidArgumentError(
        absl::StrFormat("regression.%s must be %s (got %g)", field, want, got));
  };
  if (!(o.regression > 0 && o.regression < 1)) return bad("regression", "in (0, 1)", o.regression);
  if (!(o.clip >= 1 && o.clip <= 10)) return bad("clip", "in [1, 10]", o.clip);
  if (!(o.false_alarm_pairs >= 100 && std::isfinite(o.false_alarm_pairs))) {
    return bad("false_alarm_pairs", "at least 100 and finite", o.false_alarm_pairs);
  }
  if (!(o.sigma_floor > 0 && o.sigma_floor < 1)) {
    return bad("sigma_floor", "in (0, 1)", o.sigma_floor);
  }
  if (!(o.window >= 8 && o.window <= 4096)) return bad("window", "in [8, 4096]", o.window);
  if (!(o.prior_pairs >= 0 && std::isfinite(o.prior_pairs))) {
    return bad("prior_pairs", "at least 0 and finite", o.prior_pairs);
  }
  if (!(o.large_regression > o.regression && o.large_regression < 10)) {
    return bad("large_regression", "above regression and below 10", o.large_regression);
  }
  if (!(o.large_pairs >= 0 && o.large_pairs <= 1000)) {
    return bad("large_pairs", "in [0, 1000]", o.large_pairs);
  }
  return absl::OkStatus();
}

double RegressionThreshold(const RegressionOptions& o, double sigma) {
  sigma = std::max(Positive(sigma) ? sigma : 0.0, o.sigma_floor);
  const double k = 0.5 * std::log1p(o.regression) / sigma;
  // SiegmundArl(-k, b) = false_alarm_pairs is exp(a) - a - 1 = c with
  // a = 2 k b, c = 2 k^2 false_alarm_pairs: convex and increasing in a > 0,
  // so Newton's steps from a point above the root fall to it monotonically.
  const double c = 2 * k * k * o.false_alarm_pairs;
  double a = std::log1p(c) + 1;
  for (int i = 0; i < 60; ++i) {
    const double step = (std::expm1(a) - a - c) / std::expm1(a);
    a -= step;
    if (step < 1e-12 * a) break;
  }
  return std::max(a / (2 * k) - kOvershoot, o.clip + 1);
}

double ExpectedDetectionPairs(const RegressionOptions& o, double sigma, double true_regression) {
  sigma = std::max(Positive(sigma) ? sigma : 0.0, o.sigma_floor);
  const double k = 0.5 * std::log1p(o.regression);
  if (!(true_regression > -1)) return std::numeric_limits<double>::infinity();
  if (!(std::log1p(true_regression) > k)) return std::numeric_limits<double>::infinity();
  const double mu = ClippedNormalMean((std::log1p(true_regression) - k) / sigma, o.clip);
  if (!(mu > 0)) return std::numeric_limits<double>::infinity();
  const double b = RegressionThreshold(o, sigma) + kOvershoot;
  return std::max(1.0, SiegmundArl(mu, b));
}

int CheckEvery(double gain, double max_cost_fraction) {
  if (!(gain > 0)) return kMinCheckEvery;
  if (!(max_cost_fraction > 0)) return kMaxCheckEvery;
  const double every = std::ceil(gain / max_cost_fraction - 1e-9);
  if (!(every < kMaxCheckEvery)) return kMaxCheckEvery;
  return std::max(kMinCheckEvery, static_cast<int>(every));
}

CheckInterval::CheckInterval(double gain, int min_every, double max_cost_fraction)
    : gain_(std::max(0.0, gain)),
      min_every_(min_every),
      max_cost_(max_cost_fraction),
      every_(std::max(min_every, CheckEvery(gain_, max_cost_fraction))) {}

void CheckInterval::Add(double baseline, double kept) {
  if (!Positive(baseline) || !Positive(kept)) return;
  recent_.push_back(std::log(kept / baseline));
  if (recent_.size() > kRecentPairs) recent_.erase(recent_.begin());
  if (recent_.size() < kRecentPairs) return;
  std::vector<double> work = recent_;
  const double recent_gain = 1 - std::exp(Median(work));
  every_ = std::max(min_every_, CheckEvery(std::min(gain_, std::max(0.0, recent_gain)), max_cost_));
}

double NoiseFromPairs(const std::vector<double>& baseline, const std::vector<double>& kept,
                      double clip) {
  if (baseline.size() != kept.size()) return 0;
  std::vector<double> x;
  x.reserve(baseline.size());
  for (size_t i = 0; i < baseline.size(); ++i) {
    if (Positive(baseline[i]) && Positive(kept[i])) x.push_back(std::log(kept[i] / baseline[i]));
  }
  if (x.size() < 2) return 0;
  return WinsorisedSd(std::move(x), clip > 0 ? clip : RegressionOptions{}.clip);
}

RegressionCheck::RegressionCheck(RegressionOptions options, double sigma0)
    : options_(options), sigma0_(Positive(sigma0) ? sigma0 : 0.0), sigma_(0) {
  options_.window = std::max(options_.window, 8);  // memory safety for unvalidated options
  window_.reserve(static_cast<size_t>(options_.window));
  UpdateSigma();
}

double RegressionCheck::threshold() const { return RegressionThreshold(options_, sigma_); }

void RegressionCheck::UpdateSigma() {
  const int n = static_cast<int>(window_.size());
  const bool prior = sigma0_ > 0 && options_.prior_pairs > 0;
  if (n < kMinSigmaPairs) {
    sigma_ = prior ? std::max(sigma0_, options_.sigma_floor) : 0.0;
    return;
  }
  const double s = WinsorisedSd(window_, options_.clip);
  const double p = prior ? options_.prior_pairs : 0.0;
  const double var = (p * sigma0_ * sigma0_ + n * s * s) / (p + n);
  sigma_ = std::max(std::sqrt(var), options_.sigma_floor);
}

bool RegressionCheck::Add(double baseline, double kept) {
  if (!Positive(baseline) || !Positive(kept)) return detected_;
  const double x = std::log(kept / baseline);
  ++pairs_;
  if (sigma_ > 0) {
    const double k = 0.5 * std::log1p(options_.regression);
    const double z = std::clamp((x - k) / sigma_, -options_.clip, options_.clip);
    s_ = std::max(0.0, s_ + z);
    if (!detected_ && s_ > threshold()) {
      detected_ = true;
      detected_at_ = pairs_;
    }
  }
  // The large-regression rule (RegressionOptions::large_pairs).
  const double bar = std::max(std::log1p(options_.large_regression), 3 * sigma_);
  large_run_ = x > bar ? large_run_ + 1 : 0;
  if (!detected_ && options_.large_pairs > 0 && sigma_ > 0 &&
      large_run_ >= options_.large_pairs) {
    detected_ = true;
    large_ = true;
    detected_at_ = pairs_;
  }
  if (static_cast<int>(window_.size()) < options_.window) {
    window_.push_back(x);
  } else {
    window_[next_] = x;
    next_ = (next_ + 1) % options_.window;
  }
  UpdateSigma();
  return detected_;
}

std::string RegressionCheck::Describe() const {
  return absl::StrFormat(
      "CUSUM %.2f of threshold %.2f (log-ratio noise sigma %.4f, reference %.4f, %d pairs): %s", s_,
      threshold(), sigma_, 0.5 * std::log1p(options_.regression), pairs_,
      detected_ ? large_ ? absl::StrFormat("%d pairs in a row over %.0f%% slower at pair %d",
                                           options_.large_pairs,
                                           100 * options_.large_regression, detected_at_)
                         : absl::StrFormat("%.0f%% regression detected at pair %d",
                                           100 * options_.regression, detected_at_)
                : std::string("no regression"));
}

}  // namespace fusebox::autotune
