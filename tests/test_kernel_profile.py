"""AUTOFUSE_DFX_FLAGS=--kernel_profile=FILE: every step of every fused kernel timed, one CSV.

Run in a fresh process (the flag is read at import and the file is written at exit)."""

import csv
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf
    import tf_autofuse
    tf1 = tf.compat.v1
    tf_autofuse.compat.enable_v1()
    x = tf1.placeholder(tf.float16, [128, 192], name="x")
    b = tf.constant(np.linspace(-1, 1, 192).astype(np.float16))
    y = tf.reduce_sum(tf.exp(tf.nn.relu(tf.abs(x) + b)), axis=1, name="y")
    with tf1.Session() as sess:
        for _ in range(5):
            sess.run(y, {x: np.ones((128, 192), np.float16)})
""")


def run(tmp_path, dfx, script=SCRIPT):
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               AUTOFUSE_FLAGS="--enable_autofuse=true;--autofuse_enable_pass=reduce",
               AUTOFUSE_DFX_FLAGS=dfx, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)


def test_profile_names_every_step_of_the_fused_kernel(tmp_path):
    done = run(tmp_path, "--kernel_profile=prof/../kp.csv")  # relative to the cwd at import
    assert done.returncode == 0, done.stderr[-2000:]
    assert "kernel profile of 1 kernel(s) written to" in done.stderr
    rows = list(csv.DictReader((tmp_path / "kp.csv").open()))
    kernels = {r["kernel"] for r in rows}
    assert kernels == {"autofuse_reduce_0_Abs_AddV2_Relu_Exp_Sum"}
    call = [r for r in rows if r["step"] == "call"]
    assert len(call) == 1 and int(call[0]["runs"]) == 5
    steps = [r for r in rows if r["step"] != "call"]
    whats = [r["what"].split(" (in strips")[0] for r in steps]
    # the f16 input widened, the bias broadcast, each instruction, the row sums, the store
    assert whats[0] == "load in0 (f16)" and any(w.startswith("broadcast load in1") for w in whats)
    for op in ("Abs", "Add", "Relu", "Exp"):
        assert any(w.startswith(op + " ") for w in whats), (op, whats)
    assert any(w.startswith("accumulate Sum") for w in whats)
    assert any(w.startswith("store out0 (f16") for w in whats)
    # strip fusion runs spans of elementwise steps strip by strip; each step keeps its row
    assert any(" (in strips" in r["what"] for r in steps)
    # every run of a full step covers the tensor once per call
    assert all(int(r["elements"]) == 5 * 128 * 192 for r in steps if r["what"].startswith("Exp"))
    assert sum(float(r["share"]) for r in steps) == pytest.approx(1.0, abs=0.01)
    assert all(float(r["total_us"]) >= 0 for r in rows)


def test_profile_off_writes_nothing(tmp_path):
    done = run(tmp_path, "")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "kernel profile" not in done.stderr and not list(tmp_path.iterdir())


def test_empty_path_is_a_flag_error(tmp_path):
    done = run(tmp_path, "--kernel_profile=")
    assert done.returncode != 0 and "--kernel_profile" in done.stderr


SOFTMAX = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf
    import tf_autofuse
    tf1 = tf.compat.v1
    tf_autofuse.compat.enable_v1()
    x = tf1.placeholder(tf.float32, [64, {width}], name="x")
    e = tf.exp(x - tf.reduce_max(x, axis=1, keepdims=True))
    y = tf.identity(e / tf.reduce_sum(e, axis=1, keepdims=True), name="y")
    v = np.random.default_rng(0).normal(size=(64, {width})).astype(np.float32)
    with tf1.Session() as sess:
        for _ in range(3):
            out = sess.run(y, {{x: v}})
    ref = np.exp(v - v.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, ref / ref.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
""")


@pytest.mark.parametrize("width,exps", [(256, 1), (8192, 1), (70000, 2)])
def test_softmax_evaluates_exp_once_when_its_row_fits_the_kept_budget(tmp_path, width, exps):
    """The exp(x - max) that the sum and the division both need is computed once, in the sum's
    pass, and kept: rows of a quarter tile or less run several to a tile (the value stays in its
    tile's buffer); longer rows keep it tile by tile while a row's worth fits kKeptRowBytes
    (256 KiB: 8192 floats do). A row of 70000 floats does not, and the division's pass computes
    it again."""
    done = run(tmp_path, "--kernel_profile=kp.csv", SOFTMAX.format(width=width))
    assert done.returncode == 0, done.stderr[-2000:]
    steps = [r for r in csv.DictReader((tmp_path / "kp.csv").open()) if r["step"] != "call"]
    exp = [r for r in steps if r["what"].startswith("Exp ")]
    assert len(exp) == exps, [r["what"] for r in steps]
    assert all(int(r["elements"]) == 3 * 64 * width for r in exp)


CHAIN = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf
    import tf_autofuse
    tf1 = tf.compat.v1
    tf_autofuse.compat.enable_v1()
    x = tf1.placeholder(tf.float32, [256, 512], name="x")
    y = tf.exp(tf.nn.relu(tf.abs(x)), name="y")
    z = tf.nn.relu(tf.exp(x) - 1.5, name="z")
    v = np.random.default_rng(0).normal(size=(256, 512)).astype(np.float32)
    with tf1.Session() as sess:
        out_y, out_z = sess.run([y, z], {x: v})
    np.testing.assert_allclose(out_y, np.exp(np.abs(v)), rtol=2e-6)
    np.testing.assert_allclose(out_z, np.maximum(np.exp(v) - 1.5, 0), rtol=2e-6, atol=1e-6)
""")


def test_relu_of_a_never_negative_value_is_not_computed(tmp_path):
    """In abs -> relu -> exp the Relu (of |x|, never below 0) is dropped by the rewriter's
    simplify pass (rewriter/passes.py): the kernel keeps its name but runs no Relu step; a Relu
    of exp(x) - 1.5 runs."""
    done = run(tmp_path, "--kernel_profile=kp.csv", CHAIN)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [r for r in csv.DictReader((tmp_path / "kp.csv").open()) if r["step"] != "call"]
    kernels = {r["kernel"] for r in rows}
    chain = next(k for k in kernels if "Abs_Relu_Exp" in k)
    other = next(k for k in kernels if k != chain)
    whats = {k: [r["what"] for r in rows if r["kernel"] == k] for k in kernels}
    assert not any(w.startswith("Relu ") for w in whats[chain]), whats[chain]
    assert any(w.startswith("Abs ") for w in whats[chain])
    assert any(w.startswith("Exp ") for w in whats[chain])
    assert any(w.startswith("Relu ") for w in whats[other]), whats[other]


BIAS = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf
    import tf_autofuse
    tf1 = tf.compat.v1
    tf_autofuse.compat.enable_v1()
    x = tf1.placeholder(tf.float32, [64, {width}], name="x")
    bias = np.linspace(-1, 1, {bias}).astype(np.float32).reshape({bias_shape})
    y = tf.identity(tf.nn.relu(tf.abs(x) * 2.0 + tf.constant(bias)), name="y")
    v = np.random.default_rng(0).normal(size=(64, {width})).astype(np.float32)
    with tf1.Session() as sess:
        for _ in range(3):
            out = sess.run(y, {{x: v}})
    np.testing.assert_array_equal(out, np.maximum(np.abs(v) * np.float32(2) + bias, 0))
""")


@pytest.mark.parametrize("width,column,in_place", [(4096, False, True), (100, False, True),
                                                   (4096, True, False)])
def test_a_bias_row_is_read_in_place(tmp_path, width, column, in_place):
    """A bias row a tile long or longer is read where it is (cc/cpu/convert.h, ReadsOneRun), a
    short one from its row repeated once per call (RepeatedRows); the profile says so on its
    load's row. A column of 64 values, each repeated along a row, is copied strip by strip."""
    shape = (64, 1) if column else (width,)
    done = run(tmp_path, "--kernel_profile=kp.csv",
               BIAS.format(width=width, bias=shape[0], bias_shape=shape))
    assert done.returncode == 0, done.stderr[-2000:]
    steps = [r for r in csv.DictReader((tmp_path / "kp.csv").open()) if r["step"] != "call"]
    load = [r["what"] for r in steps if r["what"].startswith("broadcast load in1")]
    assert load == ["broadcast load in1 (f32) (in strips" +
                    (", read in place)" if in_place else ")")], [r["what"] for r in steps]
