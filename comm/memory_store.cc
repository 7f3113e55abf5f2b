#include "comm/memory_store.h"

#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace fusebox::comm {
namespace {

// Waits on `cv` until `ready()` or `deadline`; returns ready(). `lock` holds
// the mutex `cv` is used with.
template <typename Pred>
bool WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
               absl::Time deadline, Pred ready) {
  if (deadline == absl::InfiniteFuture()) {
    cv.wait(lock, ready);
    return true;
  }
  return cv.wait_until(lock, absl::ToChronoTime(deadline), ready);
}

}  // namespace

absl::Status MemoryStore::Set(absl::string_view key, absl::string_view value) {
  if (absl::Status s = ValidateStoreKey(key); !s.ok()) return s;
  if (absl::Status s = ValidateStoreValue(key, value); !s.ok()) return s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = std::string(value);
  }
  cv_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::string> MemoryStore::Get(absl::string_view key,
                                             absl::Time deadline) {
  if (absl::Status s = ValidateStoreKey(key); !s.ok()) return s;
  const absl::Time start = absl::Now();
  std::unique_lock<std::mutex> lock(mu_);
  auto present = [&] { return data_.contains(key); };
  if (!WaitUntil(cv_, lock, deadline, present)) {
    const std::string k(key);
    return MissingKeysError("get", absl::MakeConstSpan(&k, 1), 1,
                            deadline - start);
  }
  return data_.find(key)->second;
}

absl::StatusOr<int64_t> MemoryStore::Add(absl::string_view key, int64_t delta) {
  if (absl::Status s = ValidateStoreKey(key); !s.ok()) return s;
  int64_t result = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    int64_t current = 0;
    if (it != data_.end() && !absl::SimpleAtoi(it->second, &current)) {
      return absl::InvalidArgumentError(
          absl::StrCat("store add: key '", absl::CHexEscape(key.substr(0, 128)),
                       "' holds a value that is not a decimal integer (",
                       it->second.size(), " bytes)"));
    }
    if (__builtin_add_overflow(current, delta, &result)) {
      return absl::OutOfRangeError(
          absl::StrCat("store add: key '", absl::CHexEscape(key.substr(0, 128)),
                       "': ", current, " + ", delta, " overflows int64"));
    }
    data_[key] = absl::StrCat(result);
  }
  cv_.notify_all();
  return result;
}

absl::Status MemoryStore::Wait(absl::Span<const std::string> keys,
                               absl::Time deadline) {
  for (const std::string& k : keys) {
    if (absl::Status s = ValidateStoreKey(k); !s.ok()) return s;
  }
  const absl::Time start = absl::Now();
  std::unique_lock<std::mutex> lock(mu_);
  auto all_present = [&] {
    for (const std::string& k : keys) {
      if (!data_.contains(k)) return false;
    }
    return true;
  };
  if (WaitUntil(cv_, lock, deadline, all_present)) return absl::OkStatus();
  std::vector<std::string> missing;
  for (const std::string& k : keys) {
    if (!data_.contains(k)) missing.push_back(k);
  }
  return MissingKeysError("wait", missing, keys.size(), deadline - start);
}

absl::StatusOr<bool> MemoryStore::Check(absl::string_view key) {
  if (absl::Status s = ValidateStoreKey(key); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  return data_.contains(key);
}

}  // namespace fusebox::comm
