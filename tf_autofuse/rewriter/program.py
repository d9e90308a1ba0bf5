"""The fused program (docs/PROGRAM.md): data structure, printer and parser.

`parse(str(p)) == p` and `str(parse(t)) == t`: the parser reads each line, prints what it
read and refuses the line when the two differ, so only the canonical spelling is accepted.
Both the parser and the constructor check the program (numbering, references, arity, dtypes)
and raise ValueError naming the line.
"""

from __future__ import annotations

import dataclasses
import functools
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
    "bool": types_pb2.DT_BOOL,
}
FLOAT_NAMES = ("f16", "bf16", "f32", "f64")
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


Operand = Union[Ref, bool, int, float]  # bool / int / float: an immediate


def shape_text(shape: Optional[tuple]) -> str:
    """[4,?,3]; [*] for an unknown rank; [] for a scalar."""
    if shape is None:
        return "[*]"
    return "[" + ",".join("?" if d < 0 else str(d) for d in shape) + "]"


@dataclasses.dataclass(frozen=True)
class InputDecl:
    dtype: str  # "f16", ...
    shape: Optional[tuple]  # sizes, -1 unknown; None unknown rank
    view: Optional[tuple] = None  # `-> [view]`: the shape the program reads the tensor as

    def text(self, index: int) -> str:
        view = "" if self.view is None else " -> " + shape_text(self.view)
        return f"in{index}: {self.dtype}{shape_text(self.shape)}{view}"


@dataclasses.dataclass(frozen=True)
class Instruction:
    op: str
    operands: tuple  # of Operand
    attrs: tuple = ()  # of (key, value text): axes=[1,2], to=f32, alpha=0.2
    # computed once a run over the small shape its inputs are read as, not once an element of
    # the iteration shape (docs/PROGRAM.md, Invariants; passes.hoist decides)
    invariant: bool = False

    def text(self, index: int) -> str:
        operands = ", ".join(_operand_text(o) for o in self.operands)
        attrs = "".join(f" {key}={value}" for key, value in self.attrs)
        return f"%{index} = {self.op} {operands}{attrs}{INVARIANT_MARK if self.invariant else ''}"


INVARIANT_MARK = " invariant"


@dataclasses.dataclass(frozen=True)
class FusedProgram:
    inputs: tuple  # of InputDecl
    instructions: tuple  # of Instruction
    outputs: tuple  # of Ref
    output_views: tuple = ()  # per output: None, or the `-> [shape]` it is stored as

    def __post_init__(self):
        for name in ("inputs", "instructions", "outputs", "output_views"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.output_views:
            object.__setattr__(self, "output_views", (None,) * len(self.outputs))
        # checked once; the check derives the value dtypes and which values are reduced
        dtypes, reduced, reduced_inputs = _check(self)
        object.__setattr__(self, "_value_dtypes", tuple(dtypes))
        object.__setattr__(self, "_reduced", tuple(reduced))
        object.__setattr__(self, "_reduced_inputs", reduced_inputs)

    def lines(self) -> list[str]:
        return (
            [decl.text(i) for i, decl in enumerate(self.inputs)]
            + [inst.text(i) for i, inst in enumerate(self.instructions)]
            + [_output_text(i, ref, view)
               for i, (ref, view) in enumerate(zip(self.outputs, self.output_views))]
        )

    def reduce_axes(self) -> Optional[tuple]:
        """The axes of the program's reductions, or None when it has none."""
        for inst in self.instructions:
            if catalog.for_ir_name(inst.op).kind == catalog.REDUCE:
                return parse_axes(dict(inst.attrs)["axes"])
        return None

    @functools.cached_property  # rendered once: the rewriter needs it for the Fusion and the node
    def _text(self) -> str:
        return "".join(line + "\n" for line in self.lines())

    def print(self) -> str:
        """The program text: one statement a line, each line ended by '\\n'."""
        return self._text

    __str__ = print

    def value_dtypes(self) -> list[str]:
        """The dtype of each instruction's result, in order."""
        return list(self._value_dtypes)

    def is_reduced(self, ref: Ref) -> bool:
        """Whether a value is reduced (a reduction, or computed from reduced values and
        immediates only) or an input is read as one (1 along every reduced axis): it has the
        reduced shape (docs/PROGRAM.md, Reductions)."""
        return (self._reduced_inputs if ref.kind == "in" else self._reduced)[ref.index]

    def output_dtypes(self) -> list[str]:
        return [self.ref_dtype(r) for r in self.outputs]

    def ref_dtype(self, ref: Ref) -> str:
        """The dtype of an input or a value."""
        return self.inputs[ref.index].dtype if ref.kind == "in" else self._value_dtypes[ref.index]

    def operand_dtype(self, index: int) -> str:
        """The dtype instruction `index` computes in: that of its data operands (Select: x and
        y; its last Ref always is one, immediates taking the dtype of the values)."""
        refs = [o for o in self.instructions[index].operands if isinstance(o, Ref)]
        return self.ref_dtype(refs[-1])

    def read_shape(self, index: int) -> Optional[tuple]:
        """The shape input `index` is read as: its view, else its tensor shape."""
        decl = self.inputs[index]
        return decl.view if decl.view is not None else decl.shape

    @staticmethod
    def parse(text: str) -> "FusedProgram":
        return parse(text)


def _output_text(index: int, ref, view) -> str:
    return f"out{index} = {ref}" + ("" if view is None else " -> " + shape_text(view))


def _operand_text(operand: Operand) -> str:
    if isinstance(operand, Ref):
        return str(operand)
    if isinstance(operand, bool):
        return "true" if operand else "false"
    return repr(operand)


def literal_text(value) -> str:
    """A LITERAL as the grammar prints it."""
    return _operand_text(value)


def axes_text(axes) -> str:
    return "[" + ",".join(str(a) for a in axes) + "]"


def parse_axes(text: str) -> tuple:
    """'[1,2]' -> (1, 2); ValueError unless non-negative, increasing and consecutive."""
    if not re.fullmatch(r"\[\d+(,\d+)*\]", text):
        raise ValueError(f"axes must be written [a,b,...], got {text!r}")
    axes = tuple(int(a) for a in text[1:-1].split(","))
    if axes_text(axes) != text:
        raise ValueError(f"axes {text!r} not written as the grammar prints them")
    if any(b != a + 1 for a, b in zip(axes, axes[1:])):
        raise ValueError(f"axes {text} are not increasing and consecutive")
    return axes


def _check_view(view, what: str, fail):
    if view is None:
        return
    if any(not isinstance(d, int) or d < -1 for d in view):
        fail(f"{what}: sizes are integers >= 0, or -1 for unknown")
    if sum(1 for d in view if d < 0) > 1:
        fail(f"{what}: a view has at most one '?'")


# --- checking --------------------------------------------------------------------------------


def _check(program: FusedProgram) -> tuple:
    """Raise ValueError naming the line of the first fault (docs/PROGRAM.md: the rules
    cc/program.cc checks too); return what the check derives: each value's dtype and whether it
    is reduced, and whether each input is read as a reduced value."""
    n_in, n_inst = len(program.inputs), len(program.instructions)

    def fail(line_index: int, reason: str):
        lines = program.lines()  # only for the message: rendering every program costs
        raise ValueError(f"line {line_index + 1}: {reason}: {lines[line_index]!r}")

    if not program.inputs or not program.instructions or not program.outputs:
        raise ValueError("a program needs at least one input, one instruction and one output")
    if len(program.output_views) != len(program.outputs):
        raise ValueError("one output view (or None) per output")
    for i, decl in enumerate(program.inputs):
        if decl.dtype not in DTYPES:
            fail(i, f"unknown dtype {decl.dtype!r}")
        if decl.shape is not None and any(not isinstance(d, int) or d < -1 for d in decl.shape):
            fail(i, "sizes are integers >= 0, or -1 for unknown")
        _check_view(decl.view, "view", lambda r, i=i: fail(i, r))
        known = catalog.fully_known(decl.shape) and catalog.fully_known(decl.view)
        if decl.view is not None and known and math.prod(decl.view) != math.prod(decl.shape):
            fail(i, f"the view {shape_text(decl.view)} has {math.prod(decl.view)} elements but "
                    f"the tensor {shape_text(decl.shape)} has {math.prod(decl.shape)}")
    _check_views_broadcast(program)
    axes_seen = None
    for i, inst in enumerate(program.instructions):
        spec = catalog.for_ir_name(inst.op)
        if spec is not None and spec.kind == catalog.REDUCE:
            value = dict(inst.attrs).get("axes")
            if value is None:
                fail(n_in + i, f"{inst.op} needs axes=[...]")
            try:
                axes = parse_axes(value)
            except ValueError as err:
                fail(n_in + i, str(err))
            if axes_seen is not None and axes != axes_seen:
                fail(n_in + i, "every reduction of a program reduces the same axes")
            axes_seen = axes

    reduced_inputs = _reduced_inputs(program, axes_seen, fail)

    value_dtypes: list[str] = []
    reduced: list[bool] = []
    for i, inst in enumerate(program.instructions):
        line = n_in + i
        # What the instruction's own checks read of the program: each operand's dtype and
        # whether it is reduced (a Ref), or its value (an immediate).
        operands = []
        for operand in inst.operands:
            if isinstance(operand, Ref):
                if operand.kind == "in" and 0 <= operand.index < n_in:
                    operands.append(ref_operand(program.inputs[operand.index].dtype, "in",
                                                reduced_inputs[operand.index]))
                elif operand.kind == "%" and 0 <= operand.index < len(value_dtypes):
                    operands.append(ref_operand(value_dtypes[operand.index], "%",
                                                reduced[operand.index]))
                else:
                    operands.append((_UNDEFINED, str(operand)))
            else:
                operands.append(immediate_operand(operand))
        outcome = instruction_outcome(inst.op, inst.attrs, tuple(operands), axes_seen is not None)
        if isinstance(outcome, str):
            fail(line, outcome)
        result, is_reduced = outcome
        value_dtypes.append(result)
        reduced.append(is_reduced)
    _check_invariants(program, value_dtypes, axes_seen is not None, fail)
    for i, ref in enumerate(program.outputs):
        line = n_in + n_inst + i
        if not isinstance(ref, Ref):
            fail(line, "an output names a value")
        _ref_dtype(ref, program, value_dtypes, lambda r: fail(line, r))
        if ref.kind == "%" and program.instructions[ref.index].invariant:
            fail(line, "an output names no invariant value")
        _check_view(program.output_views[i], "output view", lambda r, l=line: fail(l, r))
    return value_dtypes, reduced, reduced_inputs


def _check_views_broadcast(program: FusedProgram) -> None:
    """The input views broadcast (right-aligned, a known 1 stretches) as far as they are known;
    ValueError naming the two inputs otherwise."""
    merged: list = []  # right-aligned: merged[0] is the last dimension
    source: list = []  # which input set merged[i]
    for k in range(len(program.inputs)):
        shape = program.read_shape(k)
        for i, d in enumerate(reversed(shape or ())):
            if i >= len(merged):
                merged.append(d)
                source.append(k)
            elif d >= 0 and d != 1:
                if merged[i] >= 0 and merged[i] != 1 and merged[i] != d:
                    a = source[i]
                    raise ValueError(
                        f"the shapes of in{a}: {program.inputs[a].text(a)[len(f'in{a}: '):]} and "
                        f"in{k}: {program.inputs[k].text(k)[len(f'in{k}: '):]} do not broadcast "
                        f"(dimension {-1 - i}: {merged[i]} vs {d})")
                merged[i], source[i] = d, k


def _reduced_inputs(program: FusedProgram, axes: Optional[tuple], fail) -> tuple:
    """Per input, whether it is read as a reduced value: 1 along every reduced axis of the
    iteration shape (numpy's right alignment). A program with reductions needs inputs of known
    rank and axes within the iteration rank."""
    if axes is None:
        return (False,) * len(program.inputs)
    shapes = [program.read_shape(k) for k in range(len(program.inputs))]
    for k, shape in enumerate(shapes):
        if shape is None:
            fail(k, "a program with reductions needs inputs of known rank (or a view)")
    rank = max(len(shape) for shape in shapes)
    for i, inst in enumerate(program.instructions):
        if catalog.for_ir_name(inst.op) is not None and \
                catalog.for_ir_name(inst.op).kind == catalog.REDUCE and axes[-1] >= rank:
            fail(len(shapes) + i, f"axis {axes[-1]} is out of range for rank {rank} (the rank "
                                  "of the iteration shape)")
    return tuple(all(((1,) * (rank - len(shape)) + tuple(shape))[a] == 1 for a in axes)
                 for shape in shapes)


def _check_invariants(program: FusedProgram, value_dtypes: list, reducing: bool, fail) -> None:
    """The rules of invariant instructions (docs/PROGRAM.md, Invariants): what makes computing
    them once a run, over the one shape S their inputs are read as, give the same bits."""
    n_in = len(program.inputs)
    small = None  # S
    for i, inst in enumerate(program.instructions):
        if not inst.invariant:
            continue
        if reducing:
            fail(n_in + i, "a program with reductions has no invariant instruction")
        if value_dtypes[i] in ("f16", "bf16"):
            fail(n_in + i, "an invariant value is not 16-bit (computed apart, it would be "
                           "rounded where the program keeps fp32)")
        for operand in inst.operands:
            if not isinstance(operand, Ref):
                continue
            if operand.kind == "%":
                if not program.instructions[operand.index].invariant:
                    fail(n_in + i, f"an invariant instruction reads {operand}, which is not")
                continue
            read = program.read_shape(operand.index)
            if not (catalog.fully_known(program.inputs[operand.index].shape)
                    and catalog.fully_known(read)):
                fail(n_in + i, f"an invariant instruction reads {operand}, whose shape is not "
                               "fully known")
            if small is None:
                small = read
            elif read != small:
                fail(n_in + i, f"an invariant instruction reads {operand} as {shape_text(read)}, "
                               f"others read inputs as {shape_text(small)}")


# operand descriptions of _check (else: an immediate)
_OPERAND_REF, _UNDEFINED = "ref", "undefined"


def ref_operand(dtype: str, kind: str, reduced: bool) -> tuple:
    """_check's description of a Ref operand: kind "in" or "%", its dtype, reduced or not."""
    return (_OPERAND_REF, dtype, kind, reduced)


def immediate_operand(value) -> tuple:
    """_check's description of an immediate operand."""
    return (type(value), value, repr(value))


def instruction_outcome(op: str, attrs: tuple, operands: tuple, reducing: bool):
    """_check of one instruction from its operands' descriptions (ref_operand,
    immediate_operand) and whether the program reduces: (result dtype, reduced) or the reason
    of its first fault. lower.check asks it of a member's instructions alone."""
    spec = catalog.for_ir_name(op)
    if spec is None:
        return f"unknown op {op!r}"
    if len(operands) != spec.arity:
        return f"{op} takes {spec.arity} operand(s), has {len(operands)}"
    return _instruction_outcome(op, attrs, operands, reducing)


def _instruction_outcome(op: str, attrs: tuple, operands: tuple, reducing: bool):
    """The checks of one instruction of a known op and arity, from its operands' descriptions
    (_check): (result dtype, reduced) or the reason of the first fault. The partitioner checks
    the same instructions in every trial program, so outcomes are memoised."""
    try:
        return _cached_outcome(op, attrs, operands, reducing)
    except TypeError:  # an unhashable operand (not an immediate): its fault is found uncached
        return _outcome(op, attrs, operands, reducing)


def _outcome(op: str, attrs: tuple, operands: tuple, reducing: bool):
    spec = catalog.for_ir_name(op)
    roles = spec.operand_roles()
    dtypes = set()
    has_value = False
    for role, operand in zip(roles, operands):
        if operand[0] == _UNDEFINED:
            return f"{operand[1]} is not defined above"
        if operand[0] == _OPERAND_REF:
            has_value = True
            dtype = operand[1]
            if role == "bool" and dtype != "bool":
                return f"{op} needs a bool operand, got {dtype}"
            if role == "data":
                dtypes.add(dtype)
            continue
        value = operand[1]
        if isinstance(value, bool):
            if role != "bool" and not (role == "data" and types_pb2.DT_BOOL in spec.dtypes):
                return f"bad operand {_operand_text(value)} (bool immediate)"
        elif not isinstance(value, (int, float)):
            return f"bad operand {operand[2]}"
        elif role == "bool":
            return f"{op} needs a bool operand, got {operand[2]}"
        elif isinstance(value, float) and not math.isfinite(value):
            return "immediates must be finite"
    if not has_value:
        return "needs at least one operand that is a value"
    if not dtypes:
        return f"{op} needs a value operand for its dtype"
    if len(dtypes) > 1:
        return f"operands of different dtypes {sorted(dtypes)}"
    dtype = dtypes.pop()
    if DTYPES[dtype] not in spec.dtypes:
        return f"{op} does not take {dtype}"
    data = [o for role, o in zip(roles, operands) if role == "data"]
    immediates = [o[1] for o in data if o[0] != _OPERAND_REF]
    if dtype == "i32" and any(isinstance(v, float) for v in immediates):
        return "an i32 instruction takes integer immediates only"
    if dtype == "i32" and any(not -2**31 <= v < 2**31 for v in immediates):
        return "an i32 immediate is out of the int32 range"
    if dtype != "bool" and any(isinstance(v, bool) for v in immediates):
        return "a bool immediate needs a bool instruction"
    if dtype == "bool" and any(not isinstance(v, bool) for v in immediates):
        return "a bool instruction takes true / false immediates only"
    keys = [key for key, _ in attrs]
    for key, value in attrs:
        if not _ATTR_KEY.fullmatch(key) or not value or " " in value:
            return f"bad attr {key}={value}"
        if key not in spec.attrs:
            return f"{op} takes no attr {key!r}"
    if len(set(keys)) != len(keys):
        return "an attr is given twice"
    for key in spec.attrs:
        if key not in keys:
            return f"{op} needs attr {key}="
    values = dict(attrs)
    result = dtype
    if spec.result == "bool":
        result = "bool"
    elif spec.result == "to":
        if values["to"] not in FLOAT_NAMES:
            return f"to= takes one of {', '.join(FLOAT_NAMES)}"
        result = values["to"]
    if "alpha" in values:
        token = values["alpha"]
        if not _NUMBER.fullmatch(token) or _operand_text(_number(token)) != token:
            return f"alpha={token} is not a LITERAL"
    is_reduced = False
    if spec.kind == catalog.REDUCE:
        first = operands[0]
        if first[0] == _OPERAND_REF and first[2] == "%" and first[3]:
            return "the operand of a reduction is a full value"
        is_reduced = True
    elif reducing:
        is_reduced = all(o[0] != _OPERAND_REF or o[3] for o in operands)
    return result, is_reduced


_cached_outcome = functools.lru_cache(maxsize=4096)(_outcome)


def _number(token: str):
    return int(token) if token.lstrip("-").isdigit() else float(token)


def _ref_dtype(ref: Ref, program: FusedProgram, value_dtypes: list[str], fail) -> str:
    if ref.kind == "in" and 0 <= ref.index < len(program.inputs):
        return program.inputs[ref.index].dtype
    if ref.kind == "%" and 0 <= ref.index < len(value_dtypes):
        return value_dtypes[ref.index]
    fail(f"{ref} is not defined above")


# --- parsing ---------------------------------------------------------------------------------

_INPUT = re.compile(r"in(\d+): ([a-z0-9]+)\[([^\]]*)\](?: -> \[([^\]]*)\])?")
_INSTRUCTION = re.compile(r"%(\d+) = ([A-Za-z][A-Za-z0-9_]*) (.+)")
_OUTPUT = re.compile(r"out(\d+) = ([^ ]+)(?: -> \[([^\]]*)\])?")
_REF = re.compile(r"(in|%)(\d+)")
_NUMBER = re.compile(r"-?\d+(\.\d+)?(e[+-]\d+)?")
_ATTR_KEY = re.compile(r"[a-z_][a-z0-9_]*")


def parse(text: str) -> FusedProgram:
    """Read program text; ValueError naming the line for anything not in the grammar.

    It refuses what cc/program.cc refuses, naming the same line (tests/test_program.py holds
    the two to one table), and also any spelling other than the one the printer gives (a
    missing final '\\n', `0.50` for `0.5`, `[1, 2]` for `[1,2]`), which the kernel reads."""
    if not isinstance(text, str):
        raise ValueError("program text must be str")
    if not text:
        raise ValueError("the program text is empty")
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
        if kind > 0 and not sections[kind - 1]:
            fail(f"{('an instruction', 'an output')[kind - 1]} before any "
                 f"{('input', 'instruction')[kind - 1]}")
        section = kind
        if index != expected:
            fail(f"numbered {index}, expected {expected}")
        text_back = item.text(index) if kind < 2 else _output_text(index, *item)
        if text_back != line:
            fail(f"not written as the grammar prints it (expected {text_back!r})")
        sections[kind].append(item)
    if not sections[2]:
        raise ValueError(f"line {len(lines)}: the program has no output")
    outputs = [ref for ref, _ in sections[2]]
    views = [view for _, view in sections[2]]
    return FusedProgram(sections[0], sections[1], outputs, views)


def _parse_input(line: str, fail):
    match = _INPUT.fullmatch(line)
    if not match:
        fail("expected 'inK: DTYPE[dims]'")
    index, dtype, dims = int(match[1]), match[2], match[3]
    if dtype not in DTYPES:
        fail(f"unknown dtype {dtype!r}")
    shape = _parse_dims(dims, fail)
    view = None
    if match[4] is not None:
        view = _parse_dims(match[4], fail)
        if view is None:
            fail("a view has no '*'")
    return index, InputDecl(dtype, shape, view)


def _parse_dims(dims: str, fail):
    if dims == "*":
        return None
    if dims == "":
        return ()
    shape = []
    for dim in dims.split(","):
        if dim == "?":
            shape.append(-1)
        elif dim.isdigit():
            shape.append(int(dim))
        else:
            fail(f"bad dimension {dim!r}")
    return tuple(shape)


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
    invariant = tokens[-1] == INVARIANT_MARK.strip() and position < len(tokens)
    for token in tokens[position:len(tokens) - invariant]:
        key, sep, value = token.partition("=")
        if not sep:
            fail(f"expected an attr KEY=VALUE, got {token!r}")
        attrs.append((key, value))
    return index, Instruction(op, tuple(operands), tuple(attrs), invariant)


def _parse_operand(token: str, fail) -> Operand:
    match = _REF.fullmatch(token)
    if match:
        return Ref(match[1], int(match[2]))
    if token in ("true", "false"):
        return token == "true"
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
    view = None
    if match[3] is not None:
        view = _parse_dims(match[3], fail)
        if view is None:
            fail("a view has no '*'")
    return int(match[1]), (Ref(ref[1], int(ref[2])), view)
