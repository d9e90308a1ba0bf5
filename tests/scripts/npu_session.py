"""Fused v1 Sessions whose AutofuseKernels run on the stand-in NPU (CPU twin + stand-in ACL).

Run by tests/test_npu_dispatch.py in a fresh process: it installs the test-only
`twin.StandinBackend` in place of CANN (`cann.set_backend_for_tests`), so each AutofuseKernel,
when constructed, gets the twin-built library of its program from the resolver and launches it
through the stand-in runtime, which logs every kernel run to $TWIN_ACL_LOG.
Usage: python npu_session.py OUT_DIR   (writes OUT_DIR/report.json and OUT_DIR/arrays.npz)
"""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

import tf_autofuse
from tf_autofuse.codegen import cann, twin

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
import sessions  # noqa: E402

tf1 = tf.compat.v1
OUT = Path(sys.argv[1])
LOG = Path(os.environ["TWIN_ACL_LOG"])
handler = logging.StreamHandler(sys.stderr)
logging.getLogger("tf_autofuse").addHandler(handler)
logging.getLogger("tf_autofuse").setLevel(logging.INFO)


def launches():
    return LOG.read_text().splitlines() if LOG.exists() else []


def run(build, feeds, fuse=True, runs=1, **params):
    """(fetched values of the last run, {fused node: the NPU library it got or None}, runs logged)."""
    graph = tf.Graph()
    with graph.as_default():
        fetches, placeholders = build()
        before = len(launches())
        cann.resolved_libraries(clear=True)
        with tf1.Session(graph=graph, config=sessions.config(fuse, params)) as sess:
            metadata = tf1.RunMetadata()
            for _ in range(runs):
                values = sess.run(fetches, dict(zip(placeholders, feeds)),
                                  options=tf1.RunOptions(output_partition_graphs=True),
                                  run_metadata=metadata)
    resolved = cann.resolved_libraries()
    kernels = {}
    for partition in metadata.partition_graphs:
        for node in partition.node:
            if node.op == "AutofuseKernel":
                kernels[node.name] = resolved.get(node.name)
    return values, kernels, launches()[before:]


rng = np.random.default_rng(0)
x32 = rng.uniform(-3, 3, (64, 300)).astype(np.float32)
x16 = rng.uniform(-3, 3, (64, 300)).astype(np.float16)
b16 = rng.uniform(-1, 1, 300).astype(np.float16)
xr = rng.uniform(-2, 2, (48, 1000)).astype(np.float32)
br = rng.uniform(-1, 1, 1000).astype(np.float32)
xf = rng.uniform(-4, 4, (32, 100)).astype(np.float32)


def pointwise():
    x = tf1.placeholder(tf.float32, [64, 300], name="x")
    return tf.exp(tf.nn.relu(tf.abs(x)), name="y"), [x]


def broadcast():
    x = tf1.placeholder(tf.float16, [64, 300], name="x")
    b = tf1.placeholder(tf.float16, [300], name="b")
    return tf.nn.relu(tf.abs(x) + b, name="y"), [x, b]


def reduce():
    x = tf1.placeholder(tf.float32, [48, 1000], name="x")
    b = tf1.placeholder(tf.float32, [1000], name="b")
    return [tf.reduce_sum(tf.square(x - b), axis=1, name="ssq"),
            tf.reduce_max(tf.abs(x - b), axis=1, name="mx")], [x, b]


def rms():  # arithmetic on the reduced value, once a row
    x = tf1.placeholder(tf.float32, [48, 1000], name="x")
    return tf.math.rsqrt(tf.reduce_mean(tf.square(x), axis=1) + 1e-5, name="y"), [x]


def boolean():  # bool values: a mask computed, combined, selected on, and returned (issue 6)
    x = tf1.placeholder(tf.float32, [64, 300], name="x")
    y = tf1.placeholder(tf.float32, [64, 300], name="y")
    m = tf.logical_and(tf.greater(x, y), tf.logical_not(tf.math.is_nan(x)), name="m")
    s = tf.where(m, tf.math.erf(x), tf.cast(tf.cast(y, tf.float16), tf.float32), name="s")
    return [m, s], [x, y]


def softmax():  # several passes over each row (max, sum, output)
    x = tf1.placeholder(tf.float32, [None, 1000], name="x")
    e = tf.exp(x - tf.reduce_max(x, axis=1, keepdims=True))
    return tf.identity(e / tf.reduce_sum(e, axis=1, keepdims=True), name="y"), [x]


def column():  # a reduction over the leading axis: the column schedule
    x = tf1.placeholder(tf.float32, [48, 1000], name="x")
    return tf.reduce_sum(tf.square(x), axis=0, name="y"), [x]


def failing():
    x = tf1.placeholder(tf.float32, [32, 100], name="x")
    return tf.sigmoid(tf.tanh(x) * 2.0, name="y"), [x]


report, arrays = {}, {}


def as_list(values):
    return values if isinstance(values, list) else [values]


def case(name, build, feeds, runs=1, **params):
    fused, kernels, logged = run(build, feeds, runs=runs, **params)
    unfused, _, _ = run(build, feeds, fuse=False)
    report[name] = {"kernels": kernels, "launches": logged}
    for k, (f, u) in enumerate(zip(as_list(fused), as_list(unfused))):
        arrays[f"{name}_fused_{k}"], arrays[f"{name}_unfused_{k}"] = f, u


# 1. No CANN (and no stand-in): nothing stamped, the CPU kernel runs; one info line in all.
cann.reset_for_tests()
case("no_cann", pointwise, [x32])
case("no_cann_again", broadcast, [x16, b16])

# 2. The stand-in NPU.
cann.set_backend_for_tests(twin.StandinBackend())
case("pointwise", pointwise, [x32], runs=2)
case("broadcast", broadcast, [x16, b16])
case("reduce", reduce, [xr, br], autofuse_enable_pass="reduce")
case("rms", rms, [xr], autofuse_enable_pass="reduce")
x32b = x32[::-1].copy()
x32b[0, :7] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e30, 70000.0]
case("boolean", boolean, [x32b, x32])
case("softmax", softmax, [xr], autofuse_enable_pass="reduce")
case("column", column, [xr], autofuse_enable_pass="reduce")

# 3. Launches that fail: the CPU path, one warning for the kernel (two sessions, three runs).
os.environ["TWIN_ACL_FAIL_SYNC"] = "1"
case("failing", failing, [xf], runs=2)
fused, kernels, logged = run(failing, [xf])
report["failing_again"] = {"kernels": kernels, "launches": logged}
arrays["failing_again_fused_0"] = fused
del os.environ["TWIN_ACL_FAIL_SYNC"]


# 4. A graph naming a library in an attr: never loaded. The library's constructor would create
# $EVIL_MARKER; the kernel runs the library built for its own program.
EVIL_MARKER = OUT / "evil_marker"
(OUT / "evil.cpp").write_text(
    '#include <cstdio>\n#include <cstdlib>\n'
    '__attribute__((constructor)) static void hit() { std::FILE* f = std::fopen(std::getenv("EVIL_MARKER"), "w"); '
    'if (f) std::fclose(f); }\n'
    'extern "C" int autofuse_npu_launch(const void*) { return 0; }\n'
    'extern "C" const char* autofuse_npu_kernel_name() { return "evil"; }\n')
subprocess.run(["g++", "-shared", "-fPIC", str(OUT / "evil.cpp"), "-o", str(OUT / "libevil.so")], check=True)
os.environ["EVIL_MARKER"] = str(EVIL_MARKER)


def attr_library():
    x = tf1.placeholder(tf.float32, [32, 100], name="x")
    program = "in0: f32[32,100]\n%0 = Abs in0\n%1 = Sqrt %0\nout0 = %1\n"
    y = tf_autofuse.ops().autofuse_kernel(inputs=[x], Tout=[tf.float32], program=program)[0]
    for attr in ("_autofuse_npu_library", "_npu_library"):
        y.op._set_attr(attr, attr_value_pb2.AttrValue(s=str(OUT / "libevil.so").encode()))
    return y, [x]


fused, kernels, logged = run(attr_library, [xf], fuse=False, runs=2)
report["attr_library"] = {"kernels": kernels, "launches": logged, "marker": EVIL_MARKER.exists()}
arrays["attr_library_fused_0"] = fused


# 5. A library that does not load: one warning, the CPU kernel runs.
class MissingLibrary(twin.StandinBackend):
    def build(self, kernel, found=None):
        return OUT / "nonexistent" / "libnpu.so"


cann.set_backend_for_tests(MissingLibrary())
fused, kernels, logged = run(attr_library, [xf], fuse=False, runs=2)
report["missing_library"] = {"kernels": kernels, "launches": logged}
arrays["missing_library_fused_0"] = fused

np.savez(OUT / "arrays.npz", x32=x32, x32b=x32b, x16=x16, b16=b16, xr=xr, br=br, xf=xf, **arrays)
(OUT / "report.json").write_text(json.dumps(report, indent=1))
print("done")
