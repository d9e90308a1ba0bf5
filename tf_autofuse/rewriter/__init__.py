"""The graph rewriter: GraphDef in, GraphDef with AutofuseKernel nodes out. Pure Python.

    graph.py      read-only view of the GraphDef
    catalog.py    the table of supported ops (IR ops, and how each TF op type lowers)
    partition.py  which nodes fuse (policy, with a reason for every refusal)
    cost.py       the cost models the partitioner may consult (memory_bandwidth, ...)
    patterns.py   user patterns (Pattern), run before the partitioner
    epilogue.py   convolutions' and MatMuls' per-channel maps and activations, handed to
                  TensorFlow's own fused kernels (_FusedConv2D, ...), run before the partitioner
    pads.py       a zero Pad before a convolution read as the convolution's explicit padding
    reshaped_sums.py  a Reshape of a Sum over leading axes read as the Sum of a Reshape
    editor.py     the graph edits of those passes (new nodes, unique names, static shapes)
    unfold.py     TensorFlow's fused elementwise nodes (oneDNN's _MklSwish) read as their ops
    lower.py      a set of nodes -> its FusedProgram (program.py), inputs, outputs; or why not
    output_views.py  a Reshape (Squeeze, ExpandDims) of a fused output stored as its view
    assigns.py    variable writes of fused outputs carried out by their kernel (optimizer steps)
    passes.py     the IR passes (simplify, hoist) every kernel's program gets before printing
    scope.py      disable_autofuse(): the attr that keeps nodes out of every fusion
    naming.py     autofuse_<kind>_<n>_<Op>_<Op>..., and the fused op types
    errors.py     what an unexpected exception becomes (a group's refusal, or AutofuseError)
    splice.py     the new GraphDef
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping, Optional, Sequence

from tensorflow.core.framework import graph_pb2

from .._warn import warn_once
from . import catalog, cost, errors, passes
from .errors import AutofuseError
from .graph import GraphView, Shape, node_name
from .lower import Unfusible, build, keeps_name, reads_view_node
from .naming import FUSED_OP, FUSED_OPS, Namer
from .assigns import absorb_assignments
from .output_views import absorb_output_views
from .epilogue import OPERATORS, Epilogue, fuse_epilogues
from .pads import fold_pads
from .reshaped_sums import reshape_sums
from .partition import Policy, Refusal, find_groups, lowering, plan_recomputation
from .patterns import Pattern, PatternGraph, apply_patterns
from .splice import Planned, splice
from .unfold import FOLDED_OPS, alone, original_names, refold_graph, unfold_graph

DEFAULTS = Policy()  # the one place the limits' defaults are written: partition.Policy

__all__ = ["AutofuseError", "Fusion", "Pattern", "PatternGraph", "Policy", "Refusal", "Rewrite",
           "rewrite", "optimize", "policy_from_flags", "FUSED_OP",
           "FUSED_OPS"]


@dataclasses.dataclass(frozen=True)
class Fusion:
    name: str  # the AutofuseKernel node
    kind: str  # "pointwise", "reduce", or "pattern" (claimed by a user Pattern)
    nodes: tuple  # original node names, topological order (an unfolded _MklSwish: its name)
    op_types: tuple  # TF op types, in program order (recomputed copies included)
    program: str  # the program text
    absorbed: tuple = ()  # view nodes (Reshape, ...) read through and removed from the graph


@dataclasses.dataclass(frozen=True)
class Rewrite:
    graph_def: graph_pb2.GraphDef
    fusions: list  # of Fusion
    refusals: list  # of Refusal (node, reason)
    epilogues: list = dataclasses.field(default_factory=list)  # of epilogue.Epilogue


def policy_from_flags(flags, preserve=frozenset()) -> Policy:
    """The partitioning policy a flags object asks for (any object; missing attrs: defaults).

    Reads max_fusion_size, max_input_nums_after_fuse, recomputation_threshold,
    autofuse_enable_pass / autofuse_disable_pass (tuples of pass names),
    skip_node_names_cfg (an object with `names` and `types`, or None), cost_model ("none" or
    one of cost.MODELS; ValueError otherwise) and enable_auto_fusion (default true).
    """
    enable = tuple(getattr(flags, "autofuse_enable_pass", ()) or ())
    disable = tuple(getattr(flags, "autofuse_disable_pass", ()) or ())
    skip = getattr(flags, "skip_node_names_cfg", None)
    cost_model = cost.check_model(str(getattr(flags, "cost_model", cost.NONE) or cost.NONE))
    return Policy(
        max_fusion_size=int(getattr(flags, "max_fusion_size", DEFAULTS.max_fusion_size)),
        max_inputs=int(getattr(flags, "max_input_nums_after_fuse", DEFAULTS.max_inputs)),
        pointwise="pointwise" not in disable,
        reduce="reduce" in enable and "reduce" not in disable,
        epilogue="epilogue" not in disable,
        epilogue_scale="epilogue_scale" not in disable,
        assign="assign" not in disable,
        recomputation_threshold=int(getattr(flags, "recomputation_threshold",
                                            DEFAULTS.recomputation_threshold)),
        skip_names=frozenset(getattr(skip, "names", ()) or ()),
        skip_types=frozenset(getattr(skip, "types", ()) or ()),
        preserve=frozenset(preserve),
        cost_model=cost_model,
        auto=bool(getattr(flags, "enable_auto_fusion", True)),
    )


def rewrite(
    graph_def: graph_pb2.GraphDef,
    preserve: Iterable[str] = (),
    flags=None,
    shapes: Optional[Mapping[str, Sequence[Shape]]] = None,
    feeds: Iterable[str] = (),
    patterns: Sequence[Pattern] = (),
    policy: Optional[Policy] = None,
) -> Rewrite:
    """Fuse what can be fused. The input is never mutated; `.graph_def` is a new GraphDef.

    preserve: node names whose name and value must survive (fetches, feeds, control targets).
    flags: a tf_autofuse.Flags or any object with its attributes (`policy_from_flags`); or
    policy: the partitioner's Policy itself (what fuser.FuserConfig.policy() gives). Not both.
    shapes: node name -> static shape of each output (tuple, -1 unknown size; None unknown rank).
    feeds: node names the caller feeds; they are never fused.
    patterns: user Patterns, run before the partitioner (patterns.py); their kernels come first.

    An unexpected exception while lowering one group makes that group a refusal whose reason
    is the exception (one AutofuseWarning says so); anywhere else it is an AutofuseError naming
    the phase and node (errors.py).
    """
    preserve = frozenset(node_name(p) for p in preserve)
    feeds = frozenset(node_name(f) for f in feeds)
    if policy is None:
        policy = policy_from_flags(flags, preserve)
    elif flags is not None:
        raise TypeError("rewrite() takes flags or a policy, not both")
    policy = dataclasses.replace(policy, preserve=preserve, feeds=feeds)
    with errors.tracking(errors.Progress()) as progress:
        try:
            result = _rewrite(graph_def, preserve, policy, shapes, tuple(patterns or ()))
        except Exception as err:  # noqa: BLE001 - every bug of the pass, by design
            raise progress.error(err) from err
    for refusal in result.refusals:
        if errors.is_internal(refusal.reason):
            warn_once(f"{refusal.node} runs unfused: {refusal.reason}")
    return result


def _rewrite(source: graph_pb2.GraphDef, preserve: frozenset, policy: Policy, shapes,
             patterns: tuple) -> Rewrite:
    """rewrite() in its phases: unfold, epilogues, claim patterns, partition, plan
    recomputation, lower (and the IR passes), output views, splice, refold."""
    feeds = policy.feeds

    def unchanged() -> graph_pb2.GraphDef:  # a copy, made only when nothing is fused
        copy = graph_pb2.GraphDef()
        copy.CopyFrom(source)
        return copy

    def without_groups() -> graph_pb2.GraphDef:  # no group fused: the epilogue pass's graph
        return refold_graph(graph_def, unfolded) if rewired else unchanged()

    auto = policy.auto and policy.pointwise
    epilogues = policy.auto and policy.epilogue
    candidates = catalog.candidate_op_types() | FOLDED_OPS | (OPERATORS if epilogues
                                                              else frozenset())
    if policy.max_fusion_size <= 0 or not (auto or patterns or epilogues) or not any(
            node.op in candidates for node in source.node):
        return Rewrite(unchanged(), [], [])

    errors.phase("unfold")
    graph_def, shapes, unfolded = unfold_graph(source, shapes)
    epilogue_refusals, taken, rewired = [], [], False
    if epilogues:
        errors.phase("pads")
        before = graph_def
        graph_def, shapes, _ = fold_pads(graph_def, shapes, policy)
        errors.phase("epilogues")
        graph_def, shapes, taken, epilogue_refusals = fuse_epilogues(graph_def, shapes, policy)
        # epilogues taken, fused operators' biases rewired, or pads folded into convolutions
        rewired = graph_def is not before
    if auto and policy.reduce:
        errors.phase("reshaped sums")
        graph_def, shapes, reshaped = reshape_sums(graph_def, shapes, policy)
        rewired = rewired or bool(reshaped)
    view = GraphView(graph_def, shapes)

    computed: set = set()  # members of the partitioner's groups: never read through

    def absorbable(name: str, members) -> bool:
        node = view.node(name)
        consumers = view.data_consumers(name)
        return (name not in computed and name not in preserve and name not in feeds and consumers
                and all(c in members for c, _, _ in consumers)
                and not view.control_inputs(name) and not view.control_consumers(name)
                and view.device_type(name) == "CPU" and len(view.data_inputs(name)) >= 1
                and "_class" not in node.attr)

    claims, refusals, groups, served = [], list(epilogue_refusals), [], {}
    if patterns:
        errors.phase("patterns")
        # a pattern reads through view nodes only: a Tile it read through could still be a
        # member of the partitioner's groups
        claims, excluded, claim_refusals = apply_patterns(
            view, patterns, policy,
            lambda name, members: catalog.tf_op(view.node(name).op).kind == catalog.VIEW
            and absorbable(name, members))
        refusals += claim_refusals
        policy = dataclasses.replace(policy, excluded=tuple(excluded.items()))
    if auto:
        errors.phase("partition")
        groups, auto_refusals = find_groups(view, feeds, policy=policy)
        for group in list(groups) if unfolded else ():
            lone = alone(group.members, unfolded)
            if lone is not None:
                groups.remove(group)
                auto_refusals.extend(Refusal(m, f"only the parts of one {lone.original.op} "
                                                f"({lone.original.name}): already one kernel")
                                     for m in group.members)
        refusals = refusals + auto_refusals
        if groups:
            errors.phase("recomputation")
            served = plan_recomputation(view, groups, policy, refusals)
        computed.update(m for group in groups for m in group.members)

    errors.phase("lower")
    namer = Namer(node.name for node in graph_def.node)
    plans, kinds = [], []

    def add(kind: str, suffix, members: tuple, device: str, lowered) -> None:
        name = namer.name(kind, suffix)
        # the one place the IR passes run: every backend reads the program they leave
        lowered = dataclasses.replace(lowered, program=passes.optimize(lowered.program))
        keep = frozenset(m for m in members if keeps_name(view, m, preserve))
        plans.append(Planned(name, members, device, lowered, keep))
        kinds.append("pattern" if kind == "pattern" else lowered.kind)

    for claim in claims:
        errors.at(claim.members[0])
        add("pattern", [claim.suffix], tuple(claim.members), view.device(claim.members[0]),
            claim.lowered)
    for group in groups:
        errors.at(group.members[0])
        try:
            lowered = _lower_group(view, group, policy, served, absorbable)
        except Unfusible as err:  # only an internal error: the partitioner checked the group
            refusals.append(Refusal(group.members[0], str(err)))
            continue
        add(lowered.kind, lowered.op_types, tuple(group.members), group.device, lowered)
    if not plans:
        return Rewrite(without_groups(), [], refusals, taken)
    errors.phase("output views")
    plans = absorb_output_views(view, plans, preserve | feeds)
    if policy.assign:
        errors.phase("assignments")
        plans, assign_refusals = absorb_assignments(view, plans, feeds)
        refusals = refusals + assign_refusals
    fusions = [Fusion(plan.name, kind, original_names(plan.members, unfolded),
                      plan.lowered.op_types, plan.lowered.program.print(),
                      plan.lowered.absorbed + plan.lowered.assigns)
               for plan, kind in zip(plans, kinds)]
    # a Tile refused as a member may still be read through by its readers' kernel: then it is gone
    absorbed = {name for fusion in fusions for name in fusion.absorbed}
    refusals = [r for r in refusals if r[0] not in absorbed]
    errors.phase("splice")
    spliced = splice(view, plans, preserve | feeds)
    errors.phase("refold")
    return Rewrite(refold_graph(spliced, unfolded), fusions, refusals, taken)


def _lower_group(view: GraphView, group, policy: Policy, served: dict, absorbable):
    """A partitioned group's program: the partitioner's own lowering where it is this build's
    result, else built again with absorption and recomputed copies."""
    if not group.private and not served and not reads_view_node(view, group.lowered):
        # the partitioner's lowering of exactly these members is this build's result: only an
        # input a view node produces could be absorbed (read through) here
        return lowering(view, group, policy)
    members = sorted(set(group.members) | set(group.private), key=view.position.get)
    try:
        return build(view, members, policy.preserve, private=set(group.private), served=served,
                     absorbable=absorbable, feeds=policy.feeds)
    except Unfusible:
        return lowering(view, group, policy)


def optimize(
    graph_def: graph_pb2.GraphDef,
    preserve: Iterable[str] = (),
    flags=None,
    shapes: Optional[Mapping[str, Sequence[Shape]]] = None,
    feeds: Iterable[str] = (),
) -> graph_pb2.GraphDef:
    """`rewrite(...).graph_def`."""
    return rewrite(graph_def, preserve, flags, shapes, feeds).graph_def
