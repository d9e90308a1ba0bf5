// Which kernel of ops.h and reduce.h runs each op, per compute type: the interpreter's dispatch
// (step.h, RunCompute; ops.h, RunFloat) goes through CpuKernelsOf, and the op table is checked
// against it when the library is compiled: an op with no kernel for a dtype the table allows, and
// no cpu_refusal in the table, is a compile error naming the op.
//
// Adding an op: its row in tf_autofuse/rewriter/catalog.py, its body in the family's function of
// ops.h (RunFloatSimple, RunFloatBinary, RunIntUnary...) and its line here.
//
// Part of the CPU interpreter's one translation unit: included by interpreter.cc (and by the
// parts after it), never compiled alone, so that the hot loops inline across the parts.

#ifndef TF_AUTOFUSE_CC_CPU_KERNELS_H_
#define TF_AUTOFUSE_CC_CPU_KERNELS_H_

#include <cstdint>

#include "schedule.h"

namespace tf_autofuse {

// The kernel families, each one function (a switch over its ops) in ops.h or reduce.h.
enum class Kernel : uint8_t {
  kNone,
  kFloatSimple,          // RunFloatSimple: one or two exact instructions
  kFloatTranscendental,  // RunFloatTranscendental
  kFloatActivation,      // RunFloatActivation
  kFloatBinary,          // RunFloatBinary
  kLeakyRelu,            // RunLeakyRelu (its alpha attribute)
  kIntUnary,             // RunIntUnary
  kIntBinary,            // RunIntBinary
  kLogical,              // RunLogical
  kCompare,              // RunCompare -> bool
  kClassify,             // RunClassify -> bool
  kSelect,               // RunSelect
  kCast,                 // RunCast
  kFill,                 // Fill: ZerosLike, OnesLike
  kReduction,            // reduce.h: accumulate and finalize
};

// The kernel of an op for operands computed in fp32/f64, in i32, and in bool.
struct Kernels {
  Kernel floats = Kernel::kNone;
  Kernel ints = Kernel::kNone;
  Kernel bools = Kernel::kNone;
};

constexpr Kernels CpuKernelsOf(OpCode op) {
  switch (op) {
    case OpCode::kAbs: case OpCode::kNeg: case OpCode::kSquare: case OpCode::kSign:
      return {Kernel::kFloatSimple, Kernel::kIntUnary};
    case OpCode::kReciprocal: case OpCode::kSqrt: case OpCode::kRsqrt: case OpCode::kFloor:
    case OpCode::kCeil: case OpCode::kRound:
      return {Kernel::kFloatSimple};
    case OpCode::kRelu: case OpCode::kRelu6:
      return {Kernel::kFloatActivation, Kernel::kIntUnary};
    case OpCode::kElu: case OpCode::kSelu: case OpCode::kSigmoid: case OpCode::kTanh:
    case OpCode::kSoftplus: case OpCode::kSoftsign:
      return {Kernel::kFloatActivation};
    case OpCode::kExp: case OpCode::kExpm1: case OpCode::kLog: case OpCode::kLog1p:
    case OpCode::kErf: case OpCode::kErfc: case OpCode::kSin: case OpCode::kCos:
    case OpCode::kTan: case OpCode::kAtan: case OpCode::kSinh: case OpCode::kCosh:
      return {Kernel::kFloatTranscendental};
    case OpCode::kLeakyRelu:
      return {Kernel::kLeakyRelu};
    case OpCode::kAdd: case OpCode::kSub: case OpCode::kMul: case OpCode::kMaximum:
    case OpCode::kMinimum: case OpCode::kSquaredDifference:
      return {Kernel::kFloatBinary, Kernel::kIntBinary};
    case OpCode::kDiv: case OpCode::kPow: case OpCode::kFloorDiv: case OpCode::kFloorMod:
      return {Kernel::kFloatBinary};
    case OpCode::kLogicalNot: case OpCode::kLogicalAnd: case OpCode::kLogicalOr:
      return {Kernel::kNone, Kernel::kNone, Kernel::kLogical};
    case OpCode::kIsNan: case OpCode::kIsInf: case OpCode::kIsFinite:
      return {Kernel::kClassify};
    case OpCode::kGreater: case OpCode::kGreaterEqual: case OpCode::kLess:
    case OpCode::kLessEqual: case OpCode::kEqual: case OpCode::kNotEqual:
      return {Kernel::kCompare, Kernel::kCompare};
    case OpCode::kSelect:
      return {Kernel::kSelect, Kernel::kSelect, Kernel::kSelect};
    case OpCode::kCast:
      return {Kernel::kCast};
    case OpCode::kZerosLike: case OpCode::kOnesLike:
      return {Kernel::kFill, Kernel::kFill, Kernel::kFill};
    case OpCode::kSum: case OpCode::kMean: case OpCode::kMax: case OpCode::kMin:
    case OpCode::kProd:
      return {Kernel::kReduction, Kernel::kReduction};
    default:
      break;
  }
  return {};
}

// An op's kernel for operands of compute type `type` (Select: of its x and y).
inline Kernel CpuKernelFor(OpCode op, ComputeType type) {
  const Kernels kernels = CpuKernelsOf(op);
  switch (type) {
    case ComputeType::kI32:
      return kernels.ints;
    case ComputeType::kBool:
      return kernels.bools;
    default:
      return kernels.floats;
  }
}

// Every dtype class the table allows has a kernel; a refused op has none.
constexpr bool CpuKernelsCover(OpCode op, int dtypes, bool refused) {
  const Kernels k = CpuKernelsOf(op);
  if (refused) {
    return k.floats == Kernel::kNone && k.ints == Kernel::kNone && k.bools == Kernel::kNone;
  }
  return (!(dtypes & kFloatTypes) || k.floats != Kernel::kNone) &&
         (!(dtypes & kI32Type) || k.ints != Kernel::kNone) &&
         (!(dtypes & kBoolType) || k.bools != Kernel::kNone);
}

#define TF_AUTOFUSE_CHECK_CPU_KERNEL(name, arity, dtypes, result, cost, cost_f64,            \
                                     cpu_refusal)                                           \
  static_assert(CpuKernelsCover(OpCode::k##name, dtypes, (cpu_refusal) != nullptr),         \
                "the CPU interpreter has no kernel for op " #name " for every dtype the op " \
                "table allows (add its body in cc/cpu/ops.h and its line in CpuKernelsOf, "  \
                "cc/cpu/kernels.h), or the table's cpu_refusal for it does not match");
TF_AUTOFUSE_OPS(TF_AUTOFUSE_CHECK_CPU_KERNEL)
#undef TF_AUTOFUSE_CHECK_CPU_KERNEL

}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CC_CPU_KERNELS_H_
