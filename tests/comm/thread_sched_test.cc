#include "comm/thread_sched.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "gtest/gtest.h"

namespace fusebox::comm {
namespace {

int ThisThreadNice() {
  errno = 0;
  return ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
}

// Each case runs on a thread of its own: the settings are per thread and
// must not leak into the test runner's.
template <typename F>
void OnAThread(F f) {
  std::thread t(f);
  t.join();
}

TEST(ThreadSchedTest, RaisesTheNiceValueOfThisThreadOnly) {
  const int runner = ThisThreadNice();
  if (runner > 16) GTEST_SKIP() << "the runner's nice value is " << runner;
  OnAThread([&] {
    // Raising it is always allowed.
    ASSERT_TRUE(SetThisThreadScheduling(runner + 3, absl::ZeroDuration()).ok());
    EXPECT_EQ(ThisThreadNice(), runner + 3);
  });
  EXPECT_EQ(ThisThreadNice(), runner);
}

TEST(ThreadSchedTest, ASliceKeepsTheNiceValueAndIsReportedWhereTheKernelTakesOne) {
  OnAThread([] {
    const int nice = std::min(ThisThreadNice() + 2, 19);  // raising it is always allowed
    const absl::Duration kernel_default = ThisThreadSlice();
    absl::Status s = SetThisThreadScheduling(nice, absl::Microseconds(500));
    if (absl::IsUnimplemented(s) || absl::IsPermissionDenied(s)) {
      GTEST_SKIP() << "sched_setattr is not available here: " << s;
    }
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(ThisThreadNice(), nice);
    if (kernel_default == absl::ZeroDuration()) {
      GTEST_SKIP() << "this kernel reports no slice (before Linux 6.12)";
    }
    EXPECT_EQ(ThisThreadSlice(), absl::Microseconds(500));
  });
}

TEST(ThreadSchedTest, NothingToSetIsOk) {
  OnAThread([] {
    const int before = ThisThreadNice();
    const absl::Duration slice = ThisThreadSlice();
    EXPECT_TRUE(SetThisThreadScheduling(0, absl::ZeroDuration()).ok());
    EXPECT_EQ(ThisThreadNice(), before);
    EXPECT_EQ(ThisThreadSlice(), slice);
  });
}

}  // namespace
}  // namespace fusebox::comm
