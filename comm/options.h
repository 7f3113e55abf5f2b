// Per-backend options, filled at the edges (flags, environment) and passed
// down. Plain data, no dependency on any backend's headers.
#ifndef FUSEBOX_COMM_OPTIONS_H_
#define FUSEBOX_COMM_OPTIONS_H_

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace fusebox::comm {

struct UcxOptions {
  // On one host, collectives of up to this many bytes carry their payload
  // in the header round ("one-shot": one round of latency, each rank reduces
  // all contributions); larger AllReduce uses shared memory (below).
  // Measured here, the shared-memory path wins from ~4 KiB. Over messages,
  // AllReduce of up to max(this, recursive_doubling_bytes) rides in the
  // descriptor round that opens every collective (Note [Descriptor round]
  // in comm/ucx/descriptor_round.h), larger runs the pipelined ring.
  // Where up to 8 ranks share a host with fewer cores than ranks, a non-zero
  // value is raised to 32 KiB (every synchronisation then costs a round of
  // context switches); 0 turns one-shot off everywhere.
  size_t small_message_bytes = 4 << 10;
  // AllReduce over messages (no shared memory: across hosts) of up to this
  // many bytes (or small_message_bytes, if larger; where the world is a
  // power of two of at least 4 ranks, only up to rabenseifner_from_bytes
  // and above rabenseifner_bytes) runs recursive doubling
  // inside the descriptor round, log2(p) rounds of latency instead of the
  // ring's 2(p-1) (Note [Algorithm table] in comm/ucx/algorithms.h); every
  // rank's receive staging holds that many bytes. Its break-even with
  // the ring, p ranks, latency L per round and link bandwidth B:
  // m = (2(p-1) - log2 p) L B / (log2 p - 2(p-1)/p). With L ~ 100 us (TCP
  // between emulated hosts) and 1 Gbit/s that is ~100 KB at 4 ranks and
  // ~110 KB at 8, and it grows with B and L (at 2 ranks the two move the
  // same bytes and recursive doubling always wins): 64 KiB stays below the
  // break-even wherever it was estimated. Measured on emulated hosts it
  // shortened 4 KiB at 2 and 4 hosts and changed nothing at 8
  // (commit 89955b1).
  size_t recursive_doubling_bytes = 64 << 10;
  // AllReduce over messages above rabenseifner_from_bytes (or what the
  // linear round carries), up to this many
  // bytes, runs Rabenseifner's algorithm inside the descriptor round where
  // the world is a power of two of at least 4 ranks: a reduce-scatter by
  // recursive halving whose messages carry the descriptors, then an
  // allgather by recursive doubling (Note [Rabenseifner] in
  // comm/ucx/descriptor_round.h). It moves what the ring moves, 2(p-1)/p of
  // the data per rank, in 2 log2(p) rounds of latency instead of 2(p-1),
  // where recursive doubling moves log2(p) times all of it. Above it (or
  // where p is not a power of two, whose extra ranks would hand the whole
  // vector over and back) the ring. Its first message is half the vector,
  // unchunked: over TCP, halves above tcp_eager_bytes go by rendezvous, and
  // on 4 and 8 emulated hosts (1 Gbit) a 2 MiB allreduce took 1.3-1.6x the
  // ring's time and 1 MiB (8 hosts, 4 Gbit) as long, while at 8 hosts
  // 64-128 KiB took 0.5-0.7x and 256-512 KiB 0.65-0.9x at 4 Gbit, 0.7-1.3x
  // at 1 Gbit (commit 2d349ba). 0 turns it off. Every
  // rank's staging holds up to 2.5 times this many bytes (at most 64 MiB).
  size_t rabenseifner_bytes = 512 << 10;
  // Where both apply (a power-of-two world of at least 4 ranks, over
  // messages), AllReduce above this many bytes runs Rabenseifner instead of
  // recursive doubling (up to recursive_doubling_bytes). Which is faster
  // depends on the link and on how many ranks share a core (Note [Recursive
  // doubling or Rabenseifner] in comm/ucx/algorithms.h); 32 KiB did best of
  // 8-64 KiB on 4 and 8 emulated hosts over 1 and 4 Gbit.
  size_t rabenseifner_from_bytes = 32 << 10;
  // How collectives over messages open (Note [Linear round] in
  // comm/ucx/descriptor_round.h). kRecursiveDoubling: the descriptor round,
  // log2(p) rounds of latency in p log2 p messages. kLinear: every rank's
  // descriptor to rank 0, which judges them and answers each rank: two
  // rounds in 2(p-1) messages, for worlds where messages cost CPU time that
  // ranks do not have. kAuto: linear where some machine runs more ranks than
  // it has cores (every rank publishes its machine and core count, so all
  // decide alike) and there are at least 5 ranks (kLinearMinRanks in
  // comm/ucx/algorithms.h), recursive doubling otherwise.
  enum class Opening { kAuto, kRecursiveDoubling, kLinear };
  Opening opening = Opening::kAuto;
  // Where the linear round opens, AllReduce of up to this many bytes rides
  // in it (rank 0 reduces in rank order and sends every rank the result);
  // up to the recursive-doubling range, recursive doubling follows it, and
  // the ring above. Rank 0 receives and sends p-1 copies, so this stays
  // small: on 4 and 8 emulated hosts sharing 2 cores OpenMPI's linear
  // allreduce was its fastest up to 4 KiB and lost to recursive doubling
  // and Rabenseifner at 32 KiB (commit 2a2c117).
  size_t linear_bytes = 4 << 10;
  // Where not 0: AllReduce over messages above 4 KiB and up to this many
  // bytes, in a world of at least 3 ranks, chooses its algorithm by timing
  // the candidates on its first calls (Rabenseifner, above 32 KiB the ring,
  // recursive doubling, and up to 64 KiB, where ranks outnumber a machine's
  // cores, the linear round), per size class, each twice the last: rank 0
  // decides and every rank switches after the same collective (Note
  // [Measured choice] in comm/ucx/measured_choice.h). Rank 0 goes on timing
  // the choice, and where it runs 1.5x dearer than the next candidate's last
  // cost (and than in its own trial) the class switches to that one, at most
  // 3 times (Note [Watching the choice]). A class's trial takes up to 103
  // calls (135 with four candidates), and a first switch comes 81 calls
  // after the decision at the soonest; a benchmark's warm-up of about 300
  // calls per size covers both, though a switch may come later. The candidates add
  // in different orders, so inexact sums may differ in their last bits
  // between the trial, later calls and calls after a switch (every rank
  // still holds the same bits). The classes stop where the table stops
  // carrying AllReduce in a round (rabenseifner_bytes in power-of-two
  // worlds of at least 4 ranks, recursive_doubling_bytes in others).
  // 0: the static table alone.
  size_t measured_choice_bytes = 512 << 10;
  // Pipeline chunk of the ring algorithm. Small enough that a received chunk
  // is still in cache when it is reduced.
  size_t chunk_bytes = 256 << 10;
  // UCX transports (UCX_TLS) for this communicator; empty leaves UCX's own
  // choice (and the UCX_TLS environment variable) in force. The default keeps
  // shared-memory messaging on sysv: UCX 1.13 cannot unpack a remote key of
  // memory it allocated once its posix transport is also enabled, which the
  // shared-memory path below needs. Edges map a user's UCX_TLS here.
  std::string transports = "sysv,cma,self,tcp";
  // On one host, large AllReduce runs over shared memory that UCX maps into
  // every rank (ucp_mem_map + ucp_rkey_ptr) instead of the tag ring: ranks
  // reduce straight out of each other's staging with no kernel copies. Used
  // only when every rank can map every other rank's staging; otherwise (e.g.
  // UCX_TLS=tcp, or ranks on several hosts) recursive doubling or the ring
  // runs.
  bool use_shared_memory = true;
  // Bytes each rank owns per round of the shared-memory algorithm: a
  // multiple of 64 (a cache line), so that every element and counter in the
  // segments is aligned.
  size_t shm_chunk_bytes = 128 << 10;
  // How a rank writes its shared-memory staging (Note [Streaming into the
  // staging] and Note [Choosing how to stage] in comm/ucx/shm_allreduce.h):
  // kAuto times both kinds of store on the job's own allreduces of 256 KiB
  // and more and runs the faster (smaller ones: cached); kCached always uses
  // ordinary stores, which are faster where the ranks' cores share a cache;
  // kStreamed non-temporal stores for every copy of 16 KiB and more, which
  // keep the bandwidth where they share none.
  enum class ShmStores { kAuto, kCached, kStreamed };
  ShmStores shm_stores = ShmStores::kAuto;
  // On one host, AllReduce of at least this many bytes reads the peers'
  // buffers in place by cross-memory attach, one kernel copy instead of
  // staging (Note [Single-copy allreduce] in comm/ucx/shm_allreduce.h),
  // where the kernel lets every rank read every other (found at set-up;
  // else every call stages), up to cma_max_bytes: above it the staged
  // rounds, whose streaming stores spare the writes a read-for-ownership,
  // were faster (2 local ranks: 2-8 MiB 1.06-1.18x the staged rounds'
  // speed, 32-64 MiB 0.81-0.84x; below 2 MiB no clear gain). 0: never.
  size_t cma_min_bytes = size_t{2} << 20;
  size_t cma_max_bytes = size_t{8} << 20;
  // Where the transports are TCP only (nothing but tcp and self, in
  // `transports` or a TLS in ucx_config: every peer is reached through
  // sockets), messages of up to this
  // many bytes go eagerly (UCX's RNDV_THRESH) instead of by rendezvous, whose
  // handshake costs a round trip per message. Measured on 8 emulated hosts
  // at 1 Gbit (2 cores), a 256 KiB allreduce took 11.4 ms with UCX's own
  // threshold and 4.2 ms with every ring message eager. The default covers
  // the largest message the algorithms send (chunk_bytes). 0 leaves UCX's
  // choice; so does an RNDV_THRESH in ucx_config or a UCX_RNDV_THRESH in the
  // environment. Over RDMA transports rendezvous is the zero-copy path and
  // UCX's choice always stands. UCX's TCP receive segments (RX_SEG_SIZE,
  // 64 KiB by default) are set to the same size unless the user set them:
  // messages of exactly 128 KiB (Rabenseifner's at 256 KiB) were 2-5x slow
  // with 64 KiB segments on 8 emulated hosts at 1 Gbit.
  size_t tcp_eager_bytes = 256 << 10;
  // UCX configuration overrides applied with ucp_config_modify, e.g.
  // {"TLS", "tcp,cma"}; UCX_* environment variables still apply underneath.
  std::vector<std::pair<std::string, std::string>> ucx_config;
  // Note [Progress without sleeping] (comm/async_core.h): how long
  // the progress thread keeps looking for the next collective (yielding the
  // core on every look) after the queue runs empty, before it blocks until
  // an issue wakes it. A collective issued within this window starts with no
  // wake-up, but a launch that finds the thread spinning rather than asleep
  // waits behind its core's other threads (Note [Sharing a core with the
  // progress thread]): 0 by default. Back-to-back small non-blocking calls
  // from a thread on the same core are faster with 50 us and nice 0.
  absl::Duration progress_spin = absl::ZeroDuration();
  // Note [Waiters first] (comm/async_core.h): a non-blocking call of at
  // most 64 KiB issued within this long of its issuer's wait for the
  // previous call, which came within this long of that call's issue, is run
  // by its waiter, and the
  // progress thread takes it only once this long has passed with nobody
  // waiting. 0: every call wakes the progress thread.
  absl::Duration waiter_window = absl::Microseconds(200);
  // The progress thread's nice value (0: the caller's), where this
  // machine's ranks do not outnumber its cores (Note [Sharing a core with
  // the progress thread]). Where the process may not take it, the thread
  // runs at the caller's.
  int progress_nice = -10;
  // The progress thread's requested slice (comm/thread_sched.h, Note
  // [Slices, not weights]); 0 leaves the kernel's default (3 ms). Applied
  // where progress_nice is.
  absl::Duration progress_slice = absl::ZeroDuration();
  // Whether a non-blocking allreduce issued to an idle communicator on one
  // host has its first step run by the issuing thread: its descriptor (with
  // a small allreduce's data) published and the first round of the
  // shared-memory allreduce staged, before the progress thread wakes for
  // the rest (Note [The issuer begins] in comm/async_core.h). kAuto: where
  // this machine's ranks, each with a progress thread, outnumber its cores,
  // so that waking the thread means taking a core from someone; kOn, kOff:
  // always, never. Local: ranks need not agree.
  enum class IssuerBegins { kAuto, kOn, kOff };
  IssuerBegins issuer_begins = IssuerBegins::kAuto;
  // Ask UCX to report failed peers (UCP_ERR_HANDLING_MODE_PEER): a collective
  // waiting on a rank that died then fails with Unavailable instead of
  // waiting for the caller's deadline. UCX 1.13 supports this only over TCP,
  // so it turns off the shared-memory transports and costs most of the
  // bandwidth on one host; off by default.
  bool detect_peer_failure = false;
  // How long one collective may wait for its peers before it fails with
  // DeadlineExceeded naming the operation and the ranks it was waiting for
  // (Note [Timeout post-mortem] in comm/fault.h); the communicator is then
  // unusable until recreated. Must exceed the longest time one rank can
  // legitimately reach a collective after another (checkpointing, uneven
  // data loading): a rank that late is indistinguishable from a dead one.
  // Edges set it from FUSEBOX_TIMEOUT_S or --timeout_s.
  absl::Duration timeout = absl::Seconds(300);
  // Deadline for exchanging worker addresses.
  absl::Duration rendezvous_timeout = absl::Seconds(300);
};

struct MpiOptions {
  // As UcxOptions::timeout. MPI cannot cancel a collective: after a timeout
  // the library may still own the buffers of the collectives that were in
  // flight, so the process should report the error and exit.
  absl::Duration timeout = absl::Seconds(300);
};

struct NcclOptions {
  // CUDA device ordinal; -1 means the local rank.
  int device = -1;
  // As UcxOptions::timeout; a timed-out communicator is aborted
  // (ncclCommAbort), which also stops its kernels.
  absl::Duration timeout = absl::Seconds(300);
  absl::Duration rendezvous_timeout = absl::Seconds(300);
};

struct BackendOptions {
  UcxOptions ucx;
  MpiOptions mpi;
  NcclOptions nccl;
};

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_OPTIONS_H_
