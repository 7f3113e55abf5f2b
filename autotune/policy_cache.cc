#include "autotune/policy_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "autotune/json_fields.h"
#include "bucketing/file_io.h"
#include "bucketing/hash.h"
#include "bucketing/plan_io.h"
#include "nlohmann/json.hpp"

namespace fusebox::autotune {

namespace {

namespace fs = std::filesystem;
using json_fields::Field;
using json_fields::GetNumber;
using json_fields::GetString;
using json_fields::IsValidUtf8;
using json_fields::Json;
using json_fields::Member;
using json_fields::Mistyped;

constexpr char kFormatName[] = "fusebox-policy";
constexpr char kBundleFormatName[] = "fusebox-policy-bundle";
constexpr int kBundleFormatVersion = 1;
constexpr char kLockFileName[] = ".lock";
constexpr int kMaxWorldSize = 1 << 24;
constexpr int64_t kMaxTuningIterations = 1000000;
constexpr size_t kMaxCostModelBytes = 4096;
constexpr size_t kMaxPlanNameBytes = 256;  // ParsePlan's limit

// ---- small checks ------------------------------------------------------------

bool IsLowerHex(absl::string_view s, size_t digits) {
  if (s.size() != digits) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool IsHex(absl::string_view s, size_t digits) {
  return s.size() == digits && std::all_of(s.begin(), s.end(), [](char c) {
           return absl::ascii_isxdigit(static_cast<unsigned char>(c));
         });
}

bool IsLabelChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' ||
         c == '+' || c == '-';
}

// A JSON string literal; never throws (invalid UTF-8 is replaced, and
// ValidateEntry refuses it before anything is stored).
std::string Quote(const std::string& s) {
  return Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string Num(double v) { return absl::StrFormat("%g", v); }

absl::Status Invalid(const std::string& field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::Status PrefixStatus(absl::string_view prefix, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

absl::Status CheckLabel(const std::string& field, const std::string& v) {
  if (v.empty()) return Invalid(field, "empty");
  if (v.size() > kMaxPolicyLabelBytes) {
    return Invalid(field,
                   absl::StrCat(v.size(), " bytes, more than the limit of ", kMaxPolicyLabelBytes));
  }
  for (char c : v) {
    if (!IsLabelChar(c)) {
      return Invalid(field, absl::StrCat(Quote(v), " has a character outside [A-Za-z0-9._:+-]"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckText(const std::string& field, const std::string& v, size_t max_bytes) {
  if (v.size() > max_bytes) {
    return Invalid(field, absl::StrCat(v.size(), " bytes, more than the limit of ", max_bytes));
  }
  if (!IsValidUtf8(v)) return Invalid(field, "not valid UTF-8");
  return absl::OkStatus();
}

absl::Status CheckFigure(const std::string& field, double v) {
  if (!std::isfinite(v)) return Invalid(field, absl::StrCat(Num(v), " is not finite"));
  if (v < 0) return Invalid(field, absl::StrCat(Num(v), " is negative"));
  return absl::OkStatus();
}

// Everything but the plan's structure (see ValidateEntry).
absl::Status ValidateFields(const CacheEntry& e) {
  if (absl::Status s = e.key.Validate(); !s.ok()) return PrefixStatus("key.", s);
  if (e.key.format_version != kPolicyFormatVersion) {
    return Invalid("key.format_version",
                   absl::StrCat(e.key.format_version, " is not the version this build writes (",
                                kPolicyFormatVersion, ")"));
  }
  if (absl::Status s = CheckText("model", e.model, kMaxPolicyLabelBytes); !s.ok()) return s;
  if (absl::Status s = CheckFigure("measured_iteration_us", e.measured_iteration_us); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckFigure("ddp_iteration_us", e.ddp_iteration_us); !s.ok()) return s;
  if (absl::Status s = CheckFigure("predicted_iteration_us", e.predicted_iteration_us); !s.ok()) {
    return s;
  }
  if (e.tuning_iterations < 0 || e.tuning_iterations > kMaxTuningIterations) {
    return Invalid("tuning_iterations", absl::StrCat(e.tuning_iterations, " is outside [0, ",
                                                     kMaxTuningIterations, "]"));
  }
  if (absl::Status s = CheckText("cost_model", e.cost_model, kMaxCostModelBytes); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckText("fusebox_version", e.fusebox_version, kMaxPolicyLabelBytes);
      !s.ok()) {
    return s;
  }
  if (e.created_unix_s < 0) {
    return Invalid("created_unix_s", absl::StrCat(e.created_unix_s, " is negative"));
  }
  return CheckText("plan.name", e.plan.name, kMaxPlanNameBytes);
}

// ParsePlan's errors read "plan file: buckets[2]...: what"; inside an entry
// the field is "plan.buckets[2]...".
absl::Status PlanFieldError(const absl::Status& s) {
  absl::string_view message = s.message();
  absl::ConsumePrefix(&message, "plan file: ");
  return absl::Status(s.code(), absl::StrCat("plan.", message));
}

// The plan's structure, as a reader will check it: it must survive the
// trip through its file form.
absl::Status ValidatePlanStructure(const bucketing::Plan& plan) {
  absl::StatusOr<bucketing::Plan> back = bucketing::ParsePlan(bucketing::SerializePlan(plan));
  if (!back.ok()) return PlanFieldError(back.status());
  if (!(*back == plan)) return Invalid("plan", "does not survive serialisation");
  return absl::OkStatus();
}

absl::Status ValidateEntry(const CacheEntry& e) {
  if (absl::Status s = ValidateFields(e); !s.ok()) return s;
  return ValidatePlanStructure(e.plan);
}

// ---- JSON field access; every error names the field --------------------------

// A number that must be finite and non-negative (times, counts).
absl::StatusOr<double> GetFigure(const Json& obj, const std::string& parent,
                                 absl::string_view key) {
  absl::StatusOr<double> x = GetNumber(obj, parent, key);
  if (!x.ok()) return x.status();
  if (absl::Status s = CheckFigure(Field(parent, key), *x); !s.ok()) return s;
  return x;
}

absl::StatusOr<int64_t> GetInt(const Json& obj, const std::string& parent, absl::string_view key,
                               int64_t lo, int64_t hi) {
  absl::StatusOr<const Json*> v = Member(obj, parent, key);
  if (!v.ok()) return v.status();
  const std::string field = Field(parent, key);
  const Json& j = **v;
  if (j.is_number_float()) {
    return Invalid(field, absl::StrCat("expected an integer, got ", Num(j.get<double>())));
  }
  if (!j.is_number_integer()) return Mistyped(field, "an integer", j);
  if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return Invalid(field, absl::StrCat(j.get<uint64_t>(), " is outside [", lo, ", ", hi, "]"));
  }
  const int64_t x = j.get<int64_t>();
  if (x < lo || x > hi) {
    return Invalid(field, absl::StrCat(x, " is outside [", lo, ", ", hi, "]"));
  }
  return x;
}

absl::StatusOr<uint64_t> GetHex64(const Json& obj, const std::string& parent,
                                  absl::string_view key) {
  absl::StatusOr<std::string> s = GetString(obj, parent, key);
  if (!s.ok()) return s.status();
  uint64_t v = 0;
  if (!IsHex(*s, 16) || !absl::SimpleHexAtoi(*s, &v)) {
    return Invalid(Field(parent, key),
                   absl::StrCat(Quote(*s), " is not a 16-digit hexadecimal number"));
  }
  return v;
}

// Parses `text` as JSON, refusing (without building) containers nested
// kMaxPolicyJsonDepth or more levels deep; see Note [profile nesting bound]
// in profile.cc. The cost is linear in the input and memory is bounded by it.
absl::StatusOr<Json> ParseBoundedJson(absl::string_view text) {
  return json_fields::ParseObject(text, kMaxPolicyJsonDepth);
}

absl::Status CheckFormat(const Json& root, absl::string_view name, int64_t version) {
  absl::StatusOr<std::string> format = GetString(root, "", "format");
  if (!format.ok()) return format.status();
  if (*format != name) {
    return Invalid("format", absl::StrCat("expected \"", name, "\", got ", Quote(*format)));
  }
  absl::StatusOr<int64_t> v = GetInt(root, "", "version", 0, std::numeric_limits<int64_t>::max());
  if (!v.ok()) return v.status();
  if (*v != version) {
    return Invalid("version",
                   absl::StrCat(*v, " is not supported (this build reads version ", version, ")"));
  }
  return absl::OkStatus();
}

// One entry from its JSON object (a file's root or a bundle's element).
absl::StatusOr<CacheEntry> ParseEntryObject(const Json& root) {
  if (!root.is_object()) return Mistyped("(entry)", "an object", root);
  if (absl::Status s = CheckFormat(root, kFormatName, kPolicyFormatVersion); !s.ok()) return s;
  CacheEntry e;

  absl::StatusOr<const Json*> key = Member(root, "", "key");
  if (!key.ok()) return key.status();
  if (!(*key)->is_object()) return Mistyped("key", "an object", **key);
  const Json& k = **key;
  absl::StatusOr<std::string> signature = GetString(k, "key", "model_signature");
  if (!signature.ok()) return signature.status();
  e.key.model_signature = *std::move(signature);
  absl::StatusOr<int64_t> world = GetInt(k, "key", "world_size", 1, kMaxWorldSize);
  if (!world.ok()) return world.status();
  e.key.world_size = static_cast<int>(*world);
  absl::StatusOr<int64_t> rpn = GetInt(k, "key", "ranks_per_node", 1, kMaxWorldSize);
  if (!rpn.ok()) return rpn.status();
  e.key.ranks_per_node = static_cast<int>(*rpn);
  absl::StatusOr<std::string> backend = GetString(k, "key", "backend");
  if (!backend.ok()) return backend.status();
  e.key.backend = *std::move(backend);
  absl::StatusOr<std::string> network = GetString(k, "key", "network");
  if (!network.ok()) return network.status();
  e.key.network = *std::move(network);
  e.key.format_version = kPolicyFormatVersion;  // the file's version, checked above

  absl::StatusOr<std::string> model = GetString(root, "", "model");
  if (!model.ok()) return model.status();
  e.model = *std::move(model);
  absl::StatusOr<uint64_t> layout_hash = GetHex64(root, "", "layout_hash");
  if (!layout_hash.ok()) return layout_hash.status();
  e.layout_hash = *layout_hash;

  absl::StatusOr<double> measured = GetFigure(root, "", "measured_iteration_us");
  if (!measured.ok()) return measured.status();
  e.measured_iteration_us = *measured;
  absl::StatusOr<double> ddp = GetFigure(root, "", "ddp_iteration_us");
  if (!ddp.ok()) return ddp.status();
  e.ddp_iteration_us = *ddp;
  absl::StatusOr<double> predicted = GetFigure(root, "", "predicted_iteration_us");
  if (!predicted.ok()) return predicted.status();
  e.predicted_iteration_us = *predicted;
  absl::StatusOr<int64_t> iterations =
      GetInt(root, "", "tuning_iterations", 0, kMaxTuningIterations);
  if (!iterations.ok()) return iterations.status();
  e.tuning_iterations = static_cast<int>(*iterations);
  absl::StatusOr<std::string> cost_model = GetString(root, "", "cost_model");
  if (!cost_model.ok()) return cost_model.status();
  e.cost_model = *std::move(cost_model);
  absl::StatusOr<std::string> version = GetString(root, "", "fusebox_version");
  if (!version.ok()) return version.status();
  e.fusebox_version = *std::move(version);
  absl::StatusOr<int64_t> created =
      GetInt(root, "", "created_unix_s", 0, std::numeric_limits<int64_t>::max());
  if (!created.ok()) return created.status();
  e.created_unix_s = *created;

  absl::StatusOr<const Json*> plan = Member(root, "", "plan");
  if (!plan.ok()) return plan.status();
  if (!(*plan)->is_object()) return Mistyped("plan", "an object", **plan);
  absl::StatusOr<bucketing::Plan> parsed = bucketing::ParsePlan((*plan)->dump());
  if (!parsed.ok()) return PlanFieldError(parsed.status());
  e.plan = *std::move(parsed);

  if (absl::Status s = ValidateFields(e); !s.ok()) return s;
  return e;
}

// Prefixes every line after the first with `indent` (the texts indented
// here hold no raw newlines inside strings: JSON escapes them).
std::string Indent(absl::string_view text, absl::string_view indent) {
  absl::ConsumeSuffix(&text, "\n");
  return absl::StrReplaceAll(text, {{"\n", absl::StrCat("\n", indent)}});
}

// ---- the directory -----------------------------------------------------------

std::string JoinPath(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

// The lock on `<dir>/.lock`, held while the object lives.
class DirLock {
 public:
  static absl::StatusOr<DirLock> Acquire(const std::string& dir, absl::Duration timeout) {
    const std::string path = JoinPath(dir, kLockFileName);
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      return absl::UnavailableError(
          absl::StrCat(path, ": cannot open the lock file: ", std::strerror(errno)));
    }
    DirLock lock(fd);
    const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
    auto pause = std::chrono::microseconds(200);
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) {
        return absl::UnavailableError(absl::StrCat(path, ": cannot lock: ", std::strerror(errno)));
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        return absl::UnavailableError(absl::StrCat(path, ": not locked within ",
                                                   absl::FormatDuration(timeout),
                                                   " (another process holds it)"));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(10));
    }
    return lock;
  }

  DirLock(DirLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  DirLock& operator=(DirLock&&) = delete;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  ~DirLock() {
    if (fd_ >= 0) close(fd_);  // closing the last descriptor releases the flock
  }

 private:
  explicit DirLock(int fd) : fd_(fd) {}
  int fd_;
};

// A bare file name as List() gives them.
absl::Status CheckEntryFileName(const std::string& file) {
  if (file.empty() || file[0] == '.' || file.find('/') != std::string::npos ||
      !absl::EndsWith(file, ".json")) {
    return absl::InvalidArgumentError(absl::StrCat(
        Quote(file), " is not an entry file name (NAME.json, no directory, as listed)"));
  }
  return absl::OkStatus();
}

// Reads and parses one entry file. Errors do not repeat the path.
absl::StatusOr<CacheEntry> ReadEntryFile(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("cannot stat: ", ec.message()));
  if (!fs::is_regular_file(st)) return absl::InvalidArgumentError("not a regular file");
  absl::StatusOr<std::string> text = bucketing::ReadFileBounded(path, kMaxPolicyFileBytes);
  if (!text.ok()) {
    absl::string_view message = text.status().message();
    absl::ConsumePrefix(&message, path + ": ");
    return absl::Status(text.status().code(), message);
  }
  return ParseCacheEntry(*text);
}

// Reads `file` in `dir` and checks that it holds the entry its name says.
absl::StatusOr<CacheEntry> ReadListedFile(const std::string& dir, const std::string& file) {
  absl::StatusOr<CacheEntry> e = ReadEntryFile(JoinPath(dir, file));
  if (!e.ok()) return e;
  if (e->key.FileName() != file) {
    return absl::InvalidArgumentError(absl::StrCat(
        "holds the entry for another key (its name would be ", e->key.FileName(), ")"));
  }
  return e;
}

// The entry files' names, sorted.
std::vector<std::string> EntryFileNames(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.empty() || name[0] == '.' || !absl::EndsWith(name, ".json")) continue;
    names.push_back(std::move(name));
  }
  std::sort(names.begin(), names.end());
  return names;
}

absl::Status CheckUsable(const CacheEntry& e, const bucketing::GradientLayout& layout) {
  if (e.layout_hash != layout.Hash()) {
    return Invalid("layout_hash",
                   absl::StrFormat("the plan was made for layout %016x, this layout is %016x",
                                   e.layout_hash, layout.Hash()));
  }
  if (absl::Status s = bucketing::ValidatePlan(layout, e.plan); !s.ok()) {
    return PrefixStatus("plan does not fit the layout: ", s);
  }
  return absl::OkStatus();
}

// True when world size `a` is nearer to `target` than `b` in ratio (ties:
// the larger). Exact: the ratios are compared by cross-multiplying.
bool NearerInRatio(int64_t a, int64_t b, int64_t target) {
  const int64_t a_hi = std::max(a, target), a_lo = std::min(a, target);
  const int64_t b_hi = std::max(b, target), b_lo = std::min(b, target);
  const int64_t lhs = a_hi * b_lo, rhs = b_hi * a_lo;  // a_hi/a_lo vs b_hi/b_lo
  if (lhs != rhs) return lhs < rhs;
  return a > b;
}

}  // namespace

std::string DefaultCacheDir(const char* fusebox_cache_dir, const char* xdg_cache_home,
                            const char* home) {
  auto set = [](const char* v) { return v != nullptr && v[0] != '\0'; };
  if (set(fusebox_cache_dir)) return fusebox_cache_dir;
  if (set(xdg_cache_home)) return absl::StrCat(xdg_cache_home, "/fusebox");
  if (set(home)) return absl::StrCat(home, "/.cache/fusebox");
  return "";
}

std::string BackendFamily(absl::string_view backend) {
  std::string b = absl::AsciiStrToLower(backend);
  if (absl::StartsWith(b, "torch-")) b.erase(0, 6);
  return b;
}

std::string ModelSignature(const bucketing::GradientLayout& layout) {
  bucketing::StableHasher h;
  h.AddU64(static_cast<uint64_t>(layout.size()));
  for (const bucketing::TensorSpec& t : layout.tensors()) {
    h.AddI64(t.numel);
    h.AddU64(static_cast<uint64_t>(t.dtype));
  }
  return absl::StrFormat("%016x", h.value());
}

absl::Status CacheKey::Validate() const {
  if (!IsLowerHex(model_signature, 16)) {
    return Invalid("model_signature",
                   absl::StrCat(Quote(model_signature), " is not 16 lowercase hex digits"));
  }
  if (world_size < 1 || world_size > kMaxWorldSize) {
    return Invalid("world_size", absl::StrCat(world_size, " is outside [1, ", kMaxWorldSize, "]"));
  }
  if (ranks_per_node < 1 || ranks_per_node > world_size) {
    return Invalid("ranks_per_node",
                   absl::StrCat(ranks_per_node, " is outside [1, world_size = ", world_size, "]"));
  }
  if (absl::Status s = CheckLabel("backend", backend); !s.ok()) return s;
  if (absl::Status s = CheckLabel("network", network); !s.ok()) return s;
  if (format_version < 1) {
    return Invalid("format_version", absl::StrCat(format_version, " is not positive"));
  }
  return absl::OkStatus();
}

std::string CacheKey::FileName() const {
  const std::string net = absl::StrReplaceAll(network, {{":", "_"}, {"+", "_"}});
  return absl::StrCat(model_signature, "-w", world_size, "-r", ranks_per_node, "-", backend, "-",
                      net, "-v", format_version, ".json");
}

absl::StatusOr<CacheEntry> ParseCacheEntry(absl::string_view json_text) {
  if (json_text.size() > kMaxPolicyFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(json_text.size(), " bytes, more than the limit of ", kMaxPolicyFileBytes));
  }
  absl::StatusOr<Json> root = ParseBoundedJson(json_text);
  if (!root.ok()) return root.status();
  return ParseEntryObject(*root);
}

absl::StatusOr<std::vector<absl::StatusOr<CacheEntry>>> ParseCacheBundle(
    absl::string_view json_text) {
  if (json_text.size() > kMaxPolicyBundleBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(json_text.size(), " bytes, more than the limit of ", kMaxPolicyBundleBytes));
  }
  absl::StatusOr<Json> root = ParseBoundedJson(json_text);
  if (!root.ok()) return root.status();
  if (absl::Status s = CheckFormat(*root, kBundleFormatName, kBundleFormatVersion); !s.ok()) {
    return s;
  }
  absl::StatusOr<const Json*> entries = Member(*root, "", "entries");
  if (!entries.ok()) return entries.status();
  if (!(*entries)->is_array()) return Mistyped("entries", "an array", **entries);
  std::vector<absl::StatusOr<CacheEntry>> out;
  out.reserve((*entries)->size());
  for (const Json& j : **entries) {
    absl::StatusOr<CacheEntry> e = ParseEntryObject(j);
    if (e.ok()) {
      if (absl::Status valid = ValidateEntry(*e); !valid.ok()) e = valid;
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::string SerializeCacheEntry(const CacheEntry& e) {
  const CacheKey& k = e.key;
  auto num = [](double v) { return Json(v).dump(); };
  std::string out = "{\n";
  absl::StrAppend(&out, "  \"format\": ", Quote(kFormatName), ",\n");
  absl::StrAppend(&out, "  \"version\": ", k.format_version, ",\n");
  absl::StrAppend(&out, "  \"key\": {\"model_signature\": ", Quote(k.model_signature),
                  ", \"world_size\": ", k.world_size, ", \"ranks_per_node\": ", k.ranks_per_node,
                  ", \"backend\": ", Quote(k.backend), ", \"network\": ", Quote(k.network), "},\n");
  absl::StrAppend(&out, "  \"model\": ", Quote(e.model), ",\n");
  absl::StrAppendFormat(&out, "  \"layout_hash\": \"%016x\",\n", e.layout_hash);
  absl::StrAppend(&out, "  \"measured_iteration_us\": ", num(e.measured_iteration_us), ",\n");
  absl::StrAppend(&out, "  \"ddp_iteration_us\": ", num(e.ddp_iteration_us), ",\n");
  absl::StrAppend(&out, "  \"predicted_iteration_us\": ", num(e.predicted_iteration_us), ",\n");
  absl::StrAppend(&out, "  \"tuning_iterations\": ", e.tuning_iterations, ",\n");
  absl::StrAppend(&out, "  \"cost_model\": ", Quote(e.cost_model), ",\n");
  absl::StrAppend(&out, "  \"fusebox_version\": ", Quote(e.fusebox_version), ",\n");
  absl::StrAppend(&out, "  \"created_unix_s\": ", e.created_unix_s, ",\n");
  std::string plan_text;
  if (IsValidUtf8(e.plan.name)) {
    plan_text = bucketing::SerializePlan(e.plan);
  } else {  // SerializePlan insists on UTF-8; such an entry is refused by Store anyway
    bucketing::Plan copy = e.plan;
    copy.name = Json::parse(Quote(copy.name)).get<std::string>();
    plan_text = bucketing::SerializePlan(copy);
  }
  absl::StrAppend(&out, "  \"plan\": ", Indent(plan_text, "  "), "\n}\n");
  return out;
}

PolicyCache::PolicyCache(PolicyCacheOptions options) : options_(std::move(options)) {
  const std::string& dir = options_.dir;
  if (dir.empty()) {
    Warn("policy cache disabled: no directory given");
    return;
  }
  std::error_code ec;
  if (options_.read_only) {
    // Never created; a directory that does not exist yet is an empty cache, not a fault.
    struct stat st;
    if (stat(dir.c_str(), &st) != 0) {
      if (errno != ENOENT) {
        Warn(absl::StrCat("policy cache disabled: cannot read directory ", dir, ": ",
                          std::strerror(errno)));
      }
      return;
    }
    if (!S_ISDIR(st.st_mode)) {
      Warn(absl::StrCat("policy cache disabled: ", dir, " exists and is not a directory"));
      return;
    }
    enabled_ = true;
    return;
  }
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir, ec)) {
    Warn(absl::StrCat("policy cache disabled: cannot create directory ", dir, ": ",
                      ec ? ec.message() : "it exists and is not a directory"));
    return;
  }
  // Probe: create and remove a file, the operations Store needs. A directory
  // that fails the probe is still read: lookups need no write.
  enabled_ = true;
  std::string probe = JoinPath(dir, ".probe-XXXXXX");
  const int fd = mkstemp(probe.data());
  if (fd < 0) {
    Warn(absl::StrCat("policy cache in ", dir, " is not writable (cannot create a file in it: ",
                      std::strerror(errno), "): plans are looked up in it but not stored"));
    return;
  }
  close(fd);
  if (unlink(probe.c_str()) != 0) {
    Warn(absl::StrCat("policy cache in ", dir, " is not writable (cannot remove ", probe, ": ",
                      std::strerror(errno), "): plans are looked up in it but not stored"));
    return;
  }
  writable_ = true;
}

absl::Status PolicyCache::CheckWritable() const {
  if (options_.read_only) {
    return absl::FailedPreconditionError(
        absl::StrCat("policy cache in ", options_.dir, " was opened read-only"));
  }
  if (!enabled_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "policy cache in ", options_.dir, " is disabled (see the warning given when it opened)"));
  }
  if (!writable_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "policy cache in ", options_.dir,
        " is not writable (see the warning given when it opened)"));
  }
  return absl::OkStatus();
}

void PolicyCache::Warn(const std::string& message) const {
  if (options_.warn) options_.warn(message);
}

std::optional<CacheEntry> PolicyCache::Lookup(const CacheKey& key,
                                              const bucketing::GradientLayout& layout) const {
  if (!enabled_) return std::nullopt;
  if (absl::Status s = key.Validate(); !s.ok()) {
    Warn(absl::StrCat("policy cache: lookup with an invalid key: ", s.message()));
    return std::nullopt;
  }
  const std::string file = key.FileName();
  const std::string path = JoinPath(options_.dir, file);
  struct stat st;
  if (lstat(path.c_str(), &st) != 0 && errno == ENOENT) return std::nullopt;  // a plain miss
  absl::Status why;
  absl::StatusOr<CacheEntry> e = ReadEntryFile(path);
  if (!e.ok()) {
    why = e.status();
  } else if (!(e->key == key)) {
    why = absl::InvalidArgumentError(absl::StrCat(
        "holds the entry for another key (its name would be ", e->key.FileName(), ")"));
  } else {
    why = CheckUsable(*e, layout);
  }
  if (!why.ok()) {
    Warn(absl::StrCat("policy cache: ignoring ", path, ": ", why.message(),
                      " (the next Store replaces it)"));
    return std::nullopt;
  }
  return *std::move(e);
}

std::optional<CacheEntry> PolicyCache::Nearest(const CacheKey& key,
                                               const bucketing::GradientLayout& layout) const {
  if (!enabled_) return std::nullopt;
  if (absl::Status s = key.Validate(); !s.ok()) {
    Warn(absl::StrCat("policy cache: nearest-entry search with an invalid key: ", s.message()));
    return std::nullopt;
  }
  // Only this model's files: their names start with the signature.
  const std::string prefix = absl::StrCat(key.model_signature, "-");
  std::optional<CacheEntry> best;
  for (const std::string& file : EntryFileNames(options_.dir)) {
    if (!absl::StartsWith(file, prefix)) continue;
    absl::StatusOr<CacheEntry> e = ReadListedFile(options_.dir, file);
    if (!e.ok()) {
      Warn(absl::StrCat("policy cache: ignoring ", JoinPath(options_.dir, file), ": ",
                        e.status().message()));
      continue;
    }
    const CacheKey& k = e->key;
    if (k.model_signature != key.model_signature || k.ranks_per_node != key.ranks_per_node ||
        k.backend != key.backend || k.network != key.network ||
        k.format_version != key.format_version || k.world_size == key.world_size) {
      continue;
    }
    if (absl::Status s = CheckUsable(*e, layout); !s.ok()) {
      Warn(
          absl::StrCat("policy cache: ignoring ", JoinPath(options_.dir, file), ": ", s.message()));
      continue;
    }
    if (!best.has_value() || NearerInRatio(k.world_size, best->key.world_size, key.world_size)) {
      best = *std::move(e);
    }
  }
  return best;
}

absl::Status PolicyCache::Store(const CacheEntry& entry) {
  if (absl::Status s = ValidateEntry(entry); !s.ok()) {
    return PrefixStatus("policy cache entry: ", s);
  }
  if (absl::Status s = CheckWritable(); !s.ok()) return s;
  const std::string text = SerializeCacheEntry(entry);
  if (text.size() > kMaxPolicyFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat("policy cache entry: ", text.size(),
                                                   " bytes, more than the limit of ",
                                                   kMaxPolicyFileBytes));
  }
  absl::StatusOr<DirLock> lock = DirLock::Acquire(options_.dir, options_.lock_timeout);
  if (!lock.ok()) return lock.status();
  return bucketing::WriteFileAtomically(JoinPath(options_.dir, entry.key.FileName()), text);
}

std::vector<ListedEntry> PolicyCache::List() const {
  std::vector<ListedEntry> out;
  for (const std::string& file : EntryFileNames(options_.dir)) {
    ListedEntry listed;
    listed.file = file;
    absl::StatusOr<CacheEntry> e = ReadListedFile(options_.dir, file);
    if (e.ok()) {
      listed.entry = *std::move(e);
    } else {
      listed.status = e.status();
    }
    out.push_back(std::move(listed));
  }
  return out;
}

absl::Status PolicyCache::Remove(const std::string& file) {
  if (absl::Status s = CheckEntryFileName(file); !s.ok()) return s;
  if (absl::Status s = CheckWritable(); !s.ok()) return s;
  absl::StatusOr<DirLock> lock = DirLock::Acquire(options_.dir, options_.lock_timeout);
  if (!lock.ok()) return lock.status();
  const std::string path = JoinPath(options_.dir, file);
  if (unlink(path.c_str()) != 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such entry"));
    return absl::UnavailableError(absl::StrCat(path, ": cannot remove: ", std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::Status PolicyCache::Export(const std::string& path, int* count) const {
  int n = 0;
  std::string out = absl::StrCat("{\"format\": ", Quote(kBundleFormatName),
                                 ", \"version\": ", kBundleFormatVersion, ",\n \"entries\": [");
  for (const ListedEntry& listed : List()) {
    if (!listed.entry.has_value()) continue;
    absl::StrAppend(&out, n == 0 ? "\n  " : ",\n  ",
                    Indent(SerializeCacheEntry(*listed.entry), "  "));
    ++n;
  }
  absl::StrAppend(&out, n == 0 ? "]}\n" : "\n ]}\n");
  if (absl::Status s = bucketing::WriteFileAtomically(path, out); !s.ok()) return s;
  if (count != nullptr) *count = n;
  return absl::OkStatus();
}

absl::Status PolicyCache::Import(const std::string& path, int* imported) {
  if (imported != nullptr) *imported = 0;
  if (absl::Status s = CheckWritable(); !s.ok()) return s;
  absl::StatusOr<std::string> text = bucketing::ReadFileBounded(path, kMaxPolicyBundleBytes);
  if (!text.ok()) return text.status();
  absl::StatusOr<std::vector<absl::StatusOr<CacheEntry>>> entries = ParseCacheBundle(*text);
  if (!entries.ok()) return PrefixStatus(absl::StrCat(path, ": "), entries.status());
  int n = 0;
  for (size_t i = 0; i < entries->size(); ++i) {
    const absl::StatusOr<CacheEntry>& e = (*entries)[i];
    if (!e.ok()) {
      Warn(absl::StrCat("policy cache import: ", path, ": entries[", i, "]: ",
                        e.status().message(), " (skipped)"));
      continue;
    }
    if (absl::Status stored = Store(*e); !stored.ok()) {
      if (imported != nullptr) *imported = n;
      return PrefixStatus(absl::StrCat(path, ": entries[", i, "]: "), stored);
    }
    ++n;
  }
  if (imported != nullptr) *imported = n;
  return absl::OkStatus();
}

}  // namespace fusebox::autotune
