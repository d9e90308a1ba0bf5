"""Which nodes fuse together. Policy only: the graph is not changed here.

A node is a candidate when the catalog supports its op for its dtype (a
`_UnaryOpsComposition` when it supports every op of `op_names`), the pass of its kind is on
(reductions need `--autofuse_enable_pass=reduce`), it sits on a CPU, the caller does not feed
it, and it is not inside `disable_autofuse()` nor listed in `--skip_node_names_cfg`. Whether it
lowers to a valid program (lower.check: shapes that provably broadcast, Const axes, ...) is
checked for every merge (the union is lowered), and on its own only for a node left alone or
when a cost model weighs a merge: a node that does not lower alone (x - max(x) of an input of
unknown batch size: the max, read from outside, has sizes of its own) may lower with its
producer in the group, and only a group that lowers is fused.

Groups grow greedily in topological order: each candidate starts a group of its own, then
takes in the group of each of its data producers, one at a time, unless the two differ in
device, the result would pass `max_fusion_size` compute ops or `max_inputs` inputs, contracting
the result into one node would close a cycle (a path that leaves the group and comes back to
it), or the union does not lower (lower.check says why). Every "no" is recorded as
(node, reason). A merge refused for a cycle is tried again once the greedy pass is done, whole
group with whole group (and with the group of the node the cycle went through), until no such
merge succeeds: the node on the path may have joined one side since.

With `recomputation_threshold` N > 0, a group that reads a value another group computes takes
a private copy of the nodes computing it (at most N compute ops) instead (`plan_recomputation`).

With a cost model (`Policy.cost_model`, cost.py) each merge and each recomputation that passes
the limits is also put to the model, which may decline it with a reason. Nodes in
`Policy.excluded` (claimed or forbidden by a user pattern, patterns.py) are never candidates.
"""

from __future__ import annotations

import dataclasses
from typing import AbstractSet, Iterable, NamedTuple, Optional

from . import catalog, cost, errors, scope
from .graph import GraphView, node_name
from .lower import Lowered, Unfusible, build, check, compute_ops, waits_on_members


class Refusal(NamedTuple):
    node: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Policy:
    """What the partitioner may do with one graph. The defaults here are the defaults of the
    flags (flags.py) and of the API (fuser.FuserConfig), which read them from this class."""

    max_fusion_size: int = 64
    max_inputs: int = 8
    pointwise: bool = True
    reduce: bool = False
    epilogue: bool = True  # convolutions' and MatMuls' epilogues into TF's fused kernels
    epilogue_scale: bool = True  # ... with a per-channel scale (folded into the filter)
    assign: bool = True  # variable writes of fused outputs carried out by their kernel
    recomputation_threshold: int = 0
    skip_names: frozenset = frozenset()
    skip_types: frozenset = frozenset()
    preserve: frozenset = frozenset()
    feeds: frozenset = frozenset()
    cost_model: str = cost.NONE  # "none" or one of cost.MODELS
    auto: bool = True  # the automatic partitioner runs (False: only user patterns fuse)
    excluded: tuple = ()  # (node, reason) pairs kept out of the partitioner; reason "" is silent


@dataclasses.dataclass
class Group:
    members: list  # node names, in topological order
    dtype: int  # the compute dtype of the first member (for information)
    device: str
    size: int  # compute ops (a _UnaryOpsComposition counts len(op_names))
    # the members' lowering (no absorption): a Lowered, or lower.check's Checked (inputs,
    # outputs, dtypes) until `lowering` builds the program
    lowered: Optional[Lowered] = None
    private: list = dataclasses.field(default_factory=list)  # recomputed copies


def _refuse_candidate(view: GraphView, name: str, feeds: frozenset,
                      policy: Policy) -> Optional[str]:
    """Why the node cannot be fused at all, or None when it is a candidate."""
    node = view.node(name)
    if scope.disabled(node):
        return "inside tf_autofuse.disable_autofuse()"
    if name in policy.skip_names:
        return "listed in --skip_node_names_cfg [ByNodeName]"
    if node.op in policy.skip_types:
        return "listed in --skip_node_names_cfg [ByNodeType]"
    if node.op == catalog.COMPOSITION_OP:
        if "op_names" not in node.attr:
            return "_UnaryOpsComposition without op_names"
        for op in [s.decode() for s in node.attr["op_names"].list.s]:
            spec = catalog.for_tf_op(op)
            if spec is None or spec.arity != 1 or spec.kind != catalog.ELEMENTWISE or \
                    spec.result != "same" or spec.attrs:
                return f"{op} in op_names is not a supported unary op"
            if spec.cpu_refusal is not None:
                return catalog.cpu_refusal_reason(spec)
        if not node.attr["op_names"].list.s:
            return "_UnaryOpsComposition without op_names"
        entry, n_inputs = None, 1
        dtype = view.dtype(name)
        if dtype is None:
            return "no dtype attr T"
    else:
        entry = catalog.tf_op(node.op)
        if entry.kind == catalog.REDUCE and not policy.reduce:
            return "the reduce pass is off (--autofuse_enable_pass=reduce turns it on)"
        dtype = entry.compute_dtype(node)
        if dtype is None:
            return f"no dtype attr {entry.dtype_attr}"
        if dtype not in entry.dtypes:
            return f"dtype {catalog.dtype_name(dtype)} not supported by {node.op}"
        if entry.check is not None:
            reason = entry.check(node)
            if reason is not None:
                return reason
        n_inputs = entry.n_inputs()
    for op in compute_ops(view, name) if entry is None else ():
        if dtype not in catalog.for_tf_op(op).dtypes:
            return f"dtype {catalog.dtype_name(dtype)} not supported by {op}"
    kind = view.device_type(name)
    if kind != "CPU":
        return f"device {kind}"
    if name in feeds:
        return "fed by the caller"
    if view.in_cycle(name):
        return "on a cycle of the graph"
    inputs = view.data_inputs(name)
    if n_inputs is not None and len(inputs) != n_inputs:
        what = "inputs" if entry is not None and entry.n_static else "data input(s)"
        return f"{node.op} expects {n_inputs} {what}, has {len(inputs)}"
    if n_inputs is None and not inputs:
        return f"{node.op} without inputs"
    return None


def _through_view(view: GraphView, name: str, feeds: frozenset, policy: Policy,
                  group_of: dict) -> tuple:
    """(the group, `name`) when `name` is a Reshape, Squeeze or ExpandDims of output 0 of a
    group's member that may join it as an alias (lower.aliased_shape says whether the shapes
    allow it); else (None, None). A view that is not fused stays what it was: read through
    as an input view, or a kernel of its own. No refusal is recorded for it."""
    node = view.node(name)
    entry = catalog.tf_op(node.op)
    if entry is None or entry.kind != catalog.VIEW or name in group_of:
        return None, None
    inputs = view.data_inputs(name)
    if not inputs or inputs[0][1] != 0 or inputs[0][0] not in group_of:
        return None, None
    if (scope.disabled(node) or name in policy.skip_names or node.op in policy.skip_types
            or view.device_type(name) != "CPU" or name in feeds or view.in_cycle(name)):
        return None, None
    return group_of[inputs[0][0]], name


def _cycle_through(view: GraphView, members: set, inlined: Optional[set] = None) -> Optional[str]:
    """The first outside node of a path from the members back to them, or None.

    Only nodes placed before the last member can lie on such a path (edges go forward in
    the topological order), so the search stops there. With `inlined` (a set to fill), a Const
    that waits on members only (lower.waits_on_members) closes no path through its edges into
    the members, which read it as an immediate: such Consts are added to `inlined`, and the
    caller checks that the lowered group did not make any of them an input.
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
                if inlined is not None and view.node(node).op == "Const" \
                        and waits_on_members(view, node, members):
                    inlined.add(node)
                    continue
                return origin[node]
            if succ not in origin and view.position[succ] < limit:
                origin[succ] = origin[node]
                stack.append(succ)
    return None


def _merge(view: GraphView, group: Group, other: Group, lowered, group_of: dict) -> None:
    """`other`'s members join `group` (whose program is now `lowered`)."""
    group.members = sorted(group.members + other.members, key=view.position.get)
    group.size += other.size
    group.lowered = lowered
    for member in other.members:
        group_of[member] = group


def find_groups(
    view: GraphView, feeds: Iterable[str] = (), max_fusion_size: Optional[int] = None,
    policy: Optional[Policy] = None,
) -> tuple[list[Group], list[Refusal]]:
    """Groups of 2 compute ops or more, in topological order of their first member; each
    group's `lowered` may be lower.check's Checked (`lowering` gives the program).
    `max_fusion_size` (without a policy): the default Policy with that limit."""
    if policy is None:
        policy = Policy() if max_fusion_size is None else Policy(max_fusion_size=max_fusion_size)
    if policy.max_fusion_size <= 0 or not policy.pointwise:
        return [], []
    feeds = frozenset(node_name(f) for f in feeds) | policy.feeds
    policy = dataclasses.replace(policy, feeds=feeds)
    refusals: list[Refusal] = []
    merge_refusals: list[tuple] = []  # (index in refusals, producer)
    group_of: dict[str, Group] = {}
    # Nodes that do not lower on their own for their operands: one read from outside has sizes
    # the rewriter cannot tie to the other operand's (x - max(x) of a [?,C] input: two unknown
    # sizes), or they are more inputs than max_input_nums_after_fuse. With the producer in the
    # same group the sizes are one symbol and the inputs fewer, so such a node stays a
    # candidate and fuses if a merge lowers; alone, this is its refusal.
    alone: dict[str, str] = {}

    def lower_alone(group: Group) -> Optional[Lowered]:
        """A one-member group's own program (cached), None when it does not lower alone."""
        name = group.members[0]
        if group.lowered is None and len(group.members) == 1 and name not in alone:
            try:
                group.lowered = check(view, [name], policy.preserve, feeds=policy.feeds)
            except Unfusible as err:
                alone[name] = str(err)
                if alone[name].startswith(f"{name}: "):
                    alone[name] = alone[name][len(name) + 2:]
            if group.lowered is not None and len(group.lowered.inputs) > policy.max_inputs:
                # with a producer in the group, its inputs may be fewer: x + f(x) reads x once
                alone[name] = _too_many(len(group.lowered.inputs), policy)
                group.lowered = None
        return group.lowered

    candidate_types = catalog.candidate_op_types()
    excluded = dict(policy.excluded)
    for name in view.order:
        if view.node(name).op not in candidate_types:
            continue
        errors.at(name)
        if name in excluded:
            if excluded[name]:
                refusals.append(Refusal(name, excluded[name]))
            continue
        reason = _refuse_candidate(view, name, feeds, policy)
        size = len(compute_ops(view, name))
        if reason is None and size > policy.max_fusion_size:
            reason = f"group full (max_fusion_size={policy.max_fusion_size})"
        if reason is not None:
            refusals.append(Refusal(name, reason))
            continue
        node = view.node(name)
        entry = catalog.tf_op(node.op)
        dtype = entry.compute_dtype(node) if entry is not None else view.dtype(name)
        # Lowered on its own only when needed (a cost model's estimate, or a node that stays
        # alone): most candidates join a group, and a merge lowers the union anyway.
        group = Group([name], dtype, view.device(name), size, None)
        group_of[name] = group
        for producer, _ in view.data_inputs(name):
            other = group_of.get(producer)
            alias = None
            if other is None:  # a view between this node and a group: fused as an alias?
                other, alias = _through_view(view, producer, feeds, policy, group_of)
            if other is None or other is group:
                continue
            if alias is not None:
                other = dataclasses.replace(other, members=other.members + [alias], lowered=None)
            reason, lowered = _refuse_merge(view, group, other, producer, policy, lower_alone)
            if reason is not None and alias is not None:
                continue  # the view is read through as before: nothing was refused
            if reason is not None:
                merge_refusals.append((len(refusals), producer))
                refusals.append(Refusal(name, reason))
                continue
            _merge(view, group, other, lowered, group_of)
    # A merge refused because it closed a cycle through a node outside both groups may be
    # cycle-free once that node has joined one of them, or together with that node's group
    # (BatchNorm's backward: the gradients of the mean and of the variance come back into dx
    # through a Tile of a reduced value, which can join neither side alone). Such merges are
    # tried again, whole groups, in the order they were refused, until none succeeds.
    retried = True
    while retried:
        retried = False
        for i, producer in merge_refusals:
            name = refusals[i].node
            group, other = group_of.get(name), group_of.get(producer)
            if group is None or other is None or group is other:
                continue
            through = _cycle_through(view, set(group.members) | set(other.members))
            if through is None and not refusals[i].reason.startswith("would create a cycle"):
                continue  # refused for another reason, which still holds
            joining = [other]
            third = group_of.get(through) if through is not None else None
            if third is not None and third is not group and third is not other:
                joining.append(third)
            union = dataclasses.replace(
                other, members=[m for g in joining for m in g.members],
                size=sum(g.size for g in joining), lowered=None)
            reason, lowered = _refuse_merge(view, group, union, producer, policy, lower_alone)
            if reason is None:
                for joined in joining:
                    _merge(view, group, joined, lowered, group_of)
                retried = True
    # a merge refused early may have happened later through another path: not a refusal
    settled = {i for i, producer in merge_refusals
               if group_of.get(producer) is not None
               and group_of.get(producer) is group_of.get(refusals[i].node)}
    refusals = [r for i, r in enumerate(refusals) if i not in settled]
    groups = []
    refused = {r.node for r in refusals}
    for group in dict((id(g), g) for g in group_of.values()).values():
        group.members.sort(key=view.position.get)
        lower_alone(group)
        if group.size >= 2 and group.lowered is not None:
            groups.append(group)
        elif len(group.members) == 1 and group.members[0] in alone:
            refusals.append(Refusal(group.members[0], alone[group.members[0]]))
        elif group.members[0] not in refused:
            refusals.append(Refusal(group.members[0], "no fusible neighbour"))
    groups.sort(key=lambda g: view.position[g.members[0]])
    return groups, refusals


def lowering(view: GraphView, group: Group, policy: Policy) -> Lowered:
    """The group's program without absorption: group.lowered, built first when it is lower.
    check's Checked (most groups of a model are lowered with absorption instead, so
    find_groups does not build it). `policy`: the one find_groups ran with, feeds included."""
    if not isinstance(group.lowered, Lowered):
        group.lowered = build(view, group.members, policy.preserve, feeds=policy.feeds)
    return group.lowered


def _too_many(count: int, policy: Policy) -> str:
    return f"too many inputs ({count} > max_input_nums_after_fuse={policy.max_inputs})"


def _refuse_merge(view, group: Group, other: Group, producer: str, policy: Policy, lower_alone):
    if other.device != group.device:
        return f"device {group.device!r} differs from {other.device!r} of {producer}'s group", None
    if group.size + other.size > policy.max_fusion_size:
        return f"group full (max_fusion_size={policy.max_fusion_size})", None
    members = set(group.members) | set(other.members)
    inlined: set = set()
    through = _cycle_through(view, members, inlined)
    if through is not None:
        return f"would create a cycle through {through}", None
    try:
        lowered = check(view, sorted(members, key=view.position.get), policy.preserve,
                        feeds=policy.feeds)
    except Unfusible as err:
        return f"cannot join {producer}'s group: {err}", None
    read = [name for name, _ in lowered.inputs if name in inlined]
    if read:  # a Const the program reads as an input after all (not a scalar, or no immediate)
        return f"would create a cycle through {read[0]}", None
    if len(lowered.inputs) > policy.max_inputs:
        return _too_many(len(lowered.inputs), policy), None
    # A group that does not lower on its own runs as TensorFlow's kernels unless this merge is
    # made: there is nothing to weigh the merge against.
    if policy.cost_model != cost.NONE and lower_alone(group) is not None \
            and lower_alone(other) is not None:
        apart = (cost.estimate(view, group.members, group.lowered)
                 + cost.estimate(view, other.members, other.lowered))
        fused = cost.estimate(view, members, lowered)
        reason = cost.merge_refusal(policy.cost_model, fused, apart)
        if reason is not None:
            return reason, None
    return None, lowered


def _ancestry(view: GraphView, name: str, members: AbstractSet[str]) -> set:
    """`name` and the members it reads, directly or not."""
    seen, stack = {name}, [name]
    while stack:
        for producer, _ in view.data_inputs(stack.pop()):
            if producer in members and producer not in seen:
                seen.add(producer)
                stack.append(producer)
    return seen


def _lowering_with(view: GraphView, group: Group, served: dict, policy: Policy) -> Lowered:
    """The group's program when `served` says which of its values others recompute."""
    try:
        return build(view, sorted(set(group.members) | set(group.private), key=view.position.get),
                     policy.preserve, private=set(group.private), served=served,
                     feeds=policy.feeds)
    except Unfusible:
        return group.lowered


def _recompute_refusal(view, group, other, copies, lowered, served, policy) -> Optional[str]:
    """The cost model's view of `group` recomputing `copies` of `other` as `lowered`."""
    readers = {copy: {c for c, _, _ in view.data_consumers(copy) if c in group.members}
               for copy in copies}
    then = {k: set(v) for k, v in served.items()}
    for copy, names in readers.items():
        then.setdefault(copy, set()).update(names)
    owner = set(other.members) | set(other.private)
    before = (cost.estimate(view, set(group.members) | set(group.private), group.lowered)
              + cost.estimate(view, owner, _lowering_with(view, other, served, policy)))
    after = (cost.estimate(view, set(group.members) | set(group.private) | set(copies), lowered)
             + cost.estimate(view, owner, _lowering_with(view, other, then, policy)))
    return cost.recompute_refusal(policy.cost_model, copies, view, before, after)


def plan_recomputation(view: GraphView, groups: list, policy: Policy,
                       refusals: Optional[list] = None) -> dict:
    """Give groups private copies of cheap producers of other groups; returns `served`
    (member -> consumers that recompute it). Groups' `private` and `lowered` are updated.
    A recomputation the cost model declines is appended to `refusals` (node, reason)."""
    served: dict[str, set] = {}
    if policy.recomputation_threshold <= 0:
        return served
    for group in groups:  # a lowering to fall back on
        lowering(view, group, policy)
    owner = {m: g for g in groups for m in g.members}
    for group in groups:
        members = set(group.members)
        for name in list(group.members):
            errors.at(name)
            for producer, index in view.data_inputs(name):
                other = owner.get(producer)
                if other is None or other is group or index != 0 or producer in group.private:
                    continue
                copies = _ancestry(view, producer, set(other.members))
                size = sum(len(compute_ops(view, c)) for c in copies)
                if size > policy.recomputation_threshold:
                    continue
                private = set(group.private) | copies
                try:
                    lowered = build(view, sorted(members | private, key=view.position.get),
                                    policy.preserve, private=private, served=served,
                                    feeds=policy.feeds)
                except Unfusible:
                    continue
                if len(lowered.inputs) > policy.max_inputs:
                    continue
                if policy.cost_model != cost.NONE:
                    reason = _recompute_refusal(view, group, other, copies, lowered, served,
                                                policy)
                    if reason is not None:
                        if refusals is not None:
                            refusals.append(Refusal(producer, f"not recomputed in {name}'s "
                                                              f"group: {reason}"))
                        continue
                group.private = sorted(private, key=view.position.get)
                group.lowered = lowered
                for copy in copies:
                    readers = {c for c, _, _ in view.data_consumers(copy) if c in members}
                    served.setdefault(copy, set()).update(readers)
    def relower(group):
        try:
            group.lowered = build(view, sorted(set(group.members) | set(group.private),
                                               key=view.position.get),
                                  policy.preserve, private=set(group.private), served=served,
                                  feeds=policy.feeds)
        except Unfusible:
            pass  # keeps its earlier lowering (with the outputs)

    for group in groups:  # outputs no longer needed by the groups that recompute them
        relower(group)
    # `served` is per consumer node, but a copy recomputed in one group may read, from outside,
    # a value that another copy of the same consumer recomputes: a group recomputing c (but not
    # the m that c reads, which c's own group recomputes) reads m from m's group, which must
    # then still output m. A group's inputs do not depend on `served`, so one pass settles it.
    read = {tensor[0] for group in groups for tensor in group.lowered.inputs}
    needed = read & served.keys()
    for name in needed:
        del served[name]
    for group in groups:
        if needed & set(group.members):
            relower(group)
    return served
