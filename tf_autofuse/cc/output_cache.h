// Reuse of large fused-kernel outputs from one step to the next: AUTOFUSE_FLAGS
// "--output_cache_mb=N".
//
// TensorFlow's default CPU allocator takes every tensor from the C library's malloc, which maps
// fresh pages for a large block and unmaps them when it is freed (glibc: from 32 MiB always,
// smaller blocks depending on its moving threshold). A step's large tensor is then new memory
// each step, and the OS zero-fills it page by page at the first store into it: a large part of
// a large fused kernel's time (`--kernel_profile` shows it in the store step; run the benchmarks
// with --output_cache_mb=0 to see it).
//
// The output cache is a tensorflow::Allocator for the outputs of AutofuseKernel of at least
// kMinBytes. A block freed by the last tensor that referenced it goes back into the cache, which
// keeps up to the budget's bytes of such idle blocks (the oldest are released first), and the
// next output of the same rounded size takes it without a page fault. Tensors keep their usual
// reference counting: an output can still be forwarded in place by its consumer, adopted by a
// variable or handed to numpy by a fetch; its block returns when the last reference goes. The
// cost is memory: up to the budget stays resident between steps.

#ifndef TF_AUTOFUSE_CC_OUTPUT_CACHE_H_
#define TF_AUTOFUSE_CC_OUTPUT_CACHE_H_

#include <cstdint>

#include "tensorflow/core/framework/allocator.h"

namespace tf_autofuse {

// Outputs smaller than this come from TensorFlow's allocator: malloc reuses such blocks itself
// once they have been freed, and each one faults in little.
constexpr int64_t kOutputCacheMinBytes = int64_t{4} << 20;

// The allocator for an output of `bytes` bytes, or null: too small, or the cache is off
// (budget 0, the state before tf_autofuse/_native.py configures it).
tensorflow::Allocator* OutputCacheFor(int64_t bytes);

}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CC_OUTPUT_CACHE_H_
