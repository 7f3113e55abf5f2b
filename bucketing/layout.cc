#include "bucketing/layout.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "bucketing/hash.h"

namespace fusebox::bucketing {

namespace {

bool IsFloating(comm::DataType t) {
  return t == comm::DataType::kFloat32 || t == comm::DataType::kFloat64 ||
         t == comm::DataType::kFloat16 || t == comm::DataType::kBFloat16;
}

}  // namespace

absl::StatusOr<GradientLayout> GradientLayout::Create(std::vector<TensorSpec> tensors) {
  if (tensors.size() > static_cast<size_t>(kMaxLayoutTensors)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "layout has %d tensors, more than the limit of %d", tensors.size(), kMaxLayoutTensors));
  }
  absl::flat_hash_set<absl::string_view> names;
  GradientLayout layout;
  StableHasher h;
  h.AddU64(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& t = tensors[i];
    if (t.name.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("tensor %d has an empty name", i));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor %d: name \"%s\" appears twice in the layout", i, t.name));
    }
    if (t.numel < 0 || t.numel > kMaxTensorElements) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor %d (\"%s\"): element count %d is outside [0, %d]", i, t.name,
                          t.numel, kMaxTensorElements));
    }
    if (!IsFloating(t.dtype)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensor %d (\"%s\"): dtype %d is not a floating-point gradient type (float, double, "
          "half, bfloat16)",
          i, t.name, static_cast<int>(t.dtype)));
    }
    if (t.memory != comm::MemoryKind::kHost && t.memory != comm::MemoryKind::kDevice) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor %d (\"%s\"): unknown memory kind", i, t.name));
    }
    layout.total_bytes_ += t.numel * static_cast<int64_t>(comm::DataTypeSize(t.dtype));
    h.AddString(t.name);
    h.AddI64(t.numel);
    h.AddU64(static_cast<uint64_t>(t.dtype));
    h.AddU64(static_cast<uint64_t>(t.memory));
  }
  layout.tensors_ = std::move(tensors);
  layout.hash_ = h.value();
  return layout;
}

int64_t GradientLayout::bytes(int id) const {
  return tensors_[id].numel * static_cast<int64_t>(comm::DataTypeSize(tensors_[id].dtype));
}

}  // namespace fusebox::bucketing
