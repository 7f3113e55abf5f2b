#include "comm/host_pages.h"

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fusebox::comm {

absl::StatusOr<HostPages> AllocateHostPages(size_t bytes) {
  constexpr size_t kPage = 4096;
  const size_t rounded = (std::max<size_t>(bytes, 1) + kPage - 1) / kPage * kPage;
  if (rounded < bytes) {  // wrapped
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  HostPages p(static_cast<std::byte*>(std::aligned_alloc(kPage, rounded)));
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  std::memset(p.get(), 0, rounded);  // faulted in before any timing
  return p;
}

}  // namespace fusebox::comm
