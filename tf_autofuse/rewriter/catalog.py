"""The one table of operators the rewriter can fuse.

Each entry says what the partitioner needs (TF op types, kind, arity, dtypes), what the
program text calls it (`ir_name`, see docs/PROGRAM.md), a numpy reference used as the golden
result in tests (float64 capable), and the Ascend C API it maps to (None: not mapped yet).
The partitioner and the program printer read this table; no other module names ops.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

import numpy as np
from tensorflow.core.framework import types_pb2

# The kinds of op the partitioner knows. Only "elementwise" exists today.
ELEMENTWISE = "elementwise"

# Grappler's arithmetic optimizer folds CPU chains of unary ops into this op; attr `op_names`.
COMPOSITION_OP = "_UnaryOpsComposition"

FLOAT = frozenset(
    {types_pb2.DT_HALF, types_pb2.DT_BFLOAT16, types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE}
)
FLOAT_I32 = FLOAT | {types_pb2.DT_INT32}


@dataclasses.dataclass(frozen=True)
class OpSpec:
    tf_ops: tuple[str, ...]  # TF op types that mean this op
    ir_name: str  # the op's name in the program text
    kind: str
    arity: int
    dtypes: frozenset  # allowed DataType enums
    reference: Callable[..., np.ndarray]  # numpy golden implementation
    ascendc: Optional[str]  # Ascend C API name, None when not mapped yet
    attrs: frozenset = frozenset()  # attr keys the program text may give it (axes=, to=)


def _quiet(fn):
    """Run a reference without numpy's overflow / invalid-value warnings."""

    def run(*args):
        with np.errstate(all="ignore"):
            return fn(*(np.asarray(a) for a in args))

    return run


_SELU_SCALE = 1.0507009873554805
_SELU_ALPHA = 1.6732632423543772
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x):
    e = np.exp(-np.abs(x))  # never overflows
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)


def _erf_ref(x):
    return _erf(x.astype(np.float64)).astype(x.dtype) if x.size else x.copy()


def _spec(tf_ops, ir_name, arity, dtypes, reference, ascendc=None):
    if isinstance(tf_ops, str):
        tf_ops = (tf_ops,)
    return OpSpec(tuple(tf_ops), ir_name, ELEMENTWISE, arity, dtypes, _quiet(reference), ascendc)


OPS: tuple[OpSpec, ...] = (
    _spec("Abs", "Abs", 1, FLOAT_I32, np.abs, "Abs"),
    _spec("Neg", "Neg", 1, FLOAT_I32, np.negative),
    _spec("Relu", "Relu", 1, FLOAT_I32, lambda x: np.maximum(x, x.dtype.type(0)), "Relu"),
    _spec("Relu6", "Relu6", 1, FLOAT_I32, lambda x: np.minimum(np.maximum(x, 0), 6).astype(x.dtype)),
    _spec("Elu", "Elu", 1, FLOAT, lambda x: np.where(x < 0, np.expm1(x), x)),
    _spec(
        "Selu",
        "Selu",
        1,
        FLOAT,
        lambda x: np.where(x < 0, _SELU_SCALE * _SELU_ALPHA * np.expm1(x), _SELU_SCALE * x).astype(
            x.dtype
        ),
    ),
    _spec("Exp", "Exp", 1, FLOAT, np.exp, "Exp"),
    _spec("Expm1", "Expm1", 1, FLOAT, np.expm1),
    _spec("Log", "Log", 1, FLOAT, np.log, "Ln"),
    _spec("Log1p", "Log1p", 1, FLOAT, np.log1p),
    _spec("Sqrt", "Sqrt", 1, FLOAT, np.sqrt, "Sqrt"),
    _spec("Rsqrt", "Rsqrt", 1, FLOAT, lambda x: 1 / np.sqrt(x), "Rsqrt"),
    _spec("Square", "Square", 1, FLOAT_I32, lambda x: x * x),
    _spec(("Reciprocal", "Inv"), "Reciprocal", 1, FLOAT, lambda x: 1 / x, "Reciprocal"),
    _spec("Sigmoid", "Sigmoid", 1, FLOAT, _sigmoid),
    _spec("Tanh", "Tanh", 1, FLOAT, np.tanh),
    _spec("Softplus", "Softplus", 1, FLOAT, lambda x: np.logaddexp(x.dtype.type(0), x)),
    _spec("Softsign", "Softsign", 1, FLOAT, lambda x: x / (1 + np.abs(x))),
    _spec("Sign", "Sign", 1, FLOAT_I32, np.sign),
    _spec("Floor", "Floor", 1, FLOAT, np.floor),
    _spec("Ceil", "Ceil", 1, FLOAT, np.ceil),
    _spec("Round", "Round", 1, FLOAT, np.round),  # numpy rounds half to even, as TF does
    _spec("Erf", "Erf", 1, FLOAT, _erf_ref),
    _spec("Sin", "Sin", 1, FLOAT, np.sin),
    _spec("Cos", "Cos", 1, FLOAT, np.cos),
    _spec(("AddV2", "Add"), "Add", 2, FLOAT_I32, np.add, "Add"),
    _spec("Sub", "Sub", 2, FLOAT_I32, np.subtract, "Sub"),
    _spec("Mul", "Mul", 2, FLOAT_I32, np.multiply, "Mul"),
    _spec("RealDiv", "Div", 2, FLOAT, np.divide, "Div"),
    _spec("Maximum", "Maximum", 2, FLOAT_I32, np.maximum, "Max"),
    _spec("Minimum", "Minimum", 2, FLOAT_I32, np.minimum, "Min"),
    _spec("SquaredDifference", "SquaredDifference", 2, FLOAT_I32, lambda x, y: (x - y) * (x - y)),
)

_BY_TF_OP = {tf_op: spec for spec in OPS for tf_op in spec.tf_ops}
_BY_IR_NAME = {spec.ir_name: spec for spec in OPS}


def for_tf_op(op_type: str) -> Optional[OpSpec]:
    """The entry for a TF op type, or None when the op is not supported."""
    return _BY_TF_OP.get(op_type)


def for_ir_name(name: str) -> Optional[OpSpec]:
    """The entry for an op name of the program text, or None."""
    return _BY_IR_NAME.get(name)


def candidate_op_types() -> frozenset:
    """Every TF op type that can start a fusion (the bridge skips graphs holding none)."""
    return frozenset(_BY_TF_OP) | {COMPOSITION_OP}


def dtype_name(dtype: int) -> str:
    """DT_FLOAT etc. for messages."""
    try:
        return types_pb2.DataType.Name(dtype)
    except ValueError:
        return f"DataType({dtype})"
