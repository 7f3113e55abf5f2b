// The UCX backend's opening round on one host (or one rank): every rank's
// Header, with a small payload behind it, through the shared-memory
// mailboxes (Note [Shared-memory exchange] in shm_allreduce.h), compared on
// every rank (Note [UCX collective protocol] in communicator.h). Over
// messages the descriptor round opens instead (descriptor_round.h).
#ifndef FUSEBOX_COMM_UCX_HEADER_ROUND_H_
#define FUSEBOX_COMM_UCX_HEADER_ROUND_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/ucx/algo/context.h"
#include "comm/ucx/shm_allreduce.h"

namespace fusebox::comm::ucx {

// Executing thread only (and the issuing thread in Publish, under the
// core's rules: Note [Beginning on the issuing thread] in communicator.h).
class HeaderRound {
 public:
  // One rank: the message stays in a slot of `message_bytes`. Several:
  // through `group`'s mailboxes where `exchange` (else Run fails: the
  // descriptor round opens instead); `group` and `aborted` outlive this.
  void Init(int size, size_t message_bytes, bool exchange, const ShmGroup* group,
            const std::atomic<bool>* aborted);

  // Builds this rank's message (the header, then the payload) in its
  // mailbox and publishes it, without waiting; returns the exchange's
  // number, or InvalidArgument where it does not fit a mailbox.
  absl::StatusOr<uint64_t> Publish(const Request& req, HeaderPayload payload);
  // Runs the round (collecting exchange begun->exchange where the issuer
  // published it already) until `deadline`, and compares every header with
  // rank 0's: a mismatch is InvalidArgument with the same message on every
  // rank.
  absl::Status Run(const Request& req, HeaderPayload payload, const Begun* begun,
                   absl::Time deadline);
  // Every rank's message after a clean Run, valid until the next round.
  const std::vector<const unsigned char*>& received() const { return received_; }

 private:
  absl::Status CheckFits(size_t message_bytes) const;
  absl::Status CheckHeaders() const;

  int size_ = 1;
  bool exchange_ = false;
  const ShmGroup* group_ = nullptr;
  const std::atomic<bool>* aborted_ = nullptr;
  uint64_t exchanges_ = 0;  // exchanges completed (all ranks agree)
  std::vector<size_t> lengths_;
  std::vector<unsigned char> slot_;  // one rank's message
  // Every rank's message (a Header, then its payload) once the round is
  // done: in the mailboxes (Note [Reading the mailboxes in place] in
  // shm_allreduce.h), or slot_ on one rank.
  std::vector<const unsigned char*> received_;
};

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_HEADER_ROUND_H_
