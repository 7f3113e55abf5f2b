// Reading untrusted files with a size bound, and replacing files atomically:
// shared by plan files, timelines and profiles (and later the policy cache).
#ifndef FUSEBOX_BUCKETING_FILE_IO_H_
#define FUSEBOX_BUCKETING_FILE_IO_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fusebox::bucketing {

// The whole of `path`, reading at most one byte past `max_bytes` (so a pipe
// or /dev/zero, which have no useful size, are refused too). Errors start
// with the path: NotFound when it cannot be opened, InvalidArgument when it
// is larger than the limit, Unavailable on a read error.
absl::StatusOr<std::string> ReadFileBounded(const std::string& path, size_t max_bytes);

// Writes `contents` to a temporary file next to `path`, syncs it and renames
// it over `path`: readers see the old file or the new one, never a partial
// one. On error the temporary file is removed and `path` is untouched.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

}  // namespace fusebox::bucketing

#endif  // FUSEBOX_BUCKETING_FILE_IO_H_
