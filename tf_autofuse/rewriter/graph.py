"""A read-only view of a GraphDef: names, edges, order, dtypes, devices, static shapes.

Topological order: Kahn's algorithm over data and control edges, ties broken by the node's
index in the GraphDef. Edges out of NextIteration nodes (the back edges of v1 while loops)
are left out, so a valid graph always orders fully; nodes still left (a malformed cycle) are
appended in index order and reported by `in_cycle`.

Shapes (tuple of ints, -1 an unknown size, <= -2 a symbolic size from the caller's shape
inference; None an unknown rank) merge, in this order of trust: shapes handed in by the
caller, `_output_shapes` attrs, the Placeholder `shape` and Const tensor shapes, then
propagation through the catalog's ops (catalog.output_shape: elementwise, numpy broadcast,
reductions and view ops with Const axes / shapes) and a few same-shape ops (Identity, Cast).
"""

from __future__ import annotations

import functools
import heapq
from typing import AbstractSet, Mapping, Optional, Sequence

from tensorflow.core.framework import graph_pb2, node_def_pb2, tensor_shape_pb2

from . import catalog
from .naming import FUSED_OPS

Shape = Optional[tuple]  # None: unknown rank
Tensor = tuple  # (node name, output index)

_BACK_EDGE_OPS = frozenset({"NextIteration", "RefNextIteration"})
_DTYPE_ATTR_OPS = frozenset({"Placeholder", "PlaceholderWithDefault", "Const", "VariableV2"})
# Not fusible, but their output has their input's shape: shapes propagate through them.
_SAME_SHAPE_OPS = frozenset(
    {"Identity", "Snapshot", "StopGradient", "PreventGradient", "CheckNumerics", "Cast"}
)


def parse_input(text: str) -> tuple[str, int, bool]:
    """'^a' -> ('a', -1, True); 'a:1' -> ('a', 1, False); 'a' -> ('a', 0, False)."""
    if text.startswith("^"):
        return text[1:], -1, True
    name, sep, index = text.rpartition(":")
    if sep and index.isdigit():
        return name, int(index), False
    return text, 0, False


def tensor_name(tensor: Tensor) -> str:
    """The input string for a tensor: 'a' for output 0, 'a:1' otherwise."""
    name, index = tensor
    return name if index == 0 else f"{name}:{index}"


def node_name(text: str) -> str:
    """The node a name refers to: strips a leading '^' and an output suffix ':k'."""
    return parse_input(text)[0]


@functools.lru_cache(maxsize=256)  # a graph names a handful of devices, on every node
def device_type(device: str) -> str:
    """'/job:a/replica:0/task:0/device:GPU:1' -> 'GPU'; '/cpu:0' -> 'CPU'; '' -> 'CPU'."""
    for part in device.split("/"):
        if part.startswith("device:"):
            kind = part[len("device:") :].split(":")[0]
        elif part.lower().startswith(("cpu:", "gpu:")):
            kind = part.split(":")[0].upper()  # the legacy '/cpu:0' form
        else:
            continue
        if kind and kind != "*":
            return kind
    return "CPU"


def shape_from_proto(proto: tensor_shape_pb2.TensorShapeProto) -> Shape:
    if proto.unknown_rank:
        return None
    return tuple(int(d.size) if d.size >= 0 else -1 for d in proto.dim)


def merge_shapes(first: Shape, second: Shape) -> Shape:
    """What both tell: a size beats a symbolic size, which beats -1; `first` wins ties."""
    if first is None:
        return second
    if second is None or len(second) != len(first) or first == second:
        return first
    return tuple(_merge_dim(a, b) for a, b in zip(first, second))


def _merge_dim(a: int, b: int) -> int:
    if a >= 0 or (a <= -2 and b < 0):
        return a
    return b


def known_equal(a: Shape, b: Shape) -> bool:
    """Statically equal: same rank, each size known and equal, or the same symbolic size.

    Sizes <= -2 are symbolic (the caller's shape inference gives equal ids to sizes it proved
    equal); -1 is unknown and equals nothing.
    """
    return a is not None and a == b and all(d != -1 for d in a)


def format_shape(shape: Shape) -> str:
    """For messages: [?,3], [*] for unknown rank, [] for a scalar."""
    if shape is None:
        return "[*]"
    return "[" + ",".join("?" if d < 0 else str(d) for d in shape) + "]"


class GraphView:
    """Read-only: never mutates the GraphDef it is given."""

    def __init__(
        self,
        graph_def: graph_pb2.GraphDef,
        shapes: Optional[Mapping[str, Sequence[Shape]]] = None,
    ):
        self.graph_def = graph_def
        self.nodes: list[node_def_pb2.NodeDef] = list(graph_def.node)
        # Each proto field read makes a new Python object: names and ops are read once here.
        names = [node.name for node in self.nodes]
        self._ops = [node.op for node in self.nodes]
        self._by_name = dict(zip(names, self.nodes))
        self._index = {name: i for i, name in enumerate(names)}
        self._data_inputs: dict[str, list[Tensor]] = {}
        self._control_inputs: dict[str, list[str]] = {}
        self._data_consumers: dict[str, list[tuple[str, int, int]]] = {n: [] for n in names}
        self._control_consumers: dict[str, list[str]] = {n: [] for n in names}
        data_consumers, control_consumers = self._data_consumers, self._control_consumers
        for node_name, node in zip(names, self.nodes):
            data, control = [], []
            for position, text in enumerate(node.input):
                name, index, is_control = parse_input(text)
                if is_control:
                    control.append(name)
                    control_consumers.setdefault(name, []).append(node_name)
                else:
                    data.append((name, index))
                    data_consumers.setdefault(name, []).append((node_name, position, index))
            self._data_inputs[node_name] = data
            self._control_inputs[node_name] = control
        self._names = names
        self._consts: dict = {}
        self._successors = self._forward_successors()
        self.order, self._cyclic = self._topological_order()
        self.position = {name: i for i, name in enumerate(self.order)}
        self._shapes = self._static_shapes(shapes or {})
        # Derived facts other modules compute once per graph (lower.py's per-node lowering
        # facts): the partitioner lowers each node once per trial merge that includes it.
        self.memo: dict = {}

    # --- names and edges -------------------------------------------------------------------

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def node(self, name: str) -> node_def_pb2.NodeDef:
        return self._by_name[name]

    def index(self, name: str) -> int:
        """The node's position in the GraphDef."""
        return self._index[name]

    def data_inputs(self, name: str) -> list[Tensor]:
        return self._data_inputs[name]

    def control_inputs(self, name: str) -> list[str]:
        return self._control_inputs[name]

    def data_consumers(self, name: str) -> list[tuple[str, int, int]]:
        """(consumer, input position, output index read) for each data edge out of `name`."""
        return self._data_consumers.get(name, [])

    def control_consumers(self, name: str) -> list[str]:
        return self._control_consumers.get(name, [])

    def same_value(self, tensor: Tensor, feeds: AbstractSet[str] = frozenset()) -> Tensor:
        """A tensor that holds the same value as `tensor` in every step, read in its stead: the
        first (in topological order) of the ReadVariableOps that read the same resource with
        the same control inputs, dtype and device, none of them fed. Such reads depend on the
        same nodes, so reading one for the other adds no edge a cycle could close; with any
        write to the resource they are equally unordered against it, so one value for both is
        a schedule TensorFlow may run. Any other tensor: itself."""
        name, index = tensor
        if index != 0 or name in feeds or self._ops[self._index[name]] != "ReadVariableOp":
            return tensor
        key = ("graph.first_reads", frozenset(feeds))
        first = self.memo.get(key)
        if first is None:
            first = {}
            for read in self.order:
                if self._ops[self._index[read]] == "ReadVariableOp" and read not in feeds:
                    first.setdefault(self._read_key(read), read)
            self.memo[key] = first
        return (first.get(self._read_key(name), name), 0)

    def _read_key(self, name: str) -> tuple:
        node = self._by_name[name]
        dtype = node.attr["dtype"].type if "dtype" in node.attr else None
        return (tuple(self._data_inputs[name]), frozenset(self._control_inputs[name]), dtype,
                node.device)

    def successors(self, name: str) -> Sequence[str]:
        """Nodes reached by one forward edge (data or control), back edges left out."""
        return self._successors[name]

    def _forward_successors(self) -> dict[str, tuple]:
        result = {}
        for name, op in zip(self._names, self._ops):
            if op in _BACK_EDGE_OPS:
                result[name] = ()
                continue
            seen = dict.fromkeys(c for c, _, _ in self._data_consumers[name])
            seen.update(dict.fromkeys(self._control_consumers[name]))
            result[name] = tuple(seen)
        return result

    def in_cycle(self, name: str) -> bool:
        """True for nodes of a cycle that is not a while loop's (a malformed graph)."""
        return name in self._cyclic

    def _topological_order(self) -> tuple[list[str], frozenset]:
        # producers that count: in the graph and not a back edge (read each op once)
        names = self._names
        forward = {name for name, op in zip(names, self._ops) if op not in _BACK_EDGE_OPS}
        pending = {}
        for name in names:
            producers = {n for n, _ in self._data_inputs[name]}
            producers.update(self._control_inputs[name])
            pending[name] = sum(1 for p in producers if p in forward)
        ready = [self._index[name] for name, count in pending.items() if count == 0]
        heapq.heapify(ready)
        order = []
        successors, index = self._successors, self._index
        while ready:
            name = names[heapq.heappop(ready)]
            order.append(name)
            for consumer in successors[name]:
                pending[consumer] -= 1
                if pending[consumer] == 0:
                    heapq.heappush(ready, index[consumer])
        placed = set(order)
        left = [name for name in names if name not in placed]
        return order + left, frozenset(left)

    # --- dtypes and devices ----------------------------------------------------------------

    def output_dtype(self, name: str, index: int = 0) -> Optional[int]:
        """The DataType of output `index`, where the node's attrs tell it; else None."""
        node = self.node(name)
        attrs = node.attr
        if "_output_types" in attrs and index < len(attrs["_output_types"].list.type):
            return attrs["_output_types"].list.type[index]
        if node.op in FUSED_OPS and "Tout" in attrs and index < len(attrs["Tout"].list.type):
            return attrs["Tout"].list.type[index]
        if index != 0:
            return None
        if node.op in _DTYPE_ATTR_OPS and "dtype" in attrs:
            return attrs["dtype"].type
        if node.op == "Cast" and "DstT" in attrs:
            return attrs["DstT"].type
        entry = catalog.tf_op(node.op)
        if entry is not None:
            return entry.output_dtype(node)
        if (node.op in _SAME_SHAPE_OPS or node.op == catalog.COMPOSITION_OP) and "T" in attrs:
            return attrs["T"].type
        return None

    def const_value(self, tensor: Tensor):
        """The numpy value of a Const node's output, or None."""
        name, index = tensor
        if index != 0 or name not in self._by_name:
            return None
        node = self.node(name)
        if node.op != "Const" or "value" not in node.attr:
            return None
        if name not in self._consts:
            try:
                from tensorflow.python.framework import tensor_util

                self._consts[name] = tensor_util.MakeNdarray(node.attr["value"].tensor)
            except Exception:  # noqa: BLE001 - a Const we cannot read is just not a constant
                self._consts[name] = None
        return self._consts[name]

    def dtype(self, name: str) -> Optional[int]:
        """The node's `T` attr (the compute type of an elementwise op), or None."""
        attrs = self.node(name).attr
        return attrs["T"].type if "T" in attrs else None

    def device(self, name: str) -> str:
        return self.node(name).device

    def device_type(self, name: str) -> str:
        return device_type(self.node(name).device)

    # --- shapes -----------------------------------------------------------------------------

    def output_shape(self, name: str, index: int = 0) -> Shape:
        shapes = self._shapes.get(name, ())
        return shapes[index] if index < len(shapes) else None

    def tensor_shape(self, tensor: Tensor) -> Shape:
        return self.output_shape(*tensor) if tensor[0] in self._by_name else None

    def _recorded_shapes(self) -> dict[str, list[Shape]]:
        """The `_output_shapes` attr of each node that has one, read once per graph (each
        proto field read makes new Python objects)."""
        key = "_output_shapes"
        return {name: [shape_from_proto(p) for p in node.attr[key].list.shape]
                for name, node in zip(self._names, self.nodes) if key in node.attr}

    def _static_shapes(self, given: Mapping[str, Sequence[Shape]]) -> dict[str, list[Shape]]:
        recorded = self._recorded_shapes()
        given = self._resolve_symbols(given, recorded)
        shapes: dict[str, list[Shape]] = {}
        for name in self.order:
            i = self._index[name]
            node, op = self.nodes[i], self._ops[i]
            known = [tuple(s) if s is not None else None for s in given.get(name, ())]
            if name in recorded:
                known = _merge_lists(known, recorded[name])
            # Own and propagated shapes are of output 0, and merge_shapes keeps a first
            # shape whose sizes are all known: then neither can change anything.
            if not (known and catalog.fully_known(known[0])):
                # merging None changes nothing but a trailing None, which is dropped below
                own = self._own_shape(node, op)
                if own is not None:
                    known = _merge_lists(known, [own])
                propagated = self._propagated_shape(node, op, shapes)
                if propagated is not None:
                    known = _merge_lists(known, [propagated])
            while known and known[-1] is None:
                known.pop()
            shapes[name] = known
        return shapes

    def _resolve_symbols(self, given: Mapping[str, Sequence[Shape]],
                         recorded: Mapping[str, list[Shape]]) -> dict:
        """The caller's symbolic sizes (<= -2) that a node's own shape (`_output_shapes`, a
        Placeholder's shape, a Const) knows, replaced by that size everywhere: Grappler gives
        one symbol to sizes it proved equal, so one known occurrence tells them all."""
        table: dict[int, int] = {}
        for name, outputs in given.items():
            if name not in self._by_name:
                continue
            others = recorded.get(name)
            if not others:
                node = self.node(name)
                others = [self._own_shape(node, node.op)]
            for mine, other in zip(outputs, others):
                if mine is None or other is None or len(mine) != len(other):
                    continue
                for a, b in zip(mine, other):
                    if a <= -2 and b >= 0:
                        table.setdefault(a, b)
        if not table:
            return dict(given)
        return {name: [None if s is None else tuple(table.get(d, d) for d in s)
                       for s in outputs] for name, outputs in given.items()}

    @staticmethod
    def _own_shape(node: node_def_pb2.NodeDef, op: str) -> Shape:
        # `op` is node.op, read once by the caller (each proto field read makes a new object)
        if op in ("Placeholder", "PlaceholderWithDefault") and "shape" in node.attr:
            return shape_from_proto(node.attr["shape"].shape)
        if op == "Const" and "value" in node.attr:
            return shape_from_proto(node.attr["value"].tensor.tensor_shape)
        return None

    def _propagated_shape(self, node: node_def_pb2.NodeDef, op: str, shapes) -> Shape:
        if not _may_propagate(op):
            return None
        inputs = [
            shapes.get(n, ())[i] if i < len(shapes.get(n, ())) else None
            for n, i in self._data_inputs[node.name]
        ]
        if op in _SAME_SHAPE_OPS and len(inputs) == 1:
            return inputs[0]
        if catalog.tf_op(op) is None and op != catalog.COMPOSITION_OP:
            return None
        return catalog.output_shape(node, self._data_inputs[node.name], inputs,
                                    self.const_value)


@functools.lru_cache(maxsize=None)  # per op type: a graph has a few dozen
def _may_propagate(op: str) -> bool:
    """Can _propagated_shape know the output shape of an `op` node from its inputs?"""
    return op in _SAME_SHAPE_OPS or catalog.tf_op(op) is not None or op == catalog.COMPOSITION_OP


def _merge_lists(first: list[Shape], second: list[Shape]) -> list[Shape]:
    length = max(len(first), len(second))
    first = list(first) + [None] * (length - len(first))
    second = list(second) + [None] * (length - len(second))
    return [merge_shapes(a, b) for a, b in zip(first, second)]

