#include "comm/nccl/cuda_device.h"

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fusebox::comm {
namespace {

absl::Status Check(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return absl::OkStatus();
  const std::string what = absl::StrCat(call, ": ", cudaGetErrorString(e));
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
    return absl::UnavailableError(what);
  }
  return absl::InternalError(what);
}

class CudaStream final : public DeviceStream {
 public:
  CudaStream(int ordinal, cudaStream_t s) : ordinal_(ordinal), stream_(s) {}
  ~CudaStream() override {
    cudaSetDevice(ordinal_);
    cudaStreamSynchronize(stream_);  // Note [Device seam]: destroying waits
    cudaStreamDestroy(stream_);
  }
  cudaStream_t get() const { return stream_; }
  int ordinal() const { return ordinal_; }

 private:
  const int ordinal_;
  const cudaStream_t stream_;
};

class CudaEvent final : public DeviceEvent {
 public:
  explicit CudaEvent(cudaEvent_t e) : event_(e) {}
  ~CudaEvent() override { cudaEventDestroy(event_); }  // CUDA defers it past pending waits
  cudaEvent_t get() const { return event_; }

 private:
  const cudaEvent_t event_;
};

void CUDART_CB RunHostFunc(void* arg) {
  std::unique_ptr<std::function<void()>> fn(static_cast<std::function<void()>*>(arg));
  (*fn)();
}

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {}

  std::string name() const override { return absl::StrCat("cuda:", ordinal_); }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    if (absl::Status s = Current(); !s.ok()) return s;
    void* p = nullptr;
    if (absl::Status s = Check(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc"); !s.ok()) {
      return s;
    }
    return p;
  }
  void Free(void* ptr) override {
    if (ptr == nullptr) return;
    cudaSetDevice(ordinal_);
    cudaFree(ptr);
  }
  absl::StatusOr<void*> AllocateHost(size_t bytes) override {
    if (absl::Status s = Current(); !s.ok()) return s;
    void* p = nullptr;  // page-locked, so that async copies need no bounce buffer
    if (absl::Status s = Check(cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocDefault),
                               "cudaHostAlloc");
        !s.ok()) {
      return s;
    }
    return p;
  }
  void FreeHost(void* ptr) override {
    if (ptr != nullptr) cudaFreeHost(ptr);
  }

  absl::StatusOr<std::unique_ptr<DeviceStream>> CreateStream() override {
    if (absl::Status s = Current(); !s.ok()) return s;
    cudaStream_t s = nullptr;
    if (absl::Status st = Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                                "cudaStreamCreateWithFlags");
        !st.ok()) {
      return st;
    }
    return std::unique_ptr<DeviceStream>(new CudaStream(ordinal_, s));
  }

  absl::Status CopyAsync(void* dst, const void* src, size_t bytes, DeviceStream& stream) override {
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr || src == nullptr) {
      return absl::InvalidArgumentError("cuda device: copy with a null pointer");
    }
    CudaStream* s = Own(stream);
    if (s == nullptr) return NotOurs("stream");
    if (absl::Status st = Current(); !st.ok()) return st;
    return Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s->get()), "cudaMemcpyAsync");
  }

  absl::Status LaunchHostFunc(DeviceStream& stream, std::function<void()> fn) override {
    if (!fn) return absl::InvalidArgumentError("cuda device: empty host function");
    CudaStream* s = Own(stream);
    if (s == nullptr) return NotOurs("stream");
    if (absl::Status st = Current(); !st.ok()) return st;
    auto* arg = new std::function<void()>(std::move(fn));
    absl::Status st = Check(cudaLaunchHostFunc(s->get(), RunHostFunc, arg), "cudaLaunchHostFunc");
    if (!st.ok()) delete arg;
    return st;
  }

  absl::StatusOr<std::shared_ptr<DeviceEvent>> RecordEvent(DeviceStream& stream) override {
    CudaStream* s = Own(stream);
    if (s == nullptr) return NotOurs("stream");
    if (absl::Status st = Current(); !st.ok()) return st;
    cudaEvent_t e = nullptr;
    if (absl::Status st = Check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                                "cudaEventCreateWithFlags");
        !st.ok()) {
      return st;
    }
    auto event = std::make_shared<CudaEvent>(e);
    if (absl::Status st = Check(cudaEventRecord(e, s->get()), "cudaEventRecord"); !st.ok()) {
      return st;
    }
    return std::shared_ptr<DeviceEvent>(std::move(event));
  }

  absl::Status WaitEvent(DeviceStream& stream, const DeviceEvent& event) override {
    CudaStream* s = Own(stream);
    if (s == nullptr) return NotOurs("stream");
    const auto* e = dynamic_cast<const CudaEvent*>(&event);
    if (e == nullptr) return NotOurs("event");
    if (absl::Status st = Current(); !st.ok()) return st;
    return Check(cudaStreamWaitEvent(s->get(), e->get(), 0), "cudaStreamWaitEvent");
  }

  absl::StatusOr<bool> EventDone(const DeviceEvent& event) override {
    const auto* e = dynamic_cast<const CudaEvent*>(&event);
    if (e == nullptr) return NotOurs("event");
    const cudaError_t r = cudaEventQuery(e->get());
    if (r == cudaErrorNotReady) {
      cudaGetLastError();  // not an error: clear it
      return false;
    }
    if (absl::Status st = Check(r, "cudaEventQuery"); !st.ok()) return st;
    return true;
  }

  absl::Status SynchronizeEvent(const DeviceEvent& event) override {
    const auto* e = dynamic_cast<const CudaEvent*>(&event);
    if (e == nullptr) return NotOurs("event");
    return Check(cudaEventSynchronize(e->get()), "cudaEventSynchronize");
  }

  absl::Status SynchronizeStream(DeviceStream& stream) override {
    CudaStream* s = Own(stream);
    if (s == nullptr) return NotOurs("stream");
    return Check(cudaStreamSynchronize(s->get()), "cudaStreamSynchronize");
  }

 private:
  absl::Status Current() const { return Check(cudaSetDevice(ordinal_), "cudaSetDevice"); }
  CudaStream* Own(DeviceStream& stream) const {
    auto* s = dynamic_cast<CudaStream*>(&stream);
    return s != nullptr && s->ordinal() == ordinal_ ? s : nullptr;
  }
  static absl::Status NotOurs(const char* what) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda device: the ", what, " belongs to another device"));
  }

  const int ordinal_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal) {
  int count = 0;
  if (absl::Status s = Check(cudaGetDeviceCount(&count), "cudaGetDeviceCount"); !s.ok()) {
    cudaGetLastError();
    return s;
  }
  if (ordinal < 0 || ordinal >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda device ", ordinal, ": there are ", count, " devices"));
  }
  return std::unique_ptr<Device>(new CudaDevice(ordinal));
}

CUstream_st* CudaStreamOf(DeviceStream& stream) {
  auto* s = dynamic_cast<CudaStream*>(&stream);
  return s == nullptr ? nullptr : s->get();
}

CUevent_st* CudaEventOf(const DeviceEvent& event) {
  const auto* e = dynamic_cast<const CudaEvent*>(&event);
  return e == nullptr ? nullptr : e->get();
}

}  // namespace fusebox::comm
