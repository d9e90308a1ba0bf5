// Parser and validator of the fused-program text IR (docs/PROGRAM.md).
//
// The grammar is line oriented and strict (single spaces, no blank lines), because the rewriter
// prints it and `print(parse(text)) == text`; the only leniency is an optional final "\n".

#include "program.h"

#include <charconv>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tf_autofuse {
namespace {

constexpr OpInfo kOps[] = {
    {OpCode::kAbs, "Abs", 1, true, 1},
    {OpCode::kNeg, "Neg", 1, true, 1},
    {OpCode::kRelu, "Relu", 1, true, 1},
    {OpCode::kRelu6, "Relu6", 1, true, 1},
    {OpCode::kElu, "Elu", 1, false, 5},
    {OpCode::kSelu, "Selu", 1, false, 5},
    {OpCode::kExp, "Exp", 1, false, 2},
    {OpCode::kExpm1, "Expm1", 1, false, 5},
    {OpCode::kLog, "Log", 1, false, 2},
    {OpCode::kLog1p, "Log1p", 1, false, 3},
    {OpCode::kSqrt, "Sqrt", 1, false, 1},
    {OpCode::kRsqrt, "Rsqrt", 1, false, 1},
    {OpCode::kSquare, "Square", 1, true, 1},
    {OpCode::kReciprocal, "Reciprocal", 1, false, 1},
    {OpCode::kSigmoid, "Sigmoid", 1, false, 2},
    {OpCode::kTanh, "Tanh", 1, false, 1},
    {OpCode::kSoftplus, "Softplus", 1, false, 5},
    {OpCode::kSoftsign, "Softsign", 1, false, 1},
    {OpCode::kSign, "Sign", 1, true, 1},
    {OpCode::kFloor, "Floor", 1, false, 1},
    {OpCode::kCeil, "Ceil", 1, false, 1},
    {OpCode::kRound, "Round", 1, false, 1},
    {OpCode::kErf, "Erf", 1, false, 1},
    {OpCode::kSin, "Sin", 1, false, 2},
    {OpCode::kCos, "Cos", 1, false, 2},
    {OpCode::kAdd, "Add", 2, true, 1},
    {OpCode::kSub, "Sub", 2, true, 1},
    {OpCode::kMul, "Mul", 2, true, 1},
    {OpCode::kDiv, "Div", 2, false, 1},
    {OpCode::kMaximum, "Maximum", 2, true, 1},
    {OpCode::kMinimum, "Minimum", 2, true, 1},
    {OpCode::kSquaredDifference, "SquaredDifference", 2, true, 1},
};

// GetOpInfo indexes this table by OpCode.
constexpr bool TableFollowsOpCodes() {
  for (int i = 0; i < static_cast<int>(sizeof(kOps) / sizeof(kOps[0])); ++i) {
    if (static_cast<int>(kOps[i].code) != i) return false;
  }
  return true;
}
static_assert(TableFollowsOpCodes(), "kOps must list the ops in OpCode order");
static_assert(sizeof(kOps) / sizeof(kOps[0]) ==
                  static_cast<int>(OpCode::kSquaredDifference) + 1,
              "kOps must list every OpCode");

struct DTypeSpelling {
  DType dtype;
  const char* name;
  int size;
};
constexpr DTypeSpelling kDTypes[] = {
    {DType::kF16, "f16", 2}, {DType::kBF16, "bf16", 2}, {DType::kF32, "f32", 4},
    {DType::kF64, "f64", 8}, {DType::kI32, "i32", 4},
};

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// A decimal index without sign or leading zeros ("0", "17").
bool ParseIndex(absl::string_view text, int* index) {
  if (text.empty() || text.size() > 9) return false;
  if (text.size() > 1 && text[0] == '0') return false;
  int value = 0;
  for (char c : text) {
    if (!IsDigit(c)) return false;
    value = value * 10 + (c - '0');
  }
  *index = value;
  return true;
}

// `text` starts with `prefix` followed by an index; returns the index in *index.
bool ParsePrefixedIndex(absl::string_view text, absl::string_view prefix, int* index) {
  return absl::StartsWith(text, prefix) && ParseIndex(text.substr(prefix.size()), index);
}

bool ParseDType(absl::string_view text, DType* dtype) {
  for (const DTypeSpelling& d : kDTypes) {
    if (text == d.name) {
      *dtype = d.dtype;
      return true;
    }
  }
  return false;
}

// A literal as Python's repr(float) / repr(int) prints it: "2", "-3.0", "1e-05", "inf", "nan".
bool ParseLiteral(absl::string_view text, double* value) {
  if (text.empty()) return false;
  const char first = text[0] == '-' ? (text.size() > 1 ? text[1] : '\0') : text[0];
  if (!IsDigit(first) && first != 'i' && first != 'n') return false;
  const char* end = text.data() + text.size();
  auto result = std::from_chars(text.data(), end, *value);
  return result.ec == std::errc() && result.ptr == end;
}

class Parser {
 public:
  explicit Parser(Program* program) : program_(program) {}

  absl::Status Parse(absl::string_view text) {
    if (text.empty()) return absl::InvalidArgumentError("program: the program text is empty");
    if (text.back() == '\n') text.remove_suffix(1);
    std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
    // Sections in order: inputs, instructions, outputs.
    for (size_t i = 0; i < lines.size(); ++i) {
      line_number_ = static_cast<int>(i) + 1;
      line_ = lines[i];
      absl::Status status;
      if (line_.empty()) {
        status = Error("blank line");
      } else if (ParsePrefixedIndex(line_.substr(0, line_.find(':')), "in", &scratch_index_) &&
                 line_.find(':') != absl::string_view::npos) {
        status = ParseInputDecl();
      } else if (line_[0] == '%') {
        status = ParseInstruction();
      } else if (absl::StartsWith(line_, "out")) {
        status = ParseOutput();
      } else {
        status = Error("expected an input declaration (inK: ...), an instruction (%K = ...) "
                       "or an output (outK = ...)");
      }
      if (!status.ok()) return status;
    }
    line_number_ = static_cast<int>(lines.size());
    line_ = lines.back();
    if (program_->inputs.empty()) return Error("the program declares no input");
    if (program_->instructions.empty()) return Error("the program has no instruction");
    if (program_->outputs.empty()) return Error("the program has no output");
    return CheckDeclaredShapesAgree();
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("program line ", line_number_, " `", line_, "`: ", what));
  }

  // inK: DTYPE[dims]
  absl::Status ParseInputDecl() {
    if (!program_->instructions.empty() || !program_->outputs.empty()) {
      return Error("input declarations must come before all instructions and outputs");
    }
    const size_t colon = line_.find(':');
    int index;
    ParsePrefixedIndex(line_.substr(0, colon), "in", &index);
    if (index != static_cast<int>(program_->inputs.size())) {
      return Error(absl::StrCat("expected in", program_->inputs.size(),
                                " (inputs are numbered from 0, in order)"));
    }
    absl::string_view rest = line_.substr(colon + 1);
    if (!absl::ConsumePrefix(&rest, " ")) return Error("expected a space after ':'");
    const size_t open = rest.find('[');
    if (open == absl::string_view::npos || rest.back() != ']') {
      return Error("expected DTYPE[dims], e.g. f32[128,?]");
    }
    InputDecl decl;
    if (!ParseDType(rest.substr(0, open), &decl.dtype)) {
      return Error(absl::StrCat("unknown dtype '", rest.substr(0, open),
                                "' (expected f16, bf16, f32, f64 or i32)"));
    }
    absl::string_view dims = rest.substr(open + 1, rest.size() - open - 2);
    if (dims == "*") {
      decl.unknown_rank = true;
    } else if (!dims.empty()) {
      for (absl::string_view dim : absl::StrSplit(dims, ',')) {
        int64_t size = -1;
        if (dim != "?") {
          int value;
          if (!ParseIndex(dim, &value)) {
            return Error(absl::StrCat("bad dimension '", dim, "' (expected a size or ?)"));
          }
          size = value;
        }
        decl.dims.push_back(size);
      }
    }
    program_->inputs.push_back(std::move(decl));
    return absl::OkStatus();
  }

  // A reference (inK / %K) or literal; `where` says which instruction for messages.
  absl::Status ParseOperand(absl::string_view token, int instruction_index, Operand* operand) {
    if (token.size() >= 3 && absl::StartsWith(token, "in") && IsDigit(token[2])) {
      operand->kind = Operand::Kind::kInput;
      if (!ParseIndex(token.substr(2), &operand->index)) {
        return Error(absl::StrCat("bad operand '", token, "'"));
      }
      if (operand->index >= static_cast<int>(program_->inputs.size())) {
        return Error(absl::StrCat("operand ", token, " is not a declared input"));
      }
      return absl::OkStatus();
    }
    if (!token.empty() && token[0] == '%') {
      operand->kind = Operand::Kind::kValue;
      if (!ParseIndex(token.substr(1), &operand->index)) {
        return Error(absl::StrCat("bad operand '", token, "'"));
      }
      if (operand->index >= instruction_index) {
        return Error(absl::StrCat("operand ", token, " is not defined above its use"));
      }
      return absl::OkStatus();
    }
    operand->kind = Operand::Kind::kImmediate;
    if (!ParseLiteral(token, &operand->immediate)) {
      return Error(absl::StrCat("bad operand '", token,
                                "' (expected inK, %K or a decimal literal)"));
    }
    return absl::OkStatus();
  }

  // %K = OP operand(, operand)*( key=value)*
  absl::Status ParseInstruction() {
    if (!program_->outputs.empty()) return Error("instructions must come before all outputs");
    if (program_->inputs.empty()) return Error("instruction before any input declaration");
    const int expected = static_cast<int>(program_->instructions.size());
    absl::string_view rest = line_.substr(1);
    const size_t eq = rest.find(" = ");
    int index;
    if (eq == absl::string_view::npos || !ParseIndex(rest.substr(0, eq), &index)) {
      return Error("expected %K = OP operands");
    }
    if (index != expected) {
      return Error(absl::StrCat("expected %", expected, " (values are numbered from 0, in order)"));
    }
    rest.remove_prefix(eq + 3);
    const size_t space = rest.find(' ');
    if (space == absl::string_view::npos) return Error("expected OP followed by its operands");
    Instruction inst;
    inst.line = line_number_;
    const absl::string_view op_name = rest.substr(0, space);
    if (!LookupOp(op_name, &inst.op)) return Error(absl::StrCat("unknown op '", op_name, "'"));
    const OpInfo& info = GetOpInfo(inst.op);
    rest.remove_prefix(space + 1);

    // Operands, separated by ", "; then attributes, separated by " ".
    std::vector<absl::string_view> operand_tokens;
    while (true) {
      const size_t end = rest.find_first_of(", ");
      operand_tokens.push_back(rest.substr(0, end));
      if (end == absl::string_view::npos) {
        rest = absl::string_view();
        break;
      }
      rest.remove_prefix(end);
      if (absl::ConsumePrefix(&rest, ", ")) continue;
      if (absl::ConsumePrefix(&rest, " ")) {  // attributes follow
        if (rest.empty()) return Error("trailing space");
        break;
      }
      return Error("operands are separated by ', '");
    }
    if (static_cast<int>(operand_tokens.size()) != info.arity) {
      return Error(absl::StrCat(info.name, " takes ", info.arity, " operand",
                                info.arity == 1 ? "" : "s", ", got ", operand_tokens.size()));
    }
    inst.num_operands = info.arity;
    for (int i = 0; i < info.arity; ++i) {
      absl::Status status = ParseOperand(operand_tokens[i], expected, &inst.operands[i]);
      if (!status.ok()) return status;
    }
    while (!rest.empty()) {
      // key=value; a value may hold brackets ([0, 1]) whose spaces do not end it.
      size_t end = 0;
      int depth = 0;
      while (end < rest.size() && (rest[end] != ' ' || depth > 0)) {
        if (rest[end] == '[') ++depth;
        if (rest[end] == ']') --depth;
        ++end;
      }
      absl::string_view attr = rest.substr(0, end);
      const size_t attr_eq = attr.find('=');
      if (attr_eq == absl::string_view::npos || attr_eq == 0) {
        return Error(absl::StrCat("bad attribute '", attr, "' (expected key=value)"));
      }
      inst.attrs.emplace_back(std::string(attr.substr(0, attr_eq)),
                              std::string(attr.substr(attr_eq + 1)));
      rest.remove_prefix(end);
      if (absl::ConsumePrefix(&rest, " ") && rest.empty()) return Error("trailing space");
    }
    if (!inst.attrs.empty()) {
      return Error(absl::StrCat(info.name, " takes no attribute, got '", inst.attrs[0].first,
                                "'"));
    }
    absl::Status status = ResolveDType(&inst);
    if (!status.ok()) return status;
    program_->instructions.push_back(std::move(inst));
    return absl::OkStatus();
  }

  // The instruction's dtype is that of its non-immediate operands, which must agree; the op
  // must allow it and every immediate must be representable in it.
  absl::Status ResolveDType(Instruction* inst) {
    const OpInfo& info = GetOpInfo(inst->op);
    bool found = false;
    for (int i = 0; i < inst->num_operands; ++i) {
      const Operand& operand = inst->operands[i];
      if (operand.kind == Operand::Kind::kImmediate) continue;
      const DType dtype = program_->OperandDType(operand);
      if (found && dtype != inst->dtype) {
        return Error(absl::StrCat(info.name, " mixes dtypes ", DTypeName(inst->dtype), " and ",
                                  DTypeName(dtype)));
      }
      inst->dtype = dtype;
      found = true;
    }
    if (!found) {
      return Error(absl::StrCat(info.name, " needs at least one operand that is not an immediate"));
    }
    if (inst->dtype == DType::kI32 && !info.allows_i32) {
      return Error(absl::StrCat(info.name, " does not allow dtype i32 (only f16, bf16, f32, f64)"));
    }
    for (int i = 0; i < inst->num_operands; ++i) {
      const Operand& operand = inst->operands[i];
      if (operand.kind != Operand::Kind::kImmediate || inst->dtype != DType::kI32) continue;
      const double v = operand.immediate;
      if (!(v == std::floor(v) && v >= std::numeric_limits<int32_t>::min() &&
            v <= std::numeric_limits<int32_t>::max())) {
        return Error(absl::StrCat("immediate ", v, " is not an i32"));
      }
    }
    return absl::OkStatus();
  }

  // outK = %K | inK
  absl::Status ParseOutput() {
    const size_t eq = line_.find(" = ");
    int index;
    if (eq == absl::string_view::npos || !ParsePrefixedIndex(line_.substr(0, eq), "out", &index)) {
      return Error("expected outK = %K or outK = inK");
    }
    if (index != static_cast<int>(program_->outputs.size())) {
      return Error(absl::StrCat("expected out", program_->outputs.size(),
                                " (outputs are numbered from 0, in order)"));
    }
    if (program_->instructions.empty()) return Error("output before any instruction");
    Operand operand;
    const absl::string_view token = line_.substr(eq + 3);
    absl::Status status = ParseOperand(token, static_cast<int>(program_->instructions.size()),
                                       &operand);
    if (!status.ok()) return status;
    if (operand.kind == Operand::Kind::kImmediate) {
      return Error("an output must name a value (%K) or an input (inK), not a literal");
    }
    program_->outputs.push_back(operand);
    return absl::OkStatus();
  }

  // Elementwise programs: the declared input shapes must describe one shape.
  absl::Status CheckDeclaredShapesAgree() {
    const InputDecl* ranked = nullptr;
    std::vector<int64_t> merged;
    for (size_t k = 0; k < program_->inputs.size(); ++k) {
      const InputDecl& decl = program_->inputs[k];
      if (decl.unknown_rank) continue;
      if (ranked == nullptr) {
        ranked = &decl;
        merged = decl.dims;
        continue;
      }
      bool agree = decl.dims.size() == merged.size();
      for (size_t d = 0; agree && d < merged.size(); ++d) {
        if (decl.dims[d] >= 0 && merged[d] >= 0 && decl.dims[d] != merged[d]) agree = false;
        if (merged[d] < 0) merged[d] = decl.dims[d];
      }
      if (!agree) {
        return absl::InvalidArgumentError(absl::StrCat(
            "program: input declarations ", DeclString(*ranked), " and in", k, ": ",
            DeclString(decl), " disagree, and an elementwise program needs one shape"));
      }
    }
    return absl::OkStatus();
  }

  Program* program_;
  int line_number_ = 0;
  absl::string_view line_;
  int scratch_index_ = 0;
};

}  // namespace

const char* DTypeName(DType dtype) {
  for (const DTypeSpelling& d : kDTypes) {
    if (d.dtype == dtype) return d.name;
  }
  return "?";
}

int DTypeSize(DType dtype) {
  for (const DTypeSpelling& d : kDTypes) {
    if (d.dtype == dtype) return d.size;
  }
  return 0;
}

const OpInfo& GetOpInfo(OpCode op) { return kOps[static_cast<int>(op)]; }

bool LookupOp(absl::string_view name, OpCode* op) {
  for (const OpInfo& info : kOps) {
    if (name == info.name) {
      *op = info.code;
      return true;
    }
  }
  return false;
}

std::string DeclString(const InputDecl& decl) {
  std::string dims;
  if (decl.unknown_rank) {
    dims = "*";
  } else {
    dims = absl::StrJoin(decl.dims, ",", [](std::string* out, int64_t d) {
      absl::StrAppend(out, d < 0 ? std::string("?") : absl::StrCat(d));
    });
  }
  return absl::StrCat(DTypeName(decl.dtype), "[", dims, "]");
}

absl::Status ParseProgram(absl::string_view text, Program* program) {
  *program = Program();
  return Parser(program).Parse(text);
}

}  // namespace tf_autofuse
