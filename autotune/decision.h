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
// * The bound on the median gain is the sign test's order statistic (no
//   assumption about the distribution of iteration times): with n gains
//   sorted, the one-sided lower bound at confidence c is g_(k), the largest
//   k with P(Binomial(n, 1/2) <= k - 1) <= 1 - c. With 8 pairs and c = 0.95
//   that is the second smallest gain (coverage 96.5%).
// * The default is replaced only when that lower bound exceeds the minimum
//   effect (2% by default): faster with 95% confidence and by more than the
//   effect. Under equal distributions the chance of a switch is at most
//   1 - c (less, since the bound must clear a positive effect).
// * After the decision the tuner keeps checking: every `check_every`
//   iterations one iteration of the default runs, paired with the next
//   iteration of the chosen plan; each full window of pairs is tested with
//   the upper bound: when the chosen plan is slower than the default by
//   more than the minimum effect with 95% confidence, the tuner falls back
//   to the default by itself.
//
// Note [Stopping verification early]
// The bound over n pairs is the k-th smallest gain, so the baseline is
// replaced only when fewer than k gains are at or below the minimum effect.
// Once k of the pairs run so far are, no later pair can change the verdict,
// and verification stops there: exact curtailment, the same decision as the
// full rounds, with none of their error rates changed. With 8 pairs at 95%
// k is 2. Where the user's plan is as fast as any candidate, verification
// then ends after 2-4 of its 8 rounds; those rounds of slower plans were
// most of what tuning cost a user whose plan was already right.
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
// Pairs needed before MedianLowerBound can reach `confidence` at all.
int MinimumPairs(double confidence);

// A random order of 0..k-1 from `seed` (the same on every rank given the
// same seed) whose first element is not `avoid_first` when k > 1.
std::vector<int> RandomizedBlock(int k, uint64_t seed, int avoid_first);

// Paired relative gains (a_i - b_i) / a_i: how much faster b is than a.
std::vector<double> RelativeGains(const std::vector<double>& a, const std::vector<double>& b);

struct SwitchRule {
  double confidence = 0.95;
  double min_effect = 0.02;  // fraction of the default's iteration time
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

// After a decision: is `chosen` slower than `baseline` by more than the
// minimum effect, with the rule's confidence? (Paired samples.)
bool ProvenSlower(const std::vector<double>& baseline, const std::vector<double>& chosen,
                  const SwitchRule& rule);

}  // namespace fusebox::autotune

#endif  // FUSEBOX_AUTOTUNE_DECISION_H_
