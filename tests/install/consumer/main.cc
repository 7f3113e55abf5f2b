// A program built against an installed fusebox (tests/install): checks a
// DDP bucket plan (fusebox::bucketing), then joins the job from the
// environment (RANK, WORLD_SIZE, ... as fusebox-run sets them), creates a
// communicator through the backend factory, all-reduces known values and
// checks the exact result. Prints "OK rank R/N" on success; the
// exit status is non-zero on any failure.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "bucketing/layout.h"
#include "bucketing/plan.h"
#include "bucketing/planners.h"
#include "comm/backends.h"
#include "comm/communicator.h"
#include "comm/rendezvous.h"
#include "fusebox/config.h"

using namespace fusebox::comm;

namespace {

// Rank r contributes (r + 1) * (i + 1) at index i: the sum over n ranks is
// (i + 1) * n * (n + 1) / 2, exact in int32 and in float32 for these sizes.
constexpr size_t kCount = 4099;

int Check(Communicator& c) {
  const int n = c.size();
  int failures = 0;
  {
    std::vector<int32_t> in(kCount), out(kCount, -1);
    for (size_t i = 0; i < kCount; ++i) in[i] = (c.rank() + 1) * static_cast<int32_t>(i + 1);
    auto work = c.AllReduce(in.data(), out.data(), kCount, DataType::kInt32, ReduceOp::kSum);
    absl::Status s = work.ok() ? (*work)->Wait() : work.status();
    if (!s.ok()) {
      std::fprintf(stderr, "rank %d: int32 allreduce: %s\n", c.rank(), s.ToString().c_str());
      return 1;
    }
    for (size_t i = 0; i < kCount; ++i) {
      const int32_t want = static_cast<int32_t>(i + 1) * n * (n + 1) / 2;
      if (out[i] != want && failures++ < 5) {
        std::fprintf(stderr, "rank %d: int32[%zu] = %d, want %d\n", c.rank(), i, out[i], want);
      }
    }
  }
  {
    std::vector<float> buf(kCount);  // in place
    for (size_t i = 0; i < kCount; ++i) buf[i] = static_cast<float>((c.rank() + 1) * (i + 1));
    auto work = c.AllReduce(buf.data(), buf.data(), kCount, DataType::kFloat32, ReduceOp::kSum);
    absl::Status s = work.ok() ? (*work)->Wait() : work.status();
    if (!s.ok()) {
      std::fprintf(stderr, "rank %d: float32 allreduce: %s\n", c.rank(), s.ToString().c_str());
      return 1;
    }
    for (size_t i = 0; i < kCount; ++i) {
      const float want = static_cast<float>((i + 1) * n * (n + 1) / 2);
      if (std::memcmp(&buf[i], &want, sizeof want) != 0 && failures++ < 5) {
        std::fprintf(stderr, "rank %d: float32[%zu] = %g, want %g\n", c.rank(), i, buf[i], want);
      }
    }
  }
  return failures == 0 ? 0 : 1;
}

// fusebox::bucketing from the installed headers and archive: DDP's plan for
// a small layout covers every element exactly once.
int CheckBucketing() {
  auto layout = fusebox::bucketing::GradientLayout::Create(
      {{"fc.bias", 1000}, {"fc.weight", 2048000}, {"conv.weight", 9408}});
  if (!layout.ok()) {
    std::fprintf(stderr, "layout: %s\n", layout.status().ToString().c_str());
    return 1;
  }
  absl::Status s = fusebox::bucketing::ValidatePlan(*layout, fusebox::bucketing::DdpPlan(*layout));
  if (!s.ok()) {
    std::fprintf(stderr, "DDP plan: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string backend = argc > 1 ? argv[1] : "ucx";
  std::fprintf(stderr, "fusebox %s (UCX=%d MPI=%d)\n", FUSEBOX_VERSION, FUSEBOX_WITH_UCX,
               FUSEBOX_WITH_MPI);
  if (CheckBucketing() != 0) return 1;
  auto options = RendezvousOptionsFromEnv(::getenv);
  if (!options.ok()) {
    std::fprintf(stderr, "rendezvous options: %s\n", options.status().ToString().c_str());
    return 1;
  }
  auto rdv = ConnectTcpRendezvous(*options);
  if (!rdv.ok()) {
    std::fprintf(stderr, "rendezvous: %s\n", rdv.status().ToString().c_str());
    return 1;
  }
  Launch launch;
  launch.rdv = *std::move(rdv);
  int rc = 0;
  int rank = launch.rdv.rank, size = launch.rdv.size;
  {
    auto comm = CreateCommunicator(backend, BackendOptions{}, launch.rdv);
    if (!comm.ok()) {
      std::fprintf(stderr, "create %s: %s\n", backend.c_str(), comm.status().ToString().c_str());
      rc = 1;
    } else {
      rc = Check(**comm);
    }
  }
  ShutdownLaunch(launch, /*after_failure=*/rc != 0);
  if (rc == 0) std::printf("OK rank %d/%d\n", rank, size);
  return rc;
}
