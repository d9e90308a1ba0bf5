"""Which nodes fuse together. Policy only: the graph is not changed here.

A node is a candidate when the catalog supports its op for its dtype (a
`_UnaryOpsComposition` when it supports every op of `op_names`), it sits on a CPU, the caller
does not feed it, and a binary op's operands are known to have the same shape (or are one
tensor).

Groups grow greedily in topological order: each candidate starts a group of its own, then
takes in the group of each of its data producers, one at a time, unless the two differ in
dtype or device, the result would pass `max_fusion_size` compute ops, or contracting the
result into one node would close a cycle (a path that leaves the group and comes back to
it). Every "no" is recorded as (node, reason).
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, NamedTuple, Optional

from . import catalog
from .graph import GraphView, format_shape, known_equal, node_name


class Refusal(NamedTuple):
    node: str
    reason: str


@dataclasses.dataclass
class Group:
    members: list  # node names, in topological order
    dtype: int
    device: str
    size: int  # compute ops (a _UnaryOpsComposition counts len(op_names))


def compute_ops(view: GraphView, name: str) -> list[tuple[str, catalog.OpSpec]]:
    """The (TF op type, entry) chain a node computes; [] when the catalog lacks one of them."""
    node = view.node(name)
    if node.op == catalog.COMPOSITION_OP:
        op_types = _op_names(node)
    else:
        op_types = [node.op]
    specs = [catalog.for_tf_op(op) for op in op_types]
    if None in specs:
        return []
    return list(zip(op_types, specs))


def _op_names(node) -> list[str]:
    # Never index a proto map with a missing key: that would insert it into the input graph.
    if "op_names" not in node.attr:
        return []
    return [s.decode() for s in node.attr["op_names"].list.s]


def _refuse_candidate(view: GraphView, name: str, feeds: frozenset) -> Optional[str]:
    """Why the node cannot be fused at all, or None when it is a candidate."""
    node = view.node(name)
    if node.op == catalog.COMPOSITION_OP:
        names = _op_names(node)
        if not names:
            return "_UnaryOpsComposition without op_names"
        for op in names:
            spec = catalog.for_tf_op(op)
            if spec is None or spec.arity != 1 or spec.kind != catalog.ELEMENTWISE:
                return f"{op} in op_names is not a supported unary op"
        arity = 1
    else:
        arity = catalog.for_tf_op(node.op).arity
    dtype = view.dtype(name)
    if dtype is None:
        return "no dtype attr T"
    for op, spec in compute_ops(view, name):
        if dtype not in spec.dtypes:
            return f"dtype {catalog.dtype_name(dtype)} not supported by {op}"
    kind = view.device_type(name)
    if kind != "CPU":
        return f"device {kind}"
    if name in feeds:
        return "fed by the caller"
    if view.in_cycle(name):
        return "on a cycle of the graph"
    inputs = view.data_inputs(name)
    if len(inputs) != arity:
        return f"{node.op} expects {arity} data input(s), has {len(inputs)}"
    if arity == 2 and inputs[0] != inputs[1]:
        a, b = (view.tensor_shape(t) for t in inputs)
        if not known_equal(a, b):
            return f"shapes {format_shape(a)} and {format_shape(b)} not known equal"
    return None


def _cycle_through(view: GraphView, members: set) -> Optional[str]:
    """The first outside node of a path from the members back to them, or None.

    Only nodes placed before the last member can lie on such a path (edges go forward in
    the topological order), so the search stops there.
    """
    limit = max(view.position[m] for m in members)
    origin: dict[str, str] = {}
    stack = []
    for member in sorted(members, key=view.position.get):
        for succ in view.successors(member):
            if succ not in members and succ not in origin and view.position[succ] < limit:
                origin[succ] = succ
                stack.append(succ)
    while stack:
        node = stack.pop()
        for succ in view.successors(node):
            if succ in members:
                return origin[node]
            if succ not in origin and view.position[succ] < limit:
                origin[succ] = origin[node]
                stack.append(succ)
    return None


def find_groups(
    view: GraphView, feeds: Iterable[str] = (), max_fusion_size: int = 64
) -> tuple[list[Group], list[Refusal]]:
    """Groups of 2 compute ops or more, in topological order of their first member."""
    if max_fusion_size <= 0:
        return [], []
    feeds = frozenset(node_name(f) for f in feeds)
    refusals: list[Refusal] = []
    group_of: dict[str, Group] = {}
    candidate_types = catalog.candidate_op_types()
    for name in view.order:
        if view.node(name).op not in candidate_types:
            continue
        reason = _refuse_candidate(view, name, feeds)
        size = len(compute_ops(view, name))
        if reason is None and size > max_fusion_size:
            reason = f"group full (max_fusion_size={max_fusion_size})"
        if reason is not None:
            refusals.append(Refusal(name, reason))
            continue
        group = Group([name], view.dtype(name), view.device(name), size)
        group_of[name] = group
        for producer, _ in view.data_inputs(name):
            other = group_of.get(producer)
            if other is None or other is group:
                continue
            reason = _refuse_merge(view, group, other, producer, max_fusion_size)
            if reason is not None:
                refusals.append(Refusal(name, reason))
                continue
            group.members.extend(other.members)
            group.size += other.size
            for member in other.members:
                group_of[member] = group
    groups = []
    refused = {r.node for r in refusals}
    for group in dict((id(g), g) for g in group_of.values()).values():
        group.members.sort(key=view.position.get)
        if group.size >= 2:
            groups.append(group)
        elif group.members[0] not in refused:
            refusals.append(Refusal(group.members[0], "no fusible neighbour"))
    groups.sort(key=lambda g: view.position[g.members[0]])
    return groups, refusals


def _refuse_merge(view, group: Group, other: Group, producer: str, limit: int) -> Optional[str]:
    if other.dtype != group.dtype:
        return (
            f"dtype {catalog.dtype_name(group.dtype)} differs from "
            f"{catalog.dtype_name(other.dtype)} of {producer}'s group"
        )
    if other.device != group.device:
        return f"device {group.device!r} differs from {other.device!r} of {producer}'s group"
    if group.size + other.size > limit:
        return f"group full (max_fusion_size={limit})"
    through = _cycle_through(view, set(group.members) | set(other.members))
    if through is not None:
        return f"would create a cycle through {through}"
    return None
