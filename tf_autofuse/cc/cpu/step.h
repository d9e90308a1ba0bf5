// Running one step of a schedule: per-thread scratch, operands (tiles, immediates, scalar
// reduced values), the dispatch of a compute step to its operator family; the Frame of one
// schedule run, and the step labels of the kernel profile.
//
// Part of the CPU interpreter's one translation unit: included by interpreter.cc (and by the
// parts after it), never compiled alone, so that the hot loops inline across the parts.

#ifndef TF_AUTOFUSE_CC_CPU_STEP_H_
#define TF_AUTOFUSE_CC_CPU_STEP_H_

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "reduce.h"

namespace tf_autofuse {
namespace {

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
template <>
uint8_t ImmediateOf<uint8_t>(const Loc& loc) { return loc.imm.b; }

// An operand: an immediate, a reduced value read as a scalar (a row reduction, in a full pass),
// or a tile.
template <typename T>
Arg<T> MakeArg(const Loc& loc, const char* address, bool scalar_reduced) {
  if (loc.is(Loc::Kind::kImmediate)) return {nullptr, ImmediateOf<T>(loc)};
  if (loc.is(Loc::Kind::kReduced) && scalar_reduced) {
    return {nullptr, *reinterpret_cast<const T*>(address)};
  }
  return {reinterpret_cast<const T*>(address), T(0)};
}

// The ops whose operands and result are of one type T.
template <typename T>
void RunSameType(const Step& step, const char* const* src, char* dst, int64_t count,
                 bool scalar_reduced) {
  const Arg<T> x = MakeArg<T>(step.src[0], src[0], scalar_reduced);
  const Arg<T> y =
      step.num_src > 1 ? MakeArg<T>(step.src[1], src[1], scalar_reduced) : Arg<T>{nullptr, T(0)};
  T* out = reinterpret_cast<T*>(dst);
  if constexpr (std::is_same_v<T, int32_t>) {
    if (CpuKernelsOf(step.op).ints == Kernel::kIntUnary) {
      RunIntUnary(step.op, x.data, out, count);
    } else {
      RunIntBinary(step.op, x, y, out, count);
    }
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    RunLogical(step.op, x, y, out, count);
  } else {
    if (CpuKernelsOf(step.op).floats == Kernel::kLeakyRelu) {
      RunLeakyRelu<T>(x.data, ImmediateOf<T>(step.attr), out, count);
    } else if (x.data == nullptr && y.data == nullptr) {
      // Both operands scalars (a reduced scalar and an immediate cannot meet in a full pass, but
      // stay safe): compute one element and splat it.
      alignas(64) T a[kPad], b[kPad], r[kPad];
      std::fill_n(a, kPad, x.scalar);
      std::fill_n(b, kPad, y.scalar);
      RunFloat<T>(step.op, Arg<T>{a, T(0)}, Arg<T>{b, T(0)}, r, kPad);
      std::fill_n(out, count, r[0]);
    } else {
      RunFloat<T>(step.op, x, y, out, count);
    }
  }
}

template <typename T>
void RunCompareAs(const Step& step, const char* const* src, char* dst, int64_t count,
                  bool scalar_reduced) {
  RunCompare<T>(step.op, MakeArg<T>(step.src[0], src[0], scalar_reduced),
                MakeArg<T>(step.src[1], src[1], scalar_reduced), reinterpret_cast<uint8_t*>(dst),
                count);
}

template <typename T>
void RunSelectAs(const Step& step, const char* const* src, char* dst, int64_t count,
                 bool scalar_reduced) {
  RunSelect<T>(MakeArg<uint8_t>(step.src[0], src[0], scalar_reduced),
               MakeArg<T>(step.src[1], src[1], scalar_reduced),
               MakeArg<T>(step.src[2], src[2], scalar_reduced), reinterpret_cast<T*>(dst), count);
}

void RunCompute(const Step& step, const char* const* src, char* dst, int64_t count,
                bool scalar_reduced) {
  switch (CpuKernelFor(step.op, step.src_ctype)) {
    case Kernel::kCast:
      RunCast(step.src_ctype, step.dtype, src[0], dst, count);
      return;
    case Kernel::kFill:
      Fill(step.ctype, step.op == OpCode::kOnesLike, dst, count);
      return;
    case Kernel::kClassify:
      if (step.src_ctype == ComputeType::kF64) {
        RunClassify(step.op, reinterpret_cast<const double*>(src[0]),
                    reinterpret_cast<uint8_t*>(dst), count);
      } else {
        RunClassify(step.op, reinterpret_cast<const float*>(src[0]),
                    reinterpret_cast<uint8_t*>(dst), count);
      }
      return;
    case Kernel::kCompare:
      switch (step.src_ctype) {
        case ComputeType::kF32: RunCompareAs<float>(step, src, dst, count, scalar_reduced); break;
        case ComputeType::kF64: RunCompareAs<double>(step, src, dst, count, scalar_reduced); break;
        case ComputeType::kI32: RunCompareAs<int32_t>(step, src, dst, count, scalar_reduced); break;
        case ComputeType::kBool: break;
      }
      return;
    case Kernel::kSelect:
      switch (step.ctype) {
        case ComputeType::kF32: RunSelectAs<float>(step, src, dst, count, scalar_reduced); break;
        case ComputeType::kF64: RunSelectAs<double>(step, src, dst, count, scalar_reduced); break;
        case ComputeType::kI32: RunSelectAs<int32_t>(step, src, dst, count, scalar_reduced); break;
        case ComputeType::kBool: RunSelectAs<uint8_t>(step, src, dst, count, scalar_reduced); break;
      }
      return;
    default:
      break;
  }
  switch (step.ctype) {
    case ComputeType::kF32:
      RunSameType<float>(step, src, dst, count, scalar_reduced);
      break;
    case ComputeType::kF64:
      RunSameType<double>(step, src, dst, count, scalar_reduced);
      break;
    case ComputeType::kI32:
      RunSameType<int32_t>(step, src, dst, count, scalar_reduced);
      break;
    case ComputeType::kBool:
      RunSameType<uint8_t>(step, src, dst, count, scalar_reduced);
      break;
  }
}

// What one schedule run reads and writes.
struct Frame {
  const RunShape& run;
  const IoBuffers& io;
  const PlanSet& plans;
  char* scratch;
  bool lanes;  // a row reduction (inner == 1): reduced values are scalars in full passes
  bool rows;   // row-group mode: tiles of whole rows, reduced values expanded per row
  bool cols;   // column-group mode: tiles of whole inner blocks, reduced values tiled
  KernelProfile* profile;  // --kernel_profile: time every step; null: off
  // Kept values: the tiles a kept buffer holds (row-group mode: 1; kept-row mode: the tiles of a
  // row, the tile at offset o * reduce + r0 being number r0 / tile_size); 0: nothing kept.
  int64_t kept_tiles = 0;
  bool prefetch = false;  // strip runs prefetch their tensor inputs (kPrefetchElements)
  // Per input: its row repeated (RepeatedRows), or null; null: no such input.
  const float* const* repeated = nullptr;
};

std::string LocString(const Loc& loc) {
  switch (loc.kind) {
    case Loc::Kind::kSlot:
      return absl::StrCat("slot", loc.index);
    case Loc::Kind::kInput:
      return absl::StrCat("in", loc.index);
    case Loc::Kind::kOutput:
      return absl::StrCat("out", loc.index);
    case Loc::Kind::kReduced:
      return absl::StrCat("reduced", loc.index);
    case Loc::Kind::kAccumulator:
      return absl::StrCat("acc", loc.index);
    case Loc::Kind::kKept:
      return absl::StrCat("kept", loc.index);
    case Loc::Kind::kImmediate:
      return "imm";
  }
  return "?";
}

// What a step does, for the kernel profile: "Exp slot1 <- slot0", "load in0 (f16)"...
std::string StepLabel(const Step& step) {
  std::vector<std::string> srcs;
  for (int i = 0; i < step.num_src; ++i) srcs.push_back(LocString(step.src[i]));
  const std::string from = absl::StrJoin(srcs, ", ");
  switch (step.kind) {
    case Step::Kind::kLoad:
      return absl::StrCat("load ", LocString(step.src[0]), " (", DTypeName(step.dtype), ")");
    case Step::Kind::kBroadcastLoad:
      return absl::StrCat("broadcast load ", LocString(step.src[0]), " (", DTypeName(step.dtype),
                          ")");
    case Step::Kind::kCompute:
      return absl::StrCat(GetOpInfo(step.op).name, " ", LocString(step.dst), " <- ", from);
    case Step::Kind::kConvertStore:
      return absl::StrCat("store ", LocString(step.dst), " (", DTypeName(step.dtype),
                          step.stream ? ", streaming" : "", ")");
    case Step::Kind::kCopyStore:
      return absl::StrCat("copy ", LocString(step.dst), " <- ", from);
    case Step::Kind::kAccumulate:
      return absl::StrCat("accumulate ", GetOpInfo(step.op).name, " ", LocString(step.dst),
                          " <- ", from);
    case Step::Kind::kFinalize:
      return absl::StrCat("finalize ", GetOpInfo(step.op).name, " ", LocString(step.dst));
    case Step::Kind::kExpandReduced:
      return absl::StrCat("expand ", LocString(step.src[0]), " over its rows");
  }
  return "?";
}

// Where one operand of a run's op is for this tile: element i of a strip at data + i * moves

}  // namespace
}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CC_CPU_STEP_H_
