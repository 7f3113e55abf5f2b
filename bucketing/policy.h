// PlanPolicy: what the engine consults between iterations about its plan.
//
// Note [The loop owns, the policy advises]
// The engine owns the iteration (its buffers, its statistics, when a plan
// may change); a policy only advises. Engine::StartIteration closes the
// previous iteration's whole time (one start to the next: forward, backward,
// the optimizer and whatever else the training loop does), hands its
// statistics to the policy, and installs the plan the policy returns, if
// any, before the new iteration begins. A fixed plan needs no policy; the
// online tuner (autotune/tuner.h) is one. Every rank's engine calls its
// policy at the same iteration, so a policy may run collectives on the
// engine's communicator, and must return the same answer on every rank.
#ifndef FUSEBOX_BUCKETING_POLICY_H_
#define FUSEBOX_BUCKETING_POLICY_H_

#include <optional>

#include "absl/status/statusor.h"
#include "bucketing/plan.h"

namespace fusebox::bucketing {

struct IterationStats;

class PlanPolicy {
 public:
  virtual ~PlanPolicy() = default;
  // Between iterations, on every rank in step (collective). `last` is the
  // iteration that just ended, with whole_us() set; `current` the plan it
  // ran. Returns the plan for the next iteration when it differs, nullopt to
  // keep the current one. An error fails the engine.
  virtual absl::StatusOr<std::optional<Plan>> OnIterationEnd(const IterationStats& last,
                                                             const Plan& current) = 0;
};

}  // namespace fusebox::bucketing

#endif  // FUSEBOX_BUCKETING_POLICY_H_
