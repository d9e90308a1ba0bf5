// The plan of a fused program on the CPU: compute types, tile constants, and the schedule
// data (Loc, Step, strip runs, Schedule, PlanSet) that the planner (planner.h, strip_plan.h)
// builds and the executor (step.h, strip_run.h, interpreter.cc) carries out.
//
// Part of the CPU interpreter's one translation unit: included by interpreter.cc (and by the
// parts after it), never compiled alone, so that the hot loops inline across the parts.

#ifndef TF_AUTOFUSE_CC_CPU_SCHEDULE_H_
#define TF_AUTOFUSE_CC_CPU_SCHEDULE_H_

#include <cstdint>
#include <vector>

#include "../interpreter.h"
#include "../program.h"

namespace tf_autofuse {

// Schedule: what runs on every tile (the data the planner builds and the executor reads).

// The type values are computed in: 16-bit floats are computed in fp32; bool is a byte, 0 or 1.
// kI64 is only an accumulator type (i32 Mean).
enum class ComputeType : uint8_t { kF32, kF64, kI32, kBool, kI64 };

inline ComputeType ComputeTypeOf(DType dtype) {
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

inline int ComputeSize(ComputeType type) {
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
inline bool IsComputedAsStored(DType dtype) {
  return dtype != DType::kF16 && dtype != DType::kBF16;
}

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
inline ComputeType AccumulatorType(OpCode op, DType dtype) {
  if (dtype == DType::kI32) return op == OpCode::kMean ? ComputeType::kI64 : ComputeType::kI32;
  if (op == OpCode::kMax || op == OpCode::kMin) return ComputeTypeOf(dtype);
  return dtype == DType::kF16 || dtype == DType::kBF16 ? ComputeType::kF32 : ComputeType::kF64;
}

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
// load or store and compute-bound arithmetic. 256-element strips measured best of 64..512;
// `benchmarks/run.py --autofuse-dfx-flags=--strip_fusion=false` measures what strips bring.
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

}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CC_CPU_SCHEDULE_H_
