// The UCX backend's checks of its options, before any rendezvous.
#ifndef FUSEBOX_COMM_UCX_OPTIONS_H_
#define FUSEBOX_COMM_UCX_OPTIONS_H_

#include "absl/status/status.h"
#include "comm/options.h"

namespace fusebox::comm::ucx {

// InvalidArgument naming the first option out of its range for a world of
// `size` ranks (or the rank out of the world); OK otherwise.
absl::Status ValidateUcxOptions(const UcxOptions& options, int rank, int size);

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_OPTIONS_H_
