"""Random DAGs of broadcasting, reducing and view ops through the rewriter.

Each graph is rewritten (reduce pass on, random flags) and the result, with every fused node
expanded into the TF ops its program names (test_rewriter.expand_fused: views as Reshape,
reductions keep_dims over the iteration axes), must give the original graph's numbers for
every fetched node. This checks the lowering's shape reasoning (placements, views, outputs)
without the kernel. float64 throughout, so the comparison is tight.
"""

import types

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import types_pb2

from tf_autofuse import rewriter
from tf_autofuse.rewriter import catalog, lower
from rewriter_graphs import const, expand_fused, graph, node, placeholder, run_graph

F64 = types_pb2.DT_DOUBLE
SHAPES = [(3, 4, 5), (4, 5), (5,), (1, 5), (3, 1, 5), (3, 4, 1), (1,), (), (3, 4, 5), (4, 1)]
UNARY = ["Abs", "Neg", "Tanh", "Sigmoid", "Square", "Sin", "Relu"]
BINARY = ["AddV2", "Sub", "Mul", "Maximum", "Minimum", "SquaredDifference"]
REDUCE = ["Sum", "Mean", "Max", "Min"]


def random_graph(seed, unknown=False):
    """unknown: placeholders declare some sizes as unknown (-1); the feeds keep them."""
    rng = np.random.default_rng(seed)
    nodes, values, feeds = [], [], {}  # values: (name, shape)
    for i in range(rng.integers(2, 5)):
        shape = SHAPES[rng.integers(len(SHAPES))]
        name = f"in{i}"
        declared = tuple(-1 if unknown and rng.random() < 0.4 else d for d in shape)
        nodes.append(placeholder(name, F64, declared))
        nodes[-1].attr["shape"].shape.SetInParent()  # a scalar's shape attr has no dims
        feeds[name] = rng.uniform(-2, 2, shape)
        values.append((name, shape))
    for i in range(rng.integers(4, 14)):
        choice = rng.random()
        name = f"n{i}"
        a_name, a_shape = values[rng.integers(len(values))]
        if choice < 0.3:
            op = UNARY[rng.integers(len(UNARY))]
            nodes.append(node(name, op, [a_name], F64))
            values.append((name, a_shape))
        elif choice < 0.65:
            b_name, b_shape = values[rng.integers(len(values))]
            if rng.random() < 0.2:
                c = f"c{i}"
                nodes.append(const(c, np.float64(rng.uniform(0.5, 2)), tf.float64))
                b_name, b_shape = c, ()
            try:
                out = np.broadcast_shapes(a_shape, b_shape)
            except ValueError:
                continue
            op = BINARY[rng.integers(len(BINARY))]
            nodes.append(node(name, op, [a_name, b_name], F64))
            values.append((name, out))
        elif choice < 0.75:
            b_name, b_shape = values[rng.integers(len(values))]
            try:
                out = np.broadcast_shapes(a_shape, b_shape)
            except ValueError:
                continue
            nodes.append(node(f"{name}_cond", "Greater", [a_name, b_name], F64))
            nodes.append(node(name, "SelectV2", [f"{name}_cond", a_name, b_name], F64))
            values.append((name, out))
        elif choice < 0.9 and len(a_shape) >= 1:
            rank = len(a_shape)
            start = int(rng.integers(rank))
            stop = int(rng.integers(start, rank)) + 1
            axes = list(range(start, stop))
            if rng.random() < 0.3:
                axes = [a - rank for a in axes]
            keep = bool(rng.random() < 0.5)
            op = REDUCE[rng.integers(len(REDUCE))]
            nodes.append(const(f"{name}_axes", np.array(axes, np.int32), tf.int32))
            n = node(name, op, [a_name, f"{name}_axes"], F64)
            n.attr["keep_dims"].b = keep
            n.attr["Tidx"].type = types_pb2.DT_INT32
            nodes.append(n)
            out = tuple(1 if i in range(start, stop) else d for i, d in enumerate(a_shape))
            if not keep:
                out = tuple(d for i, d in enumerate(a_shape) if i not in range(start, stop))
            values.append((name, out))
        elif choice < 0.95:
            kind = rng.integers(4)
            if kind == 0:  # AddN of values of one shape
                same = [n for n, sh in values if sh == a_shape]
                picks = [same[j] for j in rng.integers(len(same), size=int(rng.integers(2, 4)))]
                n = node(name, "AddN", picks, F64)
                n.attr["N"].i = len(picks)
            elif kind == 1:
                for bound, value in (("lo", -0.5), ("hi", 0.75)):
                    nodes.append(const(f"{name}_{bound}", np.float64(value), tf.float64))
                n = node(name, "ClipByValue", [a_name, f"{name}_lo", f"{name}_hi"], F64)
            elif kind == 2:
                n = node(name, "LeakyRelu", [a_name], F64)
                n.attr["alpha"].f = 0.125
            else:  # through float32 and back
                nodes.append(node(f"{name}_f32", "Cast", [a_name], None))
                nodes[-1].attr["SrcT"].type = F64
                nodes[-1].attr["DstT"].type = types_pb2.DT_FLOAT
                n = node(name, "Cast", [f"{name}_f32"], None)
                n.attr["SrcT"].type = types_pb2.DT_FLOAT
                n.attr["DstT"].type = F64
            nodes.append(n)
            values.append((name, a_shape))
        elif a_name.startswith("in") and rng.random() < 0.5:
            axis = int(rng.integers(-len(a_shape) - 1, len(a_shape) + 1))
            nodes.append(const(f"{name}_axis", np.int32(axis), tf.int32))
            n = node(name, "ExpandDims", [a_name, f"{name}_axis"], F64)
            n.attr["Tdim"].type = types_pb2.DT_INT32
            nodes.append(n)
            target = list(a_shape)
            target.insert(axis % (len(a_shape) + 1), 1)
            values.append((name, tuple(target)))
        elif a_name.startswith("in") and 1 in a_shape:
            n = node(name, "Squeeze", [a_name], F64)
            n.attr["squeeze_dims"].list.i.append(a_shape.index(1))
            nodes.append(n)
            values.append((name, tuple(d for i, d in enumerate(a_shape) if i != a_shape.index(1))))
        elif a_name.startswith("in"):
            target = tuple(a_shape) + (1,)
            nodes.append(const(f"{name}_shape", np.array(target, np.int32), tf.int32))
            n = node(name, "Reshape", [a_name, f"{name}_shape"], F64)
            n.attr["Tshape"].type = types_pb2.DT_INT32
            nodes.append(n)
            values.append((name, target))
    names = {n.name for n in nodes}
    consumed = {i.split(":")[0].lstrip("^") for n in nodes for i in n.input}
    fetches = [n for n, _ in values if n not in consumed and not n.startswith("in")]
    fetches += [n for n, _ in values[::3] if not n.startswith("in") and n not in fetches]
    assert all(f in names for f in fetches)
    return graph(*nodes), fetches, feeds


@pytest.mark.parametrize("unknown", [False, True])
@pytest.mark.parametrize("seed", range(50))
def test_random_graph_keeps_its_numbers(seed, unknown):
    g, fetches, feeds = random_graph(seed, unknown)
    if not fetches:
        pytest.skip("nothing computed")
    rng = np.random.default_rng(1000 + seed)
    flags = types.SimpleNamespace(
        autofuse_enable_pass=("reduce",),
        max_fusion_size=int(rng.integers(2, 10)),
        max_input_nums_after_fuse=int(rng.integers(2, 6)),
        recomputation_threshold=int(rng.integers(0, 3)),
    )
    result = rewriter.rewrite(g, preserve=fetches, flags=flags)
    want = run_graph(g, fetches, feeds)
    got = run_graph(expand_fused(result.graph_def), fetches, feeds)
    for name, w, v in zip(fetches, want, got):
        assert w.shape == v.shape, name
        np.testing.assert_allclose(v, w, rtol=1e-12, atol=1e-12, err_msg=name)
    again = rewriter.rewrite(result.graph_def, preserve=fetches, flags=flags)
    assert not again.fusions


def _check_or_build(function, view, members):
    """What lower.check / lower.build tell of `members`: the refusal, or what a merge reads."""
    try:
        lowered = function(view, members, frozenset(members[-1:]))
    except lower.Unfusible as err:
        return str(err)
    return (lowered.inputs, lowered.outputs, lowered.in_dtypes, lowered.out_dtypes, lowered.kind)


def _agree_on_subsets(g, rng, trials):
    view = rewriter.GraphView(g)
    types = catalog.candidate_op_types()
    candidates = [n for n in view.order if view.node(n).op in types]
    for _ in range(trials):
        size = int(rng.integers(1, min(5, len(candidates)) + 1))
        picks = rng.choice(len(candidates), size=size, replace=False)
        members = sorted((candidates[i] for i in picks), key=view.position.get)
        # fresh views: neither answer may lean on the other's memo
        want = _check_or_build(lower.build, rewriter.GraphView(g), members)
        assert _check_or_build(lower.check, rewriter.GraphView(g), members) == want, members


@pytest.mark.parametrize("unknown", [False, True])
@pytest.mark.parametrize("seed", range(25))
def test_check_agrees_with_build(seed, unknown):
    """lower.check (the partitioner's trial merges) refuses what build refuses, with build's
    reason, and otherwise gives build's inputs, outputs and dtypes."""
    g, _, _ = random_graph(seed, unknown)
    _agree_on_subsets(g, np.random.default_rng(2000 + seed), 30)


def test_check_agrees_with_build_where_emission_or_the_program_fails():
    """A LeakyRelu whose alpha is not finite fails in emission; a Cast to float32 read by an
    AddV2 of float64 (a graph TF would reject) fails the program's dtype check."""
    leaky = node("leaky", "LeakyRelu", ["x"], F64)
    leaky.attr["alpha"].f = float("inf")
    cast = node("cast", "Cast", ["x"], None)
    cast.attr["SrcT"].type = F64
    cast.attr["DstT"].type = types_pb2.DT_FLOAT
    g = graph(placeholder("x", F64, (3, 4)), node("abs", "Abs", ["x"], F64), leaky, cast,
              node("add", "AddV2", ["cast", "abs"], F64), node("neg", "Neg", ["leaky"], F64))
    for members in (["leaky"], ["leaky", "neg"], ["abs", "leaky", "neg"], ["cast", "add"],
                    ["abs", "cast", "add"]):
        want = _check_or_build(lower.build, rewriter.GraphView(g), members)
        assert isinstance(want, str), members
        assert _check_or_build(lower.check, rewriter.GraphView(g), members) == want
    _agree_on_subsets(g, np.random.default_rng(7), 40)
