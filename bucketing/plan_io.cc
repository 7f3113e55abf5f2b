#include "bucketing/plan_io.h"

#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bucketing/file_io.h"
#include "nlohmann/json.hpp"

namespace fusebox::bucketing {

namespace {

using json = nlohmann::json;

// Deepest nesting a valid plan file has: root, buckets, bucket, slices,
// slice.
constexpr int kMaxDepth = 6;

absl::Status FieldError(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("plan file: ", field, ": ", what));
}

absl::StatusOr<int64_t> GetInt(const json& v, const std::string& field, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) return FieldError(field, "expected an integer");
  const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)
                        ? hi + 1
                        : v.get<int64_t>();
  if (x < lo || x > hi) {
    return FieldError(field, absl::StrFormat("%d is outside [%d, %d]", x, lo, hi));
  }
  return x;
}

// ParsePlan, also giving back "layout_hash" when the file has one, so that
// ReadPlanFile parses the document once.
absl::StatusOr<Plan> ParsePlanDocument(absl::string_view text,
                                       std::optional<uint64_t>* layout_hash) {
  if (text.size() > kMaxPlanFileBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "plan file: %d bytes, more than the limit of %d", text.size(), kMaxPlanFileBytes));
  }
  bool too_deep = false;
  json::parser_callback_t bound_depth = [&too_deep](int depth, json::parse_event_t, json&) {
    if (depth > kMaxDepth) too_deep = true;
    return !too_deep;
  };
  json doc;
  try {
    doc = json::parse(text.begin(), text.end(), bound_depth);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for 1e999
    return absl::InvalidArgumentError(absl::StrCat("plan file: malformed JSON: ", e.what()));
  }
  if (too_deep) {
    return absl::InvalidArgumentError(
        absl::StrFormat("plan file: nested deeper than %d levels", kMaxDepth));
  }
  if (!doc.is_object()) return FieldError("(root)", "expected an object");
  auto format = doc.find("format");
  if (format == doc.end() || !format->is_string() || *format != "fusebox-plan") {
    return FieldError("format", "expected \"fusebox-plan\"");
  }
  auto version = doc.find("version");
  if (version == doc.end()) return FieldError("version", "missing");
  auto v = GetInt(*version, "version", 0, 1 << 20);
  if (!v.ok()) return v.status();
  if (*v != kPlanFormatVersion) {
    return FieldError("version", absl::StrFormat("version %d is not supported (this build reads "
                                                 "version %d)",
                                                 *v, kPlanFormatVersion));
  }
  Plan plan;
  if (auto name = doc.find("name"); name != doc.end()) {
    if (!name->is_string()) return FieldError("name", "expected a string");
    plan.name = name->get<std::string>();
    if (plan.name.size() > 256) return FieldError("name", "longer than 256 characters");
  }
  layout_hash->reset();
  if (auto h = doc.find("layout_hash"); h != doc.end()) {
    uint64_t v = 0;
    if (!h->is_string() || !absl::SimpleHexAtoi(h->get<std::string>(), &v)) {
      return FieldError("layout_hash", "expected a hexadecimal string");
    }
    *layout_hash = v;
  }
  auto buckets = doc.find("buckets");
  if (buckets == doc.end() || !buckets->is_array()) {
    return FieldError("buckets", "expected an array");
  }
  if (buckets->size() > static_cast<size_t>(kMaxPlanBuckets)) {
    return FieldError("buckets", absl::StrFormat("%d buckets, more than the limit of %d",
                                                 buckets->size(), kMaxPlanBuckets));
  }
  size_t total_slices = 0;
  for (size_t b = 0; b < buckets->size(); ++b) {
    const json& jb = (*buckets)[b];
    const std::string where = absl::StrFormat("buckets[%d]", b);
    if (!jb.is_object()) return FieldError(where, "expected an object");
    auto dtype = jb.find("dtype");
    if (dtype == jb.end() || !dtype->is_string()) {
      return FieldError(where + ".dtype", "expected a type name");
    }
    auto parsed = comm::ParseDataType(dtype->get<std::string>());
    if (!parsed.ok()) return FieldError(where + ".dtype", std::string(parsed.status().message()));
    Bucket bucket;
    bucket.dtype = *parsed;
    auto slices = jb.find("slices");
    if (slices == jb.end() || !slices->is_array()) {
      return FieldError(where + ".slices", "expected an array");
    }
    total_slices += slices->size();
    if (total_slices > static_cast<size_t>(kMaxPlanSlices)) {
      return FieldError(where + ".slices",
                        absl::StrFormat("more than %d slices in the plan", kMaxPlanSlices));
    }
    for (size_t i = 0; i < slices->size(); ++i) {
      const json& js = (*slices)[i];
      const std::string sw = absl::StrFormat("%s.slices[%d]", where, i);
      if (!js.is_array() || js.size() != 3) {
        return FieldError(sw, "expected [tensor, offset, count]");
      }
      auto t = GetInt(js[0], sw + "[0]", 0, kMaxLayoutTensors - 1);
      if (!t.ok()) return t.status();
      auto off = GetInt(js[1], sw + "[1]", 0, kMaxTensorElements);
      if (!off.ok()) return off.status();
      auto cnt = GetInt(js[2], sw + "[2]", 0, kMaxTensorElements);
      if (!cnt.ok()) return cnt.status();
      bucket.slices.push_back(Slice{static_cast<int>(*t), *off, *cnt});
    }
    plan.buckets.push_back(std::move(bucket));
  }
  return plan;
}

}  // namespace

absl::StatusOr<Plan> ParsePlan(absl::string_view text) {
  std::optional<uint64_t> layout_hash;
  return ParsePlanDocument(text, &layout_hash);
}

std::string SerializePlan(const Plan& plan, const GradientLayout* layout) {
  // Written by hand so that each bucket is one line: plans of thousands of
  // slices stay readable and diffable.
  std::string out = "{\"format\": \"fusebox-plan\", \"version\": ";
  absl::StrAppend(&out, kPlanFormatVersion, ",\n \"name\": ", json(plan.name).dump());
  if (layout != nullptr) {
    absl::StrAppendFormat(&out, ",\n \"layout_hash\": \"%016x\"", layout->Hash());
  }
  absl::StrAppendFormat(&out, ",\n \"plan_hash\": \"%016x\",\n \"buckets\": [", PlanHash(plan));
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    const Bucket& bucket = plan.buckets[b];
    absl::StrAppend(&out, b == 0 ? "\n" : ",\n", "  {\"dtype\": \"",
                    comm::DataTypeName(bucket.dtype), "\", \"slices\": [");
    for (size_t i = 0; i < bucket.slices.size(); ++i) {
      const Slice& s = bucket.slices[i];
      absl::StrAppendFormat(&out, "%s[%d, %d, %d]", i == 0 ? "" : ", ", s.tensor, s.offset,
                            s.count);
    }
    absl::StrAppend(&out, "]}");
  }
  absl::StrAppend(&out, "\n ]}\n");
  return out;
}

absl::StatusOr<Plan> ReadPlanFile(const std::string& path, const GradientLayout& layout) {
  auto text = ReadFileBounded(path, kMaxPlanFileBytes);
  if (!text.ok()) return text.status();
  auto prefix = [&path](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  };
  std::optional<uint64_t> want;
  auto plan = ParsePlanDocument(*text, &want);
  if (!plan.ok()) return prefix(plan.status());
  if (want.has_value() && *want != layout.Hash()) {
    return prefix(FieldError(
        "layout_hash", absl::StrFormat("plan was made for layout %016x, this model's layout is "
                                       "%016x",
                                       *want, layout.Hash())));
  }
  if (plan->name.empty()) plan->name = path;
  if (absl::Status s = ValidatePlan(layout, *plan); !s.ok()) return prefix(s);
  return plan;
}

absl::Status WritePlanFile(const std::string& path, const Plan& plan,
                           const GradientLayout* layout) {
  return WriteFileAtomically(path, SerializePlan(plan, layout));
}

}  // namespace fusebox::bucketing
