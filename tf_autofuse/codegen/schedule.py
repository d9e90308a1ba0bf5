"""Choosing the schedule of a fused program: how its iteration space is walked on the AI core.

    flat        every input read as the iteration shape
    broadcast   the iteration shape cut into [outer, inner]: inputs full / row / col / scalar,
                tiles are chunks of a row
    broadcast3  no such cut fits: [outer, mid, inner], every input full or broadcast on each part
    reduce      the [outer, inner] cut at the reduced trailing axes: row accumulators (or a fold
                into a tile accumulator), arithmetic on reduced values once a row, several passes
                over a row when full values read reduced ones
    column      reduced axes followed by kept ones: [outer, mid reduced, inner], element-wise
                accumulation over mid

`choose(program)` returns (Schedule, "") or (None, the reason no schedule fits). The emitter of
each kind is in emit/.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from . import ir, opmap
from .kernel import CTYPE

FLAT, BROADCAST, BROADCAST3, REDUCE, COLUMN = "flat", "broadcast", "broadcast3", "reduce", "column"


@dataclasses.dataclass(frozen=True)
class Schedule:
    kind: str
    split: Optional[int] = None  # iteration axes [0, split) are outer; None: flat
    split2: Optional[int] = None  # broadcast3 / column: axes [split, split2) are the mid part
    patterns: tuple = ()  # per input: "full", "row", "col", "scalar"; broadcast3: "f"/"b" per part


def choose(program: ir.Program):
    """(Schedule, "") or (None, why no schedule fits)."""
    kind = _kind(program)
    if kind == FLAT:
        return Schedule(FLAT, patterns=("full",) * len(program.inputs)), ""
    if kind == BROADCAST:
        split, patterns, reason = _split(program)
    elif kind == REDUCE:
        split, patterns, reason = _reduce_split(program)
    else:
        return None, kind
    if reason:
        return None, reason
    if isinstance(split, tuple):  # [outer, mid, inner]: the 3-level broadcast or the column reduce
        return Schedule(COLUMN if kind == REDUCE else BROADCAST3, split[0], split[1], patterns), ""
    return Schedule(kind, split, None, patterns), ""


def row_of(patterns, k: int) -> str:
    """broadcast3: the element index of input k's row (outer o, mid m) in its view."""
    po, pm, pi = patterns[k]
    return f"(({'o' if po == 'f' else '0'}) * {'mid' if pm == 'f' else '1'} + {'m' if pm == 'f' else '0'})"


_NO_FP64 = {"f64": " (the AI core's vector unit has no fp64 arithmetic)"}


def dtype_refusal(program: ir.Program) -> str:
    """Why a value of the program has no vector type, or ""."""
    for k, inp in enumerate(program.inputs):
        if inp.dtype not in CTYPE:
            return f"in{k}: {inp.dtype} has no Ascend vector type on this path{_NO_FP64.get(inp.dtype, '')}"
    for k, inst in enumerate(program.insts):
        if inst.dtype not in CTYPE or inst.operand_dtype not in CTYPE:
            return f"%{k} = {inst.op}: dtype {inst.dtype} is not generated{_NO_FP64.get(inst.dtype, '')}"
    return ""


def _kind(program: ir.Program) -> str:
    """FLAT, BROADCAST or REDUCE, else why no schedule fits (yet)."""
    why = dtype_refusal(program)
    if why:
        return why
    if program.has_reduction:
        return REDUCE
    if program.has_broadcast:
        return BROADCAST
    return FLAT



def _reduce_split(program: ir.Program):
    """The reduce schedule: one pass over each row of [outer, inner], the reduced axes being
    exactly the inner ones. (split, patterns, "") or (None, None, reason)."""
    axes_lists = {inst.attrs.get("axes") for inst in program.insts if inst.op in ir.REDUCTIONS}
    if None in axes_lists:
        return None, None, "a reduction without axes=[...]"
    if len(axes_lists) != 1:
        return None, None, "reductions over different axes in one program"
    views = [inp.view for inp in program.inputs]
    if any(v is None for v in views):
        return None, None, "reductions need inputs of known rank"
    rank = max(len(v) for v in views)
    try:
        axes = [int(a) for a in axes_lists.pop().strip("[]").split(",")]
    except ValueError:
        return None, None, "reductions need axes=[...]"
    if axes != list(range(axes[0], rank)):
        return _column_split(program, axes, rank)
    for k, inst in enumerate(program.insts):
        if inst.op in ir.REDUCTIONS and inst.op not in opmap.FOLD_OP:
            return None, None, f"%{k} = {inst.op}: no vector reduction for it"
        if inst.op == "Prod" and inst.operand_dtype == "i32":
            return None, None, f"%{k} = Prod of i32 is not generated (the twin has no wrapping i32 Mul check)"
        if (inst.op not in ir.REDUCTIONS and inst.reduced and inst.dtype == "i32"):
            return None, None, (f"%{k} = {inst.op}: arithmetic on i32 reduced values is not generated "
                                "(RowEnd computes in fp32)")
        if inst.op not in ir.REDUCTIONS and inst.reduced:
            continue  # computed once a row, at the row's end, from the finished reductions
        reads_reduction = any(isinstance(o, ir.Ref) and o.kind == "%" and program.insts[o.index].reduced
                              for o in inst.operands)
        if inst.op not in ir.REDUCTIONS and inst.reduced_shape and reads_reduction:
            return None, None, (f"%{k} = {inst.op} mixes reduced values with inputs read as reduced "
                                "values: not generated yet")
    for j, out in enumerate(program.outputs):
        ref = out.ref
        if program.ref_reduced_shape(ref) and not (ref.kind == "%" and program.insts[ref.index].reduced):
            return None, None, (f"out{j} = {ref} has the reduced shape but no reduction computes it "
                                "(it comes from inputs read as reduced values): not generated yet")
    split = axes[0]
    patterns = _patterns_at(program, split, rank)
    if patterns is None:
        return None, None, f"the inputs' views do not split at the reduced axes {axes}"
    return split, patterns, ""


def _column_split(program: ir.Program, axes, rank: int):
    """The column schedule: reduced axes followed by kept ones, the iteration shape read as
    [outer, mid (reduced), inner]; ((split, split2), patterns, "") or (None, None, reason)."""
    padded = {(1,) * (rank - len(i.view)) + tuple(i.view) for i in program.inputs}
    if len(padded) != 1 or (1 in padded.pop()[axes[0]:axes[-1] + 1]):
        return None, None, (f"reduction over the non-trailing axes {axes} with broadcast inputs (or a "
                            "broadcast reduced axis): the column schedule reads every input in full")
    for k, inst in enumerate(program.insts):
        if inst.op in ir.REDUCTIONS and inst.op not in opmap.FOLD_OP:
            return None, None, f"%{k} = {inst.op}: no vector reduction for it"
        if inst.op == "Prod" and inst.operand_dtype == "i32":
            return None, None, f"%{k} = Prod of i32 is not generated (the twin has no wrapping i32 Mul check)"
        if inst.op == "Mean" and inst.operand_dtype == "i32":
            return None, None, (f"%{k} = Mean of i32 over non-trailing axes {axes}: no element-wise "
                                "truncating division on the vector unit")
        if inst.op not in ir.REDUCTIONS and inst.reduced:
            return None, None, (f"%{k} = {inst.op}: arithmetic on reduced values over the non-trailing "
                                f"axes {axes} is not generated yet")
        if inst.op not in ir.REDUCTIONS and any(
                isinstance(o, ir.Ref) and o.kind == "%" and program.insts[o.index].reduced for o in inst.operands):
            return None, None, (f"%{k} = {inst.op} reads a value reduced over the non-trailing axes "
                                f"{axes}: several passes over columns are not generated yet")
    return (axes[0], axes[-1] + 1), ("full",) * len(program.inputs), ""


_PATTERN = {(True, True): "full", (False, True): "row", (True, False): "col", (False, False): "scalar"}


def _side(view, padded, axes):
    """How an input (its padded view) is read over `axes`: True in full, False broadcast (ones
    wherever another input is not), None neither."""
    ones = [view[a] == 1 for a in axes]
    needed = [any(w[a] != 1 for w in padded) for a in axes]
    if not any(o and n for o, n in zip(ones, needed)):
        return True
    if all(o or not n for o, n in zip(ones, needed)):
        return False
    return None


def _patterns_at(program: ir.Program, split: int, rank: int):
    padded = [(1,) * (rank - len(i.view)) + tuple(i.view) for i in program.inputs]
    patterns = []
    for v in padded:
        sides = tuple(_side(v, padded, axes) for axes in (range(split), range(split, rank)))
        if None in sides:
            return None
        patterns.append(_PATTERN[sides])
    return tuple(patterns)


def _split(program: ir.Program):
    """(split axis, per-input pattern, "") of the broadcast schedule, or (None, None, reason).

    The iteration shape is cut into outer axes [0, split) and inner axes [split, rank); every
    input must be, on each side, either read in full or broadcast (all ones): "full", "row" (inner
    only, e.g. a bias), "col" (outer only, e.g. [N,1]) or "scalar". "?" counts as not 1."""
    views = [inp.view for inp in program.inputs]
    if any(v is None for v in views):
        return None, None, "broadcast inputs of unknown rank: the view of each input must be known"
    rank = max(len(v) for v in views)
    padded = [(1,) * (rank - len(v)) + tuple(v) for v in views]
    for axis in range(rank):
        sizes = {d for v in padded for d in (v[axis],) if d != 1}
        if len(sizes - {-1}) > 1:
            return None, None, f"incompatible views {views} on axis {axis}"
    for split in range(rank + 1):
        patterns = []
        for v in padded:
            sides = tuple(_side(v, padded, axes) for axes in (range(split), range(split, rank)))
            if None in sides:
                break
            patterns.append(_PATTERN[sides])
        else:
            return split, tuple(patterns), ""
    for s1 in range(1, rank):
        for s2 in range(s1 + 1, rank):
            patterns = []
            for v in padded:
                sides = [_side(v, padded, axes) for axes in (range(s1), range(s1, s2), range(s2, rank))]
                if None in sides:
                    break
                patterns.append("".join("f" if full else "b" for full in sides))  # full / broadcast
            else:
                return (s1, s2), tuple(patterns), ""
    return None, None, (f"broadcast pattern of {views} is neither an [outer, inner] nor an "
                        "[outer, mid, inner] split (every input full or broadcast on each part)")


