"""The gradient ops: each TF gradient op of the catalog (rewriter/catalog.py, `_GRADIENTS` and
BiasAddGrad) lowers to IR ops that reproduce TensorFlow's CPU kernel operation for operation.

- The catalog's references against TensorFlow's float64 kernels.
- Structure: each gradient op is one kernel with its forward op and the op after it.
- Numbers: fused vs unfused vs float64 under the random-graph error model, in every dtype the op
  allows (test_random_graphs.check_spec); fused vs unfused bit for bit in f32 and f64 on values
  with +-0, +-inf, NaN, subnormals, huge and tiny ones (SoftplusGrad, whose exp is the kernel's
  own, within its ulps instead).
- The Ascend C kernels of their programs, on the CPU twin, against the references.
- BiasAddGrad: one Sum over every axis but the channels; NCHW of rank >= 3 refused, its reason
  stated.
- A Keras training step through the CPU plugin path: its gradient ops fused, losses, gradients
  and weights as unfused.
- Tile of size-1 axes (the gradient of a mean): read broadcast by its readers, as a member or
  read through; the Tiles a program cannot read broadcast refused, each with its reason.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import op_def_registry

import test_random_graphs as rg
import tf_autofuse
from test_codegen import as_float, check, store
from test_plugin import ROOT, python
from tf_autofuse.codegen import generate, twin
from tf_autofuse.rewriter import catalog
from tf_autofuse.rewriter import program as ir

tf1 = tf.compat.v1

GRADIENTS = rg.COMPOSITES  # the catalog's gradient ops but BiasAddGrad (a reduction)
IDS = [e.op_type for e in GRADIENTS]
# the operand that is the forward op's value (the others are the gradient flowing back)
ACTIVATION_INPUTS = ("features", "outputs", "y")


def _input_names(op_type):
    return [arg.name for arg in op_def_registry.get(op_type).input_arg]


def _attrs(entry):
    return {"alpha": float(np.float32(0.3))} if "alpha" in entry.attrs else {}


def _chain_spec(entry, dtype, shape=(61, 67), seed=0) -> rg.GraphSpec:
    """x -> forward op -> gradient op (activation operand: the forward op's value, the other
    operand: dy) -> * 2, fetched."""
    forward = entry.op_type[:-len("Grad")]
    values = [rg.Input(shape), rg.Input(shape),
              rg.Node(forward, catalog.for_tf_op(forward).ir_name, (0,), shape, dtype,
                      _attrs(entry))]
    operands = tuple(2 if name in ACTIVATION_INPUTS else 1 for name in _input_names(entry.op_type))
    values.append(rg.Node(entry.op_type, entry.op_type, operands, shape, dtype, _attrs(entry)))
    values.append(rg.Input((), const=True, value=2))
    values.append(rg.Node("Mul", "Mul", (3, 4), shape, dtype))
    return rg.GraphSpec(dtype, values, fetches=[5], fed=[], seed=seed)


# --- the references -----------------------------------------------------------------------------

_SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 6.0, 0.5, 1e-300, -1e-310, 1e300]


def _values(rng, n, dtype):
    """Normal values, magnitudes over many decades, and 15 % specials (subnormals included)."""
    half = n // 2
    tiny, huge = (-30, 30) if dtype == np.float32 else (-300, 300)
    x = np.concatenate([rng.normal(0, 3, half),
                        10.0 ** rng.uniform(tiny, huge, n - half) * rng.choice([-1, 1], n - half)])
    specials = _SPECIALS + [np.finfo(dtype).tiny / 3, -np.finfo(dtype).max]
    mask = rng.random(n) < 0.15
    x[mask] = rng.choice(specials, int(mask.sum()))
    with np.errstate(over="ignore"):  # beyond float32's range: +-inf
        return x.astype(dtype)


def _tf_op(entry, args, **attrs):
    names = _input_names(entry.op_type)
    return getattr(tf.raw_ops, entry.op_type)(**dict(zip(names, args)), **attrs)


@pytest.mark.parametrize("entry", GRADIENTS, ids=IDS)
def test_reference_is_tensorflows_formula(entry):
    rng = np.random.default_rng(1)
    a, b = _values(rng, 4096, np.float64), _values(rng, 4096, np.float64)
    want = _tf_op(entry, [tf.constant(a), tf.constant(b)], **_attrs(entry)).numpy()
    got = entry.reference(a, b, **_attrs(entry))
    # TensorFlow flushes subnormals (inputs and results) to zero; the reference computes exactly
    normal = np.abs(want) >= np.finfo(np.float64).tiny
    for v in (a, b):
        normal &= (np.abs(v) >= np.finfo(np.float64).tiny) | (v == 0) | ~np.isfinite(v)
    np.testing.assert_array_equal(np.isnan(got[normal]), np.isnan(want[normal]))
    np.testing.assert_allclose(got[normal], want[normal], rtol=1e-12)


def test_bias_add_grad_reference_and_axes():
    x = np.random.default_rng(2).normal(0, 1, (2, 3, 4, 5))
    reference = catalog.tf_op("BiasAddGrad").reference
    for fmt, x_ in (("NHWC", x), ("NCHW", x), ("NCHW", x[0, 0])):
        want = tf.raw_ops.BiasAddGrad(out_backprop=x_, data_format=fmt).numpy()
        np.testing.assert_allclose(reference(x_, data_format=fmt), want, rtol=1e-12)
    assert catalog.bias_grad_axes(4, "NHWC") == (0, 1, 2)
    assert catalog.bias_grad_axes(4, "NCHW") == (0, 2, 3)
    assert catalog.bias_grad_axes(2, "NCHW") == (0,)  # TensorFlow: the channels are last


# --- structure ---------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", GRADIENTS, ids=IDS)
def test_gradient_op_fuses_with_its_neighbours(entry):
    spec = _chain_spec(entry, "f32", shape=(8, 16))
    graph, _, _ = rg.build_graph(spec, rg.make_data(spec))
    fused = tf_autofuse.fuse(graph, outputs=[spec.name(5)])
    (fusion,) = fused.fusions
    assert set(fusion.nodes) == {spec.name(2), spec.name(3), spec.name(5)}
    assert entry.op_type in fusion.op_types and entry.op_type in fusion.name
    assert entry.op_type not in {n.op for n in fused.graph_def.node}
    # the program holds the IR ops of TensorFlow's formula, in its order
    ops = [line.split(" = ")[1].split()[0] for line in fusion.program.splitlines()
           if line.startswith("%")]
    assert tuple(ops[1:-1]) == entry.ir_ops


def test_a_scalar_const_operand_is_an_input_not_an_immediate():
    """SigmoidGrad's y * (1 - y) reads y alone: a Const y would make an instruction of
    immediates only, so the gradient ops read their Const operands as inputs."""
    graph = tf.Graph()
    with graph.as_default():
        dy = tf1.placeholder(tf.float32, [], name="dy")
        y = tf.constant(0.25, name="y")
        tf.multiply(tf.raw_ops.SigmoidGrad(y=y, dy=dy), 2.0, name="out")
    fused = tf_autofuse.fuse(graph, outputs=["out"])
    (fusion,) = fused.fusions
    assert "%0 = Sub 1.0, in0\n" in fusion.program
    np.testing.assert_array_equal(fused.run("out", {"dy": np.float32(3.0)}),
                                  np.float32(3.0 * 0.25 * 0.75 * 2))


# --- numbers -----------------------------------------------------------------------------------


def _dtypes(entry):
    return [d for d in rg.DTYPES if rg.ENUMS[d] in entry.dtypes]


@pytest.mark.parametrize("entry", GRADIENTS, ids=IDS)
def test_fused_unfused_and_float64_agree_in_every_dtype(entry):
    for seed, dtype in enumerate(_dtypes(entry)):
        outcome = rg.check_spec(_chain_spec(entry, dtype, seed=seed))
        assert outcome.fused_kernels == 1, dtype


def _bits_equal(a, b):
    same = a.view(f"u{a.itemsize}") == b.view(f"u{b.itemsize}")
    return same | (np.isnan(a) & np.isnan(b))


def _ulps(a, b, dtype):
    """|a - b| in ulps of dtype at b."""
    with np.errstate(over="ignore"):
        spacing = np.spacing(np.abs(b).astype(dtype)).astype(np.float64)
    return np.abs(a.astype(np.float64) - b) / spacing


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("entry", GRADIENTS, ids=IDS)
def test_fused_is_tensorflows_bits(entry, dtype):
    """Bit for bit TensorFlow's kernel, NaN, +-inf, -0 and flushed subnormals included. 4096
    elements: TensorFlow computes the last (size mod packet size) elements with Eigen's scalar
    form, which associates SigmoidGrad's and SqrtGrad's products differently."""
    rng = np.random.default_rng(3)
    n = 4096
    graph = tf.Graph()
    with graph.as_default():
        args = [tf1.placeholder(dtype, [n], name=f"in{i}") for i in range(2)]
        tf.negative(_tf_op(entry, args, **_attrs(entry)), name="out")
    fused = tf_autofuse.fuse(graph, outputs=["out"])
    assert len(fused.fusions) == 1
    feeds = {f"in{i}": _values(rng, n, dtype) for i in range(2)}
    got = fused.run("out", feeds)
    want = fused.run("out", feeds, original=True)
    if not catalog.is_transcendental(entry.op_type):
        bad = np.flatnonzero(~_bits_equal(got, want))
        assert not bad.size, (bad[:5], got[bad[:5]], want[bad[:5]])
        return
    # the kernel's exp is its own (within 1.02 ulps in f32; Eigen's, TensorFlow's: 1.28)
    reference = -entry.reference(*(feeds[f"in{i}"].astype(np.float64) for i in range(2)))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(reference) & (np.abs(reference) >= np.finfo(dtype).tiny)
    assert (_ulps(got[finite], want[finite], dtype) <= 4).all()
    assert (_ulps(got[finite], reference[finite], dtype)
            <= _ulps(want[finite], reference[finite], dtype) + 2).all()


# --- Ascend -------------------------------------------------------------------------------------


def _program(entry, dtype, n):
    """The program of gradient op -> Neg over two placeholders of n elements."""
    graph = tf.Graph()
    with graph.as_default():
        args = [tf1.placeholder(rg.TF_DTYPES[dtype], [n], name=f"in{i}") for i in range(2)]
        tf.negative(_tf_op(entry, args, **_attrs(entry)), name="out")
    (fusion,) = tf_autofuse.fuse(graph, outputs=["out"]).fusions
    return fusion.program


def test_ascend_kernels_on_the_twin():
    n = 3 * 1280 + 37  # 8 cores, the last one with a tail that is not 32-byte aligned
    cases = [(entry, dtype) for entry in GRADIENTS for dtype in ("f32", "f16", "bf16")]
    kernels = [generate(_program(entry, dtype, n), f"grad_{entry.op_type}_{dtype}")
               for entry, dtype in cases]
    assert all(k.ok for k in kernels), [k.reason for k in kernels if not k.ok]
    lib = twin.build(kernels)
    rng = np.random.default_rng(5)
    for (entry, dtype), kernel in zip(cases, kernels):
        xs = [store(rng.uniform(-3, 3, n), dtype) for _ in range(2)]
        (got,), _ = lib.run(kernel.name, xs, core_num=8)
        want = -entry.reference(*(as_float(x, dtype) for x in xs), **_attrs(entry))
        check(got, want, dtype, f"{entry.op_type} {dtype}")


# --- BiasAddGrad --------------------------------------------------------------------------------


def _bias_grad_graph(shape, data_format):
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, shape, name="x")
        dy = tf1.placeholder(tf.float32, shape, name="dy")
        tf.identity(tf.raw_ops.BiasAddGrad(out_backprop=tf.nn.relu(x) * dy,
                                           data_format=data_format), name="db")
    return graph


@pytest.mark.parametrize("shape,data_format,axes", [((2, 5, 5, 16), "NHWC", "[0,1,2]"),
                                                    ((8, 16), "NHWC", "[0]")])
def test_bias_add_grad_is_one_sum(shape, data_format, axes):
    fused = tf_autofuse.fuse(_bias_grad_graph(shape, data_format), outputs=["db"],
                             passes=["pointwise", "reduce"])
    (fusion,) = fused.fusions
    assert fusion.kind == "reduce" and fusion.op_types[-1] == "BiasAddGrad"
    assert f"= Sum %1 axes={axes}\nout0 = %2 -> [16]\n" in fusion.program
    rng = np.random.default_rng(4)
    feeds = {k: rng.normal(0, 1, shape).astype(np.float32) for k in ("x", "dy")}
    got, want = fused.run("db", feeds), fused.run("db", feeds, original=True)
    reference = catalog.tf_op("BiasAddGrad").reference(
        np.maximum(feeds["x"], 0).astype(np.float64) * feeds["dy"], data_format=data_format)
    assert got.shape == want.shape == (16,)
    # the kernel sums in f64: at least as close to the float64 sum as TensorFlow's f32 sum
    assert np.all(np.abs(got - reference) <= np.abs(want - reference) + 1e-6)


def test_bias_add_grad_refusals_say_why():
    fused = tf_autofuse.fuse(_bias_grad_graph((2, 16, 5, 5), "NCHW"), outputs=["db"],
                             passes=["pointwise", "reduce"])
    assert fused.fusions and all("BiasAddGrad" not in f.op_types for f in fused.fusions)
    assert ("BiasAddGrad", "BiasAddGrad NCHW sums axes [0, 2, 3], on both sides of the "
            "channels; a fused program reduces one run of consecutive axes") in fused.refusals
    fused = tf_autofuse.fuse(_bias_grad_graph((4, 16), "NHWC"), outputs=["db"])
    assert ("BiasAddGrad", "the reduce pass is off (--autofuse_enable_pass=reduce turns it on)"
            ) in fused.refusals


# --- a training step ----------------------------------------------------------------------------


def _train_step(tmp_path, model: str) -> tuple:
    """tests/scripts/train_step.py MODEL run fused (with the reduce pass) and unfused, each in a
    fresh process: (fused report, unfused report, fused arrays, unfused arrays)."""
    script = ROOT / "tests/scripts/train_step.py"
    on = json.loads(python([script, tmp_path / "on.npz", model],
                           "--enable_autofuse=true;--autofuse_enable_pass=reduce",
                           tmp_path).splitlines()[-1])
    off = json.loads(python([script, tmp_path / "off.npz", model], None,
                            tmp_path).splitlines()[-1])
    return on, off, np.load(tmp_path / "on.npz"), np.load(tmp_path / "off.npz")


def test_keras_training_step_fuses_its_gradient_ops(tmp_path):
    on, off, fused, unfused = _train_step(tmp_path, "dense")
    gradient_ops = {op for op in off["ops"]
                    if catalog.tf_op(op) is not None and catalog.tf_op(op).reference is not None}
    # Keras' relu, sigmoid, tanh, elu and selu layers and their biases (its softplus'
    # gradient is TensorFlow's grad * sigmoid(x), no SoftplusGrad)
    assert len(gradient_ops) >= 6 and "BiasAddGrad" in gradient_ops, gradient_ops
    assert off["kernels"] == []
    assert not gradient_ops & set(on["ops"]), on["ops"]
    for op in gradient_ops:
        assert any(f"_{op}_" in name for name in on["kernels"]), (op, on["kernels"])
    for key in ("losses", "gradients", "weights"):
        np.testing.assert_allclose(fused[key], unfused[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_keras_batch_norm_training_step_leaves_no_gradient_plumbing(tmp_path):
    """Keras BatchNormalization's backward: the gradients of the batch mean and variance come
    back into dx through Tiles of reduced values and RsqrtGrad, which greedy merging alone left
    out (each merge closed a cycle through the other); the partitioner's second round takes
    them. The steps' numbers are the unfused run's."""
    on, off, fused, unfused = _train_step(tmp_path, "conv_bn")
    assert {"Tile", "RsqrtGrad", "ReluGrad"} <= set(off["ops"]), off["ops"]
    # (what stays: the optimizer's int64 step count AddV2, the pooling's Mean and the Tile and
    # scaling of its gradient, which has no reduction of the same axes to join)
    assert not {"RsqrtGrad", "ReluGrad", "Sub", "AddN", "Sum"} & set(on["ops"]), on["ops"]
    tiled = [k for k in on["kernels"] if "_Tile_" in k and "_RsqrtGrad" not in k]
    assert len(tiled) == 2, on["kernels"]  # each BatchNormalization's dx: one kernel
    for key in ("losses", "gradients", "weights"):
        np.testing.assert_allclose(fused[key], unfused[key], rtol=1e-4, atol=1e-5, err_msg=key)


def test_a_small_conv_net_trains_as_tensorflow_does(tmp_path):
    """10 steps of SGD with momentum of a conv net with BatchNormalization and swish: the loss
    curve is TensorFlow's to 5 digits, and the optimizer's writes are carried out by fused
    kernels (AutofuseAssignKernel): no AssignAddVariableOp is left."""
    on, off, fused, unfused = _train_step(tmp_path, "conv_swish")
    assert "AssignAddVariableOp" in off["ops"] and "AssignAddVariableOp" not in on["ops"]
    assert "AutofuseAssignKernel" in on["ops"], on["ops"]
    assert len(fused["losses"]) == 10 and fused["losses"][-1] < fused["losses"][0]
    np.testing.assert_allclose(fused["losses"], unfused["losses"], rtol=1e-5)
    np.testing.assert_allclose(fused["weights"], unfused["weights"], rtol=1e-4, atol=1e-5)


# --- Tile of size-1 axes: a broadcast ------------------------------------------------------------


def _mean_grad_graph():
    """The gradient of a mean over an axis: Reshape, Tile of the size-1 axis, / n, then the
    gradients of x * x."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [64, 8], name="x")
        w = tf1.placeholder(tf.float32, [64], name="w")
        loss = tf.reduce_sum(tf.reduce_mean(x * x, axis=1) * w)
        tf.identity(tf1.gradients(loss, [x])[0], name="gx")
    return graph


def test_the_tile_of_a_mean_gradient_is_read_broadcast():
    graph = _mean_grad_graph()
    tiles = {n.name for n in graph.as_graph_def().node if n.op == "Tile"}
    fused = tf_autofuse.fuse(graph, outputs=["gx"])
    assert any(tiles & (set(f.nodes) | set(f.absorbed)) for f in fused.fusions), fused.report()
    assert not tiles & {n.name for n in fused.graph_def.node}
    rng = np.random.default_rng(6)
    feeds = {"x": rng.normal(0, 1, (64, 8)).astype(np.float32),
             "w": rng.normal(0, 1, 64).astype(np.float32)}
    np.testing.assert_array_equal(fused.run("gx", feeds), fused.run("gx", feeds, original=True))
    # and through Grappler: the session runs no Tile
    spec_feeds = {graph.get_tensor_by_name(f"{k}:0"): v for k, v in feeds.items()}
    gx = graph.get_tensor_by_name("gx:0")
    (want,), _ = rg.run_session(graph, [gx], spec_feeds, fuse=False)
    (got,), executed = rg.run_session(graph, [gx], spec_feeds, fuse=True)
    assert "Tile" not in executed.values() and "AutofuseKernel" in executed.values()
    np.testing.assert_array_equal(got, want)


def test_a_tile_member_is_its_operand_broadcast():
    graph = tf.Graph()
    with graph.as_default():
        a = tf1.placeholder(tf.float32, [5, 1], name="a")
        b = tf1.placeholder(tf.float32, [5, 3], name="b")
        t = tf.tile(a, [1, 3], name="t")
        tf.add(t, b, name="s")
    fused = tf_autofuse.fuse(graph, outputs=["t", "s"])
    (fusion,) = fused.fusions
    assert fusion.op_types == ("Tile", "AddV2")
    assert fusion.program == ("in0: f32[5,1]\nin1: f32[5,3]\n%0 = Add in0, in1\nout0 = in0\n"
                              "out1 = %0\n")
    rng = np.random.default_rng(7)
    feeds = {"a": rng.normal(0, 1, (5, 1)).astype(np.float32),
             "b": rng.normal(0, 1, (5, 3)).astype(np.float32)}
    for name in ("t", "s"):
        np.testing.assert_array_equal(fused.run(name, feeds), fused.run(name, feeds,
                                                                        original=True))
    # and its Ascend kernel on the twin: out0 = in0 stores the input broadcast
    kernel = generate(fusion.program, "tile_member")
    assert kernel.ok, kernel.reason
    (t, s), _ = twin.build([kernel]).run(kernel.name, [feeds["a"], feeds["b"]], core_num=2)
    np.testing.assert_array_equal(t.reshape(5, 3), np.broadcast_to(feeds["a"], (5, 3)))
    np.testing.assert_array_equal(s.reshape(5, 3), feeds["a"] + feeds["b"])


def test_tile_refusals_say_why():
    graph = tf.Graph()
    with graph.as_default():
        b = tf1.placeholder(tf.float32, [5, 3], name="b")
        tf.negative(tf.tile(b, [2, 1], name="t"), name="n")
        a = tf1.placeholder(tf.float32, [5, 1], name="a")
        tf.reduce_sum(tf.tile(tf.exp(a), [1, 3], name="t2") * 2.0, axis=[0], name="sum")
        tf.reduce_sum(tf.tile(a, [1, 3], name="t3"), axis=[1], name="sum3")
    fused = tf_autofuse.fuse(graph, outputs=["n", "sum", "sum3"], passes=["pointwise", "reduce"])
    reasons = dict(fused.refusals)
    assert reasons["t"] == ("Tile repeats axis 0 of size 5 2 times: only repeated size-1 axes "
                            "are a broadcast, which is what a fused program reads")
    # a Tile gives no size: its readers need another input of the tiled shape
    assert reasons["t2"].endswith("not the iteration shape [5,1]; a Tile's repeats give the "
                                  "program no size: its inputs' broadcast does")
    assert "sum3 reduces t3, a Tile the program does not compute" in reasons["sum3"]


def test_a_program_with_reductions_reads_a_tile_as_it_is():
    """x - mean(x) for x a Tile: read broadcast, x would make x - mean(x) a reduced value (one
    element a row), where TensorFlow's has the Tile's shape (the fuzz's seed 4242, graph 162)."""
    graph = tf.Graph()
    with graph.as_default():
        a = tf1.placeholder(tf.float32, [4, 1], name="a")
        x = tf1.placeholder(tf.float32, [4, 7], name="x")
        t = tf.tile(a, [1, 7], name="t")
        tf.add(t - tf.reduce_mean(t, axis=[1], keepdims=True), x, name="out")
    fused = tf_autofuse.fuse(graph, outputs=["out"], passes=["pointwise", "reduce"])
    assert fused.fusions and not any("t" in f.absorbed for f in fused.fusions)
    rng = np.random.default_rng(9)
    feeds = {"a": rng.normal(0, 1, (4, 1)).astype(np.float32),
             "x": rng.normal(0, 1, (4, 7)).astype(np.float32)}
    got = fused.run("out", feeds)
    assert got.shape == (4, 7)
    np.testing.assert_allclose(got, fused.run("out", feeds, original=True), atol=1e-6)


@pytest.mark.parametrize("scaled", [True, False])
def test_a_program_with_reductions_reads_a_tile_broadcast_along_kept_axes(scaled):
    """The gradient of a global average pool, as ResNet's training step has it before a
    BatchNormalization's backward: dy [4,8] -> [4,1,1,8], tiled over the 3x3 pixels, / 9, times
    the ReluGrad mask, then sums over [0,1,2]. The Tile's operand is not 1 along the reduced
    batch axis, so it is no reduced value: the program reads it broadcast (sums included, which
    count each element as often as the Tile repeats it) and the Tile goes."""
    graph = tf.Graph()
    with graph.as_default():
        dy = tf1.placeholder(tf.float32, [4, 8], name="dy")
        x = tf1.placeholder(tf.float32, [4, 3, 3, 8], name="x")
        t = tf.tile(tf.reshape(dy, [4, 1, 1, 8]), [1, 3, 3, 1], name="t")
        g = tf.raw_ops.ReluGrad(gradients=t / 9.0 if scaled else t, features=x, name="g")
        tf.identity(tf.reduce_sum(g * x, axis=[0, 1, 2]), name="dscale")
        tf.identity(g - tf.reduce_sum(g, axis=[0, 1, 2]) / 36.0, name="dx")
    fused = tf_autofuse.fuse(graph, outputs=["dscale", "dx"], passes=["pointwise", "reduce"])
    assert "t" not in {n.name for n in fused.graph_def.node}, fused.report()
    assert any("t" in set(f.nodes) | set(f.absorbed) for f in fused.fusions)
    rng = np.random.default_rng(10)
    feeds = {"dy": rng.normal(0, 1, (4, 8)).astype(np.float32),
             "x": rng.normal(0, 1, (4, 3, 3, 8)).astype(np.float32)}
    for name in ("dscale", "dx"):
        got, want = fused.run(name, feeds), fused.run(name, feeds, original=True)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_reduction_never_reads_a_tile_broadcast():
    """The Tile's reader is a Sum: it reduces the Tile's output, never its operand broadcast
    (which would sum 1 element where the Tile has 3)."""
    graph = tf.Graph()
    with graph.as_default():
        a = tf1.placeholder(tf.float32, [5, 1], name="a")
        x = tf1.placeholder(tf.float32, [5, 3], name="x")
        total = tf.reduce_sum(tf.tile(a, [1, 3], name="t"), axis=[1], keepdims=True)
        tf.add(total, x, name="out")
    fused = tf_autofuse.fuse(graph, outputs=["out"], passes=["pointwise", "reduce"])
    assert fused.fusions and "t" in {n.name for n in fused.graph_def.node}
    rng = np.random.default_rng(8)
    feeds = {"a": rng.normal(0, 1, (5, 1)).astype(np.float32),
             "x": rng.normal(0, 1, (5, 3)).astype(np.float32)}
    np.testing.assert_allclose(fused.run("out", feeds), fused.run("out", feeds, original=True),
                               rtol=1e-6)


# --- a layer norm's gradient ---------------------------------------------------------------------


def _dense_norm_loss_graph(dtype, rows=1024, width=128, hidden=512):
    """A Dense layer's output plus a residual, layer-normalised as Keras does (rsqrt(var + eps)
    then x * inv + (beta - mean * inv)), a mean squared error, and the gradients of the weights
    and of the normalised value."""
    graph = tf.Graph()
    with graph.as_default():
        h = tf1.placeholder(dtype, [rows, hidden], name="h")
        w = tf1.placeholder(dtype, [hidden, width], name="w")
        residual = tf1.placeholder(dtype, [rows, width], name="residual")
        target = tf1.placeholder(dtype, [rows, width], name="target")
        x = tf.matmul(h, w) + residual
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        inv = tf.math.rsqrt(variance + 1e-6) * tf.ones([width], dtype)
        y = x * inv + (tf.zeros([width], dtype) - mean * inv)
        loss = tf.reduce_mean(tf.square(y - target))
        gw, gx = tf1.gradients(loss, [w, x])
        tf.identity(gw, name="gw")
        tf.identity(gx, name="gx")
    return graph


def test_a_layer_norm_gradient_is_no_less_accurate_than_tensorflows():
    """The weight gradient of a Dense layer before a layer norm sums over the rows terms that
    cancel only when scale^2 * (var + eps) = 1. All but 4 of the 1024 rows have their variance
    in [1, 2), where adding eps = 1e-6 in fp32 rounds each down by the same 0.39 ulp: an error of
    one sign in the rows' scales, which does not average out over the rows. The fused kernel
    computes rsqrt(var + eps) of the exact sum, rounded once (passes.widen), and its gradients
    are closer to float64 than TensorFlow's."""
    rng = np.random.default_rng(0)
    rows, width, hidden = 1024, 128, 512
    feeds = {"h": np.maximum(rng.normal(0, 1, (rows, hidden)), -0.17),
             "w": rng.normal(0, hidden ** -0.5, (hidden, width)),
             "residual": rng.normal(0, 1, (rows, width)),
             "target": rng.uniform(-0.1, 0.1, (rows, width))}
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    fused = tf_autofuse.fuse(_dense_norm_loss_graph(tf.float32), outputs=["gw", "gx"],
                             passes=["pointwise", "reduce"])
    # structure: the norm's scale is computed in a reduction kernel, in f64 from the variance
    (norm,) = [f for f in fused.fusions if "Rsqrt" in f.op_types]
    assert norm.name.startswith("autofuse_reduce_")
    program = ir.parse(norm.program)
    (rsqrt,) = [i for i, inst in enumerate(program.instructions) if inst.op == "Rsqrt"]
    assert program.value_dtypes()[rsqrt] == "f64"
    assert "Rsqrt" not in {n.op for n in fused.graph_def.node}
    with tf.compat.v1.Session(graph=_dense_norm_loss_graph(tf.float64)) as session:
        exact = session.run(["gw:0", "gx:0"], {f"{k}:0": v.astype(np.float64)
                                               for k, v in feeds.items()})
    got = fused.run(["gw", "gx"], feeds)
    tf_got = fused.run(["gw", "gx"], feeds, original=True)

    def error(values):
        return [np.linalg.norm(v.astype(np.float64) - e) / np.linalg.norm(e)
                for v, e in zip(values, exact)]

    (fused_gw, fused_gx), (tf_gw, tf_gx) = error(got), error(tf_got)
    assert fused_gw <= tf_gw and fused_gx <= tf_gx, (fused_gw, tf_gw, fused_gx, tf_gx)
