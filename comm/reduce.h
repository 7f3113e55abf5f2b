// Host reduction kernels used by the host backends' own algorithms.
#ifndef FUSEBOX_COMM_REDUCE_H_
#define FUSEBOX_COMM_REDUCE_H_

#include <cstddef>

#include "comm/types.h"

namespace fusebox::comm {

// out[i] = a[i] (op) b[i] for i < count. kAvg reduces as kSum (see
// FinishAvg). `out` may alias `a` or `b` exactly, not partially. Float types
// follow IEEE semantics (min/max propagate neither NaN specially); half and
// bfloat16 are computed in float and rounded to nearest even once per step.
// Memory-bound; auto-vectorised for float, double and integer types.
void Reduce(const void* a, const void* b, void* out, size_t count,
            DataType type, ReduceOp op);

// Turns a sum over `world` ranks into the average, in place: one division
// in the element type's arithmetic (integers truncate toward zero). A world
// of 1 leaves the data untouched (x / 1 == x) without a pass over it.
void FinishAvg(void* buf, size_t count, DataType type, int world);

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_REDUCE_H_
