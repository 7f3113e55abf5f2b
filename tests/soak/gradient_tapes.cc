#include "tests/soak/gradient_tapes.h"

#include <algorithm>
#include <cstdlib>

#include "comm/testing/exact_data.h"

namespace fusebox::soak {

using comm::DataType;

GradientTapes::GradientTapes(const bucketing::GradientLayout& layout, int rank, int world)
    : world_(world) {
  for (const bucketing::TensorSpec& t : layout.tensors()) {
    Tape& tape = tapes_[static_cast<int>(t.dtype)];
    tape.length = std::max(tape.length, t.numel + kShifts);
  }
  for (int k = 0; k < comm::kNumDataTypes; ++k) {
    Tape& tape = tapes_[k];
    if (tape.length == 0) continue;
    const auto type = static_cast<DataType>(k);
    tape.input.resize(tape.length * comm::DataTypeSize(type));
    // kSum and kAvg inputs are the same values.
    comm::testing::FillInput(tape.input.data(), tape.length, type, comm::ReduceOp::kSum, rank);
  }
  SetAverage(true);
}

void GradientTapes::SetAverage(bool average) {
  if (expected_filled_ && average == average_) return;
  average_ = average;
  expected_filled_ = true;
  for (int k = 0; k < comm::kNumDataTypes; ++k) {
    Tape& tape = tapes_[k];
    if (tape.length == 0) continue;
    const auto type = static_cast<DataType>(k);
    tape.expected.resize(tape.input.size());
    comm::testing::FillExpected(tape.expected.data(), tape.length, type,
                                average ? comm::ReduceOp::kAvg : comm::ReduceOp::kSum, world_);
  }
}

int64_t GradientTapes::Shift(int64_t iteration, int id) {
  const uint64_t h = static_cast<uint64_t>(iteration) * 7919u + static_cast<uint64_t>(id) * 104729u;
  return static_cast<int64_t>(h % static_cast<uint64_t>(kShifts));
}

const GradientTapes::Tape& GradientTapes::TapeOf(DataType type) const {
  const Tape& tape = tapes_[static_cast<int>(type)];
  if (tape.length == 0) std::abort();  // a dtype the layout does not have: a soak bug
  return tape;
}

const unsigned char* GradientTapes::Input(DataType type, int64_t shift) const {
  return TapeOf(type).input.data() + shift * comm::DataTypeSize(type);
}

const unsigned char* GradientTapes::Expected(DataType type, int64_t shift) const {
  return TapeOf(type).expected.data() + shift * comm::DataTypeSize(type);
}

}  // namespace fusebox::soak
