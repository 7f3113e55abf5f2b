// The shared-memory allreduce of the UCX backend, as a pure algorithm over
// segments that every rank of the group has mapped (the UCX backend maps them
// with ucp_mem_map + ucp_rkey_ptr; the unit tests use one process's memory).
//
// Note [UCX shared-memory allreduce]
// The buffer is processed in rounds of p sub-blocks of chunk_bytes; in round
// k rank r owns sub-block r:
//   1. copy my sub-blocks j != r into my staging slot; ready[r] = k
//   2. wait ready[*] >= k; reduce sub-block r from my input and every peer's
//      slot (my input first, then peers in rank order: deterministic); write
//      it to my output and back into my slot; reduced[r] = k
//   3. wait reduced[*] >= k; copy every peer's sub-block from its slot into
//      my output; consumed[r] = k
// A slot is reused kSlots rounds later, once consumed[*] says every peer has
// read it. Counters are monotonic across collectives (all ranks run the same
// rounds), written only by their owner, each in a cache line of its own.
// Staging stays in the last-level cache, so DRAM sees little more than one
// read of the input and one write of the output, and no kernel copies.
// A rank that gives up mid-collective (its communicator is destroyed, or it
// timed out waiting for a peer) says so in its control block (and on whom
// it timed out), and peers waiting on it fail naming it instead of spinning
// until their own deadline.
#ifndef FUSEBOX_COMM_UCX_SHM_ALLREDUCE_H_
#define FUSEBOX_COMM_UCX_SHM_ALLREDUCE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/types.h"

namespace fusebox::comm::ucx {

struct ShmGroup {
  int rank = 0;
  int size = 1;
  size_t chunk_bytes = 128 << 10;       // bytes a rank owns per round; a multiple of 64
  std::vector<unsigned char*> bases;    // every rank's segment, as mapped here
  // Largest message ShmPost carries (0: the segments have no mailboxes).
  size_t mailbox_bytes = 0;
  // A waiting rank yields its core every yield_mask + 1 polls (a power of two
  // minus one): rarely when every rank has a core of its own, at every poll
  // when ranks outnumber cores, where the rank waited for may be the one
  // that is descheduled.
  unsigned yield_mask = 255;
  // Copies into this rank's staging of at least this many bytes use
  // non-temporal stores (0: never; Note [Streaming into the staging]).
  size_t stream_bytes = 0;
  // Every rank's process id where every rank can read every other's memory
  // by cross-memory attach (Note [Single-copy allreduce]); empty: it cannot,
  // or it is not wanted, and every allreduce stages.
  std::vector<int> pids{};
  // Allreduces of cma_min_bytes to cma_max_bytes run CmaAllReduce where
  // `pids` allows.
  size_t cma_min_bytes = SIZE_MAX;
  size_t cma_max_bytes = 0;
};

// The smallest copy into the staging that streams where a rank streams.
constexpr size_t kStreamMinCopyBytes = 16 << 10;

// Note [Streaming into the staging]
// A rank writes its staging slot and its peers read it at once, so the
// data moves from one core's cache to another's. That is fast where the
// cores share a last-level cache and slow where they do not: on this
// project's 2-vCPU VM, phases of seconds to minutes where a writer-to-reader
// copy through shared memory ran at 1.5-2.6 GB/s instead of 5-6.6 GB/s,
// while a private memcpy kept 7 GB/s; the 24 MiB allreduce then took 16 ms
// instead of 3.5-5 ms. Non-temporal stores send the staged data to memory,
// where the reader finds it at memory speed either way (4-9 GB/s in both
// phases). Copies into the staging of at least ShmGroup::stream_bytes use
// them, followed by a store fence before the counter that publishes them;
// smaller copies stay in the cache, where a reader on a near core finds them
// sooner. The output, which only this rank reads, is written normally.
// Where the cores do share a cache, streaming costs: the same 24 MiB took
// 1.3-1.5x as long streamed, and 256 KiB-4 MiB 1.3-1.8x. So neither kind
// of store is right everywhere, and StagingChooser picks by measurement.
//
// Note [Choosing how to stage]
// Each rank times its own shared-memory allreduces of at least
// StagingChooser::kMinBytes, per size class (powers of 4), and keeps for each
// kind of store an average time per byte; it runs the kind whose average is
// lower (a faster time replaces the figure, a slower one counts for a
// quarter). Calls 0 and kExplore/2 of every kExplore of a class run streamed and
// cached in turn whatever the averages say, so the kind not chosen is
// measured again within kExplore calls, and a change of placement (a VM's
// vCPUs moved) is followed within kExplore calls of the class: where the
// kind in use turned slower than the other, the next exploration of the
// other finds it faster (sooner where the kind in use passes the other's
// old figure). Samples of no time (a clock that did not move) are
// ignored. How a rank writes its own
// staging changes no bits and needs no agreement; the ranks run the same
// collectives in the same order, so they explore on the same calls and the
// timing of an explored call is that kind's on every rank. The time counted
// starts once every rank has staged the first round, so that a peer that
// came late to the collective is not charged to a kind.
class StagingChooser {
 public:
  static constexpr size_t kMinBytes = 256 << 10;  // smaller: cached, never timed
  static constexpr int kClasses = 5;  // [256K, 1M), [1M, 4M), [4M, 16M), [16M, 64M), 64M+
  static constexpr uint64_t kExplore = 16;

  // Whether this rank's next shared-memory allreduce of `bytes` streams.
  bool Stream(size_t bytes);
  // How long the allreduce that Stream(bytes) answered `stream` took.
  void Record(size_t bytes, bool stream, absl::Duration took);
  // The average time per byte of a class's allreduces of that kind (ns; 0:
  // not measured yet).
  double NsPerByte(size_t bytes, bool stream) const;

 private:
  struct Class {
    uint64_t calls = 0;
    double ns_per_byte[2] = {0, 0};  // cached, streamed
  };
  static int ClassOf(size_t bytes);
  Class classes_[kClasses];
};

// The segments' layout, named in the ranks' agreement to share them (the
// UCX communicator's "ok" verdict): it changes with the layout, so that
// ranks of builds that lay segments out differently fall back to messages
// instead of reading each other at other offsets. 2: slots staged in the
// input's phase (Note [Staging in the buffer's phase]).
// 3: the control block carries each call's addresses (Note [Single-copy
// allreduce]).
constexpr int kShmLayoutVersion = 3;

// Bytes of one rank's segment (control block + staging slots + two
// mailboxes of mailbox_bytes, each with a 16-byte head).
size_t ShmSegmentBytes(int size, size_t chunk_bytes, size_t mailbox_bytes = 0);

// Note [Faulting the segments in]
// A page of a segment costs a page fault in each process the first time
// that process touches it, and on this VM a fault on shared memory costs
// several microseconds. The staging slots are used in turn, so the first
// kSlots allreduces of each new size touched pages none had touched: on 2
// local ranks the first four 32 KiB allreduces of a process took 70 us
// each (median of 6 runs) and 24 with the segments faulted in, those of
// 256 KiB 375 and 75 (commit 39f7110). The cost model's
// timings, taken in a
// new process one size after the other, had recorded those first calls as
// the sizes' cost (256 KiB as dear as 2 MiB). So the owner writes its whole
// segment before publishing it, and every rank reads every page of its
// peers' segments once every rank's layout is known to be the same (a
// peer's segment may otherwise be smaller than this rank's): the faults are
// paid once, in Init. Only where the group's segments come to at most
// kFaultInGroupBytes together (with the default 128 KiB chunk, up to 22
// ranks): beyond that, committing every page up front costs more memory
// than a first call's faults cost time, and they stay lazy.

constexpr size_t kFaultInGroupBytes = size_t{256} << 20;
// Whether a group of `size` segments of `segment_bytes` is faulted in.
inline bool FaultInGroup(int size, size_t segment_bytes) {
  return static_cast<size_t>(size) * segment_bytes <= kFaultInGroupBytes;
}

// Prepares a fresh segment of that geometry: zeroes its counters and its
// mailboxes' flags, and all the rest too (faulting every page in) where
// FaultInGroup. Call before publishing it.
void InitShmSegment(unsigned char* base, int size, size_t chunk_bytes, size_t mailbox_bytes = 0);

// Reads one byte of every page of a peer's segment as mapped here, so that
// this process faults its mapping in now (Note [Faulting the segments in]).
void FaultInShmSegment(const unsigned char* base, size_t bytes);

// recv = op over the group of send, `count` elements; in-place when
// send == recv. Every rank of the group calls it with the same arguments but
// its own buffers. `rounds` counts the rounds this rank has run on the group
// (start at 0; the function advances it). Returns Cancelled when `abort` is
// set, Aborted when a peer gave up, DeadlineExceeded naming the ranks still
// behind when `deadline` passes; the group is then unusable. `waited`, when
// given, is set to how long this rank waited for its peers to stage the
// first round (their lateness, not this collective's cost). With
// `first_round_staged`, ShmBeginAllReduce has staged the first round of this
// very call (the same send, count and type) and advanced `rounds` for it.
absl::Status ShmAllReduce(const ShmGroup& group, const void* send, void* recv, size_t count,
                          DataType type, ReduceOp op, uint64_t* rounds,
                          const std::atomic<bool>& abort,
                          absl::Time deadline = absl::InfiniteFuture(),
                          absl::Duration* waited = nullptr, bool first_round_staged = false);

// Note [Single-copy allreduce]
// Staging costs every byte a copy into a slot and, once reduced, a copy
// back and a copy out: on 2 local ranks 64 MiB reached a third of one
// thread's memcpy. With cross-memory attach (process_vm_readv: the kernel
// copies straight from another process's pages) a rank reads its peers'
// buffers where they are:
//   1. publish this call's send and recv addresses; ready = k
//   2. wait ready[*] >= k; for sub-block r (this rank's, SplitEven over the
//      whole buffer) in pieces of chunk_bytes: read each peer's send piece
//      into a scratch buffer that stays in cache, and reduce it into the
//      output (my input first, then peers in rank order, as the staged
//      rounds do); reduced = k
//   3. wait reduced[*] >= k; read every peer's reduced sub-block from its
//      recv straight into my recv (one copy, by the kernel); consumed = k
//   4. wait consumed[*] >= k: no peer reads my buffers any more, so the
//      caller may reuse them
// In place is safe: a rank writes its send's sub-block j != r (its recv)
// only in step 3, after every peer reduced (step 2 read it). The counters
// are the staged rounds' (one round per call), so the two kinds of call
// mix on one group. A peer's addresses come from its control block; a
// wrong one makes the read fail (EFAULT), and the call fails naming the
// peer. Whether the kernel lets every rank read every other is found once,
// at set-up (ProbeCrossMemoryAttach), and agreed: one rank refused and all
// stage. The result per element is that of the rank that owns it, so every
// rank gets the same bits; for 3 or more ranks the owner of an element may
// differ from the staged rounds', and so may its last bit.
absl::Status CmaAllReduce(const ShmGroup& group, const void* send, void* recv, size_t count,
                          DataType type, ReduceOp op, uint64_t* rounds,
                          const std::atomic<bool>& abort, std::vector<unsigned char>* scratch,
                          absl::Time deadline = absl::InfiniteFuture());

// Whether this process reads, by cross-memory attach (one process_vm_readv),
// the `bytes` at `address` in process `pid` as `expected` (what the same
// memory shows through a shared mapping): OK, or why not. The kernel may
// refuse (EPERM under a ptrace scope or a seccomp policy, ENOSYS, ESRCH for
// a process that is gone, EFAULT for an address not mapped there), or the
// pid may name another process (a peer in another PID namespace), whose
// bytes differ.
absl::Status ProbeCrossMemoryAttach(int pid, uint64_t address, const void* expected,
                                    size_t bytes);

// Where in a segment its owner writes a value of its own before publishing
// it (SetShmProbeWord), for peers to probe cross-memory attach with.
size_t ShmProbeOffset();
void SetShmProbeWord(unsigned char* base, uint64_t value);

// Where Yama restricts ptrace to descendants (ptrace_scope 1), lets any
// process of this user read this one by cross-memory attach
// (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY), as UCX's cma transport and
// Open MPI's shared-memory transport do); a no-op elsewhere.
void AllowCrossMemoryAttach();

// The first step of ShmAllReduce, without waiting for anyone (Note [The
// issuer begins] in comm/async_core.h): stages and publishes the first
// round of `count` elements of `send`, if its slot is free now (every rank
// has read the slot's previous round), and then returns true; false
// (nothing done) where the slot is not free yet or there is nothing to
// reduce. ShmAllReduce(..., first_round_staged = true) runs the rest.
bool ShmBeginAllReduce(const ShmGroup& group, const void* send, size_t count, DataType type,
                       uint64_t* rounds);

// Note [Shared-memory exchange]
// Every rank posts one message of up to mailbox_bytes and receives every
// rank's, with one write and one flag per rank and no network round trip:
// the UCX backend's header round (the collective's descriptor, with the
// data of a small collective behind it) when all ranks share the host.
// Exchange n writes mailbox n % 2 of this rank's segment (the message, then
// its length), then sets that mailbox's flag to n (release); it waits for
// the flag of every rank's mailbox n % 2 to reach n, and every rank's
// message is then read where it arrived (Note [Reading the mailboxes in
// place]). The flag sits in
// the same cache line as the length and the first 48 bytes of the message,
// so a small collective costs each reader one line transfer per peer, and
// the writer one (which Note [Owning the line before writing it] in
// shm_allreduce.cc takes off the critical path). No flag says "read": a
// rank writes mailbox n % 2 again only in exchange n + 2, after it saw every
// peer's flag reach n + 1, and a peer sets that flag only after it has
// finished reading exchange n. The caller compares the descriptors it
// received, so a mismatch is found on every rank, as with the network
// round. Abort, peers that gave up and the deadline behave as in
// ShmAllReduce.
//
// Note [Reading the mailboxes in place]
// The caller builds its message where it is sent and reads the others'
// where they arrived: ShmOutbox is where this rank's next message goes
// (mailbox_bytes of room), ShmPost publishes the `bytes` written there,
// waits, then points (*messages)[r] at rank r's message in its own segment
// and sets (*lengths)[r] to its length; `exchanges` counts this rank's
// exchanges (start at 0). The argument above keeps the messages there:
// rank r writes that mailbox again only in exchange n + 2, after this
// rank's next post. So they may be read until this rank posts again, and
// no copy is made (ShmPost prefetches every line
// of every message, as a copy would have had them in flight together). The
// UCX backend's header round built its message in a slot of its own, copied
// it into the mailbox and every mailbox out again before reducing: 4 copies
// of a small allreduce's data where 1 is needed. Read in place, 2 local
// ranks: 2 KiB 0.79 -> 0.69 us, 512 B 0.40 -> 0.36 us (medians of 16
// interleaved rounds, faster in 13-14 of them; 8 B unchanged within the
// scatter; commit 99a7bfa).
unsigned char* ShmOutbox(const ShmGroup& group, uint64_t exchanges);
absl::Status ShmPost(const ShmGroup& group, size_t bytes,
                     std::vector<const unsigned char*>* messages, std::vector<size_t>* lengths,
                     uint64_t* exchanges, const std::atomic<bool>& abort,
                     absl::Time deadline = absl::InfiniteFuture());
// ShmPost's two halves, for a message published on one thread and waited
// for on another (Note [The issuer begins] in comm/async_core.h):
// ShmPublish publishes the `bytes` written at ShmOutbox and returns the
// exchange's number (it never waits); ShmCollect(n) waits for every rank's
// message of exchange n and points at them as ShmPost does. This rank must
// collect exchange n before it publishes again.
absl::StatusOr<uint64_t> ShmPublish(const ShmGroup& group, size_t bytes, uint64_t* exchanges);
absl::Status ShmCollect(const ShmGroup& group, uint64_t exchange,
                        std::vector<const unsigned char*>* messages, std::vector<size_t>* lengths,
                        const std::atomic<bool>& abort,
                        absl::Time deadline = absl::InfiniteFuture());

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_SHM_ALLREDUCE_H_
