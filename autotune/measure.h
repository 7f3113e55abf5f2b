// Measuring the allreduce cost on a live communicator, for fitting a
// CostModel (cost_model.h) on the cluster at hand.
#ifndef FUSEBOX_AUTOTUNE_MEASURE_H_
#define FUSEBOX_AUTOTUNE_MEASURE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "autotune/cost_model.h"
#include "comm/communicator.h"
#include "comm/device.h"

namespace fusebox::autotune {

// 4 KiB, 32 KiB, ... (x8) up to max_bytes, plus max_bytes itself; fp32
// sizes (multiples of 4).
std::vector<int64_t> CalibrationSizes(int64_t max_bytes);

// Collective (every rank, same arguments): for each size, one warm-up and
// `reps` timed fp32 averaging allreduces, each preceded by a barrier; a
// repetition counts as the slowest rank's time and the sample is the
// median over repetitions, so every rank returns the same samples.
// Each call runs on the next page-aligned part of one buffer of
// max(largest size, working_set_bytes) bytes, in turn, so that where the
// working set (a model's gradients) is larger than the caches every call
// finds its data in memory, as a plan's buckets do (Note [Timing on data
// out of cache]); 0 times every call on the buffer's start.
absl::StatusOr<std::vector<AllReduceSample>> MeasureAllReduce(comm::Communicator& comm,
                                                              const std::vector<int64_t>& sizes,
                                                              int reps,
                                                              int64_t working_set_bytes = 0);

// Collective: the host memcpy bandwidth (GB/s) every rank gets while all
// copy at once (what the engine's copies in and out compete for): each rank
// copies `bytes` three times after a barrier; the slowest copy of the
// slowest rank counts.
absl::StatusOr<double> MeasureCopyGbps(comm::Communicator& comm, int64_t bytes);

// Collective: the staging bandwidth (GB/s) for device gradients over a
// host communicator (SimOptions::staging_gbps): each rank copies `bytes`
// device-to-host into pinned host memory and back on one stream of
// `device`, three times after a barrier, every rank at once (ranks that
// share a GPU share its copy engines); the slowest copy in either
// direction of the slowest rank counts. Where the device fails on one rank
// (allocation, stream or copy), every rank returns an error: that rank the
// device's, the others one saying another rank's failed.
absl::StatusOr<double> MeasureStagingGbps(comm::Communicator& comm, comm::Device& device,
                                          int64_t bytes);

// Element-wise maximum across ranks, in place (the slowest rank decides).
absl::Status MaxAcrossRanks(comm::Communicator& comm, std::vector<double>& values);

// Rank `root`'s `data` on every rank. Receivers refuse more than
// `max_bytes`. Every wait has `timeout`.
absl::Status BroadcastBytes(comm::Communicator& comm, std::string& data, int root,
                            size_t max_bytes, absl::Duration timeout);

double Median(std::vector<double> values);

}  // namespace fusebox::autotune

#endif  // FUSEBOX_AUTOTUNE_MEASURE_H_
