"""Views, broadcasting, LeakyRelu, the binary ops with inputs of their own, bool, Cast, Select
and reductions of the kernel.

Like test_kernel.py, every result is compared with TensorFlow's own ops on the same input and
with a float64 numpy reference: each element within the dtype's tolerance of TensorFlow's, or
at least as accurate as TensorFlow's. Reductions must be bit-identical across runs and thread
counts.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import tensorflow as tf

import kernel_library
from test_kernel import (DTYPES, FLOATS, INT32_MAX, INT32_MIN, OWN_INPUTS, as_f64,
                         assert_bit_identical_across_threads, assert_float_close, float_inputs,
                         program_text, raw_op, run_fused, ulp)
from tf_autofuse.rewriter import catalog, passes
from tf_autofuse.rewriter import program as ir


def cast(values, dtype):
    return tf.cast(tf.constant(values), DTYPES[dtype])


def rng_for(*seed):
    return np.random.default_rng([abs(hash(str(s))) % (2**31) for s in seed])


SIZES = (0, 1, 7, 1023, 100_003)

# ---------------------------------------------------------------------------------------------
# LeakyRelu (its alpha attribute); the other unary ops are in test_kernel.py, taken from the table

_LEAKY = 0.2


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", FLOATS)
def test_leaky_relu(ops, dtype, n):
    x = cast(float_inputs("normal", n, rng_for("LeakyRelu", dtype, n)), dtype)
    (fused,) = run_fused(ops, program_text([f"{dtype}[{n}]"], [f"LeakyRelu in0 alpha={_LEAKY}"],
                                           ["%0"]), [x], [DTYPES[dtype]])
    unfused = tf.nn.leaky_relu(x, alpha=_LEAKY)
    # alpha is a value of the dtype, as in TensorFlow
    a = tf.constant(_LEAKY, DTYPES[dtype]).numpy().astype(np.float64)
    ref = catalog.for_ir_name("LeakyRelu").reference(as_f64(x), alpha=a)
    assert fused.shape == unfused.shape and fused.dtype == unfused.dtype
    assert_float_close(as_f64(fused), as_f64(unfused), ref, dtype, f"LeakyRelu {dtype}[{n}]")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", FLOATS)
def test_classify_and_logical_not(ops, dtype, n):
    x = cast(float_inputs("normal", n, rng_for("cls", dtype, n)), dtype)
    program = program_text([f"{dtype}[{n}]"],
                           ["IsNan in0", "IsInf in0", "IsFinite in0", "LogicalNot %2",
                            "LogicalAnd %3, %1", "LogicalOr %0, %4"],
                           ["%0", "%1", "%2", "%3", "%5"])
    outs = run_fused(ops, program, [x], [tf.bool] * 5)
    v = as_f64(x)
    want = [np.isnan(v), np.isinf(v), np.isfinite(v), ~np.isfinite(v),
            np.isnan(v) | (~np.isfinite(v) & np.isinf(v))]
    tf_want = [tf.math.is_nan(x), tf.math.is_inf(x), tf.math.is_finite(x),
               tf.logical_not(tf.math.is_finite(x))]
    for got, w in zip(outs, want):
        assert got.dtype == tf.bool
        np.testing.assert_array_equal(got.numpy(), w)
    for got, w in zip(outs, tf_want):
        np.testing.assert_array_equal(got.numpy(), w.numpy())


@pytest.mark.parametrize("dtype", FLOATS + ("i32", "bool"))
@pytest.mark.parametrize("n", (0, 7, 1023, 100_003))
def test_zeros_ones_like(ops, dtype, n):
    if dtype == "bool":
        x = tf.constant(np.random.default_rng(n).random(n) < 0.5)
    elif dtype == "i32":
        x = tf.constant(np.arange(n, dtype=np.int32))
    else:
        x = cast(float_inputs("normal", n, rng_for(dtype, n)), dtype)
    program = program_text([f"{dtype}[?]"], ["ZerosLike in0", "OnesLike in0"], ["%0", "%1"])
    zeros, ones = run_fused(ops, program, [x], [x.dtype, x.dtype])
    np.testing.assert_array_equal(zeros.numpy(), tf.zeros_like(x).numpy())
    np.testing.assert_array_equal(ones.numpy(), tf.ones_like(x).numpy())


@pytest.mark.parametrize("n", (0, 1, 7, 1023, 100_003))
@pytest.mark.parametrize("src", FLOATS)
@pytest.mark.parametrize("to", FLOATS)
def test_cast(ops, src, to, n):
    v = float_inputs("wide", n, rng_for("cast", src, to, n)) * np.where(
        np.arange(n) % 3 == 0, 1e4, 1.0)
    x = cast(v, src)
    program = program_text([f"{src}[{n}]"], [f"Cast in0 to={to}", "Neg %0"], ["%0", "%1"])
    got, neg = run_fused(ops, program, [x], [DTYPES[to]] * 2)
    want = tf.cast(x, DTYPES[to])
    np.testing.assert_array_equal(got.numpy().view(np.uint8), want.numpy().view(np.uint8))
    np.testing.assert_array_equal(as_f64(neg), -as_f64(want))


def test_cast_rounds_in_the_middle(ops):
    """A Cast to f16 rounds there: f32 -> f16 -> f32 is not the identity."""
    x = tf.constant([1.0 + 2.0**-12, 65519.0, 1e-8], tf.float32)
    program = program_text(["f32[3]"], ["Cast in0 to=f16", "Cast %0 to=f32", "Sub in0, %1"],
                           ["%2"])
    (got,) = run_fused(ops, program, [x], [tf.float32])
    want = x - tf.cast(tf.cast(x, tf.float16), tf.float32)
    np.testing.assert_array_equal(got.numpy(), want.numpy())


# ---------------------------------------------------------------------------------------------
# The binary ops with inputs of their own (test_kernel.OWN_INPUTS), comparisons, Select

def _binary_inputs(name, dtype, n):
    rng = rng_for(name, dtype, n)
    if name == "Pow":
        x = np.exp(rng.uniform(-3, 3, n))
        y = rng.uniform(-4, 4, n)
        y[: n // 4] = np.round(y[: n // 4])  # integral exponents, negative bases
        x[: n // 8] = -x[: n // 8]
    else:
        x = rng.normal(0, 20, n)
        y = rng.normal(0, 3, n)
        y[np.abs(y) < 0.05] = 0.5
    return cast(x, dtype), cast(y, dtype)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(OWN_INPUTS))
def test_binary_with_own_inputs(ops, name, dtype, n):
    spec = catalog.for_ir_name(name)
    x, y = _binary_inputs(name, dtype, n)
    (fused,) = run_fused(ops, program_text([f"{dtype}[{n}]"] * 2, [f"{name} in0, in1"], ["%0"]),
                         [x, y], [DTYPES[dtype]])
    unfused = raw_op(spec.tf_ops[0])(x, y)
    ref = spec.reference(as_f64(x), as_f64(y))
    assert_float_close(as_f64(fused), as_f64(unfused), ref, dtype, f"{name} {dtype}[{n}]")


def test_floormod_sign_of_y(ops):
    x = tf.constant([5.0, -5.0, 5.0, -5.0, 0.0, -0.0, 7.5], tf.float32)
    y = tf.constant([3.0, 3.0, -3.0, -3.0, 2.0, -2.0, 2.5], tf.float32)
    (got,) = run_fused(ops, program_text(["f32[7]"] * 2, ["FloorMod in0, in1"], ["%0"]), [x, y],
                       [tf.float32])
    np.testing.assert_array_equal(got.numpy(), tf.math.floormod(x, y).numpy())
    np.testing.assert_array_equal(np.signbit(got.numpy()),
                                  np.signbit(tf.math.floormod(x, y).numpy()))


# The binary ops of the table with a bool result, and TensorFlow's kernel of each.
COMPARISONS = {s.ir_name: raw_op(s.tf_ops[0]) for s in catalog.OPS
               if s.arity == 2 and s.result == "bool"}


@pytest.mark.parametrize("n", (0, 1, 7, 1023, 100_003))
@pytest.mark.parametrize("dtype", FLOATS + ("i32",))
def test_comparisons_and_select(ops, dtype, n):
    rng = rng_for("cmp", dtype, n)
    if dtype == "i32":
        x = tf.constant(rng.integers(-5, 5, n).astype(np.int32))
        y = tf.constant(rng.integers(-5, 5, n).astype(np.int32))
    else:
        x = cast(np.round(float_inputs("normal", n, rng, 0)), dtype)
        y = cast(np.round(float_inputs("normal", n, rng, 1)), dtype)
    names = sorted(COMPARISONS)
    k = len(names)  # the first Select
    lines = [f"{name} in0, in1" for name in names]
    lines += [f"Select %{names.index('Greater')}, in0, in1", f"Select %0, %{k}, 2",
              "Less in0, 1"]
    program = program_text([f"{dtype}[?]"] * 2, lines, [f"%{i}" for i in range(len(lines))])
    outs = run_fused(ops, program, [x, y], [tf.bool] * k + [x.dtype] * 2 + [tf.bool])
    for got, name in zip(outs, names):
        np.testing.assert_array_equal(got.numpy(), COMPARISONS[name](x, y).numpy(), err_msg=name)
    sel = tf.where(tf.greater(x, y), x, y)
    np.testing.assert_array_equal(as_f64(outs[k]), as_f64(sel))
    two = tf.constant(2, x.dtype)
    np.testing.assert_array_equal(as_f64(outs[k + 1]),
                                  as_f64(tf.where(outs[0], sel, tf.fill(tf.shape(x), two))))
    np.testing.assert_array_equal(outs[k + 2].numpy(), tf.less(x, tf.constant(1, x.dtype)).numpy())


def test_bool_inputs_outputs_and_literals(ops):
    a = tf.constant([True, False, True, False])
    b = tf.constant([True, True, False, False])
    program = program_text(["bool[4]", "bool[4]"],
                           ["LogicalAnd in0, in1", "LogicalOr %0, false", "LogicalAnd in1, true",
                            "Select in0, 1.5, %3", "Cast %3 to=f32"], [])
    # Select needs a non-immediate x or y: the program above is malformed on purpose
    with pytest.raises(tf.errors.InvalidArgumentError, match="program line"):
        run_fused(ops, program + "out0 = %0", [a, b], [tf.bool])
    x = tf.constant([1.0, 2.0, 3.0, 4.0])
    program = program_text(["bool[4]", "bool[4]", "f32[4]"],
                           ["LogicalAnd in0, in1", "LogicalOr %0, false", "LogicalAnd in1, true",
                            "Select %1, in2, -1.0", "Select true, %3, in2"],
                           ["%1", "%2", "%4", "in0"])
    o1, o2, o3, o4 = run_fused(ops, program, [a, b, x], [tf.bool, tf.bool, tf.float32, tf.bool])
    np.testing.assert_array_equal(o1.numpy(), [True, False, False, False])
    np.testing.assert_array_equal(o2.numpy(), b.numpy())
    np.testing.assert_array_equal(o3.numpy(), [1.0, -1.0, -1.0, -1.0])
    np.testing.assert_array_equal(o4.numpy(), a.numpy())


# ---------------------------------------------------------------------------------------------
# Broadcasting and views

BROADCASTS = [
    # (shape of in0, shape of in1, declared view of in1 or None)
    ([64, 33], [], None),                # scalar
    ([1000, 37], [37], None),            # trailing vector, rows across tiles
    ([4096, 100], [100], None),
    ([1000, 37], [1000, 1], None),       # column
    ([5, 7, 9, 33], [5, 1, 1, 33], None),  # middle
    ([3, 1, 5], [1, 4, 1], None),        # both stretched
    ([2, 3, 5], [5], None),              # rank mismatch
    ([4, 16, 9, 10], [16], [16, 1, 1]),  # NCHW bias through a view
    ([1], [300, 7], None),               # in0 is the stretched one
    ([0, 5], [5], None),                 # empty
    ([7], [1], None),
    # a read row repeated along a stretched dimension (converted once, then copied by doubling):
    ([3000, 3], [3], None),              # many tiny rows a tile, tiles starting mid-row
    ([40, 3, 5], [40, 1, 5], None),      # the repeats stop at the dimension's end, carry outward
    ([2, 700, 5], [2, 1, 5], None),      # the repeats cross a tile boundary
    ([9, 50, 2, 11], [9, 1, 1, 11], None),  # collapsed to [9, 100, 11]
    ([6, 5, 400, 3], [1, 5, 1, 3], None),   # stretched, read, stretched, read
]


def _decl(dtype, shape, view=None):
    text = f"{dtype}[{','.join(str(d) for d in shape)}]"
    if view is not None:
        text += f" -> [{','.join(str(d) for d in view)}]"
    return text


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "f64", "i32"])
@pytest.mark.parametrize("case", range(len(BROADCASTS)))
def test_broadcast_patterns(ops, case, dtype):
    s0, s1, view = BROADCASTS[case]
    rng = rng_for("bc", case, dtype)
    if dtype == "i32":
        x = tf.constant(rng.integers(-100, 100, s0).astype(np.int32))
        y = tf.constant(rng.integers(-100, 100, s1).astype(np.int32))
    else:
        x = cast(rng.normal(0, 3, s0), dtype)
        y = cast(rng.normal(0, 3, s1), dtype)
    lines = ["Abs in0", "Add %0, in1", "Relu %1", "Mul in1, %2", "Maximum in0, in1"]
    program = program_text([_decl(dtype, s0), _decl(dtype, s1, view)], lines,
                           ["%3", "%4", "in1"])
    outs = run_fused(ops, program, [x, y], [x.dtype] * 3)
    yv = tf.reshape(y, view) if view is not None else y
    want = [yv * tf.nn.relu(tf.abs(x) + yv), tf.maximum(x, yv),
            tf.broadcast_to(yv, tf.broadcast_dynamic_shape(tf.shape(x), tf.shape(yv)))]
    for got, w in zip(outs, want):
        assert got.shape == w.shape, (got.shape, w.shape)
    # Add, Mul, Abs, Relu, Maximum are exact (16-bit sums and products are exact in fp32 before
    # their one rounding), so the results equal TensorFlow's bit for bit... except that Mul of
    # the rounded 16-bit sum matches only because TensorFlow rounds in between too: compare the
    # chain through the float64 reference where rounding differs.
    if dtype in ("f16", "bf16"):
        ref = as_f64(yv) * np.maximum(np.abs(as_f64(x)) + as_f64(yv), 0)
        assert_float_close(as_f64(outs[0]), as_f64(want[0]), ref, dtype, "chain",
                           scale=np.abs(as_f64(yv)) * (np.abs(as_f64(x)) + np.abs(as_f64(yv))))
    else:
        np.testing.assert_array_equal(outs[0].numpy(), want[0].numpy())
    np.testing.assert_array_equal(as_f64(outs[1]), as_f64(want[1]))
    np.testing.assert_array_equal(as_f64(outs[2]), as_f64(want[2]))


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_broadcast_large_bias_relu(ops, dtype):
    """Abs, a [C] bias, Relu over many tiles and both threads; and a column, and a scalar."""
    rng = np.random.default_rng(1)
    x = cast(rng.normal(size=(1531, 769)), dtype)
    b = cast(rng.normal(size=(769,)), dtype)
    c = cast(rng.normal(size=(1531, 1)), dtype)
    s = cast(rng.normal(size=()), dtype)
    program = program_text([_decl(dtype, [1531, 769]), _decl(dtype, [769]),
                            _decl(dtype, [1531, 1]), _decl(dtype, [])],
                           ["Abs in0", "Add %0, in1", "Relu %1", "Sub %2, in2", "Mul %3, in3"],
                           ["%2", "%4"])
    o1, o2 = run_fused(ops, program, [x, b, c, s], [x.dtype] * 2)
    w1 = tf.nn.relu(tf.abs(x) + b)
    np.testing.assert_array_equal(as_f64(o1), as_f64(w1))
    ref = (np.maximum(np.abs(as_f64(x)) + as_f64(b), 0) - as_f64(c)) * as_f64(s)
    assert_float_close(as_f64(o2), as_f64((w1 - c) * s), ref, dtype, "column, scalar",
                       scale=(np.abs(as_f64(x)) + np.abs(as_f64(b)) + np.abs(as_f64(c)))
                       * np.abs(as_f64(s)))


@pytest.mark.parametrize("rows,cols,dtype", [(61, 4096, "f32"), (230, 5000, "f32"),
                                            (40, 12288, "f32"), (300, 192, "f32"),
                                            (3000, 100, "f16"), (257, 768, "bf16"),
                                            (20, 5000, "f16")])
def test_bias_read_in_place_gives_the_bits_of_a_full_input(ops, rows, cols, dtype):
    """A bias whose values for a tile are one run somewhere is read in place by every op reading
    its load, up to the op that reuses the load's register (cc/cpu/strip_run.h, RunStrips): an f32
    row as long as a tile or longer from the tensor itself (ReadsOneRun; rows of 5000 make some
    tiles cross a row, which load the bias as before), a row of up to 4096 values of any float
    type from that row repeated once per call (RepeatedRows). The same program with the bias
    broadcast beforehand (read as a full input) gives the same bits, and both match TensorFlow
    and float64."""
    rng = np.random.default_rng(cols)
    x = cast(rng.normal(size=(rows, cols)), dtype)
    b = cast(rng.normal(size=(cols,)), dtype)
    lines = ["Abs in0", "Add %0, in1", "Mul %1, in1", "Sub in1, %2", "Exp %3", "Add %4, in1"]
    outs, reuse = [], []
    wide = tf.broadcast_to(b, x.shape)
    for bias, decl in ((b, f"{dtype}[{cols}]"), (wide, f"{dtype}[?,{cols}]")):
        program = program_text([f"{dtype}[?,{cols}]", decl], lines, ["%3", "%5"])
        outs.append(run_fused(ops, program, [x, bias], [x.dtype] * 2))
        # the bias's last reader writes into the bias's register, and the next op reads that
        program = program_text([f"{dtype}[?,{cols}]", decl], ["Add in0, in1", "Exp %0"], ["%1"])
        reuse.append(run_fused(ops, program, [x, bias], [x.dtype]))
    bits = np.uint32 if dtype == "f32" else np.uint16
    for in_place, full in zip(outs[0] + reuse[0], outs[1] + reuse[1]):
        np.testing.assert_array_equal(in_place.numpy().view(bits), full.numpy().view(bits))
    xv, bv = as_f64(x), as_f64(b)
    ref3 = bv - (np.abs(xv) + bv) * bv
    want3 = b - (tf.abs(x) + b) * b
    assert_float_close(as_f64(outs[0][0]), as_f64(want3), ref3, dtype, "bias read in place",
                       scale=np.abs(bv) + (np.abs(xv) + np.abs(bv)) * np.abs(bv))
    if dtype == "f32":  # (in f16 the kernel's exp reads %3 before it is rounded to f16)
        with np.errstate(over="ignore"):
            e3 = np.exp(as_f64(outs[0][0]))  # from the fused %3: exp's own error only
        assert_float_close(as_f64(outs[0][1]), as_f64(tf.exp(outs[0][0]) + b), e3 + bv, dtype,
                           "exp and the bias again", scale=e3 + np.abs(bv))


def test_view_with_unknown_dim_and_output_view(ops):
    x = tf.constant(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    bias = tf.constant(np.arange(3, dtype=np.float32))
    program = ("in0: f32[?,3,4]\nin1: f32[3] -> [?,1]\n%0 = Add in0, in1\n"
               "out0 = %0 -> [?,12]\nout1 = in1")
    o0, o1 = run_fused(ops, program, [x, bias], [tf.float32, tf.float32])
    want = x + tf.reshape(bias, [3, 1])
    np.testing.assert_array_equal(o0.numpy(), tf.reshape(want, [2, 12]).numpy())
    np.testing.assert_array_equal(o1.numpy(), tf.broadcast_to(tf.reshape(bias, [3, 1]),
                                                              [2, 3, 4]).numpy())


def test_broadcast_error_names_kernel_and_shapes(ops):
    program = "in0: f32[?,?]\nin1: f32[?]\n%0 = Add in0, in1\nout0 = %0"
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"AutofuseKernel '.*'.*do not broadcast: input 0 of shape "
                             r"\[4,5\] and input 1 of shape \[6\]"):
        run_fused(ops, program, [tf.zeros([4, 5]), tf.zeros([6])], [tf.float32], name="my_node")
    program = "in0: f32[?,?]\nin1: f32[?] -> [?,2]\n%0 = Add in0, in1\nout0 = %0"
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"AutofuseKernel '.*'.*input 1 of shape \[6\] read as \[3,2\]"):
        run_fused(ops, program, [tf.zeros([4, 2]), tf.zeros([6])], [tf.float32])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"input 1 has shape \[5\] \(5 elements\), which cannot be read as "
                             r"the view of in1: f32\[\?\] -> \[\?,2\]"):
        run_fused(ops, program, [tf.zeros([4, 2]), tf.zeros([5])], [tf.float32])
    program = "in0: f32[?,?]\n%0 = Abs in0\nout0 = %0 -> [7]"
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"AutofuseKernel '.*'.*program line 3: out0 -> \[7\] does not fit"):
        run_fused(ops, program, [tf.zeros([4, 2])], [tf.float32])


def test_shape_function_broadcasts(ops):
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 10])
        b = tf.compat.v1.placeholder(tf.float32, [10])
        c = tf.compat.v1.placeholder(tf.float32, [None])
        (y,) = run_fused(ops, "in0: f32[?,?]\nin1: f32[10]\n%0 = Add in0, in1\nout0 = %0",
                         [x, b], [tf.float32])
        assert y.shape.as_list() == [None, 10]
        (y,) = run_fused(ops, "in0: f32[?,10]\nin1: f32[?] -> [?,1,1]\n%0 = Add in0, in1\n"
                              "out0 = %0", [x, c], [tf.float32])
        assert y.shape.as_list() == [None, None, 10]
        s, m = run_fused(ops, "in0: f32[?,10]\n%0 = Sum in0 axes=[1]\n%1 = Sub in0, %0\n"
                              "out0 = %0 -> [?]\nout1 = %1", [x], [tf.float32] * 2)
        assert s.shape.as_list() == [None] and m.shape.as_list() == [None, 10]
        k = tf.compat.v1.placeholder(tf.float32, [6, 4])
        (y,) = run_fused(ops, "in0: f32[6,4]\n%0 = Mean in0 axes=[0]\nout0 = %0 -> [?]", [k],
                         [tf.float32])
        assert y.shape.as_list() == [4]
        (y,) = run_fused(ops, "in0: f32[6,4] -> [2,?]\n%0 = Abs in0\nout0 = %0", [k],
                         [tf.float32])
        assert y.shape.as_list() == [2, 12]
        with pytest.raises((ValueError, tf.errors.InvalidArgumentError),
                           match=r"(?s)do not broadcast.*bad_node"):
            run_fused(ops, "in0: f32[?,?]\nin1: f32[?]\n%0 = Add in0, in1\nout0 = %0",
                      [k, tf.compat.v1.placeholder(tf.float32, [5])], [tf.float32],
                      name="bad_node")


# ---------------------------------------------------------------------------------------------
# Reductions

REDUCTIONS = {
    "Sum": (tf.reduce_sum, np.sum),
    "Mean": (tf.reduce_mean, np.mean),
    "Max": (tf.reduce_max, np.max),
    "Min": (tf.reduce_min, np.min),
    "Prod": (tf.reduce_prod, np.prod),
}

REDUCE_CASES = [
    # (shape, axes)
    ([37, 1000], [1]),       # rows
    ([37, 1000], [0]),       # columns
    ([5, 6, 700], [1]),      # a middle axis
    ([3, 4, 5, 6], [1, 2]),  # two middle axes of a rank-4 tensor
    ([2, 9000], [1]),        # a row longer than a tile
    ([9000, 3], [0]),
    ([7], [0]),              # everything
    ([1], [0]),
    ([4, 0], [1]),           # empty reductions
    ([0, 4], [0]),
    ([0, 4], [1]),           # nothing to reduce into
    ([3, 5000, 2], [1]),
    ([300, 7], [1]),         # short rows: several rows per tile
    ([2000, 33], [1]),
    ([5, 40, 256, 1], [2]),
    ([9, 257], [1]),
    # Split runs (interpreter.cc): fewer than 8 work items, each of more than 2 * 2**24 cost
    # units (a few million elements for these programs), are cut along the reduced axes into
    # blocks whose partial results are folded in block order.
    ([3000001], [0]),        # everything, in lanes: one item
    ([1000001, 3], [0]),     # column groups
    ([3000, 2001], [0]),     # inner chunks of a tile
    ([2, 2000, 3, 500], [1, 2]),  # two reduced axes, two outer indices
]


def _reduce_input(name, dtype, shape, rng):
    if dtype == "i32":
        if name == "Prod":
            return tf.constant(rng.integers(-3, 4, shape).astype(np.int32))
        return tf.constant(rng.integers(INT32_MIN, INT32_MAX, shape, endpoint=True)
                           .astype(np.int32))
    if name == "Prod":  # |log| of a product of n values: about 0.01 sqrt(n), or 1e-4 sqrt(n)
        sigma = 0.01 if np.prod(shape) < 65536 else 1e-4
        v = np.exp(rng.normal(0, sigma, shape)) * np.where(rng.random(shape) < 0.5, -1, 1)
    elif np.prod(shape) < 65536:
        v = rng.normal(1.0, 3.0, shape)
    else:  # centred, so that a 16-bit sum of 3000001 values does not overflow
        v = rng.normal(0.0, 3.0, shape)
    return cast(v, dtype)


@pytest.mark.parametrize("dtype", FLOATS + ("i32",))
@pytest.mark.parametrize("case", range(len(REDUCE_CASES)))
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reductions(ops, name, case, dtype):
    shape, axes = REDUCE_CASES[case]
    x = _reduce_input(name, dtype, shape, rng_for(name, case, dtype))
    ax = ",".join(map(str, axes))
    squeezed = [d for i, d in enumerate(shape) if i not in axes]
    program = (f"in0: {dtype}[{','.join('?' * len(shape))}]\n%0 = {name} in0 axes=[{ax}]\n"
               f"out0 = %0\nout1 = %0 -> [{','.join(map(str, squeezed))}]")
    keep, flat = run_fused(ops, program, [x], [x.dtype] * 2)
    tf_fn, np_fn = REDUCTIONS[name]
    want = tf_fn(x, axis=axes, keepdims=True)
    assert keep.shape == want.shape and flat.shape == tuple(squeezed)
    np.testing.assert_array_equal(keep.numpy().ravel(), flat.numpy().ravel())
    if dtype == "i32" or x.shape.num_elements() == 0:
        np.testing.assert_array_equal(keep.numpy(), want.numpy())
        return
    v = as_f64(x)
    with np.errstate(all="ignore"):  # f64: np.sum is no exact reference, long double is
        ref = np_fn(v.astype(np.longdouble) if dtype == "f64" else v, axis=tuple(axes),
                    keepdims=True).astype(np.float64)
    if name in ("Max", "Min"):
        np.testing.assert_array_equal(as_f64(keep), as_f64(want))
        return
    scale = np.sum(np.abs(v), axis=tuple(axes), keepdims=True)
    if name == "Mean":
        scale = scale / max(1, int(np.prod([shape[a] for a in axes])))
    if name == "Prod":
        scale = None
    # TensorFlow's 16-bit Sum and Mean of 3000001 values overflow (inf, NaN): there the fused
    # result is held to the reference alone, within half an ulp of the dtype (and one of f32)
    overflowed = not np.all(np.isfinite(as_f64(want))[np.isfinite(ref)])
    assert_float_close(as_f64(keep), as_f64(want), ref, dtype, f"{name} {dtype}{shape}",
                       scale=scale, bound_ulps=1 if overflowed else 0)


@pytest.mark.parametrize("cols", [40, 2000003])  # 2000003: rows reduced in blocks (split runs)
@pytest.mark.parametrize("dtype", ["f32", "f16", "f64"])
def test_max_min_propagate_nan(ops, dtype, cols):
    v = np.random.default_rng(0).normal(size=(6, cols))
    v[1, 3] = np.nan
    v[4, cols - 1] = np.nan
    v[:, 5] = np.inf
    x = cast(v, dtype)
    for axis in (0, 1):
        program = f"in0: {dtype}[6,{cols}]\n%0 = Max in0 axes=[{axis}]\n%1 = Min in0 axes=[{axis}]\n" \
                  "out0 = %0\nout1 = %1"
        mx, mn = run_fused(ops, program, [x], [x.dtype] * 2)
        np.testing.assert_array_equal(as_f64(mx), np.max(as_f64(x), axis=axis, keepdims=True))
        np.testing.assert_array_equal(as_f64(mn), np.min(as_f64(x), axis=axis, keepdims=True))


# The shapes of a row (lanes), row-group, column and column-group reduction; and for Sum and
# Mean a row and columns long enough to be reduced in blocks (split runs: a product of 3000000
# values of 0.5..1.5 would underflow).
@pytest.mark.parametrize("op,shape,axis", [
    (op, shape, axis) for op in ("Sum", "Mean", "Prod")
    for shape, axis in [((3, 40), 1), ((40, 7), 1), ((40, 3000), 0), ((40, 7), 0)]
    + ([((3, 3000000), 1), ((3000000, 3), 0)] if op != "Prod" else [])])
def test_f64_sum_and_prod_of_infinities_are_infinite(ops, op, shape, axis):
    """Regression (found by tests/test_random_graphs.py): the f64 compensation term became
    inf - inf = NaN, so an f64 Sum, Mean or Prod holding +-inf, or overflowing, gave NaN where
    TensorFlow (and the exact value) is +-inf."""
    v = np.random.default_rng(3).uniform(0.5, 1.5, shape)
    lines = np.moveaxis(v, axis, -1)  # a view: one reduced line per row of it
    lines[0, 1] = np.inf
    lines[1, 2] = -np.inf
    lines[2, :3] = 1e308  # overflows to +inf, in any order
    x = tf.constant(v)
    program = f"in0: f64[{shape[0]},{shape[1]}]\n%0 = {op} in0 axes=[{axis}]\nout0 = %0"
    (got,) = run_fused(ops, program, [x], [tf.float64])
    want = getattr(tf.raw_ops, op)(input=x, axis=[axis], keep_dims=True).numpy().ravel()
    got = got.numpy().ravel()
    np.testing.assert_array_equal(got[:3], [np.inf, -np.inf, np.inf])
    np.testing.assert_array_equal(want[:3], [np.inf, -np.inf, np.inf])
    np.testing.assert_allclose(got[3:], want[3:], rtol=1e-14)  # finite lines: last bits differ


def _softmax_program(dtype, rank_decl="?,?"):
    return (f"in0: {dtype}[{rank_decl}]\n%0 = Max in0 axes=[1]\n%1 = Sub in0, %0\n%2 = Exp %1\n"
            "%3 = Sum %2 axes=[1]\n%4 = Div %2, %3\nout0 = %4")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(1, 1), (3, 10), (64, 1000), (5, 9001), (1000, 7), (4000, 10),
                                   (333, 256), (100, 100)])
def test_softmax(ops, dtype, shape):
    x = cast(np.random.default_rng(shape[1]).normal(0, 4, shape), dtype)
    (fused,) = run_fused(ops, _softmax_program(dtype), [x], [x.dtype])
    unfused = tf.nn.softmax(x, axis=-1)
    v = as_f64(x)
    e = np.exp(v - v.max(axis=1, keepdims=True))
    ref = e / e.sum(axis=1, keepdims=True)
    # exp(x - max) amplifies the rounding of x - max (in the dtype, fused or not) |x - max| times:
    # ulps are measured at that scale.
    scale = ref * np.maximum(1.0, np.abs(v - v.max(axis=1, keepdims=True)))
    assert_float_close(as_f64(fused), as_f64(unfused), ref, dtype, f"softmax {dtype}{shape}",
                       scale=scale)
    # the unfused op sequence a rewriter would replace
    seq = tf.exp(x - tf.reduce_max(x, 1, keepdims=True))
    seq = seq / tf.reduce_sum(seq, 1, keepdims=True)
    assert_float_close(as_f64(fused), as_f64(seq), ref, dtype, f"softmax ops {dtype}{shape}",
                       scale=scale)


@pytest.mark.parametrize("dtype", ["f32", "f16", "f64"])
@pytest.mark.parametrize("shape", [(5000, 7), (300, 64), (40, 300), (3, 2000), (7000, 3),
                                   (3000, 1)])
def test_softmax_over_axis_0(ops, dtype, shape):
    """Reduced values read back over a leading axis (short inner blocks: several per tile)."""
    x = cast(np.random.default_rng(shape[0]).normal(0, 3, shape), dtype)
    program = (f"in0: {dtype}[?,?]\n%0 = Max in0 axes=[0]\n%1 = Sub in0, %0\n%2 = Exp %1\n"
               "%3 = Sum %2 axes=[0]\n%4 = Div %2, %3\nout0 = %4\nout1 = %3 -> [?]")
    fused, total = run_fused(ops, program, [x], [x.dtype] * 2)
    v = as_f64(x)
    e = np.exp(v - v.max(axis=0, keepdims=True))
    ref = e / e.sum(axis=0, keepdims=True)
    scale = ref * np.maximum(1.0, np.abs(v - v.max(axis=0, keepdims=True)))
    assert_float_close(as_f64(fused), as_f64(tf.nn.softmax(x, axis=0)), ref, dtype,
                       f"softmax axis 0 {dtype}{shape}", scale=scale)
    assert total.shape == (shape[1],)


def _layer_norm_program(dtype, c):
    # x declared [?,1] is read as a reduced value (1 along the reduced axis), and so is x - mean,
    # whose Mean the grammar refuses (a reduction reads no reduced value, PROGRAM.md): a single
    # channel is declared unknown
    x = f"{dtype}[?,{c if c > 1 else '?'}]"
    return (f"in0: {x}\nin1: {dtype}[{c}]\nin2: {dtype}[{c}]\n"
            "%0 = Mean in0 axes=[1]\n%1 = Sub in0, %0\n%2 = Square %1\n%3 = Mean %2 axes=[1]\n"
            "%4 = Add %3, 1e-05\n%5 = Rsqrt %4\n%6 = Mul %1, %5\n%7 = Mul %6, in1\n"
            "%8 = Add %7, in2\nout0 = %8\nout1 = %0\nout2 = %3 -> [?]")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(1, 1), (7, 768), (300, 1000), (3, 5000), (1001, 64), (50, 3)])
def test_layer_norm(ops, dtype, shape):
    rng = np.random.default_rng(shape[0])
    x = cast(rng.normal(2.0, 3.0, shape), dtype)
    gamma = cast(rng.normal(1.0, 0.5, shape[1]), dtype)
    beta = cast(rng.normal(0.0, 0.5, shape[1]), dtype)
    y, mean, var = run_fused(ops, _layer_norm_program(dtype, shape[1]), [x, gamma, beta],
                             [x.dtype] * 3)
    m = tf.reduce_mean(x, 1, keepdims=True)
    d = x - m
    vv = tf.reduce_mean(tf.square(d), 1, keepdims=True)
    eps = tf.constant(1e-05, x.dtype)
    unfused = d * tf.math.rsqrt(vv + eps) * gamma + beta
    xv, g, b = as_f64(x), as_f64(gamma), as_f64(beta)
    mr = xv.mean(axis=1, keepdims=True)
    vr = ((xv - mr) ** 2).mean(axis=1, keepdims=True)
    epsr = eps.numpy().astype(np.float64)
    ref = (xv - mr) / np.sqrt(vr + epsr) * g + b
    assert_float_close(as_f64(mean), as_f64(m), mr, dtype, "mean",
                       scale=np.abs(xv).mean(axis=1, keepdims=True))
    assert_float_close(as_f64(var).reshape(-1, 1), as_f64(vv), vr, dtype, "variance")
    scale = (np.abs(xv) + np.abs(mr)) / np.sqrt(vr + epsr) * np.abs(g) + np.abs(b)
    assert_float_close(as_f64(y), as_f64(unfused), ref, dtype, f"layer norm {dtype}{shape}",
                       scale=scale)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_reduction_with_broadcast_inputs_and_reduced_inputs(ops, dtype):
    """A [N,1] input is a reduced value: mixed into the mean, and output in keep_dims form."""
    rng = np.random.default_rng(4)
    x = cast(rng.normal(size=(50, 300)), dtype)
    col = cast(rng.normal(size=(50, 1)), dtype)
    row = cast(rng.normal(size=(300,)), dtype)
    program = (f"in0: {dtype}[50,300]\nin1: {dtype}[50,1]\nin2: {dtype}[300]\n"
               "%0 = Mul in0, in2\n%1 = Sum %0 axes=[1]\n%2 = Mul %1, in1\n%3 = Add %2, 1.0\n"
               "%4 = Sub in0, %3\nout0 = %3\nout1 = %4\nout2 = in1")
    o0, o1, o2 = run_fused(ops, program, [x, col, row], [x.dtype] * 3)
    s = tf.reduce_sum(x * row, 1, keepdims=True)
    w0 = s * col + tf.constant(1.0, x.dtype)
    r0 = np.sum(as_f64(x) * as_f64(row), 1, keepdims=True) * as_f64(col) + 1.0
    sc = np.sum(np.abs(as_f64(x) * as_f64(row)), 1, keepdims=True) * np.abs(as_f64(col)) + 1
    assert o0.shape == (50, 1) and o1.shape == (50, 300) and o2.shape == (50, 1)
    assert_float_close(as_f64(o0), as_f64(w0), r0, dtype, "reduced", scale=sc)
    np.testing.assert_array_equal(o2.numpy(), col.numpy())
    assert_float_close(as_f64(o1), as_f64(x - w0), as_f64(x) - r0, dtype, "full",
                       scale=np.abs(as_f64(x)) + sc)


def test_sum_is_at_least_as_accurate_as_tensorflow(ops):
    """f32 sums accumulate in f64: a long row of values with cancellation."""
    rng = np.random.default_rng(9)
    v = np.concatenate([rng.normal(0, 1e4, (4, 50000)), rng.normal(0, 1, (4, 50000))], axis=1)
    x = tf.constant(v.astype(np.float32))
    (s,) = run_fused(ops, "in0: f32[?,?]\n%0 = Sum in0 axes=[1]\nout0 = %0 -> [?]", [x],
                     [tf.float32])
    ref = as_f64(x).sum(axis=1)
    assert np.all(np.abs(as_f64(s) - ref) <= np.abs(as_f64(tf.reduce_sum(x, 1)) - ref)
                  + ulp(ref, "f32"))


@pytest.mark.parametrize("dtype,shape,axis", [("f32", (3000, 700), 1), ("f16", (300, 7000), 1),
                                              ("f32", (700, 3000), 0), ("f32", (100003, 10), 1),
                                              ("f64", (100003, 3), 0), ("f32", (3, 600001), 1),
                                              ("f16", (20001, 64), 0)])
def test_reductions_bit_identical_across_runs_and_threads(ops, dtype, shape, axis, tmp_path):
    values = cast(np.random.default_rng(5).normal(0, 3, shape), dtype).numpy()
    program = (f"in0: {dtype}[?,?]\n%0 = Max in0 axes=[{axis}]\n%1 = Sub in0, %0\n%2 = Exp %1\n"
               f"%3 = Sum %2 axes=[{axis}]\n%4 = Div %2, %3\n%5 = Mean in0 axes=[{axis}]\n"
               "out0 = %4\nout1 = %3\nout2 = %5")
    assert_bit_identical_across_threads(ops, program, values, 3, tmp_path)


@pytest.mark.parametrize("late", [False, True], ids=["no_final_pass", "final_pass"])
@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("case", range(len(REDUCE_CASES)))
def test_full_outputs_that_need_no_reduction(ops, case, dtype, late):
    """A bias gradient's shape: the gradient and its Sum in one kernel. The full outputs that
    depend on no reduction (a value, an input) are stored while the Sum accumulates; those that
    read a reduced value (late) after it. Inputs computed in the step, so that TensorFlow may
    give their buffers to the outputs: one that a later pass still reads must not be given."""
    shape, axes = REDUCE_CASES[case]
    rng = rng_for("early", case, dtype)
    loc = 1.0 if np.prod(shape) < 65536 else 0.0  # large: a 16-bit Sum that does not overflow
    x = cast(rng.normal(loc, 3.0, shape), dtype)
    y = cast(rng.normal(loc, 3.0, shape), dtype)
    squeezed = [d for i, d in enumerate(shape) if i not in axes]
    dims = ",".join("?" * len(shape))
    program = (f"in0: {dtype}[{dims}]\nin1: {dtype}[{dims}]\n%0 = Mul in0, in1\n"
               f"%1 = Sum %0 axes=[{','.join(map(str, axes))}]\n%2 = Sub %0, %1\n"
               f"%3 = Sum %2 axes=[{','.join(map(str, axes))}]\n"
               f"out0 = %0\nout1 = %1 -> [{','.join(map(str, squeezed))}]\nout2 = in1\n")
    if late:
        program += "out3 = %2\nout4 = %3\n"

    @tf.function
    def fused_fn(a, b, one):
        return run_fused(ops, program, [a * one, b * one], [x.dtype] * (5 if late else 3))

    got = fused_fn(x, y, tf.constant(1.0, x.dtype))
    f32 = lambda t: np.asarray(t).astype(np.float32)  # noqa: E731 - f16 products are exact in f32
    product = (f32(x) * f32(y)).astype(x.dtype.as_numpy_dtype)
    np.testing.assert_array_equal(got[0].numpy(), product)
    np.testing.assert_array_equal(got[2].numpy(), y.numpy())
    # the Sum reads the product as the program holds it: rounded to f32, or for f16 in fp32
    # (16-bit values stay fp32 until the outputs), where a product of two halves is exact
    v = as_f64(got[0]) if dtype == "f32" else as_f64(x) * as_f64(y)
    ref = np.sum(v, axis=tuple(axes))
    assert_float_close(as_f64(got[1]), ref.astype(np.float32), ref, dtype, f"Sum {shape}",
                       scale=np.sum(np.abs(v), axis=tuple(axes)))
    if late:
        keep = got[1].numpy().reshape([1 if i in axes else d for i, d in enumerate(shape)])
        want = (f32(got[0]) - keep.astype(np.float32)).astype(x.dtype.as_numpy_dtype)
        if dtype == "f32":
            np.testing.assert_array_equal(got[3].numpy(), want)
        else:  # the kernel subtracts the fp32 Sum, not out1 (its f16 rounding)
            np.testing.assert_allclose(f32(got[3]), f32(want), rtol=2e-3,
                                       atol=2e-3 * float(np.max(np.abs(keep), initial=0)))
        assert got[4].shape == tuple([1 if i in axes else d for i, d in enumerate(shape)])


@pytest.mark.parametrize("n", [1023, 200_003])
def test_forwarding_with_broadcast_inputs(ops, n):
    """A same-shape input may give its buffer to an output; a broadcast one never does."""
    program = "in0: f32[?,?]\nin1: f32[?]\n%0 = Add in0, in1\n%1 = Mul %0, in0\nout0 = %1"

    @tf.function
    def fused_fn(x, b, one):
        return run_fused(ops, program, [x * one, b * one], [tf.float32])

    rng = np.random.default_rng(n)
    x = tf.constant(rng.normal(size=(n // 1000 + 1, 1000)).astype(np.float32))
    b = tf.constant(rng.normal(size=(1000,)).astype(np.float32))
    (got,) = fused_fn(x, b, tf.constant(1.0))
    np.testing.assert_array_equal(got.numpy(), ((x + b) * x).numpy())


# ---------------------------------------------------------------------------------------------
# Benchmark: python tests/test_kernel_broadcast_reduce.py --bench

def benchmark():
    from test_kernel import _median_ms

    os.environ.pop("AUTOFUSE_FLAGS", None)  # TensorFlow's own ops must run unfused
    ops = kernel_library.load()
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(4096, 4096)).astype(np.float32))
    bias = tf.constant(rng.normal(size=(4096,)).astype(np.float32))
    h = tf.constant(rng.normal(size=(16384, 768)).astype(np.float32))
    gamma = tf.constant(rng.normal(size=(768,)).astype(np.float32))
    beta = tf.constant(rng.normal(size=(768,)).astype(np.float32))

    def layer_norm(a, g, b):
        m = tf.reduce_mean(a, 1, keepdims=True)
        d = a - m
        v = tf.reduce_mean(tf.square(d), 1, keepdims=True)
        return d * tf.math.rsqrt(v + 1e-05) * g + b

    def softmax(a):
        e = tf.exp(a - tf.reduce_max(a, 1, keepdims=True))
        return e / tf.reduce_sum(e, 1, keepdims=True)

    cases = [
        ("abs+bias[4096]+relu [4096,4096]",
         "in0: f32[4096,4096]\nin1: f32[4096]\n%0 = Abs in0\n%1 = Add %0, in1\n%2 = Relu %1\n"
         "out0 = %2", [x, bias], lambda a, b: tf.nn.relu(tf.abs(a) + b)),
        ("abs+sum(axis 1) [4096,4096]",
         "in0: f32[4096,4096]\n%0 = Abs in0\n%1 = Sum %0 axes=[1]\nout0 = %1 -> [4096]", [x],
         lambda a: tf.reduce_sum(tf.abs(a), 1)),
        ("softmax(last axis) [4096,4096]", _softmax_program("f32", "4096,4096"), [x], softmax),
        ("layer norm [16384,768]", _layer_norm_program("f32", 768).rsplit("\nout1", 1)[0],
         [h, gamma, beta], layer_norm),
    ]
    for name, program, inputs, tf_fn in cases:
        fused = tf.function(lambda *a, p=program: run_fused(ops, p, a, [tf.float32])[0])
        unfused = tf.function(tf_fn)
        got, want = fused(*inputs), unfused(*inputs)
        err = float(tf.reduce_max(tf.abs(got - want)))
        rows = {"fused": lambda: fused(*inputs), "TF ops (tf.function)": lambda: unfused(*inputs),
                "TF ops (eager)": lambda: tf_fn(*inputs)}
        print(f"{name}: " + ", ".join(f"{k} {_median_ms(f, reps=10):.1f} ms"
                                      for k, f in rows.items()) + f" (max |diff| {err:.2g})",
              flush=True)


def benchmark_hoisting():
    """Keras' inference BatchNormalization + Relu as one kernel, its [C] invariants hoisted (the
    rewriter's hoist pass marks them) or not (the program as lowered); the two alternate over
    three rounds so that both see the same machine."""
    from test_kernel import _median_ms

    ops = kernel_library.load()
    rng = np.random.default_rng(0)
    for shape in [(8, 56, 56, 256), (1, 112, 112, 64)]:
        c = shape[-1]
        args = [tf.constant(rng.normal(size=shape).astype(np.float32))] + [
            tf.constant(rng.uniform(0.5, 2.0, size=(c,)).astype(np.float32)) for _ in range(4)]

        small = f"f32[{c}] -> [1,1,1,{c}]"
        program = (f"in0: {_decl('f32', shape)}\nin1: {small}\nin2: {small}\nin3: {small}\n"
                   f"in4: {small}\n%0 = Add in1, 0.001\n%1 = Rsqrt %0\n%2 = Mul %1, in2\n"
                   "%3 = Mul in0, %2\n%4 = Mul in3, %2\n%5 = Sub in4, %4\n%6 = Add %3, %5\n"
                   "%7 = Relu %6\nout0 = %7\n")
        marked = passes.hoist(ir.parse(program)).print()
        hoisted = tf.function(lambda *a, p=marked: run_fused(ops, p, a, [tf.float32])[0])
        plain = tf.function(lambda *a, p=program: run_fused(ops, p, a, [tf.float32])[0])
        np.testing.assert_array_equal(hoisted(*args).numpy(), plain(*args).numpy())
        for _ in range(3):
            print(f"batchnorm+relu {list(shape)}: hoisted "
                  f"{_median_ms(lambda: hoisted(*args), reps=30):.2f} ms, not hoisted "
                  f"{_median_ms(lambda: plain(*args), reps=30):.2f} ms", flush=True)


if __name__ == "__main__":
    if "--bench" in sys.argv:
        benchmark_hoisting()
        benchmark()
    else:
        sys.exit(pytest.main([__file__, "-q"] + sys.argv[1:]))


# ---------------------------------------------------------------------------------------------
# Hoisted invariants (rewriter/passes.py marks them, cc/hoist.h splits the program there):
# instructions that read only inputs of one small shape run once per run at that shape. The
# results must be bit-identical to the same program run on inputs broadcast to the full shape
# beforehand (where nothing can be hoisted).

HOIST_CASES = {
    # Keras' inference BatchNormalization + Relu: mean, var, gamma, beta [C] as [1,1,1,C]
    "batchnorm": (["x", "c", "c", "c", "c"],
                  ["Add in1, 0.001", "Rsqrt %0", "Mul in2, %1", "Mul in3, %2", "Mul %2, in0",
                   "Sub in4, %3", "Add %4, %5", "Relu %6"], ["%7", "%2"]),
    # a small input read both by a hoisted instruction and by the main program (a Mul alone:
    # worth a prologue in f64 only, whose vectors hold half the lanes)
    "shared_input": (["x", "c"], ["Mul in1, 2.5", "Add in0, in1", "Mul %1, %0", "Exp %0"],
                     ["%2", "%3"]),
    # a hoisted comparison (bool) selecting between a large and a small value
    "select": (["x", "c"], ["Greater in1, 0.0", "Neg in1", "Select %0, in0, %1", "Abs %2"],
               ["%3"]),
    # two small shapes, a row and a column: one of them is hoisted
    "row_and_column": (["x", "c", "col"], ["Exp in1", "Square in2", "Add in0, %0", "Mul %2, %1",
                                           "Sqrt %1"], ["%3"]),
}


def _hoist_inputs(kinds, dtype, shape, rng):
    n, h, w, c = shape
    shapes = {"x": shape, "c": (c,), "col": (n, h, w, 1)}
    views = {"x": None, "c": (1, 1, 1, c), "col": None}
    values = []
    for kind in kinds:
        if dtype == "i32":
            values.append(tf.constant(rng.integers(-9, 9, shapes[kind]).astype(np.int32)))
        else:
            values.append(cast(rng.uniform(0.1, 2.0, shapes[kind]), dtype))
    return values, [views[k] for k in kinds]


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (4, 32, 32, 64)])
@pytest.mark.parametrize("dtype", ["f32", "f64", "f16", "i32"])
@pytest.mark.parametrize("case", sorted(HOIST_CASES))
def test_hoisted_invariants_are_bit_identical(ops, case, dtype, shape):
    kinds, lines, outputs = HOIST_CASES[case]
    if dtype == "i32":
        if case != "shared_input":
            pytest.skip("float ops")
        lines = ["Mul in1, 3", "Add in0, in1", "Mul %1, %0", "Square %0"]
    rng = rng_for("hoist", case, dtype, shape)
    values, views = _hoist_inputs(kinds, dtype, shape, rng)
    small_decls = [_decl(dtype, v.shape.as_list(), view) for v, view in zip(values, views)]
    small_decls[0] = _decl(dtype, ["?"] + list(shape[1:]))  # an unknown batch, as in a model
    wide = [tf.broadcast_to(tf.reshape(v, view) if view else v, shape) for v, view in
            zip(values, views)]
    wide_decls = [_decl(dtype, shape)] * len(values)
    touts = [values[0].dtype] * len(outputs)
    program = passes.hoist(ir.parse(program_text(small_decls, lines, outputs))).print()
    hoisted = dtype != "f16" and (case != "shared_input" or dtype == "f64")  # 16-bit: never
    assert (" invariant" in program) == hoisted, program
    got = run_fused(ops, program, values, touts)
    want = run_fused(ops, program_text(wide_decls, lines, outputs), wide, touts)
    for g, w in zip(got, want):
        assert tuple(g.shape) == tuple(w.shape) == tuple(shape)
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    # and the numbers are right: one case against numpy in float64
    if case == "batchnorm" and dtype in ("f32", "f64"):
        x, var, gamma, mean, beta = (as_f64(v) for v in values)
        inv = gamma / np.sqrt(var + 0.001)
        ref = np.maximum(x * inv + (beta - mean * inv), 0)
        np.testing.assert_allclose(as_f64(got[0]), ref, rtol=1e-5 if dtype == "f32" else 1e-12,
                                   atol=1e-5 if dtype == "f32" else 1e-12)


# ---------------------------------------------------------------------------------------------
# A normalisation's scale, rsqrt(var + eps) of each row (rewriter/passes.py, widen: computed in
# f64 from the fp32 variance): the exact value of the fp32 operands rounded once, so its error
# has no sign of its own even where every row's variance is in one binade.

def test_rsqrt_of_a_reduced_sum_is_rounded_once(ops):
    rows, cols, eps = 4096, 64, np.float32(1e-6)
    rng = rng_for("rsqrt of a reduced sum")
    # each row's variance in [1, 2): adding eps (8.39 ulps of it) rounds down by 0.39 ulp in
    # fp32 in every row
    x = rng.normal(0, 1, (rows, cols))
    x = (x - x.mean(1, keepdims=True)) / x.std(1, keepdims=True)
    x = (x * rng.uniform(1.0, 1.41, (rows, 1))).astype(np.float32)
    lines = ["Mean in0 axes=[1]", "SquaredDifference in0, %0", "Mean %1 axes=[1]",
             f"Add %2, {float(eps)!r}", "Rsqrt %3"]
    program = passes.optimize(ir.parse(program_text([_decl("f32", (rows, cols))], lines,
                                                    ["%2", "%4"]))).print()
    variance, scale = run_fused(ops, program, [tf.constant(x)], [tf.float32] * 2)
    variance = variance.numpy().astype(np.float64).ravel()
    scale = scale.numpy().ravel()
    assert 1 <= variance.min() and variance.max() < 2
    exact = 1 / np.sqrt(variance + np.float64(eps))
    np.testing.assert_array_equal(scale, exact.astype(np.float32))
    # why: rounding the sum first (TensorFlow's Add, then Rsqrt) errs one way in every row
    twice = 1 / np.sqrt((variance.astype(np.float32) + eps).astype(np.float64))
    ulps = ulp(exact, "f32")
    assert np.mean((twice - exact) / ulps) > 0.1
    assert abs(np.mean((scale - exact) / ulps)) < 0.03
