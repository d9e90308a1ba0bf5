// Algebraic simplification of fused programs, before they are planned.
//
// One rule so far: a Relu whose operand can never be below -0 is its operand, bit for bit, and
// is dropped (its readers read the operand). Never below -0 (or NaN) are the float values of the
// ops the op table marks never_negative (catalog.py: Abs, Relu, Exp, Square...): max(x, 0) then
// returns x itself for every such x, NaN (with its payload) included, in fp32 as in f64. Integer
// values are left alone (Abs and Square of i32 wrap negative). A Relu that is an output of the
// program stays, so outputs keep one value each. The fused kernel keeps its name (it still
// replaces the graph's Relu); the kernel profile has no row for the dropped instruction.
//
// abs -> relu -> exp is the chain the project's examples fuse: the relu is one pass over every
// element that the kernel no longer makes.
#ifndef TF_AUTOFUSE_CC_SIMPLIFY_H_
#define TF_AUTOFUSE_CC_SIMPLIFY_H_

#include "program.h"

namespace tf_autofuse {

// Rewrites `program` in place; returns the number of instructions dropped.
int SimplifyProgram(Program* program);

}  // namespace tf_autofuse

#endif  // TF_AUTOFUSE_CC_SIMPLIFY_H_
