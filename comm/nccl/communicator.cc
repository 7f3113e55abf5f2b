// NCCL backend. See comm/nccl/communicator.h for the contract.
//
// Note [NCCL completion]
// Callers launch NCCL operations on the communicator's stream directly (under
// mu_, which orders concurrent callers and keeps the ncclComm single-threaded)
// and record a CUDA event after each one. One completion thread per
// communicator waits for those events in issue order by polling
// cudaEventQuery, checking ncclCommGetAsyncError as it waits so that a
// failed peer or network error completes the Work with an error instead of
// leaving it pending forever. After such an error the communicator is broken:
// every queued and later Work fails, and the destructor aborts (rather than
// destroys) the ncclComm. An operation still incomplete options.timeout
// after its launch (a peer died or stalled: NCCL itself would wait forever)
// fails with DeadlineExceeded, and the completion thread aborts the ncclComm
// at once (ncclCommAbort, under mu_ so no caller is using it), which also
// stops the kernels spinning on the dead peer.
//
// Unlike the MPI backend this one does not check peers' descriptors before
// each collective (Note [Collective ordering]): that would cost a device
// round trip and a host synchronisation per call. Mismatched calls behave as
// in NCCL itself (undefined; typically a hang that ncclCommGetAsyncError may
// report). ncclAvg is NCCL's: integers sum then divide, but floating types
// pre-multiply by 1/size, which is exact only for power-of-two world sizes.
#include "comm/nccl/communicator.h"
#include "comm/nccl/cuda_device.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace fusebox::comm {
namespace {

absl::Status CudaError(absl::string_view what, cudaError_t e) {
  return absl::InternalError(absl::StrCat(what, " failed: ", cudaGetErrorName(e),
                                          ": ", cudaGetErrorString(e)));
}

absl::Status NcclError(absl::string_view what, ncclResult_t r, ncclComm_t comm) {
  std::string detail;
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && last[0] != '\0') detail = absl::StrCat(" (", last, ")");
  }
  const std::string msg =
      absl::StrCat(what, " failed: ", ncclGetErrorString(r), detail);
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage: return absl::InvalidArgumentError(msg);
    case ncclRemoteError:
    case ncclSystemError: return absl::UnavailableError(msg);
    default: return absl::InternalError(msg);
  }
}

struct StreamDeleter {
  void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
};
struct EventDeleter {
  void operator()(cudaEvent_t e) const { cudaEventDestroy(e); }
};
struct DeviceDeleter {
  void operator()(void* p) const { cudaFree(p); }
};
using UniqueStream = std::unique_ptr<CUstream_st, StreamDeleter>;
using UniqueEvent = std::unique_ptr<CUevent_st, EventDeleter>;
using UniqueDeviceBuffer = std::unique_ptr<void, DeviceDeleter>;

// Owns an ncclComm: destroyed normally, or aborted once an error made
// destroying it unsafe (ncclCommDestroy may wait on hung kernels).
class UniqueNcclComm {
 public:
  UniqueNcclComm() = default;
  explicit UniqueNcclComm(ncclComm_t c) : comm_(c) {}
  ~UniqueNcclComm() { Reset(/*abort=*/false); }
  UniqueNcclComm(UniqueNcclComm&& other) noexcept
      : comm_(std::exchange(other.comm_, nullptr)) {}
  UniqueNcclComm& operator=(UniqueNcclComm&& other) noexcept {
    if (this != &other) {
      Reset(/*abort=*/false);
      comm_ = std::exchange(other.comm_, nullptr);
    }
    return *this;
  }
  UniqueNcclComm(const UniqueNcclComm&) = delete;
  UniqueNcclComm& operator=(const UniqueNcclComm&) = delete;
  ncclComm_t get() const { return comm_; }
  void Reset(bool abort) {
    if (comm_ == nullptr) return;
    if (abort) {
      ncclCommAbort(comm_);
    } else {
      ncclCommDestroy(comm_);
    }
    comm_ = nullptr;
  }

 private:
  ncclComm_t comm_ = nullptr;
};

// Makes `device` current for the scope and restores the caller's device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    int now = -1;
    if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) {
      cudaSetDevice(previous_);
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

ncclDataType_t NcclType(DataType t) {
  switch (t) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
    case DataType::kUInt8: return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProd: return ncclProd;
  }
  return ncclSum;
}

class NcclCommunicator final : public Communicator {
 public:
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      const NcclOptions& options, int rank, int size, int local_rank,
      Store& store);

  // Waits for every launched operation, joins the completion thread, then
  // destroys (or, if broken, aborts) the ncclComm.
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  MemoryKind memory() const override { return MemoryKind::kDevice; }
  // The seam's CUDA device on this communicator's GPU: events recorded on
  // its streams are what AllReduceAfter waits for.
  Device* device() const override { return cuda_.get(); }

 protected:
  // Note [One front door] (comm/communicator.h): the arguments are checked.
  absl::StatusOr<std::shared_ptr<Work>> DoIssue(const CollectiveArgs& a) override;
  // Note [Device communicators]: cudaStreamWaitEvent on this
  // communicator's stream, then the allreduce, under one lock.
  absl::StatusOr<std::shared_ptr<Work>> DoAllReduceAfter(const DeviceEvent& ready,
                                                         const CollectiveArgs& a) override;
  // One group: NCCL fuses the launches and the Work covers all tensors.
  absl::StatusOr<std::shared_ptr<Work>> DoAllReduceMulti(absl::Span<const TensorRef> tensors,
                                                         ReduceOp op) override;

 private:
  struct InFlight {
    UniqueEvent event;
    std::shared_ptr<Work> work;
    absl::Time deadline;  // launch time + timeout
  };

  NcclCommunicator(absl::Duration timeout, int rank, int size, int device, UniqueNcclComm comm,
                   UniqueStream stream, UniqueDeviceBuffer scratch, std::unique_ptr<Device> cuda)
      : timeout_(timeout),
        rank_(rank),
        size_(size),
        device_(device),
        comm_(std::move(comm)),
        stream_(std::move(stream)),
        scratch_(std::move(scratch)),
        cuda_(std::move(cuda)) {}

  // Runs `launch` (NCCL calls on stream_) under mu_ with device_ current,
  // records an event and queues the Work. `what` names the call in errors.
  absl::StatusOr<std::shared_ptr<Work>> Launch(
      const char* what, absl::FunctionRef<ncclResult_t()> launch);
  // AllReduce and AllReduceAfter: the allreduce on stream_, behind
  // `wait_for` when it is not null.
  absl::StatusOr<std::shared_ptr<Work>> LaunchAllReduce(cudaEvent_t wait_for, const void* send,
                                                        void* recv, size_t count, DataType type,
                                                        ReduceOp op);
  // Barrier: a one-float allreduce of scratch_.
  absl::StatusOr<std::shared_ptr<Work>> LaunchBarrier();
  // Completion thread (Note [NCCL completion]).
  void Run();
  // Waits for `event`; an error if it or the communicator failed, or
  // `deadline` passes.
  absl::Status WaitEvent(cudaEvent_t event, absl::Time deadline);

  const absl::Duration timeout_;
  const int rank_;
  const int size_;
  const int device_;
  UniqueNcclComm comm_;
  UniqueStream stream_;
  UniqueDeviceBuffer scratch_;  // one float for Barrier
  const std::unique_ptr<Device> cuda_;  // the seam's device on device_

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<InFlight> in_flight_;       // guarded by mu_
  std::vector<UniqueEvent> free_events_; // guarded by mu_
  bool stopping_ = false;                // guarded by mu_
  absl::Status broken_;                  // guarded by mu_

  std::thread thread_;  // started last, joined first
};

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const NcclOptions& options, int rank, int size, int local_rank,
    Store& store) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL: rank ", rank, " is out of range for size ", size));
  }
  if (absl::Status s = ValidateCollectiveTimeout("NCCL", options.timeout); !s.ok()) return s;
  absl::Status s = CudaAvailable();
  if (!s.ok()) return s;
  int devices = 0;
  cudaGetDeviceCount(&devices);
  const int device = options.device >= 0 ? options.device : local_rank;
  if (device < 0 || device >= devices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NCCL: device ", device, " is out of range (", devices,
        " visible CUDA devices)"));
  }
  DeviceGuard guard(device);

  // Each rank counts the NCCL communicators it has built over this store, so
  // that the n-th communicator of every rank meets under "nccl/id/<n>" and a
  // stale id from an earlier one is never read.
  absl::StatusOr<int64_t> generation = store.Add(absl::StrCat("nccl/comms/", rank), 1);
  if (!generation.ok()) return generation.status();
  const std::string key = absl::StrCat("nccl/id/", *generation);

  ncclUniqueId id;
  static_assert(sizeof(id.internal) == sizeof(id), "ncclUniqueId layout");
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return NcclError("ncclGetUniqueId", r, nullptr);
    s = store.Set(key, absl::string_view(id.internal, sizeof(id.internal)));
    if (!s.ok()) return s;
  } else {
    absl::StatusOr<std::string> v =
        store.Get(key, absl::Now() + options.rendezvous_timeout);
    if (!v.ok()) return v.status();
    if (v->size() != sizeof(id.internal)) {
      return absl::DataLossError(absl::StrCat(
          "NCCL: store key '", key, "' holds ", v->size(),
          " bytes, not an ncclUniqueId (", sizeof(id.internal), " bytes)"));
    }
    std::memcpy(id.internal, v->data(), sizeof(id.internal));
  }

  ncclComm_t raw = nullptr;
  ncclResult_t r = ncclCommInitRank(&raw, size, id, rank);
  if (r != ncclSuccess) return NcclError("ncclCommInitRank", r, nullptr);
  UniqueNcclComm comm(raw);

  cudaStream_t stream = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) return CudaError("cudaStreamCreateWithFlags", e);
  UniqueStream owned_stream(stream);

  void* scratch = nullptr;
  e = cudaMalloc(&scratch, sizeof(float));
  if (e != cudaSuccess) return CudaError("cudaMalloc", e);
  UniqueDeviceBuffer owned_scratch(scratch);
  e = cudaMemset(scratch, 0, sizeof(float));
  if (e != cudaSuccess) return CudaError("cudaMemset", e);

  absl::StatusOr<std::unique_ptr<Device>> cuda = CreateCudaDevice(device);
  if (!cuda.ok()) return cuda.status();

  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(
      options.timeout, rank, size, device, std::move(comm), std::move(owned_stream),
      std::move(owned_scratch), *std::move(cuda)));
  c->thread_ = std::thread([p = c.get()] { p->Run(); });
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  DeviceGuard guard(device_);
  bool broken;
  {
    std::lock_guard<std::mutex> lock(mu_);
    broken = !broken_.ok();
  }
  comm_.Reset(/*abort=*/broken);
  free_events_.clear();
  scratch_.reset();
  stream_.reset();
}

absl::StatusOr<std::shared_ptr<Work>> NcclCommunicator::Launch(
    const char* what, absl::FunctionRef<ncclResult_t()> launch) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.ok()) return Work::Done(broken_);
  DeviceGuard guard(device_);
  UniqueEvent event;
  if (!free_events_.empty()) {
    event = std::move(free_events_.back());
    free_events_.pop_back();
  } else {
    cudaEvent_t raw = nullptr;
    cudaError_t e = cudaEventCreateWithFlags(&raw, cudaEventDisableTiming);
    if (e != cudaSuccess) return CudaError("cudaEventCreateWithFlags", e);
    event.reset(raw);
  }
  ncclResult_t r = launch();
  if (r != ncclSuccess) {
    absl::Status s = NcclError(what, r, comm_.get());
    if (absl::IsInvalidArgument(s)) return s;  // nothing was launched
    broken_ = s;
    return Work::Done(s);
  }
  cudaError_t e = cudaEventRecord(event.get(), stream_.get());
  if (e != cudaSuccess) {
    broken_ = CudaError("cudaEventRecord", e);
    return Work::Done(broken_);
  }
  auto work = std::make_shared<Work>();
  in_flight_.push_back(InFlight{std::move(event), work, absl::Now() + timeout_});
  cv_.notify_one();
  return work;
}

absl::Status NcclCommunicator::WaitEvent(cudaEvent_t event, absl::Time deadline) {
  for (int polls = 0;; ++polls) {
    const cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) return CudaError("waiting for an NCCL operation", e);
    if (polls % 64 == 63) {
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "rank ", rank_, ": NCCL operation not complete after ", absl::FormatDuration(timeout_),
            " (a peer died or stalled, or ranks issued different collectives); the "
            "communicator is aborted (ncclCommAbort)"));
      }
      ncclResult_t async = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_.get(), &async);
      if (r != ncclSuccess) return NcclError("ncclCommGetAsyncError", r, comm_.get());
      if (async != ncclSuccess && async != ncclInProgress) {
        return NcclError("NCCL operation", async, comm_.get());
      }
    }
    // Short waits spin (collectives of a few KB take microseconds); long
    // ones sleep so the thread does not burn a core.
    if (polls < 2000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

void NcclCommunicator::Run() {
  cudaSetDevice(device_);
  for (;;) {
    cudaEvent_t event;
    absl::Time deadline;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !in_flight_.empty(); });
      if (in_flight_.empty()) return;  // stopping_ and drained
      event = in_flight_.front().event.get();
      deadline = in_flight_.front().deadline;
    }
    absl::Status s = WaitEvent(event, deadline);
    std::vector<std::shared_ptr<Work>> done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (s.ok()) {
        InFlight front = std::move(in_flight_.front());
        in_flight_.pop_front();
        free_events_.push_back(std::move(front.event));
        done.push_back(std::move(front.work));
      } else {
        // Later operations cannot finish on a failed communicator.
        broken_ = s;
        if (absl::IsDeadlineExceeded(s)) comm_.Reset(/*abort=*/true);
        for (InFlight& f : in_flight_) done.push_back(std::move(f.work));
        in_flight_.clear();
      }
    }
    for (auto& w : done) w->Complete(s);
  }
}

absl::StatusOr<std::shared_ptr<Work>> NcclCommunicator::DoIssue(const CollectiveArgs& a) {
  switch (a.kind) {
    case CollectiveKind::kAllReduce:
      return LaunchAllReduce(nullptr, a.send, a.recv, a.count, a.type, a.op);
    case CollectiveKind::kBroadcast:
      return Launch("ncclBroadcast", [&] {
        return ncclBroadcast(a.recv, a.recv, a.count, NcclType(a.type), a.root, comm_.get(),
                             stream_.get());
      });
    case CollectiveKind::kAllGather:
      // NCCL treats send == recv + rank*count*size as in place, as we do.
      return Launch("ncclAllGather", [&] {
        return ncclAllGather(a.send, a.recv, a.count, NcclType(a.type), comm_.get(),
                             stream_.get());
      });
    case CollectiveKind::kBarrier:
      return LaunchBarrier();
  }
  return absl::InvalidArgumentError("unknown collective kind");
}

absl::StatusOr<std::shared_ptr<Work>> NcclCommunicator::DoAllReduceAfter(
    const DeviceEvent& ready, const CollectiveArgs& a) {
  cudaEvent_t event = CudaEventOf(ready);
  if (event == nullptr) {
    return absl::InvalidArgumentError(
        "AllReduceAfter: the event is not one of this NCCL communicator's CUDA device "
        "(device())");
  }
  return LaunchAllReduce(event, a.send, a.recv, a.count, a.type, a.op);
}

absl::StatusOr<std::shared_ptr<Work>> NcclCommunicator::LaunchAllReduce(
    cudaEvent_t wait_for, const void* send, void* recv, size_t count, DataType type,
    ReduceOp op) {
  cudaError_t waited = cudaSuccess;
  auto launched = Launch("ncclAllReduce", [&] {
    // Under the launch lock: nothing else is enqueued between the wait and
    // the allreduce.
    if (wait_for != nullptr) {
      waited = cudaStreamWaitEvent(stream_.get(), wait_for, 0);
      if (waited != cudaSuccess) return ncclInvalidArgument;
    }
    return ncclAllReduce(send, recv, count, NcclType(type), NcclOp(op), comm_.get(),
                         stream_.get());
  });
  if (waited != cudaSuccess) return CudaError("cudaStreamWaitEvent", waited);
  return launched;
}

absl::StatusOr<std::shared_ptr<Work>> NcclCommunicator::DoAllReduceMulti(
    absl::Span<const TensorRef> tensors, ReduceOp op) {
  return Launch("ncclAllReduce (grouped)", [&] {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return r;
    for (const TensorRef& t : tensors) {
      if (t.count == 0) continue;
      r = ncclAllReduce(t.data, t.data, t.count, NcclType(t.type), NcclOp(op),
                        comm_.get(), stream_.get());
      if (r != ncclSuccess) break;
    }
    const ncclResult_t end = ncclGroupEnd();  // always closes the group
    return r != ncclSuccess ? r : end;
  });
}

absl::StatusOr<std::shared_ptr<Work>> NcclCommunicator::LaunchBarrier() {
  return Launch("ncclAllReduce (barrier)", [&] {
    return ncclAllReduce(scratch_.get(), scratch_.get(), 1, ncclFloat32,
                         ncclSum, comm_.get(), stream_.get());
  });
}

}  // namespace

absl::Status CudaAvailable() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error for later callers
    std::string why;
    if (e == cudaErrorInsufficientDriver) {
      why = "no usable CUDA driver";
    } else if (e == cudaErrorNoDevice) {
      why = "no CUDA device";
    } else {
      why = "CUDA cannot be initialised";
    }
    return absl::UnavailableError(absl::StrCat(
        why, " (cudaGetDeviceCount: ", cudaGetErrorName(e), " = ",
        static_cast<int>(e), ": ", cudaGetErrorString(e), ")"));
  }
  if (n == 0) {
    return absl::UnavailableError("no CUDA device (cudaGetDeviceCount returned 0)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    const NcclOptions& options, int rank, int size, int local_rank,
    Store& store) {
  auto c = NcclCommunicator::Create(options, rank, size, local_rank, store);
  if (!c.ok()) return c.status();
  return std::unique_ptr<Communicator>(*std::move(c));
}

}  // namespace fusebox::comm
