// Plan: how a GradientLayout is fused into allreduce buckets.
#ifndef FUSEBOX_BUCKETING_PLAN_H_
#define FUSEBOX_BUCKETING_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bucketing/layout.h"
#include "comm/types.h"

namespace fusebox::bucketing {

// Elements [offset, offset + count) of tensor `tensor`.
struct Slice {
  int tensor = 0;
  int64_t offset = 0;
  int64_t count = 0;
  friend bool operator==(const Slice& a, const Slice& b) {
    return a.tensor == b.tensor && a.offset == b.offset && a.count == b.count;
  }
};

// One fused allreduce: its slices laid out back to back, in order, in one
// fusion buffer of a single dtype.
struct Bucket {
  comm::DataType dtype = comm::DataType::kFloat32;
  std::vector<Slice> slices;
  int64_t count() const;  // elements
  friend bool operator==(const Bucket& a, const Bucket& b) {
    return a.dtype == b.dtype && a.slices == b.slices;
  }
};

// Buckets in launch order: every rank issues bucket k's allreduce before
// bucket k+1's (see Note [Launch order] in launch_order.h). `name` is a
// label for reports and takes no part in the hash or in equality.
struct Plan {
  std::string name;
  std::vector<Bucket> buckets;
  friend bool operator==(const Plan& a, const Plan& b) { return a.buckets == b.buckets; }
};

// At most this many buckets and slices in one plan (bounded for plans read
// from files; a real plan has at most a few thousand).
inline constexpr int kMaxPlanBuckets = 1 << 20;
inline constexpr int kMaxPlanSlices = 1 << 22;

// Stable 64-bit hash of the buckets (dtypes and slices in order), equal on
// every rank, build and host for equal plans.
uint64_t PlanHash(const Plan& plan);

// OK when `plan` fits `layout`: every bucket non-empty and of one dtype and
// one memory kind matching its tensors; every slice inside its tensor; every
// element of every tensor covered exactly once; a zero-size tensor appears as
// exactly one zero-count slice (so that marking it ready has a bucket to
// complete) and non-empty tensors have no zero-count slices. Errors name the
// bucket, slice and tensor.
absl::Status ValidatePlan(const GradientLayout& layout, const Plan& plan);

// One line per bucket: index, dtype, elements, bytes, tensors; for reports.
std::string DescribePlan(const GradientLayout& layout, const Plan& plan);

}  // namespace fusebox::bucketing

#endif  // FUSEBOX_BUCKETING_PLAN_H_
