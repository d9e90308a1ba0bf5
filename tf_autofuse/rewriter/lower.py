"""One group of nodes -> the FusedProgram it computes, with the tensors it reads and yields.

Inputs are the group's outside data inputs in the order the members (topological order)
read them, each tensor once. Outputs are the members, in topological order, whose value is
read outside the group or whose name must be kept (`keeps_name`).
"""

from __future__ import annotations

import dataclasses
from typing import AbstractSet

from . import program as ir
from .graph import GraphView, Tensor
from .partition import Group, compute_ops


@dataclasses.dataclass(frozen=True)
class Lowered:
    program: ir.FusedProgram
    inputs: tuple  # of Tensor (node, output index), in0, in1, ...
    outputs: tuple  # of member names, out0, out1, ...
    control_inputs: tuple  # outside nodes members wait for, sorted
    op_types: tuple  # TF op types in order (a composition gives its op_names)


def keeps_name(view: GraphView, name: str, preserve: AbstractSet[str]) -> bool:
    """A member keeps its name (as an Identity) when preserved, or when nothing reads it
    (then it can only be there to be fetched)."""
    return name in preserve or not view.data_consumers(name)


def lower(view: GraphView, group: Group, preserve: AbstractSet[str]) -> Lowered:
    members = set(group.members)
    dtype = ir.DTYPE_NAMES[group.dtype]
    inputs: dict[Tensor, ir.Ref] = {}
    values: dict[str, ir.Ref] = {}  # member -> the Ref holding its result
    decls, instructions, op_types = [], [], []
    for name in group.members:
        operands = []
        for tensor in view.data_inputs(name):
            if tensor[0] in members:
                operands.append(values[tensor[0]])
                continue
            if tensor not in inputs:
                inputs[tensor] = ir.In(len(inputs))
                decls.append(ir.InputDecl(dtype, _declared(view.tensor_shape(tensor))))
            operands.append(inputs[tensor])
        for op_type, spec in compute_ops(view, name):
            instructions.append(ir.Instruction(spec.ir_name, tuple(operands)))
            operands = [ir.Val(len(instructions) - 1)]
            op_types.append(op_type)
        values[name] = operands[0]
    outputs = [
        name
        for name in group.members
        if keeps_name(view, name, preserve)
        or any(consumer not in members for consumer, _, _ in view.data_consumers(name))
    ]
    controls = sorted(
        {c for name in group.members for c in view.control_inputs(name) if c not in members}
    )
    program = ir.FusedProgram(decls, instructions, [values[name] for name in outputs])
    return Lowered(program, tuple(inputs), tuple(outputs), tuple(controls), tuple(op_types))


def _declared(shape):
    """The program knows sizes or "?": symbolic sizes (<= -2) are written as unknown."""
    return None if shape is None else tuple(d if d >= 0 else -1 for d in shape)
