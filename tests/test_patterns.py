"""Model patterns through real v1 Sessions with the named optimizer "AutofuseOptimizer".

Each pattern is built with the TF1 graph API and run twice, fused and unfused (the session
configuration of test_session.py: only the named custom optimizer, flags such as
`autofuse_enable_pass` through its parameter_map). The tests assert the fused kernels the
executed graph holds (RunMetadata partition graphs) and the numbers: fused close to unfused,
and the fused error against a float64 numpy reference no larger than the unfused error plus a
few ulps. Needs a kernel that runs the issue-3 IR (views, broadcast, reductions, new ops).
"""

import math

import numpy as np
import pytest
import tensorflow as tf

import tf_autofuse
from test_session import fused_kernels
from test_session import run as session_run

tf1 = tf.compat.v1
REDUCE = {"autofuse_enable_pass": "reduce"}


def run(build, inputs, fuse=True, **params):
    """test_session.run with feeds given as {placeholder name: array}: build() returns
    (fetches, {placeholder name: tensor}); returns (results, executed op type by node name)."""
    return session_run(build, lambda placeholders: {placeholders[k]: v for k, v in inputs.items()},
                       fuse, **params)


def ulp(dtype, magnitude):
    return float(np.finfo(dtype).eps) * max(float(magnitude), float(np.finfo(dtype).tiny))


def check_numbers(fused, unfused, reference, dtype, rtol, ulps=4):
    """fused ~ unfused; max |fused - ref| <= max |unfused - ref| + a few ulps of the result."""
    fused64 = np.asarray(fused, np.float64)
    unfused64 = np.asarray(unfused, np.float64)
    reference = np.asarray(reference, np.float64)
    assert fused64.shape == reference.shape == unfused64.shape
    scale = float(np.max(np.abs(reference))) if reference.size else 0.0
    np.testing.assert_allclose(fused64, unfused64, rtol=rtol, atol=rtol * scale)
    fused_err = float(np.max(np.abs(fused64 - reference)))
    unfused_err = float(np.max(np.abs(unfused64 - reference)))
    assert fused_err <= unfused_err + ulps * ulp(dtype, scale), (fused_err, unfused_err)


def compare(build, inputs, reference, dtype, rtol, expected_kernels, gone=(), **params):
    """Run fused and unfused; check the kernels, the ops they replaced, and the numbers."""
    fused, executed = run(build, inputs, **params)
    unfused, executed_off = run(build, inputs, fuse=False)
    assert fused_kernels(executed) == sorted(expected_kernels)
    assert not fused_kernels(executed_off)
    assert not set(gone) & set(executed.values()), set(gone) & set(executed.values())
    if not isinstance(fused, (list, tuple)):
        fused, unfused, reference = [fused], [unfused], [reference]
    for f, u, r in zip(fused, unfused, reference):
        check_numbers(f, u, r, dtype, rtol)
    return executed


def uniform(seed, shape, dtype=np.float32, low=-3.0, high=3.0):
    return np.random.default_rng(seed).uniform(low, high, shape).astype(dtype)


# --- float64 references ------------------------------------------------------------------------


def f64(x):
    return np.asarray(x, np.float64)


def sigmoid64(x):
    return 1.0 / (1.0 + np.exp(-x))


_erf = np.vectorize(math.erf, otypes=[np.float64])
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


# --- GELU ------------------------------------------------------------------------------------------


def gelu_tanh(dtype, shape=(32, 64)):
    def build():
        x = tf1.placeholder(dtype, shape, name="x")
        c = lambda v: tf.constant(v, dtype)  # noqa: E731
        y = x * c(0.5) * (c(1.0) + tf.tanh(c(0.7978845608) * (x + c(0.044715) * tf.pow(x, c(3.0)))))
        return tf.identity(y, name="y"), {"x": x}
    return build


def gelu_tanh64(x, dtype):
    x = f64(x)
    k = f64(np.asarray(0.7978845608, dtype))
    a = f64(np.asarray(0.044715, dtype))
    return x * 0.5 * (1.0 + np.tanh(k * (x + a * x ** 3)))


# Grappler's arithmetic optimizer turns pow(x, 3) into x * square(x) before the pass runs.
GELU_TANH = "autofuse_pointwise_0_Mul_Square_Mul_Mul_AddV2_Mul_Tanh_AddV2_Mul"


@pytest.mark.parametrize("np_dtype,tf_dtype,rtol", [(np.float32, tf.float32, 1e-5),
                                                    (np.float16, tf.float16, 4e-3)])
def test_gelu_tanh_form(np_dtype, tf_dtype, rtol):
    x = uniform(0, (32, 64), np_dtype)
    compare(gelu_tanh(tf_dtype), {"x": x}, gelu_tanh64(x, np_dtype), np_dtype, rtol,
            [GELU_TANH], gone={"Tanh", "Pow"})


def test_gelu_erf_form():
    def build():
        x = tf1.placeholder(tf.float32, [32, 64], name="x")
        y = 0.5 * x * (1.0 + tf.math.erf(x / 1.4142135623730951))
        return tf.identity(y, name="y"), {"x": x}
    x = uniform(1, (32, 64))
    reference = 0.5 * f64(x) * (1.0 + _erf(f64(x) / f64(np.float32(1.4142135623730951))))
    compare(build, {"x": x}, reference, np.float32, 1e-5,
            ["autofuse_pointwise_0_Mul_Mul_Erf_AddV2_Mul"], gone={"Erf"})  # x/c -> x*(1/c)


@pytest.mark.parametrize("np_dtype,tf_dtype,rtol", [(np.float32, tf.float32, 1e-5),
                                                    (np.float16, tf.float16, 4e-3)])
def test_gelu_exact_erfc_form(np_dtype, tf_dtype, rtol):
    # tf.nn.gelu(approximate=False), what Keras' "gelu" runs: 0.5 x erfc(-x / sqrt 2)
    def build():
        x = tf1.placeholder(tf_dtype, [32, 64], name="x")
        return tf.identity(tf.nn.gelu(x, approximate=False), name="y"), {"x": x}
    x = uniform(1, (32, 64), np_dtype)
    c = f64(np.asarray(0.7071067811865476, np_dtype))
    reference = 0.5 * f64(x) * _erfc(-f64(x) * c)
    compare(build, {"x": x}, reference, np_dtype, rtol,
            ["autofuse_pointwise_0_Mul_Neg_Mul_Erfc_Mul"], gone={"Erfc", "Neg"})


# --- swish / SiLU with a bias ----------------------------------------------------------------------


def test_swish_with_a_bias():
    bias = np.linspace(-1, 1, 64).astype(np.float32)

    def build():
        x = tf1.placeholder(tf.float32, [32, 64], name="x")
        h = x + tf.constant(bias, name="b")
        return tf.identity(h * tf.sigmoid(h), name="y"), {"x": x}
    x = uniform(2, (32, 64))
    h = f64(x) + f64(bias)
    compare(build, {"x": x}, h * sigmoid64(h), np.float32, 1e-5,
            ["autofuse_pointwise_0_AddV2_Sigmoid_Mul"], gone={"Sigmoid"})


# --- LayerNorm (Keras-style moments) ---------------------------------------------------------------

GAMMA = np.linspace(0.5, 1.5, 64).astype(np.float32)
BETA = np.linspace(-1, 1, 64).astype(np.float32)


def layer_norm():
    x = tf1.placeholder(tf.float32, [8, 16, 64], name="x")
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    y = tf.nn.batch_normalization(x, mean, variance, offset=tf.constant(BETA),
                                  scale=tf.constant(GAMMA), variance_epsilon=1e-3)
    return tf.identity(y, name="y"), {"x": x}


def layer_norm64(x):
    x = f64(x)
    mean = x.mean(axis=-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + f64(np.float32(1e-3))) * f64(GAMMA) + f64(BETA)


LAYER_NORM = "autofuse_reduce_0_Mean_SquaredDifference_Mean_AddV2_Rsqrt_Mul_Mul_Mul_Sub_AddV2"


def test_layer_norm_is_one_reduce_kernel():
    x = uniform(3, (8, 16, 64))
    compare(layer_norm, {"x": x}, layer_norm64(x), np.float32, 1e-5, [LAYER_NORM],
            gone={"Mean", "Rsqrt", "SquaredDifference"}, **REDUCE)


def test_layer_norm_without_the_reduce_pass_keeps_the_means():
    x = uniform(3, (8, 16, 64))
    _, executed = run(layer_norm, {"x": x})
    assert not any(name.startswith("autofuse_reduce") for name in fused_kernels(executed))
    assert "Mean" in executed.values()


def test_mean_then_rsqrt():
    def build():
        x = tf1.placeholder(tf.float32, [16, 128], name="x")
        return tf.math.rsqrt(tf.reduce_mean(x * x, axis=1) + 1e-6, name="y"), {"x": x}
    x = uniform(4, (16, 128))
    reference = 1.0 / np.sqrt((f64(x) ** 2).mean(axis=1) + f64(np.float32(1e-6)))
    compare(build, {"x": x}, reference, np.float32, 1e-5,
            ["autofuse_reduce_0_Square_Mean_AddV2_Rsqrt"], gone={"Mean", "Rsqrt"},  # x*x: Square
            **REDUCE)


# --- softmax ---------------------------------------------------------------------------------------


def test_softmax_is_one_reduce_kernel():
    def build():
        x = tf1.placeholder(tf.float32, [64, 100], name="x")
        e = tf.exp(x - tf.reduce_max(x, axis=1, keepdims=True))
        return tf.identity(e / tf.reduce_sum(e, axis=1, keepdims=True), name="y"), {"x": x}
    x = uniform(5, (64, 100), low=-10, high=10)
    e = np.exp(f64(x) - f64(x).max(axis=1, keepdims=True))
    compare(build, {"x": x}, e / e.sum(axis=1, keepdims=True), np.float32, 1e-5,
            ["autofuse_reduce_0_Max_Sub_Exp_Sum_RealDiv"], gone={"Max", "Sum", "Exp"}, **REDUCE)


def test_softmax_and_layer_norm_of_an_unknown_batch_are_one_kernel_each():
    """Regression: with the batch size unknown (placeholder [None, C], the usual case), x - max(x)
    was refused on its own ("shapes [?,C] and [?,1] not known to broadcast": the max, read from
    outside, had a size of its own) and so never joined the max's group; nothing was fused."""
    def build():
        x = tf1.placeholder(tf.float32, [None, 100], name="x")
        e = tf.exp(x - tf.reduce_max(x, axis=1, keepdims=True))
        softmax = tf.identity(e / tf.reduce_sum(e, axis=1, keepdims=True), name="softmax")
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        norm = tf.identity((x - mean) * tf.math.rsqrt(variance + 1e-3), name="norm")
        return [softmax, norm], {"x": x}
    x = uniform(5, (64, 100), low=-10, high=10)
    e = np.exp(f64(x) - f64(x).max(axis=1, keepdims=True))
    mean = f64(x).mean(axis=1, keepdims=True)
    variance = ((f64(x) - mean) ** 2).mean(axis=1, keepdims=True)
    executed = compare(build, {"x": x}, [e / e.sum(axis=1, keepdims=True),
                                         (f64(x) - mean) / np.sqrt(variance + 1e-3)],
                       np.float32, 1e-5, ["autofuse_reduce_0_Mean_Sub_SquaredDifference_Mean_"
                                          "AddV2_Rsqrt_Mul",
                                          "autofuse_reduce_1_Max_Sub_Exp_Sum_RealDiv"],
                       gone={"Max", "Sum", "Mean", "Exp", "Rsqrt"}, **REDUCE)
    assert executed["softmax"] == executed["norm"] == "Identity"


def test_reduce_pass_off_leaves_sum_as_its_own_kernel():
    def build():
        x = tf1.placeholder(tf.float32, [8, 32], name="x")
        return tf.reduce_sum(tf.exp(tf.abs(x)), axis=1, name="y"), {"x": x}
    x = uniform(6, (8, 32))
    executed = compare(build, {"x": x}, np.exp(np.abs(f64(x))).sum(axis=1), np.float32, 1e-5,
                       ["autofuse_pointwise_0_Abs_Exp"])
    assert executed["y"] == "Sum"


# --- squeeze-excite: a global mean, a 1x1 conv MLP, a sigmoid gate ---------------------------------

W1 = np.random.default_rng(100).uniform(-0.5, 0.5, (1, 1, 16, 4)).astype(np.float32)
W2 = np.random.default_rng(101).uniform(-0.5, 0.5, (1, 1, 4, 16)).astype(np.float32)
B0 = np.linspace(-0.5, 0.5, 16).astype(np.float32)


def squeeze_excite():
    x = tf1.placeholder(tf.float32, [2, 8, 8, 16], name="x")
    h = tf.nn.relu(x + tf.constant(B0), name="h")
    s = tf.reduce_mean(h, axis=[1, 2], keepdims=True, name="squeeze")
    s = tf.nn.conv2d(s, tf.constant(W1), strides=1, padding="VALID")
    s = tf.nn.conv2d(tf.nn.relu(s), tf.constant(W2), strides=1, padding="VALID")
    return tf.identity(h * tf.sigmoid(s), name="y"), {"x": x}


def squeeze_excite64(x):
    h = np.maximum(f64(x) + f64(B0), 0)
    s = h.mean(axis=(1, 2), keepdims=True)
    s = np.maximum(np.einsum("nhwc,cd->nhwd", s, f64(W1[0, 0])), 0)
    s = np.einsum("nhwc,cd->nhwd", s, f64(W2[0, 0]))
    return h * sigmoid64(s)


def test_squeeze_excite_both_halves():
    x = uniform(7, (2, 8, 8, 16))
    executed = compare(squeeze_excite, {"x": x}, squeeze_excite64(x), np.float32, 1e-5,
                       ["autofuse_reduce_0_AddV2_Relu_Mean", "autofuse_pointwise_1_Sigmoid_Mul"],
                       gone={"Mean", "Sigmoid"}, **REDUCE)
    # the convolutions stay TensorFlow's (Conv2D, or _MklNativeConv2D with oneDNN on)
    assert sum(op.endswith("Conv2D") for op in executed.values()) == 2, executed


# --- residual add + relu, BiasAdd + Relu6 NCHW -----------------------------------------------------


def test_residual_add_relu():
    w = np.random.default_rng(102).uniform(-0.3, 0.3, (3, 3, 8, 8)).astype(np.float32)

    def build():
        x = tf1.placeholder(tf.float32, [2, 8, 8, 8], name="x")
        c = tf.nn.conv2d(x, tf.constant(w), strides=1, padding="SAME")
        return tf.nn.relu(tf.abs(c) + x, name="y"), {"x": x}
    x = uniform(8, (2, 8, 8, 8))
    conv = tf.nn.conv2d(f64(x), f64(w), strides=1, padding="SAME").numpy()
    compare(build, {"x": x}, np.maximum(np.abs(conv) + f64(x), 0), np.float32, 1e-5,
            ["autofuse_pointwise_0_Abs_AddV2_Relu"], gone={"Relu"})


def test_bias_add_relu6_nchw():
    bias = np.linspace(-2, 2, 16).astype(np.float32)

    def build():
        x = tf1.placeholder(tf.float32, [2, 16, 5, 5], name="x")
        y = tf.nn.relu6(tf.nn.bias_add(x, tf.constant(bias), data_format="NCHW"))
        return tf.identity(y, name="y"), {"x": x}
    x = uniform(9, (2, 16, 5, 5), low=-6, high=8)
    reference = np.minimum(np.maximum(f64(x) + f64(bias)[:, None, None], 0), 6)
    compare(build, {"x": x}, reference, np.float32, 1e-6,
            ["autofuse_pointwise_0_BiasAdd_Relu6"], gone={"BiasAdd", "Relu6"})


# --- select, column broadcast, reductions ----------------------------------------------------------


def test_select_with_a_comparison():
    def build():
        x = tf1.placeholder(tf.float32, [16, 24], name="x")
        w = tf1.placeholder(tf.float32, [16, 24], name="w")
        return tf.identity(tf.where(x > w, tf.abs(x), w * 2.0), name="y"), {"x": x, "w": w}
    x, w = uniform(10, (16, 24)), uniform(11, (16, 24))
    reference = np.where(x > w, np.abs(f64(x)), f64(w) * 2.0)
    compare(build, {"x": x, "w": w}, reference, np.float32, 1e-6,
            ["autofuse_pointwise_0_Abs_Greater_Mul_SelectV2"], gone={"Greater", "SelectV2"})


def test_column_broadcast():
    def build():
        x = tf1.placeholder(tf.float32, [16, 24], name="x")
        c = tf1.placeholder(tf.float32, [16, 1], name="c")
        return tf.identity(tf.exp(x - c) * 3.0, name="y"), {"x": x, "c": c}
    x, c = uniform(12, (16, 24)), uniform(13, (16, 1))
    compare(build, {"x": x, "c": c}, np.exp(f64(x) - f64(c)) * 3.0, np.float32, 1e-5,
            ["autofuse_pointwise_0_Sub_Exp_Mul"], gone={"Exp"})


def test_reduction_over_axes_1_2_keep_dims():
    def build():
        x = tf1.placeholder(tf.float32, [4, 6, 5, 8], name="x")
        s = tf.reduce_sum(tf.abs(x), axis=[1, 2], keepdims=True)
        return tf.identity(s, name="y"), {"x": x}
    x = uniform(14, (4, 6, 5, 8))
    compare(build, {"x": x}, np.abs(f64(x)).sum(axis=(1, 2), keepdims=True), np.float32, 1e-6,
            ["autofuse_reduce_0_Abs_Sum"], gone={"Sum", "Abs"}, **REDUCE)


def test_disable_autofuse_scope_in_a_session():
    # Binary ops inside the scope: a chain of unary ops would be folded by Grappler's
    # arithmetic optimizer into one _UnaryOpsComposition, which does not keep the attr.
    def build():
        x = tf1.placeholder(tf.float32, [8, 8], name="x")
        with tf_autofuse.disable_autofuse():
            a = tf.multiply(x, x, name="a")
            b = tf.add(a, x, name="b")
        return tf.nn.relu(tf.sqrt(tf.abs(b)), name="y"), {"x": x}
    x = uniform(15, (8, 8))
    reference = np.maximum(np.sqrt(np.abs(f64(x) * f64(x) + f64(x))), 0)
    executed = compare(build, {"x": x}, reference, np.float32, 1e-6,
                       ["autofuse_pointwise_0_Abs_Sqrt_Relu"])
    assert "AddV2" in executed.values()  # the scoped ops run unfused (Grappler may rename them)
