"""The pass inside real v1 Sessions, through the named optimizer "AutofuseOptimizer".

These tests ask for fusion per session (RewriterConfig.custom_optimizers, the way a user
does without AUTOFUSE_FLAGS) and read the graph TensorFlow executed from the RunMetadata's
partition graphs: structure first (which fused kernels, which original ops are gone), then
numbers (fused vs unfused vs a float64 reference).
"""

import numpy as np
import pytest
import tensorflow as tf

import sessions
import tf_autofuse
from tf_autofuse import _bridge, _warn

tf1 = tf.compat.v1
ORIGINAL_TYPES = {"Abs", "Relu", "Exp", "_UnaryOpsComposition"}


def run(build, feeds_fn, fuse=True, fetch_names=None, **params):
    """Build a graph, run it once; returns (results, executed op types by node name)."""
    graph = tf.Graph()
    with graph.as_default():
        fetches, feeds = build()
        with tf1.Session(graph=graph, config=sessions.config(fuse, params)) as sess:
            metadata = tf1.RunMetadata()
            values = sess.run(fetches, feeds_fn(feeds),
                              options=tf1.RunOptions(output_partition_graphs=True),
                              run_metadata=metadata)
    executed = {}
    for partition in metadata.partition_graphs:
        for node in partition.node:
            executed[node.name] = node.op
    return values, executed


def fused_kernels(executed):
    return sorted(name for name, op in executed.items() if op == "AutofuseKernel")


def abs_relu_exp(dtype=tf.float16, shape=(128, 192)):
    def build():
        x = tf1.placeholder(dtype, shape, name="x")
        y = tf.exp(tf.nn.relu(tf.abs(x)), name="y")
        return y, x
    return build


def feed_rand(dtype, shape=(128, 192), seed=0):
    def feeds(x):
        data = np.random.default_rng(seed).uniform(-2, 2, shape)
        return {x: data.astype(dtype)}
    return feeds


def f64_abs_relu_exp(x):
    return np.exp(np.maximum(np.abs(x.astype(np.float64)), 0))


def assert_no_worse_than_unfused(fused, unfused, reference, rtol):
    fused64, unfused64 = fused.astype(np.float64), unfused.astype(np.float64)
    np.testing.assert_allclose(fused64, unfused64, rtol=rtol, atol=0)
    fused_err = np.max(np.abs(fused64 - reference) / np.maximum(np.abs(reference), 1e-30))
    unfused_err = np.max(np.abs(unfused64 - reference) / np.maximum(np.abs(reference), 1e-30))
    assert fused_err <= unfused_err * 1.0001 + 1e-7, (fused_err, unfused_err)


@pytest.mark.parametrize("np_dtype,tf_dtype,rtol", [
    (np.float16, tf.float16, 1e-3), (np.float32, tf.float32, 1e-6),
    (np.float64, tf.float64, 1e-14)])
def test_chain_is_one_kernel_with_unfused_results(np_dtype, tf_dtype, rtol):
    fused, executed = run(abs_relu_exp(tf_dtype), feed_rand(np_dtype))
    unfused, executed_off = run(abs_relu_exp(tf_dtype), feed_rand(np_dtype), fuse=False)

    assert fused_kernels(executed) == ["autofuse_pointwise_0_Abs_Relu_Exp"]
    assert not ORIGINAL_TYPES & set(executed.values())
    assert executed["y"] == "Identity"  # the fetched node keeps its name
    assert not fused_kernels(executed_off)
    x = np.random.default_rng(0).uniform(-2, 2, (128, 192)).astype(np_dtype)
    assert_no_worse_than_unfused(fused, unfused, f64_abs_relu_exp(x), rtol)


def test_bfloat16_chain():
    def build():
        x = tf1.placeholder(tf.float32, [64, 33], name="x")
        xb = tf.cast(x, tf.bfloat16)
        return tf.cast(tf.sigmoid(tf.tanh(xb) * xb), tf.float32), x
    fused, executed = run(build, feed_rand(np.float32, (64, 33)))
    unfused, _ = run(build, feed_rand(np.float32, (64, 33)), fuse=False)
    assert len(fused_kernels(executed)) == 1  # the casts are fused too: no bf16 rounding inside
    # Unfused TensorFlow rounds to bf16 after every op; the fused kernel rounds at most once, so
    # the two may differ by a couple of bf16 ulps and the fused one must be the closer to float64.
    np.testing.assert_allclose(fused, unfused, rtol=2 ** -6, atol=0)
    xb = np.random.default_rng(0).uniform(-2, 2, (64, 33)).astype(np.float32)
    xb = tf.cast(tf.cast(xb, tf.bfloat16), tf.float64).numpy()
    t = np.tanh(xb) * xb
    ref = 1 / (1 + np.exp(-t))
    assert np.max(np.abs(fused - ref)) <= np.max(np.abs(unfused - ref))


def test_fetch_the_middle_of_a_chain():
    def build():
        x = tf1.placeholder(tf.float32, [16, 16], name="x")
        r = tf.nn.relu(tf.abs(x), name="r")
        return [r, tf.exp(r, name="e")], x
    (r, e), executed = run(build, feed_rand(np.float32, (16, 16)))
    x = np.random.default_rng(0).uniform(-2, 2, (16, 16)).astype(np.float32)
    assert len(fused_kernels(executed)) == 1
    assert executed["r"] == "Identity" and executed["e"] == "Identity"
    np.testing.assert_allclose(r, np.abs(x), rtol=0)
    np.testing.assert_allclose(e, np.exp(np.abs(x)), rtol=1e-6)


def test_feed_the_middle_of_a_chain():
    fed = np.full((16, 16), 0.5, np.float32)

    def build():
        x = tf1.placeholder(tf.float32, [16, 16], name="x")
        r = tf.nn.relu(tf.abs(x), name="r")
        return tf.sqrt(tf.exp(r)), (x, r)

    def feeds(tensors):
        x, r = tensors
        return {x: np.zeros((16, 16), np.float32), r: fed}
    value, executed = run(build, feeds)
    np.testing.assert_allclose(value, np.sqrt(np.exp(fed)), rtol=1e-6)
    assert len(fused_kernels(executed)) == 1  # Exp and Sqrt still fuse after the fed value


def test_control_dependencies_are_kept():
    graph = tf.Graph()
    with graph.as_default():
        counter = tf1.Variable(0, name="counter", use_resource=True)
        x = tf1.placeholder(tf.float32, [8], name="x")
        bump = counter.assign_add(1)
        with tf.control_dependencies([bump]):
            y = tf.exp(tf.abs(x) * tf.abs(x))
        with tf.control_dependencies([y]):
            after = tf.identity(counter.read_value(), name="after")
        with tf1.Session(graph=graph, config=sessions.config()) as sess:
            sess.run(counter.initializer)
            metadata = tf1.RunMetadata()
            y_value, count = sess.run([y, after], {x: np.ones(8, np.float32)},
                                      options=tf1.RunOptions(output_partition_graphs=True),
                                      run_metadata=metadata)
    ops = {n.name: n.op for p in metadata.partition_graphs for n in p.node}
    assert len(fused_kernels(ops)) == 1
    assert count == 1
    np.testing.assert_allclose(y_value, np.exp(np.ones(8)), rtol=1e-6)


def test_parameter_map_turns_fusion_off_for_one_session():
    _, executed = run(abs_relu_exp(), feed_rand(np.float16), max_fusion_size=0)
    assert not fused_kernels(executed)
    _, executed = run(abs_relu_exp(), feed_rand(np.float16), enable_autofuse="false")
    assert not fused_kernels(executed)


def test_bad_parameter_map_value_warns_and_runs_unfused():
    _warn.reset()
    with pytest.warns(tf_autofuse.AutofuseWarning, match="--max_fusion_size"):
        value, executed = run(abs_relu_exp(), feed_rand(np.float16), max_fusion_size="lots")
    assert not fused_kernels(executed)
    assert value.shape == (128, 192)


def test_rewriter_failure_leaves_the_session_running_unfused(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("forced failure from a test")
    monkeypatch.setattr(tf_autofuse.rewriter, "rewrite", broken)
    _warn.reset()
    with pytest.warns(tf_autofuse.AutofuseWarning) as caught:
        first, executed = run(abs_relu_exp(tf.float32), feed_rand(np.float32))
        second, _ = run(abs_relu_exp(tf.float32), feed_rand(np.float32))
    messages = [str(w.message) for w in caught if issubclass(w.category, tf_autofuse.AutofuseWarning)]
    assert len(messages) == 1, messages
    assert "forced failure from a test" in messages[0] and "runs unfused" in messages[0]
    assert not fused_kernels(executed)
    x = np.random.default_rng(0).uniform(-2, 2, (128, 192)).astype(np.float32)
    np.testing.assert_allclose(first, f64_abs_relu_exp(x), rtol=1e-6)
    np.testing.assert_array_equal(first, second)


def test_graphs_without_candidates_never_reach_python(monkeypatch):
    calls = []
    real = _bridge.optimize
    monkeypatch.setattr(_bridge, "optimize", lambda *a: calls.append(1) or real(*a))

    def matmul_only():
        x = tf1.placeholder(tf.float32, [4, 4], name="x")
        return tf.matmul(tf.matmul(x, x), x), x
    run(matmul_only, feed_rand(np.float32, (4, 4)))
    assert calls == []
    run(abs_relu_exp(tf.float32), feed_rand(np.float32))
    assert calls


def test_rewrite_pauses_the_collector_and_leaves_no_collection_due(monkeypatch):
    """The cyclic collector is off during the rewrite and back on after it, with the young
    generation collected before it is re-enabled: the first allocation after the pass must not
    start an automatic collection (in a process whose tracing left a full one due, that became
    a full collection inside the first call: the transformer's was ~100 ms slower than TF's)."""
    import gc

    state = {"during": None, "returned": False, "next": None}
    real = _bridge._optimize
    keep = []

    def spy(*args):
        state["during"] = gc.isenabled()
        keep.extend([] for _ in range(5 * gc.get_threshold()[0]))  # survivors, as a cache's
        try:
            return real(*args)
        finally:
            state["returned"] = True

    def on_collection(phase, info):
        if phase == "start" and state["returned"] and state["next"] is None:
            state["next"] = "explicit, paused" if not gc.isenabled() else "automatic"

    monkeypatch.setattr(_bridge, "_optimize", spy)
    gc.callbacks.append(on_collection)
    try:
        assert gc.isenabled()
        run(abs_relu_exp(tf.float32), feed_rand(np.float32))
    finally:
        gc.callbacks.remove(on_collection)
    assert state["during"] is False and gc.isenabled()
    assert state["next"] == "explicit, paused"


def test_debug_dump_writes_graphs_and_programs(tmp_path):
    run(abs_relu_exp(), feed_rand(np.float16), codegen_compile_debug="true",
        debug_dir=str(tmp_path))
    program = tmp_path / "autofuse_pointwise_0_Abs_Relu_Exp.program.txt"
    assert program.read_text() == (  # the Relu of |x| dropped (rewriter/passes.py)
        "in0: f16[128,192]\n%0 = Abs in0\n%1 = Exp %0\nout0 = %1\n")
    assert list(tmp_path.glob("graph_*_before.pbtxt"))
    after = list(tmp_path.glob("graph_*_after.pbtxt"))
    assert any('op: "AutofuseKernel"' in path.read_text() for path in after)
    assert list(tmp_path.glob("graph_*_refusals.txt"))


def test_same_graph_same_names_and_bits():
    first, executed_a = run(abs_relu_exp(tf.float32), feed_rand(np.float32, seed=3))
    second, executed_b = run(abs_relu_exp(tf.float32), feed_rand(np.float32, seed=3))
    assert fused_kernels(executed_a) == fused_kernels(executed_b)
    assert first.tobytes() == second.tobytes()


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.int32])
def test_clip_by_value_is_tensorflows_when_lo_exceeds_hi_or_a_bound_is_nan(dtype):
    """Regression (found by tests/test_random_graphs.py): ClipByValue was lowered as
    min(max(x, lo), hi), which gives hi where lo > hi and NaN where a bound is NaN. TensorFlow's
    is max(min(x, hi), lo) of std::min/std::max: lo wins, a NaN bound is ignored."""
    np_dtype = dtype.as_numpy_dtype
    nan = np.nan if dtype.is_floating else 0
    x = np.array([-3, 0, 1, 2, 5, 9, -7, nan, 4, 6], np_dtype)
    lo = np.array([2, 2, 2, 2, 2, 2, nan, 2, 7, 8], np_dtype)  # lo > hi from index 4 on
    hi = np.array([4, 4, 4, 4, 1, nan, 1, 4, 3, 3], np_dtype)

    def build():
        xs = [tf1.placeholder(dtype, [10], name=n) for n in ("x", "lo", "hi")]
        a = tf.abs(xs[0])
        # tensor bounds, then scalar immediates with lo > hi
        y = tf.negative(tf.raw_ops.ClipByValue(t=a, clip_value_min=xs[1], clip_value_max=xs[2]))
        z = tf.abs(tf.raw_ops.ClipByValue(t=y, clip_value_min=tf.constant(-2, dtype),
                                          clip_value_max=tf.constant(-5, dtype)))
        return [y, z], xs

    def feeds(xs):
        return dict(zip(xs, (x, lo, hi)))
    fused, executed = run(build, feeds)
    unfused, _ = run(build, feeds, fuse=False)
    assert len(fused_kernels(executed)) == 1
    assert "ClipByValue" not in executed.values()
    for got, want in zip(fused, unfused):
        np.testing.assert_array_equal(got, want)  # all exact ops: the same bits
    want_z = np.array([2] * 7 + [nan if dtype.is_floating else 2] + [2, 2], np_dtype)
    np.testing.assert_array_equal(unfused[1], want_z)  # lo (-2) wins over hi (-5); NaN stays


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16])
def test_clip_by_value_keeps_the_sign_of_a_zero_like_tensorflow(dtype):
    """Regression (found by scripts/fuzz_long.py --seed 20261205, graph 2724): a zero bound was
    lowered to Minimum/Maximum, whose zero result may have either sign; TensorFlow's std::min /
    std::max keep x: clip(-0.0, lo, 0.0) is -0.0, and 1 / it is -inf, not inf."""
    np_dtype = dtype.as_numpy_dtype
    x = np.array([-0.0, 0.0, -0.0, 1.0, -2.0, 0.0, -0.0, 3.0], np_dtype)

    def build():
        xs = [tf1.placeholder(dtype, [8], name="x")]
        a = tf.raw_ops.ClipByValue(t=xs[0], clip_value_min=xs[0], clip_value_max=tf.constant(0.0, dtype))
        b = tf.raw_ops.ClipByValue(t=-xs[0], clip_value_min=tf.constant(0.0, dtype),
                                   clip_value_max=tf.constant(5.0, dtype))
        return [tf.math.reciprocal(a), tf.math.reciprocal(b)], xs

    def feeds(xs):
        return {xs[0]: x}
    fused, executed = run(build, feeds)
    unfused, _ = run(build, feeds, fuse=False)
    assert fused_kernels(executed) and "ClipByValue" not in executed.values()
    for got, want in zip(fused, unfused):
        # the signs (of the zeros, hence of the infinities) exactly; the finite values to an ulp:
        # TensorFlow's Reciprocal is not correctly rounded everywhere (with AVX-512, Eigen's
        # rcp14 plus one Newton step gives 1 / 1 = 0.99999994)
        assert np.array_equal(np.signbit(got), np.signbit(want)), (got, want)
        assert np.array_equal(np.isinf(got), np.isinf(want)), (got, want)
        finite = np.isfinite(want)
        np.testing.assert_array_max_ulp(got[finite], want[finite], maxulp=1)
    assert np.isneginf(fused[0][0]) and np.isposinf(fused[0][1])  # the sign survived
