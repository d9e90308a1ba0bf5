"""The pure-Python rewriter (tf_autofuse.rewriter), Grappler-remapper style.

Graphs are built by hand (NodeDef protos) or with tf.Graph (tests/rewriter_graphs.py); the tests
assert the structure of the rewritten GraphDef (fused nodes, names, inputs, program text,
refusals, the policy's limits and passes). test_rewriter_numbers.py runs rewritten graphs.
"""

import types

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, types_pb2
from tensorflow.python.framework import op_def_registry

import sessions
from rewriter_graphs import (CPU0, F16, F32, GPU0, I32, I64, REDUCE_ON, by_name, chain, const,
                             expand_fused, flags, fused_nodes, fused_programs, gelu_tanh, graph,
                             node, op_types, placeholder, program_of, programs, run_graph,
                             serialized, softmax, tf1, tf_graph, uniform)
from tf_autofuse import rewriter
from tf_autofuse.rewriter import catalog, graph as graph_mod, naming, partition

# the program of abs -> relu -> exp: the simplify pass drops the Relu of |x| (rewriter/passes.py)
ABS_RELU_EXP = "in0: f16[128,192]\n%0 = Abs in0\n%1 = Exp %0\nout0 = %1\n"
ABS_RELU_EXP_NAME = "autofuse_pointwise_0_Abs_Relu_Exp"


# --- the abs / relu / exp chain ----------------------------------------------------------------


def test_abs_relu_exp_chain_becomes_one_node():
    g = graph(*chain(["Abs", "Relu", "Exp"], F16, (128, 192)), node("out", "Identity", ["Exp"], F16))
    result = rewriter.rewrite(g, preserve=["out"])
    (fused,) = fused_nodes(result.graph_def)
    assert fused.name == ABS_RELU_EXP_NAME
    assert program_of(fused) == ABS_RELU_EXP
    assert list(fused.input) == ["x"]
    assert list(fused.attr["Tin"].list.type) == [F16]
    assert list(fused.attr["Tout"].list.type) == [F16]
    assert list(by_name(result.graph_def)["out"].input) == [ABS_RELU_EXP_NAME]
    assert op_types(result.graph_def) == ["AutofuseKernel", "Identity", "Placeholder"]
    (fusion,) = result.fusions
    assert fusion.name == ABS_RELU_EXP_NAME and fusion.kind == "pointwise"
    assert fusion.nodes == ("Abs", "Relu", "Exp")
    assert fusion.op_types == ("Abs", "Relu", "Exp")
    assert fusion.program == ABS_RELU_EXP


def test_unary_ops_composition_reads_as_the_chain():
    composed = node("Exp", "_UnaryOpsComposition", ["x"], F16, op_names=["Abs", "Relu", "Exp"])
    g = graph(placeholder("x", F16, (128, 192)), composed)
    result = rewriter.rewrite(g, preserve=["Exp"])
    (fused,) = fused_nodes(result.graph_def)
    assert fused.name == ABS_RELU_EXP_NAME
    assert program_of(fused) == ABS_RELU_EXP
    assert result.fusions[0].op_types == ("Abs", "Relu", "Exp")
    identity = by_name(result.graph_def)["Exp"]
    assert identity.op == "Identity" and list(identity.input) == [ABS_RELU_EXP_NAME]
    assert "_UnaryOpsComposition" not in op_types(result.graph_def)


def test_abs_relu_exp_built_with_tf_graph():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float16, [128, 192], name="x")
        tf.exp(tf.nn.relu(tf.abs(x)), name="y")
    result = rewriter.rewrite(g.as_graph_def(), preserve=["y"])
    (fused,) = fused_nodes(result.graph_def)
    assert fused.name == ABS_RELU_EXP_NAME
    assert program_of(fused) == ABS_RELU_EXP
    nodes = by_name(result.graph_def)
    assert set(nodes) == {"x", ABS_RELU_EXP_NAME, "y"}
    assert nodes["y"].op == "Identity"


def test_composition_with_an_unsupported_op_is_left_alone():
    composed = node("c", "_UnaryOpsComposition", ["x"], F32, op_names=["Abs", "Acos"])
    g = graph(placeholder("x"), composed, node("Exp", "Exp", ["c"]))
    result = rewriter.rewrite(g)
    assert not result.fusions
    assert ("c", "Acos in op_names is not a supported unary op") in result.refusals


def test_composition_and_plain_ops_fuse_together():
    composed = node("c", "_UnaryOpsComposition", ["x"], op_names=["Abs", "Relu"])
    g = graph(placeholder("x"), composed, node("e", "Exp", ["c"]))
    groups, refusals = partition.find_groups(graph_mod.GraphView(g))
    assert [(gr.members, gr.size, gr.dtype, gr.device) for gr in groups] == [(["c", "e"], 3, F32, "")]
    assert refusals == []
    (fusion,) = rewriter.rewrite(g, preserve=["e"]).fusions
    assert fusion.name == "autofuse_pointwise_0_Abs_Relu_Exp"
    assert fusion.program == "in0: f32[4,3]\n%0 = Abs in0\n%1 = Exp %0\nout0 = %1\n"


# --- binary ops --------------------------------------------------------------------------------


def test_binary_same_shape_ops_fuse_with_every_input_once():
    g = graph(
        placeholder("x", F32, (8, 16)),
        placeholder("y", F32, (8, 16)),
        node("add", "AddV2", ["x", "y"]),
        node("mul", "Mul", ["add", "y"]),
        node("max", "Maximum", ["mul", "x"]),
        node("div", "RealDiv", ["max", "y"]),
    )
    result = rewriter.rewrite(g, preserve=["div"])
    (fused,) = fused_nodes(result.graph_def)
    assert fused.name == "autofuse_pointwise_0_AddV2_Mul_Maximum_RealDiv"
    assert list(fused.input) == ["x", "y"]
    assert program_of(fused) == (
        "in0: f32[8,16]\nin1: f32[8,16]\n"
        "%0 = Add in0, in1\n%1 = Mul %0, in1\n%2 = Maximum %1, in0\n%3 = Div %2, in1\n"
        "out0 = %3\n"
    )
    assert list(fused.attr["Tin"].list.type) == [F32, F32]


def test_binary_with_an_unknown_size_against_a_known_size():
    g = graph(
        placeholder("x", F32, (-1, 3)),
        placeholder("y", F32, (4, 3)),
        node("a", "Abs", ["x"]),
        node("add", "AddV2", ["a", "y"]),
        node("e", "Exp", ["add"]),
    )
    # ? is 1 or 4 at run time (else TF and the kernel both fail): the result is [4,3]
    result = rewriter.rewrite(g, preserve=["e"])
    assert programs(result) == {"autofuse_pointwise_0_Abs_AddV2_Exp": (
        "in0: f32[?,3]\nin1: f32[4,3]\n%0 = Abs in0\n%1 = Add %0, in1\n%2 = Exp %1\nout0 = %2\n")}
    # but a [?,3] value is not provably the iteration shape [4,3]: it cannot be an output
    result = rewriter.rewrite(g, preserve=["e", "a"])
    assert ("add", "cannot join a's group: a would be an output of shape [?,3], not the "
                   "iteration shape [4,3]") in result.refusals
    assert [f.nodes for f in result.fusions] == [("add", "e")]


def test_binary_shapes_from_the_caller_and_from_output_shapes_attr():
    g = graph(
        placeholder("x", F32, None),
        placeholder("y", F32, None),
        node("add", "AddV2", ["x", "y"]),
        node("e", "Exp", ["add"]),
    )
    assert not rewriter.rewrite(g).fusions
    shapes = {"x": [(2, 5)], "y": [(2, 5)]}
    result = rewriter.rewrite(g, shapes=shapes)
    assert program_of(fused_nodes(result.graph_def)[0]).startswith("in0: f32[2,5]\nin1: f32[2,5]\n")
    g.node[0].CopyFrom(node("x", "Placeholder", dtype=None, _output_shapes=[(2, 5)]))
    g.node[0].attr["dtype"].type = F32
    g.node[1].CopyFrom(node("y", "Placeholder", dtype=None, _output_shapes=[(2, 5)]))
    g.node[1].attr["dtype"].type = F32
    assert len(rewriter.rewrite(g).fusions) == 1


def test_binary_with_equal_symbolic_sizes_from_the_caller():
    g = graph(
        placeholder("x", F32, (-1, 3)),
        placeholder("y", F32, (-1, 3)),
        node("add", "AddV2", ["x", "y"]),
        node("e", "Exp", ["add"]),
    )
    result = rewriter.rewrite(g, shapes={"x": [(-2, 3)], "y": [(-2, 3)]})
    assert program_of(fused_nodes(result.graph_def)[0]).startswith("in0: f32[?,3]\nin1: f32[?,3]\n")
    result = rewriter.rewrite(g, shapes={"x": [(-2, 3)], "y": [(-3, 3)]})
    assert ("add", "shapes [?,3] and [?,3] not known to broadcast") in result.refusals


def test_shapes_propagate_through_cast():
    g = graph(
        placeholder("x", F32, (64, 33)),
        node("xb", "Cast", ["x"], dtype=None),
        node("t", "Tanh", ["xb"], types_pb2.DT_BFLOAT16),
        node("m", "Mul", ["xb", "t"], types_pb2.DT_BFLOAT16),
        node("s", "Sigmoid", ["m"], types_pb2.DT_BFLOAT16),
    )
    g.node[1].attr["DstT"].type = types_pb2.DT_BFLOAT16
    (fusion,) = rewriter.rewrite(g, preserve=["s"]).fusions
    assert fusion.program == (
        "in0: bf16[64,33]\n%0 = Tanh in0\n%1 = Mul in0, %0\n%2 = Sigmoid %1\nout0 = %2\n"
    )


def test_binary_on_one_tensor_needs_no_shape():
    g = graph(placeholder("x", F32, None), node("sq", "Mul", ["x", "x"]), node("e", "Exp", ["sq"]))
    (fused,) = fused_nodes(rewriter.optimize(g))
    assert program_of(fused) == "in0: f32[*]\n%0 = Mul in0, in0\n%1 = Exp %0\nout0 = %1\n"


def test_binary_with_a_const_operand():
    g = graph(
        placeholder("x", F32, (2, 3)),
        const("c", np.ones((2, 3), np.float32)),
        node("m", "Mul", ["x", "c"]),
        node("t", "Tanh", ["m"]),
    )
    (fused,) = fused_nodes(rewriter.optimize(g))
    assert list(fused.input) == ["x", "c"]


def test_diamond_x_times_sigmoid_x():
    g = graph(
        placeholder("x", F32, (8, 16)),
        node("a", "Abs", ["x"]),
        node("sig", "Sigmoid", ["a"]),
        node("swish", "Mul", ["a", "sig"]),
    )
    result = rewriter.rewrite(g, preserve=["swish"])
    (fused,) = fused_nodes(result.graph_def)
    assert fused.name == "autofuse_pointwise_0_Abs_Sigmoid_Mul"
    assert list(fused.input) == ["x"]
    assert program_of(fused) == (
        "in0: f32[8,16]\n%0 = Abs in0\n%1 = Sigmoid %0\n%2 = Mul %0, %1\nout0 = %2\n"
    )


def test_swish_reads_its_input_once():
    g = graph(placeholder("x", F32, (8,)), node("sig", "Sigmoid", ["x"]), node("m", "Mul", ["x", "sig"]))
    (fused,) = fused_nodes(rewriter.optimize(g, preserve=["m"]))
    assert program_of(fused) == "in0: f32[8]\n%0 = Sigmoid in0\n%1 = Mul in0, %0\nout0 = %1\n"


# --- several groups, names ---------------------------------------------------------------------


def test_two_independent_chains_are_numbered_in_topological_order():
    g = graph(
        placeholder("x"),
        placeholder("y"),
        node("n1", "Neg", ["y"]),  # the chain from y comes first in the node list
        node("t1", "Tanh", ["n1"]),
        node("a1", "Abs", ["x"]),
        node("e1", "Exp", ["a1"]),
    )
    result = rewriter.rewrite(g, preserve=["t1", "e1"])
    assert [f.name for f in result.fusions] == [
        "autofuse_pointwise_0_Neg_Tanh",
        "autofuse_pointwise_1_Abs_Exp",
    ]
    names = [n.name for n in fused_nodes(result.graph_def)]
    assert names == ["autofuse_pointwise_0_Neg_Tanh", "autofuse_pointwise_1_Abs_Exp"]


def test_numbering_continues_after_existing_fused_nodes():
    existing = node("autofuse_pointwise_3_Abs_Exp", "AutofuseKernel", ["x"], dtype=None)
    taken = node("autofuse_pointwise_4_Neg_Tanh", "NoOp", dtype=None)
    g = graph(*chain(["Neg", "Tanh"]), existing, taken)
    (fusion,) = rewriter.rewrite(g).fusions
    assert fusion.name == "autofuse_pointwise_5_Neg_Tanh"


def test_namer_never_reuses_a_name():
    namer = naming.Namer(["autofuse_pointwise_0_Abs", "other"])
    assert namer.name("pointwise", ["Abs", "Exp"]) == "autofuse_pointwise_1_Abs_Exp"
    assert namer.name("pointwise", ["Abs", "Exp"]) == "autofuse_pointwise_2_Abs_Exp"
    namer = naming.Namer(["autofuse_pointwise_0_Abs_Exp_x"])
    assert namer.name("pointwise", ["Abs"]) == "autofuse_pointwise_1_Abs"


# --- preserve and feeds ------------------------------------------------------------------------


def test_preserved_middle_keeps_its_name_and_value():
    g = graph(*chain(["Abs", "Relu", "Exp"], F16, (128, 192)), node("out", "Identity", ["Exp"], F16))
    result = rewriter.rewrite(g, preserve=["Relu", "out"])
    (fused,) = fused_nodes(result.graph_def)
    assert list(fused.attr["Tout"].list.type) == [F16, F16]
    assert program_of(fused).endswith("out0 = %1\nout1 = %2\n")
    nodes = by_name(result.graph_def)
    relu = nodes["Relu"]
    assert relu.op == "Identity"
    assert graph_mod.parse_input(relu.input[0])[:2] == (fused.name, 0)
    assert relu.attr["T"].type == F16 and relu.device == ""
    assert graph_mod.parse_input(nodes["out"].input[0])[:2] == (fused.name, 1)
    assert "Abs" not in nodes and "Exp" not in nodes


def test_preserved_identity_copies_the_device():
    g = graph(*chain(["Abs", "Relu", "Exp"], device=CPU0))
    result = rewriter.rewrite(g, preserve=["Relu", "Exp"])
    nodes = by_name(result.graph_def)
    assert nodes[result.fusions[0].name].device == CPU0
    assert nodes["Relu"].device == CPU0 and nodes["Exp"].device == CPU0


def test_a_fed_middle_splits_the_chain():
    g = graph(*chain(["Abs", "Sqrt", "Relu", "Exp", "Neg"]))
    result = rewriter.rewrite(g, preserve=["Neg", "Relu"], feeds=["Relu"])
    assert [f.nodes for f in result.fusions] == [("Abs", "Sqrt"), ("Exp", "Neg")]
    nodes = by_name(result.graph_def)
    assert nodes["Relu"].op == "Relu"
    assert list(nodes["Relu"].input) == ["autofuse_pointwise_0_Abs_Sqrt"]
    assert list(nodes["autofuse_pointwise_1_Exp_Neg"].input) == ["Relu"]
    assert ("Relu", "fed by the caller") in result.refusals


def test_feeds_and_preserve_accept_tensor_names():
    g = graph(*chain(["Abs", "Relu", "Exp"]))
    result = rewriter.rewrite(g, preserve=["Exp:0"], feeds=["Relu:0"])
    assert not result.fusions


# --- control dependencies ----------------------------------------------------------------------


def test_control_inputs_of_members_move_to_the_fused_node():
    g = graph(
        placeholder("x"),
        node("c2", "NoOp", dtype=None),
        node("c1", "NoOp", dtype=None),
        node("Abs", "Abs", ["x", "^c2"]),
        node("Relu", "Relu", ["Abs", "^c1", "^c2"]),
        node("Exp", "Exp", ["Relu", "^Abs"]),  # inside the group: dropped
    )
    (fused,) = fused_nodes(rewriter.optimize(g))
    assert list(fused.input) == ["x", "^c1", "^c2"]


def test_control_edges_out_of_the_group_point_at_the_fused_node():
    g = graph(
        *chain(["Abs", "Relu", "Exp"]),
        node("after", "NoOp", ["^Relu", "^Abs"], dtype=None),
        node("kept", "NoOp", ["^Exp"], dtype=None),
    )
    result = rewriter.rewrite(g, preserve=["Exp"])
    nodes = by_name(result.graph_def)
    name = result.fusions[0].name
    assert list(nodes["after"].input) == ["^" + name]  # two members, one edge
    assert list(nodes["kept"].input) == ["^Exp"]  # Exp keeps its name as an Identity
    assert nodes["Exp"].op == "Identity"


def test_control_edge_from_a_preserved_member_stays_on_its_identity():
    g = graph(*chain(["Abs", "Relu", "Exp"]), node("after", "NoOp", ["^Relu"], dtype=None))
    result = rewriter.rewrite(g, preserve=["Relu", "Exp"])
    assert list(by_name(result.graph_def)["after"].input) == ["^Relu"]


def test_colocation_with_a_removed_member_follows_the_fused_node():
    after = node("after", "Identity", ["Exp"])
    after.attr["_class"].list.s.append(b"loc:@Relu")
    g = graph(*chain(["Abs", "Relu", "Exp"]), after)
    result = rewriter.rewrite(g, preserve=["after"])
    assert list(by_name(result.graph_def)["after"].attr["_class"].list.s) == [
        b"loc:@" + result.fusions[0].name.encode()
    ]


# --- what is not fused -------------------------------------------------------------------------


def test_other_device_nodes_are_excluded():
    nodes = chain(["Abs", "Relu", "Exp", "Neg"])
    nodes[2].device = GPU0  # Relu
    result = rewriter.rewrite(graph(*nodes))
    assert [f.nodes for f in result.fusions] == [("Exp", "Neg")]
    assert ("Relu", "device GPU") in result.refusals


def test_nodes_on_different_cpu_device_strings_do_not_mix():
    nodes = chain(["Abs", "Relu"])
    nodes[2].device = CPU0
    result = rewriter.rewrite(graph(*nodes))
    assert not result.fusions
    assert ("Relu", f"device {CPU0!r} differs from '' of Abs's group") in result.refusals


def test_unsupported_dtypes_are_excluded():
    result = rewriter.rewrite(graph(*chain(["Abs", "Neg"], I64)))
    assert not result.fusions
    assert ("Abs", "dtype DT_INT64 not supported by Abs") in result.refusals

    result = rewriter.rewrite(graph(*chain(["Abs", "Neg", "Exp"], I32)))
    assert [f.nodes for f in result.fusions] == [("Abs", "Neg")]
    assert program_of(fused_nodes(result.graph_def)[0]).startswith("in0: i32[4,3]\n")
    assert ("Exp", "dtype DT_INT32 not supported by Exp") in result.refusals


def test_a_single_op_is_not_fused():
    g = graph(*chain(["Exp"]))
    result = rewriter.rewrite(g)
    assert not result.fusions
    assert serialized(result.graph_def) == serialized(g)
    assert result.graph_def is not g
    assert result.refusals == [("Exp", "no fusible neighbour")]


def test_nothing_to_fuse_returns_the_graph_unchanged():
    g = graph(placeholder("x"), node("i", "Identity", ["x"]))
    g.versions.producer = 1234
    g.library.function.add().signature.name = "f"
    out = rewriter.optimize(g)
    assert serialized(out) == serialized(g)


def test_max_fusion_size_splits_a_long_chain():
    g = graph(*chain(["Abs", "Neg", "Exp", "Tanh", "Sin"]))
    result = rewriter.rewrite(g, flags=flags(2), preserve=["Sin"])
    assert [f.nodes for f in result.fusions] == [("Abs", "Neg"), ("Exp", "Tanh")]
    nodes = by_name(result.graph_def)
    assert nodes["Sin"].op == "Sin"
    assert list(nodes["Sin"].input) == ["autofuse_pointwise_1_Exp_Tanh"]
    assert ("Exp", "group full (max_fusion_size=2)") in result.refusals


def test_max_fusion_size_counts_composition_ops():
    composed = node("c", "_UnaryOpsComposition", ["x"], op_names=["Abs", "Relu", "Exp"])
    g = graph(placeholder("x"), composed)
    result = rewriter.rewrite(g, flags=flags(2))
    assert not result.fusions
    assert ("c", "group full (max_fusion_size=2)") in result.refusals
    assert len(rewriter.rewrite(g, flags=flags(3)).fusions) == 1


def test_max_fusion_size_zero_means_no_fusion():
    g = graph(*chain(["Abs", "Relu", "Exp"]))
    result = rewriter.rewrite(g, flags=flags(0))
    assert not result.fusions
    assert serialized(result.graph_def) == serialized(g)


def test_flags_without_max_fusion_size_use_the_default():
    g = graph(*chain(["Abs", "Relu", "Exp"]))
    assert len(rewriter.rewrite(g, flags=object()).fusions) == 1


def test_fusion_never_creates_a_cycle():
    # a -> b directly, and a -> X -> b through a node that cannot be fused: fusing a and b
    # would make the fused node both produce X's input and consume X's output.
    g = graph(
        placeholder("x"),
        node("a", "Relu", ["x"]),
        node("X", "Identity", ["a"]),
        node("b", "Mul", ["a", "X"]),
    )
    result = rewriter.rewrite(g)
    assert not result.fusions
    assert ("b", "would create a cycle through X") in result.refusals


def test_cycle_avoidance_still_fuses_both_sides():
    g = graph(
        placeholder("x"),
        node("abs", "Abs", ["x"]),
        node("a", "Relu", ["abs"]),
        node("X", "Identity", ["a"]),
        node("b", "Mul", ["a", "X"]),
        node("e", "Exp", ["b"]),
    )
    result = rewriter.rewrite(g, preserve=["e"])
    assert [f.nodes for f in result.fusions] == [("abs", "a"), ("b", "e")]
    nodes = by_name(result.graph_def)
    first, second = (f.name for f in result.fusions)
    assert list(nodes["X"].input) == [first]
    assert list(nodes[second].input) == [first, "X"]


def test_cycle_through_a_control_edge():
    g = graph(
        placeholder("x"),
        node("a", "Relu", ["x"]),
        node("X", "NoOp", ["^a"], dtype=None),
        node("b", "Exp", ["a", "^X"]),
    )
    result = rewriter.rewrite(g)
    assert ("b", "would create a cycle through X") in result.refusals


def test_a_const_waiting_on_a_member_is_an_immediate(ops):
    """TensorFlow's gradients make a Const wait on the gradient it scales (the 2.0 of
    SquaredDifference's): read by the group that holds that gradient, a scalar is an immediate,
    and the edge ^a -> Const closes no cycle. A non-scalar one would be an input: refused."""
    two = const("two", 2.0)
    two.input.append("^a")
    g = graph(placeholder("x"), node("a", "Relu", ["x"]), two, node("b", "Mul", ["two", "a"]),
              node("e", "Exp", ["b"]))
    result = rewriter.rewrite(g, preserve=["e"])
    assert [f.nodes for f in result.fusions] == [("a", "b", "e")]
    fused = by_name(result.graph_def)[result.fusions[0].name]
    assert list(fused.input) == ["x"] and "2.0" in fused.attr["program"].s.decode()
    x = uniform(7, (4, 3))
    (want,) = run_graph(g, ["e"], {"x": x})
    (got,) = run_graph(result.graph_def, ["e"], {"x": x})
    np.testing.assert_allclose(got, want, rtol=3e-7)  # the Exp of each: within an ulp or two
    np.testing.assert_allclose(got, np.exp(2.0 * np.maximum(x.astype(np.float64), 0)), rtol=1e-6)

    row = const("row", [1.0, 2.0, 3.0])
    row.input.append("^a")
    g = graph(placeholder("x"), node("a", "Relu", ["x"]), row, node("b", "Mul", ["row", "a"]))
    result = rewriter.rewrite(g, preserve=["b"])
    assert not result.fusions
    assert ("b", "would create a cycle through row") in result.refusals


def test_a_v1_while_loop_orders_and_fuses_its_body():
    g = graph(
        placeholder("x"),
        node("enter", "Enter", ["x"]),
        node("merge", "Merge", ["enter", "next"]),
        node("abs", "Abs", ["merge"]),
        node("exp", "Exp", ["abs"]),
        node("next", "NextIteration", ["exp"]),
    )
    view = graph_mod.GraphView(g)
    assert view.order == ["x", "enter", "merge", "abs", "exp", "next"]
    result = rewriter.rewrite(g)
    assert [f.nodes for f in result.fusions] == [("abs", "exp")]
    assert list(by_name(result.graph_def)["next"].input) == [result.fusions[0].name]


def test_a_malformed_cycle_is_not_fused():
    g = graph(node("a", "Abs", ["b"]), node("b", "Exp", ["a"]))
    result = rewriter.rewrite(g)
    assert not result.fusions
    assert ("a", "on a cycle of the graph") in result.refusals


def test_refusals_carry_reasons():
    nodes = chain(["Abs", "Relu", "Exp"]) + [
        node("i", "Abs", ["x"], I64),
        node("g", "Neg", ["x"], device="/device:GPU:0"),
    ]
    result = rewriter.rewrite(graph(*nodes), feeds=["Relu"])
    reasons = dict(result.refusals)
    assert reasons["i"] == "dtype DT_INT64 not supported by Abs"
    assert reasons["g"] == "device GPU"
    assert reasons["Relu"] == "fed by the caller"
    assert reasons["Abs"] == "no fusible neighbour"
    assert all(isinstance(r, tuple) and len(r) == 2 for r in result.refusals)


# --- invariants --------------------------------------------------------------------------------


def _sample_graphs():
    yield graph(*chain(["Abs", "Relu", "Exp"], F16, (128, 192)))
    yield graph(*chain(["Abs", "Neg", "Exp", "Tanh", "Sin"]), node("o", "Identity", ["Sin"]))
    yield graph(
        placeholder("x"),
        node("abs", "Abs", ["x"]),
        node("a", "Relu", ["abs"]),
        node("X", "Identity", ["a"]),
        node("b", "Mul", ["a", "X"]),
        node("e", "Exp", ["b"]),
        node("after", "NoOp", ["^a", "^e"], dtype=None),
    )
    yield graph(placeholder("x", F32, (8, 16)), node("sig", "Sigmoid", ["x"]), node("m", "Mul", ["x", "sig"]))


@pytest.mark.parametrize("g", list(_sample_graphs()))
@pytest.mark.parametrize("max_size", [2, 64])
def test_idempotent(g, max_size):
    once = rewriter.optimize(g, preserve=["Relu"], flags=flags(max_size))
    twice = rewriter.rewrite(once, preserve=["Relu"], flags=flags(max_size))
    assert not twice.fusions
    assert serialized(twice.graph_def) == serialized(once)


@pytest.mark.parametrize("g", list(_sample_graphs()))
def test_deterministic(g):
    first = rewriter.optimize(g, preserve=["e"])
    second = rewriter.optimize(graph_pb2.GraphDef.FromString(g.SerializeToString()), preserve=["e"])
    assert serialized(first) == serialized(second)


@pytest.mark.parametrize("g", list(_sample_graphs()))
def test_input_is_not_mutated(g):
    before = serialized(g)
    result = rewriter.rewrite(g, preserve=["Relu", "e"], shapes={"x": [(4, 3)]})
    assert result.fusions
    assert serialized(g) == before


def test_composition_without_op_names_does_not_touch_the_input():
    g = graph(placeholder("x"), node("c", "_UnaryOpsComposition", ["x"]), node("e", "Exp", ["c"]))
    before = serialized(g)
    result = rewriter.rewrite(g)
    assert serialized(g) == before
    assert ("c", "_UnaryOpsComposition without op_names") in result.refusals


def test_other_graph_content_is_kept():
    g = graph(*chain(["Abs", "Relu", "Exp"]), node("o", "Identity", ["Exp"]))
    g.versions.producer = 1234
    g.library.function.add().signature.name = "f"
    out = rewriter.optimize(g)
    assert out.versions.producer == 1234
    assert out.library.function[0].signature.name == "f"
    assert serialized(by_name(out)["x"]) == serialized(by_name(g)["x"])


# --- graph view --------------------------------------------------------------------------------


def test_graph_view_edges_order_devices_and_shapes():
    g = graph(
        node("c", "NoOp", dtype=None),
        node("scope/y", "Exp", ["scope/x:0", "^c"]),
        placeholder("scope/x", F32, (-1, 3)),
        node("split", "Split", ["scope/y"], _output_shapes=[(2, 3), (2, 3)]),
        node("z", "Neg", ["split:1"], device="/device:GPU:0"),
    )
    view = graph_mod.GraphView(g, shapes={"scope/x": [(5, -1)]})
    assert view.order == ["c", "scope/x", "scope/y", "split", "z"]
    assert view.data_inputs("scope/y") == [("scope/x", 0)]
    assert view.control_inputs("scope/y") == ["c"]
    assert view.control_consumers("c") == ["scope/y"]
    assert view.data_consumers("split") == [("z", 0, 1)]
    assert view.output_shape("scope/x") == (5, 3)
    assert view.output_shape("scope/y") == (5, 3)
    assert view.output_shape("split", 1) == (2, 3)
    assert view.output_shape("z") == (2, 3)
    assert view.output_dtype("scope/x") == F32 and view.output_dtype("z") == F32
    assert view.device_type("z") == "GPU" and view.device_type("c") == "CPU"


@pytest.mark.parametrize(
    "device, kind",
    [("", "CPU"), (CPU0, "CPU"), (GPU0, "GPU"), ("/cpu:0", "CPU"), ("/gpu:1", "GPU"),
     ("/job:worker/task:1", "CPU"), ("/device:NPU:0", "NPU")],
)
def test_device_type(device, kind):
    assert graph_mod.device_type(device) == kind


# --- catalog -----------------------------------------------------------------------------------


def test_catalog_names():
    assert catalog.for_tf_op("AddV2").ir_name == "Add" == catalog.for_tf_op("Add").ir_name
    assert catalog.for_tf_op("RealDiv").ir_name == "Div"
    assert catalog.for_tf_op("Inv").ir_name == "Reciprocal"
    assert catalog.for_tf_op("BiasAdd") is None  # not one to one: see catalog.tf_op
    assert catalog.tf_op("BiasAdd").kind == "broadcast"
    assert catalog.tf_op("AddN").ir_ops == ("Add",)
    assert catalog.tf_op("ClipByValue").ir_ops == ("Maximum", "Minimum", "Less", "Select")
    assert catalog.tf_op("Reshape").kind == "view"
    assert catalog.for_tf_op("Select") is catalog.for_tf_op("SelectV2")
    assert "_UnaryOpsComposition" in catalog.candidate_op_types()
    assert "Reshape" not in catalog.candidate_op_types()
    assert {spec.kind for spec in catalog.OPS} == {"elementwise", "broadcast", "reduce"}
    for spec in catalog.OPS:
        assert spec.kind == {1: "elementwise", 2: "broadcast", 3: "broadcast"}[spec.arity] or (
            spec.kind == "reduce" and spec.attrs == {"axes"})
    assert {catalog.for_ir_name(n).arity for n in ("Add", "SquaredDifference")} == {2}


def _domain(ir_name, rng, shape=(64,)):
    x = rng.uniform(-4, 4, shape)
    if ir_name in ("Log", "Sqrt", "Rsqrt"):
        x = np.abs(x) + 0.01
    if ir_name == "Log1p":
        x = np.abs(x) - 0.5
    if ir_name == "Round":
        x = np.concatenate([x, [0.5, 1.5, 2.5, -0.5, -2.5]])
    return x


def _run_tf_op(op_type, args):
    names = [arg.name for arg in op_def_registry.get(op_type).input_arg]
    op = getattr(tf.raw_ops, op_type)
    return op(**{n: tf.constant(a) for n, a in zip(names, args)}).numpy()


_PLAIN = [s for s in catalog.OPS if not s.attrs and s.kind != "reduce"
          and types_pb2.DT_BOOL not in s.dtypes and s.arity < 3]


@pytest.mark.parametrize("spec", _PLAIN, ids=lambda s: s.ir_name)
def test_catalog_reference_matches_tensorflow(spec):
    rng = np.random.default_rng(0)
    args = [_domain(spec.ir_name, rng) for _ in range(spec.arity)]
    if spec.arity == 2:
        args[1] = np.where(np.abs(args[1]) < 0.1, 0.5, args[1])  # keep Div away from 0
    for tf_op in spec.tf_ops:
        expected = _run_tf_op(tf_op, args)
        np.testing.assert_allclose(spec.reference(*args), expected, rtol=1e-12, atol=1e-12)
    if types_pb2.DT_INT32 in spec.dtypes:
        ints = [rng.integers(-50, 50, (32,)).astype(np.int32) for _ in range(spec.arity)]
        expected = _run_tf_op(spec.tf_ops[0], ints)
        got = spec.reference(*ints)
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)


def test_catalog_reference_of_ops_with_attrs_bool_and_reductions():
    rng = np.random.default_rng(1)
    x = rng.uniform(-4, 4, (6, 5))
    y = rng.uniform(-4, 4, (6, 5))
    spec = catalog.for_ir_name
    np.testing.assert_array_equal(spec("Cast").reference(x, to=np.float16),
                                  tf.cast(x, tf.float16).numpy())
    np.testing.assert_allclose(spec("LeakyRelu").reference(x, alpha=float(np.float32(0.3))),
                               tf.nn.leaky_relu(x, 0.3).numpy(), rtol=1e-15)
    b, c = x > 0, y > 0
    np.testing.assert_array_equal(spec("LogicalAnd").reference(b, c), tf.logical_and(b, c))
    np.testing.assert_array_equal(spec("LogicalOr").reference(b, c), tf.logical_or(b, c))
    np.testing.assert_array_equal(spec("LogicalNot").reference(b), tf.logical_not(b))
    np.testing.assert_array_equal(spec("Select").reference(b, x, y), tf.where(b, x, y))
    for name, fn in [("Greater", tf.greater), ("GreaterEqual", tf.greater_equal),
                     ("Less", tf.less), ("LessEqual", tf.less_equal), ("Equal", tf.equal),
                     ("NotEqual", tf.not_equal)]:
        np.testing.assert_array_equal(spec(name).reference(x, np.round(y)),
                                      fn(x, np.round(y)).numpy())
    for name, fn in [("Sum", tf.reduce_sum), ("Mean", tf.reduce_mean), ("Max", tf.reduce_max),
                     ("Min", tf.reduce_min), ("Prod", tf.reduce_prod)]:
        np.testing.assert_allclose(spec(name).reference(x, axes=(1,)),
                                   fn(x, axis=[1], keepdims=True).numpy(), rtol=1e-12)
    ints = rng.integers(-50, 50, (4, 7)).astype(np.int32)
    np.testing.assert_array_equal(spec("Mean").reference(ints, axes=(0,)),
                                  tf.reduce_mean(ints, axis=[0], keepdims=True).numpy())


# --- refusals ------------------------------------------------------------------------------------


def test_non_consecutive_axes_are_refused():
    def build():
        x = tf1.placeholder(tf.float32, [2, 3, 4], name="x")
        tf.identity(tf.reduce_sum(tf.abs(x), axis=[0, 2]), name="y")
    result = rewriter.rewrite(tf_graph(build), preserve=["y"], flags=REDUCE_ON)
    assert ("Sum", "axes [0, 2] are not consecutive") in result.refusals
    assert not result.fusions


def test_reduce_pass_off_by_default_and_disable_pass():
    g = tf_graph(softmax)
    result = rewriter.rewrite(g, preserve=["y"])
    assert ("Max", "the reduce pass is off (--autofuse_enable_pass=reduce turns it on)") \
        in result.refusals
    assert [f.name for f in result.fusions] == ["autofuse_pointwise_0_Sub_Exp"]
    off = types.SimpleNamespace(autofuse_enable_pass=("reduce",), autofuse_disable_pass=("reduce",))
    assert all(f.kind == "pointwise" for f in rewriter.rewrite(g, ["y"], flags=off).fusions)
    nothing = types.SimpleNamespace(autofuse_disable_pass=("pointwise",))
    assert rewriter.rewrite(g, ["y"], flags=nothing).fusions == []


def test_too_many_inputs():
    nodes = [placeholder(f"p{i}", F32, (4, 3)) for i in range(4)]
    nodes += [node("a0", "AddV2", ["p0", "p1"]), node("a1", "AddV2", ["a0", "p2"]),
              node("a2", "AddV2", ["a1", "p3"])]
    g = graph(*nodes)
    three = types.SimpleNamespace(max_input_nums_after_fuse=3)
    result = rewriter.rewrite(g, preserve=["a2"], flags=three)
    assert [f.nodes for f in result.fusions] == [("a0", "a1")]
    assert ("a2", "too many inputs (4 > max_input_nums_after_fuse=3)") in result.refusals
    assert len(rewriter.rewrite(g, preserve=["a2"]).fusions[0].nodes) == 3


def test_unknown_shapes_are_refused_conservatively():
    g = graph(placeholder("x", F32, (-1, 8)), placeholder("y", F32, (-1, 8)),
              node("a", "Abs", ["x"]), node("add", "AddV2", ["a", "y"]), node("e", "Exp", ["add"]))
    result = rewriter.rewrite(g, preserve=["e"])
    assert ("add", "shapes [?,8] and [?,8] not known to broadcast") in result.refusals
    # one tensor with an unknown size broadcasts against a known [8]
    g = graph(placeholder("x", F32, (-1, 8)), placeholder("b", F32, (8,)),
              node("add", "AddV2", ["x", "b"]), node("e", "Exp", ["add"]))
    assert programs(rewriter.rewrite(g, preserve=["e"])) == {
        "autofuse_pointwise_0_AddV2_Exp": "in0: f32[?,8]\nin1: f32[8]\n%0 = Add in0, in1\n"
                                          "%1 = Exp %0\nout0 = %1\n"}


def test_keep_dims_false_reduction_feeding_a_full_op_is_refused():
    def build():
        x = tf1.placeholder(tf.float32, [5, 5], name="x")
        tf.identity(x - tf.reduce_max(x, axis=1), name="y")  # TF broadcasts [5] along rows
    result = rewriter.rewrite(tf_graph(build), preserve=["y"], flags=REDUCE_ON)
    assert not result.fusions
    assert ("sub", "cannot join Max's group: sub: Max (a keep_dims=false reduction) broadcasts "
                   "in TF unlike its keep_dims form") in result.refusals


def test_an_output_of_another_shape_is_refused():
    g = graph(placeholder("x", F32, (4, 3)), placeholder("b", F32, (3,)),
              node("nb", "Neg", ["b"]), node("add", "AddV2", ["x", "nb"]),
              node("other", "Identity", ["nb"]))
    result = rewriter.rewrite(g, preserve=["add", "other"])
    assert not result.fusions
    assert ("add", "cannot join nb's group: nb would be an output of shape [3], not the iteration "
                   "shape [4,3]") in result.refusals


def test_select_v1_with_a_row_condition_is_refused():
    g = graph(placeholder("c", types_pb2.DT_BOOL, (4,)), placeholder("x", F32, (4, 3)),
              node("a", "Abs", ["x"]), node("s", "Select", ["c", "a", "x"]))
    assert ("s", "Select (v1) whose condition is neither a scalar nor x's shape") \
        in rewriter.rewrite(g, ["s"]).refusals


def test_equal_with_incompatible_shape_error_false_is_refused():
    eq = node("eq", "Equal", ["a", "x"])
    eq.attr["incompatible_shape_error"].b = False
    g = graph(placeholder("x", F32, (4, 3)), node("a", "Abs", ["x"]), eq)
    assert ("eq", "Equal with incompatible_shape_error=false") in rewriter.rewrite(g, ["eq"]).refusals


# --- policy: skip list, disable scope, recomputation -------------------------------------------


def test_skip_list_by_name_and_type():
    skip = types.SimpleNamespace(names=frozenset({"Relu"}), types=frozenset({"Exp"}))
    g = graph(*chain(["Abs", "Neg", "Relu", "Exp", "Tanh", "Sin"]))
    result = rewriter.rewrite(g, preserve=["Sin"],
                              flags=types.SimpleNamespace(skip_node_names_cfg=skip))
    assert [f.nodes for f in result.fusions] == [("Abs", "Neg"), ("Tanh", "Sin")]
    reasons = dict(result.refusals)
    assert reasons["Relu"] == "listed in --skip_node_names_cfg [ByNodeName]"
    assert reasons["Exp"] == "listed in --skip_node_names_cfg [ByNodeType]"


def test_disable_scope_attr_is_never_fused():
    nodes = chain(["Abs", "Relu", "Exp"])
    nodes[2].attr["_disable_autofuse_scope"].b = True
    result = rewriter.rewrite(graph(*nodes), preserve=["Exp"])
    assert not result.fusions
    assert ("Relu", "inside tf_autofuse.disable_autofuse()") in result.refusals


def test_disable_autofuse_marks_nodes_in_graphs_and_functions():
    import tf_autofuse

    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4], name="x")
        a = tf.abs(x, name="a")
        with tf_autofuse.disable_autofuse():
            b = tf.exp(a, name="b")
        tf.nn.relu(b, name="c")
    marked = {n.name for n in g.as_graph_def().node if "_disable_autofuse_scope" in n.attr}
    assert marked == {"b"}

    @tf.function
    def f(x):
        with tf_autofuse.disable_autofuse():
            y = tf.exp(x, name="inner")
        return tf.abs(y, name="outer")
    fn = f.get_concrete_function(tf.TensorSpec([4], tf.float32)).function_def
    marked = {n.name for n in fn.node_def if "_disable_autofuse_scope" in n.attr}
    assert marked == {"inner"}


def test_recomputation_threshold_duplicates_cheap_producers():
    g = graph(
        placeholder("x", F32, (3, 3)),
        node("a", "Abs", ["x"]),
        node("b", "Exp", ["a"]),
        node("m", "MatMul", ["b", "b"], _output_shapes=[(3, 3)]),
        node("d", "AddV2", ["a", "m"]),
        node("r", "Relu", ["d"]),
    )
    plain = rewriter.rewrite(g, preserve=["r"])
    assert [(f.nodes, f.program.count("out")) for f in plain.fusions] == [
        (("a", "b"), 2), (("d", "r"), 1)]
    again = rewriter.rewrite(g, preserve=["r"], flags=types.SimpleNamespace(recomputation_threshold=1))
    assert programs(again) == {
        "autofuse_pointwise_0_Abs_Exp": "in0: f32[3,3]\n%0 = Abs in0\n%1 = Exp %0\nout0 = %1\n",
        "autofuse_pointwise_1_Abs_AddV2_Relu": "in0: f32[3,3]\nin1: f32[3,3]\n%0 = Abs in0\n"
                                               "%1 = Add %0, in1\n%2 = Relu %1\nout0 = %2\n"}
    (second,) = [n for n in fused_nodes(again.graph_def) if "AddV2" in n.name]
    assert list(second.input) == ["x", "m"]


def test_recomputed_copy_reading_a_value_recomputed_elsewhere_keeps_its_output():
    """Regression (found by tests/test_random_graphs.py): g2 recomputes m for c, g3 recomputes
    c for e but reads m from g1. `served[m] = {c}` made g1 drop its output m, and g3's kernel
    read the removed node m."""
    g = graph(
        placeholder("x", F32, (3, 3)),
        node("m", "Abs", ["x"]),
        node("n", "Exp", ["m"]),
        node("M1", "MatMul", ["n", "n"], _output_shapes=[(3, 3)]),
        node("c", "AddV2", ["m", "M1"]),
        node("d", "Relu", ["c"]),
        node("M2", "MatMul", ["d", "d"], _output_shapes=[(3, 3)]),
        node("e", "AddV2", ["c", "M2"]),
        node("f", "Sigmoid", ["e"]),
    )
    result = rewriter.rewrite(g, preserve=["f"],
                              flags=types.SimpleNamespace(recomputation_threshold=1))
    assert [f.nodes for f in result.fusions] == [("m", "n"), ("c", "d"), ("e", "f")]
    names = {n.name for n in result.graph_def.node}
    for n in result.graph_def.node:
        for text in n.input:
            assert text.lstrip("^").split(":")[0] in names, (n.name, text)
    first, _, third = result.fusions
    assert first.program.count("out") == 2  # n for M1, and m for the third kernel
    (kernel,) = [n for n in fused_nodes(result.graph_def) if n.name == third.name]
    assert kernel.input[0] == first.name  # m, out0 of the first kernel
    values = {"x": uniform(42, (3, 3))}
    np.testing.assert_allclose(run_graph(expand_fused(result.graph_def), ["f"], values)[0],
                               run_graph(g, ["f"], values)[0], rtol=1e-6)


def test_view_read_as_it_is_by_another_kernel_stays():
    """Regression (found by tests/test_random_graphs.py): the second kernel recomputes s and r
    reading b through the view; the first (whose output nobody needs any more, so it keeps its
    plain lowering) reads the view node v itself, which the splice removed all the same."""
    g = graph(
        placeholder("x", F32, (3,)),
        placeholder("b", F32, (3,)),
        const("axis", np.int32(0), tf.int32),
        node("v", "ExpandDims", ["b", "axis"]),
        node("s", "SquaredDifference", ["x", "v"]),
        node("r", "Reciprocal", ["s"]),
        node("a", "AddN", ["r", "r"]),
        node("c", "Exp", ["a"]),
    )
    g.node[6].attr["N"].i = 2
    flags = types.SimpleNamespace(max_fusion_size=2, recomputation_threshold=3)
    result = rewriter.rewrite(g, preserve=["c"], flags=flags)
    first, second = result.fusions
    assert (first.nodes, second.nodes) == (("s", "r"), ("a", "c"))
    assert "in1: f32[3] -> [1,3]" in second.program  # b through the view
    out = {n.name: n for n in result.graph_def.node}
    assert list(out[first.name].input) == ["x", "v"] and out["v"].op == "ExpandDims"
    values = {"x": uniform(43, (3,)), "b": uniform(44, (3,))}
    np.testing.assert_allclose(run_graph(expand_fused(result.graph_def), ["c"], values)[0],
                               run_graph(g, ["c"], values)[0], rtol=1e-6)


def test_node_with_too_many_inputs_alone_fuses_with_its_producer():
    """x + (x + x) reads x twice on its own, once with its producer: with
    max_input_nums_after_fuse=1 the two fuse in the first pass (the second pass, which sees the
    rest of the graph without shapes, fused them instead: not idempotent)."""
    g = graph(placeholder("x", F32, (4, 3)), node("b", "AddV2", ["x", "x"]),
              node("c", "AddV2", ["x", "b"]), node("y", "Exp", ["c"]))
    flags = types.SimpleNamespace(max_input_nums_after_fuse=1, max_fusion_size=2)
    result = rewriter.rewrite(g, preserve=["y"], flags=flags)
    assert [f.nodes for f in result.fusions] == [("b", "c")]
    assert not rewriter.rewrite(result.graph_def, preserve=["y"], flags=flags).fusions


@pytest.mark.parametrize("model", ["latency", "memory_bandwidth", "compute_density"])
def test_cost_model_merges_a_node_that_does_not_lower_alone(model):
    """x + (x + x) with max_input_nums_after_fuse=1: c does not lower alone (two inputs), so its
    group has no program of its own to weigh a merge against. Every cost model lets the merge
    through (it is the only way c fuses) instead of failing the pass."""
    g = graph(placeholder("x", F32, (4, 3)), node("b", "AddV2", ["x", "x"]),
              node("c", "AddV2", ["x", "b"]), node("y", "Exp", ["c"]))
    flags = types.SimpleNamespace(max_input_nums_after_fuse=1, max_fusion_size=2, cost_model=model)
    result = rewriter.rewrite(g, preserve=["y"], flags=flags)
    assert [f.nodes for f in result.fusions] == [("b", "c")]


def test_two_groups_absorbing_one_view_both_stay():
    """Regression (found by tests/test_random_graphs.py): a view node absorbed by a group and by
    another that recomputes its consumer was the first member of both, and the splice kept only
    the last group's kernel: the first one's node (read by MatMul) and its outputs were gone."""
    g = graph(
        placeholder("x", F32, (3, 3)),
        placeholder("b", F32, (1, 3)),
        node("v", "Squeeze", ["b"]),
        node("a", "AddV2", ["x", "v"]),
        node("e", "Exp", ["a"]),
        node("m", "MatMul", ["e", "e"], _output_shapes=[(3, 3)]),
        node("d", "AddV2", ["a", "m"]),
        node("r", "Relu", ["d"]),
    )
    g.node[2].attr["squeeze_dims"].list.i.extend([0])
    flags = types.SimpleNamespace(recomputation_threshold=1)
    result = rewriter.rewrite(g, preserve=["r", "e"], flags=flags)
    assert [f.nodes for f in result.fusions] == [("a", "e"), ("d", "r")]
    out = {n.name: n for n in result.graph_def.node}
    assert {f.name for f in result.fusions} <= set(out)
    assert out["e"].op == "Identity" and out["e"].input[0] == result.fusions[0].name
    assert list(out["m"].input) == [result.fusions[0].name] * 2
    assert "v" not in out  # read through the view by both kernels
    values = {"x": uniform(40, (3, 3)), "b": uniform(41, (1, 3))}
    want = run_graph(g, ["r", "e"], values)
    got = run_graph(expand_fused(result.graph_def), ["r", "e"], values)
    for w, v in zip(want, got):
        np.testing.assert_allclose(v, w, rtol=1e-6)


@pytest.mark.parametrize("build", [gelu_tanh, softmax])
def test_new_patterns_are_idempotent_and_deterministic(build):
    g = tf_graph(build)
    once = rewriter.optimize(g, preserve=["y"], flags=REDUCE_ON)
    twice = rewriter.rewrite(once, preserve=["y"], flags=REDUCE_ON)
    assert not twice.fusions
    assert serialized(twice.graph_def) == serialized(once)
    assert serialized(rewriter.optimize(g, preserve=["y"], flags=REDUCE_ON)) == serialized(once)


def test_a_fed_or_control_dependent_scalar_const_is_an_input():
    g = graph(placeholder("x", F32, (4, 3)), const("c", np.float32(2.0)),
              node("m", "Mul", ["x", "c"]), node("e", "Exp", ["m"]))
    assert programs(rewriter.rewrite(g, ["e"]))[
        "autofuse_pointwise_0_Mul_Exp"].startswith("in0: f32[4,3]\n%0 = Mul in0, 2.0\n")
    assert "c" not in by_name(rewriter.optimize(g, ["e"]))  # only the program reads it now
    fed = rewriter.rewrite(g, ["e"], feeds=["c"])
    assert programs(fed)["autofuse_pointwise_0_Mul_Exp"].startswith(
        "in0: f32[4,3]\nin1: f32[]\n%0 = Mul in0, in1\n")
    assert "c" in by_name(fed.graph_def)
    g.node[1].input.append("^x")
    assert "in1: f32[]" in programs(rewriter.rewrite(g, ["e"]))["autofuse_pointwise_0_Mul_Exp"]


def test_debug_dump_lists_refusals_with_reasons(tmp_path):
    from tf_autofuse import debug

    g = tf_graph(softmax)
    result = rewriter.rewrite(g, preserve=["y"])
    debug.dump(str(tmp_path), g, result)
    (refusals,) = tmp_path.glob("graph_*_refusals.txt")
    text = refusals.read_text()
    assert "Max: the reduce pass is off (--autofuse_enable_pass=reduce turns it on)\n" in text
    (fusions,) = tmp_path.glob("graph_*_fusions.txt")
    assert "autofuse_pointwise_0_Sub_Exp  (pointwise)" in fusions.read_text()


def test_symbolic_sizes_the_graph_knows_are_resolved_everywhere():
    # Grappler: x is [s2,s3,s4,s5] and the conv [s2,s3,s4,8]; the placeholder knows s3=s4=8
    g = graph(placeholder("x", F32, (-1, 8, 8, 8)), node("c", "Conv2D", ["x", "x"]),
              node("a", "Abs", ["c"]), node("add", "AddV2", ["a", "x"]))
    view = graph_mod.GraphView(g, shapes={"x": [(-2, -3, -4, -5)], "c": [(-2, -3, -4, 8)]})
    assert view.output_shape("x") == (-2, 8, 8, 8)
    assert view.output_shape("c") == (-2, 8, 8, 8)
    assert view.output_shape("add") == (-2, 8, 8, 8)


def test_disable_scope_attr_reaches_the_pass_in_a_session(monkeypatch):
    import tf_autofuse

    seen = []
    real = rewriter.rewrite

    def spy(graph_def, **kwargs):
        seen.append(graph_def)
        return real(graph_def, **kwargs)
    monkeypatch.setattr(rewriter, "rewrite", spy)

    # (Grappler's arithmetic optimizer replaces x + x, x * x or chains of unary ops by new
    # nodes that do not carry the attr: these use two different tensors.)
    @tf.function
    def inner(x, w):
        with tf_autofuse.disable_autofuse():
            return tf.multiply(x, w, name="fn_scoped")

    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [8], name="x")
        w = tf1.placeholder(tf.float32, [8], name="w")
        with tf_autofuse.disable_autofuse():
            a = tf.add(x, w, name="scoped")
        y = tf.nn.relu(tf.abs(inner(a, w) + x), name="y")
        with tf1.Session(graph=g, config=sessions.config()) as sess:
            xs = np.arange(8, dtype=np.float32)
            value = sess.run(y, {x: xs, w: xs - 3})
    np.testing.assert_allclose(value, np.abs((2 * xs - 3) * (xs - 3) + xs), rtol=1e-6)
    assert seen
    marked = {n.name.split("/")[-1] for gd in seen for n in gd.node
              if "_disable_autofuse_scope" in n.attr}
    marked |= {n.name.split("/")[-1] for gd in seen for f in gd.library.function
               for n in f.node_def if "_disable_autofuse_scope" in n.attr}
    assert {"scoped", "fn_scoped"} <= marked, marked


def test_layer_norm_with_sub_and_square():
    def build():
        x = tf1.placeholder(tf.float32, [4, 8, 32], name="x")
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)
        centered = x - mean
        variance = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
        gamma = tf.constant(np.linspace(0.5, 1.5, 32).astype(np.float32), name="gamma")
        beta = tf.constant(np.linspace(-1, 1, 32).astype(np.float32), name="beta")
        tf.identity(centered * tf.math.rsqrt(variance + 1e-5) * gamma + beta, name="y")
    fused = fused_programs(build, ["y"], {"x": uniform(30, (4, 8, 32))}, rtol=1e-5,
                           flags=REDUCE_ON)
    assert fused == {"autofuse_reduce_0_Mean_Sub_Square_Mean_AddV2_Rsqrt_Mul_Mul_AddV2": (
        "in0: f32[4,8,32]\nin1: f32[32]\nin2: f32[32]\n%0 = Mean in0 axes=[2]\n%1 = Sub in0, %0\n"
        "%2 = Square %1\n%3 = Mean %2 axes=[2]\n%4 = Cast %3 to=f64\n"
        "%5 = Add %4, 9.999999747378752e-06\n%6 = Rsqrt %5\n%7 = Cast %6 to=f32\n"
        "%8 = Mul %1, %7\n%9 = Mul %8, in1\n%10 = Add %9, in2\nout0 = %10\n")}


