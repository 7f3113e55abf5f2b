// In-memory Store for ranks that are threads of one process (unit tests).
#ifndef FUSEBOX_COMM_MEMORY_STORE_H_
#define FUSEBOX_COMM_MEMORY_STORE_H_

#include <condition_variable>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "comm/store.h"

namespace fusebox::comm {

class MemoryStore final : public Store {
 public:
  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key,
                                  absl::Time deadline) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::Status Wait(absl::Span<const std::string> keys,
                    absl::Time deadline) override;
  absl::StatusOr<bool> Check(absl::string_view key) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  absl::flat_hash_map<std::string, std::string> data_;  // guarded by mu_
};

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_MEMORY_STORE_H_
