"""The IR passes: rewrites of a FusedProgram that every backend then runs as written.

The rewriter runs `optimize` on each kernel's program before printing it into the node's
`program` attr (rewrite(), __init__.py), so that the CPU kernel and the Ascend generator read
the same program; neither has a pass of its own. Each pass but `widen` keeps the results bit for
bit: the kernel computes the same operations on the same values in the same types; `widen`
rounds once where TensorFlow rounds twice, so its results are at least as close to the exact
value as TensorFlow's.

  simplify  a Relu whose operand is never below -0 is its operand, and is dropped
  widen     the fp32 rsqrt(a + b) of reduced values is computed in f64 and rounded once
            (`narrow` gives the fp32 form back to a backend without f64)
  hoist     loop-invariant instructions of small shape are marked `invariant`: computed once a
            run over that shape, not once an element of the iteration shape

The kernel's name and the graph around it are the rewriter's, whatever the passes do to the
program: names come from the fused TF nodes (naming.py), not from its instructions.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from . import catalog
from . import program as ir


def optimize(program: ir.FusedProgram) -> ir.FusedProgram:
    """Every pass, in order."""
    return hoist(widen(simplify(program)))


def _output_values(program: ir.FusedProgram) -> set:
    return {ref.index for ref in program.outputs if ref.kind == "%"}


def _readers(program: ir.FusedProgram) -> dict:
    """How many operands of instructions read each value %i (absent: none)."""
    readers: dict = {}
    for inst in program.instructions:
        for o in inst.operands:
            if isinstance(o, ir.Ref) and o.kind == "%":
                readers[o.index] = readers.get(o.index, 0) + 1
    return readers


class _Rebuilt:
    """A program rebuilt instruction by instruction, the way every pass here changes one:
    `remap` gives what a read of an old value reads now (its new number, or what replaced it)."""

    def __init__(self, program: ir.FusedProgram):
        self.program = program
        self.kept: list = []
        self.replacement: dict = {}  # old %i -> the Ref its reads read now

    def remap(self, operand):
        if isinstance(operand, ir.Ref) and operand.kind == "%":
            return self.replacement[operand.index]
        return operand

    def emit(self, op: str, operands, attrs=()) -> ir.Ref:
        self.kept.append(ir.Instruction(op, tuple(operands), tuple(attrs)))
        return ir.Val(len(self.kept) - 1)

    def keep(self, i: int, inst: ir.Instruction) -> None:
        """Old instruction i as it is, reading what its operands became."""
        self.kept.append(dataclasses.replace(inst, operands=tuple(map(self.remap,
                                                                      inst.operands))))
        self.replacement[i] = ir.Val(len(self.kept) - 1)

    def result(self) -> ir.FusedProgram:
        return ir.FusedProgram(self.program.inputs, self.kept,
                               [self.remap(r) for r in self.program.outputs],
                               self.program.output_views)


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
    new = _Rebuilt(program)
    for i, inst in enumerate(program.instructions):
        x = new.remap(inst.operands[0])
        if (inst.op == "Relu" and dtypes[i] in ir.FLOAT_NAMES and i not in outputs
                and isinstance(x, ir.Ref) and x.kind == "%"
                and catalog.for_ir_name(new.kept[x.index].op).never_negative):
            new.replacement[i] = x  # dropped: its readers read its operand
            continue
        new.keep(i, inst)
    if len(new.kept) == len(program.instructions):
        return program
    return new.result()


def widen(program: ir.FusedProgram) -> ir.FusedProgram:
    """Compute each fp32 `Rsqrt(Add(a, b))` of reduced values as
    `Cast(Rsqrt(Add(Cast(a), Cast(b))), to=f32)` in f64: the sum of two fp32 values is exact in
    f64, so the result is the exact rsqrt(a + b) rounded once (the kernel's f64 Rsqrt is within
    1.2 ulps of f64, far below an fp32 ulp), where the fp32 form rounds the sum first.

    Why: in a normalisation, `rsqrt(var + eps)` per row, every row's variance is often in one
    binade, and then adding the same small eps rounds every row the same way: a relative error
    of up to half an ulp of the same sign in each row's scale. The gradient of the
    normalisation subtracts terms that cancel only when scale^2 * (var + eps) = 1, so an error
    of the same sign in every row does not average out over the rows in the weight gradients
    that sum over them (a Dense layer before a LayerNorm). Rounded once, the scale's error has
    no sign of its own. Only reduced values are widened (one a row, not one an element), so the
    f64 arithmetic costs nothing against the reductions; the Add stays where something else
    reads it."""
    dtypes = program.value_dtypes()
    insts = program.instructions
    outputs = _output_values(program)
    readers = _readers(program)
    sums = {}
    for i, inst in enumerate(insts):
        x = inst.operands[0]
        if (inst.op == "Rsqrt" and dtypes[i] == "f32" and program.is_reduced(ir.Val(i))
                and isinstance(x, ir.Ref) and x.kind == "%" and insts[x.index].op == "Add"
                and dtypes[x.index] == "f32"):
            sums[i] = x.index
    if not sums:
        return program
    dropped = {a for a in sums.values() if readers[a] == list(sums.values()).count(a)
               and a not in outputs}
    new = _Rebuilt(program)
    for i, inst in enumerate(insts):
        if i in dropped:
            continue
        if i in sums:
            wide = [new.emit("Cast", [new.remap(o)], (("to", "f64"),)) if isinstance(o, ir.Ref)
                    else float(np.float32(o)) for o in insts[sums[i]].operands]
            rsqrt = new.emit("Rsqrt", [new.emit("Add", wide)])
            new.replacement[i] = new.emit("Cast", [rsqrt], (("to", "f32"),))
            continue
        new.keep(i, inst)
    return new.result()


def narrow(program: ir.FusedProgram) -> ir.FusedProgram:
    """`widen` undone: each `Cast(Rsqrt(Add(Cast(a), Cast(b))), to=f32)` whose f64 values are
    read only by that chain computed as fp32 `Rsqrt(Add(a, b))`, TensorFlow's form, for a
    backend without f64 arithmetic (the Ascend generator: the AI core's vector unit has none)."""
    dtypes = program.value_dtypes()
    insts = program.instructions
    outputs = _output_values(program)
    readers = _readers(program)

    def single(ref, op, dtype):
        """The instruction `ref` names when it is `op` of `dtype` read once, not an output."""
        if not (isinstance(ref, ir.Ref) and ref.kind == "%"):
            return None
        inst = insts[ref.index]
        ok = (inst.op == op and dtypes[ref.index] == dtype and readers[ref.index] == 1
              and ref.index not in outputs)
        return inst if ok else None

    chains, dead = {}, set()
    for i, inst in enumerate(insts):
        if inst.op != "Cast" or dict(inst.attrs).get("to") != "f32":
            continue
        rsqrt = single(inst.operands[0], "Rsqrt", "f64")
        add = rsqrt and single(rsqrt.operands[0], "Add", "f64")
        if not add:
            continue
        casts = [single(o, "Cast", "f64") for o in add.operands if isinstance(o, ir.Ref)]
        if not all(c and program.ref_dtype(c.operands[0]) == "f32" for c in casts):
            continue
        narrow_operands = [insts[o.index].operands[0] if isinstance(o, ir.Ref) else o
                           for o in add.operands]
        chains[i] = narrow_operands
        dead |= {inst.operands[0].index, rsqrt.operands[0].index}
        dead |= {o.index for o in add.operands if isinstance(o, ir.Ref)}
    if not chains:
        return program
    new = _Rebuilt(program)
    for i, inst in enumerate(insts):
        if i in dead:
            continue
        if i in chains:
            total = new.emit("Add", [new.remap(o) for o in chains[i]])
            new.replacement[i] = new.emit("Rsqrt", [total])
        else:
            new.keep(i, inst)
    return new.result()


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
