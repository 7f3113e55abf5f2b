#include "autotune/profile.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "autotune/json_fields.h"
#include "bucketing/file_io.h"

namespace fusebox::autotune {

namespace {

using json_fields::Field;
using json_fields::GetNumber;
using json_fields::GetString;
using json_fields::IsValidUtf8;
using json_fields::Json;
using json_fields::Member;
using json_fields::Mistyped;

constexpr char kFormatName[] = "fusebox-profile";

bool IsGradientType(comm::DataType t) {
  return t == comm::DataType::kFloat32 || t == comm::DataType::kFloat64 ||
         t == comm::DataType::kFloat16 || t == comm::DataType::kBFloat16;
}


// %g keeps error messages short ("-3", "1e+11", "nan").
std::string Num(double v) { return absl::StrFormat("%g", v); }

absl::Status CheckTime(const std::string& field, double v) {
  if (!std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", Num(v), " is not finite"));
  }
  if (v < 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", Num(v), " is negative"));
  }
  if (v > kMaxProfileMicros) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", Num(v),
                                                   " us is absurd (more than ",
                                                   Num(kMaxProfileMicros), " us)"));
  }
  return absl::OkStatus();
}

absl::Status CheckDuration(const std::string& field, double v) {
  if (absl::Status s = CheckTime(field, v); !s.ok()) return s;
  if (v <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", Num(v), " is not positive"));
  }
  return absl::OkStatus();
}

absl::Status CheckName(const std::string& field, const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": empty"));
  if (name.size() > kMaxProfileNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", name.size(),
                                                   " bytes, more than the limit of ",
                                                   kMaxProfileNameBytes));
  }
  if (!IsValidUtf8(name)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": not valid UTF-8"));
  }
  return absl::OkStatus();
}

// An integer written without fraction or exponent, within int64.
absl::StatusOr<int64_t> AsInteger(const Json& v, const std::string& field) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", u, " is out of range"));
    }
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected an integer, got ", Num(v.get<double>())));
  }
  return Mistyped(field, "an integer", v);
}

absl::StatusOr<ProfileTensor> ParseTensor(const Json& j, const std::string& path) {
  if (!j.is_object()) return Mistyped(path, "an object", j);
  ProfileTensor t;
  absl::StatusOr<std::string> name = GetString(j, path, "name");
  if (!name.ok()) return name.status();
  t.name = *std::move(name);

  const std::string shape_field = Field(path, "shape");
  absl::StatusOr<const Json*> shape = Member(j, path, "shape");
  if (!shape.ok()) return shape.status();
  if (!(*shape)->is_array()) return Mistyped(shape_field, "an array of integers", **shape);
  if ((*shape)->size() > static_cast<size_t>(kMaxProfileTensorDims)) {
    return absl::InvalidArgumentError(absl::StrCat(shape_field, ": ", (*shape)->size(),
                                                   " dims, more than the limit of ",
                                                   kMaxProfileTensorDims));
  }
  for (size_t d = 0; d < (*shape)->size(); ++d) {
    absl::StatusOr<int64_t> dim = AsInteger((**shape)[d], absl::StrCat(shape_field, "[", d, "]"));
    if (!dim.ok()) return dim.status();
    t.shape.push_back(*dim);
  }

  const std::string dtype_field = Field(path, "dtype");
  absl::StatusOr<std::string> dtype = GetString(j, path, "dtype");
  if (!dtype.ok()) return dtype.status();
  absl::StatusOr<comm::DataType> parsed = comm::ParseDataType(*dtype);
  if (!parsed.ok() || !IsGradientType(*parsed)) {
    return absl::InvalidArgumentError(
        absl::StrCat(dtype_field, ": \"", *dtype,
                     "\" is not a gradient type (expected float, double, half or bfloat16)"));
  }
  t.dtype = *parsed;

  absl::StatusOr<double> ready = GetNumber(j, path, "ready_us");
  if (!ready.ok()) return ready.status();
  t.ready_us = *ready;
  return t;
}

}  // namespace

int64_t ProfileTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t ProfileTensor::bytes() const {
  return numel() * static_cast<int64_t>(comm::DataTypeSize(dtype));
}

int64_t Profile::total_bytes() const {
  int64_t total = 0;
  for (const ProfileTensor& t : tensors) total += t.bytes();
  return total;
}

absl::Status ValidateProfile(const Profile& p) {
  if (absl::Status s = CheckName("model", p.model); !s.ok()) return s;
  if (p.description.size() > kMaxProfileDescriptionBytes) {
    return absl::InvalidArgumentError(absl::StrCat("description: ", p.description.size(),
                                                   " bytes, more than the limit of ",
                                                   kMaxProfileDescriptionBytes));
  }
  if (!IsValidUtf8(p.description)) {
    return absl::InvalidArgumentError("description: not valid UTF-8");
  }
  if (absl::Status s = CheckDuration("forward_us", p.forward_us); !s.ok()) return s;
  if (absl::Status s = CheckDuration("backward_us", p.backward_us); !s.ok()) return s;
  if (p.tensors.size() > static_cast<size_t>(bucketing::kMaxLayoutTensors)) {
    return absl::InvalidArgumentError(absl::StrCat("tensors: ", p.tensors.size(),
                                                   " tensors, more than the limit of ",
                                                   bucketing::kMaxLayoutTensors));
  }
  absl::flat_hash_set<absl::string_view> names;
  names.reserve(p.tensors.size());
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    const ProfileTensor& t = p.tensors[i];
    const std::string path = absl::StrCat("tensors[", i, "]");
    if (absl::Status s = CheckName(Field(path, "name"), t.name); !s.ok()) return s;
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(Field(path, "name"), ": \"", t.name,
                                                     "\" appears more than once"));
    }
    if (t.shape.size() > static_cast<size_t>(kMaxProfileTensorDims)) {
      return absl::InvalidArgumentError(absl::StrCat(Field(path, "shape"), ": ", t.shape.size(),
                                                     " dims, more than the limit of ",
                                                     kMaxProfileTensorDims));
    }
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (t.shape[d] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ".shape[", d, "]: ", t.shape[d], " is negative"));
      }
    }
    if (std::find(t.shape.begin(), t.shape.end(), int64_t{0}) == t.shape.end()) {
      // All dims positive: checked before multiplying, so the product never
      // overflows (numel <= max / dim  <=>  numel * dim <= max).
      int64_t numel = 1;
      for (int64_t dim : t.shape) {
        if (numel > bucketing::kMaxTensorElements / dim) {
          return absl::InvalidArgumentError(absl::StrCat(
              Field(path, "shape"), ": [", absl::StrJoin(t.shape, ", "),
              "] has more than the limit of ", bucketing::kMaxTensorElements, " elements"));
        }
        numel *= dim;
      }
    }
    if (!IsGradientType(t.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat(Field(path, "dtype"), ": type code ", static_cast<int>(t.dtype),
                       " is not a gradient type (float, double, half or bfloat16)"));
    }
    const std::string ready_field = Field(path, "ready_us");
    if (absl::Status s = CheckTime(ready_field, t.ready_us); !s.ok()) return s;
    if (t.ready_us > p.backward_us) {
      return absl::InvalidArgumentError(absl::StrCat(ready_field, ": ", Num(t.ready_us),
                                                     " is after the end of backward (backward_us = ",
                                                     Num(p.backward_us), ")"));
    }
    if (i > 0 && t.ready_us < p.tensors[i - 1].ready_us) {
      return absl::InvalidArgumentError(absl::StrCat(
          ready_field, ": ", Num(t.ready_us), " is earlier than tensors[", i - 1,
          "].ready_us = ", Num(p.tensors[i - 1].ready_us),
          " (tensors must be listed in backward-ready order)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Profile> ParseProfile(absl::string_view json_text) {
  // Note [profile nesting bound]: containers nested too deep are discarded
  // as they open (json_fields::ParseObject), so the cost stays linear.
  absl::StatusOr<Json> parsed = json_fields::ParseObject(json_text, kMaxProfileJsonDepth);
  if (!parsed.ok()) return parsed.status();
  const Json& root = *parsed;

  absl::StatusOr<std::string> format = GetString(root, "", "format");
  if (!format.ok()) return format.status();
  if (*format != kFormatName) {
    return absl::InvalidArgumentError(absl::StrCat("format: expected \"", kFormatName,
                                                   "\", got \"", *format, "\""));
  }
  absl::StatusOr<const Json*> version_json = Member(root, "", "version");
  if (!version_json.ok()) return version_json.status();
  absl::StatusOr<int64_t> version = AsInteger(**version_json, "version");
  if (!version.ok()) return version.status();
  if (*version != kProfileFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat("version: ", *version,
                                                   " is not supported (supported versions: ",
                                                   kProfileFormatVersion, ")"));
  }

  Profile p;
  absl::StatusOr<std::string> model = GetString(root, "", "model");
  if (!model.ok()) return model.status();
  p.model = *std::move(model);
  absl::StatusOr<std::string> description = GetString(root, "", "description");
  if (!description.ok()) return description.status();
  p.description = *std::move(description);
  absl::StatusOr<double> forward = GetNumber(root, "", "forward_us");
  if (!forward.ok()) return forward.status();
  p.forward_us = *forward;
  absl::StatusOr<double> backward = GetNumber(root, "", "backward_us");
  if (!backward.ok()) return backward.status();
  p.backward_us = *backward;

  absl::StatusOr<const Json*> tensors = Member(root, "", "tensors");
  if (!tensors.ok()) return tensors.status();
  if (!(*tensors)->is_array()) return Mistyped("tensors", "an array", **tensors);
  if ((*tensors)->size() > static_cast<size_t>(bucketing::kMaxLayoutTensors)) {
    return absl::InvalidArgumentError(absl::StrCat("tensors: ", (*tensors)->size(),
                                                   " tensors, more than the limit of ",
                                                   bucketing::kMaxLayoutTensors));
  }
  p.tensors.reserve((*tensors)->size());
  for (size_t i = 0; i < (*tensors)->size(); ++i) {
    absl::StatusOr<ProfileTensor> t = ParseTensor((**tensors)[i], absl::StrCat("tensors[", i, "]"));
    if (!t.ok()) return t.status();
    p.tensors.push_back(*std::move(t));
  }
  if (absl::Status s = ValidateProfile(p); !s.ok()) return s;
  return p;
}

absl::StatusOr<Profile> LoadProfile(const std::string& path) {
  absl::StatusOr<std::string> text =
      bucketing::ReadFileBounded(path, static_cast<size_t>(kMaxProfileFileBytes));
  if (!text.ok()) return text.status();
  absl::StatusOr<Profile> p = ParseProfile(*text);
  if (!p.ok()) {
    return absl::Status(p.status().code(), absl::StrCat(path, ": ", p.status().message()));
  }
  return p;
}

std::string SerializeProfile(const Profile& p) {
  auto str = [](const std::string& s) {
    return Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
  };
  auto num = [](double v) { return Json(v).dump(); };
  std::string out = "{\n";
  absl::StrAppend(&out, "  \"format\": ", str(kFormatName), ",\n");
  absl::StrAppend(&out, "  \"version\": ", kProfileFormatVersion, ",\n");
  absl::StrAppend(&out, "  \"model\": ", str(p.model), ",\n");
  absl::StrAppend(&out, "  \"description\": ", str(p.description), ",\n");
  absl::StrAppend(&out, "  \"forward_us\": ", num(p.forward_us), ",\n");
  absl::StrAppend(&out, "  \"backward_us\": ", num(p.backward_us), ",\n");
  absl::StrAppend(&out, "  \"tensors\": [");
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    const ProfileTensor& t = p.tensors[i];
    absl::StrAppend(&out, i == 0 ? "\n" : ",\n", "    {\"name\": ", str(t.name), ", \"shape\": [");
    for (size_t d = 0; d < t.shape.size(); ++d) {
      absl::StrAppend(&out, d == 0 ? "" : ", ", t.shape[d]);
    }
    absl::StrAppend(&out, "], \"dtype\": ", str(std::string(comm::DataTypeName(t.dtype))),
                    ", \"ready_us\": ", num(t.ready_us), "}");
  }
  absl::StrAppend(&out, p.tensors.empty() ? "]\n" : "\n  ]\n", "}\n");
  return out;
}

absl::Status SaveProfile(const Profile& p, const std::string& path) {
  if (absl::Status s = ValidateProfile(p); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": refusing to save an invalid profile: ", s.message()));
  }
  return bucketing::WriteFileAtomically(path, SerializeProfile(p));
}

absl::StatusOr<bucketing::GradientLayout> LayoutFromProfile(const Profile& p) {
  if (absl::Status s = ValidateProfile(p); !s.ok()) return s;
  std::vector<bucketing::TensorSpec> specs;
  specs.reserve(p.tensors.size());
  for (const ProfileTensor& t : p.tensors) {
    bucketing::TensorSpec spec;
    spec.name = t.name;
    spec.numel = t.numel();
    spec.dtype = t.dtype;
    spec.memory = comm::MemoryKind::kHost;
    specs.push_back(std::move(spec));
  }
  return bucketing::GradientLayout::Create(std::move(specs));
}

Profile ScaleCompute(const Profile& p, double factor) {
  Profile out = p;
  out.forward_us *= factor;
  out.backward_us *= factor;
  for (ProfileTensor& t : out.tensors) t.ready_us *= factor;
  return out;
}

}  // namespace fusebox::autotune
