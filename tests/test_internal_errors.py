"""No internal error escapes the API: a bug in lowering one group costs that group only (its
refusal says why, one AutofuseWarning says it is a bug), and a bug anywhere else in the pass is
one AutofuseError naming the phase and node, with the original exception chained. Through a
session either way the graph runs, with the right numbers."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf_autofuse
from tf_autofuse import _warn
from tf_autofuse.rewriter import lower, partition
import tf_autofuse.rewriter as rewriter_package
import sessions

tf1 = tf.compat.v1


def _two_chains():
    """x -> Abs -> Exp and y -> Tanh -> Sigmoid: two groups the partitioner keeps apart."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [64], name="x")
        y = tf1.placeholder(tf.float32, [32], name="y")
        a = tf.exp(tf.abs(x, name="abs"), name="exp")
        b = tf.sigmoid(tf.tanh(y, name="tanh"), name="sig")
    feeds = {x: np.linspace(-3, 3, 64, dtype=np.float32),
             y: np.linspace(-2, 2, 32, dtype=np.float32)}
    return graph, (a, b), feeds


def _raising_for(node_name, error):
    """lower._emit_node that raises `error` for one member: a bug in one emitter."""
    emit = lower._emit_node

    def emit_node(em, name, node, *args):
        if name == node_name:
            raise error
        return emit(em, name, node, *args)

    return emit_node


def _assert_close(got, want):
    """Fused and unfused float32 values: within a few ulps (the fused Sigmoid is not TF's)."""
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=4 * 2.0 ** -23, atol=0)


def _warnings_of(call):
    _warn.reset()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", _warn.AutofuseWarning)
        result = call()
    return result, [str(w.message) for w in said if issubclass(w.category, _warn.AutofuseWarning)]


def test_a_group_whose_lowering_raises_is_refused_and_the_rest_fuses(monkeypatch):
    monkeypatch.setattr(lower, "_emit_node", _raising_for("exp", ZeroDivisionError("boom")))
    graph, _, feeds = _two_chains()
    fused, said = _warnings_of(lambda: tf_autofuse.fuse(graph, outputs=["exp", "sig"]))
    assert [f.nodes for f in fused.fusions] == [("tanh", "sig")]
    reasons = {r.node: r.reason for r in fused.refusals}
    assert "exp" in reasons or "abs" in reasons, fused.refusals
    internal = [r for r in fused.refusals if "internal error: ZeroDivisionError: boom" in r.reason]
    assert internal and all("please report it" in r.reason for r in internal), fused.refusals
    assert len(said) >= 1 and all("internal error: ZeroDivisionError: boom" in s for s in said)
    feeds_by_name = {t.name: v for t, v in feeds.items()}
    want = fused.run(feeds=feeds_by_name, original=True)
    _assert_close(fused.run(feeds=feeds_by_name), want)


def test_a_group_whose_lowering_raises_runs_unfused_in_a_session(monkeypatch):
    monkeypatch.setattr(lower, "_emit_node", _raising_for("exp", ZeroDivisionError("boom")))
    graph, fetches, feeds = _two_chains()

    def run():
        with tf1.Session(graph=graph, config=sessions.config(True)) as sess:
            metadata = tf1.RunMetadata()
            values = sess.run(fetches, feeds, options=tf1.RunOptions(output_partition_graphs=True),
                              run_metadata=metadata)
        return values, {n.name: n.op for p in metadata.partition_graphs for n in p.node}

    (values, executed), said = _warnings_of(run)
    kernels = sorted(n for n, op in executed.items() if op == "AutofuseKernel")
    assert kernels == ["autofuse_pointwise_0_Tanh_Sigmoid"], executed
    assert executed.get("exp") == "Exp"
    assert said and all("internal error: ZeroDivisionError: boom" in s for s in said), said
    with tf1.Session(graph=graph, config=sessions.config(False)) as sess:
        want = sess.run(fetches, feeds)
    _assert_close(values, want)


def test_a_bug_outside_the_lowering_is_one_autofuse_error_naming_the_node(monkeypatch):
    def refuse_candidate(view, name, *args):
        if name == "tanh":
            raise KeyError("lost")
        return original(view, name, *args)

    original = partition._refuse_candidate
    monkeypatch.setattr(partition, "_refuse_candidate", refuse_candidate)
    graph, _, _ = _two_chains()
    with pytest.raises(tf_autofuse.AutofuseError) as caught:
        tf_autofuse.fuse(graph, outputs=["exp", "sig"])
    text = str(caught.value)
    assert "partition" in text and "'tanh'" in text and "KeyError" in text, text
    assert "bug in tf_autofuse" in text, text
    assert isinstance(caught.value.__cause__, KeyError)


def test_a_bug_in_the_splice_is_an_autofuse_error_and_the_session_runs_unfused(monkeypatch):
    def splice(*args):
        raise AttributeError("no such field")

    monkeypatch.setattr(rewriter_package, "splice", splice)
    graph, fetches, feeds = _two_chains()
    with pytest.raises(tf_autofuse.AutofuseError, match=r"\(splice\).*AttributeError"):
        tf_autofuse.fuse(graph, outputs=["exp", "sig"])

    def run():
        with tf1.Session(graph=graph, config=sessions.config(True)) as sess:
            return sess.run(fetches, feeds)

    values, said = _warnings_of(run)
    assert len(said) == 1 and "runs unfused" in said[0] and "AttributeError" in said[0], said
    with tf1.Session(graph=graph, config=sessions.config(False)) as sess:
        want = sess.run(fetches, feeds)
    _assert_close(values, want)


def test_a_user_error_is_not_an_internal_error():
    """A bad cost model name is the caller's mistake: a ValueError naming it, not AutofuseError."""
    graph, _, _ = _two_chains()

    class Flags:
        cost_model = "no_such_model"

    with pytest.raises(ValueError, match="no_such_model"):
        rewriter_package.rewrite(graph.as_graph_def(), preserve=["exp"], flags=Flags())


def test_a_bug_in_the_api_s_shape_pass_is_an_autofuse_error(monkeypatch):
    from tf_autofuse import fuser

    def static_shapes(*args):
        raise IndexError("tuple index out of range")

    monkeypatch.setattr(fuser, "static_shapes", static_shapes)
    graph, _, _ = _two_chains()
    with pytest.raises(tf_autofuse.AutofuseError, match=r"\(static shapes\).*IndexError") as caught:
        tf_autofuse.fuse(graph, outputs=["exp", "sig"])
    assert isinstance(caught.value.__cause__, IndexError)
