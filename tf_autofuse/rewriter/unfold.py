"""TensorFlow's own fused elementwise nodes, read as the ops they stand for.

With oneDNN on (TensorFlow's default on x86 CPUs that have AVX512-VNNI, AVX512-BF16 or AMX,
i.e. Intel Xeons since Cascade Lake), Grappler's remapper runs before this pass and replaces
`x * sigmoid(x)` by one `_MklSwish` node: the swish of every EfficientNet block, of a gated
unit, of `swish(x + bias)`, would then be a foreign op the partitioner cannot fuse with what
feeds it. `unfold_graph` gives the rewriter a copy of the graph in which each such node is the
ops it replaced again (the last one keeps the node's name, so its consumers are untouched), and
`refold_graph` puts the original node back wherever the rewrite fused none of those ops, so a
graph the pass leaves alone keeps TensorFlow's kernel. A group that would be only one such
node's parts is not fused at all (`alone`): it would trade one kernel for another.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional, Sequence

from tensorflow.core.framework import graph_pb2, node_def_pb2

SWISH_OP = "_MklSwish"  # x * sigmoid(x), oneDNN's eltwise swish
# the folded op types, and how many operators each stands for
OPERATORS = {SWISH_OP: 2}
FOLDED_OPS = frozenset(OPERATORS)
# an attr that names the kernel implementation of the fused op; wrong on the ops it stands for
_KERNEL_LABEL = "_kernel"


@dataclasses.dataclass(frozen=True)
class Unfolded:
    original: node_def_pb2.NodeDef
    parts: tuple  # the names of the nodes standing for it, the original's name last


def _part(original: node_def_pb2.NodeDef, name: str, op: str, inputs) -> node_def_pb2.NodeDef:
    node = node_def_pb2.NodeDef(name=name, op=op, device=original.device)
    node.input.extend(inputs)
    for key, value in original.attr.items():
        if key != _KERNEL_LABEL:
            node.attr[key].CopyFrom(value)
    return node


def _unique(name: str, taken: set) -> str:
    candidate, k = name, 1
    while candidate in taken:
        candidate, k = f"{name}_{k}", k + 1
    taken.add(candidate)
    return candidate


def unfold_graph(graph_def: graph_pb2.GraphDef, shapes: Optional[Mapping[str, Sequence]]):
    """(graph, shapes, [Unfolded]): the inputs themselves when no node needs unfolding, else
    copies in which each `_MklSwish` is a Sigmoid and a Mul. The inputs are never mutated."""
    if not any(node.op in FOLDED_OPS for node in graph_def.node):
        return graph_def, shapes, []
    taken = {node.name for node in graph_def.node}
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    new_shapes = dict(shapes) if shapes is not None else None
    unfolded, nodes = [], []
    for node in graph_def.node:
        if node.op != SWISH_OP or not node.input or node.input[0].startswith("^"):
            nodes.append(node)
            continue
        x, control = node.input[0], [t for t in node.input[1:] if t.startswith("^")]
        sigmoid = _part(node, _unique(f"{node.name}/Sigmoid", taken), "Sigmoid", [x, *control])
        mul = _part(node, node.name, "Mul", [x, sigmoid.name, *control])
        nodes.extend((sigmoid, mul))
        if new_shapes is not None and node.name in new_shapes:
            new_shapes[sigmoid.name] = new_shapes[node.name]
        unfolded.append(Unfolded(node, (sigmoid.name, mul.name)))
    out.node.extend(nodes)
    return out, new_shapes, unfolded


def original_names(names, unfolded: Sequence[Unfolded]) -> tuple:
    """Node names of the unfolded graph as the caller's graph names them: a part is named by
    the node it came from (once)."""
    if not unfolded:
        return tuple(names)
    owner = {part: record.original.name for record in unfolded for part in record.parts}
    return tuple(dict.fromkeys(owner.get(name, name) for name in names))


def alone(members, unfolded: Sequence[Unfolded]) -> Optional[Unfolded]:
    """The unfolded node whose parts are all of `members`, if any: fusing just those would
    replace one TensorFlow kernel by one of ours and save nothing, so the pass leaves it."""
    members = set(members)
    for record in unfolded:
        if members <= set(record.parts):
            return record
    return None


def refold_graph(graph_def: graph_pb2.GraphDef, unfolded: Sequence[Unfolded]) -> graph_pb2.GraphDef:
    """Put back (in place) each original node none of whose parts the rewrite fused."""
    if not unfolded:
        return graph_def
    index = {node.name: k for k, node in enumerate(graph_def.node)}
    drop = set()
    for record in unfolded:
        first, last = record.parts
        # a part that is still in the graph as the op it was created as was not fused
        # (a fused member that keeps its name becomes an Identity)
        if (first in index and last in index
                and graph_def.node[index[first]].op == "Sigmoid"
                and graph_def.node[index[last]].op == "Mul"):
            mul = graph_def.node[index[last]]
            # the splice may have rewired its input and control inputs: keep those
            inputs = [text for text in mul.input if text != first]
            mul.CopyFrom(record.original)
            del mul.input[:]
            mul.input.extend(inputs)
            drop.add(index[first])
    if drop:
        kept = [node for k, node in enumerate(graph_def.node) if k not in drop]
        del graph_def.node[:]
        graph_def.node.extend(kept)
    return graph_def
