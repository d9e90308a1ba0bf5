"""Property-based equivalence: random graphs over the whole op table, fused vs unfused vs float64.

Each case is a random DAG over the catalog (tf_autofuse/rewriter/catalog.py): every unary and
binary op, comparisons and IsNan/IsInf/IsFinite feeding Select and the logical ops, Cast between
float types, ZerosLike/OnesLike, LeakyRelu with a drawn alpha, AddN, ClipByValue, BiasAdd (NHWC,
NCHW), the TF ops the catalog lowers to several IR ops with a reference of their own (the
gradient ops: ReluGrad, SigmoidGrad...), and with `Features`: operands of broadcast shapes and
views (Reshape, ExpandDims, Squeeze) of inputs, Tile of size-1 axes, and reductions (Sum, Mean, Max, Min, Prod over
random axes, keep_dims or not, with ops before and after, reduced values broadcast back, softmax
and layer norm shapes, 0-sized and size-1 reduced axes, BiasAddGrad NHWC and NCHW). Shared
inputs, diamonds, constants, shapes from 0-sized to ~100k elements, every dtype the op allows,
a random set of fetched nodes (intermediates included) and of fed intermediates. It runs in a
v1 Session without and with the named optimizer "AutofuseOptimizer" (reduce pass on through its
parameter_map when the graph may hold reductions), and is also handed to the rewriter directly:

- structure: every preserved node (fetch, feed) is still there; a fused member is gone unless
  preserved (then it is an Identity of the fused kernel); fed nodes are never fused; the
  rewriter is idempotent (a second pass fuses nothing and changes no byte).
- numbers, per element: NaN and +-Inf where unfused TensorFlow has them, and
  |fused - ref| <= |unfused - ref| + E, where ref is a float64 numpy evaluation of the same
  graph (catalog references) and E a bound of how far a correct implementation may be from ref
  (see `reference`: a few ulps per op of the compute type -- f32 for f16/bf16 -- propagated
  through each op's derivative; for f16/bf16, the rounding at each node where a group boundary
  may store it; for an op the catalog lowers to several IR ops, those ops' bounds in turn; for
  reductions, the operands' bounds summed (Sum, Mean), their largest (Max, Min) or multiplied
  out (Prod), plus the accumulation error of n additions or products in the accumulator type, n
  the reduction length). int32 and bool results are compared exactly with
  TensorFlow (and the reference wherever TensorFlow is on it). Elements whose value depends on
  which side of a discontinuity, domain edge, pole or overflow threshold a few ulps land (Floor at
  an integer, Sqrt near 0, Tan near a pole, a comparison of near-equal values, a sum whose
  partial sums may overflow) are counted as unstable and not compared.

The generator draws through a `Chooser`, so the same code runs under hypothesis (here, CI
sized, deterministic, shrinking to a minimal graph on failure) and under a seeded numpy RNG
(scripts/fuzz_long.py). `test_generator_covers_the_op_table` fails when the catalog gains an op
the generator does not draw.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import types
import warnings
from typing import Callable, Optional, Sequence

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import types_pb2

import sessions
from tf_autofuse import _warn, rewriter
from tf_autofuse.rewriter import catalog

tf1 = tf.compat.v1

try:
    from scipy import special as _special
except ImportError:  # pragma: no cover
    _special = None

# ---------------------------------------------------------------------------------------------
# dtypes

DTYPES = ("f32", "f16", "bf16", "f64", "i32")  # simplest first: hypothesis shrinks to f32
FLOATS = ("f32", "f16", "bf16", "f64")
TF_DTYPES = {"f16": tf.float16, "bf16": tf.bfloat16, "f32": tf.float32, "f64": tf.float64,
             "i32": tf.int32, "bool": tf.bool}
ENUMS = {"f16": types_pb2.DT_HALF, "bf16": types_pb2.DT_BFLOAT16, "f32": types_pb2.DT_FLOAT,
         "f64": types_pb2.DT_DOUBLE, "i32": types_pb2.DT_INT32, "bool": types_pb2.DT_BOOL}
_MANTISSA = {"f16": 10, "bf16": 7, "f32": 23, "f64": 52}
_MIN_EXP = {"f16": -14, "bf16": -126, "f32": -126, "f64": -1022}
_MAX = {"f16": 65504.0, "bf16": 3.3895313892515355e38, "f32": 3.4028234663852886e38,
        "f64": 1.7976931348623157e308}
COMPUTE = {"f16": "f32", "bf16": "f32", "f32": "f32", "f64": "f64"}  # what the kernel computes in
OP_ULPS = 4  # "a few ulps" of the compute type that each op may be off by, in either path
# Ops documented to be off by more in the fused kernel (tf_autofuse/cc/cpu/ops.h): our fp32
# erfc is within 5.9 ulps over its range (TensorFlow's own is within ~65); the fp32 erf is
# Eigen's, as TensorFlow's, whose wider-packet form the kernel runs: 5.7 ulps at most over
# [-6, 6] in 200k points (TensorFlow's kernel 5.1), worst for |x| in [3, 4].
OWN_OP_ULPS = {"Erfc": 6, "Erf": 6}
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def np_dtype(dtype):
    return TF_DTYPES[dtype].as_numpy_dtype


def unit_roundoff(dtype) -> float:
    return 2.0 ** -(_MANTISSA[dtype] + 1)


def ulp(values, dtype):
    """Spacing of `dtype` at |values| (subnormal spacing near 0; 0 where not finite)."""
    a = np.abs(np.asarray(values, np.float64))
    finite = np.isfinite(a)
    safe = np.where(finite & (a > 0), a, 2.0 ** _MIN_EXP[dtype])
    exponent = np.maximum(np.floor(np.log2(safe)), _MIN_EXP[dtype])
    return np.where(finite, np.ldexp(1.0, (exponent - _MANTISSA[dtype]).astype(np.int64)), 0.0)


# ---------------------------------------------------------------------------------------------
# The error model of the elementwise ops: for each IR op, |d out / d operand_i|, the distance from
# each operand to the nearest point where the op jumps or leaves its domain (None: it has none),
# and, for ops whose jumps depend on several operands, a mask of where they may jump.

def _sig(x):
    return _special.expit(x) if _special is not None else 1 / (1 + np.exp(-x))


_SELU_SCALE, _SELU_ALPHA = 1.0507009873554805, 1.6732632423543772
_ONE = lambda *xs: np.ones_like(xs[0])  # noqa: E731
_ZERO = lambda *xs: np.zeros_like(xs[0])  # noqa: E731


def _dist_int(x):
    return np.abs(x - np.round(x))


def _dist_half(x):
    return np.abs(x - (np.floor(x) + 0.5))


def _dist_pole(x):
    """Distance to the nearest pole of tan, pi/2 + k pi."""
    y = (x - np.pi / 2) / np.pi
    return np.abs(y - np.round(y)) * np.pi


def _pow_da(a, b):
    # a < 0 with b not an integer: NaN whatever a is (b's distance to an integer says when not)
    return np.where((a < 0) & (b != np.round(b)), 0.0, np.abs(b * np.power(a, b - 1)))


def _pow_db(a, b):
    return np.where(a <= 0, 0.0, np.abs(np.power(a, b) * np.log(a)))


def _pow_base_edge(a, b):
    # a crossing 0 (sign, 0^-b = inf); |a| crossing 1 when b is infinite (0 or inf) or NaN
    # (1^NaN = 1, anything else ^ NaN = NaN)
    return np.minimum(np.abs(a), np.where(np.isinf(b) | np.isnan(b), np.abs(np.abs(a) - 1),
                                          np.inf))


def _pow_exponent_edge(a, b):
    # a < 0: NaN unless b is an integer; a = 0 or +-inf: b crossing 0 flips 0 and inf; a NaN:
    # b crossing 0 (NaN^0 = 1)
    return np.where(a < 0, _dist_int(b),
                    np.where((a == 0) | np.isinf(a) | np.isnan(a), np.abs(b), np.inf))


def _quotient_jump(xs, es, ctx):
    """FloorDiv and FloorMod jump where x / y crosses an integer (an exact integer quotient of
    exact operands is no jump: every implementation computes it exactly)."""
    a, b = xs
    ea, eb = es
    q = a / b
    eq = (ea + np.abs(q) * eb) / np.abs(b) + 2 * (ulp(q, ctx.compute) + ulp(q, ctx.dtype))
    d = _dist_int(q)
    exact = (d == 0) & (ea == 0) & (eb == 0)
    return (~exact & (d <= eq)) | ((eb > 0) & (np.abs(b) <= eb))


@dataclasses.dataclass(frozen=True)
class OpModel:
    derivs: tuple  # one callable per operand: f64 operands -> |partial derivative|
    critical: tuple = ()  # (operand index, f64 operands -> distance to a jump / domain edge)
    unstable: Optional[Callable] = None  # (operands, bounds, ctx) -> where the op may jump


ERROR_MODEL = {
    "Abs": OpModel((_ONE,)),
    "Neg": OpModel((_ONE,)),
    "Relu": OpModel((_ONE,)),
    "Relu6": OpModel((_ONE,)),
    "Elu": OpModel((lambda x: np.where(x < 0, np.exp(np.minimum(x, 0)), 1.0),)),
    "Selu": OpModel((lambda x: np.where(x < 0, _SELU_SCALE * _SELU_ALPHA * np.exp(np.minimum(x, 0)),
                                         _SELU_SCALE),)),
    "Exp": OpModel((np.exp,)),
    "Expm1": OpModel((np.exp,)),
    "Log": OpModel((lambda x: 1 / np.abs(x),), ((0, np.abs),)),
    "Log1p": OpModel((lambda x: 1 / np.abs(1 + x),), ((0, lambda x: np.abs(1 + x)),)),
    "Sqrt": OpModel((lambda x: 0.5 / np.sqrt(np.abs(x)),), ((0, np.abs),)),
    "Rsqrt": OpModel((lambda x: 0.5 * np.abs(x) ** -1.5,), ((0, np.abs),)),
    "Square": OpModel((lambda x: 2 * np.abs(x),)),
    "Reciprocal": OpModel((lambda x: 1 / (x * x),), ((0, np.abs),)),
    "Sigmoid": OpModel((lambda x: _sig(x) * (1 - _sig(x)),)),
    "Tanh": OpModel((lambda x: 1 - np.tanh(x) ** 2,)),
    "Softplus": OpModel((_sig,)),
    "Softsign": OpModel((lambda x: 1 / (1 + np.abs(x)) ** 2,)),
    "Sign": OpModel((_ZERO,), ((0, np.abs),)),
    "Floor": OpModel((_ZERO,), ((0, _dist_int),)),
    "Ceil": OpModel((_ZERO,), ((0, _dist_int),)),
    "Round": OpModel((_ZERO,), ((0, _dist_half),)),
    "Erf": OpModel((lambda x: 2 / np.sqrt(np.pi) * np.exp(-x * x),)),
    "Erfc": OpModel((lambda x: 2 / np.sqrt(np.pi) * np.exp(-x * x),)),
    "Sin": OpModel((_ONE,)),
    "Cos": OpModel((_ONE,)),
    # sec^2 is convex between poles: its largest value on [x - e, x + e] is at an end, which the
    # corners below evaluate; an interval holding a pole is `critical`. So the bound is the
    # condition number times the operand's error, never a fixed tolerance.
    "Tan": OpModel((lambda x: 1 + np.tan(x) ** 2,), ((0, _dist_pole),)),
    "Atan": OpModel((lambda x: 1 / (1 + x * x),)),
    "Sinh": OpModel((np.cosh,)),
    "Cosh": OpModel((lambda x: np.abs(np.sinh(x)),)),
    "Add": OpModel((_ONE, _ONE)),
    "Sub": OpModel((_ONE, _ONE)),
    "Mul": OpModel((lambda a, b: np.abs(b), lambda a, b: np.abs(a))),
    "Div": OpModel((lambda a, b: 1 / np.abs(b), lambda a, b: np.abs(a) / (b * b)),
                   ((1, lambda a, b: np.abs(b)),)),
    "Maximum": OpModel((_ONE, _ONE)),
    "Minimum": OpModel((_ONE, _ONE)),
    "SquaredDifference": OpModel((lambda a, b: 2 * np.abs(a - b), lambda a, b: 2 * np.abs(a - b))),
    "Pow": OpModel((_pow_da, _pow_db), ((0, _pow_base_edge), (1, _pow_exponent_edge))),
    "FloorDiv": OpModel((_ZERO, _ZERO), unstable=_quotient_jump),
    "FloorMod": OpModel((_ONE, lambda a, b: np.abs(np.floor(a / b))), unstable=_quotient_jump),
}

# Ops whose model depends on their attrs: IR name -> attrs -> OpModel.
ATTR_MODELS = {
    "LeakyRelu": lambda attrs: OpModel(
        (lambda x: np.where(x < 0, abs(attrs["alpha"]), 1.0),)),
}


def op_model(ir_name: str, attrs) -> OpModel:
    if ir_name in ATTR_MODELS:
        return ATTR_MODELS[ir_name](attrs)
    return ERROR_MODEL[ir_name]


# ---------------------------------------------------------------------------------------------
# The op table, by what the generator needs to know (read from the catalog's kinds, arities and
# result types, not from op names, so a new op of a known shape is drawn without a change here)

_SPECIAL = {"Cast", "ZerosLike", "OnesLike"}  # drawn by their own moves

UNARY = [s for s in catalog.OPS if s.kind == catalog.ELEMENTWISE and s.result == "same"
         and catalog.BOOL.isdisjoint(s.dtypes) and s.ir_name not in _SPECIAL]
BINARY = [s for s in catalog.OPS if s.arity == 2 and s.result == "same"
          and catalog.BOOL.isdisjoint(s.dtypes)]
COMPARISONS = [s for s in catalog.OPS if s.arity == 2 and s.result == "bool"]
TESTS = [s for s in catalog.OPS if s.arity == 1 and s.result == "bool"]
LOGICAL = [s for s in catalog.OPS if s.dtypes == catalog.BOOL]
SELECTS = [s for s in catalog.OPS if s.operand_roles()[:1] == ("bool",)]
REDUCTIONS = [s for s in catalog.OPS if s.kind == catalog.REDUCE]
REDUCE_NAMES = frozenset(s.ir_name for s in REDUCTIONS)
# TF ops the catalog lowers to several IR ops, with a reference of their own (the gradient ops):
# their error model is the IR ops' in turn (_composite_reference)
COMPOSITES = [e for e in catalog.TF_OPS.values()
              if e.reference is not None and e.kind in (catalog.ELEMENTWISE, catalog.BROADCAST)]
COMPOSITE_NAMES = frozenset(e.op_type for e in COMPOSITES)
COMPARISON_NAMES = frozenset(s.ir_name for s in COMPARISONS)
VIEWS = ("Reshape", "ExpandDims", "Squeeze")
LEAKY_ALPHAS = (0.2, 0.01, 0.5, 1.5, -0.3, 0.0)


# ---------------------------------------------------------------------------------------------
# Drawing: one interface over hypothesis and numpy

class Chooser:
    def integers(self, lo: int, hi: int) -> int:  # inclusive
        raise NotImplementedError

    def choice(self, seq: Sequence):
        return seq[self.integers(0, len(seq) - 1)]

    def chance(self, p: float) -> bool:
        return self.integers(0, 999) < int(p * 1000)


class RandomChooser(Chooser):
    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def integers(self, lo, hi):
        return int(self.rng.integers(lo, hi, endpoint=True))


class HypothesisChooser(Chooser):
    def __init__(self, data):
        self.data = data

    def integers(self, lo, hi):
        from hypothesis import strategies as st

        return self.data.draw(st.integers(lo, hi))

    def chance(self, p):
        # shrinks towards "no": the simplest graph has none of the optional features
        return self.integers(0, 999) >= 1000 - int(p * 1000)


@dataclasses.dataclass(frozen=True)
class Features:
    """What the generator may use beyond the elementwise ops (always drawn, typed ones too).

    broadcast: operands of broadcastable shapes ([N,C] + [C], [1,C], [N,1]), views
      (Reshape, ExpandDims, Squeeze) of inputs, Tile of size-1 axes.
    reductions: Sum, Mean, Max, Min, Prod, softmax and layer-norm shapes, BiasAddGrad; the fused
      run turns on the reduce pass (`--autofuse_enable_pass=reduce`).
    flags: the fused run (and the rewriter) also get a random `max_fusion_size`,
      `max_input_nums_after_fuse` and `recomputation_threshold` (groups split, inputs limited,
      producers recomputed in their consumers' kernels).
    value_views: views of the graph's own values between ops: Reshape, Squeeze or ExpandDims
      that add or drop leading size-1 axes (fused as aliases) and flattening Reshapes (never
      fused), read by an elementwise op with the value itself. Apart from ALL so that the
      graphs its seeds found stay the graphs they were.
    """

    broadcast: bool = False
    reductions: bool = False
    max_nodes: int = 12
    flags: bool = False
    value_views: bool = False


ALL = Features(broadcast=True, reductions=True, flags=True)

# Shapes: simplest first. 0-sized, 1, primes, a size-1 axis, short rows (row-group reductions),
# short inner blocks (column-group reductions), a few tiles, ~100k elements (many tiles, threads).
SHAPES = [(7,), (1,), (0,), (2, 3), (13, 17), (1, 1, 1), (3, 0, 2), (5, 1, 7), (1031,), (33, 10),
          (61, 67), (6, 40, 33), (4, 4099), (100_003,)]


@dataclasses.dataclass
class Input:
    shape: tuple  # the runtime shape
    declared: str = "static"  # "static", "unknown_dims", "unknown_rank"
    const: bool = False  # a Const node holding the data instead of a placeholder
    dtype: str = ""  # "" is the graph's dtype
    value: Optional[float] = None  # a Const of this value everywhere (else random data)


@dataclasses.dataclass
class Node:
    tf_op: str
    ir_name: str  # the catalog's IR op, or the TF op for AddN, ClipByValue, BiasAdd and views
    operands: tuple  # indices into GraphSpec.values
    shape: tuple
    dtype: str  # of the result
    attrs: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class GraphSpec:
    dtype: str
    values: list  # Input and Node, in creation order; operands index this list
    fetches: list  # indices of fetched nodes
    fed: list  # indices of nodes whose value the caller feeds
    seed: int
    features: Features = Features()
    params: dict = dataclasses.field(default_factory=dict)  # the optimizer's parameter_map

    @property
    def nodes(self) -> list:
        return [v for v in self.values if isinstance(v, Node)]

    def node_indices(self) -> list:
        return [v for v, item in enumerate(self.values) if isinstance(item, Node)]

    def dtype_of(self, v) -> str:
        return self.values[v].dtype or self.dtype

    def shape_of(self, v) -> tuple:
        return self.values[v].shape

    def name(self, v) -> str:
        item = self.values[v]
        if isinstance(item, Input):
            return f"c{v}" if item.const else f"in{v}"
        return f"n{v}"

    def describe(self) -> str:
        lines = []
        for v, item in enumerate(self.values):
            if isinstance(item, Input):
                what = "const" if item.const else item.declared
                value = "" if item.value is None else f" = {item.value!r}"
                lines.append(f"{self.name(v)}: {self.dtype_of(v)}{list(item.shape)} {what}{value}")
                continue
            ops = ", ".join(self.name(o) for o in item.operands)
            attrs = "".join(f" {k}={val!r}" for k, val in sorted(item.attrs.items()))
            lines.append(f"{self.name(v)} = {item.tf_op}({ops}){attrs}  "
                         f"{item.dtype}{list(item.shape)}")
        lines.append(f"fetch {[self.name(f) for f in self.fetches]} "
                     f"feed {[self.name(f) for f in self.fed]} seed {self.seed}"
                     + (f" params {self.params}" if self.params else ""))
        return "\n".join(lines)


def _broadcast_shape(ch: Chooser, shape: tuple) -> tuple:
    """A shape that broadcasts to `shape` (a suffix, or some dims set to 1)."""
    if not shape:
        return shape
    if ch.chance(0.5):
        return shape[ch.integers(0, len(shape)):]
    return tuple(1 if ch.chance(0.5) else d for d in shape)


def _broadcasts(*shapes) -> bool:
    try:
        np.broadcast_shapes(*shapes)
    except ValueError:
        return False
    return True


def reduced_shape(shape, axes, keep) -> tuple:
    rank = len(shape)
    axes = {a % rank for a in axes}
    if keep:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def foldable(values: list, v: int) -> bool:
    """Whether Grappler may turn value v into a Const (no placeholder behind it)."""
    item = values[v]
    if isinstance(item, Input):
        return item.const
    return item.ir_name in ("ZerosLike", "OnesLike") or all(
        foldable(values, o) for o in item.operands)


class _Builder:
    """Appends inputs and nodes to a graph being drawn. Each move returns the index of the value
    it made, or None when the graph holds nothing it can start from."""

    def __init__(self, ch: Chooser, features: Features, dtype: str, shape: tuple):
        self.ch, self.features, self.dtype, self.shape = ch, features, dtype, shape
        self.values: list = []

    # --- values ---------------------------------------------------------------------------
    def add(self, item) -> int:
        if isinstance(item, Input) and not item.dtype:
            item.dtype = self.dtype
        self.values.append(item)
        return len(self.values) - 1

    def dtype_of(self, v) -> str:
        return self.values[v].dtype or self.dtype

    def shape_of(self, v) -> tuple:
        return self.values[v].shape

    def node(self, tf_op, ir_name, operands, dtype, shape=None, **attrs) -> int:
        if shape is None:
            shape = tuple(np.broadcast_shapes(*(self.shape_of(o) for o in operands)))
        return self.add(Node(tf_op, ir_name, tuple(operands), tuple(shape), dtype, attrs))

    def scalar(self, dtype) -> int:
        if dtype == "i32":
            value = self.ch.choice([2, -3, 7, 0])
        else:
            value = self.ch.choice([0.5, 2.0, -1.5, 3.0, 1e-3, 0.0])
        return self.add(Input((), const=True, dtype=dtype, value=value))

    def pick(self, ok) -> Optional[int]:
        candidates = [v for v in range(len(self.values)) if ok(v)]
        if not candidates:
            return None
        if self.ch.chance(0.6):
            return candidates[-1]  # continue the chain
        return self.ch.choice(candidates)  # shared values, diamonds

    def foldable(self, v) -> bool:
        return foldable(self.values, v)

    def data(self, v) -> bool:
        return self.dtype_of(v) != "bool"

    def floating(self, v) -> bool:
        return self.dtype_of(v) in FLOATS

    def partner(self, a, same_shape=False) -> int:
        """A second operand for `a`: its dtype, a shape that broadcasts with it (or its shape)."""
        dtype, shape = self.dtype_of(a), self.shape_of(a)
        if self.ch.chance(0.15):
            return self.scalar(dtype)
        if self.features.broadcast and not same_shape and self.ch.chance(0.15):
            return self.add(Input(_broadcast_shape(self.ch, shape), dtype=dtype))
        if same_shape:
            return self.pick(lambda v: self.dtype_of(v) == dtype and self.shape_of(v) == shape)
        return self.pick(lambda v: self.dtype_of(v) == dtype and _broadcasts(self.shape_of(v), shape))

    # --- moves ----------------------------------------------------------------------------
    def unary(self):
        return self.unary_of(self.pick(self.data))

    def unary_of(self, x):
        dtype = self.dtype_of(x)
        spec = self.ch.choice([s for s in UNARY if ENUMS[dtype] in s.dtypes])
        attrs = {}
        if spec.ir_name == "LeakyRelu":
            attrs["alpha"] = self.ch.choice(LEAKY_ALPHAS)
        return self.node(self.ch.choice(spec.tf_ops), spec.ir_name, (x,), dtype, **attrs)

    def _pair(self, specs, result=None):
        a = self.pick(self.data)
        dtype = self.dtype_of(a)
        options = [s for s in specs if ENUMS[dtype] in s.dtypes]
        if not options:
            return None
        spec = self.ch.choice(options)
        b = self.partner(a)
        if self.ch.chance(0.3):
            a, b = b, a
        return self.node(self.ch.choice(spec.tf_ops), spec.ir_name, (a, b), result or dtype)

    def binary(self):
        return self._pair(BINARY)

    def compare(self):
        return self._pair(COMPARISONS, "bool")

    def test(self):
        x = self.pick(self.floating)
        if x is None:
            return None
        spec = self.ch.choice(TESTS)
        return self.node(spec.tf_ops[0], spec.ir_name, (x,), "bool")

    def boolean(self) -> int:
        """A bool value; made from a comparison or a test when the graph has none."""
        v = self.pick(lambda v: self.dtype_of(v) == "bool")
        if v is None:
            v = self.test() if self.ch.chance(0.5) else None
            if v is None:
                v = self.compare()
        return v

    def logical(self):
        spec = self.ch.choice(LOGICAL)
        a = self.boolean()
        if spec.arity == 1:
            return self.node(spec.tf_ops[0], spec.ir_name, (a,), "bool")
        shape = self.shape_of(a)
        b = self.pick(lambda v: self.dtype_of(v) == "bool" and _broadcasts(self.shape_of(v), shape))
        return self.node(spec.tf_ops[0], spec.ir_name, (a, b), "bool")

    def select(self):
        spec = self.ch.choice(SELECTS)
        c = self.boolean()
        x = self.pick(lambda v: self.data(v) and _broadcasts(self.shape_of(v), self.shape_of(c)))
        if x is None:
            return None
        y = self.partner(x)
        if not _broadcasts(self.shape_of(c), self.shape_of(x), self.shape_of(y)):
            y = x
        tf_op = self.ch.choice(spec.tf_ops)
        if tf_op == "Select" and not (self.shape_of(c) == self.shape_of(x) == self.shape_of(y)):
            tf_op = "SelectV2"  # v1 Select: the condition has x's shape (or is a scalar)
        return self.node(tf_op, spec.ir_name, (c, x, y), self.dtype_of(x))

    def cast(self):
        x = self.pick(self.floating)
        if x is None:
            return None
        to = self.ch.choice([d for d in FLOATS if d != self.dtype_of(x)])
        return self.node("Cast", "Cast", (x,), to, to=to)

    def like(self):
        x = self.pick(lambda v: True)
        op = self.ch.choice(["ZerosLike", "OnesLike"])
        return self.node(op, op, (x,), self.dtype_of(x))

    def addn(self):
        x = self.pick(self.data)
        operands = [x] + [self.partner(x, same_shape=True) for _ in range(self.ch.integers(1, 3))]
        operands = [o for o in operands if self.shape_of(o) == self.shape_of(x)]  # AddN: no broadcast
        return self.node("AddN", "AddN", operands, self.dtype_of(x))

    def clip(self):
        x = self.pick(self.data)
        # each bound a scalar or a tensor of x's shape, drawn independently: lo > hi happens
        lo, hi = (self.partner(x, same_shape=True) for _ in range(2))
        for bound in (lo, hi):
            if self.shape_of(bound) not in ((), self.shape_of(x)):
                return None
        return self.node("ClipByValue", "ClipByValue", (x, lo, hi), self.dtype_of(x),
                         shape=self.shape_of(x))

    def bias(self):
        x = self.pick(lambda v: self.data(v) and len(self.shape_of(v)) >= 2)
        if x is None:
            return None
        shape = self.shape_of(x)
        fmt = "NHWC"
        # NCHW needs rank >= 3. And TensorFlow's Grappler breaks a BiasAdd NCHW of a constant
        # tensor of zeros (or a 0-sized one): it becomes an Add of the bias broadcast NHWC-wise,
        # "Incompatible shapes: [C] vs. [N,C,W]" at run time, fused or not.
        if len(shape) >= 3 and 0 not in shape and not self.foldable(x):
            fmt = self.ch.choice(["NHWC", "NCHW"])
        channels = shape[-1] if fmt == "NHWC" else shape[1]
        b = self.add(Input((channels,), const=self.ch.chance(0.3), dtype=self.dtype_of(x)))
        return self.node("BiasAdd", "BiasAdd", (x, b), self.dtype_of(x), shape=shape,
                         data_format=fmt)

    def view(self):
        """A view of a new input (as Keras reshapes normalisation parameters) combined with a
        value of the graph."""
        a = self.pick(lambda v: self.data(v) and len(self.shape_of(v)) >= 1)
        if a is None:
            return None
        dtype, shape = self.dtype_of(a), self.shape_of(a)
        c = shape[-1]
        op = self.ch.choice(VIEWS)
        if op == "Squeeze":
            src = self.add(Input((1, c), const=self.ch.chance(0.3), dtype=dtype))
            v = self.node("Squeeze", "View", (src,), dtype, shape=(c,), squeeze=(0,))
        elif op == "ExpandDims":
            src = self.add(Input((c,), const=self.ch.chance(0.3), dtype=dtype))
            v = self.node("ExpandDims", "View", (src,), dtype, shape=(1, c), axis=0)
        else:
            src = self.add(Input((c,), const=self.ch.chance(0.3), dtype=dtype))
            v = self.node("Reshape", "View", (src,), dtype, shape=(1,) * (len(shape) - 1) + (c,))
        spec = self.ch.choice([s for s in BINARY if ENUMS[dtype] in s.dtypes])
        return self.node(self.ch.choice(spec.tf_ops), spec.ir_name, (a, v), dtype)

    def value_view(self):
        """A view of a value of the graph, combined with that value by a binary op: Squeeze of
        a leading 1, ExpandDims at 0 or a Reshape adding leading ones (aliases when fused),
        or a Reshape to one flat axis (a view that moves sizes: never fused)."""
        a = self.pick(lambda v: self.data(v) and len(self.shape_of(v)) >= 1)
        if a is None:
            return None
        dtype, shape = self.dtype_of(a), self.shape_of(a)
        if self.features.reductions and len(shape) >= 2 and self.ch.chance(0.5):
            # a gradient's reduction to a parameter's shape: leading axes summed with keep_dims,
            # then Reshape or Squeeze to the parameter's shape, then an update with a new input
            lead = self.ch.integers(1, len(shape) - 1)
            spec = self.ch.choice([s for s in REDUCTIONS if ENUMS[dtype] in s.dtypes])
            r = self._reduction(spec, a, list(range(lead)), True)
            if self.ch.chance(0.5):
                v = self.node("Reshape", "View", (r,), dtype, shape=shape[lead:])
            else:
                v = self.node("Squeeze", "View", (r,), dtype, shape=shape[lead:],
                              squeeze=tuple(range(lead)))
            p = self.add(Input(shape[lead:], dtype=dtype))
            spec = self.ch.choice([s for s in BINARY if ENUMS[dtype] in s.dtypes])
            return self.node(self.ch.choice(spec.tf_ops), spec.ir_name, (p, v), dtype)
        choices = ["expand", "reshape"] + (["squeeze"] if len(shape) >= 2 and shape[0] == 1
                                           else []) + (["flatten"] if len(shape) >= 2 else [])
        op = self.ch.choice(choices)
        if op == "squeeze":
            v = self.node("Squeeze", "View", (a,), dtype, shape=shape[1:], squeeze=(0,))
        elif op == "expand":
            v = self.node("ExpandDims", "View", (a,), dtype, shape=(1,) + shape, axis=0)
        elif op == "reshape":
            v = self.node("Reshape", "View", (a,), dtype,
                          shape=(1,) * self.ch.integers(1, 3) + shape)
        else:
            v = self.node("Reshape", "View", (a,), dtype, shape=(int(np.prod(shape)),))
            return self.node("Neg" if dtype != "bool" else "LogicalNot",
                             "Neg" if dtype != "bool" else "LogicalNot", (v,), dtype)
        spec = self.ch.choice([s for s in BINARY if ENUMS[dtype] in s.dtypes])
        return self.node(self.ch.choice(spec.tf_ops), spec.ir_name, (v, a), dtype)

    def _reduction(self, spec, x, axes, keep) -> int:
        shape = reduced_shape(self.shape_of(x), axes, keep)
        return self.node(spec.tf_ops[0], spec.ir_name, (x,), self.dtype_of(x), shape=shape,
                         axes=tuple(axes), keep_dims=keep)

    def reduce(self):
        x = self.pick(lambda v: self.data(v) and len(self.shape_of(v)) >= 1)
        if x is None:
            return None
        dtype, shape = self.dtype_of(x), self.shape_of(x)
        rank = len(shape)
        spec = self.ch.choice([s for s in REDUCTIONS if ENUMS[dtype] in s.dtypes])
        if rank >= 3 and self.ch.chance(0.1):
            axes = [0, rank - 1]  # not consecutive: refused by the rewriter, must still run
        else:
            start = self.ch.integers(0, rank - 1)
            axes = list(range(start, self.ch.integers(start, rank - 1) + 1))
        if self.ch.chance(0.3):
            axes = [a - rank for a in axes]
        r = self._reduction(spec, x, axes, self.ch.chance(0.5))
        if self.ch.chance(0.5) and _broadcasts(self.shape_of(r), shape):
            # the reduced value broadcast back over the value it reduces (x - mean, x / sum)
            back = self.ch.choice([s for s in BINARY if ENUMS[dtype] in s.dtypes])
            operands = (x, r) if self.ch.chance(0.7) else (r, x)
            return self.node(self.ch.choice(back.tf_ops), back.ir_name, operands, dtype)
        return r

    def softmax(self):
        x = self.pick(lambda v: self.floating(v) and len(self.shape_of(v)) >= 1)
        if x is None:
            return None
        dtype, rank = self.dtype_of(x), len(self.shape_of(x))
        axis = rank - 1 if self.ch.chance(0.7) else self.ch.integers(0, rank - 1)
        m = self._reduction(catalog.for_ir_name("Max"), x, [axis], True)
        s = self.node("Sub", "Sub", (x, m), dtype)
        e = self.node("Exp", "Exp", (s,), dtype)
        z = self._reduction(catalog.for_ir_name("Sum"), e, [axis], True)
        return self.node("RealDiv", "Div", (e, z), dtype)

    def gradient(self):
        """A gradient op (COMPOSITES): two operands of one shape (TensorFlow's kernels broadcast
        nothing), either of them the gradient."""
        a = self.pick(self.data)
        dtype = self.dtype_of(a)
        options = [e for e in COMPOSITES if ENUMS[dtype] in e.dtypes]
        b = self.partner(a, same_shape=True)
        if not options or self.shape_of(b) != self.shape_of(a):
            return None
        entry = self.ch.choice(options)
        if self.ch.chance(0.5):
            a, b = b, a
        attrs = {}
        if "alpha" in entry.attrs:  # a float attr: what TensorFlow reads is the float32 value
            attrs["alpha"] = float(np.float32(self.ch.choice(LEAKY_ALPHAS)))
        return self.node(entry.op_type, entry.op_type, (a, b), dtype, **attrs)

    def tile(self):
        """Tile repeating the size-1 axes of a value (the gradient of a mean), often combined
        with a value of the tiled shape; now and then repeating an axis > 1 (refused by the
        rewriter, which TensorFlow must still run)."""
        x = self.pick(lambda v: self.data(v) and 1 in self.shape_of(v))
        if x is None or self.ch.chance(0.3):
            x = self.add(Input(tuple(1 if self.ch.chance(0.5) else d for d in self.shape)))
            if self.ch.chance(0.5):
                x = self.unary_of(x)
        shape = self.shape_of(x)
        if not shape:
            return None
        target = self.shape[-len(shape):] if len(self.shape) >= len(shape) else shape
        multiples = [t if d == 1 else 1 for d, t in zip(shape, target)]
        if self.ch.chance(0.1):
            multiples[self.ch.integers(0, len(shape) - 1)] = 2
        tiled = tuple(d * m for d, m in zip(shape, multiples))
        t = self.node("Tile", "Tile", (x,), self.dtype_of(x), shape=tiled,
                      multiples=tuple(multiples))
        if self.ch.chance(0.6):
            spec = self.ch.choice([s for s in BINARY if ENUMS[self.dtype_of(t)] in s.dtypes])
            other = self.partner(t)
            return self.node(self.ch.choice(spec.tf_ops), spec.ir_name, (t, other),
                             self.dtype_of(t))
        return t

    def bias_grad(self):
        """BiasAddGrad: a Sum over every axis but the channels (NCHW of rank >= 3: axes on both
        sides of them, which the rewriter refuses and TensorFlow must still run)."""
        x = self.pick(lambda v: self.data(v) and len(self.shape_of(v)) >= 2)
        if x is None:
            return None
        shape = self.shape_of(x)
        fmt = "NHWC"
        if len(shape) >= 3 and 0 not in shape and not self.foldable(x):  # as in `bias`
            fmt = self.ch.choice(["NHWC", "NCHW"])
        axes = catalog.bias_grad_axes(len(shape), fmt)
        return self.node("BiasAddGrad", "Sum", (x,), self.dtype_of(x),
                         shape=reduced_shape(shape, axes, False), axes=axes, keep_dims=False,
                         data_format=fmt)

    def layernorm(self):
        x = self.pick(lambda v: self.floating(v) and len(self.shape_of(v)) >= 1)
        if x is None:
            return None
        dtype, rank = self.dtype_of(x), len(self.shape_of(x))
        axes = list(range(self.ch.integers(0, rank - 1), rank))
        mean = catalog.for_ir_name("Mean")
        mu = self._reduction(mean, x, axes, True)
        d = self.node("Sub", "Sub", (x, mu), dtype)
        if self.ch.chance(0.5):
            sq = self.node("Square", "Square", (d,), dtype)
        else:
            sq = self.node("SquaredDifference", "SquaredDifference", (x, mu), dtype)
        var = self._reduction(mean, sq, axes, True)
        eps = self.add(Input((), const=True, dtype=dtype, value=1e-3))
        r = self.node("Rsqrt", "Rsqrt", (self.node("AddV2", "Add", (var, eps), dtype),), dtype)
        return self.node("Mul", "Mul", (d, r), dtype)


def _moves(dtype: str, features: Features) -> list:
    # simplest first (hypothesis shrinks to index 0); the many unary and binary ops get most draws
    moves = ["unary", "binary"] * 3 + ["compare", "select", "logical", "like", "addn", "clip",
                                       "bias", "gradient", "gradient"]
    if dtype != "i32":
        moves += ["test", "cast", "unary", "unary"]
    if features.broadcast:
        moves += ["view", "tile"]
    if features.reductions:
        moves += ["reduce", "reduce", "reduce", "softmax", "layernorm", "bias_grad"]
    if features.value_views:
        moves += ["value_view", "value_view", "value_view"]
    return moves


def generate(ch: Chooser, features: Features = Features()) -> GraphSpec:
    dtype = ch.choice(DTYPES)
    shape = ch.choice(SHAPES)
    b = _Builder(ch, features, dtype, shape)
    for _ in range(ch.integers(1, 3)):
        declared = "static"
        if ch.chance(0.25):
            declared = ch.choice(["unknown_dims", "unknown_rank"])
        b.add(Input(shape, declared))
    if ch.chance(0.2):
        b.add(Input(shape, const=True))
    if features.broadcast and ch.chance(0.5):
        b.add(Input(_broadcast_shape(ch, shape)))
    moves = _moves(dtype, features)
    nodes = lambda: sum(isinstance(v, Node) for v in b.values)  # noqa: E731
    for _ in range(ch.integers(1, features.max_nodes)):
        move = ch.choice(moves)
        if getattr(b, move)() is None:
            b.unary()
        if nodes() >= features.max_nodes + 8:
            break
    node_ids = [v for v, item in enumerate(b.values) if isinstance(item, Node)]
    last = node_ids[-1]
    fetches = sorted({last} | {v for v in node_ids[:-1] if ch.chance(0.25)})
    fed = sorted(v for v in node_ids[:-1] if ch.chance(0.1))
    params = {}
    if features.reductions:
        params["autofuse_enable_pass"] = "reduce"
    if features.flags and ch.chance(0.5):
        params["max_fusion_size"] = str(ch.choice([64, 2, 3, 5]))
        params["max_input_nums_after_fuse"] = str(ch.choice([8, 1, 2, 3]))
        params["recomputation_threshold"] = str(ch.choice([0, 1, 3, 8]))
    return GraphSpec(dtype, b.values, fetches, fed, ch.integers(0, 2**31 - 1), features, params)


# ---------------------------------------------------------------------------------------------
# Data

_SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0])


def make_data(spec: GraphSpec) -> dict:
    """{value index: array} for every input and every fed node."""
    rng = np.random.default_rng(spec.seed)
    wanted = [v for v, item in enumerate(spec.values) if isinstance(item, Input)] + spec.fed
    out = {}
    for v in wanted:
        shape, dtype = spec.shape_of(v), spec.dtype_of(v)
        item = spec.values[v]
        n = int(np.prod(shape))
        if isinstance(item, Input) and item.value is not None:
            out[v] = np.full(shape, item.value, np_dtype(dtype))
            continue
        if dtype == "bool":
            out[v] = (rng.random(n) < 0.5).reshape(shape)
            continue
        if dtype == "i32":
            kind = rng.integers(0, 3)
            if kind == 0:
                x = rng.integers(-10, 11, n)
            elif kind == 1:
                x = rng.integers(-(2**31), 2**31, n)
            else:
                x = rng.choice([-(2**31), 2**31 - 1, -1, 0, 1, 6, 7, -7, 46341], n)
            out[v] = x.astype(np.int32).reshape(shape)
            continue
        kind = rng.integers(0, 5)
        if kind == 0:
            x = rng.normal(0.0, 2.0, n)
        elif kind == 1:
            x = rng.uniform(-10.0, 10.0, n)
        elif kind == 2:
            x = np.exp(rng.uniform(-8.0, 8.0, n)) * rng.choice([-1.0, 1.0], n)
        elif kind == 3:
            x = np.round(rng.uniform(-8.0, 8.0, n) * 2) / 2
        else:
            x = rng.uniform(0.0, 3.0, n)
        # specials (NaN, +-inf, 0, 1...): often 5 %, but also rare or none, so that reductions
        # over long axes do not all end up NaN
        special = rng.random(n) < rng.choice([0.05, 0.005, 0.0])
        x[special] = rng.choice(_SPECIALS, int(special.sum()))
        out[v] = x.astype(np_dtype(dtype)).reshape(shape)
    return out


# ---------------------------------------------------------------------------------------------
# Building and running

def _raw(op: str, name: str, args, **attrs):
    """tf.raw_ops.<op> with the data operands `args` in the op's input order."""
    import inspect

    fn = getattr(tf.raw_ops, op)
    params = [p for p in inspect.signature(fn).parameters if p not in ("name", *attrs)]
    return fn(name=name, **dict(zip(params, args)), **attrs)


def _tf_node(spec: GraphSpec, v: int, args):
    node, name = spec.values[v], spec.name(v)
    attrs = node.attrs
    if node.tf_op == "BiasAddGrad":
        return tf.raw_ops.BiasAddGrad(out_backprop=args[0], data_format=attrs["data_format"],
                                      name=name)
    if node.tf_op == "Tile":
        multiples = tf.constant(np.array(attrs["multiples"], np.int32), name=name + "_multiples")
        return tf.raw_ops.Tile(input=args[0], multiples=multiples, name=name)
    if node.ir_name in COMPOSITE_NAMES:
        return _raw(node.tf_op, name, args, **attrs)
    if node.ir_name in REDUCE_NAMES:
        axes = tf.constant(np.array(attrs["axes"], np.int32), name=name + "_axes")
        return getattr(tf.raw_ops, node.tf_op)(input=args[0], axis=axes,
                                               keep_dims=attrs["keep_dims"], name=name)
    if node.tf_op == "Cast":
        return tf.raw_ops.Cast(x=args[0], DstT=TF_DTYPES[node.dtype], name=name)
    if node.tf_op == "LeakyRelu":
        return tf.raw_ops.LeakyRelu(features=args[0], alpha=attrs["alpha"], name=name)
    if node.tf_op == "AddN":
        return tf.raw_ops.AddN(inputs=list(args), name=name)
    if node.tf_op == "BiasAdd":
        return tf.raw_ops.BiasAdd(value=args[0], bias=args[1], data_format=attrs["data_format"],
                                  name=name)
    if node.tf_op == "Reshape":
        target = tf.constant(np.array(node.shape, np.int32), name=name + "_shape")
        return tf.raw_ops.Reshape(tensor=args[0], shape=target, name=name)
    if node.tf_op == "ExpandDims":
        axis = tf.constant(attrs["axis"], tf.int32, name=name + "_axis")
        return tf.raw_ops.ExpandDims(input=args[0], axis=axis, name=name)
    if node.tf_op == "Squeeze":
        return tf.raw_ops.Squeeze(input=args[0], axis=list(attrs["squeeze"]), name=name)
    return _raw(node.tf_op, name, args)


def build_graph(spec: GraphSpec, data: dict):
    """A tf.Graph of the spec; returns (graph, fetch tensors, {fed tensor: array})."""
    graph = tf.Graph()
    tensors = []
    with graph.as_default():
        for v, item in enumerate(spec.values):
            tdt = TF_DTYPES[spec.dtype_of(v)]
            if isinstance(item, Node):
                tensors.append(_tf_node(spec, v, [tensors[o] for o in item.operands]))
            elif item.const:
                tensors.append(tf.constant(data[v], tdt, name=spec.name(v)))
            else:
                shape = {"static": list(item.shape), "unknown_dims": [None] * len(item.shape),
                         "unknown_rank": None}[item.declared]
                tensors.append(tf1.placeholder(tdt, shape, name=spec.name(v)))
    feeds = {tensors[v]: data[v] for v, item in enumerate(spec.values)
             if isinstance(item, Input) and not item.const}
    for v in spec.fed:
        feeds[tensors[v]] = data[v]
    return graph, [tensors[v] for v in spec.fetches], feeds


def run_session(graph, fetches, feeds, fuse: bool, arithmetic: bool = True, params=None,
                remapping: bool = True):
    """(fetched values, {node name: op type} of what ran)."""
    config = sessions.config(fuse, params, arithmetic, remapping)
    with tf1.Session(graph=graph, config=config) as sess:
        metadata = tf1.RunMetadata()
        values = sess.run(fetches, feeds, options=tf1.RunOptions(output_partition_graphs=True),
                          run_metadata=metadata)
    executed = {n.name: n.op for p in metadata.partition_graphs for n in p.node}
    return values, executed


# ---------------------------------------------------------------------------------------------
# float64 reference with error bounds

TF_16BIT_ULPS = 4  # TensorFlow's own 16-bit kernels (Softplus, Sigmoid in bf16) are this far off


# Ops whose result is one of their operands, or an integer of them, computed exactly in any type
# (only a 16-bit store rounds it).
EXACT_OPS = frozenset({"Abs", "Neg", "Relu", "Relu6", "Sign", "Floor", "Ceil", "Round", "Maximum",
                       "Minimum", "Select", "ClipByValue", "Max", "Min"})


def _own_error(r, dtype: str, by_tf: bool, ir: str = ""):
    """What one op may add at its output: OP_ULPS of the compute type; for 16-bit types the
    rounding where the value leaves a kernel (half an ulp of a fused kernel's one rounding, or
    TensorFlow's own 16-bit kernel); flush-to-zero under the smallest normal."""
    if ir in EXACT_OPS:
        if COMPUTE[dtype] == dtype:
            return np.zeros(np.shape(r))
        return np.where(r == 0, 0.0, 0.5 * ulp(r, dtype))
    compute = COMPUTE[dtype]
    e = OWN_OP_ULPS.get(ir, OP_ULPS) * ulp(r, compute)
    if compute != dtype:
        e = e + (TF_16BIT_ULPS if by_tf else 0.5) * ulp(r, dtype)
    tiny = 2.0 ** _MIN_EXP[compute]
    e = e + np.where(np.abs(r) < tiny, tiny, 0.0)
    # an exact 0 is computed exactly: correctly rounded arithmetic never rounds to or from 0, and
    # the library functions are exact where they are 0 (sin 0, log 1); an underflow in float64
    # underflows in the narrower types too. (A value near 0 carries its operands' errors.)
    return np.where(r == 0, 0.0, e)


def _edges(r, e, dtype: str):
    """Unstable where a bound is not finite or the value sits at an overflow threshold of the
    compute type or of the stored type."""
    u = ~np.isfinite(e)
    a = np.abs(r)
    slack = e + ulp(r, dtype)
    for limit in {_MAX[COMPUTE[dtype]], _MAX[dtype]}:
        u = u | (np.isfinite(a) & (a - slack <= limit) & (limit < a + slack))
    return u


def _propagate(model: OpModel, xs, es, shape, ctx, ref=None, r=None):
    """(error carried over from the operands, where the op may jump).

    ref, r: the op's reference and value; where r is +-inf and the reference gives that same
    infinity at every corner of the operands' error boxes (Exp, Sinh, Pow of values far beyond
    the overflow point), the result is that infinity whatever the errors."""
    anynan = np.zeros(shape, bool)
    for x in xs:
        anynan = anynan | np.isnan(x)
    e = np.zeros(shape)
    # |derivative| at the worst corner of the operands' error boxes: a first-order bound that
    # still covers curvature (Square of a value smaller than its own error)
    corners = list(itertools.product((-1.0, 0.0, 1.0), repeat=len(xs)))
    saturated = np.zeros(shape, bool)
    if ref is not None and np.isinf(r).any():
        saturated = np.isinf(r)
        for signs in corners:
            moved = [x + s * eb if s else x for x, s, eb in zip(xs, signs, es)]
            saturated = saturated & (np.broadcast_to(ref(*moved), shape) == r)
    for deriv, ei in zip(model.derivs, es):
        d = np.zeros(shape)
        for signs in corners:
            moved = [x + s * eb if s else x for x, s, eb in zip(xs, signs, es)]
            d = np.fmax(d, np.abs(np.broadcast_to(deriv(*moved), shape)))
        contrib = np.where((np.broadcast_to(ei, shape) == 0) | anynan | saturated, 0.0, d * ei)
        e = e + np.where(np.isnan(contrib), np.inf, contrib)
    u = np.zeros(shape, bool)
    for index, dist in model.critical:
        dd = np.broadcast_to(dist(*xs), shape)
        ei = np.broadcast_to(es[index], shape)
        u = u | (dd < ei) | ((dd == 0) & (ei > 0))
    if model.unstable is not None:
        u = u | np.broadcast_to(model.unstable(xs, es, ctx), shape)
    return e, u


# Accumulator of a reduction: the kernel's (docs/PROGRAM.md: f16/bf16 in f32, f32 and f64 in
# f64) and TensorFlow's (tensorflow/core/kernels/reduction_ops.h: bf16 Sum in float, everything
# else -- f16 Sum, f16/bf16 Mean and Prod -- in the type itself).
def _accumulator(op: str, dtype: str, by_tf: bool) -> str:
    if op in ("Max", "Min"):
        return dtype if dtype in FLOATS else "f64"
    if not by_tf:
        return "f32" if dtype in ("f16", "bf16") else "f64"
    if op == "Sum" and dtype == "bf16":
        return "f32"
    return dtype


def _gamma(n: int, acc: str) -> float:
    """The classic bound of n roundings in a row, whatever the order: n u / (1 - n u)."""
    nu = n * unit_roundoff(acc)
    return nu / (1 - nu) if nu < 1 else np.inf


def _reduce_reference(node, x, e, u, dtype: str, by_tf: bool):
    """(value, bound, unstable) of a reduction, keep_dims form."""
    rank = x.ndim
    axes = tuple(sorted({a % rank for a in node.attrs["axes"]}))
    kw = dict(axis=axes, keepdims=True)
    n = int(np.prod([x.shape[a] for a in axes]))
    op = node.ir_name
    reference_ = catalog.for_ir_name(op).reference

    def ref(*args, **kwargs):
        with warnings.catch_warnings():  # np.mean of an empty slice: NaN, as TensorFlow's
            warnings.simplefilter("ignore", RuntimeWarning)
            return reference_(*args, **kwargs)

    unstable = np.any(u, **kw)
    if dtype == "i32":
        r = ref(x.astype(np.int32), axes=axes).astype(np.int64)
        return (r + 2**31) % 2**32 - 2**31, np.zeros(r.shape), unstable
    r = ref(x, axes=axes)
    finite = np.isfinite(x)
    magnitude = np.abs(np.where(finite, x, 0.0))
    ef = np.where(finite, e, 0.0)
    acc = _accumulator(op, dtype, by_tf)
    if op in ("Max", "Min"):
        return r, np.max(ef, initial=0.0, **kw), unstable
    gamma = _gamma(n, acc)
    if op == "Prod":
        # The true product of finite values: 0 when one is 0, where numpy's float64 product may
        # have overflowed first (inf * 0 = NaN), and exp(sum of logs) where it over- or
        # underflowed although the product itself fits. Its sign is that of every factor's
        # sign bit, -0.0 included (a zero product is -0.0 after an odd number of them).
        all_finite = np.all(finite, **kw)
        has_zero = np.any(x == 0, **kw)
        sign = np.prod(np.copysign(1.0, np.where(finite, x, 1.0)), **kw)
        robust = sign * np.where(has_zero, 0.0, np.exp(
            np.sum(np.log(np.where(x == 0, 1.0, magnitude)), **kw)))
        r = np.where(all_finite & (has_zero | ~np.isfinite(r) | (r == 0)), robust, r)
        # |prod(x + d) - prod(x)| <= prod(|x| + e) - prod(|x|), exactly (expand the product);
        # the n - 1 roundings add gamma_n of the computed magnitude, prod(|x| + e) at most
        top = magnitude + ef
        upper = np.exp(np.sum(np.log(top), **kw))
        positive = np.all(magnitude > 0, **kw)
        ratio = np.where(magnitude > 0, ef / np.where(magnitude > 0, magnitude, 1.0), 0.0)
        grown = np.exp(np.sum(np.log(magnitude + (magnitude == 0)), **kw)) * np.expm1(
            np.sum(np.log1p(ratio), **kw))
        bound = np.where(positive, grown, upper) + gamma * upper
        # partial products may overflow, or underflow (and flush) and be scaled back up, in an
        # order the final product does not show
        big = np.exp(np.sum(np.log(np.maximum(top, 1.0)), **kw))
        exact_zero = (x == 0) & (e == 0)
        small = np.where((magnitude < 1) & ~exact_zero, np.maximum(magnitude - ef, 0.0), 1.0)
        smallest = np.exp(np.sum(np.log(small), **kw))
        unstable = unstable | ((big >= _MAX[acc]) & (has_zero | (np.abs(r) < _MAX[acc])))
        unstable = unstable | ((smallest < 2.0 ** _MIN_EXP[acc]) & (big > 1))
        return r, bound, unstable
    # Sum, Mean: the operands' bounds add up; n roundings of partial sums at most |x| summed
    # each; a partial sum flushed to zero loses at most the smallest normal
    total = np.sum(magnitude, **kw)
    bound = np.sum(ef, **kw) + gamma * total + n * 2.0 ** _MIN_EXP[acc]
    unstable = unstable | (total + np.sum(ef, **kw) >= _MAX[acc])  # a partial sum may overflow
    if op == "Mean":
        bound = bound / n if n else np.zeros_like(bound)
        if by_tf and dtype in ("f16", "bf16"):
            # TensorFlow divides by the count rounded to the 16-bit type (inf beyond 65504)
            count = float(np.array(n, np.float64).astype(np_dtype(dtype)))
            if not np.isfinite(count):
                unstable = np.ones_like(unstable)
            elif n:
                bound = bound + np.abs(r) * abs(n / count - 1)
    return r, bound, unstable


_EXACT_ON_ITSELF = {"Sub", "SquaredDifference", "Div", "FloorDiv", "FloorMod"} | COMPARISON_NAMES


def _tf_clip(x, lo, hi):
    """TensorFlow's ClipByValue: max(min(x, hi), lo) of std::min/max, so lo wins when lo > hi and
    a NaN bound is ignored (a NaN x stays NaN)."""
    m = np.where(hi < x, hi, x)
    return np.where(m < lo, lo, m)


def _bias_view(bias, rank: int, fmt: str):
    return bias if fmt != "NCHW" else bias.reshape(bias.shape + (1,) * (rank - 2))


def _composite_reference(node, xs, es, us, dtype: str, by_tf: bool):
    """(value, bound, unstable) of a TF op the catalog lowers to several IR ops (COMPOSITES):
    the value its catalog reference gives; the bound and unstable mask of the IR ops its emit
    gives, each through `_node_reference` in turn (TensorFlow's 16-bit kernel rounds each of them
    to the type, which the rounding `_own_error` adds per op covers; inside it as inside a fused
    kernel, a 16-bit value beyond the type's range makes its readers unstable)."""
    from tensorflow.core.framework import node_def_pb2

    entry = catalog.tf_op(node.tf_op)
    values = list(zip(xs, es, us))  # the operands, then each IR op's result
    tf_node = node_def_pb2.NodeDef(op=node.tf_op)
    tf_node.attr["T"].type = ENUMS[dtype]
    for key, value in node.attrs.items():
        tf_node.attr[key].f = value

    def em(op, operands, attrs=()):
        spec = catalog.for_ir_name(op)
        ids, args = [], []
        for k, operand in enumerate(operands):
            if isinstance(operand, tuple):  # ("value", index), as `em` returns them
                ids.append(operand[1])
                args.append(values[operand[1]])
            else:  # an immediate, exact
                ids.append(-1 - k)
                number = np.int64(operand) if dtype == "i32" else np.float64(operand)
                args.append((number, np.zeros(()), np.zeros((), bool)))
        result = "bool" if spec.result == "bool" or spec.dtypes == catalog.BOOL else dtype
        step = Node(op, op, tuple(ids), node.shape, result, dict(attrs))
        r, e, u = _node_reference(step, *map(list, zip(*args)), result, by_tf)
        if result in FLOATS:
            u = u | _beyond_range(r, e, result)
        values.append((r, e, u))
        return ("value", len(values) - 1)

    out = entry.emit(em, tf_node, [("value", i) for i in range(len(xs))], None)
    _, e, u = values[out[1]]
    r = entry.reference(*xs, **{key: node.attrs[key] for key in entry.attrs})
    return np.broadcast_to(r, node.shape), e, u


def _node_reference(node, xs, es, us, dtype: str, by_tf: bool):
    """(value, bound, unstable) of one node from its operands'. Values are f64 for floats, int64
    (wrapped) for i32, bool for bool."""
    shape, ir = node.shape, node.ir_name
    if ir in COMPOSITE_NAMES:
        return _composite_reference(node, xs, es, us, dtype, by_tf)
    if ir == "Tile":  # copies, exact
        reps = node.attrs["multiples"]
        return (catalog.tf_op("Tile").reference(xs[0], reps), np.tile(es[0], reps),
                np.tile(us[0], reps))
    zeros = np.zeros(shape)
    if ir == "BiasAdd":  # the bias as TensorFlow broadcasts it
        fmt, rank = node.attrs["data_format"], len(shape)
        xs, es, us = ([a[0], _bias_view(a[1], rank, fmt)] for a in (xs, es, us))
    anyu = np.zeros(shape, bool)
    if ir not in REDUCE_NAMES and ir != "View":
        for ui in us:
            anyu = anyu | np.broadcast_to(ui, shape)
    if ir in REDUCE_NAMES:
        r, e, u = _reduce_reference(node, xs[0], es[0], us[0], dtype, by_tf)
        r, e, u = r.reshape(shape), e.reshape(shape), u.reshape(shape)
        if dtype == "i32":
            return r, e, u
        e = e + _own_error(r, dtype, by_tf, ir)
        return r, e, u | _edges(r, e, dtype)
    if ir == "View":
        return xs[0].reshape(shape), es[0].reshape(shape), us[0].reshape(shape)
    if ir in ("ZerosLike", "OnesLike"):
        value = 0 if ir == "ZerosLike" else 1
        kind = {"bool": bool, "i32": np.int64}.get(dtype, np.float64)
        return np.full(shape, value, kind), zeros, np.zeros(shape, bool)
    if (ir in _EXACT_ON_ITSELF and len(xs) == 2 and node.operands[0] == node.operands[1]
            and xs[0].dtype == np.float64):
        # x - x, x == x, x // x...: both operands are the same value in either path, so the
        # result is exact given x (0, 1, true, false), whatever x's error; x / x may be 0 / 0
        x, ex = xs[0], es[0]
        r = np.broadcast_to(catalog.for_ir_name(ir).reference(x, x), shape)
        if dtype == "bool":
            return r, zeros, anyu
        u = anyu | ((ex > 0) & (np.abs(x) <= ex) & (ir in ("Div", "FloorDiv", "FloorMod")))
        r = np.asarray(r, np.float64)
        e = _own_error(r, dtype, by_tf, ir)
        return r, e, u | _edges(r, e, dtype)
    if dtype == "bool":
        spec = catalog.for_ir_name(ir)
        r = np.broadcast_to(spec.reference(*xs), shape)
        if ir in COMPARISON_NAMES and xs[0].dtype == np.float64:
            # a comparison of values closer than their errors may come out either way
            gap = np.broadcast_to(np.abs(xs[0] - xs[1]), shape)
            err = np.broadcast_to(es[0] + es[1], shape)
            anyu = anyu | ((err > 0) & (gap <= err))
        return r, zeros, anyu
    if ir == "Select":
        c, x, y = xs
        r = np.broadcast_to(np.where(c, x, y), shape)
        e = np.broadcast_to(np.where(c, es[1], es[2]), shape)
        u = np.broadcast_to(us[0] | np.where(c, us[1], us[2]), shape)
        if dtype == "i32":
            return r, zeros, u
        e = e + _own_error(r, dtype, by_tf, ir)
        return r, e, u | _edges(r, e, dtype)
    if dtype == "i32":
        if ir == "AddN":
            r = np.sum(np.stack([np.broadcast_to(x, shape) for x in xs]), axis=0)
        elif ir == "ClipByValue":
            r = _tf_clip(*xs)
        elif ir == "BiasAdd":
            r = xs[0] + xs[1]
        else:
            r = catalog.for_ir_name(ir).reference(*xs)
        r = np.broadcast_to(r, shape).astype(np.int64)
        return (r + 2**31) % 2**32 - 2**31, zeros, anyu
    if ir == "Cast":
        x = xs[0]
        stored = x.astype(np_dtype(dtype)).astype(np.float64)  # overflows like the target
        r = np.where(np.isinf(stored) & np.isfinite(x), stored, x)
        # rounding to the target, possibly through f32 first (double rounding): one ulp of it;
        # flush-to-zero of a result under the target's smallest normal
        tiny = 2.0 ** _MIN_EXP[dtype]
        e = es[0] + ulp(r, dtype) + np.where(np.abs(r) < tiny, tiny, 0.0)
        u = us[0]
    elif ir == "AddN":
        xs = [np.broadcast_to(x, shape) for x in xs]
        r = np.sum(np.stack(xs), axis=0)
        # len - 1 additions in the compute type (TensorFlow's 16-bit AddN in the type itself)
        acc = dtype if by_tf else COMPUTE[dtype]
        magnitude = np.sum(np.stack([np.abs(x) for x in xs]), axis=0)
        e = sum(np.broadcast_to(ei, shape) for ei in es) + \
            _gamma(len(xs) - 1, acc) * np.where(np.isfinite(magnitude), magnitude, 0.0)
        u = anyu
    elif ir == "ClipByValue":
        r = np.broadcast_to(_tf_clip(*xs), shape)
        e = np.maximum(np.maximum(es[0], es[1]), es[2]) + zeros  # 1-Lipschitz in each operand
        u = anyu
    else:
        if ir == "BiasAdd":
            model, ref = ERROR_MODEL["Add"], np.add
        else:
            model = op_model(ir, node.attrs)
            spec = catalog.for_ir_name(ir)
            ref = (lambda *a: spec.reference(*a, **node.attrs)) if spec.attrs else spec.reference
        r = np.broadcast_to(ref(*xs), shape).astype(np.float64)
        ctx = types.SimpleNamespace(compute=COMPUTE[dtype], dtype=dtype)
        e, u = _propagate(model, xs, es, shape, ctx, ref, r)
        u = u | anyu
        if ir == "Relu":
            # The sign of Relu(-0.0) is unspecified: TensorFlow's own float32 Relu gives +0 from
            # its vectorised loop and -0 from its scalar one (its 16-bit ones -0), the fused
            # kernel -0. A zero operand that is -0.0, or may be computed as one, makes every
            # reader of the sign (1 / x) unstable; the value itself compares equal either way.
            x = np.broadcast_to(xs[0], shape)
            u = u | ((x == 0) & (np.signbit(x) | (np.broadcast_to(es[0], shape) > 0)))
    r = np.asarray(r, np.float64)
    e = e + _own_error(r, dtype, by_tf, ir)
    return r, e, u | _edges(r, e, dtype)


def _beyond_range(r, e, dtype: str):
    """Where a 16-bit value may lie beyond its type's range: stored (at a kernel's output, or
    by TensorFlow's own op) it is +-inf, inside a fused kernel, which computes in f32, it stays
    finite. Which of the two its readers see depends on where the partition puts the kernel
    boundaries, so everything computed from it is unstable."""
    if COMPUTE.get(dtype, dtype) == dtype:
        return False
    a = np.abs(r)
    return np.isfinite(a) & (a + e + ulp(r, dtype) > _MAX[dtype])


def reference(spec: GraphSpec, data: dict, tf_nodes=None):
    """Per value: (value, bound E, unstable mask). f64 for floats, wrapped int64 for i32, bool.

    tf_nodes: indices of nodes TensorFlow itself computed in the fused run (left unfused, or
    constant-folded); None: all of them may be. For 16-bit types such a node may be off by
    TF_16BIT_ULPS of the stored type, a fused one by half an ulp (its one rounding); a reduction
    TensorFlow computed accumulates in TensorFlow's accumulator type. The readers of a 16-bit
    value beyond its type's range are unstable (_beyond_range).
    """
    vals, bounds, unstable, beyond = [], [], [], []
    for v, item in enumerate(spec.values):
        dtype = spec.dtype_of(v)
        if isinstance(item, Input) or v in spec.fed:
            x = data[v]
            vals.append(x.astype({"i32": np.int64, "bool": bool}.get(dtype, np.float64)))
            bounds.append(np.zeros(x.shape))
            unstable.append(np.zeros(x.shape, bool))
            beyond.append(False)
            continue
        by_tf = tf_nodes is None or v in tf_nodes
        operands = item.operands
        with np.errstate(all="ignore"):
            r, e, u = _node_reference(item, [vals[o] for o in operands],
                                      [bounds[o] for o in operands],
                                      [unstable[o] | beyond[o] for o in operands], dtype, by_tf)
            if item.ir_name == "Div" and COMPUTE[dtype] != dtype and foldable(
                    spec.values, operands[1]):
                # Grappler turns x / c into x * (1 / c), 1 / c rounded to the 16-bit type: up
                # to an ulp of the type, relative, in both runs
                e = e + np.abs(r) * 2.0 ** -_MANTISSA[dtype]
            beyond.append(_beyond_range(r, e, dtype))
        vals.append(np.asarray(r))
        bounds.append(np.asarray(e, np.float64))
        unstable.append(np.asarray(u, bool))
    return vals, bounds, unstable


@dataclasses.dataclass
class Outcome:
    fused_kernels: int = 0
    reduce_kernels: int = 0
    elements: int = 0
    unstable: int = 0


def compare(spec: GraphSpec, v: int, fused, unfused, r, e, u) -> tuple[int, Optional[str]]:
    """(unstable elements, failure message or None) for fetched node v."""
    node = spec.values[v]
    dtype = node.dtype
    what = f"{spec.name(v)} ({node.tf_op}) {dtype}{list(node.shape)}"
    fused, unfused = np.asarray(fused), np.asarray(unfused)
    if fused.shape != tuple(node.shape) or fused.shape != unfused.shape:
        return 0, f"{what}: shape fused {fused.shape} unfused {unfused.shape}"
    if fused.dtype != unfused.dtype:
        return 0, f"{what}: dtype fused {fused.dtype} unfused {unfused.dtype}"
    u = u.ravel()
    if dtype in ("i32", "bool"):
        f, t, rr = fused.ravel(), unfused.ravel(), r.ravel()
        if dtype == "i32":
            f, t = f.astype(np.int64), t.astype(np.int64)
        # equal to TensorFlow always (bool: or to the reference); to the reference wherever
        # TensorFlow is
        if dtype == "i32":
            ok = u | ((f == t) & ((f == rr) | (t != rr)))
        else:
            ok = u | (f == t) | (f == rr)
        if ok.all():
            return int(u.sum()), None
        bad = np.flatnonzero(~ok)[:6]
        return int(u.sum()), (f"{what}: mismatch at {bad}: fused {f[bad]} unfused {t[bad]} "
                              f"ref {rr[bad]}")
    f, t = fused.astype(np.float64).ravel(), unfused.astype(np.float64).ravel()
    r, e = r.ravel(), e.ravel()
    tol = e + ulp(r, dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        same_class = (np.isnan(f) & np.isnan(t)) | (np.isinf(f) & (f == t))
        f_fin, t_fin = np.isfinite(f), np.isfinite(t)
        both = f_fin & t_fin & (np.abs(f - r) <= np.abs(t - r) + tol)
        # unfused overflowed or went NaN where the reference is finite (a 16-bit intermediate
        # beyond 65504): its error is infinite, a finite fused result is no worse. How close
        # fused gets depends on where the partition still rounds to 16 bits.
        better = f_fin & ~t_fin & np.isfinite(r)
        # TensorFlow is off the reference and fused is on it (TF's f64 Erf(+-inf) is NaN)
        stored = r.astype(np_dtype(dtype)).astype(np.float64)  # overflows like the dtype
        right = (np.isnan(f) & np.isnan(r)) | (np.isinf(f) & (f == stored))
        ok = u | same_class | both | better | right | (f_fin & t_fin & (f == t))
    if ok.all():
        return int(u.sum()), None
    bad = np.flatnonzero(~ok)[:6]
    rows = "; ".join(f"[{i}] fused={f[i]!r} unfused={t[i]!r} ref={r[i]!r} tol={tol[i]:.3g}"
                     for i in bad)
    return int(u.sum()), f"{what}: {np.count_nonzero(~ok)} of {f.size} elements off: {rows}"


def rewriter_flags(spec: GraphSpec):
    """The flags object the session's parameter_map makes (tf_autofuse.flags)."""
    from tf_autofuse.flags import Flags

    return Flags().with_overrides(spec.params, source="random graph")


def check_structure(spec: GraphSpec, graph) -> int:
    """The rewriter's invariants on this graph; returns how many fusions it made."""
    graph_def = graph.as_graph_def()
    preserve = [spec.name(v) for v in spec.fetches] + [spec.name(v) for v in spec.fed]
    feeds = [spec.name(v) for v in spec.fed]
    flags = rewriter_flags(spec)
    result = rewriter.rewrite(graph_def, preserve=preserve, feeds=feeds, flags=flags)
    out = {n.name: n for n in result.graph_def.node}
    read = {i.split(":")[0] for n in graph_def.node for i in n.input if not i.startswith("^")}
    # a member nothing reads can only be there to be fetched: it keeps its name too
    kept = set(preserve) | {n.name for n in graph_def.node if n.name not in read}
    for name in preserve:
        assert name in out, f"preserved node {name} is gone"
    for node in result.graph_def.node:  # no input names a node that is gone
        for text in node.input:
            assert text.lstrip("^").split(":")[0] in out, f"{node.name} reads missing {text}"
    for fusion in result.fusions:
        assert out[fusion.name].op == rewriter.FUSED_OP
        for member in fusion.nodes:
            assert member not in feeds, f"fed node {member} was fused"
            if member in kept:
                node = out[member]
                assert node.op == "Identity" and node.input[0].split(":")[0] == fusion.name, node
            else:
                assert member not in out, f"fused member {member} is still in the graph"
    again = rewriter.rewrite(result.graph_def, preserve=preserve, feeds=feeds, flags=flags)
    assert not again.fusions, "the second pass fused again"
    assert again.graph_def.SerializeToString(deterministic=True) == \
        result.graph_def.SerializeToString(deterministic=True), "the second pass changed the graph"
    direct = rewriter.optimize(graph_def, preserve=preserve, feeds=feeds, flags=flags)
    assert direct.SerializeToString(deterministic=True) == \
        result.graph_def.SerializeToString(deterministic=True), "optimize() is not deterministic"
    return len(result.fusions)


def _empty_extremum(spec: GraphSpec) -> bool:
    for node in spec.nodes:
        if node.ir_name in ("Max", "Min"):
            shape = spec.shape_of(node.operands[0])
            if any(shape[a] == 0 for a in node.attrs["axes"]):
                return True
    return False


def _half_sums(spec: GraphSpec) -> bool:
    """Does the graph add in a 16-bit type with AddN? Grappler's AddOpsRewrite regroups a tree
    of AddN/Add into one AddN, rounding each partial sum in the type, and whether it meets the
    tree depends on the optimizers the session runs (a session with a custom optimizer sees it
    rewritten where one without does not): the two runs would differ before fusion starts."""
    return any(n.tf_op == "AddN" and spec.dtype_of(v) in ("f16", "bf16")
               for v, n in zip(spec.node_indices(), spec.nodes))


def check_spec(spec: GraphSpec) -> Outcome:
    """Run one random graph all ways and assert every property. Returns counts."""
    data = make_data(spec)
    graph, fetches, feeds = build_graph(spec, data)
    check_structure(spec, graph)
    # With a fed intermediate, TensorFlow's own arithmetic optimizer can ignore the feed, fused
    # or not (x + x -> Mul(2, x) and x * x -> Square(x) rewire the consumers of a fed x + x or
    # x * x to a new node: a TensorFlow bug), so such graphs run without it. So do graphs with
    # a Max or Min over nothing: it rewrites Max(f(x)) as f(Max(x)) for monotonic f, wrong when
    # the reduction is empty (-max(sigmoid(x)) of an empty x is -0.0 instead of +inf).
    # So do graphs with 16-bit AddN trees (_half_sums).
    arithmetic = not spec.fed and not _empty_extremum(spec) and not _half_sums(spec)
    # TensorFlow's remapper (its oneDNN patterns) rewrites Maximum(Mul(c, x), x) as
    # LeakyRelu(x, c) whatever c is (wrong for c > 1: max(3x, x) is 3x where x > 0), and
    # x * sigmoid(x) as one _MklSwish even when the sigmoid is fetched (then the fetch fails).
    # Whether it meets those patterns depends on the graph it sees, which fusion changes, so
    # graphs with a Maximum or a fetched Sigmoid run without it, fused or not.
    remapping = not any(n.ir_name == "Maximum" or (n.ir_name == "Sigmoid" and v in spec.fetches)
                        for v, n in zip(spec.node_indices(), spec.nodes))
    unfused, _ = run_session(graph, fetches, feeds, fuse=False, arithmetic=arithmetic,
                             remapping=remapping)
    _warn.reset()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", _warn.AutofuseWarning)
        fused, executed = run_session(graph, fetches, feeds, fuse=True, arithmetic=arithmetic,
                                      params=spec.params, remapping=remapping)
    said = [str(w.message) for w in said if issubclass(w.category, _warn.AutofuseWarning)]
    assert not said, spec.describe() + "\n" + "\n".join(said)  # the pass failed: unfused
    # nodes TensorFlow computed in the fused run: still there under their name, as their own
    # op or a folded Const (a fused member is gone, or an Identity of its kernel)
    tf_nodes = {v for v in spec.node_indices()
                if executed.get(spec.name(v), "Identity") != "Identity"}
    vals, bounds, unstable = reference(spec, data, tf_nodes)
    kernels = [n for n, op in executed.items() if op == "AutofuseKernel"]
    outcome = Outcome(len(kernels), sum(n.startswith("autofuse_reduce") for n in kernels))
    failures = []
    for value_f, value_t, v in zip(fused, unfused, spec.fetches):
        n_unstable, message = compare(spec, v, value_f, value_t, vals[v], bounds[v], unstable[v])
        outcome.elements += np.asarray(value_f).size
        outcome.unstable += n_unstable
        if message:
            failures.append(message)
    assert not failures, spec.describe() + "\n" + "\n".join(failures)
    return outcome


# ---------------------------------------------------------------------------------------------
# The tests

CI_EXAMPLES = int(os.environ.get("TF_AUTOFUSE_FUZZ_EXAMPLES", "400"))
CI_REDUCE_EXAMPLES = int(os.environ.get("TF_AUTOFUSE_FUZZ_REDUCE_EXAMPLES", "300"))


def _catalog_ops_drawn(specs) -> tuple:
    """(TF op types, IR ops) the specs hold."""
    tf_ops = {n.tf_op for s in specs for n in s.nodes}
    ir_ops = {n.ir_name for s in specs for n in s.nodes}
    return tf_ops, ir_ops


def test_generator_covers_the_op_table():
    """Every TF op type and IR op of the catalog is drawn, in every dtype it allows."""
    specs = [generate(RandomChooser(np.random.default_rng([3, i])), features)
             for features in (Features(), ALL) for i in range(1000)]
    tf_ops, ir_ops = _catalog_ops_drawn(specs)
    assert not set(catalog.TF_OPS) - tf_ops, sorted(set(catalog.TF_OPS) - tf_ops)
    assert not {s.ir_name for s in catalog.OPS} - ir_ops, \
        sorted({s.ir_name for s in catalog.OPS} - ir_ops)
    by_dtype = {(n.ir_name, s.dtype_of(n.operands[0])) for s in specs for n in s.nodes}
    missing = sorted((spec.ir_name, d) for spec in catalog.OPS for d in DTYPES + ("bool",)
                     if ENUMS[d] in spec.dtypes and spec.operand_roles()[0] == "data"
                     and (spec.ir_name, d) not in by_dtype)
    assert not missing, missing
    drawn = {(n.tf_op, s.dtype_of(n.operands[0])) for s in specs for n in s.nodes}
    missing = sorted((e.op_type, d) for e in COMPOSITES for d in DTYPES
                     if ENUMS[d] in e.dtypes and (e.op_type, d) not in drawn)
    assert not missing, missing
    # the reduction shapes the kernel has modes for, and the edges
    reductions = [(s.shape_of(n.operands[0]), n.attrs) for s in specs for n in s.nodes
                  if n.ir_name in REDUCE_NAMES]
    lengths = {int(np.prod([sh[a] for a in at["axes"]])) for sh, at in reductions}
    assert 0 in lengths and 1 in lengths and max(lengths) > 4096
    assert {at["keep_dims"] for _, at in reductions} == {True, False}


def test_error_model_covers_the_catalog():
    """Every float op the generator draws has an error model (a derivative-based one, or a case
    of its own in `_node_reference`)."""
    own_cases = {"Cast", "ZerosLike", "OnesLike", "Select"} | REDUCE_NAMES
    missing = sorted(s.ir_name for s in catalog.OPS
                     if not catalog.FLOAT.isdisjoint(s.dtypes) and s.result == "same"
                     and s.ir_name not in ERROR_MODEL and s.ir_name not in ATTR_MODELS
                     and s.ir_name not in own_cases)
    assert not missing, f"add these ops to ERROR_MODEL in {__file__}: {missing}"


def _hypothesis():
    return pytest.importorskip("hypothesis")


def _run_hypothesis(features: Features, examples: int) -> list:
    hypothesis = _hypothesis()
    from hypothesis import strategies as st

    stats = []

    @hypothesis.settings(max_examples=examples, derandomize=True, deadline=None,
                         database=None, print_blob=True,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(st.data())
    def prop(data):
        spec = generate(HypothesisChooser(data), features)
        outcome = check_spec(spec)
        stats.append(outcome)
        worst.append((outcome.unstable / max(outcome.elements, 1), spec.describe()))

    worst = []
    prop()
    fused = sum(1 for s in stats if s.fused_kernels)
    elements = sum(s.elements for s in stats)
    unstable = sum(s.unstable for s in stats)
    print(f"\n{len(stats)} graphs, {fused} with fused kernels "
          f"({sum(1 for s in stats if s.reduce_kernels)} with reductions), {elements} elements "
          f"compared, {unstable} unstable")
    assert fused >= len(stats) // 4, "too few graphs fused: the test is not exercising fusion"
    # most of each graph is compared (a total would be one 100k-element graph's say)
    mean = sum(fraction for fraction, _ in worst) / max(len(worst), 1)
    assert mean <= 0.1, (mean, max(worst))
    return stats


def test_random_graphs_match_unfused_and_float64():
    _run_hypothesis(Features(), CI_EXAMPLES)


def test_random_graphs_with_reductions_and_broadcast():
    stats = _run_hypothesis(ALL, CI_REDUCE_EXAMPLES)
    assert sum(1 for s in stats if s.reduce_kernels) >= len(stats) // 8, \
        "too few graphs with a fused reduction"


def test_random_graphs_with_broadcast_operands():
    rng = np.random.default_rng(20261203)
    for _ in range(25):
        check_spec(generate(RandomChooser(rng), Features(broadcast=True)))


VIEWS_BETWEEN = Features(broadcast=True, reductions=True, flags=True, value_views=True)


def test_random_graphs_with_views_between_ops():
    """Views of the graph's own values between fused ops: those that add or drop leading
    size-1 axes join the group as aliases of their operand (a Sum with keep_dims and the
    Reshape after it), the others stay TensorFlow's."""
    rng = np.random.default_rng(20261205)
    aliased = 0
    for _ in range(150):
        spec = generate(RandomChooser(rng), VIEWS_BETWEEN)
        check_spec(spec)
        graph, _, _ = build_graph(spec, make_data(spec))
        result = rewriter.rewrite(
            graph.as_graph_def(), preserve=[spec.name(v) for v in spec.fetches + spec.fed],
            feeds=[spec.name(v) for v in spec.fed], flags=rewriter_flags(spec))
        aliased += sum(1 for f in result.fusions for n in f.nodes
                       if graph.get_operation_by_name(n).type in VIEWS)
    assert aliased >= 10, f"only {aliased} views fused as aliases"


def test_generator_is_deterministic():
    a = generate(RandomChooser(np.random.default_rng(7)), ALL)
    b = generate(RandomChooser(np.random.default_rng(7)), ALL)
    assert a.describe() == b.describe()
