#include "bucketing/fusion_buffers.h"

#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace fusebox::bucketing {

namespace {

constexpr size_t kBufferAlignment = 64;

}  // namespace

std::vector<std::vector<Placement>> PlaceSlices(const Plan& plan, int tensors) {
  std::vector<std::vector<Placement>> placements(tensors);
  for (int b = 0; b < static_cast<int>(plan.buckets.size()); ++b) {
    int64_t offset = 0;
    for (const Slice& s : plan.buckets[b].slices) {
      placements[s.tensor].push_back(Placement{b, offset, s.offset, s.count});
      offset += s.count;
    }
  }
  return placements;
}

absl::StatusOr<std::shared_ptr<FusionBuffers>> FusionBuffers::Allocate(const Plan& plan,
                                                                       int vote_slots,
                                                                       comm::Device* device,
                                                                       bool on_device,
                                                                       bool allocate) {
  const int nb = static_cast<int>(plan.buckets.size());
  std::shared_ptr<FusionBuffers> buffers(new FusionBuffers());
  buffers->vote_slots_ = vote_slots;
  buffers->data_.assign(nb, nullptr);
  buffers->device_ = device;
  buffers->on_device_ = on_device;
  if (!allocate) return buffers;
  for (int b = 0; b < nb; ++b) {
    const Bucket& bucket = plan.buckets[b];
    const int64_t bytes =
        (bucket.count() + vote_slots) * static_cast<int64_t>(comm::DataTypeSize(bucket.dtype));
    if (bytes <= 0) continue;
    const size_t rounded = (static_cast<size_t>(bytes) + kBufferAlignment - 1) /
                           kBufferAlignment * kBufferAlignment;
    if (device != nullptr) {
      absl::StatusOr<void*> made =
          on_device ? device->Allocate(rounded) : device->AllocateHost(rounded);
      buffers->data_[b] = made.ok() ? static_cast<char*>(*made) : nullptr;
    } else {
      buffers->data_[b] = static_cast<char*>(std::aligned_alloc(kBufferAlignment, rounded));
    }
    if (buffers->data_[b] == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("engine: cannot allocate %d bytes for bucket %d", bytes, b));
    }
  }
  return buffers;
}

FusionBuffers::~FusionBuffers() {
  for (char* p : data_) {
    if (device_ == nullptr) {
      std::free(p);
    } else if (on_device_) {
      device_->Free(p);
    } else {
      device_->FreeHost(p);
    }
  }
}

std::vector<void*> TensorViews(const GradientLayout& layout,
                               const std::vector<std::vector<Placement>>& placements,
                               const FusionBuffers& buffers, bool views) {
  std::vector<void*> storage(layout.size(), nullptr);
  if (!views) return storage;
  for (int id = 0; id < layout.size(); ++id) {
    const auto& p = placements[id];
    if (layout.tensor(id).numel > 0 && p.size() == 1 && buffers.data(p[0].bucket) != nullptr) {
      storage[id] = buffers.data(p[0].bucket) +
                    p[0].buffer_offset * comm::DataTypeSize(layout.tensor(id).dtype);
    }
  }
  return storage;
}

}  // namespace fusebox::bucketing
