"""Ascend C generation for one fused program.

`generate(text, name)` returns a `Kernel`: either `ok` with its sources (device kernel, tiling
header, host tiling + ACL launch glue) and its UB plan, or not ok with the reason the group
stays on the CPU path. The generated kernel is the standard vector (AIV) shape:

    CopyIn   GM -> UB   DataCopy (whole 32-byte blocks) / DataCopyPad (tail) into VECIN queues
    Compute  UB -> UB   16-bit inputs Cast to fp32 (bool: uint8 0/1 -> fp32 0/1 tiles), the
                        program's ops (opmap.py), Cast back
    CopyOut  UB -> GM   from VECOUT queues

double-buffered TQues (BUFFER_NUM = 2), scratch tensors in TBufs, the work split over
GetBlockNum() cores by the host tiling function (tiling.py). Schedules (`_schedule`):
"flat" (every input read as the iteration shape); "broadcast" (the iteration shape cut into
[outer, inner], inputs full / row / col / scalar, tiles are chunks of a row; or, when no such
cut fits, into [outer, mid, inner] with every input full or broadcast on each part); "reduce"
(the same [outer, inner] cut at the reduced trailing axes, ReduceSum/Max/Min into row
accumulators, or a fold into a tile accumulator for Prod and i32; arithmetic on the finished
reduced values once a row, in RowEnd; full values reading reduced values in later passes over the
row, resident in UB when the row is one tile); "column" (reduced axes followed by kept ones:
[outer, mid reduced, inner], element-wise accumulation over mid). Every schedule computes the
same per-tile instructions (`_emit`: bool values, compares, Select, advanced math with its
sharedTmp buffer); only RowEnd's one-lane arithmetic refuses the ops that need whole tiles.
Anything else is refused with a reason.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from typing import Optional

from . import ir, opmap, tiling

CTYPE = {"f16": "half", "bf16": "bfloat16_t", "f32": "float", "i32": "int32_t", "bool": "uint8_t"}
SIZE = {"half": 2, "bfloat16_t": 2, "float": 4, "int32_t": 4, "uint8_t": 1}
# compute type; bool is 1 byte 0/1 in GM and a float 0.0/1.0 tile in UB (opmap.py, docs/ASCEND.md)
STORAGE = {"f16": "float", "bf16": "float", "f32": "float", "i32": "int32_t", "bool": "float"}
BLACKLIST_FLAG = "autofuse_enhance_precision_blacklist"


@dataclasses.dataclass
class Kernel:
    name: str
    program: str
    ok: bool
    reason: str = ""
    sources: dict = dataclasses.field(default_factory=dict)  # file name -> text
    ub: Optional[tiling.UbPlan] = None
    inputs: tuple = ()  # C types of the kernel's inputs
    outputs: tuple = ()  # C types of its outputs
    half_ops: tuple = ()  # instructions computed in half (blacklisted)
    split: Optional[int] = None  # broadcast schedule: iteration axes [0, split) are outer; None: flat
    patterns: tuple = ()  # broadcast schedule: per input "full", "row", "col" or "scalar"
    rank: int = 0  # broadcast schedule: rank of the iteration shape
    out_reduced: tuple = ()  # reduce schedule: per output, True when it is a reduced value
    passes: int = 1  # reduce schedule: passes over each row
    split2: Optional[int] = None  # column schedule: axes [split, split2) reduced, [split2, rank) kept

    def column_dims(self, iteration_shape) -> tuple:
        """(outer, mid, inner) of the column schedule."""
        shape = tuple(iteration_shape)
        dims = [1, 1, 1]
        for a, d in enumerate(shape):
            dims[0 if a < self.split else 1 if a < self.split2 else 2] *= d
        return tuple(dims)

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        for key in sorted(self.sources):
            h.update(key.encode() + b"\0" + self.sources[key].encode() + b"\0")
        return h.hexdigest()[:20]

    def tiling(self, total: int, core_num: int) -> tiling.Tiling:
        return tiling.compute(total, core_num, self.ub.max_tile)

    def outer_inner(self, iteration_shape) -> tuple:
        """(outer, inner) element counts of an iteration shape, for the broadcast schedule."""
        shape = tuple(iteration_shape)
        if len(shape) != self.rank:
            raise ValueError(f"{self.name}: iteration shape {shape} is not of rank {self.rank}")
        outer = inner = 1
        for d in shape[:self.split]:
            outer *= d
        for d in shape[self.split:]:
            inner *= d
        return outer, inner


def kernel_name(node_name: str) -> str:
    """`autofuse_pointwise_0_Abs_SquaredDifference` -> `autofuse_pointwise_0_abs_squared_difference`."""
    snake = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", node_name)
    snake = re.sub(r"[^A-Za-z0-9_]", "_", snake).lower()
    snake = re.sub(r"_+", "_", snake).strip("_")
    if not snake or snake[0].isdigit():
        snake = "k_" + snake
    return snake


def precision_blacklist(environ=None) -> frozenset:
    """IR op names of `--autofuse_enhance_precision_blacklist=Op,...` in AUTOFUSE_FLAGS
    (tf_autofuse/flags.py reads and checks it): ops listed compute f16 in f16.

    The pass passes the session's flags explicitly; this is the default of `generate` for the
    offline tools. A flag string that does not parse is one warning and an empty list."""
    from .. import flags
    from .._warn import warn_once

    environ = os.environ if environ is None else environ
    try:
        items = flags.parse_items(environ.get(flags.FLAGS_ENV, ""), flags.FLAGS_ENV)
    except flags.FlagError as err:
        warn_once(f"the precision blacklist is not used: {err}")
        return frozenset()
    return frozenset(items.get(BLACKLIST_FLAG, frozenset()))


def generate(text: str, name: str = "autofuse_pointwise_0", blacklist=None) -> Kernel:
    name = kernel_name(name)
    blacklist = precision_blacklist() if blacklist is None else frozenset(blacklist)
    try:
        program = ir.load(text)
    except ValueError as err:
        return Kernel(name, text, False, f"the program does not parse: {err}")
    reason = _schedule(program)
    split = patterns = split2 = None
    if reason == _BROADCAST:
        split, patterns, reason = _split(program)
        if isinstance(split, tuple):  # the 3-level broadcast: [outer, mid, inner]
            split, split2 = split
    elif reason == _REDUCE:
        split, patterns, reason = _reduce_split(program)
        if isinstance(split, tuple):  # the column schedule: axes [split, split2) reduced
            split, split2 = split
    if reason:
        return Kernel(name, text, False, reason)
    try:
        return _Flat(name, program, blacklist, split, patterns, split2).kernel()
    except _Refused as refused:
        return Kernel(name, text, False, str(refused))


_NO_FP64 = {"f64": " (the AI core's vector unit has no fp64 arithmetic)"}


def _schedule(program: ir.Program) -> str:
    """'' for the flat schedule, else why no schedule fits (yet)."""
    for k, inp in enumerate(program.inputs):
        if inp.dtype not in CTYPE:
            return f"in{k}: {inp.dtype} has no Ascend vector type on this path{_NO_FP64.get(inp.dtype, '')}"
    for k, inst in enumerate(program.insts):
        if inst.dtype not in CTYPE or inst.operand_dtype not in CTYPE:
            return f"%{k} = {inst.op}: dtype {inst.dtype} is not generated{_NO_FP64.get(inst.dtype, '')}"
    if program.has_reduction:
        return _REDUCE
    if program.has_broadcast:
        return _BROADCAST
    return ""


_BROADCAST = "broadcast"
_REDUCE = "reduce"
REDUCE_API = {"Sum": "ReduceSum", "Mean": "ReduceSum", "Max": "ReduceMax", "Min": "ReduceMin"}
ACCUMULATE = {"Sum": "Add", "Mean": "Add", "Max": "Max", "Min": "Min"}
# Reductions without a vector reduce API for their type (Prod; Sum/Mean/Max/Min of i32): folded
# element-wise into a tile-sized accumulator over the row's tiles, then halved in UB down to 8
# lanes (32 bytes) at the row's end and finished by the scalar unit.
FOLD_OP = {"Prod": "Mul", "Sum": "Add", "Mean": "Add", "Max": "Max", "Min": "Min"}
FOLD_IDENTITY = {("Prod", "float"): "1.0f", ("Sum", "int32_t"): "static_cast<int32_t>(0)",
                 ("Mean", "int32_t"): "static_cast<int32_t>(0)",
                 ("Max", "int32_t"): "static_cast<int32_t>(INT32_MIN)",
                 ("Min", "int32_t"): "static_cast<int32_t>(INT32_MAX)"}
FOLD_SCALAR = {  # v = v (op) x on the scalar unit; i32 sums wrap as the vector unit's do
    "Mul": "v = v * x;",
    "Add": "v = static_cast<int32_t>(static_cast<uint32_t>(v) + static_cast<uint32_t>(x));",
    "Max": "v = x > v ? x : v;", "Min": "v = x < v ? x : v;"}


def _is_fold(inst) -> bool:
    return inst.op == "Prod" or (inst.op in ir.REDUCTIONS and inst.operand_dtype == "i32")


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
        if inst.op in ir.REDUCTIONS and inst.op not in FOLD_OP:
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
        if inst.op in ir.REDUCTIONS and inst.op not in FOLD_OP:
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


def _patterns_at(program: ir.Program, split: int, rank: int):
    padded = [(1,) * (rank - len(i.view)) + tuple(i.view) for i in program.inputs]
    patterns = []
    for v in padded:
        sides = []
        for axes in (range(split), range(split, rank)):
            ones = [v[a] == 1 for a in axes]
            needed = [any(w[a] != 1 for w in padded) for a in axes]
            if any(o and n for o, n in zip(ones, needed)):
                if not all(o or not n for o, n in zip(ones, needed)):
                    return None
                sides.append(False)
            else:
                sides.append(True)
        patterns.append({(True, True): "full", (False, True): "row", (True, False): "col",
                         (False, False): "scalar"}[tuple(sides)])
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
            sides = []
            for axes in (range(split), range(split, rank)):
                ones = [v[a] == 1 for a in axes]
                needed = [any(w[a] != 1 for w in padded) for a in axes]
                if all(o or not n for o, n in zip(ones, needed)) and any(o and n for o, n in zip(ones, needed)):
                    sides.append(False)  # broadcast on this side
                elif not any(o and n for o, n in zip(ones, needed)):
                    sides.append(True)  # read in full on this side
                else:
                    sides.append(None)
            if None in sides:
                break
            patterns.append({(True, True): "full", (False, True): "row", (True, False): "col",
                             (False, False): "scalar"}[tuple(sides)])
        else:
            return split, tuple(patterns), ""
    for s1 in range(1, rank):
        for s2 in range(s1 + 1, rank):
            patterns = []
            for v in padded:
                sides = ""
                for axes in (range(s1), range(s1, s2), range(s2, rank)):
                    ones = [v[a] == 1 for a in axes]
                    needed = [any(w[a] != 1 for w in padded) for a in axes]
                    if not any(o and n for o, n in zip(ones, needed)):
                        sides += "f"  # read in full on this side
                    elif all(o or not n for o, n in zip(ones, needed)):
                        sides += "b"  # broadcast on this side
                    else:
                        break
                if len(sides) < 3:
                    break
                patterns.append(sides)
            else:
                return (s1, s2), tuple(patterns), ""
    return None, None, (f"broadcast pattern of {views} is neither an [outer, inner] nor an "
                        "[outer, mid, inner] split (every input full or broadcast on each part)")


class _Refused(Exception):
    pass


class _Flat:
    """The flat schedule: every value is a tile of the same element range."""

    def __init__(self, name: str, program: ir.Program, blacklist: frozenset, split=None, patterns=None,
                 split2=None):
        self.name, self.p, self.blacklist = name, program, blacklist
        self.split = split
        self.split2 = split2
        self.column = split2 is not None  # [outer, mid (reduced), inner]: items walk the mid axis
        self.patterns = patterns or ("full",) * len(program.inputs)
        # 3-level broadcast patterns: "f"/"b" (full / broadcast) for outer, mid, inner
        self.bcast3 = split2 is not None and not program.has_reduction
        self.queued = [pat in ("full", "row") or (len(pat) == 3 and pat[2] == "f") for pat in self.patterns]
        self.reduce = program.has_reduction
        self.reductions: list = []  # (accumulator index, op)
        self.acc_of: dict = {}  # instruction index -> accumulator index
        self.folds: list = []  # accumulators of fold reductions (FOLD_OP): tile-sized foldBuf<a>
        # arithmetic on reduced values, done once a row in RowEnd on 32-byte buffers (rowBuf<i>)
        self.row_bodies: list = []  # per pass: RowEnd statements
        self.row_pass = 0  # the pass whose RowEnd _row_vec appends to
        self.row_bufs = 0
        self.row_loc: dict = {}  # instruction index -> the rowBuf view holding its value
        self.free: list = []
        self.slots = 0
        self.views: dict = {}  # (slot, ctype) -> C++ name of the view
        self.body: list = []  # statements of Compute (the pass being emitted)
        self.bodies: list = []  # per pass: statements of Compute<pass>
        # passes over each row (reduce schedule): a value over the full shape that reads a reduced
        # value is computed in a pass after the one finishing that value; the row is re-read from
        # GM in every pass
        self.n_passes = 1
        self.pass_of: dict = {}  # reduced instruction -> the pass at whose row end it is known
        self.scalars: set = set()  # reduced values read over the full shape: rs<k> scalars
        self.half_ops: list = []
        self.shared_tmp = (0, 0)  # advanced math: (bytes per tile element, extra bytes) of sharedTmp

    # ---- scratch slots (TBufs of tile * 4 bytes) ------------------------------------------
    def _alloc(self) -> int:
        if self.free:
            return self.free.pop()
        self.slots += 1
        return self.slots - 1

    def _release(self, slot: int):
        self.free.append(slot)
        self.free.sort(reverse=True)

    def _view(self, slot: int, ctype: str) -> str:
        key = (slot, ctype)
        if key not in self.views:
            suffix = {"float": "", "int32_t": "i", "half": "h", "bfloat16_t": "b", "uint8_t": "u"}[ctype]
            self.views[key] = f"c{slot}{suffix}"
        return self.views[key]

    def _vec(self, *statements):
        for s in statements:
            if self.body and self.body[-1] != "PipeBarrier<PIPE_V>();":
                self.body.append("PipeBarrier<PIPE_V>();")
            self.body.append(s)

    # ---- planning ------------------------------------------------------------------------
    def kernel(self) -> Kernel:
        p = self.p
        output_refs = [o.ref for o in p.outputs]
        in_types = [CTYPE[i.dtype] for i in p.inputs]
        out_types = [CTYPE[p.ref_dtype(r)] for r in output_refs]
        out_reduced = [r.kind == "%" and p.insts[r.index].reduced for r in output_refs]
        self.out_reduced = out_reduced
        self._plan_passes(output_refs)
        for k, inst in enumerate(p.insts):  # arithmetic on reduced values: once a row, in RowEnd
            if self.reduce and inst.reduced and inst.op not in ir.REDUCTIONS:
                self._row_end_inst(k, inst)
        for q in range(self.n_passes):
            final = q + 1 == self.n_passes
            keep = output_refs if final else []
            needed = self._cone(q, keep)
            last_use = {}
            for k in needed:
                for o in p.insts[k].operands:
                    if isinstance(o, ir.Ref):
                        last_use[o] = k
            # where each value lives: (C++ tensor expression, ctype, slot or None)
            loc: dict = {}
            for k, inp in enumerate(p.inputs):
                if STORAGE[inp.dtype] == CTYPE[inp.dtype] and self.queued[k]:
                    loc[ir.Ref("in", k)] = (f"x{k}", CTYPE[inp.dtype], None)
            # values written straight into their output tensor (the final pass writes the outputs)
            direct = {}
            for j, ref in enumerate(keep):
                if (ref.kind == "%" and output_refs.count(ref) == 1 and not p.insts[ref.index].reduced
                        and STORAGE[p.insts[ref.index].dtype] == out_types[j]):
                    direct[ref] = j
            self.free = sorted(range(self.slots), reverse=True)  # every pass reuses the scratch slots
            self.body = []
            for k in needed:
                self._emit(k, p.insts[k], loc, direct, last_use, keep)
            if final:
                self._write_outputs(loc, direct, output_refs, out_types, out_reduced)
            self.bodies.append(self.body)

        buffers = [(f"in{k} queue", SIZE[t], tiling.BUFFER_NUM) for k, t in enumerate(in_types)
                   if self.queued[k]]
        buffers += [(f"out{k} queue", SIZE[t], tiling.BUFFER_NUM) for k, t in enumerate(out_types)
                    if not out_reduced[k] or self.column]
        buffers += [(f"scratch{s}", 4, 1) for s in range(self.slots)]
        buffers += [(f"fold{a}", 4, 1) for a in self.folds]
        if self.shared_tmp[0]:
            buffers.append(("sharedTmp (advanced math)", self.shared_tmp[0], 1))
        fixed = 32 * len(self.reductions) + (0 if self.column else 32 * tiling.BUFFER_NUM * sum(out_reduced))
        fixed += self.shared_tmp[1]
        fixed += 32 if any(op == "Mean" for _, op in self.reductions) else 0
        fixed += 32 * self.row_bufs
        ub = tiling.plan_ub(buffers, fixed)
        if ub.max_tile < tiling.ALIGN_ELEMS:
            raise _Refused(f"does not fit in UB: {ub.bytes_per_element} bytes per element, "
                           f"{tiling.ALIGN_ELEMS} elements need more than the "
                           f"{tiling.UB_BUDGET}-byte budget")
        sources = {
            f"{self.name}_tiling.h": self._tiling_header(),
            f"{self.name}_kernel.cpp": self._kernel_source(in_types, out_types, ub),
            f"{self.name}_host.cpp": self._host_source(in_types, out_types, ub),
        }
        rank = 0 if self.split is None else max(len(i.view) for i in p.inputs)
        return Kernel(self.name, p.text, True, "", sources, ub, tuple(in_types), tuple(out_types),
                      tuple(self.half_ops), self.split, tuple(self.patterns) if self.split is not None else (),
                      rank, tuple(out_reduced), self.n_passes, self.split2)

    def _plan_passes(self, output_refs):
        """Accumulators, and the pass of every reduced value: a reduction whose operand reads
        reduced values of pass q is accumulated in pass q + 1 (variance after mean; softmax's
        sum after max); the full outputs are written in the last pass."""
        p = self.p
        need = {}  # full value -> the first pass that can compute it

        def need_of(o):
            if o.kind == "in":
                return 0
            return self.pass_of[o.index] + 1 if p.insts[o.index].reduced else need[o.index]

        for k, inst in enumerate(p.insts):
            refs = [o for o in inst.operands if isinstance(o, ir.Ref)]
            if inst.op in ir.REDUCTIONS:
                self.acc_of[k] = len(self.reductions)
                if _is_fold(inst) or self.column:
                    self.folds.append(len(self.reductions))
                self.reductions.append((len(self.reductions), inst.op))
                self.pass_of[k] = need_of(refs[0])
            elif self.reduce and inst.reduced:
                self.pass_of[k] = max(self.pass_of[o.index] for o in refs)
            else:
                need[k] = max([need_of(o) for o in refs], default=0)
        last = [self.pass_of[k] + 1 for k, inst in enumerate(p.insts) if inst.op in ir.REDUCTIONS]
        last += [need_of(r) + 1 for r in output_refs if not (r.kind == "%" and p.insts[r.index].reduced)]
        self.n_passes = max(last + [1])
        self.row_bodies = [[] for _ in range(self.n_passes)]

    def _cone(self, q, output_refs):
        """Instructions Compute<q> evaluates per tile, in order: the reductions of pass q, the
        full outputs (the last pass) and the full values they read."""
        p = self.p
        stack = [k for k, inst in enumerate(p.insts) if inst.op in ir.REDUCTIONS and self.pass_of[k] == q]
        stack += [r.index for r in output_refs if r.kind == "%" and not p.insts[r.index].reduced]
        needed = set()
        while stack:
            k = stack.pop()
            if k in needed:
                continue
            needed.add(k)
            stack += [o.index for o in p.insts[k].operands
                      if isinstance(o, ir.Ref) and o.kind == "%" and not p.insts[o.index].reduced]
        return sorted(needed)

    def _emit(self, k, inst, loc, direct, last_use, output_refs):
        """Compute statements of %k for one tile (the current pass)."""
        ctype = STORAGE[inst.operand_dtype]
        if self.column and inst.op in ir.REDUCTIONS:  # element-wise over the mid axis (j: its index)
            acc = self.acc_of[k]
            src, _ = self._operand(inst.operands[0], loc)
            first = (f"Muls(f{acc}, {src}, 1.0f, cn);" if ctype == "float"
                     else f"Adds(f{acc}, {src}, static_cast<int32_t>(0), cn);")
            self._vec(f"if (j == 0) {{ {first} }} else {{ {FOLD_OP[inst.op]}(f{acc}, f{acc}, {src}, cn); }}")
            loc[ir.Ref("%", k)] = (f"f{acc}", ctype, None)
            o = inst.operands[0]
            if last_use.get(o) == k and o not in output_refs:
                self._drop(o, loc)
            return
        if _is_fold(inst):  # element-wise into the tile accumulator (identity lanes past the row)
            acc = self.acc_of[k]
            src, _ = self._operand(inst.operands[0], loc)
            self._vec(f"if (j == 0) {{ Duplicate(f{acc}, {FOLD_IDENTITY[(inst.op, ctype)]}, "
                      "static_cast<int32_t>(tileLength)); PipeBarrier<PIPE_V>(); }")
            self._vec(f"{FOLD_OP[inst.op]}(f{acc}, f{acc}, {src}, static_cast<int32_t>(n));")
            loc[ir.Ref("%", k)] = (f"acc{acc}", ctype, None)
            o = inst.operands[0]
            if last_use.get(o) == k and o not in output_refs:
                self._drop(o, loc)
            return
        if inst.op in REDUCE_API:  # this tile's part of the row, folded into the accumulator
            acc = self.acc_of[k]
            src, _ = self._operand(inst.operands[0], loc)
            part, tmp = self._alloc(), self._alloc()
            pv, tv = self._view(part, "float"), self._view(tmp, "float")
            self._vec(f"{REDUCE_API[inst.op]}({pv}, {src}, {tv}, static_cast<int32_t>(n));")
            self._vec(f"if (j == 0) {{ Muls(acc{acc}, {pv}, 1.0f, 1); }} "
                      f"else {{ {ACCUMULATE[inst.op]}(acc{acc}, acc{acc}, {pv}, 1); }}")
            self._release(part)
            self._release(tmp)
            ref = ir.Ref("%", k)
            loc[ref] = (f"acc{acc}", "float", None)
            o = inst.operands[0]
            if last_use.get(o) == k and o not in output_refs:
                self._drop(o, loc)
            return
        if self.reduce and inst.reduced:
            return  # arithmetic on reduced values: RowEnd
        mapping = opmap.lookup(inst.op)
        why = opmap.refusal(inst.op, ctype)
        if why:
            raise _Refused(f"%{k} = {why}")
        exec_type = ctype
        if inst.op in self.blacklist and inst.operand_dtype == "f16" and "half" in mapping.types:
            exec_type = "half"
            self.half_ops.append(f"%{k} = {inst.op}")
        if mapping.shared_tmp:
            self.shared_tmp = tuple(max(a, b) for a, b in zip(self.shared_tmp, mapping.shared_tmp))
        srcs, scratch = [], []
        for pos, o in enumerate(inst.operands):
            if isinstance(o, ir.Ref):
                srcs.append(self._operand(o, loc))
            else:
                # an immediate: Select's condition is a bool (float 0/1 tile), others exec_type
                imm_type = STORAGE["bool"] if inst.op == "Select" and pos == 0 else exec_type
                slot = self._alloc()
                scratch.append(slot)
                view = self._view(slot, imm_type)
                self._vec(f"Duplicate({view}, {opmap.lit(imm_type, o)}, cn);")
                srcs.append((view, imm_type))
        # operands in the execution type
        args = []
        for pos, (expr, t) in enumerate(srcs):
            if t == exec_type or (inst.op == "Select" and pos == 0):
                args.append(expr)
            else:  # float -> half for a blacklisted op
                slot = self._alloc()
                scratch.append(slot)
                view = self._view(slot, exec_type)
                self._vec(f"Cast({view}, {expr}, RoundMode::CAST_RINT, cn);")
                args.append(view)
        temps = []
        for _ in range(opmap.temps_for(mapping, exec_type)):
            slot = self._alloc()
            scratch.append(slot)
            temps.append(self._view(slot, exec_type))
        ref = ir.Ref("%", k)
        vtype = STORAGE[inst.dtype]  # the value's compute type (bool: float 0/1)
        if ref in direct:
            dst, dst_slot = f"y{direct[ref]}", None
        else:
            dst_slot = self._alloc()
            dst = self._view(dst_slot, vtype)
        extra = {"alpha": opmap.alpha_of(inst.attrs)} if inst.op == "LeakyRelu" else {}
        if inst.op == "Cast":
            extra = {"to": inst.attrs.get("to")}
        if exec_type == ctype:
            self._vec(*mapping.emit(exec_type, dst, args, "cn", temps, **extra))
        else:
            hslot = self._alloc()
            scratch.append(hslot)
            hdst = self._view(hslot, exec_type)
            self._vec(*mapping.emit(exec_type, hdst, args, "cn", temps, **extra))
            self._vec(f"Cast({dst}, {hdst}, RoundMode::CAST_NONE, cn);")
        loc[ref] = (dst, vtype, dst_slot)
        for slot in scratch:
            self._release(slot)
        for o in set(x for x in inst.operands if isinstance(x, ir.Ref)):
            if last_use.get(o) == k and o not in output_refs:
                self._drop(o, loc)

    def _write_outputs(self, loc, direct, output_refs, out_types, out_reduced):
        p = self.p
        # outputs not written in place
        for j, ref in enumerate(output_refs):
            if out_reduced[j]:
                continue  # written once a row, in RowEnd
            if ref in direct and loc[ref][0] == f"y{j}":
                continue
            if (ref.kind == "in" and self.queued[ref.index]
                    and CTYPE[p.inputs[ref.index].dtype] == out_types[j]):
                expr, t = f"x{ref.index}", out_types[j]
            else:
                expr, t = self._operand(ref, loc)
            if t == out_types[j]:
                self._vec(f"DataCopy(y{j}, {expr}, cn);")
            elif out_types[j] == "uint8_t":  # bool: float 0/1 -> half -> uint8 0/1 (exact)
                slot = self._alloc()
                view = self._view(slot, "half")
                self._vec(f"Cast({view}, {expr}, RoundMode::CAST_RINT, cn);",
                          f"Cast(y{j}, {view}, RoundMode::CAST_RINT, cn);")
                self._release(slot)
            else:
                self._vec(f"Cast(y{j}, {expr}, RoundMode::CAST_RINT, cn);")

    def _operand(self, ref, loc):
        """The tensor holding `ref` in its compute type; 16-bit inputs are Cast up on first use."""
        if ref not in loc and ref.kind == "in" and not self.queued[ref.index]:
            # a broadcast column / scalar: one GM element for the whole tile
            ctype = STORAGE[self.p.inputs[ref.index].dtype]
            slot = self._alloc()
            view = self._view(slot, ctype)
            index = ("o" if self.patterns[ref.index] == "col" else
                     self._row_of(ref.index) if self.bcast3 else "0")
            self._vec(f"Duplicate({view}, static_cast<{ctype}>(in{ref.index}Gm.GetValue({index})), cn);")
            loc[ref] = (view, ctype, slot)
        if ref not in loc and ref.kind == "%":
            # a reduced value read over the full shape (a later pass): the row's scalar
            rtype = STORAGE[self.p.insts[ref.index].dtype]
            slot = self._alloc()
            view = self._view(slot, rtype)
            self._vec(f"Duplicate({view}, rs{ref.index}, cn);")
            self.scalars.add(ref.index)
            loc[ref] = (view, rtype, slot)
        if ref not in loc and ref.kind == "in" and self.p.inputs[ref.index].dtype == "bool":
            # uint8 0/1 -> half -> float 0/1 (the vector Cast has no uint8 -> float)
            tmp, slot = self._alloc(), self._alloc()
            view, hview = self._view(slot, "float"), self._view(tmp, "half")
            self._vec(f"Cast({hview}, x{ref.index}, RoundMode::CAST_NONE, cn);",
                      f"Cast({view}, {hview}, RoundMode::CAST_NONE, cn);")
            self._release(tmp)
            loc[ref] = (view, "float", slot)
        if ref not in loc:  # a 16-bit input: widen it into a scratch slot
            slot = self._alloc()
            view = self._view(slot, "float")
            self._vec(f"Cast({view}, x{ref.index}, RoundMode::CAST_NONE, cn);")
            loc[ref] = (view, "float", slot)
        expr, t, _ = loc[ref]
        return expr, t

    def _row_buf(self) -> str:
        self.row_bufs += 1
        return f"rv{self.row_bufs - 1}"

    def _row_vec(self, *statements):
        body = self.row_bodies[self.row_pass]
        for s in statements:
            if body:
                body.append("PipeBarrier<PIPE_V>();")
            body.append(s)

    def _item_end_source(self, out_types, out_red) -> str:
        """Column schedule: the mid axis is done for the item's inner chunk: finish Mean, write
        each reduced output's chunk."""
        lines = ["    PipeBarrier<PIPE_V>();", "    const int32_t cn = static_cast<int32_t>((n + ALIGN - 1) / ALIGN * ALIGN);"]
        lines += [f"    LocalTensor<{self._acc_type(a)}> f{a} = foldBuf{a}.Get<{self._acc_type(a)}>();"
                  for a in self.folds]
        for a, op in self.reductions:
            if op == "Mean":  # float only (i32 Mean is refused): one rounding more than a division
                lines += [f"    Muls(f{a}, f{a}, 1.0f / static_cast<float>(mid), cn);", "    PipeBarrier<PIPE_V>();"]
        for k, t in enumerate(out_types):
            if not out_red[k]:
                continue
            a = self.acc_of[self.p.outputs[k].ref.index]
            at = self._acc_type(a)
            convert = (f"Muls(r{k}, f{a}, 1.0f, cn);" if t == at == "float"
                       else f"Adds(r{k}, f{a}, static_cast<int32_t>(0), cn);" if t == at
                       else f"Cast(r{k}, f{a}, RoundMode::CAST_RINT, cn);")
            lines.append(f"""\
    LocalTensor<{t}> r{k} = outQue{k}.AllocTensor<{t}>();
    {convert}
    outQue{k}.EnQue(r{k});
    r{k} = outQue{k}.DeQue<{t}>();
    if ((n * sizeof({t})) % 32 == 0) {{
      DataCopy(out{k}Gm[ro], r{k}, n);
    }} else {{
      DataCopyExtParams copy{k}{{1, static_cast<uint32_t>(n * sizeof({t})), 0, 0, 0}};
      DataCopyPad(out{k}Gm[ro], r{k}, copy{k});
    }}
    outQue{k}.FreeTensor(r{k});""")
        return ("  // The item's mid axis is done: finish Mean, write each reduced output's chunk at ro.\n"
                "  __aicore__ inline void ItemEnd(uint64_t ro, uint32_t n) {\n" + "\n".join(lines) + "\n  }\n")

    def _row_of(self, k: int) -> str:
        """3-level broadcast: the element index of input k's row (outer o, mid m) in its view."""
        po, pm, pi = self.patterns[k]
        return f"(({'o' if po == 'f' else '0'}) * {'mid' if pm == 'f' else '1'} + {'m' if pm == 'f' else '0'})"

    def _extent3(self, k: int, outer="t.outer", mid="t.mid", inner="t.inner") -> str:
        return " * ".join(d for d, p in zip((outer, mid, inner), self.patterns[k]) if p == "f") or "1"

    def _acc_type(self, acc: int) -> str:
        return STORAGE[self.p.insts[self._acc_inst(acc)].operand_dtype]

    def _acc_inst(self, acc: int) -> int:
        return next(k for k, a in self.acc_of.items() if a == acc)

    def _reduced_value(self, index: int) -> str:
        """The tensor holding reduced value %index at the row's end (lane 0)."""
        return f"acc{self.acc_of[index]}" if index in self.acc_of else self.row_loc[index]

    def _row_end_inst(self, k: int, inst):
        """%k computed from reduced values and immediates only: once a row, in float, on one lane."""
        mapping = opmap.lookup(inst.op)
        why = opmap.refusal(inst.op, "float")
        if why:
            raise _Refused(f"%{k} = {why}")
        if mapping.tile_only or inst.dtype == "bool":
            raise _Refused(f"%{k} = {inst.op} on reduced values: it needs whole 256-byte repeats "
                           "(Compare) or a tile-sized temp buffer, not the one lane of RowEnd (on a "
                           "full-shape value reading a reduced one, in a later pass, it is generated)")
        self.row_pass = self.pass_of[k]
        args = []
        for o in inst.operands:
            if isinstance(o, ir.Ref):
                args.append(self._reduced_value(o.index))
            else:
                view = self._row_buf()
                self._row_vec(f"Duplicate({view}, {opmap.lit('float', o)}, 1);")
                args.append(view)
        temps = [self._row_buf() for _ in range(opmap.temps_for(mapping, "float"))]
        dst = self._row_buf()
        extra = {"alpha": opmap.alpha_of(inst.attrs)} if inst.op == "LeakyRelu" else {}
        self._row_vec(*mapping.emit("float", dst, args, "1", temps, **extra))
        self.row_loc[k] = dst

    def _drop(self, ref, loc):
        expr, t, slot = loc.get(ref, (None, None, None))
        if slot is not None:
            self._release(slot)
            del loc[ref]

    # ---- sources -------------------------------------------------------------------------
    def _tiling_header(self) -> str:
        guard = f"{self.name.upper()}_TILING_H_"
        return (f"// Tiling data of {self.name}: computed on the host, read by the kernel.\n"
                f"#ifndef {guard}\n#define {guard}\n#include <cstdint>\n\n"
                f"{tiling.cpp_struct(self.name + '_TilingData', self.split is not None, self.split2 is not None)}\n"
                f"#endif  // {guard}\n")

    def _kernel_source(self, in_types, out_types, ub) -> str:
        n = self.name
        nin, nout = len(in_types), len(out_types)
        program = "".join(f"//   {line}\n" for line in self.p.text.splitlines())
        gm_args = ", ".join([f"GM_ADDR in{k}" for k in range(nin)] + [f"GM_ADDR out{k}" for k in range(nout)])
        gm_names = ", ".join([f"in{k}" for k in range(nin)] + [f"out{k}" for k in range(nout)])
        members = []
        for k, t in enumerate(in_types):
            if self.queued[k]:
                members.append(f"  TQue<TPosition::VECIN, BUFFER_NUM> inQue{k};")
            members.append(f"  GlobalTensor<{t}> in{k}Gm;")
        for k, t in enumerate(out_types):
            members.append(f"  TQue<TPosition::VECOUT, BUFFER_NUM> outQue{k};")
            members.append(f"  GlobalTensor<{t}> out{k}Gm;")
        members += [f"  TBuf<TPosition::VECCALC> calc{s};" for s in range(self.slots)]
        members += [f"  TBuf<TPosition::VECCALC> foldBuf{a};  // tile accumulator" for a in self.folds]
        if self.shared_tmp[0]:
            members.append("  TBuf<TPosition::VECCALC> sharedTmpBuf;  // advanced math temp buffer")
        members += [f"  TBuf<TPosition::VECCALC> accBuf{a};  // row accumulator of %{op}"
                    for a, op in self.reductions]
        has_mean = any(op == "Mean" for _, op in self.reductions)
        if has_mean:
            members.append("  TBuf<TPosition::VECCALC> rowTmp;")
        members += [f"  TBuf<TPosition::VECCALC> rowBuf{i};  // arithmetic on reduced values"
                    for i in range(self.row_bufs)]
        out_red = getattr(self, "out_reduced", [False] * nout)
        bcast = self.split is not None
        extent = {"full": "t.outer * t.inner", "row": "t.inner", "col": "t.outer", "scalar": "1"}
        if self.column or self.bcast3:
            extent["full"] = "t.outer * t.mid * t.inner"
        init = []
        for k, t in enumerate(in_types):
            if self.bcast3:
                init.append(f"    in{k}Gm.SetGlobalBuffer((__gm__ {t}*)in{k}, {self._extent3(k)});")
            elif bcast:
                init.append(f"    in{k}Gm.SetGlobalBuffer((__gm__ {t}*)in{k}, {extent[self.patterns[k]]});")
            else:
                init.append(f"    in{k}Gm.SetGlobalBuffer((__gm__ {t}*)in{k} + start, len);")
            if self.queued[k]:
                init.append(f"    pipe.InitBuffer(inQue{k}, BUFFER_NUM, t.tileLength * sizeof({t}));")
        for k, t in enumerate(out_types):
            if out_red[k] and self.column:
                init.append(f"    out{k}Gm.SetGlobalBuffer((__gm__ {t}*)out{k}, t.outer * t.inner);")
                init.append(f"    pipe.InitBuffer(outQue{k}, BUFFER_NUM, t.tileLength * sizeof({t}));")
                continue
            if out_red[k]:
                init.append(f"    out{k}Gm.SetGlobalBuffer((__gm__ {t}*)out{k}, t.outer);")
                init.append(f"    pipe.InitBuffer(outQue{k}, BUFFER_NUM, 32);")
                continue
            if bcast:
                init.append(f"    out{k}Gm.SetGlobalBuffer((__gm__ {t}*)out{k}, {extent['full']});")
            else:
                init.append(f"    out{k}Gm.SetGlobalBuffer((__gm__ {t}*)out{k} + start, len);")
            init.append(f"    pipe.InitBuffer(outQue{k}, BUFFER_NUM, t.tileLength * sizeof({t}));")
        init += [f"    pipe.InitBuffer(accBuf{a}, 32);" for a, _ in self.reductions]
        init += [f"    pipe.InitBuffer(foldBuf{a}, t.tileLength * 4);" for a in self.folds]
        if has_mean:
            init.append("    pipe.InitBuffer(rowTmp, 32);")
        init += [f"    pipe.InitBuffer(rowBuf{i}, 32);" for i in range(self.row_bufs)]
        init += [f"    pipe.InitBuffer(calc{s}, t.tileLength * 4);" for s in range(self.slots)]
        if self.shared_tmp[0]:
            init.append(f"    pipe.InitBuffer(sharedTmpBuf, t.tileLength * {self.shared_tmp[0]} + "
                        f"{self.shared_tmp[1]});")

        def copy_in(k, t):
            if not self.queued[k]:
                return ""
            off = "col" if bcast and self.patterns[k] == "row" else "off"
            if self.bcast3:
                off = f"{self._row_of(k)} * {'inner' if self.patterns[k][2] == 'f' else '1'} + col"
            return f"""\
    LocalTensor<{t}> x{k} = inQue{k}.AllocTensor<{t}>();
    if ((n * sizeof({t})) % 32 == 0) {{
      DataCopy(x{k}, in{k}Gm[{off}], n);
    }} else {{
      DataCopyExtParams copy{{1, static_cast<uint32_t>(n * sizeof({t})), 0, 0, 0}};
      DataCopyPadExtParams<{t}> pad{{false, 0, 0, static_cast<{t}>(0)}};
      DataCopyPad(x{k}, in{k}Gm[{off}], copy, pad);
    }}
    inQue{k}.EnQue(x{k});
"""

        def copy_out(k, t):
            if out_red[k]:
                return ""
            return f"""\
    LocalTensor<{t}> y{k} = outQue{k}.DeQue<{t}>();
    if ((n * sizeof({t})) % 32 == 0) {{
      DataCopy(out{k}Gm[off], y{k}, n);
    }} else {{
      DataCopyExtParams copy{{1, static_cast<uint32_t>(n * sizeof({t})), 0, 0, 0}};
      DataCopyPad(out{k}Gm[off], y{k}, copy);
    }}
    outQue{k}.FreeTensor(y{k});
"""

        P = self.n_passes

        def compute_lines(body, final):
            # several passes: the caller DeQues and frees the input tiles (a resident row is read once)
            lines = [f"    LocalTensor<{t}> x{k} = inQue{k}.DeQue<{t}>();" for k, t in enumerate(in_types)
                     if self.queued[k] and P == 1]
            if final:
                lines += [f"    LocalTensor<{t}> y{k} = outQue{k}.AllocTensor<{t}>();"
                          for k, t in enumerate(out_types) if not out_red[k]]
            lines += [f"    LocalTensor<{self._acc_type(a)}> acc{a} = accBuf{a}.Get<{self._acc_type(a)}>();"
                      for a, _ in self.reductions]
            lines += [f"    LocalTensor<{self._acc_type(a)}> f{a} = foldBuf{a}.Get<{self._acc_type(a)}>();"
                      for a in self.folds]
            if self.reduce:
                lines.insert(0, "    PipeBarrier<PIPE_V>();  // the accumulators were written by the last tile")
            for (slot, ctype), view in sorted(self.views.items()):
                lines.append(f"    LocalTensor<{ctype}> {view} = calc{slot}.Get<{ctype}>();")
            if self.shared_tmp[0]:
                lines.append("    LocalTensor<uint8_t> sharedTmp = sharedTmpBuf.Get<uint8_t>();")
            lines += [f"    {s}" for s in body]
            if final:
                lines += [f"    outQue{k}.EnQue(y{k});" for k in range(nout) if not out_red[k]]
            lines += [f"    inQue{k}.FreeTensor(x{k});" for k in range(nin) if self.queued[k] and P == 1]
            return lines

        def row_end_source(q):
            final = q + 1 == P
            lines = ["    PipeBarrier<PIPE_V>();"]
            lines += [f"    LocalTensor<{self._acc_type(a)}> acc{a} = accBuf{a}.Get<{self._acc_type(a)}>();"
                      for a, _ in self.reductions]
            lines += [f"    LocalTensor<{self._acc_type(a)}> f{a} = foldBuf{a}.Get<{self._acc_type(a)}>();"
                      for a in self.folds]
            for a in self.folds:
                if self.pass_of[self._acc_inst(a)] != q:
                    continue
                inst = self.p.insts[self._acc_inst(a)]
                at = self._acc_type(a)
                mean = ("\n    v = static_cast<int32_t>(static_cast<int64_t>(v) / static_cast<int64_t>(inner));"
                        if inst.op == "Mean" else "")
                lines.append(f"""\
    {{  // finish %{self._acc_inst(a)} = {inst.op}: halve the tile accumulator to 8 lanes, fold those on the scalar unit
      uint32_t len = tileLength, half = 8;
      while (half * 2 <= len) half *= 2;
      if (len > half) {{
        {FOLD_OP[inst.op]}(f{a}, f{a}, f{a}[half], static_cast<int32_t>(len - half));
        PipeBarrier<PIPE_V>();
      }}
      for (half /= 2; half >= 8; half /= 2) {{
        {FOLD_OP[inst.op]}(f{a}, f{a}, f{a}[half], static_cast<int32_t>(half));
        PipeBarrier<PIPE_V>();
      }}
      SetFlag<HardEvent::V_S>(EVENT_ID0);
      WaitFlag<HardEvent::V_S>(EVENT_ID0);
      {at} v = f{a}.GetValue(0);
      for (uint32_t i = 1; i < 8; ++i) {{
        const {at} x = f{a}.GetValue(i);
        {FOLD_SCALAR[FOLD_OP[inst.op]]}
      }}{mean}
      acc{a}.SetValue(0, v);
      SetFlag<HardEvent::S_V>(EVENT_ID0);
      WaitFlag<HardEvent::S_V>(EVENT_ID0);
    }}""")
            means = [a for a, op in self.reductions if op == "Mean" and self.pass_of[self._acc_inst(a)] == q
                     and a not in self.folds]
            if means:
                lines += ["    LocalTensor<float> tmp = rowTmp.Get<float>();",
                          "    Duplicate(tmp, static_cast<float>(inner), 8);", "    PipeBarrier<PIPE_V>();"]
                lines += [f"    Div(acc{a}, acc{a}, tmp, 1);\n    PipeBarrier<PIPE_V>();" for a in means]
            if self.row_bufs:
                lines += [f"    LocalTensor<float> rv{i} = rowBuf{i}.Get<float>();" for i in range(self.row_bufs)]
            if self.row_bodies[q]:
                lines += [f"    {stmt}" for stmt in self.row_bodies[q]]
                lines.append("    PipeBarrier<PIPE_V>();")
            scalars = sorted(k for k in self.scalars if self.pass_of[k] == q)
            if scalars:  # the vector results, read by the scalar unit: V -> S synchronisation
                lines += ["    SetFlag<HardEvent::V_S>(EVENT_ID0);", "    WaitFlag<HardEvent::V_S>(EVENT_ID0);"]
                lines += [f"    rs{k} = {self._reduced_value(k)}.GetValue(0);" for k in scalars]
            for k, t in enumerate(out_types):
                if not out_red[k] or not final:
                    continue
                value = self._reduced_value(self.p.outputs[k].ref.index)
                convert = (f"Muls(r{k}, {value}, 1.0f, 8);" if t == "float"
                           else f"Adds(r{k}, {value}, static_cast<int32_t>(0), 8);" if t == "int32_t"
                           else f"Cast(r{k}, {value}, RoundMode::CAST_RINT, 8);")
                lines.append(f"""\
    LocalTensor<{t}> r{k} = outQue{k}.AllocTensor<{t}>();
    {convert}
    outQue{k}.EnQue(r{k});
    r{k} = outQue{k}.DeQue<{t}>();
    DataCopyExtParams copy{k}{{1, static_cast<uint32_t>(sizeof({t})), 0, 0, 0}};
    DataCopyPad(out{k}Gm[o], r{k}, copy{k});
    outQue{k}.FreeTensor(r{k});""")
            name = "RowEnd" if P == 1 else f"RowEnd{q}"
            what = ("finish Mean, compute on the reduced values, write each reduced output's element"
                    if P == 1 else
                    f"pass {q} of the row is done: finish its Mean, compute on its reduced values"
                    + (", read the ones later passes broadcast" if scalars else "")
                    + (", write each reduced output's element" if final else ""))
            return (f"  // {what}.\n"
                    f"  __aicore__ inline void {name}(uint64_t o) {{\n" + "\n".join(lines) + "\n  }\n")

        compute_params = ("uint64_t o, uint64_t j, uint32_t n" if self.reduce else
                          "uint64_t o, uint64_t m, uint32_t n" if self.bcast3 else
                          "uint64_t o, uint32_t n" if bcast else "uint32_t n")
        cn_line = "    const int32_t cn = static_cast<int32_t>((n + ALIGN - 1) / ALIGN * ALIGN);  // pad lanes are don't-care\n"
        computes = []
        tile_params = "".join(f", LocalTensor<{t}>& x{k}" for k, t in enumerate(in_types) if self.queued[k])
        tile_args = "".join(f", x{k}" for k in range(nin) if self.queued[k])
        deque = "".join(f"\n{{ind}}LocalTensor<{t}> x{k} = inQue{k}.DeQue<{t}>();"
                        for k, t in enumerate(in_types) if self.queued[k])
        free = "".join(f"\n{{ind}}inQue{k}.FreeTensor(x{k});" for k in range(nin) if self.queued[k])
        for q, body in enumerate(self.bodies):
            name = "Compute" if P == 1 else f"Compute{q}"
            params = compute_params if P == 1 else compute_params + tile_params
            computes.append(f"  __aicore__ inline void {name}({params}) {{\n" + cn_line
                            + "\n".join(compute_lines(body, q + 1 == P)) + "\n  }\n")
        compute_src = "".join(computes)
        row_end = "".join(row_end_source(q) for q in range(P)) if self.reduce else ""
        if self.column:
            row_end = self._item_end_source(out_types, out_red)
        if bcast:
            prelude = """\
    const uint64_t first = GetBlockIdx() * t.tilesPerBlock;
    firstTile = first;
    lastTile = first + t.tilesPerBlock < t.totalTiles ? first + t.tilesPerBlock : t.totalTiles;
    inner = t.inner;
    tilesPerRow = t.tilesPerRow;
    tileLength = t.tileLength;"""
            process = """\
    for (uint64_t g = firstTile; g < lastTile; ++g) {
      const uint64_t o = g / tilesPerRow;  // outer index: the row
      const uint64_t col = (g % tilesPerRow) * tileLength;  // inner offset in the row
      const uint64_t off = o * inner + col;
      const uint32_t n = static_cast<uint32_t>(inner - col < tileLength ? inner - col : tileLength);
      CopyIn(off, col, n);
      Compute(o, n);
      CopyOut(off, n);
    }"""
            if self.reduce:
                process = process.replace("      Compute(o, n);", "      const uint64_t j = g % tilesPerRow;\n      Compute(o, j, n);")
                process = process.replace("      CopyOut(off, n);\n",
                                          "      CopyOut(off, n);\n      if (j + 1 == tilesPerRow) RowEnd(o);\n")
            if P > 1:  # whole rows a block: a row of one tile stays in UB for every pass, a longer
                #          row is re-read from GM in every pass
                resident, loops = [], []
                for q in range(P):
                    out = "\n          CopyOut(off, n);" if q + 1 == P else ""
                    resident.append(f"        Compute{q}(o, 0, n{tile_args});{out.replace('    ', '  ', 1)}"
                                    f"\n        RowEnd{q}(o);")
                    loops.append(f"""\
        for (uint64_t j = 0; j < tilesPerRow; ++j) {{
          const uint64_t col = j * tileLength;
          const uint64_t off = o * inner + col;
          const uint32_t n = static_cast<uint32_t>(inner - col < tileLength ? inner - col : tileLength);
          CopyIn(off, col, n);{deque.replace("{ind}", "          ")}
          Compute{q}(o, j, n{tile_args});{free.replace("{ind}", "          ")}{out}
        }}
        RowEnd{q}(o);""")
                process = (
                    "    for (uint64_t o = firstTile / tilesPerRow; o < lastTile / tilesPerRow; ++o) {\n"
                    "      if (tilesPerRow == 1) {  // the row fits in one tile: read once, every pass in UB\n"
                    "        const uint64_t off = o * inner;\n"
                    "        const uint32_t n = static_cast<uint32_t>(inner);\n"
                    "        CopyIn(off, 0, n);" + deque.replace("{ind}", "        ") + "\n"
                    + "\n".join(resident) + free.replace("{ind}", "        ") + "\n"
                    "      } else {  // every pass reads the row's tiles from GM again\n"
                    + "\n".join(loops) + "\n      }\n    }")
            if self.column:
                prelude = prelude.replace("    inner = t.inner;", "    inner = t.inner;\n    mid = t.mid;")
                process = """\
    for (uint64_t g = firstTile; g < lastTile; ++g) {
      const uint64_t o = g / tilesPerRow;  // outer index
      const uint64_t col = (g % tilesPerRow) * tileLength;  // inner offset
      const uint32_t n = static_cast<uint32_t>(inner - col < tileLength ? inner - col : tileLength);
      for (uint64_t j = 0; j < mid; ++j) {  // the reduced (mid) axis, accumulated element-wise
        const uint64_t off = (o * mid + j) * inner + col;
        CopyIn(off, col, n);
        Compute(o, j, n);
        CopyOut(off, n);
      }
      ItemEnd(o * inner + col, n);
    }"""
            if self.bcast3:
                prelude = prelude.replace("    inner = t.inner;", "    inner = t.inner;\n    mid = t.mid;")
                process = """\
    for (uint64_t g = firstTile; g < lastTile; ++g) {
      const uint64_t row = g / tilesPerRow;  // the row of [outer * mid, inner]
      const uint64_t o = row / mid, m = row % mid;  // its outer and mid indices
      const uint64_t col = (g % tilesPerRow) * tileLength;  // inner offset in the row
      const uint64_t off = row * inner + col;
      const uint32_t n = static_cast<uint32_t>(inner - col < tileLength ? inner - col : tileLength);
      CopyIn(off, col, n, o, m);
      Compute(o, m, n);
      CopyOut(off, n);
    }"""
            copy_in_params = "uint64_t off, uint64_t col, uint32_t n"
            if self.bcast3:
                copy_in_params += ", uint64_t o, uint64_t m"
            state = "  uint64_t firstTile = 0, lastTile = 0, inner = 0, tilesPerRow = 0;\n  uint32_t tileLength = 0;"
            if self.column or self.bcast3:
                state += "\n  uint64_t mid = 0;"
            state += "".join(f"\n  {STORAGE[self.p.insts[k].dtype]} rs{k} = 0;  // %{k} of the current row, "
                             "broadcast over it" for k in sorted(self.scalars))
        else:
            prelude = """\
    const uint64_t block = GetBlockIdx();
    const bool last = block + 1 == t.blockDim;
    const uint64_t start = block * t.blockLength;
    const uint64_t len = last ? t.lastBlockLength : t.blockLength;
    tileLength = t.tileLength;
    tileNum = last ? t.lastTileNum : t.tileNum;
    tailLength = last ? t.lastTailLength : t.tailLength;"""
            process = """\
    for (uint32_t i = 0; i < tileNum; ++i) {
      const uint32_t n = i + 1 == tileNum ? tailLength : tileLength;
      const uint64_t off = static_cast<uint64_t>(i) * tileLength;
      CopyIn(off, n);
      Compute(n);
      CopyOut(off, n);
    }"""
            copy_in_params = "uint64_t off, uint32_t n"
            state = "  uint32_t tileLength = 0, tileNum = 0, tailLength = 0;"
        schedule = ("flat" if not bcast else
                    f"{'reduce (inner axes reduced)' if self.reduce else 'broadcast'}, outer axes [0, {self.split}), inputs "
                    + ", ".join(f"in{k} {pat}" for k, pat in enumerate(self.patterns)))
        if P > 1:
            schedule += f"; {P} passes over each row (re-read from GM)"
        if self.bcast3:
            schedule = (f"broadcast over [outer, mid, inner] = axes [0, {self.split}), [{self.split}, "
                        f"{self.split2}), [{self.split2}, rank); per input full (f) or broadcast (b) on each: "
                        + ", ".join(f"in{k} {pat}" for k, pat in enumerate(self.patterns)))
        if self.column:
            schedule = (f"column reduce: the iteration shape as [outer, mid, inner] = axes [0, {self.split}), "
                        f"[{self.split}, {self.split2}) reduced, [{self.split2}, rank); inputs full")

        half_note = ("// Computed in half (--autofuse_enhance_precision_blacklist): "
                     + ", ".join(self.half_ops) + "\n") if self.half_ops else ""
        return f"""\
// Generated by tf_autofuse.codegen from the fused program:
{program}// Schedule: {schedule}. {ub.describe()}
{half_note}#include "kernel_operator.h"
#include "{n}_tiling.h"

using namespace AscendC;

namespace {n}_impl {{
constexpr int32_t BUFFER_NUM = {tiling.BUFFER_NUM};
constexpr uint32_t ALIGN = {tiling.ALIGN_ELEMS};  // elements; whole 32-byte blocks of every dtype

class Kernel {{
 public:
  __aicore__ inline Kernel() {{}}
  __aicore__ inline void Init({gm_args}, const {n}_TilingData& t) {{
{prelude}
{chr(10).join(init)}
  }}
  __aicore__ inline void Process() {{
{process}
  }}

 private:
  __aicore__ inline void CopyIn({copy_in_params}) {{
{"".join(copy_in(k, t) for k, t in enumerate(in_types))}  }}
{compute_src}  __aicore__ inline void CopyOut(uint64_t off, uint32_t n) {{
{"".join(copy_out(k, t) for k, t in enumerate(out_types))}  }}
{row_end}
  TPipe pipe;
{chr(10).join(members)}
{state}
}};

__aicore__ inline void CopyTiling({n}_TilingData* t, GM_ADDR tiling) {{
  uint32_t* dst = reinterpret_cast<uint32_t*>(t);
  __gm__ uint32_t* src = reinterpret_cast<__gm__ uint32_t*>(tiling);
  for (uint32_t i = 0; i < sizeof({n}_TilingData) / sizeof(uint32_t); ++i) dst[i] = src[i];
}}
}}  // namespace {n}_impl

extern "C" __global__ __aicore__ void {n}({gm_args}, GM_ADDR workspace, GM_ADDR tiling) {{
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  {n}_TilingData t;
  {n}_impl::CopyTiling(&t, tiling);
  if (GetBlockIdx() >= t.blockDim) return;
  {n}_impl::Kernel op;
  op.Init({gm_names}, t);
  op.Process();
}}
"""

    def _host_source(self, in_types, out_types, ub) -> str:
        n = self.name
        nin, nout = len(in_types), len(out_types)
        in_sizes = ", ".join(str(SIZE[t]) for t in in_types)
        out_sizes = ", ".join(str(SIZE[t]) for t in out_types)
        dev_args = ", ".join([f"static_cast<uint8_t*>(dev[{k}])" for k in range(nin + nout)]
                             + ["nullptr", f"static_cast<uint8_t*>(dev[{nin + nout}])"])
        if self.split is None:
            tiling_fn = tiling.cpp_function(n, n + "_TilingData", ub.max_tile)
            tiling_call = (f'  if ({n}_tiling(a->total, core_num, 0, &t) != 0) '
                           f'return autofuse_launch_fail(a, -1, "{n}: tiling failed");')
            in_bytes = f"  for (int k = 0; k < {nin}; ++k) bytes[k] = a->total * {n}_IN_SIZES[k];"
        else:
            rank = max(len(i.view) for i in self.p.inputs)
            tiling_fn = tiling.cpp_bcast_function(n, n + "_TilingData", ub.max_tile, self.reduce)
            tiling_call = f"""\
  if (a->rank != {rank} || (a->rank && !a->shape))
    return autofuse_launch_fail(a, -1, "{n}: the iteration shape must have rank {rank}");
  uint64_t outer = 1, inner = 1;
  for (uint32_t d = 0; d < a->rank; ++d) (d < {self.split} ? outer : inner) *= static_cast<uint64_t>(a->shape[d]);
  if (outer * inner != a->total) return autofuse_launch_fail(a, -1, "{n}: total != product of the shape");
  if ({n}_tiling(outer, inner, core_num, 0, &t) != 0) return autofuse_launch_fail(a, -1, "{n}: tiling failed");"""
            extent = {"full": "outer * inner", "row": "inner", "col": "outer", "scalar": "1"}
            in_bytes = "\n".join(f"  bytes[{k}] = ({extent.get(pat, '0')}) * {n}_IN_SIZES[{k}];"
                                 for k, pat in enumerate(self.patterns))  # 3-level: set below
        out_red = getattr(self, "out_reduced", [False] * nout)
        if self.column or self.bcast3:
            rank = max(len(i.view) for i in self.p.inputs)
            tiling_fn = tiling.cpp_column_function(n, n + "_TilingData", ub.max_tile, rows=self.bcast3)
            tiling_call = f"""\
  if (a->rank != {rank} || (a->rank && !a->shape))
    return autofuse_launch_fail(a, -1, "{n}: the iteration shape must have rank {rank}");
  uint64_t dims[3] = {{1, 1, 1}};
  for (uint32_t d = 0; d < a->rank; ++d)
    dims[d < {self.split} ? 0 : d < {self.split2} ? 1 : 2] *= static_cast<uint64_t>(a->shape[d]);
  const uint64_t outer = dims[0], inner = dims[2];
  if (dims[0] * dims[1] * dims[2] != a->total) return autofuse_launch_fail(a, -1, "{n}: total != product of the shape");
  if ({n}_tiling(dims[0], dims[1], dims[2], core_num, 0, &t) != 0) return autofuse_launch_fail(a, -1, "{n}: tiling failed");"""
            in_bytes = "\n".join(f"  bytes[{k}] = a->total * {n}_IN_SIZES[{k}];" for k in range(nin))
            if self.bcast3:
                in_bytes = "\n".join(f"  bytes[{k}] = ({self._extent3(k, 'dims[0]', 'dims[1]', 'dims[2]')}) * "
                                     f"{n}_IN_SIZES[{k}];" for k in range(nin))
        reduced_extent = "outer * inner" if self.column else "outer"
        out_bytes = "\n".join(f"  bytes[{nin + k}] = {reduced_extent if out_red[k] else 'a->total'} * {n}_OUT_SIZES[{k}];"
                              for k in range(nout))
        return f"""\
// Host side of {n}: the tiling function and the ACL launch glue.
// Build with AUTOFUSE_WITH_ACL for the launcher (needs acl/acl.h and libascendcl.so).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include "{n}_tiling.h"
#include "autofuse_launch.h"

{tiling_fn}
static const uint32_t {n}_IN_SIZES[{nin}] = {{{in_sizes}}};
static const uint32_t {n}_OUT_SIZES[{nout}] = {{{out_sizes}}};

#ifdef AUTOFUSE_WITH_ACL
#include "acl/acl.h"

// Runs the kernel on host buffers: device buffers, copy in, launch with the tiling data,
// synchronise, copy out, free. 0 on success, else an ACL error code (message in a->error).
extern "C" int {n}_launch(const AutofuseLaunchArgs* a) {{
  if (a->abi_version != AUTOFUSE_LAUNCH_ABI || a->num_inputs != {nin} || a->num_outputs != {nout})
    return autofuse_launch_fail(a, -1, "{n}: bad launch arguments (ABI or tensor count)");
  aclrtStream stream = reinterpret_cast<aclrtStream>(a->stream);
  uint32_t core_num = a->core_num;
  aclError rc = autofuse_acl_prepare(a->device_id, &stream, &core_num);
  if (rc != ACL_SUCCESS) return autofuse_acl_fail(a, rc, "device setup failed");
  {n}_TilingData t;
{tiling_call}
  if (t.blockDim == 0) return 0;
  void* dev[{nin + nout + 1}] = {{}};
  uint64_t bytes[{nin + nout + 1}];
{in_bytes}
  for (int k = 0; k < {nin}; ++k)
    if (a->input_elements && a->input_elements[k] * {n}_IN_SIZES[k] != bytes[k])
      return autofuse_launch_fail(a, -1, "{n}: an input does not have the element count its view needs");
{out_bytes}
  bytes[{nin + nout}] = sizeof(t);
  const char* what = "aclrtMalloc";
  for (int k = 0; k < {nin + nout + 1} && rc == ACL_SUCCESS; ++k)
    rc = aclrtMalloc(&dev[k], bytes[k], ACL_MEM_MALLOC_HUGE_FIRST);
  if (rc == ACL_SUCCESS) {{
    what = "aclrtMemcpy host->device";
    for (int k = 0; k < {nin} && rc == ACL_SUCCESS; ++k)
      rc = aclrtMemcpy(dev[k], bytes[k], a->inputs[k], bytes[k], ACL_MEMCPY_HOST_TO_DEVICE);
    if (rc == ACL_SUCCESS)
      rc = aclrtMemcpy(dev[{nin + nout}], sizeof(t), &t, sizeof(t), ACL_MEMCPY_HOST_TO_DEVICE);
  }}
  if (rc == ACL_SUCCESS) {{
    what = "kernel launch";
    rc = AUTOFUSE_LAUNCH_KERNEL({n}, t.blockDim, stream, {dev_args});
  }}
  if (rc == ACL_SUCCESS) {{
    what = "aclrtSynchronizeStream";
    rc = aclrtSynchronizeStream(stream);
  }}
  if (rc == ACL_SUCCESS) {{
    what = "aclrtMemcpy device->host";
    for (int k = 0; k < {nout} && rc == ACL_SUCCESS; ++k)
      rc = aclrtMemcpy(a->outputs[k], bytes[{nin} + k], dev[{nin} + k], bytes[{nin} + k],
                       ACL_MEMCPY_DEVICE_TO_HOST);
  }}
  for (int k = 0; k < {nin + nout + 1}; ++k)
    if (dev[k]) aclrtFree(dev[k]);
  if (rc != ACL_SUCCESS) return autofuse_acl_fail(a, rc, what);
  if (a->tiling_out) std::memcpy(a->tiling_out, &t, sizeof(t));
  return 0;
}}

#ifdef AUTOFUSE_SINGLE_KERNEL
extern "C" int autofuse_npu_launch(const AutofuseLaunchArgs* a) {{ return {n}_launch(a); }}
extern "C" const char* autofuse_npu_kernel_name() {{ return "{n}"; }}
#endif
#endif  // AUTOFUSE_WITH_ACL
"""
