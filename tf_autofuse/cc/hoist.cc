// See hoist.h.

#include "hoist.h"

#include <vector>

namespace tf_autofuse {

bool SplitInvariants(const Program& program, HoistedProgram* out) {
  const int num_inputs = static_cast<int>(program.inputs.size());
  const int n = static_cast<int>(program.instructions.size());
  std::vector<bool> invariant(n, false);
  bool any = false;
  for (int i = 0; i < n; ++i) {
    invariant[i] = program.instructions[i].invariant;
    any = any || invariant[i];
  }
  if (!any) return false;

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
    if (!invariant[i]) continue;
    Instruction inst = program.instructions[i];
    for (int o = 0; o < inst.num_operands; ++o) inst.operands[o] = remap_prologue(inst.operands[o]);
    inst.invariant = false;  // the prologue computes it over its whole iteration shape, S
    prologue_value[i] = static_cast<int>(split.prologue.instructions.size());
    split.prologue.instructions.push_back(std::move(inst));
  }
  const ShapeDecl& invariant_shape = split.prologue.inputs.front().read_shape();

  split.main.inputs = program.inputs;
  auto remap_main = [&](Operand operand) {
    if (operand.kind != Operand::Kind::kValue) return operand;
    const int i = operand.index;
    if (!invariant[i]) {
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
    if (invariant[i]) continue;
    Instruction inst = program.instructions[i];
    for (int o = 0; o < inst.num_operands; ++o) inst.operands[o] = remap_main(inst.operands[o]);
    main_value[i] = static_cast<int>(split.main.instructions.size());
    split.main.instructions.push_back(std::move(inst));
  }
  if (split.prologue.outputs.empty()) return false;  // nothing reads them: run as written
  for (const Output& output : program.outputs) {
    Output copy = output;
    copy.operand = remap_main(output.operand);
    split.main.outputs.push_back(copy);
  }
  *out = std::move(split);
  return true;
}

}  // namespace tf_autofuse
