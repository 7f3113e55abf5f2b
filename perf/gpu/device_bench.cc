// fusebox-gpu-bench: what the device path costs on one GPU, side by side
// with what CUDA and NCCL do alone (perf/gpu/README.md).
//
//   1. copy: device-to-device copies through the device seam
//      (comm/device.h: what the engine's copies in and back use) against
//      cudaMemcpyAsync on a stream of the benchmark's own, GB/s.
//   2. nccl: an NCCL allreduce on one rank against a device-to-device copy
//      of the same bytes, microseconds.
//   3. engine: one iteration of the engine on the NCCL communicator (Note
//      [A device communicator]), DDP's plan, gradients copied in and back,
//      against the same bytes copied in and back plus one allreduce of
//      them, microseconds.
// Each row: sizes from --min to --max bytes (x4), the two sides measured in
// alternation, --reps repetitions of --iters calls each, the median of the
// repetitions and its ratio. Prints "SKIPPED: <reason>" and exits 0 where
// no GPU is usable.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bucketing/engine.h"
#include "bucketing/planners.h"
#include "comm/device.h"
#include "comm/memory_store.h"
#include "comm/nccl/communicator.h"
#include "comm/nccl/cuda_device.h"

ABSL_FLAG(int64_t, min, int64_t{1} << 20, "smallest size in bytes");
ABSL_FLAG(int64_t, max, int64_t{256} << 20, "largest size in bytes");
ABSL_FLAG(int, iters, 20, "calls per repetition");
ABSL_FLAG(int, reps, 7, "repetitions per side and size (medians reported)");

namespace fusebox {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Microseconds per call of one run of `run` (which enqueues `iters` calls
// and waits for them); a failure ends the program.
double TimeUs(int iters, const std::function<absl::Status()>& run) {
  const auto t0 = Clock::now();
  if (absl::Status s = run(); !s.ok()) {
    std::fprintf(stderr, "fusebox-gpu-bench: %s\n", std::string(s.message()).c_str());
    std::exit(1);
  }
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
}

absl::Status Cuda(cudaError_t e, const char* what) {
  return e == cudaSuccess ? absl::OkStatus()
                          : absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

int Run() {
  if (absl::Status gpu = comm::CudaAvailable(); !gpu.ok()) {
    std::printf("SKIPPED: %s\n", std::string(gpu.message()).c_str());
    return 0;
  }
  const int64_t lo = absl::GetFlag(FLAGS_min), hi = absl::GetFlag(FLAGS_max);
  const int iters = absl::GetFlag(FLAGS_iters), reps = absl::GetFlag(FLAGS_reps);
  if (lo < 4 || hi < lo || iters < 1 || reps < 1) {
    std::fprintf(stderr, "fusebox-gpu-bench: need 4 <= --min <= --max, --iters >= 1, --reps >= 1\n");
    return 2;
  }
  comm::MemoryStore store;
  auto nccl = comm::CreateNcclCommunicator(comm::NcclOptions{}, 0, 1, 0, store);
  if (!nccl.ok()) {
    std::fprintf(stderr, "fusebox-gpu-bench: %s\n", std::string(nccl.status().message()).c_str());
    return 1;
  }
  comm::Device& device = *(*nccl)->device();
  auto seam_stream = device.CreateStream();
  if (!seam_stream.ok()) return 1;
  cudaStream_t raw = nullptr;
  if (!Cuda(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking), "cudaStreamCreate").ok()) {
    return 1;
  }
  std::printf("# fusebox-gpu-bench on %s: median of %d repetitions of %d calls, sides "
              "alternated\n",
              device.name().c_str(), reps, iters);
  std::printf("# %-8s %12s %14s %14s %8s\n", "what", "bytes", "fusebox", "reference", "ratio");
  for (int64_t bytes = lo; bytes <= hi; bytes *= 4) {
    auto a = device.Allocate(bytes), b = device.Allocate(bytes);
    if (!a.ok() || !b.ok()) return 1;
    const size_t n = static_cast<size_t>(bytes);
    auto seam_copies = [&] {
      for (int i = 0; i < iters; ++i) {
        if (absl::Status s = device.CopyAsync(*b, *a, n, **seam_stream); !s.ok()) return s;
      }
      return device.SynchronizeStream(**seam_stream);
    };
    auto raw_copies = [&] {
      for (int i = 0; i < iters; ++i) {
        if (absl::Status s = Cuda(cudaMemcpyAsync(*b, *a, n, cudaMemcpyDeviceToDevice, raw),
                                  "cudaMemcpyAsync");
            !s.ok()) {
          return s;
        }
      }
      return Cuda(cudaStreamSynchronize(raw), "cudaStreamSynchronize");
    };
    auto allreduces = [&] {
      std::shared_ptr<comm::Work> last;
      for (int i = 0; i < iters; ++i) {
        auto w = (*nccl)->AllReduce(*a, *a, n / 4, comm::DataType::kFloat32, comm::ReduceOp::kSum);
        if (!w.ok()) return w.status();
        last = *w;
      }
      return last->Wait();
    };
    // The two sides alternate within each repetition's pair.
    std::vector<double> seam_us, raw_us, nccl_us, copy_us;
    for (int r = 0; r < reps; ++r) {
      seam_us.push_back(TimeUs(iters, seam_copies));
      raw_us.push_back(TimeUs(iters, raw_copies));
      nccl_us.push_back(TimeUs(iters, allreduces));
      copy_us.push_back(TimeUs(iters, raw_copies));
    }
    const double seam = bytes / Median(seam_us) / 1e3, ref = bytes / Median(raw_us) / 1e3;
    std::printf("  %-8s %12lld %11.2f GB/s %11.2f GB/s %8.3f\n", "copy",
                static_cast<long long>(bytes), seam, ref, seam / ref);
    std::printf("  %-8s %12lld %11.2f us   %11.2f us   %8.3f\n", "nccl",
                static_cast<long long>(bytes), Median(nccl_us), Median(copy_us),
                Median(nccl_us) / Median(copy_us));

    // The engine: 16 gradients of bytes/16, DDP's plan, copied in and back.
    std::vector<bucketing::TensorSpec> specs;
    const int64_t numel = std::max<int64_t>(1, bytes / 16 / 4);
    for (int i = 0; i < 16; ++i) {
      specs.push_back({absl::StrCat("g", i), numel, comm::DataType::kFloat32,
                       comm::MemoryKind::kDevice});
    }
    auto layout = bucketing::GradientLayout::Create(specs);
    if (!layout.ok()) return 1;
    auto engine = bucketing::Engine::Create(**nccl, *layout, bucketing::DdpPlan(*layout), {});
    if (!engine.ok()) {
      std::fprintf(stderr, "fusebox-gpu-bench: %s\n",
                   std::string(engine.status().message()).c_str());
      return 1;
    }
    auto grads = device.Allocate(16 * numel * 4);
    if (!grads.ok()) return 1;
    auto iteration = [&] {
      for (int i = 0; i < iters; ++i) {
        for (int t = 0; t < 16; ++t) {
          char* g = static_cast<char*>(*grads) + t * numel * 4;
          if (absl::Status s = (*engine)->MarkReadyOnDevice(t, g, numel, nullptr); !s.ok()) {
            return s;
          }
        }
        if (absl::Status s = (*engine)->Finish(); !s.ok()) return s;
      }
      return device.SynchronizeEvent(*(*engine)->finished_event());
    };
    auto by_hand = [&] {
      const size_t all = static_cast<size_t>(16 * numel * 4);
      for (int i = 0; i < iters; ++i) {
        if (absl::Status s = Cuda(cudaMemcpyAsync(*b, *grads, all, cudaMemcpyDeviceToDevice, raw),
                                  "cudaMemcpyAsync");
            !s.ok()) {
          return s;
        }
        if (absl::Status s = Cuda(cudaStreamSynchronize(raw), "cudaStreamSynchronize"); !s.ok()) {
          return s;
        }
        auto w = (*nccl)->AllReduce(*b, *b, all / 4, comm::DataType::kFloat32, comm::ReduceOp::kAvg);
        if (!w.ok()) return w.status();
        if (absl::Status s = (*w)->Wait(); !s.ok()) return s;
        if (absl::Status s = Cuda(cudaMemcpyAsync(*grads, *b, all, cudaMemcpyDeviceToDevice, raw),
                                  "cudaMemcpyAsync");
            !s.ok()) {
          return s;
        }
      }
      return Cuda(cudaStreamSynchronize(raw), "cudaStreamSynchronize");
    };
    std::vector<double> engine_us, hand_us;
    for (int r = 0; r < reps; ++r) {
      engine_us.push_back(TimeUs(iters, iteration));
      hand_us.push_back(TimeUs(iters, by_hand));
    }
    std::printf("  %-8s %12lld %11.2f us   %11.2f us   %8.3f\n", "engine",
                static_cast<long long>(16 * numel * 4), Median(engine_us), Median(hand_us),
                Median(engine_us) / Median(hand_us));
    engine->reset();
    device.Free(*grads);
    device.Free(*a);
    device.Free(*b);
  }
  std::printf("# copy: GB/s (higher is better), ratio = fusebox / cudaMemcpyAsync; nccl: one-rank "
              "allreduce / copy of the same bytes; engine: one iteration (DDP plan, 16 "
              "gradients copied in and back) / the same copies and one allreduce by hand\n");
  cudaStreamDestroy(raw);
  return 0;
}

}  // namespace
}  // namespace fusebox

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return fusebox::Run();
}
