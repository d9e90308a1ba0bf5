// The tiled CPU interpreter of a fused program.
//
// Plan (built once per broadcast pattern, i.e. per set of inputs that are stretched at run time)
//   * The flat element range of the iteration shape is cut into tiles of `tile_size`
//     elements. Every instruction runs over a whole tile as one vectorised loop (Eigen array
//     expressions, the same functors TensorFlow's CPU kernels use) before the next instruction
//     starts, so a tile's intermediate values never leave L1.
//   * Every intermediate value lives in a scratch *slot* of one tile. Slots are assigned by a
//     linear scan over the schedule: a slot is released after its value's last use and reused
//     by the next value (the instruction that reads a value for the last time may write its
//     result into the same slot: elementwise, so in place is safe). A chain of any length needs
//     one slot; a diamond two. Values no output depends on are not computed.
//   * f32, f64, i32 and bool inputs of the iteration's size are read straight from the input
//     tensor. f16 and bf16 inputs are widened into an fp32 slot once, at their first use;
//     f16/bf16 outputs are rounded to nearest even from their fp32 slot right after the value is
//     computed. A broadcast (stretched) input is loaded into a slot at its first use by walking
//     the rows of the innermost dimension of its BroadcastPlan: a contiguous run is copied, a
//     stretched one splats one value; no per-element index arithmetic.
//   * Three schedules of the same pass, differing only in how they reach the tensors:
//       direct     full tiles: an f32/f64/i32/bool value that is an output is written straight
//                  into the output tensor;
//       streaming  full tiles of a large run (>= kStreamBytes of output): outputs go through a
//                  slot and are stored non-temporally, which saves reading every destination
//                  cache line first (a third of a memory-bound kernel's traffic);
//       staged     a ragged tile (length not a multiple of 16): every input is copied into
//                  a zero-padded slot and every output stored from a slot, so that every
//                  instruction still runs on whole SIMD packets and nothing reaches past a
//                  tensor's end. An element is computed by the same code wherever it sits,
//                  whatever the number of threads: results are bit-identical across them.
//   * Strip fusion (StripRun): in the direct and streaming schedules, a span of consecutive
//     fp32 elementwise steps (loads, broadcast loads, most arithmetic, stores, and the
//     accumulations of one-row-per-item passes) runs strip by strip, 256 elements at a time,
//     its values in 1 KiB strip buffers instead of tile slots: loads and stores interleave with
//     the arithmetic. Same packet functions, same bits as the staged schedule's steps. A bias
//     (a broadcast input repeating one row) is read in place instead of copied strip by strip:
//     an f32 row as long as the tile from the tensor, a row of up to 4096 values of any float
//     type from that row repeated once per call (RepeatedRows). In runs of 2**20 elements and
//     more, tensor inputs are prefetched 4 KiB ahead of the strip (kPrefetchElements).
//   * The tile size is the largest power of two (1024..4096) whose slots and tensor streams fit
//     in 24 KiB of the 32 KiB L1d.
//
// Reductions (docs/PROGRAM.md, Reductions)
//   * The iteration shape is seen as [outer, R, inner] around the reduced axes. A work item is
//     one outer index and one chunk of at most `tile_size` inner indices (inner == 1: the whole
//     row). It is computed pass by pass, full values recomputed from the inputs in every pass
//     (they are in L1/L2 again by then, a row being read pass after pass):
//       finalize 0   reduced values that depend on no reduction (inputs that are 1 along the
//                    reduced axes, read through their reduced-space BroadcastPlan);
//       pass p       (p = 1..levels) the full values the level-p reductions read, tile by tile
//                    over R, accumulated into per-reduction accumulators; pass 1 also stores
//                    the full outputs that depend on no reduction (EarlyOutputs); then
//       finalize p   the level-p reductions' results, the reduced instructions of level p, and
//                    the stores of reduced outputs;
//       final pass   the full values the other full outputs need, reading reduced values
//                    broadcast (no final pass when there are none).
//     With inner == 1 a tile is a piece of a row and a reduced value is one scalar per item,
//     accumulated in 16 lanes (lane = r mod 16) combined in lane order at the end; with inner > 1
//     a tile is the item's inner chunk at one r, and the accumulators are one per inner index,
//     accumulated over r in order. Either way the order depends only on the shapes: every
//     reduced element is accumulated by one thread, bit-identically for any thread count.
//   * Short rows and short inner blocks would leave tiles nearly empty, so two grouped modes put
//     several of them in one tile (chosen from the shapes alone, so still deterministic):
//       row groups     inner == 1 and R <= tile/4: an item is tile/R whole rows, each reduced
//                      in order into its own accumulator;
//       column groups  1 < inner <= tile/4: a tile is tile/inner consecutive r of one outer
//                      index, accumulated block after block (the order of one-block tiles).
//     Their full passes read reduced values expanded into a slot (kExpandReduced: one value
//     repeated over its row, or the inner vector repeated per block), row by row.
//   * Split runs: a reduction of fewer than 8 items over a long R (BatchNorm's statistics over
//     N*H*W rows: one item) has R cut into blocks, as many as the shapes and the program's cost
//     say (SplitRun), and runs phase by phase (Phase): each pass of each block is an item, and
//     before each finalize the blocks' partial accumulators are folded in block order. Still
//     one order per shape.
//   * Kept values: a full value that several passes of an item need (softmax's exp(x - max),
//     for the sum and for the division) is computed by the first and kept for the others, in
//     row-group mode (one slot-sized buffer: the item is one tile) and in kept-row mode (row
//     reductions of one row per item: a buffer per tile of the row, when they fit
//     kKeptRowBytes). Elsewhere every pass recomputes its full values from the inputs.
//   * Accumulators: f16/bf16 sums in fp32, f32 and f64 in f64 (f64 with a compensation term),
//     i32 wrapping (i32 Mean in int64, as TensorFlow); Max/Min in the compute type, propagating
//     NaN.
//
// Output forwarding: an output may take over an input's buffer when the input is read in place
// (not broadcast, not read as a reduced value) and, within a tile and in every schedule of the
// pass that writes outputs, every read of that input comes no later than the output's first
// write. Items are disjoint, so items on different threads never see each other's writes.
//
// Where the parts are (cpu/, one translation unit: this file includes them in this order):
//   schedule.h     the plan's data: compute types, tile constants, Loc, Step, Schedule, PlanSet
//   planner.h      a program -> one Schedule per pass and access (direct, streaming, staged)
//   strip_plan.h   strip fusion: the spans of a schedule that run strip by strip
//   convert.h      tensors <-> slots: f16/bf16 conversion, stores, broadcast loads
//   packet_math.h  our fp32 packet functions (Exp, Erfc, Sigmoid), shared by tiles and strips
//   kernels.h      which family of ops.h runs each op, checked against the op table
//   ops.h          the operators over a tile, one function per family (the kernel bodies)
//   reduce.h       accumulators and the finishing of reductions
//   step.h         one step of a schedule: operands, the compute dispatch, the Frame of a run
//   strip_run.h    a strip run over one tile
//   interpreter.cc (here) runtime shapes and broadcast plans, RunSchedule (one tile), the plan
//                  set of a broadcast pattern, and the work items handed to the thread pool

#include "interpreter.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cpu/planner.h"
#include "cpu/strip_plan.h"
#include "cpu/strip_run.h"

namespace tf_autofuse {
namespace {

// The cost of one element in cheap ops (the op table's, catalog.element_cost): the ops, and
// moving the bytes (about 2 bytes a cheap op).
int64_t ProgramCostPerElement(const Program& program) {
  int64_t cost = 0;
  for (const Instruction& inst : program.instructions) {
    const OpInfo& info = GetOpInfo(inst.op);
    cost += inst.operand_dtype == DType::kF64 ? info.cost_f64 : info.cost;
  }
  for (const InputDecl& in : program.inputs) cost += DTypeSize(in.dtype) / 2;
  for (size_t k = 0; k < program.outputs.size(); ++k) {
    cost += DTypeSize(program.OutputDType(static_cast<int>(k))) / 2;
  }
  return std::max<int64_t>(cost, 1);
}

int64_t Product(const std::vector<int64_t>& dims, size_t begin = 0, size_t end = SIZE_MAX) {
  int64_t n = 1;
  for (size_t d = begin; d < std::min(end, dims.size()); ++d) n *= dims[d];
  return n;
}

std::string DimsString(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ","), "]");
}

// The plan of reading `view` (right-aligned) stretched over `space`.
BroadcastPlan MakeBroadcastPlan(const std::vector<int64_t>& space,
                                const std::vector<int64_t>& view) {
  BroadcastPlan plan;
  std::vector<bool> read;
  const int offset = static_cast<int>(space.size() - view.size());
  for (int a = 0; a < static_cast<int>(space.size()); ++a) {
    if (space[a] == 1) continue;
    const bool r = a >= offset && view[a - offset] != 1;
    if (!plan.dims.empty() && read.back() == r) {
      plan.dims.back() *= space[a];
    } else {
      plan.dims.push_back(space[a]);
      read.push_back(r);
    }
  }
  if (plan.dims.empty()) {
    plan.dims.push_back(1);
    read.push_back(false);
  }
  plan.strides.assign(plan.dims.size(), 0);
  int64_t stride = 1;
  for (int d = static_cast<int>(plan.dims.size()) - 1; d >= 0; --d) {
    if (!read[d]) continue;
    plan.strides[d] = stride;
    stride *= plan.dims[d];
  }
  return plan;
}

// One tile: `valid` elements from `offset` of the schedule's space (the iteration shape, or the
// reduced shape in a finalize schedule); compute steps run over `count` >= valid elements (the
// padded length of a ragged tile, whose operands and results are all slots or buffers then).
void RunSchedule(const Schedule& schedule, const Frame& frame, bool reduced_space,
                 int64_t offset, int64_t valid, int64_t count) {
  const PlanSet& plans = frame.plans;
  auto address = [&](const Loc& loc) -> char* {
    switch (loc.kind) {
      case Loc::Kind::kSlot:
        return frame.scratch + loc.index * plans.slot_bytes;
      case Loc::Kind::kInput:
        return const_cast<char*>(frame.io.inputs[loc.index]) + offset * loc.elem_size;
      case Loc::Kind::kOutput:
        return frame.io.outputs[loc.index] + offset * loc.elem_size;
      case Loc::Kind::kReduced:
        return frame.scratch + plans.reduced_offset + loc.index * plans.buffer_bytes;
      case Loc::Kind::kAccumulator:
        return frame.scratch + plans.accumulator_offset + loc.index * 2 * plans.buffer_bytes;
      case Loc::Kind::kKept: {
        const int64_t tile = frame.kept_tiles > 1
                                 ? offset % frame.run.reduce / plans.tile_size : 0;
        return frame.scratch + plans.kept_offset +
               (loc.index * frame.kept_tiles + tile) * plans.slot_bytes;
      }
      case Loc::Kind::kImmediate:
        break;
    }
    return nullptr;
  };
  const bool scalar_reduced = frame.lanes && !frame.rows && !reduced_space;
  std::chrono::steady_clock::time_point started;
  for (size_t pos = 0; pos < schedule.steps.size(); ++pos) {
    const Step& step = schedule.steps[pos];
    if (frame.profile != nullptr) started = std::chrono::steady_clock::now();
    if (!schedule.run_at.empty() && schedule.run_at[pos] >= 0) {
      const StripRun& run = schedule.runs[schedule.run_at[pos]];
      RunStrips(schedule, run, frame, address, scalar_reduced, offset, count);
      pos = run.end - 1;
      continue;
    }
    switch (step.kind) {
      case Step::Kind::kLoad:
        LoadTile(step.dtype, address(step.src[0]), address(step.dst), valid, count);
        break;
      case Step::Kind::kBroadcastLoad: {
        const int j = step.src[0].index;
        const BroadcastPlan& plan =
            reduced_space ? frame.run.reduced_plans[j] : frame.run.full_plans[j];
        BroadcastLoad(plan, step.dtype, frame.io.inputs[j], address(step.dst), offset, valid,
                      count);
        break;
      }
      case Step::Kind::kCompute: {
        const char* src[3] = {address(step.src[0]),
                              step.num_src > 1 ? address(step.src[1]) : nullptr,
                              step.num_src > 2 ? address(step.src[2]) : nullptr};
        RunCompute(step, src, address(step.dst), count, scalar_reduced);
        break;
      }
      case Step::Kind::kConvertStore:
        StoreTile(step.dtype, address(step.src[0]), address(step.dst), valid, step.stream);
        break;
      case Step::Kind::kCopyStore: {
        const char* src = address(step.src[0]);
        char* dst = address(step.dst);
        if (src != dst) Copy(src, dst, valid * DTypeSize(step.dtype), step.stream);
        break;
      }
      case Step::Kind::kAccumulate: {
        char* acc = address(step.dst);
        if (frame.rows) {
          AccumulateGroup(step, address(step.src[0]), acc, acc + plans.buffer_bytes,
                          valid / frame.run.reduce, frame.run.reduce, /*columns=*/false);
        } else if (frame.cols) {
          AccumulateGroup(step, address(step.src[0]), acc, acc + plans.buffer_bytes,
                          valid / frame.run.inner, frame.run.inner, /*columns=*/true);
        } else {
          Accumulate(step, address(step.src[0]), acc, acc + plans.buffer_bytes, valid,
                     frame.lanes);
        }
        break;
      }
      case Step::Kind::kExpandReduced:
        ExpandReduced(step.ctype, address(step.src[0]), address(step.dst),
                      frame.cols ? frame.run.inner : frame.run.reduce, valid, count, frame.cols);
        break;
      case Step::Kind::kFinalize: {
        const char* acc = address(step.src[0]);
        Finalize(step, acc, acc + plans.buffer_bytes, address(step.dst), valid, count,
                 frame.lanes && !frame.rows, frame.run.reduce);
        break;
      }
    }
    if (frame.profile != nullptr) {
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now() - started).count();
      frame.profile->AddStep(&step, [&step] { return StepLabel(step); }, ns, valid);
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

Interpreter::Interpreter(Program program) : program_(std::move(program)) {
  cost_per_element_ = ProgramCostPerElement(program_);
}

Interpreter::~Interpreter() = default;

const PlanSet& Interpreter::PlansFor(const std::vector<bool>& broadcast) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = plans_.find(broadcast);
  if (it != plans_.end()) return *it->second;

  auto set = std::make_unique<PlanSet>();
  set->broadcast = broadcast;
  const int n = static_cast<int>(program_.instructions.size());
  std::vector<int> reduced_index(n, -1), accumulator_index(n, -1);
  for (int i = 0; i < n; ++i) {
    const Instruction& inst = program_.instructions[i];
    if (inst.reduced) reduced_index[i] = set->num_reduced++;
    if (IsReduction(inst.op)) accumulator_index[i] = set->num_accumulators++;
  }
  const std::vector<bool> early = EarlyOutputs(program_);
  set->has_final = !program_.has_reductions();
  for (int k = 0; k < static_cast<int>(program_.outputs.size()); ++k) {
    if (!program_.OutputReduced(k) && !early[k]) set->has_final = true;
  }
  const KeptValues kept = program_.has_reductions()
                              ? PlanKeptValues(program_, early, set->has_final)
                              : KeptValues();
  set->num_kept = kept.count;
  auto build = [&](Access access, Pass pass) {
    return Planner(program_, broadcast, access, pass, reduced_index, accumulator_index, early,
                   &kept)
        .Build();
  };
  auto full_pass = [&](Pass pass) {
    PassSchedules s;
    s.direct = build({/*direct_inputs=*/true, /*direct_outputs=*/true, /*stream=*/false}, pass);
    s.streaming = build({/*direct_inputs=*/true, /*direct_outputs=*/false, /*stream=*/true}, pass);
    s.staged = build({/*direct_inputs=*/false, /*direct_outputs=*/false, /*stream=*/false}, pass);
    // Full tiles only: a ragged tile's staged schedule runs step by step. Accumulations join
    // a run in the passes of one row or inner chunk per item (not in row or column groups).
    if (strip_fusion_enabled.load(std::memory_order_relaxed)) {
      const bool accumulate = pass.kind == Pass::Kind::kAccumulate && !pass.rows;
      FuseStrips(&s.direct, accumulate);
      FuseStrips(&s.streaming, accumulate);
    }
    return s;
  };
  const Access staged = {false, false, false};
  if (set->has_final) set->final = full_pass({Pass::Kind::kFinal, 0});
  if (program_.has_reductions()) {
    if (set->has_final) {
      set->rows_final = full_pass({Pass::Kind::kFinal, 0, /*rows=*/true, /*keep=*/true});
      set->cols_final = full_pass({Pass::Kind::kFinal, 0, /*rows=*/true});
      if (set->num_kept > 0) {
        set->kept_row_final =
            full_pass({Pass::Kind::kFinal, 0, /*rows=*/false, /*keep=*/true});
      }
    }
    for (int p = 1; p <= program_.num_levels; ++p) {
      set->accumulate.push_back(full_pass({Pass::Kind::kAccumulate, p}));
      set->rows_accumulate.push_back(
          full_pass({Pass::Kind::kAccumulate, p, /*rows=*/true, /*keep=*/true}));
      set->cols_accumulate.push_back(full_pass({Pass::Kind::kAccumulate, p, /*rows=*/true}));
      if (set->num_kept > 0) {
        set->kept_row_accumulate.push_back(
            full_pass({Pass::Kind::kAccumulate, p, /*rows=*/false, /*keep=*/true}));
      }
    }
    for (int p = 0; p <= program_.num_levels; ++p) {
      set->finalize.push_back(build(staged, {Pass::Kind::kFinalize, p}));
    }
  }

  std::vector<const Schedule*> schedules;
  auto add = [&](const PassSchedules& s) {
    schedules.insert(schedules.end(), {&s.direct, &s.streaming, &s.staged});
  };
  if (set->has_final) add(set->final);
  if (set->has_final && program_.has_reductions()) {
    add(set->rows_final);
    add(set->cols_final);
    if (set->num_kept > 0) add(set->kept_row_final);
  }
  for (const PassSchedules& s : set->accumulate) add(s);
  for (const PassSchedules& s : set->rows_accumulate) add(s);
  for (const PassSchedules& s : set->kept_row_accumulate) add(s);
  for (const PassSchedules& s : set->cols_accumulate) add(s);
  for (const Schedule& s : set->finalize) schedules.push_back(&s);

  int widest = 4;
  for (const Instruction& inst : program_.instructions) {
    widest = std::max({widest, ComputeSize(ComputeTypeOf(inst.dtype)),
                       ComputeSize(ComputeTypeOf(inst.operand_dtype))});
  }
  int64_t io_bytes = 0;  // per element, of every tensor a tile streams through
  for (const InputDecl& in : program_.inputs) {
    widest = std::max(widest, ComputeSize(ComputeTypeOf(in.dtype)));
    io_bytes += DTypeSize(in.dtype);
  }
  set->output_bytes = 0;
  for (int k = 0; k < static_cast<int>(program_.outputs.size()); ++k) {
    if (!program_.OutputReduced(k)) set->output_bytes += DTypeSize(program_.OutputDType(k));
  }
  io_bytes += set->output_bytes;
  // The largest power-of-two tile whose slots and tensor streams fit the L1 budget.
  int most_slots = 1;
  int full_slots = 1;
  for (const Schedule* s : schedules) most_slots = std::max(most_slots, s->num_slots);
  if (set->has_final) {
    full_slots = std::max({full_slots, set->final.direct.num_slots,
                           set->final.streaming.num_slots});
  }
  for (const PassSchedules& s : set->accumulate) {
    full_slots = std::max(full_slots, s.direct.num_slots);
  }
  int64_t tile = kMaxTile;
  while (tile > kMinTile && tile * (widest * full_slots + io_bytes) > kTileBudgetBytes) tile /= 2;
  set->tile_size = tile;
  set->slot_bytes = tile * widest;
  set->buffer_bytes = tile * 8;
  set->reduced_offset = most_slots * set->slot_bytes;
  set->accumulator_offset = set->reduced_offset + set->num_reduced * set->buffer_bytes;
  set->kept_offset = set->accumulator_offset + set->num_accumulators * 2 * set->buffer_bytes;
  set->scratch_bytes = set->kept_offset + set->num_kept * set->slot_bytes;

  // An output may take over an input's buffer when the pass storing it reads that input's
  // elements no later than it writes them and no later pass of an item reads the input (items
  // cover disjoint elements).
  const std::vector<const PassSchedules*> finals = {&set->final, &set->rows_final,
                                                    &set->cols_final, &set->kept_row_final};
  std::vector<const PassSchedules*> firsts, lasts;  // the first accumulate pass, those after it
  for (const auto* family : {&set->accumulate, &set->rows_accumulate, &set->cols_accumulate,
                             &set->kept_row_accumulate}) {
    for (size_t p = 0; p < family->size(); ++p) {
      (p == 0 ? firsts : lasts).push_back(&(*family)[p]);
    }
  }
  if (set->has_final) lasts.insert(lasts.end(), finals.begin(), finals.end());
  set->forwardable.resize(program_.outputs.size());
  for (int k = 0; k < static_cast<int>(program_.outputs.size()); ++k) {
    if (program_.OutputReduced(k)) continue;
    const DType out_dtype = program_.OutputDType(k);
    for (size_t j = 0; j < program_.inputs.size(); ++j) {
      if (program_.inputs[j].dtype != out_dtype || broadcast[j] || program_.inputs[j].reduced) {
        continue;
      }
      bool safe = true;
      for (const PassSchedules* pass : early[k] ? firsts : finals) {
        for (const Schedule* s : {&pass->direct, &pass->streaming, &pass->staged}) {
          if (s->empty()) continue;
          if (s->last_input_read[j] > s->first_output_write[k]) safe = false;
        }
      }
      if (early[k]) {
        for (const PassSchedules* pass : lasts) {
          for (const Schedule* s : {&pass->direct, &pass->streaming, &pass->staged}) {
            if (!s->empty() && s->last_input_read[j] >= 0) safe = false;
          }
        }
      }
      if (safe) set->forwardable[k].push_back(static_cast<int>(j));
    }
  }
  const PlanSet& result = *set;
  plans_.emplace(broadcast, std::move(set));
  return result;
}

absl::Status Interpreter::Prepare(const std::vector<std::vector<int64_t>>& input_shapes,
                                  RunShape* run) const {
  const int num_inputs = static_cast<int>(program_.inputs.size());
  std::vector<std::vector<int64_t>> views(num_inputs);
  for (int j = 0; j < num_inputs; ++j) {
    const InputDecl& decl = program_.inputs[j];
    const std::vector<int64_t>& shape = input_shapes[j];
    if (!decl.has_view) {
      views[j] = shape;
      continue;
    }
    const int64_t count = Product(shape);
    std::vector<int64_t> view = decl.view.dims;
    int unknown = -1;
    int64_t known = 1;
    for (size_t d = 0; d < view.size(); ++d) {
      if (view[d] < 0) {
        unknown = static_cast<int>(d);
      } else {
        known *= view[d];
      }
    }
    bool fits = true;
    if (unknown >= 0) {
      if (known == 0) {
        fits = count == 0;
        view[unknown] = 1;
      } else {
        fits = count % known == 0;
        view[unknown] = count / std::max<int64_t>(known, 1);
      }
    } else {
      fits = known == count;
    }
    if (!fits) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input ", j, " has shape ", DimsString(shape), " (", count,
          " elements), which cannot be read as the view of in", j, ": ", DeclString(decl)));
    }
    views[j] = std::move(view);
  }

  // The iteration shape: the numpy broadcast of the views.
  size_t rank = 0;
  for (const auto& v : views) rank = std::max(rank, v.size());
  std::vector<int64_t> iteration(rank, 1);
  std::vector<int> set_by(rank, -1);
  for (int j = 0; j < num_inputs; ++j) {
    const size_t offset = rank - views[j].size();
    for (size_t d = 0; d < views[j].size(); ++d) {
      const int64_t v = views[j][d];
      const size_t a = offset + d;
      if (v == 1) continue;
      if (set_by[a] < 0 || iteration[a] == v) {
        iteration[a] = v;
        set_by[a] = j;
        continue;
      }
      const int i = set_by[a];
      auto describe = [&](int k) {
        std::string text = absl::StrCat("input ", k, " of shape ", DimsString(input_shapes[k]));
        if (program_.inputs[k].has_view) absl::StrAppend(&text, " read as ", DimsString(views[k]));
        return text;
      };
      return absl::InvalidArgumentError(absl::StrCat(
          "the inputs do not broadcast: ", describe(i), " and ", describe(j),
          " differ in dimension ", static_cast<int64_t>(a) - static_cast<int64_t>(rank), " (",
          iteration[a], " vs ", v, ")"));
    }
  }
  run->iteration = iteration;
  run->num_elements = Product(iteration);
  run->outer = run->reduce = run->inner = 1;
  run->reduced.clear();
  if (program_.has_reductions()) {
    const size_t first = program_.axes.front(), last = program_.axes.back();
    run->outer = Product(iteration, 0, first);
    run->reduce = Product(iteration, first, last + 1);
    run->inner = Product(iteration, last + 1);
    run->reduced = iteration;
    for (int a : program_.axes) run->reduced[a] = 1;
  }
  run->broadcast.assign(num_inputs, false);
  run->full_plans.assign(num_inputs, BroadcastPlan());
  run->reduced_plans.assign(num_inputs, BroadcastPlan());
  for (int j = 0; j < num_inputs; ++j) {
    run->broadcast[j] = Product(views[j]) != run->num_elements;
    if (run->broadcast[j]) run->full_plans[j] = MakeBroadcastPlan(iteration, views[j]);
    if (program_.inputs[j].reduced) {
      run->reduced_plans[j] = MakeBroadcastPlan(run->reduced, views[j]);
    }
  }

  run->outputs.assign(program_.outputs.size(), {});
  for (int k = 0; k < static_cast<int>(program_.outputs.size()); ++k) {
    const Output& out = program_.outputs[k];
    const std::vector<int64_t>& shape = program_.OutputReduced(k) ? run->reduced : iteration;
    if (!out.has_view) {
      run->outputs[k] = shape;
      continue;
    }
    const int64_t count = Product(shape);
    std::vector<int64_t> view = out.view.dims;
    int64_t known = 1;
    int unknown = -1;
    for (size_t d = 0; d < view.size(); ++d) {
      if (view[d] < 0) {
        unknown = static_cast<int>(d);
      } else {
        known *= view[d];
      }
    }
    bool fits = unknown >= 0 ? (known == 0 ? count == 0 : count % known == 0) : known == count;
    if (unknown >= 0) view[unknown] = known == 0 ? 1 : count / known;
    if (!fits) {
      return absl::InvalidArgumentError(absl::StrCat(
          "program line ", out.line, ": out", k, " -> ", ShapeString(out.view),
          " does not fit the ", count, " elements of its value's shape ", DimsString(shape),
          " (iteration shape ", DimsString(iteration), ")"));
    }
    run->outputs[k] = std::move(view);
  }
  run->plans = &PlansFor(run->broadcast);
  SplitRun(run);
  return absl::OkStatus();
}

const std::vector<int>& Interpreter::ForwardableInputs(const RunShape& run, int k) const {
  return run.plans->forwardable[k];
}

namespace {
// Rows per item in row-group mode; 1 otherwise.
int64_t RowsPerItem(const RunShape& run, int64_t tile) {
  if (run.inner != 1 || run.reduce == 0 || run.reduce * kRowsPerTileMin > tile) return 1;
  return tile / run.reduce;
}
// Kept-row mode (row reductions of one row per item whose kept values fit kKeptRowBytes): the
// tiles of a row; 0 when the mode does not apply.
int64_t KeptRowTiles(const RunShape& run, const PlanSet& plans) {
  if (plans.num_kept == 0 || run.inner != 1 || run.reduce == 0) return 0;
  const int64_t tiles = (run.reduce + plans.tile_size - 1) / plans.tile_size;
  if (tiles * plans.num_kept * plans.slot_bytes > kKeptRowBytes) return 0;
  return tiles;
}
// Inner blocks per tile in column-group mode (short inner dimensions); 1 otherwise.
int64_t BlocksPerTile(const RunShape& run, int64_t tile) {
  if (run.inner == 1 || run.inner * kRowsPerTileMin > tile) return 1;
  return tile / run.inner;
}

// Work items of a reduction that is not split: one per outer index and inner chunk, or per
// group of rows.
int64_t ReductionItems(const RunShape& run, int64_t tile) {
  const int64_t group = RowsPerItem(run, tile);
  if (group > 1) return (run.outer + group - 1) / group;
  const int64_t chunks = run.inner == 1 ? 1 : (run.inner + tile - 1) / tile;
  return run.outer * chunks;
}

// Elements of one buffer of a reduced value or accumulator that a split run shares between its
// phases: a row reduction's lanes, or an item's inner chunk (padded).
int64_t SplitUnit(const RunShape& run, int64_t tile) {
  return (std::min(tile, run.inner) + kPad - 1) / kPad * kPad;
}
}  // namespace

// Split runs. A reduction with fewer work items than kSplitItems would leave threads idle:
// BatchNorm's statistics over N*H*W rows of C <= 4096 channels are ONE item (one outer index,
// one inner chunk), so the kernel and every elementwise op fused into it ran on one thread. Its R
// is then cut into blocks, each pass of each block a work item of its own, the blocks' partial
// accumulators folded in block order before each finalize. The number of blocks depends on the
// shapes and the program alone (up to kSplitItems items in all, each block at least kSplitCost
// of the program's cost units over all its passes), so a result is the same bits for any thread
// count, as for runs that are not split. The cost bound keeps out runs whose split would cost
// more in waking threads and in the barriers between phases than it saves, and plain one-pass
// sums of a few MiB, which one core's loads already keep at the memory's speed. Blocks start
// where the tiles of the run would: at whole tiles of a row (row reductions, whose lanes are
// positions mod kLanes) or whole tiles of inner blocks (column groups). Not split: row groups
// (short rows, already many per item), kept rows (values kept between passes of one item), and
// products: partial products of blocks may overflow and underflow where the running product does
// not (inf * 0 = NaN where the product of the row is inf).
constexpr int64_t kSplitItems = 8;
constexpr int64_t kSplitCost = int64_t{1} << 24;
std::atomic<bool> split_reductions_enabled{true};  // AUTOFUSE_DFX_FLAGS=--split_reductions=false

void Interpreter::SplitRun(RunShape* run) const {
  run->split = 1;
  run->split_rows = 0;
  const int64_t tile = run->plans->tile_size;
  if (!split_reductions_enabled.load(std::memory_order_relaxed) ||
      !program_.has_reductions() || run->reduce < 2 || RowsPerItem(*run, tile) > 1 ||
      KeptRowTiles(*run, *run->plans) > 0) {
    return;
  }
  for (const Instruction& inst : program_.instructions) {
    if (inst.op == OpCode::kProd) return;
  }
  const int64_t items = ReductionItems(*run, tile);
  if (items == 0 || items >= kSplitItems) return;
  const int64_t blocks = BlocksPerTile(*run, tile);
  const int64_t step = run->inner == 1 ? tile : blocks;  // r per tile
  const int64_t per_r = run->inner == 1 ? 1 : std::min(tile, run->inner);
  const int64_t work = run->reduce * per_r * cost_per_element_ * (program_.num_levels + 1);
  const int64_t by_size = work / kSplitCost;
  const int64_t want = std::min((kSplitItems + items - 1) / items, by_size);
  if (want < 2) return;
  const int64_t tiles = (run->reduce + step - 1) / step;
  const int64_t rows = (tiles + want - 1) / want * step;
  const int64_t split = (run->reduce + rows - 1) / rows;
  if (split < 2) return;
  run->split = split;
  run->split_rows = rows;
}

std::vector<Phase> Interpreter::Phases(const RunShape& run) const {
  if (run.split == 1) return {Phase{}};
  std::vector<Phase> phases;
  if (!run.plans->finalize[0].empty()) phases.push_back({Phase::Kind::kFinalize, 0});
  for (int p = 1; p <= program_.num_levels; ++p) {
    phases.push_back({Phase::Kind::kAccumulate, p});
    phases.push_back({Phase::Kind::kFinalize, p});
  }
  if (run.plans->has_final) phases.push_back({Phase::Kind::kFinal, 0});
  return phases;
}

int64_t Interpreter::SharedBytes(const RunShape& run) const {
  if (run.split == 1) return 0;
  const PlanSet& plans = *run.plans;
  const int64_t items = ReductionItems(run, plans.tile_size);
  const int64_t buffer = SplitUnit(run, plans.tile_size) * sizeof(double);
  return items * (plans.num_reduced + run.split * plans.num_accumulators * 2) * buffer;
}

int64_t Interpreter::NumItems(const RunShape& run, Phase phase) const {
  const int64_t tile = run.plans->tile_size;
  if (!program_.has_reductions()) return (run.num_elements + tile - 1) / tile;
  const int64_t items = ReductionItems(run, tile);
  return phase.kind == Phase::Kind::kAll || phase.kind == Phase::Kind::kFinalize
             ? items
             : items * run.split;
}

int64_t Interpreter::TotalCost(const RunShape& run, Phase phase) const {
  const int64_t elements = std::max<int64_t>(run.num_elements, 1);
  switch (phase.kind) {
    case Phase::Kind::kAll:
      return elements * cost_per_element_ * (program_.num_levels + 1);
    case Phase::Kind::kFinalize:  // the partials of every block, then a reduced-space pass
      return (Product(run.reduced) * (run.split + 1) + 1) * cost_per_element_;
    default:
      return elements * cost_per_element_;
  }
}

int64_t Interpreter::CostPerItem(const RunShape& run, Phase phase) const {
  return TotalCost(run, phase) / std::max<int64_t>(NumItems(run, phase), 1) + 1;
}

// Per input, for this thread's call: a broadcast input that repeats one row over the rest (a
// bias: plan [rows, L], strides [0, 1], L <= kMaxTile), in fp32, repeated to at least
// tile + L values; null for the others (and for every input where there is none). A tile's
// values are then the `count` values from offset % L, which strip runs read in place. Built
// once a call (fewer than tile + 2 L floats an input, 12 K at most), read by every tile.
const float* const* RepeatedRows(const RunShape& run, const IoBuffers& io, int64_t tile,
                                 const std::vector<InputDecl>& inputs) {
  thread_local std::vector<std::vector<float>> buffers;
  thread_local std::vector<const float*> repeated;
  const size_t n = run.full_plans.size();
  repeated.assign(n, nullptr);
  if (buffers.size() < n) buffers.resize(n);
  bool any = false;
  for (size_t j = 0; j < n && j < inputs.size(); ++j) {
    const BroadcastPlan& plan = run.full_plans[j];
    const DType dtype = inputs[j].dtype;
    if (!run.broadcast[j] || plan.dims.size() != 2 || plan.strides[0] != 0 ||
        plan.strides[1] != 1 || plan.dims[0] < 2 || plan.dims[1] > kMaxTile ||
        ComputeTypeOf(dtype) != ComputeType::kF32) {
      continue;
    }
    const int64_t row = plan.dims[1];
    const int64_t reps = (tile + 2 * row - 1) / row;  // reps * row >= tile + row
    std::vector<float>& buffer = buffers[j];
    if (static_cast<int64_t>(buffer.size()) < reps * row) buffer.resize(reps * row);
    char* data = reinterpret_cast<char*>(buffer.data());
    ConvertRun(dtype, io.inputs[j], data, row);
    RepeatByDoubling(data, row * sizeof(float), reps);
    repeated[j] = buffer.data();
    any = true;
  }
  return any ? repeated.data() : nullptr;
}

void Interpreter::RunItems(const RunShape& run, const IoBuffers& io, int64_t first, int64_t last,
                           Phase phase) const {
  const PlanSet& plans = *run.plans;
  const bool stream = run.num_elements * plans.output_bytes >= kStreamBytes;
  const int64_t tile = plans.tile_size;
  const int64_t group = program_.has_reductions() ? RowsPerItem(run, tile) : 1;
  const int64_t blocks = program_.has_reductions() ? BlocksPerTile(run, tile) : 1;
  const int64_t row_tiles = KeptRowTiles(run, plans);
  const int64_t kept_tiles = group > 1 ? 1 : row_tiles;
  char* scratch = ThreadScratch(
      plans.scratch_bytes + (kept_tiles > 1 ? (kept_tiles - 1) * plans.num_kept * plans.slot_bytes
                                            : 0));
  const Frame frame{run, io, plans, scratch, /*lanes=*/run.inner == 1, /*rows=*/group > 1,
                    /*cols=*/blocks > 1, profile_, kept_tiles,
                    /*prefetch=*/run.num_elements >= kPrefetchElements,
                    RepeatedRows(run, io, tile, program_.inputs)};
  const bool kept_rows = group == 1 && row_tiles > 0;
  auto full_tile = [&](const PassSchedules& s, bool streaming, int64_t offset, int64_t valid) {
    if (valid % kPad == 0) {
      RunSchedule(streaming ? s.streaming : s.direct, frame, false, offset, valid, valid);
    } else {
      RunSchedule(s.staged, frame, false, offset, valid, (valid + kPad - 1) / kPad * kPad);
    }
  };

  if (!program_.has_reductions()) {
    for (int64_t t = first; t < last; ++t) {
      const int64_t offset = t * tile;
      full_tile(plans.final, stream, offset, std::min(tile, run.num_elements - offset));
    }
  } else {
    const int64_t inner = run.inner, reduce = run.reduce;
    const int64_t chunks = inner == 1 ? 1 : (inner + tile - 1) / tile;
    const int64_t accumulated = frame.lanes && !frame.rows ? kLanes : 0;  // else reduced_count
    // A split run's shared memory: per item its reduced buffers, then per item and block its
    // accumulators (each with its compensation), every buffer `unit` elements of 8 bytes.
    const int64_t unit_bytes = SplitUnit(run, tile) * int64_t{sizeof(double)};
    const int64_t items = ReductionItems(run, tile);
    auto shared_reduced = [&](int64_t item, int index) {
      return io.shared + (item * plans.num_reduced + index) * unit_bytes;
    };
    auto shared_partial = [&](int64_t item, int64_t b, int index) {
      return io.shared + items * plans.num_reduced * unit_bytes +
             ((item * run.split + b) * plans.num_accumulators + index) * 2 * unit_bytes;
    };
    auto accumulator = [&](const Step& finalize) {
      return scratch + plans.accumulator_offset + finalize.src[0].index * 2 * plans.buffer_bytes;
    };
    for (int64_t task = first; task < last; ++task) {
      const bool blocked =
          phase.kind == Phase::Kind::kAccumulate || phase.kind == Phase::Kind::kFinal;
      const int64_t item = blocked ? task / run.split : task;
      const int64_t b = blocked ? task % run.split : 0;
      // The r of this task: a block of a split run, all of R otherwise.
      const int64_t r_begin = blocked ? b * run.split_rows : 0;
      const int64_t r_end = blocked ? std::min(reduce, r_begin + run.split_rows) : reduce;
      const int64_t o = frame.rows ? item * group : item / chunks;
      const int64_t i0 = frame.rows ? 0 : (item % chunks) * tile;
      // Reduced elements of this item: an inner chunk, or (row-group mode) rows.
      const int64_t width =
          frame.rows ? std::min(group, run.outer - o) : std::min(tile, inner - i0);
      const int64_t reduced_offset = o * inner + i0;
      const int64_t reduced_count = (width + kPad - 1) / kPad * kPad;
      const int64_t count = accumulated > 0 ? accumulated : reduced_count;
      // Every full tile of this item from r_begin to r_end, in order.
      auto for_tiles = [&](const PassSchedules& s, bool streaming) {
        if (frame.rows) {
          full_tile(s, streaming, o * reduce, width * reduce);
        } else if (frame.cols) {
          for (int64_t r0 = r_begin; r0 < r_end; r0 += blocks) {
            full_tile(s, streaming, (o * reduce + r0) * inner,
                      std::min(blocks, r_end - r0) * inner);
          }
        } else if (frame.lanes) {
          for (int64_t r0 = r_begin; r0 < r_end; r0 += tile) {
            full_tile(s, streaming, o * reduce + r0, std::min(tile, r_end - r0));
          }
        } else {
          for (int64_t r = r_begin; r < r_end; ++r) {
            full_tile(s, streaming, (o * reduce + r) * inner + i0, width);
          }
        }
      };
      auto finalize = [&](int level) {
        const Schedule& s = plans.finalize[level];
        if (!s.empty()) RunSchedule(s, frame, true, reduced_offset, width, reduced_count);
      };
      auto init_accumulators = [&](int level) {
        for (const Step& step : plans.finalize[level].steps) {
          if (step.kind != Step::Kind::kFinalize) continue;
          char* acc = accumulator(step);
          InitAccumulator(step, acc, acc + plans.buffer_bytes, count);
        }
      };
      auto accumulate = [&](int level) {
        for_tiles(frame.rows   ? plans.rows_accumulate[level - 1]
                  : frame.cols ? plans.cols_accumulate[level - 1]
                  : kept_rows  ? plans.kept_row_accumulate[level - 1]
                               : plans.accumulate[level - 1],
                  false);
      };
      auto final_pass = [&] {
        for_tiles(frame.rows   ? plans.rows_final
                  : frame.cols ? plans.cols_final
                  : kept_rows  ? plans.kept_row_final
                               : plans.final,
                  stream);
      };
      // Reduced buffers between the thread's scratch and the split run's shared memory.
      auto reduced_buffers = [&](bool load) {
        const int64_t bytes = reduced_count * int64_t{sizeof(double)};
        for (int k = 0; k < plans.num_reduced; ++k) {
          char* mine = scratch + plans.reduced_offset + k * plans.buffer_bytes;
          if (load) {
            std::memcpy(mine, shared_reduced(item, k), bytes);
          } else {
            std::memcpy(shared_reduced(item, k), mine, bytes);
          }
        }
      };

      switch (phase.kind) {
        case Phase::Kind::kAll:
          finalize(0);
          for (int p = 1; p <= program_.num_levels; ++p) {
            init_accumulators(p);
            accumulate(p);
            finalize(p);
          }
          if (plans.has_final) final_pass();
          break;
        case Phase::Kind::kAccumulate: {
          if (phase.level > 1 || !plans.finalize[0].empty()) reduced_buffers(/*load=*/true);
          init_accumulators(phase.level);
          accumulate(phase.level);
          const int64_t bytes = count * int64_t{sizeof(double)};
          for (const Step& step : plans.finalize[phase.level].steps) {
            if (step.kind != Step::Kind::kFinalize) continue;
            char* part = shared_partial(item, b, step.src[0].index);
            std::memcpy(part, accumulator(step), bytes);
            std::memcpy(part + unit_bytes, accumulator(step) + plans.buffer_bytes, bytes);
          }
          break;
        }
        case Phase::Kind::kFinalize: {
          if (phase.level > 1 || (phase.level == 1 && !plans.finalize[0].empty())) {
            reduced_buffers(/*load=*/true);
          }
          const int64_t bytes = count * int64_t{sizeof(double)};
          for (const Step& step : plans.finalize[phase.level].steps) {
            if (step.kind != Step::Kind::kFinalize) continue;
            char* acc = accumulator(step);
            const char* part = shared_partial(item, 0, step.src[0].index);
            std::memcpy(acc, part, bytes);
            std::memcpy(acc + plans.buffer_bytes, part + unit_bytes, bytes);
            for (int64_t k = 1; k < run.split; ++k) {
              part = shared_partial(item, k, step.src[0].index);
              CombinePartial(step, part, part + unit_bytes, acc, acc + plans.buffer_bytes, count);
            }
          }
          finalize(phase.level);
          reduced_buffers(/*load=*/false);
          break;
        }
        case Phase::Kind::kFinal:
          reduced_buffers(/*load=*/true);
          final_pass();
          break;
      }
    }
  }
#ifdef TF_AUTOFUSE_X86_CONVERT
  if (stream) _mm_sfence();  // non-temporal stores are visible before the caller moves on
#endif
}

void Interpreter::RunAll(const RunShape& run, const IoBuffers& io) const {
  for (const Phase& phase : Phases(run)) {
    const int64_t items = NumItems(run, phase);
    if (items > 0) RunItems(run, io, 0, items, phase);
  }
}

}  // namespace tf_autofuse

// C entry point for tf_autofuse/_native.py (ctypes): AUTOFUSE_DFX_FLAGS=--strip_fusion=false
// turns strip fusion off for the kernels planned afterwards (for measuring what it brings).
extern "C" __attribute__((visibility("default"))) void autofuse_set_strip_fusion(int on) {
  tf_autofuse::strip_fusion_enabled.store(on != 0);
}

// AUTOFUSE_DFX_FLAGS=--split_reductions=false turns split runs off for the runs prepared
// afterwards (for measuring what they bring).
extern "C" __attribute__((visibility("default"))) void autofuse_set_split_reductions(int on) {
  tf_autofuse::split_reductions_enabled.store(on != 0);
}
