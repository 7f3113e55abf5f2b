// Verifiable collective data: inputs whose reduction is exact in any order
// (small integers for sum/avg, 1s and 2s for prod, anything for min/max), and
// an independent reference computed element by element in wide arithmetic.
// Shared by the tests and fusebox-perf (nccl-tests' approach).
#ifndef FUSEBOX_COMM_TESTING_EXACT_DATA_H_
#define FUSEBOX_COMM_TESTING_EXACT_DATA_H_

#include <cstddef>
#include <cstdint>

#include "comm/types.h"

namespace fusebox::comm::testing {

// The value rank `rank` contributes at element `i` for `op`, as a double
// (always exactly representable in every DataType).
double InputValue(ReduceOp op, DataType type, int rank, size_t i);

// Writes `count` input elements for (`rank`, `op`) into `out` (host memory).
// `seed` shifts the pattern so that successive iterations differ.
void FillInput(void* out, size_t count, DataType type, ReduceOp op, int rank,
               uint64_t seed = 0);

// Writes the expected reduction over `world` ranks into `out`.
void FillExpected(void* out, size_t count, DataType type, ReduceOp op,
                  int world, uint64_t seed = 0);

// Number of elements whose bit patterns differ.
size_t CountMismatches(const void* got, const void* want, size_t count,
                       DataType type);

// Stores `v` (exactly representable) as one element of `type` at out[i].
void StoreElement(void* out, size_t i, DataType type, double v);
double LoadElement(const void* in, size_t i, DataType type);

}  // namespace fusebox::comm::testing

#endif  // FUSEBOX_COMM_TESTING_EXACT_DATA_H_
