// Defensive reading of the autotune JSON formats (profiles, cost models,
// policy-cache entries): nesting bounded while parsing, and every error
// naming its field ("tensors[3].shape: expected an array, got string").
// Internal to autotune/.
#ifndef FUSEBOX_AUTOTUNE_JSON_FIELDS_H_
#define FUSEBOX_AUTOTUNE_JSON_FIELDS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace fusebox::autotune::json_fields {

using Json = nlohmann::json;

// Parses `text` into an object. A container nested at depth >= max_depth
// (the top-level object is depth 0) is discarded as it opens, so the cost
// stays linear and memory bounded; the result is then an error. Errors:
// "malformed JSON: <parser's message with line and column>", "JSON nests
// arrays/objects more than N levels deep", "(top level): expected an
// object, got ...".
absl::StatusOr<Json> ParseObject(absl::string_view text, int max_depth);

// "parent.key" (or "key" at the top level).
std::string Field(const std::string& parent, absl::string_view key);
// "<field>: expected <expected>, got <JSON type>".
absl::Status Mistyped(const std::string& field, absl::string_view expected, const Json& got);
// The member `key` of `obj`, or "<field>: missing".
absl::StatusOr<const Json*> Member(const Json& obj, const std::string& parent,
                                   absl::string_view key);
absl::StatusOr<std::string> GetString(const Json& obj, const std::string& parent,
                                      absl::string_view key);
// Any JSON number, as a double (range checks are the caller's).
absl::StatusOr<double> GetNumber(const Json& obj, const std::string& parent,
                                 absl::string_view key);

// Strict UTF-8 (no overlong forms, no surrogates, at most U+10FFFF): what
// the JSON writer and reader both insist on.
bool IsValidUtf8(absl::string_view s);

}  // namespace fusebox::autotune::json_fields

#endif  // FUSEBOX_AUTOTUNE_JSON_FIELDS_H_
