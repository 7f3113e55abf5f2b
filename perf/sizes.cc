#include "perf/sizes.h"

#include <cstdint>
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

}  // namespace fusebox::perf
