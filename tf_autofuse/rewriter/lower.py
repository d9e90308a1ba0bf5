"""A set of nodes -> the FusedProgram it computes, with the tensors it reads and yields.

`build` is both the legality check and the lowering: it raises `Unfusible(reason)` for
anything the program cannot express. `check` is build for the partitioner's trial merges: the
same refusals, and when it gives a Checked, the same inputs, outputs and dtypes, without the
program (emitting and validating it was most of a trial's cost).

Shapes. Every value gets its TF shape (unknown sizes of the group's inputs become symbols,
unique per tensor and dimension, so that only sizes read from one place compare equal) and a
*placement*: which axis of the iteration space each of its dimensions occupies. Full values sit
on the trailing axes (numpy's right alignment); a keep_dims=false reduced value sits on the axes
that were not reduced. An op's operands must agree on where each dimension of size > 1 sits, so
that the kernel's broadcast (of keep_dims forms) is TF's (of the shapes TF sees). Inputs take the
placement their consumer gives them, which becomes their view (`in1: f32[16] -> [16,1,1]`). The
iteration shape is the broadcast of every input view; each exported value must be it (full
values) or the reduced shape (reduced values), else the group is refused.

Inputs are the group's outside data inputs in the order the members (topological order) read
them, each (tensor, view) once; scalar Consts become immediates. Outputs are the members, in
topological order, whose value is read outside the group or whose name must be kept.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import AbstractSet, Callable, Mapping, NamedTuple, Optional

from tensorflow.core.framework import types_pb2

from . import catalog, errors
from . import program as ir
from .graph import GraphView, Tensor, format_shape

SYMBOL_BASE = -(10**9)  # fresh symbols for unknown sizes: SYMBOL_BASE, SYMBOL_BASE - 1, ...


class Unfusible(Exception):
    """The nodes cannot be one fused program; str(err) is the reason."""


def _refusing_internal_errors(lowering):
    """`lowering` (build, check) with any exception but Unfusible made the refusal of the
    members it was lowering (errors.internal_refusal), so that a bug costs one group, not the
    graph; the original exception is chained."""

    @functools.wraps(lowering)
    def guarded(view, members, *args, **kwargs):
        try:
            return lowering(view, members, *args, **kwargs)
        except Unfusible:
            raise
        except Exception as err:  # noqa: BLE001 - any bug of the lowering, by design
            raise Unfusible(errors.internal_refusal(err)) from err

    return guarded


def _refuse_immediates_only(op: str, operands) -> None:
    """An instruction needs a value operand: one of immediates only is never emitted (an emitter
    folds what it can compute exactly, e.g. ClipByValue of two constants; the rest is
    TensorFlow's constant folding's to do)."""
    if operands and not any(isinstance(o, ir.Ref) for o in operands):
        raise Unfusible(f"{op} of immediates only ({', '.join(map(repr, operands))})")


@dataclasses.dataclass(frozen=True)
class Lowered:
    program: ir.FusedProgram
    inputs: tuple  # of Tensor (node, output index), in0, in1, ...
    outputs: tuple  # of member names, out0, out1, ...
    control_inputs: tuple  # outside nodes members wait for, sorted
    op_types: tuple  # TF op types in order (a composition gives its op_names)
    in_dtypes: tuple  # DataType of each input
    out_dtypes: tuple  # DataType of each output
    absorbed: tuple = ()  # view nodes read through (removed from the graph)
    kind: str = "pointwise"  # "pointwise", or "reduce" when the program reduces
    # An AutofuseAssignKernel's variables (rewriter/assigns.py): the resource handles the node
    # takes after `inputs`; per program input after `inputs`, the variable it reads; per output,
    # the variable it is stored into (-1: none; () when no output is); the assignment nodes the
    # kernel carries out (removed from the graph, or a NoOp where their name must stay).
    variables: tuple = ()
    variable_reads: tuple = ()
    variable_writes: tuple = ()
    assigns: tuple = ()


def keeps_name(view: GraphView, name: str, preserve: AbstractSet[str]) -> bool:
    """A member keeps its name (as an Identity) when preserved, or when nothing reads it
    (then it can only be there to be fetched)."""
    return name in preserve or not view.data_consumers(name)


def compute_ops(view: GraphView, name: str) -> list:
    """The TF op types a node computes (a composition: its op_names); [] when unsupported."""
    node = view.node(name)
    if node.op == catalog.COMPOSITION_OP:
        if "op_names" not in node.attr:  # never index a proto map with a missing key
            return []
        ops = [s.decode() for s in node.attr["op_names"].list.s]
        if not ops or any(catalog.for_tf_op(op) is None for op in ops):
            return []
        return ops
    entry = catalog.tf_op(node.op)
    return [node.op] if entry is not None and entry.kind != catalog.VIEW else []


def compute_dtype(view: GraphView, name: str) -> Optional[int]:
    """The dtype a fusible node computes in (a Cast: its source type)."""
    return _node_facts(view, name).compute


def scalar_immediate(view: GraphView, tensor: Tensor, dtype: Optional[int],
                     feeds: AbstractSet[str] = frozenset(), members: AbstractSet[str] = frozenset()):
    """The Python value of a finite scalar Const of dtype `dtype`, or None (also for a Const
    the caller feeds or that waits on a control input other than the group's `members`)."""
    if tensor[0] in feeds or (tensor[0] in view and not waits_on_members(view, tensor[0], members)):
        return None
    value = view.const_value(tensor)
    if value is None or value.shape != () or dtype not in catalog.IR_DTYPES:
        return None
    if view.output_dtype(*tensor) != dtype:
        return None
    if dtype == types_pb2.DT_BOOL:
        return bool(value)
    if dtype == types_pb2.DT_INT32:
        return int(value)
    number = float(value)
    return number if math.isfinite(number) else None


class _NodeFacts(NamedTuple):
    """What lowering a member reads from its node alone, whatever the group."""

    node: object  # the NodeDef
    ops: list  # compute_ops
    entry: Optional[catalog.TfOp]  # None for a composition
    inputs: list  # data inputs (Tensor)
    n: int  # data operands
    dtypes: list  # dtype of each operand
    compute: Optional[int]  # the compute dtype
    data_positions: list  # operands of the compute dtype ([0] when none)


def _node_facts(view: GraphView, name: str) -> _NodeFacts:
    """The member's _NodeFacts, or Unfusible; computed once per graph (view.memo): the
    partitioner lowers a node again in every trial merge of a group holding it."""
    memo = view.memo.setdefault("lower.facts", {})
    facts = memo.get(name)
    if facts is None:
        try:
            facts = _compute_node_facts(view, name)
        except Unfusible as err:
            facts = err
        memo[name] = facts
    if isinstance(facts, Unfusible):
        raise Unfusible(str(facts))
    return facts


def _compute_node_facts(view: GraphView, name: str) -> _NodeFacts:
    node = view.node(name)
    entry = catalog.tf_op(node.op)
    if entry is not None and entry.kind == catalog.VIEW:  # an alias member (aliased_shape)
        dtype = view.dtype(name)
        if dtype not in catalog.IR_DTYPES:
            raise Unfusible(f"{name}: {node.op} of dtype {catalog.dtype_name(dtype)}")
        return _NodeFacts(node, [], entry, view.data_inputs(name)[:1], 1, [dtype], dtype, [0])
    ops = compute_ops(view, name)
    if not ops:
        raise Unfusible(f"{name}: {node.op} is not supported")
    entry = catalog.tf_op(ops[0]) if node.op != catalog.COMPOSITION_OP else None
    inputs = view.data_inputs(name)
    n = entry.data_operands(node, len(inputs)) if entry is not None else 1
    if len(inputs) < n or n == 0:
        raise Unfusible(f"{name}: {node.op} has {len(inputs)} data input(s)")
    if entry is not None:
        dtypes = entry.dtypes_of_operands(node, n)
        compute = entry.compute_dtype(node)
    else:
        compute = view.dtype(name)
        dtypes = [compute]
    data_positions = [i for i, d in enumerate(dtypes) if d == compute] or [0]
    return _NodeFacts(node, ops, entry, inputs, n, dtypes, compute, data_positions)


_NOT_IMMEDIATE = object()


def waits_on_members(view: GraphView, name: str, members: AbstractSet[str]) -> bool:
    """Whether every control input of `name` is one of `members`. TensorFlow's gradients make a
    Const wait on the gradient it scales (`with ops.control_dependencies([grad])`, the 2.0 of
    SquaredDifference's): read by the same group as that gradient, it is an immediate like any
    other, since the fused node runs after its members anyway."""
    return all(c in members for c in view.control_inputs(name))


def _immediate(view: GraphView, tensor: Tensor, dtype, feeds: AbstractSet[str]):
    """scalar_immediate, computed once per graph and feeds (view.memo)."""
    memo = view.memo.setdefault(("lower.immediates", frozenset(feeds)), {})
    key = (tensor, dtype)
    value = memo.get(key, _NOT_IMMEDIATE)
    if value is _NOT_IMMEDIATE:
        value = memo[key] = scalar_immediate(view, tensor, dtype, feeds)
    return value


def _broadcast(view: GraphView, shapes) -> tuple:
    """catalog.broadcast_shapes of known-rank shapes, once per graph and list of shapes
    (view.memo): trial merges broadcast the same operand shapes again and again."""
    memo = view.memo.setdefault("lower.broadcast", {})
    key = tuple(shapes)
    result = memo.get(key)
    if result is None:
        try:
            result = catalog.broadcast_shapes(shapes)
        except catalog.Unsupported as err:
            result = err
        memo[key] = result
    if isinstance(result, catalog.Unsupported):
        raise catalog.Unsupported(str(result))
    return result


@dataclasses.dataclass
class _Value:
    shape: Optional[tuple]  # TF shape with symbols; None: unknown rank
    placement: Optional[tuple] = None  # iteration axis of each dimension
    reduced: bool = False


def _embed(shape: tuple, placement: tuple, rank: int) -> tuple:
    out = [1] * rank
    for d, axis in zip(shape, placement):
        out[axis] = d
    return tuple(out)


def _shown(shape) -> Optional[tuple]:
    if shape is None:
        return None
    if not shape or min(shape) >= 0:  # nothing symbolic (most shapes)
        return tuple(shape)
    return tuple(d if d >= 0 else -1 for d in shape)


def _fmt(shape) -> str:
    return format_shape(_shown(shape))


def _symbolic(shape: Optional[tuple], next_symbol: list) -> Optional[tuple]:
    """`shape` with each unknown size (-1) replaced by a fresh symbol (next_symbol[0], ...)."""
    if shape is None:
        return None
    dims = []
    for d in shape:
        if d == -1:
            dims.append(next_symbol[0])
            next_symbol[0] -= 1
        else:
            dims.append(d)
    return tuple(dims)


@dataclasses.dataclass
class _FirstPass:
    """Pass 1 of build over a list of members: what each reads, its TF shape (with symbols)."""

    plans: list  # (name, entry or None, op types, operands [(kind, x, shape, dtype)], axes, keep)
    shapes: dict  # member -> shape (None: unknown rank), in member order
    outside: set  # tensors read from outside ("in" operands)
    symbols: dict  # outside tensor -> its shape with symbols
    next_symbol: int
    producers: set  # outside nodes the members read (inputs and immediates)


def _first_pass(view: GraphView, members: list, member_set: AbstractSet[str],
                feeds: AbstractSet[str]) -> _FirstPass:
    """Pass 1 of build, or Unfusible.

    A member's pass 1 reads only its own node and the members before it (its producers:
    members come in topological order), and symbols are numbered in member order, so the
    pass over members[:-1] is the start of the pass over members. The partitioner's trial
    merges mostly add one node after the members of a group lowered before, so each
    successful pass is kept (view.memo) and extended by the members after it, unless one of
    them is read from outside by the members before it (an order that is not topological).
    """
    memo = view.memo.setdefault(("lower.first_pass", frozenset(feeds)), {})
    key = tuple(members)
    done = memo.get(key)
    if done is not None:
        return done
    prefix = memo.get(key[:-1]) if len(key) > 1 else None
    if prefix is not None and key[-1] not in prefix.producers:
        state = _FirstPass(list(prefix.plans), dict(prefix.shapes), set(prefix.outside),
                           dict(prefix.symbols), prefix.next_symbol, set(prefix.producers))
        todo = key[-1:]
    else:
        state = _FirstPass([], {}, set(), {}, SYMBOL_BASE, set())
        todo = key
    symbols = state.symbols
    next_symbol = [state.next_symbol]

    def input_shape(tensor: Tensor) -> Optional[tuple]:
        if tensor not in symbols:
            symbols[tensor] = _symbolic(view.tensor_shape(tensor), next_symbol)
        return symbols[tensor]

    values = state.shapes
    plans = state.plans
    outside_tensors = state.outside
    for name in todo:
        node, ops, entry, inputs, n, dtypes, compute, data_positions = _node_facts(view, name)
        operands = []
        for tensor, dtype in zip(inputs[:n], dtypes):
            if tensor[0] in member_set:
                if tensor[1] != 0:
                    raise Unfusible(f"{name} reads output {tensor[1]} of member {tensor[0]}")
                operands.append(("val", tensor[0], values[tensor[0]], dtype))
                continue
            tensor = view.same_value(tensor, feeds)  # one input for reads of one variable
            state.producers.add(tensor[0])
            immediate = None
            if entry is None or entry.immediates:
                immediate = _immediate(view, tensor, dtype, feeds)
                if immediate is None and tensor[0] in view and view.control_inputs(tensor[0]):
                    immediate = scalar_immediate(view, tensor, dtype, feeds, member_set)
            if immediate is not None:
                operands.append(("imm", immediate, (), dtype))
            else:
                operands.append(("in", tensor, input_shape(tensor), dtype))
        # an instruction needs a value operand that gives its dtype: make a Const an input
        if all(operands[i][0] == "imm" for i in data_positions):
            i = data_positions[0]
            tensor = inputs[i]
            operands[i] = ("in", tensor, input_shape(tensor), dtypes[i])
        for kind, x, shape, dtype in operands:
            if kind == "in":
                outside_tensors.add(x)
        shapes = [shape for _, _, shape, _ in operands]
        axes, keep = None, False
        if entry is not None and entry.kind == catalog.VIEW:
            if operands[0][0] != "val":
                raise Unfusible(f"{name}: a {node.op} of a tensor from outside the group is read "
                                "through (an input view), not computed")
            values[name] = aliased_shape(view, name, shapes[0])
            plans.append((name, entry, ops, operands, axes, keep))
            continue
        if entry is not None and entry.operand_shapes is not None:
            try:
                adjusted = entry.operand_shapes(node, shapes)
            except catalog.Unsupported as err:
                raise Unfusible(f"{name}: {err}") from None
            for i, (old, new) in enumerate(zip(shapes, adjusted)):
                if old != new and operands[i][0] != "in":
                    raise Unfusible(f"{name}: operand {i} needs a view, and only inputs take one")
            shapes = list(adjusted)
        operands = [(k, x, s, d) for (k, x, _, d), s in zip(operands, shapes)]
        if any(s is None for s in shapes):
            shape = None
            if entry is not None and (entry.kind == catalog.REDUCE
                                      or entry.result_shape is not None):
                raise Unfusible(f"{name}: {node.op} of a tensor of unknown rank")
        elif entry is not None and entry.kind == catalog.REDUCE:
            try:
                axes, keep = entry.reduction(node, inputs, len(shapes[0]), view.const_value)
            except catalog.Unsupported as err:
                raise Unfusible(f"{name}: {err}") from None
            shape = catalog.reduced_shape(shapes[0], axes, keep)
        elif entry is not None and entry.result_shape is not None:
            try:
                shape = entry.result_shape(node, inputs, shapes, view.const_value)
            except catalog.Unsupported as err:
                raise Unfusible(f"{name}: {err}") from None
        else:
            try:
                shape = _broadcast(view, shapes)
            except catalog.Unsupported:
                raise Unfusible(f"{name}: {_not_broadcast(shapes)}") from None
        values[name] = shape
        plans.append((name, entry, ops, operands, axes, keep))

    state.next_symbol = next_symbol[0]
    memo[key] = state
    return state


@dataclasses.dataclass
class _Plan:
    """What build decides before it emits: passes 1 and 2, the iteration shape, outputs."""

    members: list
    member_set: set
    plans: list  # _FirstPass.plans
    values: dict  # member -> _Value
    symbols: dict  # outside tensor -> its shape with symbols (a copy of pass 1's)
    next_symbol: list
    unknown_rank: bool
    rank: int
    reduce_axes: Optional[tuple]
    outputs: list  # member names
    output_views: list
    iteration: Optional[tuple]  # the broadcast of the input views (None: unknown rank)


@_refusing_internal_errors
def build(
    view: GraphView,
    members: list,
    preserve: AbstractSet[str] = frozenset(),
    private: AbstractSet[str] = frozenset(),
    served: Optional[Mapping[str, AbstractSet[str]]] = None,
    absorbable: Optional[Callable[[str, AbstractSet[str]], bool]] = None,
    feeds: AbstractSet[str] = frozenset(),
) -> Lowered:
    """Lower `members` (topological order) into one program, or raise Unfusible.

    private: members computed here but owned by another group (recomputation): never outputs.
    served: member -> outside consumers that recompute it (they need no output of it).
    absorbable(view_node, members): may this view node's input be read with a view instead?
    feeds: nodes the caller feeds (a fed Const is an input, never an immediate).
    """
    return _emit(view, _plan(view, members, preserve, private, served or {}, feeds),
                 absorbable)


def _plan(view: GraphView, members: list, preserve: AbstractSet[str],
          private: AbstractSet[str], served: Mapping[str, AbstractSet[str]],
          feeds: AbstractSet[str]) -> _Plan:
    """build up to the emission: every refusal but those of the inputs and the program."""
    member_set = set(members)
    first = _first_pass(view, members, member_set, feeds)
    symbols = dict(first.symbols)
    next_symbol = [first.next_symbol]
    values = {name: _Value(shape) for name, shape in first.shapes.items()}
    plans = first.plans
    outside_tensors = first.outside
    unknown_rank = any(v.shape is None for v in values.values())
    if unknown_rank and len(outside_tensors) > 1:
        raise Unfusible("an input of unknown rank among several inputs")

    # --- pass 2: placements in the iteration space -----------------------------------------
    rank = 0
    if not unknown_rank:
        for _, _, _, operands, _, _ in plans:
            for k, _, s, _ in operands:
                if k != "imm" and len(s) > rank:
                    rank = len(s)
        for v in values.values():
            if len(v.shape) > rank:
                rank = len(v.shape)
    usages = []  # (tensor, shape as read, placement)
    reductions = []  # (name, axes, operand shape, operand placement)
    expanded = {name for name, entry, *_ in plans if entry is not None
                and entry.kind == catalog.EXPAND}
    for name, entry, ops, operands, axes, keep in plans:
        value = values[name]
        if unknown_rank:
            usages.extend((x, s, None) for k, x, s, _ in operands if k == "in")
            continue
        if entry is not None and entry.kind == catalog.REDUCE:
            kind, x, shape, _ = operands[0]
            if kind == "val" and x in expanded:
                raise Unfusible(f"{name} reduces {x}, a Tile the program does not compute (its "
                                "readers read its operand broadcast), not a full value")
            placement = tuple(range(len(shape)))
            if kind == "val":
                placement = values[x].placement
            elif len(shape) == rank:
                usages.append((x, shape, placement))
            reductions.append((name, axes, shape, placement, len(shape) == rank))
            if keep:
                value.placement = tuple(range(rank))
            else:
                value.placement = tuple(a for a in range(rank) if a not in axes)
            value.reduced = True
            continue
        if entry is not None and entry.kind == catalog.VIEW:
            x = operands[0][1]
            value.placement = _aliased_placement(name, values[x].shape, values[x].placement,
                                                 value.shape)
            value.reduced = values[x].reduced
            continue
        live = [(k, x, s) for k, x, s, _ in operands if k != "imm"]
        k_rank = max(len(s) for _, _, s in live)
        out_placement = None
        for kind, x, shape in live:
            if kind == "val" and len(shape) == k_rank:
                out_placement = values[x].placement
                break
        if out_placement is None:
            out_placement = tuple(range(rank - k_rank, rank))
        for kind, x, shape in live:
            offset = k_rank - len(shape)
            if kind == "in":
                usages.append((x, shape, out_placement[offset:]))
                continue
            for d, size in enumerate(shape):
                if size != 1 and values[x].placement[d] != out_placement[offset + d]:
                    raise Unfusible(
                        f"{name}: {x} (a keep_dims=false reduction) broadcasts in TF unlike "
                        f"its keep_dims form")
        value.placement = out_placement
        # the kernel's rule: reduced when every operand is reduced or 1 along the axes
        value.reduced = False

    # --- the iteration shape ------------------------------------------------------------------
    iteration = None
    if not unknown_rank:
        views = [_embed(s, p, rank) for _, s, p in usages]
        if not views:
            raise Unfusible("the group reads no tensor")
        try:
            iteration = _broadcast(view, views)
        except catalog.Unsupported:
            raise Unfusible(
                "inputs " + " and ".join(_fmt(v) for v in views) + " not known to broadcast"
            ) from None
        # the kernel iterates over the broadcast of what it reads: an alias whose leading ones
        # give the group more axes than any input is read with has no axes there to be stored
        read_ranks = [rank if tuple(p) != tuple(range(rank - len(s), rank)) else len(s)
                      for _, s, p in usages]
        if max(read_ranks) < rank:
            raise Unfusible(f"the group has {rank} axes, more than any input it reads: the "
                            "leading size-1 axes of a view of one of its values")
    reduce_axes = None
    for name, axes, shape, placement, full_rank in reductions:
        if reduce_axes is not None and axes != reduce_axes:
            raise Unfusible(f"{name} reduces axes {list(axes)}, another reduction "
                            f"{list(reduce_axes)}")
        reduce_axes = axes
        if not full_rank or tuple(shape) != iteration or placement != tuple(range(rank)):
            raise Unfusible(f"{name} reduces a value of shape {_fmt(shape)}, not the iteration "
                            f"shape {_fmt(iteration)}")
    reduced_shape = None
    if reduce_axes is not None:
        reduced_shape = catalog.reduced_shape(iteration, reduce_axes, True)

    def input_reduced(shape, placement) -> bool:
        view_ = _embed(shape, placement, rank)
        return all(view_[a] == 1 for a in reduce_axes)

    if reduce_axes is not None:
        for name, entry, ops, operands, axes, keep in plans:
            if entry is not None and entry.kind == catalog.REDUCE:
                continue
            placement = values[name].placement
            k_rank = len(values[name].shape)
            flags = []
            for kind, x, shape, _ in operands:
                if kind == "imm":
                    continue
                if kind == "val":
                    flags.append(values[x].reduced)
                else:
                    flags.append(input_reduced(shape, placement[k_rank - len(shape):]))
            values[name].reduced = all(flags)

    # --- outputs --------------------------------------------------------------------------
    outputs, output_views = [], []
    for name in members:
        if name in private:
            continue
        outside = [c for c, _, _ in view.data_consumers(name)
                   if c not in member_set and c not in served.get(name, ())]
        if not (outside or keeps_name(view, name, preserve)):
            continue
        value = values[name]
        out_view = None
        if not unknown_rank:
            expected = reduced_shape if value.reduced else iteration
            placed = _embed(value.shape, value.placement, rank)
            if placed != expected:
                wanted = f"the iteration shape {_fmt(iteration)}"
                if reduced_shape is not None:
                    wanted = f"neither {wanted} nor the reduced shape {_fmt(reduced_shape)}"
                hint = ("; a Tile's repeats give the program no size: its inputs' broadcast "
                        "does" if expanded else "")
                raise Unfusible(f"{name} would be an output of shape {_fmt(value.shape)}, "
                                f"{'not ' if reduced_shape is None else ''}{wanted}{hint}")
            if tuple(value.shape) != expected:
                out_view = _shown(value.shape)
                if sum(1 for d in out_view if d < 0) > 1:
                    raise Unfusible(f"{name}: its shape {_fmt(value.shape)} as an output view "
                                    "has more than one unknown size")
        outputs.append(name)
        output_views.append(out_view)
    if not outputs:
        raise Unfusible("nothing of the group is read outside it")

    return _Plan(members, member_set, plans, values, symbols, next_symbol, unknown_rank, rank,
                 reduce_axes, outputs, output_views, iteration)


def _input_view(view: GraphView, plan: _Plan, tensor: Tensor, shape, placement, dtype,
                absorbable) -> tuple:
    """How the program reads an outside tensor: (source tensor, its declared shape, the view
    or None, the view node read through or None), or Unfusible."""
    if dtype not in catalog.IR_DTYPES:
        raise Unfusible(f"input {tensor[0]} of dtype {catalog.dtype_name(dtype)}")
    symbols = plan.symbols
    if tensor not in symbols:
        symbols[tensor] = _symbolic(view.tensor_shape(tensor), plan.next_symbol)
    own = symbols[tensor]
    source, decl_shape, view_, through = tensor, own, None, None
    if not plan.unknown_rank:
        rank = plan.rank
        trailing = tuple(placement) == tuple(range(rank - len(shape), rank))
        if not trailing:
            view_ = _embed(shape, placement, rank)
        elif tuple(shape) != own:
            view_ = tuple(shape)
        producer = view.node(tensor[0])
        entry = catalog.tf_op(producer.op)
        if (absorbable is not None and entry is not None
                and entry.kind in (catalog.VIEW, catalog.EXPAND)
                and tensor[1] == 0 and absorbable(tensor[0], plan.member_set)):
            inner = view.data_inputs(tensor[0])[0]
            if entry.kind == catalog.VIEW:
                candidate = view_ if view_ is not None else tuple(shape)
                if sum(1 for d in candidate if d < 0) <= 1:
                    source, decl_shape, view_ = inner, view.tensor_shape(inner), candidate
                    through = tensor[0]
            else:
                read = _broadcast_read(view, producer, inner, shape, placement, rank)
                if read is not None and plan.reduce_axes is not None and all(
                        read[a] == 1 for a in plan.reduce_axes):
                    read = None  # it would be a reduced value (see _emit)
                if read is not None:
                    source, decl_shape, through = inner, view.tensor_shape(inner), tensor[0]
                    view_ = None if read == tuple(decl_shape) else read
        if view_ is not None and sum(1 for d in view_ if d < 0) > 1:
            raise Unfusible(f"input {tensor[0]} needs the view {_fmt(view_)}, which has "
                            "more than one unknown size")
    return source, decl_shape, view_, through


def _broadcast_read(view: GraphView, node, inner: Tensor, shape, placement, rank: int):
    """How a consumer that reads the output of an EXPAND node (a Tile of size-1 axes), of
    shape `shape` at `placement`, can read the node's operand instead, broadcast: the operand's
    shape at that placement. None unless the operand's shape is static and the node a broadcast
    of it to `shape`."""
    inner_shape = view.tensor_shape(inner)
    if inner_shape is None or len(inner_shape) != len(shape) or min(inner_shape, default=0) < 0:
        return None
    try:
        tiled = catalog.tf_op(node.op).result_shape(node, view.data_inputs(node.name),
                                                     [tuple(inner_shape)], view.const_value)
    except catalog.Unsupported:
        return None
    if tuple(tiled) != tuple(shape):
        return None
    return _embed(tuple(inner_shape), placement, rank)


def _strip_ones(shape: tuple) -> tuple:
    """`shape` without its leading size-1 axes."""
    lead = 0
    while lead < len(shape) and shape[lead] == 1:
        lead += 1
    return tuple(shape[lead:])


def aliased_shape(view: GraphView, name: str, operand: Optional[tuple]) -> tuple:
    """The shape of a view node fused as an alias of its operand's value, or Unfusible.

    A Reshape, Squeeze or ExpandDims that only adds or drops leading size-1 axes ([1,1,C] and
    [C], a Sum with keep_dims and the Reshape that undoes the broadcast in a gradient) changes
    nothing numpy broadcasting sees: broadcasting aligns trailing axes. Its readers in the
    group read the operand's value as it is; an output of it is stored with its own shape (an
    output view). The result: the node's leading ones, then the operand's other sizes (their
    symbols, so that unknown sizes stay tied to the operand's)."""
    out = view.tensor_shape((name, 0))
    node = view.node(name)
    if operand is None or out is None:
        raise Unfusible(f"{name}: a {node.op} of unknown rank")
    core, out_core = _strip_ones(operand), _strip_ones(tuple(out))
    if len(core) != len(out_core) or any(
            o != c and not (o < 0 and c < 0) for o, c in zip(out_core, core)):
        raise Unfusible(f"{name}: a {node.op} from {_fmt(operand)} to {_fmt(tuple(out))} does "
                        "more than add or drop leading size-1 axes")
    return (1,) * (len(out) - len(out_core)) + core


def _aliased_placement(name: str, operand: tuple, placement: tuple, shape: tuple) -> tuple:
    """The iteration axes of an alias's dimensions: its operand's for the sizes they share,
    the axes just before them for its leading ones."""
    core = len(_strip_ones(operand))
    kept = tuple(placement[len(placement) - core:]) if core else ()
    lead = len(shape) - core
    first = kept[0] if kept else (placement[-1] + 1 if placement else lead)
    if first < lead:
        raise Unfusible(f"{name}: its {lead} leading size-1 axes have no place before the "
                        "iteration axes of its operand")
    return tuple(range(first - lead, first)) + kept


def _operand_placement(plan: _Plan, name: str, entry):
    """(the member's placement, its rank) as its "in" operands are placed by."""
    if plan.unknown_rank:
        return None, 0
    if entry is not None and entry.kind == catalog.REDUCE:
        return tuple(range(plan.rank)), plan.rank
    value = plan.values[name]
    return value.placement, len(value.shape)


def _emit_node(em, name: str, node, entry, ops, args, axes):
    """The instructions of one member (em(op, operands, attrs) -> Ref); its result."""
    if entry is not None and entry.kind == catalog.VIEW:  # an alias: its operand's value
        return args[0]
    if entry is None:  # a composition: a chain of unary ops
        result = args[0]
        for op in ops:
            result = em(catalog.for_tf_op(op).ir_name, [result])
        return result
    try:
        return entry.emit(em, node, args, ir.axes_text(axes) if axes else None)
    except catalog.Unsupported as err:
        raise Unfusible(f"{name}: {err}") from None


def _iteration_kept(view: GraphView, plan: _Plan, reads) -> bool:
    """Do inputs read as `reads` give the plan's iteration shape?"""
    if plan.unknown_rank:
        return True
    try:
        return _broadcast(view, [(1,) * (plan.rank - len(r)) + tuple(r) for r in reads]) \
            == plan.iteration
    except catalog.Unsupported:
        return False


def _emit(view: GraphView, plan: _Plan, absorbable) -> Lowered:
    """The program of a plan, its inputs, outputs and dtypes; or Unfusible."""
    decls, instructions, op_types = [], [], []
    input_refs: dict = {}
    input_tensors, in_dtypes, absorbed = [], [], []
    reads = []  # the shape each input is read as
    refs: dict[str, ir.Ref] = {}
    # reads through view nodes and Tiles; views_only: not Tiles (the fallback when reading a
    # Tile's operand broadcast loses the iteration shape or makes no valid program). A program
    # with reductions reads a Tile's operand broadcast only when it is not 1 along every reduced
    # axis (_input_view): values computed from it alone would be reduced ones, of another shape
    # than the Tile's readers have in TF.
    views_only = None if absorbable is None else (
        lambda name, members: catalog.tf_op(view.node(name).op).kind != catalog.EXPAND
        and absorbable(name, members))
    reads_through = absorbable

    def input_ref(tensor: Tensor, shape, placement, dtype) -> ir.Ref:
        source, decl_shape, view_, through = _input_view(view, plan, tensor, shape, placement,
                                                         dtype, reads_through)
        if through is not None and through not in absorbed:
            absorbed.append(through)
        key = (source, None if view_ is None else tuple(view_))
        if key not in input_refs:
            input_refs[key] = ir.In(len(input_refs))
            decls.append(ir.InputDecl(catalog.IR_DTYPES[dtype], _shown(decl_shape),
                                      _shown(view_)))
            input_tensors.append(source)
            in_dtypes.append(dtype)
            reads.append(view_ if view_ is not None else decl_shape)
        return input_refs[key]

    def em(op: str, operands, attrs=()) -> ir.Ref:
        _refuse_immediates_only(op, operands)
        instructions.append(ir.Instruction(op, tuple(operands), tuple(attrs)))
        return ir.Val(len(instructions) - 1)

    for name, entry, ops, operands, axes, keep in plan.plans:
        placement, k_rank = _operand_placement(plan, name, entry)
        args = []
        for kind, x, shape, dtype in operands:
            if kind == "imm":
                args.append(x)
            elif kind == "val":
                args.append(refs[x])
            else:
                where = None if plan.unknown_rank else placement[k_rank - len(shape):]
                args.append(input_ref(x, shape, where, dtype))
        refs[name] = _emit_node(em, name, view.node(name), entry, ops, args, axes)
        op_types.extend(ops)
    if any(catalog.tf_op(view.node(n).op).kind == catalog.EXPAND for n in absorbed) \
            and not _iteration_kept(view, plan, reads):
        # read broadcast, a Tile's operand no longer gives the iteration its size: the program
        # reads the Tiles' outputs
        return _emit(view, plan, views_only)

    outputs = plan.outputs
    if not instructions and any(entry is not None and entry.kind == catalog.EXPAND
                                for _, entry, *_ in plan.plans):
        raise Unfusible("the group computes nothing: its Tiles are read broadcast, not computed")
    try:
        program = ir.FusedProgram(decls, instructions, [refs[n] for n in outputs],
                                  plan.output_views)
    except ValueError as err:
        if reads_through is not views_only and any(
                catalog.tf_op(view.node(n).op).kind == catalog.EXPAND for n in absorbed):
            return _emit(view, plan, views_only)
        raise Unfusible(f"the program is not valid: {err}") from None
    out_dtypes = tuple(ir.DTYPES[d] for d in program.output_dtypes())
    member_set = plan.member_set
    controls = sorted({c for name in plan.members for c in view.control_inputs(name)
                       if c not in member_set})
    kind = "reduce" if plan.reduce_axes is not None else "pointwise"
    return Lowered(program, tuple(input_tensors), tuple(outputs), tuple(controls),
                   tuple(op_types), tuple(in_dtypes), out_dtypes, tuple(absorbed), kind)


class Checked(NamedTuple):
    """What `check` tells of a group whose program it knows valid without emitting it: what
    the partitioner and the cost models read of a Lowered (build gives the same values)."""

    inputs: tuple  # of Tensor, in0, in1, ...
    outputs: tuple  # of member names
    in_dtypes: tuple
    out_dtypes: tuple
    kind: str = "pointwise"


@_refusing_internal_errors
def check(view: GraphView, members: list, preserve: AbstractSet[str] = frozenset(),
          feeds: AbstractSet[str] = frozenset()):
    """build(view, members, preserve, feeds=feeds) for the partitioner's trial merges: the
    same Unfusible, or the same inputs, outputs and dtypes.

    A program without reductions is checked member by member (_member_outcome: the same
    checks as the program's, memoised per member and operand dtypes), so nothing is emitted:
    a Checked. Anything else (a reduction, an input or a member that fails or may fail those
    checks) is build's own emission: a Lowered or its Unfusible, so every reason is build's.
    """
    plan = _plan(view, members, preserve, frozenset(), {}, feeds)
    if plan.reduce_axes is None:
        checked = _check_pointwise(view, plan)
        if checked is not None:
            return checked
    return _emit(view, plan, None)


def _check_pointwise(view: GraphView, plan: _Plan) -> Optional[Checked]:
    """What _emit would return of a plan without reductions, when it would return; None when
    it may raise (then _emit says what)."""
    input_keys: set = set()
    inputs, in_dtypes = [], []
    results: dict = {}  # member -> the kind ("in" or "%") and IR dtype of its result Ref
    n_instructions = 0
    for name, entry, ops, operands, axes, keep in plan.plans:
        placement, k_rank = _operand_placement(plan, name, entry)
        signature = []
        for kind, x, shape, dtype in operands:
            if kind == "imm":
                signature.append(("imm", type(x), repr(x)))
            elif kind == "val":
                signature.append(results[x])
            else:
                where = None if plan.unknown_rank else placement[k_rank - len(shape):]
                try:
                    source, _, view_, _ = _input_view(view, plan, x, shape, where, dtype, None)
                except Unfusible:
                    return None
                key = (source, None if view_ is None else tuple(view_))
                if key not in input_keys:
                    input_keys.add(key)
                    inputs.append(source)
                    in_dtypes.append(dtype)
                signature.append(("in", catalog.IR_DTYPES[dtype]))
        outcome = _member_outcome(view, name, entry, ops, operands, axes, tuple(signature))
        if outcome is None:
            return None
        n_instructions += outcome[0]
        results[name] = outcome[1:]
    if not inputs or not n_instructions:
        return None  # the program's own checks refuse it
    return Checked(tuple(inputs), tuple(plan.outputs), tuple(in_dtypes),
                   tuple(ir.DTYPES[results[name][1]] for name in plan.outputs))


def _member_outcome(view: GraphView, name: str, entry, ops, operands, axes, signature):
    """(instructions, result kind, result dtype) of a member whose operands are as `signature` says
    (("imm", type, repr), or the kind "in" / "%" and IR dtype of a Ref) in a program without
    reductions, if the program's checks pass every instruction it emits; else None. Once per
    graph, member and signature (view.memo)."""
    memo = view.memo.setdefault("lower.member_outcome", {})
    key = (name, signature)
    if key in memo:
        return memo[key]
    args, described = [], []
    for (kind, x, _, _), sig in zip(operands, signature):
        if kind == "imm":
            args.append(x)
        else:
            args.append(ir.Ref("arg", len(described)))
            described.append(ir.ref_operand(sig[1], sig[0], False))
    locals_: list = []  # dtype of each instruction's result, or None after a fault
    faulty = []

    def em(op: str, operands_, attrs=()) -> ir.Ref:
        _refuse_immediates_only(op, operands_)
        descriptions = []
        for operand in operands_:
            if isinstance(operand, ir.Ref) and operand.kind == "%" \
                    and locals_[operand.index] is None:
                # an operand already faulty: this instruction is not checked (its fault
                # would only restate that one, and the operand has no dtype to check)
                locals_.append(None)
                return ir.Ref("%", len(locals_) - 1)
            if not isinstance(operand, ir.Ref):
                descriptions.append(ir.immediate_operand(operand))
            elif operand.kind == "arg":
                descriptions.append(described[operand.index])
            else:  # the member's own instruction (reduced: never, without reductions)
                descriptions.append(ir.ref_operand(locals_[operand.index], "%", False))
        outcome = ir.instruction_outcome(op, tuple(attrs), tuple(descriptions), False)
        if isinstance(outcome, str):
            faulty.append(outcome)
            outcome = (None, False)
        locals_.append(outcome[0])
        return ir.Ref("%", len(locals_) - 1)

    try:
        result = _emit_node(em, name, view.node(name), entry, ops, args, axes)
    except Unfusible:
        result = None
    outcome = None
    if not faulty and isinstance(result, ir.Ref):
        if result.kind == "%":
            outcome = (len(locals_), "%", locals_[result.index])
        else:  # one of its operands, passed through
            outcome = (len(locals_), described[result.index][2], described[result.index][1])
    memo[key] = outcome
    return outcome


def _not_broadcast(shapes) -> str:
    return "shapes " + " and ".join(_fmt(s) for s in shapes) + " not known to broadcast"


def reads_view_node(view: GraphView, lowered: Lowered) -> bool:
    """Does the program read output 0 of a view node (Reshape, ...) or of a Tile, which `build`
    with an `absorbable` could read through instead?"""
    for name, index in lowered.inputs:
        entry = catalog.tf_op(view.node(name).op) if index == 0 else None
        if entry is not None and entry.kind in (catalog.VIEW, catalog.EXPAND):
            return True
    return False


def lower(view: GraphView, group, preserve: AbstractSet[str], **kwargs) -> Lowered:
    """The program of a partitioned group (see partition.Group)."""
    return build(view, group.members, preserve, **kwargs)
