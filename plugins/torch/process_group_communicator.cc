#include "plugins/torch/process_group_communicator.h"

#include <cstring>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/work.h"

namespace fusebox::torch_plugin {
namespace {

at::Tensor Wrap(const void* data, size_t count, comm::DataType type) {
  return at::from_blob(const_cast<void*>(data), {static_cast<int64_t>(count)},
                       at::TensorOptions().dtype(ToScalarType(type)).device(at::kCPU));
}

absl::StatusOr<::c10d::ReduceOp> ToTorchOp(comm::ReduceOp op) {
  switch (op) {
    case comm::ReduceOp::kSum:
    case comm::ReduceOp::kAvg:  // sum, then divided (see AllReduce)
      return compat::SumOp();
    case comm::ReduceOp::kMin:
      return compat::MinOp();
    case comm::ReduceOp::kMax:
      return compat::MaxOp();
    case comm::ReduceOp::kProd:
      return compat::ProductOp();
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("process group AllReduce: unknown reduce op %d", static_cast<int>(op)));
}

}  // namespace

at::ScalarType ToScalarType(comm::DataType type) {
  switch (type) {
    case comm::DataType::kFloat32: return at::kFloat;
    case comm::DataType::kFloat64: return at::kDouble;
    case comm::DataType::kFloat16: return at::kHalf;
    case comm::DataType::kBFloat16: return at::kBFloat16;
    case comm::DataType::kInt32: return at::kInt;
    case comm::DataType::kInt64: return at::kLong;
    case comm::DataType::kUInt8: return at::kByte;
  }
  return at::kFloat;  // unreachable: callers validate the type first
}

absl::StatusOr<comm::DataType> FromScalarType(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return comm::DataType::kFloat32;
    case at::kDouble: return comm::DataType::kFloat64;
    case at::kHalf: return comm::DataType::kFloat16;
    case at::kBFloat16: return comm::DataType::kBFloat16;
    case at::kInt: return comm::DataType::kInt32;
    case at::kLong: return comm::DataType::kInt64;
    case at::kByte: return comm::DataType::kUInt8;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("fusebox cannot reduce tensors of dtype ", c10::toString(type)));
  }
}

ProcessGroupCommunicator::ProcessGroupCommunicator(
    c10::intrusive_ptr<::c10d::ProcessGroup> group)
    : group_(std::move(group)),
      rank_(group_->getRank()),
      size_(group_->getSize()),
      backend_(absl::StrCat("torch-", group_->getBackendName())) {}

absl::StatusOr<std::shared_ptr<comm::Work>> ProcessGroupCommunicator::Submit(
    const char* what, const std::function<c10::intrusive_ptr<compat::Work>()>& issue,
    std::function<void()> after) {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  try {
    future = issue()->getFuture();
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrFormat("process group (%s) %s failed to start: %s", backend_, what, e.what()));
  }
  auto work = std::make_shared<comm::Work>();
  std::string name = absl::StrFormat("process group (%s) %s", backend_, what);
  future->addCallback([work, after = std::move(after), name](c10::ivalue::Future& f) {
    if (f.hasError()) {
      work->Complete(absl::UnavailableError(absl::StrCat(name, ": ", f.tryRetrieveErrorMessage())));
      return;
    }
    try {
      if (after) after();
    } catch (const std::exception& e) {
      work->Complete(absl::InternalError(absl::StrCat(name, ": ", e.what())));
      return;
    }
    work->Complete(absl::OkStatus());
  });
  return work;
}

absl::StatusOr<std::shared_ptr<comm::Work>> ProcessGroupCommunicator::DoIssue(
    const comm::CollectiveArgs& a) {
  switch (a.kind) {
    case comm::CollectiveKind::kAllReduce: return StartAllReduce(a);
    case comm::CollectiveKind::kBroadcast: return StartBroadcast(a);
    case comm::CollectiveKind::kAllGather: return StartAllGather(a);
    case comm::CollectiveKind::kBarrier: return StartBarrier();
  }
  return absl::InvalidArgumentError("unknown collective kind");
}

absl::StatusOr<std::shared_ptr<comm::Work>> ProcessGroupCommunicator::StartAllReduce(
    const comm::CollectiveArgs& a) {
  const void* send = a.send;
  void* recv = a.recv;
  const size_t count = a.count;
  const comm::DataType type = a.type;
  const comm::ReduceOp op = a.op;
  absl::StatusOr<::c10d::ReduceOp> torch_op = ToTorchOp(op);
  if (!torch_op.ok()) return torch_op.status();
  if (count == 0) return comm::Work::Done(absl::OkStatus());  // the same on every rank
  if (send != recv) std::memcpy(recv, send, count * comm::DataTypeSize(type));
  at::Tensor tensor = Wrap(recv, count, type);
  std::function<void()> after;
  if (op == comm::ReduceOp::kAvg && size_ > 1) {
    const bool integral = !at::isFloatingType(tensor.scalar_type());
    after = [tensor, integral, n = size_]() mutable {
      if (integral) {
        tensor.div_(n, "trunc");
      } else {
        tensor.div_(n);
      }
    };
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++calls_;
  counts_.push_back(static_cast<int64_t>(count));
  if (counts_.size() > kCallLogLimit) counts_.pop_front();
  ::c10d::AllreduceOptions options;
  options.reduceOp = *torch_op;
  return Submit(
      "AllReduce",
      [&] {
        std::vector<at::Tensor> tensors{tensor};
        return group_->allreduce(tensors, options);
      },
      std::move(after));
}

absl::StatusOr<std::shared_ptr<comm::Work>> ProcessGroupCommunicator::StartBroadcast(
    const comm::CollectiveArgs& a) {
  void* buf = a.recv;
  const size_t count = a.count;
  const comm::DataType type = a.type;
  const int root = a.root;
  std::lock_guard<std::mutex> lock(mu_);
  ::c10d::BroadcastOptions options;
  options.rootRank = root;
  return Submit(
      "Broadcast",
      [&] {
        std::vector<at::Tensor> tensors{Wrap(buf, count, type)};
        return group_->broadcast(tensors, options);
      },
      nullptr);
}

absl::StatusOr<std::shared_ptr<comm::Work>> ProcessGroupCommunicator::StartAllGather(
    const comm::CollectiveArgs& a) {
  const void* send = a.send;
  void* recv = a.recv;
  const size_t count = a.count;
  const comm::DataType type = a.type;
  const size_t bytes = count * comm::DataTypeSize(type);
  // The group may copy the input into its own slot of the output: give it
  // a private copy when the caller's input is that slot.
  at::Tensor input = Wrap(send, count, type);
  if (send == static_cast<char*>(recv) + rank_ * bytes) input = input.clone();
  std::lock_guard<std::mutex> lock(mu_);
  return Submit(
      "AllGather",
      [&] {
        std::vector<std::vector<at::Tensor>> outputs(1);
        for (int r = 0; r < size_; ++r) {
          outputs[0].push_back(Wrap(static_cast<char*>(recv) + r * bytes, count, type));
        }
        std::vector<at::Tensor> inputs{input};
        return group_->allgather(outputs, inputs);
      },
      [input] {});  // keeps the private copy alive until completion
}

absl::StatusOr<std::shared_ptr<comm::Work>> ProcessGroupCommunicator::StartBarrier() {
  std::lock_guard<std::mutex> lock(mu_);
  return Submit("Barrier", [&] { return group_->barrier(); }, nullptr);
}

int64_t ProcessGroupCommunicator::allreduce_calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return calls_;
}

std::vector<int64_t> ProcessGroupCommunicator::AllReduceCountsSince(int64_t first) const {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t oldest = calls_ - static_cast<int64_t>(counts_.size());
  std::vector<int64_t> out;
  for (int64_t i = std::max(first, oldest); i < calls_; ++i) out.push_back(counts_[i - oldest]);
  return out;
}

}  // namespace fusebox::torch_plugin
