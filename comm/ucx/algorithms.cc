#include "comm/ucx/algorithms.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/ucx/algo/registry.h"
#include "comm/ucx/algo/unit.h"

namespace fusebox::comm::ucx {

const char* AlgorithmName(Algorithm a) {
  for (const AlgorithmUnit* u : AlgorithmUnits()) {
    if (u->algorithm == a) return u->name;
  }
  return "?";
}

size_t SmallMessageBytes(const AlgorithmInputs& in) {
  const bool oversubscribed = static_cast<unsigned>(in.world) > std::max(1u, in.cores);
  if (in.shm_exchange && oversubscribed && in.small_message_bytes > 0 &&
      in.world <= kOversubscribedSmallMaxRanks) {
    return std::max(in.small_message_bytes, kOversubscribedSmallBytes);
  }
  return in.small_message_bytes;
}

Situation::Situation(const AlgorithmInputs& inputs)
    : in(inputs),
      small_bytes(SmallMessageBytes(inputs)),
      messages(inputs.world > 1 && !inputs.shm_exchange),
      linear(messages && (inputs.opening == UcxOptions::Opening::kLinear ||
                          (inputs.opening == UcxOptions::Opening::kAuto &&
                           inputs.machine_oversubscribed && inputs.world >= kLinearMinRanks))),
      halving_world((inputs.world & (inputs.world - 1)) == 0 && inputs.world >= 4) {}

namespace {

struct Candidate {
  Served served;
  Algorithm algorithm;
};

// Note [Algorithm units]: for every size, the candidate of the highest
// score that serves it; neighbours naming the same algorithm merged.
std::vector<AlgorithmTable::Range> Resolve(const std::vector<Candidate>& candidates) {
  std::vector<size_t> starts = {0};
  for (const Candidate& c : candidates) {
    starts.push_back(c.served.lo);
    if (c.served.hi < SIZE_MAX) starts.push_back(c.served.hi + 1);
  }
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  std::vector<AlgorithmTable::Range> ranges;
  for (size_t i = 0; i < starts.size(); ++i) {
    const Candidate* best = nullptr;
    for (const Candidate& c : candidates) {
      const bool serves = c.served.lo <= starts[i] && starts[i] <= c.served.hi;
      if (serves && (best == nullptr || c.served.score > best->served.score)) best = &c;
    }
    if (best == nullptr) std::abort();  // a broken invariant: every size is served
    const size_t end = i + 1 < starts.size() ? starts[i + 1] - 1 : SIZE_MAX;
    if (!ranges.empty() && ranges.back().algorithm == best->algorithm) {
      ranges.back().max_bytes = end;
    } else {
      ranges.push_back({end, best->algorithm});
    }
  }
  return ranges;
}

// Note [Measured choice] in measured_choice.h, a layer over the ranges:
// AllReduce of kMeasuredFromBytes up to measured_bytes in size classes,
// each twice the last, with the units that say they may run it, in their
// trial order. Only over messages, in worlds of at least 3 ranks, and only
// where the table itself carries AllReduce in a round (up to
// `carried_end`): above it the ring alone. A class with one candidate is
// left to the table.
std::vector<AlgorithmTable::MeasuredClass> MeasuredClasses(const Situation& s,
                                                           size_t carried_end) {
  std::vector<AlgorithmTable::MeasuredClass> classes;
  if (!s.messages) return classes;
  for (size_t lo = kMeasuredFromBytes; s.in.world >= 3 && lo < s.in.measured_bytes; lo *= 2) {
    AlgorithmTable::MeasuredClass c;
    c.lo = lo;
    c.hi = std::min(2 * lo, s.in.measured_bytes);
    if (c.hi > carried_end) break;
    std::vector<const AlgorithmUnit*> units;
    for (const AlgorithmUnit* u : AlgorithmUnits()) {
      if (u->measured != nullptr && u->measured(s, c.lo, c.hi)) units.push_back(u);
    }
    std::stable_sort(units.begin(), units.end(), [](const AlgorithmUnit* a, const AlgorithmUnit* b) {
      return a->trial_order < b->trial_order;
    });
    for (const AlgorithmUnit* u : units) c.candidates.push_back(u->algorithm);
    if (c.candidates.size() >= 2) classes.push_back(std::move(c));
  }
  return classes;
}

}  // namespace

AlgorithmTable BuildAlgorithmTable(const AlgorithmInputs& in) {
  const Situation s(in);
  AlgorithmTable t;
  t.small_bytes_ = s.small_bytes;
  t.linear_ = s.linear;
  if (t.linear_) t.linear_bytes_ = in.linear_bytes;
  t.linear_watched_ = t.linear_;
  std::vector<Candidate> by_kind[4];
  for (const AlgorithmUnit* u : AlgorithmUnits()) {
    for (const Served& served : u->serves(s)) {
      by_kind[static_cast<int>(served.kind) - 1].push_back({served, u->algorithm});
      // What the descriptor round carries: every range of a unit it carries.
      if (u->carrier == Carrier::kDescriptorRound) {
        t.carried_bytes_ = std::max(t.carried_bytes_, served.hi);
      }
    }
  }
  for (int k = 0; k < 4; ++k) t.ranges_[k] = Resolve(by_kind[k]);
  t.measured_ = MeasuredClasses(s, t.carried_bytes_);
  for (const AlgorithmTable::MeasuredClass& c : t.measured_) {
    t.carried_bytes_ = std::max(t.carried_bytes_, c.hi);
    for (Algorithm a : c.candidates) {
      if (UnitOf(a).carrier != Carrier::kLinearRound) continue;
      t.linear_bytes_ = std::max(t.linear_bytes_, c.hi);
      t.linear_watched_ = true;
    }
  }
  return t;
}

const std::vector<AlgorithmTable::Range>& AlgorithmTable::ranges(Kind kind) const {
  return ranges_[static_cast<int>(kind) - 1];
}

Algorithm AlgorithmTable::Select(Kind kind, size_t bytes) const {
  for (const Range& r : ranges(kind)) {
    if (bytes <= r.max_bytes) return r.algorithm;
  }
  return ranges(kind).back().algorithm;  // unreachable: the last range ends at SIZE_MAX
}

std::string AlgorithmTable::Describe() const {
  std::vector<std::string> lines;
  for (Kind kind : {Kind::kAllReduce, Kind::kBroadcast, Kind::kAllGather, Kind::kBarrier}) {
    std::vector<std::string> parts;
    size_t lo = 0;
    for (const Range& r : ranges(kind)) {
      parts.push_back(r.max_bytes == SIZE_MAX
                          ? absl::StrCat(lo, " B+ ", AlgorithmName(r.algorithm))
                          : absl::StrCat(lo, "-", r.max_bytes, " B ", AlgorithmName(r.algorithm)));
      if (r.max_bytes != SIZE_MAX) lo = r.max_bytes + 1;
    }
    lines.push_back(absl::StrCat(KindName(kind), ": ", absl::StrJoin(parts, ", ")));
  }
  if (linear_) lines.push_back("Opening: linear round");
  if (!measured_.empty()) {
    std::vector<std::string> parts;
    for (const MeasuredClass& c : measured_) {
      std::vector<std::string> names;
      for (Algorithm a : c.candidates) names.push_back(AlgorithmName(a));
      parts.push_back(absl::StrCat("(", c.lo, ", ", c.hi, "] B ", absl::StrJoin(names, "|")));
    }
    lines.push_back(absl::StrCat("Measured: ", absl::StrJoin(parts, ", ")));
  }
  return absl::StrJoin(lines, "\n");
}

}  // namespace fusebox::comm::ucx
