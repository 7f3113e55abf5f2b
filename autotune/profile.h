// Gradient profiles: what a planner needs to know about one model's backward
// pass. Which gradients exist (name, shape, dtype), in which order backward
// makes them ready, and when, plus the forward and backward durations.
//
// A profile is a plain value. It comes from a generator (autotune/models.h),
// from a measurement, or from a JSON file (format in
// autotune/profiles/README.md). Files are untrusted input: ParseProfile and
// LoadProfile check every field and bound every size before anything else
// sees the data. All functions here are pure (LoadProfile and SaveProfile do
// file I/O and nothing else) and may be called from any thread.
#ifndef FUSEBOX_AUTOTUNE_PROFILE_H_
#define FUSEBOX_AUTOTUNE_PROFILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bucketing/layout.h"
#include "comm/types.h"

namespace fusebox::autotune {

// The "version" written by SerializeProfile and the only one ParseProfile
// reads. Bump it when a reader of the old version would misread a new file.
inline constexpr int kProfileFormatVersion = 1;

// Bounds checked by ValidateProfile / ParseProfile / LoadProfile.
inline constexpr int kMaxProfileTensorDims = 8;
inline constexpr size_t kMaxProfileNameBytes = 256;          // tensor and model names
inline constexpr size_t kMaxProfileDescriptionBytes = 1 << 16;
inline constexpr double kMaxProfileMicros = 1e10;           // ~2.8 hours
inline constexpr int kMaxProfileJsonDepth = 8;              // nested arrays/objects
inline constexpr int64_t kMaxProfileFileBytes = int64_t{64} << 20;

struct ProfileTensor {
  std::string name;
  std::vector<int64_t> shape;          // numel = product (empty shape = scalar = 1)
  comm::DataType dtype = comm::DataType::kFloat32;
  double ready_us = 0;                 // when backward makes this gradient ready, from backward start
  // Product of `shape`. Call only on validated tensors (no overflow check).
  int64_t numel() const;
  int64_t bytes() const;
};

struct Profile {
  std::string model;                   // e.g. "resnet50"
  std::string description;             // human text: architecture source, compute model, batch
  double forward_us = 0;
  double backward_us = 0;
  std::vector<ProfileTensor> tensors;  // in backward-ready order
  int64_t total_bytes() const;
};

// OK when `p` is within bounds: model name non-empty and at most 256 bytes;
// forward_us and backward_us finite, > 0 and <= 1e10; at most
// bucketing::kMaxLayoutTensors tensors, each with a non-empty, unique name of
// at most 256 bytes of valid UTF-8, at most 8 non-negative dims whose product
// is at most bucketing::kMaxTensorElements, a floating-point dtype, and a
// finite ready_us in [0, backward_us] not earlier than the previous tensor's.
// Errors are InvalidArgument and start with the field, e.g.
// "tensors[12].ready_us: -3 is negative".
absl::Status ValidateProfile(const Profile& p);

// Parses and validates the JSON file format (autotune/profiles/README.md).
// Rejects malformed JSON (with the parser's position), a wrong "format", a
// "version" other than kProfileFormatVersion, missing or mistyped fields
// (named, e.g. "tensors[3].shape[1]"), nesting deeper than
// kMaxProfileJsonDepth, and everything ValidateProfile rejects. Unknown keys
// are ignored (forward compatible). Linear in the input size.
absl::StatusOr<Profile> ParseProfile(absl::string_view json_text);

// Reads at most kMaxProfileFileBytes from `path` and parses it. Errors name
// the path.
absl::StatusOr<Profile> LoadProfile(const std::string& path);

// The JSON file format: an indented object with one tensor per line. Doubles
// are written in their shortest round-trip form, so ParseProfile gives back
// an equal profile. `p` should be valid (names that are not UTF-8 would be
// written with replacement characters).
std::string SerializeProfile(const Profile& p);

// Validates `p`, writes it to a temporary file next to `path`, syncs it and
// renames it over `path`: readers see the old file or the new one, never a
// partial one.
absl::Status SaveProfile(const Profile& p, const std::string& path);

// The gradients of `p` as a host-memory layout: names, element counts and
// dtypes in ready order. Validates `p` first.
absl::StatusOr<bucketing::GradientLayout> LayoutFromProfile(const Profile& p);

// `p` with forward_us, backward_us and every ready_us multiplied by
// `factor` (a faster or slower device, same model). Validate the result when
// `factor` is not known to be positive and moderate.
Profile ScaleCompute(const Profile& p, double factor);

}  // namespace fusebox::autotune

#endif  // FUSEBOX_AUTOTUNE_PROFILE_H_
