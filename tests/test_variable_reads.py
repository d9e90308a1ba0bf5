"""One read per tensor: the ReadVariableOps of one variable with the same control inputs are one
input of a fused kernel (XLA reads such a variable once too), never a read that is fed, nor one
ordered differently against the graph's other nodes."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_autofuse import rewriter
import sessions

tf1 = tf.compat.v1


def _gelu_of_a_variable():
    """tanh-GELU written with x * x * x over a resource variable read five times."""
    graph = tf.Graph()
    with graph.as_default():
        v = tf1.get_variable("v", initializer=np.linspace(-3, 3, 4096, dtype=np.float32),
                             use_resource=True)
        cube = v * v * v
        inner = 0.7978845608 * (v + 0.044715 * cube)
        y = tf.identity(0.5 * v * (1.0 + tf.tanh(inner)), name="y")
        init = tf1.global_variables_initializer()
    return graph, init, y


def _kernel_inputs(graph_def, fusion_name):
    node = next(n for n in graph_def.node if n.name == fusion_name)
    return [i for i in node.input if not i.startswith("^")]


def test_reads_of_one_variable_are_one_input():
    graph, _, _ = _gelu_of_a_variable()
    graph_def = graph.as_graph_def()
    reads = [n.name for n in graph_def.node if n.op == "ReadVariableOp"]
    assert len(reads) >= 5  # the test is about several reads
    shapes = {name: [(4096,)] for name in reads}  # what Grappler's shape inference tells
    result = rewriter.rewrite(graph_def, preserve=["y"], shapes=shapes)
    assert len(result.fusions) == 1, result.refusals
    assert len(result.fusions[0].op_types) == 9  # every Mul, Add and the Tanh
    inputs = _kernel_inputs(result.graph_def, result.fusions[0].name)
    assert len(inputs) == 1 and inputs[0].split(":")[0] in reads, inputs
    assert result.fusions[0].program.startswith("in0: f32[4096]\n%0")
    assert "\nin1:" not in result.fusions[0].program


def test_fused_reads_give_the_values_of_the_unfused_graph():
    graph, init, y = _gelu_of_a_variable()
    values = {}
    for fuse in (False, True):
        with tf1.Session(graph=graph, config=sessions.config(fuse)) as sess:
            sess.run(init)
            metadata = tf1.RunMetadata()
            values[fuse] = sess.run(y, options=tf1.RunOptions(output_partition_graphs=True),
                                    run_metadata=metadata)
        kernels = [n for p in metadata.partition_graphs for n in p.node
                   if n.op == "AutofuseKernel"]
        assert len(kernels) == int(fuse)
        if fuse:
            assert len([i for i in kernels[0].input if not i.startswith("^")]) == 1
    x = np.linspace(-3, 3, 4096)
    ref = 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(values[True], ref, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(values[True], values[False], rtol=2e-6, atol=1e-6)


def test_reads_ordered_differently_or_fed_stay_apart():
    """A read after an assignment (a control input the first read lacks) is another value; a
    fed read is the caller's value: neither is replaced by the other read."""
    graph = tf.Graph()
    with graph.as_default():
        v = tf1.get_variable("v", initializer=np.ones(8, np.float32), use_resource=True)
        first = tf.raw_ops.ReadVariableOp(resource=v.handle, dtype=tf.float32, name="first")
        assign = tf.raw_ops.AssignAddVariableOp(resource=v.handle, value=np.ones(8, np.float32),
                                                name="assign")
        with tf.control_dependencies([assign]):
            after = tf.raw_ops.ReadVariableOp(resource=v.handle, dtype=tf.float32, name="after")
        fed = tf.raw_ops.ReadVariableOp(resource=v.handle, dtype=tf.float32, name="fed")
        tf.exp(tf.abs(first) + tf.abs(after) + tf.abs(fed), name="y")
    graph_def = graph.as_graph_def()
    reads = [n.name for n in graph_def.node if n.op == "ReadVariableOp"]
    shapes = {name: [(8,)] for name in reads}
    result = rewriter.rewrite(graph_def, preserve=["y", "fed"], feeds=["fed"], shapes=shapes)
    assert len(result.fusions) == 1, result.refusals
    inputs = {i.split(":")[0] for i in _kernel_inputs(result.graph_def, result.fusions[0].name)}
    # `first` may be read as the variable's other read without control inputs, never as the
    # read after the assignment nor as the fed one
    assert len(inputs) == 3 and {"after", "fed"} <= inputs, inputs
    (unordered,) = inputs - {"after", "fed"}
    assert unordered in reads and not [n for n in graph_def.node
                                       if n.name == unordered][0].input[1:], unordered
