// fusebox-memcpy-bw: single-thread memcpy bandwidth, the ceiling that a
// host-memory allreduce is compared with.
//
//   fusebox-memcpy-bw [--size 64M] [--repeats 21] [--warmup 3] [--json out.json]
//
// Both buffers are allocated and written once before anything is timed (so
// page faults are not measured), then `warmup` untimed copies, then `repeats`
// timed copies of `size` bytes. Reports the median (and min/max) as GB/s =
// bytes copied / seconds / 1e9 (each byte is read once and written once).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "perf/sizes.h"

namespace {

void Usage(FILE* f) {
  std::fprintf(f,
               "usage: fusebox-memcpy-bw [options]\n"
               "  -s, --size N      bytes per copy, K/M/G suffixes (default 64M)\n"
               "  -r, --repeats N   timed copies; the median is reported (default 21)\n"
               "  -w, --warmup N    untimed copies first (default 3)\n"
               "  -J, --json PATH   also write {\"tool\":\"fusebox-memcpy-bw\",...}\n"
               "  -h, --help\n");
}

// Keeps the compiler from dropping or merging the copies.
inline void Clobber() { asm volatile("" ::: "memory"); }

}  // namespace

int main(int argc, char** argv) {
  size_t size = 64u << 20;
  int repeats = 21, warmup = 3;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], v;
    bool inline_val = false;
    if (a.rfind("--", 0) == 0 && a.find('=') != std::string::npos) {
      v = a.substr(a.find('=') + 1);
      a = a.substr(0, a.find('='));
      inline_val = true;
    }
    if (a == "-h" || a == "--help") {
      Usage(stdout);
      return 0;
    }
    if (!inline_val) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fusebox-memcpy-bw: missing value for %s\n", a.c_str());
        return 2;
      }
      v = argv[++i];
    }
    bool ok = true;
    if (a == "-s" || a == "--size") {
      ok = fusebox::perf::ParseBytesArg(v.c_str(), &size) && size > 0;
    } else if (a == "-r" || a == "--repeats") {
      ok = fusebox::perf::ParseIntArg(v.c_str(), 1000000, &repeats) && repeats > 0;
    } else if (a == "-w" || a == "--warmup") {
      ok = fusebox::perf::ParseIntArg(v.c_str(), 1000000, &warmup);
    } else if (a == "-J" || a == "--json") {
      json_path = v;
    } else {
      std::fprintf(stderr, "fusebox-memcpy-bw: unknown option %s\n", a.c_str());
      Usage(stderr);
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "fusebox-memcpy-bw: bad value for %s: %s\n", a.c_str(), v.c_str());
      return 2;
    }
  }

  const size_t align = 4096;
  const size_t alloc = (size + align - 1) / align * align;
  auto* src = static_cast<unsigned char*>(std::aligned_alloc(align, alloc));
  auto* dst = static_cast<unsigned char*>(std::aligned_alloc(align, alloc));
  if (!src || !dst) {
    std::fprintf(stderr, "fusebox-memcpy-bw: cannot allocate 2 x %zu bytes\n", size);
    return 1;
  }
  // Fault in every page of both buffers.
  for (size_t i = 0; i < alloc; ++i) src[i] = static_cast<unsigned char>(i * 131u + 7u);
  std::memset(dst, 0, alloc);

  for (int i = 0; i < warmup; ++i) {
    std::memcpy(dst, src, size);
    Clobber();
  }
  std::vector<double> secs;
  secs.reserve(static_cast<size_t>(repeats));
  for (int i = 0; i < repeats; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst, src, size);
    Clobber();
    auto t1 = std::chrono::steady_clock::now();
    secs.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  // Use the destination so that the copies have an observable effect.
  unsigned sum = 0;
  for (size_t i = 0; i < size; i += 4096) sum += dst[i];
  if (std::memcmp(dst, src, size) != 0) {
    std::fprintf(stderr, "fusebox-memcpy-bw: copy mismatch\n");
    return 1;
  }

  std::vector<double> sorted = secs;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double median_s =
      n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  auto gbps = [&](double s) { return s > 0 ? static_cast<double>(size) / s / 1e9 : 0.0; };
  const double med = gbps(median_s), best = gbps(sorted.front()), worst = gbps(sorted.back());

  std::printf("# fusebox-memcpy-bw: single-thread memcpy, %zu bytes, %d warm-up + %d timed copies\n",
              size, warmup, repeats);
  std::printf("memcpy %zu bytes: median %.2f GB/s (min %.2f, max %.2f; median %.1f us)  [chk %u]\n",
              size, med, worst, best, median_s * 1e6, sum & 0xff);
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "fusebox-memcpy-bw: cannot write %s: %s\n", json_path.c_str(),
                   std::strerror(errno));
      return 3;
    }
    std::fprintf(f,
                 "{\"tool\":\"fusebox-memcpy-bw\",\"bytes\":%zu,\"repeats\":%d,\"warmup\":%d,"
                 "\"median_gbps\":%.6g,\"min_gbps\":%.6g,\"max_gbps\":%.6g,"
                 "\"median_time_us\":%.6g}\n",
                 size, repeats, warmup, med, worst, best, median_s * 1e6);
    if (std::fclose(f) != 0) return 3;
  }
  std::free(src);
  std::free(dst);
  return 0;
}
