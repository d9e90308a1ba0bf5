"""Property-based equivalence: random graphs over the op table, fused vs unfused vs float64.

Each case is a random DAG of the catalog's elementwise ops (shared inputs, diamonds, constants,
shapes from 0-sized to ~100k elements, every dtype the op allows), with a random set of fetched
nodes (intermediates included) and of fed intermediates. It runs in a v1 Session without and
with the named optimizer "AutofuseOptimizer", and is also handed to the rewriter directly:

- structure: every preserved node (fetch, feed) is still there; a fused member is gone unless
  preserved (then it is an Identity of the fused kernel); fed nodes are never fused; the
  rewriter is idempotent (a second pass fuses nothing and changes no byte).
- numbers, per element: NaN and +-Inf where unfused TensorFlow has them, and
  |fused - ref| <= |unfused - ref| + E, where ref is a float64 numpy evaluation of the same
  graph (catalog references) and E a first-order bound of "a few ulps per op" of the compute
  type (f32 for f16/bf16) -- and, for f16/bf16, half an ulp of the stored type at each node,
  where a group boundary may round -- propagated through each op's derivative, plus one ulp of
  the output type. (That 16-bit slack is what a per-element check needs: across a boundary the
  unfused path's differently placed roundings can cancel by luck; the per-op "never less accurate
  in 16 bits" property is tested exactly in tests/test_kernel.py.) Elements whose value depends on which side of a discontinuity, domain edge or overflow
  threshold a few ulps land (Floor at an integer, Sqrt near 0, Exp near the overflow point) are
  counted as unstable and not compared. int32 results are compared exactly with TensorFlow and
  a wrapped int64 reference.

The generator draws through a `Chooser`, so the same code runs under hypothesis (here, CI
sized, deterministic, shrinking to a minimal graph on failure) and under a seeded numpy RNG
(scripts/fuzz_long.py). `Features(broadcast=True)` adds operands of broadcastable shapes;
reductions are the next extension point (see `Features`).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from typing import Optional, Sequence

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import rewriter_config_pb2

import tf_autofuse
from tf_autofuse import rewriter
from tf_autofuse.rewriter import catalog

tf1 = tf.compat.v1
OFF = rewriter_config_pb2.RewriterConfig.OFF

try:
    from scipy import special as _special
except ImportError:  # pragma: no cover
    _special = None

# ---------------------------------------------------------------------------------------------
# dtypes

DTYPES = ("f32", "f16", "bf16", "f64", "i32")  # simplest first: hypothesis shrinks to f32
TF_DTYPES = {"f16": tf.float16, "bf16": tf.bfloat16, "f32": tf.float32, "f64": tf.float64,
             "i32": tf.int32}
ENUMS = {"f16": types_pb2.DT_HALF, "bf16": types_pb2.DT_BFLOAT16, "f32": types_pb2.DT_FLOAT,
         "f64": types_pb2.DT_DOUBLE, "i32": types_pb2.DT_INT32}
_MANTISSA = {"f16": 10, "bf16": 7, "f32": 23, "f64": 52}
_MIN_EXP = {"f16": -14, "bf16": -126, "f32": -126, "f64": -1022}
_MAX = {"f16": 65504.0, "bf16": 3.3895313892515355e38, "f32": 3.4028234663852886e38,
        "f64": 1.7976931348623157e308}
COMPUTE = {"f16": "f32", "bf16": "f32", "f32": "f32", "f64": "f64"}  # what the kernel computes in
OP_ULPS = 4  # "a few ulps" of the compute type that each op may be off by, in either path


def np_dtype(dtype):
    return TF_DTYPES[dtype].as_numpy_dtype


def ulp(values, dtype):
    """Spacing of `dtype` at |values| (subnormal spacing near 0; 0 where not finite)."""
    a = np.abs(np.asarray(values, np.float64))
    finite = np.isfinite(a)
    safe = np.where(finite & (a > 0), a, 2.0 ** _MIN_EXP[dtype])
    exponent = np.maximum(np.floor(np.log2(safe)), _MIN_EXP[dtype])
    return np.where(finite, np.ldexp(1.0, (exponent - _MANTISSA[dtype]).astype(np.int64)), 0.0)


# ---------------------------------------------------------------------------------------------
# The error model: for each IR op, |d out / d operand_i| and the distance from each operand to
# the nearest point where the op jumps or leaves its domain (None: it has none).

def _sig(x):
    return _special.expit(x) if _special is not None else 1 / (1 + np.exp(-x))


_SELU_SCALE, _SELU_ALPHA = 1.0507009873554805, 1.6732632423543772
_ONE = lambda *xs: np.ones_like(xs[0])  # noqa: E731
_ZERO = lambda *xs: np.zeros_like(xs[0])  # noqa: E731


def _dist_int(x):
    return np.abs(x - np.round(x))


def _dist_half(x):
    return np.abs(x - (np.floor(x) + 0.5))


@dataclasses.dataclass(frozen=True)
class OpModel:
    derivs: tuple  # one callable per operand: f64 operands -> |partial derivative|
    critical: tuple = ()  # (operand index, f64 operands -> distance to a jump / domain edge)


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
    "Add": OpModel((_ONE, _ONE)),
    "Sub": OpModel((_ONE, _ONE)),
    "Mul": OpModel((lambda a, b: np.abs(b), lambda a, b: np.abs(a))),
    "Div": OpModel((lambda a, b: 1 / np.abs(b), lambda a, b: np.abs(a) / (b * b)),
                   ((1, lambda a, b: np.abs(b)),)),
    "Maximum": OpModel((_ONE, _ONE)),
    "Minimum": OpModel((_ONE, _ONE)),
    "SquaredDifference": OpModel((lambda a, b: 2 * np.abs(a - b), lambda a, b: 2 * np.abs(a - b))),
}


def fuzzable_ops(dtype: str) -> list:
    """Catalog entries the generator draws from for `dtype` (elementwise, with an error model)."""
    enum = ENUMS[dtype]
    return [s for s in catalog.OPS
            if s.kind == catalog.ELEMENTWISE and enum in s.dtypes and s.ir_name in ERROR_MODEL]


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
    """What the generator may use. Today's rewriter fuses same-shape elementwise ops only.

    broadcast: binary operands of broadcastable shapes ([N,C] + [C], [1,C], [N,1]).
    reductions: not there yet. To add them: an entry in ERROR_MODEL-like table for reduce ops
    (the bound of a sum is the sum of the bounds plus n ulps of the result), a branch in
    `generate` that appends a Node with `axes`, `build_graph` creating tf.raw_ops.Sum etc., and
    `reference` calling the catalog's reference with the axes.
    """

    broadcast: bool = False
    reductions: bool = False
    max_nodes: int = 12


# Shapes: simplest first. 0-sized, 1, primes, a few tiles, ~100k elements (many tiles, threads).
SHAPES = [(7,), (1,), (0,), (2, 3), (13, 17), (1, 1, 1), (3, 0, 2), (1031,), (61, 67),
          (4, 4099), (100_003,)]


@dataclasses.dataclass
class Input:
    shape: tuple  # the runtime shape
    declared: str  # "static", "unknown_dims", "unknown_rank"
    const: bool = False  # a Const node holding the data instead of a placeholder


@dataclasses.dataclass
class Node:
    tf_op: str
    ir_name: str
    operands: tuple  # indices into values: inputs first, then nodes
    shape: tuple


@dataclasses.dataclass
class GraphSpec:
    dtype: str
    inputs: list
    nodes: list
    fetches: list  # node indices (into nodes)
    fed: list  # node indices whose value the caller feeds
    seed: int
    features: Features = Features()

    def value_shape(self, v):
        return self.inputs[v].shape if v < len(self.inputs) else self.nodes[v - len(self.inputs)].shape

    def describe(self) -> str:
        names = [f"in{i}{'(const)' if x.const else ''}:{self.dtype}{list(x.shape)}/{x.declared}"
                 for i, x in enumerate(self.inputs)]
        k = len(self.inputs)
        lines = [", ".join(names)]
        for j, node in enumerate(self.nodes):
            ops = ", ".join(f"n{o - k}" if o >= k else f"in{o}" for o in node.operands)
            lines.append(f"n{j} = {node.tf_op}({ops})  {list(node.shape)}")
        lines.append(f"fetch {['n%d' % f for f in self.fetches]} feed {['n%d' % f for f in self.fed]}"
                     f" seed {self.seed}")
        return "\n".join(lines)


def _broadcast_shape(ch: Chooser, shape: tuple) -> tuple:
    """A shape that broadcasts to `shape` (a suffix, or some dims set to 1)."""
    if not shape:
        return shape
    if ch.chance(0.5):
        return shape[ch.integers(0, len(shape)):]
    return tuple(1 if ch.chance(0.5) else d for d in shape)


def generate(ch: Chooser, features: Features = Features()) -> GraphSpec:
    if features.reductions:
        raise NotImplementedError("reductions: see Features for where to add them")
    dtype = ch.choice(DTYPES)
    shape = ch.choice(SHAPES)
    ops = fuzzable_ops(dtype)
    inputs = []
    for _ in range(ch.integers(1, 3)):
        declared = "static"
        if ch.chance(0.25):
            declared = ch.choice(["unknown_dims", "unknown_rank"])
        inputs.append(Input(shape, declared))
    if ch.chance(0.2):
        inputs.append(Input(shape, "static", const=True))
    if features.broadcast and ch.chance(0.5):
        inputs.append(Input(_broadcast_shape(ch, shape), "static"))
    nodes: list[Node] = []
    n_inputs = len(inputs)

    def shape_of(v):
        return inputs[v].shape if v < n_inputs else nodes[v - n_inputs].shape

    def operand():
        count = n_inputs + len(nodes)
        if nodes and ch.chance(0.6):
            return count - 1  # continue the chain
        return ch.integers(0, count - 1)  # shared values, diamonds

    for _ in range(ch.integers(1, features.max_nodes)):
        spec = ch.choice(ops)
        tf_op = ch.choice(spec.tf_ops)
        operands = tuple(operand() for _ in range(spec.arity))
        if spec.arity == 2 and all(o < n_inputs and inputs[o].const for o in operands):
            operands = (operands[0], 0 if not inputs[0].const else operands[0])
        out_shape = tuple(np.broadcast_shapes(*(shape_of(o) for o in operands)))
        nodes.append(Node(tf_op, spec.ir_name, operands, out_shape))
    last = len(nodes) - 1
    fetches = sorted({last} | {j for j in range(last) if ch.chance(0.25)})
    fed = sorted(j for j in range(last) if ch.chance(0.1))
    return GraphSpec(dtype, inputs, nodes, fetches, fed, ch.integers(0, 2**31 - 1), features)


# ---------------------------------------------------------------------------------------------
# Data

_SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0])


def make_data(spec: GraphSpec) -> list:
    """One array of the spec's dtype per input, and one per fed node."""
    rng = np.random.default_rng(spec.seed)
    shapes = [x.shape for x in spec.inputs] + [spec.nodes[j].shape for j in spec.fed]
    out = []
    for shape in shapes:
        n = int(np.prod(shape))
        if spec.dtype == "i32":
            kind = rng.integers(0, 3)
            if kind == 0:
                x = rng.integers(-10, 11, n)
            elif kind == 1:
                x = rng.integers(-(2**31), 2**31, n)
            else:
                x = rng.choice([-(2**31), 2**31 - 1, -1, 0, 1, 6, 7, -7, 46341], n)
            out.append(x.astype(np.int32).reshape(shape))
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
        special = rng.random(n) < 0.05
        x[special] = rng.choice(_SPECIALS, int(special.sum()))
        out.append(x.astype(np_dtype(spec.dtype)).reshape(shape))
    return out


# ---------------------------------------------------------------------------------------------
# Building and running

def node_name(j):
    return f"n{j}"


def build_graph(spec: GraphSpec, data: list):
    """A tf.Graph of the spec; returns (graph, fetch tensors, {fed tensor: array})."""
    graph = tf.Graph()
    tdt = TF_DTYPES[spec.dtype]
    with graph.as_default():
        values = []
        for i, x in enumerate(spec.inputs):
            if x.const:
                values.append(tf.constant(data[i], tdt, name=f"c{i}"))
                continue
            shape = {"static": list(x.shape), "unknown_dims": [None] * len(x.shape),
                     "unknown_rank": None}[x.declared]
            values.append(tf1.placeholder(tdt, shape, name=f"in{i}"))
        for j, node in enumerate(spec.nodes):
            fn = getattr(tf.raw_ops, node.tf_op)
            params = [p for p in fn.__signature__.parameters if p != "name"] \
                if hasattr(fn, "__signature__") else None
            if params is None:
                import inspect

                params = [p for p in inspect.signature(fn).parameters if p != "name"]
            args = dict(zip(params, (values[o] for o in node.operands)))
            values.append(fn(name=node_name(j), **args))
    k = len(spec.inputs)
    feeds = {values[i]: data[i] for i, x in enumerate(spec.inputs) if not x.const}
    for f, j in enumerate(spec.fed):
        feeds[values[k + j]] = data[k + f]
    fetches = [values[k + j] for j in spec.fetches]
    return graph, fetches, feeds


def session_config(fuse: bool, threads: int = 0, arithmetic: bool = True):
    cfg = tf1.ConfigProto(intra_op_parallelism_threads=threads)
    rewrite = cfg.graph_options.rewrite_options
    rewrite.use_plugin_optimizers = OFF
    if not arithmetic:
        rewrite.arithmetic_optimization = OFF
    if fuse:
        rewrite.custom_optimizers.add().name = tf_autofuse.OPTIMIZER_NAME
    return cfg


def run_session(graph, fetches, feeds, fuse: bool, arithmetic: bool = True):
    """(fetched values, {node name: op type} of what ran)."""
    with tf1.Session(graph=graph, config=session_config(fuse, arithmetic=arithmetic)) as sess:
        metadata = tf1.RunMetadata()
        values = sess.run(fetches, feeds, options=tf1.RunOptions(output_partition_graphs=True),
                          run_metadata=metadata)
    executed = {n.name: n.op for p in metadata.partition_graphs for n in p.node}
    return values, executed


# ---------------------------------------------------------------------------------------------
# float64 reference with error bounds

TF_16BIT_ULPS = 4  # TensorFlow's own 16-bit kernels (Softplus, Sigmoid in bf16) are this far off


def reference(spec: GraphSpec, data: list, tf_nodes=None):
    """Per node: (value, bound E, unstable mask). f64 for floats, wrapped int64 for i32.

    tf_nodes: indices of nodes TensorFlow itself computed in the fused run (left unfused, or
    constant-folded); None: all of them may be. For 16-bit types such a node may be off by
    TF_16BIT_ULPS of the stored type, a fused one by half an ulp (its one rounding).
    """
    k = len(spec.inputs)
    fed = {j: data[k + f] for f, j in enumerate(spec.fed)}
    is_int = spec.dtype == "i32"
    vals, bounds, unstable = [], [], []
    for i in range(k):
        x = data[i]
        vals.append(x.astype(np.int64) if is_int else x.astype(np.float64))
        bounds.append(np.zeros(x.shape))
        unstable.append(np.zeros(x.shape, bool))
    for j, node in enumerate(spec.nodes):
        shape = node.shape
        if j in fed:
            x = fed[j]
            vals.append(x.astype(np.int64) if is_int else x.astype(np.float64))
            bounds.append(np.zeros(shape))
            unstable.append(np.zeros(shape, bool))
            continue
        ref = catalog.for_ir_name(node.ir_name).reference
        xs = [vals[o] for o in node.operands]
        with np.errstate(all="ignore"):
            r = np.broadcast_to(ref(*xs), shape)
        if is_int:
            vals.append((r.astype(np.int64) + 2**31) % 2**32 - 2**31)
            bounds.append(np.zeros(shape))
            unstable.append(np.zeros(shape, bool))
            continue
        r = r.astype(np.float64)
        es = [bounds[o] for o in node.operands]
        us = [unstable[o] for o in node.operands]
        model = ERROR_MODEL[node.ir_name]
        compute = COMPUTE[spec.dtype]
        with np.errstate(all="ignore"):
            e = OP_ULPS * ulp(r, compute)
            if compute != spec.dtype:
                # 16-bit values are rounded where they leave a kernel: half an ulp of the stored
                # type for a fused node's output; TensorFlow's own 16-bit kernels, which the
                # fused graph still runs for the ops left unfused, are less accurate than that
                by_tf = tf_nodes is None or j in tf_nodes
                e = e + (TF_16BIT_ULPS if by_tf else 0.5) * ulp(r, spec.dtype)
            # flush-to-zero: a result under the smallest normal may come out as 0
            e = e + np.where(np.abs(r) < 2.0 ** _MIN_EXP[compute], 2.0 ** _MIN_EXP[compute], 0.0)
            anynan = np.zeros(shape, bool)
            for x in xs:
                anynan = anynan | np.isnan(x)
            # |derivative| at the worst corner of the operands' error boxes: a first-order bound
            # that still covers curvature (Square of a value smaller than its own error)
            corners = list(itertools.product((-1.0, 0.0, 1.0), repeat=len(xs)))
            for deriv, ei in zip(model.derivs, es):
                d = np.zeros(shape)
                for signs in corners:
                    moved = [x + s * eb if s else x for x, s, eb in zip(xs, signs, es)]
                    d = np.fmax(d, np.abs(np.broadcast_to(deriv(*moved), shape)))
                contrib = np.where((ei == 0) | anynan, 0.0, d * ei)
                e = e + np.where(np.isnan(contrib), np.inf, contrib)
            u = np.zeros(shape, bool)
            for ui in us:
                u = u | ui
            for index, dist in model.critical:
                dd = np.broadcast_to(dist(*xs), shape)
                ei = np.broadcast_to(es[index], shape)
                u = u | (dd < ei) | ((dd == 0) & (ei > 0))
            u = u | ~np.isfinite(e)
            # overflow thresholds of the compute type and of the stored type
            for limit in {_MAX[compute], _MAX[spec.dtype]}:
                a = np.abs(r)
                slack = e + ulp(r, spec.dtype)
                u = u | (np.isfinite(a) & (a - slack <= limit) & (limit < a + slack))
        vals.append(r)
        bounds.append(e)
        unstable.append(u)
    return vals, bounds, unstable


@dataclasses.dataclass
class Outcome:
    fused_kernels: int = 0
    elements: int = 0
    unstable: int = 0


def compare(spec: GraphSpec, j: int, fused, unfused, r, e, u) -> tuple[int, Optional[str]]:
    """(unstable elements, failure message or None) for fetched node j."""
    what = f"n{j} ({spec.nodes[j].tf_op}) {spec.dtype}{list(spec.nodes[j].shape)}"
    fused, unfused = np.asarray(fused), np.asarray(unfused)
    if fused.shape != tuple(spec.nodes[j].shape) or fused.shape != unfused.shape:
        return 0, f"{what}: shape fused {fused.shape} unfused {unfused.shape}"
    if fused.dtype != unfused.dtype:
        return 0, f"{what}: dtype fused {fused.dtype} unfused {unfused.dtype}"
    if spec.dtype == "i32":
        f, t = fused.astype(np.int64).ravel(), unfused.astype(np.int64).ravel()
        # equal to TensorFlow always; to the reference wherever TensorFlow is
        ok = (f == t) & ((f == r.ravel()) | (t != r.ravel()))
        if ok.all():
            return 0, None
        bad = np.flatnonzero(~ok)[:6]
        return 0, f"{what}: int mismatch at {bad}: fused {f[bad]} unfused {t[bad]} ref {r.ravel()[bad]}"
    f, t = fused.astype(np.float64).ravel(), unfused.astype(np.float64).ravel()
    r, e, u = r.ravel(), e.ravel(), u.ravel()
    tol = e + ulp(r, spec.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        same_class = (np.isnan(f) & np.isnan(t)) | (np.isinf(f) & (f == t))
        f_fin, t_fin = np.isfinite(f), np.isfinite(t)
        both = f_fin & t_fin & (np.abs(f - r) <= np.abs(t - r) + tol)
        # unfused overflowed or went NaN where the reference is finite (a 16-bit intermediate
        # beyond 65504): its error is infinite, a finite fused result is no worse. How close
        # fused gets depends on where the partition still rounds to 16 bits.
        better = f_fin & ~t_fin & np.isfinite(r)
        # TensorFlow is off the reference and fused is on it (TF's f64 Erf(+-inf) is NaN)
        stored = r.astype(np_dtype(spec.dtype)).astype(np.float64)  # overflows like the dtype
        right = (np.isnan(f) & np.isnan(r)) | (np.isinf(f) & (f == stored))
        ok = u | same_class | both | better | right | (f_fin & t_fin & (f == t))
    if ok.all():
        return int(u.sum()), None
    bad = np.flatnonzero(~ok)[:6]
    rows = "; ".join(f"[{i}] fused={f[i]!r} unfused={t[i]!r} ref={r[i]!r} tol={tol[i]:.3g}"
                     for i in bad)
    return int(u.sum()), f"{what}: {np.count_nonzero(~ok)} of {f.size} elements off: {rows}"


def check_structure(spec: GraphSpec, graph) -> int:
    """The rewriter's invariants on this graph; returns how many fusions it made."""
    graph_def = graph.as_graph_def()
    preserve = [node_name(j) for j in spec.fetches] + [node_name(j) for j in spec.fed]
    feeds = [node_name(j) for j in spec.fed]
    result = rewriter.rewrite(graph_def, preserve=preserve, feeds=feeds)
    out = {n.name: n for n in result.graph_def.node}
    read = {i.split(":")[0] for n in graph_def.node for i in n.input if not i.startswith("^")}
    # a member nothing reads can only be there to be fetched: it keeps its name too
    kept = set(preserve) | {n.name for n in graph_def.node if n.name not in read}
    for name in preserve:
        assert name in out, f"preserved node {name} is gone"
    for fusion in result.fusions:
        assert out[fusion.name].op == rewriter.FUSED_OP
        for member in fusion.nodes:
            assert member not in feeds, f"fed node {member} was fused"
            if member in kept:
                node = out[member]
                assert node.op == "Identity" and node.input[0].split(":")[0] == fusion.name, node
            else:
                assert member not in out, f"fused member {member} is still in the graph"
    again = rewriter.rewrite(result.graph_def, preserve=preserve, feeds=feeds)
    assert not again.fusions, "the second pass fused again"
    assert again.graph_def.SerializeToString(deterministic=True) == \
        result.graph_def.SerializeToString(deterministic=True), "the second pass changed the graph"
    direct = rewriter.optimize(graph_def, preserve=preserve, feeds=feeds)
    assert direct.SerializeToString(deterministic=True) == \
        result.graph_def.SerializeToString(deterministic=True), "optimize() is not deterministic"
    return len(result.fusions)


def check_spec(spec: GraphSpec) -> Outcome:
    """Run one random graph all ways and assert every property. Returns counts."""
    data = make_data(spec)
    graph, fetches, feeds = build_graph(spec, data)
    check_structure(spec, graph)
    # With a fed intermediate, TensorFlow's own arithmetic optimizer can ignore the feed, fused
    # or not (x + x -> Mul(2, x) and x * x -> Square(x) rewire the consumers of a fed x + x or
    # x * x to a new node: a TensorFlow bug), so such graphs run without it.
    arithmetic = not spec.fed
    unfused, _ = run_session(graph, fetches, feeds, fuse=False, arithmetic=arithmetic)
    fused, executed = run_session(graph, fetches, feeds, fuse=True, arithmetic=arithmetic)
    # nodes TensorFlow computed in the fused run: still there under their name, as their own
    # op or a folded Const (a fused member is gone, or an Identity of its kernel)
    tf_nodes = {j for j in range(len(spec.nodes))
                if executed.get(node_name(j), "Identity") != "Identity"}
    vals, bounds, unstable = reference(spec, data, tf_nodes)
    k = len(spec.inputs)
    outcome = Outcome(sum(op == "AutofuseKernel" for op in executed.values()))
    failures = []
    for value_f, value_t, j in zip(fused, unfused, spec.fetches):
        n_unstable, message = compare(spec, j, value_f, value_t, vals[k + j], bounds[k + j],
                                      unstable[k + j])
        outcome.elements += np.asarray(value_f).size
        outcome.unstable += n_unstable
        if message:
            failures.append(message)
    assert not failures, spec.describe() + "\n" + "\n".join(failures)
    return outcome


# ---------------------------------------------------------------------------------------------
# The tests

CI_EXAMPLES = int(os.environ.get("TF_AUTOFUSE_FUZZ_EXAMPLES", "400"))


# Elementwise ops the generator does not draw yet, and why. Each is covered against numpy and
# TensorFlow by tests/test_kernel_broadcast_reduce.py and by the rewriter tests; drawing them
# here needs an error model (float ops) or typed edges (bool results, dtype changes).
NOT_FUZZED_YET = {
    "Atan": "no error model yet", "Tan": "no error model yet", "Sinh": "no error model yet",
    "Cosh": "no error model yet", "LeakyRelu": "needs its alpha attr drawn",
    "Cast": "changes the dtype", "IsNan": "bool result", "IsInf": "bool result",
    "IsFinite": "bool result", "LogicalNot": "bool operand", "ZerosLike": "constant result",
    "OnesLike": "constant result",
}


def test_error_model_covers_the_elementwise_catalog():
    missing = sorted(s.ir_name for s in catalog.OPS
                     if s.kind == catalog.ELEMENTWISE and s.ir_name not in ERROR_MODEL
                     and s.ir_name not in NOT_FUZZED_YET)
    assert not missing, f"add these ops to ERROR_MODEL in {__file__}: {missing}"


def _hypothesis():
    return pytest.importorskip("hypothesis")


def test_random_graphs_match_unfused_and_float64():
    hypothesis = _hypothesis()
    from hypothesis import strategies as st

    stats = []

    @hypothesis.settings(max_examples=CI_EXAMPLES, derandomize=True, deadline=None,
                         database=None, print_blob=True,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(st.data())
    def prop(data):
        stats.append(check_spec(generate(HypothesisChooser(data))))

    prop()
    fused = sum(1 for s in stats if s.fused_kernels)
    elements = sum(s.elements for s in stats)
    unstable = sum(s.unstable for s in stats)
    print(f"\n{len(stats)} graphs, {fused} with fused kernels, {elements} elements compared, "
          f"{unstable} unstable")
    assert fused >= len(stats) // 4, "too few graphs fused: the test is not exercising fusion"
    assert unstable <= elements // 10


def test_random_graphs_with_broadcast_operands():
    """Broadcast operands are refused today; the graphs must still run with unfused results."""
    rng = np.random.default_rng(20261203)
    for _ in range(25):
        check_spec(generate(RandomChooser(rng), Features(broadcast=True)))


def test_generator_is_deterministic():
    a = generate(RandomChooser(np.random.default_rng(7)))
    b = generate(RandomChooser(np.random.default_rng(7)))
    assert a.describe() == b.describe()
