"""A Reshape of a Sum over leading axes is read as the Sum of a Reshape (rewriter/
reshaped_sums.py), so that the gradient of a broadcast operand (Keras' EinsumDense kernel:
Reshape(Sum(BatchMatMulV2, [0]), [128,4,32])) joins the elementwise ops that read it."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_autofuse

tf1 = tf.compat.v1


def _graph(axes=(0,), produce="matmul"):
    """y = Reshape(Sum(x, axes), [8,3,4] or [4,3,4]) * m + 1, x [4,8,12] from a BatchMatMulV2
    (or an Exp, which is fused)."""
    graph = tf.Graph()
    with graph.as_default():
        a = tf1.placeholder(tf.float32, (4, 8, 6), name="a")
        b = tf1.placeholder(tf.float32, (6, 12), name="b")
        target = (8, 3, 4) if axes == (0,) else (4, 3, 4)
        m = tf1.placeholder(tf.float32, target, name="m")
        x = tf.raw_ops.BatchMatMulV2(x=a, y=b, name="x") if produce == "matmul" else \
            tf.exp(tf1.placeholder(tf.float32, (4, 8, 12), name="e"), name="x")
        total = tf.reduce_sum(x, axis=list(axes), name="total")
        r = tf.reshape(total, target, name="r")
        tf.identity(r * m + 1.0, name="y")
    return graph


def _feeds(produce="matmul", axes=(0,)):
    rng = np.random.default_rng(7)
    feeds = {"a": rng.normal(0, 1, (4, 8, 6)), "b": rng.normal(0, 1, (6, 12)),
             "m": rng.normal(0, 1, (8, 3, 4) if axes == (0,) else (4, 3, 4))}
    if produce != "matmul":
        feeds = {"e": rng.normal(0, 1, (4, 8, 12)), "m": feeds["m"]}
    return {k: v.astype(np.float32) for k, v in feeds.items()}


def test_the_sum_joins_the_ops_that_read_its_reshape():
    fused = tf_autofuse.fuse(_graph(), outputs=["y"], passes=["pointwise", "reduce"])
    (fusion,) = fused.fusions
    assert fusion.kind == "reduce" and fusion.op_types == ("Sum", "Mul", "AddV2"), fusion
    # x is read as [4,8,3,4] (a view of the BatchMatMulV2's output) and summed over axis 0
    assert fusion.program.startswith("in0: f32[4,8,12] -> [4,8,3,4]\n"), fusion.program
    assert "= Sum in0 axes=[0]\n" in fusion.program
    ops = [n.op for n in fused.graph_def.node]
    assert "Sum" not in ops and "Reshape" not in ops, ops
    feeds = _feeds()
    got, want = fused.run("y", feeds), fused.run("y", feeds, original=True)
    x = np.matmul(feeds["a"].astype(np.float64), feeds["b"].astype(np.float64))
    exact = x.sum(axis=0).reshape(8, 3, 4) * feeds["m"] + 1
    assert got.shape == want.shape == (8, 3, 4)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.max(np.abs(got - exact)) <= np.max(np.abs(want - exact)) + 1e-5


@pytest.mark.parametrize("axes,produce", [((1,), "matmul"), ((0,), "exp")])
def test_other_sums_keep_their_reshape(axes, produce):
    """A Sum of another axis than the leading ones, or of a fused value (the new Reshape would
    stand between its producer and the Sum), is left as it is."""
    fused = tf_autofuse.fuse(_graph(axes, produce), outputs=["y"], passes=["pointwise", "reduce"])
    names = {n.name for n in fused.graph_def.node}
    assert "r/summed" not in names
    feeds = _feeds(produce, axes)
    np.testing.assert_allclose(fused.run("y", feeds), fused.run("y", feeds, original=True),
                               rtol=1e-5, atol=1e-5)
