"""View nodes on a fused kernel's outputs, stored as output views.

A Reshape, Squeeze or ExpandDims whose input is a group's value and which is that value's only
reader outside the group costs TensorFlow a kernel of its own, though it copies nothing. The
program can store the output in the view node's shape directly (`outK = %N -> [shape]`,
docs/PROGRAM.md): the view node then leaves the graph and its readers read the fused kernel.
Where another group reads the value itself, or reads through the view node as an input view,
the output and the view node stay as they are.
"""

from __future__ import annotations

import dataclasses
from typing import AbstractSet

from . import catalog
from .graph import GraphView
from .splice import Planned


def absorb_output_views(view: GraphView, plans: list, protected: AbstractSet[str]) -> list:
    """`plans` with each such view node taken into the plan whose output it reshapes.

    protected: nodes whose name and value must survive (preserved and fed).
    """
    read = {tensor for plan in plans for tensor in plan.lowered.inputs}
    through = {name for plan in plans for name in plan.lowered.absorbed}
    result = []
    for plan in plans:
        lowered = plan.lowered
        outputs, views, taken = list(lowered.outputs), list(lowered.program.output_views), []
        for k, member in enumerate(outputs):
            node = _view_reader(view, member, plan, protected)
            if node is None or (member, 0) in read or node in through or (node, 0) in read:
                continue
            shape = view.output_shape(node)
            shown = tuple(d if d >= 0 else -1 for d in shape)
            outputs[k], views[k] = node, shown
            taken.append(node)
        if taken:
            program = dataclasses.replace(lowered.program, output_views=tuple(views))
            lowered = dataclasses.replace(lowered, program=program, outputs=tuple(outputs),
                                          absorbed=lowered.absorbed + tuple(taken))
            plan = dataclasses.replace(plan, lowered=lowered)
        result.append(plan)
    return result


def _view_reader(view: GraphView, member: str, plan: Planned, protected):
    """The view node that is `member`'s only reader outside the plan, when it may be absorbed
    and its shape is known up to one size; else None."""
    if member in protected or member in plan.keep_names or view.control_consumers(member):
        return None
    outside = [(c, pos, index) for c, pos, index in view.data_consumers(member)
               if c not in plan.members]
    if len(outside) != 1 or outside[0][1] != 0 or outside[0][2] != 0:
        return None
    node = outside[0][0]
    entry = catalog.tf_op(view.node(node).op)
    if entry is None or entry.kind != catalog.VIEW or node in protected:
        return None
    if (view.control_inputs(node) or view.device(node) != plan.device
            or "_class" in view.node(node).attr):
        return None
    shape = view.output_shape(node)
    if shape is None or sum(1 for d in shape if d < 0) > 1:
        return None
    if view.output_dtype(node) not in (None, plan.lowered.out_dtypes[
            plan.lowered.outputs.index(member)]):
        return None
    return node
