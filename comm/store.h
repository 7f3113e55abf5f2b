// comm::Store: the key-value rendezvous ranks use to find each other
// (exchange UCX worker addresses, the NCCL unique id). Gloo's
// rendezvous/store.h and c10d's Store are the models.
#ifndef FUSEBOX_COMM_STORE_H_
#define FUSEBOX_COMM_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace fusebox::comm {

// Limits every Store implementation enforces (and the TCP store checks on
// the wire): longer keys or values are rejected with InvalidArgument.
inline constexpr size_t kMaxStoreKeyBytes = 4096;
inline constexpr size_t kMaxStoreValueBytes = 16u << 20;

// Thread-safe. Keys are opaque byte strings.
class Store {
 public:
  virtual ~Store() = default;

  // Sets (or overwrites) `key`.
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;

  // Returns the value of `key`, waiting for it to be set until `deadline`;
  // DeadlineExceeded names the key.
  virtual absl::StatusOr<std::string> Get(absl::string_view key,
                                          absl::Time deadline) = 0;

  // Atomically adds `delta` to the integer stored at `key` (absent = 0) and
  // returns the new value. The value is stored as decimal text.
  virtual absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) = 0;

  // Waits until every key in `keys` is set. DeadlineExceeded lists the keys
  // still missing at the deadline.
  virtual absl::Status Wait(absl::Span<const std::string> keys,
                            absl::Time deadline) = 0;

  // True if `key` is set now. Never blocks on the key.
  virtual absl::StatusOr<bool> Check(absl::string_view key) = 0;
};

// Prepends "<prefix>/" to every key; does not own `base`.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, Store& base)
      : prefix_(std::move(prefix) + "/"), base_(base) {}
  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key,
                                  absl::Time deadline) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::Status Wait(absl::Span<const std::string> keys,
                    absl::Time deadline) override;
  absl::StatusOr<bool> Check(absl::string_view key) override;

 private:
  std::string Full(absl::string_view key) const;
  const std::string prefix_;
  Store& base_;
};

// Every rank publishes `value` under "<rank>" and receives all ranks' values
// in rank order. On timeout the error names the ranks that never arrived,
// e.g. "rendezvous 'ucx/addr': ranks 2, 3 of 4 did not arrive within 5s".
// `name` is used in messages only; callers scope keys with a PrefixStore.
absl::StatusOr<std::vector<std::string>> StoreAllGather(
    Store& store, absl::string_view name, int rank, int size,
    absl::string_view value, absl::Time deadline);

// For Store implementations: InvalidArgument naming the size and the limit
// if `key` (or `value`) exceeds kMaxStoreKeyBytes (kMaxStoreValueBytes).
absl::Status ValidateStoreKey(absl::string_view key);
absl::Status ValidateStoreValue(absl::string_view key, absl::string_view value);

// For Store implementations: the DeadlineExceeded status of a Get or Wait
// that gave up, naming (C-escaped, at most 16 listed) the keys in `missing`
// out of `total` requested, e.g. "store wait: 2 of 4 keys not set within 5s:
// 'rdv/2', 'rdv/3'". `op` is "get" or "wait"; `waited` is the caller's budget.
// Keys longer than 128 bytes are shown truncated.
absl::Status MissingKeysError(absl::string_view op,
                              absl::Span<const std::string> missing,
                              size_t total, absl::Duration waited);

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_STORE_H_
