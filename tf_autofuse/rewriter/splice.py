"""Mechanics: a new GraphDef in which each planned group is one AutofuseKernel node.

The fused node takes the place of the group's first member in the node list. Members that
keep their name become an `Identity` reading the fused output; the other members go. Data
edges out of the group read the fused outputs directly; control edges `^member` point at the
fused node, or stay on the member's Identity when it keeps its name. Every other node is
copied as it is, with only the input strings (and `loc:@` colocation) that named a removed
member rewritten.

A kernel that carries out variable assignments (rewriter/assigns.py) is an
AutofuseAssignKernel taking the variables' handles after its tensor inputs; the assignments go,
or stay as a NoOp waiting on it where their name must (a function's control output).
"""

from __future__ import annotations

import dataclasses

from tensorflow.core.framework import graph_pb2, node_def_pb2

from .graph import GraphView, Tensor, parse_input, tensor_name
from .lower import Lowered
from .naming import ASSIGN_OP, FUSED_OP


@dataclasses.dataclass(frozen=True)
class Planned:
    name: str
    members: tuple  # node names, topological order
    device: str
    lowered: Lowered
    keep_names: frozenset  # members that stay as an Identity


class _Remap:
    """Where references to members go once the groups are fused."""

    def __init__(self, plans: list[Planned]):
        self.output: dict[str, Tensor] = {}  # member -> (fused node, output index)
        self.control: dict[str, str] = {}  # member -> node to wait for
        # a view node one kernel reads through may still be read as it is by another (one that
        # recomputes its consumer without the view, or fell back to its plain lowering): it stays
        read = {tensor[0] for plan in plans for tensor in plan.lowered.inputs}
        for plan in plans:
            for k, member in enumerate(plan.lowered.outputs):
                self.output[member] = (plan.name, k)
            for member in plan.members:
                self.control[member] = member if member in plan.keep_names else plan.name
            for absorbed in plan.lowered.absorbed:  # view nodes only the fused node read
                if absorbed not in read:
                    self.control[absorbed] = plan.name
            for assign in plan.lowered.assigns:
                self.control[assign] = plan.name

    def touches(self, node: node_def_pb2.NodeDef) -> bool:
        return any(parse_input(text)[0] in self.control for text in node.input)

    def data(self, tensor: Tensor) -> Tensor:
        return self.output.get(tensor[0], tensor) if tensor[1] == 0 else tensor

    def inputs(self, inputs) -> list[str]:
        data, control = [], []
        for text in inputs:
            name, index, is_control = parse_input(text)
            if is_control:
                control.append("^" + self.control.get(name, name))
            elif name in self.output and index == 0:
                data.append(tensor_name(self.output[name]))
            else:
                data.append(text)
        return data + list(dict.fromkeys(control))

    def colocation(self, node: node_def_pb2.NodeDef) -> None:
        if "_class" not in node.attr:
            return
        values = node.attr["_class"].list.s
        for i, value in enumerate(values):
            if value.startswith(b"loc:@"):
                target = value[5:].decode()
                if self.control.get(target, target) != target:
                    values[i] = b"loc:@" + self.control[target].encode()


def _fused_node(plan: Planned, remap: _Remap) -> node_def_pb2.NodeDef:
    lowered = plan.lowered
    node = node_def_pb2.NodeDef(name=plan.name, op=ASSIGN_OP if lowered.variables else FUSED_OP,
                                device=plan.device)
    node.input.extend(tensor_name(remap.data(t)) for t in lowered.inputs)
    node.input.extend(tensor_name(t) for t in lowered.variables)
    controls = sorted({remap.control.get(c, c) for c in lowered.control_inputs})
    node.input.extend("^" + c for c in controls)
    node.attr["program"].s = lowered.program.print().encode()
    node.attr["Tin"].list.type.extend(lowered.in_dtypes)
    node.attr["Tout"].list.type.extend(lowered.out_dtypes)
    if lowered.variables:
        node.attr["num_variables"].i = len(lowered.variables)
        node.attr["reads"].list.i.extend(lowered.variable_reads)
        node.attr["writes"].list.i.extend(lowered.variable_writes)
    return node


def _kept_assign(plan: Planned, name: str, view: GraphView) -> node_def_pb2.NodeDef:
    """An assignment the kernel carries out whose name must stay: a NoOp waiting on it."""
    node = node_def_pb2.NodeDef(name=name, op="NoOp", device=view.device(name))
    node.input.append("^" + plan.name)
    return node


def _identity(plan: Planned, member: str, view: GraphView) -> node_def_pb2.NodeDef:
    k = plan.lowered.outputs.index(member)
    node = node_def_pb2.NodeDef(name=member, op="Identity", device=view.device(member))
    node.input.append(tensor_name((plan.name, k)))
    node.attr["T"].type = plan.lowered.out_dtypes[k]
    return node


def _dead_consts(view: GraphView, plans: list[Planned], remap: "_Remap", preserve) -> set:
    """Consts that only fused members read, now immediates of the programs."""
    read = {tensor[0] for plan in plans for tensor in plan.lowered.inputs}
    dead = set()
    for node in view.nodes:
        if node.op != "Const" or node.name in preserve or node.name in read:
            continue
        consumers = view.data_consumers(node.name)
        if consumers and not view.control_consumers(node.name) and all(
                c in remap.control for c, _, _ in consumers):
            dead.add(node.name)
    return dead


def _without_nodes(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """A copy of everything but the nodes (versions, library, ...): copying the whole graph
    and deleting its nodes would copy every node once for nothing."""
    out = graph_pb2.GraphDef()
    for field, value in graph_def.ListFields():
        if field.name == "node":
            continue
        if field.message_type is not None:  # versions, library, debug_info
            getattr(out, field.name).CopyFrom(value)
        else:  # the deprecated `version`
            setattr(out, field.name, value)
    return out


def splice(view: GraphView, plans: list[Planned], preserve=frozenset()) -> graph_pb2.GraphDef:
    remap = _Remap(plans)
    dead = _dead_consts(view, plans, remap, preserve)
    # the member whose place the fused node takes; several groups may share it (a view node
    # absorbed by a group and by another that recomputes its consumer)
    first_member: dict[str, list] = {}
    for plan in plans:
        first = min(plan.members + plan.lowered.absorbed, key=view.index)
        first_member.setdefault(first, []).append(plan)
    out = _without_nodes(view.graph_def)
    for node in view.nodes:
        for plan in first_member.get(node.name, ()):
            out.node.append(_fused_node(plan, remap))
            for member in plan.members:
                if member in plan.keep_names:
                    out.node.append(_identity(plan, member, view))
            out.node.extend(_kept_assign(plan, name, view) for name in plan.lowered.assigns
                            if name in preserve)
        if node.name in remap.control or node.name in dead:
            continue
        copy = out.node.add()
        copy.CopyFrom(node)
        if remap.touches(node):
            new_inputs = remap.inputs(node.input)
            del copy.input[:]
            copy.input.extend(new_inputs)
        remap.colocation(copy)
    _check_inputs(out)
    return out


def _check_inputs(graph_def: graph_pb2.GraphDef) -> None:
    """Raise if a node reads a node that is not in the graph (a bug of the pass: TensorFlow
    would log it and silently run the graph unoptimized; the bridge warns instead)."""
    names = {node.name for node in graph_def.node}
    for node in graph_def.node:
        for text in node.input:
            name = parse_input(text)[0]
            if name not in names:
                raise RuntimeError(f"the rewritten graph is broken: {node.name} reads {text}, "
                                   "which is not in it")
