#include "comm/ucx/shm_allreduce.h"

#include <sched.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/reduce.h"
#include "comm/ucx/ranges.h"

namespace fusebox::comm::ucx {
namespace {

constexpr int kSlots = 4;
constexpr size_t kLine = 64;

// Control block at the start of each rank's segment: counters written only by
// the owner, each in a cache line of its own.
struct Control {
  alignas(kLine) std::atomic<uint64_t> ready;
  alignas(kLine) std::atomic<uint64_t> reduced;
  alignas(kLine) std::atomic<uint64_t> consumed;
  alignas(kLine) std::atomic<uint64_t> aborted;  // non-zero: gave up mid-collective
  // Where in each slot its sub-blocks start, past the slot's line boundary
  // (Note [Staging in the buffer's phase]); written before `ready`.
  alignas(kLine) std::atomic<uint64_t> phase[kSlots];
  // The addresses of this rank's send and recv buffers in its current
  // single-copy call (Note [Single-copy allreduce]); written before `ready`.
  alignas(kLine) std::atomic<uint64_t> cma_send;
  std::atomic<uint64_t> cma_recv;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared counters must be lock-free");
constexpr size_t kControlBytes = (sizeof(Control) + 4095) / 4096 * 4096;

Control* ControlOf(unsigned char* base) { return reinterpret_cast<Control*>(base); }

// A mailbox, cache-line aligned: the number of the exchange that last wrote
// it (its flag), the message's length, then the message. Flag and a small
// message share one cache line, so a reader that sees the flag has the data
// in the same transfer (Note [Shared-memory exchange]).
struct MailboxHead {
  std::atomic<uint64_t> exchange;
  uint64_t length;
};
static_assert(sizeof(MailboxHead) == 16, "the head is shared memory layout");
size_t MailboxStride(size_t mailbox_bytes) {
  return (sizeof(MailboxHead) + mailbox_bytes + kLine - 1) / kLine * kLine;
}

// Note [Staging in the buffer's phase]
// A round's sub-blocks move between the user's buffers and the staging
// slots, and the reduction reads a slot and the buffer side by side. Where
// the two start at different offsets within a cache line, every line of one
// of them is split across two: 2 local ranks reducing a buffer 16 bytes past
// a page (as malloc's large blocks are) ran at half the speed of one 64-byte
// aligned (commit 2c20a3d). So each slot has room to spare,
// and a round stages at the same offset within a line as its input has; the
// offset goes into the control block with the data, for the peers that read
// the slot. Ranks whose buffers differ in phase still agree on where each
// slot's data is; only their copies are split. The room is a page, not a
// line, so that for aligned buffers the layout is the one it was (slots on
// pages, with the default chunk): with a line's slack, one A/B had aligned
// 4 MiB allreduces at 0.68x (within this VM's scatter; the next, with the
// page, at 1.52x).
size_t SlotStride(int size, size_t chunk_bytes) {
  return (static_cast<size_t>(size) * chunk_bytes + kLine + 4095) / 4096 * 4096;
}

// Where the mailboxes start: after the staging slots, on a cache line of
// their own (chunk_bytes need not be a multiple of a line, and the flag must
// be aligned to be atomic).
size_t MailboxesOffset(int size, size_t chunk_bytes) {
  return (kControlBytes + kSlots * SlotStride(size, chunk_bytes) + kLine - 1) / kLine * kLine;
}

// Mailbox `which` (0 or 1) of the segment at `base`.
MailboxHead* Mailbox(const ShmGroup& g, unsigned char* base, uint64_t which) {
  return reinterpret_cast<MailboxHead*>(base + MailboxesOffset(g.size, g.chunk_bytes) +
                                        which * MailboxStride(g.mailbox_bytes));
}
unsigned char* MessageOf(MailboxHead* box) {
  return reinterpret_cast<unsigned char*>(box) + sizeof(MailboxHead);
}

// Note [Owning the line before writing it]
// A flag or counter that peers poll is read by them as soon as it changes,
// so the line that holds it sits in their caches. The owner's next write to
// it must first take the line back (a read-for-ownership that invalidates
// their copies), and the peers then fetch it again: two transfers between
// cores in series on the critical path of every exchange, where the
// store waits in the store buffer for the first. On this project's 2-vCPU
// VM one such transfer can take a third of a 0.5 us blocking 8 B allreduce.
// So right after an exchange's wait, a rank asks for the lines of its next
// mailbox in the exclusive state (prefetchw), while it still has the
// exchange to read and the next call to set up. A peer polls that mailbox's
// flag only once it has posted the next exchange itself, so on ranks that
// keep step the line is still this rank's when it posts, and its peers'
// first poll fetches it: one transfer instead of two. A peer already
// polling just takes the line back, and the write costs what it did
// without this. A prefetch changes no value, only where a line is. Where
// the issuing thread posts the next exchange (Note [The issuer begins]) and
// another thread ran this one, the line is owned by the wrong core; that
// case was not measured.
// Measured interleaved on 2 ranks (commit 19e8dfa):
// a blocking 8 B allreduce went from 1.06x to 0.90x OpenMPI's time, and
// with the coarse deadline clock (Note [The deadline's clock]) blocking
// allreduces of 8-256 B took 0.76-0.80x the time of the build before both.
// At most 1 KiB is owned ahead: owning the whole mailbox, with the counters
// of ShmAllReduce's rounds owned before the work whose end they announce,
// showed no gain from 4 KiB to 8 MiB (1.05x the time at 4 KiB and at
// 8 MiB), and was not kept.
constexpr size_t kOwnAheadBytes = 1024;  // of a mailbox, at most
void PrefetchForWrite(const void* line) {
#if defined(__x86_64__)
  // PREFETCHW: a no-op on x86-64 processors without it.
  asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(line)));
#else
  __builtin_prefetch(line, 1, 3);
#endif
}

// Values of Control::aborted (0: still in): why its owner gave up mid-collective.
constexpr uint64_t kAbortedDestroyed = 1;
constexpr uint64_t kAbortedFollowing = 2;    // another rank gave up first
constexpr uint64_t kAbortedReadFailed = 3;   // a single-copy read of a peer failed
constexpr uint64_t kAbortedTimeoutBase = 4;  // + the rank it timed out on

// A status, and the value this rank's `aborted` word gets so that peers can
// say why it left.
struct WaitResult {
  absl::Status status;
  uint64_t aborted = kAbortedDestroyed;
};

// Gives up mid-collective: the peers must not wait for this rank, and they
// learn why from its `aborted` word.
absl::Status GiveUp(std::atomic<uint64_t>& aborted, WaitResult w) {
  aborted.store(w.aborted, std::memory_order_release);
  return w.status;
}

// Waits until the counter `counter_of(base)` of every rank of `g` reaches
// `target`, yielding the core every g.yield_mask + 1 polls so that
// oversubscribed ranks get to run. Gives up, touching no shared state, when
// `abort` is set, a peer has given up, or `deadline` passes (the error then
// names every rank still behind); those are checked every 256 polls.
template <typename CounterOf>
WaitResult WaitAll(const ShmGroup& g, CounterOf counter_of, const char* stage, uint64_t target,
                   const std::atomic<bool>& abort, absl::Time deadline) {
  const std::vector<unsigned char*>& bases = g.bases;
  for (size_t r = 0; r < bases.size(); ++r) {
    std::atomic<uint64_t>& c = counter_of(bases[r]);
    for (unsigned spins = 1; c.load(std::memory_order_acquire) < target; ++spins) {
      if ((spins & g.yield_mask) == 0) {
        sched_yield();
      } else {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
      }
      if ((spins & 255) == 0) {
        if (abort.load(std::memory_order_relaxed)) {
          return {absl::CancelledError("communicator destroyed while a collective was in flight"),
                  kAbortedDestroyed};
        }
        // Any rank that gave up ends the collective, not only the one
        // waited on, and the error names the rank that gave up first (one
        // that left because another did is never the cause).
        for (size_t q = 0; q < bases.size(); ++q) {
          const uint64_t why = ControlOf(bases[q])->aborted.load(std::memory_order_acquire);
          if (why == kAbortedDestroyed) {
            return {absl::AbortedError(absl::StrCat(
                        "rank ", q,
                        " abandoned the shared-memory allreduce (its communicator was destroyed)")),
                    kAbortedFollowing};
          }
          if (why == kAbortedReadFailed) {
            return {absl::AbortedError(absl::StrCat(
                        "rank ", q,
                        " abandoned the shared-memory allreduce (a cross-memory read failed)")),
                    kAbortedFollowing};
          }
          if (why >= kAbortedTimeoutBase) {
            return {absl::AbortedError(absl::StrCat(
                        "rank ", q,
                        " abandoned the shared-memory allreduce after timing out waiting for rank ",
                        why - kAbortedTimeoutBase)),
                    kAbortedFollowing};
          }
        }
        if (absl::Now() >= deadline) {
          std::vector<size_t> behind;
          for (size_t q = 0; q < bases.size(); ++q) {
            if (counter_of(bases[q]).load(std::memory_order_acquire) < target) {
              behind.push_back(q);
            }
          }
          return {absl::DeadlineExceededError(absl::StrCat(
                      "shared-memory round ", target, " (", stage, ") still waiting for rank",
                      behind.size() == 1 ? " " : "s ", absl::StrJoin(behind, ", "))),
                  kAbortedTimeoutBase + (behind.empty() ? r : behind.front())};
        }
      }
    }
  }
  return {};
}

// Copies n bytes to dst with non-temporal stores where the target has them
// (SSE2), then fences them, so that a release store after it publishes the
// data (Note [Streaming into the staging]).
void StreamCopy(unsigned char* dst, const unsigned char* src, size_t n) {
#if defined(__SSE2__)
  const size_t head = (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16;
  if (n < head + 16) {
    std::memcpy(dst, src, n);
    return;
  }
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  for (; i + 16 <= n; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
  }
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

// A copy into this rank's staging, which its peers read next.
void StageCopy(const ShmGroup& g, unsigned char* dst, const unsigned char* src, size_t n) {
  if (g.stream_bytes != 0 && n >= g.stream_bytes) {
    StreamCopy(dst, src, n);
  } else {
    std::memcpy(dst, src, n);
  }
}

// The accessor WaitAll takes for one of the control block's counters.
auto ControlCounter(std::atomic<uint64_t> Control::*counter) {
  return [counter](unsigned char* base) -> std::atomic<uint64_t>& {
    return ControlOf(base)->*counter;
  };
}

}  // namespace

size_t ShmSegmentBytes(int size, size_t chunk_bytes, size_t mailbox_bytes) {
  return MailboxesOffset(size, chunk_bytes) + 2 * MailboxStride(mailbox_bytes);
}

void InitShmSegment(unsigned char* base, int size, size_t chunk_bytes, size_t mailbox_bytes) {
  const size_t bytes = ShmSegmentBytes(size, chunk_bytes, mailbox_bytes);
  if (FaultInGroup(size, bytes)) {
    // All of it: Note [Faulting the segments in].
    std::memset(base, 0, bytes);
    return;
  }
  std::memset(base, 0, kControlBytes);
  if (mailbox_bytes == 0) return;
  ShmGroup g;
  g.size = size;
  g.chunk_bytes = chunk_bytes;
  g.mailbox_bytes = mailbox_bytes;
  for (uint64_t which : {0, 1}) {
    std::memset(static_cast<void*>(Mailbox(g, base, which)), 0, sizeof(MailboxHead));
  }
}

void FaultInShmSegment(const unsigned char* base, size_t bytes) {
  const long page = sysconf(_SC_PAGESIZE);
  const size_t step = page > 0 ? static_cast<size_t>(page) : 4096;
  const volatile unsigned char* p = base;
  for (size_t off = 0; off < bytes; off += step) (void)p[off];
  if (bytes > 0) (void)p[bytes - 1];
}

int StagingChooser::ClassOf(size_t bytes) {
  int c = 0;
  for (size_t b = bytes / kMinBytes; b >= 4 && c < kClasses - 1; b /= 4) ++c;
  return c;
}

bool StagingChooser::Stream(size_t bytes) {
  if (bytes < kMinBytes) return false;
  Class& c = classes_[ClassOf(bytes)];
  const uint64_t n = c.calls++ % kExplore;
  if (n == 0) return true;
  if (n == kExplore / 2) return false;
  if (c.ns_per_byte[0] == 0) return false;
  if (c.ns_per_byte[1] == 0) return true;
  return c.ns_per_byte[1] < c.ns_per_byte[0];
}

void StagingChooser::Record(size_t bytes, bool stream, absl::Duration took) {
  if (bytes < kMinBytes) return;
  double& avg = classes_[ClassOf(bytes)].ns_per_byte[stream ? 1 : 0];
  // A faster sample replaces the figure (the first calls run cold, and an
  // exploration that finds a kind faster than it was must count at once);
  // a slower one counts for a quarter, and at most 4x the figure: one
  // preempted call moves it little, while the kind in use, timed on every
  // call, passes a faster kind's figure within a few calls.
  if (took <= absl::ZeroDuration()) return;
  const double x = absl::ToDoubleNanoseconds(took) / static_cast<double>(bytes);
  avg = avg == 0 || x < avg ? x : avg + 0.25 * (std::min(x, 4 * avg) - avg);
}

double StagingChooser::NsPerByte(size_t bytes, bool stream) const {
  return bytes < kMinBytes ? 0 : classes_[ClassOf(bytes)].ns_per_byte[stream ? 1 : 0];
}

namespace {

// One round's geometry: the elements [first, first + per_round) of the
// buffer, split into p sub-blocks.
struct RoundPlan {
  size_t esize = 0;
  size_t per_round = 0;  // elements per round
  size_t nrounds = 0;
  size_t slot_stride = 0;
};

RoundPlan PlanRounds(const ShmGroup& g, size_t count, DataType type) {
  RoundPlan r;
  r.esize = DataTypeSize(type);
  r.per_round = std::max<size_t>(1, g.chunk_bytes / r.esize) * g.size;
  r.nrounds = (count + r.per_round - 1) / r.per_round;
  r.slot_stride = SlotStride(g.size, g.chunk_bytes);
  return r;
}

// Rank r's slot for `round`, at the phase r staged it in (read after r's
// `ready` for the round, which publishes it). A peer's word is bounded
// here, as its segment is not ours to trust.
unsigned char* SlotOf(const ShmGroup& g, const RoundPlan& plan, int r, uint64_t round) {
  const uint64_t phase =
      ControlOf(g.bases[r])->phase[round % kSlots].load(std::memory_order_relaxed) % kLine;
  return g.bases[r] + kControlBytes + (round % kSlots) * plan.slot_stride + phase;
}

// Step 1 of a round (Note [UCX shared-memory allreduce]): this rank's
// sub-blocks but its own, of the round's elements from `base` bytes into
// the input, into its slot for `round`, published by `ready`. The slot must
// be free (consumed by every rank kSlots rounds before).
void StageRound(const ShmGroup& g, const RoundPlan& plan, const unsigned char* in, size_t base,
                const std::vector<Range>& sub, uint64_t round) {
  Control* const ctl = ControlOf(g.bases[g.rank]);
  // Whole elements: a peer reduces from the slot as T, so its data stays
  // aligned for T even where this rank's input is not.
  ctl->phase[round % kSlots].store(
      reinterpret_cast<uintptr_t>(in + base) % kLine / plan.esize * plan.esize,
      std::memory_order_relaxed);
  unsigned char* my_slot = SlotOf(g, plan, g.rank, round);
  for (int j = 0; j < g.size; ++j) {
    // My own sub-block is read from the input before the output (in-place:
    // the same memory) is written, so it needs no copy.
    if (j != g.rank && sub[j].len != 0) {
      StageCopy(g, my_slot + sub[j].off, in + base + sub[j].off, sub[j].len);
    }
  }
  ctl->ready.store(round, std::memory_order_release);
}

}  // namespace

bool ShmBeginAllReduce(const ShmGroup& g, const void* send, size_t count, DataType type,
                       uint64_t* rounds) {
  const RoundPlan plan = PlanRounds(g, count, type);
  if (plan.nrounds == 0) return false;
  const uint64_t round = *rounds + 1;
  if (round > kSlots) {  // free now, or not staged here (no waiting)
    for (unsigned char* base : g.bases) {
      if (ControlOf(base)->consumed.load(std::memory_order_acquire) < round - kSlots) return false;
    }
  }
  ++*rounds;
  const std::vector<Range> sub = SplitEven(std::min(plan.per_round, count), plan.esize, g.size);
  StageRound(g, plan, static_cast<const unsigned char*>(send), 0, sub, round);
  return true;
}

absl::Status ShmAllReduce(const ShmGroup& g, const void* send, void* recv, size_t count,
                          DataType type, ReduceOp op, uint64_t* rounds,
                          const std::atomic<bool>& abort, absl::Time deadline,
                          absl::Duration* waited, bool first_round_staged) {
  if (waited != nullptr) *waited = absl::ZeroDuration();
  const RoundPlan plan = PlanRounds(g, count, type);
  const size_t esize = plan.esize;
  const int p = g.size;
  const auto* in = static_cast<const unsigned char*>(send);
  auto* out = static_cast<unsigned char*>(recv);
  Control* const ctl = ControlOf(g.bases[g.rank]);
  const auto give_up = [ctl](WaitResult w) { return GiveUp(ctl->aborted, std::move(w)); };

  for (size_t k = 0; k < plan.nrounds; ++k) {
    const size_t first = k * plan.per_round;
    const std::vector<Range> sub = SplitEven(std::min(plan.per_round, count - first), esize, p);
    const size_t base = first * esize;
    uint64_t round = *rounds;  // 1-based, global across collectives
    if (k > 0 || !first_round_staged) {
      round = ++*rounds;
      if (round > kSlots) {  // the slot is free once every rank has read it
        WaitResult w = WaitAll(g, ControlCounter(&Control::consumed), "slot reuse", round - kSlots,
                               abort, deadline);
        if (!w.status.ok()) return give_up(std::move(w));
      }
      StageRound(g, plan, in, base, sub, round);
    }
    unsigned char* my_slot = SlotOf(g, plan, g.rank, round);
    const bool time_wait = k == 0 && waited != nullptr;
    const auto staged =
        time_wait ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    if (WaitResult w =
            WaitAll(g, ControlCounter(&Control::ready), "inputs staged", round, abort, deadline);
        !w.status.ok()) {
      return give_up(std::move(w));
    }
    if (time_wait) *waited = absl::FromChrono(std::chrono::steady_clock::now() - staged);

    const Range mine = sub[g.rank];
    if (mine.len != 0) {
      const size_t n = mine.len / esize;
      unsigned char* dst = out + base + mine.off;
      const unsigned char* acc = in + base + mine.off;
      for (int j = 0; j < p; ++j) {
        if (j == g.rank) continue;
        Reduce(acc, SlotOf(g, plan, j, round) + mine.off, dst, n, type, op);
        acc = dst;
      }
      if (p == 1 && dst != acc) std::memcpy(dst, acc, mine.len);
      if (op == ReduceOp::kAvg) FinishAvg(dst, n, type, p);
      StageCopy(g, my_slot + mine.off, dst, mine.len);
    }
    ctl->reduced.store(round, std::memory_order_release);
    if (WaitResult w = WaitAll(g, ControlCounter(&Control::reduced), "sub-blocks reduced",
                               round, abort, deadline);
        !w.status.ok()) {
      return give_up(std::move(w));
    }

    for (int j = 0; j < p; ++j) {
      if (j == g.rank || sub[j].len == 0) continue;
      std::memcpy(out + base + sub[j].off, SlotOf(g, plan, j, round) + sub[j].off, sub[j].len);
    }
    ctl->consumed.store(round, std::memory_order_release);
  }
  return absl::OkStatus();
}

namespace {

// Reads `n` bytes at `remote` in rank `peer`'s process into `dst`, in as
// many calls as the kernel needs (it may stop at a page boundary).
absl::Status ReadPeer(const ShmGroup& g, int peer, unsigned char* dst, uint64_t remote,
                      size_t n) {
  while (n > 0) {
    iovec local{dst, n};
    iovec far{reinterpret_cast<void*>(static_cast<uintptr_t>(remote)), n};
    const ssize_t got = process_vm_readv(g.pids[peer], &local, 1, &far, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return absl::InternalError(absl::StrCat(
          "single-copy allreduce: reading ", n, " bytes of rank ", peer, " (pid ", g.pids[peer],
          ") failed: ", got < 0 ? std::strerror(errno) : "nothing read"));
    }
    dst += got;
    remote += static_cast<uint64_t>(got);
    n -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CmaAllReduce(const ShmGroup& g, const void* send, void* recv, size_t count,
                          DataType type, ReduceOp op, uint64_t* rounds,
                          const std::atomic<bool>& abort, std::vector<unsigned char>* scratch,
                          absl::Time deadline) {
  if (static_cast<int>(g.pids.size()) != g.size) {
    return absl::FailedPreconditionError("single-copy allreduce: no cross-memory attach here");
  }
  const size_t esize = DataTypeSize(type);
  const int p = g.size;
  const auto* in = static_cast<const unsigned char*>(send);
  auto* out = static_cast<unsigned char*>(recv);
  Control* const ctl = ControlOf(g.bases[g.rank]);
  const auto give_up = [ctl](WaitResult w) { return GiveUp(ctl->aborted, std::move(w)); };
  const auto wait = [&](std::atomic<uint64_t> Control::*counter, const char* stage,
                        uint64_t round) {
    return WaitAll(g, ControlCounter(counter), stage, round, abort, deadline);
  };
  const std::vector<Range> sub = SplitEven(count, esize, p);
  const uint64_t round = ++*rounds;
  // 1. This call's addresses, published by `ready`.
  ctl->cma_send.store(reinterpret_cast<uintptr_t>(send), std::memory_order_relaxed);
  ctl->cma_recv.store(reinterpret_cast<uintptr_t>(recv), std::memory_order_relaxed);
  ctl->ready.store(round, std::memory_order_release);
  if (WaitResult w = wait(&Control::ready, "addresses published", round); !w.status.ok()) {
    return give_up(std::move(w));
  }
  // 2. My sub-block, a cache-sized piece at a time.
  const Range mine = sub[g.rank];
  const size_t piece = std::max(esize, g.chunk_bytes / esize * esize);
  scratch->resize(std::min(piece, mine.len));
  for (size_t off = 0; off < mine.len; off += piece) {
    const size_t n = std::min(piece, mine.len - off);
    unsigned char* dst = out + mine.off + off;
    const unsigned char* acc = in + mine.off + off;
    for (int j = 0; j < p; ++j) {
      if (j == g.rank) continue;
      const uint64_t peer_send = ControlOf(g.bases[j])->cma_send.load(std::memory_order_relaxed);
      if (absl::Status s = ReadPeer(g, j, scratch->data(), peer_send + mine.off + off, n);
          !s.ok()) {
        return give_up({s, kAbortedReadFailed});
      }
      Reduce(acc, scratch->data(), dst, n / esize, type, op);
      acc = dst;
    }
    if (acc != dst) std::memcpy(dst, acc, n);  // one rank: nothing reduced
    if (op == ReduceOp::kAvg) FinishAvg(dst, n / esize, type, p);
  }
  ctl->reduced.store(round, std::memory_order_release);
  if (WaitResult w = wait(&Control::reduced, "sub-blocks reduced", round); !w.status.ok()) {
    return give_up(std::move(w));
  }
  // 3. Every peer's sub-block straight into my output.
  for (int j = 0; j < p; ++j) {
    if (j == g.rank || sub[j].len == 0) continue;
    const uint64_t peer_recv = ControlOf(g.bases[j])->cma_recv.load(std::memory_order_relaxed);
    if (absl::Status s = ReadPeer(g, j, out + sub[j].off, peer_recv + sub[j].off, sub[j].len);
        !s.ok()) {
      return give_up({s, kAbortedReadFailed});
    }
  }
  ctl->consumed.store(round, std::memory_order_release);
  // 4. Nobody reads my buffers any more.
  if (WaitResult w = wait(&Control::consumed, "peers done reading", round); !w.status.ok()) {
    return give_up(std::move(w));
  }
  return absl::OkStatus();
}

absl::Status ProbeCrossMemoryAttach(int pid, uint64_t address, const void* expected,
                                    size_t bytes) {
  std::vector<unsigned char> buf(bytes);
  iovec local{buf.data(), bytes};
  iovec far{reinterpret_cast<void*>(static_cast<uintptr_t>(address)), bytes};
  const ssize_t got = process_vm_readv(pid, &local, 1, &far, 1, 0);
  if (got != static_cast<ssize_t>(bytes)) {
    return absl::FailedPreconditionError(
        absl::StrCat("process_vm_readv of pid ", pid, ": ",
                     got < 0 ? std::strerror(errno) : absl::StrCat(got, " of ", bytes, " bytes")));
  }
  if (std::memcmp(buf.data(), expected, bytes) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "process_vm_readv of pid ", pid,
        " read other bytes than its shared segment holds (a process in another PID namespace?)"));
  }
  return absl::OkStatus();
}

size_t ShmProbeOffset() { return offsetof(Control, cma_send); }

void SetShmProbeWord(unsigned char* base, uint64_t value) {
  ControlOf(base)->cma_send.store(value, std::memory_order_release);
}

void AllowCrossMemoryAttach() {
#if defined(PR_SET_PTRACER) && defined(PR_SET_PTRACER_ANY)
  // EINVAL where Yama is absent: nothing to allow.
  (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
#endif
}

unsigned char* ShmOutbox(const ShmGroup& g, uint64_t exchanges) {
  return MessageOf(Mailbox(g, g.bases[g.rank], (exchanges + 1) % 2));
}

absl::StatusOr<uint64_t> ShmPublish(const ShmGroup& g, size_t bytes, uint64_t* exchanges) {
  if (bytes > g.mailbox_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared-memory exchange: ", bytes, " bytes do not fit a mailbox of ", g.mailbox_bytes));
  }
  const uint64_t n = ++*exchanges;  // 1-based, the same on every rank
  // Mailbox n % 2 was last written for exchange n - 2, and every peer has
  // read it: each posted n - 1 (this rank waited for that in exchange n - 1),
  // and a rank posts only after reading all of its previous exchange.
  MailboxHead* mine = Mailbox(g, g.bases[g.rank], n % 2);
  mine->length = bytes;
  mine->exchange.store(n, std::memory_order_release);
  return n;
}

absl::Status ShmCollect(const ShmGroup& g, uint64_t n, std::vector<const unsigned char*>* messages,
                        std::vector<size_t>* lengths, const std::atomic<bool>& abort,
                        absl::Time deadline) {
  Control* const ctl = ControlOf(g.bases[g.rank]);
  const auto flag_of = [&g, n](unsigned char* base) -> std::atomic<uint64_t>& {
    return Mailbox(g, base, n % 2)->exchange;
  };
  WaitResult w = WaitAll(g, flag_of, "exchange", n, abort, deadline);
  if (!w.status.ok()) return GiveUp(ctl->aborted, std::move(w));
  messages->resize(g.size);
  lengths->resize(g.size);
  for (int r = 0; r < g.size; ++r) {
    MailboxHead* box = Mailbox(g, g.bases[r], n % 2);
    (*messages)[r] = MessageOf(box);
    // A peer's segment is untrusted as far as sizes go.
    (*lengths)[r] = std::min<uint64_t>(box->length, g.mailbox_bytes);
    // Every line of every message in flight at once, as a copy would have
    // had them, before the caller reads them one after the other.
    for (size_t off = kLine; off < (*lengths)[r] + sizeof(MailboxHead); off += kLine) {
      __builtin_prefetch(reinterpret_cast<const unsigned char*>(box) + off);
    }
  }
  // Every peer has read exchange n - 1 (it posted n), so mailbox
  // (n + 1) % 2 is this rank's to write: own its lines now, as many as this
  // exchange's message took (Note [Owning the line before writing it]). A
  // peer already waiting for exchange n + 1 polls its flag meanwhile and
  // takes that line back; the write then costs what it did without this.
  auto* next = reinterpret_cast<unsigned char*>(Mailbox(g, g.bases[g.rank], (n + 1) % 2));
  const size_t span = std::min(sizeof(MailboxHead) + (*lengths)[g.rank], kOwnAheadBytes);
  for (size_t off = 0; off < span; off += kLine) PrefetchForWrite(next + off);
  return absl::OkStatus();
}

absl::Status ShmPost(const ShmGroup& g, size_t bytes, std::vector<const unsigned char*>* messages,
                     std::vector<size_t>* lengths, uint64_t* exchanges,
                     const std::atomic<bool>& abort, absl::Time deadline) {
  absl::StatusOr<uint64_t> n = ShmPublish(g, bytes, exchanges);
  if (!n.ok()) return n.status();
  return ShmCollect(g, *n, messages, lengths, abort, deadline);
}

}  // namespace fusebox::comm::ucx
