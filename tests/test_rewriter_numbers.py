"""The rewriter's graphs run: the rewritten graph gives the original's numbers, with each fused
node expanded into TF ops (rewriter_graphs.expand_fused) or run as the AutofuseKernel op; the
programs of Keras-like patterns (GELU, layer norm, softmax, squeeze-excite, BiasAdd NCHW...), of
views and of the ops added for reductions; TensorFlow's own fused elementwise nodes
(oneDNN's _MklSwish).
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.python.framework import op_def_registry

from rewriter_graphs import (CPU0, F16, F32, I32, REDUCE_ON, by_name, chain, const, expand_fused,
                             expanded_matches, flags, fused_nodes, fused_programs, gelu_tanh, graph,
                             node, op_types, placeholder, program_of, programs, run_graph,
                             serialized, softmax, tf1, tf_graph, uniform)
from tf_autofuse import rewriter

# Two ways to run a rewritten graph: "expanded" replaces each AutofuseKernel by the TF ops its
# program names (checks the rewiring without the kernel); "kernel" runs the AutofuseKernel op
# itself (skipped until its library is built).


@pytest.fixture(scope="module")
def kernel_library():
    try:
        from tf_autofuse import _native

        module = _native.load()
    except Exception as err:  # noqa: BLE001 - the library is built elsewhere, in parallel
        pytest.skip(f"AutofuseKernel op library not available: {err}")
    if op_def_registry.get("AutofuseKernel") is None:
        pytest.skip("the op library does not register AutofuseKernel yet")
    return module


@pytest.fixture(params=["expanded", "kernel"])
def run_fused(request):
    if request.param == "kernel":
        request.getfixturevalue("kernel_library")
        return lambda graph_def, fetches, values: run_graph(graph_def, fetches, values)
    return lambda graph_def, fetches, values: run_graph(expand_fused(graph_def), fetches, values)



def test_run_abs_relu_exp_f16(run_fused):
    g = graph(*chain(["Abs", "Relu", "Exp"], F16, (128, 192)))
    expanded_matches(g, ["Exp"], {"x": uniform(1, (128, 192), np.float16)}, rtol=2e-3,
                     run=run_fused)


def test_run_abs_relu_exp_built_with_tf_graph(run_fused):
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [16, 8], name="x")
        tf.exp(tf.nn.relu(tf.abs(x)), name="y")
    expanded_matches(g.as_graph_def(), ["y"], {"x": uniform(1, (16, 8))}, rtol=1e-6,
                     run=run_fused)


def test_run_composition(run_fused):
    composed = node("Exp", "_UnaryOpsComposition", ["x"], F32, op_names=["Abs", "Relu", "Exp"])
    g = graph(placeholder("x", F32, (16, 8)), composed)
    expanded_matches(g, ["Exp"], {"x": uniform(2, (16, 8))}, rtol=1e-6, run=run_fused)


def test_run_preserved_middle_and_fed_middle(run_fused):
    g = graph(*chain(["Abs", "Sqrt", "Relu", "Exp", "Neg"]))
    x = uniform(3, (4, 3))
    expanded_matches(g, ["Sqrt", "Neg"], {"x": x}, rtol=1e-6, run=run_fused)
    fed = {"x": x, "Relu": np.full((4, 3), 0.25, np.float32)}
    result = expanded_matches(g, ["Sqrt", "Neg"], fed, rtol=1e-6, feeds=["Relu"], run=run_fused)
    assert len(result.fusions) == 2


def test_run_binary_and_diamond(run_fused):
    g = graph(
        placeholder("x", F32, (8, 16)),
        placeholder("y", F32, (8, 16)),
        node("a", "Abs", ["x"]),
        node("sig", "Sigmoid", ["a"]),
        node("swish", "Mul", ["a", "sig"]),
        node("d", "SquaredDifference", ["swish", "y"]),
        node("m", "Maximum", ["d", "x"]),
    )
    values = {"x": uniform(4, (8, 16)), "y": uniform(5, (8, 16))}
    expanded_matches(g, ["swish", "m"], values, rtol=1e-6, run=run_fused)


def test_run_split_chain_cycle_and_controls(run_fused):
    g = graph(
        placeholder("x"),
        node("c", "NoOp", dtype=None),
        node("abs", "Abs", ["x", "^c"]),
        node("a", "Relu", ["abs"]),
        node("X", "Identity", ["a"]),
        node("b", "Mul", ["a", "X"]),
        node("e", "Exp", ["b"]),
        node("t", "Tanh", ["e", "^a"]),
        node("s", "Sin", ["t"]),
    )
    result = expanded_matches(g, ["s", "X"], {"x": uniform(6, (4, 3))}, rtol=1e-6,
                              flags=flags(2), run=run_fused)
    assert [f.nodes for f in result.fusions] == [("abs", "a"), ("b", "e"), ("t", "s")]


def test_run_int32(run_fused):
    g = graph(
        placeholder("x", I32, (5, 7)),
        node("sq", "Square", ["x"], I32),
        node("n", "Neg", ["sq"], I32),
        node("d", "SquaredDifference", ["n", "x"], I32),
    )
    x = np.random.default_rng(7).integers(-100, 100, (5, 7)).astype(np.int32)
    expanded_matches(g, ["d"], {"x": x}, rtol=0, run=run_fused)


# --- the programs of model patterns, views and the ops of reductions ---------------------------


def test_gelu_tanh_form_is_one_pointwise_kernel():
    g = tf_graph(gelu_tanh)
    result = expanded_matches(g, ["y"], {"x": uniform(0, (8, 64))})
    assert programs(result) == {"autofuse_pointwise_0_Mul_Pow_Mul_AddV2_Mul_Tanh_AddV2_Mul": (
        "in0: f32[8,64]\n%0 = Mul in0, 0.5\n%1 = Pow in0, 3.0\n%2 = Mul 0.044714998453855515, %1\n"
        "%3 = Add in0, %2\n%4 = Mul 0.7978845834732056, %3\n%5 = Tanh %4\n%6 = Add 1.0, %5\n"
        "%7 = Mul %0, %6\nout0 = %7\n")}
    (fused,) = fused_nodes(result.graph_def)
    assert list(fused.input) == ["x"]  # the scalar Consts are immediates
    assert not [n for n in result.graph_def.node if n.op == "Const"]


def test_gelu_erf_form():
    def build():
        x = tf1.placeholder(tf.float32, [8, 64], name="x")
        tf.identity(0.5 * x * (1.0 + tf.math.erf(x / 1.4142135623730951)), name="y")
    fused = fused_programs(build, ["y"], {"x": uniform(1, (8, 64))})
    assert fused == {"autofuse_pointwise_0_Mul_RealDiv_Erf_AddV2_Mul": (
        "in0: f32[8,64]\n%0 = Mul 0.5, in0\n%1 = Div in0, 1.4142135381698608\n%2 = Erf %1\n"
        "%3 = Add 1.0, %2\n%4 = Mul %0, %3\nout0 = %4\n")}


def test_swish_with_a_bias_reads_the_bias_const_as_an_input():
    def build():
        x = tf1.placeholder(tf.float32, [8, 64], name="x")
        b = tf.constant(np.linspace(-1, 1, 64).astype(np.float32), name="b")
        h = x + b
        tf.identity(h * tf.sigmoid(h), name="y")
    result = expanded_matches(tf_graph(build), ["y"], {"x": uniform(2, (8, 64))})
    (fused,) = fused_nodes(result.graph_def)
    assert fused.name == "autofuse_pointwise_0_AddV2_Sigmoid_Mul"
    assert list(fused.input) == ["x", "b"]
    assert by_name(result.graph_def)["b"].op == "Const"  # the Const stays and feeds the kernel
    assert program_of(fused) == ("in0: f32[8,64]\nin1: f32[64]\n%0 = Add in0, in1\n"
                                 "%1 = Sigmoid %0\n%2 = Mul %0, %1\nout0 = %2\n")


def layer_norm_graph():
    """Keras-style: moments over the last axis (after Grappler pruned the StopGradient)."""
    x = placeholder("x", F32, (8, 16, 64))
    axes = const("axes", np.array([-1], np.int32), tf.int32)
    mean = node("mean", "Mean", ["x", "axes"])
    mean.attr["keep_dims"].b = True
    var = node("var", "Mean", ["sqd", "axes"])
    var.attr["keep_dims"].b = True
    return graph(
        x, axes, mean,
        node("sqd", "SquaredDifference", ["x", "mean"]), var,
        const("eps", np.float32(1e-3)),
        node("add_eps", "AddV2", ["var", "eps"]),
        node("rsqrt", "Rsqrt", ["add_eps"]),
        const("gamma", np.linspace(0.5, 1.5, 64).astype(np.float32)),
        node("scale", "Mul", ["rsqrt", "gamma"]),
        node("xs", "Mul", ["x", "scale"]),
        node("ms", "Mul", ["mean", "scale"]),
        const("beta", np.linspace(-1, 1, 64).astype(np.float32)),
        node("shift", "Sub", ["beta", "ms"]),
        node("y", "AddV2", ["xs", "shift"]),
    )


def test_layer_norm_is_one_reduce_kernel():
    g = layer_norm_graph()
    result = expanded_matches(g, ["y"], {"x": uniform(3, (8, 16, 64))}, rtol=1e-5,
                              flags=REDUCE_ON)
    assert programs(result) == {
        "autofuse_reduce_0_Mean_SquaredDifference_Mean_AddV2_Rsqrt_Mul_Mul_Mul_Sub_AddV2": (
            "in0: f32[8,16,64]\nin1: f32[64]\nin2: f32[64]\n"
            "%0 = Mean in0 axes=[2]\n%1 = SquaredDifference in0, %0\n%2 = Mean %1 axes=[2]\n"
            "%3 = Cast %2 to=f64\n%4 = Add %3, 0.0010000000474974513\n%5 = Rsqrt %4\n"
            "%6 = Cast %5 to=f32\n%7 = Mul %6, in1\n%8 = Mul in0, %7\n%9 = Mul %0, %7\n"
            "%10 = Sub in2, %9\n%11 = Add %8, %10\nout0 = %11\n")}
    (fused,) = fused_nodes(result.graph_def)
    assert list(fused.input) == ["x", "gamma", "beta"]


def test_layer_norm_without_the_reduce_pass_fuses_only_pointwise_parts():
    result = rewriter.rewrite(layer_norm_graph(), preserve=["y"])
    assert all(f.kind == "pointwise" for f in result.fusions)
    reasons = dict(result.refusals)
    assert reasons["mean"] == "the reduce pass is off (--autofuse_enable_pass=reduce turns it on)"
    assert reasons["var"] == reasons["mean"]


def test_mean_then_rsqrt():
    def build():
        x = tf1.placeholder(tf.float32, [4, 32], name="x")
        tf.math.rsqrt(tf.reduce_mean(x * x, axis=1), name="y")
    fused = fused_programs(build, ["y"], {"x": uniform(4, (4, 32))}, flags=REDUCE_ON)
    assert fused == {"autofuse_reduce_0_Mul_Mean_Rsqrt": (
        "in0: f32[4,32]\n%0 = Mul in0, in0\n%1 = Mean %0 axes=[1]\n%2 = Rsqrt %1\n"
        "out0 = %2 -> [4]\n")}


def test_softmax_is_one_reduce_kernel():
    fused = fused_programs(softmax, ["y"], {"x": uniform(5, (8, 10))}, flags=REDUCE_ON)
    assert fused == {"autofuse_reduce_0_Max_Sub_Exp_Sum_RealDiv": (
        "in0: f32[8,10]\n%0 = Max in0 axes=[1]\n%1 = Sub in0, %0\n%2 = Exp %1\n"
        "%3 = Sum %2 axes=[1]\n%4 = Div %2, %3\nout0 = %4\n")}


def test_squeeze_excite_halves():
    def squeeze():  # global mean over H, W, then the (1x1 conv) MLP would follow
        x = tf1.placeholder(tf.float32, [2, 7, 7, 16], name="x")
        tf.nn.relu(tf.reduce_mean(tf.abs(x), axis=[1, 2], keepdims=True), name="s")

    def excite():  # after the 1x1 conv: sigmoid of the [N,1,1,C] gate times the feature map
        x = tf1.placeholder(tf.float32, [2, 7, 7, 16], name="x")
        s = tf1.placeholder(tf.float32, [2, 1, 1, 16], name="gate")
        tf.identity(x * tf.sigmoid(s), name="y")

    result = expanded_matches(tf_graph(squeeze), ["s"], {"x": uniform(6, (2, 7, 7, 16))},
                              flags=REDUCE_ON)
    assert programs(result) == {"autofuse_reduce_0_Abs_Mean_Relu": (
        "in0: f32[2,7,7,16]\n%0 = Abs in0\n%1 = Mean %0 axes=[1,2]\n%2 = Relu %1\nout0 = %2\n")}
    fused = fused_programs(excite, ["y"], {"x": uniform(7, (2, 7, 7, 16)),
                                           "gate": uniform(8, (2, 1, 1, 16))})
    assert fused == {"autofuse_pointwise_0_Sigmoid_Mul": (
        "in0: f32[2,1,1,16]\nin1: f32[2,7,7,16]\n%0 = Sigmoid in0 invariant\n%1 = Mul in1, %0\n"
        "out0 = %1\n")}  # the gate's sigmoid computed once a run (passes.hoist)


def test_residual_add_relu():
    g = graph(placeholder("x", F32, (4, 8, 8, 16)), placeholder("skip", F32, (4, 8, 8, 16)),
              node("add", "AddV2", ["x", "skip"]), node("relu", "Relu", ["add"]))
    fused = fused_programs(g, ["relu"], {"x": uniform(9, (4, 8, 8, 16)),
                                         "skip": uniform(10, (4, 8, 8, 16))})
    assert fused == {"autofuse_pointwise_0_AddV2_Relu": (
        "in0: f32[4,8,8,16]\nin1: f32[4,8,8,16]\n%0 = Add in0, in1\n%1 = Relu %0\nout0 = %1\n")}


def bias_add(data_format):
    n = node("bias_add", "BiasAdd", ["x", "b"])
    n.attr["data_format"].s = data_format.encode()
    return n


def test_bias_add_relu6_nchw_views_the_bias():
    g = graph(placeholder("x", F32, (2, 16, 5, 5)), placeholder("b", F32, (16,)),
              bias_add("NCHW"), node("r6", "Relu6", ["bias_add"]))
    fused = fused_programs(g, ["r6"], {"x": uniform(11, (2, 16, 5, 5)), "b": uniform(12, (16,))})
    assert fused == {"autofuse_pointwise_0_BiasAdd_Relu6": (
        "in0: f32[2,16,5,5]\nin1: f32[16] -> [16,1,1]\n%0 = Add in0, in1\n%1 = Relu6 %0\n"
        "out0 = %1\n")}
    g = graph(placeholder("x", F32, (2, 5, 5, 16)), placeholder("b", F32, (16,)),
              bias_add("NHWC"), node("r6", "Relu6", ["bias_add"]))
    assert programs(rewriter.rewrite(g, preserve=["r6"])) == {
        "autofuse_pointwise_0_BiasAdd_Relu6":
        "in0: f32[2,5,5,16]\nin1: f32[16]\n%0 = Add in0, in1\n%1 = Relu6 %0\nout0 = %1\n"}


def test_select_with_a_comparison():
    def build():
        x = tf1.placeholder(tf.float32, [4, 6], name="x")
        y = tf1.placeholder(tf.float32, [4, 6], name="w")
        tf.identity(tf.where(x > y, tf.abs(x), y * 2.0), name="y")
    fused = fused_programs(build, ["y"], {"x": uniform(13, (4, 6)), "w": uniform(14, (4, 6))})
    assert fused == {"autofuse_pointwise_0_Greater_Abs_Mul_SelectV2": (
        "in0: f32[4,6]\nin1: f32[4,6]\n%0 = Greater in0, in1\n%1 = Abs in0\n%2 = Mul in1, 2.0\n"
        "%3 = Select %0, %1, %2\nout0 = %3\n")}


def test_bool_values_and_outputs():
    g = graph(placeholder("x", F32, (4, 6)), node("nan", "IsNan", ["x"]),
              node("fin", "IsFinite", ["x"]), node("not", "LogicalNot", ["nan"], None),
              node("and", "LogicalAnd", ["not", "fin"], None))
    result = expanded_matches(g, ["and"], {"x": np.array([[np.nan, np.inf, 1, 2, 3, -np.inf]] * 4,
                                                         np.float32)})
    (fused,) = fused_nodes(result.graph_def)
    assert list(fused.attr["Tout"].list.type) == [types_pb2.DT_BOOL]
    assert program_of(fused) == ("in0: f32[4,6]\n%0 = IsNan in0\n%1 = IsFinite in0\n"
                                 "%2 = LogicalNot %0\n%3 = LogicalAnd %2, %1\nout0 = %3\n")


def test_column_broadcast():
    def build():
        x = tf1.placeholder(tf.float32, [4, 6], name="x")
        c = tf1.placeholder(tf.float32, [4, 1], name="c")
        tf.identity(tf.exp(x - c) * 3.0, name="y")
    fused = fused_programs(build, ["y"], {"x": uniform(15, (4, 6)), "c": uniform(16, (4, 1))})
    assert fused == {"autofuse_pointwise_0_Sub_Exp_Mul": (
        "in0: f32[4,6]\nin1: f32[4,1]\n%0 = Sub in0, in1\n%1 = Exp %0\n%2 = Mul %1, 3.0\n"
        "out0 = %2\n")}


def test_reduction_over_axes_1_2_with_and_without_keep_dims():
    def build():
        x = tf1.placeholder(tf.float32, [2, 3, 4, 5], name="x")
        tf.identity(tf.reduce_sum(tf.abs(x), axis=[1, 2], keepdims=True), name="y")
        tf.identity(tf.reduce_sum(tf.abs(x), axis=[2, -3], keepdims=False), name="z")
    fused = fused_programs(build, ["y", "z"], {"x": uniform(17, (2, 3, 4, 5))}, flags=REDUCE_ON)
    assert fused == {
        "autofuse_reduce_0_Abs_Sum": "in0: f32[2,3,4,5]\n%0 = Abs in0\n%1 = Sum %0 axes=[1,2]\n"
                                     "out0 = %1\n",
        "autofuse_reduce_1_Abs_Sum": "in0: f32[2,3,4,5]\n%0 = Abs in0\n%1 = Sum %0 axes=[1,2]\n"
                                     "out0 = %1 -> [2,5]\n"}


def test_reduced_and_full_outputs_together():
    def build():
        x = tf1.placeholder(tf.float32, [6, 5], name="x")
        m = tf.reduce_mean(x, axis=0, name="m")  # keep_dims=false over the leading axis: [5]
        tf.identity(x - m, name="centered")  # broadcasts like the keep_dims form [1,5]
    fused = fused_programs(build, ["m", "centered"], {"x": uniform(18, (6, 5))}, flags=REDUCE_ON)
    assert fused == {"autofuse_reduce_0_Mean_Sub": (
        "in0: f32[6,5]\n%0 = Mean in0 axes=[0]\n%1 = Sub in0, %0\nout0 = %0 -> [5]\nout1 = %1\n")}


def test_views_between_fused_ops_that_add_or_drop_leading_ones_are_aliases():
    """A gradient's Sum with keep_dims and the Reshape to the parameter's shape, a mean's
    Squeeze to [C] and the Reshape back to [1,1,1,C]: numpy broadcasting aligns trailing axes,
    so the readers read the value itself and the views leave the graph. A Reshape that moves
    sizes (flattening) stays TensorFlow's, and so does one adding more axes than any input of
    the group has."""
    def build():
        g = tf1.placeholder(tf.float32, [16, 8, 4, 32], name="g")
        m = tf1.placeholder(tf.float32, [4, 32], name="m")
        s = tf.reduce_sum(tf.exp(g * 0.5), [0, 1], keepdims=True)
        tf.identity(0.9 * m - 0.01 * tf.reshape(s, [4, 32]), name="update")
        y = tf1.placeholder(tf.float32, [8, 5, 5, 16], name="y")
        stats = tf.squeeze(tf.reduce_mean(y, [0, 1, 2], keepdims=True), [0, 1, 2])
        tf.identity(y * tf.reshape(stats * 2.0 + 1.0, [1, 1, 1, 16]), name="scaled")
        v = tf1.placeholder(tf.float32, [6, 7], name="v")
        h = tf.abs(v) * 2.0
        tf.identity(tf.exp(tf.reshape(h, [42])) + 1.0, name="flat")
        tf.identity(tf.exp(tf.expand_dims(h, 0)) - 1.0, name="wider")
    values = {"g": uniform(23, (16, 8, 4, 32)), "m": uniform(24, (4, 32)),
              "y": uniform(25, (8, 5, 5, 16)), "v": uniform(26, (6, 7))}
    result = expanded_matches(tf_graph(build), ["update", "scaled", "flat", "wider"], values,
                              flags=REDUCE_ON)
    assert programs(result) == {
        "autofuse_reduce_0_Mul_Exp_Sum_Mul_Mul_Sub": (
            "in0: f32[16,8,4,32]\nin1: f32[4,32]\n%0 = Mul in0, 0.5\n%1 = Exp %0\n"
            "%2 = Sum %1 axes=[0,1]\n%3 = Mul 0.8999999761581421, in1\n"
            "%4 = Mul 0.009999999776482582, %2\n%5 = Sub %3, %4\nout0 = %5 -> [4,32]\n"),
        "autofuse_reduce_1_Mean_Mul_AddV2_Mul": (
            "in0: f32[8,5,5,16]\n%0 = Mean in0 axes=[0,1,2]\n%1 = Mul %0, 2.0\n"
            "%2 = Add %1, 1.0\n%3 = Mul in0, %2\nout0 = %3\n"),
        # the flattening view and the widening one split their groups: each is read by the
        # group after it as an input view
        "autofuse_pointwise_2_Abs_Mul": "in0: f32[6,7]\n%0 = Abs in0\n%1 = Mul %0, 2.0\n"
                                        "out0 = %1\n",
        "autofuse_pointwise_3_Exp_AddV2": "in0: f32[6,7] -> [42]\n%0 = Exp in0\n%1 = Add %0, 1.0\n"
                                          "out0 = %1\n",
        "autofuse_pointwise_4_Exp_Sub": "in0: f32[6,7] -> [1,6,7]\n%0 = Exp in0\n"
                                        "%1 = Sub %0, 1.0\nout0 = %1\n"}
    assert not [n for n in result.graph_def.node if n.op in ("Reshape", "Squeeze", "ExpandDims")]


def test_input_views_reshape_expand_dims_squeeze():
    def build():
        x = tf1.placeholder(tf.float32, [4, 16, 8, 8], name="x")
        b = tf1.placeholder(tf.float32, [16], name="b")
        s = tf1.placeholder(tf.float32, [4, 1, 1, 8, 1], name="s")
        c = tf1.placeholder(tf.float32, [4, 16], name="c")
        h = tf.nn.relu(x + tf.reshape(b, [16, 1, 1]))
        h = h * tf.squeeze(s, axis=[4])
        tf.identity(h - tf.expand_dims(tf.expand_dims(c, -1), -1), name="y")
    values = {"x": uniform(19, (4, 16, 8, 8)), "b": uniform(20, (16,)),
              "s": uniform(21, (4, 1, 1, 8, 1)), "c": uniform(22, (4, 16))}
    result = expanded_matches(tf_graph(build), ["y"], values)
    (fused,) = fused_nodes(result.graph_def)
    assert fused.name == "autofuse_pointwise_0_AddV2_Relu_Mul_Sub"
    assert list(fused.input) == ["x", "b", "s", "ExpandDims"]  # one ExpandDims is absorbed
    assert program_of(fused) == (
        "in0: f32[4,16,8,8]\nin1: f32[16] -> [16,1,1]\nin2: f32[4,1,1,8,1] -> [4,1,1,8]\n"
        "in3: f32[4,16,1] -> [4,16,1,1]\n%0 = Add in0, in1\n%1 = Relu %0\n%2 = Mul %1, in2\n"
        "%3 = Sub %2, in3\nout0 = %3\n")
    kept = {n.op for n in result.graph_def.node}
    assert "Reshape" not in kept and "Squeeze" not in kept


def test_add_n_clip_leaky_relu_and_cast_lower_to_the_ir():
    def build():
        x = tf1.placeholder(tf.float32, [3, 4], name="x")
        y = tf1.placeholder(tf.float32, [3, 4], name="w")
        s = tf.add_n([x, y, tf.abs(x)])
        s = tf.raw_ops.ClipByValue(t=s, clip_value_min=-1.0, clip_value_max=2.0)
        s = tf.nn.leaky_relu(s, alpha=0.25)
        tf.cast(tf.cast(s, tf.float16) * tf.constant(2.0, tf.float16), tf.float32, name="y")
    fused = fused_programs(build, ["y"], {"x": uniform(23, (3, 4)), "w": uniform(24, (3, 4))},
                           rtol=1e-3)
    assert fused == {
        "autofuse_pointwise_0_Abs_AddN_ClipByValue_LeakyRelu_Cast_Mul_Cast": (
            "in0: f32[3,4]\nin1: f32[3,4]\n%0 = Abs in0\n%1 = Add in0, in1\n%2 = Add %1, %0\n"
            "%3 = Minimum %2, 2.0\n%4 = Maximum %3, -1.0\n%5 = LeakyRelu %4 alpha=0.25\n"
            "%6 = Cast %5 to=f16\n%7 = Mul %6, 2.0\n%8 = Cast %7 to=f32\nout0 = %8\n")}


# --- TensorFlow's own fused elementwise nodes (oneDNN's _MklSwish) -----------------------------
#
# With oneDNN on (x86 CPUs with AVX512-VNNI/BF16/AMX), Grappler's remapper turns x * sigmoid(x)
# into one _MklSwish before this pass runs. The rewriter reads it as Sigmoid and Mul again.


def _swish_after_add():
    bias = np.linspace(-1, 1, 16).astype(np.float32)
    return graph(placeholder("x", F32, (8, 16)), const("b", bias),
                 node("add", "AddV2", ["x", "b"]), node("mul", "_MklSwish", ["add"]),
                 node("y", "Identity", ["mul"])), bias


def test_mkl_swish_fuses_as_sigmoid_and_mul(run_fused):
    g, bias = _swish_after_add()
    before = serialized(g)
    result = rewriter.rewrite(g, preserve=["y"])
    assert serialized(g) == before  # the input is never mutated
    (fused,) = fused_nodes(result.graph_def)
    assert fused.name == "autofuse_pointwise_0_AddV2_Sigmoid_Mul"
    assert program_of(fused) == ("in0: f32[8,16]\nin1: f32[16]\n%0 = Add in0, in1\n"
                                 "%1 = Sigmoid %0\n%2 = Mul %0, %1\nout0 = %2\n")
    assert op_types(result.graph_def) == ["AutofuseKernel", "Const", "Identity", "Placeholder"]
    assert list(by_name(result.graph_def)["y"].input) == [fused.name]
    # numbers: the rewritten graph against float64 (the original's _MklSwish runs only with
    # oneDNN, so the reference is numpy's)
    x = uniform(3, (8, 16), low=-6, high=6)
    (got,) = run_fused(result.graph_def, ["y"], {"x": x})
    h = x.astype(np.float64) + bias
    np.testing.assert_allclose(got, h / (1 + np.exp(-h)), rtol=2e-6, atol=1e-7)


def test_a_lone_mkl_swish_keeps_tensorflows_kernel():
    # nothing to fuse it with (a MatMul on each side): our kernel would only replace oneDNN's
    g = graph(placeholder("x", F32, (4, 4)), node("m1", "MatMul", ["x", "x"]),
              node("s", "_MklSwish", ["m1"]), node("m2", "MatMul", ["s", "s"]),
              node("x2", "Abs", ["x"]), node("x3", "Relu", ["x2"]))
    result = rewriter.rewrite(g, preserve=["m2", "x3"])
    nodes = by_name(result.graph_def)
    assert [f.name for f in result.fusions] == ["autofuse_pointwise_0_Abs_Relu"]
    assert nodes["s"].op == "_MklSwish" and list(nodes["s"].input) == ["m1"]
    assert "Sigmoid" not in op_types(result.graph_def) and "Mul" not in op_types(result.graph_def)
    reasons = {r.node: r.reason for r in result.refusals}
    assert reasons["s"] == "only the parts of one _MklSwish (s): already one kernel"
    twice = rewriter.rewrite(result.graph_def, preserve=["m2", "x3"])  # the pass is idempotent
    assert not twice.fusions and serialized(twice.graph_def) == serialized(result.graph_def)


def test_an_unfused_mkl_swish_is_put_back_whole():
    # the skip list keeps the swish's Mul out; its Sigmoid alone is not fused: the original node
    # comes back, with its name, input, control input and device
    g = graph(placeholder("x", F32, (4, 3)), node("a", "Abs", ["x"]), node("r", "Relu", ["a"]),
              node("s", "_MklSwish", ["r", "^a"], device=CPU0), node("out", "Identity", ["s"]))
    g.node[3].attr["_kernel"].s = b"MklNameChangeOp"
    skip = types.SimpleNamespace(names=frozenset({"s"}), types=frozenset())
    result = rewriter.rewrite(g, preserve=["out"],
                              flags=types.SimpleNamespace(skip_node_names_cfg=skip))
    (fused,) = fused_nodes(result.graph_def)
    assert fused.name == "autofuse_pointwise_0_Abs_Relu"
    swish = by_name(result.graph_def)["s"]
    assert swish.op == "_MklSwish" and swish.device == CPU0
    assert swish.attr["_kernel"].s == b"MklNameChangeOp"
    assert list(swish.input) == [fused.name, "^" + fused.name]
    assert op_types(result.graph_def) == ["AutofuseKernel", "Identity", "Placeholder", "_MklSwish"]
    twice = rewriter.rewrite(result.graph_def, preserve=["out"],
                             flags=types.SimpleNamespace(skip_node_names_cfg=skip))
    assert not twice.fusions and serialized(twice.graph_def) == serialized(result.graph_def)


def test_mkl_swish_with_a_taken_sigmoid_name():
    g = graph(placeholder("x", F32, (4, 3)), node("a", "Abs", ["x"]),
              node("s", "_MklSwish", ["a"]), node("s/Sigmoid", "Exp", ["s"]))
    result = rewriter.rewrite(g, preserve=["s/Sigmoid"])
    (fusion,) = result.fusions
    assert fusion.op_types == ("Abs", "Sigmoid", "Mul", "Exp")
    assert fusion.nodes == ("a", "s", "s/Sigmoid")  # the caller's names
