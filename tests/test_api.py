"""The Python API (issue 7): fuse() / Fuser / FusedGraph, config errors, cost models, Patterns,
and the Grappler path going through the same Fuser.

Structure first (which fused kernels, which original ops are gone, refusal reasons), then the
numbers: fused against unfused (FusedGraph.verify runs both) and against a float64 reference.
Graphs are small; the cost-model decisions on large shapes are checked on the rewritten graph
only (nothing that large is run).
"""

import runpy
import sys
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf_autofuse
from tf_autofuse import _warn, flags, profiling, rewriter
from tf_autofuse.fuser import static_shapes
from tf_autofuse.rewriter import catalog
from tf_autofuse.rewriter import cost as cost_model

from test_plugin import ROOT
from test_session import fused_kernels
from test_session import run as session_run

sys.path.insert(0, str(ROOT / "examples/api"))
from swish_pattern import KeepOutOfFusion, SwishPattern  # noqa: E402

tf1 = tf.compat.v1


def rng(seed=0):
    return np.random.default_rng(seed)


def ops_of(graph_def):
    return {n.name: n.op for n in graph_def.node}


def fused_names(fused):
    return [f.name for f in fused.fusions]


def cost(model):
    return dict(enable_cost_model=True, cost_model=model)


# --- graphs ------------------------------------------------------------------------------------


def swish_graph(width=64):
    """x [?,width] + bias, swish, abs, relu."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, width], name="x")
        bias = tf.constant(np.linspace(-1, 1, width, dtype=np.float32), name="bias")
        z = tf.add(x, bias, name="z")
        swish = tf.multiply(z, tf.sigmoid(z, name="gate"), name="swish")
        tf.nn.relu(tf.abs(swish, name="abs"), name="y")
    return graph


def swish_reference(x, width=64):
    z = x.astype(np.float64) + np.linspace(-1, 1, width, dtype=np.float32).astype(np.float64)
    return np.maximum(np.abs(z / (1 + np.exp(-z))), 0)


def broadcast_graph(n, c, op):
    """v [c] -> op -> e; y = relu(x [n,c] * e): op is evaluated n times over in a fused kernel."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [n, c], name="x")
        v = tf1.placeholder(tf.float32, [c], name="v")
        tf.nn.relu(x * op(v, name="e"), name="y")
    return graph


def recompute_graph(op, matmul_reads_t=False, n=64, c=128):
    """t = op(x) feeds group 1 (t, u) and, past a MatMul, group 2 (v, out)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [n, c], name="x")
        w = tf1.placeholder(tf.float32, [c, c], name="w")
        t = op(x, name="t")
        u = tf.nn.relu(t, name="u")
        m = tf.matmul(t if matmul_reads_t else u, w, name="m")
        tf.negative(tf.add(m, t, name="v"), name="out")
        if matmul_reads_t:
            tf.identity(u, name="u_out")
    return graph


# --- fuse(): inputs, counts, report, run, verify ---------------------------------------------


def test_fuse_a_tf_graph_counts_report_and_numbers():
    fused = tf_autofuse.fuse(swish_graph(), outputs=["y"])
    assert fused_names(fused) == ["autofuse_pointwise_0_AddV2_Sigmoid_Mul_Abs_Relu"]
    (fusion,) = fused.fusions
    assert fusion.kind == "pointwise" and fusion.nodes == ("z", "gate", "swish", "abs", "y")
    assert fusion.program.startswith("in0: f32[?,64]\nin1: f32[64]\n%0 = Add in0, in1\n")
    after = ops_of(fused.graph_def)
    assert not {"AddV2", "Sigmoid", "Mul", "Abs", "Relu"} & set(after.values())
    assert after["y"] == "Identity"  # the output keeps its name
    # counting: 5 compute kernels -> 1; operators are conserved
    assert fused.get_fusion_count() == 1
    assert fused.get_kernel_count(original=True) == 5 and fused.get_kernel_count() == 1
    assert fused.get_operator_count(original=True) == fused.get_operator_count() == 5
    assert fused.get_kernel_count(original=True) == sum(
        profiling.compute_kernels([fused.original_graph_def]).values())
    report = fused.report()
    assert "autofuse_pointwise_0_AddV2_Sigmoid_Mul_Abs_Relu" in report
    assert "original          5          5" in report and "fused             1          5" in report

    x = rng().uniform(-4, 4, (16, 64)).astype(np.float32)
    got = fused.run("y", {"x": x})
    original = fused.run(["y:0"], {"x:0": x}, original=True)[0]
    assert fused.verify({"x": x}) == float(np.max(np.abs(got - original))) <= 1e-5
    reference = swish_reference(x)
    assert np.max(np.abs(got - reference)) <= np.max(np.abs(original - reference)) + 2e-6


def test_fuse_a_graph_def_and_a_concrete_function_with_variables():
    graph_def = swish_graph().as_graph_def()
    assert fused_names(tf_autofuse.fuse(graph_def)) == fused_names(
        tf_autofuse.fuse(swish_graph(), outputs="y"))

    scale = tf.Variable(np.full([32], 0.5, np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 32], tf.float32, name="inp")])
    def f(inp):
        return tf.exp(tf.abs(inp) * scale)

    for source in (f, f.get_concrete_function()):
        fused = tf_autofuse.fuse(source)  # variables frozen into constants
        assert fused_names(fused) == ["autofuse_pointwise_0_Abs_Mul_Exp"]
        assert fused.inputs == ["inp:0"] and len(fused.outputs) == 1
    x = rng(1).uniform(-2, 2, (4, 32)).astype(np.float32)
    np.testing.assert_allclose(fused.run(fused.outputs[0], {"inp": x}),
                               np.exp(np.abs(x.astype(np.float64)) * 0.5), rtol=1e-6)
    assert fused.verify({"inp": x}) <= 1e-6


def test_fuse_rejects_what_it_cannot_read():
    with pytest.raises(TypeError, match="GraphDef, a tf.Graph or a concrete function"):
        tf_autofuse.fuse("model.pb")
    with pytest.raises(ValueError, match="'nope:0' is not a node"):
        tf_autofuse.fuse(swish_graph(), outputs=["nope"])

    @tf.function
    def polymorphic(x):
        return tf.abs(x)
    with pytest.raises(TypeError, match="get_concrete_function"):
        tf_autofuse.fuse(polymorphic)


def test_symbolic_shapes_link_tensors_of_one_unknown_batch():
    shapes = static_shapes(swish_graph().as_graph_def())
    (batch, width), = shapes["x"]
    assert batch <= -2 and width == 64
    assert shapes["gate"] == [(batch, 64)] and shapes["y"] == [(batch, 64)]


def test_symbolic_batch_follows_convolutions():
    """A residual add of two convolutions of one unknown batch: known to match, so it fuses."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 8, 8, 3], name="x")
        kernel = tf.constant(rng(10).uniform(-1, 1, (3, 3, 3, 4)).astype(np.float32))
        a = tf.nn.conv2d(x, kernel, 1, "SAME", name="a")
        b = tf.nn.conv2d(tf.abs(x), kernel, 1, "SAME", name="b")
        tf.nn.relu(tf.add(a, b, name="sum") * 0.5, name="y")
    fused = tf_autofuse.fuse(graph, outputs=["y"])
    assert fused_names(fused) == ["autofuse_pointwise_0_AddV2_Mul_Relu"]
    data = rng(11).uniform(-1, 1, (2, 8, 8, 3)).astype(np.float32)
    assert fused.verify({"x": data}) <= 1e-5


def test_the_readme_example_runs(capsys):
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("## API\n"):].split("```python\n", 1)[1].split("```", 1)[0]
    script = (ROOT / "examples/api/quickstart.py").read_text()
    assert script.split('"""\n\n', 1)[1] == block  # the README shows the example as it is
    runpy.run_path(str(ROOT / "examples/api/quickstart.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "kernels: 4 -> 1 | operators: 4 | fused kernels: 1" in out
    assert "max |fused - original| =" in out


# --- config ------------------------------------------------------------------------------------


def test_default_fuser_is_the_flags_default():
    graph_def = recompute_graph(tf.tanh).as_graph_def()
    plain = rewriter.rewrite(graph_def, preserve=["out"])
    api = tf_autofuse.Fuser().rewrite(graph_def, preserve=["out"])
    env = tf_autofuse.Fuser.from_flags(flags.Flags()).rewrite(graph_def, preserve=["out"])
    for result in (api, env):
        assert result.graph_def.SerializeToString(deterministic=True) == \
            plain.graph_def.SerializeToString(deterministic=True)
        assert result.refusals == plain.refusals


@pytest.mark.parametrize("key,value,words", [
    ("cost_model", "fast", ["cost_model='fast'", "memory_bandwidth, compute_density, latency"]),
    ("max_fusion_size", -1, ["max_fusion_size=-1", "an integer >= 0"]),
    ("max_input_nums_after_fuse", 0, ["max_input_nums_after_fuse=0", "an integer >= 1"]),
    ("recomputation_threshold", "some", ["recomputation_threshold='some'", "integer >= 0"]),
    ("enable_cost_model", "yes", ["enable_cost_model='yes'", "true or false"]),
    ("passes", "pointwise,fancy", ["passes='pointwise,fancy'", "pointwise, reduce"]),
    ("max_fusion", 3, ["unknown key 'max_fusion'", "max_fusion_size"]),
])
def test_bad_config_names_the_key_and_the_accepted_values(key, value, words):
    fuser = tf_autofuse.Fuser()
    with pytest.raises(tf_autofuse.ConfigError) as err:
        setattr(fuser.config, key, value)
    for word in words:
        assert word in str(err.value)
    with pytest.raises(tf_autofuse.ConfigError):
        tf_autofuse.Fuser(**{key: value})
    assert fuser.config == tf_autofuse.FuserConfig()  # a refused value changes nothing


def test_config_values_and_limits_apply():
    fuser = tf_autofuse.Fuser(passes=["reduce", "pointwise"], max_fusion_size="2")
    assert fuser.config.passes == ("pointwise", "reduce") and fuser.config.max_fusion_size == 2
    other = tf_autofuse.Fuser()
    other.config = {"max_fusion_size": 2}
    assert other.config.max_fusion_size == 2
    with pytest.raises(tf_autofuse.ConfigError, match="takes a FuserConfig or a dict"):
        other.config = 2
    fused = fuser.fuse(swish_graph(), outputs=["y"])
    assert [len(f.nodes) for f in fused.fusions] == [2, 2]
    assert tf_autofuse.fuse(swish_graph(), outputs=["y"], skip_op_types="Sigmoid").fusions[0] \
        .nodes == ("swish", "abs", "y")
    assert tf_autofuse.fuse(swish_graph(), max_fusion_size=0).fusions == []
    assert tf_autofuse.fuse(swish_graph(), enable_auto_fusion=False).fusions == []


def test_cost_model_flag_is_checked():
    assert flags.from_env({"AUTOFUSE_FLAGS": "--cost_model=latency"}).cost_model == "latency"
    with pytest.raises(tf_autofuse.FlagError, match="--cost_model='cheap' is not valid; it "
                                                    "accepts one of none, memory_bandwidth"):
        flags.from_env({"AUTOFUSE_FLAGS": "--cost_model=cheap"})


# --- cost models ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(8, 16), (2048, 1024)])
def test_cost_models_on_a_broadcast_transcendental(shape):
    """exp of a [C] vector used by an [N,C] kernel: fused, Exp is evaluated N*C times."""
    graph = broadcast_graph(*shape, tf.exp)
    merged, apart = ["autofuse_pointwise_0_Exp_Mul_Relu"], ["autofuse_pointwise_0_Mul_Relu"]
    assert fused_names(tf_autofuse.fuse(graph)) == merged  # no cost model: as large as allowed
    assert fused_names(tf_autofuse.fuse(graph, **cost("memory_bandwidth"))) == merged
    density = tf_autofuse.fuse(graph, **cost("compute_density"))  # never repeat a transcendental
    assert fused_names(density) == apart and ops_of(density.graph_def)["e"] == "Exp"
    assert any(r.node == "mul" and "compute_density" in r.reason and "transcendental" in r.reason
               for r in density.refusals)
    latency = tf_autofuse.fuse(graph, **cost("latency"))  # one launch less vs N*C exps
    assert fused_names(latency) == (merged if shape == (8, 16) else apart)


def test_cost_models_on_a_broadcast_cheap_op():
    big = broadcast_graph(2048, 1024, tf.math.rsqrt)
    assert fused_names(tf_autofuse.fuse(big, **cost("compute_density"))) == [
        "autofuse_pointwise_0_Rsqrt_Mul_Relu"]  # cheap ops: fewer, larger kernels
    latency = tf_autofuse.fuse(big, **cost("latency"))
    assert fused_names(latency) == ["autofuse_pointwise_0_Mul_Relu"]
    assert any("cost model latency: estimated" in r.reason for r in latency.refusals)


def test_cost_model_numbers_match_unfused_and_float64():
    fused = tf_autofuse.fuse(broadcast_graph(8, 16, tf.exp), **cost("compute_density"))
    x, v = rng(2).uniform(-2, 2, (8, 16)).astype(np.float32), rng(3).uniform(-2, 2, 16).astype(
        np.float32)
    got = fused.run("y", {"x": x, "v": v})
    reference = np.maximum(x.astype(np.float64) * np.exp(v.astype(np.float64)), 0)
    original = fused.run("y", {"x": x, "v": v}, original=True)
    assert fused.verify({"x": x, "v": v}) <= 1e-5
    assert np.max(np.abs(got - reference)) <= np.max(np.abs(original - reference)) + 1e-6


def recompute(op, model=None, matmul_reads_t=False):
    config = dict(recomputation_threshold=2, **(cost(model) if model else {}))
    fused = tf_autofuse.fuse(recompute_graph(op, matmul_reads_t), outputs=["out"], **config)
    second = [f for f in fused.fusions if "AddV2" in f.name]
    assert len(second) == 1
    return op.__name__.capitalize() in second[0].op_types, fused  # t recomputed in group 2?


def test_cost_models_decide_recomputation():
    # default (threshold 2): t is recomputed wherever the limit allows
    assert recompute(tf.tanh)[0] and recompute(tf.tanh, matmul_reads_t=True)[0]
    # memory_bandwidth: only when that saves bytes. With the MatMul reading t too, group 1 still
    # writes t, so reading x instead of t saves nothing
    assert recompute(tf.tanh, "memory_bandwidth")[0]
    made, fused = recompute(tf.tanh, "memory_bandwidth", matmul_reads_t=True)
    assert not made and any("memory_bandwidth: recomputing saves no memory traffic" in r.reason
                            for r in fused.refusals)
    # compute_density: never recompute a transcendental, recompute cheap ops
    made, fused = recompute(tf.tanh, "compute_density")
    assert not made and any("would evaluate Tanh twice" in r.reason for r in fused.refusals)
    assert recompute(tf.abs, "compute_density")[0]
    # latency: recompute when the time saved beats the work repeated. Recomputing t saves its 4
    # bytes an element (no longer written by group 1; group 2 reads x instead of t) and repeats
    # the op's cost an element (the op table's): worth it below 4 cheap ops. Tanh costs exactly
    # that: a tie, which saves nothing
    break_even = 4 * cost_model.NS_PER_BYTE / cost_model.NS_PER_OP
    for op, ir_name in ((tf.abs, "Abs"), (tf.sqrt, "Sqrt"), (tf.tanh, "Tanh"),
                        (tf.math.erf, "Erf"), (tf.sigmoid, "Sigmoid")):
        made, fused = recompute(op, "latency")
        assert made == (catalog.for_ir_name(ir_name).cost < break_even), ir_name
        assert made or any("cost model latency: estimated" in r.reason for r in fused.refusals)


def test_recomputed_graph_numbers():
    made, fused = recompute(tf.abs, "compute_density")
    assert made
    x = rng(4).uniform(-2, 2, (64, 128)).astype(np.float32)
    w = rng(5).uniform(-1, 1, (128, 128)).astype(np.float32)
    assert fused.verify({"x": x, "w": w}) <= 1e-4


# --- patterns ------------------------------------------------------------------------------------


def test_swish_pattern_claims_its_own_kernel():
    fuser = tf_autofuse.Fuser()
    fuser.register_pattern(SwishPattern())
    fused = fuser.fuse(swish_graph(), outputs=["y"])
    assert fused_names(fused) == ["autofuse_pattern_0_Swish", "autofuse_pointwise_1_Abs_Relu"]
    pattern = fused.fusions[0]
    assert pattern.kind == "pattern" and pattern.nodes == ("gate", "swish")
    assert pattern.program == "in0: f32[?,64]\n%0 = Sigmoid in0\n%1 = Mul in0, %0\nout0 = %1\n"
    after = ops_of(fused.graph_def)
    assert "gate" not in after and "swish" not in after and after["z"] == "AddV2"
    assert fused.get_kernel_count() == 3 and fused.get_operator_count() == 5
    x = rng(6).uniform(-4, 4, (16, 64)).astype(np.float32)
    got = fused.run("y", {"x": x})
    assert fused.verify({"x": x}) <= 1e-5
    assert np.max(np.abs(got - swish_reference(x))) <= 1e-5
    # switched off, the pattern is not asked
    fuser.config.enable_pattern_matching = False
    assert fused_names(fuser.fuse(swish_graph(), outputs=["y"])) == [
        "autofuse_pointwise_0_AddV2_Sigmoid_Mul_Abs_Relu"]


def test_a_pattern_can_forbid_fusion_around_an_op():
    fused = tf_autofuse.Fuser(patterns=[KeepOutOfFusion("Sigmoid")]).fuse(swish_graph(), "y")
    assert fused_names(fused) == ["autofuse_pointwise_0_Mul_Abs_Relu"]
    assert ops_of(fused.graph_def)["gate"] == "Sigmoid"
    assert ("gate", "forbidden by pattern KeepOutOfFusion") in fused.refusals


def test_a_pattern_whose_nodes_cannot_be_one_kernel_is_refused_with_the_reason():
    class ClaimMatMul(tf_autofuse.Pattern):
        def match(self, graph, node):
            return [node, "m"] if node == "t" else None
    fused = tf_autofuse.Fuser(patterns=[ClaimMatMul()]).fuse(recompute_graph(tf.abs), "out")
    assert all(f.kind != "pattern" for f in fused.fusions)
    assert any(r.node == "t" and r.reason.startswith("pattern ClaimMatMul: m: MatMul")
               for r in fused.refusals), fused.refusals


class Raising(tf_autofuse.Pattern):
    def match(self, graph, node):
        raise RuntimeError("a bug in a user pattern")


class Junk(tf_autofuse.Pattern):
    def match(self, graph, node):
        return 42


@pytest.mark.parametrize("pattern,words", [(Raising(), "raised RuntimeError: a bug in a user"),
                                           (Junk(), "match() returned 42, not node names")])
def test_a_broken_pattern_warns_once_and_the_graph_is_still_fused(pattern, words):
    _warn.reset()
    with pytest.warns(tf_autofuse.AutofuseWarning) as caught:
        fused = tf_autofuse.Fuser(patterns=[pattern]).fuse(swish_graph(), "y")
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and words in messages[0] and "skipped" in messages[0]
    assert fused_names(fused) == ["autofuse_pointwise_0_AddV2_Sigmoid_Mul_Abs_Relu"]


def test_patterns_must_be_patterns():
    with pytest.raises(TypeError, match="not a tf_autofuse.Pattern"):
        tf_autofuse.Fuser().register_pattern(lambda graph, node: None)


# --- the Grappler path runs the same Fuser --------------------------------------------------------


def swish_session_graph():
    x = tf1.placeholder(tf.float32, [32, 64], name="x")
    z = x + tf.constant(np.linspace(-1, 1, 64, dtype=np.float32))
    y = tf.nn.relu(tf.abs(z * tf.sigmoid(z)), name="y")
    return y, x


def feed_x(x):
    return {x: rng(7).uniform(-4, 4, (32, 64)).astype(np.float32)}


def test_registered_pattern_and_cost_model_reach_sessions():
    pattern = tf_autofuse.register_pattern(SwishPattern())
    try:
        value, executed = session_run(swish_session_graph, feed_x)
    finally:
        tf_autofuse.unregister_pattern(pattern)
    assert tf_autofuse.registered_patterns() == ()
    assert "autofuse_pattern_0_Swish" in fused_kernels(executed)
    assert not {"Sigmoid", "Mul"} & set(executed.values())
    unfused, _ = session_run(swish_session_graph, feed_x, fuse=False)
    np.testing.assert_allclose(value, unfused, rtol=1e-5, atol=1e-6)

    def exp_broadcast():
        x = tf1.placeholder(tf.float32, [32, 64], name="x")
        v = tf1.placeholder(tf.float32, [64], name="v")
        return tf.nn.relu(x * tf.exp(v)), (x, v)

    def feeds(placeholders):
        x, v = placeholders
        return {x: rng(8).uniform(-2, 2, (32, 64)).astype(np.float32),
                v: rng(9).uniform(-2, 2, 64).astype(np.float32)}
    _, plain = session_run(exp_broadcast, feeds)
    density_value, density = session_run(exp_broadcast, feeds, cost_model="compute_density")
    assert any("Exp" in name for name in fused_kernels(plain))
    assert fused_kernels(density) and not any("Exp" in n for n in fused_kernels(density))
    assert "Exp" in density.values()
    unfused, _ = session_run(exp_broadcast, feeds, fuse=False)
    np.testing.assert_allclose(density_value, unfused, rtol=1e-6)


def test_a_raising_registered_pattern_never_breaks_a_session():
    _warn.reset()
    pattern = tf_autofuse.register_pattern(Raising())
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value, executed = session_run(swish_session_graph, feed_x)
    finally:
        tf_autofuse.unregister_pattern(pattern)
    messages = {str(w.message) for w in caught if issubclass(w.category,
                                                             tf_autofuse.AutofuseWarning)}
    assert len(messages) == 1 and "a bug in a user pattern" in messages.pop()
    assert fused_kernels(executed)  # the partitioner still fused the graph
    assert value.shape == (32, 64) and np.all(np.isfinite(value))
