// Exhaustive accuracy of the fp32 exp (packet_math.h's ExpPacket) and of Eigen's fp32 exp (what
// TensorFlow's kernels and the Exp op before it use), over every float32, against the C
// library's double exp; then their speed on an L1-resident array, one core (packet_timing.h).
// Built and run by scripts/packet_ulps.sh exp, which pastes ExpPacket out of packet_math.h into
// exp_packet.inc.
// `ftz` as argument: flush subnormals as TensorFlow's threads do. Ulps are of the float nearest
// the reference (subnormal spacing below 2^-126); a result that overflows float must be inf.
#include <Eigen/Core>
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "exp_packet.inc"
#include "packet_timing.h"

namespace {

using Packet = Eigen::internal::packet_traits<float>::type;
constexpr int kSize = Eigen::internal::unpacket_traits<Packet>::size;

double Ulps(float got, double want) {
  const float nearest = static_cast<float>(want);
  if (std::isinf(nearest)) return got == nearest ? 0 : 1e9;
  if (!std::isfinite(got)) return 1e9;
  int e;
  std::frexp(nearest == 0 ? 1e-45f : nearest, &e);
  return std::fabs(got - want) / std::ldexp(1.0, std::max(e - 24, -149));
}

struct Stats {
  double worst = 0, sum = 0;
  float at = 0;
  void Add(float x, double ulps, bool counted) {
    if (ulps > worst) worst = ulps, at = x;
    if (counted) sum += ulps;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const bool ftz = argc > 1 && std::strcmp(argv[1], "ftz") == 0;
  if (ftz) _mm_setcsr(_mm_getcsr() | 0x8040);
  Stats ours, eigen;
  uint64_t counted = 0;
  alignas(64) float in[kSize], a[kSize], b[kSize];
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += kSize) {
    for (int j = 0; j < kSize; ++j) {
      const uint32_t bits = static_cast<uint32_t>(u + j);
      std::memcpy(&in[j], &bits, 4);
    }
    const Packet x = Eigen::internal::pload<Packet>(in);
    Eigen::internal::pstore(a, ExpPacket(x));
    Eigen::internal::pstore(b, Eigen::internal::pexp(x));
    for (int j = 0; j < kSize; ++j) {
      if (std::isnan(in[j])) {
        if (!std::isnan(a[j])) return std::printf("exp(NaN) is not NaN\n"), 1;
        continue;
      }
      double want = std::exp(static_cast<double>(in[j]));
      if (ftz && want < 0x1p-126) want = 0;
      const bool count = std::fabs(in[j]) < 104;  // beyond, both are 0 or inf
      counted += count;
      ours.Add(in[j], Ulps(a[j], want), count);
      eigen.Add(in[j], Ulps(b[j], want), count);
    }
  }
  std::printf("ExpPacket:   max %.3f ulps (at %a), mean %.4f over |x| < 104 (%llu values)\n",
              ours.worst, ours.at, ours.sum / counted, static_cast<unsigned long long>(counted));
  std::printf("Eigen pexp:  max %.3f ulps (at %a), mean %.4f\n", eigen.worst, eigen.at,
              eigen.sum / counted);
  std::printf("ns an element, one core, L1, FTZ/DAZ on: ExpPacket %.3f, Eigen %.3f\n",
              NsPerElement<Packet>([](const Packet& x) { return ExpPacket(x); }),
              NsPerElement<Packet>([](const Packet& x) { return Eigen::internal::pexp(x); }));
  return 0;
}
