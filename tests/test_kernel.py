"""The AutofuseKernel op and its CPU kernel, run eagerly (and in graph mode where it matters).

Every operator of docs/PROGRAM.md in every dtype it allows is compared with TensorFlow's own
op on the same input and with a float64 numpy reference: each element of the fused result must
be within the dtype's tolerance of TensorFlow's, or at least as accurate as TensorFlow's (plus a
few f32 ulps). Then multi-instruction programs, immediates, output forwarding, errors and
determinism.

`python tests/test_kernel.py --bench` measures abs->relu->exp on [4096, 4096] against
TensorFlow's three ops and a plain copy.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.python.framework import op_def_registry

import kernel_library
from tf_autofuse.rewriter import catalog, passes
from tf_autofuse.rewriter import program as ir

try:
    from scipy import special as _special
except ImportError:  # pragma: no cover - scipy is optional
    _special = None


# ---------------------------------------------------------------------------------------------
# dtypes

DTYPES = {
    "f16": tf.float16,
    "bf16": tf.bfloat16,
    "f32": tf.float32,
    "f64": tf.float64,
    "i32": tf.int32,
}
FLOATS = ("f16", "bf16", "f32", "f64")
_MANTISSA = {"f16": 10, "bf16": 7, "f32": 23, "f64": 52}
_MIN_EXP = {"f16": -14, "bf16": -126, "f32": -126, "f64": -1022}
# ulps of the dtype by which the fused result may differ from TensorFlow's: 16-bit types are
# computed in fp32 and rounded once (TensorFlow may round in between); f32/f64 use the same Eigen
# functions, with or without FMA.
_TF_ULPS = {"f16": 1, "bf16": 1, "f32": 4, "f64": 4}


def ulp(values, dtype):
    """The spacing of `dtype` at each of `values` (float64 array; subnormal spacing near 0)."""
    a = np.abs(np.asarray(values, np.float64))
    a = np.where(np.isfinite(a) & (a > 0), a, 1.0)
    exponent = np.maximum(np.floor(np.log2(a)), _MIN_EXP[dtype])
    return np.ldexp(1.0, (exponent - _MANTISSA[dtype]).astype(np.int64))


# ---------------------------------------------------------------------------------------------
# The operators: TensorFlow's op, a float64 reference, and the inputs they are tested on.

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _wrap32(values):
    return ((np.asarray(values, np.int64) + 2**31) % 2**32 - 2**31).astype(np.int64)


def _erf(x):
    if _special is not None:
        return _special.erf(x)
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _erfc(x):
    # double erfc implementations (scipy's, the C library's) are up to ~30 ulps off in the tail
    # and ~5 near x = 1: too coarse a reference for the f64 kernel (tested on small sizes), fine
    # for the narrower types. mpmath (in the test extra) is exact but slow: small sizes only.
    try:
        import mpmath
    except ImportError:  # pragma: no cover
        mpmath = None
    if mpmath is None or np.size(x) > 4096:
        return np.vectorize(math.erfc, otypes=[np.float64])(x)
    with mpmath.workdps(40):
        return np.vectorize(lambda v: float(mpmath.erfc(v)) if np.isfinite(v) else math.erfc(v),
                            otypes=[np.float64])(x)


def _sigmoid(x):
    if _special is not None:
        return _special.expit(x)
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


class Op:
    def __init__(self, name, tf_fn, ref, domain="normal", ints=False, int_ref=None, arity=1):
        self.name = name
        self.tf_fn = tf_fn
        self.ref = ref  # float64 reference
        self.domain = domain
        self.ints = ints
        self.int_ref = int_ref  # int64 reference, wrapped to int32 by the test
        self.arity = arity

    def __repr__(self):
        return self.name


def raw_op(op_type):
    """TensorFlow's own kernel of an op type, called with its operands in order."""
    names = [arg.name for arg in op_def_registry.get(op_type).input_arg]
    fn = getattr(tf.raw_ops, op_type)
    return lambda *args: fn(**dict(zip(names, args)))


# Where the test inputs of an op are drawn from (float_inputs, int_inputs); "normal" if unlisted.
_DOMAINS = {"Relu6": "small", "Exp": "exp", "Expm1": "exp", "Log": "positive", "Log1p": "log1p",
            "Sqrt": "positive", "Rsqrt": "positive", "Sigmoid": "wide", "Softplus": "wide",
            "Floor": "halves", "Ceil": "halves", "Round": "halves", "Sin": "trig",
            "Cos": "trig", "Tan": "trig", "Atan": "wide", "Sinh": "small", "Cosh": "small"}
# References closer to exact than the table's (scipy, mpmath), for the f64 kernels.
_EXACT_REFERENCES = {"Erf": _erf, "Erfc": _erfc, "Sigmoid": _sigmoid}
# Binary ops whose operands need inputs of their own (test_kernel_broadcast_reduce.py,
# test_binary_with_own_inputs): negative bases with integral exponents, divisors away from 0.
OWN_INPUTS = frozenset({"Pow", "FloorDiv", "FloorMod"})


def _plain(spec):
    """An op of the table that check_op runs: operands and result of one float (or i32) dtype,
    no attribute."""
    return (spec.kind != catalog.REDUCE and spec.result == "same" and not spec.attrs
            and spec.arity <= 2 and catalog.FLOAT <= spec.dtypes <= catalog.FLOAT_I32)


def table_op(spec):
    """The test's view of an op of the table (catalog.OPS): TensorFlow's kernel, the reference."""
    ints = types_pb2.DT_INT32 in spec.dtypes
    return Op(spec.ir_name, raw_op(spec.tf_ops[0]),
              _EXACT_REFERENCES.get(spec.ir_name, spec.reference),
              domain=_DOMAINS.get(spec.ir_name, "normal"), ints=ints,
              int_ref=spec.reference if ints else None, arity=spec.arity)


UNARY = [table_op(s) for s in catalog.OPS if _plain(s) and s.arity == 1]
BINARY = [table_op(s) for s in catalog.OPS
          if _plain(s) and s.arity == 2 and s.ir_name not in OWN_INPUTS]
ALL_OPS = UNARY + BINARY

_SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0]


def float_inputs(domain, n, rng, salt=0):
    """n float64 values for `domain`; from 64 elements on, the specials (NaN, +-inf, +-0, +-1)."""
    if domain == "positive":
        x = np.exp(rng.uniform(-9.0, 9.0, n))
    elif domain == "log1p":
        x = np.where(rng.random(n) < 0.5, rng.uniform(-0.99, 1.0, n),
                     np.exp(rng.uniform(-12.0, 8.0, n)))
    elif domain == "exp":
        x = np.where(rng.random(n) < 0.5, rng.normal(0.0, 3.0, n), rng.uniform(-90.0, 90.0, n))
    elif domain == "wide":
        x = rng.uniform(-40.0, 40.0, n)
    elif domain == "small":
        x = rng.uniform(-10.0, 10.0, n)
    elif domain == "halves":
        x = np.where(rng.random(n) < 0.5, np.round(rng.uniform(-20.0, 20.0, n) * 2) / 2,
                     rng.normal(0.0, 10.0, n))
    elif domain == "trig":
        x = rng.uniform(-10.0, 10.0, n)
    else:
        x = rng.normal(0.0, 3.0, n) * np.where(rng.random(n) < 0.1, 1e-3, 1.0)
    if n >= 64:
        specials = np.array(_SPECIALS)
        # the first and second operand of a binary op (salt 0, 1) meet in every pair of specials
        x[: len(specials) ** 2] = np.tile(specials, len(specials)) if salt == 0 else \
            np.repeat(specials, len(specials))
    return x


def int_inputs(domain, n, rng, salt=0):
    if domain == "small":
        x = rng.integers(-10, 11, n)
    else:
        x = np.where(rng.random(n) < 0.5, rng.integers(-1000, 1001, n),
                     rng.integers(INT32_MIN, INT32_MAX, n, endpoint=True))
    if n >= 64:
        edges = np.array([INT32_MIN, INT32_MAX, -1, 0, 1, 6, 7, -7])
        x[: len(edges) ** 2] = np.tile(edges, len(edges)) if salt == 0 else \
            np.repeat(edges, len(edges))
    return x


def make_input(op, dtype, n, rng, salt=0):
    """A tensor of `dtype` holding test values for `op`, shape [n]."""
    if dtype == "i32":
        return tf.constant(int_inputs(op.domain, n, rng, salt).astype(np.int32))
    return tf.cast(tf.constant(float_inputs(op.domain, n, rng, salt)), DTYPES[dtype])


# ---------------------------------------------------------------------------------------------
# Running and comparing

def program_text(decls, lines, outputs):
    """decls: ["f32[7]"], lines: ["Abs in0"], outputs: ["%0"] -> the IR text."""
    text = [f"in{i}: {d}" for i, d in enumerate(decls)]
    text += [f"%{i} = {line}" for i, line in enumerate(lines)]
    text += [f"out{i} = {o}" for i, o in enumerate(outputs)]
    return "".join(line + "\n" for line in text)


def run_fused(ops, program, inputs, touts, name=None):
    kwargs = {} if name is None else {"name": name}
    return ops.autofuse_kernel(inputs=list(inputs), Tout=list(touts), program=program, **kwargs)


def as_f64(tensor):
    return tensor.numpy().astype(np.float64)


# Ops whose fp32 kernel has a documented error bound of its own (cc/cpu/), in f32 ulps of
# the exact value: an element within it passes even where TensorFlow's kernel happens to be
# closer. Erfc: ours (packet_math.h, ErfcPacket) is within 6 ulps everywhere, TensorFlow's up to
# ~65 off in the tail but closer in places.
_BOUND_ULPS = {"Erfc": 6}


def assert_float_close(fused, unfused, ref, dtype, what, scale=None, bound_ulps=0):
    """Per element: within _TF_ULPS of TensorFlow, or no less accurate than TensorFlow, or (for
    f32 and the 16-bit types) within `bound_ulps` f32 ulps of the reference.

    "No less accurate" allows 4 ulps of f32 (of f64 for f64) of slack. Ulps are measured at the
    result, or at `scale` when the result comes out of a cancellation (a + b with a ~ -b).
    """
    f, t, r = (np.asarray(a, np.float64).ravel() for a in (fused, unfused, ref))
    assert f.shape == t.shape == r.shape
    at_t, at_r = (t, r) if scale is None else (np.ravel(scale),) * 2
    nonfinite = ~np.isfinite(f) | ~np.isfinite(t)
    same_tf = (np.isnan(f) & np.isnan(t)) | (f == t)
    same_ref = (np.isnan(f) & np.isnan(r)) | (f == r)
    with np.errstate(invalid="ignore"):
        close_tf = np.abs(f - t) <= _TF_ULPS[dtype] * ulp(at_t, dtype)
        slack = 4 * ulp(at_r, "f64" if dtype == "f64" else "f32")
        as_accurate = np.abs(f - r) <= np.abs(t - r) + slack
        if bound_ulps and dtype != "f64":
            as_accurate |= np.abs(f - r) <= bound_ulps * ulp(at_r, "f32") + ulp(at_r, dtype) / 2
    ok = np.where(nonfinite, same_tf | same_ref, same_tf | close_tf | as_accurate)
    if not ok.all():
        bad = np.flatnonzero(~ok)[:8]
        rows = "\n".join(f"  [{i}] fused={f[i]!r} tf={t[i]!r} ref={r[i]!r}" for i in bad)
        pytest.fail(f"{what}: {np.count_nonzero(~ok)} of {f.size} elements off:\n{rows}")


def assert_int_equal(fused, unfused, ref, what):
    f, t = fused.numpy().astype(np.int64).ravel(), unfused.numpy().astype(np.int64).ravel()
    r = _wrap32(ref).ravel()
    for other, label in ((t, "TensorFlow"), (r, "the wrapped int64 reference")):
        if not np.array_equal(f, other):
            i = np.flatnonzero(f != other)[:8]
            pytest.fail(f"{what}: differs from {label} at {i}: fused={f[i]} other={other[i]}")


def check_op(ops, op, dtype, n, seed=0):
    rng = np.random.default_rng([seed, n, ALL_OPS.index(op), list(DTYPES).index(dtype)])
    inputs = [make_input(op, dtype, n, rng, salt=k) for k in range(op.arity)]
    decl = f"{dtype}[{n}]"
    operands = ", ".join(f"in{k}" for k in range(op.arity))
    program = program_text([decl] * op.arity, [f"{op.name} {operands}"], ["%0"])
    (fused,) = run_fused(ops, program, inputs, [DTYPES[dtype]])
    unfused = op.tf_fn(*inputs)
    assert fused.dtype == unfused.dtype and fused.shape == unfused.shape == (n,)
    what = f"{op.name} {dtype}[{n}]"
    if dtype == "i32":
        args = [x.numpy().astype(np.int64) for x in inputs]
        assert_int_equal(fused, unfused, op.int_ref(*args), what)
    else:
        args = [as_f64(x) for x in inputs]
        with np.errstate(all="ignore"):
            ref = op.ref(*args)
        assert_float_close(as_f64(fused), as_f64(unfused), ref, dtype, what,
                           bound_ulps=_BOUND_ULPS.get(op.name, 0))


def _cases(sizes, dtypes_for):
    for op in ALL_OPS:
        for dtype in dtypes_for(op):
            for n in sizes:
                yield pytest.param(op, dtype, n, id=f"{op.name}-{dtype}-{n}")


def _allowed(op):
    return FLOATS + (("i32",) if op.ints else ())


# Every op in every dtype it allows, small sizes (0 elements, 1, a ragged tile, under a tile).
@pytest.mark.parametrize("op,dtype,n", list(_cases((0, 1, 7, 1023), _allowed)))
def test_op_small(ops, op, dtype, n):
    check_op(ops, op, dtype, n)


# Every op at 1_000_003 elements (many tiles, a ragged last one, the thread pool) in f32 and f16;
# bf16, f64 and i32 for a subset.
_LARGE_SUBSET = {"Abs", "Relu6", "Exp", "Log", "Tanh", "Softplus", "Sigmoid", "Round", "Erf",
                 "Add", "Div", "Maximum", "SquaredDifference", "Mul", "Sign", "Square"}


def _large_dtypes(op):
    chosen = ["f32", "f16"]
    if op.name in _LARGE_SUBSET:
        chosen += ["bf16", "f64"] + (["i32"] if op.ints else [])
    return chosen


@pytest.mark.parametrize("op,dtype,n", list(_cases((1_000_003,), _large_dtypes)))
def test_op_large(ops, op, dtype, n):
    check_op(ops, op, dtype, n)


def assert_f32_values(ops, op, x, want):
    """`op` of each f32 value of `x` is exactly `want` (NaN where want is NaN)."""
    (fused,) = run_fused(ops, program_text([f"f32[{x.size}]"], [f"{op} in0"], ["%0"]),
                         [tf.constant(x)], [tf.float32])
    for v, w, g in zip(x, want, fused.numpy()):
        same = np.isnan(g) if np.isnan(w) else g == np.float32(w)
        assert same, f"{op}({v!r}) = {g!r}, want {w!r}"


def test_erfc_f32_within_its_bound_over_its_range(ops):
    """Erfc f32 (packet_math.h, ErfcPacket) is within _BOUND_ULPS of the exact value on a dense
    grid of its range (in places TensorFlow's kernel is closer; in the tail TensorFlow's is much
    further off). The grid is what the per-op test samples only sparsely."""
    x = np.concatenate([np.linspace(0.9, 1.05, 2048), np.linspace(-4, 10, 2048)]).astype(np.float32)
    program = program_text(["f32[4096]"], ["Erfc in0"], ["%0"])
    (fused,) = run_fused(ops, program, [tf.constant(x)], [tf.float32])
    ref = _erfc(x.astype(np.float64))
    unfused = as_f64(tf.math.erfc(tf.constant(x)))
    # results in fp32's subnormal range: TensorFlow's threads flush them to zero, and so do ours
    tiny = ref < 2.0**-126
    assert np.all(np.abs(as_f64(fused) - ref)[tiny] <= np.abs(unfused - ref)[tiny] + 2.0**-148)
    err = np.abs(as_f64(fused) - ref) / ulp(ref, "f32")
    assert err[~tiny].max() <= _BOUND_ULPS["Erfc"]
    tf_err = np.abs(unfused - ref) / ulp(ref, "f32")
    assert err[~tiny].mean() <= tf_err[~tiny].mean()  # more accurate than TensorFlow overall


def _erfc_f64(x):
    """erfc of float32 values in float64: scipy's (fast; ~1e-15 relative) when there is scipy."""
    x = np.asarray(x, np.float64)
    return _special.erfc(x) if _special is not None else _erfc(x)


def _f32_run(start, count):
    """|count| consecutive float32 from `start` on, away from 0 (count > 0) or towards it."""
    steps = np.arange(abs(count), dtype=np.int32) * np.int32(1 if count > 0 else -1)
    return (np.array([start], np.float32).view(np.int32)[0] + steps).view(np.float32)


def test_erfc_f32_dense_grid_tails_and_specials(ops):
    """Erfc f32 is our own approximation (packet_math.h, ErfcPacket: 1 - x E(x^2) below |x| = 0.5,
    exp(-x^2) P/Q above, 2 - erfc(-x) for x < 0). On 2^20 points over [-5, 11], runs of
    consecutive float32 at the branch switch (|x| = 0.5), from 9 and from 10 (results near and
    below 2^-126) and at the clamp (10.1), and a sample of |x| down to 2^-40: within 6 ulps of a
    float64 reference (over all finite float32 it is within 5.9, scripts/packet_ulps.sh erfc; the mean
    is 0.30 on |x| in [2^-13, 10.1]). A mistyped hex digit in a coefficient fails this (tried:
    one in Q, 60 ulps; one in E, 17). Special values exactly."""
    rng = np.random.default_rng(7)
    parts = [np.linspace(-5.0, 11.0, 1 << 20).astype(np.float32),
             _f32_run(np.float32(0.5), 4096), -_f32_run(np.float32(0.5), 4096),
             _f32_run(np.nextafter(np.float32(0.5), np.float32(0)), -4096),  # below 0.5
             -_f32_run(np.nextafter(np.float32(0.5), np.float32(0)), -4096),
             _f32_run(np.float32(10.0), 1 << 16), _f32_run(np.float32(9.0), 1 << 16),
             _f32_run(np.float32(10.1), -2048), _f32_run(np.float32(10.1), 2048),
             np.float32(2.0) ** rng.uniform(-40, 3.5, 1 << 16).astype(np.float32)
             * rng.choice(np.float32([-1, 1]), 1 << 16)]
    x = np.concatenate([p.astype(np.float32) for p in parts])
    x = np.concatenate([x, np.zeros((-x.size) % 16, np.float32)])
    program = program_text([f"f32[{x.size}]"], ["Erfc in0"], ["%0"])
    (fused,) = run_fused(ops, program, [tf.constant(x)], [tf.float32])
    got = as_f64(fused)
    ref = _erfc_f64(x)
    # results in fp32's subnormal range flush to zero on TensorFlow's threads (or round to nearest)
    tiny = ref < 2.0**-126
    assert np.all(np.abs(got - ref)[tiny] <= 2.0**-126)
    err = np.abs(got - ref)[~tiny] / ulp(ref[~tiny], "f32")
    worst = x[~tiny][np.argmax(err)]
    assert err.max() <= 6.0, f"max {err.max():.3f} ulps at x = {worst!r}"
    # mostly the tail, where every fp32 erfc does worst (Eigen's: 0.545 on the grid alone)
    assert err.mean() <= 0.54, f"mean {err.mean():.4f} ulps"
    # GELU's erfc(-x / sqrt 2), x ~ N(0, 1): 0.35 (Eigen's: 0.43)
    z = (rng.standard_normal(1 << 18) / np.sqrt(2.0)).astype(np.float32)
    program = program_text([f"f32[{z.size}]"], ["Erfc in0"], ["%0"])
    (fused,) = run_fused(ops, program, [tf.constant(z)], [tf.float32])
    ref = _erfc_f64(z)
    err = np.abs(as_f64(fused) - ref) / ulp(ref, "f32")
    assert err.max() <= 6.0 and err.mean() <= 0.4, f"max {err.max():.3f}, mean {err.mean():.4f}"

    specials = np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 1e-45, -1e-45, 1e-9,
                           -4.0, -3.9, 10.06, 10.1, 11.0, -11.0, 1e30, -1e30,
                           np.finfo(np.float32).max, -np.finfo(np.float32).max] + [0.0] * 12)
    want = [np.nan, 0.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 0.0, 0.0, 0.0, 2.0,
            0.0, 2.0, 0.0, 2.0] + [1.0] * 12
    assert_f32_values(ops, "Erfc", specials, want)


def test_exp_f32_dense_grid_boundaries_and_specials(ops):
    """Exp f32 is our own (packet_math.h, ExpPacket: no per-packet range test, the scale 2^k
    rounded once: vscalefps on AVX-512, else two powers of two). On 2^20 points over [-104, 89],
    runs of consecutive float32 below the overflow boundary (ln FLT_MAX = 88.7228) and around the
    results 2^-126 and 2^-149, and near 0: within 1.5 ulps of a float64 reference (over all
    float32 it is within 1.013, mean 0.064; Eigen's fp32 exp, which TensorFlow's kernels use:
    1.28, 0.074). A wrong digit in a coefficient or a wrong split of the scale fails this. Special
    values exactly."""
    rng = np.random.default_rng(11)
    overflow = np.float32(88.72283)
    parts = [np.linspace(-104.0, 89.0, 1 << 20).astype(np.float32),
             _f32_run(overflow, -4096), _f32_run(overflow, 64),
             _f32_run(np.float32(-87.33655), 4096), _f32_run(np.float32(-87.33655), -4096),
             _f32_run(np.float32(-103.2789), 4096), _f32_run(np.float32(-103.97), 4096),
             _f32_run(np.float32(0.0), 4096), -_f32_run(np.float32(0.0), 4096),
             rng.uniform(-0.35, 0.35, 1 << 16).astype(np.float32)]
    x = np.concatenate([p.astype(np.float32) for p in parts])
    x = np.concatenate([x, np.zeros((-x.size) % 16, np.float32)])
    program = program_text([f"f32[{x.size}]"], ["Exp in0"], ["%0"])
    (fused,) = run_fused(ops, program, [tf.constant(x)], [tf.float32])
    got = as_f64(fused)
    with np.errstate(over="ignore"):
        ref = np.exp(x.astype(np.float64))
        ref32 = ref.astype(np.float32)
    over = np.isinf(ref32)
    assert np.all(np.isinf(got[over])) and np.all(np.isfinite(got[~over]))
    # results in fp32's subnormal range flush to zero on TensorFlow's threads (or round once)
    tiny = ref < 2.0**-126
    assert np.all(np.abs(got - ref)[tiny & ~over] <= 2.0**-126)
    normal = ~tiny & ~over
    err = np.abs(got - ref)[normal] / ulp(ref[normal], "f32")
    worst = x[normal][np.argmax(err)]
    assert err.max() <= 1.5, f"max {err.max():.3f} ulps at x = {worst!r}"
    # TensorFlow's tf.exp on the same points: max 1.26, mean 0.344; ours 0.265
    assert err.mean() <= 0.3, f"mean {err.mean():.4f} ulps"

    specials = np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 89.0, 1e30, -1e30,
                           -104.0, -200.0, np.finfo(np.float32).max,
                           -np.finfo(np.float32).max, 1.0, -1.0])
    want = [np.nan, np.inf, 0.0, 1.0, 1.0, 1.0, 1.0, np.inf, np.inf, 0.0, 0.0, 0.0, np.inf, 0.0,
            np.float32(np.e), np.float32(1 / np.e)]
    assert_f32_values(ops, "Exp", specials, want)


# ---------------------------------------------------------------------------------------------
# Programs of several instructions

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [7, 1023, 4096, 1_000_003])
def test_chain_abs_relu_exp(ops, dtype, n):
    rng = np.random.default_rng(n)
    x = tf.cast(tf.constant(rng.normal(0.0, 2.0, n)), DTYPES[dtype])
    program = program_text([f"{dtype}[{n}]"], ["Abs in0", "Relu %0", "Exp %1"], ["%2"])
    (fused,) = run_fused(ops, program, [x], [DTYPES[dtype]])
    unfused = tf.exp(tf.nn.relu(tf.abs(x)))
    ref = np.exp(np.maximum(np.abs(as_f64(x)), 0.0))
    assert_float_close(as_f64(fused), as_f64(unfused), ref, dtype, f"abs->relu->exp {dtype}")


def test_runs_large_enough_to_prefetch_give_the_bits_of_small_ones(ops):
    """Runs of at least 2**20 elements prefetch their tensor inputs ahead of the strips
    (cc/cpu/schedule.h, kPrefetchElements; past a tensor's end too, as a hint). The last rows run
    alone, too few to prefetch, give the same bits, and both match TensorFlow and float64: an
    f32 input read by Abs, a broadcast bias, an f16 input folded into its Exp, a ragged end."""
    rows, cols = 4033, 261  # 1_052_613 elements, not a whole number of strips or tiles
    rng = np.random.default_rng(20)
    x = tf.constant(rng.normal(0.0, 2.0, (rows, cols)).astype(np.float32))
    h = tf.constant(rng.normal(0.0, 2.0, (rows, cols)).astype(np.float16))
    bias = tf.constant(rng.normal(0.0, 1.0, cols).astype(np.float32))
    program = program_text([f"f32[?,{cols}]", f"f16[?,{cols}]", f"f32[{cols}]"],
                           ["Abs in0", "Add %0, in2", "Relu %1", "Exp in1"], ["%2", "%3"])
    large = run_fused(ops, program, [x, h, bias], [tf.float32, tf.float16])
    tail = run_fused(ops, program, [x[-268:], h[-268:], bias], [tf.float32, tf.float16])
    for big, small in zip(large, tail):
        np.testing.assert_array_equal(big.numpy()[-268:].view(np.uint8),
                                      small.numpy().view(np.uint8))
    ref = np.maximum(np.abs(as_f64(x)) + as_f64(bias), 0.0)
    assert_float_close(as_f64(large[0]), as_f64(tf.nn.relu(tf.abs(x) + bias)), ref, "f32",
                       "abs+bias->relu over 2**20 elements")
    assert_float_close(as_f64(large[1]), as_f64(tf.exp(h)), np.exp(as_f64(h)), "f16",
                       "exp of f16 over 2**20 elements")


# The rewriter's simplify pass (rewriter/passes.py) drops a Relu of a value never below -0; these
# check that the kernel's Relu of such a value is that value, bit for bit, so the pass changes
# nothing the kernel gives.
_NEVER_NEGATIVE = {  # producer -> (TensorFlow's op, float64 reference)
    "Abs": (tf.abs, np.abs),
    "Relu": (tf.nn.relu, lambda x: np.maximum(x, 0)),
    "Relu6": (tf.nn.relu6, lambda x: np.minimum(np.maximum(x, 0), 6)),
    "Exp": (tf.exp, np.exp),
    "Sigmoid": (tf.sigmoid, _sigmoid),
    "Square": (tf.square, np.square),
    "Erfc": (tf.math.erfc, _erfc),
}
_RELU_SPECIALS = [np.nan, -np.nan, -0.0, 0.0, np.inf, -np.inf, 1e-30, -1e-30, 1e-40, -1e-40]


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "f64"])
@pytest.mark.parametrize("producer", sorted(_NEVER_NEGATIVE))
def test_relu_of_a_never_negative_value_is_that_value(ops, producer, dtype):
    """P -> Relu, the kernel computing the Relu, gives the bits of P alone (NaN payloads, zeros,
    infinities, subnormals, a ragged tile included), and TensorFlow's relu(P(x)) within P's own
    tolerance; the simplify pass drops that Relu (not the one an output names)."""
    n = 3 * 4096 + 37
    v = np.random.default_rng(5).normal(0, 3, n)
    v[:len(_RELU_SPECIALS)] = _RELU_SPECIALS
    x = tf.cast(tf.constant(v), DTYPES[dtype])
    decl = [f"{dtype}[{n}]"]
    relu_then_neg = ir.parse(program_text(decl, [f"{producer} in0", "Relu %0", "Neg %1"],
                                          ["%2"]))
    assert [i.op for i in passes.simplify(relu_then_neg).instructions] == [producer, "Neg"]
    (with_relu,) = run_fused(ops, program_text(decl, [f"{producer} in0", "Relu %0"], ["%1"]),
                             [x], [DTYPES[dtype]])
    (alone,) = run_fused(ops, program_text(decl, [f"{producer} in0"], ["%0"]), [x],
                         [DTYPES[dtype]])
    bits = {"f32": np.uint32, "f64": np.uint64}.get(dtype, np.uint16)
    np.testing.assert_array_equal(with_relu.numpy().view(bits), alone.numpy().view(bits))
    tf_op, ref_fn = _NEVER_NEGATIVE[producer]
    x64 = as_f64(x)
    with np.errstate(all="ignore"):
        ref = np.maximum(ref_fn(x64), 0)
    assert_float_close(as_f64(with_relu), as_f64(tf.nn.relu(tf_op(x))), ref, dtype,
                       f"{producer} -> Relu {dtype}", bound_ulps=_BOUND_ULPS.get(producer, 0))
    assert not np.any(as_f64(with_relu) < 0)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "f64"])
@pytest.mark.parametrize("op", ["Relu", "Relu6"])
def test_relu_gives_x_for_negative_zero_and_nan_on_every_path(ops, op, dtype):
    """Relu is x < 0 ? 0 : x (Relu6: -0 gives +0), the same bits in strips (full tiles, fp32
    compute), over whole tiles (the ragged tail, f64) and alone or followed by another
    instruction (where strips run). TensorFlow's own float32 Relu gives -0 from its scalar loop
    and +0 from its vectorised one, so zeros are compared with it by value."""
    n = 2 * 4096 + 37
    v = np.tile(np.array(_RELU_SPECIALS + [-2.0, 7.0, 3.0]), n // 13 + 1)[:n]
    x = tf.cast(tf.constant(v), DTYPES[dtype])
    xv = x.numpy()
    bits = {"f32": np.uint32, "f64": np.uint64}.get(dtype, np.uint16)
    want = np.where(xv < 0, np.zeros_like(xv), xv)  # keeps -0 and the NaNs
    if op == "Relu6":  # min(max(x, 0), 6) with NaN propagated: -0 gives +0
        want = np.where(want > 6, 6, np.where(want == 0, 0, want)).astype(xv.dtype)
    tf_value = {"Relu": tf.nn.relu, "Relu6": tf.nn.relu6}[op](x).numpy()
    for lines in ([f"{op} in0"], [f"{op} in0", "Mul %0, 1"]):
        (got,) = run_fused(ops, program_text([f"{dtype}[{n}]"], lines, [f"%{len(lines) - 1}"]),
                           [x], [DTYPES[dtype]])
        g = got.numpy()
        nan = np.isnan(g.astype(np.float64))
        np.testing.assert_array_equal(nan, np.isnan(xv.astype(np.float64)), err_msg=str(lines))
        np.testing.assert_array_equal(g.view(bits)[~nan], want.view(bits)[~nan],
                                      err_msg=str(lines))
        np.testing.assert_array_equal(g[~nan], tf_value[~nan], err_msg=str(lines))


@pytest.mark.parametrize("lines, ref", [
    (["Neg in0", "Relu %0"], lambda x: np.maximum(-x, 0)),
    (["Sub in0, 1.5", "Relu %0"], lambda x: np.maximum(x - 1.5, 0)),
    (["Abs in0", "Neg %0", "Relu %1"], lambda x: np.zeros_like(x)),
    (["Abs in0", "Tanh %0", "Sub %1, 0.5", "Relu %2"],
     lambda x: np.maximum(np.tanh(np.abs(x)) - 0.5, 0)),
])
def test_relu_of_a_possibly_negative_value_stays(ops, lines, ref):
    n = 4096 + 5
    x = np.random.default_rng(6).normal(0, 2, n).astype(np.float32)
    program = program_text([f"f32[{n}]"], lines, [f"%{len(lines) - 1}"])
    (fused,) = run_fused(ops, program, [tf.constant(x)], [tf.float32])
    np.testing.assert_allclose(as_f64(fused), ref(x.astype(np.float64)), rtol=1e-6, atol=1e-7)
    assert np.all(fused.numpy() >= 0)


def test_relu_of_an_int_abs_stays_and_relu_outputs_are_kept(ops):
    """Abs of INT32_MIN wraps negative, so an i32 Relu of Abs is computed; a Relu that is an
    output is kept next to its operand, also an output."""
    x = tf.constant([INT32_MIN, -3, 0, 5], tf.int32)
    program = program_text(["i32[4]"], ["Abs in0", "Relu %0"], ["%1", "%0"])
    relu, absolute = run_fused(ops, program, [x], [tf.int32, tf.int32])
    np.testing.assert_array_equal(relu.numpy(), tf.nn.relu(tf.abs(x)).numpy())
    np.testing.assert_array_equal(relu.numpy(), [0, 3, 0, 5])
    np.testing.assert_array_equal(absolute.numpy(), [INT32_MIN, 3, 0, 5])
    y = tf.constant([-2.0, np.nan, -0.0, 4.0], tf.float32)
    program = program_text(["f32[4]"], ["Abs in0", "Relu %0", "Exp %1"], ["%2", "%1"])
    out, relu = run_fused(ops, program, [y], [tf.float32, tf.float32])
    np.testing.assert_array_equal(relu.numpy().view(np.uint32),
                                  np.abs(y.numpy()).view(np.uint32))
    np.testing.assert_allclose(out.numpy(), np.exp(np.abs(y.numpy())), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("n", [100, 50_001])
def test_diamond_two_outputs(ops, dtype, n):
    """%0 feeds two branches that meet again; one branch is also an output."""
    rng = np.random.default_rng(7)
    x = tf.cast(tf.constant(rng.normal(0.0, 1.0, n)), DTYPES[dtype])
    y = tf.cast(tf.constant(rng.normal(0.0, 1.0, n)), DTYPES[dtype])
    program = program_text(
        [f"{dtype}[?]", f"{dtype}[?]"],
        ["Mul in0, in1", "Exp %0", "Tanh %0", "Add %1, %2"],
        ["%3", "%1"])
    fused_sum, fused_exp = run_fused(ops, program, [x, y], [DTYPES[dtype]] * 2)
    a = tf.multiply(x, y)
    unfused_exp = tf.exp(a)
    unfused_sum = tf.add(unfused_exp, tf.tanh(a))
    a64 = as_f64(x) * as_f64(y)  # exact; TensorFlow rounds it to 16 bits first, we do not
    assert_float_close(as_f64(fused_exp), as_f64(unfused_exp), np.exp(a64), dtype, "exp branch")
    assert_float_close(as_f64(fused_sum), as_f64(unfused_sum), np.exp(a64) + np.tanh(a64), dtype,
                       "sum", scale=np.exp(a64) + np.abs(np.tanh(a64)))


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "f64"])
def test_immediates(ops, dtype):
    n = 5000
    rng = np.random.default_rng(3)
    x = tf.cast(tf.constant(rng.normal(0.0, 4.0, n)), DTYPES[dtype])
    program = program_text([f"{dtype}[{n}]"],
                           ["Mul in0, 0.1", "Add %0, 1e-05", "Sub 3.0, %1", "Maximum %2, -2.5"],
                           ["%3"])
    (fused,) = run_fused(ops, program, [x], [DTYPES[dtype]])
    c = lambda v: tf.constant(v, DTYPES[dtype])  # noqa: E731 - immediates are of the value's type
    unfused = tf.maximum(tf.subtract(c(3.0), tf.add(tf.multiply(x, c(0.1)), c(1e-05))), c(-2.5))
    c64 = lambda v: c(v).numpy().astype(np.float64)  # noqa: E731
    ref = np.maximum(c64(3.0) - (as_f64(x) * c64(0.1) + c64(1e-05)), c64(-2.5))
    assert_float_close(as_f64(fused), as_f64(unfused), ref, dtype, "immediates")


def test_int_immediates_wrap(ops):
    x = tf.constant(np.array([INT32_MAX, INT32_MIN, -5, 0, 7] * 10, np.int32))
    program = program_text(["i32[50]"], ["Mul in0, 3", "Add %0, -7", "Sub 2, %1"], ["%2"])
    (fused,) = run_fused(ops, program, [x], [tf.int32])
    unfused = tf.subtract(2, tf.add(tf.multiply(x, 3), -7))
    ref = _wrap32(2 - (_wrap32(x.numpy().astype(np.int64) * 3) - 7))
    np.testing.assert_array_equal(fused.numpy(), unfused.numpy())
    np.testing.assert_array_equal(fused.numpy(), ref)


def test_literal_forms_and_final_newline(ops):
    """Literals as Python's repr prints them (inf and nan are no immediates: tests/test_program.py);
    one final newline is fine."""
    x = tf.constant([-2.5, 0.0, 1.0, 3.0e30], tf.float32)
    program = ("in0: f32[4]\n%0 = Maximum in0, -2.0\n%1 = Minimum %0, 1e+30\n%2 = Add %1, 1e-05\n"
               "%3 = Mul %2, 2\nout0 = %3\n")
    (got,) = run_fused(ops, program, [x], [tf.float32])
    want = (np.minimum(np.maximum(x.numpy(), np.float32(-2)), np.float32(1e30)) +
            np.float32(1e-05)) * np.float32(2)
    np.testing.assert_array_equal(got.numpy(), want)


def test_outputs_of_inputs_and_repeated_values(ops):
    """An output may be an input, and one value may be several outputs, of different dtypes."""
    n = 3000
    x = tf.constant(np.linspace(-3, 3, n), tf.float16)
    k = tf.constant(np.arange(n) - 1500, tf.int32)
    program = program_text(["f16[?]", "i32[?]"], ["Sigmoid in0", "Square in1"],
                           ["%0", "in0", "%1", "%0", "in1"])
    outs = run_fused(ops, program, [x, k], [tf.float16, tf.float16, tf.int32, tf.float16,
                                            tf.int32])
    np.testing.assert_array_equal(outs[0].numpy(), outs[3].numpy())
    np.testing.assert_array_equal(outs[1].numpy(), x.numpy())
    np.testing.assert_array_equal(outs[2].numpy(), tf.square(k).numpy())
    np.testing.assert_array_equal(outs[4].numpy(), k.numpy())
    assert_float_close(as_f64(outs[0]), as_f64(tf.sigmoid(x)), _sigmoid(as_f64(x)), "f16",
                       "sigmoid")


@pytest.mark.parametrize("dtype,n", [("f32", 1_000_003), ("f16", 2_100_003), ("i32", 1_000_003)])
def test_large_outputs_are_streamed_correctly(ops, dtype, n):
    """From 16 MiB of output per run the kernel stores non-temporally from slots."""
    tdt = DTYPES[dtype]
    rng = np.random.default_rng(11)
    if dtype == "i32":
        x = tf.constant(rng.integers(-50, 50, n).astype(np.int32))
        lines = ["Square in0", "Neg %0", "Maximum %1, in0"]
        expect = [lambda v: v * v, lambda v: -v * v, lambda v: np.maximum(-v * v, v)]
    else:
        x = tf.cast(tf.constant(rng.normal(size=n)), tdt)
        lines = ["Square in0", "Neg %0", "Maximum %1, in0"]
        expect = [np.square, lambda v: -np.square(v), lambda v: np.maximum(-np.square(v), v)]
    program = program_text([f"{dtype}[{n}]"], lines, ["%0", "%2", "in0", "%1", "%2"])
    outs = run_fused(ops, program, [x], [tdt] * 5)
    v = x.numpy().astype(np.float64)
    want = [expect[0](v), expect[2](v), v, expect[1](v), expect[2](v)]
    for got, ref in zip(outs, want):
        if dtype == "i32":
            np.testing.assert_array_equal(got.numpy(), ref)
        else:
            rounded = tf.cast(tf.constant(ref), tdt).numpy().astype(np.float64)
            np.testing.assert_array_equal(as_f64(got), rounded)  # one rounding of exact values


def test_dead_values_and_2d_shapes(ops):
    x = tf.constant(np.random.default_rng(1).normal(size=(37, 29)), tf.float32)
    program = program_text(["f32[?,29]"], ["Exp in0", "Neg in0", "Abs %1"], ["%2"])
    (fused,) = run_fused(ops, program, [x], [tf.float32])
    assert fused.shape == (37, 29)
    np.testing.assert_array_equal(fused.numpy(), np.abs(x.numpy()))


# ---------------------------------------------------------------------------------------------
# Output forwarding: an input buffer TensorFlow may hand to an output must not be overwritten
# while the program still reads it.

FORWARDING_PROGRAMS = [
    # out0 is written by the first instruction while in0 is still read by the second
    (["Exp in0", "Add %0, in0"], ["%0", "%1"],
     lambda x: (np.exp(x), np.exp(x) + x)),
    # a chain whose output may take in0's buffer; in1 is read last
    (["Abs in0", "Relu %0", "Mul %1, in1"], ["%2"],
     lambda x: (np.abs(x) * 2.0 * x,)),
    # the output is the input itself, and a value computed from it
    (["Neg in0"], ["in0", "%0"], lambda x: (x, -x)),
]


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("n", [1023, 200_003])
@pytest.mark.parametrize("case", range(len(FORWARDING_PROGRAMS)))
def test_forwarding_keeps_results(ops, case, n, dtype):
    lines, outputs, expect = FORWARDING_PROGRAMS[case]
    uses_in1 = any("in1" in line for line in lines)
    decls = [f"{dtype}[?]"] * (2 if uses_in1 else 1)
    program = program_text(decls, lines, outputs)
    tdt = DTYPES[dtype]

    @tf.function
    def fused_fn(x, one, two):
        # Fresh intermediates that nothing else reads: TensorFlow may forward their buffers.
        inputs = [x * one, x * two] if uses_in1 else [x * one]
        return run_fused(ops, program, inputs, [tdt] * len(outputs))

    x = tf.cast(tf.constant(np.random.default_rng(n).normal(size=n)), tdt)
    results = fused_fn(x, tf.constant(1.0, tdt), tf.constant(2.0, tdt))
    for got, want in zip(results, expect(as_f64(x))):
        tol = 2e-3 if dtype == "f16" else 1e-6
        np.testing.assert_allclose(as_f64(got), want, rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------------
# Errors

def test_malformed_program_names_node_and_line(ops):
    x = tf.constant([1.0, 2.0])
    bad = {
        "in0: f32[2]\n%0 = Foo in0\nout0 = %0": "unknown op 'Foo'",
        "in0: f32[2]\n%0 = Abs %1\nout0 = %0": "not defined above",
        "in0: f32[2]\n%0 = Add in0\nout0 = %0": "takes 2 operands",
        "in0: f32[2]\n%0 = Abs in0\nout1 = %0": "expected out0",
        "in0: f32[2]\n%1 = Abs in0\nout0 = %1": "expected %0",
        "in0: f32[2]\n\n%0 = Abs in0\nout0 = %0": "blank line",
        "in0: f32[2]\n%0 = Abs  in0\nout0 = %0": "bad operand",
        "in0: f32[2]\n%0 = Abs in0 axes=[1]\nout0 = %0": "takes no attribute",
        "in0: f32[2]\n%0 = Add 1.0, 2.0\nout0 = %0": "not an immediate",
        "in0: f32[2]\n%0 = Abs in0": "no output",
        "in0: q8[2]\n%0 = Abs in0\nout0 = %0": "unknown dtype",
        "": "empty",
    }
    for program, message in bad.items():
        with pytest.raises(tf.errors.InvalidArgumentError) as err:
            run_fused(ops, program, [x], [tf.float32])
        text = str(err.value)
        assert message in text, (program, text)
        assert "AutofuseKernel '" in text, text  # names the node (eagerly: the op's name)
        if program:
            assert "program line" in text, text


def test_dtype_not_allowed_for_op(ops):
    x = tf.constant([1, 2], tf.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Exp does not allow dtype i32"):
        run_fused(ops, "in0: i32[2]\n%0 = Exp in0\nout0 = %0", [x], [tf.int32])
    with pytest.raises(tf.errors.InvalidArgumentError, match="is not an i32"):
        run_fused(ops, "in0: i32[2]\n%0 = Add in0, 0.5\nout0 = %0", [x], [tf.int32])


def test_wrong_input_count_and_dtypes(ops):
    x = tf.constant([1.0, 2.0])
    program = "in0: f32[2]\n%0 = Abs in0\nout0 = %0"
    with pytest.raises(tf.errors.InvalidArgumentError, match="2 input.*declares 1"):
        run_fused(ops, program, [x, x], [tf.float32])
    with pytest.raises(tf.errors.InvalidArgumentError, match="input 0 has dtype double"):
        run_fused(ops, program, [tf.constant([1.0, 2.0], tf.float64)], [tf.float32])
    with pytest.raises(tf.errors.InvalidArgumentError, match="output 0 has dtype half"):
        run_fused(ops, program, [x], [tf.float16])
    with pytest.raises(tf.errors.InvalidArgumentError, match="2 output.*defines 1"):
        run_fused(ops, program, [x], [tf.float32, tf.float32])


def test_errors_in_graph_name_the_node(ops):
    """Graph construction runs the shape function, which checks the same things."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None])
        with pytest.raises((ValueError, tf.errors.InvalidArgumentError),
                           match=r"(?s)unknown op 'Foo'.*my_fused"):
            run_fused(ops, "in0: f32[?]\n%0 = Foo in0\nout0 = %0", [x], [tf.float32],
                      name="my_fused")
        with pytest.raises((ValueError, tf.errors.InvalidArgumentError),
                           match=r"(?s)input 0 has dtype float.*my_dtype"):
            run_fused(ops, "in0: f16[?]\n%0 = Abs in0\nout0 = %0", [x], [tf.float16],
                      name="my_dtype")
        y = tf.compat.v1.placeholder(tf.float32, [4])
        with pytest.raises((ValueError, tf.errors.InvalidArgumentError),
                           match=r"(?s)in0: f32\[3\].*my_shape"):
            run_fused(ops, "in0: f32[3]\n%0 = Abs in0\nout0 = %0", [y], [tf.float32],
                      name="my_shape")
        (ok,) = run_fused(ops, "in0: f32[?]\nin1: f32[5]\n%0 = Add in0, in1\nout0 = %0",
                          [x, x], [tf.float32], name="ok")
        assert ok.shape.as_list() == [5]


def test_runtime_shape_mismatch_names_shapes(ops):
    program = "in0: f32[?]\nin1: f32[?]\n%0 = Add in0, in1\nout0 = %0"
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"AutofuseKernel '.*'.*do not broadcast: input 0 of shape \[5\] "
                             r"and input 1 of shape \[6\]"):
        run_fused(ops, program, [tf.zeros([5]), tf.zeros([6])], [tf.float32])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"input 0 has shape \[2,3\] but the program declares in0: "
                             r"f32\[2,4\]"):
        run_fused(ops, "in0: f32[2,4]\n%0 = Abs in0\nout0 = %0", [tf.zeros([2, 3])],
                  [tf.float32])

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None])
        (y,) = run_fused(ops, "in0: f32[3]\n%0 = Abs in0\nout0 = %0", [x], [tf.float32],
                         name="runtime_node")
        with tf.compat.v1.Session(graph=g) as sess:
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=r"AutofuseKernel 'runtime_node': input 0 has shape \[4\]"):
                sess.run(y, {x: np.zeros(4, np.float32)})


# ---------------------------------------------------------------------------------------------
# Determinism

# Runs in a fresh process: TensorFlow sizes its intra-op pool once per process unless
# TF_OVERRIDE_GLOBAL_THREADPOOL gives every session its own, sized by its ConfigProto.
_THREADS_SCRIPT = """
import sys
import numpy as np
import tensorflow as tf

library, program, count, values_path, out_path = sys.argv[1:6]
ops = tf.load_op_library(library)
values = np.load(values_path)
results = []
for threads in (1, 2, 2):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.as_dtype(values.dtype), None)
        outs = ops.autofuse_kernel(inputs=[x], Tout=[x.dtype] * int(count), program=program)
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads,
                                      inter_op_parallelism_threads=1)
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        results.append(np.concatenate([o.ravel() for o in sess.run(outs, {x: values})]))
np.save(out_path, np.stack(results))
"""


def assert_bit_identical_across_threads(ops, program, values, count, tmp_path):
    """`program` (one input, `count` outputs of its dtype) gives the same bits on `values` run on
    1, 2 and again 2 threads in a fresh process, and eagerly here."""
    import subprocess

    np.save(tmp_path / "values.npy", values)
    env = dict(os.environ, TF_OVERRIDE_GLOBAL_THREADPOOL="1", TF_CPP_MIN_LOG_LEVEL="2")
    subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, kernel_library.path(), program,
                    str(count), str(tmp_path / "values.npy"), str(tmp_path / "out.npy")],
                   check=True, env=env, timeout=300)
    one, two, again = np.load(tmp_path / "out.npy")
    eager = np.concatenate([o.numpy().ravel() for o in
                            run_fused(ops, program, [tf.constant(values)], [values.dtype] * count)])
    bits = lambda a: np.asarray(a).view(np.uint16 if a.itemsize == 2 else np.uint8)  # noqa
    np.testing.assert_array_equal(bits(one), bits(two))
    np.testing.assert_array_equal(bits(two), bits(again))
    np.testing.assert_array_equal(bits(one), bits(eager))


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_bit_identical_across_runs_and_threads(ops, dtype, tmp_path):
    values = tf.cast(tf.constant(np.random.default_rng(5).normal(0, 3, 1_000_003)),
                     DTYPES[dtype]).numpy()
    program = program_text([f"{dtype}[?]"],
                           ["Tanh in0", "Exp %0", "Mul %1, in0", "Softplus %2", "Erf %3"],
                           ["%4"])
    assert_bit_identical_across_threads(ops, program, values, 1, tmp_path)


# ---------------------------------------------------------------------------------------------
# Strip fusion (schedule.h, StripRun): full tiles run spans of fp32 elementwise steps strip by
# strip; a ragged last tile runs them step by step over the tile. Both must give the same bits.

_STRIP_PROGRAMS = {
    "chain": (1, ["Abs in0", "Relu %0", "Exp %1"], ["%2", "%0"]),
    "gelu_tanh": (1, ["Mul in0, in0", "Mul %0, in0", "Mul %1, 0.044715", "Add in0, %2",
                      "Mul %3, 0.7978846", "Tanh %4", "Add %5, 1.0", "Mul in0, %6",
                      "Mul %7, 0.5"], ["%8"]),
    # every op strips run, immediates on either side, a value live across the span and a
    # second output in the middle of it
    "every_op": (2, ["Sub in0, in1", "Sigmoid %0", "Mul %0, %1", "Erfc %2", "Sqrt %3",
                     "LeakyRelu %0 alpha=0.3", "Relu6 %5", "Maximum %6, %4", "Minimum %7, in1",
                     "Div %8, 3.0", "SquaredDifference %9, %2", "Square %10", "Neg %11",
                     "Abs %12", "Add -1.5, %13", "Tanh %14"], ["%15", "%2"]),
    # one unary op: in f16 its load and its store both fold into it
    "one_op": (1, ["Sigmoid in0"], ["%0"]),
    # 14 values live at once: more than a run's strip buffers, so the span is cut in two
    "many_live": (1, [f"Mul in0, {k + 2}.0" for k in range(14)]
                  + ["Add %0, %1"] + [f"Add %{14 + k}, %{k + 2}" for k in range(12)],
                  ["%26", "%13"]),
}


# NaN (both signs), signed zeros, infinities, tiny values: every path must agree on them too
_STRIP_SPECIALS = [np.nan, -np.nan, -0.0, 0.0, np.inf, -np.inf, 1e-30, -1e-30]


def _strip_refs(name, x, y):
    if name == "chain":
        return [np.exp(np.maximum(np.abs(x), 0)), np.abs(x)]
    if name == "gelu_tanh":
        return [0.5 * x * (1 + np.tanh(0.7978846 * (x + 0.044715 * x ** 3)))]
    if name == "one_op":
        return [1 / (1 + np.exp(-x))]
    if name == "many_live":
        return [x * sum(k + 2 for k in range(14)), x * 15.0]
    d = x - y
    swish = d / (1 + np.exp(-d))
    erfc = np.array([math.erfc(v) for v in swish])
    v = np.minimum(np.maximum(np.minimum(np.maximum(np.where(d < 0, 0.3 * d, d), 0), 6),
                              np.sqrt(erfc)), y) / 3.0
    return [np.tanh(-1.5 + np.abs(-((v - swish) ** 2) ** 2)), swish]


def _strip_inputs(name, dtype, n, tail):
    """Inputs of n elements whose last `tail` (a ragged tile) repeat their first ones."""
    rng = np.random.default_rng(11)
    count, _, _ = _STRIP_PROGRAMS[name]
    scale = {"every_op": 1.0, "chain": 2.0}.get(name, 3.0)  # exp(|x|) within f16's range
    values = []
    for k in range(count):
        v = rng.normal(0, scale, n)
        v[k:k + len(_STRIP_SPECIALS)] = _STRIP_SPECIALS  # each operand's meet ordinary values
        v[-tail:] = v[:tail]
        values.append(tf.cast(tf.constant(v), DTYPES[dtype]))
    return values


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("name", sorted(_STRIP_PROGRAMS))
def test_strip_runs_match_tile_steps_bit_for_bit(ops, name, dtype):
    """The first elements (a full tile: strips) and the same values in the ragged last tile
    (staged: every step over the tile, as before strip fusion) give the same bits; in fp32 the
    results are close to the float64 reference."""
    count, lines, outputs = _STRIP_PROGRAMS[name]
    n, tail = 3 * 4096 + 37, 37
    inputs = _strip_inputs(name, dtype, n, tail)
    program = program_text([f"{dtype}[{n}]"] * count, lines, outputs)
    fused = run_fused(ops, program, inputs, [DTYPES[dtype]] * len(outputs))
    bits = np.uint16 if dtype != "f32" else np.uint32
    for k, out in enumerate(fused):
        got = out.numpy().view(bits)
        np.testing.assert_array_equal(got[-tail:], got[:tail], err_msg=f"{name} out{k}")
    if dtype == "f32":
        plain = slice(len(_STRIP_SPECIALS) + count, n - tail)  # references ignore NaN, inf, -0
        x = as_f64(inputs[0])[plain]
        y = as_f64(inputs[1])[plain] if count > 1 else None
        for k, (out, ref) in enumerate(zip(fused, _strip_refs(name, x, y))):
            np.testing.assert_allclose(as_f64(out)[plain], ref, rtol=2e-5, atol=1e-6,
                                       err_msg=f"{name} out{k}")


_STRIP_OFF_SCRIPT = """
import ctypes, sys
import numpy as np
import tensorflow as tf

library, cases_path, out_path = sys.argv[1:4]
ops = tf.load_op_library(library)
ctypes.CDLL(library).autofuse_set_strip_fusion(0)
cases = np.load(cases_path, allow_pickle=True)["cases"]
results = []
for program, values, count in cases:
    graph = tf.Graph()
    with graph.as_default():
        xs = [tf.constant(v) for v in values]
        outs = ops.autofuse_kernel(inputs=xs, Tout=[xs[0].dtype] * count, program=program)
    with tf.compat.v1.Session(graph=graph) as sess:
        results.append([np.asarray(o) for o in sess.run(outs)])
np.save(out_path, np.array(results, dtype=object), allow_pickle=True)
"""


def test_strip_fusion_off_gives_the_same_bits(ops, tmp_path):
    """AUTOFUSE_DFX_FLAGS=--strip_fusion=false (every step over whole tiles, in a subprocess)
    and strip fusion give the same bits: elementwise chains, and reductions whose full passes
    read a row's reduced value as a scalar (softmax over rows), kept values (rows of 4096), row
    groups (short rows) and reduced values as tiles (a column reduction); accumulations and
    broadcast loads inside runs (LayerNorm, a bias)."""
    import subprocess

    rng = np.random.default_rng(12)
    softmax = ("in0: f32[?,{c}]\n%0 = Max in0 axes=[{a}]\n%1 = Sub in0, %0\n%2 = Exp %1\n"
               "%3 = Sum %2 axes=[{a}]\n%4 = Div %2, %3\n%5 = Mul %4, in0\nout0 = %5")
    cases = []
    for rows, cols, axis in ((64, 4096, 1), (512, 100, 1), (300, 1000, 0)):
        x = rng.normal(0, 2, (rows, cols)).astype(np.float32)
        cases.append((softmax.format(c=cols, a=axis), [x], 1))
    # broadcast loads and accumulations inside runs: LayerNorm, a bias
    layernorm = ("in0: f32[?,768]\nin1: f32[768]\nin2: f32[768]\n%0 = Mean in0 axes=[1]\n"
                 "%1 = Sub in0, %0\n%2 = Square %1\n%3 = Mean %2 axes=[1]\n%4 = Add %3, 1e-05\n"
                 "%5 = Rsqrt %4\n%6 = Mul %1, %5\n%7 = Mul %6, in1\n%8 = Add %7, in2\nout0 = %8")
    cases.append((layernorm, [rng.normal(1, 2, (300, 768)).astype(np.float32),
                              rng.normal(1, 0.2, 768).astype(np.float32),
                              rng.normal(0, 0.2, 768).astype(np.float32)], 1))
    bias = ("in0: f16[?,1000]\nin1: f16[1000]\n%0 = Abs in0\n%1 = Add %0, in1\n%2 = Relu %1\n"
            "out0 = %2")
    cases.append((bias, [rng.normal(0, 2, (300, 1000)).astype(np.float16),
                         rng.normal(0, 2, 1000).astype(np.float16)], 1))
    for name, (count, lines, outputs) in sorted(_STRIP_PROGRAMS.items()):
        for dtype in ("f32", "f16"):
            n = 70_003
            values = [v.numpy() for v in _strip_inputs(name, dtype, n, 37)]
            cases.append((program_text([f"{dtype}[{n}]"] * count, lines, outputs), values,
                          len(outputs)))
    np.savez(tmp_path / "cases.npz", cases=np.array(cases, dtype=object))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    subprocess.run([sys.executable, "-c", _STRIP_OFF_SCRIPT, kernel_library.path(),
                    str(tmp_path / "cases.npz"), str(tmp_path / "off.npy")],
                   check=True, env=env, timeout=300)
    off = np.load(tmp_path / "off.npy", allow_pickle=True)
    for (program, values, count), want in zip(cases, off):
        got = run_fused(ops, program, [tf.constant(v) for v in values],
                        [tf.as_dtype(values[0].dtype)] * count)
        for g, w in zip(got, want):
            g = g.numpy()
            np.testing.assert_array_equal(g.view(np.uint8), np.asarray(w).view(np.uint8),
                                          err_msg=program.splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# Benchmark: python tests/test_kernel.py --bench

def _median_ms(fn, reps=20):
    import statistics
    import time

    fn()
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def benchmark():
    # TensorFlow's own ops must run unfused: no plugin optimizer for this process.
    os.environ.pop("AUTOFUSE_FLAGS", None)
    ops = kernel_library.load()
    for dtype in ("f32", "f16"):
        tdt = DTYPES[dtype]
        x = tf.cast(tf.constant(np.random.default_rng(0).normal(size=(4096, 4096))), tdt)
        program = program_text([f"{dtype}[4096,4096]"], ["Abs in0", "Relu %0", "Exp %1"], ["%2"])
        fused_fn = tf.function(lambda a: run_fused(ops, program, [a], [tdt])[0])
        tf_fn = tf.function(lambda a: tf.exp(tf.nn.relu(tf.abs(a))))
        src = x.numpy()
        dst = np.empty_like(src)
        rows = {
            "fused (eager)": lambda: run_fused(ops, program, [x], [tdt]),
            "fused (tf.function)": lambda: fused_fn(x),
            "TF 3 ops (eager)": lambda: tf.exp(tf.nn.relu(tf.abs(x))),
            "TF 3 ops (tf.function)": lambda: tf_fn(x),
            "np.copyto (same bytes, destination reused)": lambda: np.copyto(dst, src),
            "np.copy (same bytes, fresh destination)": lambda: src.copy(),
        }
        print(f"abs->relu->exp [4096,4096] {dtype}: "
              + ", ".join(f"{k} {_median_ms(f):.1f} ms" for k, f in rows.items()), flush=True)


if __name__ == "__main__":
    if "--bench" in sys.argv:
        benchmark()
    else:
        sys.exit(pytest.main([__file__, "-q"] + sys.argv[1:]))
