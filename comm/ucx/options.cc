// The UCX backend's checks of its options. See options.h.
#include "comm/ucx/options.h"

#include <cstddef>

#include "absl/strings/str_cat.h"
#include "comm/communicator.h"
#include "comm/ucx/channel.h"

namespace fusebox::comm::ucx {

absl::Status ValidateUcxOptions(const UcxOptions& options, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid rank ", rank, " for world size ", size));
  }
  if (options.chunk_bytes < 64 || options.chunk_bytes > (1u << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("UCX chunk_bytes must be in [64, 1 GiB], got ", options.chunk_bytes));
  }
  if (options.shm_chunk_bytes < 64 || options.shm_chunk_bytes > (64u << 20) ||
      options.shm_chunk_bytes % 64 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UCX shm_chunk_bytes must be a multiple of 64 in [64, 64 MiB], got ",
        options.shm_chunk_bytes));
  }
  if (options.small_message_bytes > (64u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UCX small_message_bytes must be at most 64 MiB, got ", options.small_message_bytes));
  }
  // Rank 0 of the linear round stages a message from every rank.
  constexpr size_t kLinearStagingLimit = size_t{256} << 20;
  if (options.linear_bytes > (1u << 20) ||
      (size > 1 && options.linear_bytes > kLinearStagingLimit / static_cast<size_t>(size - 1))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UCX linear_bytes must be at most 1 MiB and, times the ranks but one, at most 256 MiB "
        "(rank 0 of the linear round stages a message from every rank); got ",
        options.linear_bytes, " with ", size, " ranks"));
  }
  // The measured classes reach up to this much (Note [Measured choice]);
  // what the rounds carry stays within carried_bytes and, for the linear
  // round, kMeasuredLinearMaxBytes.
  if (options.measured_choice_bytes > (1u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UCX measured_choice_bytes must be at most 1 MiB, got ", options.measured_choice_bytes));
  }
  if (options.recursive_doubling_bytes > (64u << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("UCX recursive_doubling_bytes must be at most 64 MiB, got ",
                     options.recursive_doubling_bytes));
  }
  if (options.rabenseifner_bytes > (64u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UCX rabenseifner_bytes must be at most 64 MiB, got ", options.rabenseifner_bytes));
  }
  if (absl::Status s = ValidateCollectiveTimeout("UCX", options.timeout); !s.ok()) return s;
  if (size > kMaxWorld) {
    return absl::InvalidArgumentError(
        absl::StrCat("the UCX communicator supports at most ", kMaxWorld,
                     " ranks (its ring's step numbers must fit its tags), got ", size));
  }
  return absl::OkStatus();
}

}  // namespace fusebox::comm::ucx
