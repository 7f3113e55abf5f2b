// comm/host_pages.h: what the timed buffers stand on.
#include "comm/host_pages.h"

#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace fusebox::comm {
namespace {

TEST(HostPagesTest, StartOnAPageAndAreZeroToTheLastPage) {
  for (size_t bytes :
       {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{4097}, size_t{3} << 20}) {
    absl::StatusOr<HostPages> p = AllocateHostPages(bytes);
    ASSERT_TRUE(p.ok()) << bytes << ": " << p.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p->get()) % 4096, 0u) << bytes;
    // Rounded up to whole pages (at least one) and zero-filled to the end:
    // every byte up to the page boundary is readable and 0.
    const size_t whole = bytes == 0 ? 4096 : (bytes + 4095) / 4096 * 4096;
    for (size_t i = 0; i < whole; i += 61)
      EXPECT_EQ(p->get()[i], std::byte{0}) << bytes << " @" << i;
    EXPECT_EQ(p->get()[whole - 1], std::byte{0}) << bytes;
  }
}

TEST(HostPagesTest, ASizeThatWrapsWhenRoundedIsRefused) {
  absl::StatusOr<HostPages> p = AllocateHostPages(std::numeric_limits<size_t>::max() - 10);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(p.status().message().find("cannot allocate"), std::string::npos) << p.status();
}

}  // namespace
}  // namespace fusebox::comm
