// The one place that names LibTorch / c10d APIs whose spelling differs
// between torch releases. Everything else in plugins/torch goes through
// these aliases, so a new torch needs changes here only.
//
//   torch 1.13 (upstream)   c10d::ProcessGroup::Work, ReduceOp an enum
//   torch 2.x  (and the     c10d::Work in Work.hpp, ReduceOp a struct built
//   Debian 1.13 headers)    from ReduceOp::RedOpType
// GradBucket::getBufferRef / getIndex / isLast are spelled the same in both;
// they are wrapped anyway so that a rename lands here.
#ifndef FUSEBOX_PLUGINS_TORCH_TORCH_COMPAT_H_
#define FUSEBOX_PLUGINS_TORCH_TORCH_COMPAT_H_

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>

#if __has_include(<torch/csrc/distributed/c10d/Work.hpp>)
#include <torch/csrc/distributed/c10d/Work.hpp>
#define FUSEBOX_TORCH_WORK_IS_TOP_LEVEL 1
#else
#define FUSEBOX_TORCH_WORK_IS_TOP_LEVEL 0
#endif

namespace fusebox::torch_plugin::compat {

#if FUSEBOX_TORCH_WORK_IS_TOP_LEVEL
using Work = ::c10d::Work;
#else
using Work = ::c10d::ProcessGroup::Work;
#endif

inline at::Tensor& BucketBuffer(::c10d::GradBucket& bucket) { return bucket.getBufferRef(); }
inline size_t BucketIndex(const ::c10d::GradBucket& bucket) { return bucket.getIndex(); }
inline bool BucketIsLast(const ::c10d::GradBucket& bucket) { return bucket.isLast(); }

// `ReduceOp::SUM` converts to the option's type in both spellings.
inline ::c10d::ReduceOp SumOp() { return ::c10d::ReduceOp::SUM; }
inline ::c10d::ReduceOp MinOp() { return ::c10d::ReduceOp::MIN; }
inline ::c10d::ReduceOp MaxOp() { return ::c10d::ReduceOp::MAX; }
inline ::c10d::ReduceOp ProductOp() { return ::c10d::ReduceOp::PRODUCT; }

}  // namespace fusebox::torch_plugin::compat

#endif  // FUSEBOX_PLUGINS_TORCH_TORCH_COMPAT_H_
