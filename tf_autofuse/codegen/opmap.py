"""IR op -> Ascend C: the codegen's own table, keyed by the IR op name of docs/PROGRAM.md.

Each entry emits the vector instructions of one IR instruction, given the C++ compute type T
("float", "half" or "int32_t"), the destination tensor, the source tensors, the element count
and scratch tensors of the same size. The generator puts `PipeBarrier<PIPE_V>()` between every
two instructions, owns the buffers, and turns immediates into `Duplicate`d tensors.

An op absent from the table, or present without the compute type, cannot be generated: the
group keeps to the CPU path and `refusal()` says why. Nothing is approximated silently; the
compositions below and their precision are listed in docs/ASCEND.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

FLOAT = frozenset({"float"})
FLOAT_HALF = frozenset({"float", "half"})
ARITH = frozenset({"float", "half", "int32_t"})

_SELU_SCALE = 1.0507009873554805
_SELU_ALPHA = 1.6732632423543772


def lit(ctype: str, value) -> str:
    """A C++ scalar of type `ctype`."""
    if ctype == "int32_t":
        return f"(int32_t)({int(value)})"
    text = repr(float(value))
    if "e" not in text and "." not in text and "inf" not in text:
        text += ".0"
    return f"({ctype})({text}f)"


@dataclasses.dataclass(frozen=True)
class Mapping:
    op: str
    types: frozenset  # compute types it can be generated for
    temps: object  # scratch tensors it needs: an int, or T -> int
    emit: Callable  # (T, dst, srcs, n, tmps) -> list of statements
    apis: tuple  # Ascend C APIs it uses (docs)


_TABLE: dict = {}
_REFUSED: dict = {}


def _add(op, types, temps, apis, emit):
    _TABLE[op] = Mapping(op, frozenset(types), temps, emit, tuple(apis))


def _refuse(op, reason):
    _REFUSED[op] = reason


# ---- unary ------------------------------------------------------------------------------------
# i32 |x| = max(x, -x): the vector Abs takes half/float only.
_add("Abs", ARITH, 0, ["Abs", "Muls", "Max"],
     lambda T, d, s, n, t: ([f"Muls({d}, {s[0]}, {lit(T, -1)}, {n});", f"Max({d}, {s[0]}, {d}, {n});"]
                            if T == "int32_t" else [f"Abs({d}, {s[0]}, {n});"]))
_add("Neg", ARITH, 0, ["Muls"], lambda T, d, s, n, t: [f"Muls({d}, {s[0]}, {lit(T, -1)}, {n});"])
_add("Relu", ARITH, 0, ["Relu", "Maxs"], lambda T, d, s, n, t: (
    [f"Maxs({d}, {s[0]}, {lit(T, 0)}, {n});"] if T == "int32_t" else [f"Relu({d}, {s[0]}, {n});"]))
_add("Relu6", ARITH, 0, ["Maxs", "Mins"], lambda T, d, s, n, t: [
    f"Maxs({d}, {s[0]}, {lit(T, 0)}, {n});", f"Mins({d}, {d}, {lit(T, 6)}, {n});"])
_add("LeakyRelu", FLOAT_HALF, 0, ["LeakyRelu"], lambda T, d, s, n, t, alpha=0.2: [
    f"LeakyRelu({d}, {s[0]}, {lit(T, alpha)}, {n});"])


def _elu_like(neg_scale, pos_scale):
    # x < 0 ? neg_scale * (e^x - 1) : pos_scale * x  ==  pos_scale*max(x,0) + neg_scale*(e^min(x,0) - 1)
    def emit(T, d, s, n, t):
        out = [f"Mins({t[0]}, {s[0]}, {lit(T, 0)}, {n});", f"Exp({t[0]}, {t[0]}, {n});",
               f"Adds({t[0]}, {t[0]}, {lit(T, -1)}, {n});"]
        if neg_scale != 1:
            out.append(f"Muls({t[0]}, {t[0]}, {lit(T, neg_scale)}, {n});")
        out.append(f"Relu({d}, {s[0]}, {n});")
        if pos_scale != 1:
            out.append(f"Muls({d}, {d}, {lit(T, pos_scale)}, {n});")
        out.append(f"Add({d}, {d}, {t[0]}, {n});")
        return out
    return emit


_add("Elu", FLOAT_HALF, 1, ["Mins", "Exp", "Adds", "Relu", "Add"], _elu_like(1, 1))
_add("Selu", FLOAT_HALF, 1, ["Mins", "Exp", "Adds", "Muls", "Relu", "Add"],
     _elu_like(_SELU_SCALE * _SELU_ALPHA, _SELU_SCALE))
_add("Exp", FLOAT_HALF, 0, ["Exp"], lambda T, d, s, n, t: [f"Exp({d}, {s[0]}, {n});"])
_add("Expm1", FLOAT_HALF, 0, ["Exp", "Adds"], lambda T, d, s, n, t: [
    f"Exp({d}, {s[0]}, {n});", f"Adds({d}, {d}, {lit(T, -1)}, {n});"])
_add("Log", FLOAT_HALF, 0, ["Ln"], lambda T, d, s, n, t: [f"Ln({d}, {s[0]}, {n});"])
_add("Log1p", FLOAT_HALF, 0, ["Adds", "Ln"], lambda T, d, s, n, t: [
    f"Adds({d}, {s[0]}, {lit(T, 1)}, {n});", f"Ln({d}, {d}, {n});"])
_add("Sqrt", FLOAT_HALF, 0, ["Sqrt"], lambda T, d, s, n, t: [f"Sqrt({d}, {s[0]}, {n});"])
# 1/x and 1/sqrt(x) as a true division: the vector Reciprocal/Rsqrt are not correctly rounded.
_add("Reciprocal", FLOAT_HALF, 0, ["Duplicate", "Div"], lambda T, d, s, n, t: [
    f"Duplicate({d}, {lit(T, 1)}, {n});", f"Div({d}, {d}, {s[0]}, {n});"])
_add("Rsqrt", FLOAT_HALF, 1, ["Sqrt", "Duplicate", "Div"], lambda T, d, s, n, t: [
    f"Sqrt({t[0]}, {s[0]}, {n});", f"Duplicate({d}, {lit(T, 1)}, {n});",
    f"Div({d}, {d}, {t[0]}, {n});"])
_add("Square", ARITH, 0, ["Mul"], lambda T, d, s, n, t: [f"Mul({d}, {s[0]}, {s[0]}, {n});"])
_add("Sigmoid", FLOAT_HALF, 1, ["Muls", "Exp", "Adds", "Duplicate", "Div"], lambda T, d, s, n, t: [
    f"Muls({t[0]}, {s[0]}, {lit(T, -1)}, {n});", f"Exp({t[0]}, {t[0]}, {n});",
    f"Adds({t[0]}, {t[0]}, {lit(T, 1)}, {n});", f"Duplicate({d}, {lit(T, 1)}, {n});",
    f"Div({d}, {d}, {t[0]}, {n});"])
# tanh x = 1 - 2 / (e^(2x) + 1): saturates correctly at both ends (e^(2x) = inf or 0).
_add("Tanh", FLOAT_HALF, 1, ["Muls", "Exp", "Adds", "Duplicate", "Div"], lambda T, d, s, n, t: [
    f"Muls({t[0]}, {s[0]}, {lit(T, 2)}, {n});", f"Exp({t[0]}, {t[0]}, {n});",
    f"Adds({t[0]}, {t[0]}, {lit(T, 1)}, {n});", f"Duplicate({d}, {lit(T, -2)}, {n});",
    f"Div({d}, {d}, {t[0]}, {n});", f"Adds({d}, {d}, {lit(T, 1)}, {n});"])
# softplus x = max(x, 0) + ln(1 + e^-|x|): never overflows.
_add("Softplus", FLOAT_HALF, 1, ["Abs", "Muls", "Exp", "Adds", "Ln", "Relu", "Add"],
     lambda T, d, s, n, t: [
         f"Abs({t[0]}, {s[0]}, {n});", f"Muls({t[0]}, {t[0]}, {lit(T, -1)}, {n});",
         f"Exp({t[0]}, {t[0]}, {n});", f"Adds({t[0]}, {t[0]}, {lit(T, 1)}, {n});",
         f"Ln({t[0]}, {t[0]}, {n});", f"Relu({d}, {s[0]}, {n});", f"Add({d}, {d}, {t[0]}, {n});"])
_add("Softsign", FLOAT_HALF, 1, ["Abs", "Adds", "Div"], lambda T, d, s, n, t: [
    f"Abs({t[0]}, {s[0]}, {n});", f"Adds({t[0]}, {t[0]}, {lit(T, 1)}, {n});",
    f"Div({d}, {s[0]}, {t[0]}, {n});"])


def _sign(T, d, s, n, t):
    if T == "int32_t":  # clamp to [-1, 1]
        return [f"Maxs({d}, {s[0]}, {lit(T, -1)}, {n});", f"Mins({d}, {d}, {lit(T, 1)}, {n});"]
    # scale every nonzero float past 1 in magnitude (2^100 * 2^100 lifts the smallest fp32
    # subnormal above 1, and overflows to +-inf at worst), then clamp: 0 stays 0.
    return [f"Muls({d}, {s[0]}, {lit(T, 2.0 ** 100)}, {n});",
            f"Muls({d}, {d}, {lit(T, 2.0 ** 100)}, {n});",
            f"Maxs({d}, {d}, {lit(T, -1)}, {n});", f"Mins({d}, {d}, {lit(T, 1)}, {n});"]


_add("Sign", frozenset({"float", "int32_t"}), 0, ["Muls", "Maxs", "Mins"], _sign)
# sinh, cosh from e^x and e^-x
_add("Sinh", FLOAT, 1, ["Exp", "Muls", "Sub"], lambda T, d, s, n, t: [
    f"Exp({d}, {s[0]}, {n});", f"Muls({t[0]}, {s[0]}, {lit(T, -1)}, {n});", f"Exp({t[0]}, {t[0]}, {n});",
    f"Sub({d}, {d}, {t[0]}, {n});", f"Muls({d}, {d}, {lit(T, 0.5)}, {n});"])
_add("Cosh", FLOAT, 1, ["Exp", "Muls", "Add"], lambda T, d, s, n, t: [
    f"Exp({d}, {s[0]}, {n});", f"Muls({t[0]}, {s[0]}, {lit(T, -1)}, {n});", f"Exp({t[0]}, {t[0]}, {n});",
    f"Add({d}, {d}, {t[0]}, {n});", f"Muls({d}, {d}, {lit(T, 0.5)}, {n});"])

# ---- binary -----------------------------------------------------------------------------------
for _op, _api, _types in (("Add", "Add", ARITH), ("Sub", "Sub", ARITH), ("Mul", "Mul", ARITH),
                          ("Div", "Div", FLOAT_HALF), ("Maximum", "Max", ARITH),
                          ("Minimum", "Min", ARITH)):
    _add(_op, _types, 0, [_api],
         lambda T, d, s, n, t, api=_api: [f"{api}({d}, {s[0]}, {s[1]}, {n});"])
_add("SquaredDifference", ARITH, 1, ["Sub", "Mul"], lambda T, d, s, n, t: [
    f"Sub({t[0]}, {s[0]}, {s[1]}, {n});", f"Mul({d}, {t[0]}, {t[0]}, {n});"])

# ---- not generated (yet) ----------------------------------------------------------------------
_NEEDS_SELECT = "produces or reads bool values (Compare masks as bytes), which are not generated yet"
_NEEDS_ADV = ("needs the advanced math library (%s) with a sized shared temp buffer, which the "
              "generator does not emit yet")

def _rounding(mode):
    # |x| < 2^23 ? float(int32 round(x)) : x  (larger floats, inf and NaN are already "integral"),
    # then x's sign bit: floor(-0.0) = -0.0, ceil(-0.5) = -0.0. Views are named (vector APIs take
    # the destination by non-const reference).
    def emit(T, d, s, n, t):
        x = s[0]
        return [f"Abs({t[0]}, {x}, {n});",
                f"Duplicate({t[2]}, {lit(T, 2.0 ** 23)}, {n});",
                f"{{ LocalTensor<uint8_t> m = {t[1]}.ReinterpretCast<uint8_t>(); "
                f"Compare(m, {t[0]}, {t[2]}, CMPMODE::LT, {n}); }}",
                f"{{ LocalTensor<int32_t> i = {t[0]}.ReinterpretCast<int32_t>(); "
                f"Cast(i, {x}, RoundMode::{mode}, {n}); }}",
                f"{{ LocalTensor<int32_t> i = {t[0]}.ReinterpretCast<int32_t>(); "
                f"Cast({t[2]}, i, RoundMode::CAST_NONE, {n}); }}",
                f"{{ LocalTensor<uint8_t> m = {t[1]}.ReinterpretCast<uint8_t>(); "
                f"Select({d}, m, {t[2]}, {x}, SELMODE::VSEL_TENSOR_TENSOR_MODE, {n}); }}",
                f"{{ LocalTensor<int32_t> i = {t[0]}.ReinterpretCast<int32_t>(); "
                f"Duplicate(i, (int32_t)(-2147483647 - 1), {n}); }}",
                f"{{ LocalTensor<uint16_t> b = {t[0]}.ReinterpretCast<uint16_t>(); "
                f"LocalTensor<uint16_t> xb = {x}.ReinterpretCast<uint16_t>(); And(b, xb, b, {n} * 2); }}",
                f"Abs({d}, {d}, {n});",
                f"{{ LocalTensor<uint16_t> b = {t[0]}.ReinterpretCast<uint16_t>(); "
                f"LocalTensor<uint16_t> db = {d}.ReinterpretCast<uint16_t>(); Or(db, db, b, {n} * 2); }}"]
    return emit


for _op, _mode in (("Floor", "CAST_FLOOR"), ("Ceil", "CAST_CEIL"), ("Round", "CAST_RINT")):
    _add(_op, FLOAT, 3, ["Abs", "Duplicate", "Compare", "Cast", "Select", "And", "Or"], _rounding(_mode))
for _op in ("FloorDiv", "FloorMod"):
    _refuse(_op, "not generated yet (it would be Div followed by Floor's Compare/Select composition)")
for _op in ("Greater", "GreaterEqual", "Less", "LessEqual", "Equal", "NotEqual", "Select",
            "IsNan", "IsInf", "IsFinite", "LogicalNot", "LogicalAnd", "LogicalOr"):
    _refuse(_op, _NEEDS_SELECT)
for _op, _api in (("Erf", "Erf"), ("Erfc", "Erfc"), ("Sin", "Sin"), ("Cos", "Cos"), ("Tan", "Tan"),
                  ("Atan", "Atan"), ("Pow", "Power")):
    _refuse(_op, _NEEDS_ADV % _api)
_refuse("Cast", "Cast between program dtypes is not generated yet")
_refuse("ZerosLike", "not generated yet (a Duplicate; bool outputs are not generated yet)")
_refuse("OnesLike", "not generated yet (a Duplicate; bool outputs are not generated yet)")


def temps_for(mapping: Mapping, ctype: str) -> int:
    return mapping.temps(ctype) if callable(mapping.temps) else mapping.temps


def lookup(op: str) -> Optional[Mapping]:
    return _TABLE.get(op)


def refusal(op: str, ctype: str) -> Optional[str]:
    """None when `op` can be generated in `ctype`, else the reason it cannot."""
    mapping = _TABLE.get(op)
    if mapping is None:
        return f"{op}: " + _REFUSED.get(op, "no Ascend C mapping")
    if ctype not in mapping.types:
        return f"{op}: no Ascend C mapping for {ctype} (has {', '.join(sorted(mapping.types))})"
    return None


def mapped_ops() -> list:
    return sorted(_TABLE)


def refused_ops() -> dict:
    return dict(_REFUSED)


def alpha_of(attrs: dict) -> float:
    value = float(attrs.get("alpha", 0.2))
    if not math.isfinite(value):
        raise ValueError("alpha must be finite")
    return value
