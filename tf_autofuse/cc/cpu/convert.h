// Moving data between tensors and tile slots: f16/bf16 widening and rounding, (non-temporal)
// stores, and broadcast loads that walk an input's BroadcastPlan row by row.
//
// Part of the CPU interpreter's one translation unit: included by interpreter.cc (and by the
// parts after it), never compiled alone, so that the hot loops inline across the parts.

#ifndef TF_AUTOFUSE_CC_CPU_CONVERT_H_
#define TF_AUTOFUSE_CC_CPU_CONVERT_H_

#include <algorithm>
#include <cstring>

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define TF_AUTOFUSE_X86_CONVERT 1
#endif

#include "Eigen/Core"
#include "schedule.h"

namespace tf_autofuse {
namespace {

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
#ifdef __AVX512F__
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
  }
#endif
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
#ifdef __AVX512F__
  const bool stream32 = stream && Aligned(dst, 32);
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if (stream32) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), h);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
    }
  }
#endif
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

// A contiguous run of n tensor elements -> the compute type.
void ConvertRun(DType dtype, const char* src, char* dst, int64_t n) {
  switch (dtype) {
    case DType::kF16:
      WidenHalf(reinterpret_cast<const Eigen::half*>(src), reinterpret_cast<float*>(dst), n);
      break;
    case DType::kBF16:
      WidenBfloat16(reinterpret_cast<const Eigen::bfloat16*>(src), reinterpret_cast<float*>(dst),
                    n);
      break;
    default:
      std::memcpy(dst, src, n * DTypeSize(dtype));
      break;
  }
}

// Input tile -> slot of the compute type; elements [valid, count) are zeroed.
void LoadTile(DType dtype, const char* src, char* dst, int64_t valid, int64_t count) {
  ConvertRun(dtype, src, dst, valid);
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
// One element of a tensor of `dtype`, in the compute type, repeated n times.
void Splat(DType dtype, const char* src, char* dst, int64_t n) {
  switch (dtype) {
    case DType::kF16:
      std::fill_n(reinterpret_cast<float*>(dst), n,
                  static_cast<float>(*reinterpret_cast<const Eigen::half*>(src)));
      break;
    case DType::kBF16:
      std::fill_n(reinterpret_cast<float*>(dst), n,
                  static_cast<float>(*reinterpret_cast<const Eigen::bfloat16*>(src)));
      break;
    case DType::kF32:
      std::fill_n(reinterpret_cast<float*>(dst), n, *reinterpret_cast<const float*>(src));
      break;
    case DType::kF64:
      std::fill_n(reinterpret_cast<double*>(dst), n, *reinterpret_cast<const double*>(src));
      break;
    case DType::kI32:
      std::fill_n(reinterpret_cast<int32_t*>(dst), n, *reinterpret_cast<const int32_t*>(src));
      break;
    case DType::kBool:
      std::memset(dst, *src, n);
      break;
  }
}


// Fills dst[unit, reps * unit) with reps - 1 more copies of dst[0, unit), doubling the copied
// span each time: a few large memcpys instead of one small copy per repetition.
void RepeatByDoubling(char* dst, int64_t unit, int64_t reps) {
  int64_t filled = 1;
  while (filled < reps) {
    const int64_t n = std::min(filled, reps - filled);
    std::memcpy(dst + filled * unit, dst, n * unit);
    filled += n;
  }
}

// Elements [offset, offset + valid) of an iteration space, read from a stretched input through
// its plan, into a slot of the compute type; elements [valid, count) are zeroed. Walks the rows
// of the innermost collapsed dimension: a read one is a contiguous run (copied), a stretched one
// a single value (splat); the index arithmetic is per row, never per element. Where a read row
// sits in a stretched dimension (a [C] bias over [N, C], a [N, 1, C] scale over [N, HW, C]), the
// following rows of that dimension are the same values: the row is converted once and repeated
// by doubling.
void BroadcastLoad(const BroadcastPlan& plan, DType dtype, const char* src, char* dst,
                   int64_t offset, int64_t valid, int64_t count) {
  const int rank = static_cast<int>(plan.dims.size());
  const int esize = DTypeSize(dtype);
  const int csize = ComputeSize(ComputeTypeOf(dtype));
  int64_t index[64];  // collapsed ranks alternate read/stretched, so they stay small
  int64_t rest = offset;
  int64_t base = 0;
  for (int d = rank - 1; d >= 0; --d) {
    index[d] = rest % plan.dims[d];
    rest /= plan.dims[d];
    base += index[d] * plan.strides[d];
  }
  const int64_t row = plan.dims[rank - 1];
  const int64_t row_stride = plan.strides[rank - 1];
  const bool repeated_rows = rank >= 2 && row_stride != 0 && plan.strides[rank - 2] == 0;
  // Moves the walk on to dimension d's next index, carrying into the outer dimensions.
  auto carry = [&](int d) {
    for (; d >= 0; --d) {
      base += plan.strides[d];
      if (++index[d] < plan.dims[d]) return;
      base -= plan.dims[d] * plan.strides[d];
      index[d] = 0;
    }
  };
  int64_t done = 0;
  while (done < valid) {
    if (repeated_rows && index[rank - 1] == 0 && valid - done >= 2 * row) {
      const int64_t reps = std::min(plan.dims[rank - 2] - index[rank - 2], (valid - done) / row);
      char* out = dst + done * csize;
      ConvertRun(dtype, src + base * esize, out, row);
      RepeatByDoubling(out, row * csize, reps);
      done += reps * row;
      index[rank - 2] += reps - 1;  // base is unchanged: the dimension's stride is 0
      carry(rank - 2);
      continue;
    }
    const int64_t run = std::min(row - index[rank - 1], valid - done);
    if (row_stride != 0) {
      ConvertRun(dtype, src + base * esize, dst + done * csize, run);
    } else {
      Splat(dtype, src + base * esize, dst + done * csize, run);
    }
    done += run;
    index[rank - 1] += run;
    base += run * row_stride;
    if (index[rank - 1] == row) {  // next row
      index[rank - 1] = 0;
      base -= row * row_stride;
      carry(rank - 2);
    }
  }
  std::memset(dst + valid * csize, 0, (count - valid) * csize);
}

// Whether elements [offset, offset + count) of the iteration shape read consecutive elements of
// a broadcast input: its plan's innermost dimension is contiguous and they lie in one row of it
// (a bias at least as long as a tile). *first: the index of the first one.
bool ReadsOneRun(const BroadcastPlan& plan, int64_t offset, int64_t count, int64_t* first) {
  const int rank = static_cast<int>(plan.dims.size());
  if (plan.strides[rank - 1] != 1 || offset % plan.dims[rank - 1] + count > plan.dims[rank - 1]) {
    return false;
  }
  int64_t rest = offset;
  *first = 0;
  for (int d = rank - 1; d >= 0; --d) {
    *first += rest % plan.dims[d] * plan.strides[d];
    rest /= plan.dims[d];
  }
  return true;
}

}  // namespace
}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CC_CPU_CONVERT_H_
