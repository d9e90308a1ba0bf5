"""`python -m tf_autofuse fuse / inspect / codegen` (issue 7, offline).

The commands run in this process through `tf_autofuse.__main__.main` (fast), except the check
that matters most: the fused SavedModel loads and runs in a new process after
`import tf_autofuse`, with the original signature's input names and output keys, and gives the
original model's numbers (and a float64 reference's, within float32 rounding).
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.framework import graph_pb2

from tf_autofuse.__main__ import main

from test_plugin import ROOT

tf1 = tf.compat.v1
BIAS = np.linspace(-1, 1, 16).astype(np.float32)


class Small(tf.Module):
    def __init__(self):
        super().__init__()
        self.bias = tf.Variable(BIAS)

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="features")])
    def serve(self, features):
        z = features + self.bias
        return {"act": tf.nn.relu(z * tf.sigmoid(z)), "mag": tf.abs(z) * 2.0}


def reference(x):
    z = x.astype(np.float64) + BIAS.astype(np.float64)
    return {"act": np.maximum(z / (1 + np.exp(-z)), 0), "mag": np.abs(z) * 2}


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "small"
    module = Small()
    tf.saved_model.save(module, str(path), signatures=module.serve.get_concrete_function())
    return path


def test_fuse_a_saved_model_and_load_it_in_a_new_process(saved_model, tmp_path, capsys):
    out = tmp_path / "fused"
    assert main(["fuse", str(saved_model), "-o", str(out), "--report"]) == 0
    printed = capsys.readouterr().out
    assert "autofuse_pointwise_0_AddV2_Sigmoid_Mul_Relu_Abs_Mul" in printed
    assert "6 -> 1 kernels" in printed and "original          6          6" in printed
    record = json.loads((out / "assets.extra/autofuse_fusions.json").read_text())
    assert [f["name"] for f in record["fusions"]] == [
        "autofuse_pointwise_0_AddV2_Sigmoid_Mul_Relu_Abs_Mul"]

    assert main(["inspect", str(out)]) == 0
    table = capsys.readouterr().out
    assert "1 fused kernel(s); 1 kernels, 6 operators" in table
    assert "before fusion: 6 kernels, 6 operators" in table
    assert re.search(r"autofuse_pointwise_0_AddV2_Sigmoid_Mul_Relu_Abs_Mul +pointwise +6  "
                     r"StatefulPartitionedCall/add", table)

    x = np.random.default_rng(0).uniform(-4, 4, (5, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    script = f"""
import json, numpy as np, tensorflow as tf
import tf_autofuse
from tf_autofuse import profiling
x = tf.constant(np.load({str(tmp_path / 'x.npy')!r}))
fused = tf.saved_model.load({str(out)!r}).signatures["serving_default"]
original = tf.saved_model.load({str(saved_model)!r}).signatures["serving_default"]
graphs = profiling.executed_function_graphs(tf.function(lambda t: fused(features=t)), x)
a, b = fused(features=x), original(features=x)
np.savez({str(tmp_path / 'out.npz')!r}, **{{k: v.numpy() for k, v in a.items()}},
         **{{"orig_" + k: v.numpy() for k, v in b.items()}})
print(json.dumps({{"inputs": sorted(fused.structured_input_signature[1]),
                  "outputs": sorted(fused.structured_outputs),
                  "ops": sorted({{n.op for g in graphs for n in g.node}})}}))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("AUTOFUSE_FLAGS", "AUTOFUSE_DFX_FLAGS")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.splitlines()[-1])
    assert info["inputs"] == ["features"] and info["outputs"] == ["act", "mag"]
    assert "AutofuseKernel" in info["ops"]
    assert not {"Sigmoid", "Relu", "Abs", "AddV2", "Mul"} & set(info["ops"])
    values = np.load(tmp_path / "out.npz")
    ref = reference(x)
    for key in ("act", "mag"):
        np.testing.assert_allclose(values[key], values["orig_" + key], rtol=1e-6, atol=1e-6)
        fused_err = np.max(np.abs(values[key] - ref[key]))
        assert fused_err <= np.max(np.abs(values["orig_" + key] - ref[key])) + 1e-6


def test_fuse_a_text_graph_def_with_a_config(tmp_path, capsys):
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 8], name="x")
        y = tf.exp(tf.nn.relu(tf.abs(x)), name="y")
        tf.reduce_sum(y, axis=1, name="s")
    model = tmp_path / "g.pbtxt"
    model.write_text(text_format.MessageToString(graph.as_graph_def()))
    out = tmp_path / "out/g.pbtxt"
    assert main(["fuse", str(model), "-o", str(out), "--outputs", "y,s",
                 "--config", "passes=pointwise,reduce"]) == 0
    assert "1 fused kernel(s), 4 -> 1 kernels" in capsys.readouterr().out
    fused = text_format.Parse(out.read_text(), graph_pb2.GraphDef())
    ops = {n.name: n.op for n in fused.node}
    assert ops["autofuse_reduce_0_Abs_Relu_Exp_Sum"] == "AutofuseKernel"
    assert ops["y"] == ops["s"] == "Identity"
    assert main(["inspect", str(out)]) == 0
    assert re.search(r"autofuse_reduce_0_Abs_Relu_Exp_Sum +reduce +4  Abs, Relu, y, s\n",
                     capsys.readouterr().out)

    run = tf.Graph()
    with run.as_default():
        tf.graph_util.import_graph_def(fused, name="")
    data = np.random.default_rng(1).uniform(-2, 2, (3, 8)).astype(np.float32)
    with tf1.Session(graph=run) as sess:
        got_y, got_s = sess.run(["y:0", "s:0"], {"x:0": data})
    expected = np.exp(np.abs(data.astype(np.float64)))
    np.testing.assert_allclose(got_y, expected, rtol=1e-6)
    np.testing.assert_allclose(got_s, expected.sum(axis=1), rtol=1e-6)


@pytest.mark.parametrize("args,words", [
    (["fuse", "{tmp}/missing.pb", "-o", "{tmp}/o.pb"], ["missing.pb: no such file"]),
    (["fuse", "{tmp}/model.onnx", "-o", "{tmp}/o.onnx"], ["unknown model kind '.onnx'",
                                                           "SavedModel directory"]),
    (["fuse", "{tmp}", "-o", "{tmp}/o"], ["a directory without saved_model.pb"]),
    (["fuse", "{tmp}/bad.pb", "-o", "{tmp}/o.pb"], ["not a binary GraphDef"]),
    (["fuse", "{tmp}/g.pb", "-o", "{tmp}/o.pbtxt"], ["OUT ends with .pb"]),
    (["fuse", "{tmp}/g.pb", "-o", "{tmp}/o.pb", "--config", "cost_model=fast"],
     ["cost_model='fast' is not valid", "memory_bandwidth"]),
    (["inspect", "{tmp}/missing"], ["missing: no such file"]),
])
def test_clear_errors(args, words, tmp_path, capsys):
    (tmp_path / "model.onnx").write_bytes(b"onnx")
    (tmp_path / "bad.pb").write_bytes(b"\xff\xff not a graph")
    (tmp_path / "g.pb").write_bytes(graph_pb2.GraphDef().SerializeToString())
    assert main([a.format(tmp=tmp_path) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m tf_autofuse {args[0]}: error: ")
    for word in words:
        assert word in err


def test_subcommands_and_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main([])
    assert exit_.value.code == 2
    assert "COMMAND" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for command in ("fuse", "inspect", "codegen"):
        assert command in text
    with pytest.raises(SystemExit):
        main(["fuse", "--help"])
    assert "cost_model: one of memory_bandwidth" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["codegen", "--help"])  # still the codegen command's own parser
    assert "--no-verify" in capsys.readouterr().out
