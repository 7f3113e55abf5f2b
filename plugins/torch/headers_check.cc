// Compiles LibTorch's headers together with fusebox's in the project's C++17
// configuration (see plugins/torch/CMakeLists.txt). Nothing here runs.
#include <torch/torch.h>

#include "comm/communicator.h"
#include "fusebox/config.h"

static_assert(__cplusplus >= 201703L, "fusebox builds as C++17");
static_assert(FUSEBOX_WITH_TORCH == 1, "this file is built only with LibTorch");

namespace fusebox::plugins::torch_check {

// A tensor's element type maps onto a comm::DataType.
inline comm::DataType ToDataType(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return comm::DataType::kFloat32;
    case c10::kDouble: return comm::DataType::kFloat64;
    case c10::kHalf: return comm::DataType::kFloat16;
    case c10::kBFloat16: return comm::DataType::kBFloat16;
    case c10::kInt: return comm::DataType::kInt32;
    case c10::kLong: return comm::DataType::kInt64;
    default: return comm::DataType::kUInt8;
  }
}

comm::DataType DataTypeOf(const at::Tensor& t) { return ToDataType(t.scalar_type()); }

}  // namespace fusebox::plugins::torch_check
