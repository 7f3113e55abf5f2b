// Deterministic draws for the soak: a mixed gradient layout and plans from
// every baseline planner with parameters drawn from a seed. Integer
// arithmetic only (no <random> distributions, no libm), so every rank, build
// and host draws the same values from the same seed.
#ifndef FUSEBOX_TESTS_SOAK_PLAN_MIX_H_
#define FUSEBOX_TESTS_SOAK_PLAN_MIX_H_

#include <cstdint>
#include <initializer_list>
#include <random>

#include "absl/status/statusor.h"
#include "bucketing/layout.h"
#include "bucketing/plan.h"

namespace fusebox::soak {

// SplitMix64 over the words in turn: a seed for one purpose and moment, e.g.
// Mix({seed, kPlanStream, swap}).
uint64_t Mix(std::initializer_list<uint64_t> words);

// Roughly log-uniform in [lo, hi] (1 <= lo <= hi): a power of two is picked
// uniformly, then a value inside it, so small and large sizes are equally
// common.
int64_t LogUniform(std::mt19937_64& rng, int64_t lo, int64_t hi);

// `tensors` gradients in ready order: float32, float64, float16 and bfloat16
// at random, sizes log-uniform from one element to a quarter of
// `max_tensor_bytes`, about one in ten of size zero, and one float32 tensor
// of exactly `max_tensor_bytes` (a multiple of 4) at a random position.
absl::StatusOr<bucketing::GradientLayout> MixedLayout(uint64_t seed, int tensors,
                                                      int64_t max_tensor_bytes);

// One of the baseline planners (per-tensor, DDP, Horovod, split indices,
// split bytes, fixed size; bucketing/planners.h) with parameters drawn from
// `seed`; the plan's name says which and with what. Equal on every rank for
// equal (layout, seed).
absl::StatusOr<bucketing::Plan> PlanFromSeed(const bucketing::GradientLayout& layout,
                                             uint64_t seed);

}  // namespace fusebox::soak

#endif  // FUSEBOX_TESTS_SOAK_PLAN_MIX_H_
