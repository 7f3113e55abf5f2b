// Data-parallel training in plain LibTorch (no Python, no DDP) with
// fusebox::torch::GradientReducer: a small MLP regresses a fixed random
// linear map on synthetic data, each rank on its own shard.
//
//   fusebox-run -n 2 -- fusebox-train-example [--steps 30] [--cache_dir DIR] [--plan ddp]
//
// Every step prints, per rank, the training loss on that rank's batch and
// the loss on one evaluation batch that all ranks share, with a checksum of
// the parameters: with the gradients averaged, every rank holds the same
// parameters, so the evaluation loss and the checksum are identical on all
// ranks (bit for bit) and the loss goes down.
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "comm/backends.h"
#include "plugins/torch/gradient_reducer.h"

ABSL_FLAG(int, steps, 30, "optimizer steps");
ABSL_FLAG(double, lr, 0.1, "SGD learning rate (momentum 0.9)");
ABSL_FLAG(std::string, cache_dir, "", "policy cache directory (empty: no cache)");
ABSL_FLAG(std::string, plan, "", "fixed plan (ddp or per-tensor) instead of tuning");
ABSL_FLAG(std::string, backend, "ucx", "fusebox communicator backend");
ABSL_FLAG(int, screening_blocks, 2, "tuning: randomised blocks over the candidates");
ABSL_FLAG(int, verify_pairs, 6, "tuning: interleaved pairs of the default and the best candidate");
ABSL_FLAG(int, candidates, 2, "tuning: plans measured besides DDP's default");

namespace {

uint64_t Checksum(const std::vector<at::Tensor>& params) {
  uint64_t h = 1469598103934665603ull;
  for (const at::Tensor& p : params) {
    at::Tensor c = p.detach().contiguous();
    const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
    for (int64_t i = 0; i < c.numel() * static_cast<int64_t>(c.element_size()); ++i) {
      h = (h ^ bytes[i]) * 1099511628211ull;
    }
  }
  return h;
}

int Run(int* argc, char*** argv) {
  auto launch = fusebox::comm::ConnectFromEnvironment(::getenv, argc, argv);
  if (!launch.ok()) {
    std::fprintf(stderr, "train-example: %s\n", launch.status().ToString().c_str());
    return 1;
  }
  fusebox::comm::BackendOptions backend_options;
  auto comm = fusebox::comm::CreateCommunicator(absl::GetFlag(FLAGS_backend), backend_options,
                                                launch->rdv);
  if (!comm.ok()) {
    std::fprintf(stderr, "train-example: %s\n", comm.status().ToString().c_str());
    return 1;
  }
  const int rank = (*comm)->rank();
  at::set_num_threads(1);
  torch::manual_seed(0);  // the same initial weights on every rank
  torch::nn::Sequential model(torch::nn::Linear(64, 128), torch::nn::ReLU(),
                              torch::nn::Linear(128, 128), torch::nn::ReLU(),
                              torch::nn::Linear(128, 8));
  const torch::Tensor target_map = torch::randn({64, 8}) / 8.0;  // targets of unit variance
  const torch::Tensor eval_x = torch::randn({256, 64});
  const torch::Tensor eval_y = eval_x.matmul(target_map);

  fusebox::torch::GradientReducerOptions options;
  options.cache_dir = absl::GetFlag(FLAGS_cache_dir);
  options.fixed_plan = absl::GetFlag(FLAGS_plan);
  options.tuner.candidates = absl::GetFlag(FLAGS_candidates);
  options.tuner.screening_blocks = absl::GetFlag(FLAGS_screening_blocks);
  options.tuner.verify_pairs = absl::GetFlag(FLAGS_verify_pairs);
  options.log = [rank](const std::string& line) {
    if (rank == 0) std::fprintf(stderr, "%s\n", line.c_str());
  };
  auto reducer = fusebox::torch::GradientReducer::Create(**comm, model->parameters(), options);
  if (!reducer.ok()) {
    std::fprintf(stderr, "train-example: %s\n", reducer.status().ToString().c_str());
    return 1;
  }
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(absl::GetFlag(FLAGS_lr)).momentum(0.9));
  int rc = 0;
  for (int step = 0; step < absl::GetFlag(FLAGS_steps); ++step) {
    torch::manual_seed(1000 + 97 * step + rank);  // this rank's shard
    torch::Tensor x = torch::randn({32, 64});
    torch::Tensor y = x.matmul(target_map);
    optimizer.zero_grad();
    torch::Tensor loss = torch::mse_loss(model->forward(x), y);
    loss.backward();
    if (absl::Status s = (*reducer)->Finish(); !s.ok()) {
      std::fprintf(stderr, "train-example: rank %d step %d: %s\n", rank, step, s.ToString().c_str());
      rc = 1;
      break;
    }
    optimizer.step();
    torch::NoGradGuard no_grad;
    const double eval = torch::mse_loss(model->forward(eval_x), eval_y).item<double>();
    std::printf("rank %d step %d train_loss %.6f eval_loss %.17g params %016llx phase %s\n", rank,
                step, loss.item<double>(), eval,
                static_cast<unsigned long long>(Checksum(model->parameters())),
                (*reducer)->phase().c_str());
    std::fflush(stdout);
  }
  if (rc == 0) {
    std::printf("rank %d done: %s plan, %d tuning iterations, cache %s\n", rank,
                (*reducer)->phase().c_str(), (*reducer)->tuning_iterations(),
                (*reducer)->cache_hit() ? "hit" : "miss");
  }
  reducer->reset();
  comm->reset();
  fusebox::comm::ShutdownLaunch(*launch);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "LibTorch data-parallel training with fusebox::torch::GradientReducer.\n"
      "  fusebox-run -n 2 -- fusebox-train-example [--steps N] [--cache_dir DIR]");
  absl::ParseCommandLine(argc, argv);
  return Run(&argc, &argv);
}
