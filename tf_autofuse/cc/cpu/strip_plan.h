// Strip fusion, planning (see StripRun in schedule.h): which spans of a full-tile schedule
// run strip by strip, their strip registers, and the f16 conversions folded into them.
//
// Part of the CPU interpreter's one translation unit: included by interpreter.cc (and by the
// parts after it), never compiled alone, so that the hot loops inline across the parts.

#ifndef TF_AUTOFUSE_CC_CPU_STRIP_PLAN_H_
#define TF_AUTOFUSE_CC_CPU_STRIP_PLAN_H_

#include <atomic>
#include <map>
#include <utility>
#include <vector>

#include "schedule.h"

namespace tf_autofuse {
namespace {

std::atomic<bool> strip_fusion_enabled{true};  // AUTOFUSE_DFX_FLAGS=--strip_fusion=false: off

// The fp32 instructions a strip computes with the same packet functions as RunFloat: exact
// operations, Eigen's ptanh (what x.tanh() runs on whole packets), and our own Exp, Sigmoid
// and Erfc packets. The rest (Eigen's other approximations, whose scalar and packet versions
// differ, and the C library's functions) break a run.
bool StripFusable(OpCode op) {
  switch (op) {
    case OpCode::kAbs: case OpCode::kNeg: case OpCode::kSquare: case OpCode::kSqrt:
    case OpCode::kRelu: case OpCode::kRelu6: case OpCode::kLeakyRelu: case OpCode::kExp:
    case OpCode::kSigmoid: case OpCode::kErfc: case OpCode::kTanh: case OpCode::kAdd:
    case OpCode::kSub: case OpCode::kMul: case OpCode::kDiv: case OpCode::kMaximum:
    case OpCode::kMinimum: case OpCode::kSquaredDifference:
      return true;
    default:
      return false;
  }
}

bool StripDType(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

// `accumulate`: the schedule is one of a plain or kept-row accumulation pass, whose
// accumulations (one scalar of 16 lanes per row, lane = element mod 16, or one accumulator per
// inner index) take the elements in the same order strip by strip as tile by tile.
bool StripStep(const Step& step, bool accumulate) {
  auto tile_loc = [](const Loc& loc) {
    return loc.is(Loc::Kind::kSlot) || loc.is(Loc::Kind::kKept) ||
           loc.is(Loc::Kind::kOutput) || loc.is(Loc::Kind::kInput);
  };
  switch (step.kind) {
    case Step::Kind::kLoad:
    case Step::Kind::kBroadcastLoad:
      return StripDType(step.dtype) && step.dst.is(Loc::Kind::kSlot);
    case Step::Kind::kAccumulate:
      return accumulate && step.src_ctype == ComputeType::kF32 &&
             (tile_loc(step.src[0]) && !step.src[0].is(Loc::Kind::kOutput));
    case Step::Kind::kConvertStore:
      return StripDType(step.dtype) && step.ctype == ComputeType::kF32 &&
             (step.src[0].is(Loc::Kind::kSlot) || step.src[0].is(Loc::Kind::kKept));
    case Step::Kind::kCompute:
      if (IsReduction(step.op) || !StripFusable(step.op) || step.num_src > 2 ||
          step.ctype != ComputeType::kF32 || step.src_ctype != ComputeType::kF32 ||
          !(step.dst.is(Loc::Kind::kSlot) || step.dst.is(Loc::Kind::kKept) ||
            step.dst.is(Loc::Kind::kOutput))) {
        return false;
      }
      for (int k = 0; k < step.num_src; ++k) {
        const Loc& loc = step.src[k];
        if (!tile_loc(loc) && !loc.is(Loc::Kind::kImmediate) && !loc.is(Loc::Kind::kReduced)) {
          return false;
        }
      }
      return true;
    default:
      return false;
  }
}

// The ops of `run` that read the value op `k` writes (up to the next op writing its register;
// an op reading and writing it reads this value).
std::vector<int> StripReaders(const StripRun& run, int k) {
  std::vector<int> readers;
  const int reg = run.ops[k].dst;
  for (int j = k + 1; j < static_cast<int>(run.ops.size()); ++j) {
    const StripOp& op = run.ops[j];
    for (int m = 0; m < op.num_src; ++m) {
      if (op.src[m].kind == StripOperand::Kind::kRegister && op.src[m].reg == reg) {
        readers.push_back(j);
        break;
      }
    }
    if (op.dst == reg) break;
  }
  return readers;
}

bool StripUnaryOp(const StripOp& op) {
  return op.kind == StripOp::Kind::kCompute && op.num_src == 1 && !op.write_back;
}

// Folds an f16 load into the unary instruction that alone reads it, and an f16 store into the
// unary instruction whose value only it reads (StripOp::half_in, half_out).
void FoldHalfConversions(StripRun* run) {
  std::vector<StripOp>& ops = run->ops;
  for (int k = 0; k + 1 < static_cast<int>(ops.size()); ++k) {
    StripOp& load = ops[k];
    StripOp& next = ops[k + 1];
    if (load.kind == StripOp::Kind::kLoad && load.dtype == DType::kF16 && !load.write_back &&
        StripUnaryOp(next) && next.src[0].kind == StripOperand::Kind::kRegister &&
        next.src[0].reg == load.dst && StripReaders(*run, k) == std::vector<int>{k + 1}) {
      next.src[0] = load.src[0];  // the input tensor
      next.half_in = true;
      load.skipped = true;
    }
  }
  for (int k = 0; k + 1 < static_cast<int>(ops.size()); ++k) {
    StripOp& op = ops[k];
    StripOp& store = ops[k + 1];
    if (store.kind == StripOp::Kind::kStore && store.dtype == DType::kF16 && StripUnaryOp(op) &&
        !op.skipped && store.src[0].kind == StripOperand::Kind::kRegister &&
        store.src[0].reg == op.dst && StripReaders(*run, k) == std::vector<int>{k + 1}) {
      op.half_out = true;
      op.home = store.home;
      op.stream = store.stream;
      store.skipped = true;
    }
  }
}

// Steps [begin, end) of `schedule` as a run, registers numbered per location written; false if
// they need more than kMaxStripRegisters.
bool BuildStripRun(const Schedule& schedule, int begin, int end, StripRun* run) {
  *run = StripRun();
  run->end = end;
  std::map<std::pair<int, int>, int> reg_of;  // (Loc kind, index) written in the run -> register
  std::map<std::pair<int, int>, int> last_writer;  // -> index in run->ops
  auto key = [](const Loc& loc) { return std::make_pair(static_cast<int>(loc.kind), loc.index); };
  auto operand = [&](const Loc& loc) {
    StripOperand o;
    o.loc = loc;
    auto it = reg_of.find(key(loc));
    if (loc.is(Loc::Kind::kImmediate)) {
      o.kind = StripOperand::Kind::kImmediate;
    } else if (it != reg_of.end()) {
      o.kind = StripOperand::Kind::kRegister;
      o.reg = it->second;
    } else {
      o.kind = StripOperand::Kind::kMemory;
    }
    return o;
  };
  for (int pos = begin; pos < end; ++pos) {
    const Step& step = schedule.steps[pos];
    StripOp op;
    op.step = pos;
    op.op = step.op;
    op.dtype = step.dtype;
    op.stream = step.stream;
    op.num_src = step.num_src;
    for (int k = 0; k < step.num_src; ++k) op.src[k] = operand(step.src[k]);
    if (step.kind == Step::Kind::kConvertStore || step.kind == Step::Kind::kAccumulate) {
      op.kind = step.kind == Step::Kind::kConvertStore ? StripOp::Kind::kStore
                                                       : StripOp::Kind::kAccumulate;
      op.home = step.dst;
    } else {
      op.kind = step.kind == Step::Kind::kLoad            ? StripOp::Kind::kLoad
                : step.kind == Step::Kind::kBroadcastLoad ? StripOp::Kind::kBroadcastLoad
                                                          : StripOp::Kind::kCompute;
      if (step.op == OpCode::kLeakyRelu) op.alpha = step.attr.imm.f32;
      auto it = reg_of.find(key(step.dst));
      if (it == reg_of.end()) {
        if (static_cast<int>(reg_of.size()) == kMaxStripRegisters) return false;
        it = reg_of.emplace(key(step.dst), static_cast<int>(reg_of.size())).first;
      }
      op.dst = it->second;
      op.home = step.dst;
      op.write_back = !step.dst.is(Loc::Kind::kSlot);
      last_writer[key(step.dst)] = static_cast<int>(run->ops.size());
    }
    run->ops.push_back(op);
  }
  // A slot whose last value in the run is read after it (before being written again) is
  // written back.
  for (const auto& [k, index] : last_writer) {
    if (k.first != static_cast<int>(Loc::Kind::kSlot)) continue;
    for (size_t pos = end; pos < schedule.steps.size(); ++pos) {
      const Step& later = schedule.steps[pos];
      bool read = false;
      for (int m = 0; m < later.num_src; ++m) read = read || key(later.src[m]) == k;
      if (read) run->ops[index].write_back = true;
      if (read || key(later.dst) == k) break;
    }
  }
  FoldHalfConversions(run);
  for (int k = 0; k < static_cast<int>(run->ops.size()); ++k) {
    StripOp& op = run->ops[k];
    if (op.kind == StripOp::Kind::kBroadcastLoad) op.readers = StripReaders(*run, k);
  }
  return true;
}

// Marks the runs of a full-tile schedule: maximal spans of at least two StripStep steps (cut
// where they would need too many registers).
void FuseStrips(Schedule* schedule, bool accumulate) {
  const int n = static_cast<int>(schedule->steps.size());
  int pos = 0;
  while (pos < n) {
    if (!StripStep(schedule->steps[pos], accumulate)) {
      ++pos;
      continue;
    }
    int end = pos;
    while (end < n && StripStep(schedule->steps[end], accumulate)) ++end;
    StripRun run;
    while (end - pos >= 2 && !BuildStripRun(*schedule, pos, end, &run)) --end;
    if (end - pos < 2) {
      ++pos;
      continue;
    }
    if (schedule->run_at.empty()) schedule->run_at.assign(n, -1);
    schedule->run_at[pos] = static_cast<int>(schedule->runs.size());
    schedule->runs.push_back(std::move(run));
    pos = end;
  }
}

}  // namespace
}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CC_CPU_STRIP_PLAN_H_
