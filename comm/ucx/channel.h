// The UCX backend's channel: a UCP context and worker, one endpoint per
// peer, tagged sends and receives, waiting on them under the running
// collective's deadline, and failure notices. The algorithms
// (communicator.cc; Note [UCX collective protocol] in communicator.h) are written against it
// and never call UCP's messaging themselves.
//
//   Channel ch(rank, size, &abort);
//   std::string me = *ch.Open(options, /*rma=*/false);  // this rank's worker address
//   ... every rank publishes `me` and gathers the others' ...
//   ch.Connect(addresses, /*detect_peer_failure=*/false);  // endpoints; notices listened for
//   ch.set_deadline(absl::Now() + timeout);
//   Pending r, s;
//   ch.PostRecv(peer, buf, n, MakeTag(seq, 1, 0), &r);
//   ch.PostSend(peer, data, n, MakeTag(seq, 1, 0), &s);
//   absl::Status st = ch.Finish(&r, "receive");  // then Finish(&s, "send")
//   st = ch.SendRecv(peer, data, buf, n, MakeTag(seq, 2, 0), "exchange");  // both at once
//
// A channel is not thread-safe: it is used by one thread at a time (the
// communicator's executor, Note [Who executes a collective] in
// comm/async_core.h), which is why
// its worker runs in UCS_THREAD_MODE_SINGLE.
//
// Tags: [seq:24][step:12][index:28]. Step 0 is the descriptor round
// (index = exchange, then Rabenseifner's allgather steps, and the linear
// round's indexes from 2^20; descriptor_round.h); later steps are algorithm steps
// (index = chunk). Whatever (seq, step, index) a rank receives comes from
// exactly one peer, so a tag is unique per receiver. The last step number is
// reserved for failure notices.
//
// Note [Waiting where ranks outnumber cores]
// Where a machine's ranks outnumber its cores, the rank a wait is for may
// be the one descheduled, so a waiting rank must give its core away. Over
// TCP each poll of the worker is an epoll_wait, and a rank that polls
// without yielding keeps its core from the peer it waits for, while one
// that sleeps on the worker's event fd pays a wake-up per message. So a
// waiting rank yields after each poll that found nothing, and after a few
// such polls in a row (kYieldsBeforeSleep in communicator.cc) sleeps on the
// fd at each until a poll progresses. Measured on emulated hosts (one rank
// per network namespace, all on 2 cores, 4 Gbit; blocking allreduce,
// interleaved rounds, commit 99a7bfa): against
// sleeping after 16 plain polls (the previous policy), yielding 4 times
// first took 0.77-0.81x the time at 4 hosts for 8-512 B (median of 10
// per-round ratios; faster in 8-9 of 10 rounds), the same within the
// scatter at 4 KiB and 32 KiB and at 8 hosts. 8 or 16 yields did about as
// well; 64 yields, or yielding and never sleeping, were slower than the
// previous policy at 8 hosts up to 4 KiB (never sleeping: 281-415 us,
// against the previous policy's 208-223).
//
// Note [Failure notices]
// A rank that gives up on a collective (its deadline passed, or a peer's
// endpoint failed) sends every peer a FailureNotice (NotifyPeers) before its
// post-mortem (Note [Timeout post-mortem] in comm/fault.h). Each rank keeps
// one receive posted for notices (any sender: the tag mask covers the step
// only), and Progress() fails the running collective, as Aborted, once one
// has arrived. Without it a rank whose ring neighbour is healthy but itself
// stuck on a dead rank would wait out its whole deadline, and report long
// after the ranks that saw the fault, or be named silent by their
// post-mortems. Ranks aborted by a notice do not send one (their peers have
// one already). The shared-memory allreduce has its own abandon word
// (shm_allreduce.h).
//
// Note [A peer that left first]
// A rank that has its result leaves, and its endpoints close, while a peer
// may still be waiting for something else: under the linear opening a rank
// that called a recursive-doubling AllReduce among ranks that called a
// linear one has its exchange with a partner that never sends (it runs the
// linear round) still posted while it waits for rank 0's answer, which
// carries the verdict (Note [Watching the linear round] in
// descriptor_round.h). When the partner has its own answer first and
// leaves, the waiting rank's endpoint to it fails (UCX over TCP reports a
// closed connection as "Endpoint timeout") while rank 0's answer to it may
// not be sent yet: on a loaded machine rank 0 can be descheduled between
// two answers. Over TCP a rank's sends to a peer and its receives from it may
// also run on two sockets, so a closed socket can be seen before the last
// data on the other. So Progress reports a failed endpoint only once it has
// been seen failed for kPeerGoneGrace (1 s), progressing all the while: what
// was sent before the peer left still arrives and settles the call as every
// other rank settles it. A notice is read before a failed endpoint (it says
// why the peer left). A peer that crashed is reported 1 s later than it was
// seen, well within the post-mortem's own 2 s.
#ifndef FUSEBOX_COMM_UCX_CHANNEL_H_
#define FUSEBOX_COMM_UCX_CHANNEL_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/options.h"

namespace fusebox::comm::ucx {

inline constexpr int kSeqBits = 24, kStepBits = 12, kIndexBits = 28;
inline constexpr uint64_t kNoticeStep = (uint64_t{1} << kStepBits) - 1;
// Algorithm steps stay below kNoticeStep up to this many ranks (the ring's
// reach 2(p-1)).
inline constexpr int kMaxWorld = 2048;

// Note [A peer that left first]: how long a failed endpoint is progressed
// past before it is reported.
inline constexpr absl::Duration kPeerGoneGrace = absl::Seconds(1);

inline ucp_tag_t MakeTag(uint64_t seq, uint64_t step, uint64_t index) {
  return ((seq & ((uint64_t{1} << kSeqBits) - 1)) << (kStepBits + kIndexBits)) |
         ((step & ((uint64_t{1} << kStepBits) - 1)) << kIndexBits) |
         (index & ((uint64_t{1} << kIndexBits) - 1));
}

std::string UcsError(ucs_status_t s);

// The UCX settings Channel::Open applies with ucp_config_modify, in order:
// TLS from options.transports; where the transports are TCP only,
// RNDV_THRESH from options.tcp_eager_bytes and RX_SEG_SIZE (UCX's TCP
// receive segment) as large, at most 1 MiB, where that is above UCX's 64 KiB,
// each unless options.ucx_config or UCX's environment variable sets it; then
// options.ucx_config.
std::vector<std::pair<std::string, std::string>> UcxSettings(const UcxOptions& options);
// Whether the transports UCX will be given (options.transports, or the last
// TLS in options.ucx_config) are nothing but tcp and self.
bool TcpOnly(const UcxOptions& options);

// Completion record of one UCP operation; its address must stay valid while
// the operation is in flight (until Finish, WaitFor or Release).
struct Pending {
  int peer = -1;  // the rank on the other side; -1: any
  bool done = false;
  ucs_status_t status = UCS_OK;
  size_t length = 0;  // bytes received
  void* request = nullptr;
};

class Channel {
 public:
  // `abort` (owned by the caller, outliving the channel) set makes every
  // wait fail as Cancelled: the communicator is being destroyed.
  Channel(int rank, int size, const std::atomic<bool>* abort)
      : rank_(rank), size_(size), abort_(abort) {}
  // Closes what Close() has not, forcing, then destroys the worker and the
  // context.
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Creates the context (with RMA when `rma`, for the shared-memory segments)
  // and the worker, applying options.transports and options.ucx_config.
  // Returns this rank's worker address, to publish to the peers.
  absl::StatusOr<std::string> Open(const UcxOptions& options, bool rma);
  // Creates an endpoint to every peer from the addresses every rank
  // published (addresses[rank()] is not used; each is at most 1 MiB), then
  // posts the receive for failure notices. `detect_peer_failure`: UCX
  // reports failed peers (UCP_ERR_HANDLING_MODE_PEER).
  absl::Status Connect(const std::vector<std::string>& addresses, bool detect_peer_failure);
  // Flushes every endpoint (so that remote keys can be unpacked on them),
  // waiting until `deadline`. An error names the first peer that failed.
  absl::Status FlushEndpoints(absl::Time deadline);
  // Cancels the notice receive and closes the endpoints: with a flush
  // bounded to 2 s, or forced where `force` (after a failure a peer may be
  // dead or stuck) or the peer's endpoint failed. Idempotent.
  void Close(bool force);

  int rank() const { return rank_; }
  int size() const { return size_; }
  ucp_context_h context() const { return context_; }
  ucp_ep_h endpoint(int peer) const { return eps_[peer]; }

  // The running collective's deadline (InfiniteFuture when none), which
  // Progress enforces.
  void set_deadline(absl::Time deadline) { deadline_ = deadline; }
  absl::Time deadline() const { return deadline_; }
  // Progress yields the core (sched_yield) on every (mask + 1)-th poll that
  // found nothing to do: often where ranks outnumber cores.
  void set_yield_mask(unsigned mask) { yield_mask_ = mask; }
  // Instead of yielding, sleep until the worker has something to progress
  // (at most 10 ms at a time): where the transports are TCP only (the
  // worker then has an event fd) and ranks outnumber cores, a waiting rank
  // leaves its core to the ranks that have work. Then every poll that found
  // nothing yields, and after `yields` such polls in a row the channel
  // sleeps at each until one progresses (Note [Waiting where ranks outnumber
  // cores]; the run of idle polls carries over from one wait to the next
  // until a poll progresses); the yield mask applies only where the worker
  // has no event fd, or could not be armed.
  void set_sleep_when_idle(bool sleep, unsigned yields = 0) {
    sleep_when_idle_ = sleep;
    yields_before_sleep_ = yields;
  }
  // Idle polls that yielded, and that slept on the event fd, while sleeping
  // when idle (for tests and diagnostics).
  uint64_t idle_yields() const { return idle_yields_; }
  uint64_t idle_sleeps() const { return idle_sleeps_; }
  // Messages posted by PostSend (and SendRecv), for tests and diagnostics.
  uint64_t sends() const { return sends_; }

  void PostSend(int peer, const void* buf, size_t len, ucp_tag_t tag, Pending* p);
  void PostRecv(int peer, void* buf, size_t len, ucp_tag_t tag, Pending* p,
                ucp_tag_t tag_mask = ~ucp_tag_t{0});
  // One step of progress. Fails if the communicator is being destroyed, a
  // failure notice arrived (Aborted), the endpoint of `peer` (when >= 0)
  // has reported an error for kPeerGoneGrace (Note [A peer that left
  // first]), or the deadline passed.
  absl::Status Progress(int peer);
  // Progresses until `p` is done (or Progress fails).
  absl::Status WaitFor(Pending* p);
  // WaitFor, then hands the request back to UCX and turns a failed
  // operation into Unavailable naming `what`. A failed wait leaves the
  // request for Release.
  absl::Status Finish(Pending* p, const char* what);
  // Error paths: cancels `p` if it is an unfinished receive and hands its
  // request back to UCX, which then calls no callback for it (ucp.h,
  // ucp_request_free), so `p` may go out of scope. Never blocks. A transfer
  // already under way may still land in the caller's buffer: the collective
  // has failed and its buffers hold no defined result.
  void Release(Pending* p, bool is_recv);
  // One pairwise step: sends `len` bytes of `send_buf` (if not null) to
  // `peer` and receives `len` bytes into `recv_buf` (if not null) from it,
  // both under `tag`, and returns once both are done; a receive of another
  // length is DataLoss naming `what` and the peer. On error nothing is left
  // for the caller to release (a send handed back to UCX may still read
  // `send_buf` until the endpoints close).
  absl::Status SendRecv(int peer, const void* send_buf, void* recv_buf, size_t len, ucp_tag_t tag,
                        const char* what);
  // Note [Failure notices]: tells every reachable peer that this rank gave
  // up on collective `seq`; bounded in time (100 ms), never fails.
  void NotifyPeers(uint64_t seq);

 private:
  struct EpErrorArg {
    Channel* self;
    int peer;
  };
  // What a rank that gave up tells its peers (a wire format).
  struct FailureNotice {
    uint32_t magic;
    int32_t sender;
    uint64_t seq;  // the collective it gave up on
  };
  static_assert(sizeof(FailureNotice) == 16, "FailureNotice is a wire format");

  // Waits for the worker's event fd (set_sleep_when_idle). False where it
  // did not wait: the worker had events already (progress again at once),
  // or could not be armed (it then yields, and the channel no longer sleeps).
  bool Sleep();
  // The error for a received notice (Aborted), validated.
  absl::Status NoticeError() const;
  // Note [A peer that left first]: OK within the grace after `peer`'s
  // endpoint was first seen failed (unless `now_or_never`: the deadline has
  // passed), then Unavailable naming it.
  absl::Status PeerGone(int peer, bool now_or_never = false);

  const int rank_;
  const int size_;
  const std::atomic<bool>* const abort_;

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<ucp_ep_h> eps_;  // eps_[rank_] unused
  // Per-peer endpoint status, set from UCP's error callback (during progress).
  std::vector<ucs_status_t> peer_status_;
  // When Progress first saw each peer's endpoint failed (InfiniteFuture:
  // not yet); Note [A peer that left first].
  std::vector<absl::Time> peer_failed_seen_;
  std::vector<EpErrorArg> ep_error_args_;
  // Note [Failure notices]: the posted receive for peers' notices, and this
  // rank's own (it must stay valid while its sends are in flight).
  FailureNotice notice_in_{};
  Pending notice_recv_;
  FailureNotice notice_out_{};
  bool closed_ = false;

  absl::Time deadline_ = absl::InfiniteFuture();
  unsigned deadline_polls_ = 0;
  unsigned yield_mask_ = 1023;
  unsigned idle_polls_ = 0;
  bool sleep_when_idle_ = false;
  unsigned yields_before_sleep_ = 0;
  unsigned idle_run_ = 0;  // polls in a row that found nothing (sleeping when idle)
  uint64_t idle_yields_ = 0;
  uint64_t idle_sleeps_ = 0;
  uint64_t sends_ = 0;
  int event_fd_ = -1;  // the worker's, where it has wake-up events (TCP only)
};

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_CHANNEL_H_
