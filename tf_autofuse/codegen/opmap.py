"""IR op -> Ascend C: the one table of how each op of the catalog is lowered to Ascend C.

Keyed by the IR op name of docs/PROGRAM.md (rewriter/catalog.py declares the ops). Every catalog
op has an entry here: an element-wise lowering (`_add`), a reduction lowering (REDUCE_API /
FOLD_OP), or a stated refusal with its reason (`_refuse`). An op added to the catalog without
one is an import error naming it (`_check_complete`).

Each element-wise entry emits the vector instructions of one IR instruction, given the C++ compute type T
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
    # advanced math: the API's shared temp buffer, as (bytes per tile element, fixed extra bytes);
    # the generator reserves one such buffer (`sharedTmp`, LocalTensor<uint8_t>) and counts it in
    # the UB plan. None: no shared temp buffer.
    shared_tmp: Optional[tuple] = None
    # needs whole 256-byte repeats (Compare) or a tile-sized temp buffer: not generated on the one
    # lane of the reduce schedule's RowEnd.
    tile_only: bool = False


_TABLE: dict = {}
_REFUSED: dict = {}


def _add(op, types, temps, apis, emit, shared_tmp=None, tile_only=False):
    _TABLE[op] = Mapping(op, frozenset(types), temps, emit, tuple(apis), shared_tmp,
                         tile_only or shared_tmp is not None)


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
    _add(_op, FLOAT, 3, ["Abs", "Duplicate", "Compare", "Cast", "Select", "And", "Or"], _rounding(_mode),
         tile_only=True)

# ---- bool values, Cast, fills, FloorDiv, advanced math ------------------------------------------
# bool representation: 1 byte 0/1 in GM (uint8_t, TF's layout); in UB a bool value is a float 0.0 /
# 1.0 tile (ascendc.STORAGE["bool"] == "float"), so that LogicalAnd/Or/Not are Mul/Max/1-x and a
# condition is turned into a Compare mask only where Select needs one. Compare writes one bit per
# element and takes a count whose bytes are a multiple of 256 (tiles are padded to 128 elements).
I32_FLOAT = frozenset({"float", "int32_t"})


def _select01(d, t, n, negate=False):
    """d = mask bit (in t[0]) ? 1.0 : 0.0 (0.0 : 1.0 when negated); t[1] holds the ones."""
    hit, miss = (0, 1) if negate else (1, 0)
    return [f"Duplicate({d}, {lit('float', miss)}, {n});",
            f"{{ LocalTensor<float> o = {t[1]}.ReinterpretCast<float>(); "
            f"Duplicate(o, {lit('float', hit)}, {n}); }}",
            f"{{ LocalTensor<uint8_t> m = {t[0]}.ReinterpretCast<uint8_t>(); "
            f"LocalTensor<float> o = {t[1]}.ReinterpretCast<float>(); "
            f"Select({d}, m, o, {d}, SELMODE::VSEL_TENSOR_TENSOR_MODE, {n}); }}"]


def _compare(mode, negate=False):
    def emit(T, d, s, n, t):
        return [f"{{ LocalTensor<uint8_t> m = {t[0]}.ReinterpretCast<uint8_t>(); "
                f"Compare(m, {s[0]}, {s[1]}, CMPMODE::{mode}, {n}); }}"] + _select01(d, t, n, negate)
    return emit


# float compares: Compare takes half/float with every CMPMODE (f16/bf16 values are compared
# widened to fp32, which is exact). int32: the A2/A3 Compare takes int32 with CMPMODE::EQ only (and
# int32 through fp32 is inexact above 2^24), so the order comes from Max/Min and an EQ:
# x > y = !(max(x, y) == y), x >= y = max(x, y) == x, x < y = !(min(x, y) == y), x <= y = min(x, y) == x.
def _ordered(mode):
    api, other, negate = {"GT": ("Max", 1, True), "GE": ("Max", 0, False),
                          "LT": ("Min", 1, True), "LE": ("Min", 0, False)}[mode]

    def emit(T, d, s, n, t):
        if T != "int32_t":
            return _compare(mode)(T, d, s, n, t)
        return [f"{api}({t[2]}, {s[0]}, {s[1]}, {n});",
                f"{{ LocalTensor<uint8_t> m = {t[0]}.ReinterpretCast<uint8_t>(); "
                f"Compare(m, {t[2]}, {s[other]}, CMPMODE::EQ, {n}); }}"] + _select01(d, t, n, negate)
    return emit


for _op, _mode in (("Greater", "GT"), ("GreaterEqual", "GE"), ("Less", "LT"), ("LessEqual", "LE")):
    _add(_op, I32_FLOAT, lambda T: 3 if T == "int32_t" else 2,
         ["Compare", "Duplicate", "Select", "Max" if _mode[0] == "G" else "Min"], _ordered(_mode),
         tile_only=True)
_add("Equal", I32_FLOAT, 2, ["Compare", "Duplicate", "Select"], _compare("EQ"), tile_only=True)
# x != y is !(x == y) for int32 (no NE on int32); float NE is true for NaN, as TF's
_add("NotEqual", I32_FLOAT, 2, ["Compare", "Duplicate", "Select"],
     lambda T, d, s, n, t: (_compare("EQ", negate=True) if T == "int32_t" else _compare("NE"))(T, d, s, n, t),
     tile_only=True)


def _inf_into(view, n):
    return (f"{{ LocalTensor<int32_t> i = {view}.ReinterpretCast<int32_t>(); "
            f"Duplicate(i, (int32_t)(0x7f800000), {n}); }}")  # +inf, as bits


_add("IsNan", FLOAT, 2, ["Compare", "Duplicate", "Select"], lambda T, d, s, n, t: (
    [f"{{ LocalTensor<uint8_t> m = {t[0]}.ReinterpretCast<uint8_t>(); "
     f"Compare(m, {s[0]}, {s[0]}, CMPMODE::NE, {n}); }}"] + _select01(d, t, n)), tile_only=True)


def _vs_inf(mode):
    def emit(T, d, s, n, t):
        return [f"Abs({t[2]}, {s[0]}, {n});", _inf_into(t[1], n),
                f"{{ LocalTensor<uint8_t> m = {t[0]}.ReinterpretCast<uint8_t>(); "
                f"Compare(m, {t[2]}, {t[1]}, CMPMODE::{mode}, {n}); }}"] + _select01(d, t, n)
    return emit


_add("IsInf", FLOAT, 3, ["Abs", "Duplicate", "Compare", "Select"], _vs_inf("EQ"), tile_only=True)
_add("IsFinite", FLOAT, 3, ["Abs", "Duplicate", "Compare", "Select"], _vs_inf("LT"), tile_only=True)
_add("LogicalNot", FLOAT, 0, ["Muls", "Adds"], lambda T, d, s, n, t: [
    f"Muls({d}, {s[0]}, {lit(T, -1)}, {n});", f"Adds({d}, {d}, {lit(T, 1)}, {n});"])
_add("LogicalAnd", FLOAT, 0, ["Mul"], lambda T, d, s, n, t: [f"Mul({d}, {s[0]}, {s[1]}, {n});"])
_add("LogicalOr", FLOAT, 0, ["Max"], lambda T, d, s, n, t: [f"Max({d}, {s[0]}, {s[1]}, {n});"])


def _select(T, d, s, n, t):
    if T == "int32_t":  # y + c * (x - y) in wrapping int32 is exact for c in {0, 1}
        return [f"Cast({t[0]}, {s[0]}, RoundMode::CAST_RINT, {n});", f"Sub({t[1]}, {s[1]}, {s[2]}, {n});",
                f"Mul({t[1]}, {t[1]}, {t[0]}, {n});", f"Add({d}, {s[2]}, {t[1]}, {n});"]
    return [f"Duplicate({t[0]}, {lit(T, 0)}, {n});",
            f"{{ LocalTensor<uint8_t> m = {t[1]}.ReinterpretCast<uint8_t>(); "
            f"Compare(m, {s[0]}, {t[0]}, CMPMODE::NE, {n}); }}",
            f"{{ LocalTensor<uint8_t> m = {t[1]}.ReinterpretCast<uint8_t>(); "
            f"Select({d}, m, {s[1]}, {s[2]}, SELMODE::VSEL_TENSOR_TENSOR_MODE, {n}); }}"]


# the condition (operand 0) is a bool value: a float 0/1 tile
_add("Select", I32_FLOAT, 2, ["Duplicate", "Compare", "Select", "Cast", "Sub", "Mul", "Add"], _select,
     tile_only=True)
_add("ZerosLike", I32_FLOAT, 0, ["Duplicate"], lambda T, d, s, n, t: [f"Duplicate({d}, {lit(T, 0)}, {n});"])
_add("OnesLike", I32_FLOAT, 0, ["Duplicate"], lambda T, d, s, n, t: [f"Duplicate({d}, {lit(T, 1)}, {n});"])


def _cast(T, d, s, n, t, to="f32"):
    """Cast between float program dtypes, computed in fp32: to f16/bf16 rounds to nearest even
    (Cast down with CAST_RINT, back up with CAST_NONE), as TF's Cast does."""
    if to == "f32":
        return [f"Muls({d}, {s[0]}, {lit(T, 1)}, {n});"]  # keeps -0.0 and NaN
    narrow = {"f16": "half", "bf16": "bfloat16_t"}.get(to)
    if narrow is None:
        raise ValueError(f"Cast to {to} is not generated")
    return [f"{{ LocalTensor<{narrow}> h = {t[0]}.ReinterpretCast<{narrow}>(); "
            f"Cast(h, {s[0]}, RoundMode::CAST_RINT, {n}); }}",
            f"{{ LocalTensor<{narrow}> h = {t[0]}.ReinterpretCast<{narrow}>(); "
            f"Cast({d}, h, RoundMode::CAST_NONE, {n}); }}"]


_add("Cast", FLOAT, 1, ["Cast", "Muls"], _cast)
# TF's float FloorDiv is floor(x / y): a correctly rounded Div, then Floor's composition.
_add("FloorDiv", FLOAT, 4, ["Div", "Abs", "Duplicate", "Compare", "Cast", "Select", "And", "Or"],
     lambda T, d, s, n, t: [f"Div({t[3]}, {s[0]}, {s[1]}, {n});"]
     + _rounding("CAST_FLOOR")(T, d, [t[3]], n, t[:3]), tile_only=True)
# FloorMod, as TF's CPU kernel computes it: r = fmod(x, y) (glibc's exact remainder, x's sign),
# then r + y where r != 0 and r, y differ in sign. TF's CPU threads flush fp32 subnormals (DAZ,
# FTZ), which shows through: y with |y| < 2^-126 counts as 0 (NaN), a subnormal r counts as 0
# (returned as is, never moved to y's sign), r + y below 2^-126 is a zero of its sign. Also NaN
# for x = +-inf or a NaN; fmod(x, +-inf) = x. f16/bf16 are widened to fp32 first, exactly as TF
# does (fmod of narrow values is exact, r + y rounds as its half/bfloat16 add does) and rounded
# once on the store; f16 never meets the subnormal rules (its values are normal fp32).
# fmod(|x|, |y|) is a restoring division on the vector unit, exact at every step: from the top
# k down to 0, t = |y| * 2^k (exact: a scaling by powers of two <= 2^127, or +inf where it
# overflows) and r = r >= t ? r - t : r (t <= r < 2t, so r - t is exact by Sterbenz). The top k
# is bounded per tile: q = max over the tile of |x| / |y| (ReduceMax, read by the scalar unit
# after a V->S sync), and k starts at the smallest K with 2^K > q (one step more, as a margin):
# |x| < |y| * 2^K on every lane. At most 278 steps (|x| / |y| < 2^277 in fp32), one when |x| < |y|
# everywhere; each step is 4 vector instructions (5-6 when 2^k > 2^127).
_FP32_MIN_NORMAL = 2.0 ** -126


def _floormod(T, d, s, n, t):
    x, y = s
    r, b, w, mk, c = t[:5]

    def m(stmt):
        return f"{{ LocalTensor<uint8_t> m = {mk}.ReinterpretCast<uint8_t>(); {stmt} }}"

    def bits(stmt, *views):  # uint16 views of float tensors, named v0, v1, ...
        decl = " ".join(f"LocalTensor<uint16_t> v{i} = {v}.ReinterpretCast<uint16_t>();"
                        for i, v in enumerate(views))
        return f"{{ {decl} {stmt} }}"

    sel = "SELMODE::VSEL_TENSOR_TENSOR_MODE"
    loop = "\n    ".join([  # one statement: continuation lines indented as the body
        "{",
        "  SetFlag<HardEvent::V_S>(EVENT_ID0);",
        "  WaitFlag<HardEvent::V_S>(EVENT_ID0);",
        f"  const float fmQ = {c}.GetValue(0);  // max |x| / |y| over the tile, in [0, inf]",
        "  int32_t fmSteps = 1;  // k = fmSteps - 1 .. 0",
        "  for (float p = 1.0f; p <= fmQ && fmSteps < 278; p *= 2.0f) ++fmSteps;",
        "  float fmS1 = 1.0f, fmS2 = 1.0f, fmS3 = 1.0f;  // 2^k = fmS1 * fmS2 * fmS3, each <= 2^127",
        "  for (int32_t i = 1; i < fmSteps; ++i) {",
        "    if (fmS1 < 1e38f) fmS1 *= 2.0f; else if (fmS2 < 1e38f) fmS2 *= 2.0f; else fmS3 *= 2.0f;",
        "  }",
        f"  LocalTensor<uint8_t> fmM = {mk}.ReinterpretCast<uint8_t>();",
        "  for (int32_t k = 0; k < fmSteps; ++k) {",
        f"    Muls({w}, {b}, fmS1, {n});",
        f"    if (fmS2 > 1.0f) {{ PipeBarrier<PIPE_V>(); Muls({w}, {w}, fmS2, {n}); }}",
        f"    if (fmS3 > 1.0f) {{ PipeBarrier<PIPE_V>(); Muls({w}, {w}, fmS3, {n}); }}",
        "    PipeBarrier<PIPE_V>();",
        f"    Compare(fmM, {r}, {w}, CMPMODE::GE, {n});",
        "    PipeBarrier<PIPE_V>();",
        f"    Sub({w}, {r}, {w}, {n});",
        "    PipeBarrier<PIPE_V>();",
        f"    Select({r}, fmM, {w}, {r}, {sel}, {n});",
        "    PipeBarrier<PIPE_V>();",
        "    if (fmS3 > 1.0f) fmS3 *= 0.5f; else if (fmS2 > 1.0f) fmS2 *= 0.5f; else fmS1 *= 0.5f;",
        "  }",
        "}"])
    nan = (f"{{ LocalTensor<int32_t> i = {c}.ReinterpretCast<int32_t>(); "
           f"Duplicate(i, (int32_t)(0x7fc00000), {n}); }}")
    sign = (f"{{ LocalTensor<int32_t> i = {w}.ReinterpretCast<int32_t>(); "
            f"Duplicate(i, (int32_t)(-2147483647 - 1), {n}); }}")
    return [
        # a = |x| (0 where x is inf or NaN), b = |y| (1 where TF's result is NaN: |y| < 2^-126
        # or NaN): no NaN and no subnormal divisor in the loop
        f"Abs({r}, {x}, {n});", _inf_into(c, n), m(f"Compare(m, {r}, {c}, CMPMODE::LT, {n});"),
        f"Duplicate({c}, {lit(T, 0)}, {n});", m(f"Select({r}, m, {r}, {c}, {sel}, {n});"),
        f"Abs({b}, {y}, {n});", f"Duplicate({c}, {lit(T, _FP32_MIN_NORMAL)}, {n});",
        m(f"Compare(m, {b}, {c}, CMPMODE::GE, {n});"),
        f"Duplicate({c}, {lit(T, 1)}, {n});", m(f"Select({b}, m, {b}, {c}, {sel}, {n});"),
        f"Div({w}, {r}, {b}, {n});", f"ReduceMax({c}, {w}, {mk}, {n});",
        loop,  # r = fmod(a, b) >= +0
        # r gets x's sign; c = (+-1 with x's sign) * (+-1 with y's) * |r|: <= -2^-126 where r + y
        sign, bits(f"And(v0, v1, v2, {n} * 2);", d, x, w),
        f"Duplicate({c}, {lit(T, 1)}, {n});",
        bits(f"Or(v0, v0, v1, {n} * 2);", c, d), bits(f"Or(v0, v0, v1, {n} * 2);", r, d),
        bits(f"And(v0, v1, v2, {n} * 2);", d, y, w),
        f"Duplicate({w}, {lit(T, 1)}, {n});", bits(f"Or(v0, v0, v1, {n} * 2);", w, d),
        f"Mul({c}, {c}, {w}, {n});", f"Abs({w}, {r}, {n});", f"Mul({c}, {c}, {w}, {n});",
        # w = r + y, flushed to a zero of its sign below 2^-126 (TF's FTZ)
        f"Add({w}, {r}, {y}, {n});", f"Abs({b}, {w}, {n});",
        f"Duplicate({d}, {lit(T, _FP32_MIN_NORMAL)}, {n});", m(f"Compare(m, {b}, {d}, CMPMODE::LT, {n});"),
        f"Muls({b}, {w}, {lit(T, 0)}, {n});", m(f"Select({w}, m, {b}, {w}, {sel}, {n});"),
        f"Duplicate({d}, {lit(T, -_FP32_MIN_NORMAL)}, {n});", m(f"Compare(m, {c}, {d}, CMPMODE::LE, {n});"),
        m(f"Select({d}, m, {w}, {r}, {sel}, {n});"),
        # NaN where x is inf or NaN, or |y| < 2^-126 (zero, or subnormal: TF's DAZ) or NaN
        f"Abs({r}, {x}, {n});", _inf_into(w, n), m(f"Compare(m, {r}, {w}, CMPMODE::LT, {n});"),
        nan, m(f"Select({d}, m, {d}, {c}, {sel}, {n});"),
        f"Abs({r}, {y}, {n});", f"Duplicate({w}, {lit(T, _FP32_MIN_NORMAL)}, {n});",
        m(f"Compare(m, {r}, {w}, CMPMODE::GE, {n});"), m(f"Select({d}, m, {d}, {c}, {sel}, {n});"),
    ]


_add("FloorMod", FLOAT, 5, ["Abs", "Duplicate", "Compare", "Select", "Div", "ReduceMax", "Muls", "Sub",
                            "And", "Or", "Mul", "Add"], _floormod, tile_only=True)

# Advanced math (the Ascend C math library): each takes a shared temp buffer (LocalTensor<uint8_t>)
# of at least its maxLiveNodeCount * count * sizeof(float) bytes for fp32 (+ extra bytes), the
# GetXxxMaxMinTmpSize maximum. The generator reserves that, per tile element, in the UB plan.
for _op, _api, _nodes in (("Erf", "Erf", 3), ("Erfc", "Erfc", 7), ("Sin", "Sin", 3), ("Cos", "Cos", 3),
                          ("Tan", "Tan", 4), ("Atan", "Atan", 5)):
    _add(_op, FLOAT, 0, [_api],
         lambda T, d, s, n, t, api=_api: [f"{api}({d}, {s[0]}, sharedTmp, {n});"],
         shared_tmp=(4 * _nodes, 0))
_add("Pow", FLOAT, 0, ["Power"], lambda T, d, s, n, t: [f"Power({d}, {s[0]}, {s[1]}, sharedTmp, {n});"],
     shared_tmp=(4 * 4, 256))


# ---- reductions ---------------------------------------------------------------------------------
# Reductions with a vector reduce API for their type: each tile reduced to one value, folded into
# a 32-byte row accumulator with ACCUMULATE.
REDUCE_API = {"Sum": "ReduceSum", "Mean": "ReduceSum", "Max": "ReduceMax", "Min": "ReduceMin"}
ACCUMULATE = {"Sum": "Add", "Mean": "Add", "Max": "Max", "Min": "Min"}
# Reductions without a vector reduce API for their type (Prod; Sum/Mean/Max/Min of i32): folded
# element-wise into a tile-sized accumulator over the row's tiles, then halved in UB down to 8
# lanes (32 bytes) at the row's end and finished by the scalar unit.
FOLD_OP = {"Prod": "Mul", "Sum": "Add", "Mean": "Add", "Max": "Max", "Min": "Min"}
FOLD_IDENTITY = {("Prod", "float"): "1.0f", ("Sum", "int32_t"): "static_cast<int32_t>(0)",
                 ("Mean", "int32_t"): "static_cast<int32_t>(0)",
                 ("Max", "int32_t"): "static_cast<int32_t>(INT32_MIN)",
                 ("Min", "int32_t"): "static_cast<int32_t>(INT32_MAX)"}
FOLD_SCALAR = {  # v = v (op) x on the scalar unit; i32 sums wrap as the vector unit's do
    "Mul": "v = v * x;",
    "Add": "v = static_cast<int32_t>(static_cast<uint32_t>(v) + static_cast<uint32_t>(x));",
    "Max": "v = x > v ? x : v;", "Min": "v = x < v ? x : v;"}


def is_fold(inst) -> bool:
    """A reduction folded element-wise (no vector reduce API for its op and type)."""
    return inst.op == "Prod" or (inst.op in FOLD_OP and inst.operand_dtype == "i32")


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


def reduction_ops() -> list:
    return sorted(FOLD_OP)


def apis(op: str) -> tuple:
    """The Ascend C APIs the lowering of `op` uses; () when it is refused."""
    if op in _TABLE:
        return _TABLE[op].apis
    if op in FOLD_OP:
        return tuple(sorted({REDUCE_API.get(op), ACCUMULATE.get(op), FOLD_OP[op]} - {None}))
    return ()


def refused_ops() -> dict:
    return dict(_REFUSED)


def alpha_of(attrs: dict) -> float:
    value = float(attrs.get("alpha", 0.2))
    if not math.isfinite(value):
        raise ValueError("alpha must be finite")
    return value


def _check_complete() -> None:
    """Every catalog op is lowered or refused with a reason; nothing here names an unknown op."""
    from ..rewriter import catalog

    ops = {spec.ir_name for spec in catalog.OPS}
    lowered = set(_TABLE) | set(FOLD_OP)
    missing = sorted(ops - lowered - set(_REFUSED))
    if missing:
        raise ImportError(f"tf_autofuse.codegen.opmap: catalog op(s) {', '.join(missing)} have neither "
                          "an Ascend C lowering nor a stated refusal (_refuse(op, reason))")
    unknown = sorted((lowered | set(_REFUSED)) - ops)
    if unknown:
        raise ImportError(f"tf_autofuse.codegen.opmap: {', '.join(unknown)} are not catalog ops")
    both = sorted(lowered & set(_REFUSED))
    if both:
        raise ImportError(f"tf_autofuse.codegen.opmap: {', '.join(both)} are both lowered and refused")


_check_complete()
