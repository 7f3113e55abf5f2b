// Element types and reduction operators understood by every comm backend.
#ifndef FUSEBOX_COMM_TYPES_H_
#define FUSEBOX_COMM_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fusebox::comm {

enum class DataType : uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kUInt8 = 6,
};
inline constexpr int kNumDataTypes = 7;

enum class ReduceOp : uint8_t {
  kSum = 0,
  kAvg = 1,
  kMin = 2,
  kMax = 3,
  kProd = 4,
};
inline constexpr int kNumReduceOps = 5;

// Every type and every operator, for sweeps and tests.
inline constexpr DataType kAllDataTypes[] = {
    DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
    DataType::kInt32,   DataType::kInt64,   DataType::kUInt8};
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin,
                                             ReduceOp::kMax, ReduceOp::kProd};

// Size of one element in bytes.
size_t DataTypeSize(DataType t);

// Short lower-case names as used by nccl-tests ("float", "double", "half",
// "bfloat16", "int32", "int64", "uint8") and "sum", "avg", "min", "max",
// "prod". Parse* also accept the aliases "float32", "float64", "float16",
// "bf16", "int", "long".
absl::string_view DataTypeName(DataType t);
absl::string_view ReduceOpName(ReduceOp op);
absl::StatusOr<DataType> ParseDataType(absl::string_view name);
absl::StatusOr<ReduceOp> ParseReduceOp(absl::string_view name);

// The collectives of comm/communicator.h, for backends that describe or
// dispatch them; the values are part of the UCX header's wire format.
enum class CollectiveKind : uint8_t { kAllReduce = 1, kBroadcast = 2, kAllGather = 3, kBarrier = 4 };

// One collective's arguments, as the front door (Note [One front door] in
// comm/communicator.h) hands them to a backend and a backend to its core.
// Broadcast: send == recv == its buffer; Barrier: no buffers. op and root
// matter only where the kind has them.
struct CollectiveArgs {
  CollectiveKind kind = CollectiveKind::kBarrier;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  DataType type = DataType::kUInt8;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
};

// "AllReduce", "Broadcast", "AllGather", "Barrier".
absl::string_view CollectiveKindName(CollectiveKind k);

// OK when `t` and `op` name a known type and operator (values cast from
// integers read off the wire or a command line may not). Every known pair is
// supported. Avg divides the exact sum by the world size once, at the end,
// in the element type's arithmetic (integer types truncate toward zero, as
// NCCL's ncclAvg does).
absl::Status CheckSupported(DataType t, ReduceOp op);

// IEEE half and bfloat16 conversions (round to nearest even), shared by the
// reduction kernels and the tests' references.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_TYPES_H_
