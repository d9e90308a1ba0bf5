// The tiled CPU interpreter of a fused program.
//
// Plan (built once, when the kernel is constructed)
//   * The flat element range of the (equal-shaped) inputs is cut into tiles of `tile_size_`
//     elements. Every instruction runs over a whole tile as one vectorised loop (Eigen array
//     expressions, the same functors TensorFlow's CPU kernels use) before the next instruction
//     starts, so a tile's intermediate values never leave L1.
//   * Every intermediate value lives in a scratch *slot* of one tile. Slots are assigned by a
//     linear scan over the schedule: a slot is released after its value's last use and reused
//     by the next value (the instruction that reads a value for the last time may write its
//     result into the same slot: elementwise, so in place is safe). A chain of any length needs
//     one slot; a diamond two. Values no output depends on are not computed.
//   * f32, f64 and i32 inputs are read straight from the input tensor. f16 and bf16 inputs are
//     widened into an fp32 slot once, at their first use; f16/bf16 outputs are rounded to
//     nearest even from their fp32 slot right after the value is computed.
//   * Three schedules of the same program, differing only in how they reach the tensors:
//       direct     full tiles: an f32/f64/i32 value that is an output is written straight into
//                  the output tensor;
//       streaming  full tiles of a large run (>= kStreamBytes of output): outputs go through a
//                  slot and are stored non-temporally, which saves reading every destination
//                  cache line first (a third of a memory-bound kernel's traffic);
//       staged     a ragged last tile (length not a multiple of 16): every input is copied into
//                  a zero-padded slot and every output stored from a slot, so that every
//                  instruction still runs on whole SIMD packets and nothing reaches past a
//                  tensor's end. An element is computed by the same code wherever it sits,
//                  whatever the number of threads: results are bit-identical across them.
//   * The tile size is the largest power of two (1024..4096) whose slots and tensor streams fit
//     in 24 KiB of the 32 KiB L1d.
//
// Output forwarding: an output may take over an input's buffer when, within a tile and in every
// schedule, every read of that input comes no later than the output's first write
// (ForwardableInputs). Tiles are disjoint, so tiles on different threads never see each other's
// writes.

#include "interpreter.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <type_traits>

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define TF_AUTOFUSE_X86_CONVERT 1
#endif

#include "Eigen/Core"
#include "unsupported/Eigen/SpecialFunctions"

namespace tf_autofuse {

// ---------------------------------------------------------------------------------------------
// Schedule: what runs on every tile.

namespace {

// The type values are computed in: 16-bit floats are computed in fp32.
enum class ComputeType : uint8_t { kF32, kF64, kI32 };

ComputeType ComputeTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return ComputeType::kF64;
    case DType::kI32:
      return ComputeType::kI32;
    default:
      return ComputeType::kF32;
  }
}

int ComputeSize(ComputeType type) { return type == ComputeType::kF64 ? 8 : 4; }

// Values of these dtypes are stored as they are computed, so tensors can be used in place.
bool IsComputedAsStored(DType dtype) { return dtype != DType::kF16 && dtype != DType::kBF16; }

// Slots and tiles are padded to this many elements: a whole number of SIMD packets, and a slot
// is a multiple of 64 bytes.
constexpr int64_t kPad = 16;

// L1 space a tile may take, slots and tensor streams together: three quarters of a 32 KiB L1d.
constexpr int64_t kTileBudgetBytes = 24 * 1024;
constexpr int64_t kMinTile = 1024;
constexpr int64_t kMaxTile = 4096;

// From this many bytes of output per run, outputs are written with non-temporal stores: they
// would not stay in the caches anyway (2 cores share a 32 MiB L3 here), and skipping the read of
// each destination line saves a third of the memory traffic. Below it, the next kernel finds
// the output in cache.
constexpr int64_t kStreamBytes = 16 << 20;

}  // namespace

// Where an operand or result lives within the current tile.
struct Loc {
  enum class Kind : uint8_t { kSlot, kInput, kOutput, kImmediate };
  Kind kind = Kind::kSlot;
  int index = 0;       // slot (virtual register while planning), input or output number
  int elem_size = 0;   // bytes per element of the input/output tensor
  union {
    float f32;
    double f64;
    int32_t i32;
  } imm{};             // kImmediate, already in the compute type

  bool is(Kind k) const { return kind == k; }
};

struct Step {
  enum class Kind : uint8_t {
    kLoad,          // input tensor -> slot (widening f16/bf16; zero padding in a ragged tile)
    kCompute,       // one instruction over the tile
    kConvertStore,  // slot -> output tensor (rounding to f16/bf16)
    kCopyStore,     // tensor -> output tensor, same dtype (an output of an input or of a value
                    // that another output already holds)
  };
  Kind kind = Kind::kCompute;
  OpCode op = OpCode::kAbs;
  ComputeType ctype = ComputeType::kF32;  // of the slot a load fills / a compute or store reads
  DType dtype = DType::kF32;              // of the tensor a load reads / a store writes
  bool stream = false;                    // a store with non-temporal writes
  int num_src = 0;
  Loc src[2];
  Loc dst;
};

struct Schedule {
  std::vector<Step> steps;
  int num_slots = 0;
  std::vector<int> last_input_read;    // per input: last step reading its tensor, -1 if none
  std::vector<int> first_output_write; // per output: first step writing its tensor
};

namespace {

// Values that reach an output; the others are not computed.
std::vector<bool> LiveInstructions(const Program& program) {
  std::vector<bool> live(program.instructions.size(), false);
  for (const Operand& out : program.outputs) {
    if (out.kind == Operand::Kind::kValue) live[out.index] = true;
  }
  for (int i = static_cast<int>(program.instructions.size()) - 1; i >= 0; --i) {
    if (!live[i]) continue;
    const Instruction& inst = program.instructions[i];
    for (int k = 0; k < inst.num_operands; ++k) {
      if (inst.operands[k].kind == Operand::Kind::kValue) live[inst.operands[k].index] = true;
    }
  }
  return live;
}

Loc ImmediateLoc(double value, DType dtype) {
  Loc loc;
  loc.kind = Loc::Kind::kImmediate;
  switch (dtype) {
    case DType::kF16:  // a scalar of the value's type, then widened like the tensors
      loc.imm.f32 = static_cast<float>(Eigen::half(static_cast<float>(value)));
      break;
    case DType::kBF16:
      loc.imm.f32 = static_cast<float>(Eigen::bfloat16(static_cast<float>(value)));
      break;
    case DType::kF32:
      loc.imm.f32 = static_cast<float>(value);
      break;
    case DType::kF64:
      loc.imm.f64 = value;
      break;
    case DType::kI32:
      loc.imm.i32 = static_cast<int32_t>(value);  // validated: integral and in range
      break;
  }
  return loc;
}

// How a schedule reaches the tensors.
struct Access {
  bool direct_inputs;   // f32/f64/i32 inputs read in place (else loaded into padded slots)
  bool direct_outputs;  // f32/f64/i32 outputs written in place (else stored from slots)
  bool stream_outputs;  // stores bypass the caches (non-temporal)
};

class Planner {
 public:
  Planner(const Program& program, Access access) : program_(program), access_(access) {}

  Schedule Build() {
    const std::vector<bool> live = LiveInstructions(program_);
    input_loc_.assign(program_.inputs.size(), Loc());
    input_loaded_.assign(program_.inputs.size(), false);
    value_loc_.assign(program_.instructions.size(), Loc());
    for (size_t i = 0; i < program_.instructions.size(); ++i) {
      if (live[i]) EmitInstruction(static_cast<int>(i));
    }
    for (size_t k = 0; k < program_.outputs.size(); ++k) {
      const Operand& out = program_.outputs[k];
      if (out.kind != Operand::Kind::kInput) continue;
      Step store;
      store.kind = Step::Kind::kCopyStore;
      store.stream = access_.stream_outputs;
      store.dtype = program_.inputs[out.index].dtype;
      store.num_src = 1;
      store.src[0] = TensorLoc(Loc::Kind::kInput, out.index);
      store.dst = TensorLoc(Loc::Kind::kOutput, static_cast<int>(k));
      schedule_.steps.push_back(store);
    }
    AssignSlots();
    RecordTensorAccesses();
    return std::move(schedule_);
  }

 private:
  Loc TensorLoc(Loc::Kind kind, int index) const {
    Loc loc;
    loc.kind = kind;
    loc.index = index;
    const DType dtype = kind == Loc::Kind::kInput ? program_.inputs[index].dtype
                                                  : program_.OutputDType(index);
    loc.elem_size = DTypeSize(dtype);
    return loc;
  }

  Loc NewRegister() {
    Loc loc;
    loc.kind = Loc::Kind::kSlot;
    loc.index = num_registers_++;
    return loc;
  }

  Loc OperandLoc(const Operand& operand, DType dtype) {
    switch (operand.kind) {
      case Operand::Kind::kImmediate:
        return ImmediateLoc(operand.immediate, dtype);
      case Operand::Kind::kValue:
        return value_loc_[operand.index];
      case Operand::Kind::kInput:
        break;
    }
    const int j = operand.index;
    const DType input_dtype = program_.inputs[j].dtype;
    if (access_.direct_inputs && IsComputedAsStored(input_dtype)) {
      return TensorLoc(Loc::Kind::kInput, j);
    }
    if (!input_loaded_[j]) {  // first use: load the tile into a slot
      Step load;
      load.kind = Step::Kind::kLoad;
      load.dtype = input_dtype;
      load.ctype = ComputeTypeOf(input_dtype);
      load.num_src = 1;
      load.src[0] = TensorLoc(Loc::Kind::kInput, j);
      load.dst = NewRegister();
      schedule_.steps.push_back(load);
      input_loc_[j] = load.dst;
      input_loaded_[j] = true;
    }
    return input_loc_[j];
  }

  void EmitInstruction(int i) {
    const Instruction& inst = program_.instructions[i];
    Step step;
    step.kind = Step::Kind::kCompute;
    step.op = inst.op;
    step.dtype = inst.dtype;
    step.ctype = ComputeTypeOf(inst.dtype);
    step.num_src = inst.num_operands;
    for (int k = 0; k < inst.num_operands; ++k) {
      step.src[k] = OperandLoc(inst.operands[k], inst.dtype);
    }
    // The first output of this value receives it directly when its tensor holds the compute type.
    int direct_output = -1;
    for (size_t k = 0; k < program_.outputs.size(); ++k) {
      const Operand& out = program_.outputs[k];
      if (out.kind == Operand::Kind::kValue && out.index == i) {
        if (access_.direct_outputs && IsComputedAsStored(inst.dtype)) {
          direct_output = static_cast<int>(k);
        }
        break;
      }
    }
    step.dst = direct_output >= 0 ? TensorLoc(Loc::Kind::kOutput, direct_output) : NewRegister();
    value_loc_[i] = step.dst;
    schedule_.steps.push_back(step);

    // Every other output of this value: stored right away, so the slot can be released early.
    for (size_t k = 0; k < program_.outputs.size(); ++k) {
      const Operand& out = program_.outputs[k];
      if (out.kind != Operand::Kind::kValue || out.index != i ||
          static_cast<int>(k) == direct_output) {
        continue;
      }
      Step store;
      store.kind = step.dst.is(Loc::Kind::kSlot) ? Step::Kind::kConvertStore
                                                 : Step::Kind::kCopyStore;
      store.stream = access_.stream_outputs;
      store.ctype = step.ctype;
      store.dtype = inst.dtype;
      store.num_src = 1;
      store.src[0] = step.dst;
      store.dst = TensorLoc(Loc::Kind::kOutput, static_cast<int>(k));
      schedule_.steps.push_back(store);
    }
  }

  // Linear scan: virtual registers -> slots, a slot reused once its value is dead.
  void AssignSlots() {
    std::vector<int> last_use(num_registers_, -1);
    for (size_t pos = 0; pos < schedule_.steps.size(); ++pos) {
      const Step& step = schedule_.steps[pos];
      for (int k = 0; k < step.num_src; ++k) {
        if (step.src[k].is(Loc::Kind::kSlot)) last_use[step.src[k].index] = static_cast<int>(pos);
      }
    }
    std::vector<int> slot_of(num_registers_, -1);
    std::set<int> free_slots;  // lowest first: deterministic, and keeps few slots hot
    for (size_t pos = 0; pos < schedule_.steps.size(); ++pos) {
      Step& step = schedule_.steps[pos];
      // Operands read for the last time free their slot before the result takes one, so the
      // result may overwrite an operand in place.
      int dying[2] = {-1, -1};
      for (int k = 0; k < step.num_src; ++k) {
        Loc& src = step.src[k];
        if (!src.is(Loc::Kind::kSlot)) continue;
        const int reg = src.index;
        src.index = slot_of[reg];
        if (last_use[reg] == static_cast<int>(pos) && dying[0] != reg) dying[k] = reg;
      }
      for (int reg : dying) {
        if (reg >= 0) free_slots.insert(slot_of[reg]);
      }
      if (step.dst.is(Loc::Kind::kSlot)) {
        const int reg = step.dst.index;
        int slot;
        if (free_slots.empty()) {
          slot = schedule_.num_slots++;
        } else {
          slot = *free_slots.begin();
          free_slots.erase(free_slots.begin());
        }
        slot_of[reg] = slot;
        step.dst.index = slot;
        if (last_use[reg] < 0) free_slots.insert(slot);  // never read (not for live values)
      }
    }
  }

  void RecordTensorAccesses() {
    schedule_.last_input_read.assign(program_.inputs.size(), -1);
    schedule_.first_output_write.assign(program_.outputs.size(), std::numeric_limits<int>::max());
    for (size_t pos = 0; pos < schedule_.steps.size(); ++pos) {
      const Step& step = schedule_.steps[pos];
      for (int k = 0; k < step.num_src; ++k) {
        if (step.src[k].is(Loc::Kind::kInput)) {
          schedule_.last_input_read[step.src[k].index] = static_cast<int>(pos);
        }
      }
      if (step.dst.is(Loc::Kind::kOutput)) {
        int& first = schedule_.first_output_write[step.dst.index];
        first = std::min(first, static_cast<int>(pos));
      }
    }
  }

  const Program& program_;
  const Access access_;
  Schedule schedule_;
  int num_registers_ = 0;
  std::vector<Loc> input_loc_;
  std::vector<bool> input_loaded_;
  std::vector<Loc> value_loc_;
};

// ---------------------------------------------------------------------------------------------
// Conversions between tensors and fp32 slots. A store may be non-temporal ("stream"): the
// output goes to memory without first reading its cache lines, which saves a third of the
// memory traffic of a large kernel; it applies when the destination is aligned (full tiles of
// TensorFlow's 64-byte aligned buffers are).

#ifdef TF_AUTOFUSE_X86_CONVERT
inline bool Aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

inline void Store128(void* dst, __m128i v, bool stream) {
  if (stream) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst), v);
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), v);
  }
}
#endif

void Copy(const char* src, char* dst, int64_t bytes, bool stream) {
  int64_t i = 0;
#ifdef TF_AUTOFUSE_X86_CONVERT
  if (stream && Aligned(dst, 32)) {
    for (; i + 32 <= bytes; i += 32) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    }
  }
#endif
  std::memmove(dst + i, src + i, bytes - i);
}

void WidenHalf(const Eigen::half* src, float* dst, int64_t n) {
  int64_t i = 0;
#ifdef TF_AUTOFUSE_X86_CONVERT
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

void NarrowToHalf(const float* src, Eigen::half* dst, int64_t n, bool stream) {
  int64_t i = 0;
#ifdef TF_AUTOFUSE_X86_CONVERT
  stream = stream && Aligned(dst, 16);
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    Store128(dst + i, h, stream);
  }
#endif
  for (; i < n; ++i) dst[i] = Eigen::half(src[i]);  // round to nearest even
}

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

void WidenBfloat16(const Eigen::bfloat16* src, float* dst, int64_t n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
  int64_t i = 0;
#ifdef TF_AUTOFUSE_X86_CONVERT
  for (; i + 8 <= n; i += 8) {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bits + i)));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
  }
#endif
  for (; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(bits[i]) << 16;
    std::memcpy(dst + i, &u, sizeof(u));
  }
}

// Round to nearest even; a NaN stays a (quiet) NaN of the same sign.
uint16_t FloatToBfloat16Bits(float f) {
  const uint32_t u = FloatBits(f);
  if (f != f) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

void NarrowToBfloat16(const float* src, Eigen::bfloat16* dst, int64_t n, bool stream) {
  uint16_t* bits = reinterpret_cast<uint16_t*>(dst);
  int64_t i = 0;
#ifdef TF_AUTOFUSE_X86_CONVERT
  stream = stream && Aligned(dst, 16);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i bias = _mm256_set1_epi32(0x7fff);
  const __m256i quiet = _mm256_set1_epi32(0x00400000);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(src + i);
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(bias, lsb));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i r = _mm256_srli_epi32(
        _mm256_blendv_epi8(rounded, _mm256_or_si256(u, quiet), nan), 16);
    // 8 x u32 (each < 2^16) -> 8 x u16
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8);
    Store128(bits + i, _mm256_castsi256_si128(packed), stream);
  }
#endif
  for (; i < n; ++i) bits[i] = FloatToBfloat16Bits(src[i]);
}

// Input tile -> slot of the compute type; elements [valid, count) are zeroed.
void LoadTile(DType dtype, const char* src, char* dst, int64_t valid, int64_t count) {
  switch (dtype) {
    case DType::kF16:
      WidenHalf(reinterpret_cast<const Eigen::half*>(src), reinterpret_cast<float*>(dst), valid);
      break;
    case DType::kBF16:
      WidenBfloat16(reinterpret_cast<const Eigen::bfloat16*>(src), reinterpret_cast<float*>(dst),
                    valid);
      break;
    default:
      std::memcpy(dst, src, valid * DTypeSize(dtype));
      break;
  }
  const int size = ComputeSize(ComputeTypeOf(dtype));
  std::memset(dst + valid * size, 0, (count - valid) * size);
}

// Slot of the compute type -> output tile of `dtype`.
void StoreTile(DType dtype, const char* src, char* dst, int64_t valid, bool stream) {
  switch (dtype) {
    case DType::kF16:
      NarrowToHalf(reinterpret_cast<const float*>(src), reinterpret_cast<Eigen::half*>(dst), valid,
                   stream);
      break;
    case DType::kBF16:
      NarrowToBfloat16(reinterpret_cast<const float*>(src),
                       reinterpret_cast<Eigen::bfloat16*>(dst), valid, stream);
      break;
    default:
      Copy(src, dst, valid * DTypeSize(dtype), stream);
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// The operators, one function per family. `n` is a whole number of packets (see kPad); every
// function is a single elementwise pass, so `out` may be the same buffer as an operand.

template <typename T>
using ArrayX = Eigen::Array<T, Eigen::Dynamic, 1>;
template <typename T>
using In = Eigen::Map<const ArrayX<T>>;
template <typename T>
using Out = Eigen::Map<ArrayX<T>>;

// An operand: a tile, or an immediate scalar broadcast over the tile (data == nullptr).
template <typename T>
struct Arg {
  const T* data;
  T scalar;
};

constexpr double kSeluScale = 1.0507009873554805;
constexpr double kSeluScaleAlpha = 1.0507009873554805 * 1.6732632423543772;

// Abs, Neg, Square, Reciprocal, Sqrt, Rsqrt, Sign, Floor, Ceil, Round: one or two instructions.
template <typename T>
void RunFloatSimple(OpCode op, In<T> x, Out<T> out) {
  switch (op) {
    case OpCode::kAbs: out = x.abs(); break;
    case OpCode::kNeg: out = -x; break;
    case OpCode::kSquare: out = x.square(); break;
    case OpCode::kReciprocal: out = x.inverse(); break;
    case OpCode::kSqrt: out = x.sqrt(); break;
    case OpCode::kRsqrt: out = x.rsqrt(); break;
    case OpCode::kSign: out = x.sign(); break;  // NaN stays NaN
    case OpCode::kFloor: out = x.floor(); break;
    case OpCode::kCeil: out = x.ceil(); break;
    case OpCode::kRound: out = x.rint(); break;  // half to even (TF runs round-to-nearest)
    default: break;
  }
}

// The transcendental functions of an array expression. fp32 uses Eigen's vectorised
// approximations, the functors TensorFlow's float kernels use (1-3 ulps). f64 uses the C
// library's scalar functions (within an ulp): Eigen's vectorised double versions are off by up
// to ~10 ulps, and TensorFlow's own double kernels land on the scalar functions.
template <typename X, typename Vectorised, typename Scalar>
auto Transcendental(const Eigen::ArrayBase<X>& x, Vectorised vectorised, Scalar scalar) {
  if constexpr (std::is_same_v<typename X::Scalar, double>) {
    return x.unaryExpr(scalar);
  } else {
    return vectorised(x);
  }
}

template <typename X>
auto Exp(const Eigen::ArrayBase<X>& x) {
  return Transcendental(x, [](const auto& a) { return a.exp(); },
                        [](double v) { return std::exp(v); });
}
template <typename X>
auto Expm1(const Eigen::ArrayBase<X>& x) {
  return Transcendental(x, [](const auto& a) { return a.expm1(); },
                        [](double v) { return std::expm1(v); });
}
template <typename X>
auto Log(const Eigen::ArrayBase<X>& x) {
  return Transcendental(x, [](const auto& a) { return a.log(); },
                        [](double v) { return std::log(v); });
}
template <typename X>
auto Log1p(const Eigen::ArrayBase<X>& x) {
  return Transcendental(x, [](const auto& a) { return a.log1p(); },
                        [](double v) { return std::log1p(v); });
}
template <typename X>
auto Erf(const Eigen::ArrayBase<X>& x) {
  return Transcendental(x, [](const auto& a) { return a.erf(); },
                        [](double v) { return std::erf(v); });
}
template <typename X>
auto Sin(const Eigen::ArrayBase<X>& x) {
  return Transcendental(x, [](const auto& a) { return a.sin(); },
                        [](double v) { return std::sin(v); });
}
template <typename X>
auto Cos(const Eigen::ArrayBase<X>& x) {
  return Transcendental(x, [](const auto& a) { return a.cos(); },
                        [](double v) { return std::cos(v); });
}
template <typename X>
auto Tanh(const Eigen::ArrayBase<X>& x) {
  return Transcendental(x, [](const auto& a) { return a.tanh(); },
                        [](double v) { return std::tanh(v); });
}

template <typename T>
void RunFloatTranscendental(OpCode op, In<T> x, Out<T> out) {
  switch (op) {
    case OpCode::kExp: out = Exp(x); break;
    case OpCode::kExpm1: out = Expm1(x); break;
    case OpCode::kLog: out = Log(x); break;
    case OpCode::kLog1p: out = Log1p(x); break;
    case OpCode::kErf: out = Erf(x); break;
    case OpCode::kSin: out = Sin(x); break;
    case OpCode::kCos: out = Cos(x); break;
    default: break;
  }
}

// 1 where x < 0, else 0, in x's own type. select() vectorises only on a condition of the same
// scalar type as its branches (a bool condition makes the whole expression scalar).
template <typename X>
auto IsNegative(const Eigen::ArrayBase<X>& x) {
  using T = typename X::Scalar;
  return x.matrix()
      .cwiseTypedLess(Eigen::Matrix<T, Eigen::Dynamic, 1>::Zero(x.size()))
      .array();
}

// e = exp(-|x|) never overflows; x < 0: e / (1 + e), else 1 / (1 + e). Within ~2 ulps (Eigen's
// fp32 logistic() is up to 4.5 ulps off). In blocks, so that exp runs once per element: a block
// of x is read before the same block of out is written, which keeps it safe in place.
template <typename T>
void Sigmoid(In<T> x, Out<T> out) {
  constexpr int64_t kBlock = 256;  // a multiple of kPad
  alignas(64) T e_block[kBlock];
  const T one(1);
  for (int64_t i = 0; i < x.size(); i += kBlock) {
    const int64_t len = std::min(kBlock, x.size() - i);
    Out<T> e(e_block, len);
    const auto xs = x.segment(i, len);
    e = Exp(-xs.abs());
    out.segment(i, len) = IsNegative(xs).select(e * (e + one).inverse(), (e + one).inverse());
  }
}

// The activations. Max/min propagate NaN, as TensorFlow's do.
template <typename T>
void RunFloatActivation(OpCode op, In<T> x, Out<T> out) {
  const T zero(0);
  const T one(1);
  switch (op) {
    case OpCode::kRelu:
      out = x.template max<Eigen::PropagateNaN>(zero);
      break;
    case OpCode::kRelu6:
      out = x.template max<Eigen::PropagateNaN>(zero).template min<Eigen::PropagateNaN>(T(6));
      break;
    case OpCode::kElu:
      out = IsNegative(x).select(Expm1(x), x);
      break;
    case OpCode::kSelu:
      out = IsNegative(x).select(T(kSeluScaleAlpha) * Expm1(x), T(kSeluScale) * x);
      break;
    case OpCode::kSigmoid:
      Sigmoid<T>(x, out);
      break;
    case OpCode::kTanh:
      out = Tanh(x);
      break;
    case OpCode::kSoftplus:  // max(x, 0) + log1p(exp(-|x|)): no overflow, accurate for x << 0
      out = x.template max<Eigen::PropagateNaN>(zero) + Log1p(Exp(-x.abs()));
      break;
    case OpCode::kSoftsign:
      out = x / (x.abs() + one);
      break;
    default:
      break;
  }
}

// out = f(x, y) with either operand possibly an immediate (never both).
template <typename T, typename F>
void ApplyBinary(const Arg<T>& x, const Arg<T>& y, T* out_data, int64_t n, F f) {
  Out<T> out(out_data, n);
  if (x.data != nullptr && y.data != nullptr) {
    out = f(In<T>(x.data, n), In<T>(y.data, n));
  } else if (x.data != nullptr) {
    out = f(In<T>(x.data, n), ArrayX<T>::Constant(n, y.scalar));
  } else {
    out = f(ArrayX<T>::Constant(n, x.scalar), In<T>(y.data, n));
  }
}

template <typename T>
void RunFloatBinary(OpCode op, const Arg<T>& x, const Arg<T>& y, T* out, int64_t n) {
  switch (op) {
    case OpCode::kAdd:
      ApplyBinary(x, y, out, n, [](const auto& a, const auto& b) { return a + b; });
      break;
    case OpCode::kSub:
      ApplyBinary(x, y, out, n, [](const auto& a, const auto& b) { return a - b; });
      break;
    case OpCode::kMul:
      ApplyBinary(x, y, out, n, [](const auto& a, const auto& b) { return a * b; });
      break;
    case OpCode::kDiv:
      ApplyBinary(x, y, out, n, [](const auto& a, const auto& b) { return a / b; });
      break;
    case OpCode::kMaximum:
      ApplyBinary(x, y, out, n, [](const auto& a, const auto& b) {
        return a.template max<Eigen::PropagateNaN>(b);
      });
      break;
    case OpCode::kMinimum:
      ApplyBinary(x, y, out, n, [](const auto& a, const auto& b) {
        return a.template min<Eigen::PropagateNaN>(b);
      });
      break;
    case OpCode::kSquaredDifference:
      ApplyBinary(x, y, out, n, [](const auto& a, const auto& b) { return (a - b).square(); });
      break;
    default:
      break;
  }
}

template <typename T>
void RunFloat(OpCode op, const Arg<T>& x, const Arg<T>& y, T* out, int64_t n) {
  switch (op) {
    case OpCode::kAbs: case OpCode::kNeg: case OpCode::kSquare: case OpCode::kReciprocal:
    case OpCode::kSqrt: case OpCode::kRsqrt: case OpCode::kSign: case OpCode::kFloor:
    case OpCode::kCeil: case OpCode::kRound:
      RunFloatSimple<T>(op, In<T>(x.data, n), Out<T>(out, n));
      break;
    case OpCode::kExp: case OpCode::kExpm1: case OpCode::kLog: case OpCode::kLog1p:
    case OpCode::kErf: case OpCode::kSin: case OpCode::kCos:
      RunFloatTranscendental<T>(op, In<T>(x.data, n), Out<T>(out, n));
      break;
    case OpCode::kRelu: case OpCode::kRelu6: case OpCode::kElu: case OpCode::kSelu:
    case OpCode::kSigmoid: case OpCode::kTanh: case OpCode::kSoftplus: case OpCode::kSoftsign:
      RunFloatActivation<T>(op, In<T>(x.data, n), Out<T>(out, n));
      break;
    default:
      RunFloatBinary<T>(op, x, y, out, n);
      break;
  }
}

// int32: plain loops GCC vectorises. Arithmetic goes through uint32_t so that it wraps
// (two's complement, as TensorFlow's kernels do) without undefined behaviour.
inline int32_t Wrap(uint32_t v) { return static_cast<int32_t>(v); }
inline uint32_t U(int32_t v) { return static_cast<uint32_t>(v); }

template <typename F>
void MapInt(const int32_t* x, int32_t* out, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) out[i] = f(x[i]);
}

template <typename F>
void MapInt(const Arg<int32_t>& x, const Arg<int32_t>& y, int32_t* out, int64_t n, F f) {
  if (x.data != nullptr && y.data != nullptr) {
    for (int64_t i = 0; i < n; ++i) out[i] = f(x.data[i], y.data[i]);
  } else if (x.data != nullptr) {
    const int32_t b = y.scalar;
    for (int64_t i = 0; i < n; ++i) out[i] = f(x.data[i], b);
  } else {
    const int32_t a = x.scalar;
    for (int64_t i = 0; i < n; ++i) out[i] = f(a, y.data[i]);
  }
}

void RunIntUnary(OpCode op, const int32_t* x, int32_t* out, int64_t n) {
  switch (op) {
    case OpCode::kAbs:  // |INT32_MIN| wraps to INT32_MIN
      MapInt(x, out, n, [](int32_t v) { return v < 0 ? Wrap(0u - U(v)) : v; });
      break;
    case OpCode::kNeg:
      MapInt(x, out, n, [](int32_t v) { return Wrap(0u - U(v)); });
      break;
    case OpCode::kSquare:
      MapInt(x, out, n, [](int32_t v) { return Wrap(U(v) * U(v)); });
      break;
    case OpCode::kRelu:
      MapInt(x, out, n, [](int32_t v) { return std::max(v, 0); });
      break;
    case OpCode::kRelu6:
      MapInt(x, out, n, [](int32_t v) { return std::min(std::max(v, 0), 6); });
      break;
    case OpCode::kSign:
      MapInt(x, out, n, [](int32_t v) { return static_cast<int32_t>((v > 0) - (v < 0)); });
      break;
    default:
      break;
  }
}

void RunIntBinary(OpCode op, const Arg<int32_t>& x, const Arg<int32_t>& y, int32_t* out,
                  int64_t n) {
  switch (op) {
    case OpCode::kAdd:
      MapInt(x, y, out, n, [](int32_t a, int32_t b) { return Wrap(U(a) + U(b)); });
      break;
    case OpCode::kSub:
      MapInt(x, y, out, n, [](int32_t a, int32_t b) { return Wrap(U(a) - U(b)); });
      break;
    case OpCode::kMul:
      MapInt(x, y, out, n, [](int32_t a, int32_t b) { return Wrap(U(a) * U(b)); });
      break;
    case OpCode::kMaximum:
      MapInt(x, y, out, n, [](int32_t a, int32_t b) { return std::max(a, b); });
      break;
    case OpCode::kMinimum:
      MapInt(x, y, out, n, [](int32_t a, int32_t b) { return std::min(a, b); });
      break;
    case OpCode::kSquaredDifference:
      MapInt(x, y, out, n, [](int32_t a, int32_t b) {
        const uint32_t d = U(a) - U(b);
        return Wrap(d * d);
      });
      break;
    default:
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// Running a schedule.

// Per-thread scratch holding the slots, grown on demand and kept for the thread's life.
char* ThreadScratch(int64_t bytes) {
  struct Buffer {
    void* data = nullptr;
    int64_t size = 0;
    ~Buffer() { std::free(data); }
  };
  thread_local Buffer buffer;
  if (buffer.size < bytes) {
    std::free(buffer.data);
    buffer.data = std::aligned_alloc(64, static_cast<size_t>((bytes + 63) / 64 * 64));
    buffer.size = bytes;
  }
  return static_cast<char*>(buffer.data);
}

template <typename T>
T ImmediateOf(const Loc& loc);
template <>
float ImmediateOf<float>(const Loc& loc) { return loc.imm.f32; }
template <>
double ImmediateOf<double>(const Loc& loc) { return loc.imm.f64; }
template <>
int32_t ImmediateOf<int32_t>(const Loc& loc) { return loc.imm.i32; }

template <typename T>
Arg<T> MakeArg(const Loc& loc, const char* address) {
  if (loc.is(Loc::Kind::kImmediate)) return {nullptr, ImmediateOf<T>(loc)};
  return {reinterpret_cast<const T*>(address), T(0)};
}

template <typename T>
void RunCompute(const Step& step, const char* const* src, char* dst, int64_t count) {
  const Arg<T> x = MakeArg<T>(step.src[0], src[0]);
  const Arg<T> y = step.num_src > 1 ? MakeArg<T>(step.src[1], src[1]) : Arg<T>{nullptr, T(0)};
  T* out = reinterpret_cast<T*>(dst);
  if constexpr (std::is_same_v<T, int32_t>) {
    if (step.num_src == 1) {
      RunIntUnary(step.op, x.data, out, count);
    } else {
      RunIntBinary(step.op, x, y, out, count);
    }
  } else {
    RunFloat<T>(step.op, x, y, out, count);
  }
}

// Rough CPU cycles per element: the ops, and moving the bytes (about 2 bytes a cycle).
int64_t ProgramCostPerElement(const Program& program) {
  int64_t cost = 0;
  for (const Instruction& inst : program.instructions) {
    const int op_cost = GetOpInfo(inst.op).cost;
    // f64 transcendentals run the C library's scalar functions
    cost += inst.dtype == DType::kF64 && op_cost > 1 ? 8 * op_cost : op_cost;
  }
  for (const InputDecl& in : program.inputs) cost += DTypeSize(in.dtype) / 2;
  for (size_t k = 0; k < program.outputs.size(); ++k) {
    cost += DTypeSize(program.OutputDType(static_cast<int>(k))) / 2;
  }
  return std::max<int64_t>(cost, 1);
}

}  // namespace

// ---------------------------------------------------------------------------------------------

Interpreter::Interpreter(Program program) : program_(std::move(program)) {
  direct_ = std::make_unique<Schedule>(
      Planner(program_, {/*direct_inputs=*/true, /*direct_outputs=*/true, /*stream=*/false})
          .Build());
  streaming_ = std::make_unique<Schedule>(
      Planner(program_, {/*direct_inputs=*/true, /*direct_outputs=*/false, /*stream=*/true})
          .Build());
  staged_ = std::make_unique<Schedule>(
      Planner(program_, {/*direct_inputs=*/false, /*direct_outputs=*/false, /*stream=*/false})
          .Build());
  const Schedule* schedules[] = {direct_.get(), streaming_.get(), staged_.get()};

  int widest = 4;
  for (const Instruction& inst : program_.instructions) {
    widest = std::max(widest, ComputeSize(ComputeTypeOf(inst.dtype)));
  }
  int64_t io_bytes = 0;  // per element, of every tensor a tile streams through
  for (const InputDecl& in : program_.inputs) {
    widest = std::max(widest, ComputeSize(ComputeTypeOf(in.dtype)));
    io_bytes += DTypeSize(in.dtype);
  }
  output_bytes_ = 0;
  for (size_t k = 0; k < program_.outputs.size(); ++k) {
    output_bytes_ += DTypeSize(program_.OutputDType(static_cast<int>(k)));
  }
  io_bytes += output_bytes_;
  // The largest power-of-two tile whose slots and tensor streams fit the L1 budget.
  const int64_t slots = std::max({direct_->num_slots, streaming_->num_slots, 1});
  int64_t tile = kMaxTile;
  while (tile > kMinTile && tile * (widest * slots + io_bytes) > kTileBudgetBytes) tile /= 2;
  tile_size_ = tile;
  slot_bytes_ = tile_size_ * widest;
  int most_slots = 1;
  for (const Schedule* s : schedules) most_slots = std::max(most_slots, s->num_slots);
  scratch_bytes_ = most_slots * slot_bytes_;
  cost_per_element_ = ProgramCostPerElement(program_);

  forwardable_.resize(program_.outputs.size());
  for (size_t k = 0; k < program_.outputs.size(); ++k) {
    const DType out_dtype = program_.OutputDType(static_cast<int>(k));
    for (size_t j = 0; j < program_.inputs.size(); ++j) {
      if (program_.inputs[j].dtype != out_dtype) continue;
      bool safe = true;
      for (const Schedule* s : schedules) {
        if (s->last_input_read[j] > s->first_output_write[k]) safe = false;
      }
      if (safe) forwardable_[k].push_back(static_cast<int>(j));
    }
  }
}

Interpreter::~Interpreter() = default;

void Interpreter::RunTiles(const IoBuffers& io, int64_t num_elements, int64_t first_tile,
                           int64_t last_tile) const {
  char* scratch = ThreadScratch(scratch_bytes_);
  const bool stream = num_elements * output_bytes_ >= kStreamBytes;
  const Schedule& full = stream ? *streaming_ : *direct_;
  for (int64_t t = first_tile; t < last_tile; ++t) {
    const int64_t offset = t * tile_size_;
    const int64_t valid = std::min(tile_size_, num_elements - offset);
    if (valid % kPad == 0) {
      RunSchedule(full, io, offset, valid, valid, scratch);
    } else {
      RunSchedule(*staged_, io, offset, valid, (valid + kPad - 1) / kPad * kPad, scratch);
    }
  }
#ifdef TF_AUTOFUSE_X86_CONVERT
  if (stream) _mm_sfence();  // non-temporal stores are visible before the caller moves on
#endif
}

// One tile: `valid` elements from `offset`; compute steps run over `count` >= valid elements
// (the padded length of a ragged tile, whose operands and results are all slots then).
void Interpreter::RunSchedule(const Schedule& schedule, const IoBuffers& io, int64_t offset,
                              int64_t valid, int64_t count, char* scratch) const {
  auto address = [&](const Loc& loc) -> char* {
    switch (loc.kind) {
      case Loc::Kind::kSlot:
        return scratch + loc.index * slot_bytes_;
      case Loc::Kind::kInput:
        return const_cast<char*>(io.inputs[loc.index]) + offset * loc.elem_size;
      case Loc::Kind::kOutput:
        return io.outputs[loc.index] + offset * loc.elem_size;
      case Loc::Kind::kImmediate:
        break;
    }
    return nullptr;
  };
  for (const Step& step : schedule.steps) {
    switch (step.kind) {
      case Step::Kind::kLoad:
        LoadTile(step.dtype, address(step.src[0]), address(step.dst), valid, count);
        break;
      case Step::Kind::kCompute: {
        const char* src[2] = {address(step.src[0]),
                              step.num_src > 1 ? address(step.src[1]) : nullptr};
        char* dst = address(step.dst);
        switch (step.ctype) {
          case ComputeType::kF32:
            RunCompute<float>(step, src, dst, count);
            break;
          case ComputeType::kF64:
            RunCompute<double>(step, src, dst, count);
            break;
          case ComputeType::kI32:
            RunCompute<int32_t>(step, src, dst, count);
            break;
        }
        break;
      }
      case Step::Kind::kConvertStore:
        StoreTile(step.dtype, address(step.src[0]), address(step.dst), valid, step.stream);
        break;
      case Step::Kind::kCopyStore: {
        const char* src = address(step.src[0]);
        char* dst = address(step.dst);
        if (src != dst) Copy(src, dst, valid * DTypeSize(step.dtype), step.stream);
        break;
      }
    }
  }
}

}  // namespace tf_autofuse
