// Creates a communicator by backend name over a connected rendezvous.
#ifndef FUSEBOX_COMM_BACKENDS_H_
#define FUSEBOX_COMM_BACKENDS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/communicator.h"
#include "comm/options.h"
#include "comm/rendezvous.h"

namespace fusebox::comm {

// Backends compiled into this build ("ucx", "mpi", "nccl").
std::vector<std::string> AvailableBackends();

// `backend` is "ucx", "mpi" or "nccl". The MPI backend ignores `rdv` (it
// uses MPI_COMM_WORLD; MPI must be initialised). Unimplemented names the
// backends this build has.
absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    absl::string_view backend, const BackendOptions& options, Rendezvous& rdv);

// Sets every backend's collective timeout (UcxOptions::timeout and the
// others: how long one collective may wait for its peers).
void SetCollectiveTimeout(absl::Duration timeout, BackendOptions* options);

// An edge helper (pass ::getenv): applies FUSEBOX_TIMEOUT_S, when set, with
// SetCollectiveTimeout; an error names a bad value.
absl::Status CollectiveTimeoutFromEnv(const std::function<const char*(const char*)>& getenv,
                                      BackendOptions* options);

// How this process was started, decided from its environment (an edge
// helper: pass ::getenv). Under fusebox-run or torchrun (RANK set): the TCP
// rendezvous. Under mpirun (OMPI_COMM_WORLD_SIZE set): MPI is initialised and
// the MPI rendezvous is used; `mpi_initialized` is set so the caller can
// finalise. Otherwise: a single rank over an in-memory store.
struct Launch {
  Rendezvous rdv;
  bool mpi_initialized = false;
};
absl::StatusOr<Launch> ConnectFromEnvironment(
    const std::function<const char*(const char*)>& getenv, int* argc,
    char*** argv);
// Collective: every rank calls it once, after its last collective. Waits
// until no rank still needs the store (the rank hosting it, if any, leaves
// last), closes the store, and finalises MPI if ConnectFromEnvironment
// initialised it. With `after_failure` (this rank is exiting on an error;
// peers may be dead) it waits for nobody but the host's few seconds of
// grace, and leaves MPI unfinalised (MPI_Finalize would wait on dead ranks).
void ShutdownLaunch(Launch& launch, bool after_failure = false);

// Buffers in the memory a communicator works on (host, or CUDA device
// memory for NCCL). Plain host memory for MemoryKind::kHost.
class BufferOps {
 public:
  virtual ~BufferOps() = default;
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* p) = 0;
  virtual absl::Status Upload(void* dst, const void* host, size_t bytes) = 0;
  virtual absl::Status Download(void* host, const void* src, size_t bytes) = 0;
  virtual absl::Status Copy(void* dst, const void* src, size_t bytes) = 0;
};
absl::StatusOr<std::unique_ptr<BufferOps>> MakeBufferOps(MemoryKind kind);

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_BACKENDS_H_
