#include "bucketing/plan.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bucketing/hash.h"

namespace fusebox::bucketing {

int64_t Bucket::count() const {
  int64_t n = 0;
  for (const Slice& s : slices) n += s.count;
  return n;
}

uint64_t PlanHash(const Plan& plan) {
  StableHasher h;
  h.AddU64(plan.buckets.size());
  for (const Bucket& b : plan.buckets) {
    h.AddU64(static_cast<uint64_t>(b.dtype));
    h.AddU64(b.slices.size());
    for (const Slice& s : b.slices) {
      h.AddI64(s.tensor);
      h.AddI64(s.offset);
      h.AddI64(s.count);
    }
  }
  return h.value();
}

absl::Status ValidatePlan(const GradientLayout& layout, const Plan& plan) {
  if (plan.buckets.size() > static_cast<size_t>(kMaxPlanBuckets)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "plan has %d buckets, more than the limit of %d", plan.buckets.size(), kMaxPlanBuckets));
  }
  // Per tensor: the slices that cover it, checked for exact coverage below.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> covered(layout.size());
  size_t total_slices = 0;
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    const Bucket& bucket = plan.buckets[b];
    if (bucket.slices.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("bucket %d has no slices", b));
    }
    total_slices += bucket.slices.size();
    if (total_slices > static_cast<size_t>(kMaxPlanSlices)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("plan has more than %d slices", kMaxPlanSlices));
    }
    comm::MemoryKind memory = comm::MemoryKind::kHost;
    for (size_t i = 0; i < bucket.slices.size(); ++i) {
      const Slice& s = bucket.slices[i];
      if (s.tensor < 0 || s.tensor >= layout.size()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("bucket %d slice %d: tensor id %d is not in the layout (%d tensors)",
                            b, i, s.tensor, layout.size()));
      }
      const TensorSpec& t = layout.tensor(s.tensor);
      if (t.dtype != bucket.dtype) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "bucket %d slice %d: tensor %d (\"%s\") is %s but the bucket is %s", b, i, s.tensor,
            t.name, comm::DataTypeName(t.dtype), comm::DataTypeName(bucket.dtype)));
      }
      if (i == 0) {
        memory = t.memory;
      } else if (t.memory != memory) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "bucket %d mixes host and device tensors (slice %d, tensor \"%s\")", b, i, t.name));
      }
      if (s.offset < 0 || s.count < 0 || s.offset > t.numel || s.count > t.numel - s.offset) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "bucket %d slice %d: elements [%d, %d + %d) are outside tensor %d (\"%s\", %d "
            "elements)",
            b, i, s.offset, s.offset, s.count, s.tensor, t.name, t.numel));
      }
      if (s.count == 0 && t.numel != 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "bucket %d slice %d: empty slice of non-empty tensor %d (\"%s\")", b, i, s.tensor,
            t.name));
      }
      covered[s.tensor].emplace_back(s.offset, s.count);
    }
  }
  for (int id = 0; id < layout.size(); ++id) {
    const TensorSpec& t = layout.tensor(id);
    auto& spans = covered[id];
    if (spans.empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor %d (\"%s\") is in no bucket", id, t.name));
    }
    if (t.numel == 0) {
      if (spans.size() != 1) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "zero-size tensor %d (\"%s\") appears in %d slices; it must appear in exactly one",
            id, t.name, spans.size()));
      }
      continue;
    }
    std::sort(spans.begin(), spans.end());
    int64_t next = 0;
    for (const auto& [offset, count] : spans) {
      if (offset < next) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "tensor %d (\"%s\"): elements from %d are covered twice", id, t.name, offset));
      }
      if (offset > next) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "tensor %d (\"%s\"): elements [%d, %d) are in no bucket", id, t.name, next, offset));
      }
      next = offset + count;
    }
    if (next != t.numel) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensor %d (\"%s\"): elements [%d, %d) are in no bucket", id, t.name, next, t.numel));
    }
  }
  return absl::OkStatus();
}

std::string DescribePlan(const GradientLayout& layout, const Plan& plan) {
  std::string out = absl::StrFormat("# plan \"%s\": %d buckets, hash %016x\n", plan.name,
                                    plan.buckets.size(), PlanHash(plan));
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    const Bucket& bucket = plan.buckets[b];
    const int64_t bytes = bucket.count() * static_cast<int64_t>(comm::DataTypeSize(bucket.dtype));
    const Slice& first = bucket.slices.front();
    const Slice& last = bucket.slices.back();
    absl::StrAppendFormat(&out, "%5d %-8s %12d elements %10.3f MiB  %4d slices  %s .. %s\n", b,
                          comm::DataTypeName(bucket.dtype), bucket.count(), bytes / 1048576.0,
                          bucket.slices.size(), layout.tensor(first.tensor).name,
                          layout.tensor(last.tensor).name);
  }
  return out;
}

}  // namespace fusebox::bucketing
