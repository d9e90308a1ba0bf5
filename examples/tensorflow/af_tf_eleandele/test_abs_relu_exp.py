"""abs -> relu -> exp on a [128,192] float16 placeholder, 100 steps, with an op summary.

    export AUTOFUSE_FLAGS="--enable_autofuse=true"
    python3 examples/tensorflow/af_tf_eleandele/test_abs_relu_exp.py --mode tf1

With fusion on the op summary lists one kernel, autofuse_pointwise_0_Abs_Relu_Exp, where
TensorFlow alone runs Abs, Relu and Exp (or its own _UnaryOpsComposition of them).
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import runner  # noqa: E402


def build(tf1):
    x = tf1.placeholder(tf1.float16, [128, 192], name="x")
    y = tf1.exp(tf1.nn.relu(tf1.abs(x)), name="output")
    return {x: np.random.rand(128, 192).astype(np.float16)}, y


def reference(values):
    x = values["x"].astype(np.float64)
    return np.exp(np.maximum(np.abs(x), 0.0))


if __name__ == "__main__":
    runner.run(build, reference, __doc__.splitlines()[0])
