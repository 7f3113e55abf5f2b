#include "comm/reduce.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace fusebox::comm {
namespace {

template <typename T, typename F>
void Apply(const void* a, const void* b, void* out, size_t n, F f) {
  const T* pa = static_cast<const T*>(a);
  const T* pb = static_cast<const T*>(b);
  T* po = static_cast<T*>(out);
  for (size_t i = 0; i < n; ++i) po[i] = f(pa[i], pb[i]);
}

// Integer sums and products wrap around (two's complement), as MPI and NCCL
// compute them; done in the unsigned type, where wrapping is defined
// (signed overflow is undefined behaviour).
template <typename T>
T Add(T x, T y) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(x) + static_cast<U>(y)));
  } else {
    return x + y;
  }
}

template <typename T>
T Mul(T x, T y) {
  if constexpr (std::is_integral_v<T>) {
    // Promote at least to unsigned int: uint8 * uint8 would promote to int.
    using U = std::common_type_t<std::make_unsigned_t<T>, unsigned int>;
    return static_cast<T>(static_cast<U>(x) * static_cast<U>(y));
  } else {
    return x * y;
  }
}

template <typename T>
void ReduceTyped(const void* a, const void* b, void* out, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      Apply<T>(a, b, out, n, Add<T>);
      return;
    case ReduceOp::kProd:
      Apply<T>(a, b, out, n, Mul<T>);
      return;
    case ReduceOp::kMin:
      Apply<T>(a, b, out, n, [](T x, T y) { return y < x ? y : x; });
      return;
    case ReduceOp::kMax:
      Apply<T>(a, b, out, n, [](T x, T y) { return x < y ? y : x; });
      return;
  }
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void Reduce16(const void* a, const void* b, void* out, size_t n, ReduceOp op) {
  const auto* pa = static_cast<const uint16_t*>(a);
  const auto* pb = static_cast<const uint16_t*>(b);
  auto* po = static_cast<uint16_t*>(out);
  for (size_t i = 0; i < n; ++i) {
    const float x = ToF(pa[i]);
    const float y = ToF(pb[i]);
    float r = 0;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: r = x + y; break;
      case ReduceOp::kProd: r = x * y; break;
      case ReduceOp::kMin: r = y < x ? y : x; break;
      case ReduceOp::kMax: r = x < y ? y : x; break;
    }
    po[i] = FromF(r);
  }
}

}  // namespace

void Reduce(const void* a, const void* b, void* out, size_t count,
            DataType type, ReduceOp op) {
  switch (type) {
    case DataType::kFloat32: return ReduceTyped<float>(a, b, out, count, op);
    case DataType::kFloat64: return ReduceTyped<double>(a, b, out, count, op);
    case DataType::kInt32: return ReduceTyped<int32_t>(a, b, out, count, op);
    case DataType::kInt64: return ReduceTyped<int64_t>(a, b, out, count, op);
    case DataType::kUInt8: return ReduceTyped<uint8_t>(a, b, out, count, op);
    case DataType::kFloat16:
      return Reduce16<HalfToFloat, FloatToHalf>(a, b, out, count, op);
    case DataType::kBFloat16:
      return Reduce16<BFloat16ToFloat, FloatToBFloat16>(a, b, out, count, op);
  }
}

void FinishAvg(void* buf, size_t count, DataType type, int world) {
  if (world == 1) return;  // x / 1 == x: skip a pass over the data
  switch (type) {
    case DataType::kFloat32: {
      auto* p = static_cast<float*>(buf);
      const float w = static_cast<float>(world);
      for (size_t i = 0; i < count; ++i) p[i] = p[i] / w;
      return;
    }
    case DataType::kFloat64: {
      auto* p = static_cast<double*>(buf);
      const double w = world;
      for (size_t i = 0; i < count; ++i) p[i] = p[i] / w;
      return;
    }
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      auto* p = static_cast<uint16_t*>(buf);
      const float w = static_cast<float>(world);
      const bool half = type == DataType::kFloat16;
      for (size_t i = 0; i < count; ++i) {
        const float q = (half ? HalfToFloat(p[i]) : BFloat16ToFloat(p[i])) / w;
        p[i] = half ? FloatToHalf(q) : FloatToBFloat16(q);
      }
      return;
    }
    case DataType::kInt32: {
      auto* p = static_cast<int32_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] /= world;
      return;
    }
    case DataType::kInt64: {
      auto* p = static_cast<int64_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] /= world;
      return;
    }
    case DataType::kUInt8: {
      auto* p = static_cast<uint8_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = static_cast<uint8_t>(p[i] / world);
      return;
    }
  }
}

}  // namespace fusebox::comm
