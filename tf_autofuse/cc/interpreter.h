// The tiled CPU interpreter of a fused program. See interpreter.cc for the plan.

#ifndef TF_AUTOFUSE_CC_INTERPRETER_H_
#define TF_AUTOFUSE_CC_INTERPRETER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "program.h"

namespace tf_autofuse {

struct Schedule;  // interpreter.cc

// The raw buffers of one run, indexed like the program's inputs and outputs. Every buffer holds
// the same number of elements (elementwise programs); an output may be an input's buffer when
// ForwardableInputs allowed it.
struct IoBuffers {
  std::vector<const char*> inputs;
  std::vector<char*> outputs;
};

class Interpreter {
 public:
  // `program` must have passed ParseProgram. Plans the schedules and the scratch slots once.
  explicit Interpreter(Program program);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  const Program& program() const { return program_; }

  // Elements per tile, a multiple of 16.
  int64_t tile_size() const { return tile_size_; }
  int64_t NumTiles(int64_t num_elements) const {
    return (num_elements + tile_size_ - 1) / tile_size_;
  }
  // Rough CPU cycles per element and per full tile, for the thread pool's cost model.
  int64_t CostPerElement() const { return cost_per_element_; }
  int64_t CostPerTile() const { return cost_per_element_ * tile_size_; }

  // The inputs whose buffer output `k` may reuse: same dtype, and within a tile every read of
  // the input happens no later than the first write of the output (an instruction that reads
  // the input and writes the output in the same pass is fine: elements are independent).
  const std::vector<int>& ForwardableInputs(int k) const { return forwardable_[k]; }

  // Runs tiles [first_tile, last_tile) of a `num_elements`-element problem. Thread-safe: calls
  // on disjoint tile ranges may run concurrently. Results do not depend on how the tiles are
  // split between calls.
  void RunTiles(const IoBuffers& io, int64_t num_elements, int64_t first_tile,
                int64_t last_tile) const;

 private:
  void RunSchedule(const Schedule& schedule, const IoBuffers& io, int64_t offset, int64_t valid,
                   int64_t count, char* scratch) const;

  Program program_;
  // Full tiles: f32/f64/i32 inputs and outputs used in place.
  std::unique_ptr<Schedule> direct_;
  // Full tiles of large problems: inputs in place, outputs stored from slots, non-temporally.
  std::unique_ptr<Schedule> streaming_;
  // A ragged last tile: everything through zero-padded slots.
  std::unique_ptr<Schedule> staged_;
  int64_t tile_size_ = 0;
  int64_t slot_bytes_ = 0;      // one slot: tile_size_ elements of the widest compute type
  int64_t scratch_bytes_ = 0;   // all slots of the larger schedule
  int64_t cost_per_element_ = 0;
  int64_t output_bytes_ = 0;    // per element, all outputs together
  std::vector<std::vector<int>> forwardable_;
};

}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CC_INTERPRETER_H_
