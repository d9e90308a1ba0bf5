// The fused program (docs/PROGRAM.md) as a compact, validated struct.
//
// ParseProgram reads the text IR that an AutofuseKernel node carries in its `program` attr and
// checks everything the interpreter relies on: inputs, values and outputs numbered from 0 in
// order, every operand defined above its use, known ops with the right arity and attributes,
// one dtype per operand position that the op allows, immediates representable in that dtype,
// well-formed views, reductions over one list of consecutive axes whose operands are full
// values, and invariant instructions that keep the rules which make computing them once a run
// give the same bits (the rewriter's IR passes decide them, rewriter/passes.py). It then
// classifies every value as full or reduced and gives it a level (the number of reductions it
// depends on, one after the other). A program that passes is safe to plan and run;
// every failure is InvalidArgument naming the line.
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
#include "op_table.inc"  // generated from the op table (-I added by _build.py)

namespace tf_autofuse {

enum class DType : uint8_t { kF16, kBF16, kF32, kF64, kI32, kBool };

// The IR spelling: "f16", "bf16", "f32", "f64", "i32", "bool".
const char* DTypeName(DType dtype);
// Bytes per element in a tensor of this dtype.
int DTypeSize(DType dtype);
inline bool IsFloat(DType dtype) { return dtype != DType::kI32 && dtype != DType::kBool; }

// The ops of the program text, in the order of the op table (tf_autofuse/rewriter/catalog.py),
// which op_table.inc is generated from when the library is built.
enum class OpCode : uint8_t {
#define TF_AUTOFUSE_OPCODE(name, ...) k##name,
  TF_AUTOFUSE_OPS(TF_AUTOFUSE_OPCODE)
#undef TF_AUTOFUSE_OPCODE
};

#define TF_AUTOFUSE_COUNT_OP(...) +1
constexpr int kNumOps = 0 TF_AUTOFUSE_OPS(TF_AUTOFUSE_COUNT_OP);
#undef TF_AUTOFUSE_COUNT_OP

// Which dtypes an op's (non-condition) operands may have.
enum DTypeClass : uint8_t {
  kFloatTypes = 1,  // f16, bf16, f32, f64
  kI32Type = 2,
  kBoolType = 4,
};

// What an op's value is, given its operands' dtype T.
enum class ResultKind : uint8_t { kSame, kBool, kCastTo };

// One row of the operator table of PROGRAM.md (generated from catalog.py, see OpSpec there).
struct OpInfo {
  OpCode code;
  const char* name;     // IR spelling, e.g. "SquaredDifference"
  int arity;            // 1, 2 or 3
  uint8_t dtypes;       // DTypeClass bits allowed for the operands (Select: its x and y)
  ResultKind result;
  int cost;             // one element in fp32 (and 16-bit types), in cheap ops, and in f64
  int cost_f64;         // (catalog.element_cost): the thread-pool estimate, which kernel.cc's
                        // timing refines, so it only needs to be right within ~2x
  const char* cpu_refusal;  // why the CPU kernel does not run it; null: it does
};

const OpInfo& GetOpInfo(OpCode op);
// Looks up an IR op name; false when unknown.
bool LookupOp(absl::string_view name, OpCode* op);
inline bool IsReduction(OpCode op) { return op >= OpCode::TF_AUTOFUSE_FIRST_REDUCTION; }

// A reference to an input (inK), an instruction's value (%K) or an immediate literal.
struct Operand {
  enum class Kind : uint8_t { kInput, kValue, kImmediate };
  Kind kind = Kind::kInput;
  int index = 0;         // K of inK / %K
  double immediate = 0;  // the literal, exactly as parsed (kImmediate); true/false are 1/0
  bool is_bool = false;  // the literal was `true` or `false`
  bool is_integer = false;  // the literal was written as an integer (digits, an optional '-')
};

// "[128,?]" as parsed: -1 for "?"; unknown_rank for "[*]".
struct ShapeDecl {
  bool unknown_rank = false;
  std::vector<int64_t> dims;
};

struct InputDecl {
  DType dtype = DType::kF32;
  ShapeDecl shape;     // what the rewriter knew of the tensor
  bool has_view = false;
  ShapeDecl view;      // " -> [view]": known rank, at most one "?"
  // The shape the program reads the input as: the view, or the tensor shape.
  const ShapeDecl& read_shape() const { return has_view ? view : shape; }
  // Set by the parser in programs with reductions: the view is 1 along every reduced axis, so
  // the input is a reduced value.
  bool reduced = false;
};

struct Instruction {
  OpCode op = OpCode::kAbs;
  DType dtype = DType::kF32;          // of its value
  DType operand_dtype = DType::kF32;  // of its non-immediate operands (Select: of x and y)
  int num_operands = 0;
  std::array<Operand, 3> operands;
  double alpha = 0;                   // LeakyRelu
  DType to = DType::kF32;             // Cast
  std::vector<int> axes;              // reductions
  bool reduced = false;               // a reduced value (see Reductions in PROGRAM.md)
  int level = 0;                      // reductions it depends on, in a chain
  // Marked `invariant`: computed once a run over the one small shape its inputs are read as
  // (PROGRAM.md, Invariants; hoist.h splits the program there).
  bool invariant = false;
  int line = 0;                       // 1-based line in the text, for messages
};

struct Output {
  Operand operand;       // kInput or kValue
  bool has_view = false;
  ShapeDecl view;        // " -> [shape]": known rank, at most one "?"
  int line = 0;
};

struct Program {
  std::vector<InputDecl> inputs;
  std::vector<Instruction> instructions;
  std::vector<Output> outputs;
  // The reduced axes of every reduction (empty without reductions), and the deepest level.
  std::vector<int> axes;
  int num_levels = 0;

  bool has_reductions() const { return num_levels > 0; }
  DType OperandDType(const Operand& operand) const {
    return operand.kind == Operand::Kind::kInput ? inputs[operand.index].dtype
                                                 : instructions[operand.index].dtype;
  }
  // A reduced value, or an input read as one.
  bool IsReduced(const Operand& operand) const {
    switch (operand.kind) {
      case Operand::Kind::kInput:
        return inputs[operand.index].reduced;
      case Operand::Kind::kValue:
        return instructions[operand.index].reduced;
      case Operand::Kind::kImmediate:
        break;
    }
    return false;
  }
  DType OutputDType(int k) const { return OperandDType(outputs[k].operand); }
  bool OutputReduced(int k) const { return IsReduced(outputs[k].operand); }
};

// Parses and validates `text`. On failure returns InvalidArgument("program line N: ...").
absl::Status ParseProgram(absl::string_view text, Program* program);

// "[128,?]" / "[*]" / "[]".
std::string ShapeString(const ShapeDecl& shape);
// "f32[128,?]" / "f16[*]" / "i32[]" / "f32[16] -> [16,1,1]": a declaration as the IR prints it.
std::string DeclString(const InputDecl& decl);

}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CC_PROGRAM_H_
