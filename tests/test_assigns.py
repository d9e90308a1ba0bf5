"""Variable writes carried out by the fused kernel that computes their value
(rewriter/assigns.py): an optimizer step's AssignVariableOp of a fused output, and the
AssignAdd/SubVariableOp of the value it stored, become part of one AutofuseAssignKernel, and the
variables hold what the unfused graph gives them."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tf_autofuse import rewriter
import sessions

tf1 = tf.compat.v1
SHAPE = (64, 33)
LR, MOMENTUM = 0.05, 0.9


def _momentum_step(validate: bool = True, update: str = "AssignAddVariableOp", wait=False):
    """SGD with momentum as Keras writes it: m = 0.9 m - lr g; m stored; w += read(m)."""
    graph = tf.Graph()
    rng = np.random.default_rng(3)
    start = {"w": rng.normal(0, 1, SHAPE).astype(np.float32),
             "m": rng.normal(0, 0.1, SHAPE).astype(np.float32)}
    with graph.as_default():
        w, m = (tf1.get_variable(k, initializer=start[k], use_resource=True) for k in ("w", "m"))
        g = tf1.placeholder(tf.float32, SHAPE, name="g")
        m_read = tf.raw_ops.ReadVariableOp(resource=m.handle, dtype=tf.float32, name="m_read")
        new_m = tf.subtract(MOMENTUM * m_read, LR * g, name="new_m")
        waits = [tf.no_op(name="before")] if wait else []
        with tf.control_dependencies(waits):
            assign = tf.raw_ops.AssignVariableOp(resource=m.handle, value=new_m,
                                                 validate_shape=validate, name="assign_m")
        with tf.control_dependencies([assign]):
            reread = tf.raw_ops.ReadVariableOp(resource=m.handle, dtype=tf.float32,
                                               name="reread")
        step = getattr(tf.raw_ops, update)(resource=w.handle, value=reread, name="update_w")
        tf.group(step, name="train")
        init = tf1.global_variables_initializer()
    return graph, init, (w, m), start


def _rewrite(graph, preserve=("train",)):
    graph_def = graph.as_graph_def()
    shapes = {n.name: [SHAPE] for n in graph_def.node if n.op == "ReadVariableOp"}
    return rewriter.rewrite(graph_def, preserve=list(preserve), shapes=shapes)


def _node(graph_def, name):
    return next(n for n in graph_def.node if n.name == name)


def test_the_momentum_update_is_one_kernel_that_writes_both_variables():
    graph, _, _, _ = _momentum_step()
    result = _rewrite(graph)
    (fusion,) = result.fusions
    names = {n.name for n in result.graph_def.node}
    assert not names & {"assign_m", "update_w"}, names
    kernel = _node(result.graph_def, fusion.name)
    assert kernel.op == "AutofuseAssignKernel"
    handles = kernel.input[-2:]
    assert [h.split(":")[0] for h in handles] == ["m", "w"]
    # out0 (the new m) stored into m; out1 = w + out0 computed from w's value, stored into w
    assert list(kernel.attr["writes"].list.i) == [0, 1]
    assert list(kernel.attr["reads"].list.i) == [1]
    assert "%3 = Add in2, %2\n" in fusion.program and fusion.program.endswith("out1 = %3\n")
    assert set(fusion.absorbed) == {"assign_m", "update_w"}
    # what waited on the assignment waits on the kernel
    assert list(_node(result.graph_def, "reread").input) == ["m", "^" + fusion.name]
    assert list(_node(result.graph_def, "train").input) == ["^" + fusion.name]


@pytest.mark.parametrize("update,sign", [("AssignAddVariableOp", 1), ("AssignSubVariableOp", -1)])
def test_the_variables_hold_the_unfused_values(update, sign):
    graph, init, (w, m), start = _momentum_step(update=update)
    rng = np.random.default_rng(5)
    grads = [rng.normal(0, 1, SHAPE).astype(np.float32) for _ in range(3)]
    values, kinds = {}, {}
    for fuse in (False, True):
        with tf1.Session(graph=graph, config=sessions.config(fuse)) as sess:
            sess.run(init)
            for g in grads:
                metadata = tf1.RunMetadata()
                sess.run("train", {"g:0": g},
                         options=tf1.RunOptions(output_partition_graphs=True),
                         run_metadata=metadata)
            values[fuse] = sess.run([w.value(), m.value()])
            kinds[fuse] = {n.op for p in metadata.partition_graphs for n in p.node}
    assert "AutofuseAssignKernel" in kinds[True] and "AssignAddVariableOp" not in kinds[True]
    assert "AutofuseAssignKernel" not in kinds[False]
    w64, m64 = (start[k].astype(np.float64) for k in ("w", "m"))
    for g in grads:
        m64 = MOMENTUM * m64 - LR * g
        w64 = w64 + sign * m64
    for got, want, exact in zip(values[True], values[False], (w64, m64)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-5)


def test_an_assignment_whose_name_must_stay_is_a_noop_on_the_kernel():
    graph, _, _, _ = _momentum_step()
    result = _rewrite(graph, preserve=("train", "assign_m"))
    (fusion,) = result.fusions
    kept = _node(result.graph_def, "assign_m")
    assert kept.op == "NoOp" and list(kept.input) == ["^" + fusion.name]
    assert _node(result.graph_def, fusion.name).op == "AutofuseAssignKernel"


@pytest.mark.parametrize("options,reason", [
    ({"validate": False}, "may change the variable's shape (validate_shape=false)"),
    ({"wait": True}, "waits on before"),
])
def test_assignments_that_stay_nodes_say_why(options, reason):
    graph, _, _, _ = _momentum_step(**options)
    result = _rewrite(graph)
    ops = {n.name: n.op for n in result.graph_def.node}
    assert ops["assign_m"] == "AssignVariableOp" and ops["update_w"] == "AssignAddVariableOp"
    assert ("assign_m", reason) in result.refusals
    (fusion,) = result.fusions
    assert _node(result.graph_def, fusion.name).op == "AutofuseKernel"


def test_the_assign_pass_is_on_by_default_and_can_be_turned_off():
    """--autofuse_disable_pass=assign (the API's passes without "assign") leaves every
    assignment a node of its own, and the kernel an AutofuseKernel."""
    import tf_autofuse

    assert rewriter.Policy().assign and tf_autofuse.Fuser().config.policy().assign
    flags = tf_autofuse.flags.Flags(autofuse_disable_pass=("assign",))
    assert not rewriter.policy_from_flags(flags).assign
    graph, _, _, _ = _momentum_step()
    graph_def = graph.as_graph_def()
    shapes = {n.name: [SHAPE] for n in graph_def.node if n.op == "ReadVariableOp"}
    result = rewriter.rewrite(graph_def, preserve=["train"], shapes=shapes, flags=flags)
    ops = {n.name: n.op for n in result.graph_def.node}
    assert ops["assign_m"] == "AssignVariableOp" and ops["update_w"] == "AssignAddVariableOp"
    assert ops[result.fusions[0].name] == "AutofuseKernel"


def test_an_update_reading_a_fed_read_stays_a_node():
    """A ReadVariableOp the caller feeds holds the caller's value, not the stored output: the
    AssignAddVariableOp reading it is not taken, and the AssignVariableOp alone is not either."""
    graph, _, _, _ = _momentum_step()
    graph_def = graph.as_graph_def()
    shapes = {n.name: [SHAPE] for n in graph_def.node if n.op == "ReadVariableOp"}
    result = rewriter.rewrite(graph_def, preserve=["train"], shapes=shapes, feeds=["reread"])
    ops = {n.name: n.op for n in result.graph_def.node}
    assert ops["assign_m"] == "AssignVariableOp" and ops["update_w"] == "AssignAddVariableOp"
    (fusion,) = result.fusions
    assert ops[fusion.name] == "AutofuseKernel"
    assert any(node == "assign_m" and reason.startswith("a write alone")
               for node, reason in result.refusals)
