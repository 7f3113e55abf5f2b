// fusebox communicators bootstrapped from torch's own Store.
//
// A torch.distributed job already has a rendezvous: the c10d::Store that
// init_process_group connected (a TCPStore under torchrun). TorchStore
// adapts it to comm::Store, so that a fusebox communicator (UCX) can
// exchange its worker addresses through it instead of starting a second
// rendezvous; CreateCommunicatorOverTorchStore builds one.
#ifndef FUSEBOX_PLUGINS_TORCH_TORCH_STORE_H_
#define FUSEBOX_PLUGINS_TORCH_TORCH_STORE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "comm/options.h"
#include "comm/store.h"
#include "torch/csrc/distributed/c10d/Store.hpp"

namespace fusebox::torch_plugin {

// comm::Store over a c10d::Store. Keys and values are validated as by every
// fusebox store (comm::ValidateStoreKey / ValidateStoreValue); torch's
// exceptions become statuses: a wait that runs past its deadline is
// DeadlineExceeded naming the keys still missing, anything else Unavailable
// with torch's message. Thread-safe when the c10d store is (TCPStore,
// FileStore, HashStore and PrefixStore are).
class TorchStore final : public comm::Store {
 public:
  explicit TorchStore(c10::intrusive_ptr<::c10d::Store> store) : store_(std::move(store)) {}

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Time deadline) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::Status Wait(absl::Span<const std::string> keys, absl::Time deadline) override;
  absl::StatusOr<bool> Check(absl::string_view key) override;

 private:
  const c10::intrusive_ptr<::c10d::Store> store_;
};

struct TorchStoreCommOptions {
  std::string backend = "ucx";  // a comm::CreateCommunicator backend name
  // Keys go under this prefix in the torch store; it must be the same on
  // every rank and differ between communicators of one job.
  std::string prefix = "fusebox";
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  absl::Duration timeout = absl::Seconds(300);  // rendezvous
  comm::BackendOptions backend_options;
};

// Collective over `options.size` ranks: creates a fusebox communicator whose
// rendezvous runs through `store` (wrapped in a c10d::PrefixStore). The
// returned communicator owns the rendezvous it needs. The NCCL backend
// works on device memory, which the DDP hook does not take yet: the hook
// refuses it before calling this.
absl::StatusOr<std::shared_ptr<comm::Communicator>> CreateCommunicatorOverTorchStore(
    c10::intrusive_ptr<::c10d::Store> store, const TorchStoreCommOptions& options);

}  // namespace fusebox::torch_plugin

#endif  // FUSEBOX_PLUGINS_TORCH_TORCH_STORE_H_
