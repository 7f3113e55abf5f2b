// The UCX backend's header round. See header_round.h.
#include "comm/ucx/header_round.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "comm/ucx/header.h"

namespace fusebox::comm::ucx {
namespace {

// The header round's message (the header, then the payload) built at `mine`.
void BuildMessage(unsigned char* mine, const Request& req, HeaderPayload payload) {
  std::memcpy(mine, &req.header, sizeof(Header));
  if (payload.bytes > 0) std::memcpy(mine + sizeof(Header), payload.data, payload.bytes);
}

}  // namespace

void HeaderRound::Init(int size, size_t message_bytes, bool exchange, const ShmGroup* group,
                       const std::atomic<bool>* aborted) {
  size_ = size;
  exchange_ = exchange;
  group_ = group;
  aborted_ = aborted;
  // With several ranks the message is built and read in the mailboxes.
  if (size == 1) slot_.resize(message_bytes);
}

absl::Status HeaderRound::CheckFits(size_t message_bytes) const {
  if (message_bytes <= group_->mailbox_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("header round: ", message_bytes,
                                                 " bytes do not fit a mailbox of ",
                                                 group_->mailbox_bytes));
}

absl::StatusOr<uint64_t> HeaderRound::Publish(const Request& req, HeaderPayload payload) {
  const size_t message_bytes = sizeof(Header) + payload.bytes;
  if (absl::Status s = CheckFits(message_bytes); !s.ok()) return s;
  // One write and one flag per rank (Note [Shared-memory exchange]); the
  // message is built in the mailbox (Note [Reading the mailboxes in place]).
  BuildMessage(ShmOutbox(*group_, exchanges_), req, payload);
  return ShmPublish(*group_, message_bytes, &exchanges_);
}

absl::Status HeaderRound::Run(const Request& req, HeaderPayload payload, const Begun* begun,
                              absl::Time deadline) {
  if (size_ == 1) {
    BuildMessage(slot_.data(), req, payload);
    received_.assign(1, slot_.data());
    return absl::OkStatus();
  }
  // Over messages the descriptor round opens instead.
  if (!exchange_) return absl::InternalError("header round over messages");
  if (absl::Status s = CheckFits(sizeof(Header) + payload.bytes); !s.ok()) return s;
  // Every rank's message is read where it arrived. A begun call's is
  // published already (Note [Beginning on the issuing thread]).
  uint64_t exchange = 0;
  if (begun != nullptr) {
    exchange = begun->exchange;
  } else {
    absl::StatusOr<uint64_t> n = Publish(req, payload);
    if (!n.ok()) return n.status();
    exchange = *n;
  }
  if (absl::Status s = ShmCollect(*group_, exchange, &received_, &lengths_, *aborted_, deadline);
      !s.ok()) {
    return s;
  }
  for (int peer = 0; peer < size_; ++peer) {
    if (lengths_[peer] < sizeof(Header)) {
      return absl::DataLossError(
          absl::StrCat("rank ", peer, " sent a short header (", lengths_[peer], " bytes)"));
    }
  }
  return CheckHeaders();
}

absl::Status HeaderRound::CheckHeaders() const {
  // Every rank compares every header with rank 0's, so all reach the same
  // verdict with the same message.
  Header ref;
  std::memcpy(&ref, received_[0], sizeof(Header));
  for (int r = 0; r < size_; ++r) {
    Header h;
    std::memcpy(&h, received_[r], sizeof(Header));
    if (h.magic != kHeaderMagic || h.sender != r) {
      return absl::DataLossError(absl::StrCat("rank ", r, " sent a malformed collective header"));
    }
    // The descriptor round's message for the same finding (ref is rank 0's).
    if (!SameCall(h, ref)) return VerdictStatus(Verdict{ref, h});
  }
  return absl::OkStatus();
}

}  // namespace fusebox::comm::ucx
