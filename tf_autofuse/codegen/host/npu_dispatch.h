// NPU dispatch for the AutofuseKernel op kernel: finds the kernel library of a fused program
// and runs it through its ACL launcher. Header-only, needs only dlopen.
//
// The library is found from the program itself, never from a path in the graph: the Python side
// registers a resolver (tf_autofuse.codegen.cann.install_resolver, only when a CANN toolchain is
// present) that generates the program's Ascend C and builds it, or finds the build, under
// $TF_AUTOFUSE_CACHE_DIR/npu/<hash of the sources and the toolchain>/. Without a resolver every
// kernel runs on the CPU.
//
// Hook (kernel.cc), in the constructor:
//   npu_ = tf_autofuse::npu::Launcher::ForProgram(program_text, node_name, blacklist, &why);
//   // null: CPU path (log `why` once when it is not empty)
// and at the top of Compute, once the output tensors are allocated:
//   if (npu_ && npu_->Run(input_ptrs, output_ptrs, iteration_elements, &error, 0, 0, nullptr,
//                         iteration_shape, input_num_elements)) return;
//   // else: LOG(WARNING) once with `error`, npu_.reset(), and run the CPU interpreter.
// Buffers are host memory (the launcher copies them to and from the device); flat kernels expect
// every input to hold iteration_elements values, broadcast/reduce kernels read the inputs in
// their views and need iteration_shape; reduced outputs hold one value per outer position.
// Pass input_num_elements: the launcher refuses (false, CPU path) inputs of the wrong size.
#ifndef TF_AUTOFUSE_CODEGEN_NPU_DISPATCH_H_
#define TF_AUTOFUSE_CODEGEN_NPU_DISPATCH_H_

#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "autofuse_launch.h"

namespace tf_autofuse {
namespace npu {

// (program text, node name, precision blacklist, path out, its capacity) -> 1 when a library was
// found or built (its path written to `path`), else 0: the CPU path.
using Resolver = int (*)(const char* program, const char* node, const char* blacklist, char* path,
                         int path_len);

inline std::atomic<Resolver>& ResolverSlot() {
  static std::atomic<Resolver> resolver{nullptr};
  return resolver;
}

class Launcher {
 public:
  using LaunchFn = int (*)(const AutofuseLaunchArgs*);
  using NameFn = const char* (*)();

  // The library of this program, from the registered resolver; nullptr without one, when the
  // program has no NPU kernel (why stays empty), or when the library does not load (*why).
  static std::unique_ptr<Launcher> ForProgram(const std::string& program, const std::string& node,
                                              const std::string& blacklist, std::string* why) {
    Resolver resolver = ResolverSlot().load(std::memory_order_acquire);
    if (resolver == nullptr) return nullptr;
    std::vector<char> path(4096, '\0');
    if (resolver(program.c_str(), node.c_str(), blacklist.c_str(), path.data(),
                 static_cast<int>(path.size())) != 1 || path[0] == '\0') {
      return nullptr;
    }
    path.back() = '\0';
    return Open(path.data(), why);
  }

  // Loads the library; nullptr with *why when it cannot be used.
  static std::unique_ptr<Launcher> Open(const std::string& path, std::string* why) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      if (why) *why = std::string("cannot load ") + path + ": " + dlerror();
      return nullptr;
    }
    auto launch = reinterpret_cast<LaunchFn>(dlsym(handle, "autofuse_npu_launch"));
    auto name = reinterpret_cast<NameFn>(dlsym(handle, "autofuse_npu_kernel_name"));
    if (!launch || !name) {
      if (why) *why = path + " exports no autofuse_npu_launch / autofuse_npu_kernel_name";
      dlclose(handle);
      return nullptr;
    }
    return std::unique_ptr<Launcher>(new Launcher(handle, launch, name(), MutexOf(handle)));
  }

  ~Launcher() { dlclose(handle_); }
  const std::string& kernel_name() const { return name_; }

  // Runs the kernel on host buffers of `total` elements each. false with *error on failure:
  // the caller runs the CPU path. Launches of one library are serialised, across all the
  // Launchers that opened it (it has one stream; dlopen gives them the same handle).
  // Broadcast kernels also need the iteration shape (`shape`); flat kernels ignore it.
  bool Run(const std::vector<const void*>& inputs, const std::vector<void*>& outputs, uint64_t total,
           std::string* error, uint32_t core_num = 0, int32_t device = 0, void* stream = nullptr,
           const std::vector<int64_t>& shape = {}, const std::vector<uint64_t>& input_elements = {}) {
    char message[512] = {0};
    AutofuseLaunchArgs args{};
    args.abi_version = AUTOFUSE_LAUNCH_ABI;
    args.device_id = device;
    args.stream = stream;
    args.core_num = core_num;
    args.total = total;
    args.num_inputs = static_cast<uint32_t>(inputs.size());
    args.inputs = inputs.data();
    args.num_outputs = static_cast<uint32_t>(outputs.size());
    args.outputs = outputs.data();
    args.error = message;
    args.error_len = sizeof(message);
    args.rank = static_cast<uint32_t>(shape.size());
    args.shape = shape.data();
    args.input_elements = input_elements.empty() ? nullptr : input_elements.data();
    std::lock_guard<std::mutex> lock(*mu_);
    int rc = launch_(&args);
    if (rc != 0 && error) *error = name_ + ": " + message;
    return rc == 0;
  }

 private:
  Launcher(void* handle, LaunchFn launch, const char* name, std::mutex* mu)
      : handle_(handle), launch_(launch), name_(name), mu_(mu) {}
  // One mutex per loaded library, for the life of the process.
  static std::mutex* MutexOf(void* handle) {
    static std::mutex registry_mu;
    static std::map<void*, std::unique_ptr<std::mutex>>* registry =
        new std::map<void*, std::unique_ptr<std::mutex>>();
    std::lock_guard<std::mutex> lock(registry_mu);
    auto& mu = (*registry)[handle];
    if (!mu) mu.reset(new std::mutex);
    return mu.get();
  }
  void* handle_;
  LaunchFn launch_;
  std::string name_;
  std::mutex* mu_;
};

}  // namespace npu
}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CODEGEN_NPU_DISPATCH_H_
