// Every UCX algorithm unit (comm/ucx/algo/unit.h), listed once.
#ifndef FUSEBOX_COMM_UCX_ALGO_REGISTRY_H_
#define FUSEBOX_COMM_UCX_ALGO_REGISTRY_H_

#include "absl/types/span.h"
#include "comm/ucx/algo/unit.h"

namespace fusebox::comm::ucx {

// Every unit, in the order of Algorithm's values.
absl::Span<const AlgorithmUnit* const> AlgorithmUnits();

// The unit of `a` (every Algorithm has one; registry_test checks it).
const AlgorithmUnit& UnitOf(Algorithm a);

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_ALGO_REGISTRY_H_
