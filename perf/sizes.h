// Byte sizes as users type them on command lines ("8", "256K", "64M", "1G").
#ifndef FUSEBOX_PERF_SIZES_H_
#define FUSEBOX_PERF_SIZES_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fusebox::perf {

// Parses a byte count with an optional K/M/G suffix (binary multiples, as
// nccl-tests) and an optional trailing "B"; at most 1 TiB.
absl::StatusOr<size_t> ParseBytes(absl::string_view text);

}  // namespace fusebox::perf

#endif  // FUSEBOX_PERF_SIZES_H_
