"""Faults: the pass or its library fails, the program goes on (docs/DESIGN.md, invariant 3).

Each case runs in its own Python with its own cache directory, since the library is built and
loaded once per process at import: a compiler that fails (`CXX=false`), no compiler at all, a
cache directory that cannot be created, a disk that fills while building (RLIMIT_FSIZE), a
library file that does not load, and an exception in the rewriter on the CPU plugin path. In
each, the child imports tf_autofuse with fusion on, runs a graph that would fuse (through the
plugin and through the named optimizer) twice, and reports: the graph runs, unfused, with the
right numbers, exactly one AutofuseWarning says why and how to fix it, and the exit status is 0.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, warnings
warnings.simplefilter("always")
import numpy as np
import tensorflow as tf

caught = []
def record(message, category, *args, **kwargs):
    caught.append((category.__name__, str(message)))
warnings.showwarning = record

import tf_autofuse
from tf_autofuse import rewriter

if sys.argv[1] == "broken_rewriter":
    def broken(*args, **kwargs):
        raise RuntimeError("forced failure from test_faults")
    rewriter.rewrite = broken

tf1 = tf.compat.v1
results, kernels = [], []
for named in (False, True, True):
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [64, 33], name="x")
        y = tf.exp(tf.nn.relu(tf.abs(x)), name="y")
        config = tf1.ConfigProto()
        if named:
            config.graph_options.rewrite_options.custom_optimizers.add().name = "AutofuseOptimizer"
        with tf1.Session(graph=graph, config=config) as sess:
            md = tf1.RunMetadata()
            value = sess.run(y, {x: np.linspace(-3, 3, 64 * 33, dtype=np.float32).reshape(64, 33)},
                             options=tf1.RunOptions(output_partition_graphs=True), run_metadata=md)
    results.append(float(np.abs(value - np.exp(np.abs(np.linspace(-3, 3, 64 * 33)).reshape(64, 33))).max()))
    kernels += [n.name for p in md.partition_graphs for n in p.node if n.op == "AutofuseKernel"]

@tf.function
def fn(a):
    return tf.sigmoid(tf.tanh(a) * a)
fn_value = fn(tf.ones([8, 8])).numpy()
print(json.dumps({"available": tf_autofuse.is_available(), "errors": results, "kernels": kernels,
                  "fn_ok": bool(np.allclose(fn_value, 1 / (1 + np.exp(-np.tanh(1.0))))),
                  "warnings": [m for c, m in caught if c == "AutofuseWarning"]}))
"""


def child(tmp_path, case="plain", env_extra=None, unset=(), preexec=None, cache=None):
    env = dict(os.environ)
    for key in ("AUTOFUSE_FLAGS", "AUTOFUSE_DFX_FLAGS", "CXX", "TF_AUTOFUSE_SANITIZE", *unset):
        env.pop(key, None)
    env.update({"AUTOFUSE_FLAGS": "--enable_autofuse=true", "TF_CPP_MIN_LOG_LEVEL": "2",
                "PYTHONPATH": str(ROOT),
                "TF_AUTOFUSE_CACHE_DIR": str(cache if cache is not None else tmp_path / "cache")})
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, "-c", CHILD, case], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600, preexec_fn=preexec)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert max(report["errors"]) < 1e-5, report  # the graph ran, with the right numbers
    assert report["fn_ok"], report
    return report


def assert_one_warning(report, *words):
    warnings = report["warnings"]
    assert len(warnings) == 1, warnings
    for word in words:
        assert word in warnings[0], (word, warnings[0])
    return warnings[0]


def test_compiler_that_fails_runs_unfused_with_one_warning(tmp_path):
    report = child(tmp_path, env_extra={"CXX": "false"})
    assert report["available"] is False and report["kernels"] == []
    assert_one_warning(report, "nothing will be fused", "'false'", "does not run")


def test_missing_compiler_runs_unfused_with_one_warning(tmp_path):
    report = child(tmp_path, env_extra={"CXX": str(tmp_path / "no-such-g++")})
    assert report["available"] is False and report["kernels"] == []
    assert_one_warning(report, "needs a C++17 compiler", "apt-get install g++", "set CXX")


def test_compiler_that_breaks_while_compiling_runs_unfused(tmp_path):
    fake = tmp_path / "broken-g++"
    fake.write_text("#!/bin/sh\n"
                    "case \"$*\" in *--version*) echo 'broken-g++ 1.0'; exit 0;; esac\n"
                    "echo 'internal compiler error: simulated' >&2; exit 1\n")
    fake.chmod(0o755)
    report = child(tmp_path, env_extra={"CXX": str(fake)})
    assert report["available"] is False and report["kernels"] == []
    assert_one_warning(report, "compiling", "failed", "simulated", "set CXX")


def test_cache_directory_that_cannot_be_created_runs_unfused(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    report = child(tmp_path, cache=blocker / "cache")
    assert report["available"] is False
    assert_one_warning(report, "cannot write the kernel cache directory", "TF_AUTOFUSE_CACHE_DIR")


def _tiny_file_limit():
    # A disk that fills up: writes past 64 KiB fail with EFBIG (SIGXFSZ ignored, so the
    # compiler and Python get an error instead of being killed).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))


def test_full_cache_disk_while_building_runs_unfused(tmp_path):
    # A stand-in compiler that writes its object file at once (a real one would fail the same
    # way, a minute later): the write fails with "File too large".
    fake = tmp_path / "writing-g++"
    fake.write_text("#!/bin/bash\n"
                    "case \"$*\" in *--version*) echo 'writing-g++ 1.0'; exit 0;; esac\n"
                    "while [[ $# -gt 0 ]]; do [[ $1 == -o ]] && out=$2; shift; done\n"
                    "head -c 1000000 /dev/zero > \"$out\"\n")
    fake.chmod(0o755)
    report = child(tmp_path, env_extra={"CXX": str(fake)}, preexec=_tiny_file_limit)
    assert report["available"] is False
    assert_one_warning(report, "nothing will be fused", "free space", "File size limit")
    assert not list((tmp_path / "cache").glob("libtf_autofuse_*.so")), "a partial library landed"


def test_library_that_does_not_load_runs_unfused(tmp_path):
    from tf_autofuse import _build

    cache = tmp_path / "cache"
    cache.mkdir()
    key = _build.build_key(_build._compiler(), _build.current_target())
    bad = cache / f"libtf_autofuse_{key}.so"
    bad.write_bytes(b"\x7fELF this is not a shared library")
    report = child(tmp_path, cache=cache)
    assert report["available"] is False and report["kernels"] == []
    assert_one_warning(report, "does not load", str(bad), "Delete it")


def test_rewriter_exception_on_the_plugin_path_warns_once(tmp_path):
    # Uses the normal cache (the library is there already): only the rewriter fails.
    report = child(tmp_path, "broken_rewriter", cache=os.environ.get("TF_AUTOFUSE_CACHE_DIR") or
                   str(Path.home() / ".cache/tf_autofuse"))
    assert report["available"] is True and report["kernels"] == []
    assert_one_warning(report, "forced failure from test_faults", "runs unfused")


def test_working_setup_fuses_in_the_same_harness(tmp_path):
    """The control case: same child, nothing broken: fused kernels and no warning."""
    report = child(tmp_path, cache=os.environ.get("TF_AUTOFUSE_CACHE_DIR") or
                   str(Path.home() / ".cache/tf_autofuse"))
    assert report["available"] is True and report["warnings"] == []
    assert len(report["kernels"]) == 3, report


def _fake_compiler(path: Path, defines: str) -> str:
    path.write_text("#!/bin/bash\n"
                    f"case \"$*\" in *-dM*) printf '{defines}'; exit 0;; esac\n"
                    "exit 1\n")
    path.chmod(0o755)
    return str(path)


def test_avx512fp16_is_turned_off_only_where_the_compiler_enables_it(tmp_path):
    # TensorFlow 2.21's bundled Eigen does not compile its AVX512-FP16 packets (g++ 12 on a
    # Sapphire Rapids CPU: "expected initializer before '<'"), so the build turns the extension
    # off exactly when -march=native would turn it on, and never passes the flag to a compiler
    # that does not know it.
    from tf_autofuse import _build

    fp16 = _fake_compiler(tmp_path / "fp16-g++", "#define __AVX2__ 1\\n#define __AVX512FP16__ 1\\n")
    plain = _fake_compiler(tmp_path / "plain-g++", "#define __AVX2__ 1\\n")
    broken = tmp_path / "broken-g++"
    broken.write_text("#!/bin/bash\nexit 1\n")
    broken.chmod(0o755)
    assert _build._native_exclusions(fp16) == ["-mno-avx512fp16"]
    assert _build._native_exclusions(plain) == []
    assert _build._native_exclusions(str(broken)) == []
    # and the real compiler on this machine: the flag exactly when it defines the macro
    real = _build._compiler()
    defines = subprocess.run([real, "-march=native", "-dM", "-E", "-x", "c++", os.devnull],
                             capture_output=True, text=True).stdout
    assert (_build._native_exclusions(real) == ["-mno-avx512fp16"]) == ("__AVX512FP16__" in defines)
