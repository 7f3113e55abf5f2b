#include "plugins/torch/torch_store.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/backends.h"
#include "comm/rendezvous.h"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"

namespace fusebox::torch_plugin {
namespace {

// c10d's waits take a relative timeout in whole milliseconds, rounded up so
// that c10d never gives up before `deadline`; 0 means "no timeout" to c10d,
// so a deadline already past becomes 1 ms.
std::chrono::milliseconds Remaining(absl::Time deadline) {
  const int64_t ms = absl::ToInt64Milliseconds(
      absl::Ceil(deadline - absl::Now(), absl::Milliseconds(1)));
  return std::chrono::milliseconds(std::max<int64_t>(ms, 1));
}

absl::Status TorchError(absl::string_view op, absl::string_view key, const std::exception& e) {
  return absl::UnavailableError(
      absl::StrCat("torch store ", op, "('", key, "') failed: ", e.what()));
}

}  // namespace

absl::Status TorchStore::Set(absl::string_view key, absl::string_view value) {
  if (absl::Status s = comm::ValidateStoreKey(key); !s.ok()) return s;
  if (absl::Status s = comm::ValidateStoreValue(key, value); !s.ok()) return s;
  try {
    store_->set(std::string(key), std::vector<uint8_t>(value.begin(), value.end()));
  } catch (const std::exception& e) {
    return TorchError("set", key, e);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> TorchStore::Get(absl::string_view key, absl::Time deadline) {
  const std::string k(key);
  if (absl::Status s = Wait({k}, deadline); !s.ok()) return s;
  std::vector<uint8_t> v;
  try {
    v = store_->get(k);
  } catch (const std::exception& e) {
    return TorchError("get", key, e);
  }
  if (v.size() > comm::kMaxStoreValueBytes) {
    return absl::OutOfRangeError(absl::StrCat("torch store value of '", key, "' is ", v.size(),
                                              " bytes, more than the limit of ",
                                              comm::kMaxStoreValueBytes));
  }
  return std::string(v.begin(), v.end());
}

absl::StatusOr<int64_t> TorchStore::Add(absl::string_view key, int64_t delta) {
  if (absl::Status s = comm::ValidateStoreKey(key); !s.ok()) return s;
  try {
    return store_->add(std::string(key), delta);
  } catch (const std::exception& e) {
    return TorchError("add", key, e);
  }
}

absl::Status TorchStore::Wait(absl::Span<const std::string> keys, absl::Time deadline) {
  for (const std::string& k : keys) {
    if (absl::Status s = comm::ValidateStoreKey(k); !s.ok()) return s;
  }
  if (keys.empty()) return absl::OkStatus();
  const absl::Time start = absl::Now();
  try {
    store_->wait(std::vector<std::string>(keys.begin(), keys.end()), Remaining(deadline));
    return absl::OkStatus();
  } catch (const std::exception& e) {
    // c10d reports a timeout and a broken connection alike (c10::Error);
    // tell them apart by asking which keys are missing.
    std::vector<std::string> missing;
    try {
      for (const std::string& k : keys) {
        if (!store_->check({k})) missing.push_back(k);
      }
    } catch (const std::exception& e2) {
      return TorchError("wait", keys.front(), e2);
    }
    // Keys still missing after c10d gave up: the deadline's error, naming
    // them (Remaining() never lets c10d give up early). None missing: the
    // connection failed.
    if (missing.empty()) return TorchError("wait", keys.front(), e);
    return comm::MissingKeysError("torch store wait", missing, keys.size(), absl::Now() - start);
  }
}

absl::StatusOr<bool> TorchStore::Check(absl::string_view key) {
  if (absl::Status s = comm::ValidateStoreKey(key); !s.ok()) return s;
  try {
    return store_->check({std::string(key)});
  } catch (const std::exception& e) {
    return TorchError("check", key, e);
  }
}

absl::StatusOr<std::shared_ptr<comm::Communicator>> CreateCommunicatorOverTorchStore(
    c10::intrusive_ptr<::c10d::Store> store, const TorchStoreCommOptions& options) {
  if (store == nullptr) return absl::InvalidArgumentError("torch store is null");
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " out of range for world size ", options.size));
  }
  if (options.prefix.empty()) return absl::InvalidArgumentError("store prefix is empty");
  // The communicator and the rendezvous it was built from, destroyed in that
  // order (members are destroyed in reverse).
  struct Owned {
    comm::Rendezvous rdv;
    std::unique_ptr<comm::Communicator> comm;
  };
  auto owned = std::make_shared<Owned>();
  owned->rdv.rank = options.rank;
  owned->rdv.size = options.size;
  owned->rdv.local_rank = options.local_rank;
  owned->rdv.store = std::make_unique<TorchStore>(
      c10::make_intrusive<::c10d::PrefixStore>(options.prefix, std::move(store)));
  comm::BackendOptions backend_options = options.backend_options;
  backend_options.ucx.rendezvous_timeout = options.timeout;
  backend_options.nccl.rendezvous_timeout = options.timeout;
  auto comm = comm::CreateCommunicator(options.backend, backend_options, owned->rdv);
  if (!comm.ok()) return comm.status();
  owned->comm = *std::move(comm);
  comm::Communicator* raw = owned->comm.get();
  return std::shared_ptr<comm::Communicator>(std::move(owned), raw);
}

}  // namespace fusebox::torch_plugin
