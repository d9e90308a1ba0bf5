"""The graphs the long fuzz (scripts/fuzz_long.py) found failing, the class of programs each
belongs to, and the fuzz itself on a seed that changes with every commit (fuzz_seed.py).

Each found graph is checked the way the fuzz checks it (test_random_graphs.check_spec: structure,
no warning, fused vs unfused vs float64); the class tests check the property behind the bug on
graphs written out by hand, so that they hold whatever the generator draws next.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import tensorflow as tf

import fuzz_seed
import test_random_graphs as rg
import kernel_library
import sessions
from test_kernel import run_fused
from tf_autofuse import _warn, rewriter
from tf_autofuse.rewriter import program as ir

tf1 = tf.compat.v1

# (seed, graph index) of scripts/fuzz_long.py --features all, and what each found
FOUND = {
    (8686, 737): "f16 stacked normalisations whose squares pass 65504, small partition limits",
    (5151, 1208): "Pow(Prod(x) with a -0.0 product, x): the reference lost the zero's sign",
    (4242, 511): "ClipByValue(const, computed, const): Minimum of two immediates",
    (1001, 2826): "ClipByValue(const, computed, const)",
    (3003, 578): "ClipByValue(const, computed, const)",
    (3003, 1868): "ClipByValue(const, computed, const)",
    (990099, 2118): "f32 Erf near 1: Eigen's erf 6 ulps off where TensorFlow's was closer",
    (4242, 4533): "x / Relu(-0.0): the sign of Relu(-0.0) is unspecified (TensorFlow: +0 or -0)",
    (8080, 2595): "Round(x / c) in bf16: Grappler's x * (1 / c) rounds 1 / c to bf16",
    (4242, 162): "x - mean(x), x a Tile: read through, its readers became reduced values",
    (3166023375, 816): "bf16 AddN tree regrouped by Grappler in the fused session only",
}

COMMIT_GRAPHS = int(os.environ.get("TF_AUTOFUSE_FUZZ_COMMIT_GRAPHS", "300"))


def _spec(seed: int, index: int) -> rg.GraphSpec:
    return rg.generate(rg.RandomChooser(np.random.default_rng([seed, index])), rg.ALL)


@pytest.mark.parametrize("seed,index", sorted(FOUND), ids=[f"{s}-{i}" for s, i in sorted(FOUND)])
def test_graphs_the_fuzz_found(seed, index):
    rg.check_spec(_spec(seed, index))


def test_fuzz_on_the_commit_seed():
    """COMMIT_GRAPHS fresh graphs on the commit's seed; a failure names the command that
    reruns it."""
    seed, source = fuzz_seed.commit_seed()
    failed = []
    for index in range(COMMIT_GRAPHS):
        try:
            rg.check_spec(_spec(seed, index))
        except Exception as err:  # noqa: BLE001 - every kind of failure is a finding
            failed.append((index, f"{type(err).__name__}: {err}"))
    assert not failed, (
        f"fuzz seed {seed} ({source}): graphs {[i for i, _ in failed]} of {COMMIT_GRAPHS} failed; "
        f"rerun one with: python scripts/fuzz_long.py --seed {seed} --only {failed[0][0]}\n"
        f"{failed[0][1]}")


# --- ClipByValue of constants: no instruction of immediates only ------------------------------

@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float32, tf.int32])
@pytest.mark.parametrize("value,high", [(2.0, 0.5), (0.25, 0.5), (-3.0, -4.0)])
def test_clip_of_a_constant_value_and_bound_folds(dtype, value, high):
    """ClipByValue(const, computed lo, const hi): min(value, hi) is folded (it is one of the two
    constants, picked exactly as std::min does) and the lower bound still clips it."""
    if dtype == tf.int32:
        value, high = int(value), int(high)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(dtype, [], name="x")
        lo = tf.nn.relu(tf.abs(x) - tf.cast(1, dtype), name="lo")
        out = tf.raw_ops.ClipByValue(t=tf.constant(value, dtype), clip_value_min=lo,
                                     clip_value_max=tf.constant(high, dtype), name="clip")
    result = rewriter.rewrite(graph.as_graph_def(), preserve=["clip"], feeds=["x"])
    assert result.fusions, result.refusals
    for fusion in result.fusions:
        program = ir.parse(fusion.program)
        for inst in program.instructions:
            assert any(isinstance(o, ir.Ref) for o in inst.operands), fusion.program
    with tf1.Session(graph=graph, config=sessions.config()) as sess:
        for data in (-3, -1, 0, 1, 4):
            fused = sess.run(out, {x: data})
            assert float(fused) == float(max(min(value, high), abs(data) - 1, 0)), (data, fused)


# --- the sign of a zero product ----------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "f64"])
def test_prod_of_a_zero_keeps_the_sign_and_pow_of_it_the_infinity(dtype):
    """A product with a zero is -0.0 after an odd number of negative factors (or -0.0s), and
    Pow(-0.0, -1) is -inf: the fused Prod and Pow give numpy's float64 bits, signs included."""
    ops = kernel_library.load()
    rows = np.array([[0.0, -2.0, 3.0, -1.0],    # +0 (two negatives)
                     [0.0, -2.0, 3.0, 1.0],     # -0 (one negative)
                     [-0.0, 2.0, 3.0, 1.0],     # -0 (a -0.0 factor)
                     [-0.0, -2.0, 3.0, 1.0],    # +0
                     [1.0, -2.0, 3.0, 0.5]])    # -3
    exponent = np.array([[-1.0], [-1.0], [-3.0], [-1.0], [2.0]])
    np_type = rg.np_dtype(dtype)
    x = tf.constant(rows.astype(np_type))
    e = tf.constant(exponent.astype(np_type))
    program = (f"in0: {dtype}[5,4]\nin1: {dtype}[5,1]\n%0 = Prod in0 axes=[1]\n"
               f"%1 = Pow %0, in1\nout0 = %0\nout1 = %1")
    prod, power = run_fused(ops, program, [x, e], [x.dtype, x.dtype])
    want_prod = np.prod(rows, axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        want_pow = np.power(want_prod, exponent)
    got_prod = prod.numpy().astype(np.float64)
    np.testing.assert_array_equal(got_prod, want_prod)
    np.testing.assert_array_equal(np.signbit(got_prod), np.signbit(want_prod))
    np.testing.assert_array_equal(power.numpy().astype(np.float64), want_pow)


# --- 16-bit values beyond their range, and where the partition rounds them ---------------------

@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_a_value_beyond_the_16_bit_range_stays_f32_inside_a_kernel(dtype):
    """The class of (8686, 737): a 16-bit kernel computes in f32 and rounds once, at its
    outputs. Squares beyond 65504 (f16) stay finite inside the kernel, so the rsqrt of their
    mean is the float64 one; the same mean as an output is stored, as +inf in f16."""
    ops = kernel_library.load()
    big = 400.0 if dtype == "f16" else 1e19  # squares beyond the type's largest value
    values = np.array([[big, -big, 1.0, 2.0], [1.0, 2.0, 3.0, 4.0]])
    x = tf.constant(values.astype(rg.np_dtype(dtype)))
    program = (f"in0: {dtype}[2,4]\n%0 = Square in0\n%1 = Mean %0 axes=[1]\n"
               f"%2 = Rsqrt %1\nout0 = %1\nout1 = %2")
    mean, rsqrt = run_fused(ops, program, [x], [x.dtype, x.dtype])
    exact = np.mean(np.asarray(x.numpy(), np.float64) ** 2, axis=1, keepdims=True)
    got = rsqrt.numpy().astype(np.float64)
    assert np.all(np.isfinite(got)) and np.all(got > 0)
    np.testing.assert_allclose(got, 1 / np.sqrt(exact), rtol=2.0 ** -(rg._MANTISSA[dtype]))
    stored = mean.numpy().astype(np.float64)
    assert stored[0, 0] == np.float64(exact[0, 0]).astype(rg.np_dtype(dtype)).astype(np.float64)
    if dtype == "f16":
        assert stored[0, 0] == np.inf


PARTITIONS = [
    {},
    {"autofuse_enable_pass": "reduce"},
    {"autofuse_enable_pass": "reduce", "max_fusion_size": "2", "max_input_nums_after_fuse": "2",
     "recomputation_threshold": "8"},
    {"autofuse_enable_pass": "reduce", "max_fusion_size": "3", "recomputation_threshold": "8"},
    {"autofuse_enable_pass": "reduce", "max_fusion_size": "4", "max_input_nums_after_fuse": "3"},
]


def _stacked_normalisations(dtype):
    """The shape of (8686, 737): a row layer norm, then one over both axes of it plus a bias,
    selected on IsFinite of the first mean."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(dtype, [13, 17], name="x")
        b = tf1.placeholder(dtype, [1, 1], name="b")
        eps = tf.constant(1e-3, dtype)
        mean = tf.reduce_mean(x, axis=1, keepdims=True)
        d = x - mean
        r = tf.math.rsqrt(tf.reduce_mean(tf.square(d), axis=1, keepdims=True) + eps)
        y = b + d * r
        d2 = y - tf.reduce_mean(y, axis=[0, 1], keepdims=True)
        z = d2 * tf.math.rsqrt(tf.reduce_mean(tf.square(d2), axis=[0, 1], keepdims=True) + eps)
        out = tf.where(tf.math.is_finite(mean), z, r, name="out")
    return graph, x, b, out


def _stacked_reference(x, b):
    mean = x.mean(axis=1, keepdims=True)
    d = x - mean
    r = 1 / np.sqrt((d * d).mean(axis=1, keepdims=True) + 1e-3)
    y = b + d * r
    d2 = y - y.mean()
    return d2 / np.sqrt((d2 * d2).mean() + 1e-3)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32])
@pytest.mark.parametrize("params", PARTITIONS, ids=range(len(PARTITIONS)))
def test_stacked_normalisations_agree_with_float64_whatever_the_partition(dtype, params):
    """Recomputation into kernels with reductions and values kept across passes, under the
    limits that cut the program into many kernels: with values in range, every partition's
    result is as close to float64 as TensorFlow's."""
    graph, x, b, out = _stacked_normalisations(dtype)
    rng = np.random.default_rng(737)
    xv = rng.normal(0.0, 8.0, (13, 17)).astype(dtype.as_numpy_dtype)
    bv = np.array([[-2.2]], dtype.as_numpy_dtype)
    ref = _stacked_reference(xv.astype(np.float64), bv.astype(np.float64))
    cfg = sessions.config(True, params)
    _warn.reset()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", _warn.AutofuseWarning)
        with tf1.Session(graph=graph, config=cfg) as sess:
            metadata = tf1.RunMetadata()
            fused = sess.run(out, {x: xv, b: bv},
                             options=tf1.RunOptions(output_partition_graphs=True),
                             run_metadata=metadata)
    assert not [w for w in said if issubclass(w.category, _warn.AutofuseWarning)]
    kernels = [n.name for p in metadata.partition_graphs for n in p.node
               if n.op == "AutofuseKernel"]
    assert kernels
    with tf1.Session(graph=graph, config=sessions.config(False)) as sess:
        unfused = sess.run(out, {x: xv, b: bv})
    f, t = np.asarray(fused, np.float64), np.asarray(unfused, np.float64)
    ulp = 2.0 ** -{tf.float16: 10, tf.bfloat16: 7, tf.float32: 23}[dtype]
    # the unfused error plus a few roundings of the output's scale
    np.testing.assert_array_less(np.abs(f - ref), np.abs(t - ref) + 8 * ulp * (1 + np.abs(ref)))
