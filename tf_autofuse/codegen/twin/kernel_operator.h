// CPU twin of the Ascend C API subset that tf_autofuse's generator emits.
//
// Generated kernels compile against this header with g++ and run one block after another with
// a chosen block count. The twin checks the hardware's rules and throws twin::Violation (the
// runner turns it into an error message) when generated code breaks one:
//   - UB capacity: every TPipe::InitBuffer is carved out of AUTOFUSE_UB_BYTES per core;
//   - alignment: UB buffers start on 32-byte boundaries, DataCopy moves a multiple of 32 bytes,
//     every operand of a vector instruction starts on a 32-byte boundary;
//   - queues: AllocTensor with every buffer of the queue taken, more consecutive EnQue than the
//     queue depth (TQue<pos, depth>: the depth counts EnQue before a DeQue, not buffers, so
//     TQue<VECIN, 1> with two buffers is double buffering), DeQue of an empty queue, FreeTensor of a
//     tensor still queued or freed twice, and tensors never freed when the block ends;
//   - event IDs (Atlas A2): each queue position (VECIN, VECOUT) has a pool of 8 IDs per event type.
//     EnQue holds one (MTE2->V on VECIN, V->MTE3 on VECOUT) until its DeQue; FreeTensor holds one
//     (V->MTE2 / MTE3->V) until that buffer's next AllocTensor (a queue hands out its buffers in
//     turn); at most 8 tensors allocated and not yet queued (or freed) per position;
//   - at most 64 buffers per TPipe (every buffer of every queue, and every TBuf);
//   - bounds: every vector op, copy and GM access stays inside its tensors and allocations;
//   - use after free: a LocalTensor used after its buffer went back to the queue;
//   - dtypes: each vector API accepts only the types the hardware does (compile error otherwise);
//     Cast float -> bfloat16_t needs a rounding mode (CAST_NONE is rejected);
//   - advanced math: the shared temp buffer holds at least the API's factor times the operand bytes
//     (fp32 Erf 3, Erfc 7, Sin/Cos 3, Tan 3, Atan 4, Power 4; half Erf 8, Erfc 16, Sin/Cos 8,
//     Tan 10, Atan 12).
// Vector results follow the API's documented meaning; 16-bit values are rounded to nearest even
// after every instruction, as the vector unit does. Not emulated: timing, pipe overlap, the
// exact NaN/denormal behaviour of the hardware.
#ifndef TF_AUTOFUSE_TWIN_KERNEL_OPERATOR_H_
#define TF_AUTOFUSE_TWIN_KERNEL_OPERATOR_H_

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#define __aicore__
#define __global__
#define __gm__
#define GM_ADDR uint8_t*
// The kernel's task type, recorded per block: a Matmul (twin/lib/matmul_intf.h) needs the cube,
// so its kernel must be declared a mix kernel.
#define KERNEL_TASK_TYPE_DEFAULT(x) (::twin::Cur().kernel_type = (x))
#define KERNEL_TYPE_AIV_ONLY 0
#define KERNEL_TYPE_MIX_AIC_1_2 4

// The UB of one vector core (Atlas A2/A3) and the part the framework keeps for itself. The
// generator (tf_autofuse/codegen/tiling.py) budgets against the same two numbers.
#ifndef AUTOFUSE_UB_BYTES
#define AUTOFUSE_UB_BYTES (192 * 1024)
#endif
#ifndef AUTOFUSE_UB_RESERVED_BYTES
#define AUTOFUSE_UB_RESERVED_BYTES (8 * 1024)
#endif

// ---- 16-bit floating types ------------------------------------------------------------------
namespace twin {
inline uint32_t f2u(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float u2f(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint16_t float_to_half_bits(float f) {
  uint32_t x = f2u(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return sign | (absx > 0x7f800000u ? 0x7e00u : 0x7c00u);
  if (absx >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (absx < 0x38800000u) {  // subnormal half (or zero)
    float a = u2f(absx);
    // half subnormal step is 2^-24; rint in float is exact here
    float q = std::nearbyint(a * 16777216.0f);
    return sign | static_cast<uint16_t>(q);
  }
  uint32_t mant = absx & 0x7fffffu;
  uint32_t exp = (absx >> 23) - 127 + 15;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h += 1;
  return sign | h;
}
inline float half_bits_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return u2f(sign | 0x7f800000u | (mant << 13));
  return u2f(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}
inline uint16_t float_to_bf16_bits(float f) {
  uint32_t x = f2u(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  uint32_t lsb = (x >> 16) & 1u;
  return static_cast<uint16_t>((x + 0x7fffu + lsb) >> 16);
}
}  // namespace twin

struct half {
  uint16_t bits = 0;
  half() = default;
  half(float f) : bits(twin::float_to_half_bits(f)) {}  // NOLINT: implicit like the device type
  operator float() const { return twin::half_bits_to_float(bits); }
};
struct bfloat16_t {
  uint16_t bits = 0;
  bfloat16_t() = default;
  bfloat16_t(float f) : bits(twin::float_to_bf16_bits(f)) {}  // NOLINT
  operator float() const { return twin::u2f(static_cast<uint32_t>(bits) << 16); }
};

// ---- the twin's per-block state ------------------------------------------------------------
namespace twin {

struct Violation : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void Fail(const std::string& what) { throw Violation(what); }

// GM allocations the kernel may touch: registered by the harness / the stand-in ACL runtime.
struct GmRegistry {
  std::map<uintptr_t, size_t> blocks;  // start -> bytes
  void Add(const void* p, size_t bytes) { blocks[reinterpret_cast<uintptr_t>(p)] = bytes; }
  void Remove(const void* p) { blocks.erase(reinterpret_cast<uintptr_t>(p)); }
  bool Contains(const void* p, size_t bytes) const {
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto it = blocks.upper_bound(a);
    if (it == blocks.begin()) return false;
    --it;
    return a >= it->first && a + bytes <= it->first + it->second;
  }
};
inline GmRegistry& Gm() {
  static GmRegistry registry;
  return registry;
}

struct Slot {  // one buffer of a queue, or a TBuf
  uint32_t offset = 0, bytes = 0;
  enum State { kFree, kAllocated, kQueued, kDequeued } state = kFree;
  uint64_t generation = 0;
  bool holds_free_id = false;  // freed: holds a V->MTE2 / MTE3->V event ID until its next AllocTensor
};

// The framework's limits (Atlas A2): event IDs per queue position and event type
// (QUE_MAX_EVENT), buffers managed by one TPipe.
constexpr int kQueMaxEvent = 8;
constexpr uint32_t kMaxPipeBuffers = 64;

// Event IDs of one queue position (VECIN or VECOUT) in use.
struct PositionIds {
  int enqueued = 0;   // EnQue -> DeQue (MTE2->V on VECIN, V->MTE3 on VECOUT)
  int freed = 0;      // FreeTensor -> the buffer's next AllocTensor (V->MTE2 / MTE3->V)
  int allocated = 0;  // AllocTensor -> EnQue (or FreeTensor of a tensor never queued)
};

struct Block {
  uint32_t idx = 0, num = 1;
  alignas(64) uint8_t ub[AUTOFUSE_UB_BYTES];
  uint32_t used = 0;  // bytes of UB handed out by InitBuffer
  std::vector<std::string> errors;  // found after the kernel returned (destructors)
  std::vector<std::pair<uint32_t, uint32_t>> dirty;  // UB ranges written since the last barrier
  std::vector<std::pair<uint32_t, uint32_t>> unsynced_s;  // UB written since the last V->S WaitFlag
  std::vector<std::pair<uint32_t, uint32_t>> unsynced_v;  // UB SetValue'd since the last S->V WaitFlag
  uint64_t vector_ops = 0, copies = 0;
  PositionIds ids[2];  // VECIN, VECOUT
  int kernel_type = -1;  // KERNEL_TASK_TYPE_DEFAULT
  uint8_t* sys_workspace = nullptr;  // SetSysWorkspace
};
inline Block*& Current() {
  static thread_local Block* block = nullptr;
  return block;
}
inline Block& Cur() {
  Block* b = Current();
  if (!b) Fail("kernel code ran outside a twin block (call twin::RunBlocks)");
  return *b;
}
inline uint32_t Capacity() { return AUTOFUSE_UB_BYTES - AUTOFUSE_UB_RESERVED_BYTES; }

}  // namespace twin

namespace AscendC {

enum class TPosition { GM, VECIN, VECOUT, VECCALC };
enum class RoundMode { CAST_NONE = 0, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC, CAST_ODD };
enum PipeType { PIPE_V, PIPE_MTE2, PIPE_MTE3, PIPE_S, PIPE_ALL };
enum class CMPMODE { LT = 0, GT, EQ, LE, GE, NE };
enum class SELMODE { VSEL_CMPMASK_SPR = 0, VSEL_TENSOR_SCALAR_MODE, VSEL_TENSOR_TENSOR_MODE };

inline int64_t GetBlockIdx() { return twin::Cur().idx; }
inline int64_t GetBlockNum() { return twin::Cur().num; }

template <PipeType p>
inline void PipeBarrier() {
  if (p == PIPE_V || p == PIPE_ALL) twin::Cur().dirty.clear();
}

template <typename T>
class LocalTensor {
 public:
  LocalTensor() = default;
  LocalTensor(twin::Slot* slot, uint64_t generation, uint32_t offset, uint32_t count, const char* owner)
      : slot_(slot), generation_(generation), offset_(offset), count_(count), owner_(owner) {}
  uint32_t GetSize() const { return count_; }
  // Checked access to `count` elements from the start; returns the data.
  T* Data(uint32_t count, const char* api) const {
    if (!slot_) twin::Fail(std::string(api) + ": LocalTensor was never allocated");
    if (slot_->generation != generation_ || slot_->state == twin::Slot::kFree)
      twin::Fail(std::string(api) + ": tensor of " + owner_ + " used after FreeTensor");
    if (count > count_)
      twin::Fail(std::string(api) + ": " + std::to_string(count) + " elements on a tensor of " +
                 std::to_string(count_) + " (" + owner_ + ")");
    return reinterpret_cast<T*>(twin::Cur().ub + offset_);
  }
  uint32_t UbOffset() const { return offset_; }
  twin::Slot* GetSlot() const { return slot_; }
  uint64_t Generation() const { return generation_; }
  const char* Owner() const { return owner_; }
  template <typename U>
  LocalTensor<U> ReinterpretCast() const {
    return LocalTensor<U>(slot_, generation_, offset_, count_ * sizeof(T) / sizeof(U), owner_);
  }
  T GetValue(uint32_t i) const {  // a scalar read: needs SetFlag/WaitFlag<HardEvent::V_S> after a write
    const T* p = Data(i + 1, "GetValue");
    for (auto& d : twin::Cur().unsynced_s)
      if (offset_ + i * sizeof(T) < d.first + d.second && d.first < offset_ + (i + 1) * sizeof(T))
        twin::Fail("LocalTensor::GetValue: reads UB written by a vector instruction or copy without "
                   "SetFlag/WaitFlag<HardEvent::V_S> in between");
    return p[i];
  }
  void SetValue(uint32_t i, T v) {  // a scalar write: vector reads need SetFlag/WaitFlag<HardEvent::S_V>
    Data(i + 1, "SetValue")[i] = v;
    twin::Cur().unsynced_v.push_back({static_cast<uint32_t>(offset_ + i * sizeof(T)), sizeof(T)});
  }
  LocalTensor operator[](uint32_t offset) const {  // elements [offset, size) of this tensor
    Data(offset, "LocalTensor[]");
    return LocalTensor(slot_, generation_, offset_ + offset * sizeof(T), count_ - offset, owner_);
  }

 private:
  twin::Slot* slot_ = nullptr;
  uint64_t generation_ = 0;
  uint32_t offset_ = 0, count_ = 0;
  const char* owner_ = "?";
};

template <typename T>
class GlobalTensor {
 public:
  void SetGlobalBuffer(__gm__ T* base, uint64_t count) {
    base_ = base;
    count_ = count;
    if (count && !twin::Gm().Contains(base, count * sizeof(T)))
      twin::Fail("SetGlobalBuffer: [" + std::to_string(count) +
                 " elements] is not inside one GM allocation (bad argument or offset)");
  }
  GlobalTensor operator[](uint64_t offset) const {
    if (offset > count_) twin::Fail("GlobalTensor[]: offset " + std::to_string(offset) +
                                    " beyond the buffer of " + std::to_string(count_));
    GlobalTensor g;
    g.base_ = base_ + offset;
    g.count_ = count_ - offset;
    return g;
  }
  T* Data(uint64_t count, const char* api) const {
    if (count > count_)
      twin::Fail(std::string(api) + ": " + std::to_string(count) +
                 " elements past the end of the GlobalTensor (" + std::to_string(count_) + " left)");
    if (count && !twin::Gm().Contains(base_, count * sizeof(T)))
      twin::Fail(std::string(api) + ": GM access outside any allocation");
    return base_;
  }
  uint64_t GetSize() const { return count_; }
  // Scalar read of one GM element (the scalar unit's path).
  T GetValue(uint64_t i) const {
    if (i >= count_) twin::Fail("GlobalTensor::GetValue(" + std::to_string(i) + ") past the end (" +
                                std::to_string(count_) + ")");
    return Data(i + 1, "GlobalTensor::GetValue")[i];
  }

 private:
  T* base_ = nullptr;
  uint64_t count_ = 0;
};

class TPipe;

template <TPosition pos, int32_t depth>
class TQue {
 public:
  TQue() = default;
  TQue(const TQue&) = delete;
  ~TQue() {
    twin::Block* b = twin::Current();
    if (!b) return;
    int held = 0;
    for (auto& s : slots_) held += s.state != twin::Slot::kFree;
    if (held)
      b->errors.push_back("missing FreeTensor: a " + Name() + " queue still holds " +
                          std::to_string(held) + " tensor(s) when the block ends");
  }
  // The buffers are handed out in turn, starting after the last one allocated.
  template <typename T>
  LocalTensor<T> AllocTensor() {
    if (slots_.empty()) twin::Fail("AllocTensor on a " + Name() + " queue before InitBuffer");
    for (size_t i = 0; i < slots_.size(); ++i) {
      twin::Slot& s = slots_[(cursor_ + i) % slots_.size()];
      if (s.state != twin::Slot::kFree) continue;
      cursor_ = (cursor_ + i + 1) % slots_.size();
      twin::PositionIds& ids = Ids();
      if (s.holds_free_id) {  // the buffer's FreeTensor event is waited for: its ID is back
        --ids.freed;
        s.holds_free_id = false;
      }
      if (++ids.allocated > twin::kQueMaxEvent)
        twin::Fail("AllocTensor: " + std::to_string(ids.allocated) + " tensors allocated and not queued in position " +
                   Name() + ", at most " + std::to_string(twin::kQueMaxEvent) + " (max buffer number in same "
                   "queue position is 8)");
      s.state = twin::Slot::kAllocated;
      ++s.generation;
      return LocalTensor<T>(&s, s.generation, s.offset, s.bytes / sizeof(T), NameC());
    }
    twin::Fail("AllocTensor: all " + std::to_string(slots_.size()) + " buffers of a " + Name() +
               " queue are in use (a FreeTensor is missing)");
  }
  template <typename T>
  void EnQue(const LocalTensor<T>& t) {
    twin::Slot* s = Own(t, "EnQue");
    if (s->state != twin::Slot::kAllocated)
      twin::Fail("EnQue: the tensor is not freshly allocated (queued twice or already dequeued)");
    if (static_cast<int32_t>(fifo_.size()) >= depth)
      twin::Fail("EnQue: more consecutive EnQue than the queue depth " + std::to_string(depth) + " (" +
                 Name() + ")");
    twin::PositionIds& ids = Ids();
    --ids.allocated;
    if (++ids.enqueued > twin::kQueMaxEvent)
      twin::Fail("EnQue: out of " + std::string(pos == TPosition::VECIN ? "MTE2->V" : "V->MTE3") +
                 " event IDs in position " + Name() + ": current id is 8, max buffer number in same queue "
                 "position is 8");
    s->state = twin::Slot::kQueued;
    fifo_.push_back(s);
  }
  template <typename T>
  LocalTensor<T> DeQue() {
    if (fifo_.empty()) twin::Fail("DeQue on an empty " + Name() + " queue (EnQue/DeQue out of order)");
    twin::Slot* s = fifo_.front();
    fifo_.erase(fifo_.begin());
    s->state = twin::Slot::kDequeued;
    --Ids().enqueued;
    return LocalTensor<T>(s, s->generation, s->offset, s->bytes / sizeof(T), NameC());
  }
  template <typename T>
  void FreeTensor(const LocalTensor<T>& t) {
    twin::Slot* s = Own(t, "FreeTensor");
    if (s->state == twin::Slot::kFree) twin::Fail("FreeTensor: freed twice (" + Name() + ")");
    if (s->state == twin::Slot::kQueued) twin::Fail("FreeTensor: tensor still queued, DeQue it first");
    twin::PositionIds& ids = Ids();
    if (s->state == twin::Slot::kAllocated) --ids.allocated;
    if (++ids.freed > twin::kQueMaxEvent)
      twin::Fail("FreeTensor: out of " + std::string(pos == TPosition::VECIN ? "V->MTE2" : "MTE3->V") +
                 " event IDs in position " + Name() + " (each freed buffer holds one until its next "
                 "AllocTensor): current id is 8, max buffer number in same queue position is 8");
    s->holds_free_id = true;
    s->state = twin::Slot::kFree;
    ++s->generation;
  }

 private:
  friend class TPipe;
  std::string Name() const { return NameC(); }
  const char* NameC() const {
    return pos == TPosition::VECIN ? "VECIN" : pos == TPosition::VECOUT ? "VECOUT" : "VECCALC";
  }
  template <typename T>
  twin::Slot* Own(const LocalTensor<T>& t, const char* api) {
    for (auto& s : slots_)
      if (&s == t.GetSlot()) {
        if (s.generation != t.Generation()) twin::Fail(std::string(api) + ": stale tensor (already freed)");
        return &s;
      }
    twin::Fail(std::string(api) + ": tensor does not belong to this " + Name() + " queue");
  }
  twin::PositionIds& Ids() {
    static_assert(pos == TPosition::VECIN || pos == TPosition::VECOUT, "the twin models VECIN and VECOUT queues");
    return twin::Cur().ids[pos == TPosition::VECIN ? 0 : 1];
  }
  std::vector<twin::Slot> slots_;
  std::vector<twin::Slot*> fifo_;
  size_t cursor_ = 0;
};

template <TPosition pos>
class TBuf {
 public:
  template <typename T>
  LocalTensor<T> Get() {
    if (!init_) twin::Fail("TBuf::Get before InitBuffer");
    return LocalTensor<T>(&slot_, slot_.generation, slot_.offset, slot_.bytes / sizeof(T), "TBuf");
  }
  template <typename T>
  LocalTensor<T> Get(uint32_t count) {
    LocalTensor<T> t = Get<T>();
    if (count > t.GetSize()) twin::Fail("TBuf::Get: more elements than the buffer holds");
    return LocalTensor<T>(&slot_, slot_.generation, slot_.offset, count, "TBuf");
  }

 private:
  friend class TPipe;
  twin::Slot slot_;
  bool init_ = false;
};

class TPipe {
 public:
  template <TPosition pos, int32_t depth>
  void InitBuffer(TQue<pos, depth>& que, uint8_t num, uint32_t bytes) {
    if (num < 1) twin::Fail("InitBuffer: a queue needs at least one buffer");
    if (!que.slots_.empty()) twin::Fail("InitBuffer: queue initialised twice");
    Count(num);
    que.slots_.resize(num);
    for (auto& s : que.slots_) {
      s.offset = Carve(bytes);
      s.bytes = bytes;
    }
  }
  template <TPosition pos>
  void InitBuffer(TBuf<pos>& buf, uint32_t bytes) {
    if (buf.init_) twin::Fail("InitBuffer: TBuf initialised twice");
    Count(1);
    buf.slot_.offset = Carve(bytes);
    buf.slot_.bytes = bytes;
    buf.slot_.state = twin::Slot::kAllocated;
    buf.init_ = true;
  }

 private:
  void Count(uint32_t num) {
    buffers_ += num;
    if (buffers_ > twin::kMaxPipeBuffers)
      twin::Fail("InitBuffer: Total buffer num managed by TPipe is " + std::to_string(buffers_) +
                 ", should be in range (0, " + std::to_string(twin::kMaxPipeBuffers) + "]");
  }
  uint32_t buffers_ = 0;
  uint32_t Carve(uint32_t bytes) {
    twin::Block& b = twin::Cur();
    if (bytes == 0) twin::Fail("InitBuffer: zero bytes");
    uint32_t offset = (b.used + 31u) & ~31u;  // UB buffers start on 32-byte boundaries
    if (static_cast<uint64_t>(offset) + bytes > twin::Capacity())
      twin::Fail("UB overflow: InitBuffer of " + std::to_string(bytes) + " bytes at offset " +
                 std::to_string(offset) + " exceeds the " + std::to_string(twin::Capacity()) +
                 " usable bytes of UB");
    b.used = offset + bytes;
    return offset;
  }
};

// ---- copies ----------------------------------------------------------------------------------
struct DataCopyExtParams {
  uint16_t blockCount = 1;
  uint32_t blockLen = 0;  // bytes
  uint32_t srcStride = 0;
  uint32_t dstStride = 0;
  uint32_t rsv = 0;
};
template <typename T>
struct DataCopyPadExtParams {
  bool isPad = false;
  uint8_t leftPadding = 0;
  uint8_t rightPadding = 0;
  T paddingValue = T();
};

namespace detail {
template <typename T>
void CheckAligned(const LocalTensor<T>& t, uint32_t count, const char* api) {
  if (t.UbOffset() % 32) twin::Fail(std::string(api) + ": UB address not 32-byte aligned");
  if ((static_cast<uint64_t>(count) * sizeof(T)) % 32)
    twin::Fail(std::string(api) + ": " + std::to_string(count) + " elements of " +
               std::to_string(sizeof(T)) + " bytes is not a multiple of 32 bytes (use DataCopyPad)");
}
inline void Touch(uint32_t offset, uint32_t bytes) {
  twin::Cur().dirty.push_back({offset, bytes});
  auto& unsynced = twin::Cur().unsynced_s;  // bounded: past 4096 ranges, all of UB counts as written
  if (unsynced.size() < 4096) unsynced.push_back({offset, bytes});
  else unsynced.assign(1, {0u, static_cast<uint32_t>(AUTOFUSE_UB_BYTES)});
}
}  // namespace detail

template <typename T>
void DataCopy(LocalTensor<T>& dst, const GlobalTensor<T>& src, uint32_t count) {
  detail::CheckAligned(dst, count, "DataCopy GM->UB");
  std::memcpy(dst.Data(count, "DataCopy GM->UB"), src.Data(count, "DataCopy GM->UB"), count * sizeof(T));
  ++twin::Cur().copies;
}
template <typename T>
void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, uint32_t count) {
  detail::CheckAligned(src, count, "DataCopy UB->GM");
  std::memcpy(dst.Data(count, "DataCopy UB->GM"), src.Data(count, "DataCopy UB->GM"), count * sizeof(T));
  ++twin::Cur().copies;
}
template <typename T>
void DataCopy(LocalTensor<T>& dst, const LocalTensor<T>& src, uint32_t count) {
  detail::CheckAligned(dst, count, "DataCopy UB->UB");
  detail::CheckAligned(src, count, "DataCopy UB->UB");
  std::memmove(dst.Data(count, "DataCopy UB->UB"), src.Data(count, "DataCopy UB->UB"), count * sizeof(T));
  ++twin::Cur().copies;
}
template <typename T>
void DataCopyPad(LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyExtParams& p,
                 const DataCopyPadExtParams<T>& pad) {
  if (p.blockCount != 1 || p.srcStride || p.dstStride)
    twin::Fail("DataCopyPad: the twin models blockCount=1 without strides only");
  if (p.blockLen % sizeof(T)) twin::Fail("DataCopyPad: blockLen not a whole number of elements");
  if (dst.UbOffset() % 32) twin::Fail("DataCopyPad GM->UB: UB address not 32-byte aligned");
  uint32_t count = p.blockLen / sizeof(T);
  uint32_t padded = ((p.blockLen + 31u) & ~31u) / sizeof(T);
  T* d = dst.Data(padded, "DataCopyPad GM->UB");
  std::memcpy(d, src.Data(count, "DataCopyPad GM->UB"), p.blockLen);
  for (uint32_t i = count; i < padded; ++i) {
    if (pad.isPad) d[i] = pad.paddingValue;
    else std::memset(&d[i], 0xff, sizeof(T));  // undefined on hardware: garbage here
  }
  ++twin::Cur().copies;
}
template <typename T>
void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyExtParams& p) {
  if (p.blockCount != 1 || p.srcStride || p.dstStride)
    twin::Fail("DataCopyPad: the twin models blockCount=1 without strides only");
  if (p.blockLen % sizeof(T)) twin::Fail("DataCopyPad: blockLen not a whole number of elements");
  if (src.UbOffset() % 32) twin::Fail("DataCopyPad UB->GM: UB address not 32-byte aligned");
  uint32_t count = p.blockLen / sizeof(T);
  std::memcpy(dst.Data(count, "DataCopyPad UB->GM"), src.Data(count, "DataCopyPad UB->GM"), p.blockLen);
  ++twin::Cur().copies;
}

// ---- vector instructions ---------------------------------------------------------------------
namespace detail {
template <typename T, typename... A>
constexpr bool OneOf() { return (std::is_same<T, A>::value || ...); }

template <typename T>
using Wide = typename std::conditional<std::is_same<T, half>::value || std::is_same<T, bfloat16_t>::value ||
                                           std::is_same<T, float>::value, float, T>::type;

inline bool Overlaps(uint32_t a, uint32_t an, uint32_t b, uint32_t bn) { return a < b + bn && b < a + an; }

// A vector instruction reading UB written by an earlier one needs PipeBarrier<PIPE_V>() between.
template <typename T>
void CheckOperandAligned(const LocalTensor<T>& t, const char* api) {
  if (t.UbOffset() % 32)
    twin::Fail(std::string(api) + ": vector operand at UB offset " + std::to_string(t.UbOffset()) +
               " is not 32-byte aligned");
}
template <typename T>
void Read(const LocalTensor<T>& t, int32_t count, const char* api) {
  if (count < 0) twin::Fail(std::string(api) + ": negative count");
  CheckOperandAligned(t, api);
  t.Data(static_cast<uint32_t>(count), api);
  uint32_t bytes = count * sizeof(T);
  for (auto& d : twin::Cur().dirty)
    if (Overlaps(t.UbOffset(), bytes, d.first, d.second))
      twin::Fail(std::string(api) + ": reads UB written by the previous vector instruction "
                 "without PipeBarrier<PIPE_V>()");
  for (auto& d : twin::Cur().unsynced_v)
    if (Overlaps(t.UbOffset(), bytes, d.first, d.second))
      twin::Fail(std::string(api) + ": reads UB written by LocalTensor::SetValue without "
                 "SetFlag/WaitFlag<HardEvent::S_V> in between");
}
template <typename T>
T* Write(const LocalTensor<T>& t, int32_t count, const char* api) {
  if (count < 0) twin::Fail(std::string(api) + ": negative count");
  CheckOperandAligned(t, api);
  T* p = t.Data(static_cast<uint32_t>(count), api);
  ++twin::Cur().vector_ops;
  return p;
}
template <typename T>
void Done(const LocalTensor<T>& t, int32_t count) { Touch(t.UbOffset(), count * sizeof(T)); }

template <typename T, typename F>
void Unary(const LocalTensor<T>& dst, const LocalTensor<T>& src, int32_t n, const char* api, F f) {
  Read(src, n, api);
  const T* s = src.Data(n, api);
  std::vector<T> tmp(s, s + n);
  T* d = Write(dst, n, api);
  for (int32_t i = 0; i < n; ++i) d[i] = T(f(static_cast<Wide<T>>(tmp[i])));
  Done(dst, n);
}
// dst[i] = f(src[i]) between element types (the Cast family); src is read before dst is written.
template <typename D, typename S, typename F>
void Convert(const LocalTensor<D>& dst, const LocalTensor<S>& src, int32_t n, F f) {
  Read(src, n, "Cast");
  std::vector<S> tmp(src.Data(n, "Cast"), src.Data(n, "Cast") + n);
  D* d = Write(dst, n, "Cast");
  for (int32_t i = 0; i < n; ++i) d[i] = f(tmp[i]);
  Done(dst, n);
}
template <typename T, typename F>
void Binary(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b, int32_t n,
            const char* api, F f) {
  Read(a, n, api);
  Read(b, n, api);
  std::vector<T> x(a.Data(n, api), a.Data(n, api) + n), y(b.Data(n, api), b.Data(n, api) + n);
  T* d = Write(dst, n, api);
  for (int32_t i = 0; i < n; ++i) d[i] = T(f(static_cast<Wide<T>>(x[i]), static_cast<Wide<T>>(y[i])));
  Done(dst, n);
}
// i32 arithmetic wraps like the hardware's.
inline int32_t Wrap(int64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(v))); }
}  // namespace detail

#define TWIN_FLOAT_ONLY(T, api) \
  static_assert(detail::OneOf<T, half, float>(), api " takes half or float")
#define TWIN_ARITH(T, api) \
  static_assert(detail::OneOf<T, half, float, int16_t, int32_t>(), api " takes half, float, int16 or int32")

template <typename T> void Abs(LocalTensor<T>& d, const LocalTensor<T>& s, const int32_t& n) {
  TWIN_FLOAT_ONLY(T, "Abs"); detail::Unary(d, s, n, "Abs", [](float x) { return std::fabs(x); });
}
template <typename T> void Relu(LocalTensor<T>& d, const LocalTensor<T>& s, const int32_t& n) {
  static_assert(detail::OneOf<T, half, float, int32_t>(), "Relu takes half, float or int32");
  detail::Unary(d, s, n, "Relu", [](detail::Wide<T> x) { return x > 0 ? x : detail::Wide<T>(0); });
}
template <typename T> void Exp(LocalTensor<T>& d, const LocalTensor<T>& s, const int32_t& n) {
  TWIN_FLOAT_ONLY(T, "Exp"); detail::Unary(d, s, n, "Exp", [](float x) { return std::exp(x); });
}
template <typename T> void Ln(LocalTensor<T>& d, const LocalTensor<T>& s, const int32_t& n) {
  TWIN_FLOAT_ONLY(T, "Ln"); detail::Unary(d, s, n, "Ln", [](float x) { return std::log(x); });
}
template <typename T> void Sqrt(LocalTensor<T>& d, const LocalTensor<T>& s, const int32_t& n) {
  TWIN_FLOAT_ONLY(T, "Sqrt"); detail::Unary(d, s, n, "Sqrt", [](float x) { return std::sqrt(x); });
}
template <typename T> void Add(LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b, const int32_t& n) {
  TWIN_ARITH(T, "Add");
  detail::Binary(d, a, b, n, "Add", [](detail::Wide<T> x, detail::Wide<T> y) {
    if constexpr (std::is_integral<T>::value) return detail::Wrap(int64_t(x) + y); else return x + y; });
}
template <typename T> void Sub(LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b, const int32_t& n) {
  TWIN_ARITH(T, "Sub");
  detail::Binary(d, a, b, n, "Sub", [](detail::Wide<T> x, detail::Wide<T> y) {
    if constexpr (std::is_integral<T>::value) return detail::Wrap(int64_t(x) - y); else return x - y; });
}
template <typename T> void Mul(LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b, const int32_t& n) {
  TWIN_ARITH(T, "Mul");
  detail::Binary(d, a, b, n, "Mul", [](detail::Wide<T> x, detail::Wide<T> y) {
    if constexpr (std::is_integral<T>::value) return detail::Wrap(int64_t(x) * y); else return x * y; });
}
template <typename T> void Div(LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b, const int32_t& n) {
  TWIN_FLOAT_ONLY(T, "Div"); detail::Binary(d, a, b, n, "Div", [](float x, float y) { return x / y; });
}
template <typename T> void Max(LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b, const int32_t& n) {
  TWIN_ARITH(T, "Max");
  detail::Binary(d, a, b, n, "Max", [](detail::Wide<T> x, detail::Wide<T> y) { return x > y ? x : y; });
}
template <typename T> void Min(LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b, const int32_t& n) {
  TWIN_ARITH(T, "Min");
  detail::Binary(d, a, b, n, "Min", [](detail::Wide<T> x, detail::Wide<T> y) { return x < y ? x : y; });
}
template <typename T> void And(LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b, const int32_t& n) {
  static_assert(detail::OneOf<T, int16_t, uint16_t>(), "And takes int16 or uint16");
  detail::Binary(d, a, b, n, "And", [](T x, T y) { return T(x & y); });
}
template <typename T> void Or(LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b, const int32_t& n) {
  static_assert(detail::OneOf<T, int16_t, uint16_t>(), "Or takes int16 or uint16");
  detail::Binary(d, a, b, n, "Or", [](T x, T y) { return T(x | y); });
}
template <typename T> void Adds(LocalTensor<T>& d, const LocalTensor<T>& s, const T& c, const int32_t& n) {
  TWIN_ARITH(T, "Adds"); detail::Wide<T> k = c;
  detail::Unary(d, s, n, "Adds", [k](detail::Wide<T> x) {
    if constexpr (std::is_integral<T>::value) return detail::Wrap(int64_t(x) + k); else return x + k; });
}
template <typename T> void Muls(LocalTensor<T>& d, const LocalTensor<T>& s, const T& c, const int32_t& n) {
  TWIN_ARITH(T, "Muls"); detail::Wide<T> k = c;
  detail::Unary(d, s, n, "Muls", [k](detail::Wide<T> x) {
    if constexpr (std::is_integral<T>::value) return detail::Wrap(int64_t(x) * k); else return x * k; });
}
template <typename T> void Maxs(LocalTensor<T>& d, const LocalTensor<T>& s, const T& c, const int32_t& n) {
  TWIN_ARITH(T, "Maxs"); detail::Wide<T> k = c;
  detail::Unary(d, s, n, "Maxs", [k](detail::Wide<T> x) { return x > k ? x : k; });
}
template <typename T> void Mins(LocalTensor<T>& d, const LocalTensor<T>& s, const T& c, const int32_t& n) {
  TWIN_ARITH(T, "Mins"); detail::Wide<T> k = c;
  detail::Unary(d, s, n, "Mins", [k](detail::Wide<T> x) { return x < k ? x : k; });
}
template <typename T> void LeakyRelu(LocalTensor<T>& d, const LocalTensor<T>& s, const T& c, const int32_t& n) {
  TWIN_FLOAT_ONLY(T, "LeakyRelu"); float k = c;
  detail::Unary(d, s, n, "LeakyRelu", [k](float x) { return x < 0 ? x * k : x; });
}
template <typename T> void Duplicate(LocalTensor<T>& d, const T& c, const int32_t& n) {
  static_assert(detail::OneOf<T, half, float, int16_t, int32_t, uint16_t, uint32_t>(), "Duplicate: bad type");
  T* p = detail::Write(d, n, "Duplicate");
  for (int32_t i = 0; i < n; ++i) p[i] = c;
  detail::Done(d, n);
}

// dst[0] = the reduction of src[0, count). The shared temp buffer must be a separate tensor; its
// contents are clobbered. fp32 is summed pairwise over 64-lane repeats, as the vector unit folds.
namespace detail {
template <typename T, typename F>
void Reduce(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& tmp, int32_t n,
            const char* api, F fold) {
  if (n <= 0) twin::Fail(std::string(api) + ": count must be positive");
  Read(src, n, api);
  if (tmp.UbOffset() == src.UbOffset() || tmp.UbOffset() == dst.UbOffset())
    twin::Fail(std::string(api) + ": the shared temp buffer must not be src or dst");
  T* scratch = Write(tmp, n < static_cast<int32_t>(tmp.GetSize()) ? n : tmp.GetSize(), api);
  std::vector<float> v(src.Data(n, api), src.Data(n, api) + n);
  while (v.size() > 1) {  // pairwise, like the repeat-wise folds of the hardware
    std::vector<float> next((v.size() + 1) / 2);
    for (size_t i = 0; i < next.size(); ++i)
      next[i] = 2 * i + 1 < v.size() ? static_cast<float>(T(fold(v[2 * i], v[2 * i + 1]))) : v[2 * i];
    v.swap(next);
  }
  std::memset(scratch, 0xEE, sizeof(T));
  T* d = Write(dst, 1, api);
  d[0] = T(v[0]);
  Done(dst, 1);
  Done(tmp, 1);
}
}  // namespace detail
template <typename T> void ReduceSum(LocalTensor<T>& d, const LocalTensor<T>& s, const LocalTensor<T>& tmp, const int32_t n) {
  TWIN_FLOAT_ONLY(T, "ReduceSum"); detail::Reduce(d, s, tmp, n, "ReduceSum", [](float a, float b) { return a + b; });
}
template <typename T> void ReduceMax(LocalTensor<T>& d, const LocalTensor<T>& s, const LocalTensor<T>& tmp, const int32_t n) {
  TWIN_FLOAT_ONLY(T, "ReduceMax");
  detail::Reduce(d, s, tmp, n, "ReduceMax", [](float a, float b) { return std::isnan(a) || a > b ? a : b; });
}
template <typename T> void ReduceMin(LocalTensor<T>& d, const LocalTensor<T>& s, const LocalTensor<T>& tmp, const int32_t n) {
  TWIN_FLOAT_ONLY(T, "ReduceMin");
  detail::Reduce(d, s, tmp, n, "ReduceMin", [](float a, float b) { return std::isnan(a) || a < b ? a : b; });
}

// dst: one bit per element (LSB first), set where src0 <mode> src1 holds; NaN compares false
// except NE. count * sizeof(T) must be a multiple of 256 bytes.
template <typename T>
void Compare(LocalTensor<uint8_t>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b, CMPMODE mode,
             uint32_t count) {
  TWIN_FLOAT_ONLY(T, "Compare");
  if ((count * sizeof(T)) % 256) twin::Fail("Compare: count * sizeof(T) must be a multiple of 256 bytes");
  int32_t n = static_cast<int32_t>(count);
  detail::Read(a, n, "Compare");
  detail::Read(b, n, "Compare");
  std::vector<float> x(n), y(n);
  for (int32_t i = 0; i < n; ++i) { x[i] = a.Data(n, "Compare")[i]; y[i] = b.Data(n, "Compare")[i]; }
  uint8_t* m = detail::Write(dst, n / 8, "Compare");
  for (int32_t i = 0; i < n; ++i) {
    bool r = mode == CMPMODE::LT ? x[i] < y[i] : mode == CMPMODE::GT ? x[i] > y[i] : mode == CMPMODE::EQ ? x[i] == y[i]
           : mode == CMPMODE::LE ? x[i] <= y[i] : mode == CMPMODE::GE ? x[i] >= y[i] : x[i] != y[i];
    if (r) m[i / 8] |= uint8_t(1u << (i % 8)); else m[i / 8] &= uint8_t(~(1u << (i % 8)));
  }
  detail::Done(dst, n / 8);
}
// dst[i] = bit i of mask ? src0[i] : src1[i]
template <typename T>
void Select(LocalTensor<T>& dst, const LocalTensor<uint8_t>& mask, const LocalTensor<T>& a,
            const LocalTensor<T>& b, SELMODE mode, uint32_t count) {
  TWIN_FLOAT_ONLY(T, "Select");
  if (mode != SELMODE::VSEL_TENSOR_TENSOR_MODE) twin::Fail("Select: the twin models VSEL_TENSOR_TENSOR_MODE only");
  int32_t n = static_cast<int32_t>(count);
  detail::Read(mask, (n + 7) / 8, "Select");
  detail::Read(a, n, "Select");
  detail::Read(b, n, "Select");
  std::vector<uint8_t> m(mask.Data((n + 7) / 8, "Select"), mask.Data((n + 7) / 8, "Select") + (n + 7) / 8);
  std::vector<T> x(a.Data(n, "Select"), a.Data(n, "Select") + n), y(b.Data(n, "Select"), b.Data(n, "Select") + n);
  T* d = detail::Write(dst, n, "Select");
  for (int32_t i = 0; i < n; ++i) d[i] = (m[i / 8] >> (i % 8)) & 1u ? x[i] : y[i];
  detail::Done(dst, n);
}

// float -> int32 with a rounding mode, int32 -> float (CAST_NONE: round to nearest even).
inline int32_t TwinRound(float x, RoundMode mode) {
  double r = mode == RoundMode::CAST_FLOOR ? std::floor(x) : mode == RoundMode::CAST_CEIL ? std::ceil(x)
           : mode == RoundMode::CAST_TRUNC ? std::trunc(x) : mode == RoundMode::CAST_ROUND ? std::round(x)
           : std::nearbyint(x);
  if (std::isnan(r)) return 0;
  if (r >= 2147483647.0) return 2147483647;  // saturates
  if (r <= -2147483648.0) return -2147483647 - 1;
  return static_cast<int32_t>(r);
}
inline void Cast(LocalTensor<int32_t>& dst, const LocalTensor<float>& src, const RoundMode& mode,
                 const uint32_t count) {
  if (mode == RoundMode::CAST_NONE || mode == RoundMode::CAST_ODD) twin::Fail("Cast float->int32 needs a rounding mode");
  detail::Convert(dst, src, static_cast<int32_t>(count), [&](auto v) { return TwinRound(v, mode); });
}
inline void Cast(LocalTensor<float>& dst, const LocalTensor<int32_t>& src, const RoundMode& mode,
                 const uint32_t count) {
  if (mode != RoundMode::CAST_NONE) twin::Fail("Cast int32->float: the twin models CAST_NONE only");
  detail::Convert(dst, src, static_cast<int32_t>(count), [&](auto v) { return static_cast<float>(v); });
}

template <typename D, typename S>
void Cast(LocalTensor<D>& dst, const LocalTensor<S>& src, const RoundMode& mode, const uint32_t count) {
  constexpr bool up = (std::is_same<S, half>::value || std::is_same<S, bfloat16_t>::value) && std::is_same<D, float>::value;
  constexpr bool down = std::is_same<S, float>::value && (std::is_same<D, half>::value || std::is_same<D, bfloat16_t>::value);
  static_assert(up || down, "Cast: the twin models half/bf16 <-> float only");
  if (up && mode != RoundMode::CAST_NONE) twin::Fail("Cast: a widening cast takes CAST_NONE");
  if (down && mode != RoundMode::CAST_RINT && mode != RoundMode::CAST_NONE)
    twin::Fail("Cast: the twin models round-to-nearest-even narrowing only");
  if (std::is_same<D, bfloat16_t>::value && mode == RoundMode::CAST_NONE)
    twin::Fail("Cast float->bfloat16_t: CAST_NONE is not supported, give a rounding mode (CAST_RINT)");
  detail::Convert(dst, src, static_cast<int32_t>(count), [&](auto v) { return D(static_cast<float>(v)); });
}

// ---- ops added for opmap coverage ----
// bool values (uint8 0/1 in GM, float 0/1 in UB), int32 Equal, and the advanced math library.

// int32 Compare: the A2/A3 vector Compare takes int32 with CMPMODE::EQ only; same 256-byte rule.
inline void Compare(LocalTensor<uint8_t>& dst, const LocalTensor<int32_t>& a, const LocalTensor<int32_t>& b,
                    CMPMODE mode, uint32_t count) {
  if (mode != CMPMODE::EQ) twin::Fail("Compare: int32 takes CMPMODE::EQ only");
  if ((count * sizeof(int32_t)) % 256) twin::Fail("Compare: count * sizeof(T) must be a multiple of 256 bytes");
  int32_t n = static_cast<int32_t>(count);
  detail::Read(a, n, "Compare");
  detail::Read(b, n, "Compare");
  std::vector<int32_t> x(a.Data(n, "Compare"), a.Data(n, "Compare") + n), y(b.Data(n, "Compare"), b.Data(n, "Compare") + n);
  uint8_t* m = detail::Write(dst, n / 8, "Compare");
  for (int32_t i = 0; i < n; ++i) {
    if (x[i] == y[i]) m[i / 8] |= uint8_t(1u << (i % 8)); else m[i / 8] &= uint8_t(~(1u << (i % 8)));
  }
  detail::Done(dst, n / 8);
}

// uint8 -> half (exact, CAST_NONE) and half -> uint8 (a rounding mode; out-of-range saturates to
// [0, 255]). There is no direct uint8 <-> float conversion.
inline void Cast(LocalTensor<half>& dst, const LocalTensor<uint8_t>& src, const RoundMode& mode, const uint32_t count) {
  if (mode != RoundMode::CAST_NONE) twin::Fail("Cast uint8->half takes CAST_NONE");
  detail::Convert(dst, src, static_cast<int32_t>(count), [&](auto v) { return half(static_cast<float>(v)); });
}
inline void Cast(LocalTensor<uint8_t>& dst, const LocalTensor<half>& src, const RoundMode& mode, const uint32_t count) {
  if (mode == RoundMode::CAST_NONE || mode == RoundMode::CAST_ODD) twin::Fail("Cast half->uint8 needs a rounding mode");
  detail::Convert(dst, src, static_cast<int32_t>(count), [&](half v) {
    const int32_t r = TwinRound(static_cast<float>(v), mode);
    return static_cast<uint8_t>(r < 0 ? 0 : r > 255 ? 255 : r);
  });
}

// Advanced math: dst = f(src) with a caller-provided shared temp buffer. The generator reserves
// the GetXxxMaxMinTmpSize maximum (maxLiveNodeCount * count * sizeof(T), + extra bytes); the twin
// checks that size, that the buffer is a separate tensor, and clobbers it. Values come from libm
// in fp32: the hardware's polynomial approximations may differ in the last bits.
namespace detail {
template <typename T>
void CheckSharedTmp(const LocalTensor<uint8_t>& tmp, const std::vector<uint32_t>& others, int32_t n,
                    uint32_t nodes, uint32_t extra, const char* api) {
  uint64_t need = static_cast<uint64_t>(nodes) * (n * sizeof(T) > 256 ? n * sizeof(T) : 256) + extra;
  if (tmp.GetSize() < need)
    twin::Fail(std::string(api) + ": sharedTmpBuffer of " + std::to_string(tmp.GetSize()) + " bytes, " +
               std::to_string(need) + " needed for " + std::to_string(n) + " elements");
  for (uint32_t off : others)
    if (Overlaps(tmp.UbOffset(), static_cast<uint32_t>(need), off, n * sizeof(T)))
      twin::Fail(std::string(api) + ": sharedTmpBuffer overlaps src or dst");
  uint8_t* p = Write(tmp, static_cast<int32_t>(need), api);
  std::memset(p, 0xC3, need);
  Done(tmp, static_cast<int32_t>(need));
}
template <typename T, typename F>
void AdvUnary(LocalTensor<T>& d, const LocalTensor<T>& s, const LocalTensor<uint8_t>& tmp, uint32_t count,
              uint32_t nodes, const char* api, F f) {
  int32_t n = static_cast<int32_t>(count);
  Read(s, n, api);
  Read(tmp, 0, api);
  CheckSharedTmp<T>(tmp, {s.UbOffset(), d.UbOffset()}, n, nodes, 0, api);
  Unary(d, s, n, api, f);
}
}  // namespace detail
// F32 / F16: the temp buffer's minimum, in multiples of the operand's bytes, for float / half.
#define TWIN_ADV_UNARY(NAME, F32, F16, FN)                                                               \
  template <typename T, bool isReuseSource = false>                                                      \
  void NAME(LocalTensor<T>& d, const LocalTensor<T>& s, const LocalTensor<uint8_t>& tmp, const uint32_t n) { \
    TWIN_FLOAT_ONLY(T, #NAME);                                                                           \
    detail::AdvUnary(d, s, tmp, n, std::is_same<T, float>::value ? F32 : F16, #NAME,                    \
                     [](float x) { return FN; });                                                        \
  }
TWIN_ADV_UNARY(Erf, 3, 8, std::erf(x))
TWIN_ADV_UNARY(Erfc, 7, 16, std::erfc(x))
TWIN_ADV_UNARY(Sin, 3, 8, std::sin(x))
TWIN_ADV_UNARY(Cos, 3, 8, std::cos(x))
TWIN_ADV_UNARY(Tan, 3, 10, std::tan(x))
TWIN_ADV_UNARY(Atan, 4, 12, std::atan(x))
#undef TWIN_ADV_UNARY
// Power(tensor, tensor): fp32 needs 4 live nodes + 256 bytes.
template <typename T, bool isReuseSource = false>
void Power(LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b, const LocalTensor<uint8_t>& tmp,
           const uint32_t count) {
  static_assert(detail::OneOf<T, float>(), "the twin models Power on float only");
  int32_t n = static_cast<int32_t>(count);
  detail::Read(a, n, "Power");
  detail::Read(b, n, "Power");
  detail::CheckSharedTmp<T>(tmp, {a.UbOffset(), b.UbOffset(), d.UbOffset()}, n, 4, 256, "Power");
  detail::Binary(d, a, b, n, "Power", [](float x, float y) { return std::pow(x, y); });
}
// ---- end of ops added for opmap coverage ----

// ---- APIs added for reduce/broadcast schedules ----
// Vector -> scalar synchronisation: the scalar unit may read UB (LocalTensor::GetValue) written by
// a vector instruction only after SetFlag<HardEvent::V_S>(id) and WaitFlag<HardEvent::V_S>(id) of
// the same event id; a WaitFlag without its SetFlag is an error. Likewise a vector instruction may
// read UB written by LocalTensor::SetValue only after SetFlag/WaitFlag<HardEvent::S_V>.
// (LocalTensor::operator[], GetValue's and SetValue's checks and Read's S_V check live in the
// class and in detail::Read above.)
enum class HardEvent { V_S, S_V, MTE2_V, V_MTE3, MTE2_S, MTE3_S };
}  // namespace AscendC
enum event_t : int { EVENT_ID0 = 0, EVENT_ID1, EVENT_ID2, EVENT_ID3, EVENT_ID4, EVENT_ID5, EVENT_ID6, EVENT_ID7 };
namespace twin {
inline std::map<std::pair<int, int>, int>& Flags() {  // (event, id) -> sets not yet waited, this block
  static thread_local Block* owner = nullptr;
  static thread_local std::map<std::pair<int, int>, int> flags;
  if (owner != &Cur()) {
    owner = &Cur();
    flags.clear();
  }
  return flags;
}
}  // namespace twin
namespace AscendC {
template <HardEvent e>
inline void SetFlag(int32_t id) {
  twin::Cur();
  if (id < 0 || id > 7) twin::Fail("SetFlag: event id out of range");
  ++twin::Flags()[{static_cast<int>(e), id}];
}
template <HardEvent e>
inline void WaitFlag(int32_t id) {
  int& pending = twin::Flags()[{static_cast<int>(e), id}];
  if (pending <= 0) twin::Fail("WaitFlag without a matching SetFlag of the same event and id");
  --pending;
  if (e == HardEvent::V_S || e == HardEvent::MTE2_S) twin::Cur().unsynced_s.clear();
  if (e == HardEvent::S_V) twin::Cur().unsynced_v.clear();
}
// ---- end of APIs added for reduce/broadcast schedules ----
}  // namespace AscendC

// ---- running blocks ----------------------------------------------------------------------------
namespace twin {
// Runs `kernel(args...)` once per block, as the hardware would on `block_dim` cores. Returns "" or
// the first violation, naming the block.
template <typename F, typename... A>
std::string RunBlocks(uint32_t block_dim, F kernel, A... args) {
  for (uint32_t i = 0; i < block_dim; ++i) {
    auto block = std::make_unique<Block>();
    block->idx = i;
    block->num = block_dim;
    std::memset(block->ub, 0xA5, sizeof(block->ub));  // UB starts as garbage
    Current() = block.get();
    std::string error;
    try {
      kernel(args...);
    } catch (const Violation& v) {
      error = v.what();
    }
    Current() = nullptr;
    if (error.empty() && !block->errors.empty()) error = block->errors.front();
    if (!error.empty()) return "twin: block " + std::to_string(i) + " of " + std::to_string(block_dim) + ": " + error;
  }
  return "";
}
}  // namespace twin

#endif  // TF_AUTOFUSE_TWIN_KERNEL_OPERATOR_H_
