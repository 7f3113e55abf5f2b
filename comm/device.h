// The device seam: the few operations fusebox needs from an accelerator,
// behind one small interface, so that every ordering rule between streams
// is written once and tested on machines without a GPU.
//
// Note [Device seam]
// A Device owns memory and streams. A stream is an ordered queue of work
// (copies, host functions, waits on events); work on one stream runs in
// enqueue order, and work on different streams is unordered unless an event
// orders it: RecordEvent(a) marks everything enqueued on `a` so far, and
// WaitEvent(b, e) makes everything enqueued on `b` afterwards wait for it,
// without blocking the calling thread. This is CUDA's model (streams,
// cudaEventRecord, cudaStreamWaitEvent), and the rule every device path in
// fusebox follows is the one a missing event would break:
//
//   producer stream --event--> copy stream (copy-in) --event--> collective
//   stream --event--> copy stream (copy-back) --event--> consumer stream
//
// Two implementations:
//   * CUDA (comm/nccl/cuda_device.h, in builds with the NCCL backend):
//     cudaMalloc, cudaMemcpyAsync, cudaLaunchHostFunc, events.
//   * Emulated (CreateEmulatedDevice): "device memory" is host memory, each
//     stream is a worker thread that runs its queue in order, events are
//     fences. Optional delays before each operation make a stream run late,
//     so a test whose result depends on a missing WaitEvent fails instead
//     of passing by luck.
//
//   std::unique_ptr<Device> dev = CreateEmulatedDevice({});
//   auto copy = dev->CreateStream().value();
//   auto compute = dev->CreateStream().value();
//   dev->CopyAsync(dst, src, n, *copy);
//   auto ready = dev->RecordEvent(*copy).value();
//   dev->WaitEvent(*compute, *ready);          // compute's later work sees dst
//   dev->LaunchHostFunc(*compute, [&] { ... });
//   dev->SynchronizeStream(*compute);
#ifndef FUSEBOX_COMM_DEVICE_H_
#define FUSEBOX_COMM_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace fusebox::comm {

// An ordered queue of device work. Destroying a stream waits for the work
// enqueued on it. Only the Device that created it accepts it.
class DeviceStream {
 public:
  virtual ~DeviceStream() = default;
};

// A point in one stream's work: done once everything enqueued on that
// stream before RecordEvent is done. Shared: an event may outlive the call
// that waits on it.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
};

class Device {
 public:
  virtual ~Device() = default;

  // "cuda:0", "emulated".
  virtual std::string name() const = 0;

  // Device memory (zero bytes: a valid pointer that must not be read).
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  // Frees what Allocate returned (nullptr: nothing). The caller makes sure
  // no enqueued work still uses it (synchronise first).
  virtual void Free(void* ptr) = 0;
  // Host memory that asynchronous copies to and from the device can use
  // without an intermediate copy (CUDA: page-locked, cudaHostAlloc), for
  // staging buffers. Aligned to at least 64 bytes. FreeHost has Free's rules.
  virtual absl::StatusOr<void*> AllocateHost(size_t bytes) = 0;
  virtual void FreeHost(void* ptr) = 0;

  virtual absl::StatusOr<std::unique_ptr<DeviceStream>> CreateStream() = 0;

  // Enqueues a copy of `bytes` from `src` to `dst` (device or host memory,
  // either way) on `stream`; returns at once. Both ranges stay valid and
  // `src` unchanged until the copy is done (an event or a synchronise says
  // when).
  virtual absl::Status CopyAsync(void* dst, const void* src, size_t bytes,
                                 DeviceStream& stream) = 0;
  // Enqueues `fn` to run on a host thread in stream order: after the work
  // enqueued before it, before the work enqueued after it. `fn` must not
  // call the Device (CUDA forbids it in host functions).
  virtual absl::Status LaunchHostFunc(DeviceStream& stream, std::function<void()> fn) = 0;

  virtual absl::StatusOr<std::shared_ptr<DeviceEvent>> RecordEvent(DeviceStream& stream) = 0;
  // Work enqueued on `stream` after this call waits for `event`; the
  // calling thread does not.
  virtual absl::Status WaitEvent(DeviceStream& stream, const DeviceEvent& event) = 0;
  // Whether the event is done (never blocks).
  virtual absl::StatusOr<bool> EventDone(const DeviceEvent& event) = 0;
  // Blocks the calling thread until the event, or everything enqueued on
  // the stream so far, is done.
  virtual absl::Status SynchronizeEvent(const DeviceEvent& event) = 0;
  virtual absl::Status SynchronizeStream(DeviceStream& stream) = 0;
};

struct EmulatedDeviceOptions {
  // Every operation a stream runs (copy, host function, event) first sleeps
  // this long: a stream that runs late.
  absl::Duration op_delay = absl::ZeroDuration();
  // And additionally a uniformly random time in [0, max_random_delay],
  // drawn per operation from `seed` (streams get their own sequences).
  absl::Duration max_random_delay = absl::ZeroDuration();
  uint64_t seed = 1;
  // Stream k (in creation order) sleeps op_delay * (1 + k * stagger) per
  // operation, so that later streams run later still. 0: all alike.
  double stagger = 0;
};

// A device emulated on the host (Note [Device seam]). Thread-safe.
std::unique_ptr<Device> CreateEmulatedDevice(EmulatedDeviceOptions options);

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_DEVICE_H_
