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

  // Note [One front door]
  // The calls below are the same for every backend and not virtual: each
  // checks its arguments once, here (Validate in communicator.cc), then
  // hands them to the backend's Do... hook as one CollectiveArgs. So every
  // backend refuses bad input in the same words, none checks again, and a
  // backend whose calls all go one way (UCX and MPI: into their AsyncCore)
  // implements one DoIssue instead of a forwarding override per call.
  //
  // All calls below return immediately. Bad arguments (null buffer with a
  // non-zero count, unknown type or op, out-of-range root) are reported
  // synchronously as InvalidArgument and nothing is issued; errors found
  // while running (peer mismatch, peer gone, transport failure) complete the
  // returned Work with an error. Buffers must stay valid and untouched until
  // the Work completes. Thread-safe: calls from several threads are ordered
  // by the communicator's internal lock, which is the order Note
  // [Collective ordering] refers to.

  // recv[i] = op over ranks of send[i]. In-place when send == recv.
  absl::StatusOr<std::shared_ptr<Work>> AllReduce(const void* send, void* recv, size_t count,
                                                  DataType type, ReduceOp op);

  // Reduces each tensor in place. The default issues one AllReduce per
  // tensor; backends that can group (NCCL) override DoAllReduceMulti.
  absl::StatusOr<std::shared_ptr<Work>> AllReduceMulti(absl::Span<const TensorRef> tensors,
                                                       ReduceOp op);

  // buf on every rank = buf on `root`.
  absl::StatusOr<std::shared_ptr<Work>> Broadcast(void* buf, size_t count, DataType type,
                                                  int root);

  // recv[r*count .. (r+1)*count) = send of rank r. In-place when
  // send == recv + rank*count*DataTypeSize(type).
  absl::StatusOr<std::shared_ptr<Work>> AllGather(const void* send, void* recv, size_t count,
                                                  DataType type);

  absl::StatusOr<std::shared_ptr<Work>> Barrier();

  // Any of the above from its arguments (args.kind says which).
  absl::StatusOr<std::shared_ptr<Work>> Issue(const CollectiveArgs& args);

  // Blocking forms: return once the collective has finished, with its
  // status (bad arguments as above). The default issues and waits; a
  // backend whose callers can execute their own collectives (UCX) runs one
  // on the calling thread when nothing is queued ahead of it, with no Work
  // and no hand-off to its progress thread (DoRun). The ordering rules are
  // those of the calls above. Like Work::Wait, they must not be called from
  // a Work's completion callback (OnComplete), which runs while the
  // communicator executes: that deadlocks.
  absl::Status AllReduceBlocking(const void* send, void* recv, size_t count, DataType type,
                                 ReduceOp op);
  absl::Status BroadcastBlocking(void* buf, size_t count, DataType type, int root);
  absl::Status AllGatherBlocking(const void* send, void* recv, size_t count, DataType type);
  absl::Status BarrierBlocking();
  // Any of the blocking forms from its arguments.
  absl::Status RunBlocking(const CollectiveArgs& args);

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
  absl::StatusOr<std::shared_ptr<Work>> AllReduceAfter(const DeviceEvent& ready, const void* send,
                                                       void* recv, size_t count, DataType type,
                                                       ReduceOp op);

 protected:
  Communicator() = default;

  // The backend's half of Note [One front door]: called only with
  // arguments Validate accepted, so a backend adds only its own limits
  // (MPI's int counts).
  virtual absl::StatusOr<std::shared_ptr<Work>> DoIssue(const CollectiveArgs& args) = 0;
  // Default: DoIssue, then wait.
  virtual absl::Status DoRun(const CollectiveArgs& args);
  // Default: one DoIssue per tensor (each a valid in-place allreduce).
  virtual absl::StatusOr<std::shared_ptr<Work>> DoAllReduceMulti(
      absl::Span<const TensorRef> tensors, ReduceOp op);
  // Default (host memory): Unimplemented. `args` is a valid allreduce.
  virtual absl::StatusOr<std::shared_ptr<Work>> DoAllReduceAfter(const DeviceEvent& ready,
                                                                 const CollectiveArgs& args);
};

// The front door's checks (Note [One front door]): InvalidArgument naming
// the call and what is wrong, for a communicator of `size` ranks.
absl::Status Validate(const CollectiveArgs& args, int size);
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
