#include "comm/ucx/measured_choice.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fusebox::comm::ucx {
namespace {

// The announcement's layout (Note [Measured choice]).
constexpr uint8_t kAnnounced = 0x80;
constexpr uint8_t kDrop = 0x40;

uint8_t Announcement(bool drop, int cls, int candidate) {
  return static_cast<uint8_t>(kAnnounced | (drop ? kDrop : 0) | (cls << 2) | candidate);
}

double Mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

// The mean of the samples without the largest (one stall of a rank
// descheduled for milliseconds would otherwise decide).
double TrimmedMean(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.size() > 2) v.pop_back();
  return Mean(v);
}

// "<algorithm> <us> us", as Describe lists a candidate's cost.
std::string CostText(Algorithm algorithm, double us) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.0f", us);
  return absl::StrCat(AlgorithmName(algorithm), " ", text, " us");
}

}  // namespace

MeasuredChoice::MeasuredChoice(std::vector<AlgorithmTable::MeasuredClass> classes, bool decides)
    : decides_(decides) {
  // The table builds a few classes of at most four candidates; the
  // announcement holds what fits, and the rest is left to the table.
  for (AlgorithmTable::MeasuredClass& c : classes) {
    if (static_cast<int>(classes_.size()) == kMaxMeasuredClasses) break;
    if (c.candidates.size() < 2 || c.candidates.size() > kMaxMeasuredCandidates) continue;
    State s;
    s.spec = std::move(c);
    const size_t k = s.spec.candidates.size();
    s.live.assign(k, true);
    s.blocks.assign(k, 0);
    s.samples.resize(k);
    s.early.resize(k);
    s.costs.assign(k, 0);
    s.plain.assign(k, 0);
    s.left.assign(k, 0);
    s.drop_queued.assign(k, false);
    classes_.push_back(std::move(s));
  }
}

std::optional<MeasuredChoice::Pick> MeasuredChoice::Next(size_t bytes) {
  for (int i = 0; i < static_cast<int>(classes_.size()); ++i) {
    State& c = classes_[i];
    if (bytes <= c.spec.lo || bytes > c.spec.hi) continue;
    const int64_t call = c.calls++;
    Pick p;
    p.cls = i;
    if (c.decided >= 0) {
      // Note [Watching the choice].
      p.candidate = c.decided;
      p.watch = c.decided_calls >= kTrialSettle && c.switches < kMaxSwitches;
      p.pos = call - kTrialWarmCalls;
      ++c.decided_calls;
    } else {
      if (call < kTrialWarmCalls) return std::nullopt;
      if (c.current < 0 || c.in_block == kTrialBlock || !c.live[c.current]) {
        // The next block: the live candidate with the fewest blocks begun.
        c.current = -1;
        for (int j = 0; j < static_cast<int>(c.live.size()); ++j) {
          if (c.live[j] && (c.current < 0 || c.blocks[j] < c.blocks[c.current])) c.current = j;
        }
        ++c.blocks[c.current];
        c.in_block = 0;
      }
      p.candidate = c.current;
      p.sample = c.in_block > 0;
      p.settled = c.in_block >= kTrialSettle;
      p.pos = call - kTrialWarmCalls;
      ++c.in_block;
    }
    p.algorithm = c.spec.candidates[p.candidate];
    return p;
  }
  return std::nullopt;
}

void MeasuredChoice::Record(const std::optional<Pick>& pick, absl::Time start, absl::Time end) {
  if (!decides_) return;
  const bool follows =
      pick.has_value() && pick->cls == last_cls_ && pick->pos == last_pos_ + 1 && pick->pos >= 0;
  const absl::Time from = follows ? last_end_ : start;
  last_cls_ = pick.has_value() ? pick->cls : -1;
  last_pos_ = pick.has_value() ? pick->pos : -1;
  last_end_ = end;
  if (!pick.has_value() || pick->cls < 0 || pick->pos < 0) return;
  State& c = classes_[pick->cls];
  // The clock is the wall clock; a step back must not make a cost negative.
  const double us = std::max(0.0, absl::ToDoubleMicroseconds(end - from));
  if (pick->watch) {
    // Picked while decided; a switch announced since is not applied yet.
    if (pick->candidate == c.decided && !c.decision_queued) Watch(pick->cls, us);
    return;
  }
  // A block's first call: what its candidate timed before this block is
  // not this block's.
  if (!pick->sample) c.early[pick->candidate].clear();
  if (!pick->sample || c.decided >= 0 || c.decision_queued || !c.live[pick->candidate]) return;
  if (pick->settled) {
    c.early[pick->candidate].clear();
    c.samples[pick->candidate].push_back(us);
  } else {
    c.early[pick->candidate].push_back(us);
  }
  Judge(pick->cls);
}

void MeasuredChoice::Judge(int cls) {
  State& c = classes_[cls];
  constexpr size_t kSettled = kTrialBlock - kTrialSettle;  // settled samples per block
  int cheapest = -1;  // of the candidates with a block's settled samples
  for (size_t j = 0; j < c.samples.size(); ++j) {
    if (!c.live[j] || c.drop_queued[j] || c.samples[j].size() < kSettled) continue;
    c.costs[j] = TrimmedMean(c.samples[j]);
    c.plain[j] = Mean(c.samples[j]);
    if (cheapest < 0 || c.costs[j] < c.costs[cheapest]) cheapest = static_cast<int>(j);
  }
  if (cheapest < 0) return;
  bool all_settled = true;
  std::vector<uint8_t> drops;
  for (size_t j = 0; j < c.samples.size(); ++j) {
    if (!c.live[j] || c.drop_queued[j] || static_cast<int>(j) == cheapest) continue;
    // Settled, or dear already before settling (a burst only flatters).
    const bool settled = c.samples[j].size() >= kSettled;
    if (!settled) {
      if (c.early[j].size() < static_cast<size_t>(kTrialEarlyDrop)) {
        all_settled = false;
        continue;
      }
      c.costs[j] = TrimmedMean(c.early[j]);
    }
    if (c.costs[j] <= kDropRatio * c.costs[cheapest]) {
      all_settled = all_settled && settled;
      continue;
    }
    c.drop_queued[j] = true;
    drops.push_back(Announcement(/*drop=*/true, cls, static_cast<int>(j)));
  }
  // The decision first: the drops then only mark what it left out, and the
  // class runs one more trial call before it, not a block of each dropped
  // candidate in turn.
  if (all_settled) {
    c.decision_queued = true;
    announcements_.push_back(Announcement(/*drop=*/false, cls, cheapest));
  }
  announcements_.insert(announcements_.end(), drops.begin(), drops.end());
}

void MeasuredChoice::Watch(int cls, double us) {
  State& c = classes_[cls];
  c.window.push_back(us);
  if (c.window.size() < static_cast<size_t>(kWatchWindow)) return;
  // Plain means on both sides: what the calls paid, stalls included.
  const double in_use = Mean(c.window);
  c.window.clear();
  // The cheapest other live candidate, at what it cost in use where it was
  // left before, else at its trial's plain mean.
  int best = -1;
  double best_cost = 0;
  for (size_t j = 0; j < c.plain.size(); ++j) {
    if (!c.live[j] || c.drop_queued[j] || static_cast<int>(j) == c.decided) continue;
    const double known = c.left[j] > 0 ? c.left[j] : c.plain[j];
    if (known <= 0) continue;
    if (best < 0 || known < best_cost) {
      best = static_cast<int>(j);
      best_cost = known;
    }
  }
  // Dear against the others, and dearer than itself in its trial: a slowdown
  // every candidate shares (a rank descheduled every few calls, a gap between
  // training steps) makes no window dear.
  const bool dear =
      best >= 0 && in_use > kSwitchRatio * best_cost && in_use > kSwitchRatio * c.plain[c.decided];
  if (!dear) {
    c.dear.clear();
    return;
  }
  c.dear.push_back(in_use);
  if (c.dear.size() < static_cast<size_t>(kWatchDearWindows)) return;
  c.left[c.decided] = Mean(c.dear);
  c.dear.clear();
  c.decision_queued = true;
  announcements_.push_back(Announcement(/*drop=*/false, cls, best));
}

uint8_t MeasuredChoice::TakeAnnouncement() {
  if (!decides_ || announcements_.empty()) return 0;
  const uint8_t a = announcements_.front();
  announcements_.erase(announcements_.begin());
  return a;
}

absl::Status MeasuredChoice::Apply(uint8_t pad) {
  if (pad == 0) return absl::OkStatus();
  const int cls = (pad >> 2) & (kMaxMeasuredClasses - 1);
  const int candidate = pad & (kMaxMeasuredCandidates - 1);
  const bool drop = (pad & kDrop) != 0;
  const bool known = (pad & kAnnounced) != 0 && cls < static_cast<int>(classes_.size()) &&
                     candidate < static_cast<int>(classes_[cls].spec.candidates.size());
  if (!known ||
      (drop && std::count(classes_[cls].live.begin(), classes_[cls].live.end(), true) == 1 &&
       classes_[cls].live[candidate]) ||
      (!drop && !classes_[cls].live[candidate])) {
    return absl::DataLossError(absl::StrCat(
        "rank 0 announced an algorithm ", drop ? "drop" : "choice", " (byte ", pad,
        ") this rank cannot apply: it has ", classes_.size(),
        " measured size classes and would be left without a candidate, or choose a dropped one"));
  }
  State& c = classes_[cls];
  if (drop) {
    c.live[candidate] = false;
  } else {
    // The first decision, or a switch (Note [Watching the choice]): the
    // candidate now in use settles before it is watched.
    if (c.decided >= 0) ++c.switches;
    c.decided = candidate;
    c.decided_calls = 0;
    c.decision_queued = false;
    c.window.clear();
    c.dear.clear();
  }
  return absl::OkStatus();
}

std::string MeasuredChoice::Describe() const {
  std::vector<std::string> lines;
  for (const State& c : classes_) {
    if (c.decided < 0) continue;
    std::string line = absl::StrCat("(", c.spec.lo, ", ", c.spec.hi,
                                    "] B: ", AlgorithmName(c.spec.candidates[c.decided]));
    if (decides_) {
      std::vector<std::string> parts;
      for (size_t j = 0; j < c.costs.size(); ++j) {
        parts.push_back(absl::StrCat(CostText(c.spec.candidates[j], c.costs[j]),
                                     c.live[j] ? "" : " (dropped)"));
      }
      std::vector<std::string> left;
      for (size_t j = 0; j < c.left.size(); ++j) {
        if (c.left[j] > 0) left.push_back(CostText(c.spec.candidates[j], c.left[j]));
      }
      absl::StrAppend(&line, " (rank 0, mean per call: ", absl::StrJoin(parts, ", "), ")");
      if (!left.empty()) absl::StrAppend(&line, " (left in use: ", absl::StrJoin(left, ", "), ")");
    }
    lines.push_back(std::move(line));
  }
  return absl::StrJoin(lines, "\n");
}

}  // namespace fusebox::comm::ucx
