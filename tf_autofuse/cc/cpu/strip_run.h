// Strip fusion, running: one run of a schedule over a full tile, strip after strip, its values
// in strip registers on the stack, biases read in place, tensor inputs prefetched ahead.
//
// Part of the CPU interpreter's one translation unit: included by interpreter.cc (and by the
// parts after it), never compiled alone, so that the hot loops inline across the parts.

#ifndef TF_AUTOFUSE_CC_CPU_STRIP_RUN_H_
#define TF_AUTOFUSE_CC_CPU_STRIP_RUN_H_

#include <chrono>
#include <cstring>
#include <vector>

#include "step.h"
#include "strip_plan.h"

namespace tf_autofuse {
namespace {

// One packet of f16 widened to fp32, and one fp32 packet rounded to f16 (to nearest even, as
// WidenHalf and NarrowToHalf: the same instructions where they exist).
EIGEN_STRONG_INLINE FloatPacket LoadHalfPacket(const char* p) {
#if defined(EIGEN_VECTORIZE_AVX512)
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(EIGEN_VECTORIZE_AVX) && defined(TF_AUTOFUSE_X86_CONVERT)
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  constexpr int64_t kSize = Eigen::internal::unpacket_traits<FloatPacket>::size;
  alignas(64) float wide[kSize];
  WidenHalf(reinterpret_cast<const Eigen::half*>(p), wide, kSize);
  return Eigen::internal::pload<FloatPacket>(wide);
#endif
}

EIGEN_STRONG_INLINE void StoreHalfPacket(char* p, const FloatPacket& v, bool stream) {
#if defined(EIGEN_VECTORIZE_AVX512)
  const __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  if (stream) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), h);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
  }
#else
  constexpr int64_t kSize = Eigen::internal::unpacket_traits<FloatPacket>::size;
  alignas(64) float wide[kSize];
  Eigen::internal::pstore(wide, v);
  NarrowToHalf(wide, reinterpret_cast<Eigen::half*>(p), kSize, stream);
#endif
}

// d[0, n) = f(a[0, n)) where a is f16 (kHalfIn) or fp32 and d is f16 (kHalfOut, stored
// non-temporally when `stream`, d then 32-byte aligned) or fp32.
template <bool kHalfIn, bool kHalfOut, typename F>
void MapHalfPackets(const char* a, char* d, bool stream, int64_t n, F f) {
  using Eigen::internal::ploadu;
  using Eigen::internal::pstoreu;
  constexpr int64_t kSize = Eigen::internal::unpacket_traits<FloatPacket>::size;
  for (int64_t i = 0; i < n; i += kSize) {
    const FloatPacket x = kHalfIn ? LoadHalfPacket(a + 2 * i)
                                  : ploadu<FloatPacket>(reinterpret_cast<const float*>(a) + i);
    if constexpr (kHalfOut) {
      StoreHalfPacket(d + 2 * i, f(x), stream);
    } else {
      pstoreu(reinterpret_cast<float*>(d) + i, f(x));
    }
  }
}

// d[0, n) = f(a[...], b[...]) over whole packets; an operand with `tile` false is one value
// splat.
template <typename F>
EIGEN_STRONG_INLINE void StripBinary(const float* a, bool a_tile, const float* b, bool b_tile,
                                     float* d, int64_t n, F f) {
  using Eigen::internal::ploadu;
  using Eigen::internal::pset1;
  using Eigen::internal::pstoreu;
  constexpr int64_t kSize = Eigen::internal::unpacket_traits<FloatPacket>::size;
  if (a_tile && b_tile) {
    for (int64_t i = 0; i < n; i += kSize) {
      pstoreu(d + i, f(ploadu<FloatPacket>(a + i), ploadu<FloatPacket>(b + i)));
    }
  } else if (a_tile) {
    const FloatPacket y = pset1<FloatPacket>(*b);
    for (int64_t i = 0; i < n; i += kSize) pstoreu(d + i, f(ploadu<FloatPacket>(a + i), y));
  } else {
    const FloatPacket x = pset1<FloatPacket>(*a);
    const FloatPacket y = b_tile ? FloatPacket() : pset1<FloatPacket>(*b);
    for (int64_t i = 0; i < n; i += kSize) {
      pstoreu(d + i, f(x, b_tile ? ploadu<FloatPacket>(b + i) : y));
    }
  }
}

// The unary instructions strips run: unary(f) maps the packet function f over the strip; false
// for any other op. StripCompute and StripComputeHalf share it.
template <typename Unary>
EIGEN_ALWAYS_INLINE bool ApplyUnary(OpCode op, float alpha, const Unary& unary) {
  namespace ei = Eigen::internal;
  using P = FloatPacket;
  using Eigen::PropagateNaN;
  switch (op) {
    case OpCode::kAbs: unary([](const P& x) { return ei::pabs(x); }); break;
    case OpCode::kNeg: unary([](const P& x) { return ei::pnegate(x); }); break;
    case OpCode::kSquare: unary([](const P& x) { return ei::pmul(x, x); }); break;
    case OpCode::kSqrt: unary([](const P& x) { return ei::psqrt(x); }); break;
    case OpCode::kRelu:
#if defined(EIGEN_VECTORIZE_SSE) || defined(EIGEN_VECTORIZE_AVX) || defined(EIGEN_VECTORIZE_AVX512)
      // one maxps(0, x) (Eigen's pmax(a, b) is maxps(b, a)), which returns its second operand
      // x when x is NaN or both are zeros: x < 0 ? 0 : x, as the tile path's
      unary([](const P& x) { return ei::pmax(x, ei::pzero(x)); });
#else
      unary([](const P& x) {
        return ei::pselect(ei::pcmp_lt(x, ei::pzero(x)), ei::pzero(x), x);
      });
#endif
      break;
    case OpCode::kRelu6:
      unary([](const P& x) {
        return ei::pmin<PropagateNaN>(ei::pmax<PropagateNaN>(x, ei::pzero(x)),
                                      ei::pset1<P>(6.0f));
      });
      break;
    case OpCode::kLeakyRelu: {
      const P scale = ei::pset1<P>(alpha);
      unary([&scale](const P& x) {
        return ei::pselect(ei::pcmp_lt(x, ei::pzero(x)), ei::pmul(x, scale), x);
      });
      break;
    }
    case OpCode::kExp: unary([](const P& x) { return ExpPacket(x); }); break;
    case OpCode::kSigmoid: unary([](const P& x) { return SigmoidPacket(x); }); break;
    case OpCode::kErfc: unary([](const P& x) { return ErfcPacket(x); }); break;
    case OpCode::kTanh: unary([](const P& x) { return ei::ptanh(x); }); break;
    default:
      return false;
  }
  return true;
}

// One instruction of a run over n elements of a strip.
// Always inlined into RunStrips: called out of line (as g++ chose once RunStrips grew), the fp32
// strip workloads ran 20-40 % slower.
EIGEN_ALWAYS_INLINE void StripCompute(OpCode op, const float* a, bool a_tile, const float* b,
                                      bool b_tile, float alpha, float* d, int64_t n) {
  namespace ei = Eigen::internal;
  using P = FloatPacket;
  using Eigen::PropagateNaN;
  alignas(64) float splat[kStrip];
  if (!a_tile && GetOpInfo(op).arity == 1) {  // a unary op of an immediate, over the strip
    std::fill_n(splat, n, *a);
    a = splat;
  }
  if (ApplyUnary(op, alpha, [&](auto f) { MapPackets<P>(a, d, n, f); })) return;
  auto binary = [&](auto f) { StripBinary(a, a_tile, b, b_tile, d, n, f); };
  switch (op) {
    case OpCode::kAdd: binary([](const P& x, const P& y) { return ei::padd(x, y); }); break;
    case OpCode::kSub: binary([](const P& x, const P& y) { return ei::psub(x, y); }); break;
    case OpCode::kMul: binary([](const P& x, const P& y) { return ei::pmul(x, y); }); break;
    case OpCode::kDiv: binary([](const P& x, const P& y) { return ei::pdiv(x, y); }); break;
    case OpCode::kMaximum:
      binary([](const P& x, const P& y) { return ei::pmax<PropagateNaN>(x, y); });
      break;
    case OpCode::kMinimum:
      binary([](const P& x, const P& y) { return ei::pmin<PropagateNaN>(x, y); });
      break;
    case OpCode::kSquaredDifference:
      binary([](const P& x, const P& y) {
        const P diff = ei::psub(x, y);
        return ei::pmul(diff, diff);
      });
      break;
    default:
      break;
  }
}

// A unary instruction with its f16 load (half_in) and/or f16 store (half_out) folded in. Out of
// line: three loops per op, which RunStrips need not carry inline.
EIGEN_DONT_INLINE void StripComputeHalf(OpCode op, const char* a, bool half_in, char* d,
                                        bool half_out, bool stream, float alpha, int64_t n) {
  if (half_in && half_out) {
    ApplyUnary(op, alpha, [&](auto f) { MapHalfPackets<true, true>(a, d, stream, n, f); });
  } else if (half_in) {
    ApplyUnary(op, alpha, [&](auto f) { MapHalfPackets<true, false>(a, d, stream, n, f); });
  } else {
    ApplyUnary(op, alpha, [&](auto f) { MapHalfPackets<false, true>(a, d, stream, n, f); });
  }
}

// (moves 0: a register's strip buffer, or one value splat).
struct StripPointer {
  const char* data = nullptr;
  int64_t moves = 0;  // bytes per element of the tile
  bool tile = true;   // false: one value, splat
  const float* at(int64_t i) const { return reinterpret_cast<const float*>(data + i * moves); }
};

// A run over one full tile of `count` elements, strip after strip. The operands' addresses are
// resolved once for the tile.
template <typename Address>
void RunStrips(const Schedule& schedule, const StripRun& run, const Frame& frame,
               const Address& address, bool scalar_reduced, int64_t offset, int64_t count) {
  alignas(64) float registers[kMaxStripRegisters * kStrip];
  struct Resolved {
    StripPointer src[2];
    char* home = nullptr;  // the tensor or buffer written (kStore, kAccumulate, write-back)
    int64_t home_moves = 0;
    bool skipped = false;  // folded into its neighbour, or a broadcast load read in place
  };
  thread_local std::vector<Resolved> per_thread;  // reached once: a TLS lookup is a call
  per_thread.assign(run.ops.size(), Resolved());
  Resolved* resolved = per_thread.data();
  auto pointer = [&](const StripOperand& o) {
    StripPointer p;
    switch (o.kind) {
      case StripOperand::Kind::kRegister:
        p.data = reinterpret_cast<const char*>(registers + o.reg * kStrip);
        break;
      case StripOperand::Kind::kImmediate:
        p.data = reinterpret_cast<const char*>(&o.loc.imm.f32);
        p.tile = false;
        break;
      case StripOperand::Kind::kMemory:
        p.data = address(o.loc);
        p.tile = !(o.loc.is(Loc::Kind::kReduced) && scalar_reduced);
        // a tensor's element size, or a buffer's fp32 (slots, kept and reduced buffers)
        p.moves = !p.tile ? 0 : o.loc.elem_size > 0 ? o.loc.elem_size : sizeof(float);
        break;
    }
    return p;
  };
  // The tensor inputs read strip after strip (a broadcast one is read by its plan), each once,
  // prefetched ahead (Frame::prefetch).
  const char* ahead[kMaxPrefetchStreams];
  int64_t ahead_moves[kMaxPrefetchStreams];
  int num_ahead = 0;
  auto prefetch_input = [&](const StripPointer& p) {
    for (int s = 0; s < num_ahead; ++s) {
      if (ahead[s] == p.data) return;
    }
    if (num_ahead < kMaxPrefetchStreams) {
      ahead[num_ahead] = p.data;
      ahead_moves[num_ahead++] = p.moves;
    }
  };
  for (size_t k = 0; k < run.ops.size(); ++k) {
    const StripOp& op = run.ops[k];
    Resolved& r = resolved[k];
    for (int m = 0; m < op.num_src; ++m) {
      r.src[m] = pointer(op.src[m]);
      if (frame.prefetch && op.kind != StripOp::Kind::kBroadcastLoad &&
          op.src[m].kind == StripOperand::Kind::kMemory && op.src[m].loc.is(Loc::Kind::kInput)) {
        prefetch_input(r.src[m]);
      }
    }
    if (op.kind == StripOp::Kind::kStore) {
      r.home = address(op.home);
      r.home_moves = op.home.elem_size;
    } else if (op.kind == StripOp::Kind::kAccumulate) {
      r.home = address(op.home);  // lanes: one scalar of kLanes lanes (strips start at
                                  // multiples of kLanes); else an accumulator per element
      r.home_moves = frame.lanes ? 0 : ComputeSize(schedule.steps[op.step].acc_ctype);
    } else if (op.half_out) {
      r.home = address(op.home);
      r.home_moves = op.home.elem_size;
    } else if (op.write_back) {
      r.home = address(op.home);
      r.home_moves = sizeof(float);
    }
  }
  // A broadcast input whose values for this tile are one contiguous run somewhere, of its
  // repeated row (RepeatedRows: a short bias) or, in f32, of the tensor itself (a bias row as
  // long as the tile, or longer): the readers of its load's value (StripOp::readers) read them
  // in place, and the load (a copy per strip) is skipped.
  for (size_t k = 0; k < run.ops.size(); ++k) {
    const StripOp& op = run.ops[k];
    resolved[k].skipped = op.skipped;
    if (op.kind != StripOp::Kind::kBroadcastLoad || op.write_back) continue;
    const int j = op.src[0].loc.index;
    const BroadcastPlan& plan = frame.run.full_plans[j];
    StripPointer in_place;
    in_place.moves = sizeof(float);
    int64_t first = 0;
    if (frame.repeated != nullptr && frame.repeated[j] != nullptr) {
      in_place.data = reinterpret_cast<const char*>(frame.repeated[j] + offset % plan.dims[1]);
    } else if (op.dtype == DType::kF32 && ReadsOneRun(plan, offset, count, &first)) {
      in_place.data = frame.io.inputs[j] + first * sizeof(float);
    } else {
      continue;
    }
    resolved[k].skipped = true;
    for (int m : op.readers) {
      for (int s = 0; s < run.ops[m].num_src; ++s) {
        const StripOperand& o = run.ops[m].src[s];
        if (o.kind == StripOperand::Kind::kRegister && o.reg == op.dst) {
          resolved[m].src[s] = in_place;
        }
      }
    }
  }
  // --kernel_profile: each op timed strip by strip, reported as its step's row
  std::chrono::steady_clock::time_point started;
  thread_local std::vector<int64_t> spent_per_thread;
  int64_t* spent = nullptr;
  if (frame.profile != nullptr) {
    spent_per_thread.assign(run.ops.size(), 0);
    spent = spent_per_thread.data();
  }
  for (int64_t i = 0; i < count; i += kStrip) {
    const int64_t n = std::min(kStrip, count - i);
    for (int s = 0; s < num_ahead; ++s) {  // a hint: no fault past a tensor's end
      const char* lines = ahead[s] + i * ahead_moves[s] + kPrefetchAhead;
      for (int64_t b = 0; b < n * ahead_moves[s]; b += 64) __builtin_prefetch(lines + b, 0, 3);
    }
    for (size_t k = 0; k < run.ops.size(); ++k) {
      const StripOp& op = run.ops[k];
      const Resolved& r = resolved[k];
      if (r.skipped) continue;
      if (spent != nullptr) started = std::chrono::steady_clock::now();
      float* dst = op.dst >= 0 ? registers + op.dst * kStrip : nullptr;
      switch (op.kind) {
        case StripOp::Kind::kLoad:
          LoadTile(op.dtype, r.src[0].data + i * r.src[0].moves, reinterpret_cast<char*>(dst),
                   n, n);
          break;
        case StripOp::Kind::kBroadcastLoad: {
          const int j = op.src[0].loc.index;
          BroadcastLoad(frame.run.full_plans[j], op.dtype, frame.io.inputs[j],
                        reinterpret_cast<char*>(dst), offset + i, n, n);
          break;
        }
        case StripOp::Kind::kAccumulate: {
          char* acc = r.home + i * r.home_moves;
          Accumulate(schedule.steps[op.step], reinterpret_cast<const char*>(r.src[0].at(i)), acc,
                     acc + frame.plans.buffer_bytes, n, frame.lanes);
          break;
        }
        case StripOp::Kind::kCompute:
          if (op.half_in || op.half_out) {
            StripComputeHalf(op.op, r.src[0].data + i * r.src[0].moves, op.half_in,
                             op.half_out ? r.home + i * r.home_moves
                                         : reinterpret_cast<char*>(dst),
                             op.half_out, op.stream, op.alpha, n);
            break;
          }
          StripCompute(op.op, r.src[0].at(i), r.src[0].tile,
                       op.num_src > 1 ? r.src[1].at(i) : nullptr, r.src[1].tile, op.alpha, dst,
                       n);
          break;
        case StripOp::Kind::kStore:
          StoreTile(op.dtype, reinterpret_cast<const char*>(r.src[0].at(i)),
                    r.home + i * r.home_moves, n, op.stream);
          break;
      }
      if (op.write_back) std::memcpy(r.home + i * r.home_moves, dst, n * sizeof(float));
      if (spent != nullptr) {
        spent[k] += std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now() - started).count();
      }
    }
  }
  for (size_t k = 0; spent != nullptr && k < run.ops.size(); ++k) {
    const Step& step = schedule.steps[run.ops[k].step];
    // the label of the step's first tile (a bias may be read in place in some tiles only)
    const char* how = run.ops[k].skipped ? " (in strips, folded into its neighbour)"
                      : resolved[k].skipped ? " (in strips, read in place)"
                                            : " (in strips)";
    frame.profile->AddStep(
        &step, [&step, how] { return absl::StrCat(StepLabel(step), how); }, spent[k], count);
  }
}

}  // namespace
}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CC_CPU_STRIP_RUN_H_
