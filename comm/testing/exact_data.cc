#include "comm/testing/exact_data.h"

#include <cmath>
#include <cstring>

namespace fusebox::comm::testing {
namespace {

bool IsSigned(DataType t) { return t != DataType::kUInt8; }

}  // namespace

double InputValue(ReduceOp op, DataType type, int rank, size_t i) {
  const uint64_t k = static_cast<uint64_t>(i) * 2654435761u + static_cast<uint64_t>(rank) * 40503u;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      // 0..7 (signed types: -3..4): sums over <= 32 ranks stay exact even in
      // bfloat16 (8 significant bits) and uint8.
      return static_cast<double>((k >> 7) % 8) - (IsSigned(type) ? 3.0 : 0.0);
    case ReduceOp::kProd:
      // 1 or 2 (signed types may be -1): products over <= 7 ranks are exact.
      if (IsSigned(type) && ((k >> 11) % 5) == 0) return -1.0;
      return 1.0 + static_cast<double>((k >> 9) % 2);
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return static_cast<double>((k >> 5) % 200) - (IsSigned(type) ? 100.0 : 0.0);
  }
  return 0;
}

void StoreElement(void* out, size_t i, DataType type, double v) {
  switch (type) {
    case DataType::kFloat32: static_cast<float*>(out)[i] = static_cast<float>(v); break;
    case DataType::kFloat64: static_cast<double*>(out)[i] = v; break;
    case DataType::kFloat16: static_cast<uint16_t*>(out)[i] = FloatToHalf(static_cast<float>(v)); break;
    case DataType::kBFloat16: static_cast<uint16_t*>(out)[i] = FloatToBFloat16(static_cast<float>(v)); break;
    case DataType::kInt32: static_cast<int32_t*>(out)[i] = static_cast<int32_t>(v); break;
    case DataType::kInt64: static_cast<int64_t*>(out)[i] = static_cast<int64_t>(v); break;
    case DataType::kUInt8: static_cast<uint8_t*>(out)[i] = static_cast<uint8_t>(v); break;
  }
}

double LoadElement(const void* in, size_t i, DataType type) {
  switch (type) {
    case DataType::kFloat32: return static_cast<const float*>(in)[i];
    case DataType::kFloat64: return static_cast<const double*>(in)[i];
    case DataType::kFloat16: return HalfToFloat(static_cast<const uint16_t*>(in)[i]);
    case DataType::kBFloat16: return BFloat16ToFloat(static_cast<const uint16_t*>(in)[i]);
    case DataType::kInt32: return static_cast<const int32_t*>(in)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const int64_t*>(in)[i]);
    case DataType::kUInt8: return static_cast<const uint8_t*>(in)[i];
  }
  return 0;
}

void FillInput(void* out, size_t count, DataType type, ReduceOp op, int rank,
               uint64_t seed) {
  for (size_t i = 0; i < count; ++i) {
    StoreElement(out, i, type, InputValue(op, type, rank, i + seed));
  }
}

void FillExpected(void* out, size_t count, DataType type, ReduceOp op,
                  int world, uint64_t seed) {
  for (size_t i = 0; i < count; ++i) {
    double acc = InputValue(op, type, 0, i + seed);
    for (int r = 1; r < world; ++r) {
      const double v = InputValue(op, type, r, i + seed);
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg: acc += v; break;
        case ReduceOp::kProd: acc *= v; break;
        case ReduceOp::kMin: acc = std::fmin(acc, v); break;
        case ReduceOp::kMax: acc = std::fmax(acc, v); break;
      }
    }
    if (op == ReduceOp::kAvg) {
      // One division of the exact sum, in the element type's arithmetic.
      switch (type) {
        case DataType::kFloat32:
          static_cast<float*>(out)[i] = static_cast<float>(acc) / static_cast<float>(world);
          continue;
        case DataType::kFloat64:
          static_cast<double*>(out)[i] = acc / world;
          continue;
        case DataType::kFloat16:
        case DataType::kBFloat16: {
          const float q = static_cast<float>(acc) / static_cast<float>(world);
          static_cast<uint16_t*>(out)[i] =
              type == DataType::kFloat16 ? FloatToHalf(q) : FloatToBFloat16(q);
          continue;
        }
        default:
          acc = std::trunc(acc / world);
          break;
      }
    }
    StoreElement(out, i, type, acc);
  }
}

size_t CountMismatches(const void* got, const void* want, size_t count,
                       DataType type) {
  const size_t es = DataTypeSize(type);
  const auto* g = static_cast<const unsigned char*>(got);
  const auto* w = static_cast<const unsigned char*>(want);
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(g + i * es, w + i * es, es) != 0) ++wrong;
  }
  return wrong;
}

}  // namespace fusebox::comm::testing
