// The fused program (docs/PROGRAM.md) as a compact, validated struct.
//
// ParseProgram reads the text IR that an AutofuseKernel node carries in its `program` attr and
// checks everything the interpreter relies on: inputs, values and outputs numbered from 0 in
// order, every operand defined above its use, known ops with the right arity, one dtype per
// instruction that the op allows, immediates representable in that dtype. A program that
// passes is safe to plan and run; every failure is InvalidArgument naming the line.
//
// Nothing here depends on TensorFlow, only on absl (which TensorFlow ships).

#ifndef TF_AUTOFUSE_CC_PROGRAM_H_
#define TF_AUTOFUSE_CC_PROGRAM_H_

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tf_autofuse {

enum class DType : uint8_t { kF16, kBF16, kF32, kF64, kI32 };

// The IR spelling: "f16", "bf16", "f32", "f64", "i32".
const char* DTypeName(DType dtype);
// Bytes per element in a tensor of this dtype.
int DTypeSize(DType dtype);
inline bool IsFloat(DType dtype) { return dtype != DType::kI32; }

enum class OpCode : uint8_t {
  // unary
  kAbs, kNeg, kRelu, kRelu6, kElu, kSelu, kExp, kExpm1, kLog, kLog1p, kSqrt, kRsqrt, kSquare,
  kReciprocal, kSigmoid, kTanh, kSoftplus, kSoftsign, kSign, kFloor, kCeil, kRound, kErf, kSin,
  kCos,
  // binary
  kAdd, kSub, kMul, kDiv, kMaximum, kMinimum, kSquaredDifference,
};

// One row of the operator table of PROGRAM.md.
struct OpInfo {
  OpCode code;
  const char* name;    // IR spelling, e.g. "SquaredDifference"
  int arity;           // 1 or 2
  bool allows_i32;     // every op allows the float types; some allow i32 too
  int cost;            // rough CPU cycles per fp32 element (AVX2), for the thread-pool cost model
};

const OpInfo& GetOpInfo(OpCode op);
// Looks up an IR op name; false when unknown.
bool LookupOp(absl::string_view name, OpCode* op);

// A reference to an input (inK), an instruction's value (%K) or an immediate literal.
struct Operand {
  enum class Kind : uint8_t { kInput, kValue, kImmediate };
  Kind kind = Kind::kInput;
  int index = 0;         // K of inK / %K
  double immediate = 0;  // the literal, exactly as parsed (kImmediate)
};

struct InputDecl {
  DType dtype = DType::kF32;
  bool unknown_rank = false;  // "[*]"
  std::vector<int64_t> dims;  // -1 for "?"
};

struct Instruction {
  OpCode op = OpCode::kAbs;
  DType dtype = DType::kF32;  // of its non-immediate operands, and of its value
  int num_operands = 0;
  std::array<Operand, 2> operands;
  std::vector<std::pair<std::string, std::string>> attrs;  // none allowed by today's ops
  int line = 0;  // 1-based line in the text, for messages
};

struct Program {
  std::vector<InputDecl> inputs;
  std::vector<Instruction> instructions;
  std::vector<Operand> outputs;  // kInput or kValue

  DType OperandDType(const Operand& operand) const {
    return operand.kind == Operand::Kind::kInput ? inputs[operand.index].dtype
                                                 : instructions[operand.index].dtype;
  }
  DType OutputDType(int k) const { return OperandDType(outputs[k]); }
};

// Parses and validates `text`. On failure returns InvalidArgument("program line N: ...").
absl::Status ParseProgram(absl::string_view text, Program* program);

// "f32[128,?]" / "f16[*]" / "i32[]": a declaration as the IR prints it.
std::string DeclString(const InputDecl& decl);

}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CC_PROGRAM_H_
