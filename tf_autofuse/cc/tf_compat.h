// What differs between the TensorFlow releases tf_autofuse builds against (2.15 to 2.21), in
// one place: the sources use these names and never test a TensorFlow version themselves.
//
// The version comes from TensorFlow's own header, so the library adapts to the headers it is
// compiled with; tf_autofuse/_build.py refuses a TensorFlow outside the supported range before
// compiling.

#ifndef TF_AUTOFUSE_CC_TF_COMPAT_H_
#define TF_AUTOFUSE_CC_TF_COMPAT_H_

#include <cstdint>

#include "Eigen/Core"
#include "tensorflow/core/platform/threadpool.h"
#include "tensorflow/core/public/version.h"

#define TF_AUTOFUSE_TF_AT_LEAST(major, minor) \
  (TF_MAJOR_VERSION > (major) || (TF_MAJOR_VERSION == (major) && TF_MINOR_VERSION >= (minor)))

namespace tf_autofuse {
namespace tf_compat {

// The low part of an exact product: x * y == xy + TwoProdLow(x, y, xy) for xy = pmul(x, y).
// Eigen computes it with one fused multiply-subtract where the target has FMA and with
// Veltkamp's split otherwise. The Eigen bundled before TensorFlow 2.20 offers it only as
// twoprod(x, y, hi, lo), whose hi is the same pmul(x, y): the same bits either way.
template <typename Packet>
inline Packet TwoProdLow(const Packet& x, const Packet& y, const Packet& xy) {
#if TF_AUTOFUSE_TF_AT_LEAST(2, 20)
  return Eigen::internal::twoprod_low(x, y, xy);
#else
  Packet hi, lo;
  Eigen::internal::twoprod(x, y, hi, lo);
  (void)xy;
  return lo;
#endif
}

// ThreadPool::ParallelFor's adaptive sharding for work of `cost_per_unit` cycles per item. Before
// TensorFlow 2.20 SchedulingParams has only its constructor, which later releases deprecate in
// favour of the named factory.
inline tensorflow::thread::ThreadPool::SchedulingParams AdaptiveScheduling(int64_t cost_per_unit) {
  using Params = tensorflow::thread::ThreadPool::SchedulingParams;
#if TF_AUTOFUSE_TF_AT_LEAST(2, 20)
  return Params::Adaptive(cost_per_unit);
#else
  return Params(tensorflow::thread::ThreadPool::SchedulingStrategy::kAdaptive, cost_per_unit,
                absl::nullopt);
#endif
}

}  // namespace tf_compat
}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CC_TF_COMPAT_H_
