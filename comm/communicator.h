// comm::Communicator: the backend-neutral collective interface.
//
// Note [Collective ordering]
// Every rank must issue the same collectives in the same order (as with MPI
// and NCCL). The host backends (UCX, MPI) number collectives per communicator
// and check that the peers' descriptors (kind, count, type, op, root) agree; a
// disagreement completes the Work on every rank with an error naming both
// sides, never a hang or silent corruption. (NCCL does not check: see
// comm/nccl/communicator.h.) Collectives issued on one communicator complete
// in issue order.
#ifndef FUSEBOX_COMM_COMMUNICATOR_H_
#define FUSEBOX_COMM_COMMUNICATOR_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "comm/device.h"
#include "comm/types.h"
#include "comm/work.h"

namespace fusebox::comm {

enum class MemoryKind : uint8_t { kHost, kDevice };

// One buffer of a multi-tensor call.
struct TensorRef {
  void* data = nullptr;
  size_t count = 0;
  DataType type = DataType::kFloat32;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "ucx", "mpi" or "nccl".
  virtual std::string backend() const = 0;
  // How this communicator runs each collective, one line per kind (e.g.
  // "AllReduce: 0-4096 B linear, 4097-65536 B recursive-doubling, ..."),
  // the same on every rank; empty where the backend leaves the choice to its
  // library (MPI, NCCL). A communicator that wraps another gives its own.
  virtual std::string Algorithms() const { return ""; }
  // What this rank's communicator was asked for and could not do, one
  // sentence each, for the caller to log (e.g. a progress thread that could
  // not take its priority). Empty where everything applied.
  virtual std::vector<std::string> SetupNotes() const { return {}; }
  // Where buffers passed to this communicator must live.
  virtual MemoryKind memory() const = 0;

  // All calls below return immediately. Bad arguments (null buffer with a
  // non-zero count, unknown type or op, out-of-range root) are reported
  // synchronously as InvalidArgument and nothing is issued; errors found
  // while running (peer mismatch, peer gone, transport failure) complete the
  // returned Work with an error. Buffers must stay valid and untouched until
  // the Work completes. Thread-safe: calls from several threads are ordered
  // by the communicator's internal lock, which is the order Note
  // [Collective ordering] refers to.

  // recv[i] = op over ranks of send[i]. In-place when send == recv.
  virtual absl::StatusOr<std::shared_ptr<Work>> AllReduce(
      const void* send, void* recv, size_t count, DataType type,
      ReduceOp op) = 0;

  // Reduces each tensor in place. The default issues one AllReduce per
  // tensor; backends that can group (NCCL) override it.
  virtual absl::StatusOr<std::shared_ptr<Work>> AllReduceMulti(
      absl::Span<const TensorRef> tensors, ReduceOp op);

  // buf on every rank = buf on `root`.
  virtual absl::StatusOr<std::shared_ptr<Work>> Broadcast(
      void* buf, size_t count, DataType type, int root) = 0;

  // recv[r*count .. (r+1)*count) = send of rank r. In-place when
  // send == recv + rank*count*DataTypeSize(type).
  virtual absl::StatusOr<std::shared_ptr<Work>> AllGather(
      const void* send, void* recv, size_t count, DataType type) = 0;

  virtual absl::StatusOr<std::shared_ptr<Work>> Barrier() = 0;

  // Blocking forms: return once the collective has finished, with its
  // status (bad arguments as above). The defaults issue and wait; a backend
  // whose callers can execute their own collectives (UCX) runs one on the
  // calling thread when nothing is queued ahead of it, with no Work and no
  // hand-off to its progress thread. The ordering rules are those of the
  // calls above. Like Work::Wait, they must not be called from a Work's
  // completion callback (OnComplete), which runs while the communicator
  // executes: that deadlocks.
  virtual absl::Status AllReduceBlocking(const void* send, void* recv, size_t count, DataType type,
                                         ReduceOp op);
  virtual absl::Status BroadcastBlocking(void* buf, size_t count, DataType type, int root);
  virtual absl::Status AllGatherBlocking(const void* send, void* recv, size_t count, DataType type);
  virtual absl::Status BarrierBlocking();

  // Note [Device communicators]
  // A communicator on device memory (memory() == kDevice: NCCL) runs its
  // collectives on a stream of its own on device(), in issue order, and
  // completes each Work once the collective's result is in device memory.
  // Buffers written by another stream must be complete before the
  // collective reads them, which the caller says with AllReduceAfter: the
  // collective starts on the device only once `ready` (an event of
  // device()) is done, and the calling thread does not wait for it. The
  // other calls read their buffers as the device's stream finds them, so
  // data written by another stream needs AllReduceAfter or a synchronise
  // first. Host communicators: device() is null and AllReduceAfter is
  // Unimplemented.
  virtual Device* device() const { return nullptr; }
  virtual absl::StatusOr<std::shared_ptr<Work>> AllReduceAfter(const DeviceEvent& ready,
                                                               const void* send, void* recv,
                                                               size_t count, DataType type,
                                                               ReduceOp op);

 protected:
  Communicator() = default;
};

// Shared argument checks for backends; `what` names the call in the error.
absl::Status ValidateBuffer(const char* what, const void* p, size_t count,
                            DataType type);
absl::Status ValidateRoot(int root, int size);
// The checks every backend makes before issuing a collective (the contract
// above): InvalidArgument naming the call and what is wrong, in the same
// words on every backend. Backends add their own limits after these (MPI's
// int counts).
absl::Status ValidateAllReduce(const void* send, const void* recv, size_t count, DataType type,
                               ReduceOp op);
absl::Status ValidateBroadcast(const void* buf, size_t count, DataType type, int root, int size);
absl::Status ValidateAllGather(const void* send, const void* recv, size_t count, DataType type,
                               int size);
// A collective timeout (UcxOptions::timeout and its twins) must be positive;
// `backend` ("UCX", "MPI", "NCCL") names it in the error.
absl::Status ValidateCollectiveTimeout(const char* backend, absl::Duration timeout);

// Blocking conveniences for tests and tools: AllReduceBlocking and
// BarrierBlocking.
absl::Status AllReduceSync(Communicator& c, const void* send, void* recv,
                           size_t count, DataType type, ReduceOp op);
absl::Status BarrierSync(Communicator& c);

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_COMMUNICATOR_H_
