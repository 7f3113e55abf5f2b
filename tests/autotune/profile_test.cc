#include "autotune/profile.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusebox::autotune {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

Profile SmallProfile() {
  Profile p;
  p.model = "tiny";
  p.description = "three tensors";
  p.forward_us = 100;
  p.backward_us = 200;
  p.tensors = {
      {"head.bias", {10}, comm::DataType::kFloat32, 12.5},
      {"head.weight", {10, 4}, comm::DataType::kFloat16, 12.5},
      {"embed.weight", {7, 3, 2}, comm::DataType::kBFloat16, 200},
  };
  return p;
}

// The JSON of SmallProfile, written by hand (not by SerializeProfile), with
// `tensor1` in place of the second tensor.
std::string SmallJson(const std::string& tensor1 =
                          R"({"name": "head.weight", "shape": [10, 4], "dtype": "half", "ready_us": 12.5})") {
  return absl::StrCat(R"({"format": "fusebox-profile", "version": 1, "model": "tiny",
 "description": "three tensors", "forward_us": 100, "backward_us": 200.0,
 "tensors": [
  {"name": "head.bias", "shape": [10], "dtype": "float", "ready_us": 12.5},
  )",
                      tensor1, R"(,
  {"name": "embed.weight", "shape": [7, 3, 2], "dtype": "bfloat16", "ready_us": 200}
 ]})");
}

void ExpectSameProfile(const Profile& a, const Profile& b) {
  EXPECT_EQ(a.model, b.model);
  EXPECT_EQ(a.description, b.description);
  EXPECT_EQ(a.forward_us, b.forward_us);
  EXPECT_EQ(a.backward_us, b.backward_us);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
    EXPECT_EQ(a.tensors[i].shape, b.tensors[i].shape);
    EXPECT_EQ(a.tensors[i].dtype, b.tensors[i].dtype);
    EXPECT_EQ(a.tensors[i].ready_us, b.tensors[i].ready_us);
  }
}

// Parses `json` and expects an InvalidArgument error containing every part.
void ExpectParseError(const std::string& json, const std::vector<std::string>& parts) {
  absl::StatusOr<Profile> p = ParseProfile(json);
  ASSERT_FALSE(p.ok()) << "accepted:\n" << json;
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
  for (const std::string& part : parts) {
    EXPECT_THAT(std::string(p.status().message()), HasSubstr(part));
  }
}

void ExpectInvalid(const Profile& p, const std::vector<std::string>& parts) {
  absl::Status s = ValidateProfile(p);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (const std::string& part : parts) EXPECT_THAT(std::string(s.message()), HasSubstr(part));
}

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/fusebox_profile_test_", getpid(), "_", name);
}

// ---- values -----------------------------------------------------------------

TEST(ProfileTest, CountsElementsAndBytes) {
  const Profile p = SmallProfile();
  EXPECT_EQ(p.tensors[0].numel(), 10);
  EXPECT_EQ(p.tensors[1].numel(), 40);
  EXPECT_EQ(p.tensors[1].bytes(), 80);  // half
  EXPECT_EQ(p.tensors[2].bytes(), 84);  // bfloat16
  EXPECT_EQ(p.total_bytes(), 40 + 80 + 84);
  ProfileTensor scalar{"scale", {}, comm::DataType::kFloat64, 0};
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.bytes(), 8);
  ProfileTensor empty{"empty", {3, 0, 5}, comm::DataType::kFloat32, 0};
  EXPECT_EQ(empty.numel(), 0);
}

TEST(ProfileTest, AcceptsValidProfile) {
  EXPECT_TRUE(ValidateProfile(SmallProfile()).ok());
  Profile p = SmallProfile();
  p.tensors.push_back({"zero", {0}, comm::DataType::kFloat64, 200});
  p.tensors.push_back({"scalar", {}, comm::DataType::kFloat32, 200});
  p.tensors.push_back({std::string(kMaxProfileNameBytes, 'n'), {1}, comm::DataType::kFloat32, 200});
  p.tensors.push_back({"caf\xc3\xa9.\xe2\x82\xac", {1}, comm::DataType::kFloat32, 200});
  EXPECT_TRUE(ValidateProfile(p).ok()) << ValidateProfile(p);
  p.tensors.clear();
  EXPECT_TRUE(ValidateProfile(p).ok());
}

TEST(ProfileTest, ScaleComputeMultipliesEveryTime) {
  const Profile p = ScaleCompute(SmallProfile(), 0.5);
  EXPECT_EQ(p.forward_us, 50);
  EXPECT_EQ(p.backward_us, 100);
  EXPECT_EQ(p.tensors[0].ready_us, 6.25);
  EXPECT_EQ(p.tensors[1].ready_us, 6.25);
  EXPECT_EQ(p.tensors[2].ready_us, 100);
  EXPECT_EQ(p.tensors[2].shape, SmallProfile().tensors[2].shape);
  EXPECT_TRUE(ValidateProfile(p).ok());
}

TEST(ProfileTest, LayoutFromProfileKeepsNamesCountsAndTypesInOrder) {
  const Profile p = SmallProfile();
  absl::StatusOr<bucketing::GradientLayout> layout = LayoutFromProfile(p);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(layout->tensor(i).name, p.tensors[i].name);
    EXPECT_EQ(layout->tensor(i).numel, p.tensors[i].numel());
    EXPECT_EQ(layout->tensor(i).dtype, p.tensors[i].dtype);
    EXPECT_EQ(layout->tensor(i).memory, comm::MemoryKind::kHost);
  }
  EXPECT_EQ(layout->total_bytes(), p.total_bytes());
}

TEST(ProfileTest, LayoutFromProfileRejectsInvalidProfile) {
  Profile p = SmallProfile();
  p.tensors[1].name = "head.bias";
  absl::StatusOr<bucketing::GradientLayout> layout = LayoutFromProfile(p);
  ASSERT_FALSE(layout.ok());
  EXPECT_THAT(std::string(layout.status().message()), HasSubstr("tensors[1].name"));
}

// ---- JSON -------------------------------------------------------------------

TEST(ProfileTest, ParsesHandWrittenJson) {
  absl::StatusOr<Profile> p = ParseProfile(SmallJson());
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectSameProfile(*p, SmallProfile());
}

TEST(ProfileTest, RoundTripsThroughJson) {
  Profile p = SmallProfile();
  p.description = "quotes \" backslash \\ newline \n tab \t unicode caf\xc3\xa9";
  p.forward_us = 0.1 + 0.2;  // not a short decimal
  p.tensors[0].ready_us = 1.0 / 3;
  p.tensors[1].ready_us = std::nextafter(1.0 / 3, 1.0);
  p.tensors[2].name = "weird \"name\"\\x";
  p.tensors.push_back({"scalar", {}, comm::DataType::kFloat64, 200});
  const std::string json = SerializeProfile(p);
  absl::StatusOr<Profile> back = ParseProfile(json);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << json;
  ExpectSameProfile(*back, p);
  EXPECT_EQ(SerializeProfile(*back), json);
}

TEST(ProfileTest, SerializesOneTensorPerLine) {
  const std::string json = SerializeProfile(SmallProfile());
  std::vector<std::string> lines = absl::StrSplit(json, '\n');
  int tensor_lines = 0;
  for (const std::string& line : lines) {
    if (line.find("\"name\":") != std::string::npos) {
      ++tensor_lines;
      EXPECT_THAT(line, AllOf(HasSubstr("\"shape\":"), HasSubstr("\"dtype\":"),
                              HasSubstr("\"ready_us\":")));
    }
  }
  EXPECT_EQ(tensor_lines, 3);
  EXPECT_THAT(json, HasSubstr("\"format\": \"fusebox-profile\""));
  EXPECT_THAT(json, HasSubstr("\"version\": 1"));
  EXPECT_THAT(json, HasSubstr("{\"name\": \"head.weight\", \"shape\": [10, 4], \"dtype\": \"half\", "
                              "\"ready_us\": 12.5}"));
  Profile empty = SmallProfile();
  empty.tensors.clear();
  absl::StatusOr<Profile> back = ParseProfile(SerializeProfile(empty));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->tensors.empty());
}

TEST(ProfileTest, AllowsUnknownKeys) {
  std::string json = SmallJson(
      R"({"name": "head.weight", "shape": [10, 4], "dtype": "half", "ready_us": 12.5,
          "measured": {"runs": [1, 2, {"x": [3]}]}})");
  json = absl::StrReplaceAll(json, {{R"("model": "tiny",)",
                                     R"("model": "tiny", "future": {"a": [[1], {"b": null}]},)"}});
  absl::StatusOr<Profile> p = ParseProfile(json);
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectSameProfile(*p, SmallProfile());
}

TEST(ProfileTest, AcceptsDtypeAliases) {
  absl::StatusOr<Profile> p = ParseProfile(SmallJson(
      R"({"name": "head.weight", "shape": [10, 4], "dtype": "float16", "ready_us": 12.5})"));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tensors[1].dtype, comm::DataType::kFloat16);
}

TEST(ProfileTest, RejectsMalformedJsonWithPosition) {
  ExpectParseError(R"({"format": "fusebox-profile", "version": 1,,})",
                   {"malformed JSON", "line 1", "column"});
  ExpectParseError("", {"malformed JSON"});
  ExpectParseError(SmallJson().substr(0, 100), {"malformed JSON", "line"});
  ExpectParseError(R"({"format": "fusebox-profile", "forward_us": 1e999})",
                   {"malformed JSON", "overflow"});
  ExpectParseError("{\"format\": \"fusebox-\xff\"}", {"malformed JSON"});
}

TEST(ProfileTest, RejectsNonObjectTopLevel) {
  ExpectParseError("[1, 2]", {"expected an object", "array"});
  ExpectParseError("42", {"expected an object"});
}

TEST(ProfileTest, RejectsWrongFormat) {
  std::string json = absl::StrReplaceAll(SmallJson(), {{"fusebox-profile", "fusebox-plan"}});
  ExpectParseError(json, {"format", "fusebox-profile", "fusebox-plan"});
  json = absl::StrReplaceAll(SmallJson(), {{R"("format": "fusebox-profile", )", ""}});
  ExpectParseError(json, {"format: missing"});
  json = absl::StrReplaceAll(SmallJson(), {{R"("fusebox-profile")", "7"}});
  ExpectParseError(json, {"format: expected a string, got number"});
}

TEST(ProfileTest, RejectsUnsupportedVersion) {
  std::string json = absl::StrReplaceAll(SmallJson(), {{R"("version": 1)", R"("version": 2)"}});
  ExpectParseError(json, {"version: 2 is not supported", "supported versions: 1"});
  json = absl::StrReplaceAll(SmallJson(), {{R"("version": 1)", R"("version": 1.5)"}});
  ExpectParseError(json, {"version: expected an integer"});
  json = absl::StrReplaceAll(SmallJson(), {{R"("version": 1)", R"("version": "1")"}});
  ExpectParseError(json, {"version: expected an integer, got string"});
  json = absl::StrReplaceAll(SmallJson(), {{R"("version": 1, )", ""}});
  ExpectParseError(json, {"version: missing"});
}

TEST(ProfileTest, RejectsMissingTopLevelFields) {
  for (const char* field : {"model", "description", "forward_us", "backward_us", "tensors"}) {
    SCOPED_TRACE(field);
    // Rename the key so the rest stays well-formed.
    const std::string json =
        absl::StrReplaceAll(SmallJson(), {{absl::StrCat("\"", field, "\":"), "\"renamed\":"}});
    ExpectParseError(json, {absl::StrCat(field, ": missing")});
  }
}

TEST(ProfileTest, RejectsMissingTensorFields) {
  ExpectParseError(SmallJson(R"({"shape": [10, 4], "dtype": "half", "ready_us": 12.5})"),
                   {"tensors[1].name: missing"});
  ExpectParseError(SmallJson(R"({"name": "w", "dtype": "half", "ready_us": 12.5})"),
                   {"tensors[1].shape: missing"});
  ExpectParseError(SmallJson(R"({"name": "w", "shape": [10, 4], "ready_us": 12.5})"),
                   {"tensors[1].dtype: missing"});
  ExpectParseError(SmallJson(R"({"name": "w", "shape": [10, 4], "dtype": "half"})"),
                   {"tensors[1].ready_us: missing"});
}

TEST(ProfileTest, RejectsMistypedFields) {
  ExpectParseError(SmallJson(R"({"name": "w", "shape": [10, "4"], "dtype": "half", "ready_us": 1})"),
                   {"tensors[1].shape[1]: expected an integer, got string"});
  ExpectParseError(SmallJson(R"({"name": "w", "shape": [10, 4.5], "dtype": "half", "ready_us": 1})"),
                   {"tensors[1].shape[1]: expected an integer, got 4.5"});
  ExpectParseError(SmallJson(R"({"name": "w", "shape": 40, "dtype": "half", "ready_us": 1})"),
                   {"tensors[1].shape: expected an array"});
  ExpectParseError(SmallJson(R"({"name": 5, "shape": [10, 4], "dtype": "half", "ready_us": 1})"),
                   {"tensors[1].name: expected a string, got number"});
  ExpectParseError(SmallJson(R"({"name": "w", "shape": [10, 4], "dtype": 2, "ready_us": 1})"),
                   {"tensors[1].dtype: expected a string"});
  ExpectParseError(SmallJson(R"({"name": "w", "shape": [10, 4], "dtype": "half", "ready_us": "1"})"),
                   {"tensors[1].ready_us: expected a number, got string"});
  ExpectParseError(SmallJson(R"({"name": "w", "shape": [10, 4], "dtype": "half", "ready_us": null})"),
                   {"tensors[1].ready_us: expected a number, got null"});
  ExpectParseError(SmallJson(R"(["w", [10, 4], "half", 1])"),
                   {"tensors[1]: expected an object, got array"});
  ExpectParseError(absl::StrReplaceAll(SmallJson(), {{R"("forward_us": 100)", R"("forward_us": true)"}}),
                   {"forward_us: expected a number, got boolean"});
  ExpectParseError(absl::StrReplaceAll(SmallJson(), {{R"("model": "tiny")", R"("model": ["tiny"])"}}),
                   {"model: expected a string, got array"});
  const std::string json = R"({"format": "fusebox-profile", "version": 1, "model": "m",
      "description": "", "forward_us": 1, "backward_us": 1, "tensors": {"a": 1}})";
  ExpectParseError(json, {"tensors: expected an array, got object"});
}

TEST(ProfileTest, RejectsHugeIntegers) {
  ExpectParseError(
      SmallJson(R"({"name": "w", "shape": [18446744073709551615], "dtype": "half", "ready_us": 1})"),
      {"tensors[1].shape[0]", "out of range"});
  ExpectParseError(SmallJson(R"({"name": "w", "shape": [1e30], "dtype": "half", "ready_us": 1})"),
                   {"tensors[1].shape[0]: expected an integer"});
}

TEST(ProfileTest, RejectsUnsupportedDtype) {
  ExpectParseError(SmallJson(R"({"name": "w", "shape": [10, 4], "dtype": "int32", "ready_us": 1})"),
                   {"tensors[1].dtype", "int32", "float, double, half or bfloat16"});
  ExpectParseError(SmallJson(R"({"name": "w", "shape": [10, 4], "dtype": "float128", "ready_us": 1})"),
                   {"tensors[1].dtype", "float128"});
  Profile p = SmallProfile();
  p.tensors[2].dtype = comm::DataType::kUInt8;
  ExpectInvalid(p, {"tensors[2].dtype", "not a gradient type"});
}

TEST(ProfileTest, RejectsDeepNesting) {
  std::string deep = "1";
  for (int i = 0; i < 20; ++i) deep = "[" + deep + "]";
  std::string json =
      absl::StrReplaceAll(SmallJson(), {{R"("model": "tiny",)", "\"model\": \"tiny\", \"x\": " + deep + ","}});
  ExpectParseError(json, {"nests", "8 levels"});
  // A million open brackets: rejected without recursion or a huge DOM.
  ExpectParseError(std::string(1 << 20, '['), {"malformed JSON"});
  std::string nested_ok = "1";
  for (int i = 0; i < kMaxProfileJsonDepth - 1; ++i) nested_ok = "[" + nested_ok + "]";
  json = absl::StrReplaceAll(SmallJson(), {{R"("model": "tiny",)", "\"model\": \"tiny\", \"x\": " + nested_ok + ","}});
  EXPECT_TRUE(ParseProfile(json).ok()) << ParseProfile(json).status();
}

// ---- validation ---------------------------------------------------------------

TEST(ProfileTest, RejectsNegativeReadyTime) {
  Profile p = SmallProfile();
  p.tensors[0].ready_us = -3;
  ExpectInvalid(p, {"tensors[0].ready_us: -3 is negative"});
  ExpectParseError(SmallJson(R"({"name": "w", "shape": [10, 4], "dtype": "half", "ready_us": -3})"),
                   {"tensors[1].ready_us: -3 is negative"});
}

TEST(ProfileTest, RejectsNonFiniteTimes) {
  Profile p = SmallProfile();
  p.tensors[1].ready_us = std::numeric_limits<double>::quiet_NaN();
  ExpectInvalid(p, {"tensors[1].ready_us", "not finite"});
  p = SmallProfile();
  p.tensors[1].ready_us = std::numeric_limits<double>::infinity();
  ExpectInvalid(p, {"tensors[1].ready_us", "not finite"});
  p = SmallProfile();
  p.forward_us = std::numeric_limits<double>::quiet_NaN();
  ExpectInvalid(p, {"forward_us", "not finite"});
  p = SmallProfile();
  p.backward_us = -std::numeric_limits<double>::infinity();
  ExpectInvalid(p, {"backward_us", "not finite"});
}

TEST(ProfileTest, RejectsNonMonotonicReadyTimes) {
  Profile p = SmallProfile();
  p.tensors[1].ready_us = 10;
  ExpectInvalid(p, {"tensors[1].ready_us: 10 is earlier than tensors[0].ready_us = 12.5",
                    "backward-ready order"});
  ExpectParseError(SmallJson(R"({"name": "w", "shape": [10, 4], "dtype": "half", "ready_us": 1})"),
                   {"tensors[1].ready_us", "tensors[0].ready_us"});
}

TEST(ProfileTest, RejectsReadyAfterBackward) {
  Profile p = SmallProfile();
  p.tensors[2].ready_us = 200.5;
  ExpectInvalid(p, {"tensors[2].ready_us: 200.5 is after the end of backward", "backward_us = 200"});
}

TEST(ProfileTest, RejectsNonPositiveDurations) {
  Profile p = SmallProfile();
  p.forward_us = 0;
  ExpectInvalid(p, {"forward_us: 0 is not positive"});
  p = SmallProfile();
  p.backward_us = -1;
  ExpectInvalid(p, {"backward_us: -1 is negative"});
  ExpectParseError(absl::StrReplaceAll(SmallJson(), {{R"("forward_us": 100)", R"("forward_us": 0)"}}),
                   {"forward_us: 0 is not positive"});
}

TEST(ProfileTest, RejectsAbsurdDurations) {
  Profile p = SmallProfile();
  p.forward_us = 2e10;
  ExpectInvalid(p, {"forward_us", "absurd"});
  p = SmallProfile();
  p.backward_us = 1e11;
  ExpectInvalid(p, {"backward_us", "absurd"});
  p = SmallProfile();
  p.forward_us = kMaxProfileMicros;
  EXPECT_TRUE(ValidateProfile(p).ok());
}

TEST(ProfileTest, RejectsNegativeDims) {
  Profile p = SmallProfile();
  p.tensors[2].shape = {7, -3, 2};
  ExpectInvalid(p, {"tensors[2].shape[1]: -3 is negative"});
  ExpectParseError(SmallJson(R"({"name": "w", "shape": [10, -4], "dtype": "half", "ready_us": 12.5})"),
                   {"tensors[1].shape[1]: -4 is negative"});
}

TEST(ProfileTest, RejectsTooManyDims) {
  Profile p = SmallProfile();
  p.tensors[0].shape = std::vector<int64_t>(kMaxProfileTensorDims + 1, 1);
  ExpectInvalid(p, {"tensors[0].shape: 9 dims", "limit of 8"});
  p.tensors[0].shape.pop_back();
  EXPECT_TRUE(ValidateProfile(p).ok());
  ExpectParseError(
      SmallJson(R"({"name": "w", "shape": [1,1,1,1,1,1,1,1,1], "dtype": "half", "ready_us": 12.5})"),
      {"tensors[1].shape: 9 dims"});
}

TEST(ProfileTest, RejectsTooManyElements) {
  Profile p = SmallProfile();
  p.tensors[1].shape = {bucketing::kMaxTensorElements + 1};
  ExpectInvalid(p, {"tensors[1].shape", "more than the limit"});
  p.tensors[1].shape = {bucketing::kMaxTensorElements};
  EXPECT_TRUE(ValidateProfile(p).ok());
  p.tensors[1].shape = {bucketing::kMaxTensorElements / 2, 3};
  ExpectInvalid(p, {"tensors[1].shape", "more than the limit"});
}

TEST(ProfileTest, RejectsOverflowingShapeProducts) {
  Profile p = SmallProfile();
  // 2^62 * 4 wraps to 0 in int64 arithmetic; 3037000500^2 overflows int64.
  p.tensors[1].shape = {int64_t{1} << 62, 4};
  ExpectInvalid(p, {"tensors[1].shape", "more than the limit"});
  p.tensors[1].shape = {3037000500, 3037000500};
  ExpectInvalid(p, {"tensors[1].shape", "more than the limit"});
  p.tensors[1].shape = {int64_t{1} << 62, int64_t{1} << 62, 0};  // zero elements
  EXPECT_TRUE(ValidateProfile(p).ok());
  ExpectParseError(
      SmallJson(R"({"name": "w", "shape": [4611686018427387904, 4], "dtype": "half", "ready_us": 12.5})"),
      {"tensors[1].shape", "more than the limit"});
}

TEST(ProfileTest, RejectsTooManyTensors) {
  Profile p = SmallProfile();
  p.tensors.resize(static_cast<size_t>(bucketing::kMaxLayoutTensors) + 1);
  ExpectInvalid(p, {"tensors: 1048577 tensors", "limit of 1048576"});
  std::string json = R"({"format": "fusebox-profile", "version": 1, "model": "m",
      "description": "", "forward_us": 1, "backward_us": 1, "tensors": [)";
  json.reserve(json.size() + 3 * (bucketing::kMaxLayoutTensors + 1));
  for (int i = 0; i <= bucketing::kMaxLayoutTensors; ++i) json += i == 0 ? "0" : ",0";
  json += "]}";
  ExpectParseError(json, {"tensors: 1048577 tensors"});
}

TEST(ProfileTest, RejectsBadNames) {
  Profile p = SmallProfile();
  p.tensors[1].name = "";
  ExpectInvalid(p, {"tensors[1].name: empty"});
  p = SmallProfile();
  p.tensors[2].name = "head.bias";
  ExpectInvalid(p, {"tensors[2].name: \"head.bias\" appears more than once"});
  p = SmallProfile();
  p.tensors[1].name = std::string(kMaxProfileNameBytes + 1, 'n');
  ExpectInvalid(p, {"tensors[1].name: 257 bytes", "limit of 256"});
  p = SmallProfile();
  p.tensors[1].name = "bad\xff";
  ExpectInvalid(p, {"tensors[1].name: not valid UTF-8"});
  p = SmallProfile();
  p.tensors[1].name = "overlong\xc0\xaf";
  ExpectInvalid(p, {"tensors[1].name: not valid UTF-8"});
  p = SmallProfile();
  p.tensors[1].name = "truncated\xe2\x82";
  ExpectInvalid(p, {"tensors[1].name: not valid UTF-8"});
  p = SmallProfile();
  p.model = "";
  ExpectInvalid(p, {"model: empty"});
  ExpectParseError(SmallJson(R"({"name": "", "shape": [10, 4], "dtype": "half", "ready_us": 12.5})"),
                   {"tensors[1].name: empty"});
  ExpectParseError(
      SmallJson(R"({"name": "head.bias", "shape": [10, 4], "dtype": "half", "ready_us": 12.5})"),
      {"tensors[1].name", "appears more than once"});
}

// ---- files ------------------------------------------------------------------

TEST(ProfileTest, SavesAndLoadsFiles) {
  const std::string path = TempPath("save.json");
  ASSERT_TRUE(SaveProfile(SmallProfile(), path).ok());
  absl::StatusOr<Profile> p = LoadProfile(path);
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectSameProfile(*p, SmallProfile());
  // Saving again replaces the file and leaves no temporary behind.
  Profile q = SmallProfile();
  q.model = "tiny2";
  ASSERT_TRUE(SaveProfile(q, path).ok());
  p = LoadProfile(path);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->model, "tiny2");
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().string().find(path + ".tmp"), std::string::npos) << entry.path();
  }
  std::filesystem::remove(path);
}

TEST(ProfileTest, SaveRefusesInvalidProfile) {
  const std::string path = TempPath("invalid.json");
  Profile p = SmallProfile();
  p.tensors[0].ready_us = -1;
  absl::Status s = SaveProfile(p, path);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr(path), HasSubstr("tensors[0].ready_us")));
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(ProfileTest, SaveReportsUnwritablePath) {
  const std::string path = TempPath("no/such/dir/x.json");
  absl::Status s = SaveProfile(SmallProfile(), path);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr(path));
}

TEST(ProfileTest, LoadErrorsNameThePath) {
  const std::string missing = TempPath("missing.json");
  absl::StatusOr<Profile> p = LoadProfile(missing);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr(missing));

  const std::string bad = TempPath("bad.json");
  {
    std::ofstream f(bad);
    f << SmallJson(R"({"name": "w", "shape": [10, "x"], "dtype": "half", "ready_us": 12.5})");
  }
  p = LoadProfile(bad);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()),
              AllOf(HasSubstr(bad), HasSubstr("tensors[1].shape[1]")));
  std::filesystem::remove(bad);
}

TEST(ProfileTest, LoadRejectsOversizedFiles) {
  // An endless source: the reader stops one byte past the limit.
  absl::StatusOr<Profile> p = LoadProfile("/dev/zero");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()),
              AllOf(HasSubstr("/dev/zero"), HasSubstr("larger than the limit of 64 MiB")));
}

}  // namespace
}  // namespace fusebox::autotune
