"""abs(data1) + data2 (broadcast) -> relu on float16 placeholders [128,192] and [192], with an op summary.

    export AUTOFUSE_FLAGS="--enable_autofuse=true"
    python3 examples/tensorflow/af_tf_eleandbroadcast/test_abs_add_relu.py --mode tf1

tf.add builds an AddV2 node in TensorFlow 2, so with fusion on the op summary lists one kernel,
autofuse_pointwise_0_Abs_AddV2_Relu (the name holds the graph's own op types), where TensorFlow
alone runs Abs, AddV2 and Relu.
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import runner  # noqa: E402


def build(tf1):
    data1 = tf1.placeholder(tf1.float16, [128, 192], name="data1")
    data2 = tf1.placeholder(tf1.float16, [192], name="data2")
    y = tf1.nn.relu(tf1.add(tf1.abs(data1), data2), name="output")
    feeds = {data1: np.random.uniform(-1, 1, (128, 192)).astype(np.float16),
             data2: np.random.uniform(-1, 1, (192,)).astype(np.float16)}
    return feeds, y


def reference(values):
    data1, data2 = (values[k].astype(np.float64) for k in ("data1", "data2"))
    return np.maximum(np.abs(data1) + data2, 0.0)


if __name__ == "__main__":
    runner.run(build, reference, __doc__.splitlines()[0])
