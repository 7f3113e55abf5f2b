// FNV-1a over a fixed little-endian encoding: the stable hash behind
// GradientLayout::Hash and PlanHash (equal on every rank, build and host).
#ifndef FUSEBOX_BUCKETING_HASH_H_
#define FUSEBOX_BUCKETING_HASH_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace fusebox::bucketing {

class StableHasher {
 public:
  void AddU64(uint64_t v) {
    for (int i = 0; i < 8; ++i) AddByte(static_cast<uint8_t>(v >> (8 * i)));
  }
  void AddI64(int64_t v) { AddU64(static_cast<uint64_t>(v)); }
  void AddString(absl::string_view s) {
    AddU64(s.size());
    for (char c : s) AddByte(static_cast<uint8_t>(c));
  }
  uint64_t value() const { return h_; }

 private:
  void AddByte(uint8_t b) {
    h_ ^= b;
    h_ *= 0x100000001b3ull;
  }
  uint64_t h_ = 0xcbf29ce484222325ull;
};

}  // namespace fusebox::bucketing

#endif  // FUSEBOX_BUCKETING_HASH_H_
