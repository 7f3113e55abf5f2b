#include "autotune/decision.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <tuple>
#include <utility>

#include "absl/strings/str_format.h"

namespace fusebox::autotune {

double BinomialHalfCdf(int n, int k) {
  if (k < 0) return 0;
  if (k >= n) return 1;
  // Sum of C(n, i) / 2^n, the coefficients built up in log space (no
  // overflow for large n; and no lgamma, which writes the global signgam
  // and so races between threads).
  double total = 0;
  double log_c = 0;  // log C(n, i)
  const double log_2n = n * std::log(2.0);
  for (int i = 0; i <= k; ++i) {
    total += std::exp(log_c - log_2n);
    log_c += std::log(static_cast<double>(n - i)) - std::log(static_cast<double>(i + 1));
  }
  return std::min(total, 1.0);
}

namespace {

// The largest k (1-based) with P(Binomial(n, 1/2) <= k - 1) <= alpha, or 0
// when even k = 1 is too wide for alpha.
int LowerRank(int n, double alpha) {
  int k = 0;
  while (k + 1 <= n && BinomialHalfCdf(n, k) <= alpha) ++k;
  return k;
}

// P(T+ = s), s = 0 .. n(n+1)/2, for n pairs under the signed-rank null:
// built rank by rank, each rank in or out with probability 1/2, halved at
// each step (no overflow, no lgamma). O(n^3) at most.
std::vector<double> SignedRankPmf(int n) {
  n = std::clamp(n, 0, kMaxSignedRankPairs);
  const int top = n * (n + 1) / 2;
  std::vector<double> p(top + 1, 0.0);
  p[0] = 1;
  for (int r = 1; r <= n; ++r) {
    for (int s = r * (r + 1) / 2; s >= 0; --s) p[s] = 0.5 * (p[s] + (s >= r ? p[s - r] : 0.0));
  }
  return p;
}

double MedianOfSorted(const std::vector<double>& v) {
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

MedianInterval MedianCI(std::vector<double> values, double confidence) {
  MedianInterval out;
  if (values.empty()) return out;
  std::sort(values.begin(), values.end());
  const int n = static_cast<int>(values.size());
  out.median = MedianOfSorted(values);
  const int k = LowerRank(n, (1 - confidence) / 2);
  out.exact = k >= 1;
  const int i = std::max(k, 1);
  out.low = values[i - 1];
  out.high = values[n - i];
  return out;
}

double MedianLowerBound(std::vector<double> values, double confidence) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const int k = std::max(LowerRank(static_cast<int>(values.size()), 1 - confidence), 1);
  return values[k - 1];
}

double MedianUpperBound(std::vector<double> values, double confidence) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const int n = static_cast<int>(values.size());
  const int k = std::max(LowerRank(n, 1 - confidence), 1);
  return values[n - k];
}

int MinimumPairs(double confidence) {
  int n = 1;
  while (BinomialHalfCdf(n, 0) > 1 - confidence && n < 64) ++n;
  return n;
}

double SignedRankCdf(int n, int t) {
  const std::vector<double> p = SignedRankPmf(n);
  double total = 0;
  for (int s = 0; s <= t && s < static_cast<int>(p.size()); ++s) total += p[s];
  return std::min(total, 1.0);
}

int SignedRankRank(int n, double alpha) {
  const std::vector<double> p = SignedRankPmf(n);
  const int half = static_cast<int>(p.size()) / 2;  // never past the median of T+
  int k = 0;
  double cdf = 0;
  for (int s = 0; s < half; ++s) {
    cdf += p[s];
    if (cdf > alpha) break;
    k = s + 1;
  }
  return k;
}

namespace {

std::vector<double> SortedWalshAverages(const std::vector<double>& v) {
  std::vector<double> w;
  w.reserve(v.size() * (v.size() + 1) / 2);
  for (size_t i = 0; i < v.size(); ++i) {
    for (size_t j = i; j < v.size(); ++j) w.push_back(0.5 * (v[i] + v[j]));
  }
  std::sort(w.begin(), w.end());
  return w;
}

// Both one-sided bounds at `confidence`: the k-th smallest and k-th largest
// Walsh average (one sort for both). Empty input: zeros.
std::pair<double, double> SignedRankBounds(const std::vector<double>& values,
                                           double confidence) {
  if (values.empty()) return {0, 0};
  const std::vector<double> w = SortedWalshAverages(values);
  const int k = std::max(SignedRankRank(static_cast<int>(values.size()), 1 - confidence), 1);
  return {w[k - 1], w[w.size() - k]};
}

}  // namespace

double SignedRankLowerBound(const std::vector<double>& values, double confidence) {
  return SignedRankBounds(values, confidence).first;
}

double SignedRankUpperBound(const std::vector<double>& values, double confidence) {
  return SignedRankBounds(values, confidence).second;
}

std::vector<int> RandomizedBlock(int k, uint64_t seed, int avoid_first) {
  std::vector<int> order(std::max(k, 0));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  if (k > 1 && order[0] == avoid_first) std::swap(order[0], order[1 + rng() % (k - 1)]);
  return order;
}

std::vector<double> RelativeGains(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> g;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (a[i] > 0) g.push_back((a[i] - b[i]) / a[i]);
  }
  return g;
}

Verdict DecideReplace(const std::vector<double>& baseline, const std::vector<double>& candidate,
                      const SwitchRule& rule) {
  Verdict v;
  const std::vector<double> g = RelativeGains(baseline, candidate);
  v.pairs = static_cast<int>(g.size());
  if (g.empty()) {
    v.why = "no paired measurements";
    return v;
  }
  std::vector<double> sorted = g;
  std::sort(sorted.begin(), sorted.end());
  v.gain = MedianOfSorted(sorted);
  std::tie(v.gain_low, v.gain_high) = SignedRankBounds(g, rule.confidence);
  const int need = MinimumPairs(rule.confidence);
  if (v.pairs < need) {
    v.why = absl::StrFormat("%d pairs cannot show %g%% confidence (%d needed)", v.pairs,
                            rule.confidence * 100, need);
    return v;
  }
  v.replace = v.gain_low > rule.min_gain;
  v.why = absl::StrFormat(
      "median gain %+.1f%% over %d interleaved pairs, %g%% lower bound (signed-rank) "
      "%+.1f%% %s the minimum gain %.1f%%",
      v.gain * 100, v.pairs, rule.confidence * 100, v.gain_low * 100,
      v.replace ? "above" : "not above", rule.min_gain * 100);
  return v;
}

bool ReplacementStillPossible(const std::vector<double>& baseline,
                              const std::vector<double>& candidate, int total_pairs,
                              const SwitchRule& rule) {
  if (total_pairs < MinimumPairs(rule.confidence)) return false;
  const int k = std::max(SignedRankRank(total_pairs, 1 - rule.confidence), 1);
  // Walsh averages of the pairs run so far at or below the minimum gain:
  // they stay among the final averages whatever the later pairs show.
  const std::vector<double> w = SortedWalshAverages(RelativeGains(baseline, candidate));
  const auto against = std::upper_bound(w.begin(), w.end(), rule.min_gain) - w.begin();
  return against < k;
}

bool ShowsNoGainYet(const std::vector<double>& baseline, const std::vector<double>& candidate,
                    const SwitchRule& rule) {
  std::vector<double> g = RelativeGains(baseline, candidate);
  if (g.empty()) return true;
  std::sort(g.begin(), g.end());
  return MedianOfSorted(g) <= rule.min_gain;
}

bool ProvenSlower(const std::vector<double>& baseline, const std::vector<double>& chosen,
                  const SwitchRule& rule) {
  const std::vector<double> g = RelativeGains(baseline, chosen);
  if (static_cast<int>(g.size()) < MinimumPairs(rule.confidence)) return false;
  return MedianUpperBound(g, rule.confidence) < -rule.min_effect;
}

}  // namespace fusebox::autotune
