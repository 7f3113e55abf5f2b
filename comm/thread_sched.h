// How a thread of fusebox's own (the progress thread, the engine's worker)
// asks Linux's scheduler for the core: its nice value (its share of a core
// it contends for) and its slice (how soon it runs when it wakes).
#ifndef FUSEBOX_COMM_THREAD_SCHED_H_
#define FUSEBOX_COMM_THREAD_SCHED_H_

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace fusebox::comm {

// Note [Slices, not weights]
// Under EEVDF (Linux 6.6 and later) a runnable thread's virtual deadline is
// its eligible time plus its slice divided by its weight, and a thread that
// wakes preempts the running one only where its deadline is earlier. A
// thread that sleeps until work arrives and then needs the core for a few
// microseconds can therefore get it at once in two ways: a higher weight
// (a negative nice value, which also gives it that much more of the core
// while it polls, and needs CAP_SYS_NICE or RLIMIT_NICE), or a shorter slice
// (sched_attr::sched_runtime of a SCHED_OTHER thread, honoured from Linux
// 6.12 and clamped to 0.1-100 ms; the default is 3 ms), which moves its
// deadline forward without changing its share and needs no privilege.

// Sets the calling thread's nice value (`nice` != 0; 0 leaves it) and, where
// `slice` is positive, its requested slice (sched_setattr with
// sched_runtime; kernels before 6.12 accept and ignore it for SCHED_OTHER).
// The nice value is set first: where only the slice fails, the thread keeps
// the new nice value, and the error says so. Unimplemented where the kernel
// has no sched_setattr, PermissionDenied where it or a sandbox refuses it.
absl::Status SetThisThreadScheduling(int nice, absl::Duration slice);

// The calling thread's slice as the kernel reports it (sched_getattr's
// sched_runtime; 0 where the kernel reports none).
absl::Duration ThisThreadSlice();

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_THREAD_SCHED_H_
