// The list of UCX algorithm units. Adding an algorithm: a value of
// Algorithm (comm/ucx/algorithms.h), its unit in a file of its own under
// comm/ucx/algo/ (and comm/CMakeLists.txt), declared in registry.h, and one
// line below.
#include "comm/ucx/algo/registry.h"

#include <cstdlib>

#include "comm/ucx/algo/recursive_doubling.h"
#include "comm/ucx/algo/shm_allreduce.h"

namespace fusebox::comm::ucx {
namespace {

constexpr const AlgorithmUnit* kUnits[] = {
    &kBarrierUnit,
    &kOneShotUnit,
    &kLocalUnit,
    &kShmAllReduceUnit,
    &kRingAllReduceUnit,
    &kRecursiveDoublingUnit,
    &kLinearAllReduceUnit,
    &kRabenseifnerUnit,
    &kChainBroadcastUnit,
    &kRingAllGatherUnit,
};

}  // namespace

absl::Span<const AlgorithmUnit* const> AlgorithmUnits() { return kUnits; }

const AlgorithmUnit& UnitOf(Algorithm a) {
  for (const AlgorithmUnit* u : kUnits) {
    if (u->algorithm == a) return *u;
  }
  std::abort();  // a broken invariant: every Algorithm has a unit (registry_test)
}

}  // namespace fusebox::comm::ucx
