#include "comm/backends.h"

#include "absl/strings/str_cat.h"
#include <algorithm>

#include "absl/strings/str_join.h"
#include "fusebox/config.h"

#if FUSEBOX_WITH_UCX
#include "comm/ucx/communicator.h"
#endif
#if FUSEBOX_WITH_MPI
#include "comm/mpi/communicator.h"
#include "comm/mpi/rendezvous.h"
#endif
#if FUSEBOX_WITH_NCCL
#include <cuda_runtime_api.h>

#include "comm/nccl/communicator.h"
#include "comm/nccl/cuda_device.h"
#endif
#include <cstdlib>
#include <cstring>

#include "comm/host_pages.h"
#include "comm/memory_store.h"

namespace fusebox::comm {

std::vector<std::string> AvailableBackends() {
  std::vector<std::string> out;
#if FUSEBOX_WITH_UCX
  out.push_back("ucx");
#endif
#if FUSEBOX_WITH_MPI
  out.push_back("mpi");
#endif
#if FUSEBOX_WITH_NCCL
  out.push_back("nccl");
#endif
  return out;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    absl::string_view backend, const BackendOptions& options, Rendezvous& rdv) {
#if FUSEBOX_WITH_UCX
  if (backend == "ucx") {
    return CreateUcxCommunicator(options.ucx, rdv.rank, rdv.size, *rdv.store);
  }
#endif
#if FUSEBOX_WITH_MPI
  if (backend == "mpi") return CreateMpiCommunicator(options.mpi, rdv.store.get());
#endif
#if FUSEBOX_WITH_NCCL
  if (backend == "nccl") {
    return CreateNcclCommunicator(options.nccl, rdv.rank, rdv.size,
                                  rdv.local_rank, *rdv.store);
  }
#endif
  return absl::UnimplementedError(
      absl::StrCat("backend '", backend, "' is not available in this build (have: ",
                   absl::StrJoin(AvailableBackends(), ", "), ")"));
}

void SetCollectiveTimeout(absl::Duration timeout, BackendOptions* options) {
  options->ucx.timeout = timeout;
  options->mpi.timeout = timeout;
  options->nccl.timeout = timeout;
}

absl::Status CollectiveTimeoutFromEnv(const std::function<const char*(const char*)>& getenv,
                                      BackendOptions* options) {
  auto timeout = SecondsFromEnv(getenv, "FUSEBOX_TIMEOUT_S");
  if (!timeout.ok()) return timeout.status();
  if (timeout->has_value()) SetCollectiveTimeout(**timeout, options);
  return absl::OkStatus();
}

absl::StatusOr<Launch> ConnectFromEnvironment(
    const std::function<const char*(const char*)>& getenv, int* argc,
    char*** argv) {
  Launch launch;
  auto opts = RendezvousOptionsFromEnv(getenv);
  if (opts.ok()) {
    auto rdv = ConnectTcpRendezvous(*opts);
    if (!rdv.ok()) return rdv.status();
    launch.rdv = *std::move(rdv);
    return launch;
  }
  if (!absl::IsNotFound(opts.status())) return opts.status();
  if (getenv("OMPI_COMM_WORLD_SIZE") != nullptr) {
#if FUSEBOX_WITH_MPI
    if (absl::Status s = InitMpi(argc, argv); !s.ok()) return s;
    launch.mpi_initialized = true;
    absl::Duration timeout = absl::Seconds(300);
    auto rdv = ConnectMpiRendezvous(timeout);
    if (!rdv.ok()) return rdv.status();
    launch.rdv = *std::move(rdv);
    return launch;
#else
    return absl::UnimplementedError(
        "started by mpirun, but this build has no MPI support (FUSEBOX_WITH_MPI=OFF)");
#endif
  }
  launch.rdv.rank = 0;
  launch.rdv.size = 1;
  launch.rdv.store = std::make_unique<MemoryStore>();
  return launch;
}

void ShutdownLaunch(Launch& launch, bool after_failure) {
  // The rank that hosts the store must outlive every other rank's last use of
  // it: everyone arrives, the others say they are leaving, and only then does
  // the host tear its server down. Best effort and bounded in time. After a
  // failure some ranks may never arrive: nobody waits for everyone, the
  // others leave at once, and the host keeps the store up a little longer
  // (until they have left, at most kFailedHostWait) so that peers still
  // running a post-mortem (comm/fault.h) can finish it.
  constexpr absl::Duration kFailedHostWait = absl::Seconds(5);
  Rendezvous& rdv = launch.rdv;
  if (rdv.store != nullptr && rdv.size > 1) {
    const absl::Time deadline = absl::Now() + (after_failure ? kFailedHostWait : absl::Seconds(60));
    PrefixStore arrive("fusebox/shutdown/arrive", *rdv.store);
    if (after_failure ||
        StoreAllGather(arrive, "shutdown", rdv.rank, rdv.size, "", deadline).ok()) {
      PrefixStore left("fusebox/shutdown/left", *rdv.store);
      if (rdv.server == nullptr) {
        left.Set(absl::StrCat(rdv.rank), "").IgnoreError();
      } else {
        std::vector<std::string> keys;
        for (int r = 0; r < rdv.size; ++r) {
          if (r != rdv.rank) keys.push_back(absl::StrCat(r));
        }
        left.Wait(keys, deadline).IgnoreError();
      }
    }
  }
  rdv.store.reset();
  rdv.server.reset();
#if FUSEBOX_WITH_MPI
  // MPI_Finalize synchronises with every rank: after a failure a dead one
  // would hang it. mpirun then reports that this rank did not finalise.
  if (launch.mpi_initialized && !after_failure) {
    FinalizeMpi();
    launch.mpi_initialized = false;
  }
#endif
}

namespace {

class HostBufferOps final : public BufferOps {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    absl::StatusOr<HostPages> p = AllocateHostPages(bytes);
    if (!p.ok()) return p.status();
    return p->release();  // freed by Free (std::free)
  }
  void Free(void* p) override { std::free(p); }
  absl::Status Upload(void* dst, const void* host, size_t bytes) override {
    if (bytes) std::memcpy(dst, host, bytes);
    return absl::OkStatus();
  }
  absl::Status Download(void* host, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(host, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
};

#if FUSEBOX_WITH_NCCL
// Note [Device copies before NCCL]
// BufferOps copies are complete when they return: the NCCL communicator
// runs on a non-blocking stream of its own, and nothing orders that stream
// after a copy except completion. So every copy goes through the device
// seam (Note [Device seam] in comm/device.h) on a copy stream and is
// synchronised before the call returns; only then may a collective on
// another stream read the buffer. (The old code used cudaMemcpy on the
// legacy default stream, which a non-blocking stream does not wait for, and
// a device-to-device cudaMemcpy may return before the copy is done.)
class DeviceBufferOps final : public BufferOps {
 public:
  static absl::StatusOr<std::unique_ptr<BufferOps>> Create() {
    int ordinal = 0;
    if (cudaError_t e = cudaGetDevice(&ordinal); e != cudaSuccess) {
      cudaGetLastError();
      return absl::UnavailableError(absl::StrCat("cudaGetDevice: ", cudaGetErrorString(e)));
    }
    absl::StatusOr<std::unique_ptr<Device>> dev = CreateCudaDevice(ordinal);
    if (!dev.ok()) return dev.status();
    absl::StatusOr<std::unique_ptr<DeviceStream>> stream = (*dev)->CreateStream();
    if (!stream.ok()) return stream.status();
    return std::unique_ptr<BufferOps>(new DeviceBufferOps(*std::move(dev), *std::move(stream)));
  }
  ~DeviceBufferOps() override { stream_.reset(); }

  absl::StatusOr<void*> Allocate(size_t bytes) override { return dev_->Allocate(bytes); }
  void Free(void* p) override { dev_->Free(p); }
  absl::Status Upload(void* dst, const void* host, size_t bytes) override {
    return CopyAndWait(dst, host, bytes);
  }
  absl::Status Download(void* host, const void* src, size_t bytes) override {
    return CopyAndWait(host, src, bytes);
  }
  absl::Status Copy(void* dst, const void* src, size_t bytes) override {
    return CopyAndWait(dst, src, bytes);
  }

 private:
  DeviceBufferOps(std::unique_ptr<Device> dev, std::unique_ptr<DeviceStream> stream)
      : dev_(std::move(dev)), stream_(std::move(stream)) {}
  absl::Status CopyAndWait(void* dst, const void* src, size_t bytes) {
    if (absl::Status s = dev_->CopyAsync(dst, src, bytes, *stream_); !s.ok()) return s;
    return dev_->SynchronizeStream(*stream_);
  }

  std::unique_ptr<Device> dev_;
  std::unique_ptr<DeviceStream> stream_;  // destroyed before dev_
};
#endif

}  // namespace

absl::StatusOr<std::unique_ptr<BufferOps>> MakeBufferOps(MemoryKind kind) {
  if (kind == MemoryKind::kHost) return std::unique_ptr<BufferOps>(new HostBufferOps());
#if FUSEBOX_WITH_NCCL
  return DeviceBufferOps::Create();
#else
  return absl::UnimplementedError("device buffers need a build with CUDA (FUSEBOX_WITH_NCCL)");
#endif
}

}  // namespace fusebox::comm
