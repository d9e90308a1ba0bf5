// Our own fp32 packet functions (Exp, Erfc, Sigmoid) and the loops that map a packet function
// over a buffer. The tile path (ops.h) and the strip path (strip_run.h) run the same ones, which
// is what keeps their results bit-identical.
//
// Part of the CPU interpreter's one translation unit: included by interpreter.cc (and by the
// parts after it), never compiled alone, so that the hot loops inline across the parts.

#ifndef TF_AUTOFUSE_CC_CPU_PACKET_MATH_H_
#define TF_AUTOFUSE_CC_CPU_PACKET_MATH_H_

#include <cstdint>
#include <type_traits>

#include "Eigen/Core"
#include "schedule.h"
#include "tf_compat.h"

namespace tf_autofuse {
namespace {

// exp(r) - 1 on the reduced range |r| <= ln2/2 (plus the lo part of a split argument):
// r + r^2 C(r), C the degree-4 float32 relative-minimax fit of scripts/fit_erfc.py. Shared by
// ExpPacket and ErfcPacket.
template <typename Packet>
EIGEN_STRONG_INLINE Packet ExpReducedMinus1(const Packet& r) {
  namespace ei = Eigen::internal;
  using ei::pmadd;
  using ei::pset1;
  Packet c = pset1<Packet>(0x1.6a4d70p-10f);
  c = pmadd(c, r, pset1<Packet>(0x1.12398ap-7f));
  c = pmadd(c, r, pset1<Packet>(0x1.5558b0p-5f));
  c = pmadd(c, r, pset1<Packet>(0x1.555492p-3f));
  c = pmadd(c, r, pset1<Packet>(0x1.fffffcp-2f));
  return pmadd(c, ei::pmul(r, r), r);
}

// x * 2^k rounded once, k a packet of integers held as floats, x normal and finite (or NaN, which
// stays that NaN). AVX-512: one vscalefps (x * 2^floor(k), any k, overflow to inf and a subnormal
// result included). Elsewhere 2^k is built in a float's exponent field from the integer k, which
// needs 2^k normal: without kSplit one power, -126 <= k <= 127; with kSplit two, of half the
// exponent each (floor(k / 2) and the rest), -252 <= k <= 254, the first product exact (x times
// 2^floor(k / 2) normal) so that a subnormal result or an overflow to inf is still rounded once.
// The same bits either way: ExpPacket, SigmoidPacket and ErfcPacket with vscalefps against the
// integer-shift code, every float32 input, FTZ/DAZ off and on. One cost: without FTZ, a packet
// with a subnormal result takes a microcode assist, longer after vscalefps than after a
// multiply; TensorFlow's threads run with FTZ/DAZ.
template <bool kSplit, typename Packet>
EIGEN_STRONG_INLINE Packet TimesPowerOfTwo(const Packet& x, const Packet& k) {
  namespace ei = Eigen::internal;
#ifdef EIGEN_VECTORIZE_AVX512
  if constexpr (std::is_same_v<Packet, ei::Packet16f>) return _mm512_scalef_ps(x, k);
#endif
  using PacketI = typename ei::unpacket_traits<Packet>::integer_packet;
  const PacketI ki = ei::pcast<Packet, PacketI>(k);
  const PacketI bias = ei::pset1<PacketI>(127);
  if constexpr (kSplit) {
    const PacketI half = ei::plogical_shift_right<1>(ei::padd(ki, ei::pset1<PacketI>(1 << 30)));
    const PacketI k1 = ei::psub(half, ei::pset1<PacketI>(1 << 29));  // floor(k / 2)
    const Packet s1 = ei::preinterpret<Packet>(ei::plogical_shift_left<23>(ei::padd(k1, bias)));
    const Packet s2 = ei::preinterpret<Packet>(
        ei::plogical_shift_left<23>(ei::padd(ei::psub(ki, k1), bias)));
    return ei::pmul(ei::pmul(x, s1), s2);
  } else {
    return ei::pmul(x, ei::preinterpret<Packet>(ei::plogical_shift_left<23>(ei::padd(ki, bias))));
  }
}

// exp x, fp32, one packet, no branch: x clamped to [-104, 88.73] (beyond, the result rounds to 0
// or overflows to inf either way), k = round(x / ln2), r = x - k ln2 with ln2 in two parts (the
// first product exact), |r| <= ln2/2; exp(r) = 1 + ExpReducedMinus1(r); then times 2^k by
// TimesPowerOfTwo, rounded once, so that k down to -150 (a subnormal result) and up to 128 (inf)
// need no test. NaN stays NaN (pmin/pmax keep a NaN first operand), exp(-inf) = 0,
// exp(inf) = inf. Over all float32 (scripts/packet_ulps.sh exp): within 1.013 ulps, mean 0.064
// (Eigen's fp32 exp, which TensorFlow's kernels use: 1.28, 0.074).
// Eigen's tests every packet for a lane out of its fast range (a horizontal reduction and a
// branch a packet); this one needs no test, which roughly halves its time
// (scripts/packet_ulps.sh exp times both). Used for the Exp op and inside fp32 Sigmoid;
// softplus, elu and the rest still use Eigen's.
template <typename Packet>
EIGEN_STRONG_INLINE Packet ExpPacket(const Packet& x) {
  namespace ei = Eigen::internal;
  using ei::pset1;
  const Packet c = ei::pmax(ei::pmin(x, pset1<Packet>(88.73f)), pset1<Packet>(-104.0f));
  const Packet k = ei::print(ei::pmul(c, pset1<Packet>(0x1.715476p+0f)));
  const Packet r = ei::pnmadd(k, pset1<Packet>(0x1.7f7d1cp-20f),
                              ei::pnmadd(k, pset1<Packet>(0x1.62e4p-1f), c));
  const Packet e = ei::padd(ExpReducedMinus1(r), pset1<Packet>(1.0f));
  return TimesPowerOfTwo</*kSplit=*/true>(e, k);
}

// y[i] = f(x[i]) over fp32 packets, two a turn (a transcendental's long dependency chain leaves
// the core idle with one), both loaded before either is stored: safe in place.
template <typename Packet, typename F>
EIGEN_STRONG_INLINE void MapPackets(const float* in, float* o, int64_t n, F f) {
  constexpr int64_t kSize = Eigen::internal::unpacket_traits<Packet>::size;
  static_assert(kPad % kSize == 0, "n is a whole number of packets");
  using Eigen::internal::ploadu;
  using Eigen::internal::pstoreu;
  int64_t i = 0;
  for (; i + 2 * kSize <= n; i += 2 * kSize) {
    const Packet y0 = f(ploadu<Packet>(in + i));
    const Packet y1 = f(ploadu<Packet>(in + i + kSize));
    pstoreu(o + i, y0);
    pstoreu(o + i + kSize, y1);
  }
  for (; i < n; i += kSize) pstoreu(o + i, f(ploadu<Packet>(in + i)));
}

template <typename Packet, Packet (*F)(const Packet&)>
void RunPackets(const float* in, float* o, int64_t n) {
  MapPackets<Packet>(in, o, n, F);
}
using FloatPacket = Eigen::internal::packet_traits<float>::type;

// erfc x = 1 - erf x without the cancellation, fp32 (and the 16-bit types computed in it), one
// packet: our own approximation, both branches computed and one selected per lane:
//   |x| < 0.5:  1 - x E(x^2), E a degree-4 polynomial (erf x / x);
//   |x| >= 0.5: erfc a = exp(-a^2) P(a) / Q(a), a = |x| clamped at 10.1 (beyond, erfc < 2^-150
//               rounds to 0), P/Q a [4/5] rational fitted to erfc(a) exp(a^2) on [0.5, 10.1]
//               (one division); erfc(-a) = 2 - erfc a.
// a^2 is split into hi + lo with an FMA and lo joins the reduced argument of exp, so the rounding
// of a^2 (tens of ulps of the result near a = 10 if exp took it) does not reach the result;
// exp(r) on |r| <= ln2/2 is 1 + r + r^2 C(r), deg C = 4. P carries a factor 2^-64 that the scale
// 2^(k+64) of TimesPowerOfTwo takes back (a normal power of two for every k, one multiply on the
// portable path), so a result below 2^-126 is rounded once (TF's threads flush it to zero
// anyway). Coefficients: float32 relative-minimax fits (scripts/fit_erfc.py), each rounded to
// float32 in turn and the rest refitted. NaN stays NaN, erfc(+inf) = 0, erfc(-inf) = 2.
template <typename Packet>
EIGEN_STRONG_INLINE Packet ErfcPacket(const Packet& x) {
  namespace ei = Eigen::internal;
  using ei::pmadd;
  using ei::pset1;
  const Packet a = ei::pmin(ei::pabs(x), pset1<Packet>(10.1f));  // pmin keeps a NaN first operand
  const Packet hi = ei::pmul(a, a);
  const Packet lo = tf_compat::TwoProdLow(a, a, hi);  // a^2 = hi + lo exactly (FMA or Veltkamp)
  // |x| < 0.5
  Packet e = pset1<Packet>(0x1.1d1da6p-8f);
  e = pmadd(e, hi, pset1<Packet>(-0x1.b2f136p-6f));
  e = pmadd(e, hi, pset1<Packet>(0x1.cdfa88p-4f));
  e = pmadd(e, hi, pset1<Packet>(-0x1.81266ep-2f));
  e = pmadd(e, hi, pset1<Packet>(0x1.20dd74p+0f));
  const Packet small = ei::pnmadd(x, e, pset1<Packet>(1.0f));
  // exp(-hi - lo) = 2^k exp(r), r = (-hi - k ln2_hi) - (lo + k ln2_lo), the first part exact
  const Packet k = ei::print(ei::pmul(hi, pset1<Packet>(-0x1.715476p+0f)));
  const Packet r0 = ei::pnmadd(k, pset1<Packet>(0x1.62e4p-1f), ei::pnegate(hi));
  const Packet r = ei::psub(r0, pmadd(k, pset1<Packet>(0x1.7f7d1cp-20f), lo));
  const Packet t = ExpReducedMinus1(r);
  constexpr float kP = 0x1p-64f;
  Packet p = pset1<Packet>(0x1.3c726ep-5f * kP);
  p = pmadd(p, a, pset1<Packet>(0x1.041ca6p-2f * kP));
  p = pmadd(p, a, pset1<Packet>(0x1.8fc14cp-1f * kP));
  p = pmadd(p, a, pset1<Packet>(0x1.48422ap+0f * kP));
  p = pmadd(p, a, pset1<Packet>(kP));
  Packet q = pset1<Packet>(0x1.187132p-4f);
  q = pmadd(q, a, pset1<Packet>(0x1.cd0da4p-2f));
  q = pmadd(q, a, pset1<Packet>(0x1.6af69cp+0f));
  q = pmadd(q, a, pset1<Packet>(0x1.401a8cp+1f));
  q = pmadd(q, a, pset1<Packet>(0x1.349024p+1f));
  q = pmadd(q, a, pset1<Packet>(1.0f));
  const Packet y = TimesPowerOfTwo</*kSplit=*/false>(ei::pdiv(pmadd(t, p, p), q),
                                                     ei::padd(k, pset1<Packet>(64.0f)));
  const Packet zero = ei::pzero(x);
  const Packet large = ei::pselect(ei::pcmp_lt(x, zero), ei::psub(pset1<Packet>(2.0f), y), y);
  return ei::pselect(ei::pcmp_lt(a, pset1<Packet>(0.5f)), small, large);
}

// Sigmoid, fp32, one packet: e = exp(-|x|) never overflows; x < 0: e / (1 + e), else
// 1 / (1 + e). Within ~2 ulps (Eigen's fp32 logistic() is up to 4.5 ulps off); one division an
// element.
template <typename Packet>
EIGEN_STRONG_INLINE Packet SigmoidPacket(const Packet& x) {
  namespace ei = Eigen::internal;
  const Packet one = ei::pset1<Packet>(1.0f);
  const Packet e = ExpPacket(ei::pnegate(ei::pabs(x)));
  const Packet y = ei::pdiv(ei::pselect(ei::pcmp_lt(x, ei::pzero(x)), e, one), ei::padd(one, e));
  // a NaN x gives x: which NaN the arithmetic would give (its sign) depends on the operand
  // order g++ picks for the commutative add, which differed between the strip and tile paths
  return ei::pselect(ei::pcmp_eq(x, x), y, x);
}

}  // namespace
}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CC_CPU_PACKET_MATH_H_
