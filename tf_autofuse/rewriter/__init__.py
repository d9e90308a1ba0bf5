"""The graph rewriter: GraphDef in, GraphDef with AutofuseKernel nodes out. Pure Python.

    graph.py      read-only view of the GraphDef
    catalog.py    the table of supported ops
    partition.py  which nodes fuse (policy, with a reason for every refusal)
    lower.py      a group -> its FusedProgram (program.py) and its inputs and outputs
    naming.py     autofuse_<kind>_<n>_<Op>_<Op>...
    splice.py     the new GraphDef
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping, Optional, Sequence

from tensorflow.core.framework import graph_pb2

from . import catalog
from .graph import GraphView, Shape, node_name
from .lower import keeps_name, lower
from .naming import NAME_KIND, Namer
from .partition import Refusal, find_groups
from .splice import FUSED_OP, Planned, splice

DEFAULT_MAX_FUSION_SIZE = 64

__all__ = ["Fusion", "Refusal", "Rewrite", "rewrite", "optimize", "FUSED_OP"]


@dataclasses.dataclass(frozen=True)
class Fusion:
    name: str  # the AutofuseKernel node
    kind: str  # "pointwise"
    nodes: tuple  # original node names, topological order
    op_types: tuple  # TF op types, in program order
    program: str  # the program text


@dataclasses.dataclass(frozen=True)
class Rewrite:
    graph_def: graph_pb2.GraphDef
    fusions: list  # of Fusion
    refusals: list  # of Refusal (node, reason)


def rewrite(
    graph_def: graph_pb2.GraphDef,
    preserve: Iterable[str] = (),
    flags=None,
    shapes: Optional[Mapping[str, Sequence[Shape]]] = None,
    feeds: Iterable[str] = (),
) -> Rewrite:
    """Fuse what can be fused. The input is never mutated; `.graph_def` is a new GraphDef.

    preserve: node names whose name and value must survive (fetches, feeds, control targets).
    flags: any object; its int attribute `max_fusion_size` caps compute ops per group.
    shapes: node name -> static shape of each output (tuple, -1 unknown size; None unknown rank).
    feeds: node names the caller feeds; they are never fused.
    """
    max_fusion_size = DEFAULT_MAX_FUSION_SIZE
    if flags is not None:
        max_fusion_size = int(getattr(flags, "max_fusion_size", DEFAULT_MAX_FUSION_SIZE))
    unchanged = graph_pb2.GraphDef()
    unchanged.CopyFrom(graph_def)
    candidates = catalog.candidate_op_types()
    if max_fusion_size <= 0 or not any(node.op in candidates for node in graph_def.node):
        return Rewrite(unchanged, [], [])

    view = GraphView(graph_def, shapes)
    groups, refusals = find_groups(view, feeds, max_fusion_size)
    if not groups:
        return Rewrite(unchanged, [], refusals)
    preserve = frozenset(node_name(p) for p in preserve)
    namer = Namer(node.name for node in graph_def.node)
    plans, fusions = [], []
    for group in groups:
        lowered = lower(view, group, preserve)
        kind = NAME_KIND[catalog.ELEMENTWISE]
        name = namer.name(kind, lowered.op_types)
        keep = frozenset(m for m in group.members if keeps_name(view, m, preserve))
        plans.append(
            Planned(name, tuple(group.members), group.dtype, group.device, lowered, keep)
        )
        fusions.append(
            Fusion(name, kind, tuple(group.members), lowered.op_types, lowered.program.print())
        )
    return Rewrite(splice(view, plans), fusions, refusals)


def optimize(
    graph_def: graph_pb2.GraphDef,
    preserve: Iterable[str] = (),
    flags=None,
    shapes: Optional[Mapping[str, Sequence[Shape]]] = None,
    feeds: Iterable[str] = (),
) -> graph_pb2.GraphDef:
    """`rewrite(...).graph_def`."""
    return rewrite(graph_def, preserve, flags, shapes, feeds).graph_def
