// See hoist.h.

#include "hoist.h"

#include <set>
#include <vector>

namespace tf_autofuse {
namespace {

bool FullyKnown(const ShapeDecl& shape) {
  if (shape.unknown_rank) return false;
  for (int64_t d : shape.dims) {
    if (d < 0) return false;
  }
  return true;
}

bool Stored(DType dtype) { return dtype != DType::kF16 && dtype != DType::kBF16; }

// Which instructions may be hoisted when the inputs marked `small` are those read as S.
std::vector<bool> Hoistable(const Program& program, const std::vector<bool>& small,
                            const std::vector<bool>& is_output) {
  const int n = static_cast<int>(program.instructions.size());
  std::vector<bool> hoist(n, false);
  for (int i = 0; i < n; ++i) {
    const Instruction& inst = program.instructions[i];
    if (IsReduction(inst.op) || is_output[i] || !Stored(inst.dtype)) continue;
    bool ok = true, reads = false;
    for (int o = 0; o < inst.num_operands && ok; ++o) {
      const Operand& operand = inst.operands[o];
      switch (operand.kind) {
        case Operand::Kind::kImmediate:
          break;
        case Operand::Kind::kInput:
          ok = small[operand.index];
          reads = true;
          break;
        case Operand::Kind::kValue:
          ok = hoist[operand.index];
          reads = true;
          break;
      }
    }
    hoist[i] = ok && reads;
  }
  return hoist;
}

}  // namespace

bool HoistInvariants(const Program& program, HoistedProgram* out) {
  if (program.has_reductions()) return false;
  const int num_inputs = static_cast<int>(program.inputs.size());
  const int n = static_cast<int>(program.instructions.size());
  std::vector<bool> is_output(n, false);
  for (const Output& output : program.outputs) {
    if (output.operand.kind == Operand::Kind::kValue) is_output[output.operand.index] = true;
  }

  // Each distinct fully known shape inputs are read as is a candidate S; keep the best.
  std::set<std::vector<int64_t>> tried;
  std::vector<bool> best_small, best_hoist;
  int best_cost = 0;
  for (int j = 0; j < num_inputs; ++j) {
    const InputDecl& decl = program.inputs[j];
    if (!FullyKnown(decl.shape) || !FullyKnown(decl.read_shape())) continue;
    const std::vector<int64_t>& shape = decl.read_shape().dims;
    if (!tried.insert(shape).second) continue;
    std::vector<bool> small(num_inputs, false);
    for (int k = 0; k < num_inputs; ++k) {
      const InputDecl& other = program.inputs[k];
      small[k] = FullyKnown(other.shape) && FullyKnown(other.read_shape()) &&
                 other.read_shape().dims == shape;
    }
    std::vector<bool> hoist = Hoistable(program, small, is_output);
    int cost = 0;
    bool large_read = false;  // the main program reads an input as another shape
    for (int i = 0; i < n; ++i) {
      const Instruction& inst = program.instructions[i];
      if (hoist[i]) {
        cost += GetOpInfo(inst.op).cost;
        continue;
      }
      for (int o = 0; o < inst.num_operands; ++o) {
        const Operand& operand = inst.operands[o];
        if (operand.kind == Operand::Kind::kInput && !small[operand.index]) large_read = true;
      }
    }
    for (const Output& output : program.outputs) {
      if (output.operand.kind == Operand::Kind::kInput && !small[output.operand.index]) {
        large_read = true;
      }
    }
    if (large_read && cost > best_cost) {
      best_cost = cost;
      best_small = std::move(small);
      best_hoist = std::move(hoist);
    }
  }
  if (best_cost < 2) return false;

  HoistedProgram split;
  // The prologue: the small inputs the hoisted instructions read, the hoisted instructions, and
  // as outputs the hoisted values the rest reads.
  std::vector<int> prologue_input(num_inputs, -1);
  std::vector<int> prologue_value(n, -1);
  std::vector<int> main_input(n, -1);  // hoisted value -> its input index in the main program
  std::vector<int> main_value(n, -1);
  auto remap_prologue = [&](Operand operand) {
    if (operand.kind == Operand::Kind::kInput) {
      int& index = prologue_input[operand.index];
      if (index < 0) {
        index = static_cast<int>(split.prologue.inputs.size());
        split.prologue.inputs.push_back(program.inputs[operand.index]);
        split.prologue_inputs.push_back(operand.index);
      }
      operand.index = index;
    } else if (operand.kind == Operand::Kind::kValue) {
      operand.index = prologue_value[operand.index];
    }
    return operand;
  };
  for (int i = 0; i < n; ++i) {
    if (!best_hoist[i]) continue;
    Instruction inst = program.instructions[i];
    for (int o = 0; o < inst.num_operands; ++o) inst.operands[o] = remap_prologue(inst.operands[o]);
    prologue_value[i] = static_cast<int>(split.prologue.instructions.size());
    split.prologue.instructions.push_back(std::move(inst));
  }
  const ShapeDecl& invariant_shape = split.prologue.inputs.front().read_shape();

  split.main.inputs = program.inputs;
  auto remap_main = [&](Operand operand) {
    if (operand.kind != Operand::Kind::kValue) return operand;
    const int i = operand.index;
    if (!best_hoist[i]) {
      operand.index = main_value[i];
      return operand;
    }
    if (main_input[i] < 0) {
      main_input[i] = static_cast<int>(split.main.inputs.size());
      InputDecl decl;
      decl.dtype = program.instructions[i].dtype;
      decl.shape = invariant_shape;
      split.main.inputs.push_back(decl);
      Output output;
      output.operand.kind = Operand::Kind::kValue;
      output.operand.index = prologue_value[i];
      output.line = program.instructions[i].line;
      split.prologue.outputs.push_back(output);
    }
    operand.kind = Operand::Kind::kInput;
    operand.index = main_input[i];
    return operand;
  };
  for (int i = 0; i < n; ++i) {
    if (best_hoist[i]) continue;
    Instruction inst = program.instructions[i];
    for (int o = 0; o < inst.num_operands; ++o) inst.operands[o] = remap_main(inst.operands[o]);
    main_value[i] = static_cast<int>(split.main.instructions.size());
    split.main.instructions.push_back(std::move(inst));
  }
  if (split.prologue.outputs.empty()) return false;  // hoisted values nobody reads: not ours
  for (const Output& output : program.outputs) {
    Output copy = output;
    copy.operand = remap_main(output.operand);
    split.main.outputs.push_back(copy);
  }
  *out = std::move(split);
  return true;
}

}  // namespace tf_autofuse
