"""Convolution and MatMul epilogues handed to TensorFlow's fused kernels (rewriter/epilogue.py):
the rewritten graph's structure, its numbers against the unfused graph and a float64 run of
the same graph, and the reason of each epilogue left alone."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_autofuse
from tf_autofuse import rewriter
from tf_autofuse.fuser import static_shapes
from tf_autofuse.rewriter import epilogue

tf1 = tf.compat.v1
_RNG = [np.random.default_rng(7)]  # Net draws each graph's values from one seed

pytestmark = pytest.mark.skipif(not tf_autofuse.is_available(),
                                reason="tf_autofuse's kernel library is not available")


def _values(*shape, low=-1.0, high=1.0):
    return _RNG[0].uniform(low, high, shape)


class Net:
    """One graph built twice from the same float64 values: in float32 (rewritten and run
    unfused) and in float64 (the reference)."""

    def __init__(self, build, x_shape, seed=7):
        self.x = np.random.default_rng(seed + 1).uniform(-1.0, 1.0, x_shape)
        self.graphs = {}
        for dtype in (tf.float32, tf.float64):
            _RNG[0] = np.random.default_rng(seed)  # the same values in both graphs
            g = tf.Graph()
            with g.as_default():
                x = tf1.placeholder(dtype, x_shape, name="x")
                out = build(x, lambda v: tf.constant(np.asarray(v), dtype))
                tf.identity(out, name="out")
            self.graphs[dtype] = g

    def rewrite(self, **policy):
        """The rewrite with a Policy of `policy` (the defaults: scales taken)."""
        g = self.graphs[tf.float32]
        graph_def = g.as_graph_def()
        return rewriter.rewrite(graph_def, preserve=["out", "x"], feeds=["x"],
                                shapes=static_shapes(graph_def, g),
                                policy=rewriter.Policy(**policy))

    def run(self, graph_def=None, dtype=tf.float32):
        if graph_def is None:
            graph_def = self.graphs[dtype].as_graph_def()
        g = tf.Graph()
        with g.as_default():
            tf1.import_graph_def(graph_def, name="")
        config = tf1.ConfigProto()
        config.graph_options.rewrite_options.disable_meta_optimizer = True  # the graph as given
        with tf1.Session(graph=g, config=config) as session:
            return session.run("out:0", {"x:0": self.x.astype(dtype.as_numpy_dtype)})

    def check_numbers(self, result):
        """Fused vs unfused float32 and the float64 run: no worse than unfused, up to rounding."""
        fused = self.run(result.graph_def).astype(np.float64)
        unfused = self.run().astype(np.float64)
        exact = self.run(dtype=tf.float64)
        assert np.max(np.abs(unfused - exact)) <= 1e-4 * np.max(np.abs(exact)) + 1e-30
        scale = np.max(np.abs(exact))
        unfused_error = np.max(np.abs(unfused - exact)) / scale
        fused_error = np.max(np.abs(fused - exact)) / scale
        assert fused_error <= 2 * unfused_error + 4 * np.finfo(np.float32).eps, (
            fused_error, unfused_error)


def _ops(graph_def):
    return sorted(n.op for n in graph_def.node if n.op not in ("Const", "Placeholder", "Identity"))


def _node(graph_def, name):
    return next(n for n in graph_def.node if n.name == name)


def _fused_ops(node):
    return [s.decode() for s in node.attr["fused_ops"].list.s]


def _batch_norm(y, c, channels, eps=1e-3, centred=True):
    """Keras 3's BatchNormalization in inference, as its TensorFlow ops compute it (centred:
    a mean and a beta drawn at random, else both 0, as Keras initialises them)."""
    def vector(v):
        return tf.reshape(c(v), [1] * (len(y.shape) - 1) + [channels])
    gamma, beta = vector(_values(channels, low=0.5)), vector(_values(channels))
    mean, var = vector(_values(channels)), vector(_values(channels, low=0.2, high=2.0))
    if not centred:
        beta = mean = vector(np.zeros(channels))
    inv = tf.math.rsqrt(var + eps) * gamma
    return y * inv + (beta - mean * inv)


def _conv(x, c, channels_out, bias=True):
    y = tf.nn.conv2d(x, c(_values(3, 3, x.shape[-1], channels_out)), 1, "SAME")
    return tf.nn.bias_add(y, c(_values(channels_out))) if bias else y


def test_conv_bias_batch_norm_relu_is_one_fused_convolution_of_a_scaled_filter():
    net = Net(lambda x, c: tf.nn.relu(_batch_norm(_conv(x, c, 8), c, 8)), (2, 9, 9, 4))
    result = net.rewrite()
    assert [e.op for e in result.epilogues] == ["_FusedConv2D"]
    fused = _node(result.graph_def, result.epilogues[0].name)
    assert _fused_ops(fused) == ["BiasAdd", "Relu"]
    # the filter is W * s, s broadcast along its output channels as the graph shapes it (no
    # Reshape); s and the bias c * s + t are computed per step by one fused kernel of [C] values
    scaled = _node(result.graph_def, fused.input[1].split(":")[0])
    assert scaled.op == "Mul" and _node(result.graph_def, scaled.input[0]).op == "Const"
    assert _ops(result.graph_def) == ["AutofuseKernel", "Mul", "_FusedConv2D"]
    kernel = next(n for n in result.graph_def.node if n.op == "AutofuseKernel")
    assert fused.input[2].split(":")[0] == kernel.name == scaled.input[1].split(":")[0]
    assert "-> [8]" in kernel.attr["program"].s.decode()
    net.check_numbers(result)


def test_centred_batch_norm_folds_the_mean_into_the_bias():
    def build(x, c):
        y = tf.nn.conv2d(x, c(_values(1, 1, 4, 6)), 1, "VALID")
        y = (y - c(_values(6))) * c(_values(6, low=0.5)) + c(_values(6))
        return tf.nn.relu6(y)

    net = Net(build, (1, 5, 5, 4))
    result = net.rewrite()
    fused = _node(result.graph_def, result.epilogues[0].name)
    assert _fused_ops(fused) == ["BiasAdd", "Relu6"]  # bias t - m * s
    assert _ops(result.graph_def) == ["AutofuseKernel", "Mul", "_FusedConv2D"]
    net.check_numbers(result)


def test_a_scale_is_not_folded_into_a_filter_larger_than_the_output():
    net = Net(lambda x, c: tf.nn.relu(_batch_norm(_conv(x, c, 32), c, 32)), (1, 3, 3, 16))
    result = net.rewrite()
    assert not result.epilogues
    assert any("scaling the filter each step would cost more" in r.reason
               for r in result.refusals)
    assert "Conv2D" in _ops(result.graph_def)
    net.check_numbers(result)


def test_a_scale_without_activation_before_a_residual_add_stays_in_the_add_kernel():
    """A batch norm whose output goes into an elementwise kernel anyway (ResNet's last
    convolution of a block, before the residual Add and Relu) rides in that kernel: folding
    its scale into the filter would be one more kernel and no pass less."""
    def build(x, c):
        y = _batch_norm(_conv(x, c, 4, bias=False), c, 4)
        return tf.nn.relu(y + x)

    net = Net(build, (2, 9, 9, 4))  # the filter (144) is smaller than the output (648)
    result = net.rewrite()
    assert not result.epilogues
    assert any("joins the elementwise kernel reading its output" in r.reason
               for r in result.refusals)
    assert _ops(result.graph_def) == ["AutofuseKernel", "Conv2D"]
    net.check_numbers(result)


def test_a_deep_stack_of_scaled_convolutions_keeps_the_unfused_error():
    """Sixteen Conv2D + BatchNormalization + Relu layers, the batch norms without a shift (as
    Keras initialises them), so that a relative error of one sign in each layer's scale adds
    up in the output: the fused graph's error against float64 stays that of the unfused graph,
    with no drift. (A FusedBatchNorm epilogue multiplies each layer's output by TensorFlow's
    fp32 rsqrt of its variance argument, which errs low: 2 ulps at 1, a drift of 2e-6 here.)"""
    def build(x, c):
        for _ in range(16):
            w = c(_values(1, 1, 8, 8) / np.sqrt(8.0))
            x = tf.nn.relu(_batch_norm(tf.nn.conv2d(x, w, 1, "SAME"), c, 8, centred=False))
        return x

    net = Net(build, (2, 8, 8, 8))
    result = net.rewrite()
    assert len(result.epilogues) == 16
    fused = net.run(result.graph_def).astype(np.float64)
    unfused = net.run().astype(np.float64)
    exact = net.run(dtype=tf.float64)
    scale = np.max(np.abs(exact))
    fused_error = np.max(np.abs(fused - exact)) / scale
    unfused_error = np.max(np.abs(unfused - exact)) / scale
    assert fused_error <= 1.5 * unfused_error, (fused_error, unfused_error)
    large = np.abs(exact) > 0.1 * scale

    def drift(values):  # the typical relative error, with its sign
        return np.median((values - exact)[large] / np.abs(exact[large]))

    assert abs(drift(fused)) <= abs(drift(unfused)) + 4 * np.finfo(np.float32).eps, (
        drift(fused), drift(unfused))


def _fused_conv_with_a_squeezed_bias(channels=6):
    """A graph as TensorFlow's remapper leaves a Keras Conv2D with a bias and a Relu:
    _FusedConv2D(x, W, Squeeze(Reshape(b, [1, 1, 1, C]))) [BiasAdd, Relu]."""
    from tensorflow.core.framework import node_def_pb2, types_pb2

    rng = np.random.default_rng(3)
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, (1, 5, 5, 3), name="x")
        w = tf.constant(rng.uniform(-1, 1, (3, 3, 3, channels)), tf.float32, name="w")
        b = tf.constant(rng.uniform(-1, 1, channels), tf.float32, name="b")
        wide = tf.reshape(b, [1, 1, 1, channels], name="bias_wide")
        tf.squeeze(wide, [0, 1, 2], name="bias")
    graph_def = g.as_graph_def()
    node = node_def_pb2.NodeDef(name="conv", op="_FusedConv2D", input=["x", "w", "bias"])
    node.attr["T"].type = types_pb2.DT_FLOAT
    node.attr["num_args"].i = 1
    node.attr["TArgs"].list.type.append(types_pb2.DT_FLOAT)
    node.attr["strides"].list.i.extend([1, 1, 1, 1])
    node.attr["dilations"].list.i.extend([1, 1, 1, 1])
    node.attr["padding"].s = b"SAME"
    node.attr["data_format"].s = b"NHWC"
    node.attr["fused_ops"].list.s.extend([b"BiasAdd", b"Relu"])
    out = node_def_pb2.NodeDef(name="out", op="Identity", input=["conv"])
    out.attr["T"].type = types_pb2.DT_FLOAT
    graph_def.node.extend([node, out])
    return graph_def


def test_a_fused_convolution_left_alone_reads_its_bias_without_the_views():
    graph_def = _fused_conv_with_a_squeezed_bias()
    g = tf.Graph()
    with g.as_default():
        tf1.import_graph_def(graph_def, name="")
    result = rewriter.rewrite(graph_def, preserve=["out", "x"], feeds=["x"],
                              shapes=static_shapes(graph_def, g))
    assert not result.epilogues and not result.fusions
    conv = _node(result.graph_def, "conv")
    assert conv.op == "_FusedConv2D" and list(conv.input) == ["x", "w", "b"]
    assert _ops(result.graph_def) == ["_FusedConv2D"]  # the Reshape and the Squeeze are gone
    x = np.random.default_rng(4).uniform(-1, 1, (1, 5, 5, 3)).astype(np.float32)
    outputs = []
    for graph in (graph_def, result.graph_def):
        g = tf.Graph()
        with g.as_default():
            tf1.import_graph_def(graph, name="")
        with tf1.Session(graph=g) as session:
            outputs.append(session.run("out:0", {"x:0": x}))
    np.testing.assert_array_equal(outputs[0], outputs[1])  # the same bits
    again = rewriter.rewrite(result.graph_def, preserve=["out", "x"], feeds=["x"],
                             shapes=static_shapes(result.graph_def))
    assert again.graph_def.SerializeToString(deterministic=True) == \
        result.graph_def.SerializeToString(deterministic=True)
    # a fetched view is read as it is
    kept = rewriter.rewrite(graph_def, preserve=["out", "x", "bias"], feeds=["x"],
                            shapes=static_shapes(graph_def, g))
    assert list(_node(kept.graph_def, "conv").input) == ["x", "w", "bias"]


@pytest.mark.parametrize("activation", ["Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid"])
def test_matmul_bias_and_activation(activation):
    act = {"Relu": tf.nn.relu, "Relu6": tf.nn.relu6, "Elu": tf.nn.elu, "Tanh": tf.tanh,
           "LeakyRelu": lambda v: tf.nn.leaky_relu(v, alpha=0.3), "Sigmoid": tf.sigmoid}
    net = Net(lambda x, c: act[activation](tf.matmul(x, c(_values(6, 5))) + c(_values(5))),
              (7, 6))
    result = net.rewrite()
    assert [e.op for e in result.epilogues] == ["_FusedMatMul"]
    fused = _node(result.graph_def, result.epilogues[0].name)
    assert _fused_ops(fused) == ["BiasAdd", activation]
    if activation == "LeakyRelu":
        assert fused.attr["leakyrelu_alpha"].f == pytest.approx(0.3)
    assert _ops(result.graph_def) == ["_FusedMatMul"]
    net.check_numbers(result)


def test_matmul_scale_folds_into_a_small_weight_matrix():
    net = Net(lambda x, c: tf.nn.relu(tf.matmul(x, c(_values(3, 4))) * c(_values(4, low=0.5))
                                      + c(_values(4))), (64, 3))
    result = net.rewrite()
    fused = _node(result.graph_def, result.epilogues[0].name)
    assert fused.op == "_FusedMatMul" and _fused_ops(fused) == ["BiasAdd", "Relu"]
    net.check_numbers(result)


def test_a_scale_is_not_folded_into_weights_larger_than_the_output():
    net = Net(lambda x, c: tf.nn.relu(tf.matmul(x, c(_values(16, 32))) * c(_values(32))),
              (2, 16))
    result = net.rewrite()
    assert not result.epilogues
    assert any("scaling the filter each step would cost more" in r.reason
               for r in result.refusals)
    assert "MatMul" in _ops(result.graph_def)


def test_depthwise_batch_norm_folds_its_scale_into_the_filter():
    def build(x, c):
        y = tf.nn.depthwise_conv2d(x, c(_values(3, 3, 4, 2)), [1, 1, 1, 1], "SAME")
        return tf.nn.relu6(_batch_norm(y, c, 8))

    net = Net(build, (1, 10, 10, 4))
    result = net.rewrite()
    if "Relu6" not in epilogue.accepts("depthwise"):
        assert not result.epilogues
        assert any("does not apply it" in r.reason for r in result.refusals)
        return
    fused = _node(result.graph_def, result.epilogues[0].name)
    assert fused.op == "_FusedDepthwiseConv2dNative"
    assert _fused_ops(fused) == ["BiasAdd", "Relu6"]
    net.check_numbers(result)


def test_swish_after_a_convolution():
    def build(x, c):
        y = _conv(x, c, 6)
        return y * tf.sigmoid(y)

    net = Net(build, (1, 6, 6, 3))
    result = net.rewrite()
    if epilogue.SWISH in epilogue.accepts("conv"):
        fused = _node(result.graph_def, result.epilogues[0].name)
        assert _fused_ops(fused) == ["BiasAdd", epilogue.SWISH]
    else:
        assert not result.epilogues
        assert any("_MklSwish" in r.reason and "does not apply it" in r.reason
                   for r in result.refusals)
    net.check_numbers(result)


def test_without_onednn_an_activation_eigen_lacks_is_refused_with_its_reason(monkeypatch):
    monkeypatch.setattr(epilogue, "onednn", lambda: False)
    net = Net(lambda x, c: tf.sigmoid(_conv(x, c, 4)), (1, 5, 5, 2))
    result = net.rewrite()
    assert not result.epilogues
    (reason,) = [r.reason for r in result.refusals if "epilogue" in r.reason]
    assert reason == ("Conv2D epilogue with Sigmoid: TensorFlow's _FusedConv2D (Eigen "
                      "(oneDNN off)) does not apply it")
    assert "Conv2D" in _ops(result.graph_def)  # left to TensorFlow; the Add and Sigmoid fuse
    net.check_numbers(result)


def test_a_fetched_intermediate_keeps_the_operator_apart():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 3], name="x")
        y = tf.matmul(x, tf.constant(_values(3, 5), tf.float32), name="product")
        tf.identity(tf.nn.relu(y + tf.constant(_values(5), tf.float32)), name="out")
    graph_def = g.as_graph_def()
    result = rewriter.rewrite(graph_def, preserve=["out", "x", "product"], feeds=["x"],
                              shapes=static_shapes(graph_def, g))
    assert not result.epilogues
    assert _node(result.graph_def, "product").op == "MatMul"


def test_the_pass_is_idempotent_and_can_be_turned_off():
    net = Net(lambda x, c: tf.nn.relu(_batch_norm(_conv(x, c, 8), c, 8)), (1, 6, 6, 4))
    once = net.rewrite().graph_def
    shapes = static_shapes(once)
    twice = rewriter.rewrite(once, preserve=["out", "x"], feeds=["x"], shapes=shapes).graph_def
    assert twice.SerializeToString(deterministic=True) == once.SerializeToString(
        deterministic=True)
    off = net.rewrite(epilogue=False)
    assert not off.epilogues and "Conv2D" in _ops(off.graph_def)
    fuser = tf_autofuse.Fuser(passes=["pointwise"])
    assert fuser.config.policy().epilogue is False
    assert tf_autofuse.Fuser().config.policy().epilogue is True


def test_a_reshape_of_a_fused_output_becomes_its_output_view():
    net = Net(lambda x, c: tf.matmul(tf.reshape(tf.exp(tf.abs(x)), [4, 6]), c(_values(6, 2))),
              (2, 2, 6))
    result = net.rewrite()
    assert "Reshape" not in _ops(result.graph_def)
    (kernel,) = [n for n in result.graph_def.node if n.op == "AutofuseKernel"]
    assert kernel.attr["program"].s.decode().endswith("out0 = %1 -> [4,6]\n")
    assert result.fusions[0].absorbed
    net.check_numbers(result)


@pytest.mark.parametrize("form", ["erf", "erfc", "tanh"])
def test_a_gelu_is_recognised_however_it_is_written(form):
    def gelu(v):
        if form == "erf":
            return 0.5 * v * (1.0 + tf.math.erf(v / np.sqrt(2.0)))
        if form == "erfc":
            return 0.5 * v * tf.math.erfc(-v * 0.7071067811865476)
        return 0.5 * v * (1.0 + tf.tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))

    net = Net(lambda x, c: gelu(tf.matmul(x, c(_values(6, 5))) + c(_values(5))), (9, 6))
    result = net.rewrite()
    wanted = "GeluApproximate" if form == "tanh" else "GeluExact"
    if wanted not in epilogue.accepts("matmul"):
        assert any(f"with {wanted}:" in r.reason for r in result.refusals)
        return
    fused = _node(result.graph_def, result.epilogues[0].name)
    assert _fused_ops(fused) == ["BiasAdd", wanted]
    assert _ops(result.graph_def) == ["_FusedMatMul"]
    net.check_numbers(result)


def test_an_elementwise_group_that_only_looks_like_an_activation_is_left_alone():
    # a Relu clamped at 1000 equals a Relu on small values only
    net = Net(lambda x, c: tf.minimum(tf.nn.relu(tf.matmul(x, c(_values(4, 3)))), 1000.0),
              (5, 4))
    result = net.rewrite()
    fused = _node(result.graph_def, result.epilogues[0].name)
    assert _fused_ops(fused) == ["BiasAdd", "Relu"]  # the Relu, then the Minimum apart
    assert "Minimum" in _ops(result.graph_def)
    net.check_numbers(result)


def test_a_dense_layer_on_a_sequence_reshapes_after_its_fused_matmul():
    def build(x, c):
        rows = tf.reshape(x, [-1, 8])
        y = tf.reshape(tf.matmul(rows, c(_values(8, 6))), [2, 5, 6])
        return tf.nn.relu(y + c(_values(6)))

    net = Net(build, (2, 5, 8))
    result = net.rewrite()
    (done,) = result.epilogues
    assert done.name == "MatMul" and done.nodes == ("MatMul", "add", "Relu")
    fused = _node(result.graph_def, "MatMul")
    assert fused.op == "_FusedMatMul" and _fused_ops(fused) == ["BiasAdd", "Relu"]
    last = _node(result.graph_def, "Relu")  # the chain's last name, in the chain's shape
    assert last.op == "Reshape" and last.input[0] == "MatMul"
    net.check_numbers(result)


# --- random epilogues: every form the pass may meet, checked by numbers ------------------------

_FORMULATIONS = {
    "none": lambda v: v,
    "relu": tf.nn.relu,
    "relu_max": lambda v: tf.maximum(v, 0.0),
    "relu6_clip": lambda v: tf.minimum(tf.maximum(v, 0.0), 6.0),
    "elu": tf.nn.elu,
    "leaky": lambda v: tf.nn.leaky_relu(v, alpha=0.1),
    "tanh": tf.tanh,
    "sigmoid": tf.sigmoid,
    "swish": lambda v: v * tf.sigmoid(v),
    "swish_div": lambda v: v / (1.0 + tf.exp(-v)),
    "gelu": lambda v: 0.5 * v * (1.0 + tf.math.erf(v * 0.7071067811865476)),
    "scaled_relu": lambda v: 2.0 * tf.nn.relu(v),  # not an activation of the fused kernels
    "clamped": lambda v: tf.minimum(tf.nn.relu(v), 0.5),  # a look-alike
}


def _random_case(seed):
    rng = np.random.default_rng(seed)
    family = ["conv", "depthwise", "matmul"][seed % 3]
    bias, centre, scale, shift = (bool(b) for b in rng.integers(0, 2, 4))
    form = sorted(_FORMULATIONS)[rng.integers(len(_FORMULATIONS))]
    rows, channels, width = int(rng.integers(1, 40)), int(rng.integers(1, 9)), int(
        rng.integers(2, 7))

    def build(x, c):
        if family == "conv":
            cout = channels
            y = tf.nn.conv2d(x, c(_values(2, 2, x.shape[-1], cout)), 1, "SAME")
        elif family == "depthwise":
            cout = x.shape[-1] * 2
            y = tf.nn.depthwise_conv2d(x, c(_values(3, 3, x.shape[-1], 2)), [1, 1, 1, 1], "SAME")
        else:
            cout = channels
            y = tf.matmul(x, c(_values(x.shape[-1], cout)))
        if bias:
            y = tf.nn.bias_add(y, c(_values(cout)))
        if centre:
            y = y - c(_values(cout))
        if scale:
            y = y * c(_values(cout, low=0.5, high=2.0))
        if shift:
            y = y + c(_values(cout))
        return _FORMULATIONS[form](y)

    shape = (rows, 3) if family == "matmul" else (1, width, 5, 3)
    return Net(build, shape, seed), (family, bias, centre, scale, shift, form)


@pytest.mark.parametrize("seed", range(36))
def test_random_epilogues_keep_the_numbers(seed):
    net, case = _random_case(seed)
    result = net.rewrite()
    for done in result.epilogues:
        node = _node(result.graph_def, done.name)
        assert node.op == done.op and _fused_ops(node) == list(done.fused_ops)
        assert set(done.fused_ops[1:]) <= epilogue.accepts(
            {"_FusedConv2D": "conv", "_FusedMatMul": "matmul"}.get(node.op, "depthwise")), case
    if case[-1] in ("scaled_relu", "clamped"):
        assert not any(op in ("Relu", epilogue.SWISH) and len(e.fused_ops) > 1
                       and e.fused_ops[-1] != "Relu" for e in result.epilogues for op in e.fused_ops)
    net.check_numbers(result)


def test_the_debug_dump_lists_epilogues_and_their_refusals(tmp_path, monkeypatch):
    from tf_autofuse import debug

    net = Net(lambda x, c: tf.nn.relu(_batch_norm(_conv(x, c, 8), c, 8)), (2, 6, 6, 4))
    result = net.rewrite()
    monkeypatch.setattr(epilogue, "onednn", lambda: False)
    refused = Net(lambda x, c: tf.sigmoid(_conv(x, c, 4)), (1, 5, 5, 2)).rewrite()
    debug.dump(str(tmp_path), net.graphs[tf.float32].as_graph_def(), result)
    debug.dump(str(tmp_path), net.graphs[tf.float32].as_graph_def(), refused)
    fusions = "".join(p.read_text() for p in tmp_path.glob("*_fusions.txt"))
    refusals = "".join(p.read_text() for p in tmp_path.glob("*_refusals.txt"))
    assert "(_FusedConv2D [BiasAdd, Relu], TensorFlow's kernel)" in fusions
    assert "Conv2D: Conv2D epilogue with Sigmoid" in refusals


def test_scales_are_taken_by_default_and_stay_a_kernel_of_their_own_when_disabled():
    """Pass epilogue_scale is on by default, in the flags, the API and the Policy; disabled, a
    batch norm after a convolution is refused with its reason and stays one fused kernel that
    computes its s and t once a run (invariants) and applies them: the convolution keeps
    TensorFlow's own numbers."""
    net = Net(lambda x, c: tf.nn.relu(_batch_norm(_conv(x, c, 8), c, 8)), (2, 6, 6, 4))
    assert net.rewrite().epilogues
    result = net.rewrite(epilogue_scale=False)
    assert not result.epilogues
    assert any("pass epilogue_scale is disabled" in r.reason for r in result.refusals)
    assert _ops(result.graph_def) == ["AutofuseKernel", "Conv2D"]
    kernel = next(n for n in result.graph_def.node if n.op == "AutofuseKernel")
    assert " invariant" in kernel.attr["program"].s.decode()
    assert rewriter.Policy().epilogue_scale is True
    assert tf_autofuse.Fuser().config.policy().epilogue_scale is True
    assert tf_autofuse.Fuser(passes=["pointwise", "epilogue"]).config.policy().epilogue_scale \
        is False
    flags = tf_autofuse.flags.Flags(autofuse_disable_pass=("epilogue_scale",))
    assert rewriter.policy_from_flags(flags).epilogue_scale is False
    assert rewriter.policy_from_flags(tf_autofuse.flags.Flags()).epilogue_scale is True
    net.check_numbers(result)


# --- zero padding read as the convolution's own (rewriter/pads.py) ----------------------------


def _padded_conv(x, c, pads=((0, 0), (3, 3), (2, 1), (0, 0)), v2=False, stride=2):
    padded = (tf.raw_ops.PadV2(input=x, paddings=pads, constant_values=c(0.0)) if v2
              else tf.pad(x, pads))
    y = tf.nn.conv2d(padded, c(_values(3, 3, x.shape[-1], 8)), stride, "VALID")
    return tf.nn.relu(tf.nn.bias_add(y, c(_values(8))))


@pytest.mark.parametrize("v2", [False, True], ids=["Pad", "PadV2"])
def test_a_zero_pad_becomes_the_convolutions_explicit_padding(v2):
    """Keras' ZeroPadding2D before a "valid" Conv2D: the Pad leaves the graph, the fused
    convolution pads by itself, and the result is the same bits as TensorFlow's Pad + Conv2D."""
    net = Net(lambda x, c: _padded_conv(x, c, v2=v2), (2, 11, 10, 4))
    result = net.rewrite()
    assert "Pad" not in _ops(result.graph_def) and "PadV2" not in _ops(result.graph_def)
    (conv,) = [n for n in result.graph_def.node if n.op == "_FusedConv2D"]
    assert conv.attr["padding"].s == b"EXPLICIT"
    assert list(conv.attr["explicit_paddings"].list.i) == [0, 0, 3, 3, 2, 1, 0, 0]
    assert _node(result.graph_def, conv.input[0].split(":")[0]).op == "Placeholder"
    net.check_numbers(result)
    # the same fused convolution after the Pad node (kept: preserved): the same bits with
    # Eigen's kernels; oneDNN's choose their algorithm by the padding, so only as accurate
    g = net.graphs[tf.float32]
    graph_def = g.as_graph_def()
    pad = next(n.name for n in graph_def.node if n.op in ("Pad", "PadV2"))
    kept = rewriter.rewrite(graph_def, preserve=["out", "x", pad], feeds=["x"],
                            shapes=static_shapes(graph_def, g), policy=rewriter.Policy())
    assert any(n.op in ("Pad", "PadV2") for n in kept.graph_def.node)
    folded, padded = net.run(result.graph_def), net.run(kept.graph_def)
    if epilogue.onednn():
        np.testing.assert_allclose(folded, padded, rtol=2e-5, atol=2e-6)
    else:
        np.testing.assert_array_equal(folded, padded)


def test_pads_a_convolution_cannot_take_stay():
    """A Pad read by two nodes, one of a non-zero constant and one before a depthwise
    convolution stay as they are. (A Pad of the channels, also left alone, is not run here:
    oneDNN's own Pad + Conv2D fusion fails on it in TensorFlow 2.21.)"""
    def build(x, c):
        shared = tf.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
        a = tf.nn.conv2d(shared, c(_values(3, 3, 4, 4)), 1, "VALID") + shared[:, 1:-1, 1:-1, :]
        ones = tf.nn.conv2d(tf.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=1.0),
                            c(_values(3, 3, 4, 4)), 1, "VALID")
        depthwise = tf.nn.depthwise_conv2d(tf.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0))),
                                           c(_values(3, 3, 4, 1)), (1, 1, 1, 1), "VALID")
        return a + ones + depthwise
    net = Net(build, (2, 7, 7, 4))
    result = net.rewrite()
    pads = [n for n in result.graph_def.node if n.op in ("Pad", "PadV2")]
    assert len(pads) == 3, _ops(result.graph_def)
    assert all(n.attr["padding"].s == b"VALID" for n in result.graph_def.node
               if n.op in ("Conv2D", "_FusedConv2D", "DepthwiseConv2dNative"))
    net.check_numbers(result)


def test_a_pad_or_convolution_kept_out_of_fusion_stays():
    """--skip_node_names_cfg by op type (Pad, or Conv2D) keeps the pair as it is."""
    net = Net(lambda x, c: _padded_conv(x, c), (2, 11, 10, 4))
    for skipped in ("Pad", "Conv2D"):
        result = net.rewrite(skip_types=frozenset({skipped}))
        assert "Pad" in _ops(result.graph_def), skipped
        net.check_numbers(result)


def test_a_pad_of_the_channels_stays():
    """Structure only: TensorFlow's oneDNN build fails to run this graph unfused (above)."""
    net = Net(lambda x, c: tf.nn.conv2d(tf.pad(x, ((0, 0), (1, 1), (1, 1), (1, 1))),
                                        c(_values(3, 3, 6, 4)), 1, "VALID"), (2, 7, 7, 4))
    result = net.rewrite()
    assert "Pad" in _ops(result.graph_def)
    (conv,) = [n for n in result.graph_def.node if n.op == "Conv2D"]
    assert conv.attr["padding"].s == b"VALID"
