"""AUTOFUSE_FLAGS end to end: the CPU plugin path, each case in a fresh process.

The flags are read once, at import, so every case here starts its own Python with its own
environment: the bundled example in both modes with fusion on and off (its op summary CSV
is what users read), a tf.function and a Keras model with no config edit.
"""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples/tensorflow/af_tf_eleandele/test_abs_relu_exp.py"
FUSED = "autofuse_pointwise_0_Abs_Relu_Exp"
ORIGINAL_TYPES = {"Abs", "Relu", "Exp", "_UnaryOpsComposition"}


def python(args, flags, cwd, timeout=600):
    env = dict(os.environ)
    env.pop("AUTOFUSE_FLAGS", None)
    env.pop("AUTOFUSE_DFX_FLAGS", None)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    if flags is not None:
        env["AUTOFUSE_FLAGS"] = flags
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def op_summary(stdout):
    line = next(l for l in stdout.splitlines() if l.startswith("op summary: "))
    path = Path(line.split(": ", 1)[1])
    assert path.parent.name == "mindstudio_profiler_output"
    assert path.parent.parent.name.startswith("PROF_") and path.name.startswith("op_summary_")
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize("mode", ["tf1", "tf2-compat"])
def test_example_with_fusion_on(mode, tmp_path):
    out = python([EXAMPLE, "--mode", mode, "--steps", "20"], "--enable_autofuse=true", tmp_path)
    rows = op_summary(out)
    types = {row["OP Type"] for row in rows}
    fused = [row for row in rows if row["Op Name"] == FUSED]
    assert len(fused) == 1 and fused[0]["OP Type"] == "AutofuseKernel"
    assert fused[0]["Count"] == "20"
    assert fused[0]["Input Shapes"] == "128,192" and fused[0]["Input Data Types"] == "FLOAT16"
    assert fused[0]["Output Shapes"] == "128,192" and fused[0]["Output Data Types"] == "FLOAT16"
    assert not types & ORIGINAL_TYPES, types
    assert not [row for row in rows if row["Op Name"] in ("Abs", "Relu", "Exp")]
    assert f"fusion on" in out and FUSED in out


@pytest.mark.parametrize("mode", ["tf1", "tf2-compat"])
def test_example_with_fusion_off(mode, tmp_path):
    out = python([EXAMPLE, "--mode", mode, "--steps", "5"], None, tmp_path)
    types = {row["OP Type"] for row in op_summary(out)}
    assert "AutofuseKernel" not in types
    assert {"Exp"} <= types and ("_UnaryOpsComposition" in types or {"Abs", "Relu"} <= types)


def test_example_equals_unfused_and_error_no_larger(tmp_path):
    on = python([EXAMPLE, "--steps", "1", "--save", "on.npy"], "--enable_autofuse=true", tmp_path)
    off = python([EXAMPLE, "--steps", "1", "--save", "off.npy"], None, tmp_path)
    fused, unfused = np.load(tmp_path / "on.npy"), np.load(tmp_path / "off.npy")
    assert fused.dtype == np.float16 and fused.shape == (128, 192)
    np.testing.assert_allclose(fused.astype(np.float32), unfused.astype(np.float32), rtol=1e-3)
    assert _error(on) <= _error(off)


def test_function_and_keras_run_fused_kernels_with_the_same_results(tmp_path):
    on = json.loads(python([ROOT / "tests/scripts/function_and_keras.py", tmp_path / "on.npz"],
                           "--enable_autofuse=true", tmp_path).splitlines()[-1])
    off = json.loads(python([ROOT / "tests/scripts/function_and_keras.py", tmp_path / "off.npz"],
                            None, tmp_path).splitlines()[-1])
    assert on["fn_kernels"] == [FUSED]
    assert not ORIGINAL_TYPES & set(on["fn_ops"])
    assert off["fn_kernels"] == [] and "AutofuseKernel" not in off["fn_ops"]
    assert on["keras_kernels"] == ["autofuse_pointwise_0_Sigmoid_Mul_Tanh"]
    # unfused, TensorFlow runs them as its kernels; with oneDNN on (x86 CPUs with AVX512-VNNI,
    # BF16 or AMX) its remapper makes x * sigmoid(x) one _MklSwish, which fusion reads as the two
    off_ops = set(off["keras_ops"])
    assert "Tanh" in off_ops and ({"Sigmoid", "Mul"} <= off_ops or "_MklSwish" in off_ops)
    assert not {"Sigmoid", "Tanh", "Mul", "_MklSwish"} & set(on["keras_ops"])

    fused, unfused = np.load(tmp_path / "on.npz"), np.load(tmp_path / "off.npz")
    x = fused["x"].astype(np.float64)
    np.testing.assert_allclose(fused["fn"], unfused["fn"], rtol=1e-6)
    np.testing.assert_allclose(fused["fn"], np.exp(np.abs(x)), rtol=1e-6)
    for key in ("keras", "predict"):
        np.testing.assert_allclose(fused[key], unfused[key], rtol=1e-5, atol=1e-6)


def test_bad_flag_value_stops_the_example_naming_the_key(tmp_path):
    env = dict(os.environ, AUTOFUSE_FLAGS="--max_fusion_size=many", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, str(EXAMPLE)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert "--max_fusion_size='many' is not valid; it accepts an integer >= 0" in proc.stderr


# The broadcast and reduce examples: (script, flags that fuse, fused kernel, original op types).
OTHER_EXAMPLES = {
    "broadcast": (ROOT / "examples/tensorflow/af_tf_eleandbroadcast/test_abs_add_relu.py",
                  "--enable_autofuse=true", "autofuse_pointwise_0_Abs_AddV2_Relu",
                  {"Abs", "AddV2", "Relu"}),
    "reduce": (ROOT / "examples/tensorflow/af_tf_eleandreduce/test_abs_reducesum.py",
               "--enable_autofuse=true;--autofuse_enable_pass=reduce", "autofuse_reduce_0_Abs_Sum",
               {"Abs", "Sum"}),
}


def _error(stdout):
    line = next(l for l in stdout.splitlines() if "float64 reference" in l)
    return float(line.rsplit("=", 1)[1])


@pytest.mark.parametrize("mode", ["tf1", "tf2-compat"])
@pytest.mark.parametrize("example", sorted(OTHER_EXAMPLES))
def test_other_examples_fuse_with_the_flag_and_not_without(example, mode, tmp_path):
    script, flags, fused_name, originals = OTHER_EXAMPLES[example]
    on = python([script, "--mode", mode, "--steps", "5", "--save", "on.npy"], flags, tmp_path)
    off = python([script, "--mode", mode, "--steps", "5", "--save", "off.npy"], None, tmp_path)
    fused_out, unfused_out = np.load(tmp_path / "on.npy"), np.load(tmp_path / "off.npy")
    assert fused_out.dtype == unfused_out.dtype == np.float16
    np.testing.assert_allclose(fused_out.astype(np.float32), unfused_out.astype(np.float32),
                               rtol=2e-3, atol=1e-3)
    on_rows, off_rows = op_summary(on), op_summary(off)
    fused = [row for row in on_rows if row["Op Name"] == fused_name]
    assert len(fused) == 1 and fused[0]["OP Type"] == "AutofuseKernel", on
    assert not {row["OP Type"] for row in on_rows} & originals
    assert originals <= {row["OP Type"] for row in off_rows}
    assert "AutofuseKernel" not in {row["OP Type"] for row in off_rows}
    assert _error(on) <= _error(off)


def test_reduce_stays_unfused_without_its_pass(tmp_path):
    script, _, _, _ = OTHER_EXAMPLES["reduce"]
    rows = op_summary(python([script, "--steps", "2"], "--enable_autofuse=true", tmp_path))
    assert "Sum" in {row["OP Type"] for row in rows}
    assert not [row for row in rows if row["Op Name"].startswith("autofuse_reduce_")]
