#include "autotune/json_fields.h"

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace fusebox::autotune::json_fields {

absl::StatusOr<Json> ParseObject(absl::string_view text, int max_depth) {
  bool too_deep = false;
  auto bound_depth = [&too_deep, max_depth](int depth, Json::parse_event_t event, Json&) {
    if ((event == Json::parse_event_t::object_start ||
         event == Json::parse_event_t::array_start) &&
        depth >= max_depth) {
      too_deep = true;
      return false;
    }
    return true;
  };
  Json root;
  try {
    root = Json::parse(text.begin(), text.end(), bound_depth);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("malformed JSON: ", e.what()));
  }
  if (too_deep) {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON nests arrays/objects more than ", max_depth, " levels deep"));
  }
  if (!root.is_object()) return Mistyped("(top level)", "an object", root);
  return root;
}

std::string Field(const std::string& parent, absl::string_view key) {
  return parent.empty() ? std::string(key) : absl::StrCat(parent, ".", key);
}

absl::Status Mistyped(const std::string& field, absl::string_view expected, const Json& got) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected ", expected, ", got ", got.type_name()));
}

absl::StatusOr<const Json*> Member(const Json& obj, const std::string& parent,
                                   absl::string_view key) {
  auto it = obj.find(std::string(key));
  if (it == obj.end()) {
    return absl::InvalidArgumentError(absl::StrCat(Field(parent, key), ": missing"));
  }
  return &*it;
}

absl::StatusOr<std::string> GetString(const Json& obj, const std::string& parent,
                                      absl::string_view key) {
  absl::StatusOr<const Json*> v = Member(obj, parent, key);
  if (!v.ok()) return v.status();
  if (!(*v)->is_string()) return Mistyped(Field(parent, key), "a string", **v);
  return (*v)->get<std::string>();
}

absl::StatusOr<double> GetNumber(const Json& obj, const std::string& parent,
                                 absl::string_view key) {
  absl::StatusOr<const Json*> v = Member(obj, parent, key);
  if (!v.ok()) return v.status();
  if (!(*v)->is_number()) return Mistyped(Field(parent, key), "a number", **v);
  return (*v)->get<double>();
}

bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int extra;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i <= static_cast<size_t>(extra)) return false;  // truncated
    for (int k = 1; k <= extra; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += extra + 1;
  }
  return true;
}

}  // namespace fusebox::autotune::json_fields
