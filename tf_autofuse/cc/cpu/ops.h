// The operators over a tile, one function per family (the kernel bodies). `n` is a whole number
// of packets (see kPad); every function is a single elementwise pass, so `out` may be the same
// buffer as an operand.
//
// Part of the CPU interpreter's one translation unit: included by interpreter.cc (and by the
// parts after it), never compiled alone, so that the hot loops inline across the parts.

#ifndef TF_AUTOFUSE_CC_CPU_OPS_H_
#define TF_AUTOFUSE_CC_CPU_OPS_H_

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "Eigen/Core"
#include "unsupported/Eigen/SpecialFunctions"
#include "convert.h"
#include "kernels.h"
#include "packet_math.h"

namespace tf_autofuse {
namespace {

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
// approximations, the functors TensorFlow's float kernels use (1-3 ulps), except where an op
// runs our own packet function instead (Exp: ExpPacket, Erfc: ErfcPacket). f64 uses the C
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

// Name(x): the function `fn` of an array expression: Eigen's array method in fp32, the C
// library's in f64.
#define TF_AUTOFUSE_TRANSCENDENTAL(Name, fn)                                              \
  template <typename X>                                                                   \
  auto Name(const Eigen::ArrayBase<X>& x) {                                               \
    return Transcendental(x, [](const auto& a) { return a.fn(); },                        \
                          [](double v) { return std::fn(v); });                           \
  }
TF_AUTOFUSE_TRANSCENDENTAL(Exp, exp)
TF_AUTOFUSE_TRANSCENDENTAL(Expm1, expm1)
TF_AUTOFUSE_TRANSCENDENTAL(Log, log)
TF_AUTOFUSE_TRANSCENDENTAL(Log1p, log1p)
TF_AUTOFUSE_TRANSCENDENTAL(Erf, erf)
TF_AUTOFUSE_TRANSCENDENTAL(Sin, sin)
TF_AUTOFUSE_TRANSCENDENTAL(Cos, cos)
TF_AUTOFUSE_TRANSCENDENTAL(Tanh, tanh)
#undef TF_AUTOFUSE_TRANSCENDENTAL

// Erfc. fp32: ErfcPacket, within 5.9 ulps of the exact value over all float32 (Eigen's fp32
// erfc, used before: 6.2; both worst in the tail, x in [1, 9]), mean 0.30 ulps over |x| in
// [2^-13, 10.1] (Eigen's: 0.32), 0.35 on GELU's N(0, 1/2) inputs (Eigen's: 0.43); measured with
// scripts/packet_ulps.sh erfc. Cost: ~50 vector instructions and one division a packet, less
// than Eigen's, which for any packet holding an |x| > 1 computes both of its branches, a
// reciprocal and a division (scripts/packet_ulps.sh erfc times both). Two packets a turn: one
// at a time, its long dependency chain leaves the core idle.
// Without FMA, pmadd falls back to a multiply and an add and twoprod_low to Veltkamp's split:
// less accurate, not measured.
// f64: the C library's long double erfcl (the double ones, Eigen's and glibc's, are up to ~30
// ulps off in the far tail).
template <typename T>
void RunErfc(In<T> x, Out<T> out) {
  if constexpr (std::is_same_v<T, float>) {
    RunPackets<FloatPacket, ErfcPacket<FloatPacket>>(x.data(), out.data(), x.size());
  } else {
    out = x.unaryExpr([](T v) { return static_cast<T>(std::erfc(static_cast<long double>(v))); });
  }
}

template <typename T>
void RunFloatTranscendental(OpCode op, In<T> x, Out<T> out) {
  switch (op) {
    case OpCode::kExp:
      if constexpr (std::is_same_v<T, float>) {
        RunPackets<FloatPacket, ExpPacket<FloatPacket>>(x.data(), out.data(), x.size());
      } else {
        out = Exp(x);
      }
      break;
    case OpCode::kExpm1: out = Expm1(x); break;
    case OpCode::kLog: out = Log(x); break;
    case OpCode::kLog1p: out = Log1p(x); break;
    case OpCode::kErf: out = Erf(x); break;
    case OpCode::kErfc: RunErfc<T>(x, out); break;
    case OpCode::kSin: out = Sin(x); break;
    case OpCode::kCos: out = Cos(x); break;
    // The C library's functions, in every type: Eigen has no accurate vectorised versions (its
    // sinh/cosh go through exp and lose everything near 0).
    case OpCode::kTan: out = x.unaryExpr([](T v) { return std::tan(v); }); break;
    case OpCode::kAtan: out = x.unaryExpr([](T v) { return std::atan(v); }); break;
    case OpCode::kSinh: out = x.unaryExpr([](T v) { return std::sinh(v); }); break;
    case OpCode::kCosh: out = x.unaryExpr([](T v) { return std::cosh(v); }); break;
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

// Sigmoid: fp32 runs SigmoidPacket. Other types: in blocks, so that exp runs once per element:
// a block of x is read before the same block of out is written, which keeps it safe in place.
template <typename T>
void Sigmoid(In<T> x, Out<T> out) {
  if constexpr (std::is_same_v<T, float>) {
    RunPackets<FloatPacket, SigmoidPacket<FloatPacket>>(x.data(), out.data(), x.size());
    return;
  }
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
    case OpCode::kRelu:  // x < 0 ? 0 : x, as TensorFlow's: -0 and NaN (its payload) stay x
      out = (x < zero).select(zero, x);
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
    case OpCode::kPow:
      ApplyBinary(x, y, out, n, [](const auto& a, const auto& b) {
        return a.binaryExpr(b, [](T u, T v) { return std::pow(u, v); });
      });
      break;
    case OpCode::kFloorDiv:
      ApplyBinary(x, y, out, n, [](const auto& a, const auto& b) { return (a / b).floor(); });
      break;
    case OpCode::kFloorMod:  // TensorFlow's: fmod, moved into the sign of y (exact)
      ApplyBinary(x, y, out, n, [](const auto& a, const auto& b) {
        return a.binaryExpr(b, [](T u, T v) {
          const T r = std::fmod(u, v);
          return r != T(0) && ((v < T(0)) != (r < T(0))) ? r + v : r;
        });
      });
      break;
    default:
      break;
  }
}

template <typename T>
void RunFloat(OpCode op, const Arg<T>& x, const Arg<T>& y, T* out, int64_t n) {
  switch (CpuKernelsOf(op).floats) {
    case Kernel::kFloatSimple:
      RunFloatSimple<T>(op, In<T>(x.data, n), Out<T>(out, n));
      break;
    case Kernel::kFloatTranscendental:
      RunFloatTranscendental<T>(op, In<T>(x.data, n), Out<T>(out, n));
      break;
    case Kernel::kFloatActivation:
      RunFloatActivation<T>(op, In<T>(x.data, n), Out<T>(out, n));
      break;
    case Kernel::kFloatBinary:
      RunFloatBinary<T>(op, x, y, out, n);
      break;
    default:
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

// The operators whose operands and result differ in type, and the generic ones.

template <typename T>
inline T At(const Arg<T>& a, int64_t i) {
  return a.data != nullptr ? a.data[i] : a.scalar;
}

// out = f(x, y) elementwise, either operand possibly a scalar; plain loops GCC vectorises.
template <typename T, typename R, typename F>
void MapBinary(const Arg<T>& x, const Arg<T>& y, R* out, int64_t n, F f) {
  if (x.data != nullptr && y.data != nullptr) {
    for (int64_t i = 0; i < n; ++i) out[i] = f(x.data[i], y.data[i]);
  } else if (x.data != nullptr) {
    const T b = y.scalar;
    for (int64_t i = 0; i < n; ++i) out[i] = f(x.data[i], b);
  } else if (y.data != nullptr) {
    const T a = x.scalar;
    for (int64_t i = 0; i < n; ++i) out[i] = f(a, y.data[i]);
  } else {
    std::fill_n(out, n, f(x.scalar, y.scalar));
  }
}

// Comparisons -> bool; NaN compares false, except NotEqual.
template <typename T>
void RunCompare(OpCode op, const Arg<T>& x, const Arg<T>& y, uint8_t* out, int64_t n) {
  switch (op) {
    case OpCode::kGreater:
      MapBinary(x, y, out, n, [](T a, T b) -> uint8_t { return a > b; });
      break;
    case OpCode::kGreaterEqual:
      MapBinary(x, y, out, n, [](T a, T b) -> uint8_t { return a >= b; });
      break;
    case OpCode::kLess:
      MapBinary(x, y, out, n, [](T a, T b) -> uint8_t { return a < b; });
      break;
    case OpCode::kLessEqual:
      MapBinary(x, y, out, n, [](T a, T b) -> uint8_t { return a <= b; });
      break;
    case OpCode::kEqual:
      MapBinary(x, y, out, n, [](T a, T b) -> uint8_t { return a == b; });
      break;
    case OpCode::kNotEqual:
      MapBinary(x, y, out, n, [](T a, T b) -> uint8_t { return a != b; });
      break;
    default:
      break;
  }
}

// IsNan, IsInf, IsFinite -> bool.
template <typename T>
void RunClassify(OpCode op, const T* x, uint8_t* out, int64_t n) {
  const T inf = std::numeric_limits<T>::infinity();
  switch (op) {
    case OpCode::kIsNan:
      for (int64_t i = 0; i < n; ++i) out[i] = x[i] != x[i];
      break;
    case OpCode::kIsInf:
      for (int64_t i = 0; i < n; ++i) out[i] = std::abs(x[i]) == inf;
      break;
    case OpCode::kIsFinite:
      for (int64_t i = 0; i < n; ++i) out[i] = std::abs(x[i]) < inf;
      break;
    default:
      break;
  }
}

void RunLogical(OpCode op, const Arg<uint8_t>& x, const Arg<uint8_t>& y, uint8_t* out,
                int64_t n) {
  switch (op) {
    case OpCode::kLogicalNot:
      for (int64_t i = 0; i < n; ++i) out[i] = x.data[i] ^ 1;
      break;
    case OpCode::kLogicalAnd:
      MapBinary(x, y, out, n, [](uint8_t a, uint8_t b) -> uint8_t { return a & b; });
      break;
    case OpCode::kLogicalOr:
      MapBinary(x, y, out, n, [](uint8_t a, uint8_t b) -> uint8_t { return a | b; });
      break;
    default:
      break;
  }
}

template <typename T>
void RunSelect(const Arg<uint8_t>& c, const Arg<T>& x, const Arg<T>& y, T* out, int64_t n) {
  if (c.data != nullptr && x.data != nullptr && y.data != nullptr) {
    for (int64_t i = 0; i < n; ++i) out[i] = c.data[i] ? x.data[i] : y.data[i];
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = At(c, i) ? At(x, i) : At(y, i);
  }
}

// x < 0 ? alpha * x : x (NaN and -0 pass through, as in TensorFlow).
template <typename T>
void RunLeakyRelu(const T* x, T alpha, T* out, int64_t n) {
  Out<T>(out, n) = IsNegative(In<T>(x, n)).select(In<T>(x, n) * alpha, In<T>(x, n));
}

// Cast between float types: a 16-bit target rounds to nearest even there (f64 goes through
// fp32 first, as Eigen's and so TensorFlow's casts do), and the value stays in fp32.
// fp32 values rounded to a 16-bit type and back, a block at a time (out may be x).
template <typename Half, typename Narrow, typename Widen>
void RoundThrough(const float* x, float* out, int64_t n, Narrow narrow, Widen widen) {
  constexpr int64_t kBlock = 256;
  alignas(64) Half block[kBlock];
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t len = std::min(kBlock, n - i);
    narrow(x + i, block, len, false);
    widen(block, out + i, len);
  }
}

void RunCast(ComputeType from, DType to, const char* src, char* dst, int64_t n) {
  if (from == ComputeType::kF32) {
    const float* x = reinterpret_cast<const float*>(src);
    switch (to) {
      case DType::kF64: {
        double* out = reinterpret_cast<double*>(dst);
        for (int64_t i = 0; i < n; ++i) out[i] = x[i];
        return;
      }
      case DType::kF16:
        RoundThrough<Eigen::half>(x, reinterpret_cast<float*>(dst), n, NarrowToHalf, WidenHalf);
        return;
      case DType::kBF16:
        RoundThrough<Eigen::bfloat16>(x, reinterpret_cast<float*>(dst), n, NarrowToBfloat16,
                                      WidenBfloat16);
        return;
      default:
        if (src != dst) std::memmove(dst, src, n * sizeof(float));
        return;
    }
  }
  const double* x = reinterpret_cast<const double*>(src);
  float* out = reinterpret_cast<float*>(dst);
  switch (to) {
    case DType::kF32:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(x[i]);
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        out[i] = static_cast<float>(Eigen::half(static_cast<float>(x[i])));
      }
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        out[i] = static_cast<float>(Eigen::bfloat16(static_cast<float>(x[i])));
      }
      return;
    default:
      if (src != dst) std::memmove(dst, src, n * sizeof(double));
      return;
  }
}

// ZerosLike / OnesLike: 0 or 1 in the compute type.
void Fill(ComputeType type, bool one, char* dst, int64_t n) {
  switch (type) {
    case ComputeType::kF32:
      std::fill_n(reinterpret_cast<float*>(dst), n, one ? 1.0f : 0.0f);
      break;
    case ComputeType::kF64:
      std::fill_n(reinterpret_cast<double*>(dst), n, one ? 1.0 : 0.0);
      break;
    case ComputeType::kI32:
      std::fill_n(reinterpret_cast<int32_t*>(dst), n, one ? 1 : 0);
      break;
    case ComputeType::kBool:
      std::memset(dst, one ? 1 : 0, n);
      break;
  }
}

}  // namespace
}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CC_CPU_OPS_H_
