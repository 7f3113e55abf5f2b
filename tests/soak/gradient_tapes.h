// Gradients whose reduction over the ranks is known exactly
// (comm/testing/exact_data.h), served from precomputed "tapes" so that a soak
// iteration costs one memcpy in and one memcmp out per tensor rather than a
// per-element fill and reference.
//
// FillInput(seed = s) writes InputValue(i + s) at element i, so the input of
// a tensor at shift s is the tape's elements [s, s + numel), and likewise for
// the expected values. Each (iteration, tensor) gets its own shift, so
// successive iterations send different data and a stale result (last
// iteration's, or another tensor's) does not pass.
#ifndef FUSEBOX_TESTS_SOAK_GRADIENT_TAPES_H_
#define FUSEBOX_TESTS_SOAK_GRADIENT_TAPES_H_

#include <array>
#include <cstdint>
#include <vector>

#include "bucketing/layout.h"
#include "comm/types.h"

namespace fusebox::soak {

class GradientTapes {
 public:
  // Shifts are drawn from [0, kShifts); prime, so the per-tensor patterns
  // do not line up.
  static constexpr int64_t kShifts = 4093;

  // For every dtype of `layout`: this rank's inputs, kShifts elements longer
  // than the dtype's largest tensor. Expected values follow SetAverage.
  GradientTapes(const bucketing::GradientLayout& layout, int rank, int world);

  // The expected values become the average (the exact sum divided once by
  // the world size in the element type, as the engine's kAvg) or the sum.
  // Recomputes the expected tapes when the mode changes (costs a reference
  // over every rank's inputs).
  void SetAverage(bool average);
  bool average() const { return average_; }

  // The shift of tensor `id` at `iteration`.
  static int64_t Shift(int64_t iteration, int id);

  // Elements [shift, shift + numel) of the tapes of `type` (a dtype of the
  // layout; shift < kShifts).
  const unsigned char* Input(comm::DataType type, int64_t shift) const;
  const unsigned char* Expected(comm::DataType type, int64_t shift) const;

 private:
  struct Tape {
    int64_t length = 0;  // elements; 0 for a dtype the layout lacks
    std::vector<unsigned char> input, expected;
  };
  const Tape& TapeOf(comm::DataType type) const;

  int world_ = 1;
  bool average_ = false;
  bool expected_filled_ = false;
  std::array<Tape, comm::kNumDataTypes> tapes_;
};

}  // namespace fusebox::soak

#endif  // FUSEBOX_TESTS_SOAK_GRADIENT_TAPES_H_
