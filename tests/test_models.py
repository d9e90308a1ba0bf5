"""Keras models through tf.function with fusion on (the CPU plugin path) against fusion off.

Each run is a fresh process (tests/scripts/models.py), since AUTOFUSE_FLAGS is read at import.
Asserted: the same outputs within float32 tolerance (the fused kernels evaluate the same
expressions in another order, and reductions accumulate in higher precision), fused kernels
in the executed graph, and at least half fewer compute kernels on ResNet50, whose Keras
BatchNormalization layers are chains of Reshape, Sub, Mul, Rsqrt and AddV2 on every conv output.
"""

import json

import numpy as np
import pytest

from test_plugin import ROOT, python

SCRIPT = ROOT / "tests/scripts/models.py"
FLAGS_ON = "--enable_autofuse=true;--autofuse_enable_pass=reduce"
# Tolerances on float32 outputs: softmax probabilities (about 1e-3 each) for the CNNs,
# layer-normalised activations (about 1) for the transformer.
TOLERANCE = {"resnet50": (1e-4, 1e-6), "efficientnetb0": (1e-4, 1e-6), "transformer": (1e-4, 1e-4)}


def run(model, flags, tmp_path):
    out = tmp_path / f"{model}_{'on' if flags else 'off'}.npz"
    report = json.loads(python([SCRIPT, model, out], flags, tmp_path, timeout=900).splitlines()[-1])
    return report, np.load(out)["out"]


@pytest.mark.parametrize("model", ["resnet50", "efficientnetb0", "transformer"])
def test_model_fused_gives_the_same_outputs_with_fewer_kernels(model, tmp_path):
    off, expected = run(model, None, tmp_path)
    on, actual = run(model, FLAGS_ON, tmp_path)
    print(f"{model}: {off['kernels']} compute kernels unfused, {on['kernels']} fused "
          f"({len(on['fused'])} AutofuseKernel)")
    assert off["fused"] == [] and on["fused"]
    assert all(name.startswith(("autofuse_pointwise_", "autofuse_reduce_")) for name in on["fused"])
    assert on["kernels"] < off["kernels"]
    if model == "resnet50":
        assert on["kernels"] * 2 <= off["kernels"], (off["by_type"], on["by_type"])
    rtol, atol = TOLERANCE[model]
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)
