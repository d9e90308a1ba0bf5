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
//                    over R, accumulated into per-reduction accumulators; then
//       finalize p   the level-p reductions' results, the reduced instructions of level p, and
//                    the stores of reduced outputs;
//       final pass   the full values the full outputs need, reading reduced values broadcast.
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

#include "interpreter.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <type_traits>

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define TF_AUTOFUSE_X86_CONVERT 1
#endif

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "Eigen/Core"
#include "unsupported/Eigen/SpecialFunctions"
#include "tf_compat.h"

namespace tf_autofuse {

// ---------------------------------------------------------------------------------------------
// Schedule: what runs on every tile.

namespace {

// The type values are computed in: 16-bit floats are computed in fp32; bool is a byte, 0 or 1.
// kI64 is only an accumulator type (i32 Mean).
enum class ComputeType : uint8_t { kF32, kF64, kI32, kBool, kI64 };

ComputeType ComputeTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return ComputeType::kF64;
    case DType::kI32:
      return ComputeType::kI32;
    case DType::kBool:
      return ComputeType::kBool;
    default:
      return ComputeType::kF32;
  }
}

int ComputeSize(ComputeType type) {
  switch (type) {
    case ComputeType::kF64:
    case ComputeType::kI64:
      return 8;
    case ComputeType::kBool:
      return 1;
    default:
      return 4;
  }
}

// Values of these dtypes are stored as they are computed, so tensors can be used in place.
bool IsComputedAsStored(DType dtype) { return dtype != DType::kF16 && dtype != DType::kBF16; }

// Slots and tiles are padded to this many elements: a whole number of SIMD packets, and a slot
// is a multiple of 64 bytes.
constexpr int64_t kPad = 16;
// Lanes of a scalar accumulator (a reduction over a row): lane = r mod kLanes.
constexpr int64_t kLanes = 16;
// Row reductions (inner == 1) of rows up to a quarter tile run in row-group mode: a tile holds
// whole rows, each reduced on its own (per-tile overheads would dominate one row per tile).
constexpr int64_t kRowsPerTileMin = 4;

// L1 space a tile may take, slots and tensor streams together: three quarters of a 32 KiB L1d.
constexpr int64_t kTileBudgetBytes = 24 * 1024;
constexpr int64_t kMinTile = 1024;
constexpr int64_t kMaxTile = 4096;

// From this many bytes of output per run, outputs are written with non-temporal stores: they
// would not stay in the caches anyway (2 cores share a 32 MiB L3 here), and skipping the read of
// each destination line saves a third of the memory traffic. Below it, the next kernel finds
// the output in cache.
constexpr int64_t kStreamBytes = 16 << 20;
// Runs of at least this many elements prefetch their tensor inputs kPrefetchAhead bytes ahead of
// the strip they are at (software prefetch to L1): the hardware's own prefetcher keeps too few
// lines in flight for one core to reach the memory bandwidth it shares. Alternated with and
// without it in one process: abs->relu->exp [4096,4096] f32 11-12 % less time, abs+bias->relu
// 10-12 %, abs->reduce_sum 12 %, LayerNorm [16384,768] 8 %, the f16 chain 3.5 %, softmax
// level; 4 KiB ahead did better than 1, 2, 3, 6, 8, 16 or 32 KiB, than also prefetching to L2
// a page further, or than prefetching to L2 only. Below kPrefetchElements the inputs are likely
// in cache and the prefetches would be wasted work.
constexpr int64_t kPrefetchElements = int64_t{1} << 20;
constexpr int64_t kPrefetchAhead = 4096;
constexpr int kMaxPrefetchStreams = 8;
// Row reductions over rows longer than a row group (one row per item, tile after tile) keep the
// full values several passes need, a row's worth each, when they all fit in this much scratch:
// read back from L2, where recomputing them would cost an exp per element again (softmax over
// rows of 4096).
constexpr int64_t kKeptRowBytes = 256 * 1024;

// The accumulator type of a reduction of `dtype` values. An i32 Mean sums in int64, as
// TensorFlow's does (its Sum wraps, its Mean does not).
ComputeType AccumulatorType(OpCode op, DType dtype) {
  if (dtype == DType::kI32) return op == OpCode::kMean ? ComputeType::kI64 : ComputeType::kI32;
  if (op == OpCode::kMax || op == OpCode::kMin) return ComputeTypeOf(dtype);
  return dtype == DType::kF16 || dtype == DType::kBF16 ? ComputeType::kF32 : ComputeType::kF64;
}

}  // namespace

// Where an operand or result lives within the current tile.
struct Loc {
  enum class Kind : uint8_t {
    kSlot, kInput, kOutput, kImmediate,
    kReduced,      // a reduced value's buffer: one element per inner index of the item, or a
                   // scalar when inner == 1 (read as an immediate by full instructions then)
    kAccumulator,  // a reduction's accumulator
    kKept,         // row-group mode: a full value kept from the pass that computed it for the
                   // later passes of the same rows (a slot-sized buffer of its own)
  };
  Kind kind = Kind::kSlot;
  int index = 0;       // slot (virtual register while planning), input, output, buffer number
  int elem_size = 0;   // bytes per element of the input/output tensor
  union {
    float f32;
    double f64;
    int32_t i32;
    uint8_t b;
  } imm{};             // kImmediate, already in the compute type

  bool is(Kind k) const { return kind == k; }
};

struct Step {
  enum class Kind : uint8_t {
    kLoad,          // input tensor -> slot (widening f16/bf16; zero padding in a ragged tile)
    kBroadcastLoad, // stretched input -> slot, through the run's BroadcastPlan of the space
    kCompute,       // one instruction over the tile
    kConvertStore,  // slot / reduced buffer -> output tensor (rounding to f16/bf16)
    kCopyStore,     // tensor -> output tensor, same dtype (an output of an input or of a value
                    // that another output already holds)
    kAccumulate,    // slot or tensor -> accumulator of a reduction
    kFinalize,      // accumulator -> the reduction's reduced buffer
    kExpandReduced, // reduced buffer (one value per row) -> slot, each value repeated over its
                    // row (row-group mode)
  };
  Kind kind = Kind::kCompute;
  OpCode op = OpCode::kAbs;
  ComputeType ctype = ComputeType::kF32;  // of the slot a load fills / a store reads / a result
  ComputeType src_ctype = ComputeType::kF32;  // of the operands (Select: of x and y)
  ComputeType acc_ctype = ComputeType::kF32;  // kAccumulate, kFinalize
  DType dtype = DType::kF32;              // of the tensor a load reads / a store writes; Cast: to
  bool stream = false;                    // a store with non-temporal writes
  int num_src = 0;
  Loc src[3];
  Loc dst;
  Loc attr;                               // LeakyRelu: alpha in the compute type
};

// Strip fusion. A run of consecutive steps of a full-tile schedule that are all fp32 and
// elementwise (loads widening f16/bf16/f32 inputs, broadcast loads, instructions StripFusable
// accepts, stores narrowing to an output, and in accumulation passes of one row or inner chunk
// per item the accumulations) executes as one loop over strips of kStrip elements: every step of
// the run covers one strip before the next strip starts, its values held in strip buffers
// (1 KiB each, on the stack, never leaving L1) instead of tile-sized slots. Every element is
// computed by the same packet functions as when each step covers the whole tile (which the
// staged schedule of a ragged tile still does), so results are bit-identical either way
// (tests/test_kernel.py, strip tests).
//
// Why it pays: each strip's loads and stores are interleaved with its arithmetic, so memory and
// the vector units are busy at once, where whole-tile steps alternate between a memory-bound
// load or store and compute-bound arithmetic. abs->relu->exp over 16M elements, 2 threads, a
// standalone loop on this Sapphire Rapids VM: f32 4.75 -> 3.1 ms, f16 3.75 -> 3.0 ms with
// 256-element strips (the best of 64..512 elements); the kernel, benchmarks/run.py with and
// without --strip_fusion=false: the chain f32 4.51 -> 3.16 ms, f16 3.13 -> 2.66, GELU 9.54 ->
// 7.40, swish(x + bias) 6.24 -> 4.99 (README, strip fusion).
constexpr int64_t kStrip = 256;
static_assert(kStrip % kLanes == 0 && kStrip % kPad == 0, "strips keep lanes and packets");
constexpr int kMaxStripRegisters = 12;  // 12 KiB of strip buffers on the stack

struct StripOperand {
  enum class Kind : uint8_t { kRegister, kMemory, kImmediate };
  Kind kind = Kind::kImmediate;
  int reg = -1;  // kRegister
  Loc loc;       // kMemory: a slot, tensor, kept or reduced buffer (a scalar row reduction's
                 // reduced value is splat); kImmediate: loc.imm.f32
};

struct StripOp {
  enum class Kind : uint8_t { kLoad, kBroadcastLoad, kCompute, kStore, kAccumulate };
  Kind kind = Kind::kCompute;
  OpCode op = OpCode::kAbs;
  DType dtype = DType::kF32;  // loads: of the input; kStore: of the output
  bool stream = false;        // kStore: non-temporal
  int num_src = 0;
  StripOperand src[2];        // kLoad: src[0] is the input (kMemory)
  float alpha = 0;            // LeakyRelu
  int dst = -1;               // kLoad, kCompute: the register written
  bool write_back = false;    // also written to `home` (a tensor or buffer, or a slot read after
                              // the run)
  Loc home;                   // kStore: the output; kAccumulate: the accumulator; kCompute
                              // with half_out: the f16 output
  int step = 0;               // its position in the schedule (kAccumulate: the step's op and
                              // types)
  // f16 conversions folded into a unary instruction: half_in, it reads its operand straight
  // from the f16 input (the load before it, whose only reader it is, is skipped); half_out, it
  // writes its result straight to the f16 output (the store after it is skipped). One store
  // and one load of a strip buffer fewer each.
  bool half_in = false, half_out = false, skipped = false;
  std::vector<int> readers;  // kBroadcastLoad: the ops reading its value (StripReaders), for
                             // RunStrips to point at the bias in place
};

struct StripRun {
  int end = 0;                // the run replaces the steps from where it starts up to `end`
  std::vector<StripOp> ops;
};

struct Schedule {
  std::vector<Step> steps;
  int num_slots = 0;
  // Strip fusion (full-tile schedules): run_at[pos] is the index in `runs` of the run that
  // starts at step pos, or -1; empty when the schedule has none.
  std::vector<int> run_at;
  std::vector<StripRun> runs;
  std::vector<int> last_input_read;    // per input: last step reading its tensor, -1 if none
  std::vector<int> first_output_write; // per output: first step writing its tensor
  bool empty() const { return steps.empty(); }
};

// The three variants of one pass over full tiles.
struct PassSchedules {
  Schedule direct, streaming, staged;
};

struct PlanSet {
  std::vector<bool> broadcast;         // the pattern these schedules are for
  // Elementwise programs: `final` only. Reductions: accumulate[p - 1] for level p, finalize[p]
  // for levels 0..levels, and `final` when some output is a full value.
  std::vector<PassSchedules> accumulate;
  std::vector<Schedule> finalize;
  bool has_final = false;
  PassSchedules final;
  // The same full passes for the row-group mode (rows of at most kMaxGroupedRow elements).
  std::vector<PassSchedules> rows_accumulate;
  PassSchedules rows_final;
  // Row reductions of one row per item, when values are kept (kept-row mode): the plain full
  // passes, except that values several passes need are kept, tile by tile, for the whole row.
  std::vector<PassSchedules> kept_row_accumulate;
  PassSchedules kept_row_final;
  // The column-group mode's (short inner blocks, several per tile): as the row-group ones, but
  // an item's pass runs over several tiles, so nothing is kept between passes.
  std::vector<PassSchedules> cols_accumulate;
  PassSchedules cols_final;
  int num_reduced = 0;                 // reduced-value buffers
  int num_accumulators = 0;
  int64_t tile_size = 0;
  int64_t slot_bytes = 0;              // one slot: tile_size elements of the widest type
  int64_t scratch_bytes = 0;           // slots, reduced buffers and accumulators
  int64_t reduced_offset = 0;          // where the reduced buffers start in the scratch
  int64_t accumulator_offset = 0;      // where the accumulators start
  int64_t buffer_bytes = 0;            // one reduced buffer; an accumulator takes two (the
                                       // second holds the compensation of f64 sums/products)
  int num_kept = 0;                    // row-group and kept-row modes: kept full values (a
                                       // slot-sized buffer each per tile of a kept row)
  int64_t kept_offset = 0;             // where they start in the scratch
  int64_t output_bytes = 0;            // per element, full outputs together
  std::vector<std::vector<int>> forwardable;
};

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

// The full values a full pass computes or reads: those its roots (full outputs, or the operands
// of this level's reductions) depend on through full values, not looking past a value for which
// `stop` (null: none) is true.
std::vector<bool> FullValuesOfPass(const Program& program, Pass::Kind kind, int level,
                                   const std::function<bool(int)>& stop = nullptr) {
  const int n = static_cast<int>(program.instructions.size());
  std::vector<bool> needed(n, false);
  auto mark = [&](const Operand& x) {
    if (x.kind == Operand::Kind::kValue && !program.instructions[x.index].reduced) {
      needed[x.index] = true;
    }
  };
  if (kind == Pass::Kind::kFinal) {
    for (const Output& out : program.outputs) mark(out.operand);
  } else {
    for (const Instruction& inst : program.instructions) {
      if (IsReduction(inst.op) && !inst.of_reduced && inst.level == level) mark(inst.operands[0]);
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

KeptValues PlanKeptValues(const Program& program, bool has_final) {
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
        order < levels ? FullValuesOfPass(program, Pass::Kind::kAccumulate, order + 1, computed)
                       : FullValuesOfPass(program, Pass::Kind::kFinal, 0, computed);
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
          const KeptValues* kept = nullptr)
      : program_(program),
        broadcast_(broadcast),
        access_(access),
        pass_(pass),
        reduced_index_(reduced_index),
        accumulator_index_(accumulator_index),
        kept_(pass.keep ? kept : nullptr) {}

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
          if (pass_.kind == Pass::Kind::kFinal) EmitOutputsOf(i, -1);
        } else if (needed[i]) {
          EmitInstruction(i);
        }
        const Instruction& inst = program_.instructions[i];
        if (pass_.kind == Pass::Kind::kAccumulate && IsReduction(inst.op) &&
            !inst.of_reduced && inst.level == pass_.level) {
          EmitAccumulate(i);
        }
      }
      if (pass_.kind == Pass::Kind::kFinal) EmitInputOutputs();
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
    return FullValuesOfPass(program_, pass_.kind, pass_.level,
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
    if (pass_.kind == Pass::Kind::kFinal) {
      for (size_t k = 0; k < program_.outputs.size(); ++k) {
        if (IsOutputOf(program_.outputs[k], i)) {
          if (access_.direct_outputs && IsComputedAsStored(inst.dtype)) {
            direct_output = static_cast<int>(k);
          }
          break;
        }
      }
    }
    const bool kept = kept_ != nullptr && kept_->index[i] >= 0;
    if (kept) direct_output = -1;  // later passes read it from its buffer
    step.dst = direct_output >= 0 ? TensorLoc(Loc::Kind::kOutput, direct_output)
               : kept             ? KeptLoc(i)
                                  : NewRegister();
    value_loc_[i] = step.dst;
    schedule_.steps.push_back(step);
    if (pass_.kind == Pass::Kind::kFinal) EmitOutputsOf(i, direct_output);
  }

  // Every output of value i but `written` (final pass): stored right away, so that its slot can
  // be released early.
  void EmitOutputsOf(int i, int written) {
    for (size_t k = 0; k < program_.outputs.size(); ++k) {
      if (!IsOutputOf(program_.outputs[k], i) || static_cast<int>(k) == written) continue;
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
      if (out.kind != Operand::Kind::kInput || program_.inputs[out.index].reduced) continue;
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
      if (IsReduction(inst.op) && !inst.of_reduced) {
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
};

// ---------------------------------------------------------------------------------------------
// ---------------------------------------------------------------------------------------------
// Conversions between tensors and fp32 slots. A store may be non-temporal ("stream"): the
// output goes to memory without first reading its cache lines, which saves a third of the
// memory traffic of a large kernel; it applies when the destination is aligned (full tiles of
// TensorFlow's 64-byte aligned buffers are).

#ifdef TF_AUTOFUSE_X86_CONVERT
inline bool Aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

inline void Store128(void* dst, __m128i v, bool stream) {
  if (stream) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst), v);
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), v);
  }
}
#endif

void Copy(const char* src, char* dst, int64_t bytes, bool stream) {
  int64_t i = 0;
#ifdef TF_AUTOFUSE_X86_CONVERT
  if (stream && Aligned(dst, 32)) {
    for (; i + 32 <= bytes; i += 32) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    }
  }
#endif
  std::memmove(dst + i, src + i, bytes - i);
}

void WidenHalf(const Eigen::half* src, float* dst, int64_t n) {
  int64_t i = 0;
#ifdef __AVX512F__
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
  }
#endif
#ifdef TF_AUTOFUSE_X86_CONVERT
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

void NarrowToHalf(const float* src, Eigen::half* dst, int64_t n, bool stream) {
  int64_t i = 0;
#ifdef __AVX512F__
  const bool stream32 = stream && Aligned(dst, 32);
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if (stream32) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), h);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
    }
  }
#endif
#ifdef TF_AUTOFUSE_X86_CONVERT
  stream = stream && Aligned(dst, 16);
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    Store128(dst + i, h, stream);
  }
#endif
  for (; i < n; ++i) dst[i] = Eigen::half(src[i]);  // round to nearest even
}

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

void WidenBfloat16(const Eigen::bfloat16* src, float* dst, int64_t n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
  int64_t i = 0;
#ifdef TF_AUTOFUSE_X86_CONVERT
  for (; i + 8 <= n; i += 8) {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bits + i)));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
  }
#endif
  for (; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(bits[i]) << 16;
    std::memcpy(dst + i, &u, sizeof(u));
  }
}

// Round to nearest even; a NaN stays a (quiet) NaN of the same sign.
uint16_t FloatToBfloat16Bits(float f) {
  const uint32_t u = FloatBits(f);
  if (f != f) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

void NarrowToBfloat16(const float* src, Eigen::bfloat16* dst, int64_t n, bool stream) {
  uint16_t* bits = reinterpret_cast<uint16_t*>(dst);
  int64_t i = 0;
#ifdef TF_AUTOFUSE_X86_CONVERT
  stream = stream && Aligned(dst, 16);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i bias = _mm256_set1_epi32(0x7fff);
  const __m256i quiet = _mm256_set1_epi32(0x00400000);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(src + i);
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(bias, lsb));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i r = _mm256_srli_epi32(
        _mm256_blendv_epi8(rounded, _mm256_or_si256(u, quiet), nan), 16);
    // 8 x u32 (each < 2^16) -> 8 x u16
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8);
    Store128(bits + i, _mm256_castsi256_si128(packed), stream);
  }
#endif
  for (; i < n; ++i) bits[i] = FloatToBfloat16Bits(src[i]);
}

// Input tile -> slot of the compute type; elements [valid, count) are zeroed.
void LoadTile(DType dtype, const char* src, char* dst, int64_t valid, int64_t count) {
  switch (dtype) {
    case DType::kF16:
      WidenHalf(reinterpret_cast<const Eigen::half*>(src), reinterpret_cast<float*>(dst), valid);
      break;
    case DType::kBF16:
      WidenBfloat16(reinterpret_cast<const Eigen::bfloat16*>(src), reinterpret_cast<float*>(dst),
                    valid);
      break;
    default:
      std::memcpy(dst, src, valid * DTypeSize(dtype));
      break;
  }
  const int size = ComputeSize(ComputeTypeOf(dtype));
  std::memset(dst + valid * size, 0, (count - valid) * size);
}

// Slot of the compute type -> output tile of `dtype`.
void StoreTile(DType dtype, const char* src, char* dst, int64_t valid, bool stream) {
  switch (dtype) {
    case DType::kF16:
      NarrowToHalf(reinterpret_cast<const float*>(src), reinterpret_cast<Eigen::half*>(dst), valid,
                   stream);
      break;
    case DType::kBF16:
      NarrowToBfloat16(reinterpret_cast<const float*>(src),
                       reinterpret_cast<Eigen::bfloat16*>(dst), valid, stream);
      break;
    default:
      Copy(src, dst, valid * DTypeSize(dtype), stream);
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// One element of a tensor of `dtype`, in the compute type, repeated n times.
void Splat(DType dtype, const char* src, char* dst, int64_t n) {
  switch (dtype) {
    case DType::kF16:
      std::fill_n(reinterpret_cast<float*>(dst), n,
                  static_cast<float>(*reinterpret_cast<const Eigen::half*>(src)));
      break;
    case DType::kBF16:
      std::fill_n(reinterpret_cast<float*>(dst), n,
                  static_cast<float>(*reinterpret_cast<const Eigen::bfloat16*>(src)));
      break;
    case DType::kF32:
      std::fill_n(reinterpret_cast<float*>(dst), n, *reinterpret_cast<const float*>(src));
      break;
    case DType::kF64:
      std::fill_n(reinterpret_cast<double*>(dst), n, *reinterpret_cast<const double*>(src));
      break;
    case DType::kI32:
      std::fill_n(reinterpret_cast<int32_t*>(dst), n, *reinterpret_cast<const int32_t*>(src));
      break;
    case DType::kBool:
      std::memset(dst, *src, n);
      break;
  }
}

// A contiguous run of n tensor elements -> the compute type.
void ConvertRun(DType dtype, const char* src, char* dst, int64_t n) {
  switch (dtype) {
    case DType::kF16:
      WidenHalf(reinterpret_cast<const Eigen::half*>(src), reinterpret_cast<float*>(dst), n);
      break;
    case DType::kBF16:
      WidenBfloat16(reinterpret_cast<const Eigen::bfloat16*>(src), reinterpret_cast<float*>(dst),
                    n);
      break;
    default:
      std::memcpy(dst, src, n * DTypeSize(dtype));
      break;
  }
}

// Fills dst[unit, reps * unit) with reps - 1 more copies of dst[0, unit), doubling the copied
// span each time: a few large memcpys instead of one small copy per repetition.
void RepeatByDoubling(char* dst, int64_t unit, int64_t reps) {
  int64_t filled = 1;
  while (filled < reps) {
    const int64_t n = std::min(filled, reps - filled);
    std::memcpy(dst + filled * unit, dst, n * unit);
    filled += n;
  }
}

// Elements [offset, offset + valid) of an iteration space, read from a stretched input through
// its plan, into a slot of the compute type; elements [valid, count) are zeroed. Walks the rows
// of the innermost collapsed dimension: a read one is a contiguous run (copied), a stretched one
// a single value (splat); the index arithmetic is per row, never per element. Where a read row
// sits in a stretched dimension (a [C] bias over [N, C], a [N, 1, C] scale over [N, HW, C]), the
// following rows of that dimension are the same values: the row is converted once and repeated
// by doubling.
void BroadcastLoad(const BroadcastPlan& plan, DType dtype, const char* src, char* dst,
                   int64_t offset, int64_t valid, int64_t count) {
  const int rank = static_cast<int>(plan.dims.size());
  const int esize = DTypeSize(dtype);
  const int csize = ComputeSize(ComputeTypeOf(dtype));
  int64_t index[64];  // collapsed ranks alternate read/stretched, so they stay small
  int64_t rest = offset;
  int64_t base = 0;
  for (int d = rank - 1; d >= 0; --d) {
    index[d] = rest % plan.dims[d];
    rest /= plan.dims[d];
    base += index[d] * plan.strides[d];
  }
  const int64_t row = plan.dims[rank - 1];
  const int64_t row_stride = plan.strides[rank - 1];
  const bool repeated_rows = rank >= 2 && row_stride != 0 && plan.strides[rank - 2] == 0;
  // Moves the walk on to dimension d's next index, carrying into the outer dimensions.
  auto carry = [&](int d) {
    for (; d >= 0; --d) {
      base += plan.strides[d];
      if (++index[d] < plan.dims[d]) return;
      base -= plan.dims[d] * plan.strides[d];
      index[d] = 0;
    }
  };
  int64_t done = 0;
  while (done < valid) {
    if (repeated_rows && index[rank - 1] == 0 && valid - done >= 2 * row) {
      const int64_t reps = std::min(plan.dims[rank - 2] - index[rank - 2], (valid - done) / row);
      char* out = dst + done * csize;
      ConvertRun(dtype, src + base * esize, out, row);
      RepeatByDoubling(out, row * csize, reps);
      done += reps * row;
      index[rank - 2] += reps - 1;  // base is unchanged: the dimension's stride is 0
      carry(rank - 2);
      continue;
    }
    const int64_t run = std::min(row - index[rank - 1], valid - done);
    if (row_stride != 0) {
      ConvertRun(dtype, src + base * esize, dst + done * csize, run);
    } else {
      Splat(dtype, src + base * esize, dst + done * csize, run);
    }
    done += run;
    index[rank - 1] += run;
    base += run * row_stride;
    if (index[rank - 1] == row) {  // next row
      index[rank - 1] = 0;
      base -= row * row_stride;
      carry(rank - 2);
    }
  }
  std::memset(dst + valid * csize, 0, (count - valid) * csize);
}

// Whether elements [offset, offset + count) of the iteration shape read consecutive elements of
// a broadcast input: its plan's innermost dimension is contiguous and they lie in one row of it
// (a bias at least as long as a tile). *first: the index of the first one.
bool ReadsOneRun(const BroadcastPlan& plan, int64_t offset, int64_t count, int64_t* first) {
  const int rank = static_cast<int>(plan.dims.size());
  if (plan.strides[rank - 1] != 1 || offset % plan.dims[rank - 1] + count > plan.dims[rank - 1]) {
    return false;
  }
  int64_t rest = offset;
  *first = 0;
  for (int d = rank - 1; d >= 0; --d) {
    *first += rest % plan.dims[d] * plan.strides[d];
    rest /= plan.dims[d];
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// The operators, one function per family. `n` is a whole number of packets (see kPad); every
// function is a single elementwise pass, so `out` may be the same buffer as an operand.

template <typename T>
using ArrayX = Eigen::Array<T, Eigen::Dynamic, 1>;
template <typename T>
using In = Eigen::Map<const ArrayX<T>>;
template <typename T>
using Out = Eigen::Map<ArrayX<T>>;

// An operand: a tile, or an immediate scalar broadcast over the tile (data == nullptr).
template <typename T>
struct Arg {
  const T* data;
  T scalar;
};

constexpr double kSeluScale = 1.0507009873554805;
constexpr double kSeluScaleAlpha = 1.0507009873554805 * 1.6732632423543772;

// Abs, Neg, Square, Reciprocal, Sqrt, Rsqrt, Sign, Floor, Ceil, Round: one or two instructions.
template <typename T>
void RunFloatSimple(OpCode op, In<T> x, Out<T> out) {
  switch (op) {
    case OpCode::kAbs: out = x.abs(); break;
    case OpCode::kNeg: out = -x; break;
    case OpCode::kSquare: out = x.square(); break;
    case OpCode::kReciprocal: out = x.inverse(); break;
    case OpCode::kSqrt: out = x.sqrt(); break;
    case OpCode::kRsqrt: out = x.rsqrt(); break;
    case OpCode::kSign: out = x.sign(); break;  // NaN stays NaN
    case OpCode::kFloor: out = x.floor(); break;
    case OpCode::kCeil: out = x.ceil(); break;
    case OpCode::kRound: out = x.rint(); break;  // half to even (TF runs round-to-nearest)
    default: break;
  }
}

// The transcendental functions of an array expression. fp32 uses Eigen's vectorised
// approximations, the functors TensorFlow's float kernels use (1-3 ulps), except where an op
// runs our own packet function instead (Exp: ExpPacket, Erfc: ErfcPacket). f64 uses the C
// library's scalar functions (within an ulp): Eigen's vectorised double versions are off by up
// to ~10 ulps, and TensorFlow's own double kernels land on the scalar functions.
template <typename X, typename Vectorised, typename Scalar>
auto Transcendental(const Eigen::ArrayBase<X>& x, Vectorised vectorised, Scalar scalar) {
  if constexpr (std::is_same_v<typename X::Scalar, double>) {
    return x.unaryExpr(scalar);
  } else {
    return vectorised(x);
  }
}

template <typename X>
auto Exp(const Eigen::ArrayBase<X>& x) {
  return Transcendental(x, [](const auto& a) { return a.exp(); },
                        [](double v) { return std::exp(v); });
}
template <typename X>
auto Expm1(const Eigen::ArrayBase<X>& x) {
  return Transcendental(x, [](const auto& a) { return a.expm1(); },
                        [](double v) { return std::expm1(v); });
}
template <typename X>
auto Log(const Eigen::ArrayBase<X>& x) {
  return Transcendental(x, [](const auto& a) { return a.log(); },
                        [](double v) { return std::log(v); });
}
template <typename X>
auto Log1p(const Eigen::ArrayBase<X>& x) {
  return Transcendental(x, [](const auto& a) { return a.log1p(); },
                        [](double v) { return std::log1p(v); });
}
template <typename X>
auto Erf(const Eigen::ArrayBase<X>& x) {
  return Transcendental(x, [](const auto& a) { return a.erf(); },
                        [](double v) { return std::erf(v); });
}
// exp(r) - 1 on the reduced range |r| <= ln2/2 (plus the lo part of a split argument):
// r + r^2 C(r), C the degree-4 float32 relative-minimax fit of scripts/fit_erfc.py. Shared by
// ExpPacket and ErfcPacket.
template <typename Packet>
EIGEN_STRONG_INLINE Packet ExpReducedMinus1(const Packet& r) {
  namespace ei = Eigen::internal;
  using ei::pmadd;
  using ei::pset1;
  Packet c = pset1<Packet>(0x1.6a4d70p-10f);
  c = pmadd(c, r, pset1<Packet>(0x1.12398ap-7f));
  c = pmadd(c, r, pset1<Packet>(0x1.5558b0p-5f));
  c = pmadd(c, r, pset1<Packet>(0x1.555492p-3f));
  c = pmadd(c, r, pset1<Packet>(0x1.fffffcp-2f));
  return pmadd(c, ei::pmul(r, r), r);
}

// x * 2^k rounded once, k a packet of integers held as floats, x normal and finite (or NaN, which
// stays that NaN). AVX-512: one vscalefps (x * 2^floor(k), any k, overflow to inf and a subnormal
// result included). Elsewhere 2^k is built in a float's exponent field from the integer k, which
// needs 2^k normal: without kSplit one power, -126 <= k <= 127; with kSplit two, of half the
// exponent each (floor(k / 2) and the rest), -252 <= k <= 254, the first product exact (x times
// 2^floor(k / 2) normal) so that a subnormal result or an overflow to inf is still rounded once.
// The same bits either way: ExpPacket, SigmoidPacket and ErfcPacket with vscalefps against the
// integer-shift code, every float32 input, FTZ/DAZ off and on. One cost: without FTZ, a packet
// with a subnormal result takes a microcode assist, ~1.2-1.5x as long after vscalefps as after a
// multiply (exp on [-104, -87]: 4.0 vs 2.7 ns an element); TensorFlow's threads run with FTZ/DAZ.
template <bool kSplit, typename Packet>
EIGEN_STRONG_INLINE Packet TimesPowerOfTwo(const Packet& x, const Packet& k) {
  namespace ei = Eigen::internal;
#ifdef EIGEN_VECTORIZE_AVX512
  if constexpr (std::is_same_v<Packet, ei::Packet16f>) return _mm512_scalef_ps(x, k);
#endif
  using PacketI = typename ei::unpacket_traits<Packet>::integer_packet;
  const PacketI ki = ei::pcast<Packet, PacketI>(k);
  const PacketI bias = ei::pset1<PacketI>(127);
  if constexpr (kSplit) {
    const PacketI half = ei::plogical_shift_right<1>(ei::padd(ki, ei::pset1<PacketI>(1 << 30)));
    const PacketI k1 = ei::psub(half, ei::pset1<PacketI>(1 << 29));  // floor(k / 2)
    const Packet s1 = ei::preinterpret<Packet>(ei::plogical_shift_left<23>(ei::padd(k1, bias)));
    const Packet s2 = ei::preinterpret<Packet>(
        ei::plogical_shift_left<23>(ei::padd(ei::psub(ki, k1), bias)));
    return ei::pmul(ei::pmul(x, s1), s2);
  } else {
    return ei::pmul(x, ei::preinterpret<Packet>(ei::plogical_shift_left<23>(ei::padd(ki, bias))));
  }
}

// exp x, fp32, one packet, no branch: x clamped to [-104, 88.73] (beyond, the result rounds to 0
// or overflows to inf either way), k = round(x / ln2), r = x - k ln2 with ln2 in two parts (the
// first product exact), |r| <= ln2/2; exp(r) = 1 + ExpReducedMinus1(r); then times 2^k by
// TimesPowerOfTwo, rounded once, so that k down to -150 (a subnormal result) and up to 128 (inf)
// need no test. NaN stays NaN (pmin/pmax keep a NaN first operand), exp(-inf) = 0,
// exp(inf) = inf. Over all float32 (scripts/packet_ulps.sh exp): within 1.013 ulps, mean 0.064
// (Eigen's fp32 exp, which TensorFlow's kernels use: 1.28, 0.074).
// Eigen's tests every packet for a lane out of its fast range (a horizontal reduction and a
// branch a packet); this is ~0.5x its time (0.15 vs 0.29 ns an element, one core, L1-resident,
// FTZ/DAZ on, this Sapphire Rapids VM, scripts/packet_ulps.sh exp; 0.25 with the scale as two
// powers of two built by integer shifts, the portable path, before vscalefps; that version took
// abs->relu->exp [4096,4096] f32 from 5.8 to 5.2 ms a step). Used for the Exp op and inside fp32
// Sigmoid; softplus, elu and the rest still use Eigen's.
template <typename Packet>
EIGEN_STRONG_INLINE Packet ExpPacket(const Packet& x) {
  namespace ei = Eigen::internal;
  using ei::pset1;
  const Packet c = ei::pmax(ei::pmin(x, pset1<Packet>(88.73f)), pset1<Packet>(-104.0f));
  const Packet k = ei::print(ei::pmul(c, pset1<Packet>(0x1.715476p+0f)));
  const Packet r = ei::pnmadd(k, pset1<Packet>(0x1.7f7d1cp-20f),
                              ei::pnmadd(k, pset1<Packet>(0x1.62e4p-1f), c));
  const Packet e = ei::padd(ExpReducedMinus1(r), pset1<Packet>(1.0f));
  return TimesPowerOfTwo</*kSplit=*/true>(e, k);
}

// y[i] = f(x[i]) over fp32 packets, two a turn (a transcendental's long dependency chain leaves
// the core idle with one), both loaded before either is stored: safe in place.
template <typename Packet, typename F>
EIGEN_STRONG_INLINE void MapPackets(const float* in, float* o, int64_t n, F f) {
  constexpr int64_t kSize = Eigen::internal::unpacket_traits<Packet>::size;
  static_assert(kPad % kSize == 0, "n is a whole number of packets");
  using Eigen::internal::ploadu;
  using Eigen::internal::pstoreu;
  int64_t i = 0;
  for (; i + 2 * kSize <= n; i += 2 * kSize) {
    const Packet y0 = f(ploadu<Packet>(in + i));
    const Packet y1 = f(ploadu<Packet>(in + i + kSize));
    pstoreu(o + i, y0);
    pstoreu(o + i + kSize, y1);
  }
  for (; i < n; i += kSize) pstoreu(o + i, f(ploadu<Packet>(in + i)));
}

template <typename Packet, Packet (*F)(const Packet&)>
void RunPackets(const float* in, float* o, int64_t n) {
  MapPackets<Packet>(in, o, n, F);
}
using FloatPacket = Eigen::internal::packet_traits<float>::type;

// erfc x = 1 - erf x without the cancellation, fp32 (and the 16-bit types computed in it), one
// packet: our own approximation, both branches computed and one selected per lane:
//   |x| < 0.5:  1 - x E(x^2), E a degree-4 polynomial (erf x / x);
//   |x| >= 0.5: erfc a = exp(-a^2) P(a) / Q(a), a = |x| clamped at 10.1 (beyond, erfc < 2^-150
//               rounds to 0), P/Q a [4/5] rational fitted to erfc(a) exp(a^2) on [0.5, 10.1]
//               (one division); erfc(-a) = 2 - erfc a.
// a^2 is split into hi + lo with an FMA and lo joins the reduced argument of exp, so the rounding
// of a^2 (tens of ulps of the result near a = 10 if exp took it) does not reach the result;
// exp(r) on |r| <= ln2/2 is 1 + r + r^2 C(r), deg C = 4. P carries a factor 2^-64 that the scale
// 2^(k+64) of TimesPowerOfTwo takes back (a normal power of two for every k, one multiply on the
// portable path), so a result below 2^-126 is rounded once (TF's threads flush it to zero
// anyway). Coefficients: float32 relative-minimax fits (scripts/fit_erfc.py), each rounded to
// float32 in turn and the rest refitted. NaN stays NaN, erfc(+inf) = 0, erfc(-inf) = 2.
template <typename Packet>
EIGEN_STRONG_INLINE Packet ErfcPacket(const Packet& x) {
  namespace ei = Eigen::internal;
  using ei::pmadd;
  using ei::pset1;
  const Packet a = ei::pmin(ei::pabs(x), pset1<Packet>(10.1f));  // pmin keeps a NaN first operand
  const Packet hi = ei::pmul(a, a);
  const Packet lo = tf_compat::TwoProdLow(a, a, hi);  // a^2 = hi + lo exactly (FMA or Veltkamp)
  // |x| < 0.5
  Packet e = pset1<Packet>(0x1.1d1da6p-8f);
  e = pmadd(e, hi, pset1<Packet>(-0x1.b2f136p-6f));
  e = pmadd(e, hi, pset1<Packet>(0x1.cdfa88p-4f));
  e = pmadd(e, hi, pset1<Packet>(-0x1.81266ep-2f));
  e = pmadd(e, hi, pset1<Packet>(0x1.20dd74p+0f));
  const Packet small = ei::pnmadd(x, e, pset1<Packet>(1.0f));
  // exp(-hi - lo) = 2^k exp(r), r = (-hi - k ln2_hi) - (lo + k ln2_lo), the first part exact
  const Packet k = ei::print(ei::pmul(hi, pset1<Packet>(-0x1.715476p+0f)));
  const Packet r0 = ei::pnmadd(k, pset1<Packet>(0x1.62e4p-1f), ei::pnegate(hi));
  const Packet r = ei::psub(r0, pmadd(k, pset1<Packet>(0x1.7f7d1cp-20f), lo));
  const Packet t = ExpReducedMinus1(r);
  constexpr float kP = 0x1p-64f;
  Packet p = pset1<Packet>(0x1.3c726ep-5f * kP);
  p = pmadd(p, a, pset1<Packet>(0x1.041ca6p-2f * kP));
  p = pmadd(p, a, pset1<Packet>(0x1.8fc14cp-1f * kP));
  p = pmadd(p, a, pset1<Packet>(0x1.48422ap+0f * kP));
  p = pmadd(p, a, pset1<Packet>(kP));
  Packet q = pset1<Packet>(0x1.187132p-4f);
  q = pmadd(q, a, pset1<Packet>(0x1.cd0da4p-2f));
  q = pmadd(q, a, pset1<Packet>(0x1.6af69cp+0f));
  q = pmadd(q, a, pset1<Packet>(0x1.401a8cp+1f));
  q = pmadd(q, a, pset1<Packet>(0x1.349024p+1f));
  q = pmadd(q, a, pset1<Packet>(1.0f));
  const Packet y = TimesPowerOfTwo</*kSplit=*/false>(ei::pdiv(pmadd(t, p, p), q),
                                                     ei::padd(k, pset1<Packet>(64.0f)));
  const Packet zero = ei::pzero(x);
  const Packet large = ei::pselect(ei::pcmp_lt(x, zero), ei::psub(pset1<Packet>(2.0f), y), y);
  return ei::pselect(ei::pcmp_lt(a, pset1<Packet>(0.5f)), small, large);
}

// Erfc. fp32: ErfcPacket, within 5.9 ulps of the exact value over all float32 (Eigen's fp32
// erfc, used before: 6.2; both worst in the tail, x in [1, 9]), mean 0.30 ulps over |x| in
// [2^-13, 10.1] (Eigen's: 0.32), 0.35 on GELU's N(0, 1/2) inputs (Eigen's: 0.43); measured with
// scripts/packet_ulps.sh erfc. Cost: ~50 vector instructions and one division a packet, 0.48 ns an
// element (0.50 with the scale built by integer shifts, before vscalefps), 0.63x Eigen's 0.75
// (one core, L1-resident, FTZ/DAZ on, this Sapphire Rapids VM, scripts/packet_ulps.sh erfc;
// Eigen's, for any packet holding an |x| > 1, computes both of its branches, a reciprocal and a
// division). Two packets a turn: one at a time, its long dependency chain left the core idle
// (5-10% slower in a standalone loop).
// Without FMA, pmadd falls back to a multiply and an add and twoprod_low to Veltkamp's split:
// less accurate, not measured.
// f64: the C library's long double erfcl (the double ones, Eigen's and glibc's, are up to ~30
// ulps off in the far tail).
template <typename T>
void RunErfc(In<T> x, Out<T> out) {
  if constexpr (std::is_same_v<T, float>) {
    RunPackets<FloatPacket, ErfcPacket<FloatPacket>>(x.data(), out.data(), x.size());
  } else {
    out = x.unaryExpr([](T v) { return static_cast<T>(std::erfc(static_cast<long double>(v))); });
  }
}

template <typename X>
auto Sin(const Eigen::ArrayBase<X>& x) {
  return Transcendental(x, [](const auto& a) { return a.sin(); },
                        [](double v) { return std::sin(v); });
}
template <typename X>
auto Cos(const Eigen::ArrayBase<X>& x) {
  return Transcendental(x, [](const auto& a) { return a.cos(); },
                        [](double v) { return std::cos(v); });
}
template <typename X>
auto Tanh(const Eigen::ArrayBase<X>& x) {
  return Transcendental(x, [](const auto& a) { return a.tanh(); },
                        [](double v) { return std::tanh(v); });
}

template <typename T>
void RunFloatTranscendental(OpCode op, In<T> x, Out<T> out) {
  switch (op) {
    case OpCode::kExp:
      if constexpr (std::is_same_v<T, float>) {
        RunPackets<FloatPacket, ExpPacket<FloatPacket>>(x.data(), out.data(), x.size());
      } else {
        out = Exp(x);
      }
      break;
    case OpCode::kExpm1: out = Expm1(x); break;
    case OpCode::kLog: out = Log(x); break;
    case OpCode::kLog1p: out = Log1p(x); break;
    case OpCode::kErf: out = Erf(x); break;
    case OpCode::kErfc: RunErfc<T>(x, out); break;
    case OpCode::kSin: out = Sin(x); break;
    case OpCode::kCos: out = Cos(x); break;
    // The C library's functions, in every type: Eigen has no accurate vectorised versions (its
    // sinh/cosh go through exp and lose everything near 0).
    case OpCode::kTan: out = x.unaryExpr([](T v) { return std::tan(v); }); break;
    case OpCode::kAtan: out = x.unaryExpr([](T v) { return std::atan(v); }); break;
    case OpCode::kSinh: out = x.unaryExpr([](T v) { return std::sinh(v); }); break;
    case OpCode::kCosh: out = x.unaryExpr([](T v) { return std::cosh(v); }); break;
    default: break;
  }
}

// 1 where x < 0, else 0, in x's own type. select() vectorises only on a condition of the same
// scalar type as its branches (a bool condition makes the whole expression scalar).
template <typename X>
auto IsNegative(const Eigen::ArrayBase<X>& x) {
  using T = typename X::Scalar;
  return x.matrix()
      .cwiseTypedLess(Eigen::Matrix<T, Eigen::Dynamic, 1>::Zero(x.size()))
      .array();
}

// e = exp(-|x|) never overflows; x < 0: e / (1 + e), else 1 / (1 + e). Within ~2 ulps (Eigen's
// fp32 logistic() is up to 4.5 ulps off). fp32: one packet function, one division an element.
// Other types: in blocks, so that exp runs once per element: a block of x is read before the
// same block of out is written, which keeps it safe in place.
template <typename Packet>
EIGEN_STRONG_INLINE Packet SigmoidPacket(const Packet& x) {
  namespace ei = Eigen::internal;
  const Packet one = ei::pset1<Packet>(1.0f);
  const Packet e = ExpPacket(ei::pnegate(ei::pabs(x)));
  const Packet y = ei::pdiv(ei::pselect(ei::pcmp_lt(x, ei::pzero(x)), e, one), ei::padd(one, e));
  // a NaN x gives x: which NaN the arithmetic would give (its sign) depends on the operand
  // order g++ picks for the commutative add, which differed between the strip and tile paths
  return ei::pselect(ei::pcmp_eq(x, x), y, x);
}

template <typename T>
void Sigmoid(In<T> x, Out<T> out) {
  if constexpr (std::is_same_v<T, float>) {
    RunPackets<FloatPacket, SigmoidPacket<FloatPacket>>(x.data(), out.data(), x.size());
    return;
  }
  constexpr int64_t kBlock = 256;  // a multiple of kPad
  alignas(64) T e_block[kBlock];
  const T one(1);
  for (int64_t i = 0; i < x.size(); i += kBlock) {
    const int64_t len = std::min(kBlock, x.size() - i);
    Out<T> e(e_block, len);
    const auto xs = x.segment(i, len);
    e = Exp(-xs.abs());
    out.segment(i, len) = IsNegative(xs).select(e * (e + one).inverse(), (e + one).inverse());
  }
}

// The activations. Max/min propagate NaN, as TensorFlow's do.
template <typename T>
void RunFloatActivation(OpCode op, In<T> x, Out<T> out) {
  const T zero(0);
  const T one(1);
  switch (op) {
    case OpCode::kRelu:  // x < 0 ? 0 : x, as TensorFlow's: -0 and NaN (its payload) stay x
      out = (x < zero).select(zero, x);
      break;
    case OpCode::kRelu6:
      out = x.template max<Eigen::PropagateNaN>(zero).template min<Eigen::PropagateNaN>(T(6));
      break;
    case OpCode::kElu:
      out = IsNegative(x).select(Expm1(x), x);
      break;
    case OpCode::kSelu:
      out = IsNegative(x).select(T(kSeluScaleAlpha) * Expm1(x), T(kSeluScale) * x);
      break;
    case OpCode::kSigmoid:
      Sigmoid<T>(x, out);
      break;
    case OpCode::kTanh:
      out = Tanh(x);
      break;
    case OpCode::kSoftplus:  // max(x, 0) + log1p(exp(-|x|)): no overflow, accurate for x << 0
      out = x.template max<Eigen::PropagateNaN>(zero) + Log1p(Exp(-x.abs()));
      break;
    case OpCode::kSoftsign:
      out = x / (x.abs() + one);
      break;
    default:
      break;
  }
}

// out = f(x, y) with either operand possibly an immediate (never both).
template <typename T, typename F>
void ApplyBinary(const Arg<T>& x, const Arg<T>& y, T* out_data, int64_t n, F f) {
  Out<T> out(out_data, n);
  if (x.data != nullptr && y.data != nullptr) {
    out = f(In<T>(x.data, n), In<T>(y.data, n));
  } else if (x.data != nullptr) {
    out = f(In<T>(x.data, n), ArrayX<T>::Constant(n, y.scalar));
  } else {
    out = f(ArrayX<T>::Constant(n, x.scalar), In<T>(y.data, n));
  }
}

template <typename T>
void RunFloatBinary(OpCode op, const Arg<T>& x, const Arg<T>& y, T* out, int64_t n) {
  switch (op) {
    case OpCode::kAdd:
      ApplyBinary(x, y, out, n, [](const auto& a, const auto& b) { return a + b; });
      break;
    case OpCode::kSub:
      ApplyBinary(x, y, out, n, [](const auto& a, const auto& b) { return a - b; });
      break;
    case OpCode::kMul:
      ApplyBinary(x, y, out, n, [](const auto& a, const auto& b) { return a * b; });
      break;
    case OpCode::kDiv:
      ApplyBinary(x, y, out, n, [](const auto& a, const auto& b) { return a / b; });
      break;
    case OpCode::kMaximum:
      ApplyBinary(x, y, out, n, [](const auto& a, const auto& b) {
        return a.template max<Eigen::PropagateNaN>(b);
      });
      break;
    case OpCode::kMinimum:
      ApplyBinary(x, y, out, n, [](const auto& a, const auto& b) {
        return a.template min<Eigen::PropagateNaN>(b);
      });
      break;
    case OpCode::kSquaredDifference:
      ApplyBinary(x, y, out, n, [](const auto& a, const auto& b) { return (a - b).square(); });
      break;
    case OpCode::kPow:
      ApplyBinary(x, y, out, n, [](const auto& a, const auto& b) {
        return a.binaryExpr(b, [](T u, T v) { return std::pow(u, v); });
      });
      break;
    case OpCode::kFloorDiv:
      ApplyBinary(x, y, out, n, [](const auto& a, const auto& b) { return (a / b).floor(); });
      break;
    case OpCode::kFloorMod:  // TensorFlow's: fmod, moved into the sign of y (exact)
      ApplyBinary(x, y, out, n, [](const auto& a, const auto& b) {
        return a.binaryExpr(b, [](T u, T v) {
          const T r = std::fmod(u, v);
          return r != T(0) && ((v < T(0)) != (r < T(0))) ? r + v : r;
        });
      });
      break;
    default:
      break;
  }
}

template <typename T>
void RunFloat(OpCode op, const Arg<T>& x, const Arg<T>& y, T* out, int64_t n) {
  switch (op) {
    case OpCode::kAbs: case OpCode::kNeg: case OpCode::kSquare: case OpCode::kReciprocal:
    case OpCode::kSqrt: case OpCode::kRsqrt: case OpCode::kSign: case OpCode::kFloor:
    case OpCode::kCeil: case OpCode::kRound:
      RunFloatSimple<T>(op, In<T>(x.data, n), Out<T>(out, n));
      break;
    case OpCode::kExp: case OpCode::kExpm1: case OpCode::kLog: case OpCode::kLog1p:
    case OpCode::kErf: case OpCode::kErfc: case OpCode::kSin: case OpCode::kCos: case OpCode::kTan:
    case OpCode::kAtan: case OpCode::kSinh: case OpCode::kCosh:
      RunFloatTranscendental<T>(op, In<T>(x.data, n), Out<T>(out, n));
      break;
    case OpCode::kRelu: case OpCode::kRelu6: case OpCode::kElu: case OpCode::kSelu:
    case OpCode::kSigmoid: case OpCode::kTanh: case OpCode::kSoftplus: case OpCode::kSoftsign:
      RunFloatActivation<T>(op, In<T>(x.data, n), Out<T>(out, n));
      break;
    default:
      RunFloatBinary<T>(op, x, y, out, n);
      break;
  }
}

// int32: plain loops GCC vectorises. Arithmetic goes through uint32_t so that it wraps
// (two's complement, as TensorFlow's kernels do) without undefined behaviour.
inline int32_t Wrap(uint32_t v) { return static_cast<int32_t>(v); }
inline uint32_t U(int32_t v) { return static_cast<uint32_t>(v); }

template <typename F>
void MapInt(const int32_t* x, int32_t* out, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) out[i] = f(x[i]);
}

template <typename F>
void MapInt(const Arg<int32_t>& x, const Arg<int32_t>& y, int32_t* out, int64_t n, F f) {
  if (x.data != nullptr && y.data != nullptr) {
    for (int64_t i = 0; i < n; ++i) out[i] = f(x.data[i], y.data[i]);
  } else if (x.data != nullptr) {
    const int32_t b = y.scalar;
    for (int64_t i = 0; i < n; ++i) out[i] = f(x.data[i], b);
  } else {
    const int32_t a = x.scalar;
    for (int64_t i = 0; i < n; ++i) out[i] = f(a, y.data[i]);
  }
}

void RunIntUnary(OpCode op, const int32_t* x, int32_t* out, int64_t n) {
  switch (op) {
    case OpCode::kAbs:  // |INT32_MIN| wraps to INT32_MIN
      MapInt(x, out, n, [](int32_t v) { return v < 0 ? Wrap(0u - U(v)) : v; });
      break;
    case OpCode::kNeg:
      MapInt(x, out, n, [](int32_t v) { return Wrap(0u - U(v)); });
      break;
    case OpCode::kSquare:
      MapInt(x, out, n, [](int32_t v) { return Wrap(U(v) * U(v)); });
      break;
    case OpCode::kRelu:
      MapInt(x, out, n, [](int32_t v) { return std::max(v, 0); });
      break;
    case OpCode::kRelu6:
      MapInt(x, out, n, [](int32_t v) { return std::min(std::max(v, 0), 6); });
      break;
    case OpCode::kSign:
      MapInt(x, out, n, [](int32_t v) { return static_cast<int32_t>((v > 0) - (v < 0)); });
      break;
    default:
      break;
  }
}

void RunIntBinary(OpCode op, const Arg<int32_t>& x, const Arg<int32_t>& y, int32_t* out,
                  int64_t n) {
  switch (op) {
    case OpCode::kAdd:
      MapInt(x, y, out, n, [](int32_t a, int32_t b) { return Wrap(U(a) + U(b)); });
      break;
    case OpCode::kSub:
      MapInt(x, y, out, n, [](int32_t a, int32_t b) { return Wrap(U(a) - U(b)); });
      break;
    case OpCode::kMul:
      MapInt(x, y, out, n, [](int32_t a, int32_t b) { return Wrap(U(a) * U(b)); });
      break;
    case OpCode::kMaximum:
      MapInt(x, y, out, n, [](int32_t a, int32_t b) { return std::max(a, b); });
      break;
    case OpCode::kMinimum:
      MapInt(x, y, out, n, [](int32_t a, int32_t b) { return std::min(a, b); });
      break;
    case OpCode::kSquaredDifference:
      MapInt(x, y, out, n, [](int32_t a, int32_t b) {
        const uint32_t d = U(a) - U(b);
        return Wrap(d * d);
      });
      break;
    default:
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// ---------------------------------------------------------------------------------------------
// The operators whose operands and result differ in type, and the generic ones.

template <typename T>
inline T At(const Arg<T>& a, int64_t i) {
  return a.data != nullptr ? a.data[i] : a.scalar;
}

// out = f(x, y) elementwise, either operand possibly a scalar; plain loops GCC vectorises.
template <typename T, typename R, typename F>
void MapBinary(const Arg<T>& x, const Arg<T>& y, R* out, int64_t n, F f) {
  if (x.data != nullptr && y.data != nullptr) {
    for (int64_t i = 0; i < n; ++i) out[i] = f(x.data[i], y.data[i]);
  } else if (x.data != nullptr) {
    const T b = y.scalar;
    for (int64_t i = 0; i < n; ++i) out[i] = f(x.data[i], b);
  } else if (y.data != nullptr) {
    const T a = x.scalar;
    for (int64_t i = 0; i < n; ++i) out[i] = f(a, y.data[i]);
  } else {
    std::fill_n(out, n, f(x.scalar, y.scalar));
  }
}

// Comparisons -> bool; NaN compares false, except NotEqual.
template <typename T>
void RunCompare(OpCode op, const Arg<T>& x, const Arg<T>& y, uint8_t* out, int64_t n) {
  switch (op) {
    case OpCode::kGreater:
      MapBinary(x, y, out, n, [](T a, T b) -> uint8_t { return a > b; });
      break;
    case OpCode::kGreaterEqual:
      MapBinary(x, y, out, n, [](T a, T b) -> uint8_t { return a >= b; });
      break;
    case OpCode::kLess:
      MapBinary(x, y, out, n, [](T a, T b) -> uint8_t { return a < b; });
      break;
    case OpCode::kLessEqual:
      MapBinary(x, y, out, n, [](T a, T b) -> uint8_t { return a <= b; });
      break;
    case OpCode::kEqual:
      MapBinary(x, y, out, n, [](T a, T b) -> uint8_t { return a == b; });
      break;
    case OpCode::kNotEqual:
      MapBinary(x, y, out, n, [](T a, T b) -> uint8_t { return a != b; });
      break;
    default:
      break;
  }
}

// IsNan, IsInf, IsFinite -> bool.
template <typename T>
void RunClassify(OpCode op, const T* x, uint8_t* out, int64_t n) {
  const T inf = std::numeric_limits<T>::infinity();
  switch (op) {
    case OpCode::kIsNan:
      for (int64_t i = 0; i < n; ++i) out[i] = x[i] != x[i];
      break;
    case OpCode::kIsInf:
      for (int64_t i = 0; i < n; ++i) out[i] = std::abs(x[i]) == inf;
      break;
    case OpCode::kIsFinite:
      for (int64_t i = 0; i < n; ++i) out[i] = std::abs(x[i]) < inf;
      break;
    default:
      break;
  }
}

void RunLogical(OpCode op, const Arg<uint8_t>& x, const Arg<uint8_t>& y, uint8_t* out,
                int64_t n) {
  switch (op) {
    case OpCode::kLogicalNot:
      for (int64_t i = 0; i < n; ++i) out[i] = x.data[i] ^ 1;
      break;
    case OpCode::kLogicalAnd:
      MapBinary(x, y, out, n, [](uint8_t a, uint8_t b) -> uint8_t { return a & b; });
      break;
    case OpCode::kLogicalOr:
      MapBinary(x, y, out, n, [](uint8_t a, uint8_t b) -> uint8_t { return a | b; });
      break;
    default:
      break;
  }
}

template <typename T>
void RunSelect(const Arg<uint8_t>& c, const Arg<T>& x, const Arg<T>& y, T* out, int64_t n) {
  if (c.data != nullptr && x.data != nullptr && y.data != nullptr) {
    for (int64_t i = 0; i < n; ++i) out[i] = c.data[i] ? x.data[i] : y.data[i];
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = At(c, i) ? At(x, i) : At(y, i);
  }
}

// x < 0 ? alpha * x : x (NaN and -0 pass through, as in TensorFlow).
template <typename T>
void RunLeakyRelu(const T* x, T alpha, T* out, int64_t n) {
  Out<T>(out, n) = IsNegative(In<T>(x, n)).select(In<T>(x, n) * alpha, In<T>(x, n));
}

// Cast between float types: a 16-bit target rounds to nearest even there (f64 goes through
// fp32 first, as Eigen's and so TensorFlow's casts do), and the value stays in fp32.
void RunCast(ComputeType from, DType to, const char* src, char* dst, int64_t n) {
  constexpr int64_t kBlock = 256;
  if (from == ComputeType::kF32) {
    const float* x = reinterpret_cast<const float*>(src);
    switch (to) {
      case DType::kF64: {
        double* out = reinterpret_cast<double*>(dst);
        for (int64_t i = 0; i < n; ++i) out[i] = x[i];
        return;
      }
      case DType::kF16: {
        float* out = reinterpret_cast<float*>(dst);
        alignas(64) Eigen::half block[kBlock];
        for (int64_t i = 0; i < n; i += kBlock) {
          const int64_t len = std::min(kBlock, n - i);
          NarrowToHalf(x + i, block, len, false);
          WidenHalf(block, out + i, len);
        }
        return;
      }
      case DType::kBF16: {
        float* out = reinterpret_cast<float*>(dst);
        alignas(64) Eigen::bfloat16 block[kBlock];
        for (int64_t i = 0; i < n; i += kBlock) {
          const int64_t len = std::min(kBlock, n - i);
          NarrowToBfloat16(x + i, block, len, false);
          WidenBfloat16(block, out + i, len);
        }
        return;
      }
      default:
        if (src != dst) std::memmove(dst, src, n * sizeof(float));
        return;
    }
  }
  const double* x = reinterpret_cast<const double*>(src);
  float* out = reinterpret_cast<float*>(dst);
  switch (to) {
    case DType::kF32:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(x[i]);
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        out[i] = static_cast<float>(Eigen::half(static_cast<float>(x[i])));
      }
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        out[i] = static_cast<float>(Eigen::bfloat16(static_cast<float>(x[i])));
      }
      return;
    default:
      if (src != dst) std::memmove(dst, src, n * sizeof(double));
      return;
  }
}

// ZerosLike / OnesLike: 0 or 1 in the compute type.
void Fill(ComputeType type, bool one, char* dst, int64_t n) {
  switch (type) {
    case ComputeType::kF32:
      std::fill_n(reinterpret_cast<float*>(dst), n, one ? 1.0f : 0.0f);
      break;
    case ComputeType::kF64:
      std::fill_n(reinterpret_cast<double*>(dst), n, one ? 1.0 : 0.0);
      break;
    case ComputeType::kI32:
      std::fill_n(reinterpret_cast<int32_t*>(dst), n, one ? 1 : 0);
      break;
    case ComputeType::kBool:
      std::memset(dst, one ? 1 : 0, n);
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// Reductions: accumulate, then finish. `lanes`: a row reduction into kLanes partial results
// (lane = position mod kLanes; tiles of a row start at multiples of kLanes); otherwise one
// accumulator per element of the tile.

template <typename A>
A Identity(OpCode op) {
  switch (op) {
    case OpCode::kProd:
      return A(1);
    case OpCode::kMax:
      return std::numeric_limits<A>::has_infinity ? -std::numeric_limits<A>::infinity()
                                                  : std::numeric_limits<A>::lowest();
    case OpCode::kMin:
      return std::numeric_limits<A>::has_infinity ? std::numeric_limits<A>::infinity()
                                                  : std::numeric_limits<A>::max();
    default:
      return A(0);
  }
}

// The combining functions; i32 wraps, Max/Min propagate NaN.
template <typename A, typename F>
void WithCombine(OpCode op, F body) {
  if constexpr (std::is_same_v<A, int64_t>) {  // i32 Mean
    return body([](A a, A x) { return a + x; });
  } else if constexpr (std::is_same_v<A, int32_t>) {
    switch (op) {
      case OpCode::kProd:
        return body([](A a, A x) { return Wrap(U(a) * U(x)); });
      case OpCode::kMax:
        return body([](A a, A x) { return std::max(a, x); });
      case OpCode::kMin:
        return body([](A a, A x) { return std::min(a, x); });
      default:
        return body([](A a, A x) { return Wrap(U(a) + U(x)); });
    }
  } else {
    switch (op) {
      case OpCode::kProd:
        return body([](A a, A x) { return a * x; });
      case OpCode::kMax:  // NaN-propagating, like AccumulateExtremum
        return body([](A a, A x) { return a != a || x != x ? (a != a ? a : x) : std::max(a, x); });
      case OpCode::kMin:
        return body([](A a, A x) { return a != a || x != x ? (a != a ? a : x) : std::min(a, x); });
      default:
        return body([](A a, A x) { return a + x; });
    }
  }
}

// f64 sums and products carry a compensation term (`comp`, next to the accumulator): Neumaier's
// for sums, the exact FMA residual for products. Without it an f64 reduction would be no more
// accurate than TensorFlow's (it has no wider type to accumulate in), and as the order differs,
// often less. Once the running value is not finite (an infinity or NaN among the terms, or an
// overflow) the compensation stops: it would be inf - inf = NaN, and turn a sum of +inf into NaN.
// The result is then the plain one, as TensorFlow's (accumulator + a finite compensation).
inline void CompensatedAdd(double& s, double& c, double x) {
  const double t = s + x;
  if (std::isfinite(t)) c += std::abs(s) >= std::abs(x) ? (s - t) + x : (x - t) + s;
  s = t;
}
inline void CompensatedMul(double& p, double& e, double x) {
  const double q = p * x;
  if (std::isfinite(q)) e = std::fma(e, x, std::fma(p, x, -q));
  p = q;
}

bool Compensated(OpCode op, ComputeType src, ComputeType acc) {
  return src == ComputeType::kF64 && acc == ComputeType::kF64 &&
         (op == OpCode::kSum || op == OpCode::kMean || op == OpCode::kProd);
}

void AccumulateCompensated(OpCode op, const double* x, double* acc, double* comp, int64_t n,
                           bool lanes) {
  const bool sum = op != OpCode::kProd;
  auto update = [sum](double& a, double& c, double v) {
    if (sum) {
      CompensatedAdd(a, c, v);
    } else {
      CompensatedMul(a, c, v);
    }
  };
  if (lanes) {
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) update(acc[l], comp[l], x[i + l]);
    }
    for (; i < n; ++i) update(acc[i % kLanes], comp[i % kLanes], x[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) update(acc[i], comp[i], x[i]);
  }
}

// Float Max/Min through Eigen's NaN-propagating max/min, which vectorise (a plain C++ select
// with a NaN test compiles to branches).
template <typename S, typename A>
void AccumulateExtremum(OpCode op, const S* x, A* acc, int64_t n, bool lanes) {
  const bool max = op == OpCode::kMax;
  auto step = [max](auto& a, const auto& v) {
    if (max) {
      a = a.template max<Eigen::PropagateNaN>(v);
    } else {
      a = a.template min<Eigen::PropagateNaN>(v);
    }
  };
  if (lanes) {
    using Lanes = Eigen::Array<A, kLanes, 1>;
    Lanes local = Eigen::Map<const Lanes>(acc);
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      step(local, Eigen::Map<const Eigen::Array<S, kLanes, 1>>(x + i).template cast<A>());
    }
    Eigen::Map<Lanes> result(acc);
    result = local;
    for (; i < n; ++i) {
      A& a = acc[i % kLanes];
      const A v = static_cast<A>(x[i]);
      a = v != v || a != a ? (v != v ? v : a) : (max ? std::max(a, v) : std::min(a, v));
    }
  } else {
    Eigen::Map<ArrayX<A>> a(acc, n);
    step(a, In<S>(x, n).template cast<A>());
  }
}

template <typename S, typename A>
void AccumulateAs(OpCode op, const S* x, A* acc, int64_t n, bool lanes) {
  if constexpr (!std::is_integral_v<A>) {
    if (op == OpCode::kMax || op == OpCode::kMin) {
      AccumulateExtremum(op, x, acc, n, lanes);
      return;
    }
  }
  WithCombine<A>(op, [&](auto f) {
    if (lanes) {
      A local[kLanes];
      std::copy_n(acc, kLanes, local);
      int64_t i = 0;
      for (; i + kLanes <= n; i += kLanes) {
        for (int64_t l = 0; l < kLanes; ++l) local[l] = f(local[l], static_cast<A>(x[i + l]));
      }
      std::copy_n(local, kLanes, acc);
      for (; i < n; ++i) acc[i % kLanes] = f(acc[i % kLanes], static_cast<A>(x[i]));
    } else {
      for (int64_t i = 0; i < n; ++i) acc[i] = f(acc[i], static_cast<A>(x[i]));
    }
  });
}

// Row-group mode: `rows` consecutive rows of `length` elements, each reduced into its own
// accumulator.
template <typename S, typename A>
void AccumulateRowsAs(OpCode op, const S* x, A* acc, double* comp, int64_t rows,
                      int64_t length) {
  if constexpr (std::is_same_v<S, double> && std::is_same_v<A, double>) {
    if (op != OpCode::kMax && op != OpCode::kMin) {
      for (int64_t j = 0; j < rows; ++j) {
        for (int64_t r = 0; r < length; ++r) {
          if (op == OpCode::kProd) {
            CompensatedMul(acc[j], comp[j], x[j * length + r]);
          } else {
            CompensatedAdd(acc[j], comp[j], x[j * length + r]);
          }
        }
      }
      return;
    }
  }
  // Each row into kLanes partial results (lane = position mod kLanes, vectorised), folded in
  // lane order: the order of lanes mode, so a row gives the same value in either mode. An
  // in-order scalar loop would be one dependent add (4 cycles) per element.
  A local[kLanes];
  for (int64_t j = 0; j < rows; ++j) {
    std::fill_n(local, kLanes, Identity<A>(op));
    AccumulateAs(op, x + j * length, local, length, /*lanes=*/true);
    WithCombine<A>(op, [&](auto f) {
      A a = local[0];
      for (int64_t l = 1; l < kLanes; ++l) a = f(a, local[l]);
      acc[j] = f(acc[j], a);
    });
  }
}

// Column-group mode: `rows` consecutive blocks of `width` (= inner) elements, element i of every
// block accumulated into accumulator i, block after block (the order of the one-block tiles).
template <typename S, typename A>
void AccumulateColumnsAs(OpCode op, const S* x, A* acc, double* comp, int64_t rows,
                         int64_t width) {
  for (int64_t j = 0; j < rows; ++j) {
    const S* block = x + j * width;
    if constexpr (std::is_same_v<S, double> && std::is_same_v<A, double>) {
      if (op == OpCode::kSum || op == OpCode::kMean) {
        for (int64_t i = 0; i < width; ++i) CompensatedAdd(acc[i], comp[i], block[i]);
        continue;
      }
      if (op == OpCode::kProd) {
        for (int64_t i = 0; i < width; ++i) CompensatedMul(acc[i], comp[i], block[i]);
        continue;
      }
    }
    if constexpr (!std::is_integral_v<A>) {
      if (op == OpCode::kMax || op == OpCode::kMin) {
        AccumulateExtremum(op, block, acc, width, /*lanes=*/false);
        continue;
      }
    }
    WithCombine<A>(op, [&](auto f) {
      for (int64_t i = 0; i < width; ++i) acc[i] = f(acc[i], static_cast<A>(block[i]));
    });
  }
}

// Row-group (columns == false) or column-group (columns == true) accumulation of a tile of
// `rows` rows of `length` elements.
void AccumulateGroup(const Step& step, const char* src, char* acc, char* comp, int64_t rows,
                     int64_t length, bool columns) {
  double* c = reinterpret_cast<double*>(comp);
  auto run = [&](const auto* x, auto* a) {
    if (columns) {
      AccumulateColumnsAs(step.op, x, a, c, rows, length);
    } else {
      AccumulateRowsAs(step.op, x, a, c, rows, length);
    }
  };
  switch (step.src_ctype) {
    case ComputeType::kF32:
      if (step.acc_ctype == ComputeType::kF64) {
        run(reinterpret_cast<const float*>(src), reinterpret_cast<double*>(acc));
      } else {
        run(reinterpret_cast<const float*>(src), reinterpret_cast<float*>(acc));
      }
      break;
    case ComputeType::kF64:
      run(reinterpret_cast<const double*>(src), reinterpret_cast<double*>(acc));
      break;
    case ComputeType::kI32:
      if (step.acc_ctype == ComputeType::kI64) {
        run(reinterpret_cast<const int32_t*>(src), reinterpret_cast<int64_t*>(acc));
      } else {
        run(reinterpret_cast<const int32_t*>(src), reinterpret_cast<int32_t*>(acc));
      }
      break;
    default:
      break;
  }
}

// Row-group mode: one value per row -> the value repeated over its row; [valid, count) zeroed.
// Column-group mode: the inner vector of reduced values repeated for every block of the tile.
template <typename T>
void TileAs(const T* values, T* out, int64_t width, int64_t valid, int64_t count) {
  const int64_t blocks = (valid + width - 1) / width;
  if (blocks > 0) {
    std::copy_n(values, width, out);
    RepeatByDoubling(reinterpret_cast<char*>(out), width * sizeof(T), blocks);
  }
  std::fill(out + valid, out + count, T(0));
}

template <typename T>
void ExpandAs(const T* values, T* out, int64_t length, int64_t valid, int64_t count,
              bool columns = false) {
  if (columns) return TileAs(values, out, length, valid, count);
  for (int64_t j = 0; j * length < valid; ++j) std::fill_n(out + j * length, length, values[j]);
  std::fill(out + valid, out + count, T(0));
}

void ExpandReduced(ComputeType type, const char* values, char* out, int64_t length,
                   int64_t valid, int64_t count, bool columns) {
  switch (type) {
    case ComputeType::kF32:
      ExpandAs(reinterpret_cast<const float*>(values), reinterpret_cast<float*>(out), length,
               valid, count, columns);
      break;
    case ComputeType::kF64:
      ExpandAs(reinterpret_cast<const double*>(values), reinterpret_cast<double*>(out), length,
               valid, count, columns);
      break;
    case ComputeType::kI32:
      ExpandAs(reinterpret_cast<const int32_t*>(values), reinterpret_cast<int32_t*>(out), length,
               valid, count, columns);
      break;
    default:
      ExpandAs(reinterpret_cast<const uint8_t*>(values), reinterpret_cast<uint8_t*>(out), length,
               valid, count, columns);
      break;
  }
}

void Accumulate(const Step& step, const char* src, char* acc, char* comp, int64_t n,
                bool lanes) {
  if (Compensated(step.op, step.src_ctype, step.acc_ctype)) {
    AccumulateCompensated(step.op, reinterpret_cast<const double*>(src),
                          reinterpret_cast<double*>(acc), reinterpret_cast<double*>(comp), n,
                          lanes);
    return;
  }
  switch (step.src_ctype) {
    case ComputeType::kF32:
      if (step.acc_ctype == ComputeType::kF64) {
        AccumulateAs(step.op, reinterpret_cast<const float*>(src), reinterpret_cast<double*>(acc),
                     n, lanes);
      } else {
        AccumulateAs(step.op, reinterpret_cast<const float*>(src), reinterpret_cast<float*>(acc),
                     n, lanes);
      }
      break;
    case ComputeType::kF64:
      AccumulateAs(step.op, reinterpret_cast<const double*>(src), reinterpret_cast<double*>(acc),
                   n, lanes);
      break;
    case ComputeType::kI32:
      if (step.acc_ctype == ComputeType::kI64) {
        AccumulateAs(step.op, reinterpret_cast<const int32_t*>(src),
                     reinterpret_cast<int64_t*>(acc), n, lanes);
      } else {
        AccumulateAs(step.op, reinterpret_cast<const int32_t*>(src),
                     reinterpret_cast<int32_t*>(acc), n, lanes);
      }
      break;
    default:
      break;
  }
}

template <typename A>
void InitAccumulatorAs(OpCode op, A* acc, int64_t n) {
  std::fill_n(acc, n, Identity<A>(op));
}

void InitAccumulator(const Step& finalize, char* acc, char* comp, int64_t n) {
  std::memset(comp, 0, n * sizeof(double));
  switch (finalize.acc_ctype) {
    case ComputeType::kF32:
      InitAccumulatorAs(finalize.op, reinterpret_cast<float*>(acc), n);
      break;
    case ComputeType::kF64:
      InitAccumulatorAs(finalize.op, reinterpret_cast<double*>(acc), n);
      break;
    case ComputeType::kI32:
      InitAccumulatorAs(finalize.op, reinterpret_cast<int32_t*>(acc), n);
      break;
    case ComputeType::kI64:
      InitAccumulatorAs(finalize.op, reinterpret_cast<int64_t*>(acc), n);
      break;
    case ComputeType::kBool:
      break;
  }
}

// The accumulators -> the reduction's value in its compute type: lanes combined in lane order,
// Mean divided by the number of reduced elements (i32 truncating; 0 when there are none).
template <typename A, typename V>
void FinalizeAs(OpCode op, const A* acc, V* out, int64_t valid, int64_t count, bool lanes,
                int64_t reduce) {
  auto finish = [&](A a) -> V {
    if (op != OpCode::kMean) return static_cast<V>(a);
    if constexpr (std::is_integral_v<A>) {
      return reduce == 0 ? V(0) : static_cast<V>(static_cast<int64_t>(a) / reduce);
    } else {
      return static_cast<V>(a / static_cast<A>(reduce));  // 0 / 0 = NaN
    }
  };
  if (lanes) {
    WithCombine<A>(op, [&](auto f) {
      A a = acc[0];
      for (int64_t l = 1; l < kLanes; ++l) a = f(a, acc[l]);
      std::fill_n(out, count, finish(a));
    });
  } else {
    for (int64_t i = 0; i < valid; ++i) out[i] = finish(acc[i]);
    std::fill(out + valid, out + count, V(0));
  }
}

// An accumulator plus its compensation term. A zero term adds nothing, and adding it anyway
// would turn a -0.0 result (a product with an odd number of negative factors and a zero) into
// +0.0.
inline double WithCompensation(double a, double c) { return c == 0.0 ? a : a + c; }

// Compensated f64 accumulators: the lanes (or each element) folded together with their
// compensation terms, then finished like the others.
void FinalizeCompensated(OpCode op, const double* acc, const double* comp, double* out,
                         int64_t valid, int64_t count, bool lanes, int64_t reduce) {
  const bool sum = op != OpCode::kProd;
  auto finish = [&](double a) { return op == OpCode::kMean ? a / static_cast<double>(reduce) : a; };
  if (lanes) {
    double a = sum ? 0.0 : 1.0, c = 0.0;
    for (int64_t l = 0; l < kLanes; ++l) {
      if (sum) {
        CompensatedAdd(a, c, acc[l]);
        c += comp[l];
      } else {
        // (a + c) * (p + e) ~ a*p + (c*p + a*e): the product of the two error terms is dropped
        const double q = a * acc[l];
        if (std::isfinite(q)) c = std::fma(a, acc[l], -q) + c * acc[l] + a * comp[l];
        a = q;
      }
    }
    std::fill_n(out, count, finish(WithCompensation(a, c)));
  } else {
    for (int64_t i = 0; i < valid; ++i) out[i] = finish(WithCompensation(acc[i], comp[i]));
    std::fill(out + valid, out + count, 0.0);
  }
}

void Finalize(const Step& step, const char* acc, const char* comp, char* out, int64_t valid,
              int64_t count, bool lanes, int64_t reduce) {
  if (Compensated(step.op, step.src_ctype, step.acc_ctype)) {
    FinalizeCompensated(step.op, reinterpret_cast<const double*>(acc),
                        reinterpret_cast<const double*>(comp), reinterpret_cast<double*>(out),
                        valid, count, lanes, reduce);
    return;
  }
  switch (step.acc_ctype) {
    case ComputeType::kF32:
      FinalizeAs(step.op, reinterpret_cast<const float*>(acc), reinterpret_cast<float*>(out),
                 valid, count, lanes, reduce);
      break;
    case ComputeType::kF64:
      if (step.ctype == ComputeType::kF32) {
        FinalizeAs(step.op, reinterpret_cast<const double*>(acc), reinterpret_cast<float*>(out),
                   valid, count, lanes, reduce);
      } else {
        FinalizeAs(step.op, reinterpret_cast<const double*>(acc), reinterpret_cast<double*>(out),
                   valid, count, lanes, reduce);
      }
      break;
    case ComputeType::kI32:
      FinalizeAs(step.op, reinterpret_cast<const int32_t*>(acc), reinterpret_cast<int32_t*>(out),
                 valid, count, lanes, reduce);
      break;
    case ComputeType::kI64:
      FinalizeAs(step.op, reinterpret_cast<const int64_t*>(acc), reinterpret_cast<int32_t*>(out),
                 valid, count, lanes, reduce);
      break;
    default:
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// Running a schedule.

// Per-thread scratch holding the slots, grown on demand and kept for the thread's life.
char* ThreadScratch(int64_t bytes) {
  struct Buffer {
    void* data = nullptr;
    int64_t size = 0;
    ~Buffer() { std::free(data); }
  };
  thread_local Buffer buffer;
  if (buffer.size < bytes) {
    std::free(buffer.data);
    buffer.data = std::aligned_alloc(64, static_cast<size_t>((bytes + 63) / 64 * 64));
    buffer.size = bytes;
  }
  return static_cast<char*>(buffer.data);
}

template <typename T>
T ImmediateOf(const Loc& loc);
template <>
float ImmediateOf<float>(const Loc& loc) { return loc.imm.f32; }
template <>
double ImmediateOf<double>(const Loc& loc) { return loc.imm.f64; }
template <>
int32_t ImmediateOf<int32_t>(const Loc& loc) { return loc.imm.i32; }
template <>
uint8_t ImmediateOf<uint8_t>(const Loc& loc) { return loc.imm.b; }

// An operand: an immediate, a reduced value read as a scalar (a row reduction, in a full pass),
// or a tile.
template <typename T>
Arg<T> MakeArg(const Loc& loc, const char* address, bool scalar_reduced) {
  if (loc.is(Loc::Kind::kImmediate)) return {nullptr, ImmediateOf<T>(loc)};
  if (loc.is(Loc::Kind::kReduced) && scalar_reduced) {
    return {nullptr, *reinterpret_cast<const T*>(address)};
  }
  return {reinterpret_cast<const T*>(address), T(0)};
}

// The ops whose operands and result are of one type T.
template <typename T>
void RunSameType(const Step& step, const char* const* src, char* dst, int64_t count,
                 bool scalar_reduced) {
  const Arg<T> x = MakeArg<T>(step.src[0], src[0], scalar_reduced);
  const Arg<T> y =
      step.num_src > 1 ? MakeArg<T>(step.src[1], src[1], scalar_reduced) : Arg<T>{nullptr, T(0)};
  T* out = reinterpret_cast<T*>(dst);
  if constexpr (std::is_same_v<T, int32_t>) {
    if (step.num_src == 1) {
      RunIntUnary(step.op, x.data, out, count);
    } else {
      RunIntBinary(step.op, x, y, out, count);
    }
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    RunLogical(step.op, x, y, out, count);
  } else {
    if (step.op == OpCode::kLeakyRelu) {
      RunLeakyRelu<T>(x.data, ImmediateOf<T>(step.attr), out, count);
    } else if (x.data == nullptr && y.data == nullptr) {
      // Both operands scalars (a reduced scalar and an immediate cannot meet in a full pass, but
      // stay safe): compute one element and splat it.
      alignas(64) T a[kPad], b[kPad], r[kPad];
      std::fill_n(a, kPad, x.scalar);
      std::fill_n(b, kPad, y.scalar);
      RunFloat<T>(step.op, Arg<T>{a, T(0)}, Arg<T>{b, T(0)}, r, kPad);
      std::fill_n(out, count, r[0]);
    } else {
      RunFloat<T>(step.op, x, y, out, count);
    }
  }
}

template <typename T>
void RunCompareAs(const Step& step, const char* const* src, char* dst, int64_t count,
                  bool scalar_reduced) {
  RunCompare<T>(step.op, MakeArg<T>(step.src[0], src[0], scalar_reduced),
                MakeArg<T>(step.src[1], src[1], scalar_reduced), reinterpret_cast<uint8_t*>(dst),
                count);
}

template <typename T>
void RunSelectAs(const Step& step, const char* const* src, char* dst, int64_t count,
                 bool scalar_reduced) {
  RunSelect<T>(MakeArg<uint8_t>(step.src[0], src[0], scalar_reduced),
               MakeArg<T>(step.src[1], src[1], scalar_reduced),
               MakeArg<T>(step.src[2], src[2], scalar_reduced), reinterpret_cast<T*>(dst), count);
}

// A reduction of a value that is 1 along the reduced axes, i.e. R copies of x.
template <typename T>
void RunReduceOfReduced(OpCode op, const T* x, T* out, int64_t n, int64_t reduce) {
  for (int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    T r = v;
    if (reduce == 0) {
      r = op == OpCode::kMean && !std::is_integral_v<T> ? std::numeric_limits<T>::quiet_NaN()
                                                        : Identity<T>(op == OpCode::kMean
                                                                          ? OpCode::kSum
                                                                          : op);
    } else if constexpr (std::is_integral_v<T>) {
      if (op == OpCode::kSum) {
        r = Wrap(U(v) * static_cast<uint32_t>(reduce));
      } else if (op == OpCode::kProd) {
        uint32_t p = 1, b = U(v);
        for (int64_t e = reduce; e > 0; e >>= 1, b *= b) {
          if (e & 1) p *= b;
        }
        r = Wrap(p);
      }
    } else {
      if (op == OpCode::kSum) r = static_cast<T>(static_cast<double>(v) * reduce);
      if (op == OpCode::kProd) r = static_cast<T>(std::pow(static_cast<double>(v), reduce));
    }
    out[i] = r;
  }
}

void RunCompute(const Step& step, const char* const* src, char* dst, int64_t count,
                bool scalar_reduced, int64_t reduce) {
  if (IsReduction(step.op)) {
    switch (step.ctype) {
      case ComputeType::kF32:
        RunReduceOfReduced(step.op, reinterpret_cast<const float*>(src[0]),
                           reinterpret_cast<float*>(dst), count, reduce);
        break;
      case ComputeType::kF64:
        RunReduceOfReduced(step.op, reinterpret_cast<const double*>(src[0]),
                           reinterpret_cast<double*>(dst), count, reduce);
        break;
      case ComputeType::kI32:
        RunReduceOfReduced(step.op, reinterpret_cast<const int32_t*>(src[0]),
                           reinterpret_cast<int32_t*>(dst), count, reduce);
        break;
      default:
        break;
    }
    return;
  }
  switch (step.op) {
    case OpCode::kCast:
      RunCast(step.src_ctype, step.dtype, src[0], dst, count);
      return;
    case OpCode::kZerosLike:
    case OpCode::kOnesLike:
      Fill(step.ctype, step.op == OpCode::kOnesLike, dst, count);
      return;
    case OpCode::kIsNan:
    case OpCode::kIsInf:
    case OpCode::kIsFinite:
      if (step.src_ctype == ComputeType::kF64) {
        RunClassify(step.op, reinterpret_cast<const double*>(src[0]),
                    reinterpret_cast<uint8_t*>(dst), count);
      } else {
        RunClassify(step.op, reinterpret_cast<const float*>(src[0]),
                    reinterpret_cast<uint8_t*>(dst), count);
      }
      return;
    case OpCode::kGreater: case OpCode::kGreaterEqual: case OpCode::kLess:
    case OpCode::kLessEqual: case OpCode::kEqual: case OpCode::kNotEqual:
      switch (step.src_ctype) {
        case ComputeType::kF32: RunCompareAs<float>(step, src, dst, count, scalar_reduced); break;
        case ComputeType::kF64: RunCompareAs<double>(step, src, dst, count, scalar_reduced); break;
        case ComputeType::kI32: RunCompareAs<int32_t>(step, src, dst, count, scalar_reduced); break;
        case ComputeType::kBool: break;
      }
      return;
    case OpCode::kSelect:
      switch (step.ctype) {
        case ComputeType::kF32: RunSelectAs<float>(step, src, dst, count, scalar_reduced); break;
        case ComputeType::kF64: RunSelectAs<double>(step, src, dst, count, scalar_reduced); break;
        case ComputeType::kI32: RunSelectAs<int32_t>(step, src, dst, count, scalar_reduced); break;
        case ComputeType::kBool: RunSelectAs<uint8_t>(step, src, dst, count, scalar_reduced); break;
      }
      return;
    default:
      break;
  }
  switch (step.ctype) {
    case ComputeType::kF32:
      RunSameType<float>(step, src, dst, count, scalar_reduced);
      break;
    case ComputeType::kF64:
      RunSameType<double>(step, src, dst, count, scalar_reduced);
      break;
    case ComputeType::kI32:
      RunSameType<int32_t>(step, src, dst, count, scalar_reduced);
      break;
    case ComputeType::kBool:
      RunSameType<uint8_t>(step, src, dst, count, scalar_reduced);
      break;
  }
}

// Rough CPU cycles per element: the ops, and moving the bytes (about 2 bytes a cycle).
int64_t ProgramCostPerElement(const Program& program) {
  int64_t cost = 0;
  for (const Instruction& inst : program.instructions) {
    const int op_cost = GetOpInfo(inst.op).cost;
    // f64 transcendentals run the C library's scalar functions
    cost += inst.operand_dtype == DType::kF64 && op_cost > 1 ? 8 * op_cost : op_cost;
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

// ---------------------------------------------------------------------------------------------
// Strip fusion (see StripRun): finding the runs when a schedule is planned, running them.

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

// One packet of f16 widened to fp32, and one fp32 packet rounded to f16 (to nearest even, as
// WidenHalf and NarrowToHalf: the same instructions where they exist).
EIGEN_STRONG_INLINE FloatPacket LoadHalfPacket(const char* p) {
#if defined(EIGEN_VECTORIZE_AVX512)
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(EIGEN_VECTORIZE_AVX) && defined(TF_AUTOFUSE_X86_CONVERT)
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  constexpr int64_t kSize = Eigen::internal::unpacket_traits<FloatPacket>::size;
  alignas(64) float wide[kSize];
  WidenHalf(reinterpret_cast<const Eigen::half*>(p), wide, kSize);
  return Eigen::internal::pload<FloatPacket>(wide);
#endif
}

EIGEN_STRONG_INLINE void StoreHalfPacket(char* p, const FloatPacket& v, bool stream) {
#if defined(EIGEN_VECTORIZE_AVX512)
  const __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  if (stream) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), h);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
  }
#else
  constexpr int64_t kSize = Eigen::internal::unpacket_traits<FloatPacket>::size;
  alignas(64) float wide[kSize];
  Eigen::internal::pstore(wide, v);
  NarrowToHalf(wide, reinterpret_cast<Eigen::half*>(p), kSize, stream);
#endif
}

// d[0, n) = f(a[0, n)) where a is f16 (kHalfIn) or fp32 and d is f16 (kHalfOut, stored
// non-temporally when `stream`, d then 32-byte aligned) or fp32.
template <bool kHalfIn, bool kHalfOut, typename F>
void MapHalfPackets(const char* a, char* d, bool stream, int64_t n, F f) {
  using Eigen::internal::ploadu;
  using Eigen::internal::pstoreu;
  constexpr int64_t kSize = Eigen::internal::unpacket_traits<FloatPacket>::size;
  for (int64_t i = 0; i < n; i += kSize) {
    const FloatPacket x = kHalfIn ? LoadHalfPacket(a + 2 * i)
                                  : ploadu<FloatPacket>(reinterpret_cast<const float*>(a) + i);
    if constexpr (kHalfOut) {
      StoreHalfPacket(d + 2 * i, f(x), stream);
    } else {
      pstoreu(reinterpret_cast<float*>(d) + i, f(x));
    }
  }
}

// d[0, n) = f(a[...], b[...]) over whole packets; an operand with `tile` false is one value
// splat.
template <typename F>
EIGEN_STRONG_INLINE void StripBinary(const float* a, bool a_tile, const float* b, bool b_tile,
                                     float* d, int64_t n, F f) {
  using Eigen::internal::ploadu;
  using Eigen::internal::pset1;
  using Eigen::internal::pstoreu;
  constexpr int64_t kSize = Eigen::internal::unpacket_traits<FloatPacket>::size;
  if (a_tile && b_tile) {
    for (int64_t i = 0; i < n; i += kSize) {
      pstoreu(d + i, f(ploadu<FloatPacket>(a + i), ploadu<FloatPacket>(b + i)));
    }
  } else if (a_tile) {
    const FloatPacket y = pset1<FloatPacket>(*b);
    for (int64_t i = 0; i < n; i += kSize) pstoreu(d + i, f(ploadu<FloatPacket>(a + i), y));
  } else {
    const FloatPacket x = pset1<FloatPacket>(*a);
    const FloatPacket y = b_tile ? FloatPacket() : pset1<FloatPacket>(*b);
    for (int64_t i = 0; i < n; i += kSize) {
      pstoreu(d + i, f(x, b_tile ? ploadu<FloatPacket>(b + i) : y));
    }
  }
}

// The unary instructions strips run: unary(f) maps the packet function f over the strip; false
// for any other op. StripCompute and StripComputeHalf share it.
template <typename Unary>
EIGEN_ALWAYS_INLINE bool ApplyUnary(OpCode op, float alpha, const Unary& unary) {
  namespace ei = Eigen::internal;
  using P = FloatPacket;
  using Eigen::PropagateNaN;
  switch (op) {
    case OpCode::kAbs: unary([](const P& x) { return ei::pabs(x); }); break;
    case OpCode::kNeg: unary([](const P& x) { return ei::pnegate(x); }); break;
    case OpCode::kSquare: unary([](const P& x) { return ei::pmul(x, x); }); break;
    case OpCode::kSqrt: unary([](const P& x) { return ei::psqrt(x); }); break;
    case OpCode::kRelu:
#if defined(EIGEN_VECTORIZE_SSE) || defined(EIGEN_VECTORIZE_AVX) || defined(EIGEN_VECTORIZE_AVX512)
      // one maxps(0, x) (Eigen's pmax(a, b) is maxps(b, a)), which returns its second operand
      // x when x is NaN or both are zeros: x < 0 ? 0 : x, as the tile path's
      unary([](const P& x) { return ei::pmax(x, ei::pzero(x)); });
#else
      unary([](const P& x) {
        return ei::pselect(ei::pcmp_lt(x, ei::pzero(x)), ei::pzero(x), x);
      });
#endif
      break;
    case OpCode::kRelu6:
      unary([](const P& x) {
        return ei::pmin<PropagateNaN>(ei::pmax<PropagateNaN>(x, ei::pzero(x)),
                                      ei::pset1<P>(6.0f));
      });
      break;
    case OpCode::kLeakyRelu: {
      const P scale = ei::pset1<P>(alpha);
      unary([&scale](const P& x) {
        return ei::pselect(ei::pcmp_lt(x, ei::pzero(x)), ei::pmul(x, scale), x);
      });
      break;
    }
    case OpCode::kExp: unary([](const P& x) { return ExpPacket(x); }); break;
    case OpCode::kSigmoid: unary([](const P& x) { return SigmoidPacket(x); }); break;
    case OpCode::kErfc: unary([](const P& x) { return ErfcPacket(x); }); break;
    case OpCode::kTanh: unary([](const P& x) { return ei::ptanh(x); }); break;
    default:
      return false;
  }
  return true;
}

// One instruction of a run over n elements of a strip.
// Always inlined into RunStrips: called out of line (as g++ chose once RunStrips grew), the fp32
// strip workloads ran 20-40 % slower.
EIGEN_ALWAYS_INLINE void StripCompute(OpCode op, const float* a, bool a_tile, const float* b,
                                      bool b_tile, float alpha, float* d, int64_t n) {
  namespace ei = Eigen::internal;
  using P = FloatPacket;
  using Eigen::PropagateNaN;
  alignas(64) float splat[kStrip];
  if (!a_tile && GetOpInfo(op).arity == 1) {  // a unary op of an immediate, over the strip
    std::fill_n(splat, n, *a);
    a = splat;
  }
  if (ApplyUnary(op, alpha, [&](auto f) { MapPackets<P>(a, d, n, f); })) return;
  auto binary = [&](auto f) { StripBinary(a, a_tile, b, b_tile, d, n, f); };
  switch (op) {
    case OpCode::kAdd: binary([](const P& x, const P& y) { return ei::padd(x, y); }); break;
    case OpCode::kSub: binary([](const P& x, const P& y) { return ei::psub(x, y); }); break;
    case OpCode::kMul: binary([](const P& x, const P& y) { return ei::pmul(x, y); }); break;
    case OpCode::kDiv: binary([](const P& x, const P& y) { return ei::pdiv(x, y); }); break;
    case OpCode::kMaximum:
      binary([](const P& x, const P& y) { return ei::pmax<PropagateNaN>(x, y); });
      break;
    case OpCode::kMinimum:
      binary([](const P& x, const P& y) { return ei::pmin<PropagateNaN>(x, y); });
      break;
    case OpCode::kSquaredDifference:
      binary([](const P& x, const P& y) {
        const P diff = ei::psub(x, y);
        return ei::pmul(diff, diff);
      });
      break;
    default:
      break;
  }
}

// A unary instruction with its f16 load (half_in) and/or f16 store (half_out) folded in. Out of
// line: three loops per op, which RunStrips need not carry inline.
EIGEN_DONT_INLINE void StripComputeHalf(OpCode op, const char* a, bool half_in, char* d,
                                        bool half_out, bool stream, float alpha, int64_t n) {
  if (half_in && half_out) {
    ApplyUnary(op, alpha, [&](auto f) { MapHalfPackets<true, true>(a, d, stream, n, f); });
  } else if (half_in) {
    ApplyUnary(op, alpha, [&](auto f) { MapHalfPackets<true, false>(a, d, stream, n, f); });
  } else {
    ApplyUnary(op, alpha, [&](auto f) { MapHalfPackets<false, true>(a, d, stream, n, f); });
  }
}

// What one schedule run reads and writes.
struct Frame {
  const RunShape& run;
  const IoBuffers& io;
  const PlanSet& plans;
  char* scratch;
  bool lanes;  // a row reduction (inner == 1): reduced values are scalars in full passes
  bool rows;   // row-group mode: tiles of whole rows, reduced values expanded per row
  bool cols;   // column-group mode: tiles of whole inner blocks, reduced values tiled
  KernelProfile* profile;  // --kernel_profile: time every step; null: off
  // Kept values: the tiles a kept buffer holds (row-group mode: 1; kept-row mode: the tiles of a
  // row, the tile at offset o * reduce + r0 being number r0 / tile_size); 0: nothing kept.
  int64_t kept_tiles = 0;
  bool prefetch = false;  // strip runs prefetch their tensor inputs (kPrefetchElements)
  // Per input: its row repeated (RepeatedRows), or null; null: no such input.
  const float* const* repeated = nullptr;
};

std::string LocString(const Loc& loc) {
  switch (loc.kind) {
    case Loc::Kind::kSlot:
      return absl::StrCat("slot", loc.index);
    case Loc::Kind::kInput:
      return absl::StrCat("in", loc.index);
    case Loc::Kind::kOutput:
      return absl::StrCat("out", loc.index);
    case Loc::Kind::kReduced:
      return absl::StrCat("reduced", loc.index);
    case Loc::Kind::kAccumulator:
      return absl::StrCat("acc", loc.index);
    case Loc::Kind::kKept:
      return absl::StrCat("kept", loc.index);
    case Loc::Kind::kImmediate:
      return "imm";
  }
  return "?";
}

// What a step does, for the kernel profile: "Exp slot1 <- slot0", "load in0 (f16)"...
std::string StepLabel(const Step& step) {
  std::vector<std::string> srcs;
  for (int i = 0; i < step.num_src; ++i) srcs.push_back(LocString(step.src[i]));
  const std::string from = absl::StrJoin(srcs, ", ");
  switch (step.kind) {
    case Step::Kind::kLoad:
      return absl::StrCat("load ", LocString(step.src[0]), " (", DTypeName(step.dtype), ")");
    case Step::Kind::kBroadcastLoad:
      return absl::StrCat("broadcast load ", LocString(step.src[0]), " (", DTypeName(step.dtype),
                          ")");
    case Step::Kind::kCompute:
      return absl::StrCat(GetOpInfo(step.op).name, " ", LocString(step.dst), " <- ", from);
    case Step::Kind::kConvertStore:
      return absl::StrCat("store ", LocString(step.dst), " (", DTypeName(step.dtype),
                          step.stream ? ", streaming" : "", ")");
    case Step::Kind::kCopyStore:
      return absl::StrCat("copy ", LocString(step.dst), " <- ", from);
    case Step::Kind::kAccumulate:
      return absl::StrCat("accumulate ", GetOpInfo(step.op).name, " ", LocString(step.dst),
                          " <- ", from);
    case Step::Kind::kFinalize:
      return absl::StrCat("finalize ", GetOpInfo(step.op).name, " ", LocString(step.dst));
    case Step::Kind::kExpandReduced:
      return absl::StrCat("expand ", LocString(step.src[0]), " over its rows");
  }
  return "?";
}

// Where one operand of a run's op is for this tile: element i of a strip at data + i * moves
// (moves 0: a register's strip buffer, or one value splat).
struct StripPointer {
  const char* data = nullptr;
  int64_t moves = 0;  // bytes per element of the tile
  bool tile = true;   // false: one value, splat
  const float* at(int64_t i) const { return reinterpret_cast<const float*>(data + i * moves); }
};

// A run over one full tile of `count` elements, strip after strip. The operands' addresses are
// resolved once for the tile.
template <typename Address>
void RunStrips(const Schedule& schedule, const StripRun& run, const Frame& frame,
               const Address& address, bool scalar_reduced, int64_t offset, int64_t count) {
  alignas(64) float registers[kMaxStripRegisters * kStrip];
  struct Resolved {
    StripPointer src[2];
    char* home = nullptr;  // the tensor or buffer written (kStore, kAccumulate, write-back)
    int64_t home_moves = 0;
    bool skipped = false;  // folded into its neighbour, or a broadcast load read in place
  };
  thread_local std::vector<Resolved> per_thread;  // reached once: a TLS lookup is a call
  per_thread.assign(run.ops.size(), Resolved());
  Resolved* resolved = per_thread.data();
  auto pointer = [&](const StripOperand& o) {
    StripPointer p;
    switch (o.kind) {
      case StripOperand::Kind::kRegister:
        p.data = reinterpret_cast<const char*>(registers + o.reg * kStrip);
        break;
      case StripOperand::Kind::kImmediate:
        p.data = reinterpret_cast<const char*>(&o.loc.imm.f32);
        p.tile = false;
        break;
      case StripOperand::Kind::kMemory:
        p.data = address(o.loc);
        p.tile = !(o.loc.is(Loc::Kind::kReduced) && scalar_reduced);
        // a tensor's element size, or a buffer's fp32 (slots, kept and reduced buffers)
        p.moves = !p.tile ? 0 : o.loc.elem_size > 0 ? o.loc.elem_size : sizeof(float);
        break;
    }
    return p;
  };
  // The tensor inputs read strip after strip (a broadcast one is read by its plan), each once,
  // prefetched ahead (Frame::prefetch).
  const char* ahead[kMaxPrefetchStreams];
  int64_t ahead_moves[kMaxPrefetchStreams];
  int num_ahead = 0;
  auto prefetch_input = [&](const StripPointer& p) {
    for (int s = 0; s < num_ahead; ++s) {
      if (ahead[s] == p.data) return;
    }
    if (num_ahead < kMaxPrefetchStreams) {
      ahead[num_ahead] = p.data;
      ahead_moves[num_ahead++] = p.moves;
    }
  };
  for (size_t k = 0; k < run.ops.size(); ++k) {
    const StripOp& op = run.ops[k];
    Resolved& r = resolved[k];
    for (int m = 0; m < op.num_src; ++m) {
      r.src[m] = pointer(op.src[m]);
      if (frame.prefetch && op.kind != StripOp::Kind::kBroadcastLoad &&
          op.src[m].kind == StripOperand::Kind::kMemory && op.src[m].loc.is(Loc::Kind::kInput)) {
        prefetch_input(r.src[m]);
      }
    }
    if (op.kind == StripOp::Kind::kStore) {
      r.home = address(op.home);
      r.home_moves = op.home.elem_size;
    } else if (op.kind == StripOp::Kind::kAccumulate) {
      r.home = address(op.home);  // lanes: one scalar of kLanes lanes (strips start at
                                  // multiples of kLanes); else an accumulator per element
      r.home_moves = frame.lanes ? 0 : ComputeSize(schedule.steps[op.step].acc_ctype);
    } else if (op.half_out) {
      r.home = address(op.home);
      r.home_moves = op.home.elem_size;
    } else if (op.write_back) {
      r.home = address(op.home);
      r.home_moves = sizeof(float);
    }
  }
  // A broadcast input whose values for this tile are one contiguous run somewhere, of its
  // repeated row (RepeatedRows: a short bias) or, in f32, of the tensor itself (a bias row as
  // long as the tile, or longer): the readers of its load's value (StripOp::readers) read them
  // in place, and the load (a copy per strip) is skipped.
  for (size_t k = 0; k < run.ops.size(); ++k) {
    const StripOp& op = run.ops[k];
    resolved[k].skipped = op.skipped;
    if (op.kind != StripOp::Kind::kBroadcastLoad || op.write_back) continue;
    const int j = op.src[0].loc.index;
    const BroadcastPlan& plan = frame.run.full_plans[j];
    StripPointer in_place;
    in_place.moves = sizeof(float);
    int64_t first = 0;
    if (frame.repeated != nullptr && frame.repeated[j] != nullptr) {
      in_place.data = reinterpret_cast<const char*>(frame.repeated[j] + offset % plan.dims[1]);
    } else if (op.dtype == DType::kF32 && ReadsOneRun(plan, offset, count, &first)) {
      in_place.data = frame.io.inputs[j] + first * sizeof(float);
    } else {
      continue;
    }
    resolved[k].skipped = true;
    for (int m : op.readers) {
      for (int s = 0; s < run.ops[m].num_src; ++s) {
        const StripOperand& o = run.ops[m].src[s];
        if (o.kind == StripOperand::Kind::kRegister && o.reg == op.dst) {
          resolved[m].src[s] = in_place;
        }
      }
    }
  }
  // --kernel_profile: each op timed strip by strip, reported as its step's row
  std::chrono::steady_clock::time_point started;
  thread_local std::vector<int64_t> spent_per_thread;
  int64_t* spent = nullptr;
  if (frame.profile != nullptr) {
    spent_per_thread.assign(run.ops.size(), 0);
    spent = spent_per_thread.data();
  }
  for (int64_t i = 0; i < count; i += kStrip) {
    const int64_t n = std::min(kStrip, count - i);
    for (int s = 0; s < num_ahead; ++s) {  // a hint: no fault past a tensor's end
      const char* lines = ahead[s] + i * ahead_moves[s] + kPrefetchAhead;
      for (int64_t b = 0; b < n * ahead_moves[s]; b += 64) __builtin_prefetch(lines + b, 0, 3);
    }
    for (size_t k = 0; k < run.ops.size(); ++k) {
      const StripOp& op = run.ops[k];
      const Resolved& r = resolved[k];
      if (r.skipped) continue;
      if (spent != nullptr) started = std::chrono::steady_clock::now();
      float* dst = op.dst >= 0 ? registers + op.dst * kStrip : nullptr;
      switch (op.kind) {
        case StripOp::Kind::kLoad:
          LoadTile(op.dtype, r.src[0].data + i * r.src[0].moves, reinterpret_cast<char*>(dst),
                   n, n);
          break;
        case StripOp::Kind::kBroadcastLoad: {
          const int j = op.src[0].loc.index;
          BroadcastLoad(frame.run.full_plans[j], op.dtype, frame.io.inputs[j],
                        reinterpret_cast<char*>(dst), offset + i, n, n);
          break;
        }
        case StripOp::Kind::kAccumulate: {
          char* acc = r.home + i * r.home_moves;
          Accumulate(schedule.steps[op.step], reinterpret_cast<const char*>(r.src[0].at(i)), acc,
                     acc + frame.plans.buffer_bytes, n, frame.lanes);
          break;
        }
        case StripOp::Kind::kCompute:
          if (op.half_in || op.half_out) {
            StripComputeHalf(op.op, r.src[0].data + i * r.src[0].moves, op.half_in,
                             op.half_out ? r.home + i * r.home_moves
                                         : reinterpret_cast<char*>(dst),
                             op.half_out, op.stream, op.alpha, n);
            break;
          }
          StripCompute(op.op, r.src[0].at(i), r.src[0].tile,
                       op.num_src > 1 ? r.src[1].at(i) : nullptr, r.src[1].tile, op.alpha, dst,
                       n);
          break;
        case StripOp::Kind::kStore:
          StoreTile(op.dtype, reinterpret_cast<const char*>(r.src[0].at(i)),
                    r.home + i * r.home_moves, n, op.stream);
          break;
      }
      if (op.write_back) std::memcpy(r.home + i * r.home_moves, dst, n * sizeof(float));
      if (spent != nullptr) {
        spent[k] += std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now() - started).count();
      }
    }
  }
  for (size_t k = 0; spent != nullptr && k < run.ops.size(); ++k) {
    const Step& step = schedule.steps[run.ops[k].step];
    // the label of the step's first tile (a bias may be read in place in some tiles only)
    const char* how = run.ops[k].skipped ? " (in strips, folded into its neighbour)"
                      : resolved[k].skipped ? " (in strips, read in place)"
                                            : " (in strips)";
    frame.profile->AddStep(
        &step, [&step, how] { return absl::StrCat(StepLabel(step), how); }, spent[k], count);
  }
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
        RunCompute(step, src, address(step.dst), count, scalar_reduced, frame.run.reduce);
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
  set->has_final = !program_.has_reductions();
  for (int k = 0; k < static_cast<int>(program_.outputs.size()); ++k) {
    if (!program_.OutputReduced(k)) set->has_final = true;
  }
  const KeptValues kept = program_.has_reductions() ? PlanKeptValues(program_, set->has_final)
                                                    : KeptValues();
  set->num_kept = kept.count;
  auto build = [&](Access access, Pass pass) {
    return Planner(program_, broadcast, access, pass, reduced_index, accumulator_index, &kept)
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

  set->forwardable.resize(program_.outputs.size());
  for (int k = 0; k < static_cast<int>(program_.outputs.size()); ++k) {
    if (program_.OutputReduced(k) || !set->has_final) continue;
    const DType out_dtype = program_.OutputDType(k);
    for (size_t j = 0; j < program_.inputs.size(); ++j) {
      if (program_.inputs[j].dtype != out_dtype || broadcast[j] || program_.inputs[j].reduced) {
        continue;
      }
      bool safe = true;
      for (const PassSchedules* pass :
           {&set->final, &set->rows_final, &set->cols_final, &set->kept_row_final}) {
        for (const Schedule* s : {&pass->direct, &pass->streaming, &pass->staged}) {
          if (s->empty()) continue;
          if (s->last_input_read[j] > s->first_output_write[k]) safe = false;
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
}  // namespace

int64_t Interpreter::NumItems(const RunShape& run) const {
  const int64_t tile = run.plans->tile_size;
  if (!program_.has_reductions()) return (run.num_elements + tile - 1) / tile;
  const int64_t group = RowsPerItem(run, tile);
  if (group > 1) return (run.outer + group - 1) / group;
  const int64_t chunks = run.inner == 1 ? 1 : (run.inner + tile - 1) / tile;
  return run.outer * chunks;
}

int64_t Interpreter::TotalCost(const RunShape& run) const {
  const int64_t passes = program_.num_levels + 1;
  return std::max<int64_t>(run.num_elements, 1) * cost_per_element_ * passes;
}

int64_t Interpreter::CostPerItem(const RunShape& run) const {
  return TotalCost(run) / std::max<int64_t>(NumItems(run), 1) + 1;
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

void Interpreter::RunItems(const RunShape& run, const IoBuffers& io, int64_t first,
                           int64_t last) const {
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
    for (int64_t item = first; item < last; ++item) {
      const int64_t o = frame.rows ? item * group : item / chunks;
      const int64_t i0 = frame.rows ? 0 : (item % chunks) * tile;
      // Reduced elements of this item: an inner chunk, or (row-group mode) rows.
      const int64_t width =
          frame.rows ? std::min(group, run.outer - o) : std::min(tile, inner - i0);
      const int64_t reduced_offset = o * inner + i0;
      const int64_t reduced_count = (width + kPad - 1) / kPad * kPad;
      // Every full tile of this item, in order.
      auto for_tiles = [&](const PassSchedules& s, bool streaming) {
        if (frame.rows) {
          full_tile(s, streaming, o * reduce, width * reduce);
        } else if (frame.cols) {
          for (int64_t r0 = 0; r0 < reduce; r0 += blocks) {
            full_tile(s, streaming, (o * reduce + r0) * inner,
                      std::min(blocks, reduce - r0) * inner);
          }
        } else if (frame.lanes) {
          for (int64_t r0 = 0; r0 < reduce; r0 += tile) {
            full_tile(s, streaming, o * reduce + r0, std::min(tile, reduce - r0));
          }
        } else {
          for (int64_t r = 0; r < reduce; ++r) {
            full_tile(s, streaming, (o * reduce + r) * inner + i0, width);
          }
        }
      };
      auto finalize = [&](int level) {
        const Schedule& s = plans.finalize[level];
        if (!s.empty()) RunSchedule(s, frame, true, reduced_offset, width, reduced_count);
      };
      finalize(0);
      for (int p = 1; p <= program_.num_levels; ++p) {
        for (const Step& step : plans.finalize[p].steps) {
          if (step.kind != Step::Kind::kFinalize) continue;
          char* acc = scratch + plans.accumulator_offset +
                      step.src[0].index * 2 * plans.buffer_bytes;
          InitAccumulator(step, acc, acc + plans.buffer_bytes,
                          frame.lanes && !frame.rows ? kLanes : reduced_count);
        }
        for_tiles(frame.rows   ? plans.rows_accumulate[p - 1]
                  : frame.cols ? plans.cols_accumulate[p - 1]
                  : kept_rows  ? plans.kept_row_accumulate[p - 1]
                               : plans.accumulate[p - 1],
                  false);
        finalize(p);
      }
      if (plans.has_final) {
        for_tiles(frame.rows   ? plans.rows_final
                  : frame.cols ? plans.cols_final
                  : kept_rows  ? plans.kept_row_final
                               : plans.final,
                  stream);
      }
    }
  }
#ifdef TF_AUTOFUSE_X86_CONVERT
  if (stream) _mm_sfence();  // non-temporal stores are visible before the caller moves on
#endif
}

}  // namespace tf_autofuse

// C entry point for tf_autofuse/_native.py (ctypes): AUTOFUSE_DFX_FLAGS=--strip_fusion=false
// turns strip fusion off for the kernels planned afterwards (for measuring what it brings).
extern "C" __attribute__((visibility("default"))) void autofuse_set_strip_fusion(int on) {
  tf_autofuse::strip_fusion_enabled.store(on != 0);
}
