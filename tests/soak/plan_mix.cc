#include "tests/soak/plan_mix.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bucketing/planners.h"

namespace fusebox::soak {

using bucketing::GradientLayout;
using bucketing::Plan;
using comm::DataType;

uint64_t Mix(std::initializer_list<uint64_t> words) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (uint64_t w : words) {
    h += w + 0x9e3779b97f4a7c15ull;
    uint64_t z = h;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    h = z ^ (z >> 31);
  }
  return h;
}

int64_t LogUniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  int low_bit = 0, high_bit = 0;
  while ((int64_t{2} << low_bit) <= lo) ++low_bit;
  while ((int64_t{2} << high_bit) <= hi) ++high_bit;
  const int bit = low_bit + static_cast<int>(rng() % (high_bit - low_bit + 1));
  const int64_t base = int64_t{1} << bit;
  const int64_t value = base + static_cast<int64_t>(rng() % static_cast<uint64_t>(base));
  return std::clamp(value, lo, hi);
}

absl::StatusOr<GradientLayout> MixedLayout(uint64_t seed, int tensors, int64_t max_tensor_bytes) {
  if (tensors < 1 || max_tensor_bytes < 16 || max_tensor_bytes % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "soak layout: need at least one tensor and a largest tensor of a multiple of 4 bytes "
        "(>= 16), got ", tensors, " tensors of up to ", max_tensor_bytes, " bytes"));
  }
  constexpr DataType kTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                                 DataType::kBFloat16};
  std::mt19937_64 rng(seed);
  const int largest = static_cast<int>(rng() % tensors);
  std::vector<bucketing::TensorSpec> specs;
  for (int i = 0; i < tensors; ++i) {
    bucketing::TensorSpec t;
    t.name = absl::StrCat("layer", i / 2, i % 2 == 0 ? ".bias" : ".weight");
    if (i == largest) {
      t.dtype = DataType::kFloat32;
      t.numel = max_tensor_bytes / 4;
    } else {
      t.dtype = kTypes[rng() % 4];
      const int64_t max_numel =
          std::max<int64_t>(1, max_tensor_bytes / 4 / static_cast<int64_t>(DataTypeSize(t.dtype)));
      t.numel = rng() % 10 == 0 ? 0 : LogUniform(rng, 1, max_numel);
    }
    specs.push_back(std::move(t));
  }
  return GradientLayout::Create(std::move(specs));
}

absl::StatusOr<Plan> PlanFromSeed(const GradientLayout& layout, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int n = layout.size();
  absl::StatusOr<Plan> plan;
  std::string how;
  switch (rng() % 6) {
    case 0:
      plan = bucketing::PerTensorPlan(layout);
      break;
    case 1: {
      bucketing::DdpOptions o;
      o.first_bucket_bytes = 8 * LogUniform(rng, 8 << 10, 256 << 10);
      o.bucket_cap_bytes = 8 * LogUniform(rng, 32 << 10, 4 << 20);
      plan = bucketing::DdpPlan(layout, o);
      how = absl::StrCat(" first=", o.first_bucket_bytes, "B cap=", o.bucket_cap_bytes, "B");
      break;
    }
    case 2: {
      // Ready times as if backward produced 2 bytes per nanosecond.
      std::vector<double> ready_us;
      double bytes = 0;
      for (int id = 0; id < n; ++id) {
        bytes += static_cast<double>(layout.bytes(id));
        ready_us.push_back(bytes / 2000.0);
      }
      bucketing::HorovodOptions o;
      o.fusion_threshold_bytes = 8 * LogUniform(rng, 32 << 10, 8 << 20);
      o.cycle_us = static_cast<double>(LogUniform(rng, 50, 2000));
      plan = bucketing::HorovodPlan(layout, ready_us, o);
      how = absl::StrCat(" threshold=", o.fusion_threshold_bytes, "B cycle=", o.cycle_us, "us");
      break;
    }
    case 3: {
      std::vector<int> splits;
      for (int k = 1 + static_cast<int>(rng() % 4); k > 0 && n > 1; --k) {
        splits.push_back(1 + static_cast<int>(rng() % (n - 1)));
      }
      std::sort(splits.begin(), splits.end());
      splits.erase(std::unique(splits.begin(), splits.end()), splits.end());
      plan = splits.empty() ? bucketing::PerTensorPlan(layout)
                            : bucketing::SplitIndicesPlan(layout, splits);
      how = absl::StrCat(" at ", absl::StrJoin(splits, ","));
      break;
    }
    case 4: {
      std::vector<int> weights(1 + rng() % 8);
      int total = 0;
      for (int& w : weights) total += (w = 1 + static_cast<int>(rng() % 100));
      std::vector<double> fractions;
      double sum = 0;
      for (size_t k = 0; k + 1 < weights.size(); ++k) {
        fractions.push_back(static_cast<double>(weights[k]) / total);
        sum += fractions.back();
      }
      fractions.push_back(1.0 - sum);
      plan = bucketing::SplitBytesPlan(layout, fractions);
      how = absl::StrCat(" weights ", absl::StrJoin(weights, ":"));
      break;
    }
    default: {
      const int64_t bucket_bytes = 8 * LogUniform(rng, 2 << 10, 1 << 20);
      plan = bucketing::FixedSizePlan(layout, bucket_bytes);  // named "fixed-<bytes>"
      break;
    }
  }
  if (!plan.ok()) {
    return absl::Status(plan.status().code(), absl::StrCat("soak plan from seed ", seed, " (",
                                                           how, "): ", plan.status().message()));
  }
  plan->name += how;
  return plan;
}

}  // namespace fusebox::soak
