#include "comm/communicator.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace fusebox::comm {

namespace {

// Shared argument checks; `what` names the call in the error.
absl::Status ValidateBuffer(const char* what, const void* p, size_t count, DataType type) {
  absl::Status s = CheckSupported(type, ReduceOp::kSum);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", s.message()));
  if (count > SIZE_MAX / DataTypeSize(type)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": a count of ", count, " ",
                                                   DataTypeName(type),
                                                   " elements overflows the address space"));
  }
  if (p == nullptr && count != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": null buffer with a count of ", count, " elements"));
  }
  return absl::OkStatus();
}

absl::Status ValidateAllReduce(const CollectiveArgs& a) {
  if (absl::Status s = CheckSupported(a.type, a.op); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("AllReduce: ", s.message()));
  }
  if (absl::Status s = ValidateBuffer("AllReduce send", a.send, a.count, a.type); !s.ok()) {
    return s;
  }
  return ValidateBuffer("AllReduce recv", a.recv, a.count, a.type);
}

absl::Status ValidateBroadcast(const CollectiveArgs& a, int size) {
  if (absl::Status s = ValidateBuffer("Broadcast", a.recv, a.count, a.type); !s.ok()) return s;
  if (a.root < 0 || a.root >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("root ", a.root, " is out of range for a communicator of size ", size));
  }
  return absl::OkStatus();
}

absl::Status ValidateAllGather(const CollectiveArgs& a, int size) {
  if (absl::Status s = ValidateBuffer("AllGather send", a.send, a.count, a.type); !s.ok()) {
    return s;
  }
  if (size > 0 && a.count > SIZE_MAX / static_cast<size_t>(size)) {
    return absl::InvalidArgumentError(absl::StrCat("AllGather: a count of ", a.count,
                                                   " per rank overflows over ", size, " ranks"));
  }
  return ValidateBuffer("AllGather recv", a.recv, a.count * static_cast<size_t>(size), a.type);
}

CollectiveArgs AllReduceArgs(const void* send, void* recv, size_t count, DataType type,
                             ReduceOp op) {
  return {CollectiveKind::kAllReduce, send, recv, count, type, op, 0};
}
CollectiveArgs BroadcastArgs(void* buf, size_t count, DataType type, int root) {
  return {CollectiveKind::kBroadcast, buf, buf, count, type, ReduceOp::kSum, root};
}
CollectiveArgs AllGatherArgs(const void* send, void* recv, size_t count, DataType type) {
  return {CollectiveKind::kAllGather, send, recv, count, type, ReduceOp::kSum, 0};
}
CollectiveArgs BarrierArgs() { return {}; }

absl::Status WaitOn(absl::StatusOr<std::shared_ptr<Work>> w) {
  if (!w.ok()) return w.status();
  return (*w)->Wait();
}

}  // namespace

absl::Status Validate(const CollectiveArgs& args, int size) {
  switch (args.kind) {
    case CollectiveKind::kAllReduce: return ValidateAllReduce(args);
    case CollectiveKind::kBroadcast: return ValidateBroadcast(args, size);
    case CollectiveKind::kAllGather: return ValidateAllGather(args, size);
    case CollectiveKind::kBarrier: return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown collective kind ", static_cast<int>(args.kind)));
}

absl::StatusOr<std::shared_ptr<Work>> Communicator::Issue(const CollectiveArgs& args) {
  if (absl::Status s = Validate(args, size()); !s.ok()) return s;
  return DoIssue(args);
}

absl::Status Communicator::RunBlocking(const CollectiveArgs& args) {
  if (absl::Status s = Validate(args, size()); !s.ok()) return s;
  return DoRun(args);
}

absl::StatusOr<std::shared_ptr<Work>> Communicator::AllReduce(const void* send, void* recv,
                                                              size_t count, DataType type,
                                                              ReduceOp op) {
  return Issue(AllReduceArgs(send, recv, count, type, op));
}

absl::StatusOr<std::shared_ptr<Work>> Communicator::Broadcast(void* buf, size_t count,
                                                              DataType type, int root) {
  return Issue(BroadcastArgs(buf, count, type, root));
}

absl::StatusOr<std::shared_ptr<Work>> Communicator::AllGather(const void* send, void* recv,
                                                              size_t count, DataType type) {
  return Issue(AllGatherArgs(send, recv, count, type));
}

absl::StatusOr<std::shared_ptr<Work>> Communicator::Barrier() { return Issue(BarrierArgs()); }

absl::Status Communicator::AllReduceBlocking(const void* send, void* recv, size_t count,
                                             DataType type, ReduceOp op) {
  return RunBlocking(AllReduceArgs(send, recv, count, type, op));
}

absl::Status Communicator::BroadcastBlocking(void* buf, size_t count, DataType type, int root) {
  return RunBlocking(BroadcastArgs(buf, count, type, root));
}

absl::Status Communicator::AllGatherBlocking(const void* send, void* recv, size_t count,
                                             DataType type) {
  return RunBlocking(AllGatherArgs(send, recv, count, type));
}

absl::Status Communicator::BarrierBlocking() { return RunBlocking(BarrierArgs()); }

absl::StatusOr<std::shared_ptr<Work>> Communicator::AllReduceMulti(
    absl::Span<const TensorRef> tensors, ReduceOp op) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorRef& t = tensors[i];
    absl::Status s = CheckSupported(t.type, op);
    if (s.ok()) s = ValidateBuffer("AllReduceMulti", t.data, t.count, t.type);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("tensor ", i, ": ", s.message()));
  }
  return DoAllReduceMulti(tensors, op);
}

absl::StatusOr<std::shared_ptr<Work>> Communicator::AllReduceAfter(const DeviceEvent& ready,
                                                                   const void* send, void* recv,
                                                                   size_t count, DataType type,
                                                                   ReduceOp op) {
  const CollectiveArgs args = AllReduceArgs(send, recv, count, type, op);
  if (absl::Status s = ValidateAllReduce(args); !s.ok()) return s;
  return DoAllReduceAfter(ready, args);
}

absl::Status Communicator::DoRun(const CollectiveArgs& args) { return WaitOn(DoIssue(args)); }

absl::StatusOr<std::shared_ptr<Work>> Communicator::DoAllReduceMulti(
    absl::Span<const TensorRef> tensors, ReduceOp op) {
  std::vector<std::shared_ptr<Work>> parts;
  parts.reserve(tensors.size());
  for (const TensorRef& t : tensors) {
    auto w = DoIssue(AllReduceArgs(t.data, t.data, t.count, t.type, op));
    if (!w.ok()) return w.status();
    parts.push_back(*std::move(w));
  }
  return Work::All(std::move(parts));
}

absl::StatusOr<std::shared_ptr<Work>> Communicator::DoAllReduceAfter(const DeviceEvent&,
                                                                     const CollectiveArgs&) {
  return absl::UnimplementedError(absl::StrCat(
      "AllReduceAfter: the ", backend(),
      " communicator reduces host memory; it takes no device events (Note [Device "
      "communicators] in comm/communicator.h)"));
}

absl::Status ValidateCollectiveTimeout(const char* backend, absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        backend, " timeout must be positive, got ", absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

absl::Status AllReduceSync(Communicator& c, const void* send, void* recv, size_t count,
                           DataType type, ReduceOp op) {
  return c.AllReduceBlocking(send, recv, count, type, op);
}

absl::Status BarrierSync(Communicator& c) { return c.BarrierBlocking(); }

}  // namespace fusebox::comm
