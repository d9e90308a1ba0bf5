"""Einsum and BatchMatMulV2 that are one matrix multiplication (rewriter/einsum.py) take their
bias and activation as a `_FusedMatMul` between Reshapes (rewriter/epilogue.py): the rewritten
graph's structure, its numbers against the unfused graph and float64, the refusals and their
reasons, and Keras' MultiHeadAttention run through the plugin."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_autofuse
from tf_autofuse import rewriter
from tf_autofuse.fuser import static_shapes
from tf_autofuse.rewriter import epilogue

from test_epilogue import Net, _fused_ops, _node, _ops, _values

tf1 = tf.compat.v1

pytestmark = pytest.mark.skipif(not tf_autofuse.is_available(),
                                reason="tf_autofuse's kernel library is not available")


def _product(result):
    """The one _FusedMatMul of the rewrite, the Reshape of its left operand and the Reshape
    after it (named as the chain's last node)."""
    (done,) = result.epilogues
    fused = _node(result.graph_def, done.name)
    assert fused.op == "_FusedMatMul" and done.op == "_FusedMatMul"
    (after,) = [n for n in result.graph_def.node if n.input and n.input[0] == fused.name]
    rows = _node(result.graph_def, fused.input[0])
    return fused, rows, after


def _shape_of(graph_def, reshape):
    return tuple(tf.make_ndarray(_node(graph_def, reshape.input[1]).attr["value"].tensor))


def test_query_projection_abc_cde_abde_takes_its_bias():
    # EinsumDense of MultiHeadAttention's query/key/value: [B,T,C] x [C,H,D] + [H,D]
    def build(x, c):
        y = tf.einsum("abc,cde->abde", x, c(_values(6, 3, 4)))
        return y + c(_values(3, 4))

    net = Net(build, (2, 5, 6))
    result = net.rewrite()
    fused, rows, after = _product(result)
    assert _fused_ops(fused) == ["BiasAdd"]
    assert not fused.attr["transpose_a"].b and not fused.attr["transpose_b"].b
    assert rows.op == "Reshape" and rows.input[0] == "x"
    assert _shape_of(result.graph_def, rows) == (-1, 6)
    assert after.op == "Reshape" and after.name == result.epilogues[0].nodes[-1]
    assert _shape_of(result.graph_def, after) == (2, 5, 3, 4)
    assert "Einsum" not in _ops(result.graph_def) and "AddV2" not in _ops(result.graph_def)
    assert result.epilogues[0].nodes == ("einsum/Einsum", "add")
    net.check_numbers(result)


def test_output_projection_abcd_cde_abe_takes_its_bias():
    # EinsumDense of MultiHeadAttention's output: [B,T,H,D] x [H,D,E] + [E]
    def build(x, c):
        return tf.einsum("abcd,cde->abe", x, c(_values(3, 4, 5))) + c(_values(5))

    net = Net(build, (2, 7, 3, 4))
    result = net.rewrite()
    fused, rows, after = _product(result)
    assert _fused_ops(fused) == ["BiasAdd"]
    assert _shape_of(result.graph_def, rows) == (-1, 12)
    assert _shape_of(result.graph_def, after) == (2, 7, 5)
    matrix = _node(result.graph_def, fused.input[1])  # the [H,D,E] kernel read as [12, 5]
    assert matrix.op == "Reshape" and _shape_of(result.graph_def, matrix) == (12, 5)
    assert "Einsum" not in _ops(result.graph_def)
    net.check_numbers(result)


@pytest.mark.parametrize("activation", ["Relu", "GeluExact"])
def test_abc_cd_abd_with_bias_and_activation(activation):
    act = {"Relu": tf.nn.relu, "GeluExact": lambda v: tf.nn.gelu(v, approximate=False)}
    net = Net(lambda x, c: act[activation](tf.einsum("abc,cd->abd", x, c(_values(6, 5)))
                                           + c(_values(5))), (3, 4, 6))
    result = net.rewrite()
    if activation not in epilogue.accepts("matmul"):
        assert any(f"with {activation}:" in r.reason for r in result.refusals)
        return
    fused, rows, after = _product(result)
    assert _fused_ops(fused) == ["BiasAdd", activation]
    assert fused.input[1] == "Const"  # already a [K, N] matrix: read as it is
    assert _shape_of(result.graph_def, after) == (3, 4, 5)
    assert _ops(result.graph_def) == ["Reshape", "Reshape", "_FusedMatMul"]
    net.check_numbers(result)


def test_a_transposed_right_operand_abc_dc_abd():
    net = Net(lambda x, c: tf.nn.relu(tf.einsum("abc,dc->abd", x, c(_values(5, 6)))
                                      + c(_values(5))), (2, 3, 6))
    result = net.rewrite()
    fused, _, _ = _product(result)
    assert fused.attr["transpose_b"].b
    net.check_numbers(result)


def test_batch_matmul_with_a_matrix_on_the_right():
    # Keras 3 writes Dense / EinsumDense on [B,T,C] as BatchMatMulV2 [B,T,C] x [C,N]
    net = Net(lambda x, c: tf.nn.bias_add(tf.linalg.matmul(x, c(_values(6, 8))), c(_values(8))),
              (2, 5, 6))
    graph = net.graphs[tf.float32].as_graph_def()
    assert "BatchMatMulV2" in _ops(graph)
    result = net.rewrite()
    fused, rows, after = _product(result)
    assert _fused_ops(fused) == ["BiasAdd"]
    assert _shape_of(result.graph_def, rows) == (-1, 6)
    assert _shape_of(result.graph_def, after) == (2, 5, 8)
    assert "BatchMatMulV2" not in _ops(result.graph_def)
    net.check_numbers(result)


def test_keras_einsum_dense_form_batch_matmul_reshape_bias_over_two_axes():
    # what Keras 3 emits for "abc,cde->abde": BatchMatMulV2 with the kernel as [C, H*D], a
    # Reshape to [B,T,H,D], the [H,D] bias added
    def build(x, c):
        kernel = tf.reshape(c(_values(6, 2, 4)), [6, 8])
        y = tf.reshape(tf.linalg.matmul(x, kernel), [3, 5, 2, 4])
        return c(_values(2, 4)) + y

    net = Net(build, (3, 5, 6))
    result = net.rewrite()
    fused, _, after = _product(result)
    assert _fused_ops(fused) == ["BiasAdd"]
    bias = _node(result.graph_def, fused.input[2])
    assert bias.op == "Reshape"  # the [H,D] bias read as [H*D]
    assert _shape_of(result.graph_def, after) == (3, 5, 2, 4)
    assert "BatchMatMulV2" not in _ops(result.graph_def)
    net.check_numbers(result)


def test_a_matrix_on_the_left_is_read_as_it_is():
    net = Net(lambda x, c: tf.nn.relu(tf.einsum("ab,bc->ac", x, c(_values(6, 4)))
                                      + c(_values(4))), (5, 6))
    result = net.rewrite()
    fused, _, after = _product(result)
    assert fused.input[0] == "x" and _shape_of(result.graph_def, after) == (5, 4)
    net.check_numbers(result)


def test_a_fed_reshape_before_the_product_is_read_not_read_through():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [2, 3, 4], name="x")
        rows = tf.reshape(x, [2, 2, 6], name="rows")
        y = tf.einsum("abc,cd->abd", rows, tf.constant(_values(6, 5), tf.float32))
        tf.identity(y + tf.constant(_values(5), tf.float32), name="out")
    graph_def = g.as_graph_def()
    result = rewriter.rewrite(graph_def, preserve=["out", "x"], feeds=["x", "rows"],
                              shapes=static_shapes(graph_def, g))
    fused, left, _ = _product(result)
    assert left.op == "Reshape" and left.input[0] == "rows"
    runs = _run_both(graph_def, result, {"x:0": np.zeros((2, 3, 4), np.float32),
                                         "rows:0": _values(2, 2, 6).astype(np.float32)})
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-6, atol=1e-6)


def _run_both(graph_def, result, feeds: dict) -> list:
    """"out:0" of the original graph and of the rewritten one, fed `feeds`."""
    runs = []
    for graph in (graph_def, result.graph_def):
        with tf.Graph().as_default() as run_graph:
            tf1.import_graph_def(graph, name="")
        with tf1.Session(graph=run_graph) as session:
            runs.append(session.run("out:0", feeds))
    return runs


def test_products_of_one_input_share_its_row_view():
    def build(x, c):
        q = tf.einsum("abc,cde->abde", x, c(_values(6, 2, 3))) + c(_values(2, 3))
        k = tf.einsum("abc,cde->abde", x, c(_values(6, 2, 3))) + c(_values(2, 3))
        return q * k

    net = Net(build, (2, 4, 6))
    result = net.rewrite()
    assert [e.op for e in result.epilogues] == ["_FusedMatMul"] * 2
    lefts = {_node(result.graph_def, e.name).input[0] for e in result.epilogues}
    assert len(lefts) == 1
    net.check_numbers(result)


def test_an_unknown_batch_size_is_the_reshape_s_one_unknown_size():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, 5, 6], name="x")
        y = tf.einsum("abc,cde->abde", x, tf.constant(_values(6, 3, 4), tf.float32))
        tf.identity(y + tf.constant(_values(3, 4), tf.float32), name="out")
    graph_def = g.as_graph_def()
    result = rewriter.rewrite(graph_def, preserve=["out", "x"], feeds=["x"],
                              shapes=static_shapes(graph_def, g))
    fused, rows, after = _product(result)
    assert _shape_of(result.graph_def, after) == (-1, 5, 3, 4)
    runs = _run_both(graph_def, result, {"x:0": _values(3, 5, 6).astype(np.float32)})
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-6, atol=1e-6)


def test_two_unknown_sizes_are_refused():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, None, 6], name="x")
        y = tf.einsum("abc,cde->abde", x, tf.constant(_values(6, 3, 4), tf.float32))
        tf.identity(y + tf.constant(_values(3, 4), tf.float32), name="out")
    graph_def = g.as_graph_def()
    result = rewriter.rewrite(graph_def, preserve=["out", "x"], feeds=["x"],
                              shapes=static_shapes(graph_def, g))
    assert _refusal(result, "Einsum") == (
        "Einsum epilogue: its output shape [?,?,3,4] is not static but for one size (the "
        "Reshape after the fused MatMul needs it)")


def test_the_pass_over_its_own_output_changes_nothing():
    net = Net(lambda x, c: tf.nn.relu(tf.einsum("abc,cde->abde", x, c(_values(6, 3, 4)))
                                      + c(_values(3, 4))), (2, 5, 6))
    once = net.rewrite().graph_def
    twice = rewriter.rewrite(once, preserve=["out", "x"], feeds=["x"],
                             shapes=static_shapes(once)).graph_def
    assert twice.SerializeToString(deterministic=True) == once.SerializeToString(
        deterministic=True)


def test_a_scale_folds_into_the_einsum_kernel_read_as_a_matrix():
    def build(x, c):
        y = tf.einsum("abc,cde->abde", x, c(_values(3, 2, 2)))
        return tf.nn.relu(y * c(_values(2, 2, low=0.5)) + c(_values(2, 2)))

    net = Net(build, (4, 16, 3))
    result = net.rewrite(epilogue_scale=True)
    fused, _, after = _product(result)
    assert _fused_ops(fused) == ["BiasAdd", "Relu"]
    assert _shape_of(result.graph_def, after) == (4, 16, 2, 2)
    net.check_numbers(result)
    assert "scale" in _refusal(net.rewrite(epilogue_scale=False), "Einsum")


# --- refusals ---------------------------------------------------------------------------------


def _refusal(result, op):
    reasons = [r.reason for r in result.refusals if r.reason.startswith(f"{op} epilogue")]
    assert not result.epilogues and len(reasons) == 1, (result.epilogues, reasons)
    return reasons[0]


def test_shared_batch_axes_are_refused():
    net = Net(lambda x, c: tf.einsum("abc,acd->abd", x, c(_values(2, 6, 5))) + c(_values(5)),
              (2, 3, 6))
    result = net.rewrite()
    assert "shares batch axes a between the operands" in _refusal(result, "Einsum")
    assert "Einsum" in _ops(result.graph_def)
    net.check_numbers(result)


def test_a_batch_matmul_with_batches_on_the_right_is_refused():
    net = Net(lambda x, c: tf.linalg.matmul(x, c(_values(2, 6, 5))) + c(_values(5)), (2, 3, 6))
    result = net.rewrite()
    assert "has batch axes" in _refusal(result, "BatchMatMulV2")
    net.check_numbers(result)


def test_a_bias_not_over_all_trailing_output_axes_is_refused():
    # [D] over [B,T,H,D]: one value per D, not per (H, D) column of the product
    net = Net(lambda x, c: tf.einsum("abc,cde->abde", x, c(_values(6, 3, 4))) + c(_values(4)),
              (2, 5, 6))
    result = net.rewrite()
    assert _refusal(result, "Einsum") == (
        "Einsum epilogue: the AddV2 of a [4] operand to its [2,5,3,4] output is not one value "
        "per output channel [3,4]: not a bias of the fused kernel")
    assert "Einsum" in _ops(result.graph_def)
    net.check_numbers(result)
    # over the leading output axes: a value per row, not per column
    net = Net(lambda x, c: tf.einsum("abc,cd->abd", x, c(_values(6, 4)))
              + c(_values(2, 5, 1)), (2, 5, 6))
    result = net.rewrite()
    assert "[2,5,1] operand to its [2,5,4] output" in _refusal(result, "Einsum")
    assert "Einsum" in _ops(result.graph_def)
    net.check_numbers(result)


def test_float64_is_refused_with_its_reason():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float64, [2, 3, 6], name="x")
        y = tf.einsum("abc,cd->abd", x, tf.constant(_values(6, 4)))
        tf.identity(y + tf.constant(_values(4)), name="out")
    graph_def = g.as_graph_def()
    result = rewriter.rewrite(graph_def, preserve=["out", "x"], feeds=["x"],
                              shapes=static_shapes(graph_def, g))
    assert _refusal(result, "Einsum") == "Einsum epilogue: only float32 operators take one"


def test_an_einsum_without_an_epilogue_is_not_a_refusal():
    # the attention scores, a batch of products, followed by a scalar scale: nothing to take
    net = Net(lambda x, c: tf.einsum("abcd,aecd->acbe", x, x) * 0.5, (1, 3, 2, 4))
    result = net.rewrite()
    assert not result.epilogues
    assert not [r for r in result.refusals if "epilogue" in r.reason]


# --- Keras MultiHeadAttention through the CPU plugin ------------------------------------------


def test_keras_multi_head_attention_runs_its_projections_as_fused_matmuls(tmp_path):
    """In a fresh process (AUTOFUSE_FLAGS is read at import): the query, key, value and output
    projections and the Dense after them are _FusedMatMul nodes once Grappler's own passes
    (the remapper among them) have run after ours, oneDNN runs them as its fused MatMul kernel,
    and the output is unfused TensorFlow's within float32 tolerance, no further from float64."""
    import json

    from test_plugin import ROOT, python

    out = tmp_path / "attention.npz"
    stdout = python([ROOT / "tests/scripts/attention.py", out],
                    "--enable_autofuse=true;--autofuse_enable_pass=reduce", tmp_path)
    report = json.loads(stdout.splitlines()[-1])
    unfused, fused = report["unfused"], report["fused"]
    assert not unfused["fused_matmuls"] and unfused["kernels"]["BatchMatMulV2"] == 4
    names = {name.split("/")[-2]: ops for name, ops in fused["fused_matmuls"]}
    assert names == {"query_1": ["BiasAdd"], "key_1": ["BiasAdd"], "value_1": ["BiasAdd"],
                     "attention_output_1": ["BiasAdd"], "Tensordot": ["BiasAdd", "Relu"]}
    assert "BatchMatMulV2" not in fused["kernels"] and "AddV2" not in fused["kernels"]
    assert fused["kernels"]["Einsum"] == 2  # the attention's own batches of products
    kernel = "_MklNativeFusedMatMul" if epilogue.onednn() else "_FusedMatMul"
    assert fused["executed"].count(kernel) == 5
    outputs = np.load(out)
    exact = outputs["f64"]
    scale = np.max(np.abs(exact))
    np.testing.assert_allclose(outputs["fused"], outputs["unfused"], rtol=1e-5,
                               atol=1e-6 * scale)
    unfused_error = np.max(np.abs(outputs["unfused"] - exact)) / scale
    fused_error = np.max(np.abs(outputs["fused"] - exact)) / scale
    assert fused_error <= 2 * unfused_error + 4 * np.finfo(np.float32).eps


# --- the equation analysis against numpy -------------------------------------------------------


def _random_equation(rng):
    """Labels of each role (rows, contracted, columns, batch, summed on one side), each operand's
    and the output's in a random order or in the one-MatMul order."""
    letters = iter("abcdefghij")
    take = lambda n: [next(letters) for _ in range(n)]  # noqa: E731
    rows, contracted, columns = take(rng.integers(0, 3)), take(rng.integers(1, 3)), take(
        rng.integers(0, 3))
    batch, summed = take(rng.integers(0, 2) * (rng.random() < 0.3)), take(
        rng.integers(0, 2) * (rng.random() < 0.2))
    left = batch + rows + summed + contracted
    right = batch + (columns + contracted if rng.random() < 0.3 else contracted + columns)
    out = batch + rows + columns
    for labels in (left, right, out):
        if rng.random() < 0.3:
            rng.shuffle(labels)
    sizes = {c: int(rng.integers(2, 5)) for c in "abcdefghij"}
    eq = f"{''.join(left)},{''.join(right)}->{''.join(out)}"
    return eq, [sizes[c] for c in left], [sizes[c] for c in right]


@pytest.mark.parametrize("seed", range(200))
def test_an_equation_taken_as_one_matmul_computes_the_einsum(seed):
    from tf_autofuse.rewriter import einsum

    rng = np.random.default_rng(seed)
    eq, left_shape, right_shape = _random_equation(rng)
    found, reason = einsum._einsum(eq, tuple(left_shape), tuple(right_shape))
    a, b = rng.standard_normal(left_shape), rng.standard_normal(right_shape)
    expected = np.einsum(eq, a, b)
    if found is None:
        assert reason and eq in reason
        return
    matrix = b.reshape(found.n, found.k).T if found.transpose_b else b.reshape(found.k, found.n)
    got = (a.reshape(-1, found.k) @ matrix).reshape(expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert found.rows + found.columns == expected.shape


@pytest.mark.parametrize("eq", ["abc,cde->abde", "abcd,cde->abe", "abc,cd->abd", "abc,dc->abd",
                                "ab,bc->ac", "abcd,ecd->abe", "c,cd->d"])
def test_the_one_matmul_forms_are_found(eq):
    from tf_autofuse.rewriter import einsum

    sizes = dict(zip("abcde", (2, 3, 4, 5, 6)))
    left, right = (tuple(sizes[c] for c in part) for part in eq.split("->")[0].split(","))
    found, reason = einsum._einsum(eq, left, right)
    assert found is not None, reason
