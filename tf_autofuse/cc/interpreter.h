// The tiled CPU interpreter of a fused program. See interpreter.cc for the plan.

#ifndef TF_AUTOFUSE_CC_INTERPRETER_H_
#define TF_AUTOFUSE_CC_INTERPRETER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "kernel_profile.h"
#include "program.h"

namespace tf_autofuse {

struct PlanSet;  // interpreter.cc: the schedules of one broadcast pattern

// The raw buffers of one run, indexed like the program's inputs and outputs. An output may be an
// input's buffer when ForwardableInputs allowed it.
struct IoBuffers {
  std::vector<const char*> inputs;
  std::vector<char*> outputs;
  // A split run's memory shared by its phases (Interpreter::SharedBytes): reduced values and
  // the partial accumulators of every block. Null when the run is not split.
  char* shared = nullptr;
};

// How one input is read broadcast over an iteration space: the space's dimensions, collapsed so
// that adjacent dimensions along which the input is either read or stretched alike are one, and
// the input's element stride along each (0 where it is stretched, else the number of input
// elements per step).
struct BroadcastPlan {
  std::vector<int64_t> dims;     // outermost first; never empty
  std::vector<int64_t> strides;  // 0 or the contiguous stride
};

// The geometry of one run, from the runtime input shapes (Interpreter::Prepare).
struct RunShape {
  std::vector<int64_t> iteration;  // the numpy broadcast of the input views
  int64_t num_elements = 0;        // of the iteration shape
  // Programs with reductions: the iteration shape as [outer, reduce, inner] around the reduced
  // axes, and the reduced shape (the reduced axes set to 1).
  std::vector<int64_t> reduced;
  int64_t outer = 1, reduce = 1, inner = 1;
  std::vector<bool> broadcast;               // per input: stretched (not the iteration's size)
  std::vector<BroadcastPlan> full_plans;     // per input, over the iteration shape
  std::vector<BroadcastPlan> reduced_plans;  // per input read as a reduced value
  std::vector<std::vector<int64_t>> outputs; // the shape of every output
  const PlanSet* plans = nullptr;            // the schedules for this broadcast pattern
  // A reduction with few work items and a long R is split along R (interpreter.cc, SplitRun):
  // `split` blocks of `split_rows` consecutive r each (the last one shorter); 1: not split.
  int64_t split = 1, split_rows = 0;
};

// A run is a sequence of phases; the work items of one phase are independent of each other,
// and a phase starts when the one before it has finished. A run that is not split is one phase,
// kAll: every item computed pass by pass. A split run has a phase per pass: kFinalize (level p:
// the blocks' partial accumulators of each item folded in block order, then finalize p; level
// 0: the reduced values that need no reduction), kAccumulate (pass p of every block of every
// item) and kFinal (the final pass of every block).
struct Phase {
  enum class Kind : uint8_t { kAll, kFinalize, kAccumulate, kFinal };
  Kind kind = Kind::kAll;
  int level = 0;
};

class Interpreter {
 public:
  // `program` must have passed ParseProgram.
  explicit Interpreter(Program program);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  const Program& program() const { return program_; }

  // Resolves the views against the runtime input shapes, broadcasts them into the iteration
  // shape and finds the output shapes. InvalidArgument (naming the shapes, not the kernel) when
  // they do not fit. Plans the schedules of a new broadcast pattern once (thread-safe).
  absl::Status Prepare(const std::vector<std::vector<int64_t>>& input_shapes,
                       RunShape* run) const;

  // The inputs whose buffer output `k` may reuse in this run: same dtype, not broadcast, and
  // within a tile every read of the input happens no later than the first write of the output.
  // The caller must also check that the shapes are equal.
  const std::vector<int>& ForwardableInputs(const RunShape& run, int k) const;

  // The phases of the run, in order (Phase).
  std::vector<Phase> Phases(const RunShape& run) const;
  // Bytes of IoBuffers::shared a split run needs; 0 when it is not split.
  int64_t SharedBytes(const RunShape& run) const;

  // A phase is split into independent work items (tiles of an elementwise program; rows, or
  // chunks of the inner dimensions, of a reduction; and of a split run, blocks of R). Rough CPU
  // cycles per item and in total, for the thread pool's cost model.
  int64_t NumItems(const RunShape& run, Phase phase = {}) const;
  int64_t CostPerItem(const RunShape& run, Phase phase = {}) const;
  int64_t TotalCost(const RunShape& run, Phase phase = {}) const;

  // Runs items [first, last) of `phase`. Thread-safe: calls on disjoint item ranges of one phase
  // may run concurrently. Results do not depend on how the items are split between calls, nor
  // (phases run in order) on the threads that ran them.
  void RunItems(const RunShape& run, const IoBuffers& io, int64_t first, int64_t last,
                Phase phase = {}) const;
  // Every phase of the run on this thread, in order (io.shared set by the caller if split).
  void RunAll(const RunShape& run, const IoBuffers& io) const;

  // From now on every step of every tile is timed into `profile` (kernel_profile.h); null: off.
  void set_profile(KernelProfile* profile) { profile_ = profile; }

 private:
  const PlanSet& PlansFor(const std::vector<bool>& broadcast) const;
  // Sets run->split and run->split_rows (interpreter.cc, "Split runs"); run->plans must be set.
  void SplitRun(RunShape* run) const;

  Program program_;
  int64_t cost_per_element_ = 0;
  KernelProfile* profile_ = nullptr;
  mutable std::mutex mu_;
  mutable std::map<std::vector<bool>, std::unique_ptr<PlanSet>> plans_;
};

}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CC_INTERPRETER_H_
