"""The codegen's reading of a fused program (docs/PROGRAM.md).

The text is parsed and checked by `tf_autofuse.rewriter.program.parse`, the one Python parser
of the project, which refuses what the CPU kernel's parser refuses (a program it refuses is
refused here too, with its reason). This module only flattens the result, with what the parser
derives (value and operand dtypes, reduced values and inputs), into what the generator looks at:
every input's view, every instruction's dtypes and whether its value is reduced, and the
outputs. What the rewriter's `widen` pass computes in f64 is read as its fp32 form
(`passes.narrow`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

from ..rewriter import catalog
from ..rewriter import passes
from ..rewriter import program as _program

Ref = _program.Ref  # ("in" | "%", index); str() prints in3 / %2
REDUCTIONS = frozenset(spec.ir_name for spec in catalog.OPS if spec.kind == catalog.REDUCE)

Operand = Union[Ref, int, float, bool]


@dataclasses.dataclass(frozen=True)
class Input:
    dtype: str
    shape: Optional[tuple]  # None: unknown rank; -1: unknown size
    view: Optional[tuple]  # the view after "->", else the shape


@dataclasses.dataclass(frozen=True)
class Inst:
    op: str
    operands: tuple
    attrs: dict
    dtype: str  # the value's dtype
    operand_dtype: str  # the dtype of its non-immediate operands (the last one for Select)
    reduced: bool  # a reduction, or computed from reductions (and immediates) only
    reduced_shape: bool = False  # has the reduced shape (1 along the reduced axes), as the CPU
    #                              kernel sees it: `reduced`, or computed from inputs read as
    #                              reduced values (PROGRAM.md "Reductions")


@dataclasses.dataclass(frozen=True)
class Output:
    ref: Ref
    shape: Optional[tuple]  # "-> [shape]" or None


@dataclasses.dataclass(frozen=True)
class Program:
    text: str
    inputs: tuple
    insts: tuple
    outputs: tuple
    reduced_inputs: tuple = ()  # per input: read as a reduced value (programs with reductions)

    def ref_dtype(self, ref: Ref) -> str:
        return self.inputs[ref.index].dtype if ref.kind == "in" else self.insts[ref.index].dtype

    def ref_reduced_shape(self, ref: Ref) -> bool:
        if ref.kind == "in":
            return bool(self.reduced_inputs) and self.reduced_inputs[ref.index]
        return self.insts[ref.index].reduced_shape

    @property
    def has_reduction(self) -> bool:
        return any(i.op in REDUCTIONS for i in self.insts)

    @property
    def has_broadcast(self) -> bool:
        """True unless every input is read as the same view (then the program is flat)."""
        views = {inp.view for inp in self.inputs}
        if len(views) != 1:
            return True
        view = views.pop()
        return view is None and len(self.inputs) > 1

    def output_dtypes(self) -> list:
        return [self.ref_dtype(o.ref) for o in self.outputs]


def load(text: str) -> Program:
    """Read program text; ValueError naming the line when it is not a program."""
    # the AI core has no f64: what the widen pass computes in f64 is computed in fp32 here
    parsed = passes.narrow(_program.parse(text))
    value_dtypes = parsed.value_dtypes()
    inputs = tuple(Input(d.dtype, d.shape, parsed.read_shape(k))
                   for k, d in enumerate(parsed.inputs))
    reduced_inputs = ()
    if parsed.reduce_axes() is not None:
        reduced_inputs = tuple(parsed.is_reduced(_program.In(k)) for k in range(len(inputs)))
    insts = []
    for k, inst in enumerate(parsed.instructions):
        refs = [o for o in inst.operands if isinstance(o, Ref)]
        reduced = inst.op in REDUCTIONS or all(r.kind == "%" and insts[r.index].reduced
                                               for r in refs)
        insts.append(Inst(inst.op, tuple(inst.operands), dict(inst.attrs), value_dtypes[k],
                          parsed.operand_dtype(k), reduced, parsed.is_reduced(_program.Val(k))))
    outputs = tuple(Output(ref, view) for ref, view in zip(parsed.outputs, parsed.output_views))
    return Program(text, inputs, tuple(insts), outputs, reduced_inputs)
