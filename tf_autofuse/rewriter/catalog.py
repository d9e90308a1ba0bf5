"""The one table of operators the rewriter can fuse.

Each entry says what the partitioner needs (TF op types, kind, arity, dtypes), what the
program text calls it (`ir_name`, see docs/PROGRAM.md), a numpy reference used as the golden
result in tests (float64 capable), its cost on a CPU core, and algebraic facts the passes use
(transcendental, never negative). The partitioner, the cost models, the IR passes and the
program printer read this table; the C++ kernel's OpCode enum and op table are generated from
it when the library is built (catalog_cc.py), and the Ascend generator's op map
(codegen/opmap.py) is checked against it.

Adding an op: a row here, its kernel body in the CPU interpreter (cc/cpu/ops.h and its entry in
CpuKernelsOf, or `cpu_refusal` here), and its Ascend C mapping or stated refusal in opmap.py.
A TF op that is a formula of the table's ops (the gradient ops) is a TfOp instead: an `emit`
writing that formula and a `reference` (see `_GRADIENTS`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

import numpy as np
from tensorflow.core.framework import node_def_pb2, types_pb2

# The kinds of op the partitioner knows (it reads kinds, never op names):
#   elementwise  one operand, the result has its shape
#   broadcast    several operands that broadcast numpy-style to the result's shape
#   reduce       one operand reduced over axes given by a Const (IR attr `axes=`)
#   view         a free reshape (Reshape, Squeeze, ExpandDims): absorbed as an input view
#   expand       one operand repeated along its size-1 axes (a Tile that is a broadcast): no
#                instruction, its readers read the operand broadcast to its shape
ELEMENTWISE = "elementwise"
BROADCAST = "broadcast"
REDUCE = "reduce"
VIEW = "view"
EXPAND = "expand"

# Grappler's arithmetic optimizer folds CPU chains of unary ops into this op; attr `op_names`.
COMPOSITION_OP = "_UnaryOpsComposition"

FLOAT = frozenset(
    {types_pb2.DT_HALF, types_pb2.DT_BFLOAT16, types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE}
)
FLOAT_I32 = FLOAT | {types_pb2.DT_INT32}
BOOL = frozenset({types_pb2.DT_BOOL})
ANY = FLOAT_I32 | BOOL


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """An operator of the program text (docs/PROGRAM.md)."""

    tf_ops: tuple[str, ...]  # TF op types that mean exactly this op (one node, same operands)
    ir_name: str  # the op's name in the program text
    kind: str
    arity: int
    dtypes: frozenset  # allowed DataType enums of its data operands
    reference: Callable[..., np.ndarray]  # numpy golden implementation (attrs as keywords)
    attrs: frozenset = frozenset()  # attr keys the program text gives it (axes=, to=, alpha=)
    result: str = "same"  # the result dtype: "same", "bool", or "to" (the to= attr)
    roles: tuple = ()  # per operand "data" or "bool" (Select's condition); () all data
    # What one fp32 element costs on a CPU core, in cheap ops (add, mul, abs: 1), as the CPU
    # kernel computes it: the one cost figure of an op, read by the rewriter's cost models
    # (cost.py) and the kernel's thread-pool estimate (which its own timing refines), both through
    # element_cost. Right within ~2x is enough; scripts/op_costs.py measures it.
    cost: int = 1
    # Evaluates an exp, log, trigonometric or hyperbolic function (or one built on them) per
    # element: an op the compute_density model never repeats (cost.py), and one that f64
    # computes with the C library's scalar function (element_cost).
    transcendental: bool = False
    # Its float value is never below -0 (or is NaN), whatever the operands: a Relu of it is the
    # value itself (the simplify pass, passes.py, drops such a Relu).
    never_negative: bool = False
    # Why the CPU kernel does not run it (the partitioner refuses it with this reason); None: the
    # interpreter has a kernel for it, which the build checks.
    cpu_refusal: Optional[str] = None

    def operand_roles(self) -> tuple:
        return self.roles or ("data",) * self.arity


def _quiet(fn):
    """Run a reference without numpy's overflow / invalid-value warnings."""

    def run(*args, **attrs):
        with np.errstate(all="ignore"):
            return fn(*(np.asarray(a) for a in args), **attrs)

    return run


_SELU_SCALE = 1.0507009873554805
_SELU_ALPHA = 1.6732632423543772
_erf = np.vectorize(math.erf, otypes=[np.float64])
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _sigmoid(x):
    e = np.exp(-np.abs(x))  # never overflows
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)


def _erf_ref(x):
    return _erf(x.astype(np.float64)).astype(x.dtype) if x.size else x.copy()


def _erfc_ref(x):
    return _erfc(x.astype(np.float64)).astype(x.dtype) if x.size else x.copy()


def _spec(tf_ops, ir_name, arity, dtypes, reference, **more):
    if isinstance(tf_ops, str):
        tf_ops = (tf_ops,)
    kind = more.pop("kind", ELEMENTWISE if arity == 1 else BROADCAST)
    return OpSpec(tuple(tf_ops), ir_name, kind, arity, dtypes, _quiet(reference), **more)


def _floormod(x, y):
    mod = np.fmod(x, y)
    return np.where((mod != 0) & ((y < 0) != (mod < 0)), mod + y, mod).astype(mod.dtype)


def _cast(x, to):
    return x.astype(to)


def _reduction(fn):
    def reduce(x, axes):
        return fn(x, axis=tuple(axes), keepdims=True)

    return reduce


def _extremum(fn, largest: bool):
    """Max / Min; an empty reduction gives the identity, as in TensorFlow (Max: -inf, INT_MIN)."""

    def reduce(x, axes):
        if np.issubdtype(x.dtype, np.integer):
            info = np.iinfo(x.dtype)
            initial = info.min if largest else info.max
        else:
            initial = -np.inf if largest else np.inf
        return fn(x, axis=tuple(axes), keepdims=True, initial=initial)

    return reduce


def _mean(x, axes):
    if np.issubdtype(x.dtype, np.integer):
        # TensorFlow sums int32 in int64 (no wrap) and divides with truncation; nothing -> 0
        count = int(np.prod([x.shape[a] for a in axes]))
        total = np.sum(x.astype(np.int64), axis=tuple(axes), keepdims=True)
        if count == 0:
            return np.zeros_like(total).astype(x.dtype)
        return (np.sign(total) * (np.abs(total) // count)).astype(x.dtype)
    return np.mean(x, axis=tuple(axes), keepdims=True)


OPS: tuple[OpSpec, ...] = (
    _spec("Abs", "Abs", 1, FLOAT_I32, np.abs, never_negative=True),
    _spec("Neg", "Neg", 1, FLOAT_I32, np.negative),
    _spec("Relu", "Relu", 1, FLOAT_I32, lambda x: np.maximum(x, x.dtype.type(0)),
          never_negative=True),
    _spec("Relu6", "Relu6", 1, FLOAT_I32,
          lambda x: np.minimum(np.maximum(x, 0), 6).astype(x.dtype), cost=3, never_negative=True),
    _spec("Elu", "Elu", 1, FLOAT, lambda x: np.where(x < 0, np.expm1(x), x),
          cost=30, transcendental=True),
    _spec("Selu", "Selu", 1, FLOAT,
          lambda x: np.where(x < 0, _SELU_SCALE * _SELU_ALPHA * np.expm1(x),
                             _SELU_SCALE * x).astype(x.dtype),
          cost=30, transcendental=True),
    _spec("Exp", "Exp", 1, FLOAT, np.exp, cost=4, transcendental=True, never_negative=True),
    _spec("Expm1", "Expm1", 1, FLOAT, np.expm1, cost=28, transcendental=True),
    _spec("Log", "Log", 1, FLOAT, np.log, cost=11, transcendental=True),
    _spec("Log1p", "Log1p", 1, FLOAT, np.log1p, cost=15, transcendental=True),
    _spec("Sqrt", "Sqrt", 1, FLOAT, np.sqrt, cost=3),
    _spec("Rsqrt", "Rsqrt", 1, FLOAT, lambda x: 1 / np.sqrt(x), cost=3),
    _spec("Square", "Square", 1, FLOAT_I32, lambda x: x * x, never_negative=True),
    _spec(("Reciprocal", "Inv"), "Reciprocal", 1, FLOAT, lambda x: 1 / x, cost=2),
    _spec("Sigmoid", "Sigmoid", 1, FLOAT, _sigmoid,
          cost=8, transcendental=True, never_negative=True),
    _spec("Tanh", "Tanh", 1, FLOAT, np.tanh, cost=4, transcendental=True),
    _spec("Softplus", "Softplus", 1, FLOAT, lambda x: np.logaddexp(x.dtype.type(0), x),
          cost=30, transcendental=True),
    _spec("Softsign", "Softsign", 1, FLOAT, lambda x: x / (1 + np.abs(x)), cost=4),
    _spec("Sign", "Sign", 1, FLOAT_I32, np.sign, cost=2),
    _spec("Floor", "Floor", 1, FLOAT, np.floor),
    _spec("Ceil", "Ceil", 1, FLOAT, np.ceil),
    _spec("Round", "Round", 1, FLOAT, np.round),  # numpy rounds half to even, as TF does
    _spec("Erf", "Erf", 1, FLOAT, _erf_ref, cost=5, transcendental=True),
    _spec("Erfc", "Erfc", 1, FLOAT, _erfc_ref, cost=11, transcendental=True,
          never_negative=True),
    _spec("Sin", "Sin", 1, FLOAT, np.sin, cost=9, transcendental=True),
    _spec("Cos", "Cos", 1, FLOAT, np.cos, cost=9, transcendental=True),
    _spec(("AddV2", "Add"), "Add", 2, FLOAT_I32, np.add),
    _spec("Sub", "Sub", 2, FLOAT_I32, np.subtract),
    _spec("Mul", "Mul", 2, FLOAT_I32, np.multiply),
    _spec("RealDiv", "Div", 2, FLOAT, np.divide, cost=4),
    _spec("Maximum", "Maximum", 2, FLOAT_I32, np.maximum, cost=2),
    _spec("Minimum", "Minimum", 2, FLOAT_I32, np.minimum, cost=2),
    _spec("SquaredDifference", "SquaredDifference", 2, FLOAT_I32, lambda x, y: (x - y) * (x - y)),
    _spec("Tan", "Tan", 1, FLOAT, np.tan, cost=280, transcendental=True),
    _spec("Atan", "Atan", 1, FLOAT, np.arctan, cost=160, transcendental=True),
    _spec("Sinh", "Sinh", 1, FLOAT, np.sinh, cost=250, transcendental=True),
    _spec("Cosh", "Cosh", 1, FLOAT, np.cosh, cost=120, transcendental=True),
    _spec("IsNan", "IsNan", 1, FLOAT, np.isnan, result="bool"),
    _spec("IsInf", "IsInf", 1, FLOAT, np.isinf, result="bool"),
    _spec("IsFinite", "IsFinite", 1, FLOAT, np.isfinite, result="bool"),
    _spec("LogicalNot", "LogicalNot", 1, BOOL, np.logical_not),
    _spec("ZerosLike", "ZerosLike", 1, ANY, np.zeros_like),
    _spec("OnesLike", "OnesLike", 1, ANY, np.ones_like),
    _spec("Cast", "Cast", 1, FLOAT, _cast, attrs=frozenset({"to"}), result="to"),
    _spec("LeakyRelu", "LeakyRelu", 1, FLOAT,
          lambda x, alpha: np.where(x < 0, x * x.dtype.type(alpha), x).astype(x.dtype),
          attrs=frozenset({"alpha"})),
    _spec("Pow", "Pow", 2, FLOAT, np.power, cost=120, transcendental=True),
    _spec("FloorDiv", "FloorDiv", 2, FLOAT, lambda x, y: np.floor(x / y), cost=4),
    _spec("FloorMod", "FloorMod", 2, FLOAT, _floormod, cost=70),
    _spec("Greater", "Greater", 2, FLOAT_I32, np.greater, result="bool"),
    _spec("GreaterEqual", "GreaterEqual", 2, FLOAT_I32, np.greater_equal, result="bool"),
    _spec("Less", "Less", 2, FLOAT_I32, np.less, result="bool"),
    _spec("LessEqual", "LessEqual", 2, FLOAT_I32, np.less_equal, result="bool"),
    _spec("Equal", "Equal", 2, FLOAT_I32, np.equal, result="bool"),
    _spec("NotEqual", "NotEqual", 2, FLOAT_I32, np.not_equal, result="bool"),
    _spec("LogicalAnd", "LogicalAnd", 2, BOOL, np.logical_and),
    _spec("LogicalOr", "LogicalOr", 2, BOOL, np.logical_or),
    _spec(("SelectV2", "Select"), "Select", 3, FLOAT_I32, np.where, roles=("bool", "data", "data")),
    _spec("Sum", "Sum", 1, FLOAT_I32, _reduction(np.sum), kind=REDUCE, attrs=frozenset({"axes"})),
    _spec("Mean", "Mean", 1, FLOAT_I32, _mean, kind=REDUCE, attrs=frozenset({"axes"})),
    _spec("Max", "Max", 1, FLOAT_I32, _extremum(np.max, True), kind=REDUCE,
          attrs=frozenset({"axes"})),
    _spec("Min", "Min", 1, FLOAT_I32, _extremum(np.min, False), kind=REDUCE,
          attrs=frozenset({"axes"})),
    _spec("Prod", "Prod", 1, FLOAT_I32, _reduction(np.prod), kind=REDUCE,
          attrs=frozenset({"axes"})),
)

_BY_TF_OP = {tf_op: spec for spec in OPS for tf_op in spec.tf_ops}
_BY_IR_NAME = {spec.ir_name: spec for spec in OPS}


def for_tf_op(op_type: str) -> Optional[OpSpec]:
    """The IR op a TF op type means one to one (same operands), or None.

    TF ops that lower to something else (AddN, ClipByValue, BiasAdd) or to nothing (the view
    ops) are not here: see `tf_op`.
    """
    return _BY_TF_OP.get(op_type)


def for_ir_name(name: str) -> Optional[OpSpec]:
    """The entry for an op name of the program text, or None."""
    return _BY_IR_NAME.get(name)


def candidate_op_types() -> frozenset:
    """Every TF op type that can be fused (the bridge skips graphs holding none)."""
    return frozenset(k for k, v in TF_OPS.items() if v.kind != VIEW) | {COMPOSITION_OP}


def dtype_name(dtype: int) -> str:
    """DT_FLOAT etc. for messages."""
    try:
        return types_pb2.DataType.Name(dtype)
    except ValueError:
        return f"DataType({dtype})"


# --- TF ops: how each TF op type is fused ------------------------------------------------------

IR_DTYPES = {
    types_pb2.DT_HALF: "f16",
    types_pb2.DT_BFLOAT16: "bf16",
    types_pb2.DT_FLOAT: "f32",
    types_pb2.DT_DOUBLE: "f64",
    types_pb2.DT_INT32: "i32",
    types_pb2.DT_BOOL: "bool",
}


class Unsupported(ValueError):
    """A node the catalog cannot fuse as it is; the message is the refusal reason."""


@dataclasses.dataclass(frozen=True)
class TfOp:
    """How the partitioner and the lowering treat one TF op type.

    dtype_attr: the attr holding the compute dtype (None: the op is bool only).
    n_data: data operands (the first inputs); None: every input (AddN). Further inputs are
      static (a Const: reduction_indices, Reshape's shape, ExpandDims' dim).
    check(node) -> reason or None: attrs the fused program cannot express.
    operand_dtypes(node, n) -> the DataType of each data operand.
    result_dtype(node) -> the DataType of the output.
    operand_shapes(node, shapes) -> the shapes the operands broadcast as (BiasAdd NCHW views
      its bias [C] as [C,1,1]); raises Unsupported.
    emit(em, node, operands, axes) -> the Ref of the result; em(ir_op, operands, attrs).
    ir_ops: the IR ops it may emit (their dtypes are checked against the node's).
    n_static: the static inputs after the data operands (a reduction's reduction_indices).
    axes(node, inputs, rank, const_of) -> (sorted axes, keep_dims) of a REDUCE op; raises
      Unsupported. None: the reduction_indices Const (reduce_axes).
    immediates: a scalar Const operand may be an immediate; False: it is an input (an op
      whose emit has instructions that read one operand alone, which need a value there).
    reference: the numpy golden (float64 capable) of an op that lowers to several IR ops,
      operands in the TF op's input order, `attrs` as keywords; None: its IR ops' own.
    attrs: the node attrs its emit and reference read (the tests draw them).
    result_shape(node, inputs, shapes, const_of) -> the output's static shape from the data
      operands' (an EXPAND op's); raises Unsupported. None: their numpy broadcast.
    """

    op_type: str
    kind: str
    dtypes: frozenset
    ir_ops: tuple
    emit: Callable
    dtype_attr: Optional[str] = "T"
    n_data: Optional[int] = 1
    check: Optional[Callable] = None
    result_dtype: Optional[Callable] = None
    operand_dtypes: Optional[Callable] = None
    operand_shapes: Optional[Callable] = None
    n_static: int = 0
    axes: Optional[Callable] = None
    immediates: bool = True
    reference: Optional[Callable] = None
    attrs: frozenset = frozenset()
    result_shape: Optional[Callable] = None

    def compute_dtype(self, node) -> Optional[int]:
        if self.dtype_attr is None:
            return types_pb2.DT_BOOL
        return node.attr[self.dtype_attr].type if self.dtype_attr in node.attr else None

    def data_operands(self, node, n_inputs: int) -> int:
        return n_inputs if self.n_data is None else self.n_data

    def n_inputs(self) -> Optional[int]:
        """The inputs a node of the op has; None: any number (AddN)."""
        return None if self.n_data is None else self.n_data + self.n_static

    def reduction(self, node, inputs, rank: Optional[int], const_of) -> tuple:
        """(normalised sorted axes, keep_dims) of a REDUCE op; raises Unsupported."""
        return (self.axes or reduce_axes)(node, inputs, rank, const_of)

    def dtypes_of_operands(self, node, n: int) -> list:
        if self.operand_dtypes is not None:
            return self.operand_dtypes(node, n)
        return [self.compute_dtype(node)] * n

    def output_dtype(self, node) -> Optional[int]:
        if self.result_dtype is not None:
            return self.result_dtype(node)
        return self.compute_dtype(node)


def _attr_bool(node, key: str, default: bool) -> bool:
    return node.attr[key].b if key in node.attr else default


def _attr_s(node, key: str, default: str) -> str:
    return node.attr[key].s.decode() if key in node.attr else default


def _emit_plain(ir_name):
    return lambda em, node, operands, axes: em(ir_name, operands)


def _emit_cast(em, node, operands, axes):
    return em("Cast", operands, (("to", IR_DTYPES[node.attr["DstT"].type]),))


def _check_cast(node):
    src = node.attr["SrcT"].type if "SrcT" in node.attr else None
    dst = node.attr["DstT"].type if "DstT" in node.attr else None
    if src not in FLOAT or dst not in FLOAT:
        return f"Cast from {dtype_name(src)} to {dtype_name(dst)} (only between float types)"
    if _attr_bool(node, "Truncate", False):
        return "Cast with Truncate=true"
    return None


def _leaky_alpha(node) -> float:
    alpha = float(node.attr["alpha"].f) if "alpha" in node.attr else 0.2
    if not math.isfinite(alpha):
        raise Unsupported(f"{node.op} alpha {alpha} is not finite")
    return alpha


def _emit_leaky(em, node, operands, axes):
    return em("LeakyRelu", operands, (("alpha", repr(_leaky_alpha(node))),))


def _check_equal(node):
    if not _attr_bool(node, "incompatible_shape_error", True):
        return f"{node.op} with incompatible_shape_error=false"
    return None


def _emit_addn(em, node, operands, axes):
    # values first, so that no Add has only immediates (TF's AddN sums in no fixed order)
    operands = [o for o in operands if not _is_immediate(o)] + [
        o for o in operands if _is_immediate(o)]
    total = operands[0]
    for operand in operands[1:]:
        total = em("Add", [total, operand])
    return total


def _is_immediate(operand) -> bool:
    return isinstance(operand, (bool, int, float))


def _emit_clip(em, node, operands, axes):
    # TensorFlow's ClipByValue is max(min(x, hi), lo) of std::min / std::max: lo wins where
    # lo > hi, a NaN bound is ignored (a NaN x stays NaN), and of two equal values the first is
    # kept (clip(-0.0, -0.0, 0.0) is -0.0: 1 / it is -inf). Minimum and Maximum (NaN if either
    # operand is; the sign of a zero result unspecified) say the same for int32 and for a finite
    # non-zero immediate bound; a tensor bound, which may hold NaN, and a zero bound take
    # std::min's own comparison: min(v, hi) = hi < v ? hi : v.
    x, low, high = operands
    exact = node.attr["T"].type == types_pb2.DT_INT32 if "T" in node.attr else False

    # Of two immediates (a constant x and bound) the result is one of them, computed here
    # exactly as std::min / std::max would: no instruction of immediates only is emitted.
    def clamp(value, bound, ir_op, bound_wins):
        if _is_immediate(value) and _is_immediate(bound):
            less = bound_wins(value, bound)
            return bound if less[0] < less[1] else value
        if exact or (_is_immediate(bound) and bound != 0):
            return em(ir_op, [value, bound])
        return em("Select", [em("Less", bound_wins(value, bound)), bound, value])

    upper = clamp(x, high, "Minimum", lambda v, b: [b, v])
    return clamp(upper, low, "Maximum", lambda v, b: [v, b])


def _check_bias_add(node):
    fmt = _attr_s(node, "data_format", "NHWC")
    if fmt not in ("NHWC", "NCHW"):
        return f"{node.op} data_format {fmt}"
    return None


def _bias_shapes(node, shapes):
    value, bias = shapes
    if _attr_s(node, "data_format", "NHWC") != "NCHW":
        return shapes
    if value is None or bias is None:
        raise Unsupported("BiasAdd NCHW needs the ranks of value and bias")
    if len(bias) != 1 or len(value) < 2:
        raise Unsupported("BiasAdd NCHW needs a bias vector and a value of rank >= 2")
    return [value, tuple(bias) + (1,) * (len(value) - 2)]


def _select_shapes(node, shapes):
    cond, x, y = shapes
    if node.op == "Select":  # v1: cond has x's shape, or is a scalar (or a vector of rows)
        if cond != () and (cond is None or x is None or cond != x or any(d == -1 for d in x)):
            raise Unsupported("Select (v1) whose condition is neither a scalar nor x's shape")
    return shapes


def _emit_reduce(ir_name):
    return lambda em, node, operands, axes: em(ir_name, operands, (("axes", axes),))


def _bool_result(node):
    return types_pb2.DT_BOOL


def _select_dtypes(node, n):
    t = node.attr["T"].type if "T" in node.attr else None
    return [types_pb2.DT_BOOL, t, t]


def _cast_dtypes(node, n):
    return [node.attr["SrcT"].type if "SrcT" in node.attr else None]


# --- the gradient ops ---------------------------------------------------------------------------
#
# Each lowers to the IR ops of TensorFlow's CPU kernel, operation for operation and in its order
# (tensorflow/core/kernels/relu_op_functor.h, cwise_ops_gradients.h, softplus_op.h,
# softsign_op.h), so that an f32 or f64 result is TensorFlow's bit for bit, NaN, +-inf and -0
# included: both run under TensorFlow's flush-to-zero. Where Eigen's vectorised form of a formula
# and its scalar one associate differently (SigmoidGrad, SqrtGrad), the program computes the
# vectorised one, which TensorFlow runs on all but the last (size mod packet size) elements.
# SoftplusGrad's exp is the kernel's own (within 1.02 ulps; Eigen's, TensorFlow's: 1.28), so its
# results are a few ulps from TensorFlow's, not the same bits.

# TensorFlow's SELU constants as its gradient kernel writes them (scale * alpha is the nearest
# double to the product, not the product of the two doubles)
_SELU_GRAD_SCALE = 1.0507009873554804934193349852946
_SELU_GRAD_SCALE_ALPHA = 1.7580993408473768599402175208123


def _typed(node, value):
    """static_cast<T>(value) for the node's T: an int for int32, else the nearest value of T (a
    16-bit kernel's constants are 16-bit values)."""
    dtype = node.attr["T"].type if "T" in node.attr else types_pb2.DT_FLOAT
    if dtype == types_pb2.DT_INT32:
        return int(value)
    from tensorflow.python.framework import dtypes

    typed = float(np.asarray(value, dtypes.as_dtype(dtype).as_numpy_dtype))
    if not math.isfinite(typed):
        raise Unsupported(f"{node.op}: the constant {value!r} is beyond the range of "
                          f"{dtype_name(dtype)}")
    return typed


def _times_indicator(em, node, cond, g):
    """g * cast<T>(cond), as the Select of g * 1 and g * 0: what the product gives (NaN for an
    infinite g, -0 for a negative one, 0 for a subnormal one under flush-to-zero)."""
    return em("Select", [cond, em("Mul", [g, _typed(node, 1)]), em("Mul", [g, _typed(node, 0)])])


def _mul_no_nan(em, node, a, b):
    """Eigen's mul_no_nan(a, b): +0 where b == 0 (even for a NaN or infinite a), else a * b."""
    zero = _typed(node, 0)
    return em("Select", [em("Equal", [b, zero]), zero, em("Mul", [a, b])])


def _emit_relu_grad(em, node, operands, axes):
    gradients, features = operands
    return _times_indicator(em, node, em("Greater", [features, _typed(node, 0)]), gradients)


def _emit_relu6_grad(em, node, operands, axes):
    gradients, features = operands
    inside = em("LogicalAnd", [em("Greater", [features, _typed(node, 0)]),
                               em("Less", [features, _typed(node, 6)])])
    return _times_indicator(em, node, inside, gradients)


def _emit_leaky_relu_grad(em, node, operands, axes):
    gradients, features = operands
    scaled = em("Mul", [gradients, _typed(node, _leaky_alpha(node))])
    return em("Select", [em("Greater", [features, _typed(node, 0)]), gradients, scaled])


def _emit_elu_grad(em, node, operands, axes):
    gradients, outputs = operands
    negative = em("Mul", [em("Add", [outputs, _typed(node, 1)]), gradients])
    return em("Select", [em("Less", [outputs, _typed(node, 0)]), negative, gradients])


def _emit_selu_grad(em, node, operands, axes):
    gradients, outputs = operands
    negative = em("Mul", [gradients, em("Add", [outputs, _typed(node, _SELU_GRAD_SCALE_ALPHA)])])
    positive = em("Mul", [gradients, _typed(node, _SELU_GRAD_SCALE)])
    return em("Select", [em("Less", [outputs, _typed(node, 0)]), negative, positive])


def _emit_sigmoid_grad(em, node, operands, axes):
    y, dy = operands
    return em("Mul", [dy, em("Mul", [y, em("Sub", [_typed(node, 1), y])])])


def _emit_tanh_grad(em, node, operands, axes):
    y, dy = operands
    return em("Mul", [dy, em("Sub", [_typed(node, 1), em("Mul", [y, y])])])


def _emit_reciprocal_grad(em, node, operands, axes):
    y, dy = operands
    return _mul_no_nan(em, node, em("Neg", [em("Mul", [y, y])]), dy)


def _emit_sqrt_grad(em, node, operands, axes):
    y, dy = operands
    return _mul_no_nan(em, node, em("Div", [_typed(node, 0.5), y]), dy)


def _emit_rsqrt_grad(em, node, operands, axes):
    y, dy = operands
    factor = em("Mul", [_typed(node, -0.5), em("Mul", [y, y])])
    return _mul_no_nan(em, node, factor, _mul_no_nan(em, node, y, dy))


def _emit_softplus_grad(em, node, operands, axes):
    gradients, features = operands
    one = _typed(node, 1)
    return em("Div", [gradients, em("Add", [em("Exp", [em("Neg", [features])]), one])])


def _emit_softsign_grad(em, node, operands, axes):
    gradients, features = operands
    one = _typed(node, 1)
    return em("Div", [gradients, em("Square", [em("Add", [em("Abs", [features]), one])])])


def _no_nan_where(b, value):
    return np.where(b == 0, np.zeros_like(value), value)


def _rsqrt_grad_ref(y, dy):
    inner = _no_nan_where(dy, y * dy)
    return _no_nan_where(inner, -0.5 * (y * y) * inner)


# (TF op types, dtypes, emit, numpy reference in the TF op's input order, attrs it reads)
_GRADIENTS = (
    (("ReluGrad",), FLOAT_I32, _emit_relu_grad, lambda g, f: g * (f > 0), ()),
    (("Relu6Grad",), FLOAT_I32, _emit_relu6_grad, lambda g, f: g * ((f > 0) & (f < 6)), ()),
    (("LeakyReluGrad",), FLOAT, _emit_leaky_relu_grad,
     lambda g, f, alpha: np.where(f > 0, g, g * alpha), ("alpha",)),
    (("EluGrad",), FLOAT, _emit_elu_grad, lambda g, y: np.where(y < 0, (y + 1) * g, g), ()),
    (("SeluGrad",), FLOAT, _emit_selu_grad,
     lambda g, y: np.where(y < 0, g * (y + _SELU_GRAD_SCALE_ALPHA), g * _SELU_GRAD_SCALE), ()),
    (("SigmoidGrad",), FLOAT, _emit_sigmoid_grad, lambda y, dy: dy * (y * (1 - y)), ()),
    (("TanhGrad",), FLOAT, _emit_tanh_grad, lambda y, dy: dy * (1 - y * y), ()),
    (("ReciprocalGrad", "InvGrad"), FLOAT, _emit_reciprocal_grad,
     lambda y, dy: _no_nan_where(dy, -(y * y) * dy), ()),
    (("SqrtGrad",), FLOAT, _emit_sqrt_grad, lambda y, dy: _no_nan_where(dy, 0.5 / y * dy), ()),
    (("RsqrtGrad",), FLOAT, _emit_rsqrt_grad, _rsqrt_grad_ref, ()),
    (("SoftplusGrad",), FLOAT, _emit_softplus_grad, lambda g, f: g / (np.exp(-f) + 1), ()),
    (("SoftsignGrad",), FLOAT, _emit_softsign_grad,
     lambda g, f: g / np.square(np.abs(f) + 1), ()),
)


def _traced_ir_ops(op_type: str, emit, n_data: int) -> tuple:
    """The IR ops `emit` gives for a float node of `op_type`, in order (its cost weights)."""
    ops = []

    def em(ir_op, operands, attrs=()):
        ops.append(ir_op)
        return ("traced", len(ops))

    node = node_def_pb2.NodeDef(op=op_type)
    node.attr["T"].type = types_pb2.DT_FLOAT
    emit(em, node, [("operand", i) for i in range(n_data)], None)
    return tuple(ops)


def _gradient_ops() -> dict:
    table = {}
    for op_types, dtypes, emit, reference, attrs in _GRADIENTS:
        for op_type in op_types:
            table[op_type] = TfOp(op_type, BROADCAST, dtypes, _traced_ir_ops(op_type, emit, 2),
                                  emit, n_data=2, immediates=False, reference=_quiet(reference),
                                  attrs=frozenset(attrs))
    return table


def _tile_shape(node, inputs, shapes, const_of) -> tuple:
    """Tile's output shape when it repeats size-1 axes only, i.e. is a numpy broadcast of its
    operand; raises Unsupported."""
    (shape,) = shapes
    multiples = _const_ints(const_of, inputs[1], "Tile's multiples")
    if shape is None:
        raise Unsupported("Tile of a tensor of unknown rank")
    if len(multiples) != len(shape):
        raise Unsupported(f"Tile multiples {multiples} for a tensor of rank {len(shape)}")
    tiled = []
    for axis, (size, times) in enumerate(zip(shape, multiples)):
        if times == 1 or (size == 1 and times >= 0):
            tiled.append(size * times)
            continue
        raise Unsupported(f"Tile repeats axis {axis} of size {'?' if size < 0 else size} "
                          f"{times} times: only repeated size-1 axes are a broadcast, which "
                          "is what a fused program reads")
    return tuple(tiled)


def bias_grad_axes(rank: int, data_format: str) -> tuple:
    """The axes BiasAddGrad sums: every axis but the channels, the last one (NHWC, and NCHW of
    rank 2) or axis 1 (NCHW of rank 3 and more)."""
    channels = 1 if data_format == "NCHW" and rank >= 3 else rank - 1
    return tuple(a for a in range(rank) if a != channels)


def _bias_grad_reduction(node, inputs, rank, const_of) -> tuple:
    if rank is None:
        raise Unsupported(f"{node.op} over an operand of unknown rank")
    if rank < 2:
        raise Unsupported(f"{node.op} of a rank-{rank} value (TensorFlow needs rank >= 2)")
    axes = bias_grad_axes(rank, _attr_s(node, "data_format", "NHWC"))
    if axes[-1] - axes[0] != len(axes) - 1:
        raise Unsupported(f"{node.op} NCHW sums axes {list(axes)}, on both sides of the "
                          "channels; a fused program reduces one run of consecutive axes")
    return axes, False


def cpu_refusal_reason(spec: OpSpec) -> Optional[str]:
    """Why an op cannot be fused (the CPU kernel does not run it), or None."""
    if spec.cpu_refusal is None:
        return None
    return f"{spec.ir_name} has no CPU kernel: {spec.cpu_refusal}"


def _cpu_refused(spec):
    reason = cpu_refusal_reason(spec)
    return lambda node: reason


def _direct(op_type, **more):
    spec = for_tf_op(op_type)
    return TfOp(op_type, spec.kind, spec.dtypes, (spec.ir_name,), _emit_plain(spec.ir_name),
                n_data=spec.arity, **more)


def _build_tf_ops() -> dict:
    table = {}
    special = {"Cast", "LeakyRelu", "Sum", "Mean", "Max", "Min", "Prod", "Select", "SelectV2",
               "LogicalNot", "LogicalAnd", "LogicalOr", "IsNan", "IsInf", "IsFinite", "Greater",
               "GreaterEqual", "Less", "LessEqual", "Equal", "NotEqual"}
    for spec in OPS:
        for op_type in spec.tf_ops:
            if op_type not in special:
                table[op_type] = _direct(op_type)
    for op_type in ("IsNan", "IsInf", "IsFinite", "Greater", "GreaterEqual", "Less", "LessEqual"):
        table[op_type] = _direct(op_type, result_dtype=_bool_result)
    for op_type in ("Equal", "NotEqual"):
        table[op_type] = _direct(op_type, result_dtype=_bool_result, check=_check_equal)
    for op_type in ("LogicalNot", "LogicalAnd", "LogicalOr"):
        table[op_type] = _direct(op_type, dtype_attr=None)
    for op_type in ("Select", "SelectV2"):
        table[op_type] = _direct(op_type, operand_dtypes=_select_dtypes,
                                 operand_shapes=_select_shapes)
    table["Cast"] = TfOp("Cast", ELEMENTWISE, FLOAT, ("Cast",), _emit_cast, dtype_attr="SrcT",
                         check=_check_cast, operand_dtypes=_cast_dtypes,
                         result_dtype=lambda node: node.attr["DstT"].type)
    table["LeakyRelu"] = TfOp("LeakyRelu", ELEMENTWISE, FLOAT, ("LeakyRelu",), _emit_leaky)
    table["AddN"] = TfOp("AddN", BROADCAST, FLOAT_I32, ("Add",), _emit_addn, n_data=None)
    table["ClipByValue"] = TfOp("ClipByValue", BROADCAST, FLOAT_I32,
                                ("Maximum", "Minimum", "Less", "Select"), _emit_clip, n_data=3)
    table["BiasAdd"] = TfOp("BiasAdd", BROADCAST, FLOAT_I32, ("Add",), _emit_plain("Add"),
                            n_data=2, check=_check_bias_add, operand_shapes=_bias_shapes)
    for op_type in ("Sum", "Mean", "Max", "Min", "Prod"):
        table[op_type] = TfOp(op_type, REDUCE, FLOAT_I32, (op_type,), _emit_reduce(op_type),
                              n_static=1)
    table.update(_gradient_ops())
    table["BiasAddGrad"] = TfOp(
        "BiasAddGrad", REDUCE, FLOAT_I32, ("Sum",), _emit_reduce("Sum"), check=_check_bias_add,
        axes=_bias_grad_reduction,
        reference=_quiet(lambda x, data_format: np.sum(x, axis=bias_grad_axes(x.ndim,
                                                                               data_format))),
        attrs=frozenset({"data_format"}))
    table["Tile"] = TfOp("Tile", EXPAND, ANY, (), lambda em, node, operands, axes: operands[0],
                         n_static=1, immediates=False, result_shape=_tile_shape,
                         reference=_quiet(np.tile))
    for op_type in ("Reshape", "Squeeze", "ExpandDims"):
        table[op_type] = TfOp(op_type, VIEW, ANY, (), None)
    for op_type, entry in table.items():  # a TF op lowering to an op the CPU kernel refuses
        refused = [_BY_IR_NAME[ir] for ir in entry.ir_ops if _BY_IR_NAME[ir].cpu_refusal]
        if refused:
            table[op_type] = dataclasses.replace(entry, check=_cpu_refused(refused[0]))
    return table


TF_OPS: dict = _build_tf_ops()


def tf_op(op_type: str) -> Optional[TfOp]:
    """How a TF op type is fused, or None when it is not."""
    return TF_OPS.get(op_type)


def is_view(op_type: str) -> bool:
    """A TF op that only reshapes its input (Reshape, Squeeze, ExpandDims: kind VIEW)."""
    entry = TF_OPS.get(op_type)
    return entry is not None and entry.kind == VIEW


# --- static shapes ----------------------------------------------------------------------------


def fully_known(shape) -> bool:
    """A known rank and every size known (no -1 for unknown, no symbol below it)."""
    return shape is not None and all(d >= 0 for d in shape)


def broadcast_dim(a: int, b: int) -> Optional[int]:
    """numpy's rule on two sizes (-1 unknown, <= -2 symbolic); None when it cannot be told.

    An unknown size against a known size > 1 gives the known size: whatever the unknown size
    is at run time (1 or that size; anything else is an error in TF and in the kernel alike).
    Two different unknown sizes give no static size: refused (conservative).
    """
    if a == b and a != -1:
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    if a < 0 and b > 1:
        return b
    if b < 0 and a > 1:
        return a
    return None


def broadcast_shapes(shapes) -> tuple:
    """The numpy broadcast of known-rank shapes; raises Unsupported unless provable."""
    rank = max(len(s) for s in shapes)
    result = [1] * rank
    for shape in shapes:
        padded = (1,) * (rank - len(shape)) + tuple(shape)
        for i, d in enumerate(padded):
            dim = broadcast_dim(result[i], d)
            if dim is None:
                raise Unsupported(
                    "shapes " + " and ".join(_fmt(s) for s in shapes) + " not known to broadcast")
            result[i] = dim
    return tuple(result)


def _fmt(shape) -> str:
    if shape is None:
        return "[*]"
    return "[" + ",".join("?" if d < 0 else str(d) for d in shape) + "]"


def _const_ints(const_of, tensor, what: str) -> list:
    value = const_of(tensor)
    if value is None:
        raise Unsupported(f"{what} is not a Const")
    if not np.issubdtype(value.dtype, np.integer):
        raise Unsupported(f"{what} is not an integer Const")
    return [int(v) for v in np.asarray(value).reshape(-1)]


def reduce_axes(node, inputs, rank: Optional[int], const_of) -> tuple:
    """(normalised sorted axes, keep_dims) of a reduction; raises Unsupported."""
    if len(inputs) != 2:
        raise Unsupported(f"{node.op} expects 2 inputs, has {len(inputs)}")
    axes = _const_ints(const_of, inputs[1], "reduction_indices")
    if rank is None:
        raise Unsupported(f"{node.op} over an operand of unknown rank")
    normalised = []
    for axis in axes:
        if not -rank <= axis < rank:
            raise Unsupported(f"axis {axis} out of range for rank {rank}")
        normalised.append(axis % rank)
    normalised = tuple(sorted(set(normalised)))
    if not normalised:
        raise Unsupported(f"{node.op} over no axis")
    if any(b != a + 1 for a, b in zip(normalised, normalised[1:])):
        raise Unsupported(f"axes {list(normalised)} are not consecutive")
    keep = _attr_bool(node, "keep_dims", False)
    return normalised, keep


def reduced_shape(shape: tuple, axes: tuple, keep: bool) -> tuple:
    if keep:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def view_shape(node, inputs, in_shape, const_of) -> tuple:
    """The output shape of a view op (Reshape, Squeeze, ExpandDims); raises Unsupported."""
    if node.op == "Reshape":
        dims = _const_ints(const_of, inputs[1], "Reshape's shape")
        if dims.count(-1) > 1 or any(d < -1 for d in dims):
            raise Unsupported(f"Reshape to {dims}")
        if -1 in dims and in_shape is not None and all(d >= 0 for d in in_shape):
            known = int(np.prod([d for d in dims if d != -1]))
            total = int(np.prod(in_shape))
            if known == 0 or total % known:
                raise Unsupported(f"Reshape of {_fmt(in_shape)} to {dims}")
            dims = [total // known if d == -1 else d for d in dims]
        return tuple(dims)
    if in_shape is None:
        raise Unsupported(f"{node.op} of a tensor of unknown rank")
    rank = len(in_shape)
    if node.op == "Squeeze":
        listed = list(node.attr["squeeze_dims"].list.i) if "squeeze_dims" in node.attr else []
        if not listed:
            if any(d < 0 for d in in_shape):
                raise Unsupported("Squeeze of unknown sizes")
            return tuple(d for d in in_shape if d != 1)
        axes = set()
        for axis in listed:
            if not -rank <= axis < rank or in_shape[axis % rank] != 1:
                raise Unsupported(f"Squeeze axis {axis} of {_fmt(in_shape)}")
            axes.add(axis % rank)
        return tuple(d for i, d in enumerate(in_shape) if i not in axes)
    if node.op == "ExpandDims":
        (axis,) = _const_ints(const_of, inputs[1], "ExpandDims' dim")[:1] or [None]
        if axis is None or not -rank - 1 <= axis <= rank:
            raise Unsupported(f"ExpandDims axis {axis} of {_fmt(in_shape)}")
        axis = axis % (rank + 1)
        return tuple(in_shape[:axis]) + (1,) + tuple(in_shape[axis:])
    raise Unsupported(f"{node.op} is not a view op")


def output_shape(node, inputs, shapes, const_of):
    """The static output shape of a catalog op from its input shapes; None when unknown."""
    entry = tf_op(node.op)
    try:
        if node.op == COMPOSITION_OP:
            return shapes[0] if shapes else None
        if entry is None:
            return None
        if entry.kind == VIEW:
            return view_shape(node, inputs, shapes[0], const_of)
        if entry.result_shape is not None:
            return entry.result_shape(node, inputs, shapes[:1], const_of)
        if entry.kind == REDUCE:
            if shapes[0] is None:
                return None
            axes, keep = entry.reduction(node, inputs, len(shapes[0]), const_of)
            return reduced_shape(shapes[0], axes, keep)
        n = entry.data_operands(node, len(inputs))
        data = list(shapes[:n])
        if entry.operand_shapes is not None:
            data = entry.operand_shapes(node, data)
        if any(s is None for s in data) or not data:
            return None
        return broadcast_shapes(data)
    except (Unsupported, IndexError):
        return None


# --- costs (read by cost.py and, through catalog_cc.py, by the CPU kernel) ---------------------

# What an f64 element of a transcendental op costs at least, in cheap ops: f64 calls the C
# library's scalar function (within an ulp) where fp32 evaluates a vectorised approximation.
F64_SCALAR_COST = 100


def element_cost(spec: OpSpec, dtype: int) -> int:
    """What one element of `spec` computed in `dtype` costs on a CPU core, in cheap ops: the
    table's fp32 cost; f64 vectors hold half as many lanes, and an f64 transcendental is a scalar
    call. 16-bit types compute in fp32. The one rule of both cost models (cost.py, and the CPU
    kernel's through op_table.inc)."""
    if dtype != types_pb2.DT_DOUBLE:
        return spec.cost
    if spec.transcendental:
        return max(2 * spec.cost, F64_SCALAR_COST)
    return 2 * spec.cost


def tf_op_cost(op_type: str, dtype: Optional[int]) -> int:
    """What one element of a TF op type computed in `dtype` costs: the costs of the IR ops it
    lowers to (ClipByValue: its Minimum, Maximum, Less and Select). 1 for an op the table does
    not know."""
    entry = tf_op(op_type)
    if entry is None or not entry.ir_ops:
        return 1
    return sum(element_cost(_BY_IR_NAME[ir], dtype) for ir in entry.ir_ops)


def is_transcendental(op_type: str) -> bool:
    """Whether a TF op type evaluates a transcendental function per element (table: OpSpec)."""
    entry = tf_op(op_type)
    return entry is not None and any(_BY_IR_NAME[ir].transcendental for ir in entry.ir_ops)
