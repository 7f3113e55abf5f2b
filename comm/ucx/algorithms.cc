#include "comm/ucx/algorithms.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fusebox::comm::ucx {

const char* AlgorithmName(Algorithm a) {
  switch (a) {
    case Algorithm::kNone: return "opening-round";
    case Algorithm::kOneShot: return "one-shot";
    case Algorithm::kLocal: return "local";
    case Algorithm::kShmAllReduce: return "shm-allreduce";
    case Algorithm::kRingAllReduce: return "ring-allreduce";
    case Algorithm::kRecursiveDoublingAllReduce: return "recursive-doubling";
    case Algorithm::kLinearAllReduce:
      return "linear";
    case Algorithm::kRabenseifnerAllReduce:
      return "rabenseifner";
    case Algorithm::kChainBroadcast: return "chain-broadcast";
    case Algorithm::kRingAllGather: return "ring-allgather";
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

AlgorithmTable BuildAlgorithmTable(const AlgorithmInputs& in) {
  AlgorithmTable t;
  t.small_bytes_ = SmallMessageBytes(in);
  const Kind kinds[] = {Kind::kAllReduce, Kind::kBroadcast, Kind::kAllGather, Kind::kBarrier};
  const bool messages = in.world > 1 && !in.shm_exchange;  // the descriptor round opens
  // AllReduce's algorithm for large messages between several ranks, and the
  // candidate a measured class runs for it.
  const Algorithm large_allreduce =
      in.shm_allreduce ? Algorithm::kShmAllReduce : Algorithm::kRingAllReduce;
  // AllReduce over messages, after the linear round's range where it opens:
  // recursive doubling up to rd_to, Rabenseifner up to rab_to, recursive
  // doubling again up to rd_end (where rabenseifner_bytes ends below it),
  // then the ring.
  size_t rd_to = 0, rab_to = 0, rd_end = 0;
  if (messages) {
    rd_end = std::max(t.small_bytes_, in.recursive_doubling_bytes);
    t.carried_bytes_ = rd_end;
    rd_to = rd_end;
    // Rabenseifner where every rank exchanges (p a power of two) and halving
    // saves bytes (recursive doubling moves log2(p) copies: 1 at p = 2),
    // above rabenseifner_from_bytes (Note [Recursive doubling or
    // Rabenseifner]) up to rabenseifner_bytes.
    const bool power_of_two = (in.world & (in.world - 1)) == 0;
    if (power_of_two && in.world >= 4) {
      const size_t from = std::min(rd_end, in.rabenseifner_from_bytes);
      if (in.rabenseifner_bytes > from) {
        rd_to = from;
        rab_to = in.rabenseifner_bytes;
        t.carried_bytes_ = std::max(t.carried_bytes_, rab_to);
      }
    }
    using Opening = UcxOptions::Opening;
    t.linear_ =
        in.opening == Opening::kLinear ||
        (in.opening == Opening::kAuto && in.machine_oversubscribed && in.world >= kLinearMinRanks);
    if (t.linear_) t.linear_bytes_ = in.linear_bytes;
    t.linear_watched_ = t.linear_;
    // The measured classes (Note [Measured choice] in measured_choice.h).
    const bool linear_candidate = in.world <= kMeasuredLinearMaxRanks &&
                                  in.opening != Opening::kRecursiveDoubling &&
                                  (t.linear_ || in.machine_oversubscribed);
    // Only where the table itself carries AllReduce in a round (recursive
    // doubling or Rabenseifner): above it the ring alone.
    const size_t carried_end = t.carried_bytes_;
    for (size_t lo = kMeasuredFromBytes; in.world >= 3 && lo < in.measured_bytes; lo *= 2) {
      AlgorithmTable::MeasuredClass c;
      c.lo = lo;
      c.hi = std::min(2 * lo, in.measured_bytes);
      if (c.hi > carried_end) break;
      // In the order of the bytes they send through a rank's link, fewest
      // first (Note [Measured choice]: the trial's order).
      if (power_of_two && in.world >= 4 && in.rabenseifner_bytes >= c.hi) {
        c.candidates.push_back(Algorithm::kRabenseifnerAllReduce);
      }
      if (lo >= kMeasuredRingFromBytes) {
        c.candidates.push_back(large_allreduce);
      }
      c.candidates.push_back(Algorithm::kRecursiveDoublingAllReduce);
      const bool linear_here = linear_candidate && c.hi <= kMeasuredLinearMaxBytes;
      if (linear_here) c.candidates.push_back(Algorithm::kLinearAllReduce);
      if (c.candidates.size() < 2) continue;  // the table's choice, untimed
      t.carried_bytes_ = std::max(t.carried_bytes_, c.hi);
      if (linear_here) {
        t.linear_bytes_ = std::max(t.linear_bytes_, c.hi);
        t.linear_watched_ = true;
      }
      t.measured_.push_back(std::move(c));
    }
  }
  for (Kind kind : kinds) {
    std::vector<AlgorithmTable::Range>& r = t.ranges_[static_cast<int>(kind) - 1];
    if (kind == Kind::kBarrier) {
      r.push_back({SIZE_MAX, Algorithm::kNone});
      continue;
    }
    if (messages) {
      switch (kind) {
        case Kind::kAllReduce:
          if (t.linear_) r.push_back({in.linear_bytes, Algorithm::kLinearAllReduce});
          // Each range only where it ends above the last one.
          for (const auto& [to, a] : {std::pair{rd_to, Algorithm::kRecursiveDoublingAllReduce},
                                      std::pair{rab_to, Algorithm::kRabenseifnerAllReduce},
                                      std::pair{rd_end, Algorithm::kRecursiveDoublingAllReduce}}) {
            if (r.empty() || to > r.back().max_bytes) r.push_back({to, a});
          }
          if (r.back().max_bytes < SIZE_MAX) {
            r.push_back({SIZE_MAX, large_allreduce});
          }
          break;
        case Kind::kBroadcast:
          r.push_back({SIZE_MAX, Algorithm::kChainBroadcast});
          break;
        case Kind::kAllGather:
          r.push_back({SIZE_MAX, Algorithm::kRingAllGather});
          break;
        case Kind::kBarrier:
          break;
      }
      continue;
    }
    r.push_back({t.small_bytes_, Algorithm::kOneShot});
    if (t.small_bytes_ == SIZE_MAX) continue;
    Algorithm large = Algorithm::kLocal;
    if (in.world > 1) {
      switch (kind) {
        case Kind::kAllReduce:
          large = large_allreduce;
          break;
        case Kind::kBroadcast: large = Algorithm::kChainBroadcast; break;
        case Kind::kAllGather: large = Algorithm::kRingAllGather; break;
        case Kind::kBarrier: break;
      }
    }
    r.push_back({SIZE_MAX, large});
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
