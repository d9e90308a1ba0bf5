"""Variable writes carried out by the fused kernel that computes their value.

An optimizer step ends each parameter's update with writes to resource variables, each a
kernel of its own. SGD with momentum, as Keras writes it:

    m' = 0.9 * m - lr * g          one fused kernel
    AssignVariableOp(m, m')        a kernel that swaps m's buffer
    AssignAddVariableOp(v, read(m))  a kernel that passes over v once more

The fused kernel can do all three: it stores the output m' into m (the variable adopts the
output's buffer, as AssignVariableOp does) and computes v + m' as one more output of its
program, reading v from the variable itself, which it stores into v. The node becomes an
AutofuseAssignKernel (stateful; cc/variables.h) holding the variables' locks while it runs.

What is taken, per output of a fused kernel:
- `AssignVariableOp(h, out)`: the output stored into h's variable;
- `AssignAddVariableOp(h2, x)` / `AssignSubVariableOp(h2, x)` where x is the output itself, or
  `ReadVariableOp(h)` waiting only on that AssignVariableOp (so it reads the output): the program
  computes `v + out` (`v - out`) with v read from h2's variable, stored into it.
Each assignment must wait on nothing else (no control inputs), its handles must come from nodes
with no inputs (a function's `_Arg`, a `VarHandleOp`), each variable is written once per kernel,
and an AssignVariableOp must keep the variable's shape (validate_shape, as Keras writes it): the
kernel refuses any store that would change it. Then every node that had to run before the
assignment runs before the kernel (its inputs are the kernel's, or the kernel's own outputs) and
the nodes that waited on it wait on the kernel: moving the write into the kernel adds no edge
that could close a cycle. A kernel takes writes only together with an update (an optimizer
step): a write alone would save one cheap kernel, which looking the variable up and locking it
cost back on small tensors. An assignment whose name must stay (a function's control output, a
fetch target) stays as a NoOp waiting on the kernel.
"""

from __future__ import annotations

import dataclasses
from typing import AbstractSet, Optional

from . import catalog
from . import program as ir
from .graph import GraphView, Tensor
from .partition import Refusal
from .splice import Planned

ASSIGN = "AssignVariableOp"
UPDATES = {"AssignAddVariableOp": "Add", "AssignSubVariableOp": "Sub"}


def absorb_assignments(view: GraphView, plans: list, feeds: AbstractSet[str]) -> tuple:
    """(`plans` with the assignments of their outputs taken in, refusals of the assignments of
    fused outputs that stay nodes)."""
    result, refusals = [], []
    for plan in plans:
        taken = _Taken(plan)

        def take(node: str, k: int, how) -> bool:
            reason = _why_not(view, node, plan, k, feeds) or how(view, node, k)
            if reason:
                refusals.append(Refusal(node, reason))
            return not reason

        for k, member in enumerate(plan.lowered.outputs):
            for consumer, position, index in view.data_consumers(member):
                if position != 1 or index != 0 or consumer in plan.members:
                    continue
                op = view.node(consumer).op
                if op in UPDATES:
                    take(consumer, k, taken.update)
                elif op == ASSIGN and take(consumer, k, taken.assign):
                    for update in _updates_reading(view, consumer, feeds):
                        take(update, k, taken.update)
        if taken.assigns and not taken.reads:
            # writes alone: each saves one cheap kernel, which looking the variables up and
            # locking them cost back on small tensors (the examples' [128,192] assignment)
            refusals.extend(Refusal(node, "a write alone (no AssignAdd/Sub of it in this "
                                          "kernel): it stays a node of its own")
                            for node in taken.assigns)
            result.append(plan)
            continue
        result.append(taken.plan())
    return result, refusals


def _updates_reading(view: GraphView, assign: str, feeds: AbstractSet[str]) -> list:
    """The AssignAdd/SubVariableOps whose value is a ReadVariableOp of the variable `assign`
    writes that waits on `assign` only, and is not fed: they add (subtract) the assigned value."""
    handle = view.data_inputs(assign)[0]
    rereads = [c for c in view.control_consumers(assign)
               if view.node(c).op == "ReadVariableOp" and view.data_inputs(c) == [handle]
               and view.control_inputs(c) == [assign] and c not in feeds]
    return [consumer for reread in rereads
            for consumer, position, _ in view.data_consumers(reread)
            if view.node(consumer).op in UPDATES and position == 1]


def _why_not(view: GraphView, node: str, plan: Planned, k: int, feeds) -> Optional[str]:
    """Why assignment `node` of output k cannot be taken into the plan's kernel, or None."""
    attrs = view.node(node).attr
    if node in feeds:
        return "fed"
    if view.device(node) != plan.device:
        return f"on {view.device(node)!r}, the fused kernel on {plan.device!r}"
    if view.control_inputs(node):
        return "waits on " + ", ".join(view.control_inputs(node))
    if view.node(node).op == ASSIGN and not attrs["validate_shape"].b:
        return "may change the variable's shape (validate_shape=false)"
    if "dtype" in attrs and attrs["dtype"].type != plan.lowered.out_dtypes[k]:
        return "assigns another dtype than the fused output's"
    handle = view.data_inputs(node)[0][0]
    if view.data_inputs(handle) or view.control_inputs(handle):
        return f"its variable's handle comes from {handle}, a node with inputs"
    return None


class _Taken:
    """The assignments taken into one plan so far, and its program grown by them."""

    def __init__(self, plan: Planned):
        self.original = plan
        lowered = plan.lowered
        self.program = lowered.program
        self.variables: list[Tensor] = []
        self.reads: list[int] = []
        self.writes = [-1] * len(lowered.outputs)
        self.outputs, self.out_dtypes = list(lowered.outputs), list(lowered.out_dtypes)
        self.assigns: list[str] = []

    def assign(self, view: GraphView, node: str, k: int) -> Optional[str]:
        """Take `AssignVariableOp(h, out_k)`: out_k is stored into h's variable."""
        handle = view.data_inputs(node)[0]
        if handle in self.variables:
            return "its variable is already written by the fused kernel"
        if self.writes[k] >= 0:
            return "the fused output is already stored into another variable"
        self.writes[k] = self._variable(handle)
        self.assigns.append(node)
        return None

    def update(self, view: GraphView, node: str, k: int) -> Optional[str]:
        """Take `AssignAdd/SubVariableOp(h, out_k)`: the program computes v +/- out_k."""
        handle = view.data_inputs(node)[0]
        if handle in self.variables:
            return "its variable is already written by the fused kernel"
        program = self.program
        ref = program.outputs[k]
        computed = _computed_shape(program, ref)
        stored = program.output_views[k] or computed
        if computed is None or stored is None or any(d < 0 for d in stored):
            return "the fused output's shape is not static"
        dtype = program.ref_dtype(ref)
        decl = ir.InputDecl(dtype, stored, None if stored == computed else computed)
        value = ir.Instruction(UPDATES[view.node(node).op],
                               (ir.In(len(program.inputs)), ref))
        self.program = dataclasses.replace(
            program, inputs=program.inputs + (decl,),
            instructions=program.instructions + (value,),
            outputs=program.outputs + (ir.Val(len(program.instructions)),),
            output_views=program.output_views + (None if stored == computed else stored,))
        variable = self._variable(handle)
        self.reads.append(variable)
        self.writes.append(variable)
        self.outputs.append(node)
        self.out_dtypes.append(self.out_dtypes[k])
        self.assigns.append(node)
        return None

    def _variable(self, handle: Tensor) -> int:
        self.variables.append(handle)
        return len(self.variables) - 1

    def plan(self) -> Planned:
        if not self.assigns:
            return self.original
        lowered = dataclasses.replace(
            self.original.lowered, program=self.program, outputs=tuple(self.outputs),
            out_dtypes=tuple(self.out_dtypes), variables=tuple(self.variables),
            variable_reads=tuple(self.reads), variable_writes=tuple(self.writes),
            assigns=tuple(self.assigns))
        return dataclasses.replace(self.original, lowered=lowered)


def _computed_shape(program: ir.FusedProgram, ref: ir.Ref) -> Optional[tuple]:
    """The static shape the program computes `ref` in: the iteration shape, 1 along the reduced
    axes for a reduced value; None when an input's shape is not static."""
    shapes = [program.read_shape(j) for j in range(len(program.inputs))]
    if any(s is None or any(d < 0 for d in s) for s in shapes):
        return None
    iteration = catalog.broadcast_shapes(shapes)  # the program's inputs do broadcast
    if program.is_reduced(ref):
        axes = program.reduce_axes()
        iteration = tuple(1 if a in axes else d for a, d in enumerate(iteration))
    return iteration
