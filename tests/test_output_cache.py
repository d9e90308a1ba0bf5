"""AUTOFUSE_FLAGS=--output_cache_mb=N: large fused-kernel outputs reuse the blocks of earlier
steps' outputs (cc/output_cache.h), never one that a tensor still references.

Each case runs in a fresh process: the flag is read at import, the counters are process-wide."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

# abs -> relu -> exp on [1024, 2048] float32: an 8 MiB output, a cached size.
PRELUDE = textwrap.dedent("""
    import json
    import numpy as np
    import tensorflow as tf
    import tf_autofuse
    from tf_autofuse import _native
    tf1 = tf.compat.v1
    tf_autofuse.compat.enable_v1()
    SHAPE = (1024, 2048)
    x = tf1.placeholder(tf.float32, SHAPE, name="x")
    y = tf.exp(tf.nn.relu(tf.abs(x)), name="y")
    def feed(seed):
        return {x: np.random.default_rng(seed).uniform(-4, 4, SHAPE).astype(np.float32)}
    out = {}
""")


def run(script: str, flags: str = "") -> dict:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               AUTOFUSE_FLAGS="--enable_autofuse=true" + (";" + flags if flags else ""),
               TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(script)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def reference(seed: int) -> np.ndarray:
    data = np.random.default_rng(seed).uniform(-4, 4, (1024, 2048)).astype(np.float32)
    return np.exp(np.maximum(np.abs(data.astype(np.float64)), 0))


def test_a_freed_output_is_reused_and_a_held_one_is_not():
    got = run("""
        with tf1.Session() as sess:
            first = sess.run(y, feed(1))          # held: its block must not be reused
            stats = [_native.output_cache_stats()]
            second = sess.run(y, feed(2))         # a new block (the first is still referenced)
            stats.append(_native.output_cache_stats())
            kept = second.copy()
            del second                            # its block goes back to the cache ...
            third = sess.run(y, feed(3))          # ... and this output takes it
            stats.append(_native.output_cache_stats())
            out = {"stats": stats, "first": first[:4, :4].tolist(), "first_sum": float(first.sum()),
                   "kept_sum": float(kept.sum()), "third_sum": float(third.sum())}
        print(json.dumps(out))
    """)
    first, second, third = got["stats"]
    assert first["misses"] >= 1 and first["hits"] == 0
    assert second["misses"] == first["misses"] + 1 and second["hits"] == 0
    assert third["hits"] == 1 and third["misses"] == second["misses"]
    # every result is its own step's, held or not
    for key, seed in (("first_sum", 1), ("kept_sum", 2), ("third_sum", 3)):
        want = reference(seed).sum()
        assert abs(got[key] - want) / want < 1e-5, key
    want = reference(1)[:4, :4]
    assert np.max(np.abs(np.array(got["first"]) - want) / want) < 4 * 2.0**-23


def test_an_output_a_variable_adopted_is_not_reused_while_the_variable_holds_it():
    # AssignVariableOp takes the output's buffer when nothing else references it; later steps'
    # outputs must then come from other blocks, and the variable keeps its value.
    got = run("""
        v = tf1.get_variable("v", SHAPE, tf.float32, initializer=tf1.zeros_initializer(),
                             use_resource=True)
        assign = v.assign(y, read_value=False)
        with tf1.Session() as sess:
            sess.run(v.initializer)
            sess.run(assign, feed(1))
            for seed in (2, 3, 4):
                sess.run(y, feed(seed))   # fetched and dropped: its block is reused
            held = sess.run(v.read_value())
            out = {"held": float(held.sum()), "corner": held[:8, :8].tolist(),
                   "stats": _native.output_cache_stats()}
        print(json.dumps(out))
    """)
    want = reference(1)
    assert abs(got["held"] - want.sum()) / want.sum() < 1e-5
    assert np.max(np.abs(np.array(got["corner"]) - want[:8, :8]) / want[:8, :8]) < 4 * 2.0**-23
    assert got["stats"]["hits"] >= 2  # steps 3 and 4 reused step 2's and 3's blocks


def test_the_cache_keeps_at_most_its_budget_and_zero_turns_it_off():
    script = """
        with tf1.Session() as sess:
            held = [sess.run(y, feed(seed)) for seed in range(3)]  # three live 8 MiB outputs
            sums = [float(h.sum()) for h in held]
            del held                                               # all three freed at once
            out = {"stats": _native.output_cache_stats(), "sums": sums}
        print(json.dumps(out))
    """
    small = run(script, "--output_cache_mb=10")
    assert small["stats"]["misses"] == 3
    assert small["stats"]["idle_blocks"] == 1 and small["stats"]["idle_bytes"] <= 10 << 20
    off = run(script, "--output_cache_mb=0")
    assert off["stats"] == {"hits": 0, "misses": 0, "idle_bytes": 0, "idle_blocks": 0}
    for got in (small, off):
        for seed, value in enumerate(got["sums"]):
            want = reference(seed).sum()
            assert abs(value - want) / want < 1e-5


def test_a_small_output_does_not_use_the_cache():
    got = run("""
        z = tf1.placeholder(tf.float32, [512, 1024])   # 2 MiB: TensorFlow's allocator
        w = tf.exp(tf.nn.relu(tf.abs(z)))
        with tf1.Session() as sess:
            for _ in range(3):
                sess.run(w, {z: np.ones((512, 1024), np.float32)})
            out = {"stats": _native.output_cache_stats()}
        print(json.dumps(out))
    """)
    assert got["stats"]["hits"] == 0 and got["stats"]["misses"] == 0
