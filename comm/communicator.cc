#include "comm/communicator.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"

namespace fusebox::comm {

absl::StatusOr<std::shared_ptr<Work>> Communicator::AllReduceMulti(
    absl::Span<const TensorRef> tensors, ReduceOp op) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    absl::Status s = ValidateBuffer("AllReduceMulti", tensors[i].data,
                                    tensors[i].count, tensors[i].type);
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", i, ": ", s.message()));
    }
  }
  std::vector<std::shared_ptr<Work>> parts;
  parts.reserve(tensors.size());
  for (const TensorRef& t : tensors) {
    auto w = AllReduce(t.data, t.data, t.count, t.type, op);
    if (!w.ok()) return w.status();
    parts.push_back(*std::move(w));
  }
  return Work::All(std::move(parts));
}

absl::StatusOr<std::shared_ptr<Work>> Communicator::AllReduceAfter(const DeviceEvent&,
                                                                   const void*, void*, size_t,
                                                                   DataType, ReduceOp) {
  return absl::UnimplementedError(absl::StrCat(
      "AllReduceAfter: the ", backend(),
      " communicator reduces host memory; it takes no device events (Note [Device "
      "communicators] in comm/communicator.h)"));
}

absl::Status ValidateBuffer(const char* what, const void* p, size_t count,
                            DataType type) {
  absl::Status s = CheckSupported(type, ReduceOp::kSum);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", s.message()));
  if (count > SIZE_MAX / DataTypeSize(type)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": a count of ", count, " ", DataTypeName(type), " elements overflows the address space"));
  }
  if (p == nullptr && count != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": null buffer with a count of ", count, " elements"));
  }
  return absl::OkStatus();
}

absl::Status ValidateRoot(int root, int size) {
  if (root < 0 || root >= size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "root ", root, " is out of range for a communicator of size ", size));
  }
  return absl::OkStatus();
}

absl::Status ValidateAllReduce(const void* send, const void* recv, size_t count, DataType type,
                               ReduceOp op) {
  if (absl::Status s = CheckSupported(type, op); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("AllReduce: ", s.message()));
  }
  if (absl::Status s = ValidateBuffer("AllReduce send", send, count, type); !s.ok()) return s;
  return ValidateBuffer("AllReduce recv", recv, count, type);
}

absl::Status ValidateBroadcast(const void* buf, size_t count, DataType type, int root, int size) {
  if (absl::Status s = ValidateBuffer("Broadcast", buf, count, type); !s.ok()) return s;
  return ValidateRoot(root, size);
}

absl::Status ValidateAllGather(const void* send, const void* recv, size_t count, DataType type,
                               int size) {
  if (absl::Status s = ValidateBuffer("AllGather send", send, count, type); !s.ok()) return s;
  if (size > 0 && count > SIZE_MAX / static_cast<size_t>(size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllGather: a count of ", count, " per rank overflows over ", size, " ranks"));
  }
  return ValidateBuffer("AllGather recv", recv, count * static_cast<size_t>(size), type);
}

absl::Status ValidateCollectiveTimeout(const char* backend, absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        backend, " timeout must be positive, got ", absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

namespace {

absl::Status WaitOn(absl::StatusOr<std::shared_ptr<Work>> w) {
  if (!w.ok()) return w.status();
  return (*w)->Wait();
}

}  // namespace

absl::Status Communicator::AllReduceBlocking(const void* send, void* recv, size_t count,
                                             DataType type, ReduceOp op) {
  return WaitOn(AllReduce(send, recv, count, type, op));
}

absl::Status Communicator::BroadcastBlocking(void* buf, size_t count, DataType type, int root) {
  return WaitOn(Broadcast(buf, count, type, root));
}

absl::Status Communicator::AllGatherBlocking(const void* send, void* recv, size_t count,
                                             DataType type) {
  return WaitOn(AllGather(send, recv, count, type));
}

absl::Status Communicator::BarrierBlocking() { return WaitOn(Barrier()); }

absl::Status AllReduceSync(Communicator& c, const void* send, void* recv, size_t count,
                           DataType type, ReduceOp op) {
  return c.AllReduceBlocking(send, recv, count, type, op);
}

absl::Status BarrierSync(Communicator& c) { return c.BarrierBlocking(); }

}  // namespace fusebox::comm
