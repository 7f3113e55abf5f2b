// fusebox-mpi-allreduce: the plain-MPI baseline for the allreduce benchmark.
//
// Times MPI_Allreduce (or MPI_Iallreduce, below) on MPI_COMM_WORLD (float,
// MPI_SUM), out of place and in place (MPI_IN_PLACE), over a geometric sweep
// of sizes, with the flags and the JSON schema of fusebox-perf (nccl-tests
// conventions):
//
//   mpirun -n 2 fusebox-mpi-allreduce -b 8 -e 64M -f 2 -n 20 -w 5 --json out.json
//
// Whatever MPI chooses by default (OpenMPI: ob1 + vader shared memory) is
// what is measured; this program sets no MCA parameters (the caller's mpirun
// flags pick components and algorithms).
//
// Note [Timing shapes]. Three ways to time n calls, each one of fusebox-perf's
// (perf/harness.h: Context::TimeBlocking, then Context::Time without and with
// waiting for each call):
//   -z 1 (default)        n blocking MPI_Allreduce calls (fusebox-perf -z 1:
//                         the communicator's blocking call).
//   -z 0                  n MPI_Iallreduce calls issued back to back, then
//                         MPI_Waitall: throughput of non-blocking calls
//                         (fusebox-perf -z 0, its default, which issues n
//                         AllReduce calls and then waits for them).
//   -z 0 --wait_each 1    each MPI_Iallreduce waited (MPI_Wait) before the
//                         next is issued: launch-to-done per call
//                         (fusebox-perf's --wait_each).
// Non-blocking calls go to whichever component provides iallreduce (OpenMPI
// 4.1: coll/libnbc; coll/tuned has none). As in fusebox-perf, the n calls in
// flight at once share one pair of buffers: the timed results are not
// meaningful, the checked call below is run alone. Warm-up calls are waited
// one by one in every shape, as in the harness. The default differs from
// fusebox-perf's (-z 0) so that existing callers keep MPI_Allreduce.
//
// Per size: w warm-up calls, MPI_Barrier, n timed calls; the per-call time of
// each rank is averaged across ranks (MPI_Allreduce). algbw = bytes / time
// (GB/s, 1e9), busbw = algbw * 2(p-1)/p. Then one checked call on freshly
// initialised inputs (through the timed call: MPI_Iallreduce + MPI_Wait
// with -z 0): element i of rank r holds (i + 3r) % 8, so the sum is an
// exact small integer whatever the reduction order; #wrong counts elements
// that differ, summed over ranks. Exit status 1 if anything was wrong.
#include <mpi.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "perf/sizes.h"

namespace {

struct Options {
  size_t min_bytes = 8;
  size_t max_bytes = 64u << 20;
  double factor = 2.0;
  int iters = 20;
  int warmup = 5;
  bool check = true;
  bool blocking = true;    // -z: MPI_Allreduce (1) or MPI_Iallreduce (0)
  bool wait_each = false;  // --wait_each: with -z 0, wait for each call at once
  std::string json_path;
};

// The timing shape of Note [Timing shapes].
enum class Shape { kBlocking, kIssueAllThenWait, kWaitEach };

Shape ShapeOf(const Options& o) {
  if (o.blocking) return Shape::kBlocking;
  return o.wait_each ? Shape::kWaitEach : Shape::kIssueAllThenWait;
}

// The name written to the table header and the JSON ("shape").
const char* ShapeName(Shape s) {
  switch (s) {
    case Shape::kBlocking: return "blocking";
    case Shape::kIssueAllThenWait: return "nonblocking";
    case Shape::kWaitEach: return "wait_each";
  }
  return "?";
}

const char* ShapeDescription(Shape s) {
  switch (s) {
    case Shape::kBlocking: return "MPI_Allreduce";
    case Shape::kIssueAllThenWait:
      return "MPI_Iallreduce, -n calls issued back to back, then MPI_Waitall";
    case Shape::kWaitEach: return "MPI_Iallreduce + MPI_Wait, each call waited before the next";
  }
  return "?";
}

void Usage(FILE* f) {
  std::fprintf(
      f,
      "usage: fusebox-mpi-allreduce [options]   (run under mpirun)\n"
      "  -b, --minbytes N    smallest size in bytes, K/M/G suffixes (default 8)\n"
      "  -e, --maxbytes N    largest size in bytes (default 64M)\n"
      "  -f, --stepfactor F  size multiplier between steps, > 1 (default 2)\n"
      "  -n, --iters N       timed iterations per size (default 20)\n"
      "  -w, --warmup_iters N  warm-up iterations per size (default 5)\n"
      "  -c, --check 0|1     check results (default 1)\n"
      "  -z, --blocking 0|1  1: MPI_Allreduce (default); 0: MPI_Iallreduce, -n calls\n"
      "                      issued back to back, then MPI_Waitall (fusebox-perf -z 0)\n"
      "      --wait_each [0|1]  with -z 0: wait for each MPI_Iallreduce before issuing\n"
      "                      the next (launch-to-done per call; alone: 1; default 0)\n"
      "  -d, --datatype T    only 'float'\n"
      "  -o, --op OP         only 'sum'\n"
      "  -J, --json PATH     write results as JSON (rank 0)\n"
      "  -h, --help\n");
}

// Returns 0 on success, 1 on --help, 2 on a usage error (message in *err).
int ParseArgs(int argc, char** argv, Options* o, std::string* err) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::string val;
    bool has_inline = false;
    if (a.rfind("--", 0) == 0) {
      size_t eq = a.find('=');
      if (eq != std::string::npos) {
        val = a.substr(eq + 1);
        a = a.substr(0, eq);
        has_inline = true;
      }
    }
    if (a == "-h" || a == "--help") return 1;
    // --wait_each alone (as fusebox-perf's boolean flag is spelled) means 1.
    if (a == "--wait_each" && !has_inline &&
        (i + 1 >= argc || argv[i + 1][0] == '-')) {
      o->wait_each = true;
      continue;
    }
    auto next = [&](std::string* v) {
      if (has_inline) { *v = val; return true; }
      if (i + 1 >= argc) return false;
      *v = argv[++i];
      return true;
    };
    std::string v;
    if (!next(&v)) {
      *err = "missing value for " + a;
      return 2;
    }
    if (a == "-b" || a == "--minbytes") {
      if (!fusebox::perf::ParseBytesArg(v.c_str(), &o->min_bytes)) { *err = "bad size: " + v; return 2; }
    } else if (a == "-e" || a == "--maxbytes") {
      if (!fusebox::perf::ParseBytesArg(v.c_str(), &o->max_bytes)) { *err = "bad size: " + v; return 2; }
    } else if (a == "-f" || a == "--stepfactor") {
      char* end = nullptr;
      o->factor = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !(o->factor > 1.0)) {
        *err = "-f needs a factor > 1, got " + v;
        return 2;
      }
    } else if (a == "-n" || a == "--iters") {
      if (!fusebox::perf::ParseIntArg(v.c_str(), 1000000000, &o->iters) || o->iters < 1) { *err = "bad -n: " + v; return 2; }
    } else if (a == "-w" || a == "--warmup_iters") {
      if (!fusebox::perf::ParseIntArg(v.c_str(), 1000000000, &o->warmup)) { *err = "bad -w: " + v; return 2; }
    } else if (a == "-c" || a == "--check") {
      int c = 0;
      if (!fusebox::perf::ParseIntArg(v.c_str(), 1000000000, &c)) { *err = "bad -c: " + v; return 2; }
      o->check = c != 0;
    } else if (a == "-z" || a == "--blocking") {
      if (v != "0" && v != "1") { *err = "-z wants 0 or 1, got " + v; return 2; }
      o->blocking = v == "1";
    } else if (a == "--wait_each") {
      if (v != "0" && v != "1") { *err = "--wait_each wants 0 or 1, got " + v; return 2; }
      o->wait_each = v == "1";
    } else if (a == "-d" || a == "--datatype") {
      if (v != "float") { *err = "only -d float is supported, got " + v; return 2; }
    } else if (a == "-o" || a == "--op") {
      if (v != "sum") { *err = "only -o sum is supported, got " + v; return 2; }
    } else if (a == "-J" || a == "--json") {
      o->json_path = v;
    } else {
      *err = "unknown option: " + a;
      return 2;
    }
  }
  if (o->min_bytes > o->max_bytes) {
    *err = "-b is larger than -e";
    return 2;
  }
  if (o->blocking && o->wait_each) {
    *err = "--wait_each 1 needs -z 0 (blocking calls are waited each anyway)";
    return 2;
  }
  if (o->max_bytes < sizeof(float)) {
    *err = "-e must be at least 4 bytes";
    return 2;
  }
  return 0;
}

std::vector<size_t> Sizes(const Options& o) {
  std::vector<size_t> out;
  // -b 0 would never grow; the smallest meaningful size is one float anyway.
  for (double s = static_cast<double>(std::max<size_t>(o.min_bytes, 1));
       s <= static_cast<double>(o.max_bytes) * (1 + 1e-12); s *= o.factor) {
    size_t bytes = static_cast<size_t>(s + 0.5);
    if (bytes / sizeof(float) == 0) continue;
    if (!out.empty() && out.back() == bytes) continue;
    out.push_back(bytes);
  }
  return out;
}

struct Measure {
  double time_us = 0;
  double algbw = 0;
  double busbw = 0;
  long long wrong = 0;
};

struct Row {
  size_t bytes = 0;
  size_t count = 0;
  Measure oop, ip;
};

inline float InputValue(size_t i, int rank) {
  return static_cast<float>((i + 3u * static_cast<size_t>(rank)) % 8u);
}

void FillInput(float* p, size_t count, int rank) {
  for (size_t i = 0; i < count; ++i) p[i] = InputValue(i, rank);
}

long long CountWrong(const float* p, size_t count, const float expected[8]) {
  long long wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    if (p[i] != expected[i % 8]) ++wrong;
  }
  return wrong;
}

// Requests in flight, owned: the destructor completes any still active, so
// that no early return leaves MPI writing into freed buffers. Not copyable.
class Requests {
 public:
  explicit Requests(size_t n) : reqs_(n, MPI_REQUEST_NULL) {}
  Requests(const Requests&) = delete;
  Requests& operator=(const Requests&) = delete;
  ~Requests() { WaitAll(); }
  MPI_Request* at(size_t i) { return &reqs_[i]; }
  // Completes every request (inactive ones are MPI_REQUEST_NULL: no-ops).
  void WaitAll() {
    if (!reqs_.empty()) {
      MPI_Waitall(static_cast<int>(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE);
    }
  }

 private:
  std::vector<MPI_Request> reqs_;
};

// One call, finished on return: MPI_Allreduce, or MPI_Iallreduce + MPI_Wait.
void CallOnce(Shape shape, const void* send, void* recv, int count) {
  if (shape == Shape::kBlocking) {
    MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    return;
  }
  Requests r(1);
  MPI_Iallreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, r.at(0));
  r.WaitAll();
}

// Average seconds per call across ranks, in the shape of Note [Timing shapes].
double TimeCalls(const void* send, void* recv, int count, const Options& o,
                 int nranks) {
  const Shape shape = ShapeOf(o);
  for (int i = 0; i < o.warmup; ++i) CallOnce(shape, send, recv, count);
  // Allocated before the clock starts, as fusebox-perf reserves its Works.
  Requests reqs(shape == Shape::kIssueAllThenWait ? static_cast<size_t>(o.iters) : 0);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  if (shape == Shape::kIssueAllThenWait) {
    for (int i = 0; i < o.iters; ++i) {
      MPI_Iallreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                     reqs.at(static_cast<size_t>(i)));
    }
    reqs.WaitAll();
  } else {
    for (int i = 0; i < o.iters; ++i) CallOnce(shape, send, recv, count);
  }
  double per_call = (MPI_Wtime() - t0) / o.iters;
  double sum = 0;
  MPI_Allreduce(&per_call, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return sum / nranks;
}

void FillBandwidth(Measure* m, double seconds, size_t bytes, int nranks) {
  m->time_us = seconds * 1e6;
  m->algbw = seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
  m->busbw = m->algbw * 2.0 * (nranks - 1) / nranks;
}

void AppendMeasure(std::string* s, const Measure& m) {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "{\"time_us\":%.6g,\"algbw\":%.6g,\"busbw\":%.6g,\"wrong\":%lld}",
                m.time_us, m.algbw, m.busbw, m.wrong);
  *s += buf;
}

std::string JsonEscape(const std::string& in) {
  std::string out;
  for (char c : in) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

bool WriteJson(const std::string& path, const Options& o, int nranks,
               const std::vector<Row>& rows, double avg_busbw,
               const std::string& library) {
  std::string s;
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "{\"tool\":\"fusebox-mpi-allreduce\",\"collective\":\"allreduce\","
                "\"backend\":\"mpi-direct\",\"nranks\":%d,\"iters\":%d,"
                "\"warmup\":%d,\"blocking\":%s,\"wait_each\":%s,\"shape\":\"%s\","
                "\"call\":\"%s\",",
                nranks, o.iters, o.warmup, o.blocking ? "true" : "false",
                o.wait_each ? "true" : "false", ShapeName(ShapeOf(o)),
                o.blocking ? "MPI_Allreduce" : "MPI_Iallreduce");
  s += buf;
  s += "\"mpi_library\":\"" + JsonEscape(library) + "\",\"results\":[";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    if (i) s += ",";
    std::snprintf(buf, sizeof(buf),
                  "{\"bytes\":%zu,\"count\":%zu,\"type\":\"float\","
                  "\"redop\":\"sum\",\"oop\":",
                  r.bytes, r.count);
    s += buf;
    AppendMeasure(&s, r.oop);
    s += ",\"ip\":";
    AppendMeasure(&s, r.ip);
    s += "}";
  }
  std::snprintf(buf, sizeof(buf), "],\"avg_busbw\":%.6g}\n", avg_busbw);
  s += buf;
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  bool ok = std::fwrite(s.data(), 1, s.size(), f) == s.size();
  ok = (std::fclose(f) == 0) && ok;
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);

  Options o;
  std::string err;
  int pr = ParseArgs(argc, argv, &o, &err);
  if (pr != 0) {
    if (rank == 0) {
      if (pr == 2) std::fprintf(stderr, "fusebox-mpi-allreduce: %s\n", err.c_str());
      Usage(pr == 1 ? stdout : stderr);
    }
    MPI_Finalize();
    return pr == 1 ? 0 : 2;
  }

  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int lib_len = 0;
  MPI_Get_library_version(lib, &lib_len);
  std::string library(lib, static_cast<size_t>(lib_len));
  while (!library.empty() &&
         (library.back() == '\n' || library.back() == '\0' || library.back() == ' ')) {
    library.pop_back();
  }
  size_t nl = library.find('\n');
  if (nl != std::string::npos) library.resize(nl);

  const std::vector<size_t> sizes = Sizes(o);
  const size_t max_count = sizes.empty() ? 0 : sizes.back() / sizeof(float);
  if (max_count > static_cast<size_t>(INT32_MAX)) {
    if (rank == 0) std::fprintf(stderr, "fusebox-mpi-allreduce: -e too large\n");
    MPI_Finalize();
    return 2;
  }
  // Touch every page up front so that page faults are not timed.
  std::vector<float> send(max_count, 0.0f), recv(max_count, 0.0f);

  float expected[8];
  for (int k = 0; k < 8; ++k) {
    float e = 0;
    for (int r = 0; r < nranks; ++r) e += InputValue(static_cast<size_t>(k), r);
    expected[k] = e;
  }

  if (rank == 0) {
    std::printf("# fusebox-mpi-allreduce: %s, MPI_COMM_WORLD, %d ranks (shape: %s)\n",
                ShapeDescription(ShapeOf(o)), nranks, ShapeName(ShapeOf(o)));
    std::printf("# %s\n", library.c_str());
    std::printf("# minBytes %zu maxBytes %zu step: %g(factor) warmup iters: %d iters: %d "
                "validation: %d\n#\n",
                o.min_bytes, o.max_bytes, o.factor, o.warmup, o.iters, o.check ? 1 : 0);
    std::printf("#%55s%32s%32s\n", "", "out-of-place", "in-place");
    std::printf("#%11s%14s%10s%8s%7s%11s%8s%8s%8s%9s%8s%8s%8s\n", "size", "count",
                "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
                "algbw", "busbw", "#wrong");
    std::printf("#%11s%14s%10s%8s%7s%11s%8s%8s%8s%9s%8s%8s%8s\n", "(B)", "(elements)",
                "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    std::fflush(stdout);
  }

  std::vector<Row> rows;
  long long total_wrong = 0;
  double busbw_sum = 0;
  int busbw_n = 0;
  for (size_t bytes : sizes) {
    Row row;
    row.count = bytes / sizeof(float);
    row.bytes = row.count * sizeof(float);
    const int count = static_cast<int>(row.count);

    // Out of place.
    FillInput(send.data(), row.count, rank);
    double t = TimeCalls(send.data(), recv.data(), count, o, nranks);
    FillBandwidth(&row.oop, t, row.bytes, nranks);
    if (o.check) {
      std::fill(recv.begin(), recv.begin() + row.count, -1.0f);
      CallOnce(ShapeOf(o), send.data(), recv.data(), count);
      long long w = CountWrong(recv.data(), row.count, expected);
      MPI_Allreduce(&w, &row.oop.wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    }

    // In place. The timed calls keep summing into the same buffer (values
    // grow, at worst to +inf, which costs the same); the check starts over.
    FillInput(recv.data(), row.count, rank);
    t = TimeCalls(MPI_IN_PLACE, recv.data(), count, o, nranks);
    FillBandwidth(&row.ip, t, row.bytes, nranks);
    if (o.check) {
      FillInput(recv.data(), row.count, rank);
      CallOnce(ShapeOf(o), MPI_IN_PLACE, recv.data(), count);
      long long w = CountWrong(recv.data(), row.count, expected);
      MPI_Allreduce(&w, &row.ip.wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    }

    total_wrong += row.oop.wrong + row.ip.wrong;
    busbw_sum += row.oop.busbw + row.ip.busbw;
    busbw_n += 2;
    if (rank == 0) {
      char ow[16], iw[16];
      if (o.check) {
        std::snprintf(ow, sizeof(ow), "%lld", row.oop.wrong);
        std::snprintf(iw, sizeof(iw), "%lld", row.ip.wrong);
      } else {
        std::snprintf(ow, sizeof(ow), "N/A");
        std::snprintf(iw, sizeof(iw), "N/A");
      }
      std::printf(" %11zu%14zu%10s%8s%7d%11.2f%8.2f%8.2f%8s%9.2f%8.2f%8.2f%8s\n",
                  row.bytes, row.count, "float", "sum", -1, row.oop.time_us,
                  row.oop.algbw, row.oop.busbw, ow, row.ip.time_us, row.ip.algbw,
                  row.ip.busbw, iw);
      std::fflush(stdout);
    }
    rows.push_back(row);
  }

  const double avg_busbw = busbw_n ? busbw_sum / busbw_n : 0.0;
  int rc = 0;
  if (rank == 0) {
    std::printf("# Out of bounds values : %lld %s\n", total_wrong,
                total_wrong ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %g\n#\n", avg_busbw);
    if (!o.json_path.empty() &&
        !WriteJson(o.json_path, o, nranks, rows, avg_busbw, library)) {
      std::fprintf(stderr, "fusebox-mpi-allreduce: cannot write %s: %s\n",
                   o.json_path.c_str(), std::strerror(errno));
      rc = 3;
    }
  }
  if (total_wrong != 0) rc = 1;
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return rc;
}
