// Fusion buffers: the memory each bucket's allreduce runs on, where a
// tensor's slices sit in it, and which tensors can be computed in place
// there (views). The engine (bucketing/engine.h) copies gradients in and
// results back; this unit only places and owns the memory.
//
// Note [Fusion buffers and views]
// Each bucket owns a fusion buffer holding its slices back to back. A
// tensor that lies whole in one bucket has a stable address there
// (TensorStorage); a caller that computes the gradient in place there
// ("gradient as bucket view") passes that address to MarkReady and nothing
// is copied in or out: the average is computed in place. Otherwise
// MarkReady copies the gradient in, and completion writes the average back
// to the caller's buffer, which must stay valid and untouched until
// Finish() returns.
// With EngineOptions::external_buffers the engine allocates no fusion
// buffers: the caller owns each bucket's memory, already packed in the
// plan's slice order (a DDP bucket that the plan maps 1:1), and hands it
// over whole with MarkBucketReady. The collective runs in place on it, so
// nothing is copied in or out; such plans must not split tensors.
// Under the forward-priority schedule each buffer has room for the votes
// after the bucket's data (Note [Launch order] in launch_order.h).
#ifndef FUSEBOX_BUCKETING_FUSION_BUFFERS_H_
#define FUSEBOX_BUCKETING_FUSION_BUFFERS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "bucketing/layout.h"
#include "bucketing/plan.h"
#include "comm/device.h"

namespace fusebox::bucketing {

// One slice of a tensor: where it sits in a bucket.
struct Placement {
  int bucket;
  int64_t buffer_offset;  // elements into the bucket's buffer
  int64_t tensor_offset;
  int64_t count;
};

// Per tensor (ids 0..tensors-1): where its slices sit in `plan`'s buckets,
// in plan order.
std::vector<std::vector<Placement>> PlaceSlices(const Plan& plan, int tensors);

// One buffer per bucket. Shared with the completion callbacks of in-flight
// collectives so that memory a backend may still write to outlives the
// engine if a collective never completes before it is destroyed.
class FusionBuffers {
 public:
  // A buffer per bucket of `plan` for its elements and `vote_slots` more,
  // 64-byte aligned; none for a bucket of no elements and votes, and none
  // at all unless `allocate` (external buffers: the caller's memory). From
  // the heap when `device` is null; else the device's host memory
  // (AllocateHost: staging) or, with `on_device`, its memory (Allocate).
  // ResourceExhausted names the bucket that failed (what was allocated is
  // freed).
  static absl::StatusOr<std::shared_ptr<FusionBuffers>> Allocate(const Plan& plan,
                                                                 int vote_slots,
                                                                 comm::Device* device,
                                                                 bool on_device, bool allocate);
  ~FusionBuffers();
  FusionBuffers(const FusionBuffers&) = delete;
  FusionBuffers& operator=(const FusionBuffers&) = delete;

  // Bucket `b`'s buffer; nullptr for none.
  char* data(int b) const { return data_[b]; }
  // Vote elements per bucket, after its data.
  int vote_slots() const { return vote_slots_; }
  // Where bucket `b` (the plan's `bucket`) keeps its votes: after its data.
  char* votes(int b, const Bucket& bucket) const {
    return data_[b] + bucket.count() * comm::DataTypeSize(bucket.dtype);
  }

 private:
  FusionBuffers() = default;
  std::vector<char*> data_;  // per bucket; nullptr for empty buckets
  int vote_slots_ = 0;
  // Staging buffers for device gradients come from the device
  // (AllocateHost), and with a device communicator the buffers are device
  // memory (Allocate).
  comm::Device* device_ = nullptr;
  bool on_device_ = false;
};

// Per tensor: its address in `buffers` where it lies whole in one bucket
// (TensorStorage: a view), else null (split, zero-size, no buffer). With
// !views (staging buffers are no place for a device gradient) all null.
std::vector<void*> TensorViews(const GradientLayout& layout,
                               const std::vector<std::vector<Placement>>& placements,
                               const FusionBuffers& buffers, bool views);

}  // namespace fusebox::bucketing

#endif  // FUSEBOX_BUCKETING_FUSION_BUFFERS_H_
