// Decisions that hold under noise: distribution-free confidence bounds on
// medians and the rule by which the online tuner replaces DDP's default.
//
// Note [Decisions under noise]
// Iteration times on a shared machine drift by 10-30% over minutes and a
// single A-then-B comparison can show a 5% "gain" between identical plans.
// So the tuner never compares plans measured at different times:
// * Candidates are measured in randomised blocks: each block runs every
//   candidate once, in a fresh random order (RandomizedBlock), and every
//   measured iteration is the first after a plan switch, so each candidate
//   pays the same warm-up. A block never starts with the plan that ended
//   the previous one (that iteration would skip the switch).
// * Screening picks the candidate with the lowest median over its blocks,
//   and only ranks: a few samples per plan cannot show that none beats the
//   default (two noisy steps once hid a plan 12% faster), so the pick is
//   verified unless its fastest screening sample was slower than the
//   default's slowest. Selection is biased (the luckiest of K looks best), so the decision is
//   made on fresh data: verification alternates DDP's default and the pick
//   (A B A B ..., random start) and forms the paired relative gains
//   g_i = (t_default,i - t_pick,i) / t_default,i of adjacent iterations,
//   which cancels drift slower than two iterations.
// * The bound on the median gain is the Wilcoxon signed-rank test's
//   (Hodges-Lehmann) order statistic: with n gains, form the n(n+1)/2
//   Walsh averages (g_i + g_j) / 2, i <= j, sorted; the one-sided lower
//   bound at confidence c is the k-th smallest, the largest k with
//   P(T+ <= k - 1) <= 1 - c under the signed-rank null (exact, computed).
//   It assumes only that a pair's gain is symmetric about its median,
//   which the rotation makes true of equal plans (each arm takes each place
//   equally often). It uses the size of each gain, not only its sign (the
//   sign test needs about 1.5 times the pairs for the same power under
//   normal noise, and more under heavy tails).
// * The default is replaced only when that lower bound exceeds the minimum
//   gain (`min_gain`, 0 by default): faster with 95% confidence. Under
//   equal distributions the chance of a switch is at most 1 - c, and a
//   switch between equal plans costs nothing; what a margin above 0 would
//   buy (fewer switches for gains too small to matter) costs power where
//   it matters, against plans several percent faster.
// * After the decision the tuner keeps checking: every `check_every`
//   iterations one iteration of the default runs, paired with the next
//   iteration of the chosen plan; each full window of pairs is tested with
//   the regression test of regression.h; a cache hit is dropped when it is
//   slower than the default by more than the minimum effect (`min_effect`,
//   2%) with 95% confidence (the sign test's upper bound, ProvenSlower).
//
// Note [Stopping verification early]
// Verification runs up to `verify_pairs` rounds (36 by default: at this
// machine's step noise, 8 pairs found a plan 5% faster in about one run in
// five). Every round is a step of each arm after a plan switch, and a switch
// costs (DDP allocates its buckets anew), so rounds that decide nothing
// cost the user; looks every `verify_look_every` rounds (6) end them early:
// * A win: a challenger whose signed-rank bound clears the minimum gain at
//   a stricter confidence than the end's. Each challenger's error rate is
//   split: `early_share` (20%) spent evenly over the looks, the rest at the
//   end (Bonferroni), so the chance of replacing the baseline with an equal
//   plan stays within the rule's. With 36 rounds, looks every 6 and two
//   challengers: 99.9% at each look, 98% at the end. A plan 10% faster then
//   wins after about 15 rounds instead of 36.
// * Futility: a challenger whose median gain so far is at or below the
//   minimum gain is dropped (ShowsNoGainYet). That can keep the baseline
//   where the full rounds would have replaced it (a little power: a plan 5%
//   faster is still found in about 6 runs of 7), never the other way round.
// * Exact curtailment, between looks: the end's bound is the k-th smallest
//   Walsh average over all the pairs; once k of the averages among the
//   pairs so far are at or below the minimum gain, no later pair can lift it
//   (ReplacementStillPossible): the same decision as the full rounds.
// Verification ends when no challenger is left, or at a win. Where the
// candidates are no faster, it ends after about 16 rounds on average.
#ifndef FUSEBOX_AUTOTUNE_DECISION_H_
#define FUSEBOX_AUTOTUNE_DECISION_H_

#include <cstdint>
#include <string>
#include <vector>

namespace fusebox::autotune {

// P(Binomial(n, 1/2) <= k).
double BinomialHalfCdf(int n, int k);

// A median with a distribution-free confidence interval (order statistics
// of the sign test). With too few values for the confidence asked, the
// bounds are the extreme values (the interval is then wider than claimed;
// `exact` says whether the coverage holds).
struct MedianInterval {
  double low = 0;
  double median = 0;
  double high = 0;
  bool exact = false;
};
// Two-sided interval at `confidence` (e.g. 0.95). Empty input: all zeros.
MedianInterval MedianCI(std::vector<double> values, double confidence);
// One-sided bounds at `confidence`: the median exceeds LowerBound (is below
// UpperBound) with at least that probability. Empty input: 0. With fewer
// values than the confidence needs, the extreme value.
double MedianLowerBound(std::vector<double> values, double confidence);
double MedianUpperBound(std::vector<double> values, double confidence);
// Pairs needed before MedianLowerBound (or SignedRankLowerBound) can reach
// `confidence` at all.
int MinimumPairs(double confidence);

// P(T+ <= t) for the Wilcoxon signed-rank statistic of n pairs under the
// null (every sign equally likely), exact. n at most kMaxSignedRankPairs.
inline constexpr int kMaxSignedRankPairs = 256;
double SignedRankCdf(int n, int t);
// The largest k (1-based) with P(T+ <= k - 1) <= alpha: the rank, among the
// n(n+1)/2 sorted Walsh averages, of the one-sided bound at 1 - alpha; 0
// when even k = 1 is too wide for alpha.
int SignedRankRank(int n, double alpha);
// One-sided bounds on the center of a symmetric distribution at
// `confidence` (Note [Decisions under noise]): the k-th smallest (largest)
// Walsh average. Empty input: 0. With fewer values than the confidence
// needs, the extreme value.
double SignedRankLowerBound(const std::vector<double>& values, double confidence);
double SignedRankUpperBound(const std::vector<double>& values, double confidence);

// A random order of 0..k-1 from `seed` (the same on every rank given the
// same seed) whose first element is not `avoid_first` when k > 1.
std::vector<int> RandomizedBlock(int k, uint64_t seed, int avoid_first);

// Paired relative gains (a_i - b_i) / a_i: how much faster b is than a.
std::vector<double> RelativeGains(const std::vector<double>& a, const std::vector<double>& b);

struct SwitchRule {
  double confidence = 0.95;
  // A candidate replaces the baseline only when its gain's lower bound
  // exceeds this (a fraction of the baseline's iteration time).
  double min_gain = 0;
  // A plan is proven slower (ProvenSlower: a cache hit that lost) only by
  // more than this.
  double min_effect = 0.02;
};

struct Verdict {
  bool replace = false;   // the candidate beats the default by the rule
  double gain = 0;        // median paired gain
  double gain_low = 0;    // its one-sided lower bound
  double gain_high = 0;   // its one-sided upper bound
  int pairs = 0;
  std::string why;        // one sentence for logs and the cache entry
};

// Should `candidate` replace `baseline`? Paired samples, same length
// (adjacent iterations; Note [Decisions under noise]).
Verdict DecideReplace(const std::vector<double>& baseline, const std::vector<double>& candidate,
                      const SwitchRule& rule);

// Verification stopped early (Note [Stopping verification early]): with
// the first pairs of `total_pairs` in hand, can DecideReplace over all of
// them still replace the baseline, whatever the pairs not yet run show?
// False once it cannot: then the baseline stays, and the rounds left would
// only cost iterations of slower plans. The stop never changes the
// decision: the rule's error rates are those of the full rounds.
bool ReplacementStillPossible(const std::vector<double>& baseline,
                              const std::vector<double>& candidate, int total_pairs,
                              const SwitchRule& rule);

// A futility look (Note [Stopping verification early]): is the median
// paired gain of `candidate` over `baseline` so far at or below the minimum
// gain? True with no pairs.
bool ShowsNoGainYet(const std::vector<double>& baseline, const std::vector<double>& candidate,
                    const SwitchRule& rule);

// After a decision: is `chosen` slower than `baseline` by more than the
// minimum effect, with the rule's confidence? (Paired samples; the sign
// test's upper bound.)
bool ProvenSlower(const std::vector<double>& baseline, const std::vector<double>& chosen,
                  const SwitchRule& rule);

}  // namespace fusebox::autotune

#endif  // FUSEBOX_AUTOTUNE_DECISION_H_
