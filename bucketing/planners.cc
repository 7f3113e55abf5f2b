#include "bucketing/planners.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace fusebox::bucketing {

namespace {

// Buckets are keyed by (dtype, memory), as DDP keys them by (dtype, device).
using Key = std::pair<comm::DataType, comm::MemoryKind>;
Key KeyOf(const TensorSpec& t) { return {t.dtype, t.memory}; }

Slice Whole(const GradientLayout& layout, int id) { return Slice{id, 0, layout.tensor(id).numel}; }

// Orders buckets by the first tensor they hold (ties: first offset).
void SortByFirstSlice(std::vector<Bucket>& buckets) {
  std::stable_sort(buckets.begin(), buckets.end(), [](const Bucket& a, const Bucket& b) {
    const Slice& x = a.slices.front();
    const Slice& y = b.slices.front();
    return x.tensor != y.tensor ? x.tensor < y.tensor : x.offset < y.offset;
  });
}

// Groups the tensors [begin, end) into one bucket per (dtype, memory).
void AppendSegment(const GradientLayout& layout, int begin, int end, std::vector<Bucket>& out) {
  std::map<Key, size_t> open;
  for (int id = begin; id < end; ++id) {
    const Key key = KeyOf(layout.tensor(id));
    auto it = open.find(key);
    if (it == open.end()) {
      it = open.emplace(key, out.size()).first;
      out.push_back(Bucket{key.first, {}});
    }
    out[it->second].slices.push_back(Whole(layout, id));
  }
}

}  // namespace

Plan PerTensorPlan(const GradientLayout& layout) {
  Plan plan;
  plan.name = "per-tensor";
  for (int id = 0; id < layout.size(); ++id) {
    plan.buckets.push_back(Bucket{layout.tensor(id).dtype, {Whole(layout, id)}});
  }
  return plan;
}

Plan DdpPlan(const GradientLayout& layout, const DdpOptions& options) {
  struct Open {
    Bucket bucket;
    int64_t bytes = 0;
    int limit_index = 0;  // 0: first_bucket_bytes, then bucket_cap_bytes
  };
  std::map<Key, Open> open;
  std::vector<Bucket> done;
  for (int id = 0; id < layout.size(); ++id) {
    const TensorSpec& t = layout.tensor(id);
    Open& o = open[KeyOf(t)];
    o.bucket.dtype = t.dtype;
    o.bucket.slices.push_back(Whole(layout, id));
    o.bytes += layout.bytes(id);
    const int64_t limit = o.limit_index == 0 ? options.first_bucket_bytes : options.bucket_cap_bytes;
    if (o.bytes >= limit) {
      done.push_back(std::move(o.bucket));
      o.bucket = Bucket{};
      o.bytes = 0;
      o.limit_index = 1;
    }
  }
  for (auto& [key, o] : open) {
    if (!o.bucket.slices.empty()) done.push_back(std::move(o.bucket));
  }
  SortByFirstSlice(done);
  Plan plan;
  plan.name = "ddp";
  plan.buckets = std::move(done);
  return plan;
}

absl::StatusOr<Plan> HorovodPlan(const GradientLayout& layout, absl::Span<const double> ready_us,
                                 const HorovodOptions& options) {
  if (ready_us.size() != static_cast<size_t>(layout.size())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Horovod plan: %d ready times for %d tensors", ready_us.size(), layout.size()));
  }
  if (!(options.cycle_us > 0) || !std::isfinite(options.cycle_us)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Horovod plan: cycle time %g us must be positive", options.cycle_us));
  }
  if (options.fusion_threshold_bytes < 0) {
    return absl::InvalidArgumentError("Horovod plan: fusion threshold must not be negative");
  }
  for (size_t i = 0; i < ready_us.size(); ++i) {
    if (!std::isfinite(ready_us[i]) || ready_us[i] < 0 || (i > 0 && ready_us[i] < ready_us[i - 1])) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "Horovod plan: ready time %d (%g us) is negative, not finite or earlier than the one "
          "before",
          i, ready_us[i]));
    }
  }
  Plan plan;
  plan.name = "horovod";
  int id = 0;
  while (id < layout.size()) {
    // The cycle that sees tensor `id`: the first boundary at or after it.
    const double cycle_end = std::max(1.0, std::ceil(ready_us[id] / options.cycle_us)) *
                             options.cycle_us;
    int end = id;
    while (end < layout.size() && ready_us[end] <= cycle_end) ++end;
    // Fuse [id, end) per (dtype, memory), in ready order, up to the threshold.
    std::map<Key, std::pair<size_t, int64_t>> open;  // bucket index, bytes
    std::vector<Bucket> cycle;
    for (int t = id; t < end; ++t) {
      const Key key = KeyOf(layout.tensor(t));
      const int64_t bytes = layout.bytes(t);
      auto it = open.find(key);
      if (it != open.end() && it->second.second + bytes > options.fusion_threshold_bytes) {
        open.erase(it);
        it = open.end();
      }
      if (it == open.end()) {
        it = open.emplace(key, std::make_pair(cycle.size(), int64_t{0})).first;
        cycle.push_back(Bucket{key.first, {}});
      }
      cycle[it->second.first].slices.push_back(Whole(layout, t));
      it->second.second += bytes;
    }
    for (Bucket& b : cycle) plan.buckets.push_back(std::move(b));
    id = end;
  }
  return plan;
}

absl::StatusOr<Plan> SplitIndicesPlan(const GradientLayout& layout,
                                      absl::Span<const int> split_indices) {
  int prev = 0;
  for (size_t i = 0; i < split_indices.size(); ++i) {
    const int s = split_indices[i];
    if (s <= prev || s >= layout.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "split index %d (position %d) must be greater than %d and less than the tensor count "
          "%d",
          s, i, prev, layout.size()));
    }
    prev = s;
  }
  Plan plan;
  plan.name = "split-indices";
  int begin = 0;
  for (int s : split_indices) {
    AppendSegment(layout, begin, s, plan.buckets);
    begin = s;
  }
  AppendSegment(layout, begin, layout.size(), plan.buckets);
  return plan;
}

absl::StatusOr<Plan> SplitBytesPlan(const GradientLayout& layout,
                                    absl::Span<const double> fractions) {
  if (fractions.empty() || fractions.size() > 8) {
    return absl::InvalidArgumentError(
        absl::StrFormat("byte split: %d fractions given, expected 1 to 8", fractions.size()));
  }
  double sum = 0;
  for (size_t i = 0; i < fractions.size(); ++i) {
    if (!(fractions[i] > 0) || !std::isfinite(fractions[i])) {
      return absl::InvalidArgumentError(
          absl::StrFormat("byte split: fraction %d (%g) must be positive", i, fractions[i]));
    }
    sum += fractions[i];
  }
  if (std::abs(sum - 1.0) > 1e-6) {
    return absl::InvalidArgumentError(
        absl::StrFormat("byte split: fractions sum to %.9g, expected 1", sum));
  }
  Plan plan;
  plan.name = "hccl-split";
  const double total = static_cast<double>(layout.total_bytes());
  int begin = 0;
  int64_t running = 0;
  double cumulative = 0;
  for (size_t seg = 0; seg < fractions.size() && begin < layout.size(); ++seg) {
    cumulative += fractions[seg];
    int end = begin;
    if (seg + 1 == fractions.size()) {
      end = layout.size();
    } else {
      const double target = cumulative * total;
      while (end < layout.size()) {
        running += layout.bytes(end);
        ++end;
        if (static_cast<double>(running) >= target) break;
      }
    }
    AppendSegment(layout, begin, end, plan.buckets);
    begin = end;
  }
  return plan;
}

absl::StatusOr<Plan> FixedSizePlan(const GradientLayout& layout, int64_t bucket_bytes) {
  if (bucket_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("fixed-size plan: bucket size %d bytes must be positive", bucket_bytes));
  }
  struct Open {
    Bucket bucket;
    int64_t bytes = 0;
  };
  std::map<Key, Open> open;
  std::vector<Bucket> done;
  for (int id = 0; id < layout.size(); ++id) {
    const TensorSpec& t = layout.tensor(id);
    const int64_t esize = static_cast<int64_t>(comm::DataTypeSize(t.dtype));
    const int64_t per_bucket = std::max<int64_t>(1, bucket_bytes / esize);
    Open& o = open[KeyOf(t)];
    o.bucket.dtype = t.dtype;
    if (t.numel == 0) {
      o.bucket.slices.push_back(Slice{id, 0, 0});
      continue;
    }
    int64_t offset = 0;
    while (offset < t.numel) {
      const int64_t room = per_bucket - o.bytes / esize;
      const int64_t take = std::min(room, t.numel - offset);
      o.bucket.slices.push_back(Slice{id, offset, take});
      o.bytes += take * esize;
      offset += take;
      if (o.bytes / esize >= per_bucket) {
        done.push_back(std::move(o.bucket));
        o.bucket = Bucket{t.dtype, {}};
        o.bytes = 0;
      }
    }
  }
  for (auto& [key, o] : open) {
    if (!o.bucket.slices.empty()) done.push_back(std::move(o.bucket));
  }
  // Buckets closed in ready order per dtype; order them by first slice, like
  // the other planners.
  SortByFirstSlice(done);
  Plan plan;
  plan.name = absl::StrFormat("fixed-%d", bucket_bytes);
  plan.buckets = std::move(done);
  return plan;
}

}  // namespace fusebox::bucketing
