"""The IR passes: rewrites of a FusedProgram that every backend then runs as written.

The rewriter runs `optimize` on each kernel's program before printing it into the node's
`program` attr (rewrite(), __init__.py), so that the CPU kernel and the Ascend generator read
the same program; neither has a pass of its own. Each pass keeps the results bit for bit: the
kernel computes the same operations on the same values in the same types.

  simplify  a Relu whose operand is never below -0 is its operand, and is dropped
  hoist     loop-invariant instructions of small shape are marked `invariant`: computed once a
            run over that shape, not once an element of the iteration shape

The kernel's name and the graph around it are the rewriter's, whatever the passes do to the
program: names come from the fused TF nodes (naming.py), not from its instructions.
"""

from __future__ import annotations

import dataclasses
import math

from . import catalog
from . import program as ir


def optimize(program: ir.FusedProgram) -> ir.FusedProgram:
    """Every pass, in order."""
    return hoist(simplify(program))


def _output_values(program: ir.FusedProgram) -> set:
    return {ref.index for ref in program.outputs if ref.kind == "%"}


def simplify(program: ir.FusedProgram) -> ir.FusedProgram:
    """Drop each Relu whose operand is a float value never below -0 (or NaN): the values of
    the ops the table marks never_negative (Abs, Relu, Exp, Square...), for which max(x, 0) is
    x itself, NaN payloads and -0 included, in every float type (16-bit types compute in fp32).
    Its readers read the operand. Integer values are left alone (Abs and Square of i32 wrap
    negative), and so is a Relu that is an output, so that outputs keep one value each.
    abs -> relu -> exp is the chain the project's examples fuse: its Relu would be one more pass
    over every element."""
    outputs = _output_values(program)
    dtypes = program.value_dtypes()
    kept: list = []
    # what reads of %i read now: its new number, or (dropped) its operand
    replacement: dict = {}

    def remap(operand):
        if isinstance(operand, ir.Ref) and operand.kind == "%":
            return replacement[operand.index]
        return operand

    for i, inst in enumerate(program.instructions):
        operands = tuple(remap(o) for o in inst.operands)
        x = operands[0]
        if (inst.op == "Relu" and dtypes[i] in ir.FLOAT_NAMES and i not in outputs
                and isinstance(x, ir.Ref) and x.kind == "%"
                and catalog.for_ir_name(kept[x.index].op).never_negative):
            replacement[i] = x
            continue
        replacement[i] = ir.Val(len(kept))
        kept.append(dataclasses.replace(inst, operands=operands))
    if len(kept) == len(program.instructions):
        return program
    return ir.FusedProgram(program.inputs, kept, [remap(r) for r in program.outputs],
                           program.output_views)


# What hoisted instructions must cost, per element, to be worth a prologue: more than one
# cheap op (the table's cost unit).
MIN_HOISTED_COST = 2


def hoist(program: ir.FusedProgram) -> ir.FusedProgram:
    """Mark loop invariants `invariant`. A fused program computes every instruction once an
    element of its iteration space, also those that read only small broadcast inputs: in a batch
    normalisation the [C] parameters give `rsqrt(var + eps) * gamma` and `beta - mean * that`,
    which the whole group would otherwise compute for each of N*H*W*C elements.

    For each shape S that fully known inputs are read as, the instructions that may be hoisted
    read only immediates, hoisted values and inputs read as S; they are not reductions (a
    program with reductions is left alone), not outputs, and keep their value in its stored
    type (no 16-bit value: computed apart, it would be rounded where the program keeps fp32).
    The S whose hoisted instructions cost most is taken, when the rest of the program still
    reads some input as a larger shape (more elements, or sizes not known), the rest reads some
    of their values and they cost at least MIN_HOISTED_COST an element (catalog.element_cost).
    An S as large as the iteration shape saves nothing: the prologue would compute as many
    elements as the loop, into temporaries of the tensors' size, and the loop would read them
    back from memory (a GELU gradient whose only other input is a scalar learning rate)."""
    if program.reduce_axes() is not None:
        return program
    outputs = _output_values(program)
    dtypes = program.value_dtypes()
    known = [catalog.fully_known(d.shape) and catalog.fully_known(program.read_shape(j))
             for j, d in enumerate(program.inputs)]
    best, best_cost = None, 0
    for shape in dict.fromkeys(program.read_shape(j) for j in range(len(known)) if known[j]):
        small = [known[j] and program.read_shape(j) == shape for j in range(len(known))]
        hoisted = _hoistable(program, small, outputs, dtypes)
        cost = sum(catalog.element_cost(catalog.for_ir_name(inst.op),
                                        ir.DTYPES[program.operand_dtype(i)])
                   for i, inst in enumerate(program.instructions) if hoisted[i])
        main_refs = [o for i, inst in enumerate(program.instructions) if not hoisted[i]
                     for o in inst.operands if isinstance(o, ir.Ref)] + list(program.outputs)
        large_read = any(r.kind == "in" and not small[r.index]
                         and _larger(program.read_shape(r.index), shape) for r in main_refs)
        read = any(r.kind == "%" and hoisted[r.index] for r in main_refs)
        if large_read and read and cost > best_cost:
            best, best_cost = hoisted, cost
    if best is None or best_cost < MIN_HOISTED_COST:
        return program
    marked = [dataclasses.replace(inst, invariant=True) if best[i] else inst
              for i, inst in enumerate(program.instructions)]
    return ir.FusedProgram(program.inputs, marked, program.outputs, program.output_views)


def _larger(shape, than: tuple) -> bool:
    """Whether `shape` has more elements than the fully known `than`, or sizes not known."""
    if not catalog.fully_known(shape):
        return True
    return math.prod(shape) > math.prod(than)


def _hoistable(program: ir.FusedProgram, small: list, outputs: set, dtypes: list) -> list:
    """Which instructions may be hoisted when the inputs marked `small` are those read as S."""
    hoisted = []
    for i, inst in enumerate(program.instructions):
        refs = [o for o in inst.operands if isinstance(o, ir.Ref)]
        hoisted.append(
            i not in outputs and dtypes[i] not in ("f16", "bf16") and bool(refs)
            and all(small[r.index] if r.kind == "in" else hoisted[r.index] for r in refs))
    return hoisted
