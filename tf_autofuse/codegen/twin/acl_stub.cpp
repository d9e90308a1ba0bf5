// The stand-in ACL runtime (built as libascendcl.so for the CPU twin). "Device" memory is host
// memory the stub tracks; kernels queued on a stream run at aclrtSynchronizeStream. It fails
// loudly on what would break on a device: copies in the wrong direction or outside an
// allocation, kernel arguments that are not device pointers, reading results before the
// stream is synchronised, use before aclInit / aclrtSetDevice, leaked or double-freed memory, and
// a thread that uses the device without a current context (ACL contexts are per thread: a thread
// gets one from aclrtSetDevice or aclrtSetCurrentContext; TensorFlow runs a kernel on whichever
// thread of its pool is free).
//
// Test controls (environment, read at every call): TWIN_ACL_LOG=FILE appends one line per kernel
// run at aclrtSynchronizeStream ("run blockDim=N ok" or "run blockDim=N error: ..."), so that a
// test in another process can see that a launch happened; TWIN_ACL_FAIL_SYNC=1 makes every
// synchronisation report an AI core exception (the kernel still runs; its results never leave
// the "device"), for testing the callers' CPU fallback. TWIN_ACL_VECTOR_CORES=N: the core count.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "acl/acl.h"

namespace {
struct Pending {
  const char* (*fn)(void*);
  void* ctx;
  std::vector<const void*> args;  // device buffers the launch may write
  uint32_t block_dim;
};
struct Stream {
  std::vector<Pending> pending;
};
std::mutex mu;
bool initialised = false;
int32_t device = -1;
struct Context {
  int32_t device;
};
Context device_context{0};              // the default context of device 0, made by aclrtSetDevice
thread_local Context* current = nullptr;  // this thread's current context
const char* const kNoContext =
    " in a thread without a current context (call aclrtSetDevice or aclrtSetCurrentContext in "
    "this thread first)";
std::map<uintptr_t, size_t> allocations;
std::string last_error;
struct Stats {
  uint64_t launches = 0, last_block_dim = 0, h2d_bytes = 0, d2h_bytes = 0, mallocs = 0, frees = 0;
  uint64_t device_info_queries = 0, capability_queries = 0;  // aclrtGetDeviceInfo, aclGetDeviceCapability
} stats;

aclError Fail(aclError code, const std::string& what) {
  last_error = "twin ACL: " + what;
  return code;
}
bool InDevice(const void* p, size_t bytes) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = allocations.upper_bound(a);
  if (it == allocations.begin()) return false;
  --it;
  return a >= it->first && a + bytes <= it->first + it->second;
}
std::vector<Stream*> streams;
// The stream `stream` of this thread's context, or null after Fail: what (the call) needs a
// current context and a stream it made. Call under mu.
Stream* KnownStream(aclrtStream stream, const char* what, aclError* error) {
  if (current == nullptr) {
    *error = Fail(ACL_ERROR_INVALID_PARAM, std::string(what) + kNoContext);
    return nullptr;
  }
  Stream* s = static_cast<Stream*>(stream);
  for (Stream* t : streams) {
    if (t == s) return s;
  }
  *error = Fail(ACL_ERROR_INVALID_PARAM, std::string(what) + ": unknown stream");
  return nullptr;
}
// Does a launch not yet synchronised use the device allocation holding p?
bool WrittenByPendingLaunch(const void* p) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (Stream* s : streams)
    for (const auto& work : s->pending)
      for (const void* arg : work.args) {
        auto it = allocations.find(reinterpret_cast<uintptr_t>(arg));
        if (it != allocations.end() && a >= it->first && a < it->first + it->second) return true;
      }
  return false;
}
}  // namespace

extern "C" {
aclError aclInit(const char*) {
  std::lock_guard<std::mutex> l(mu);
  if (initialised) return ACL_ERROR_REPEAT_INITIALIZE;
  initialised = true;
  return ACL_SUCCESS;
}
aclError aclFinalize() {
  std::lock_guard<std::mutex> l(mu);
  initialised = false;
  return ACL_SUCCESS;
}
aclError aclrtSetDevice(int32_t id) {
  std::lock_guard<std::mutex> l(mu);
  if (!initialised) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtSetDevice before aclInit");
  if (id != 0) return Fail(ACL_ERROR_INVALID_PARAM, "the twin has device 0 only");
  device = id;
  current = &device_context;
  return ACL_SUCCESS;
}
aclError aclrtResetDevice(int32_t) {
  std::lock_guard<std::mutex> l(mu);
  device = -1;
  current = nullptr;
  return ACL_SUCCESS;
}
aclError aclrtGetCurrentContext(aclrtContext* context) {
  std::lock_guard<std::mutex> l(mu);
  if (current == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, std::string("aclrtGetCurrentContext") + kNoContext);
  *context = current;
  return ACL_SUCCESS;
}
aclError aclrtSetCurrentContext(aclrtContext context) {
  std::lock_guard<std::mutex> l(mu);
  if (context != &device_context || device < 0)
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtSetCurrentContext: not a live context");
  current = static_cast<Context*>(context);
  return ACL_SUCCESS;
}
aclError aclrtCreateStream(aclrtStream* stream) {
  std::lock_guard<std::mutex> l(mu);
  if (device < 0) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateStream before aclrtSetDevice");
  if (current == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, std::string("aclrtCreateStream") + kNoContext);
  Stream* s = new Stream;
  streams.push_back(s);
  *stream = s;
  return ACL_SUCCESS;
}
aclError aclrtDestroyStream(aclrtStream stream) {
  std::lock_guard<std::mutex> l(mu);
  for (size_t i = 0; i < streams.size(); ++i)
    if (streams[i] == stream) {
      delete streams[i];
      streams.erase(streams.begin() + i);
      return ACL_SUCCESS;
    }
  return Fail(ACL_ERROR_INVALID_PARAM, "aclrtDestroyStream: unknown stream");
}
// CANN 8.0-8.4's device query (ACL_DEVICE_INFO_VECTOR_CORE_NUM = 1, ACL_DEVICE_INFO_AI_CORE_NUM = 0);
// the library exports both queries, the header a launcher is built against declares one.
aclError aclGetDeviceCapability(uint32_t, int info, int64_t* value) {
  const char* env = std::getenv("TWIN_ACL_VECTOR_CORES");
  int64_t cores = env ? std::atoll(env) : 40;
  { std::lock_guard<std::mutex> l(mu); ++stats.capability_queries; }
  if (info == 1) *value = cores;
  else if (info == 0) *value = cores / 2;
  else return Fail(ACL_ERROR_INVALID_PARAM, "aclGetDeviceCapability: info not modelled");
  return ACL_SUCCESS;
}
aclError aclrtGetDeviceInfo(uint32_t, aclrtDevAttr attr, int64_t* value) {
  const char* env = std::getenv("TWIN_ACL_VECTOR_CORES");
  int64_t cores = env ? std::atoll(env) : 40;
  { std::lock_guard<std::mutex> l(mu); ++stats.device_info_queries; }
  if (attr == ACL_DEV_ATTR_VECTOR_CORE_NUM) *value = cores;
  else if (attr == ACL_DEV_ATTR_AICORE_CORE_NUM) *value = cores / 2;
  else return Fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceInfo: attribute not modelled");
  return ACL_SUCCESS;
}
aclError aclrtMalloc(void** p, size_t size, aclrtMemMallocPolicy) {
  std::lock_guard<std::mutex> l(mu);
  if (device < 0) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtMalloc before aclrtSetDevice");
  if (current == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, std::string("aclrtMalloc") + kNoContext);
  if (size == 0) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtMalloc of 0 bytes");
  *p = std::aligned_alloc(512, (size + 511) / 512 * 512);
  std::memset(*p, 0xCD, size);
  allocations[reinterpret_cast<uintptr_t>(*p)] = size;
  ++stats.mallocs;
  return ACL_SUCCESS;
}
aclError aclrtFree(void* p) {
  std::lock_guard<std::mutex> l(mu);
  if (current == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, std::string("aclrtFree") + kNoContext);
  auto it = allocations.find(reinterpret_cast<uintptr_t>(p));
  if (it == allocations.end()) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtFree of a pointer aclrtMalloc did not return");
  allocations.erase(it);
  std::free(p);
  ++stats.frees;
  return ACL_SUCCESS;
}
aclError aclrtMemcpy(void* dst, size_t dest_max, const void* src, size_t count, aclrtMemcpyKind kind) {
  std::lock_guard<std::mutex> l(mu);
  if (current == nullptr) return Fail(ACL_ERROR_INVALID_PARAM, std::string("aclrtMemcpy") + kNoContext);
  if (count > dest_max) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtMemcpy: count > destMax");
  bool dst_dev = InDevice(dst, count), src_dev = InDevice(src, count);
  if (kind == ACL_MEMCPY_HOST_TO_DEVICE && (!dst_dev || src_dev))
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtMemcpy HOST_TO_DEVICE: destination is not inside a device allocation or source is device memory");
  if (kind == ACL_MEMCPY_DEVICE_TO_HOST) {
    if (!src_dev || dst_dev)
      return Fail(ACL_ERROR_INVALID_PARAM, "aclrtMemcpy DEVICE_TO_HOST: source is not inside a device allocation or destination is device memory");
    if (WrittenByPendingLaunch(src)) return Fail(ACL_ERROR_INVALID_PARAM, "aclrtMemcpy DEVICE_TO_HOST of a buffer that a launch not yet synchronised writes");
  }
  if (kind != ACL_MEMCPY_HOST_TO_DEVICE && kind != ACL_MEMCPY_DEVICE_TO_HOST)
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtMemcpy kind not modelled");
  std::memcpy(dst, src, count);
  (kind == ACL_MEMCPY_HOST_TO_DEVICE ? stats.h2d_bytes : stats.d2h_bytes) += count;
  return ACL_SUCCESS;
}
aclError aclrtSynchronizeStream(aclrtStream stream) {
  std::vector<Pending> work;
  {
    std::lock_guard<std::mutex> l(mu);
    aclError error;
    Stream* s = KnownStream(stream, "aclrtSynchronizeStream", &error);
    if (s == nullptr) return error;
    work.swap(s->pending);
  }
  aclError rc = ACL_SUCCESS;
  const char* inject = std::getenv("TWIN_ACL_FAIL_SYNC");
  const bool fail = inject && *inject && std::strcmp(inject, "0") != 0;
  for (Pending& p : work) {
    std::string err = p.fn(p.ctx);
    if (err.empty() && fail) err = "injected AI core exception (TWIN_ACL_FAIL_SYNC)";
    std::lock_guard<std::mutex> l(mu);
    if (!err.empty() && rc == ACL_SUCCESS) rc = Fail(ACL_ERROR_RT_AICORE_EXCEPTION, err);
    if (const char* path = std::getenv("TWIN_ACL_LOG")) {
      if (FILE* log = std::fopen(path, "a")) {
        std::fprintf(log, "run blockDim=%u %s%s\n", p.block_dim, err.empty() ? "ok" : "error: ", err.c_str());
        std::fclose(log);
      }
    }
  }
  return rc;
}
const char* aclGetRecentErrMsg() { return last_error.c_str(); }

size_t twinAclDeviceSize(const void* p) {
  std::lock_guard<std::mutex> l(mu);
  auto it = allocations.find(reinterpret_cast<uintptr_t>(p));
  return it == allocations.end() ? 0 : it->second;
}
aclError twinAclEnqueue(aclrtStream stream, const char* (*fn)(void*), void* ctx, uint32_t block_dim,
                        const void* const* args, uint32_t num_args) {
  std::lock_guard<std::mutex> l(mu);
  aclError error;
  Stream* s = KnownStream(stream, "kernel launch", &error);
  if (s == nullptr) return error;
  if (block_dim == 0 || block_dim > 65535) return Fail(ACL_ERROR_INVALID_PARAM, "kernel launch: bad blockDim");
  s->pending.push_back({fn, ctx, std::vector<const void*>(args, args + num_args), block_dim});
  ++stats.launches;
  stats.last_block_dim = block_dim;
  return ACL_SUCCESS;
}
// Test hook: launches, last blockDim, bytes copied each way, mallocs, frees.
void twinAclStats(uint64_t* out) {
  std::lock_guard<std::mutex> l(mu);
  out[0] = stats.launches; out[1] = stats.last_block_dim; out[2] = stats.h2d_bytes;
  out[3] = stats.d2h_bytes; out[4] = stats.mallocs; out[5] = stats.frees;
  out[6] = stats.device_info_queries; out[7] = stats.capability_queries;
}
}
