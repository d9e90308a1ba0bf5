// Loop-invariant code motion for fused programs.
//
// A fused program computes every instruction once per element of its iteration space, also the
// ones that read only small broadcast inputs: in a batch normalisation the [C] parameters give
// `rsqrt(var + eps) * gamma` and `beta - mean * that`, which the whole group would otherwise
// recompute for each of N*H*W*C elements. HoistInvariants splits such a program in two:
//
//   prologue: the invariant instructions, over the small shape S they are read as (once a run);
//   main:     the rest, over the iteration space, reading the prologue's values as extra inputs
//             (declared with shape S, after the original inputs).
//
// Hoisted, an instruction must: not be a reduction (programs with reductions are left alone),
// read only immediates, hoisted values and inputs read as S (S fully known), compute its value
// in its stored type (no 16-bit value: hoisting it would round it between the two programs,
// where the fused kernel keeps fp32 until the outputs), and not be an output. The split is made
// only when the main program still reads some input as another shape than S and the hoisted
// instructions are worth more than one cheap operation. Results are bit-identical: the same
// operations run on the same values in the same types, once per distinct element.
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

// False (and *out untouched) when nothing is worth hoisting.
bool HoistInvariants(const Program& program, HoistedProgram* out);

}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CC_HOIST_H_
