"""The codegen's reading of a fused program (docs/PROGRAM.md).

Today's pointwise programs go through `tf_autofuse.rewriter.program.parse` (the one parser the
rest of the project uses). Programs in the extended grammar (views `-> [..]`, output shapes,
bool, `Cast to=`, reductions `axes=[..]`, literals `true`/`false`) are not accepted by that
parser yet, so a small adapter here reads them with the same rules; once program.py grows, the
adapter only serves as a fallback. Both produce the same `Program` below, which is all the
generator looks at.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional, Union

DTYPE_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i32": 4, "bool": 1}
REDUCTIONS = frozenset({"Sum", "Mean", "Max", "Min", "Prod"})
_BOOL_RESULT = frozenset({"Greater", "GreaterEqual", "Less", "LessEqual", "Equal", "NotEqual",
                          "IsNan", "IsInf", "IsFinite"})


@dataclasses.dataclass(frozen=True)
class Ref:
    kind: str  # "in" or "%"
    index: int

    def __str__(self) -> str:
        return f"{self.kind}{self.index}"


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
    reduced: bool  # a reduced value (PROGRAM.md "Reductions")


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

    def ref_dtype(self, ref: Ref) -> str:
        return self.inputs[ref.index].dtype if ref.kind == "in" else self.insts[ref.index].dtype

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
    """Read program text; ValueError naming the line when it is not a program.

    The generator's model always comes from the adapter below, so that views, output shapes and
    reduced values are never lost whichever parser accepted the text. When the rewriter's parser
    accepts the program too (today's pointwise programs), it validates it and the two readings
    must agree on every value's dtype."""
    program = _parse_extended(text)
    try:
        from ..rewriter import program as rw
        parsed = rw.parse(text)
    except ValueError:
        return program  # the extended grammar, not (yet) accepted by the rewriter's parser
    theirs = list(parsed.value_dtypes())
    ours = [inst.dtype for inst in program.insts]
    if theirs != ours:
        raise ValueError(f"value dtypes {ours} differ from the rewriter's reading {theirs}")
    return program


# --- the adapter for the extended grammar ---------------------------------------------------

_INPUT = re.compile(r"in(\d+): ([a-z0-9]+)\[([^\]]*)\]( -> \[([^\]]*)\])?")
_INST = re.compile(r"%(\d+) = ([A-Za-z][A-Za-z0-9_]*) (.+)")
_OUTPUT = re.compile(r"out(\d+) = (in\d+|%\d+)( -> \[([^\]]*)\])?")
_REF = re.compile(r"(in|%)(\d+)")


def _dims(text: str, fail):
    if text == "*":
        return None
    if text == "":
        return ()
    out = []
    for d in text.split(","):
        if d == "?":
            out.append(-1)
        elif d.isdigit():
            out.append(int(d))
        else:
            fail(f"bad dimension {d!r}")
    return tuple(out)


def _literal(token: str, fail):
    if token in ("true", "false"):
        return token == "true"
    try:
        return int(token) if re.fullmatch(r"-?\d+", token) else float(token)
    except ValueError:
        fail(f"bad operand {token!r}")


def _parse_extended(text: str) -> Program:
    if not text.endswith("\n"):
        raise ValueError("the last line has no '\\n'")
    inputs, insts, outputs = [], [], []
    for number, line in enumerate(text[:-1].split("\n"), start=1):
        def fail(reason, line=line, number=number):
            raise ValueError(f"line {number}: {reason}: {line!r}")

        if m := _INPUT.fullmatch(line):
            if int(m[1]) != len(inputs) or insts or outputs:
                fail("inputs are numbered from 0 and come first")
            if m[2] not in DTYPE_BYTES:
                fail(f"unknown dtype {m[2]!r}")
            shape = _dims(m[3], fail)
            view = _dims(m[5], fail) if m[4] else shape
            inputs.append(Input(m[2], shape, view))
        elif m := _INST.fullmatch(line):
            if int(m[1]) != len(insts) or outputs:
                fail("instructions are numbered from 0 and come before the outputs")
            tokens = m[3].split(" ")
            operands, attrs = [], {}
            for token in tokens:
                if "=" in token:
                    key, _, value = token.partition("=")
                    attrs[key] = value
                    continue
                token = token.rstrip(",")
                if r := _REF.fullmatch(token):
                    ref = Ref(r[1], int(r[2]))
                    limit = len(inputs) if ref.kind == "in" else len(insts)
                    if ref.index >= limit:
                        fail(f"{ref} is not defined above")
                    operands.append(ref)
                else:
                    operands.append(_literal(token, fail))
            insts.append(_typed(m[2], tuple(operands), attrs, inputs, insts, fail))
        elif m := _OUTPUT.fullmatch(line):
            if int(m[1]) != len(outputs):
                fail("outputs are numbered from 0")
            r = _REF.fullmatch(m[2])
            ref = Ref(r[1], int(r[2]))
            if ref.index >= (len(inputs) if ref.kind == "in" else len(insts)):
                fail(f"{ref} is not defined above")
            outputs.append(Output(ref, _dims(m[4], fail) if m[3] else None))
        else:
            fail("not an input, an instruction or an output")
    if not inputs or not insts or not outputs:
        raise ValueError("a program needs inputs, instructions and outputs")
    return Program(text, tuple(inputs), tuple(insts), tuple(outputs))


def _typed(op, operands, attrs, inputs, insts, fail) -> Inst:
    refs = [o for o in operands if isinstance(o, Ref)]
    if not refs:
        fail("needs at least one operand that is a value")

    def dtype_of(r):
        return inputs[r.index].dtype if r.kind == "in" else insts[r.index].dtype

    def reduced_of(r):
        if r.kind == "%":
            return insts[r.index].reduced
        return False

    operand_dtype = dtype_of(refs[-1])
    if op == "Cast":
        dtype = attrs.get("to")
        if dtype not in DTYPE_BYTES:
            fail("Cast needs to=DTYPE")
    elif op in _BOOL_RESULT:
        dtype = "bool"
    else:
        dtype = operand_dtype
    reduced = op in REDUCTIONS or (bool(refs) and all(reduced_of(r) for r in refs))
    return Inst(op, operands, attrs, dtype, operand_dtype, reduced)
