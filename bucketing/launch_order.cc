#include "bucketing/launch_order.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <utility>

namespace fusebox::bucketing {

int MaxVotingRanks(comm::DataType type) {
  return type == comm::DataType::kBFloat16  ? 256
         : type == comm::DataType::kFloat16 ? 2048
                                            : (1 << 24);
}

std::vector<int> ForwardPriorities(const Plan& plan) {
  const int nb = static_cast<int>(plan.buckets.size());
  std::vector<int> priority(nb, -1);
  for (int b = 0; b < nb; ++b) {
    for (const Slice& s : plan.buckets[b].slices) priority[b] = std::max(priority[b], s.tensor);
  }
  return priority;
}

LaunchOrder::LaunchOrder(Schedule schedule, int max_in_flight, std::vector<int> priority)
    : schedule_(schedule), max_in_flight_(max_in_flight), priority_(std::move(priority)) {
  assert(max_in_flight_ >= 1);
  Reset();
}

void LaunchOrder::Reset() {
  state_.assign(priority_.size(), State::kFilling);
  next_in_plan_ = 0;
  launched_ = 0;
  freed_ = 0;
  votes_.assign(priority_.size(), {});
}

void LaunchOrder::Complete(int bucket) {
  if (state_[bucket] == State::kFilling) state_[bucket] = State::kReady;
}

int LaunchOrder::Next() const {
  const int nb = buckets();
  if (launched_ >= nb || in_window() >= max_in_flight_) return -1;
  int b = next_in_plan_;
  if (schedule_ == Schedule::kForwardPriority && launched_ >= max_in_flight_) {
    // Launch k - W has completed (in_window() < W, and slots free in launch
    // order), so once its votes are in they are the same on every rank.
    const std::vector<uint8_t>& everywhere = votes_[launched_ - max_in_flight_];
    if (static_cast<int>(everywhere.size()) != nb) return -1;  // not agreed yet
    int best = -1;
    for (int c = 0; c < nb; ++c) {
      if (everywhere[c] && state_[c] != State::kLaunched &&
          (best < 0 || priority_[c] > priority_[best])) {
        best = c;
      }
    }
    if (best >= 0) b = best;  // complete everywhere, so complete here too
  }
  return state_[b] == State::kReady ? b : -1;  // else wait until it is complete here
}

int LaunchOrder::Launched(int bucket) {
  assert(bucket == Next());
  state_[bucket] = State::kLaunched;
  const int nb = buckets();
  while (next_in_plan_ < nb && state_[next_in_plan_] == State::kLaunched) ++next_in_plan_;
  return launched_++;
}

bool LaunchOrder::Free(int index) {
  if (index != freed_ || index >= launched_) return false;
  ++freed_;
  return true;
}

void LaunchOrder::Agreed(int index, std::vector<uint8_t> everywhere) {
  if (index < 0 || index >= static_cast<int>(votes_.size())) return;
  votes_[index] = std::move(everywhere);
}

namespace {

// One vote element of `type`.
void StoreVote(char* p, comm::DataType type, double v) {
  switch (type) {
    case comm::DataType::kFloat32: {
      const float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      return;
    }
    case comm::DataType::kFloat64:
      std::memcpy(p, &v, 8);
      return;
    case comm::DataType::kFloat16: {
      const uint16_t h = comm::FloatToHalf(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      return;
    }
    default: {
      const uint16_t h = comm::FloatToBFloat16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      return;
    }
  }
}

}  // namespace

void WriteVotes(const LaunchOrder& order, comm::DataType type, char* out) {
  const size_t esize = comm::DataTypeSize(type);
  for (int c = 0; c < order.buckets(); ++c) {
    StoreVote(out + c * esize, type, order.complete_here(c) ? 1.0 : 0.0);
  }
}

std::vector<uint8_t> ReadVotes(const char* in, int n, comm::DataType type, double all) {
  const size_t esize = comm::DataTypeSize(type);
  // What every rank voting 1 adds up to, bit for bit.
  std::vector<char> unanimous(esize);
  StoreVote(unanimous.data(), type, all);
  std::vector<uint8_t> out(n);
  for (int c = 0; c < n; ++c) {
    out[c] = std::memcmp(in + c * esize, unanimous.data(), esize) == 0;
  }
  return out;
}

}  // namespace fusebox::bucketing
