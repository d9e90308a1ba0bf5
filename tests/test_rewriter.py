"""The pure-Python rewriter (tf_autofuse.rewriter), Grappler-remapper style.

Graphs are built by hand (NodeDef protos) or with tf.Graph; the tests assert the structure
of the rewritten GraphDef (fused nodes, names, inputs, program text, refusals) and, when the
AutofuseKernel op library is available, run the original and the rewritten graph.
"""

import types

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2, types_pb2
from tensorflow.core.protobuf import rewriter_config_pb2
from tensorflow.python.framework import op_def_registry

import sessions
from tf_autofuse import rewriter
from tf_autofuse.rewriter import catalog, graph as graph_mod, naming, partition
from tf_autofuse.rewriter import program as ir

tf1 = tf.compat.v1
F16, F32, F64 = types_pb2.DT_HALF, types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE
I32, I64 = types_pb2.DT_INT32, types_pb2.DT_INT64
CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"
GPU0 = "/job:localhost/replica:0/task:0/device:GPU:0"
# the program of abs -> relu -> exp: the simplify pass drops the Relu of |x| (rewriter/passes.py)
ABS_RELU_EXP = "in0: f16[128,192]\n%0 = Abs in0\n%1 = Exp %0\nout0 = %1\n"
ABS_RELU_EXP_NAME = "autofuse_pointwise_0_Abs_Relu_Exp"


# --- graph building helpers -------------------------------------------------------------------


def node(name, op, inputs=(), dtype=F32, device="", **attrs):
    n = node_def_pb2.NodeDef(name=name, op=op, device=device)
    n.input.extend(inputs)
    if dtype is not None:
        n.attr["T"].type = dtype
    for key, value in attrs.items():
        if key == "op_names":
            n.attr[key].list.s.extend(v.encode() for v in value)
        elif key == "_output_shapes":
            for shape in value:
                proto = n.attr[key].list.shape.add()
                for d in shape:
                    proto.dim.add().size = d
        else:
            raise ValueError(key)
    return n


def placeholder(name, dtype=F32, shape=(4, 3), device=""):
    n = node_def_pb2.NodeDef(name=name, op="Placeholder", device=device)
    n.attr["dtype"].type = dtype
    if shape is None:
        n.attr["shape"].shape.unknown_rank = True
    else:
        for d in shape:
            n.attr["shape"].shape.dim.add().size = d
    return n


def const(name, value, dtype=tf.float32):
    n = node_def_pb2.NodeDef(name=name, op="Const")
    n.attr["dtype"].type = dtype.as_datatype_enum
    n.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.asarray(value), dtype))
    return n


def graph(*nodes):
    g = graph_pb2.GraphDef()
    g.node.extend(nodes)
    return g


def chain(ops, dtype=F32, shape=(4, 3), device="", source="x"):
    """x -> ops[0] -> ops[1] ...; node names are the op types."""
    nodes = [placeholder(source, dtype, shape, device)]
    previous = source
    for op in ops:
        nodes.append(node(op, op, [previous], dtype, device))
        previous = op
    return nodes


def by_name(graph_def):
    return {n.name: n for n in graph_def.node}


def fused_nodes(graph_def):
    return [n for n in graph_def.node if n.op == "AutofuseKernel"]


def program_of(n):
    return n.attr["program"].s.decode()


def op_types(graph_def):
    return sorted(n.op for n in graph_def.node)


def serialized(graph_def):
    return graph_def.SerializeToString(deterministic=True)


def flags(max_fusion_size):
    return types.SimpleNamespace(max_fusion_size=max_fusion_size)


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


# --- numbers: original vs rewritten ------------------------------------------------------------
#
# Two ways to run a rewritten graph: "expanded" replaces each AutofuseKernel by the TF ops its
# program names (checks the rewiring: inputs, outputs, Identities, control edges, without the
# kernel); "kernel" runs the AutofuseKernel op itself (skipped until its library is built).

_TF_OP = {spec.ir_name: spec.tf_ops[0] for spec in catalog.OPS}


def _shape_const(name, dims):
    return const(name, np.array([-1 if d < 0 else d for d in dims], np.int32), tf.int32)


def _expand_fused(graph_def):
    """Each AutofuseKernel -> the TF ops its program means (views: Reshape; reductions:
    keep_dims=True over the iteration axes; immediates: Consts of the operand dtype)."""
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    del out.node[:]
    for n in graph_def.node:
        if n.op != "AutofuseKernel":
            out.node.add().CopyFrom(n)
            continue
        p = ir.parse(program_of(n))
        dtypes = p.value_dtypes()
        data = [i for i in n.input if not i.startswith("^")]
        controls = [i for i in n.input if i.startswith("^")]
        values, kinds = {}, {}
        for k, (src, decl) in enumerate(zip(data, p.inputs)):
            kinds[ir.In(k)] = decl.dtype
            if decl.view is None:
                values[ir.In(k)] = src
                continue
            shape = _shape_const(f"{n.name}/in{k}_shape", decl.view)
            view = node(f"{n.name}/in{k}", "Reshape", [src, shape.name], ir.DTYPES[decl.dtype])
            view.attr["Tshape"].type = types_pb2.DT_INT32
            out.node.extend([shape, view])
            values[ir.In(k)] = view.name
        for i, inst in enumerate(p.instructions):
            spec = catalog.for_ir_name(inst.op)
            roles = spec.operand_roles()
            data_dtype = next((kinds[o] for o, r in zip(inst.operands, roles)
                               if isinstance(o, ir.Ref) and r == "data"), "bool")
            operands = []
            for j, (operand, role) in enumerate(zip(inst.operands, roles)):
                if isinstance(operand, ir.Ref):
                    operands.append(values[operand])
                    continue
                kind = "bool" if role == "bool" else data_dtype
                c = const(f"{n.name}/imm{i}_{j}", operand, tf.as_dtype(ir.DTYPES[kind]))
                out.node.append(c)
                operands.append(c.name)
            attrs = dict(inst.attrs)
            name = f"{n.name}/v{i}"
            t = ir.DTYPES[data_dtype]
            if spec.kind == "reduce":
                axes = const(f"{name}/axes", np.array(ir.parse_axes(attrs["axes"]), np.int32),
                             tf.int32)
                out.node.append(axes)
                new = node(name, _TF_OP[inst.op], operands + [axes.name], t)
                new.attr["keep_dims"].b = True
                new.attr["Tidx"].type = types_pb2.DT_INT32
            elif inst.op == "Cast":
                new = node(name, "Cast", operands, None)
                new.attr["SrcT"].type = t
                new.attr["DstT"].type = ir.DTYPES[attrs["to"]]
            elif spec.dtypes == catalog.BOOL:
                new = node(name, _TF_OP[inst.op], operands, None)
            else:
                new = node(name, _TF_OP[inst.op], operands, t)
                if "alpha" in attrs:
                    new.attr["alpha"].f = float(attrs["alpha"])
            out.node.append(new)
            values[ir.Val(i)] = name
            kinds[ir.Val(i)] = dtypes[i]
        results = []
        for k, (ref, view) in enumerate(zip(p.outputs, p.output_views)):
            if view is None:
                results.append(values[ref])
                continue
            shape = _shape_const(f"{n.name}/out{k}_shape", view)
            reshaped = node(f"{n.name}/out{k}", "Reshape", [values[ref], shape.name],
                            ir.DTYPES[kinds[ref]])
            reshaped.attr["Tshape"].type = types_pb2.DT_INT32
            out.node.extend([shape, reshaped])
            results.append(reshaped.name)
        outputs = node(n.name, "IdentityN", results + controls, None, n.device)
        outputs.attr["T"].list.type.extend(n.attr["Tout"].list.type)
        out.node.append(outputs)
    return out


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
        return lambda graph_def, fetches, values: _run(graph_def, fetches, values)
    return lambda graph_def, fetches, values: _run(_expand_fused(graph_def), fetches, values)


def _run(graph_def, fetches, feeds):
    cfg = tf1.ConfigProto()
    cfg.graph_options.rewrite_options.disable_meta_optimizer = True
    cfg.graph_options.rewrite_options.use_plugin_optimizers = rewriter_config_pb2.RewriterConfig.OFF
    g = tf.Graph()
    with g.as_default():
        tf1.import_graph_def(graph_def, name="")
        with tf1.Session(graph=g, config=cfg) as sess:
            return sess.run([f + ":0" for f in fetches], {k + ":0": v for k, v in feeds.items()})


def _compare(run_fused, g, fetches, values, rtol, **kwargs):
    result = rewriter.rewrite(g, preserve=fetches, **kwargs)
    assert result.fusions
    want = _run(g, fetches, values)
    got = run_fused(result.graph_def, fetches, values)
    for w, v in zip(want, got):
        assert w.dtype == v.dtype and w.shape == v.shape
        np.testing.assert_allclose(v.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=rtol)
    return result


def _uniform(seed, shape, dtype=np.float32, low=-3, high=3):
    return np.random.default_rng(seed).uniform(low, high, shape).astype(dtype)


def test_run_abs_relu_exp_f16(run_fused):
    g = graph(*chain(["Abs", "Relu", "Exp"], F16, (128, 192)))
    _compare(run_fused, g, ["Exp"], {"x": _uniform(1, (128, 192), np.float16)}, rtol=2e-3)


def test_run_abs_relu_exp_built_with_tf_graph(run_fused):
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [16, 8], name="x")
        tf.exp(tf.nn.relu(tf.abs(x)), name="y")
    _compare(run_fused, g.as_graph_def(), ["y"], {"x": _uniform(1, (16, 8))}, rtol=1e-6)


def test_run_composition(run_fused):
    composed = node("Exp", "_UnaryOpsComposition", ["x"], F32, op_names=["Abs", "Relu", "Exp"])
    g = graph(placeholder("x", F32, (16, 8)), composed)
    _compare(run_fused, g, ["Exp"], {"x": _uniform(2, (16, 8))}, rtol=1e-6)


def test_run_preserved_middle_and_fed_middle(run_fused):
    g = graph(*chain(["Abs", "Sqrt", "Relu", "Exp", "Neg"]))
    x = _uniform(3, (4, 3))
    _compare(run_fused, g, ["Sqrt", "Neg"], {"x": x}, rtol=1e-6)
    fed = {"x": x, "Relu": np.full((4, 3), 0.25, np.float32)}
    result = _compare(run_fused, g, ["Sqrt", "Neg"], fed, rtol=1e-6, feeds=["Relu"])
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
    values = {"x": _uniform(4, (8, 16)), "y": _uniform(5, (8, 16))}
    _compare(run_fused, g, ["swish", "m"], values, rtol=1e-6)


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
    result = _compare(run_fused, g, ["s", "X"], {"x": _uniform(6, (4, 3))}, rtol=1e-6,
                      flags=flags(2))
    assert [f.nodes for f in result.fusions] == [("abs", "a"), ("b", "e"), ("t", "s")]


def test_run_int32(run_fused):
    g = graph(
        placeholder("x", I32, (5, 7)),
        node("sq", "Square", ["x"], I32),
        node("n", "Neg", ["sq"], I32),
        node("d", "SquaredDifference", ["n", "x"], I32),
    )
    x = np.random.default_rng(7).integers(-100, 100, (5, 7)).astype(np.int32)
    _compare(run_fused, g, ["d"], {"x": x}, rtol=0)


# --- issue 3: broadcast, views, reductions, new ops ---------------------------------------------

REDUCE_ON = types.SimpleNamespace(max_fusion_size=64, autofuse_enable_pass=("reduce",))


def tf_graph(build):
    """A GraphDef (with _output_shapes) built with the TF1 API."""
    g = tf.Graph()
    with g.as_default():
        build()
    return g.as_graph_def(add_shapes=True)


def expanded_matches(g, fetches, values, rtol=1e-6, **kwargs):
    """The rewritten graph, with each fused node expanded into TF ops, gives the original's
    numbers: checks inputs, views, immediates, reductions and outputs without the kernel."""
    result = rewriter.rewrite(g, preserve=fetches, **kwargs)
    assert result.fusions
    want = _run(g, fetches, values)
    got = _run(_expand_fused(result.graph_def), fetches, values)
    for w, v in zip(want, got):
        assert w.dtype == v.dtype and w.shape == v.shape
        np.testing.assert_allclose(v.astype(np.float64), w.astype(np.float64), rtol=rtol,
                                   atol=rtol)
    return result


def programs(result):
    return {f.name: f.program for f in result.fusions}


def fused_programs(g, fetches, values, **kwargs):
    """{name: program} of the fusions of `g` (a GraphDef, or a function building one with the TF1
    API), whose expansion gives the original's numbers (expanded_matches)."""
    return programs(expanded_matches(tf_graph(g) if callable(g) else g, fetches, values, **kwargs))


def gelu_tanh():
    x = tf1.placeholder(tf.float32, [8, 64], name="x")
    y = x * 0.5 * (1.0 + tf.tanh(0.7978845608 * (x + 0.044715 * tf.pow(x, 3.0))))
    tf.identity(y, name="y")


def test_gelu_tanh_form_is_one_pointwise_kernel():
    g = tf_graph(gelu_tanh)
    result = expanded_matches(g, ["y"], {"x": _uniform(0, (8, 64))})
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
    fused = fused_programs(build, ["y"], {"x": _uniform(1, (8, 64))})
    assert fused == {"autofuse_pointwise_0_Mul_RealDiv_Erf_AddV2_Mul": (
        "in0: f32[8,64]\n%0 = Mul 0.5, in0\n%1 = Div in0, 1.4142135381698608\n%2 = Erf %1\n"
        "%3 = Add 1.0, %2\n%4 = Mul %0, %3\nout0 = %4\n")}


def test_swish_with_a_bias_reads_the_bias_const_as_an_input():
    def build():
        x = tf1.placeholder(tf.float32, [8, 64], name="x")
        b = tf.constant(np.linspace(-1, 1, 64).astype(np.float32), name="b")
        h = x + b
        tf.identity(h * tf.sigmoid(h), name="y")
    result = expanded_matches(tf_graph(build), ["y"], {"x": _uniform(2, (8, 64))})
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
    result = expanded_matches(g, ["y"], {"x": _uniform(3, (8, 16, 64))}, rtol=1e-5,
                              flags=REDUCE_ON)
    assert programs(result) == {
        "autofuse_reduce_0_Mean_SquaredDifference_Mean_AddV2_Rsqrt_Mul_Mul_Mul_Sub_AddV2": (
            "in0: f32[8,16,64]\nin1: f32[64]\nin2: f32[64]\n"
            "%0 = Mean in0 axes=[2]\n%1 = SquaredDifference in0, %0\n%2 = Mean %1 axes=[2]\n"
            "%3 = Add %2, 0.0010000000474974513\n%4 = Rsqrt %3\n%5 = Mul %4, in1\n"
            "%6 = Mul in0, %5\n%7 = Mul %0, %5\n%8 = Sub in2, %7\n%9 = Add %6, %8\nout0 = %9\n")}
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
    fused = fused_programs(build, ["y"], {"x": _uniform(4, (4, 32))}, flags=REDUCE_ON)
    assert fused == {"autofuse_reduce_0_Mul_Mean_Rsqrt": (
        "in0: f32[4,32]\n%0 = Mul in0, in0\n%1 = Mean %0 axes=[1]\n%2 = Rsqrt %1\n"
        "out0 = %2 -> [4]\n")}


def softmax():
    x = tf1.placeholder(tf.float32, [8, 10], name="x")
    m = tf.reduce_max(x, axis=1, keepdims=True)
    e = tf.exp(x - m)
    tf.identity(e / tf.reduce_sum(e, axis=-1, keepdims=True), name="y")


def test_softmax_is_one_reduce_kernel():
    fused = fused_programs(softmax, ["y"], {"x": _uniform(5, (8, 10))}, flags=REDUCE_ON)
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

    result = expanded_matches(tf_graph(squeeze), ["s"], {"x": _uniform(6, (2, 7, 7, 16))},
                              flags=REDUCE_ON)
    assert programs(result) == {"autofuse_reduce_0_Abs_Mean_Relu": (
        "in0: f32[2,7,7,16]\n%0 = Abs in0\n%1 = Mean %0 axes=[1,2]\n%2 = Relu %1\nout0 = %2\n")}
    fused = fused_programs(excite, ["y"], {"x": _uniform(7, (2, 7, 7, 16)),
                                           "gate": _uniform(8, (2, 1, 1, 16))})
    assert fused == {"autofuse_pointwise_0_Sigmoid_Mul": (
        "in0: f32[2,1,1,16]\nin1: f32[2,7,7,16]\n%0 = Sigmoid in0 invariant\n%1 = Mul in1, %0\n"
        "out0 = %1\n")}  # the gate's sigmoid computed once a run (passes.hoist)


def test_residual_add_relu():
    g = graph(placeholder("x", F32, (4, 8, 8, 16)), placeholder("skip", F32, (4, 8, 8, 16)),
              node("add", "AddV2", ["x", "skip"]), node("relu", "Relu", ["add"]))
    fused = fused_programs(g, ["relu"], {"x": _uniform(9, (4, 8, 8, 16)),
                                         "skip": _uniform(10, (4, 8, 8, 16))})
    assert fused == {"autofuse_pointwise_0_AddV2_Relu": (
        "in0: f32[4,8,8,16]\nin1: f32[4,8,8,16]\n%0 = Add in0, in1\n%1 = Relu %0\nout0 = %1\n")}


def bias_add(data_format):
    n = node("bias_add", "BiasAdd", ["x", "b"])
    n.attr["data_format"].s = data_format.encode()
    return n


def test_bias_add_relu6_nchw_views_the_bias():
    g = graph(placeholder("x", F32, (2, 16, 5, 5)), placeholder("b", F32, (16,)),
              bias_add("NCHW"), node("r6", "Relu6", ["bias_add"]))
    fused = fused_programs(g, ["r6"], {"x": _uniform(11, (2, 16, 5, 5)), "b": _uniform(12, (16,))})
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
    fused = fused_programs(build, ["y"], {"x": _uniform(13, (4, 6)), "w": _uniform(14, (4, 6))})
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
    fused = fused_programs(build, ["y"], {"x": _uniform(15, (4, 6)), "c": _uniform(16, (4, 1))})
    assert fused == {"autofuse_pointwise_0_Sub_Exp_Mul": (
        "in0: f32[4,6]\nin1: f32[4,1]\n%0 = Sub in0, in1\n%1 = Exp %0\n%2 = Mul %1, 3.0\n"
        "out0 = %2\n")}


def test_reduction_over_axes_1_2_with_and_without_keep_dims():
    def build():
        x = tf1.placeholder(tf.float32, [2, 3, 4, 5], name="x")
        tf.identity(tf.reduce_sum(tf.abs(x), axis=[1, 2], keepdims=True), name="y")
        tf.identity(tf.reduce_sum(tf.abs(x), axis=[2, -3], keepdims=False), name="z")
    fused = fused_programs(build, ["y", "z"], {"x": _uniform(17, (2, 3, 4, 5))}, flags=REDUCE_ON)
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
    fused = fused_programs(build, ["m", "centered"], {"x": _uniform(18, (6, 5))}, flags=REDUCE_ON)
    assert fused == {"autofuse_reduce_0_Mean_Sub": (
        "in0: f32[6,5]\n%0 = Mean in0 axes=[0]\n%1 = Sub in0, %0\nout0 = %0 -> [5]\nout1 = %1\n")}


def test_input_views_reshape_expand_dims_squeeze():
    def build():
        x = tf1.placeholder(tf.float32, [4, 16, 8, 8], name="x")
        b = tf1.placeholder(tf.float32, [16], name="b")
        s = tf1.placeholder(tf.float32, [4, 1, 1, 8, 1], name="s")
        c = tf1.placeholder(tf.float32, [4, 16], name="c")
        h = tf.nn.relu(x + tf.reshape(b, [16, 1, 1]))
        h = h * tf.squeeze(s, axis=[4])
        tf.identity(h - tf.expand_dims(tf.expand_dims(c, -1), -1), name="y")
    values = {"x": _uniform(19, (4, 16, 8, 8)), "b": _uniform(20, (16,)),
              "s": _uniform(21, (4, 1, 1, 8, 1)), "c": _uniform(22, (4, 16))}
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
    fused = fused_programs(build, ["y"], {"x": _uniform(23, (3, 4)), "w": _uniform(24, (3, 4))},
                           rtol=1e-3)
    assert fused == {
        "autofuse_pointwise_0_Abs_AddN_ClipByValue_LeakyRelu_Cast_Mul_Cast": (
            "in0: f32[3,4]\nin1: f32[3,4]\n%0 = Abs in0\n%1 = Add in0, in1\n%2 = Add %1, %0\n"
            "%3 = Minimum %2, 2.0\n%4 = Maximum %3, -1.0\n%5 = LeakyRelu %4 alpha=0.25\n"
            "%6 = Cast %5 to=f16\n%7 = Mul %6, 2.0\n%8 = Cast %7 to=f32\nout0 = %8\n")}


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
    values = {"x": _uniform(42, (3, 3))}
    np.testing.assert_allclose(_run(_expand_fused(result.graph_def), ["f"], values)[0],
                               _run(g, ["f"], values)[0], rtol=1e-6)


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
    values = {"x": _uniform(43, (3,)), "b": _uniform(44, (3,))}
    np.testing.assert_allclose(_run(_expand_fused(result.graph_def), ["c"], values)[0],
                               _run(g, ["c"], values)[0], rtol=1e-6)


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
    values = {"x": _uniform(40, (3, 3)), "b": _uniform(41, (1, 3))}
    want = _run(g, ["r", "e"], values)
    got = _run(_expand_fused(result.graph_def), ["r", "e"], values)
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
    fused = fused_programs(build, ["y"], {"x": _uniform(30, (4, 8, 32))}, rtol=1e-5,
                           flags=REDUCE_ON)
    assert fused == {"autofuse_reduce_0_Mean_Sub_Square_Mean_AddV2_Rsqrt_Mul_Mul_AddV2": (
        "in0: f32[4,8,32]\nin1: f32[32]\nin2: f32[32]\n%0 = Mean in0 axes=[2]\n%1 = Sub in0, %0\n"
        "%2 = Square %1\n%3 = Mean %2 axes=[2]\n%4 = Add %3, 9.999999747378752e-06\n"
        "%5 = Rsqrt %4\n%6 = Mul %1, %5\n%7 = Mul %6, in1\n%8 = Add %7, in2\nout0 = %8\n")}


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
    x = _uniform(3, (8, 16), low=-6, high=6)
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
