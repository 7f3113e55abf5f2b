// PolicyCache: the persistent knowledge base of chosen plans, one file per
// (model, cluster) key, so that a cluster size seen before is never tuned
// again (Ascend AOE's "knowledge base", made a plain directory of JSON).
//
//   autotune::PolicyCacheOptions options;
//   options.dir = dir;
//   options.warn = log;
//   autotune::PolicyCache cache(std::move(options));
//   CacheKey key = {ModelSignature(layout), world, ranks_per_node, "ucx", "local"};
//   if (auto hit = cache.Lookup(key, layout)) use(hit->plan);   // zero tuning
//   else { tune...; cache.Store(entry); }
//
// Files on disk (docs/design.md, "Files on disk"): `<dir>/<key.FileName()>`, an
// indented JSON object a human can read (format "fusebox-policy", version
// kPolicyFormatVersion) holding the key, the plan (bucketing/plan_io.h
// form), the layout hash, and the figures the plan was chosen by. Writes go
// to a temporary file that is synced and renamed over the entry, under an
// exclusive flock(2) on `<dir>/.lock` (bounded wait), so several jobs may
// share a directory, also on a shared filesystem that supports flock.
//
// Every file is untrusted: size (kMaxPolicyFileBytes), nesting, types and
// counts are bounded and checked. A file that is corrupted, truncated, of
// another version, or made for another layout is reported through
// `warn` and ignored: Lookup misses and the caller retunes and overwrites it.
// A directory that cannot be created or written degrades the cache to
// "disabled" with one warning; nothing fails because of the cache.
//
// No process-wide state: every PolicyCache is independent; the lock is a
// file, the warning sink is the caller's.
#ifndef FUSEBOX_AUTOTUNE_POLICY_CACHE_H_
#define FUSEBOX_AUTOTUNE_POLICY_CACHE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bucketing/layout.h"
#include "bucketing/plan.h"

namespace fusebox::autotune {

inline constexpr int kPolicyFormatVersion = 1;
inline constexpr size_t kMaxPolicyFileBytes = size_t{64} << 20;
inline constexpr size_t kMaxPolicyBundleBytes = size_t{512} << 20;  // export files
inline constexpr int kMaxPolicyJsonDepth = 8;
inline constexpr size_t kMaxPolicyLabelBytes = 128;  // backend, network, model

// The model's identity for the cache: FNV-1a over the number of tensors
// and, in ready order, each tensor's element count and dtype (names and
// memory kinds are left out: the same architecture under another module
// path is the same model). 16 lowercase hex digits.
std::string ModelSignature(const bucketing::GradientLayout& layout);

// The policy cache directory every fusebox tool and the DDP hook use by
// default, from the values of $FUSEBOX_CACHE_DIR, $XDG_CACHE_HOME and $HOME
// (nullptr or empty: unset; the caller reads the environment): the first,
// else <second>/fusebox, else <third>/.cache/fusebox; empty when none is set.
std::string DefaultCacheDir(const char* fusebox_cache_dir, const char* xdg_cache_home,
                            const char* home);

// The backend family a cache key names: what reduces the buckets, so that
// a plan tuned offline for "nccl" serves a hook whose process group is NCCL.
// "torch-gloo" -> "gloo", "torch-nccl" -> "nccl" (the hook's process-group
// communicators), lower case; anything else is returned lower-cased.
std::string BackendFamily(absl::string_view backend);

struct CacheKey {
  std::string model_signature;  // ModelSignature(layout)
  int world_size = 1;
  int ranks_per_node = 1;
  std::string backend;   // BackendFamily(): "ucx", "mpi", "nccl", "gloo", ...
  std::string network;   // cost-model preset or network fingerprint, e.g. "local", "ib-400g"
  int format_version = kPolicyFormatVersion;

  // OK when the signature is 16 hex digits, 1 <= ranks_per_node <=
  // world_size <= 1<<24, and backend/network are non-empty, at most
  // kMaxPolicyLabelBytes, of [A-Za-z0-9._:+-] only.
  absl::Status Validate() const;
  // "<signature>-w<world>-r<rpn>-<backend>-<network>-v<version>.json"
  // (network's ':' and '+' become '_'). Call on a valid key.
  std::string FileName() const;
  friend bool operator==(const CacheKey& a, const CacheKey& b) {
    return a.model_signature == b.model_signature && a.world_size == b.world_size &&
           a.ranks_per_node == b.ranks_per_node && a.backend == b.backend &&
           a.network == b.network && a.format_version == b.format_version;
  }
};

struct CacheEntry {
  CacheKey key;
  std::string model;               // human label, e.g. "resnet50" (may be empty)
  uint64_t layout_hash = 0;        // GradientLayout::Hash of the layout the plan is for
  bucketing::Plan plan;
  // What the plan was chosen by (microseconds; 0 = unknown).
  double measured_iteration_us = 0;   // median, slowest rank; drift is judged against it
  double ddp_iteration_us = 0;        // the DDP default measured in the same run
  double predicted_iteration_us = 0;  // the simulator's figure
  int tuning_iterations = 0;
  std::string cost_model;          // description of the cost model used
  std::string fusebox_version;     // FUSEBOX_VERSION of the writer
  int64_t created_unix_s = 0;      // wall clock of the writer (passed in, not read here)
};

// Parses one entry file's text. Errors are InvalidArgument and name the
// field ("plan.buckets[2].slices[0][1]", "key.world_size", "version"):
// malformed JSON, a wrong format or version, missing or mistyped fields,
// out-of-range numbers, nesting deeper than kMaxPolicyJsonDepth, an invalid
// key. The plan's structure is checked (ParsePlan); validating it against a
// layout is Lookup's job.
absl::StatusOr<CacheEntry> ParseCacheEntry(absl::string_view json_text);
// The file form (indented JSON, deterministic for equal entries).
std::string SerializeCacheEntry(const CacheEntry& entry);

// Parses an export bundle's text (PolicyCache::Export's form, at most
// kMaxPolicyBundleBytes): an error for the bundle as a whole (malformed
// JSON, wrong format or version, no "entries" array), else one result per
// entry, in order: the entry, validated as Store would (key and plan
// structure), or why it is unusable ("entries" errors name the field).
absl::StatusOr<std::vector<absl::StatusOr<CacheEntry>>> ParseCacheBundle(
    absl::string_view json_text);

struct PolicyCacheOptions {
  std::string dir;  // created (with parents) when missing, unless read_only
  // Only look: the directory is neither created nor probed (a missing one
  // is an empty cache), and Store, Remove and Import fail. For listing and
  // exporting a cache without changing the file system.
  bool read_only = false;
  // Receives each warning (ignored files, disabled cache); may be empty.
  std::function<void(const std::string&)> warn;
  // Longest wait for the directory lock before a write gives up (Unavailable).
  absl::Duration lock_timeout = absl::Seconds(30);
};

// One file in the directory, for `fusebox-cache list`.
struct ListedEntry {
  std::string file;           // file name inside the directory
  absl::Status status;        // why the file is unusable, or OK
  std::optional<CacheEntry> entry;  // set when status is OK
};

class PolicyCache {
 public:
  // Never fails. A directory that cannot be created (or read) gives a
  // disabled cache (enabled() false) and one warning. An existing directory
  // this process cannot write (a cache an administrator tuned and shares
  // read-only on a cluster file system) is looked up but never written
  // (writable() false), with one warning.
  explicit PolicyCache(PolicyCacheOptions options);

  bool enabled() const { return enabled_; }
  // Store, Remove and Import can succeed (enabled, not read_only, and the
  // directory accepted a probe file when the cache opened).
  bool writable() const { return writable_; }
  const std::string& dir() const { return options_.dir; }

  // The entry for `key` whose plan is valid for `layout` (layout hash and
  // ValidatePlan), or nullopt: no file, or a file that is unusable (one
  // warning naming the file and the reason; the file is left for Store to
  // replace).
  std::optional<CacheEntry> Lookup(const CacheKey& key, const bucketing::GradientLayout& layout) const;

  // Among entries with the same key except world_size (and a plan valid
  // for `layout`), the one whose world size is nearest to key.world_size
  // in ratio (|log(w / key.world_size)|; ties: the larger world). nullopt
  // when there is none. Unusable files are skipped (with a warning).
  std::optional<CacheEntry> Nearest(const CacheKey& key, const bucketing::GradientLayout& layout) const;

  // Validates the entry (key, plan structure) and writes it atomically under
  // the directory lock, replacing any entry of the same key. Errors:
  // InvalidArgument for a bad entry, FailedPrecondition when disabled or
  // not writable, Unavailable for I/O or a lock not obtained in time.
  absl::Status Store(const CacheEntry& entry);

  // Every *.json file in the directory (temporary and lock files excluded),
  // sorted by file name, each parsed (status says why it is unusable).
  std::vector<ListedEntry> List() const;

  // Removes the entry file `file` (a name from List(), no path separators),
  // under the lock. NotFound when absent.
  absl::Status Remove(const std::string& file);

  // Every usable entry as one JSON bundle ({"format": "fusebox-policy-bundle",
  // "version": 1, "entries": [...]}); returns the number written via
  // `count`. Written atomically to `path`.
  absl::Status Export(const std::string& path, int* count) const;
  // Reads a bundle (bounded by kMaxPolicyBundleBytes), validates every
  // entry and stores each valid one (replacing same keys); invalid entries
  // are reported through warn and skipped. `imported` gets the number stored.
  absl::Status Import(const std::string& path, int* imported);

 private:
  void Warn(const std::string& message) const;
  // OK when Store, Remove and Import may write; else FailedPrecondition saying why.
  absl::Status CheckWritable() const;

  PolicyCacheOptions options_;
  bool enabled_ = false;
  bool writable_ = false;
};

}  // namespace fusebox::autotune

#endif  // FUSEBOX_AUTOTUNE_POLICY_CACHE_H_
