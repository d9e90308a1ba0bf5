// Speed of a packet function, shared by scripts/exp_ulps.cc and scripts/erfc_ulps.cc: ns an
// element over an L1-resident array of 4096 floats evenly over [-10, 10], two packets a turn as
// packet_math.h's RunPackets, one core, the best of 3 runs of 20000 passes. With FTZ/DAZ on, as
// on TensorFlow's threads: without, each packet holding a subnormal result (erfc beyond |x| ~ 9.4)
// takes a microcode assist that costs more than the function itself.
#ifndef TF_AUTOFUSE_SCRIPTS_PACKET_TIMING_H_
#define TF_AUTOFUSE_SCRIPTS_PACKET_TIMING_H_

#include <Eigen/Core>
#include <xmmintrin.h>

#include <algorithm>
#include <chrono>
#include <vector>

template <typename Packet, typename F>
double NsPerElement(F f) {
  constexpr int kSize = Eigen::internal::unpacket_traits<Packet>::size;
  const unsigned int csr = _mm_getcsr();
  _mm_setcsr(csr | 0x8040);  // FTZ and DAZ
  std::vector<float> in(4096), out(4096);
  for (int i = 0; i < 4096; ++i) in[i] = -10 + 20.0f * i / 4096;
  double best = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    for (int it = 0; it < 20000; ++it) {
      for (int i = 0; i < 4096; i += 2 * kSize) {
        const Packet y0 = f(Eigen::internal::ploadu<Packet>(&in[i]));
        const Packet y1 = f(Eigen::internal::ploadu<Packet>(&in[i + kSize]));
        Eigen::internal::pstoreu(&out[i], y0);
        Eigen::internal::pstoreu(&out[i + kSize], y1);
      }
      asm volatile("" : : "r"(out.data()) : "memory");  // each pass's stores are needed
    }
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count() / 20000 / 4096 * 1e9);
  }
  _mm_setcsr(csr);
  return best;
}

#endif  // TF_AUTOFUSE_SCRIPTS_PACKET_TIMING_H_
