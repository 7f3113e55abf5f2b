// Byte ranges of a buffer cut in per-rank segments and pipeline chunks
// (internal to the UCX backend's algorithms).
#ifndef FUSEBOX_COMM_UCX_RANGES_H_
#define FUSEBOX_COMM_UCX_RANGES_H_

#include <algorithm>
#include <cstddef>
#include <vector>

namespace fusebox::comm::ucx {

// Byte range [off, off+len) of a buffer.
struct Range {
  size_t off = 0;
  size_t len = 0;
};

// Splits `count` elements of `esize` bytes into `parts` contiguous ranges of
// whole elements, the first count % parts one element longer.
inline std::vector<Range> SplitEven(size_t count, size_t esize, int parts) {
  std::vector<Range> out(parts);
  const size_t base = count / parts, rem = count % parts;
  size_t off = 0;
  for (int i = 0; i < parts; ++i) {
    const size_t n = base + (static_cast<size_t>(i) < rem ? 1 : 0);
    out[i] = {off * esize, n * esize};
    off += n;
  }
  return out;
}

// Chunk j of `r` when cut in pieces of `chunk` bytes (empty past the end).
inline Range ChunkOf(const Range& r, size_t chunk, size_t j) {
  const size_t begin = std::min(r.len, j * chunk);
  const size_t end = std::min(r.len, begin + chunk);
  return {r.off + begin, end - begin};
}

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_RANGES_H_
