#include "autotune/models.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "autotune/profile.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#ifndef FUSEBOX_SOURCE_DIR
#error "FUSEBOX_SOURCE_DIR must name the source tree (set by tests/autotune/CMakeLists.txt)"
#endif

namespace fusebox::autotune {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMiB = 1 << 20;

// Published facts (docs/design.md, "Gradient profiles of real
// models"): tensor counts, parameter counts and the largest tensor.
struct Expected {
  const char* test_name;  // GoogleTest parameter name (no underscores)
  const char* model;
  int tensors;
  int64_t params;
  const char* largest;
  int64_t largest_bytes;
};

const Expected kExpected[] = {
    {"ResNet50", "resnet50", 161, 25'557'032, "layer4.0.conv2.weight", 9 * kMiB},
    {"BertLarge", "bert_large", 398, 336'226'108, "bert.embeddings.word_embeddings.weight",
     30522LL * 1024 * 4},
    {"Gpt2Small", "gpt2_small", 148, 124'439'808, "transformer.wte.weight", 50257LL * 768 * 4},
    {"Gpt2Medium", "gpt2_medium", 292, 354'823'168, "transformer.wte.weight", 50257LL * 1024 * 4},
    {"Gpt2Large", "gpt2_large", 436, 774'030'080, "transformer.wte.weight", 50257LL * 1280 * 4},
    {"Gpt2Xl", "gpt2_xl", 580, 1'557'611'200, "transformer.wte.weight", 50257LL * 1600 * 4},
    {"VitB16", "vit_b16", 152, 86'567'656, "encoder.layers.encoder_layer_0.mlp.0.weight",
     9 * kMiB},
};

// The profiles shipped in autotune/profiles/.
const char* const kShipped[] = {"resnet50", "bert_large", "gpt2_small", "gpt2_xl", "vit_b16"};

std::string ProfilesDir() { return std::string(FUSEBOX_SOURCE_DIR) + "/autotune/profiles"; }

class ModelProfileTest : public ::testing::TestWithParam<Expected> {
 protected:
  Profile Generate() {
    absl::StatusOr<Profile> p = GenerateModelProfile(GetParam().model);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : Profile();
  }
};

TEST_P(ModelProfileTest, MatchesPublishedCounts) {
  const Profile p = Generate();
  const Expected& e = GetParam();
  EXPECT_EQ(p.model, e.model);
  EXPECT_EQ(static_cast<int>(p.tensors.size()), e.tensors);
  int64_t params = 0;
  int64_t largest = 0;
  for (const ProfileTensor& t : p.tensors) {
    params += t.numel();
    largest = std::max(largest, t.bytes());
    EXPECT_EQ(t.dtype, comm::DataType::kFloat32) << t.name;
  }
  EXPECT_EQ(params, e.params);
  EXPECT_EQ(p.total_bytes(), 4 * e.params);
  EXPECT_EQ(largest, e.largest_bytes);
  auto it = std::find_if(p.tensors.begin(), p.tensors.end(),
                         [&](const ProfileTensor& t) { return t.name == e.largest; });
  ASSERT_NE(it, p.tensors.end()) << e.largest;
  EXPECT_EQ(it->bytes(), e.largest_bytes);
}

TEST_P(ModelProfileTest, NamesAreUnique) {
  const Profile p = Generate();
  absl::flat_hash_set<std::string> names;
  for (const ProfileTensor& t : p.tensors) EXPECT_TRUE(names.insert(t.name).second) << t.name;
}

TEST_P(ModelProfileTest, ReadyTimesAreMonotonicAndEndWithBackward) {
  const Profile p = Generate();
  ASSERT_FALSE(p.tensors.empty());
  EXPECT_GE(p.tensors.front().ready_us, 0);
  for (size_t i = 1; i < p.tensors.size(); ++i) {
    EXPECT_LE(p.tensors[i - 1].ready_us, p.tensors[i].ready_us) << p.tensors[i].name;
  }
  // The first layer in forward order owns parameters, so the last gradient
  // is ready exactly when backward ends.
  EXPECT_EQ(p.tensors.back().ready_us, p.backward_us);
  EXPECT_TRUE(ValidateProfile(p).ok()) << ValidateProfile(p);
}

TEST_P(ModelProfileTest, BackwardIsTwiceForward) {
  const Profile p = Generate();
  EXPECT_GT(p.forward_us, 0);
  EXPECT_NEAR(p.backward_us, 2 * p.forward_us, 0.002);  // both rounded to 1 ns
}

TEST_P(ModelProfileTest, ReadyTimesFollowReverseLayerOrder) {
  absl::StatusOr<ModelArchitecture> arch = GetModelArchitecture(GetParam().model);
  ASSERT_TRUE(arch.ok()) << arch.status();
  const Profile p = Generate();
  // Recompute each parameter's ready time from the layers: the backward time
  // accumulated through its declaring layer.
  const ComputeModel compute;
  std::vector<std::string> names;
  std::vector<double> ready;
  double t = 0;
  for (size_t l = arch->layers.size(); l-- > 0;) {
    t += 2 * LayerForwardUs(arch->layers[l], compute);
    for (size_t k = arch->layers[l].params.size(); k-- > 0;) {
      names.push_back(arch->layers[l].params[k].name);
      ready.push_back(t);
    }
  }
  ASSERT_EQ(names.size(), p.tensors.size());
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(p.tensors[i].name, names[i]);
    EXPECT_NEAR(p.tensors[i].ready_us, ready[i], 0.0005) << names[i];
  }
}

TEST_P(ModelProfileTest, IsDeterministic) {
  EXPECT_EQ(SerializeProfile(Generate()), SerializeProfile(Generate()));
}

TEST_P(ModelProfileTest, RoundTripsThroughJson) {
  const Profile p = Generate();
  const std::string json = SerializeProfile(p);
  absl::StatusOr<Profile> back = ParseProfile(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->model, p.model);
  EXPECT_EQ(back->description, p.description);
  EXPECT_EQ(back->forward_us, p.forward_us);
  EXPECT_EQ(back->backward_us, p.backward_us);
  ASSERT_EQ(back->tensors.size(), p.tensors.size());
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    EXPECT_EQ(back->tensors[i].name, p.tensors[i].name);
    EXPECT_EQ(back->tensors[i].shape, p.tensors[i].shape);
    EXPECT_EQ(back->tensors[i].dtype, p.tensors[i].dtype);
    EXPECT_EQ(back->tensors[i].ready_us, p.tensors[i].ready_us);
  }
  EXPECT_EQ(SerializeProfile(*back), json);
}

TEST_P(ModelProfileTest, LayoutMatchesProfile) {
  const Profile p = Generate();
  absl::StatusOr<bucketing::GradientLayout> layout = LayoutFromProfile(p);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->size(), static_cast<int>(p.tensors.size()));
  for (int i = 0; i < layout->size(); ++i) {
    EXPECT_EQ(layout->tensor(i).name, p.tensors[i].name);
    EXPECT_EQ(layout->tensor(i).numel, p.tensors[i].numel());
    EXPECT_EQ(layout->tensor(i).dtype, comm::DataType::kFloat32);
  }
  EXPECT_EQ(layout->total_bytes(), p.total_bytes());
}

TEST_P(ModelProfileTest, DescriptionStatesComputeModelAndBatch) {
  const Profile p = Generate();
  EXPECT_THAT(p.description, HasSubstr("2*MACs FLOPs at 100 TFLOP/s"));
  EXPECT_THAT(p.description, HasSubstr("memory-bound at 1.5 TB/s"));
  EXPECT_THAT(p.description, HasSubstr("backward of a layer = 2x its forward"));
  EXPECT_THAT(p.description, HasSubstr("batch "));
}

INSTANTIATE_TEST_SUITE_P(AllModels, ModelProfileTest, ::testing::ValuesIn(kExpected),
                         [](const ::testing::TestParamInfo<Expected>& info) {
                           return std::string(info.param.test_name);
                         });

TEST(ModelsTest, EveryModelHasExpectations) {
  std::vector<std::string> expected;
  for (const Expected& e : kExpected) expected.push_back(e.model);
  EXPECT_EQ(ModelNames(), expected);
}

TEST(ModelsTest, UnknownModelIsNotFoundAndListsNames) {
  absl::StatusOr<Profile> p = GenerateModelProfile("resnet51");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(p.status().message()),
              HasSubstr("resnet51' (known models: " + absl::StrJoin(ModelNames(), ", ") + ")"));
}

TEST(ModelsTest, TiedWeightsAreReadyAtTheEndOfBackward) {
  for (const char* model : {"gpt2_small", "bert_large"}) {
    SCOPED_TRACE(model);
    absl::StatusOr<Profile> p = GenerateModelProfile(model);
    ASSERT_TRUE(p.ok()) << p.status();
    const std::string tied = std::string(model) == "gpt2_small"
                                 ? "transformer.wte.weight"
                                 : "bert.embeddings.word_embeddings.weight";
    int count = 0;
    for (const ProfileTensor& t : p->tensors) {
      if (t.name == tied) {
        ++count;
        EXPECT_EQ(t.ready_us, p->backward_us);
      }
      // The tied copies are not separate parameters.
      EXPECT_NE(t.name, "lm_head.weight");
      EXPECT_NE(t.name, "cls.predictions.decoder.weight");
      EXPECT_NE(t.name, "cls.predictions.decoder.bias");
    }
    EXPECT_EQ(count, 1);
  }
}

TEST(ModelsTest, BertPredictionBiasIsReadyEarly) {
  absl::StatusOr<Profile> p = GenerateModelProfile("bert_large");
  ASSERT_TRUE(p.ok()) << p.status();
  // cls.seq_relationship (the last layer in forward) first, then the MLM
  // decoder's bias; the MLM decoder costs ~2x256 GFLOP in backward.
  ASSERT_GE(p->tensors.size(), 3u);
  EXPECT_EQ(p->tensors[0].name, "cls.seq_relationship.bias");
  EXPECT_EQ(p->tensors[1].name, "cls.seq_relationship.weight");
  EXPECT_EQ(p->tensors[2].name, "cls.predictions.bias");
  EXPECT_LT(p->tensors[2].ready_us, 0.1 * p->backward_us);
}

TEST(ModelsTest, BiasBeforeWeightWithinALayer) {
  absl::StatusOr<Profile> p = GenerateModelProfile("resnet50");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tensors[0].name, "fc.bias");
  EXPECT_EQ(p->tensors[1].name, "fc.weight");
  EXPECT_EQ(p->tensors[0].ready_us, p->tensors[1].ready_us);
  EXPECT_EQ(p->tensors.back().name, "conv1.weight");
}

// Dense MACs per sample against published counts: torchvision lists 4.09
// GFLOPS (multiply-adds) for resnet50 and 17.56 for vit_b_16.
TEST(ModelsTest, DenseCostMatchesPublishedMultiplyAdds) {
  for (const auto& [model, batch, gmacs] :
       std::vector<std::tuple<std::string, int, double>>{{"resnet50", 64, 4.09},
                                                        {"vit_b16", 64, 17.56}}) {
    SCOPED_TRACE(model);
    absl::StatusOr<ModelArchitecture> arch = GetModelArchitecture(model);
    ASSERT_TRUE(arch.ok()) << arch.status();
    double flops = 0;
    for (const ModelLayer& l : arch->layers) {
      if (l.kind == LayerKind::kDense) flops += l.flops;
    }
    EXPECT_NEAR(flops / 2 / batch / 1e9, gmacs, 0.01 * gmacs);
  }
}

TEST(ModelsTest, ComputeModelScalesTimes) {
  absl::StatusOr<ModelArchitecture> arch = GetModelArchitecture("gpt2_small");
  ASSERT_TRUE(arch.ok()) << arch.status();
  ComputeModel fast;
  fast.dense_flops_per_second *= 2;
  fast.memory_bytes_per_second *= 2;
  absl::StatusOr<Profile> base = ProfileFromArchitecture(*arch);
  absl::StatusOr<Profile> twice = ProfileFromArchitecture(*arch, fast);
  ASSERT_TRUE(base.ok() && twice.ok());
  EXPECT_NEAR(twice->forward_us, base->forward_us / 2, 0.001);
  EXPECT_NEAR(twice->backward_us, base->backward_us / 2, 0.001);
  EXPECT_THAT(twice->description, HasSubstr("200 TFLOP/s"));
  ComputeModel broken;
  broken.memory_bytes_per_second = 0;
  EXPECT_FALSE(ProfileFromArchitecture(*arch, broken).ok());
}

TEST(ModelsTest, RejectsBrokenArchitectures) {
  ModelArchitecture arch;
  arch.model = "broken";
  arch.layers.push_back({"a", LayerKind::kDense, 1e9, 0, {{"w", {2, 2}}}, {}});
  arch.layers.push_back({"b", LayerKind::kDense, 1e9, 0, {}, {"nonexistent"}});
  absl::StatusOr<Profile> p = ProfileFromArchitecture(arch);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("nonexistent"));
  arch.layers[1] = {"b", LayerKind::kMemory, 0, 1e6, {{"w", {3}}}, {}};
  p = ProfileFromArchitecture(arch);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("'w' is declared twice"));
  arch.layers[1] = {"b", LayerKind::kMemory, 0, 1e6, {{"v", {3}}}, {"w"}};
  p = ProfileFromArchitecture(arch);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->tensors.size(), 2u);
  EXPECT_EQ(p->tensors[0].name, "v");
  EXPECT_EQ(p->tensors[1].name, "w");
}

// The shipped files are exactly what the generator writes now, so they
// cannot drift from the code. After changing a model or the format,
// regenerate them (autotune/profiles/README.md).
TEST(ModelsTest, ShippedProfilesMatchGenerator) {
  std::set<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(ProfilesDir())) {
    if (entry.path().extension() == ".json") files.insert(entry.path().stem().string());
  }
  EXPECT_EQ(files, std::set<std::string>(std::begin(kShipped), std::end(kShipped)));
  for (const std::string& model : files) {
    SCOPED_TRACE(model);
    const std::string path = ProfilesDir() + "/" + model + ".json";
    absl::StatusOr<Profile> shipped = LoadProfile(path);
    ASSERT_TRUE(shipped.ok()) << shipped.status();
    absl::StatusOr<Profile> generated = GenerateModelProfile(model);
    ASSERT_TRUE(generated.ok()) << generated.status();
    std::ifstream f(path);
    std::stringstream text;
    text << f.rdbuf();
    EXPECT_TRUE(text.str() == SerializeProfile(*generated))
        << path << " differs from the generator; regenerate it with\n"
        << "  fusebox-profile generate " << absl::StrJoin(kShipped, " ")
        << " --dir autotune/profiles";
  }
}

}  // namespace
}  // namespace fusebox::autotune
