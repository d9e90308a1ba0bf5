#include "simplify.h"

#include <vector>

namespace tf_autofuse {

int SimplifyProgram(Program* program) {
  std::vector<Instruction>& insts = program->instructions;
  const int n = static_cast<int>(insts.size());
  std::vector<bool> is_output(n, false);
  for (const Output& output : program->outputs) {
    if (output.operand.kind == Operand::Kind::kValue) is_output[output.operand.index] = true;
  }
  // replacement[i]: what reads of %i read now: its new number, or (dropped) its operand
  std::vector<Operand> replacement(n);
  auto remap = [&](Operand operand) {
    return operand.kind == Operand::Kind::kValue ? replacement[operand.index] : operand;
  };
  std::vector<Instruction> kept;
  kept.reserve(n);
  for (int i = 0; i < n; ++i) {
    Instruction inst = insts[i];
    for (int o = 0; o < inst.num_operands; ++o) inst.operands[o] = remap(inst.operands[o]);
    const Operand& x = inst.operands[0];
    if (inst.op == OpCode::kRelu && IsFloat(inst.dtype) && !is_output[i] &&
        x.kind == Operand::Kind::kValue && GetOpInfo(kept[x.index].op).never_negative &&
        kept[x.index].dtype == inst.dtype) {
      replacement[i] = x;
      continue;
    }
    replacement[i].kind = Operand::Kind::kValue;
    replacement[i].index = static_cast<int>(kept.size());
    kept.push_back(std::move(inst));
  }
  for (Output& output : program->outputs) output.operand = remap(output.operand);
  const int dropped = n - static_cast<int>(kept.size());
  insts = std::move(kept);
  return dropped;
}

}  // namespace tf_autofuse
