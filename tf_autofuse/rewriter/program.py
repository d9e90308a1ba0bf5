"""The fused program (docs/PROGRAM.md): data structure, printer and parser.

`parse(str(p)) == p` and `str(parse(t)) == t`: the parser reads each line, prints what it
read and refuses the line when the two differ, so only the canonical spelling is accepted.
Both the parser and the constructor check the program (numbering, references, arity, dtypes)
and raise ValueError naming the line.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import NamedTuple, Optional, Union

from tensorflow.core.framework import types_pb2

from . import catalog

# IR dtype names and their DataType enums.
DTYPES = {
    "f16": types_pb2.DT_HALF,
    "bf16": types_pb2.DT_BFLOAT16,
    "f32": types_pb2.DT_FLOAT,
    "f64": types_pb2.DT_DOUBLE,
    "i32": types_pb2.DT_INT32,
}
DTYPE_NAMES = {enum: name for name, enum in DTYPES.items()}


class Ref(NamedTuple):
    """A value of the program: an input (`in3`) or an instruction's result (`%2`)."""

    kind: str  # "in" or "%"
    index: int

    def __str__(self) -> str:
        return f"{self.kind}{self.index}"


def In(index: int) -> Ref:  # noqa: N802 - reads like the text
    return Ref("in", index)


def Val(index: int) -> Ref:  # noqa: N802
    return Ref("%", index)


Operand = Union[Ref, int, float]  # int / float: an immediate


@dataclasses.dataclass(frozen=True)
class InputDecl:
    dtype: str  # "f16", ...
    shape: Optional[tuple]  # sizes, -1 unknown; None unknown rank

    def text(self, index: int) -> str:
        if self.shape is None:
            dims = "*"
        else:
            dims = ",".join("?" if d < 0 else str(d) for d in self.shape)
        return f"in{index}: {self.dtype}[{dims}]"


@dataclasses.dataclass(frozen=True)
class Instruction:
    op: str
    operands: tuple  # of Operand
    attrs: tuple = ()  # of (key, value text); reserved for later ops

    def text(self, index: int) -> str:
        operands = ", ".join(_operand_text(o) for o in self.operands)
        attrs = "".join(f" {key}={value}" for key, value in self.attrs)
        return f"%{index} = {self.op} {operands}{attrs}"


@dataclasses.dataclass(frozen=True)
class FusedProgram:
    inputs: tuple  # of InputDecl
    instructions: tuple  # of Instruction
    outputs: tuple  # of Ref

    def __post_init__(self):
        for name in ("inputs", "instructions", "outputs"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        _check(self)

    def lines(self) -> list[str]:
        return (
            [decl.text(i) for i, decl in enumerate(self.inputs)]
            + [inst.text(i) for i, inst in enumerate(self.instructions)]
            + [f"out{i} = {ref}" for i, ref in enumerate(self.outputs)]
        )

    def print(self) -> str:
        """The program text: one statement a line, each line ended by '\\n'."""
        return "".join(line + "\n" for line in self.lines())

    __str__ = print

    def value_dtypes(self) -> list[str]:
        """The dtype of each instruction's result, in order."""
        return _check(self)

    def output_dtypes(self) -> list[str]:
        values = self.value_dtypes()
        return [self.inputs[r.index].dtype if r.kind == "in" else values[r.index] for r in self.outputs]

    @staticmethod
    def parse(text: str) -> "FusedProgram":
        return parse(text)


def _operand_text(operand: Operand) -> str:
    if isinstance(operand, Ref):
        return str(operand)
    return repr(operand)


# --- checking --------------------------------------------------------------------------------


def _check(program: FusedProgram) -> list[str]:
    """Raise ValueError naming the line of the first fault; return the value dtypes."""
    lines = program.lines()
    n_in, n_inst = len(program.inputs), len(program.instructions)

    def fail(line_index: int, reason: str):
        raise ValueError(f"line {line_index + 1}: {reason}: {lines[line_index]!r}")

    if not program.inputs or not program.instructions or not program.outputs:
        raise ValueError("a program needs at least one input, one instruction and one output")
    for i, decl in enumerate(program.inputs):
        if decl.dtype not in DTYPES:
            fail(i, f"unknown dtype {decl.dtype!r}")
        if decl.shape is not None and any(not isinstance(d, int) or d < -1 for d in decl.shape):
            fail(i, "sizes are integers >= 0, or -1 for unknown")
    value_dtypes: list[str] = []
    for i, inst in enumerate(program.instructions):
        line = n_in + i
        spec = catalog.for_ir_name(inst.op)
        if spec is None:
            fail(line, f"unknown op {inst.op!r}")
        if len(inst.operands) != spec.arity:
            fail(line, f"{inst.op} takes {spec.arity} operand(s), has {len(inst.operands)}")
        dtypes = set()
        for operand in inst.operands:
            if isinstance(operand, Ref):
                dtypes.add(_ref_dtype(operand, program, value_dtypes, lambda r: fail(line, r)))
            elif isinstance(operand, bool) or not isinstance(operand, (int, float)):
                fail(line, f"bad operand {operand!r}")
            elif isinstance(operand, float) and not math.isfinite(operand):
                fail(line, "immediates must be finite")
        if not dtypes:
            fail(line, "needs at least one operand that is a value")
        if len(dtypes) > 1:
            fail(line, f"operands of different dtypes {sorted(dtypes)}")
        dtype = dtypes.pop()
        if DTYPES[dtype] not in spec.dtypes:
            fail(line, f"{inst.op} does not take {dtype}")
        if dtype == "i32" and any(isinstance(o, float) for o in inst.operands):
            fail(line, "an i32 instruction takes integer immediates only")
        for key, value in inst.attrs:
            if not re.fullmatch(r"[a-z_][a-z0-9_]*", key) or not value or " " in value:
                fail(line, f"bad attr {key}={value}")
            if key not in spec.attrs:
                fail(line, f"{inst.op} takes no attr {key!r}")
        value_dtypes.append(dtype)
    for i, ref in enumerate(program.outputs):
        line = n_in + n_inst + i
        if not isinstance(ref, Ref):
            fail(line, "an output names a value")
        _ref_dtype(ref, program, value_dtypes, lambda r: fail(line, r))
    return value_dtypes


def _ref_dtype(ref: Ref, program: FusedProgram, value_dtypes: list[str], fail) -> str:
    if ref.kind == "in" and 0 <= ref.index < len(program.inputs):
        return program.inputs[ref.index].dtype
    if ref.kind == "%" and 0 <= ref.index < len(value_dtypes):
        return value_dtypes[ref.index]
    fail(f"{ref} is not defined above")


# --- parsing ---------------------------------------------------------------------------------

_INPUT = re.compile(r"in(\d+): ([a-z0-9]+)\[([^\]]*)\]")
_INSTRUCTION = re.compile(r"%(\d+) = ([A-Za-z][A-Za-z0-9_]*) (.+)")
_OUTPUT = re.compile(r"out(\d+) = (.+)")
_REF = re.compile(r"(in|%)(\d+)")
_NUMBER = re.compile(r"-?\d+(\.\d+)?(e[+-]\d+)?")


def parse(text: str) -> FusedProgram:
    """Read program text; ValueError naming the line for anything not in the grammar."""
    if not isinstance(text, str):
        raise ValueError("program text must be str")
    if not text:
        raise ValueError("line 1: empty program")
    lines = text.split("\n")
    if lines[-1] != "":
        raise ValueError(f"line {len(lines)}: the last line has no '\\n': {lines[-1]!r}")
    lines.pop()
    sections: list[list] = [[], [], []]  # inputs, instructions, outputs
    section = 0
    for number, line in enumerate(lines, start=1):

        def fail(reason: str, line=line, number=number):
            raise ValueError(f"line {number}: {reason}: {line!r}")

        if line.startswith("in"):
            kind, expected = 0, len(sections[0])
            index, item = _parse_input(line, fail)
        elif line.startswith("%"):
            kind, expected = 1, len(sections[1])
            index, item = _parse_instruction(line, fail)
        elif line.startswith("out"):
            kind, expected = 2, len(sections[2])
            index, item = _parse_output(line, fail)
        else:
            fail("not an input, an instruction or an output")
        if kind < section:
            fail("out of order: inputs, then instructions, then outputs")
        section = kind
        if index != expected:
            fail(f"numbered {index}, expected {expected}")
        text_back = (item.text(index) if kind < 2 else f"out{index} = {item}")
        if text_back != line:
            fail(f"not written as the grammar prints it (expected {text_back!r})")
        sections[kind].append(item)
    for items, what in zip(sections, ("input", "instruction", "output")):
        if not items:
            raise ValueError(f"line {len(lines) + 1}: the program has no {what}")
    return FusedProgram(*sections)


def _parse_input(line: str, fail):
    match = _INPUT.fullmatch(line)
    if not match:
        fail("expected 'inK: DTYPE[dims]'")
    index, dtype, dims = int(match[1]), match[2], match[3]
    if dtype not in DTYPES:
        fail(f"unknown dtype {dtype!r}")
    if dims == "*":
        shape = None
    elif dims == "":
        shape = ()
    else:
        shape = []
        for dim in dims.split(","):
            if dim == "?":
                shape.append(-1)
            elif dim.isdigit():
                shape.append(int(dim))
            else:
                fail(f"bad dimension {dim!r}")
        shape = tuple(shape)
    return index, InputDecl(dtype, shape)


def _parse_instruction(line: str, fail):
    match = _INSTRUCTION.fullmatch(line)
    if not match:
        fail("expected '%K = OP operand, ...'")
    index, op, rest = int(match[1]), match[2], match[3]
    tokens = rest.split(" ")
    operands, attrs = [], []
    position = 0
    while True:  # operands: every one but the last ends with ','
        token = tokens[position]
        more = token.endswith(",")
        operands.append(_parse_operand(token[:-1] if more else token, fail))
        position += 1
        if not more:
            break
        if position == len(tokens):
            fail("an operand is missing after ','")
    for token in tokens[position:]:
        key, sep, value = token.partition("=")
        if not sep:
            fail(f"expected an attr KEY=VALUE, got {token!r}")
        attrs.append((key, value))
    return index, Instruction(op, tuple(operands), tuple(attrs))


def _parse_operand(token: str, fail) -> Operand:
    match = _REF.fullmatch(token)
    if match:
        return Ref(match[1], int(match[2]))
    if _NUMBER.fullmatch(token):
        value = int(token) if token.lstrip("-").isdigit() else float(token)
        if repr(value) == token:
            return value
        fail(f"immediate {token!r} is not written as Python's repr prints it ({value!r})")
    fail(f"bad operand {token!r}")


def _parse_output(line: str, fail):
    match = _OUTPUT.fullmatch(line)
    if not match:
        fail("expected 'outK = %K' or 'outK = inK'")
    ref = _REF.fullmatch(match[2])
    if not ref:
        fail(f"an output names a value, got {match[2]!r}")
    return int(match[1]), Ref(ref[1], int(ref[2]))
