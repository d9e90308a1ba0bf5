// The split of a program at its invariant instructions (PROGRAM.md, Invariants).
//
// A fused program computes every instruction once per element of its iteration space. The
// rewriter's hoist pass (rewriter/passes.py) marks `invariant` the instructions that read only
// small broadcast inputs of one shape S (in a batch normalisation, `rsqrt(var + eps) * gamma`
// on [C]); the parser checked the rules that make computing them apart give the same bits.
// SplitInvariants cuts such a program in two:
//
//   prologue: the invariant instructions, over S (once a run);
//   main:     the rest, over the iteration space, reading the prologue's values as extra inputs
//             (declared with shape S, after the original inputs).
//
// The decision is the rewriter's: nothing here weighs what is worth hoisting.
#ifndef TF_AUTOFUSE_CC_HOIST_H_
#define TF_AUTOFUSE_CC_HOIST_H_

#include <vector>

#include "program.h"

namespace tf_autofuse {

struct HoistedProgram {
  Program prologue;
  Program main;                      // inputs: the original ones, then the prologue's outputs
  std::vector<int> prologue_inputs;  // the original input index of each prologue input
};

// False (and *out untouched) when the program has no invariant instruction that the rest
// reads.
bool SplitInvariants(const Program& program, HoistedProgram* out);

}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CC_HOIST_H_
