// Parser and validator of the fused-program text IR (docs/PROGRAM.md).
//
// The grammar is line oriented and strict (single spaces, no blank lines), because the rewriter
// prints it and `print(parse(text)) == text`; the only leniency is an optional final "\n".

#include "program.h"

#include <charconv>
#include <cmath>
#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"

namespace tf_autofuse {
namespace {

constexpr OpInfo kOps[] = {
#define TF_AUTOFUSE_OP_INFO(name, arity, dtypes, result, cost, cost_f64, cpu_refusal) \
  {OpCode::k##name, #name, arity, dtypes, ResultKind::result, cost, cost_f64, cpu_refusal},
    TF_AUTOFUSE_OPS(TF_AUTOFUSE_OP_INFO)
#undef TF_AUTOFUSE_OP_INFO
};
static_assert(sizeof(kOps) / sizeof(kOps[0]) == kNumOps, "kOps has a row per OpCode");

struct DTypeSpelling {
  DType dtype;
  const char* name;
  int size;
};
constexpr DTypeSpelling kDTypes[] = {
    {DType::kF16, "f16", 2}, {DType::kBF16, "bf16", 2}, {DType::kF32, "f32", 4},
    {DType::kF64, "f64", 8}, {DType::kI32, "i32", 4}, {DType::kBool, "bool", 1},
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

// A finite decimal literal, as Python's repr(float) / repr(int) prints it: "2", "-3.0", "1e-05".
// Immediates and attributes hold finite values only (the rewriter never folds inf or NaN into
// a program).
bool ParseLiteral(absl::string_view text, double* value) {
  if (text.empty()) return false;
  const char first = text[0] == '-' ? (text.size() > 1 ? text[1] : '\0') : text[0];
  if (!IsDigit(first)) return false;
  const char* end = text.data() + text.size();
  auto result = std::from_chars(text.data(), end, *value);
  return result.ec == std::errc() && result.ptr == end && std::isfinite(*value);
}

// An integer literal: digits, after an optional '-' (what an i32 immediate is written as).
bool IsIntegerLiteral(absl::string_view text) {
  absl::ConsumePrefix(&text, "-");
  return !text.empty() && std::all_of(text.begin(), text.end(), IsDigit);
}

// "[dims]" with dims "", "*" or sizes and "?" separated by ","; false with *error set if not.
bool ParseShape(absl::string_view text, ShapeDecl* shape, std::string* error) {
  if (text.size() < 2 || text.front() != '[' || text.back() != ']') {
    *error = absl::StrCat("expected a shape [dims], got '", text, "'");
    return false;
  }
  absl::string_view dims = text.substr(1, text.size() - 2);
  *shape = ShapeDecl();
  if (dims == "*") {
    shape->unknown_rank = true;
    return true;
  }
  if (dims.empty()) return true;
  for (absl::string_view dim : absl::StrSplit(dims, ',')) {
    int64_t size = -1;
    if (dim != "?") {
      int value;
      if (!ParseIndex(dim, &value)) {
        *error = absl::StrCat("bad dimension '", dim, "' (expected a size or ?)");
        return false;
      }
      size = value;
    }
    shape->dims.push_back(size);
  }
  return true;
}

// Element count of a fully known shape, -1 otherwise.
int64_t KnownElements(const ShapeDecl& shape) {
  if (shape.unknown_rank) return -1;
  int64_t n = 1;
  for (int64_t d : shape.dims) {
    if (d < 0) return -1;
    n *= d;
  }
  return n;
}

class Parser {
 public:
  explicit Parser(Program* program) : program_(program) {}

  absl::Status Parse(absl::string_view text) {
    if (text.empty()) return absl::InvalidArgumentError("program: the program text is empty");
    if (text.back() == '\n') text.remove_suffix(1);
    lines_ = absl::StrSplit(text, '\n');
    // Sections in order: inputs, instructions, outputs.
    for (size_t i = 0; i < lines_.size(); ++i) {
      SetLine(static_cast<int>(i) + 1);
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
    SetLine(static_cast<int>(lines_.size()));
    if (program_->inputs.empty()) return Error("the program declares no input");
    if (program_->instructions.empty()) return Error("the program has no instruction");
    if (program_->outputs.empty()) return Error("the program has no output");
    absl::Status status = CheckViewsBroadcast();
    if (status.ok()) status = Classify();
    if (status.ok()) status = CheckInvariants();
    return status;
  }

 private:
  void SetLine(int number) {
    line_number_ = number;
    line_ = lines_[number - 1];
  }

  // Messages quote the program, which may hold any bytes: control and non-ASCII bytes are
  // written as \xNN so that the message stays valid UTF-8 and is never cut at a NUL.
  static std::string Printable(absl::string_view text) {
    std::string out;
    for (unsigned char c : text) {
      if (c >= 0x20 && c < 0x7f) {
        out.push_back(static_cast<char>(c));
      } else {
        static const char kHex[] = "0123456789abcdef";
        out += "\\x";
        out.push_back(kHex[c >> 4]);
        out.push_back(kHex[c & 15]);
      }
    }
    return out;
  }

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("program line ", line_number_, " `",
                                                   Printable(line_), "`: ", Printable(what)));
  }

  // A view: known rank, at most one "?".
  absl::Status CheckView(const ShapeDecl& view) const {
    if (view.unknown_rank) return Error("a view must have a known rank (no [*])");
    int unknown = 0;
    for (int64_t d : view.dims) unknown += d < 0;
    if (unknown > 1) return Error("a view may have at most one ? (resolved from the element count)");
    return absl::OkStatus();
  }

  // inK: DTYPE[dims]( -> [view])?
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
    InputDecl decl;
    absl::string_view view_text;
    const size_t arrow = rest.find(" -> ");
    if (arrow != absl::string_view::npos) {
      view_text = rest.substr(arrow + 4);
      rest = rest.substr(0, arrow);
      decl.has_view = true;
    }
    const size_t open = rest.find('[');
    if (open == absl::string_view::npos || rest.back() != ']') {
      return Error("expected DTYPE[dims], e.g. f32[128,?]");
    }
    if (!ParseDType(rest.substr(0, open), &decl.dtype)) {
      return Error(absl::StrCat("unknown dtype '", rest.substr(0, open),
                                "' (expected f16, bf16, f32, f64, i32 or bool)"));
    }
    std::string error;
    if (!ParseShape(rest.substr(open), &decl.shape, &error)) return Error(error);
    if (decl.has_view) {
      if (!ParseShape(view_text, &decl.view, &error)) return Error(error);
      absl::Status status = CheckView(decl.view);
      if (!status.ok()) return status;
      const int64_t from = KnownElements(decl.shape);
      const int64_t to = KnownElements(decl.view);
      if (from >= 0 && to >= 0 && from != to) {
        return Error(absl::StrCat("the view ", ShapeString(decl.view), " has ", to,
                                  " elements but the tensor ", ShapeString(decl.shape), " has ",
                                  from));
      }
    }
    program_->inputs.push_back(std::move(decl));
    return absl::OkStatus();
  }

  // A reference (inK / %K) or literal, for the instruction numbered `instruction_index`.
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
    if (token == "true" || token == "false") {
      operand->is_bool = true;
      operand->immediate = token == "true" ? 1.0 : 0.0;
      return absl::OkStatus();
    }
    if (!ParseLiteral(token, &operand->immediate)) {
      return Error(absl::StrCat("bad operand '", token,
                                "' (expected inK, %K, a finite decimal literal, true or false)"));
    }
    operand->is_integer = IsIntegerLiteral(token);
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
    if (info.cpu_refusal != nullptr) {
      return Error(absl::StrCat(info.name, " has no CPU kernel: ", info.cpu_refusal));
    }
    rest.remove_prefix(space + 1);
    if (absl::ConsumeSuffix(&rest, " invariant")) inst.invariant = true;

    // Operands, separated by ", "; then attributes, separated by " ".
    std::vector<absl::string_view> operand_tokens;
    std::vector<std::pair<absl::string_view, absl::string_view>> attrs;
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
      attrs.emplace_back(attr.substr(0, attr_eq), attr.substr(attr_eq + 1));
      rest.remove_prefix(end);
      if (absl::ConsumePrefix(&rest, " ") && rest.empty()) return Error("trailing space");
    }
    absl::Status status = ParseAttrs(attrs, &inst);
    if (status.ok()) status = ResolveDType(&inst);
    if (!status.ok()) return status;
    program_->instructions.push_back(std::move(inst));
    return absl::OkStatus();
  }

  // The attributes an op takes, each once and always: alpha= (LeakyRelu), to= (Cast), axes=
  // (reductions); nothing else.
  absl::Status ParseAttrs(
      const std::vector<std::pair<absl::string_view, absl::string_view>>& attrs,
      Instruction* inst) {
    const OpInfo& info = GetOpInfo(inst->op);
    const char* wanted = inst->op == OpCode::kLeakyRelu ? "alpha"
                         : inst->op == OpCode::kCast    ? "to"
                         : IsReduction(inst->op)        ? "axes"
                                                        : nullptr;
    bool seen = false;
    for (const auto& [key, value] : attrs) {
      if (wanted == nullptr) {
        return Error(absl::StrCat(info.name, " takes no attribute, got '", key, "'"));
      }
      if (key != wanted) {
        return Error(absl::StrCat(info.name, " takes the attribute ", wanted, "=, got '", key,
                                  "'"));
      }
      if (seen) return Error(absl::StrCat("attribute ", key, "= given twice"));
      seen = true;
      if (inst->op == OpCode::kLeakyRelu) {
        if (!ParseLiteral(value, &inst->alpha)) {
          return Error(
              absl::StrCat("bad alpha '", value, "' (expected a finite decimal literal)"));
        }
      } else if (inst->op == OpCode::kCast) {
        if (!ParseDType(value, &inst->to) || !IsFloat(inst->to)) {
          return Error(absl::StrCat("bad to='", value, "' (expected f16, bf16, f32 or f64)"));
        }
      } else {
        absl::Status status = ParseAxes(value, &inst->axes);
        if (!status.ok()) return status;
      }
    }
    if (!seen && wanted != nullptr) {
      return Error(absl::StrCat(info.name, " needs the attribute ", wanted, "="));
    }
    return absl::OkStatus();
  }

  // [a,b,...]: non-negative, increasing, consecutive, not empty; the same in every reduction.
  absl::Status ParseAxes(absl::string_view value, std::vector<int>* axes) {
    if (value.size() < 3 || value.front() != '[' || value.back() != ']') {
      return Error(absl::StrCat("bad axes '", value, "' (expected e.g. [1] or [1,2])"));
    }
    for (absl::string_view token : absl::StrSplit(value.substr(1, value.size() - 2), ',')) {
      token = absl::StripAsciiWhitespace(token);
      int axis;
      if (!ParseIndex(token, &axis)) {
        return Error(absl::StrCat("bad axis '", token, "' in axes ", value,
                                  " (expected non-negative integers)"));
      }
      if (!axes->empty() && axis != axes->back() + 1) {
        return Error(absl::StrCat("axes ", value, " are not increasing and consecutive"));
      }
      axes->push_back(axis);
    }
    if (!program_->axes.empty() && *axes != program_->axes) {
      return Error(absl::StrCat("axes ", value, " differ from the axes [",
                                absl::StrJoin(program_->axes, ","),
                                "] of an earlier reduction (every reduction of a program must "
                                "reduce the same axes)"));
    }
    program_->axes = *axes;
    return absl::OkStatus();
  }

  static const char* ClassName(uint8_t dtypes) {
    switch (dtypes) {
      case kFloatTypes: return "f16, bf16, f32, f64";
      case kFloatTypes | kI32Type: return "f16, bf16, f32, f64, i32";
      case kFloatTypes | kI32Type | kBoolType: return "f16, bf16, f32, f64, i32, bool";
      case kBoolType: return "bool";
      default: return "?";
    }
  }

  static bool Allows(uint8_t dtypes, DType dtype) {
    switch (dtype) {
      case DType::kI32: return (dtypes & kI32Type) != 0;
      case DType::kBool: return (dtypes & kBoolType) != 0;
      default: return (dtypes & kFloatTypes) != 0;
    }
  }

  // The dtype of the non-immediate operands (Select: of x and y; its condition is bool) must
  // agree and be allowed by the op; every immediate must be representable in the dtype of its
  // position. The value's dtype follows from the op (PROGRAM.md, Semantics).
  absl::Status ResolveDType(Instruction* inst) {
    const OpInfo& info = GetOpInfo(inst->op);
    const int first = inst->op == OpCode::kSelect ? 1 : 0;
    if (first == 1) {
      const Operand& cond = inst->operands[0];
      if (cond.kind == Operand::Kind::kImmediate ? !cond.is_bool
                                                 : program_->OperandDType(cond) != DType::kBool) {
        return Error(absl::StrCat("the condition of Select must be bool, got ",
                                  cond.kind == Operand::Kind::kImmediate
                                      ? "a number"
                                      : DTypeName(program_->OperandDType(cond))));
      }
    }
    bool found = false;
    for (int i = first; i < inst->num_operands; ++i) {
      const Operand& operand = inst->operands[i];
      if (operand.kind == Operand::Kind::kImmediate) continue;
      const DType dtype = program_->OperandDType(operand);
      if (found && dtype != inst->operand_dtype) {
        return Error(absl::StrCat(info.name, " mixes dtypes ", DTypeName(inst->operand_dtype),
                                  " and ", DTypeName(dtype)));
      }
      inst->operand_dtype = dtype;
      found = true;
    }
    if (!found) {
      return Error(absl::StrCat(info.name, " needs at least one operand that is not an immediate",
                                first == 1 ? " besides its condition" : ""));
    }
    const DType t = inst->operand_dtype;
    if (!Allows(info.dtypes, t)) {
      return Error(absl::StrCat(info.name, " does not allow dtype ", DTypeName(t), " (only ",
                                ClassName(info.dtypes), ")"));
    }
    for (int i = first; i < inst->num_operands; ++i) {
      const Operand& operand = inst->operands[i];
      if (operand.kind != Operand::Kind::kImmediate) continue;
      const double v = operand.immediate;
      if (t == DType::kBool) {
        if (!operand.is_bool) return Error(absl::StrCat("immediate ", v, " is not a bool"));
        continue;
      }
      if (operand.is_bool) {
        return Error(absl::StrCat("immediate ", v != 0 ? "true" : "false", " is not a ",
                                  DTypeName(t)));
      }
      if (t == DType::kI32 &&
          !(operand.is_integer && v >= std::numeric_limits<int32_t>::min() &&
            v <= std::numeric_limits<int32_t>::max())) {
        return Error(absl::StrCat("immediate ", v, " is not an i32 (an integer literal)"));
      }
    }
    switch (info.result) {
      case ResultKind::kSame: inst->dtype = t; break;
      case ResultKind::kBool: inst->dtype = DType::kBool; break;
      case ResultKind::kCastTo: inst->dtype = inst->to; break;
    }
    return absl::OkStatus();
  }

  // outK = %K | inK ( -> [shape])?
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
    Output output;
    output.line = line_number_;
    absl::string_view token = line_.substr(eq + 3);
    const size_t arrow = token.find(" -> ");
    if (arrow != absl::string_view::npos) {
      std::string error;
      if (!ParseShape(token.substr(arrow + 4), &output.view, &error)) return Error(error);
      absl::Status status = CheckView(output.view);
      if (!status.ok()) return status;
      output.has_view = true;
      token = token.substr(0, arrow);
    }
    absl::Status status = ParseOperand(
        token, static_cast<int>(program_->instructions.size()), &output.operand);
    if (!status.ok()) return status;
    if (output.operand.kind == Operand::Kind::kImmediate) {
      return Error("an output must name a value (%K) or an input (inK), not a literal");
    }
    program_->outputs.push_back(std::move(output));
    return absl::OkStatus();
  }

  // The input views must broadcast (right-aligned, a known 1 stretches) as far as they are
  // known.
  absl::Status CheckViewsBroadcast() {
    std::vector<int64_t> merged;  // right-aligned: merged[0] is the last dimension
    std::vector<int> from;        // which input set merged[i]
    for (size_t k = 0; k < program_->inputs.size(); ++k) {
      const ShapeDecl& shape = program_->inputs[k].read_shape();
      if (shape.unknown_rank) continue;
      const int rank = static_cast<int>(shape.dims.size());
      for (int i = 0; i < rank; ++i) {
        const int64_t d = shape.dims[rank - 1 - i];
        if (i >= static_cast<int>(merged.size())) {
          merged.push_back(d);
          from.push_back(static_cast<int>(k));
        } else if (d >= 0 && d != 1) {
          if (merged[i] >= 0 && merged[i] != 1 && merged[i] != d) {
            return absl::InvalidArgumentError(absl::StrCat(
                "program: the shapes of in", from[i], ": ", DeclString(program_->inputs[from[i]]),
                " and in", k, ": ", DeclString(program_->inputs[k]),
                " do not broadcast (dimension ", -1 - i, ": ", merged[i], " vs ", d, ")"));
          }
          merged[i] = d;
          from[i] = static_cast<int>(k);
        }
      }
    }
    return absl::OkStatus();
  }

  // Reduced values and levels (PROGRAM.md, Reductions), with the checks that need the whole
  // program: axes within the iteration rank, reductions of full values only.
  absl::Status Classify() {
    Program& p = *program_;
    if (p.axes.empty()) return absl::OkStatus();
    int rank = 0;
    for (size_t k = 0; k < p.inputs.size(); ++k) {
      const ShapeDecl& shape = p.inputs[k].read_shape();
      if (shape.unknown_rank) {
        SetLine(static_cast<int>(k) + 1);
        return Error("a program with reductions needs inputs of known rank (or a view)");
      }
      rank = std::max(rank, static_cast<int>(shape.dims.size()));
    }
    for (InputDecl& in : p.inputs) {
      const ShapeDecl& shape = in.read_shape();
      const int offset = rank - static_cast<int>(shape.dims.size());
      in.reduced = true;
      for (int a : p.axes) {
        if (a >= offset && shape.dims[a - offset] != 1) in.reduced = false;
      }
    }
    for (Instruction& inst : p.instructions) {
      SetLine(inst.line);
      if (IsReduction(inst.op)) {
        if (inst.axes.back() >= rank) {
          return Error(absl::StrCat("axis ", inst.axes.back(), " is out of range for rank ", rank,
                                    " (the rank of the iteration shape)"));
        }
        // An input that is 1 along the reduced axes may be reduced (read broadcast over them,
        // as every input is), a reduced value may not: a reduction's operand is a full value.
        const Operand& x = inst.operands[0];
        if (x.kind == Operand::Kind::kImmediate) {
          return Error(absl::StrCat("the operand of ", GetOpInfo(inst.op).name,
                                    " must be a value or an input, not an immediate"));
        }
        if (x.kind == Operand::Kind::kValue && p.IsReduced(x)) {
          return Error(absl::StrCat("the operand of ", GetOpInfo(inst.op).name,
                                    " is a full value, not the reduced %", x.index));
        }
        inst.reduced = true;
        inst.level = (x.kind == Operand::Kind::kValue ? p.instructions[x.index].level : 0) + 1;
      } else {
        inst.reduced = true;
        for (int i = 0; i < inst.num_operands; ++i) {
          const Operand& x = inst.operands[i];
          if (x.kind == Operand::Kind::kImmediate) continue;
          if (!p.IsReduced(x)) inst.reduced = false;
          if (x.kind == Operand::Kind::kValue) {
            inst.level = std::max(inst.level, p.instructions[x.index].level);
          }
        }
      }
      p.num_levels = std::max(p.num_levels, inst.level);
    }
    return absl::OkStatus();
  }

  // The rules of invariant instructions (PROGRAM.md, Invariants), which make computing them once
  // a run, over the one shape S their inputs are read as, give the same bits.
  absl::Status CheckInvariants() {
    const Program& p = *program_;
    const ShapeDecl* small = nullptr;  // S
    for (const Instruction& inst : p.instructions) {
      if (!inst.invariant) continue;
      SetLine(inst.line);
      if (!p.axes.empty()) return Error("a program with reductions has no invariant instruction");
      if (inst.dtype == DType::kF16 || inst.dtype == DType::kBF16) {
        return Error("an invariant value is not 16-bit (computed apart, it would be rounded "
                     "where the program keeps fp32)");
      }
      for (int o = 0; o < inst.num_operands; ++o) {
        const Operand& x = inst.operands[o];
        if (x.kind == Operand::Kind::kValue && !p.instructions[x.index].invariant) {
          return Error(absl::StrCat("an invariant instruction reads %", x.index,
                                    ", which is not"));
        }
        if (x.kind != Operand::Kind::kInput) continue;
        const InputDecl& decl = p.inputs[x.index];
        if (KnownElements(decl.shape) < 0 || KnownElements(decl.read_shape()) < 0) {
          return Error(absl::StrCat("an invariant instruction reads in", x.index,
                                    ", whose shape is not fully known"));
        }
        if (small == nullptr) {
          small = &decl.read_shape();
        } else if (decl.read_shape().dims != small->dims) {
          return Error(absl::StrCat("an invariant instruction reads in", x.index, " as ",
                                    ShapeString(decl.read_shape()), ", others read inputs as ",
                                    ShapeString(*small)));
        }
      }
    }
    for (const Output& output : p.outputs) {
      if (output.operand.kind == Operand::Kind::kValue &&
          p.instructions[output.operand.index].invariant) {
        SetLine(output.line);
        return Error("an output names no invariant value");
      }
    }
    return absl::OkStatus();
  }

  Program* program_;
  std::vector<absl::string_view> lines_;
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

std::string ShapeString(const ShapeDecl& shape) {
  if (shape.unknown_rank) return "[*]";
  return absl::StrCat("[", absl::StrJoin(shape.dims, ",", [](std::string* out, int64_t d) {
                        absl::StrAppend(out, d < 0 ? std::string("?") : absl::StrCat(d));
                      }), "]");
}

std::string DeclString(const InputDecl& decl) {
  std::string text = absl::StrCat(DTypeName(decl.dtype), ShapeString(decl.shape));
  if (decl.has_view) absl::StrAppend(&text, " -> ", ShapeString(decl.view));
  return text;
}

absl::Status ParseProgram(absl::string_view text, Program* program) {
  *program = Program();
  return Parser(program).Parse(text);
}

}  // namespace tf_autofuse
