// A communicator for tests that watch or shape one kind of call: every
// call goes to an inner communicator, and a test overrides the ones it
// cares about. The blocking forms keep Communicator's defaults (issue, then
// wait), so they pass through the overrides too.
#ifndef FUSEBOX_TESTS_COMMON_FORWARDING_COMMUNICATOR_H_
#define FUSEBOX_TESTS_COMMON_FORWARDING_COMMUNICATOR_H_

#include <memory>
#include <string>
#include <utility>

#include "comm/communicator.h"

namespace fusebox::testing {

class ForwardingCommunicator : public comm::Communicator {
 public:
  ForwardingCommunicator(comm::Communicator& inner, std::string backend)
      : inner_(inner), backend_(std::move(backend)) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend() const override { return backend_; }
  comm::MemoryKind memory() const override { return inner_.memory(); }
  absl::StatusOr<std::shared_ptr<comm::Work>> AllReduce(const void* send, void* recv, size_t count,
                                                        comm::DataType type,
                                                        comm::ReduceOp op) override {
    return inner_.AllReduce(send, recv, count, type, op);
  }
  absl::StatusOr<std::shared_ptr<comm::Work>> Broadcast(void* buf, size_t count,
                                                        comm::DataType type, int root) override {
    return inner_.Broadcast(buf, count, type, root);
  }
  absl::StatusOr<std::shared_ptr<comm::Work>> AllGather(const void* send, void* recv, size_t count,
                                                        comm::DataType type) override {
    return inner_.AllGather(send, recv, count, type);
  }
  absl::StatusOr<std::shared_ptr<comm::Work>> Barrier() override { return inner_.Barrier(); }

 private:
  comm::Communicator& inner_;  // not owned
  const std::string backend_;
};

}  // namespace fusebox::testing

#endif  // FUSEBOX_TESTS_COMMON_FORWARDING_COMMUNICATOR_H_
