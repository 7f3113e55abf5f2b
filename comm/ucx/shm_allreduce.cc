#include "comm/ucx/shm_allreduce.h"

#include <sched.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
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
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared counters must be lock-free");
constexpr size_t kControlBytes = (sizeof(Control) + 4095) / 4096 * 4096;

Control* ControlOf(unsigned char* base) { return reinterpret_cast<Control*>(base); }

// Waits until `counter` of every rank reaches `target`, yielding the core now
// and then so that oversubscribed ranks get to run. Gives up, touching no
// shared state, when `abort` is set or a peer has given up.
absl::Status WaitAll(const std::vector<unsigned char*>& bases,
                     std::atomic<uint64_t> Control::*counter, uint64_t target,
                     const std::atomic<bool>& abort) {
  for (size_t r = 0; r < bases.size(); ++r) {
    std::atomic<uint64_t>& c = ControlOf(bases[r])->*counter;
    for (unsigned spins = 0; c.load(std::memory_order_acquire) < target; ++spins) {
      if ((spins & 255) == 255) {
        if (abort.load(std::memory_order_relaxed)) {
          return absl::CancelledError("communicator destroyed while a collective was in flight");
        }
        if (ControlOf(bases[r])->aborted.load(std::memory_order_acquire) != 0) {
          return absl::AbortedError(absl::StrCat(
              "rank ", r, " abandoned the shared-memory allreduce (its communicator was destroyed)"));
        }
        sched_yield();
      }
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
  }
  return absl::OkStatus();
}

}  // namespace

size_t ShmSegmentBytes(int size, size_t chunk_bytes) {
  return kControlBytes + kSlots * static_cast<size_t>(size) * chunk_bytes;
}

void InitShmSegment(unsigned char* base) { std::memset(base, 0, kControlBytes); }

absl::Status ShmAllReduce(const ShmGroup& g, const void* send, void* recv,
                          size_t count, DataType type, ReduceOp op,
                          uint64_t* rounds, const std::atomic<bool>& abort) {
  const size_t esize = DataTypeSize(type);
  const int p = g.size;
  const auto* in = static_cast<const unsigned char*>(send);
  auto* out = static_cast<unsigned char*>(recv);
  const size_t slot_bytes = static_cast<size_t>(p) * g.chunk_bytes;
  const size_t per_round = std::max<size_t>(1, g.chunk_bytes / esize) * p;
  const size_t nrounds = (count + per_round - 1) / per_round;
  Control* const ctl = ControlOf(g.bases[g.rank]);
  const auto slot = [&](int r, uint64_t round) {
    return g.bases[r] + kControlBytes + (round % kSlots) * slot_bytes;
  };
  const auto give_up = [&](absl::Status st) {
    ctl->aborted.store(1, std::memory_order_release);  // peers must not wait for us
    return st;
  };

  for (size_t k = 0; k < nrounds; ++k) {
    const uint64_t round = ++*rounds;  // 1-based, global across collectives
    const size_t first = k * per_round;
    const std::vector<Range> sub = SplitEven(std::min(per_round, count - first), esize, p);
    const size_t base = first * esize;
    if (round > kSlots) {  // the slot is free once every rank has read it
      absl::Status st = WaitAll(g.bases, &Control::consumed, round - kSlots, abort);
      if (!st.ok()) return give_up(st);
    }
    unsigned char* my_slot = slot(g.rank, round);
    for (int j = 0; j < p; ++j) {
      // My own sub-block is read from the input before the output (in-place:
      // the same memory) is written, so it needs no copy.
      if (j != g.rank && sub[j].len != 0) {
        std::memcpy(my_slot + sub[j].off, in + base + sub[j].off, sub[j].len);
      }
    }
    ctl->ready.store(round, std::memory_order_release);
    if (absl::Status st = WaitAll(g.bases, &Control::ready, round, abort); !st.ok()) {
      return give_up(st);
    }

    const Range mine = sub[g.rank];
    if (mine.len != 0) {
      const size_t n = mine.len / esize;
      unsigned char* dst = out + base + mine.off;
      const unsigned char* acc = in + base + mine.off;
      for (int j = 0; j < p; ++j) {
        if (j == g.rank) continue;
        Reduce(acc, slot(j, round) + mine.off, dst, n, type, op);
        acc = dst;
      }
      if (p == 1 && dst != acc) std::memcpy(dst, acc, mine.len);
      if (op == ReduceOp::kAvg) FinishAvg(dst, n, type, p);
      std::memcpy(my_slot + mine.off, dst, mine.len);
    }
    ctl->reduced.store(round, std::memory_order_release);
    if (absl::Status st = WaitAll(g.bases, &Control::reduced, round, abort); !st.ok()) {
      return give_up(st);
    }

    for (int j = 0; j < p; ++j) {
      if (j == g.rank || sub[j].len == 0) continue;
      std::memcpy(out + base + sub[j].off, slot(j, round) + sub[j].off, sub[j].len);
    }
    ctl->consumed.store(round, std::memory_order_release);
  }
  return absl::OkStatus();
}

}  // namespace fusebox::comm::ucx
