// The C ABI between a built tf_autofuse NPU kernel library and its caller (the op kernel's
// dispatch, npu_dispatch.h, or Python through ctypes). One library per kernel exports
//   int autofuse_npu_launch(const AutofuseLaunchArgs*)   and   const char* autofuse_npu_kernel_name()
#ifndef TF_AUTOFUSE_CODEGEN_AUTOFUSE_LAUNCH_H_
#define TF_AUTOFUSE_CODEGEN_AUTOFUSE_LAUNCH_H_

#include <cstdint>
#include <cstdio>
#include <mutex>

#define AUTOFUSE_LAUNCH_ABI 1u

// The CANN API generation the launcher is built for (codegen/cann.py sets it): 8 for CANN
// 8.0-8.4 (ascendc_library, ACLRT_LAUNCH_KERNEL, aclGetDeviceCapability), 9 for CANN 8.5 and 9.x
// (find_package(ASC), <<<...>>>, aclrtGetDeviceInfo).
#ifndef AUTOFUSE_CANN_ROUTE
#define AUTOFUSE_CANN_ROUTE 9
#endif

struct AutofuseLaunchArgs {
  uint32_t abi_version;      // AUTOFUSE_LAUNCH_ABI
  int32_t device_id;         // ACL device
  void* stream;              // aclrtStream to use, or nullptr: the library's own stream
  uint32_t core_num;         // vector cores to use; 0: ask the device
  uint64_t total;            // elements of the iteration shape
  uint32_t num_inputs;
  const void* const* inputs;   // host buffers, total elements each, of the program's dtypes
  uint32_t num_outputs;
  void* const* outputs;        // host buffers
  void* tiling_out;          // optional: receives the tiling data used
  char* error;               // optional: receives a message on failure
  uint32_t error_len;
  uint32_t rank;             // broadcast kernels: the iteration shape (flat kernels ignore it)
  const int64_t* shape;
  const uint64_t* input_elements;  // optional: each input's element count, checked by the launcher
};

static inline int autofuse_launch_fail(const AutofuseLaunchArgs* a, int code, const char* what) {
  if (a->error && a->error_len) std::snprintf(a->error, a->error_len, "%s (error %d)", what, code);
  return code ? code : -1;
}

#ifdef AUTOFUSE_WITH_ACL
#include "acl/acl.h"

// An ACL call failed: `what`, the code and the runtime's own message (aclGetRecentErrMsg).
static inline int autofuse_acl_fail(const AutofuseLaunchArgs* a, aclError rc, const char* what) {
  const char* detail = aclGetRecentErrMsg();
  if (a->error && a->error_len)
    std::snprintf(a->error, a->error_len, "%s (error %d)%s%s", what, static_cast<int>(rc),
                  detail && *detail ? ": " : "", detail && *detail ? detail : "");
  return rc ? rc : -1;
}

// aclInit / aclrtSetDevice once per process, a stream of our own when the caller has none, and
// the vector core count when the caller did not give one. ACL contexts are per thread and the
// caller (a TensorFlow kernel) runs on any thread of a pool: every call without a caller stream
// makes the context of our stream current in the calling thread.
static inline aclError autofuse_acl_prepare(int32_t device, aclrtStream* stream, uint32_t* core_num) {
  static std::mutex mu;
  static bool initialised = false;
  static aclrtStream own_stream = nullptr;
  static aclrtContext own_context = nullptr;
  static int32_t own_device = -1;
  std::lock_guard<std::mutex> lock(mu);
  aclError rc = ACL_SUCCESS;
  if (!initialised) {
    rc = aclInit(nullptr);
    if (rc != ACL_SUCCESS && rc != ACL_ERROR_REPEAT_INITIALIZE) return rc;
    initialised = true;
  }
  if (*stream == nullptr) {
    if (own_device != device) {
      if ((rc = aclrtSetDevice(device)) != ACL_SUCCESS) return rc;
      if ((rc = aclrtGetCurrentContext(&own_context)) != ACL_SUCCESS) return rc;
      if ((rc = aclrtCreateStream(&own_stream)) != ACL_SUCCESS) return rc;
      own_device = device;
    } else if ((rc = aclrtSetCurrentContext(own_context)) != ACL_SUCCESS) {
      return rc;
    }
    *stream = own_stream;
  }
  if (*core_num == 0) {
    int64_t value = 0;
#if AUTOFUSE_CANN_ROUTE == 8  // CANN 8.0-8.4: aclGetDeviceCapability
    if (aclGetDeviceCapability(static_cast<uint32_t>(device), ACL_DEVICE_INFO_VECTOR_CORE_NUM, &value) != ACL_SUCCESS ||
        value <= 0) {
      if (aclGetDeviceCapability(static_cast<uint32_t>(device), ACL_DEVICE_INFO_AI_CORE_NUM, &value) == ACL_SUCCESS &&
          value > 0)
#else  // CANN 8.5 / 9.x: aclrtGetDeviceInfo
    if (aclrtGetDeviceInfo(static_cast<uint32_t>(device), ACL_DEV_ATTR_VECTOR_CORE_NUM, &value) != ACL_SUCCESS ||
        value <= 0) {
      if (aclrtGetDeviceInfo(static_cast<uint32_t>(device), ACL_DEV_ATTR_AICORE_CORE_NUM, &value) == ACL_SUCCESS &&
          value > 0)
#endif
        value *= 2;  // two AIV cores per AI core on Atlas A2/A3
      else
        value = 40;
    }
    *core_num = static_cast<uint32_t>(value);
  }
  return ACL_SUCCESS;
}

#if AUTOFUSE_CANN_ROUTE == 8
// CANN 8.0-8.4 (ascendc_library): the kernel is built apart from the host code and launched
// through the function its generated header aclrtlaunch_<name>.h declares.
#define AUTOFUSE_LAUNCH_KERNEL(name, block_dim, stream, ...) \
  static_cast<aclError>(ACLRT_LAUNCH_KERNEL(name)(block_dim, stream, __VA_ARGS__))
#elif defined(AUTOFUSE_TWIN)
// CPU twin: the launch goes through the stand-in runtime (twin/acl_stub.cpp).
#define AUTOFUSE_LAUNCH_KERNEL(name, block_dim, stream, ...) twin_launch_##name(block_dim, stream, __VA_ARGS__)
#else
// CANN (bisheng, .asc): the kernel launch syntax.
#define AUTOFUSE_LAUNCH_KERNEL(name, block_dim, stream, ...) \
  ([&]() -> aclError { name<<<block_dim, nullptr, stream>>>(__VA_ARGS__); return ACL_SUCCESS; }())
#endif
#endif  // AUTOFUSE_WITH_ACL

#endif  // TF_AUTOFUSE_CODEGEN_AUTOFUSE_LAUNCH_H_
