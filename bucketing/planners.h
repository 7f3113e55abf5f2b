// Baseline planners: pure functions (layout, options) -> Plan that reproduce
// the bucketing users run today. None reads a clock or the environment.
//
// Every planner keeps one dtype and one memory kind per bucket, as DDP's
// compute_bucket_assignment_by_size does (it keys buckets by dtype and
// device); tensors of another kind go to that kind's own open bucket.
#ifndef FUSEBOX_BUCKETING_PLANNERS_H_
#define FUSEBOX_BUCKETING_PLANNERS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "bucketing/layout.h"
#include "bucketing/plan.h"

namespace fusebox::bucketing {

inline constexpr int64_t kMiB = int64_t{1} << 20;

// No fusion: one bucket per tensor, in ready order.
Plan PerTensorPlan(const GradientLayout& layout);

// PyTorch DDP (torch/csrc/distributed/c10d/reducer.cpp,
// compute_bucket_assignment_by_size, as rebuilt in gradient-ready order after
// the first iteration): tensors are appended in ready order to the open
// bucket of their (dtype, memory); a bucket closes as soon as its size
// reaches the current limit; the first limit is `first_bucket_bytes`, every
// later one `bucket_cap_bytes`; a tensor is never split; buckets are ordered
// by the first tensor they hold.
struct DdpOptions {
  int64_t first_bucket_bytes = 1 * kMiB;    // dist._DEFAULT_FIRST_BUCKET_BYTES
  int64_t bucket_cap_bytes = 25 * kMiB;     // bucket_cap_mb=25
};
Plan DdpPlan(const GradientLayout& layout, const DdpOptions& options = {});

// Horovod's tensor fusion: the background loop wakes every `cycle_us` and
// fuses, in ready order, the tensors that became ready since its last cycle,
// starting a new fused allreduce whenever the next tensor would take it past
// `fusion_threshold_bytes` (a tensor larger than the threshold goes alone);
// tensors of different dtypes are never fused. Time-driven, so it needs each
// tensor's ready time (microseconds from backward start, non-decreasing, one
// per tensor). Cycle k covers ready times in ((k-1)*cycle, k*cycle].
struct HorovodOptions {
  int64_t fusion_threshold_bytes = 128 * kMiB;  // HOROVOD_FUSION_THRESHOLD
  double cycle_us = 1000;                        // HOROVOD_CYCLE_TIME = 1 ms
};
absl::StatusOr<Plan> HorovodPlan(const GradientLayout& layout, absl::Span<const double> ready_us,
                                 const HorovodOptions& options = {});

// MindSpore's all_reduce_fusion_config: bucket boundaries at tensor indices
// (ready order), e.g. {85, 160}: tensors [0,85), [85,160), [160,n). Indices
// must be strictly increasing and inside (0, n). A segment holding several
// dtypes becomes one bucket per dtype.
absl::StatusOr<Plan> SplitIndicesPlan(const GradientLayout& layout,
                                      absl::Span<const int> split_indices);

// HCCL's default segmentation by gradient bytes: `fractions` (positive,
// summing to 1 within 1e-6) of the total bytes, in ready order. A segment
// ends with the tensor at which the running byte total first reaches its
// cumulative fraction; tensors are not split. The HCCL default is
// {0.9654, 0.0346}. At most 8 segments, as in HCCL.
absl::StatusOr<Plan> SplitBytesPlan(const GradientLayout& layout,
                                    absl::Span<const double> fractions);
inline constexpr double kHcclDefaultSplit[] = {0.9654, 0.0346};

// Fixed-size partitions (ByteScheduler-style): fills each bucket to exactly
// `bucket_bytes` (the last of a dtype may be smaller), splitting tensors at
// bucket boundaries. bucket_bytes must be positive.
absl::StatusOr<Plan> FixedSizePlan(const GradientLayout& layout, int64_t bucket_bytes);

}  // namespace fusebox::bucketing

#endif  // FUSEBOX_BUCKETING_PLANNERS_H_
