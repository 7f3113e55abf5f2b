// Host memory for buffers that something times: page-aligned and faulted in.
#ifndef FUSEBOX_COMM_HOST_PAGES_H_
#define FUSEBOX_COMM_HOST_PAGES_H_

#include <cstddef>
#include <cstdlib>
#include <memory>

#include "absl/status/statusor.h"

namespace fusebox::comm {

struct FreeDeleter {
  void operator()(void* p) const noexcept { std::free(p); }
};
using HostPages = std::unique_ptr<std::byte[], FreeDeleter>;

// At least `bytes` (rounded up to whole 4 KiB pages, at least one), starting
// on a page boundary and zero-filled, so that its pages are faulted in
// before anything times a copy into it. A buffer from new[] or malloc is
// only 16-byte aligned: large blocks start 16 bytes past a page, where the
// shared-memory allreduce split every cache line it copied (Note [Timing on
// aligned buffers] in autotune/measure.cc). Fails with ResourceExhausted.
absl::StatusOr<HostPages> AllocateHostPages(size_t bytes);

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_HOST_PAGES_H_
