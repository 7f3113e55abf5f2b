// An in-process communicator: the ranks of one group are threads of this
// process, and a collective runs once every rank has issued it. For tests
// of what sits above the communication layer (the engine, the tuner, the
// plugins): no transport, no store, no network, and results that are exact
// by construction (rank-order reduction in one place), so a failure points
// at the caller, not at a backend.
//
//   auto comms = CreateLoopbackGroup(world);  // world communicators, rank r at [r]
//   // thread r: (*comms)[r]->AllReduce(...)
//
// Note [Loopback semantics]
// It keeps the contract of comm/communicator.h as the real backends do, so
// that code tested on it behaves the same on them:
// * Calls return at once; one executor thread per group runs the
//   collectives in issue order and completes each rank's Work, so
//   completion callbacks run on a backend thread (never the caller's),
//   exactly as with UCX and MPI.
// * The i-th call of every rank is the i-th collective. The executor
//   compares the calls of all ranks before touching any buffer; a mismatch
//   fails the collective on every rank with the same message ("collective
//   mismatch across ranks: rank 0 called AllReduce(count=4, ...) but rank 1
//   called ..."), as the UCX backend words it.
// * Failures are sticky: after a mismatch, a timeout or a rank leaving, the
//   pending and every later call of every rank fail with that status.
// * A collective that some rank has not issued within `timeout` of the first
//   rank's call fails with DeadlineExceeded naming the ranks that did not.
//   A rank whose communicator is destroyed leaves the group; collectives
//   waiting for it fail at once (Aborted) rather than at the deadline.
// It is not a model of any transport's speed: timings measured on it say
// nothing about a real backend.
#ifndef FUSEBOX_COMM_TESTING_LOOPBACK_H_
#define FUSEBOX_COMM_TESTING_LOOPBACK_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"

namespace fusebox::comm::testing {

struct LoopbackOptions {
  // How long a collective may wait for its last rank (Note [Loopback
  // semantics]); must be positive.
  absl::Duration timeout = absl::Minutes(1);
};

// The `world` communicators of one group (world >= 1), rank r at index r.
// Each may be used from any thread and destroyed independently; the group's
// executor stops when the last is destroyed. None may be destroyed from a
// completion callback.
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateLoopbackGroup(
    int world, const LoopbackOptions& options = {});

}  // namespace fusebox::comm::testing

#endif  // FUSEBOX_COMM_TESTING_LOOPBACK_H_
