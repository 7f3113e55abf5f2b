#include "comm/store.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fusebox::comm {
namespace {

// Error messages list at most this many keys or ranks, then a count, so that
// a 4096-rank job does not produce a 40 KB status message.
constexpr size_t kMaxListed = 16;
constexpr size_t kMaxShownKeyBytes = 128;

// Rounds a budget for display: "5s" rather than "4.999987s" when the caller
// computed the deadline as Now() + 5s a few microseconds before we looked.
absl::Duration ForDisplay(absl::Duration d) {
  if (d == absl::InfiniteDuration() || d < absl::Milliseconds(10)) return d;
  return absl::Floor(d + absl::Milliseconds(5), absl::Milliseconds(10));
}

// 'key' C-escaped, truncated to kMaxShownKeyBytes.
std::string Quoted(absl::string_view key) {
  if (key.size() <= kMaxShownKeyBytes) {
    return absl::StrCat("'", absl::CHexEscape(key), "'");
  }
  return absl::StrCat("'", absl::CHexEscape(key.substr(0, kMaxShownKeyBytes)),
                      "...' (", key.size(), " bytes)");
}

}  // namespace

absl::Status ValidateStoreKey(absl::string_view key) {
  if (key.size() > kMaxStoreKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store key of ", key.size(), " bytes exceeds the limit of ",
        kMaxStoreKeyBytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status ValidateStoreValue(absl::string_view key,
                                absl::string_view value) {
  if (value.size() > kMaxStoreValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store value of ", value.size(), " bytes for key ", Quoted(key),
        " exceeds the limit of ", kMaxStoreValueBytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status MissingKeysError(absl::string_view op,
                              absl::Span<const std::string> missing,
                              size_t total, absl::Duration waited) {
  std::vector<std::string> listed;
  for (size_t i = 0; i < missing.size() && i < kMaxListed; ++i) {
    listed.push_back(Quoted(missing[i]));
  }
  std::string more;
  if (missing.size() > kMaxListed) {
    more = absl::StrCat(", ... (", missing.size() - kMaxListed, " more)");
  }
  const std::string within =
      absl::StrCat("within ", absl::FormatDuration(ForDisplay(waited)));
  if (total == 1 && missing.size() == 1) {
    return absl::DeadlineExceededError(absl::StrCat(
        "store ", op, ": key ", listed[0], " was not set ", within));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "store ", op, ": ", missing.size(), " of ", total, " keys not set ",
      within, ": ", absl::StrJoin(listed, ", "), more));
}

// ---------------------------------------------------------------------------
// PrefixStore

std::string PrefixStore::Full(absl::string_view key) const {
  return absl::StrCat(prefix_, key);
}

absl::Status PrefixStore::Set(absl::string_view key, absl::string_view value) {
  return base_.Set(Full(key), value);
}

absl::StatusOr<std::string> PrefixStore::Get(absl::string_view key,
                                             absl::Time deadline) {
  return base_.Get(Full(key), deadline);
}

absl::StatusOr<int64_t> PrefixStore::Add(absl::string_view key, int64_t delta) {
  return base_.Add(Full(key), delta);
}

absl::Status PrefixStore::Wait(absl::Span<const std::string> keys,
                               absl::Time deadline) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const std::string& k : keys) full.push_back(Full(k));
  return base_.Wait(full, deadline);
}

absl::StatusOr<bool> PrefixStore::Check(absl::string_view key) {
  return base_.Check(Full(key));
}

// ---------------------------------------------------------------------------
// StoreAllGather

absl::StatusOr<std::vector<std::string>> StoreAllGather(Store& store,
                                                        absl::string_view name,
                                                        int rank, int size,
                                                        absl::string_view value,
                                                        absl::Time deadline) {
  if (size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous '", name, "': world size must be >= 1, got ", size));
  }
  if (rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous '", name, "': rank ", rank,
                     " is out of range [0, ", size, ")"));
  }
  const absl::Duration budget = deadline - absl::Now();

  if (absl::Status s = store.Set(absl::StrCat(rank), value); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("rendezvous '", name, "': rank ", rank,
                                     " could not publish: ", s.message()));
  }
  std::vector<std::string> keys;
  keys.reserve(size);
  for (int r = 0; r < size; ++r) keys.push_back(absl::StrCat(r));

  absl::Status waited = store.Wait(keys, deadline);
  if (absl::IsDeadlineExceeded(waited)) {
    // Name the ranks, not the keys: "ranks 2, 3 of 4 did not arrive".
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      absl::StatusOr<bool> present = store.Check(keys[r]);
      if (!present.ok()) {
        return absl::Status(
            present.status().code(),
            absl::StrCat("rendezvous '", name, "': timed out, then could not ",
                         "check rank ", r, ": ", present.status().message()));
      }
      if (!*present) missing.push_back(r);
    }
    if (!missing.empty()) {
      std::vector<int> listed(
          missing.begin(),
          missing.begin() + std::min(missing.size(), kMaxListed));
      std::string more;
      if (missing.size() > kMaxListed) {
        more = absl::StrCat(", ... (", missing.size(), " missing in all)");
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "rendezvous '", name, "': ", missing.size() == 1 ? "rank " : "ranks ",
          absl::StrJoin(listed, ", "), more, " of ", size,
          " did not arrive within ", absl::FormatDuration(ForDisplay(budget))));
    }
    // Every rank arrived between the timeout and the check: carry on; the
    // Gets below return at once for keys that are set.
  } else if (!waited.ok()) {
    return absl::Status(waited.code(), absl::StrCat("rendezvous '", name,
                                                    "': ", waited.message()));
  }

  std::vector<std::string> values;
  values.reserve(size);
  for (int r = 0; r < size; ++r) {
    absl::StatusOr<std::string> v = store.Get(keys[r], deadline);
    if (!v.ok()) {
      return absl::Status(v.status().code(),
                          absl::StrCat("rendezvous '", name, "': rank ", r,
                                       ": ", v.status().message()));
    }
    values.push_back(*std::move(v));
  }
  return values;
}

}  // namespace fusebox::comm
