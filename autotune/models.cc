#include "autotune/models.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace fusebox::autotune {

namespace {

// Appends layers to an architecture. MAC counts are exact integers below
// 2^53, so doubles hold them exactly.
class Builder {
 public:
  explicit Builder(ModelArchitecture* arch) : arch_(arch) {}

  void Dense(std::string name, double macs, std::vector<ModelParameter> params = {},
             std::vector<std::string> tied = {}) {
    ModelLayer l;
    l.name = std::move(name);
    l.kind = LayerKind::kDense;
    l.flops = 2 * macs;
    l.params = std::move(params);
    l.tied = std::move(tied);
    arch_->layers.push_back(std::move(l));
  }

  // `elements`: activation elements read + written by the forward.
  void Memory(std::string name, double elements, std::vector<ModelParameter> params = {}) {
    ModelLayer l;
    l.name = std::move(name);
    l.kind = LayerKind::kMemory;
    l.elements = elements;
    l.params = std::move(params);
    arch_->layers.push_back(std::move(l));
  }

  // nn.Linear over `rows` input rows: weight [out, in], bias [out].
  void Linear(const std::string& name, double rows, int64_t in, int64_t out) {
    Dense(name, rows * in * out, {{name + ".weight", {out, in}}, {name + ".bias", {out}}});
  }

  // Hugging Face Conv1D (GPT-2's linear layers): weight [in, out], bias [out].
  void Conv1D(const std::string& name, double rows, int64_t in, int64_t out) {
    Dense(name, rows * in * out, {{name + ".weight", {in, out}}, {name + ".bias", {out}}});
  }

  // nn.Conv2d with a square kernel, producing batch x out x hw x hw.
  void Conv2d(const std::string& name, int64_t batch, int64_t in, int64_t out, int64_t kernel,
              int64_t out_hw, bool bias) {
    std::vector<ModelParameter> params = {{name + ".weight", {out, in, kernel, kernel}}};
    if (bias) params.push_back({name + ".bias", {out}});
    Dense(name, static_cast<double>(batch) * out_hw * out_hw * out * in * kernel * kernel,
          std::move(params));
  }

  // Training-mode BatchNorm2d over `elements` activations: read, write.
  void BatchNorm(const std::string& name, int64_t channels, double elements) {
    Memory(name, 2 * elements, {{name + ".weight", {channels}}, {name + ".bias", {channels}}});
  }

  // LayerNorm over `elements` activations of width `dim`, reading `inputs`
  // tensors of that size (2 when a residual add is fused in) and writing one.
  void LayerNorm(const std::string& name, int64_t dim, double elements, int inputs) {
    Memory(name, (inputs + 1) * elements,
           {{name + ".weight", {dim}}, {name + ".bias", {dim}}});
  }

  // Scaled dot-product attention without its projections: scores = Q K^T,
  // softmax (with scale, mask and dropout), context = P V. Every position
  // attends to all `seq` positions (the eager implementations compute the
  // full matrix and mask it).
  void Attention(const std::string& name, int64_t batch, int64_t heads, int64_t seq,
                 int64_t head_dim) {
    const double scores = static_cast<double>(batch) * heads * seq * seq;
    Dense(name + ".scores", scores * head_dim);
    Memory(name + ".softmax", 2 * scores);
    Dense(name + ".context", scores * head_dim);
  }

 private:
  ModelArchitecture* arch_;
};

// ---- ResNet-50 (torchvision resnet50, v1.5: stride on the 3x3 conv) --------

ModelArchitecture ResNet50() {
  constexpr int64_t kBatch = 64;
  ModelArchitecture arch;
  arch.model = "resnet50";
  arch.source = "torchvision resnet50";
  arch.batch = "batch 64 at 3x224x224";
  Builder b(&arch);
  const double stem = static_cast<double>(kBatch) * 64 * 112 * 112;
  b.Conv2d("conv1", kBatch, 3, 64, 7, 112, /*bias=*/false);
  b.BatchNorm("bn1", 64, stem);
  b.Memory("relu", 2 * stem);
  b.Memory("maxpool", stem + stem / 4);

  struct Stage {
    int blocks;
    int64_t width;
    int64_t stride;
  };
  constexpr Stage kStages[] = {{3, 64, 1}, {4, 128, 2}, {6, 256, 2}, {3, 512, 2}};
  int64_t in = 64;
  int64_t hw = 56;
  for (int s = 0; s < 4; ++s) {
    const Stage& stage = kStages[s];
    const int64_t out = 4 * stage.width;
    for (int blk = 0; blk < stage.blocks; ++blk) {
      const std::string p = absl::StrCat("layer", s + 1, ".", blk);
      const int64_t stride = blk == 0 ? stage.stride : 1;
      const int64_t out_hw = hw / stride;
      const double in_act = static_cast<double>(kBatch) * stage.width * hw * hw;
      const double mid_act = static_cast<double>(kBatch) * stage.width * out_hw * out_hw;
      const double out_act = static_cast<double>(kBatch) * out * out_hw * out_hw;
      b.Conv2d(p + ".conv1", kBatch, in, stage.width, 1, hw, false);
      b.BatchNorm(p + ".bn1", stage.width, in_act);
      b.Memory(p + ".relu1", 2 * in_act);
      b.Conv2d(p + ".conv2", kBatch, stage.width, stage.width, 3, out_hw, false);
      b.BatchNorm(p + ".bn2", stage.width, mid_act);
      b.Memory(p + ".relu2", 2 * mid_act);
      b.Conv2d(p + ".conv3", kBatch, stage.width, out, 1, out_hw, false);
      b.BatchNorm(p + ".bn3", out, out_act);
      if (blk == 0) {
        b.Conv2d(p + ".downsample.0", kBatch, in, out, 1, out_hw, false);
        b.BatchNorm(p + ".downsample.1", out, out_act);
      }
      b.Memory(p + ".add_relu", 3 * out_act);  // residual add + ReLU: two reads, one write
      in = out;
      hw = out_hw;
    }
  }
  b.Memory("avgpool", static_cast<double>(kBatch) * 2048 * (7 * 7 + 1));
  b.Linear("fc", kBatch, 2048, 1000);
  return arch;
}

// ---- BERT-large with pre-training heads (HF BertForPreTraining) ------------

ModelArchitecture BertLarge() {
  constexpr int64_t kBatch = 8, kSeq = 512, kDim = 1024, kHeads = 16, kLayers = 24;
  constexpr int64_t kVocab = 30522, kPositions = 512, kFf = 4096;
  constexpr double kTokens = static_cast<double>(kBatch * kSeq);
  constexpr double kAct = kTokens * kDim;
  ModelArchitecture arch;
  arch.model = "bert_large";
  arch.source =
      "Hugging Face BertForPreTraining (bert-large: 24 layers, hidden 1024, 16 heads; MLM decoder "
      "tied to the word embeddings)";
  arch.batch = "batch 8 x sequence 512";
  Builder b(&arch);
  const std::string word = "bert.embeddings.word_embeddings.weight";
  // Three gathers and their sum: read three rows per token, write one.
  b.Memory("bert.embeddings", 4 * kAct,
           {{word, {kVocab, kDim}},
            {"bert.embeddings.position_embeddings.weight", {kPositions, kDim}},
            {"bert.embeddings.token_type_embeddings.weight", {2, kDim}}});
  b.LayerNorm("bert.embeddings.LayerNorm", kDim, kAct, 1);
  for (int i = 0; i < kLayers; ++i) {
    const std::string p = absl::StrCat("bert.encoder.layer.", i);
    b.Linear(p + ".attention.self.query", kTokens, kDim, kDim);
    b.Linear(p + ".attention.self.key", kTokens, kDim, kDim);
    b.Linear(p + ".attention.self.value", kTokens, kDim, kDim);
    b.Attention(p + ".attention.self", kBatch, kHeads, kSeq, kDim / kHeads);
    b.Linear(p + ".attention.output.dense", kTokens, kDim, kDim);
    b.LayerNorm(p + ".attention.output.LayerNorm", kDim, kAct, 2);
    b.Linear(p + ".intermediate.dense", kTokens, kDim, kFf);
    b.Memory(p + ".intermediate.gelu", 2 * kTokens * kFf);
    b.Linear(p + ".output.dense", kTokens, kFf, kDim);
    b.LayerNorm(p + ".output.LayerNorm", kDim, kAct, 2);
  }
  b.Linear("bert.pooler.dense", kBatch, kDim, kDim);  // first token only
  b.Memory("bert.pooler.tanh", 2.0 * kBatch * kDim);
  b.Linear("cls.predictions.transform.dense", kTokens, kDim, kDim);
  b.Memory("cls.predictions.transform.gelu", 2 * kAct);
  b.LayerNorm("cls.predictions.transform.LayerNorm", kDim, kAct, 1);
  // decoder.weight is the word embedding matrix and decoder.bias is
  // cls.predictions.bias: named_parameters() lists neither again.
  b.Dense("cls.predictions.decoder", kTokens * kDim * kVocab,
          {{"cls.predictions.bias", {kVocab}}}, {word});
  b.Memory("cls.predictions.loss", 2 * kTokens * kVocab);  // softmax cross-entropy
  b.Linear("cls.seq_relationship", kBatch, kDim, 2);
  return arch;
}

// ---- GPT-2 (HF GPT2LMHeadModel, lm_head tied to wte) ------------------------

ModelArchitecture Gpt2(const std::string& model, const std::string& size, int64_t layers,
                       int64_t dim, int64_t heads) {
  constexpr int64_t kBatch = 8, kSeq = 1024, kVocab = 50257, kPositions = 1024;
  constexpr double kTokens = static_cast<double>(kBatch * kSeq);
  const double act = kTokens * dim;
  ModelArchitecture arch;
  arch.model = model;
  arch.source = absl::StrCat("Hugging Face GPT2LMHeadModel (", size, ": ", layers,
                             " layers, hidden ", dim, ", ", heads,
                             " heads; lm_head tied to wte)");
  arch.batch = "batch 8 x sequence 1024";
  Builder b(&arch);
  const std::string wte = "transformer.wte.weight";
  // Two gathers and their sum: read two rows per token, write one.
  b.Memory("transformer.embeddings", 3 * act,
           {{wte, {kVocab, dim}}, {"transformer.wpe.weight", {kPositions, dim}}});
  for (int64_t i = 0; i < layers; ++i) {
    const std::string p = absl::StrCat("transformer.h.", i);
    b.LayerNorm(p + ".ln_1", dim, act, 1);
    b.Conv1D(p + ".attn.c_attn", kTokens, dim, 3 * dim);
    b.Attention(p + ".attn", kBatch, heads, kSeq, dim / heads);
    b.Conv1D(p + ".attn.c_proj", kTokens, dim, dim);
    b.Memory(p + ".attn.residual", 3 * act);
    b.LayerNorm(p + ".ln_2", dim, act, 1);
    b.Conv1D(p + ".mlp.c_fc", kTokens, dim, 4 * dim);
    b.Memory(p + ".mlp.act", 2 * 4 * act);
    b.Conv1D(p + ".mlp.c_proj", kTokens, 4 * dim, dim);
    b.Memory(p + ".mlp.residual", 3 * act);
  }
  b.LayerNorm("transformer.ln_f", dim, act, 1);
  b.Dense("lm_head", kTokens * dim * kVocab, {}, {wte});
  b.Memory("lm_head.loss", 2 * kTokens * kVocab);  // softmax cross-entropy
  return arch;
}

// ---- ViT-B/16 (torchvision vit_b_16) ----------------------------------------

ModelArchitecture VitB16() {
  constexpr int64_t kBatch = 64, kPatches = 14 * 14, kSeq = kPatches + 1, kDim = 768;
  constexpr int64_t kHeads = 12, kLayers = 12, kFf = 3072, kClasses = 1000;
  constexpr double kTokens = static_cast<double>(kBatch * kSeq);
  constexpr double kAct = kTokens * kDim;
  ModelArchitecture arch;
  arch.model = "vit_b16";
  arch.source = "torchvision vit_b_16 (12 layers, hidden 768, 12 heads, patch 16)";
  arch.batch = "batch 64 at 3x224x224";
  Builder b(&arch);
  b.Conv2d("conv_proj", kBatch, 3, kDim, 16, 14, /*bias=*/true);
  // Prepend the class token: read the patch embeddings, write the sequence.
  b.Memory("class_token", static_cast<double>(kBatch) * (kPatches + kSeq) * kDim,
           {{"class_token", {1, 1, kDim}}});
  b.Memory("encoder.pos_embedding", 2 * kAct, {{"encoder.pos_embedding", {1, kSeq, kDim}}});
  for (int i = 0; i < kLayers; ++i) {
    const std::string p = absl::StrCat("encoder.layers.encoder_layer_", i);
    b.LayerNorm(p + ".ln_1", kDim, kAct, 1);
    b.Dense(p + ".self_attention.in_proj", kTokens * kDim * 3 * kDim,
            {{p + ".self_attention.in_proj_weight", {3 * kDim, kDim}},
             {p + ".self_attention.in_proj_bias", {3 * kDim}}});
    b.Attention(p + ".self_attention", kBatch, kHeads, kSeq, kDim / kHeads);
    b.Linear(p + ".self_attention.out_proj", kTokens, kDim, kDim);
    b.Memory(p + ".residual_1", 3 * kAct);
    b.LayerNorm(p + ".ln_2", kDim, kAct, 1);
    b.Linear(p + ".mlp.0", kTokens, kDim, kFf);
    b.Memory(p + ".mlp.1", 2 * kTokens * kFf);  // GELU
    b.Linear(p + ".mlp.3", kTokens, kFf, kDim);
    b.Memory(p + ".residual_2", 3 * kAct);
  }
  b.LayerNorm("encoder.ln", kDim, kAct, 1);
  b.Linear("heads.head", kBatch, kDim, kClasses);  // class token only
  return arch;
}

double RoundToNs(double us) { return std::round(us * 1000) / 1000; }

bool PositiveFinite(double v) { return std::isfinite(v) && v > 0; }

}  // namespace

std::vector<std::string> ModelNames() {
  return {"resnet50", "bert_large", "gpt2_small", "gpt2_medium", "gpt2_large", "gpt2_xl",
          "vit_b16"};
}

absl::StatusOr<ModelArchitecture> GetModelArchitecture(absl::string_view model) {
  if (model == "resnet50") return ResNet50();
  if (model == "bert_large") return BertLarge();
  if (model == "gpt2_small") return Gpt2("gpt2_small", "gpt2", 12, 768, 12);
  if (model == "gpt2_medium") return Gpt2("gpt2_medium", "gpt2-medium", 24, 1024, 16);
  if (model == "gpt2_large") return Gpt2("gpt2_large", "gpt2-large", 36, 1280, 20);
  if (model == "gpt2_xl") return Gpt2("gpt2_xl", "gpt2-xl", 48, 1600, 25);
  if (model == "vit_b16") return VitB16();
  return absl::NotFoundError(absl::StrCat("unknown model '", model, "' (known models: ",
                                          absl::StrJoin(ModelNames(), ", "), ")"));
}

double LayerForwardUs(const ModelLayer& layer, const ComputeModel& compute) {
  if (layer.kind == LayerKind::kDense) return layer.flops / compute.dense_flops_per_second * 1e6;
  return layer.elements * compute.activation_bytes_per_element /
         compute.memory_bytes_per_second * 1e6;
}

absl::StatusOr<Profile> ProfileFromArchitecture(const ModelArchitecture& arch,
                                                const ComputeModel& compute) {
  if (!PositiveFinite(compute.dense_flops_per_second) ||
      !PositiveFinite(compute.memory_bytes_per_second) ||
      !PositiveFinite(compute.activation_bytes_per_element) ||
      !PositiveFinite(compute.backward_factor)) {
    return absl::InvalidArgumentError("compute model: every rate and factor must be positive");
  }
  // Where each parameter is declared: a tied use must refer to an earlier
  // layer, so that the declaring layer is the parameter's last use in
  // backward.
  absl::flat_hash_map<std::string, size_t> declared;
  double forward_us = 0;
  double dense_flops = 0;
  double memory_bytes = 0;
  for (size_t l = 0; l < arch.layers.size(); ++l) {
    const ModelLayer& layer = arch.layers[l];
    for (const std::string& name : layer.tied) {
      auto it = declared.find(name);
      if (it == declared.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            arch.model, ": layer ", layer.name, " ties '", name,
            "', which no earlier layer declares"));
      }
    }
    for (const ModelParameter& param : layer.params) {
      if (!declared.emplace(param.name, l).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(arch.model, ": parameter '", param.name, "' is declared twice"));
      }
    }
    const double us = LayerForwardUs(layer, compute);
    if (!std::isfinite(us) || us < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(arch.model, ": layer ", layer.name, " has no finite cost"));
    }
    forward_us += us;
    if (layer.kind == LayerKind::kDense) {
      dense_flops += layer.flops;
    } else {
      memory_bytes += layer.elements * compute.activation_bytes_per_element;
    }
  }

  Profile p;
  p.model = arch.model;
  double backward_us = 0;
  for (size_t l = arch.layers.size(); l-- > 0;) {
    const ModelLayer& layer = arch.layers[l];
    backward_us += compute.backward_factor * LayerForwardUs(layer, compute);
    for (size_t k = layer.params.size(); k-- > 0;) {
      ProfileTensor t;
      t.name = layer.params[k].name;
      t.shape = layer.params[k].shape;
      t.dtype = comm::DataType::kFloat32;
      t.ready_us = RoundToNs(backward_us);
      p.tensors.push_back(std::move(t));
    }
  }
  p.forward_us = RoundToNs(forward_us);
  p.backward_us = RoundToNs(backward_us);
  p.description = absl::StrFormat(
      "%s, %s, fp32 gradients. Compute model: dense layers (convolutions, linear layers, "
      "attention matmuls) cost 2*MACs FLOPs at %g TFLOP/s sustained; elementwise and "
      "normalisation layers are memory-bound at %g TB/s, reading their input activations once "
      "and writing their outputs once (%g bytes per element); backward of a layer = %gx its "
      "forward; a parameter is ready when the backward of its earliest layer in forward order "
      "finishes. Forward: %d layers, %.1f GFLOP dense + %.2f GB activation traffic.",
      arch.source, arch.batch, compute.dense_flops_per_second / 1e12,
      compute.memory_bytes_per_second / 1e12, compute.activation_bytes_per_element,
      compute.backward_factor, arch.layers.size(), dense_flops / 1e9, memory_bytes / 1e9);
  if (absl::Status s = ValidateProfile(p); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(arch.model, ": generated profile is invalid: ", s.message()));
  }
  return p;
}

absl::StatusOr<Profile> GenerateModelProfile(absl::string_view model) {
  absl::StatusOr<ModelArchitecture> arch = GetModelArchitecture(model);
  if (!arch.ok()) return arch.status();
  return ProfileFromArchitecture(*arch);
}

}  // namespace fusebox::autotune
