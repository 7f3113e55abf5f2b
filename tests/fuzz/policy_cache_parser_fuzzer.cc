// Fuzz target: policy-cache files (autotune/policy_cache.h): one entry file
// (ParseCacheEntry, what Lookup, Nearest and List read) and an export bundle
// (ParseCacheBundle, what Import reads). Both run on every input.
//
// Invariants: an entry that parses has a valid key whose file name stays
// inside the cache directory, and round-trips through SerializeCacheEntry
// (a fixed point); every entry a bundle yields is as valid as a file's.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "autotune/policy_cache.h"
#include "tests/fuzz/fuzz_check.h"

namespace fusebox::autotune {
namespace {

void CheckEntry(const CacheEntry& e) {
  absl::Status key = e.key.Validate();
  FUZZ_CHECK(key.ok(), "parsed key is invalid: ", key.message());
  const std::string file = e.key.FileName();
  FUZZ_CHECK(!absl::StrContains(file, "/") && file != "." && file != ".." &&
                 absl::EndsWith(file, ".json"),
             "file name ", file);

  const std::string text = SerializeCacheEntry(e);
  absl::StatusOr<CacheEntry> back = ParseCacheEntry(text);
  FUZZ_CHECK(back.ok(), "serialized entry does not parse: ", back.status().message(), "\n",
             text);
  FUZZ_CHECK(back->key == e.key);
  FUZZ_CHECK(back->plan == e.plan);
  FUZZ_CHECK(SerializeCacheEntry(*back) == text, "SerializeCacheEntry is not a fixed point");
}

}  // namespace
}  // namespace fusebox::autotune

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using fusebox::autotune::CacheEntry;
  fusebox::fuzz::ParseThenCheck(data, size, fusebox::autotune::ParseCacheEntry,
                                fusebox::autotune::CheckEntry);
  fusebox::fuzz::ParseThenCheck(
      data, size, fusebox::autotune::ParseCacheBundle,
      [](const std::vector<absl::StatusOr<CacheEntry>>& entries) {
        for (const absl::StatusOr<CacheEntry>& e : entries) {
          if (e.ok()) fusebox::autotune::CheckEntry(*e);
        }
      });
  return 0;
}
