// Layouts and helpers shared by the bucketing tests.
#ifndef FUSEBOX_TESTS_BUCKETING_TEST_LAYOUTS_H_
#define FUSEBOX_TESTS_BUCKETING_TEST_LAYOUTS_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bucketing/layout.h"
#include "gtest/gtest.h"

namespace fusebox::bucketing::testing {

inline GradientLayout MakeLayout(const std::vector<int64_t>& numels,
                                 comm::DataType dtype = comm::DataType::kFloat32) {
  std::vector<TensorSpec> specs;
  for (size_t i = 0; i < numels.size(); ++i) {
    specs.push_back(TensorSpec{absl::StrCat("t", i), numels[i], dtype});
  }
  auto layout = GradientLayout::Create(std::move(specs));
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *std::move(layout);
}

// A random layout: `n` tensors of 0..max_numel elements (some exactly zero),
// one "huge" tensor of huge_numel elements at a random position, and, when
// mixed, all four floating dtypes.
inline GradientLayout RandomLayout(uint64_t seed, int n, int64_t max_numel, int64_t huge_numel,
                                   bool mixed) {
  std::mt19937_64 rng(seed);
  const comm::DataType types[] = {comm::DataType::kFloat32, comm::DataType::kFloat64,
                                  comm::DataType::kFloat16, comm::DataType::kBFloat16};
  std::vector<TensorSpec> specs;
  const int huge_at = static_cast<int>(rng() % n);
  for (int i = 0; i < n; ++i) {
    TensorSpec t;
    t.name = absl::StrCat("layer", i, ".weight");
    t.numel = i == huge_at ? huge_numel
                           : (rng() % 5 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % max_numel));
    t.dtype = mixed ? types[rng() % 4] : comm::DataType::kFloat32;
    specs.push_back(t);
  }
  auto layout = GradientLayout::Create(std::move(specs));
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *std::move(layout);
}

}  // namespace fusebox::bucketing::testing

#endif  // FUSEBOX_TESTS_BUCKETING_TEST_LAYOUTS_H_
