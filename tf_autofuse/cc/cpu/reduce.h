// Reductions: accumulators (lanes of a row, one per inner index, row and column groups),
// compensated f64 sums and products, and finishing a reduction into its reduced value.
//
// Part of the CPU interpreter's one translation unit: included by interpreter.cc (and by the
// parts after it), never compiled alone, so that the hot loops inline across the parts.

#ifndef TF_AUTOFUSE_CC_CPU_REDUCE_H_
#define TF_AUTOFUSE_CC_CPU_REDUCE_H_

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ops.h"

namespace tf_autofuse {
namespace {

// Reductions: accumulate, then finish. `lanes`: a row reduction into kLanes partial results
// (lane = position mod kLanes; tiles of a row start at multiples of kLanes); otherwise one
// accumulator per element of the tile.

template <typename A>
A Identity(OpCode op) {
  switch (op) {
    case OpCode::kProd:
      return A(1);
    case OpCode::kMax:
      return std::numeric_limits<A>::has_infinity ? -std::numeric_limits<A>::infinity()
                                                  : std::numeric_limits<A>::lowest();
    case OpCode::kMin:
      return std::numeric_limits<A>::has_infinity ? std::numeric_limits<A>::infinity()
                                                  : std::numeric_limits<A>::max();
    default:
      return A(0);
  }
}

// The combining functions; i32 wraps, Max/Min propagate NaN.
template <typename A, typename F>
void WithCombine(OpCode op, F body) {
  if constexpr (std::is_same_v<A, int64_t>) {  // i32 Mean
    return body([](A a, A x) { return a + x; });
  } else if constexpr (std::is_same_v<A, int32_t>) {
    switch (op) {
      case OpCode::kProd:
        return body([](A a, A x) { return Wrap(U(a) * U(x)); });
      case OpCode::kMax:
        return body([](A a, A x) { return std::max(a, x); });
      case OpCode::kMin:
        return body([](A a, A x) { return std::min(a, x); });
      default:
        return body([](A a, A x) { return Wrap(U(a) + U(x)); });
    }
  } else {
    switch (op) {
      case OpCode::kProd:
        return body([](A a, A x) { return a * x; });
      case OpCode::kMax:  // NaN-propagating, like AccumulateExtremum
        return body([](A a, A x) { return a != a || x != x ? (a != a ? a : x) : std::max(a, x); });
      case OpCode::kMin:
        return body([](A a, A x) { return a != a || x != x ? (a != a ? a : x) : std::min(a, x); });
      default:
        return body([](A a, A x) { return a + x; });
    }
  }
}

// f64 sums and products carry a compensation term (`comp`, next to the accumulator): Neumaier's
// for sums, the exact FMA residual for products. Without it an f64 reduction would be no more
// accurate than TensorFlow's (it has no wider type to accumulate in), and as the order differs,
// often less. Once the running value is not finite (an infinity or NaN among the terms, or an
// overflow) the compensation stops: it would be inf - inf = NaN, and turn a sum of +inf into NaN.
// The result is then the plain one, as TensorFlow's (accumulator + a finite compensation).
inline void CompensatedAdd(double& s, double& c, double x) {
  const double t = s + x;
  if (std::isfinite(t)) c += std::abs(s) >= std::abs(x) ? (s - t) + x : (x - t) + s;
  s = t;
}
inline void CompensatedMul(double& p, double& e, double x) {
  const double q = p * x;
  if (std::isfinite(q)) e = std::fma(e, x, std::fma(p, x, -q));
  p = q;
}

bool Compensated(OpCode op, ComputeType src, ComputeType acc) {
  return src == ComputeType::kF64 && acc == ComputeType::kF64 &&
         (op == OpCode::kSum || op == OpCode::kMean || op == OpCode::kProd);
}

void AccumulateCompensated(OpCode op, const double* x, double* acc, double* comp, int64_t n,
                           bool lanes) {
  const bool sum = op != OpCode::kProd;
  auto update = [sum](double& a, double& c, double v) {
    if (sum) {
      CompensatedAdd(a, c, v);
    } else {
      CompensatedMul(a, c, v);
    }
  };
  if (lanes) {
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) update(acc[l], comp[l], x[i + l]);
    }
    for (; i < n; ++i) update(acc[i % kLanes], comp[i % kLanes], x[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) update(acc[i], comp[i], x[i]);
  }
}

// Float Max/Min through Eigen's NaN-propagating max/min, which vectorise (a plain C++ select
// with a NaN test compiles to branches).
template <typename S, typename A>
void AccumulateExtremum(OpCode op, const S* x, A* acc, int64_t n, bool lanes) {
  const bool max = op == OpCode::kMax;
  auto step = [max](auto& a, const auto& v) {
    if (max) {
      a = a.template max<Eigen::PropagateNaN>(v);
    } else {
      a = a.template min<Eigen::PropagateNaN>(v);
    }
  };
  if (lanes) {
    using Lanes = Eigen::Array<A, kLanes, 1>;
    Lanes local = Eigen::Map<const Lanes>(acc);
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      step(local, Eigen::Map<const Eigen::Array<S, kLanes, 1>>(x + i).template cast<A>());
    }
    Eigen::Map<Lanes> result(acc);
    result = local;
    for (; i < n; ++i) {
      A& a = acc[i % kLanes];
      const A v = static_cast<A>(x[i]);
      a = v != v || a != a ? (v != v ? v : a) : (max ? std::max(a, v) : std::min(a, v));
    }
  } else {
    Eigen::Map<ArrayX<A>> a(acc, n);
    step(a, In<S>(x, n).template cast<A>());
  }
}

template <typename S, typename A>
void AccumulateAs(OpCode op, const S* x, A* acc, int64_t n, bool lanes) {
  if constexpr (!std::is_integral_v<A>) {
    if (op == OpCode::kMax || op == OpCode::kMin) {
      AccumulateExtremum(op, x, acc, n, lanes);
      return;
    }
  }
  WithCombine<A>(op, [&](auto f) {
    if (lanes) {
      A local[kLanes];
      std::copy_n(acc, kLanes, local);
      int64_t i = 0;
      for (; i + kLanes <= n; i += kLanes) {
        for (int64_t l = 0; l < kLanes; ++l) local[l] = f(local[l], static_cast<A>(x[i + l]));
      }
      std::copy_n(local, kLanes, acc);
      for (; i < n; ++i) acc[i % kLanes] = f(acc[i % kLanes], static_cast<A>(x[i]));
    } else {
      for (int64_t i = 0; i < n; ++i) acc[i] = f(acc[i], static_cast<A>(x[i]));
    }
  });
}

// Row-group mode: `rows` consecutive rows of `length` elements, each reduced into its own
// accumulator.
template <typename S, typename A>
void AccumulateRowsAs(OpCode op, const S* x, A* acc, double* comp, int64_t rows,
                      int64_t length) {
  if constexpr (std::is_same_v<S, double> && std::is_same_v<A, double>) {
    if (op != OpCode::kMax && op != OpCode::kMin) {
      for (int64_t j = 0; j < rows; ++j) {
        for (int64_t r = 0; r < length; ++r) {
          if (op == OpCode::kProd) {
            CompensatedMul(acc[j], comp[j], x[j * length + r]);
          } else {
            CompensatedAdd(acc[j], comp[j], x[j * length + r]);
          }
        }
      }
      return;
    }
  }
  // Each row into kLanes partial results (lane = position mod kLanes, vectorised), folded in
  // lane order: the order of lanes mode, so a row gives the same value in either mode. An
  // in-order scalar loop would be one dependent add (4 cycles) per element.
  A local[kLanes];
  for (int64_t j = 0; j < rows; ++j) {
    std::fill_n(local, kLanes, Identity<A>(op));
    AccumulateAs(op, x + j * length, local, length, /*lanes=*/true);
    WithCombine<A>(op, [&](auto f) {
      A a = local[0];
      for (int64_t l = 1; l < kLanes; ++l) a = f(a, local[l]);
      acc[j] = f(acc[j], a);
    });
  }
}

// Column-group mode: `rows` consecutive blocks of `width` (= inner) elements, element i of every
// block accumulated into accumulator i, block after block (the order of the one-block tiles).
template <typename S, typename A>
void AccumulateColumnsAs(OpCode op, const S* x, A* acc, double* comp, int64_t rows,
                         int64_t width) {
  for (int64_t j = 0; j < rows; ++j) {
    const S* block = x + j * width;
    if constexpr (std::is_same_v<S, double> && std::is_same_v<A, double>) {
      if (op == OpCode::kSum || op == OpCode::kMean) {
        for (int64_t i = 0; i < width; ++i) CompensatedAdd(acc[i], comp[i], block[i]);
        continue;
      }
      if (op == OpCode::kProd) {
        for (int64_t i = 0; i < width; ++i) CompensatedMul(acc[i], comp[i], block[i]);
        continue;
      }
    }
    if constexpr (!std::is_integral_v<A>) {
      if (op == OpCode::kMax || op == OpCode::kMin) {
        AccumulateExtremum(op, block, acc, width, /*lanes=*/false);
        continue;
      }
    }
    WithCombine<A>(op, [&](auto f) {
      for (int64_t i = 0; i < width; ++i) acc[i] = f(acc[i], static_cast<A>(block[i]));
    });
  }
}

// Calls run(x, a) with a step's source and accumulator as pointers of their types (f32 into
// f32 or f64, f64 into f64, i32 into i32 or i64).
template <typename Run>
void WithAccumulatorTypes(const Step& step, const char* src, char* acc, Run run) {
  switch (step.src_ctype) {
    case ComputeType::kF32:
      if (step.acc_ctype == ComputeType::kF64) {
        run(reinterpret_cast<const float*>(src), reinterpret_cast<double*>(acc));
      } else {
        run(reinterpret_cast<const float*>(src), reinterpret_cast<float*>(acc));
      }
      break;
    case ComputeType::kF64:
      run(reinterpret_cast<const double*>(src), reinterpret_cast<double*>(acc));
      break;
    case ComputeType::kI32:
      if (step.acc_ctype == ComputeType::kI64) {
        run(reinterpret_cast<const int32_t*>(src), reinterpret_cast<int64_t*>(acc));
      } else {
        run(reinterpret_cast<const int32_t*>(src), reinterpret_cast<int32_t*>(acc));
      }
      break;
    default:
      break;
  }
}

// Row-group (columns == false) or column-group (columns == true) accumulation of a tile of
// `rows` rows of `length` elements.
void AccumulateGroup(const Step& step, const char* src, char* acc, char* comp, int64_t rows,
                     int64_t length, bool columns) {
  double* c = reinterpret_cast<double*>(comp);
  WithAccumulatorTypes(step, src, acc, [&](const auto* x, auto* a) {
    if (columns) {
      AccumulateColumnsAs(step.op, x, a, c, rows, length);
    } else {
      AccumulateRowsAs(step.op, x, a, c, rows, length);
    }
  });
}

// Row-group mode: one value per row -> the value repeated over its row; [valid, count) zeroed.
// Column-group mode: the inner vector of reduced values repeated for every block of the tile.
template <typename T>
void TileAs(const T* values, T* out, int64_t width, int64_t valid, int64_t count) {
  const int64_t blocks = (valid + width - 1) / width;
  if (blocks > 0) {
    std::copy_n(values, width, out);
    RepeatByDoubling(reinterpret_cast<char*>(out), width * sizeof(T), blocks);
  }
  std::fill(out + valid, out + count, T(0));
}

template <typename T>
void ExpandAs(const T* values, T* out, int64_t length, int64_t valid, int64_t count,
              bool columns = false) {
  if (columns) return TileAs(values, out, length, valid, count);
  for (int64_t j = 0; j * length < valid; ++j) std::fill_n(out + j * length, length, values[j]);
  std::fill(out + valid, out + count, T(0));
}

void ExpandReduced(ComputeType type, const char* values, char* out, int64_t length,
                   int64_t valid, int64_t count, bool columns) {
  switch (type) {
    case ComputeType::kF32:
      ExpandAs(reinterpret_cast<const float*>(values), reinterpret_cast<float*>(out), length,
               valid, count, columns);
      break;
    case ComputeType::kF64:
      ExpandAs(reinterpret_cast<const double*>(values), reinterpret_cast<double*>(out), length,
               valid, count, columns);
      break;
    case ComputeType::kI32:
      ExpandAs(reinterpret_cast<const int32_t*>(values), reinterpret_cast<int32_t*>(out), length,
               valid, count, columns);
      break;
    default:
      ExpandAs(reinterpret_cast<const uint8_t*>(values), reinterpret_cast<uint8_t*>(out), length,
               valid, count, columns);
      break;
  }
}

void Accumulate(const Step& step, const char* src, char* acc, char* comp, int64_t n,
                bool lanes) {
  if (Compensated(step.op, step.src_ctype, step.acc_ctype)) {
    AccumulateCompensated(step.op, reinterpret_cast<const double*>(src),
                          reinterpret_cast<double*>(acc), reinterpret_cast<double*>(comp), n,
                          lanes);
    return;
  }
  WithAccumulatorTypes(step, src, acc,
                       [&](const auto* x, auto* a) { AccumulateAs(step.op, x, a, n, lanes); });
}

template <typename A>
void InitAccumulatorAs(OpCode op, A* acc, int64_t n) {
  std::fill_n(acc, n, Identity<A>(op));
}

void InitAccumulator(const Step& finalize, char* acc, char* comp, int64_t n) {
  std::memset(comp, 0, n * sizeof(double));
  switch (finalize.acc_ctype) {
    case ComputeType::kF32:
      InitAccumulatorAs(finalize.op, reinterpret_cast<float*>(acc), n);
      break;
    case ComputeType::kF64:
      InitAccumulatorAs(finalize.op, reinterpret_cast<double*>(acc), n);
      break;
    case ComputeType::kI32:
      InitAccumulatorAs(finalize.op, reinterpret_cast<int32_t*>(acc), n);
      break;
    case ComputeType::kI64:
      InitAccumulatorAs(finalize.op, reinterpret_cast<int64_t*>(acc), n);
      break;
    case ComputeType::kBool:
      break;
  }
}

// The accumulators -> the reduction's value in its compute type: lanes combined in lane order,
// Mean divided by the number of reduced elements (i32 truncating; 0 when there are none).
template <typename A, typename V>
void FinalizeAs(OpCode op, const A* acc, V* out, int64_t valid, int64_t count, bool lanes,
                int64_t reduce) {
  auto finish = [&](A a) -> V {
    if (op != OpCode::kMean) return static_cast<V>(a);
    if constexpr (std::is_integral_v<A>) {
      return reduce == 0 ? V(0) : static_cast<V>(static_cast<int64_t>(a) / reduce);
    } else {
      return static_cast<V>(a / static_cast<A>(reduce));  // 0 / 0 = NaN
    }
  };
  if (lanes) {
    WithCombine<A>(op, [&](auto f) {
      A a = acc[0];
      for (int64_t l = 1; l < kLanes; ++l) a = f(a, acc[l]);
      std::fill_n(out, count, finish(a));
    });
  } else {
    for (int64_t i = 0; i < valid; ++i) out[i] = finish(acc[i]);
    std::fill(out + valid, out + count, V(0));
  }
}

// An accumulator plus its compensation term. A zero term adds nothing, and adding it anyway
// would turn a -0.0 result (a product with an odd number of negative factors and a zero) into
// +0.0.
inline double WithCompensation(double a, double c) { return c == 0.0 ? a : a + c; }

// Compensated f64 accumulators: the lanes (or each element) folded together with their
// compensation terms, then finished like the others.
void FinalizeCompensated(OpCode op, const double* acc, const double* comp, double* out,
                         int64_t valid, int64_t count, bool lanes, int64_t reduce) {
  const bool sum = op != OpCode::kProd;
  auto finish = [&](double a) { return op == OpCode::kMean ? a / static_cast<double>(reduce) : a; };
  if (lanes) {
    double a = sum ? 0.0 : 1.0, c = 0.0;
    for (int64_t l = 0; l < kLanes; ++l) {
      if (sum) {
        CompensatedAdd(a, c, acc[l]);
        c += comp[l];
      } else {
        // (a + c) * (p + e) ~ a*p + (c*p + a*e): the product of the two error terms is dropped
        const double q = a * acc[l];
        if (std::isfinite(q)) c = std::fma(a, acc[l], -q) + c * acc[l] + a * comp[l];
        a = q;
      }
    }
    std::fill_n(out, count, finish(WithCompensation(a, c)));
  } else {
    for (int64_t i = 0; i < valid; ++i) out[i] = finish(WithCompensation(acc[i], comp[i]));
    std::fill(out + valid, out + count, 0.0);
  }
}

// Split runs (interpreter.cc): the partial accumulators of one block of R folded into `acc`
// (and `comp`), `n` elements, with the reduction's own combining function. Blocks are folded in
// block order, so the result depends on the shapes alone. Compensated f64 sums and products fold
// as the lanes of a row do in FinalizeCompensated.
template <typename A>
void CombineAs(OpCode op, const A* part, A* acc, int64_t n) {
  WithCombine<A>(op, [&](auto f) {
    for (int64_t i = 0; i < n; ++i) acc[i] = f(acc[i], part[i]);
  });
}

void CombinePartial(const Step& finalize, const char* part, const char* part_comp, char* acc,
                    char* comp, int64_t n) {
  if (Compensated(finalize.op, finalize.src_ctype, finalize.acc_ctype)) {
    const double* p = reinterpret_cast<const double*>(part);
    const double* pc = reinterpret_cast<const double*>(part_comp);
    double* a = reinterpret_cast<double*>(acc);
    double* c = reinterpret_cast<double*>(comp);
    for (int64_t i = 0; i < n; ++i) {
      if (finalize.op != OpCode::kProd) {
        CompensatedAdd(a[i], c[i], p[i]);
        c[i] += pc[i];
      } else {
        const double q = a[i] * p[i];
        if (std::isfinite(q)) c[i] = std::fma(a[i], p[i], -q) + c[i] * p[i] + a[i] * pc[i];
        a[i] = q;
      }
    }
    return;
  }
  switch (finalize.acc_ctype) {
    case ComputeType::kF32:
      CombineAs(finalize.op, reinterpret_cast<const float*>(part), reinterpret_cast<float*>(acc), n);
      break;
    case ComputeType::kF64:
      CombineAs(finalize.op, reinterpret_cast<const double*>(part), reinterpret_cast<double*>(acc),
                n);
      break;
    case ComputeType::kI32:
      CombineAs(finalize.op, reinterpret_cast<const int32_t*>(part),
                reinterpret_cast<int32_t*>(acc), n);
      break;
    case ComputeType::kI64:
      CombineAs(finalize.op, reinterpret_cast<const int64_t*>(part),
                reinterpret_cast<int64_t*>(acc), n);
      break;
    case ComputeType::kBool:
      break;
  }
}

void Finalize(const Step& step, const char* acc, const char* comp, char* out, int64_t valid,
              int64_t count, bool lanes, int64_t reduce) {
  if (Compensated(step.op, step.src_ctype, step.acc_ctype)) {
    FinalizeCompensated(step.op, reinterpret_cast<const double*>(acc),
                        reinterpret_cast<const double*>(comp), reinterpret_cast<double*>(out),
                        valid, count, lanes, reduce);
    return;
  }
  switch (step.acc_ctype) {
    case ComputeType::kF32:
      FinalizeAs(step.op, reinterpret_cast<const float*>(acc), reinterpret_cast<float*>(out),
                 valid, count, lanes, reduce);
      break;
    case ComputeType::kF64:
      if (step.ctype == ComputeType::kF32) {
        FinalizeAs(step.op, reinterpret_cast<const double*>(acc), reinterpret_cast<float*>(out),
                   valid, count, lanes, reduce);
      } else {
        FinalizeAs(step.op, reinterpret_cast<const double*>(acc), reinterpret_cast<double*>(out),
                   valid, count, lanes, reduce);
      }
      break;
    case ComputeType::kI32:
      FinalizeAs(step.op, reinterpret_cast<const int32_t*>(acc), reinterpret_cast<int32_t*>(out),
                 valid, count, lanes, reduce);
      break;
    case ComputeType::kI64:
      FinalizeAs(step.op, reinterpret_cast<const int64_t*>(acc), reinterpret_cast<int32_t*>(out),
                 valid, count, lanes, reduce);
      break;
    default:
      break;
  }
}

}  // namespace
}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CC_CPU_REDUCE_H_
