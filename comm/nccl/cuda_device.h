// The CUDA implementation of the device seam (comm/device.h), built with
// the NCCL backend.
#ifndef FUSEBOX_COMM_NCCL_CUDA_DEVICE_H_
#define FUSEBOX_COMM_NCCL_CUDA_DEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "comm/device.h"

struct CUstream_st;  // cudaStream_t is CUstream_st* (no CUDA header needed here)
struct CUevent_st;   // cudaEvent_t is CUevent_st*

namespace fusebox::comm {

// CUDA device `ordinal`: memory from cudaMalloc, streams created
// non-blocking (they do not synchronise with the legacy default stream,
// so every order between them is an event's), copies by cudaMemcpyAsync,
// host functions by cudaLaunchHostFunc. Unavailable (naming the CUDA call)
// where no device or driver is present. Every call makes `ordinal` the
// calling thread's current device first.
absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal);

// The CUDA stream behind a stream of a CUDA device (for ncclAllReduce and
// kernels); nullptr for a stream of another device.
CUstream_st* CudaStreamOf(DeviceStream& stream);

// The CUDA event behind an event of a CUDA device (for cudaStreamWaitEvent
// on a stream of one's own); nullptr for an event of another device.
CUevent_st* CudaEventOf(const DeviceEvent& event);

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_NCCL_CUDA_DEVICE_H_
