#include "comm/types.h"

#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace fusebox::comm {

size_t DataTypeSize(DataType t) {
  switch (t) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kFloat16: return 2;
    case DataType::kBFloat16: return 2;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
    case DataType::kUInt8: return 1;
  }
  return 0;
}

absl::string_view DataTypeName(DataType t) {
  switch (t) {
    case DataType::kFloat32: return "float";
    case DataType::kFloat64: return "double";
    case DataType::kFloat16: return "half";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kUInt8: return "uint8";
  }
  return "?";
}

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProd: return "prod";
  }
  return "?";
}

absl::string_view CollectiveKindName(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllReduce: return "AllReduce";
    case CollectiveKind::kBroadcast: return "Broadcast";
    case CollectiveKind::kAllGather: return "AllGather";
    case CollectiveKind::kBarrier: return "Barrier";
  }
  return "?";
}

absl::StatusOr<DataType> ParseDataType(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "float" || n == "float32" || n == "f32") return DataType::kFloat32;
  if (n == "double" || n == "float64" || n == "f64") return DataType::kFloat64;
  if (n == "half" || n == "float16" || n == "f16") return DataType::kFloat16;
  if (n == "bfloat16" || n == "bf16") return DataType::kBFloat16;
  if (n == "int32" || n == "int") return DataType::kInt32;
  if (n == "int64" || n == "long") return DataType::kInt64;
  if (n == "uint8" || n == "u8") return DataType::kUInt8;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown data type '", name,
      "' (expected float, double, half, bfloat16, int32, int64 or uint8)"));
}

absl::StatusOr<ReduceOp> ParseReduceOp(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "sum") return ReduceOp::kSum;
  if (n == "avg") return ReduceOp::kAvg;
  if (n == "min") return ReduceOp::kMin;
  if (n == "max") return ReduceOp::kMax;
  if (n == "prod") return ReduceOp::kProd;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown reduction '", name, "' (expected sum, avg, min, max or prod)"));
}

absl::Status CheckSupported(DataType t, ReduceOp op) {
  if (static_cast<int>(t) >= kNumDataTypes) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported data type code ", static_cast<int>(t)));
  }
  if (static_cast<int>(op) >= kNumReduceOps) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported reduction code ", static_cast<int>(op)));
  }
  return absl::OkStatus();
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or nan
    return sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0);
  }
  if (absx >= 0x477ff000u) return sign | 0x7c00;  // overflow to inf
  if (absx < 0x38800000u) {                        // subnormal or zero
    if (absx < 0x33000000u) return sign;           // rounds to zero
    const uint32_t e = absx >> 23;
    uint32_t m = (absx & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - e;  // 14 + (113 - e)
    const uint32_t half_m = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    uint32_t r = half_m;
    if (rem > mid || (rem == mid && (half_m & 1))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t r = absx + 0xfff + ((absx >> 13) & 1);  // round to nearest even
  r -= 0x38000000u;                                // rebias 127 -> 15
  return sign | static_cast<uint16_t>(r >> 13);
}

float BFloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace fusebox::comm
