// Gradient profiles of real models, generated from their architectures.
//
// Note [model profile compute model]
// Each model is a list of layers in forward order. A layer lists the
// parameters it uses (names and shapes as the real model's
// named_parameters()) and its forward cost at a stated batch size:
// - dense layers (convolutions, linear layers, the two attention matmuls)
//   cost 2 * MACs FLOPs, run at ComputeModel::dense_flops_per_second
//   (100e12 FLOP/s sustained by default);
// - elementwise and normalisation layers (BatchNorm, LayerNorm, activations,
//   residual adds, softmax, pooling, embedding gathers, the loss) are
//   memory-bound: they read their input activations once and write their
//   outputs once, fp32 (4 bytes per element), at
//   ComputeModel::memory_bytes_per_second (1.5e12 B/s by default);
// - the backward of a layer costs backward_factor (2) times its forward.
// forward_us is the sum of the layers' forward times and backward_us the sum
// of their backward times. Backward visits the layers in reverse forward
// order, and a layer's parameters become ready when its backward finishes
// (ready_us = backward time accumulated through that layer). A parameter
// used by several layers (GPT-2's wte, which lm_head reuses; BERT's word
// embeddings, which the MLM decoder reuses) is ready when its last use in
// backward finishes: the earliest layer in forward order, the embedding, at
// the end of backward. Parameters that become ready together are listed in
// reverse named_parameters() order (bias before weight), as DDP does.
// Times are rounded to 1 ns. Only compute is modelled: no launch overheads,
// no optimizer, no communication.
#ifndef FUSEBOX_AUTOTUNE_MODELS_H_
#define FUSEBOX_AUTOTUNE_MODELS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "autotune/profile.h"

namespace fusebox::autotune {

// The device a generated profile assumes; see Note [model profile compute
// model].
struct ComputeModel {
  double dense_flops_per_second = 100e12;
  double memory_bytes_per_second = 1.5e12;
  double activation_bytes_per_element = 4;  // fp32 activations
  double backward_factor = 2;               // backward time / forward time, per layer
};

struct ModelParameter {
  std::string name;             // as in the real model's named_parameters()
  std::vector<int64_t> shape;
};

enum class LayerKind { kDense, kMemory };

struct ModelLayer {
  std::string name;
  LayerKind kind = LayerKind::kDense;
  double flops = 0;     // kDense: forward FLOPs over the whole batch (2 * MACs)
  double elements = 0;  // kMemory: activation elements read + written in forward
  // Parameters first used (in forward) by this layer, in named_parameters()
  // order.
  std::vector<ModelParameter> params;
  // Parameters declared by an earlier layer and used again here (tied
  // weights). They do not move the parameter's ready time: its last use in
  // backward is the earlier layer.
  std::vector<std::string> tied;
};

struct ModelArchitecture {
  std::string model;              // one of ModelNames()
  std::string source;             // e.g. "torchvision resnet50"
  std::string batch;              // e.g. "batch 64 at 3x224x224"
  std::vector<ModelLayer> layers;  // forward order
};

// resnet50, bert_large, gpt2_small, gpt2_medium, gpt2_large, gpt2_xl, vit_b16.
std::vector<std::string> ModelNames();

// The architecture of a model in ModelNames(); NotFound (listing the known
// names) otherwise. Deterministic.
absl::StatusOr<ModelArchitecture> GetModelArchitecture(absl::string_view model);

// Forward time of one layer under `compute`, in microseconds (not rounded).
double LayerForwardUs(const ModelLayer& layer, const ComputeModel& compute);

// The profile of `arch` under `compute` (fp32 gradients), as described in
// Note [model profile compute model]; the description states the source,
// the batch and the compute model. InvalidArgument when `compute` is not
// positive and finite, a parameter is declared twice, a tied name was not
// declared by an earlier layer, or the result fails ValidateProfile.
absl::StatusOr<Profile> ProfileFromArchitecture(const ModelArchitecture& arch,
                                                const ComputeModel& compute = ComputeModel());

// ProfileFromArchitecture(GetModelArchitecture(model)) with the default
// ComputeModel: what autotune/profiles/<model>.json holds. Deterministic.
absl::StatusOr<Profile> GenerateModelProfile(absl::string_view model);

}  // namespace fusebox::autotune

#endif  // FUSEBOX_AUTOTUNE_MODELS_H_
