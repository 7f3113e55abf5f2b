#include "perf/sizes.h"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace fusebox::perf {

absl::StatusOr<size_t> ParseBytes(absl::string_view text) {
  std::string t = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(text));
  uint64_t mult = 1;
  if (t.size() > 1 && t.back() == 'B') t.pop_back();  // "64MB", "8B"
  if (!t.empty()) {
    switch (t.back()) {
      case 'K': mult = 1ull << 10; break;
      case 'M': mult = 1ull << 20; break;
      case 'G': mult = 1ull << 30; break;
      default: break;
    }
    if (mult != 1) t.pop_back();
  }
  uint64_t v = 0;
  if (t.empty() || !absl::SimpleAtoi(t, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad size '", text, "' (expected e.g. 8, 256K, 64M, 1G)"));
  }
  if (v > (1ull << 40) / mult) {
    return absl::InvalidArgumentError(absl::StrCat("size '", text, "' is larger than 1 TiB"));
  }
  return static_cast<size_t>(v * mult);
}

bool ParseBytesArg(const char* text, size_t* out) {
  auto v = ParseBytes(text);
  if (!v.ok()) return false;
  *out = *v;
  return true;
}

bool ParseIntArg(const char* text, int max, int* out) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || v < 0 || v > max) return false;
  *out = static_cast<int>(v);
  return true;
}

}  // namespace fusebox::perf
