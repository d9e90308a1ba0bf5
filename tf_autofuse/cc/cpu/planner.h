// Planning: one Schedule per pass and tensor access (direct, streaming, staged), values
// assigned to tile slots by a linear scan; the kept values of the grouped reduction modes.
//
// Part of the CPU interpreter's one translation unit: included by interpreter.cc (and by the
// parts after it), never compiled alone, so that the hot loops inline across the parts.

#ifndef TF_AUTOFUSE_CC_CPU_PLANNER_H_
#define TF_AUTOFUSE_CC_CPU_PLANNER_H_

#include <functional>
#include <limits>
#include <map>
#include <set>

#include "Eigen/Core"
#include "schedule.h"

namespace tf_autofuse {
namespace {

Loc ImmediateLoc(double value, DType dtype) {
  Loc loc;
  loc.kind = Loc::Kind::kImmediate;
  switch (dtype) {
    case DType::kF16:  // a scalar of the value's type, then widened like the tensors
      loc.imm.f32 = static_cast<float>(Eigen::half(static_cast<float>(value)));
      break;
    case DType::kBF16:
      loc.imm.f32 = static_cast<float>(Eigen::bfloat16(static_cast<float>(value)));
      break;
    case DType::kF32:
      loc.imm.f32 = static_cast<float>(value);
      break;
    case DType::kF64:
      loc.imm.f64 = value;
      break;
    case DType::kI32:
      loc.imm.i32 = static_cast<int32_t>(value);  // validated: integral and in range
      break;
    case DType::kBool:
      loc.imm.b = value != 0;
      break;
  }
  return loc;
}

// How a schedule reaches the tensors.
struct Access {
  bool direct_inputs;   // inputs of the iteration's size read in place (else loaded into slots)
  bool direct_outputs;  // outputs written in place (else stored from slots)
  bool stream_outputs;  // stores bypass the caches (non-temporal)
};

// Which schedule of a program to build.
struct Pass {
  enum class Kind : uint8_t {
    kFinal,       // full tiles; the full outputs (all outputs of an elementwise program)
    kAccumulate,  // full tiles; the reductions of `level`
    kFinalize,    // the reduced space of an item; finishes `level`
  };
  Kind kind = Kind::kFinal;
  int level = 0;
  // Full passes of the row-group mode (short rows, several per tile): reduced values are one per
  // row and are expanded into slots (kExpandReduced) before full instructions read them.
  bool rows = false;
  bool keep = false;  // row-group mode: values several passes need are kept (PlanKeptValues)
};

// Per output of a program with reductions: a full output that depends on no reduction, stored
// by the first accumulate pass instead of the final one. That pass visits every full element
// once like the final pass, and often computes the value anyway (a bias gradient's Sum and the
// gradient it sums): stored there, the final pass does not read the inputs and compute the
// value a second time, and a program whose full outputs are all early has no final pass.
std::vector<bool> EarlyOutputs(const Program& program) {
  const int n = static_cast<int>(program.instructions.size());
  std::vector<bool> after_reduction(n, false);
  for (int i = 0; i < n; ++i) {
    const Instruction& inst = program.instructions[i];
    bool after = IsReduction(inst.op);
    for (int k = 0; k < inst.num_operands; ++k) {
      const Operand& x = inst.operands[k];
      if (x.kind == Operand::Kind::kValue && after_reduction[x.index]) after = true;
    }
    after_reduction[i] = after;
  }
  std::vector<bool> early(program.outputs.size(), false);
  if (!program.has_reductions()) return early;
  for (size_t k = 0; k < program.outputs.size(); ++k) {
    const Operand& x = program.outputs[k].operand;
    early[k] = !program.IsReduced(x) &&
               (x.kind == Operand::Kind::kInput ||
                (x.kind == Operand::Kind::kValue && !after_reduction[x.index]));
  }
  return early;
}

// The pass that stores full output k: accumulate level 1 for an early output, else the final.
bool StoresOutput(const std::vector<bool>& early, Pass::Kind kind, int level, size_t k) {
  return early[k] ? kind == Pass::Kind::kAccumulate && level == 1 : kind == Pass::Kind::kFinal;
}

// The full values a full pass computes or reads: those its roots (the full outputs it stores,
// and in an accumulate pass the operands of this level's reductions) depend on through full
// values, not looking past a value for which `stop` (null: none) is true. `early`: the
// program's EarlyOutputs.
std::vector<bool> FullValuesOfPass(const Program& program, const std::vector<bool>& early,
                                   Pass::Kind kind, int level,
                                   const std::function<bool(int)>& stop = nullptr) {
  const int n = static_cast<int>(program.instructions.size());
  std::vector<bool> needed(n, false);
  auto mark = [&](const Operand& x) {
    if (x.kind == Operand::Kind::kValue && !program.instructions[x.index].reduced) {
      needed[x.index] = true;
    }
  };
  for (size_t k = 0; k < program.outputs.size(); ++k) {
    if (StoresOutput(early, kind, level, k)) mark(program.outputs[k].operand);
  }
  if (kind == Pass::Kind::kAccumulate) {
    for (const Instruction& inst : program.instructions) {
      if (IsReduction(inst.op) && inst.level == level) mark(inst.operands[0]);
    }
  }
  for (int i = n - 1; i >= 0; --i) {
    if (!needed[i] || (stop && stop(i))) continue;
    const Instruction& inst = program.instructions[i];
    for (int k = 0; k < inst.num_operands; ++k) mark(inst.operands[k]);
  }
  return needed;
}

// Row-group mode runs every pass of an item over the same tile of whole rows, so a full value
// that several passes need is computed once, by the first, into a kept buffer that the later ones
// read (softmax's exp(x - max) for the sum and then for the division; a layer norm's x + bias for
// the mean, the variance and the output). Per instruction: its kept buffer or -1, and the first
// pass computing it, in the order the full passes of an item run: accumulate level p is p - 1,
// the final pass is the number of levels.
struct KeptValues {
  std::vector<int> index;
  std::vector<int> first_pass;
  int count = 0;
};

KeptValues PlanKeptValues(const Program& program, const std::vector<bool>& early,
                          bool has_final) {
  const int n = static_cast<int>(program.instructions.size());
  KeptValues kept;
  kept.index.assign(n, -1);
  kept.first_pass.assign(n, -1);
  std::vector<int> passes(n, 0);
  const int levels = program.num_levels;
  for (int order = 0; order <= levels; ++order) {
    if (order == levels && !has_final) break;
    // a value an earlier pass computed is read from its buffer: what it was computed from is
    // not needed again (softmax keeps exp(x - max), not x - max too)
    const auto computed = [&passes](int i) { return passes[i] > 0; };
    const std::vector<bool> needed =
        order < levels
            ? FullValuesOfPass(program, early, Pass::Kind::kAccumulate, order + 1, computed)
            : FullValuesOfPass(program, early, Pass::Kind::kFinal, 0, computed);
    for (int i = 0; i < n; ++i) {
      if (!needed[i]) continue;
      if (passes[i]++ == 0) kept.first_pass[i] = order;
    }
  }
  for (int i = 0; i < n; ++i) {
    if (passes[i] > 1) kept.index[i] = kept.count++;
  }
  return kept;
}

class Planner {
 public:
  Planner(const Program& program, const std::vector<bool>& broadcast, Access access, Pass pass,
          const std::vector<int>& reduced_index, const std::vector<int>& accumulator_index,
          const std::vector<bool>& early, const KeptValues* kept = nullptr)
      : program_(program),
        broadcast_(broadcast),
        access_(access),
        pass_(pass),
        reduced_index_(reduced_index),
        accumulator_index_(accumulator_index),
        kept_(pass.keep ? kept : nullptr),
        early_(early) {}

  Schedule Build() {
    const int n = static_cast<int>(program_.instructions.size());
    input_loc_.assign(program_.inputs.size(), Loc());
    input_loaded_.assign(program_.inputs.size(), false);
    value_loc_.assign(n, Loc());
    for (int i = 0; i < n; ++i) {
      if (program_.instructions[i].reduced) value_loc_[i] = ReducedLoc(i);
    }
    if (pass_.kind == Pass::Kind::kFinalize) {
      BuildFinalize();
    } else {
      const std::vector<bool> needed = NeededFullValues();
      for (int i = 0; i < n; ++i) {
        if (needed[i] && KeptFromEarlier(i)) {
          value_loc_[i] = KeptLoc(i);
          EmitOutputsOf(i, -1);
        } else if (needed[i]) {
          EmitInstruction(i);
        }
        const Instruction& inst = program_.instructions[i];
        if (pass_.kind == Pass::Kind::kAccumulate && IsReduction(inst.op) &&
            inst.level == pass_.level) {
          EmitAccumulate(i);
        }
      }
      if (pass_.kind != Pass::Kind::kFinalize) EmitInputOutputs();
    }
    AssignSlots();
    RecordTensorAccesses();
    return std::move(schedule_);
  }

 private:
  bool FullSpace() const { return pass_.kind != Pass::Kind::kFinalize; }

  Loc ReducedLoc(int i) const {
    Loc loc;
    loc.kind = Loc::Kind::kReduced;
    loc.index = reduced_index_[i];
    return loc;
  }

  // The full values this pass computes, or reads from a kept buffer.
  std::vector<bool> NeededFullValues() const {
    return FullValuesOfPass(program_, early_, pass_.kind, pass_.level,
                            [this](int i) { return KeptFromEarlier(i); });
  }

  // Row-group mode: value i is in its kept buffer, computed by an earlier pass of this item.
  bool KeptFromEarlier(int i) const {
    if (kept_ == nullptr || kept_->index[i] < 0) return false;
    const int order = pass_.kind == Pass::Kind::kFinal ? program_.num_levels : pass_.level - 1;
    return kept_->first_pass[i] < order;
  }

  Loc KeptLoc(int i) const {
    Loc loc;
    loc.kind = Loc::Kind::kKept;
    loc.index = kept_->index[i];
    return loc;
  }

  Loc TensorLoc(Loc::Kind kind, int index) const {
    Loc loc;
    loc.kind = kind;
    loc.index = index;
    const DType dtype = kind == Loc::Kind::kInput ? program_.inputs[index].dtype
                                                  : program_.OutputDType(index);
    loc.elem_size = DTypeSize(dtype);
    return loc;
  }

  Loc NewRegister() {
    Loc loc;
    loc.kind = Loc::Kind::kSlot;
    loc.index = num_registers_++;
    return loc;
  }

  Loc OperandLoc(const Operand& operand, DType dtype) {
    switch (operand.kind) {
      case Operand::Kind::kImmediate:
        return ImmediateLoc(operand.immediate, dtype);
      case Operand::Kind::kValue:
        if (pass_.rows && FullSpace() && program_.instructions[operand.index].reduced) {
          return ExpandedLoc(operand.index);
        }
        return value_loc_[operand.index];
      case Operand::Kind::kInput:
        break;
    }
    const int j = operand.index;
    const DType input_dtype = program_.inputs[j].dtype;
    const bool stretched = !FullSpace() || broadcast_[j];
    if (!stretched && access_.direct_inputs && IsComputedAsStored(input_dtype)) {
      return TensorLoc(Loc::Kind::kInput, j);
    }
    if (!input_loaded_[j]) {  // first use: load the tile into a slot
      Step load;
      load.kind = stretched ? Step::Kind::kBroadcastLoad : Step::Kind::kLoad;
      load.dtype = input_dtype;
      load.ctype = ComputeTypeOf(input_dtype);
      load.num_src = 1;
      load.src[0] = TensorLoc(Loc::Kind::kInput, j);
      load.dst = NewRegister();
      schedule_.steps.push_back(load);
      input_loc_[j] = load.dst;
      input_loaded_[j] = true;
    }
    return input_loc_[j];
  }

  // A reduced value repeated over its row, in a slot (row-group mode).
  Loc ExpandedLoc(int i) {
    auto it = expanded_.find(i);
    if (it != expanded_.end()) return it->second;
    Step step;
    step.kind = Step::Kind::kExpandReduced;
    step.ctype = ComputeTypeOf(program_.instructions[i].dtype);
    step.num_src = 1;
    step.src[0] = ReducedLoc(i);
    step.dst = NewRegister();
    schedule_.steps.push_back(step);
    expanded_[i] = step.dst;
    return step.dst;
  }

  Step ComputeStep(int i) {
    const Instruction& inst = program_.instructions[i];
    Step step;
    step.kind = Step::Kind::kCompute;
    step.op = inst.op;
    step.dtype = inst.op == OpCode::kCast ? inst.to : inst.dtype;
    step.ctype = ComputeTypeOf(inst.dtype);
    step.src_ctype = ComputeTypeOf(inst.operand_dtype);
    step.num_src = inst.num_operands;
    for (int k = 0; k < inst.num_operands; ++k) {
      const DType dtype =
          inst.op == OpCode::kSelect && k == 0 ? DType::kBool : inst.operand_dtype;
      step.src[k] = OperandLoc(inst.operands[k], dtype);
    }
    if (inst.op == OpCode::kLeakyRelu) step.attr = ImmediateLoc(inst.alpha, inst.dtype);
    return step;
  }

  bool IsOutputOf(const Output& out, int i) const {
    return out.operand.kind == Operand::Kind::kValue && out.operand.index == i;
  }

  void EmitInstruction(int i) {
    const Instruction& inst = program_.instructions[i];
    Step step = ComputeStep(i);
    // The first output of this value receives it directly when its tensor holds the compute type.
    int direct_output = -1;
    for (size_t k = 0; k < program_.outputs.size(); ++k) {
      if (IsOutputOf(program_.outputs[k], i) && Stores(k)) {
        if (access_.direct_outputs && IsComputedAsStored(inst.dtype)) {
          direct_output = static_cast<int>(k);
        }
        break;
      }
    }
    const bool kept = kept_ != nullptr && kept_->index[i] >= 0;
    if (kept) direct_output = -1;  // later passes read it from its buffer
    step.dst = direct_output >= 0 ? TensorLoc(Loc::Kind::kOutput, direct_output)
               : kept             ? KeptLoc(i)
                                  : NewRegister();
    value_loc_[i] = step.dst;
    schedule_.steps.push_back(step);
    EmitOutputsOf(i, direct_output);
  }

  // Whether this pass stores full output k (EarlyOutputs).
  bool Stores(size_t k) const { return StoresOutput(early_, pass_.kind, pass_.level, k); }

  // Every output of value i this pass stores but `written`: stored right away, so that its slot
  // can be released early.
  void EmitOutputsOf(int i, int written) {
    for (size_t k = 0; k < program_.outputs.size(); ++k) {
      if (!IsOutputOf(program_.outputs[k], i) || static_cast<int>(k) == written || !Stores(k)) {
        continue;
      }
      EmitStore(value_loc_[i], program_.instructions[i].dtype, static_cast<int>(k));
    }
  }

  void EmitStore(const Loc& src, DType dtype, int k) {
    Step store;
    store.kind = src.is(Loc::Kind::kInput) || src.is(Loc::Kind::kOutput)
                     ? Step::Kind::kCopyStore
                     : Step::Kind::kConvertStore;
    store.stream = access_.stream_outputs;
    store.ctype = ComputeTypeOf(dtype);
    store.dtype = dtype;
    store.num_src = 1;
    store.src[0] = src;
    store.dst = TensorLoc(Loc::Kind::kOutput, k);
    schedule_.steps.push_back(store);
  }

  // outK = inK, for full inputs (reduced ones are stored by finalize 0).
  void EmitInputOutputs() {
    for (size_t k = 0; k < program_.outputs.size(); ++k) {
      const Operand& out = program_.outputs[k].operand;
      if (out.kind != Operand::Kind::kInput || program_.inputs[out.index].reduced || !Stores(k)) {
        continue;
      }
      const DType dtype = program_.inputs[out.index].dtype;
      if (!broadcast_[out.index]) {
        EmitStore(TensorLoc(Loc::Kind::kInput, out.index), dtype, static_cast<int>(k));
      } else {
        EmitStore(OperandLoc(out, dtype), dtype, static_cast<int>(k));
      }
    }
  }

  void EmitAccumulate(int i) {
    const Instruction& inst = program_.instructions[i];
    Step step;
    step.kind = Step::Kind::kAccumulate;
    step.op = inst.op;
    step.dtype = inst.operand_dtype;
    step.src_ctype = ComputeTypeOf(inst.operand_dtype);
    step.acc_ctype = AccumulatorType(inst.op, inst.operand_dtype);
    step.num_src = 1;
    step.src[0] = OperandLoc(inst.operands[0], inst.operand_dtype);
    step.dst.kind = Loc::Kind::kAccumulator;
    step.dst.index = accumulator_index_[i];
    schedule_.steps.push_back(step);
  }

  // Finishes the reductions of this level, computes the reduced instructions of this level and
  // stores the reduced outputs that are ready.
  void BuildFinalize() {
    const int n = static_cast<int>(program_.instructions.size());
    for (int i = 0; i < n; ++i) {
      const Instruction& inst = program_.instructions[i];
      if (!inst.reduced || inst.level != pass_.level) continue;
      Step step;
      if (IsReduction(inst.op)) {
        step.kind = Step::Kind::kFinalize;
        step.op = inst.op;
        step.dtype = inst.operand_dtype;
        step.ctype = ComputeTypeOf(inst.dtype);
        step.src_ctype = ComputeTypeOf(inst.operand_dtype);
        step.acc_ctype = AccumulatorType(inst.op, inst.operand_dtype);
        step.num_src = 1;
        step.src[0].kind = Loc::Kind::kAccumulator;
        step.src[0].index = accumulator_index_[i];
      } else {
        step = ComputeStep(i);
      }
      step.dst = ReducedLoc(i);
      schedule_.steps.push_back(step);
    }
    for (size_t k = 0; k < program_.outputs.size(); ++k) {
      const Operand& out = program_.outputs[k].operand;
      if (!program_.IsReduced(out)) continue;
      const DType dtype = program_.OperandDType(out);
      if (out.kind == Operand::Kind::kInput) {
        if (pass_.level == 0) EmitStore(OperandLoc(out, dtype), dtype, static_cast<int>(k));
      } else if (program_.instructions[out.index].level == pass_.level) {
        EmitStore(ReducedLoc(out.index), dtype, static_cast<int>(k));
      }
    }
  }

  // Linear scan: virtual registers -> slots, a slot reused once its value is dead.
  void AssignSlots() {
    std::vector<int> last_use(num_registers_, -1);
    for (size_t pos = 0; pos < schedule_.steps.size(); ++pos) {
      const Step& step = schedule_.steps[pos];
      for (int k = 0; k < step.num_src; ++k) {
        if (step.src[k].is(Loc::Kind::kSlot)) last_use[step.src[k].index] = static_cast<int>(pos);
      }
    }
    std::vector<int> slot_of(num_registers_, -1);
    std::set<int> free_slots;
    for (size_t pos = 0; pos < schedule_.steps.size(); ++pos) {
      Step& step = schedule_.steps[pos];
      // Operands read for the last time free their slot before the result takes one, unless
      // the result is of another width (a widening write in place would overwrite operand
      // elements not read yet).
      const bool mixed = step.kind == Step::Kind::kCompute &&
                         (ComputeSize(step.ctype) != ComputeSize(step.src_ctype) ||
                          step.op == OpCode::kSelect);
      std::vector<int> dying;
      for (int k = 0; k < step.num_src; ++k) {
        if (!step.src[k].is(Loc::Kind::kSlot)) continue;
        const int reg = step.src[k].index;
        step.src[k].index = slot_of[reg];
        if (last_use[reg] == static_cast<int>(pos)) {
          bool repeated = false;  // the same register twice in one step: free it once
          for (int m = 0; m < k; ++m) {
            if (step.src[m].is(Loc::Kind::kSlot) && step.src[m].index == slot_of[reg]) {
              repeated = true;
            }
          }
          if (!repeated) dying.push_back(slot_of[reg]);
        }
      }
      if (!mixed) free_slots.insert(dying.begin(), dying.end());
      if (step.dst.is(Loc::Kind::kSlot)) {
        const int reg = step.dst.index;
        int slot;
        if (free_slots.empty()) {
          slot = schedule_.num_slots++;
        } else {
          slot = *free_slots.begin();
          free_slots.erase(free_slots.begin());
        }
        slot_of[reg] = slot;
        step.dst.index = slot;
        if (last_use[reg] < 0) free_slots.insert(slot);  // never read (not for live values)
      }
      if (mixed) free_slots.insert(dying.begin(), dying.end());
    }
  }

  void RecordTensorAccesses() {
    schedule_.last_input_read.assign(program_.inputs.size(), -1);
    schedule_.first_output_write.assign(program_.outputs.size(), std::numeric_limits<int>::max());
    for (size_t pos = 0; pos < schedule_.steps.size(); ++pos) {
      const Step& step = schedule_.steps[pos];
      for (int k = 0; k < step.num_src; ++k) {
        if (step.src[k].is(Loc::Kind::kInput)) {
          schedule_.last_input_read[step.src[k].index] = static_cast<int>(pos);
        }
      }
      if (step.dst.is(Loc::Kind::kOutput)) {
        int& first = schedule_.first_output_write[step.dst.index];
        first = std::min(first, static_cast<int>(pos));
      }
    }
  }

  const Program& program_;
  const std::vector<bool>& broadcast_;
  const Access access_;
  const Pass pass_;
  const std::vector<int>& reduced_index_;
  const std::vector<int>& accumulator_index_;
  Schedule schedule_;
  int num_registers_ = 0;
  std::vector<Loc> input_loc_;
  std::vector<bool> input_loaded_;
  std::vector<Loc> value_loc_;
  std::map<int, Loc> expanded_;
  const KeptValues* kept_;  // row-group passes only, else null
  const std::vector<bool>& early_;  // EarlyOutputs
};

}  // namespace
}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CC_CPU_PLANNER_H_
