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

  // The run is split into independent work items (tiles of an elementwise program; rows, or
  // chunks of the inner dimensions, of a reduction). Rough CPU cycles per item and in total, for
  // the thread pool's cost model.
  int64_t NumItems(const RunShape& run) const;
  int64_t CostPerItem(const RunShape& run) const;
  int64_t TotalCost(const RunShape& run) const;

  // Runs items [first, last). Thread-safe: calls on disjoint item ranges may run concurrently.
  // Results do not depend on how the items are split between calls.
  void RunItems(const RunShape& run, const IoBuffers& io, int64_t first, int64_t last) const;

  // From now on every step of every tile is timed into `profile` (kernel_profile.h); null: off.
  void set_profile(KernelProfile* profile) { profile_ = profile; }

 private:
  const PlanSet& PlansFor(const std::vector<bool>& broadcast) const;

  Program program_;
  int64_t cost_per_element_ = 0;
  KernelProfile* profile_ = nullptr;
  mutable std::mutex mu_;
  mutable std::map<std::vector<bool>, std::unique_ptr<PlanSet>> plans_;
};

}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CC_INTERPRETER_H_
