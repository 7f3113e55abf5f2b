// Real multi-process tests: started by fusebox-run or mpirun, one process per
// rank, over the backend named by --backend (ucx or mpi). Each rank checks its
// results bit for bit against comm/testing/exact_data.h and the process exits
// non-zero if any rank saw a failure (fusebox-run and mpirun then fail too).
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/backends.h"
#include "comm/testing/exact_data.h"

namespace fusebox::comm {
namespace {

int failures = 0;  // this process only (the test binary's edge)

#define EXPECT_MP(cond, ...)                                            \
  do {                                                                  \
    if (!(cond)) {                                                      \
      ++failures;                                                       \
      std::fprintf(stderr, "FAILED %s:%d: %s: %s\n", __FILE__, __LINE__, #cond, \
                   absl::StrCat(__VA_ARGS__).c_str());                  \
    }                                                                   \
  } while (0)

void CheckAllReduce(Communicator& c, size_t count, DataType type, ReduceOp op, bool in_place) {
  const size_t bytes = count * DataTypeSize(type);
  std::vector<unsigned char> in(bytes + 1), out(bytes + 1, 0x5A), want(bytes + 1);
  testing::FillInput(in.data(), count, type, op, c.rank());
  testing::FillExpected(want.data(), count, type, op, c.size());
  unsigned char* dst = in_place ? in.data() : out.data();
  absl::Status s = AllReduceSync(c, in.data(), dst, count, type, op);
  const std::string what = absl::StrCat("rank ", c.rank(), "/", c.size(), " count=", count, " ",
                                        DataTypeName(type), " ", ReduceOpName(op),
                                        in_place ? " in-place" : " out-of-place");
  EXPECT_MP(s.ok(), what, ": ", s.ToString());
  if (!s.ok()) return;
  EXPECT_MP(testing::CountMismatches(dst, want.data(), count, type) == 0, what);
  if (!in_place) EXPECT_MP(out[bytes] == 0x5A, what, ": wrote past the end");
}

void RunAllReduce(Communicator& c) {
  for (size_t count : {0, 1, 7, 1023, 4096}) {
    for (int t = 0; t < kNumDataTypes; ++t) {
      for (int o = 0; o < kNumReduceOps; ++o) {
        for (bool ip : {false, true}) {
          CheckAllReduce(c, count, static_cast<DataType>(t), static_cast<ReduceOp>(o), ip);
        }
      }
    }
  }
  for (int t = 0; t < kNumDataTypes; ++t) {
    CheckAllReduce(c, (1u << 20) + 3, static_cast<DataType>(t), ReduceOp::kSum, t % 2 == 0);
  }
  for (int o = 0; o < kNumReduceOps; ++o) {
    CheckAllReduce(c, (1u << 20) + 3, DataType::kFloat32, static_cast<ReduceOp>(o), o % 2 == 1);
  }
  CheckAllReduce(c, (64u << 20) / 4, DataType::kFloat32, ReduceOp::kSum, false);
  CheckAllReduce(c, (64u << 20) / 4, DataType::kFloat32, ReduceOp::kSum, true);
}

// Broadcast from every root, AllGather, Barrier, then a count mismatch.
void RunOthers(Communicator& c) {
  for (int root = 0; root < c.size(); ++root) {
    for (size_t count : {size_t{3}, size_t{100003}}) {
      std::vector<int64_t> buf(count, -1), want(count);
      for (size_t i = 0; i < count; ++i) want[i] = static_cast<int64_t>(i) * 7 + root;
      if (c.rank() == root) buf = want;
      auto w = c.Broadcast(buf.data(), count, DataType::kInt64, root);
      EXPECT_MP(w.ok() && (*w)->Wait().ok(), "broadcast root ", root);
      EXPECT_MP(buf == want, "rank ", c.rank(), " broadcast root ", root, " count ", count);
    }
  }
  for (size_t count : {size_t{5}, size_t{70001}}) {
    std::vector<float> mine(count), out(count * c.size(), -1), want(count * c.size());
    for (int r = 0; r < c.size(); ++r) {
      for (size_t i = 0; i < count; ++i) want[r * count + i] = static_cast<float>(r * 100 + i % 50);
    }
    std::copy(want.begin() + c.rank() * count, want.begin() + (c.rank() + 1) * count, mine.begin());
    auto w = c.AllGather(mine.data(), out.data(), count, DataType::kFloat32);
    EXPECT_MP(w.ok() && (*w)->Wait().ok(), "allgather");
    EXPECT_MP(out == want, "rank ", c.rank(), " allgather count ", count);
  }
  EXPECT_MP(BarrierSync(c).ok(), "barrier");

  // A count mismatch across ranks fails on every rank, naming both counts.
  if (c.size() > 1) {
    const size_t count = c.rank() == c.size() - 1 ? 300 : 200;
    std::vector<int32_t> buf(count, 1);
    absl::Status s = AllReduceSync(c, buf.data(), buf.data(), count, DataType::kInt32, ReduceOp::kSum);
    EXPECT_MP(s.code() == absl::StatusCode::kInvalidArgument, "mismatch: ", s.ToString());
    EXPECT_MP(s.message().find("200") != absl::string_view::npos &&
                  s.message().find("300") != absl::string_view::npos,
              "mismatch message names both counts: ", s.message());
  }
}

// --refuse-cma-on-rank=R: rank R refuses cross-memory reads of its peers
// as a container's seccomp profile does (process_vm_readv fails with
// EPERM), so that the group's probe finds it and every rank stages
// (Note [Single-copy allreduce] in comm/ucx/shm_allreduce.h). Only
// AllReduce is run then (see main).
bool RefuseCrossMemoryAttach() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_readv, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

}  // namespace
}  // namespace fusebox::comm

int main(int argc, char** argv) {
  using namespace fusebox::comm;
  std::string backend = "ucx";
  std::string expect_single_copy;  // "on", "off" or "" (either)
  int refuse_rank = -1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--backend=", 10) == 0) backend = argv[i] + 10;
    if (std::strncmp(argv[i], "--expect-single-copy=", 21) == 0) expect_single_copy = argv[i] + 21;
    if (std::strncmp(argv[i], "--refuse-cma-on-rank=", 21) == 0) refuse_rank = std::atoi(argv[i] + 21);
  }
  if (refuse_rank >= 0 && std::getenv("RANK") != nullptr &&
      std::atoi(std::getenv("RANK")) == refuse_rank && !RefuseCrossMemoryAttach()) {
    std::fprintf(stderr, "cannot install the seccomp filter: %s\n", std::strerror(errno));
    return 1;
  }
  auto launch = ConnectFromEnvironment(::getenv, &argc, &argv);
  if (!launch.ok()) {
    std::fprintf(stderr, "rendezvous: %s\n", launch.status().ToString().c_str());
    return 1;
  }
  int rc = 0;
  {
    auto comm = CreateCommunicator(backend, BackendOptions{}, launch->rdv);
    if (!comm.ok()) {
      std::fprintf(stderr, "create %s: %s\n", backend.c_str(), comm.status().ToString().c_str());
      rc = 1;
    } else {
      if (!expect_single_copy.empty()) {
        const std::string algorithms = (*comm)->Algorithms();
        EXPECT_MP(algorithms.find("Single copy: " + expect_single_copy) != std::string::npos,
                  "rank ", (*comm)->rank(), " expected single copy ", expect_single_copy, ": ",
                  algorithms);
      }
      RunAllReduce(**comm);
      // Under the filter UCX's own cma transport fails too (a large
      // Broadcast's receive ends in an I/O error): there, only AllReduce,
      // which is what the single copy changes, is checked.
      if (refuse_rank < 0) RunOthers(**comm);
      std::printf("rank %d/%d backend %s: %s (%d failures)\n", (*comm)->rank(), (*comm)->size(),
                  backend.c_str(), failures == 0 ? "PASSED" : "FAILED", failures);
      rc = failures == 0 ? 0 : 1;
    }
  }
  ShutdownLaunch(*launch);
  return rc;
}
