// Exhaustive accuracy of the fp32 erfc (packet_math.h's ErfcPacket) and of Eigen's fp32 erfc
// (what RunErfc used before), over every finite float32, against the C library's double erfc
// (~1e-15 relative: exact enough for fp32 ulps); then their speed on an L1-resident array, one
// core (packet_timing.h). Built and run by `scripts/packet_ulps.sh erfc`, which pastes
// ErfcPacket out of packet_math.h into erfc_packet.inc. `ftz` as argument: flush subnormals as
// TensorFlow's threads do. Ulps are of the reference, subnormal spacing below 2^-126, as
// tests/test_kernel.py's ulp().
#include <unsupported/Eigen/SpecialFunctions>
#include <Eigen/Core>
#include <pmmintrin.h>
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "erfc_packet.inc"
#include "packet_timing.h"

namespace {
float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
double Ulp(double v) {
  double a = std::fabs(v);
  if (!(a > 0) || !std::isfinite(a)) a = 1.0;
  return std::ldexp(1.0, std::max(static_cast<int>(std::floor(std::log2(a))), -126) - 23);
}
double Reference(float xf) {
  const double x = xf;
  if (std::isnan(x)) return x;
  if (std::fabs(x) < 0x1p-13) return 1.0 - 1.1283791670955126 * x * (1.0 - x * x / 3.0);
  if (x >= 10.1) return 0.0;  // < 2^-150
  if (x <= -10.1) return 2.0;
  return std::erfc(x);
}
struct Stats {
  double max = 0, sum = 0;
  uint64_t n = 0;
  float worst = 0;
  void Add(float x, float y, double r) {
    double err = std::isnan(r) ? (std::isnan(y) ? 0 : 1e30)
                               : std::fabs(static_cast<double>(y) - r) / Ulp(r);
    if (std::isnan(err)) err = 1e30;
    sum += err;
    ++n;
    if (err > max) max = err, worst = x;
  }
};
}  // namespace

int main(int argc, char** argv) {
  const bool ftz = argc > 1 && std::strcmp(argv[1], "ftz") == 0;
  if (ftz) {
    _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
    _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
  }
  using Packet = Eigen::internal::packet_traits<float>::type;
  using Eigen::internal::ploadu;
  using Eigen::internal::pstoreu;
  constexpr int kSize = Eigen::internal::unpacket_traits<Packet>::size;
  const int64_t kBlock = 1 << 16;
  std::vector<float> xs(kBlock), ours(kBlock), eigen(kBlock);
  Stats all[2], mid[2];  // [0] ours, [1] Eigen; mid: |x| in [2^-13, 10.1]
  for (uint32_t sign = 0; sign < 2; ++sign) {
    for (uint64_t base = 0; base < 0x7F800000u; base += kBlock) {
      const int64_t n = std::min<uint64_t>(kBlock, 0x7F800000u - base);
      for (int64_t i = 0; i < kBlock; ++i)
        xs[i] = i < n ? FromBits(uint32_t(base + i) | (sign << 31)) : 0.f;
      for (int64_t i = 0; i < kBlock; i += kSize)
        pstoreu(ours.data() + i, ErfcPacket(ploadu<Packet>(xs.data() + i)));
      Eigen::Map<Eigen::ArrayXf>(eigen.data(), kBlock) =
          Eigen::Map<const Eigen::ArrayXf>(xs.data(), kBlock).erfc();
      for (int64_t i = 0; i < n; ++i) {
        const float x = xs[i];
        if (ftz && std::fabs(x) < 0x1p-126f) continue;  // read as zero
        double r = Reference(x);
        if (ftz && std::fabs(r) < 0x1p-126) r = 0;
        const bool in_mid = std::fabs(x) >= 0x1p-13f && std::fabs(x) <= 10.1f;
        for (int k = 0; k < 2; ++k) {
          const float y = k == 0 ? ours[i] : eigen[i];
          all[k].Add(x, y, r);
          if (in_mid) mid[k].Add(x, y, r);
        }
      }
    }
  }
  std::printf("%s; ulps of a double reference\n",
              ftz ? "FTZ/DAZ on" : "FTZ off (subnormal results count)");
  const char* names[2] = {"ours ", "Eigen"};
  for (int k = 0; k < 2; ++k)
    std::printf("%s: all %llu finite: max %.3f (x = %a), mean %.5f; "
                "|x| in [2^-13, 10.1]: mean %.4f\n",
                names[k], static_cast<unsigned long long>(all[k].n), all[k].max, all[k].worst,
                all[k].sum / all[k].n, mid[k].sum / mid[k].n);
  const float specials[] = {NAN,   INFINITY, -INFINITY, 0.f,    -0.f,
                            10.1f, -10.1f,   3e38f,     -3e38f, 1e-45f};
  for (float s : specials) {
    alignas(64) float in[kSize] = {}, out[kSize];
    in[0] = s;
    Eigen::internal::pstore(out, ErfcPacket(Eigen::internal::pload<Packet>(in)));
    std::printf("  erfc(%g) = %g\n", s, out[0]);
  }
  std::printf("ns an element, one core, L1, FTZ/DAZ on: ErfcPacket %.3f, Eigen %.3f\n",
              NsPerElement<Packet>([](const Packet& x) { return ErfcPacket(x); }),
              NsPerElement<Packet>([](const Packet& x) { return Eigen::internal::perfc(x); }));
}
