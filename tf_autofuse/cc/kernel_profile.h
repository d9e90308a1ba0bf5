// Per-step timing of fused kernels: AUTOFUSE_DFX_FLAGS="--kernel_profile=FILE".
//
// When a path is set (tf_autofuse/_native.py calls autofuse_set_kernel_profile before any kernel
// is built), every AutofuseKernel built afterwards gets a KernelProfile: the interpreter times
// each step of its schedules (a load, one instruction, an accumulation, a store...) over every
// tile, the kernel times its whole calls, and at process exit one CSV row per (kernel, step) is
// written to FILE. Step times are CPU time summed over the threads that ran the tiles; the
// timing itself costs ~40 ns a step and tile, so the profile is for finding what bounds a
// kernel, not for benchmarking it.

#ifndef TF_AUTOFUSE_CC_KERNEL_PROFILE_H_
#define TF_AUTOFUSE_CC_KERNEL_PROFILE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

namespace tf_autofuse {

class KernelProfile {
 public:
  explicit KernelProfile(std::string kernel) : kernel_(std::move(kernel)) {}

  // One run of a step over `elements` elements (a tile). `key` identifies the step (its address);
  // `label` describes it, asked for the first time a step is seen.
  void AddStep(const void* key, const std::function<std::string()>& label, int64_t ns,
               int64_t elements);
  // One call of the kernel's Compute.
  void AddCall(int64_t ns, int64_t elements);
  // CSV rows, one a step, in the order the steps first ran.
  std::string Rows() const;

 private:
  struct Entry {
    int64_t order = 0;
    std::string label;
    int64_t runs = 0, elements = 0, ns = 0;
  };
  const std::string kernel_;
  mutable std::mutex mu_;
  std::map<const void*, Entry> steps_;
  int64_t calls_ = 0, call_elements_ = 0, call_ns_ = 0;
};

// A new profile for the kernel `name`, or null when profiling is off. Profiles live until the
// process exits, when they are written.
KernelProfile* NewKernelProfile(const std::string& name);

}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CC_KERNEL_PROFILE_H_
