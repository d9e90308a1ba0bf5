// Stand-in for CANN's acl/acl.h: the declarations tf_autofuse's launcher uses, with CANN's
// names and values. Implemented by twin/acl_stub.cpp (libascendcl.so of the CPU twin).
#ifndef TF_AUTOFUSE_TWIN_ACL_H_
#define TF_AUTOFUSE_TWIN_ACL_H_
#include <cstddef>
#include <cstdint>

typedef int aclError;
typedef void* aclrtStream;
typedef void* aclrtContext;
static const aclError ACL_SUCCESS = 0;
static const aclError ACL_ERROR_INVALID_PARAM = 100000;
static const aclError ACL_ERROR_REPEAT_INITIALIZE = 100002;
static const aclError ACL_ERROR_RT_AICORE_EXCEPTION = 507015;
typedef enum { ACL_MEM_MALLOC_HUGE_FIRST = 0, ACL_MEM_MALLOC_HUGE_ONLY = 1, ACL_MEM_MALLOC_NORMAL_ONLY = 2 } aclrtMemMallocPolicy;
typedef enum { ACL_MEMCPY_HOST_TO_HOST = 0, ACL_MEMCPY_HOST_TO_DEVICE = 1, ACL_MEMCPY_DEVICE_TO_HOST = 2,
               ACL_MEMCPY_DEVICE_TO_DEVICE = 3 } aclrtMemcpyKind;
#if defined(AUTOFUSE_CANN_ROUTE) && AUTOFUSE_CANN_ROUTE == 8
// CANN 8.0-8.4: the device is asked with aclGetDeviceCapability; aclrtGetDeviceInfo and
// ACL_DEV_ATTR_* do not exist yet (a launcher using them does not compile against this header).
typedef enum { ACL_DEVICE_INFO_AI_CORE_NUM = 0, ACL_DEVICE_INFO_VECTOR_CORE_NUM = 1,
               ACL_DEVICE_INFO_L2_SIZE = 2 } aclDeviceInfo;
#else
// CANN 8.5 / 9.x: aclrtGetDeviceInfo with ACL_DEV_ATTR_*.
typedef enum { ACL_DEV_ATTR_AICPU_CORE_NUM = 1, ACL_DEV_ATTR_AICORE_CORE_NUM = 101,
               ACL_DEV_ATTR_VECTOR_CORE_NUM = 201 } aclrtDevAttr;
#endif

extern "C" {
aclError aclInit(const char* config_path);
aclError aclFinalize();
aclError aclrtSetDevice(int32_t device_id);
aclError aclrtResetDevice(int32_t device_id);
aclError aclrtGetCurrentContext(aclrtContext* context);
aclError aclrtSetCurrentContext(aclrtContext context);
aclError aclrtCreateStream(aclrtStream* stream);
aclError aclrtDestroyStream(aclrtStream stream);
#if defined(AUTOFUSE_CANN_ROUTE) && AUTOFUSE_CANN_ROUTE == 8
aclError aclGetDeviceCapability(uint32_t device_id, aclDeviceInfo info, int64_t* value);
#else
aclError aclrtGetDeviceInfo(uint32_t device_id, aclrtDevAttr attr, int64_t* value);
#endif
aclError aclrtMalloc(void** dev_ptr, size_t size, aclrtMemMallocPolicy policy);
aclError aclrtFree(void* dev_ptr);
aclError aclrtMemcpy(void* dst, size_t dest_max, const void* src, size_t count, aclrtMemcpyKind kind);
aclError aclrtSynchronizeStream(aclrtStream stream);
const char* aclGetRecentErrMsg();

// Twin-only entry points (not CANN): what the toolchain's launch stub does on hardware.
// Size of the device allocation starting at p, 0 when p is not the start of one.
size_t twinAclDeviceSize(const void* p);
// Queue fn(ctx) on the stream; it runs at aclrtSynchronizeStream. fn returns "" or an error.
aclError twinAclEnqueue(aclrtStream stream, const char* (*fn)(void* ctx), void* ctx, uint32_t block_dim,
                        const void* const* args, uint32_t num_args);
}
#endif  // TF_AUTOFUSE_TWIN_ACL_H_
