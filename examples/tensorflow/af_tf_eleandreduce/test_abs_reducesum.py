"""abs -> reduce_sum(axis=1) on a [128,192] float16 placeholder, with an op summary.

    export AUTOFUSE_FLAGS="--enable_autofuse=true;--autofuse_enable_pass=reduce"
    python3 examples/tensorflow/af_tf_eleandreduce/test_abs_reducesum.py --mode tf1

Reduce fusion is off by default. With `--autofuse_enable_pass=reduce` the op summary lists one
kernel, autofuse_reduce_0_Abs_Sum, which accumulates in float32; with only
`--enable_autofuse=true` the Sum stays its own kernel.
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import runner  # noqa: E402


def build(tf1):
    x = tf1.placeholder(tf1.float16, [128, 192], name="x")
    y = tf1.reduce_sum(tf1.abs(x), axis=1, name="output")
    return {x: np.random.uniform(-1, 1, (128, 192)).astype(np.float16)}, y


def reference(values):
    return np.abs(values["x"].astype(np.float64)).sum(axis=1)


if __name__ == "__main__":
    runner.run(build, reference, __doc__.splitlines()[0])
