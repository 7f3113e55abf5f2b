// Stand-in for a header Debian's LibTorch 1.13 does not ship
// (plugins/torch/README.md, Known gaps): c10d/reducer.hpp includes it
// for two type names only. On the include path ahead of /usr/include, and
// only where the real header is missing (see plugins/torch/CMakeLists.txt).
#pragma once

#include <functional>
#include <memory>

#include <ATen/core/Tensor.h>

namespace torch::distributed::autograd {

class DistAutogradContext {
 public:
  using GradCallback = std::function<bool(at::Tensor&)>;
};
using ContextPtr = std::shared_ptr<DistAutogradContext>;

}  // namespace torch::distributed::autograd
