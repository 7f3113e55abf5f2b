#include "comm/thread_sched.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace fusebox::comm {
namespace {

// struct sched_attr (include/uapi/linux/sched/types.h), first version: glibc
// 2.36 declares neither it nor the system calls.
struct SchedAttr {
  uint32_t size;
  uint32_t sched_policy;
  uint64_t sched_flags;
  int32_t sched_nice;
  uint32_t sched_priority;
  uint64_t sched_runtime;
  uint64_t sched_deadline;
  uint64_t sched_period;
};
static_assert(sizeof(SchedAttr) == 48, "SCHED_ATTR_SIZE_VER0");

pid_t ThisThreadId() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

}  // namespace

absl::Status SetThisThreadScheduling(int nice, absl::Duration slice) {
  const pid_t tid = ThisThreadId();
  // On Linux the nice value is per thread: PRIO_PROCESS with a thread id
  // sets this one only.
  if (nice != 0 && ::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), nice) != 0) {
    const int e = errno;
    return absl::PermissionDeniedError(
        absl::StrCat("could not take nice ", nice, " (", std::strerror(e),
                     "; a negative value needs CAP_SYS_NICE or RLIMIT_NICE)"));
  }
  if (slice <= absl::ZeroDuration()) return absl::OkStatus();
  // Where only the slice fails, the nice value set above stays: say so.
  const std::string kept = nice != 0 ? absl::StrCat("; its nice value is now ", nice) : "";
  const int policy = ::sched_getscheduler(0);
  if (policy < 0 || (policy & ~SCHED_RESET_ON_FORK) != SCHED_OTHER) {
    return absl::FailedPreconditionError(absl::StrCat(
        "could not request a slice: it applies to SCHED_OTHER threads only, and this one runs "
        "under another policy",
        kept));
  }
  errno = 0;
  const int current_nice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
  if (current_nice == -1 && errno != 0) {
    const int e = errno;
    return absl::InternalError(absl::StrCat("getpriority: ", std::strerror(e), kept));
  }
  SchedAttr attr{};
  attr.size = sizeof(attr);
  attr.sched_policy = SCHED_OTHER;
  // SCHED_FLAG_RESET_ON_FORK (0x01): keep it where the thread had it.
  if ((policy & SCHED_RESET_ON_FORK) != 0) attr.sched_flags = 0x01;
  attr.sched_nice = current_nice;  // sched_setattr sets it too: keep it
  attr.sched_runtime = static_cast<uint64_t>(absl::ToInt64Nanoseconds(slice));
  if (::syscall(SYS_sched_setattr, 0, &attr, 0) != 0) {
    const int e = errno;
    const std::string what =
        absl::StrCat("could not request a slice of ", absl::FormatDuration(slice),
                     " (sched_setattr: ", std::strerror(e), ")", kept);
    // Kernels without the call (ENOSYS), or sandboxes that refuse it (EPERM:
    // seccomp, some container runtimes).
    if (e == ENOSYS) return absl::UnimplementedError(what);
    if (e == EPERM) return absl::PermissionDeniedError(what);
    return absl::InternalError(what);
  }
  return absl::OkStatus();
}

absl::Duration ThisThreadSlice() {
  SchedAttr attr{};
  if (::syscall(SYS_sched_getattr, 0, &attr, sizeof(attr), 0) != 0) return absl::ZeroDuration();
  if (attr.sched_policy != SCHED_OTHER) return absl::ZeroDuration();
  return absl::Nanoseconds(static_cast<int64_t>(attr.sched_runtime));
}

}  // namespace fusebox::comm
