#include "autotune/policy_cache.h"

#include <fcntl.h>
#include <stdlib.h>
#include <linux/fs.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bucketing/plan_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace fusebox::autotune {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using Json = nlohmann::json;
using comm::DataType;

// Four gradients: two fp32, one fp16, one empty; names start with `prefix`.
bucketing::GradientLayout TestLayout(const std::string& prefix = "net.") {
  auto layout = bucketing::GradientLayout::Create({
      {prefix + "fc.weight", 1000, DataType::kFloat32},
      {prefix + "fc.bias", 10, DataType::kFloat32},
      {prefix + "emb.weight", 4096, DataType::kFloat16},
      {prefix + "unused", 0, DataType::kFloat32},
  });
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *layout;
}

// Valid for TestLayout: the first tensor is split across two buckets.
bucketing::Plan TestPlan() {
  bucketing::Plan plan;
  plan.name = "test-plan";
  plan.buckets = {
      {DataType::kFloat32, {{0, 0, 500}}},
      {DataType::kFloat32, {{0, 500, 500}, {1, 0, 10}, {3, 0, 0}}},
      {DataType::kFloat16, {{2, 0, 4096}}},
  };
  return plan;
}

CacheKey TestKey(const bucketing::GradientLayout& layout, int world = 8, int rpn = 4,
                 const std::string& backend = "ucx", const std::string& network = "ib-400g:x") {
  CacheKey key;
  key.model_signature = ModelSignature(layout);
  key.world_size = world;
  key.ranks_per_node = rpn;
  key.backend = backend;
  key.network = network;
  return key;
}

CacheEntry TestEntry(const bucketing::GradientLayout& layout, const CacheKey& key) {
  CacheEntry e;
  e.key = key;
  e.model = "tiny \xc3\xa9t\xc3\xa9";  // UTF-8 survives the round trip
  e.layout_hash = layout.Hash();
  e.plan = TestPlan();
  e.measured_iteration_us = 1234.5678;
  e.ddp_iteration_us = 1500.25;
  e.predicted_iteration_us = 0.1;
  e.tuning_iterations = 42;
  e.cost_model = "alpha-beta ring: alpha=5us beta=0.04ns/B";
  e.fusebox_version = "0.1.0";
  e.created_unix_s = 1700000000;
  return e;
}

void ExpectSameEntry(const CacheEntry& a, const CacheEntry& b) {
  EXPECT_TRUE(a.key == b.key);
  EXPECT_EQ(a.model, b.model);
  EXPECT_EQ(a.layout_hash, b.layout_hash);
  EXPECT_TRUE(a.plan == b.plan);
  EXPECT_EQ(a.plan.name, b.plan.name);
  EXPECT_EQ(a.measured_iteration_us, b.measured_iteration_us);
  EXPECT_EQ(a.ddp_iteration_us, b.ddp_iteration_us);
  EXPECT_EQ(a.predicted_iteration_us, b.predicted_iteration_us);
  EXPECT_EQ(a.tuning_iterations, b.tuning_iterations);
  EXPECT_EQ(a.cost_model, b.cost_model);
  EXPECT_EQ(a.fusebox_version, b.fusebox_version);
  EXPECT_EQ(a.created_unix_s, b.created_unix_s);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteAll(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

std::vector<std::string> DirNames(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

void ExpectParseError(const std::string& text, const std::vector<std::string>& parts) {
  absl::StatusOr<CacheEntry> e = ParseCacheEntry(text);
  ASSERT_FALSE(e.ok()) << "accepted:\n" << text;
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << e.status();
  for (const std::string& part : parts) {
    EXPECT_THAT(std::string(e.status().message()), HasSubstr(part));
  }
}

class PolicyCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/policy_cache_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr) << tmpl;
    root_ = tmpl;
    dir_ = root_ + "/cache";
  }
  void TearDown() override {
    std::error_code ec;
    for (const auto& e : fs::recursive_directory_iterator(root_, ec)) {
      if (e.is_directory()) chmod(e.path().c_str(), 0755);
    }
    fs::remove_all(root_, ec);
  }

  PolicyCacheOptions Options(const std::string& dir) {
    PolicyCacheOptions o;
    o.dir = dir;
    o.warn = [this](const std::string& m) { warnings_.push_back(m); };
    return o;
  }
  PolicyCacheOptions Options() { return Options(dir_); }

  // The JSON of a valid entry for TestLayout, with `edit` applied.
  std::string EditedEntry(const std::function<void(Json&)>& edit) {
    bucketing::GradientLayout layout = TestLayout();
    Json j = Json::parse(SerializeCacheEntry(TestEntry(layout, TestKey(layout))));
    edit(j);
    return j.dump(1);
  }

  std::string root_;
  std::string dir_;
  std::vector<std::string> warnings_;
};

// ---- signature and key --------------------------------------------------------

TEST(PolicyCacheSignatureTest, IgnoresNamesAndMemoryButNotSizesTypesOrOrder) {
  const std::string base = ModelSignature(TestLayout("a."));
  EXPECT_EQ(base.size(), 16u);
  EXPECT_EQ(base.find_first_not_of("0123456789abcdef"), std::string::npos) << base;
  EXPECT_EQ(ModelSignature(TestLayout("b.other.")), base);

  auto make = [](std::vector<bucketing::TensorSpec> t) {
    auto l = bucketing::GradientLayout::Create(std::move(t));
    EXPECT_TRUE(l.ok()) << l.status();
    return ModelSignature(*l);
  };
  const std::string two = make({{"x", 10, DataType::kFloat32}, {"y", 20, DataType::kFloat16}});
  EXPECT_NE(two, base);
  EXPECT_NE(make({{"x", 11, DataType::kFloat32}, {"y", 20, DataType::kFloat16}}), two);
  EXPECT_NE(make({{"x", 10, DataType::kFloat64}, {"y", 20, DataType::kFloat16}}), two);
  EXPECT_NE(make({{"y", 20, DataType::kFloat16}, {"x", 10, DataType::kFloat32}}), two);
  EXPECT_NE(make({{"x", 10, DataType::kFloat32}}), two);
  EXPECT_EQ(make({{"p", 10, DataType::kFloat32}, {"q", 20, DataType::kFloat16}}), two);
  EXPECT_EQ(make({{"x", 10, DataType::kFloat32, comm::MemoryKind::kDevice},
                  {"y", 20, DataType::kFloat16, comm::MemoryKind::kDevice}}),
            two);
}

TEST(PolicyCacheKeyTest, ValidatesFields) {
  const CacheKey good = TestKey(TestLayout(), 16, 8, "nccl", "ib-400g+sharp");
  EXPECT_TRUE(good.Validate().ok()) << good.Validate();
  struct Case {
    std::function<void(CacheKey&)> edit;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](CacheKey& k) { k.model_signature = "abc"; }, "model_signature"},
      {[](CacheKey& k) { k.model_signature = "0123456789abcdeg"; }, "model_signature"},
      {[](CacheKey& k) { k.world_size = 0; }, "world_size"},
      {[](CacheKey& k) { k.world_size = (1 << 24) + 1; }, "world_size"},
      {[](CacheKey& k) { k.ranks_per_node = 0; }, "ranks_per_node"},
      {[](CacheKey& k) { k.ranks_per_node = 17; }, "ranks_per_node"},
      {[](CacheKey& k) { k.backend = ""; }, "backend"},
      {[](CacheKey& k) { k.backend = "u/x"; }, "backend"},
      {[](CacheKey& k) { k.network = "a b"; }, "network"},
      {[](CacheKey& k) { k.network = std::string(kMaxPolicyLabelBytes + 1, 'n'); }, "network"},
      {[](CacheKey& k) { k.network = "../etc"; }, "network"},
  };
  for (const Case& c : cases) {
    CacheKey k = good;
    c.edit(k);
    absl::Status s = k.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.field));
  }
  CacheKey k = good;
  k.network = std::string(kMaxPolicyLabelBytes, 'n');
  EXPECT_TRUE(k.Validate().ok());
}

TEST(PolicyCacheKeyTest, FileName) {
  CacheKey k = TestKey(TestLayout(), 16, 8, "nccl", "ib-400g:rail+sharp");
  EXPECT_EQ(k.FileName(),
            absl::StrCat(k.model_signature, "-w16-r8-nccl-ib-400g_rail_sharp-v1.json"));
}

// ---- the file form --------------------------------------------------------------

TEST(PolicyCacheFormatTest, SerializeParseRoundTrip) {
  bucketing::GradientLayout layout = TestLayout();
  const CacheEntry e = TestEntry(layout, TestKey(layout));
  const std::string text = SerializeCacheEntry(e);
  EXPECT_EQ(SerializeCacheEntry(e), text);  // deterministic
  absl::StatusOr<CacheEntry> back = ParseCacheEntry(text);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << text;
  ExpectSameEntry(*back, e);
  EXPECT_EQ(SerializeCacheEntry(*back), text);

  // Readable: indented, one bucket per line; the plan is the plan-file form.
  EXPECT_THAT(text, HasSubstr("\"world_size\": 8, \"ranks_per_node\": 4"));
  EXPECT_THAT(text, HasSubstr("\n  \"layout_hash\": \""));
  EXPECT_THAT(text, HasSubstr("{\"dtype\": \"float\", \"slices\": [[0, 500, 500], [1, 0, 10], "
                              "[3, 0, 0]]}"));
  const Json doc = Json::parse(text);
  EXPECT_EQ(doc["plan"], Json::parse(bucketing::SerializePlan(e.plan)));
  char hash[17];
  std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(layout.Hash()));
  EXPECT_EQ(doc["layout_hash"], hash);
}

TEST(PolicyCacheFormatTest, IgnoresUnknownKeys) {
  bucketing::GradientLayout layout = TestLayout();
  Json j = Json::parse(SerializeCacheEntry(TestEntry(layout, TestKey(layout))));
  j["comment"] = {{"from", "a newer writer"}, {"list", {1, 2, 3}}};
  j["key"]["topology"] = "ring";
  j["plan"]["extra"] = true;
  absl::StatusOr<CacheEntry> e = ParseCacheEntry(j.dump());
  ASSERT_TRUE(e.ok()) << e.status();
  ExpectSameEntry(*e, TestEntry(layout, TestKey(layout)));
}

TEST_F(PolicyCacheTest, ParseRejectsMistypedFields) {
  // Each field given a value of the wrong type.
  const std::vector<std::pair<std::vector<std::string>, Json>> cases = {
      {{"format"}, 1},
      {{"version"}, "1"},
      {{"version"}, 1.0},
      {{"key"}, "k"},
      {{"key", "model_signature"}, 12},
      {{"key", "world_size"}, "8"},
      {{"key", "world_size"}, 8.5},
      {{"key", "ranks_per_node"}, Json::array()},
      {{"key", "backend"}, nullptr},
      {{"key", "network"}, false},
      {{"model"}, 3},
      {{"layout_hash"}, 12345},
      {{"measured_iteration_us"}, "fast"},
      {{"ddp_iteration_us"}, Json::object()},
      {{"predicted_iteration_us"}, true},
      {{"tuning_iterations"}, 1.5},
      {{"cost_model"}, Json::array()},
      {{"fusebox_version"}, 1},
      {{"created_unix_s"}, "now"},
      {{"plan"}, Json::array()},
      {{"plan", "buckets"}, "none"},
  };
  for (const auto& [path, value] : cases) {
    std::string field = path[0];
    for (size_t i = 1; i < path.size(); ++i) field += "." + path[i];
    SCOPED_TRACE(field);
    ExpectParseError(EditedEntry([&](Json& j) {
                       Json* v = &j;
                       for (const std::string& p : path) v = &(*v)[p];
                       *v = value;
                     }),
                     {field + ":"});
  }
  // And each missing.
  for (const char* field :
       {"format", "version", "key", "model", "layout_hash", "measured_iteration_us",
        "tuning_iterations", "created_unix_s", "plan"}) {
    SCOPED_TRACE(field);
    ExpectParseError(EditedEntry([&](Json& j) { j.erase(field); }),
                     {absl::StrCat(field, ": missing")});
  }
  ExpectParseError(EditedEntry([](Json& j) { j["key"].erase("network"); }),
                   {"key.network: missing"});
}

TEST_F(PolicyCacheTest, ParseRejectsOutOfRangeValues) {
  ExpectParseError(EditedEntry([](Json& j) { j["format"] = "fusebox-plan"; }),
                   {"format: expected \"fusebox-policy\""});
  ExpectParseError(EditedEntry([](Json& j) { j["version"] = 2; }), {"version: 2 is not supported"});
  ExpectParseError(EditedEntry([](Json& j) { j["key"]["world_size"] = 0; }),
                   {"key.world_size: 0 is outside"});
  ExpectParseError(EditedEntry([](Json& j) { j["key"]["world_size"] = 99999999999999999ull; }),
                   {"key.world_size:"});
  ExpectParseError(EditedEntry([](Json& j) { j["key"]["ranks_per_node"] = 9; }),
                   {"key.ranks_per_node: 9 is outside"});
  ExpectParseError(EditedEntry([](Json& j) { j["key"]["model_signature"] = "ABCDEF0123456789"; }),
                   {"key.model_signature"});
  ExpectParseError(EditedEntry([](Json& j) { j["key"]["backend"] = "u x"; }), {"key.backend"});
  ExpectParseError(EditedEntry([](Json& j) { j["layout_hash"] = "12345"; }),
                   {"layout_hash: \"12345\" is not a 16-digit"});
  ExpectParseError(EditedEntry([](Json& j) { j["layout_hash"] = "-123456789abcdef"; }),
                   {"layout_hash"});
  ExpectParseError(EditedEntry([](Json& j) { j["measured_iteration_us"] = -1; }),
                   {"measured_iteration_us: -1 is negative"});
  ExpectParseError(EditedEntry([](Json& j) { j["tuning_iterations"] = 1000001; }),
                   {"tuning_iterations: 1000001 is outside [0, 1000000]"});
  ExpectParseError(EditedEntry([](Json& j) { j["created_unix_s"] = -5; }),
                   {"created_unix_s: -5 is outside"});
  ExpectParseError(EditedEntry([](Json& j) { j["created_unix_s"] = 18446744073709551615ull; }),
                   {"created_unix_s: 18446744073709551615 is outside"});
  ExpectParseError(EditedEntry([](Json& j) { j["model"] = std::string(200, 'm'); }),
                   {"model: 200 bytes"});
  ExpectParseError(EditedEntry([](Json& j) { j["plan"]["buckets"][1]["slices"][0][1] = -1; }),
                   {"plan.buckets[1].slices[0][1]"});
  ExpectParseError(EditedEntry([](Json& j) { j["plan"]["buckets"][0]["dtype"] = "complex"; }),
                   {"plan.buckets[0].dtype"});
  ExpectParseError(EditedEntry([](Json& j) { j["plan"]["format"] = "x"; }), {"plan.format"});
  // A number too large for a double.
  std::string huge = EditedEntry([](Json&) {});
  huge.replace(huge.find("1234.5678"), 9, "1e999999");
  ExpectParseError(huge, {"malformed JSON"});
  ExpectParseError("", {"malformed JSON"});
  ExpectParseError("[1, 2]", {"expected an object"});
}

TEST(PolicyCacheFormatTest, RejectsDeepNestingQuickly) {
  std::string deep = R"({"format": "fusebox-policy", "version": 1, "x": )";
  deep += std::string(10000, '[') + std::string(10000, ']') + "}";
  ExpectParseError(deep, {"more than 8 levels deep"});
  std::string deep_obj = "{\"a\": ";
  for (int i = 0; i < 10000; ++i) deep_obj += "{\"a\": ";
  deep_obj += "1" + std::string(10001, '}');
  ExpectParseError(deep_obj, {"levels deep"});
  // Nesting just inside the bound is fine as far as depth goes.
  ExpectParseError(R"({"format": "fusebox-policy", "version": 1, "x": [[[[[[[1]]]]]]]})",
                   {"key: missing"});
}

// ---- the directory --------------------------------------------------------------

TEST_F(PolicyCacheTest, MissingDirectoryIsCreated) {
  const std::string dir = dir_ + "/a/b/c";
  PolicyCache cache(Options(dir));
  EXPECT_TRUE(cache.enabled());
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_THAT(warnings_, IsEmpty());
  EXPECT_THAT(DirNames(dir), IsEmpty());  // the write probe is gone
}

// Looking at a cache (fusebox-cache list, show, export) changes nothing on
// disk: a missing directory stays missing and is an empty cache; an
// existing one is read, and nothing can be written through it.
TEST_F(PolicyCacheTest, ReadOnlyNeverCreatesTheDirectoryAndNeverWrites) {
  const std::string missing = dir_ + "/not/there";
  PolicyCacheOptions o = Options(missing);
  o.read_only = true;
  PolicyCache absent(o);
  EXPECT_FALSE(absent.enabled());
  EXPECT_THAT(absent.List(), IsEmpty());
  EXPECT_FALSE(fs::exists(dir_ + "/not"));
  EXPECT_THAT(warnings_, IsEmpty());

  bucketing::GradientLayout layout = TestLayout();
  const CacheKey key = TestKey(layout);
  ASSERT_TRUE(PolicyCache(Options()).Store(TestEntry(layout, key)).ok());
  o = Options();
  o.read_only = true;
  PolicyCache reader(o);
  ASSERT_TRUE(reader.enabled());
  EXPECT_TRUE(reader.Lookup(key, layout).has_value());
  EXPECT_EQ(reader.List().size(), 1u);
  const absl::Status s = reader.Store(TestEntry(layout, key));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("read-only"));
  EXPECT_EQ(reader.Remove(key.FileName()).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(PolicyCacheTest, StoreThenLookupRoundTrip) {
  bucketing::GradientLayout layout = TestLayout();
  const CacheKey key = TestKey(layout);
  PolicyCache cache(Options());
  ASSERT_TRUE(cache.enabled());
  EXPECT_EQ(cache.Lookup(key, layout), std::nullopt);  // a silent miss
  const CacheEntry e = TestEntry(layout, key);
  ASSERT_TRUE(cache.Store(e).ok());
  std::optional<CacheEntry> hit = cache.Lookup(key, layout);
  ASSERT_TRUE(hit.has_value());
  ExpectSameEntry(*hit, e);
  EXPECT_EQ(ReadAll(dir_ + "/" + key.FileName()), SerializeCacheEntry(e));
  EXPECT_THAT(DirNames(dir_), ElementsAre(".lock", key.FileName()));
  // Other world sizes, backends and layouts miss.
  CacheKey other = key;
  other.world_size = 16;
  EXPECT_EQ(cache.Lookup(other, layout), std::nullopt);
  other = key;
  other.backend = "mpi";
  EXPECT_EQ(cache.Lookup(other, layout), std::nullopt);
  EXPECT_THAT(warnings_, IsEmpty());

  // A second cache on the same directory sees it; Store replaces.
  PolicyCache again(Options());
  CacheEntry newer = e;
  newer.measured_iteration_us = 999;
  ASSERT_TRUE(again.Store(newer).ok());
  hit = cache.Lookup(key, layout);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->measured_iteration_us, 999);
  EXPECT_THAT(warnings_, IsEmpty());
}

TEST_F(PolicyCacheTest, StoreRejectsInvalidEntries) {
  bucketing::GradientLayout layout = TestLayout();
  PolicyCache cache(Options());
  struct Case {
    std::function<void(CacheEntry&)> edit;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](CacheEntry& e) { e.key.world_size = 0; }, "key.world_size"},
      {[](CacheEntry& e) { e.key.format_version = 2; }, "key.format_version"},
      {[](CacheEntry& e) { e.measured_iteration_us = std::nan(""); }, "measured_iteration_us"},
      {[](CacheEntry& e) { e.ddp_iteration_us = INFINITY; }, "ddp_iteration_us"},
      {[](CacheEntry& e) { e.predicted_iteration_us = -1; }, "predicted_iteration_us"},
      {[](CacheEntry& e) { e.tuning_iterations = -1; }, "tuning_iterations"},
      {[](CacheEntry& e) { e.created_unix_s = -1; }, "created_unix_s"},
      {[](CacheEntry& e) { e.model = "\xff\xfe"; }, "model"},
      {[](CacheEntry& e) { e.plan.name = "\xc3"; }, "plan.name"},
      {[](CacheEntry& e) { e.plan.buckets[0].slices[0].tensor = -1; }, "plan.buckets[0]"},
      {[](CacheEntry& e) { e.plan.buckets[2].dtype = static_cast<DataType>(99); },
       "plan.buckets[2].dtype"},
  };
  for (const Case& c : cases) {
    CacheEntry e = TestEntry(layout, TestKey(layout));
    c.edit(e);
    absl::Status s = cache.Store(e);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.field));
  }
  EXPECT_THAT(DirNames(dir_), IsEmpty());
}

// Lookup of a file with `contents` in place of the entry: a miss with one
// warning naming the file and `reason`; then Store replaces the file.
class PolicyCacheBadFileTest : public PolicyCacheTest {
 protected:
  void ExpectIgnoredThenReplaced(const std::string& contents, const std::string& reason) {
    bucketing::GradientLayout layout = TestLayout();
    const CacheKey key = TestKey(layout);
    PolicyCache cache(Options());
    ASSERT_TRUE(cache.enabled());
    const std::string path = dir_ + "/" + key.FileName();
    WriteAll(path, contents);
    warnings_.clear();
    EXPECT_EQ(cache.Lookup(key, layout), std::nullopt);
    ASSERT_THAT(warnings_, SizeIs(1));
    EXPECT_THAT(warnings_[0], HasSubstr(path));
    EXPECT_THAT(warnings_[0], HasSubstr(reason));
    const CacheEntry good = TestEntry(layout, key);
    ASSERT_TRUE(cache.Store(good).ok());
    std::optional<CacheEntry> hit = cache.Lookup(key, layout);
    ASSERT_TRUE(hit.has_value());
    ExpectSameEntry(*hit, good);
    EXPECT_THAT(warnings_, SizeIs(1));
  }
};

TEST_F(PolicyCacheBadFileTest, Garbage) {
  ExpectIgnoredThenReplaced("\x01\x02not json", "malformed JSON");
}
TEST_F(PolicyCacheBadFileTest, Empty) { ExpectIgnoredThenReplaced("", "malformed JSON"); }

TEST_F(PolicyCacheBadFileTest, Truncated) {
  bucketing::GradientLayout layout = TestLayout();
  const std::string text = SerializeCacheEntry(TestEntry(layout, TestKey(layout)));
  ExpectIgnoredThenReplaced(text.substr(0, text.size() / 2), "malformed JSON");
}

TEST_F(PolicyCacheBadFileTest, WrongVersion) {
  ExpectIgnoredThenReplaced(EditedEntry([](Json& j) { j["version"] = 7; }),
                            "version: 7 is not supported");
}

TEST_F(PolicyCacheBadFileTest, WrongFormat) {
  ExpectIgnoredThenReplaced(bucketing::SerializePlan(TestPlan()), "format: expected");
}

TEST_F(PolicyCacheBadFileTest, HugeNumber) {
  ExpectIgnoredThenReplaced(EditedEntry([](Json& j) { j["key"]["world_size"] = 1e300; }),
                            "key.world_size");
}

TEST_F(PolicyCacheBadFileTest, DeepNesting) {
  std::string text = EditedEntry([](Json&) {});
  text.insert(1, "\"deep\": " + std::string(10000, '[') + std::string(10000, ']') + ",");
  ExpectIgnoredThenReplaced(text, "levels deep");
}

TEST_F(PolicyCacheBadFileTest, WrongType) {
  ExpectIgnoredThenReplaced(EditedEntry([](Json& j) { j["tuning_iterations"] = "many"; }),
                            "tuning_iterations: expected an integer, got string");
}

TEST_F(PolicyCacheBadFileTest, PlanNotValidForLayout) {
  ExpectIgnoredThenReplaced(
      EditedEntry([](Json& j) { j["plan"]["buckets"][0]["slices"][0][2] = 499; }),
      "plan does not fit the layout");
}

TEST_F(PolicyCacheBadFileTest, LayoutHashMismatch) {
  const bucketing::GradientLayout renamed = TestLayout("renamed.");
  ExpectIgnoredThenReplaced(EditedEntry([&](Json& j) {
                              char hash[17];
                              std::snprintf(hash, sizeof(hash), "%016llx",
                                            static_cast<unsigned long long>(renamed.Hash()));
                              j["layout_hash"] = hash;
                            }),
                            "layout_hash: the plan was made for layout");
}

TEST_F(PolicyCacheBadFileTest, KeyDiffersFromName) {
  ExpectIgnoredThenReplaced(EditedEntry([](Json& j) { j["key"]["world_size"] = 16; }),
                            "holds the entry for another key");
}

TEST_F(PolicyCacheBadFileTest, TooLarge) {
  bucketing::GradientLayout layout = TestLayout();
  const CacheKey key = TestKey(layout);
  PolicyCache cache(Options());
  const std::string path = dir_ + "/" + key.FileName();
  WriteAll(path, "{");
  ASSERT_EQ(truncate(path.c_str(), kMaxPolicyFileBytes + 1), 0);  // sparse
  EXPECT_EQ(cache.Lookup(key, layout), std::nullopt);
  ASSERT_THAT(warnings_, SizeIs(1));
  EXPECT_THAT(warnings_[0], HasSubstr(path));
  EXPECT_THAT(warnings_[0], HasSubstr("larger than the limit of 64 MiB"));
}

TEST_F(PolicyCacheBadFileTest, Directory) {
  bucketing::GradientLayout layout = TestLayout();
  const CacheKey key = TestKey(layout);
  PolicyCache cache(Options());
  ASSERT_TRUE(fs::create_directory(dir_ + "/" + key.FileName()));
  EXPECT_EQ(cache.Lookup(key, layout), std::nullopt);
  ASSERT_THAT(warnings_, SizeIs(1));
  EXPECT_THAT(warnings_[0], HasSubstr("not a regular file"));
}

// ---- disabled caches --------------------------------------------------------------

// Makes `dir` unwritable for this process, even for root where the file
// system allows it (the immutable attribute; root ignores mode bits): true
// when it now refuses a new file. Undone by Unfreeze.
bool Freeze(const std::string& dir) {
  chmod(dir.c_str(), 0555);
  if (access(dir.c_str(), W_OK) != 0) return true;
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  int flags = 0;
  const bool ok = ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0 &&
                  (flags |= FS_IMMUTABLE_FL, ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0);
  close(fd);
  return ok;
}

void Unfreeze(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    int flags = 0;
    if (ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0 && (flags & FS_IMMUTABLE_FL) != 0) {
      flags &= ~FS_IMMUTABLE_FL;
      ioctl(fd, FS_IOC_SETFLAGS, &flags);
    }
    close(fd);
  }
  chmod(dir.c_str(), 0755);
}

// A cache shared read-only (tuned by one account, used by others) serves
// lookups; writes fail and say why; nothing in it changes.
TEST_F(PolicyCacheTest, UnwritableDirectoryIsLookedUpButNeverWritten) {
  bucketing::GradientLayout layout = TestLayout();
  const CacheKey key = TestKey(layout);
  {
    PolicyCache writer(Options());
    ASSERT_TRUE(writer.writable());
    ASSERT_TRUE(writer.Store(TestEntry(layout, key)).ok());
  }
  const std::string before = ReadAll(dir_ + "/" + key.FileName());
  if (!Freeze(dir_)) {
    Unfreeze(dir_);
    GTEST_SKIP() << "cannot make " << dir_ << " unwritable here (root, no immutable attribute)";
  }
  PolicyCache cache(Options());
  const bool enabled = cache.enabled();
  const bool writable = cache.writable();
  std::optional<CacheEntry> hit = cache.Lookup(key, layout);
  CacheKey other = key;
  other.world_size = key.world_size * 2;
  std::optional<CacheEntry> near = cache.Nearest(other, layout);
  const absl::Status store = cache.Store(TestEntry(layout, other));
  const absl::Status remove = cache.Remove(key.FileName());
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(dir_)) files.insert(e.path().filename().string());
  Unfreeze(dir_);

  EXPECT_TRUE(enabled);
  EXPECT_FALSE(writable);
  ASSERT_THAT(warnings_, SizeIs(1));
  EXPECT_THAT(warnings_[0], HasSubstr(dir_));
  EXPECT_THAT(warnings_[0], HasSubstr("not writable"));
  EXPECT_THAT(warnings_[0], HasSubstr("looked up in it but not stored"));
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->key.world_size, key.world_size);
  ASSERT_TRUE(near.has_value());
  EXPECT_EQ(near->key.world_size, key.world_size);
  EXPECT_EQ(store.code(), absl::StatusCode::kFailedPrecondition) << store;
  EXPECT_THAT(store.message(), HasSubstr("not writable"));
  EXPECT_EQ(remove.code(), absl::StatusCode::kFailedPrecondition) << remove;
  EXPECT_EQ(files, (std::set<std::string>{".lock", key.FileName()}));
  EXPECT_EQ(ReadAll(dir_ + "/" + key.FileName()), before);
}

TEST_F(PolicyCacheTest, PathUnderRegularFileDisablesCache) {
  WriteAll(root_ + "/file", "x");
  const std::string dir = root_ + "/file/cache";
  bucketing::GradientLayout layout = TestLayout();
  PolicyCache cache(Options(dir));
  EXPECT_FALSE(cache.enabled());
  ASSERT_THAT(warnings_, SizeIs(1));
  EXPECT_THAT(warnings_[0], HasSubstr(dir));
  EXPECT_THAT(warnings_[0], HasSubstr("cannot create directory"));
  EXPECT_EQ(cache.Lookup(TestKey(layout), layout), std::nullopt);
  absl::Status s = cache.Store(TestEntry(layout, TestKey(layout)));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(cache.Remove("x.json").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(cache.List(), IsEmpty());
  EXPECT_THAT(warnings_, SizeIs(1));
}

TEST_F(PolicyCacheTest, LockTimeoutIsUnavailable) {
  bucketing::GradientLayout layout = TestLayout();
  PolicyCacheOptions options = Options();
  options.lock_timeout = absl::Milliseconds(100);
  PolicyCache cache(options);
  ASSERT_TRUE(cache.enabled());
  const int fd = open((dir_ + "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(flock(fd, LOCK_EX), 0);
  const absl::Time start = absl::Now();
  absl::Status s = cache.Store(TestEntry(layout, TestKey(layout)));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(".lock"));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(90));
  EXPECT_FALSE(fs::exists(dir_ + "/" + TestKey(layout).FileName()));
  close(fd);
  EXPECT_TRUE(cache.Store(TestEntry(layout, TestKey(layout))).ok());
}

// ---- nearest, list, remove ------------------------------------------------------

TEST_F(PolicyCacheTest, NearestPicksNearestWorldSizeByRatio) {
  bucketing::GradientLayout layout = TestLayout();
  PolicyCache cache(Options());
  const CacheKey want = TestKey(layout, 8, 2, "ucx", "local");
  EXPECT_EQ(cache.Nearest(want, layout), std::nullopt);
  auto store = [&](int world, int rpn, const std::string& backend, const std::string& network) {
    CacheEntry e = TestEntry(layout, TestKey(layout, world, rpn, backend, network));
    e.measured_iteration_us = world;
    ASSERT_TRUE(cache.Store(e).ok());
  };
  store(2, 2, "ucx", "local");    // ratio 4
  store(64, 2, "ucx", "local");   // ratio 8
  store(8, 1, "ucx", "local");    // other rpn
  store(7, 2, "mpi", "local");    // other backend
  store(9, 2, "ucx", "ib-400g");  // other network
  std::optional<CacheEntry> n = cache.Nearest(want, layout);
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(n->key.world_size, 2);
  store(24, 2, "ucx", "local");  // ratio 3
  n = cache.Nearest(want, layout);
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(n->key.world_size, 24);
  store(6, 2, "ucx", "local");   // ratio 1.33
  store(10, 2, "ucx", "local");  // ratio 1.25
  n = cache.Nearest(want, layout);
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(n->key.world_size, 10);
  store(4, 2, "ucx", "local");  // a tie with 16: the larger wins
  store(16, 2, "ucx", "local");
  EXPECT_EQ(cache.Nearest(TestKey(layout, 8, 2, "ucx", "local"), layout)->key.world_size, 10);
  ASSERT_TRUE(cache.Remove(TestKey(layout, 10, 2, "ucx", "local").FileName()).ok());
  ASSERT_TRUE(cache.Remove(TestKey(layout, 6, 2, "ucx", "local").FileName()).ok());
  n = cache.Nearest(want, layout);
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(n->key.world_size, 16);
  EXPECT_EQ(n->measured_iteration_us, 16);
  EXPECT_THAT(warnings_, IsEmpty());

  // The same entry itself (world 8) is not a neighbour; a neighbour made
  // for another layout or corrupted is skipped with a warning.
  store(8, 2, "ucx", "local");
  WriteAll(dir_ + "/" + TestKey(layout, 12, 2, "ucx", "local").FileName(), "{garbage");
  CacheEntry other = TestEntry(layout, TestKey(layout, 11, 2, "ucx", "local"));
  other.layout_hash ^= 1;
  ASSERT_TRUE(cache.Store(other).ok());
  n = cache.Nearest(want, layout);
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(n->key.world_size, 16);
  ASSERT_THAT(warnings_, SizeIs(2));
  EXPECT_THAT(warnings_[0], HasSubstr("-w11-"));
  EXPECT_THAT(warnings_[0], HasSubstr("layout_hash"));
  EXPECT_THAT(warnings_[1], HasSubstr("-w12-"));
  EXPECT_THAT(warnings_[1], HasSubstr("malformed JSON"));
  // Another model is not considered at all.
  auto small = bucketing::GradientLayout::Create({{"x", 3, DataType::kFloat32}});
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(cache.Nearest(TestKey(*small, 8, 2, "ucx", "local"), *small), std::nullopt);
}

TEST_F(PolicyCacheTest, ListMarksUnusableFiles) {
  bucketing::GradientLayout layout = TestLayout();
  PolicyCache cache(Options());
  const CacheKey key = TestKey(layout);
  ASSERT_TRUE(cache.Store(TestEntry(layout, key)).ok());
  WriteAll(dir_ + "/0000000000000000-broken.json", "{\"format\": 1}");
  WriteAll(dir_ + "/zz-renamed.json", SerializeCacheEntry(TestEntry(layout, key)));
  WriteAll(dir_ + "/notes.txt", "not an entry");
  WriteAll(dir_ + "/" + key.FileName() + ".tmp.123", "partial");
  std::vector<ListedEntry> list = cache.List();
  ASSERT_THAT(list, SizeIs(3));
  EXPECT_EQ(list[0].file, "0000000000000000-broken.json");
  EXPECT_FALSE(list[0].status.ok());
  EXPECT_THAT(std::string(list[0].status.message()), HasSubstr("format: expected a string"));
  EXPECT_FALSE(list[0].entry.has_value());
  EXPECT_EQ(list[1].file, key.FileName());
  EXPECT_TRUE(list[1].status.ok()) << list[1].status;
  ASSERT_TRUE(list[1].entry.has_value());
  ExpectSameEntry(*list[1].entry, TestEntry(layout, key));
  EXPECT_EQ(list[2].file, "zz-renamed.json");
  EXPECT_THAT(std::string(list[2].status.message()), HasSubstr(key.FileName()));
  EXPECT_THAT(warnings_, IsEmpty());
}

TEST_F(PolicyCacheTest, Remove) {
  bucketing::GradientLayout layout = TestLayout();
  PolicyCache cache(Options());
  const CacheKey key = TestKey(layout);
  ASSERT_TRUE(cache.Store(TestEntry(layout, key)).ok());
  ASSERT_TRUE(cache.Remove(key.FileName()).ok());
  EXPECT_FALSE(fs::exists(dir_ + "/" + key.FileName()));
  EXPECT_EQ(cache.Lookup(key, layout), std::nullopt);
  EXPECT_EQ(cache.Remove(key.FileName()).code(), absl::StatusCode::kNotFound);
  WriteAll(root_ + "/outside.json", "{}");
  EXPECT_EQ(cache.Remove("../outside.json").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.Remove(".lock").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.Remove("").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(fs::exists(root_ + "/outside.json"));
}

TEST_F(PolicyCacheTest, ExportImportRoundTrip) {
  bucketing::GradientLayout layout = TestLayout();
  PolicyCache cache(Options());
  for (int world : {2, 8, 32}) {
    ASSERT_TRUE(cache.Store(TestEntry(layout, TestKey(layout, world, 2))).ok());
  }
  WriteAll(dir_ + "/ffffffffffffffff-bad.json", "nonsense");
  const std::string bundle = root_ + "/bundle.json";
  int count = -1;
  ASSERT_TRUE(cache.Export(bundle, &count).ok());
  EXPECT_EQ(count, 3);
  EXPECT_THAT(DirNames(root_), ElementsAre("bundle.json", "cache"));  // no temporary file

  PolicyCache fresh(Options(root_ + "/fresh"));
  int imported = -1;
  ASSERT_TRUE(fresh.Import(bundle, &imported).ok());
  EXPECT_EQ(imported, 3);
  std::vector<ListedEntry> a = cache.List(), b = fresh.List();
  ASSERT_THAT(b, SizeIs(3));
  for (size_t i = 0; i < b.size(); ++i) {
    ASSERT_TRUE(b[i].entry.has_value()) << b[i].status;
    EXPECT_EQ(ReadAll(root_ + "/fresh/" + b[i].file), ReadAll(dir_ + "/" + b[i].file));
  }
  EXPECT_THAT(warnings_, IsEmpty());

  // A bundle with an invalid entry: the others are imported.
  Json doc = Json::parse(ReadAll(bundle));
  doc["entries"][1]["key"]["world_size"] = 0;
  doc["entries"].push_back("not an entry");
  WriteAll(bundle, doc.dump(1));
  PolicyCache third(Options(root_ + "/third"));
  ASSERT_TRUE(third.Import(bundle, &imported).ok());
  EXPECT_EQ(imported, 2);
  ASSERT_THAT(warnings_, SizeIs(2));
  EXPECT_THAT(warnings_[0], HasSubstr(bundle));
  EXPECT_THAT(warnings_[0], HasSubstr("entries[1]: key.world_size"));
  EXPECT_THAT(warnings_[1], HasSubstr("entries[3]"));
  EXPECT_THAT(third.List(), SizeIs(2));
}

TEST_F(PolicyCacheTest, ImportRejectsBadBundles) {
  PolicyCache cache(Options());
  int imported = -1;
  const std::string bundle = root_ + "/bundle.json";
  EXPECT_EQ(cache.Import(root_ + "/missing.json", &imported).code(), absl::StatusCode::kNotFound);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[]", "expected an object"},
      {"{\"format\": \"fusebox-policy\", \"version\": 1, \"entries\": []}", "format: expected"},
      {"{\"format\": \"fusebox-policy-bundle\", \"version\": 2, \"entries\": []}",
       "version: 2 is not supported"},
      {"{\"format\": \"fusebox-policy-bundle\", \"version\": 1, \"entries\": {}}",
       "entries: expected an array"},
      {"{\"format\": \"fusebox-policy-bundle\", \"version\": 1, \"entries\": [" +
           std::string(5000, '[') + std::string(5000, ']') + "]}",
       "levels deep"},
  };
  for (const auto& [text, reason] : cases) {
    WriteAll(bundle, text);
    absl::Status s = cache.Import(bundle, &imported);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(bundle));
    EXPECT_THAT(std::string(s.message()), HasSubstr(reason));
    EXPECT_EQ(imported, 0);
  }
  EXPECT_THAT(cache.List(), IsEmpty());
}

TEST(PolicyBundleTest, ParseCacheBundleGivesOneResultPerEntry) {
  bucketing::GradientLayout layout = TestLayout();
  const std::string entry = SerializeCacheEntry(TestEntry(layout, TestKey(layout)));
  auto parsed = ParseCacheBundle(absl::StrCat(
      R"({"format": "fusebox-policy-bundle", "version": 1, "entries": [)", entry, ", 7]}"));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_THAT(*parsed, SizeIs(2));
  ASSERT_TRUE((*parsed)[0].ok()) << (*parsed)[0].status();
  EXPECT_EQ((*parsed)[0]->key, TestKey(layout));
  EXPECT_THAT(std::string((*parsed)[1].status().message()), HasSubstr("expected an object"));
}

// ---- several processes -----------------------------------------------------------

TEST_F(PolicyCacheTest, ConcurrentStoresLeaveOneCompleteEntry) {
  constexpr int kChildren = 8;
  constexpr int kStoresEach = 20;
  bucketing::GradientLayout layout = TestLayout();
  const CacheKey key = TestKey(layout);
  ASSERT_TRUE(fs::create_directories(dir_));
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  std::vector<pid_t> children;
  for (int c = 0; c < kChildren; ++c) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(go[1]);
      char byte;
      if (read(go[0], &byte, 1) != 0) _exit(3);  // EOF when the parent closes: all start
      PolicyCacheOptions options;
      options.dir = dir_;
      PolicyCache cache(options);
      if (!cache.enabled()) _exit(4);
      for (int i = 0; i < kStoresEach; ++i) {
        CacheEntry e = TestEntry(layout, key);
        e.measured_iteration_us = 1000 * (c + 1) + i;
        e.tuning_iterations = c;
        if (!cache.Store(e).ok()) _exit(5);
      }
      _exit(0);
    }
    children.push_back(pid);
  }
  close(go[0]);
  close(go[1]);  // the start signal
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
  EXPECT_THAT(DirNames(dir_), ElementsAre(".lock", key.FileName()));
  absl::StatusOr<CacheEntry> e = ParseCacheEntry(ReadAll(dir_ + "/" + key.FileName()));
  ASSERT_TRUE(e.ok()) << e.status();
  const int c = e->tuning_iterations;
  ASSERT_GE(c, 0);
  ASSERT_LT(c, kChildren);
  const double i = e->measured_iteration_us - 1000 * (c + 1);
  EXPECT_GE(i, 0);
  EXPECT_LT(i, kStoresEach);
  CacheEntry written = TestEntry(layout, key);
  written.measured_iteration_us = e->measured_iteration_us;
  written.tuning_iterations = c;
  ExpectSameEntry(*e, written);
  PolicyCache cache(Options());
  EXPECT_TRUE(cache.Lookup(key, layout).has_value());
  EXPECT_THAT(warnings_, IsEmpty());
}

}  // namespace
}  // namespace fusebox::autotune
