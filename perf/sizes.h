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

// For the baselines' hand-rolled argument loops: true and *out set when
// `text` is a valid byte size (ParseBytes) or a decimal integer in [0, max].
bool ParseBytesArg(const char* text, size_t* out);
bool ParseIntArg(const char* text, int max, int* out);

}  // namespace fusebox::perf

#endif  // FUSEBOX_PERF_SIZES_H_
