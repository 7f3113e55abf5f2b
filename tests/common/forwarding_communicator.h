// A communicator for tests that watch or shape one kind of call: every
// call goes to an inner communicator, and a test overrides DoIssue for the
// kinds it cares about. The blocking forms keep Communicator's defaults
// (DoIssue, then wait), so they pass through the override too.
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
 protected:
  // Every call, checked at this front door, goes to the inner one's; a
  // test overrides this and watches the kinds it cares about.
  absl::StatusOr<std::shared_ptr<comm::Work>> DoIssue(const comm::CollectiveArgs& args) override {
    return inner_.Issue(args);
  }

 private:
  comm::Communicator& inner_;  // not owned
  const std::string backend_;
};

}  // namespace fusebox::testing

#endif  // FUSEBOX_TESTS_COMMON_FORWARDING_COMMUNICATOR_H_
