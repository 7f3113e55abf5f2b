// UCX backend: host memory, UCP tag messaging, collectives of fusebox's own
// (ring reduce-scatter + allgather pipelined in chunks for large messages,
// recursive doubling for small ones), progressed by one thread per
// communicator so the caller never blocks.
//
// Note [UCX collective protocol]
// Collectives run one at a time, in issue order, on whichever thread holds the
// core's executor lock (Note [Who executes a collective] in
// comm/async_core.h): the communicator's progress thread or a caller blocked
// in Wait(). Only that thread touches the UCP worker (UCS_THREAD_MODE_SINGLE,
// serialised by the lock).
// Every collective opens with a round that compares every rank's Header
// (kind, count, type, op, root, sequence number; comm/ucx/header.h), so all
// ranks reach the same verdict on a mismatch: the Work fails on every rank
// with the same message, naming rank 0's call and the lowest rank's that
// differs, before any algorithm moves data, so a mismatch is never a hang or
// a corruption. Which round depends on where the ranks are:
// * On one host, the header round through shared memory (below): every rank
//   reads every rank's header. Payloads of up to small_message_bytes ride
//   along ("one-shot"), which finishes small collectives in a single round;
//   each rank then reduces all contributions in rank order, so every rank
//   computes bit-identical results.
// * Over messages (across hosts; on one host where shared memory is off or
//   did not come up), the descriptor round (Note [Descriptor round] in
//   descriptor_round.h): the headers compared by recursive doubling,
//   about p log2(p) messages instead of p(p-1), carrying AllReduce up to
//   max(small_message_bytes, recursive_doubling_bytes) in the same
//   messages; in worlds of a power of two >= 4 ranks, above
//   rabenseifner_from_bytes up to rabenseifner_bytes as a reduce-scatter in
//   the same exchanges followed by an allgather (Note [Rabenseifner]; Note
//   [Algorithm table]). Where some machine runs more
//   ranks than cores, the linear round instead (Note [Linear round]): every header to rank 0 and
//   its verdict back, 2(p-1) messages.
// Larger AllReduce over messages runs the pipelined ring
// (algo/ring_allreduce.cc); Broadcast is a pipelined chain from the root;
// AllGather is a ring.
//
// Large AllReduce between ranks on one host runs over shared memory instead
// (Note [UCX shared-memory allreduce] in shm_allreduce.h) when every rank can
// map every other rank's staging segment (shm_setup.h). The same segments
// then carry the header round too: each rank writes its header (and small
// payload) into a mailbox of its segment and raises one flag, and reads
// every other rank's (Note [Shared-memory exchange] in shm_allreduce.h), so
// a small collective on one host costs a few cache-line transfers instead
// of a round of UCX messages (header_round.h compares them).
//
// Messages go through the channel (channel.h: endpoints, tags, waiting
// under the deadline, failure notices); the queue that runs them is the
// shared core's (comm/async_core.h). Each algorithm is a unit of its own
// in algo/ (Note [Algorithm units] in algo/unit.h), run on a Context that
// lends it the channel and staging; the header round is header_round.h,
// the segments' set-up shm_setup.h. This file holds wire-up and execution:
// which unit runs (the table, with the measured choice over it), the
// opening round, and the errors. The ring's steps reach 2(p-1), hence at
// most ucx::kMaxWorld ranks.
//
// Note [Beginning on the issuing thread]
// On one host (the header round through the mailboxes) a non-blocking
// AllReduce issued to an idle communicator is begun by the issuing thread
// (Note [The issuer begins] in comm/async_core.h): Begin builds its header
// round message in the outbox (the header, and the data where it rides in
// the round: kOneShot) and publishes it (ShmPublish), and for the
// shared-memory allreduce stages its first round (ShmBeginAllReduce: up to
// (p - 1) * shm_chunk_bytes of the input copied into this rank's slot and
// published) where the slot is free at once. None of it waits for a peer.
// Start, on the progress thread, collects the round (ShmCollect), compares
// the headers as always (a mismatch is found on every rank, as before), and
// runs the rest. What the issuer did is the data moving: its peers can
// read the message, and reduce the staged round, before this rank's
// progress thread has woken. Begin never runs a kind of call or an
// algorithm it does not know to be one of these (Broadcast, AllGather,
// Barrier, and every path over messages run as before), and a blocking call
// never comes here (it runs on its caller whole, Note [Blocking calls]).
// Where it applies is UcxOptions::issuer_begins (kAuto: where this
// machine's ranks and their progress threads outnumber its cores).
#ifndef FUSEBOX_COMM_UCX_COMMUNICATOR_H_
#define FUSEBOX_COMM_UCX_COMMUNICATOR_H_

#include <memory>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "comm/options.h"
#include "comm/store.h"

namespace fusebox::comm {

// Creates this rank's UCP context and worker, exchanges worker addresses
// through `store` (keys under "ucx/"), and connects to every peer. Blocks
// until all `size` ranks have arrived or options.rendezvous_timeout passes
// (the error names the missing ranks). `store` must outlive the
// communicator: a collective that times out (options.timeout) uses it again
// to find out which ranks are gone (Note [Timeout post-mortem]). A failed
// collective leaves the communicator unusable: every later call returns
// FailedPrecondition with the first error; destroying it is the abort path
// (in-flight work is cancelled, endpoints are closed without waiting on
// peers that may be gone, the worker and context are torn down).
absl::StatusOr<std::unique_ptr<Communicator>> CreateUcxCommunicator(
    const UcxOptions& options, int rank, int size, Store& store);

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_UCX_COMMUNICATOR_H_
