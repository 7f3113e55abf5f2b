// GradientLayout: the gradients of one model, in the order backward makes
// them ready.
#ifndef FUSEBOX_BUCKETING_LAYOUT_H_
#define FUSEBOX_BUCKETING_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "comm/types.h"

namespace fusebox::bucketing {

// One gradient. Its id is its index in the layout (ready order).
struct TensorSpec {
  std::string name;
  int64_t numel = 0;
  comm::DataType dtype = comm::DataType::kFloat32;
  comm::MemoryKind memory = comm::MemoryKind::kHost;
};

// At most this many tensors and elements per tensor: far above any real
// model (GPT-2 XL has 580 tensors, the largest 80M elements), low enough
// that byte counts cannot overflow.
inline constexpr int kMaxLayoutTensors = 1 << 20;
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 40;

class GradientLayout {
 public:
  GradientLayout() = default;

  // Validates and builds a layout: names non-empty and unique, element
  // counts in [0, kMaxTensorElements], dtypes floating point (fp32, fp64,
  // fp16, bf16: gradients are averaged), at most kMaxLayoutTensors tensors.
  // Errors name the offending tensor.
  static absl::StatusOr<GradientLayout> Create(std::vector<TensorSpec> tensors);

  int size() const { return static_cast<int>(tensors_.size()); }
  const TensorSpec& tensor(int id) const { return tensors_[id]; }
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  int64_t bytes(int id) const;
  int64_t total_bytes() const { return total_bytes_; }

  // Stable 64-bit hash of names, counts, dtypes and memory kinds in order
  // (FNV-1a over a fixed little-endian encoding): equal on every rank and
  // every build for equal layouts.
  uint64_t Hash() const { return hash_; }

 private:
  std::vector<TensorSpec> tensors_;
  int64_t total_bytes_ = 0;
  uint64_t hash_ = 0;
};

}  // namespace fusebox::bucketing

#endif  // FUSEBOX_BUCKETING_LAYOUT_H_
