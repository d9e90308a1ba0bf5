"""The NPU path of the running product, end to end on the stand-in runtime (issue 6).

No CANN and no NPU here: tests/scripts/npu_session.py installs the test-only
`twin.StandinBackend` in place of the CANN toolchain, in a fresh process. Each AutofuseKernel op,
when constructed, then gets the library of its own program from the resolver
(codegen/cann.py, codegen/host/npu_dispatch.h), launches it through its ACL launcher, and the
stand-in libascendcl.so runs the twin-built kernel and logs every run. The tests assert the
structure (the library each executed node got, the runs the runtime logged, the warnings) and the
numbers (fused on the stand-in NPU == numpy and unfused TensorFlow). A library path in the graph
is never loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tensorflow.core.framework import graph_pb2

from tf_autofuse import _warn
from tf_autofuse.codegen import cann

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests/scripts/npu_session.py"
LAUNCH_FAILED = "the NPU launch failed"
NOT_LOADED = "the NPU kernel library is not used"


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    out = tmp_path_factory.mktemp("npu")
    env = dict(os.environ)
    for key in ("AUTOFUSE_FLAGS", "AUTOFUSE_DFX_FLAGS", "ASCEND_TOOLKIT_HOME", "TWIN_ACL_FAIL_SYNC",
                "TWIN_ACL_VECTOR_CORES"):
        env.pop(key, None)
    env.update({"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "1",  # C++ warnings are shown
                "TWIN_ACL_LOG": str(out / "acl.log"), "ASCEND_HOME_PATH": str(out / "no-cann")})
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out)], env=env, cwd=out,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    report = json.loads((out / "report.json").read_text())
    arrays = dict(np.load(out / "arrays.npz"))
    return report, arrays, proc.stderr


def only_kernel(report, case):
    kernels = report[case]["kernels"]
    assert len(kernels) == 1, kernels
    return next(iter(kernels.items()))


def assert_on_npu(report, case, runs):
    name, library = only_kernel(report, case)
    assert library and Path(library).is_file(), (name, library)  # the library the kernel got
    assert report[case]["launches"] == [report[case]["launches"][0]] * runs
    assert report[case]["launches"][0].endswith(" ok"), report[case]["launches"]
    return name


def test_without_cann_no_library_and_one_info_line(child):
    report, arrays, stderr = child
    for case in ("no_cann", "no_cann_again"):
        name, library = only_kernel(report, case)
        assert library is None and report[case]["launches"] == []
    assert stderr.count("no CANN toolkit") == 1, stderr[-3000:]
    assert "fused kernels run on the CPU" in stderr
    x = arrays["x32"]
    np.testing.assert_allclose(arrays["no_cann_fused_0"], np.exp(np.abs(x)), rtol=1e-6)


def test_pointwise_chain_runs_on_the_stand_in_npu(child):
    report, arrays, _ = child
    assert assert_on_npu(report, "pointwise", runs=2) == "autofuse_pointwise_0_Abs_Relu_Exp"
    x = arrays["x32"]
    np.testing.assert_allclose(arrays["pointwise_fused_0"], np.exp(np.abs(x.astype(np.float64))),
                               rtol=1e-6)
    np.testing.assert_allclose(arrays["pointwise_fused_0"], arrays["pointwise_unfused_0"], rtol=1e-6)


def test_broadcast_group_runs_on_the_stand_in_npu(child):
    report, arrays, _ = child
    assert assert_on_npu(report, "broadcast", runs=1) == "autofuse_pointwise_0_Abs_AddV2_Relu"
    x, b = arrays["x16"].astype(np.float32), arrays["b16"].astype(np.float32)
    want = np.maximum(np.abs(x) + b, 0).astype(np.float16)  # fp32 inside, rounded once
    fused = arrays["broadcast_fused_0"]
    assert fused.dtype == np.float16 and fused.shape == (64, 300)
    np.testing.assert_array_equal(fused, want)
    np.testing.assert_array_equal(fused, arrays["broadcast_unfused_0"])


def test_reduce_group_runs_on_the_stand_in_npu(child):
    report, arrays, _ = child
    name = assert_on_npu(report, "reduce", runs=1)
    assert name.startswith("autofuse_reduce_0_") and "Sum" in name and "Max" in name
    x, b = arrays["xr"].astype(np.float64), arrays["br"].astype(np.float64)
    ssq, mx = arrays["reduce_fused_0"], arrays["reduce_fused_1"]
    assert ssq.shape == mx.shape == (48,)
    np.testing.assert_allclose(ssq, ((x - b) ** 2).sum(axis=1), rtol=1e-5)
    np.testing.assert_array_equal(mx, np.abs(arrays["xr"] - arrays["br"]).max(axis=1))
    np.testing.assert_allclose(ssq, arrays["reduce_unfused_0"], rtol=1e-5)
    np.testing.assert_array_equal(mx, arrays["reduce_unfused_1"])


def test_arithmetic_on_a_reduced_value_runs_on_the_stand_in_npu(child):
    report, arrays, _ = child
    assert assert_on_npu(report, "rms", runs=1) == "autofuse_reduce_0_Square_Mean_AddV2_Rsqrt"
    x = arrays["xr"].astype(np.float64)
    want = 1 / np.sqrt((x * x).mean(axis=1) + 1e-5)
    np.testing.assert_allclose(arrays["rms_fused_0"], want, rtol=1e-5)
    np.testing.assert_allclose(arrays["rms_fused_0"], arrays["rms_unfused_0"], rtol=1e-5)


def test_bool_values_run_on_the_stand_in_npu(child):
    report, arrays, _ = child
    assert_on_npu(report, "boolean", runs=1)
    x, y = arrays["x32b"], arrays["x32"]
    m, s = arrays["boolean_fused_0"], arrays["boolean_fused_1"]
    assert m.dtype == np.bool_ and m.shape == (64, 300)
    np.testing.assert_array_equal(m, (x > y) & ~np.isnan(x))
    np.testing.assert_array_equal(m, arrays["boolean_unfused_0"])
    erf = np.vectorize(__import__("math").erf)(x.astype(np.float64))
    want = np.where(m, erf, y.astype(np.float16).astype(np.float64))
    np.testing.assert_allclose(s, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(s, arrays["boolean_unfused_1"], rtol=1e-6, atol=1e-7)


def test_softmax_and_a_column_reduction_run_on_the_stand_in_npu(child):
    report, arrays, _ = child
    name = assert_on_npu(report, "softmax", runs=1)
    assert name.startswith("autofuse_reduce_0_Max_Sub_Exp_Sum"), name
    x = arrays["xr"].astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(arrays["softmax_fused_0"], e / e.sum(axis=1, keepdims=True), rtol=2e-5, atol=1e-9)
    np.testing.assert_allclose(arrays["softmax_fused_0"], arrays["softmax_unfused_0"], rtol=2e-5, atol=1e-9)
    name = assert_on_npu(report, "column", runs=1)
    assert name.startswith("autofuse_reduce_0_") and "Sum" in name, name
    assert arrays["column_fused_0"].shape == (1000,)
    np.testing.assert_allclose(arrays["column_fused_0"], (x * x).sum(axis=0), rtol=1e-5)
    np.testing.assert_allclose(arrays["column_fused_0"], arrays["column_unfused_0"], rtol=1e-5)


def test_failed_launch_falls_back_to_the_cpu_with_one_warning(child):
    report, arrays, stderr = child
    name, library = only_kernel(report, "failing")
    assert library and only_kernel(report, "failing_again") == (name, library)
    # one attempt per kernel: the second run of the session went straight to the CPU; the next
    # session's kernel tried once more and failed the same way, without a second warning
    for case in ("failing", "failing_again"):
        assert len(report[case]["launches"]) == 1, report[case]
        assert "error: injected AI core exception" in report[case]["launches"][0]
    warnings = [line for line in stderr.splitlines() if LAUNCH_FAILED in line]
    assert len(warnings) == 1, warnings
    assert f"AutofuseKernel '{name}'" in warnings[0]
    assert "aclrtSynchronizeStream" in warnings[0] and "injected AI core exception" in warnings[0]
    x = arrays["xf"].astype(np.float64)
    want = 1 / (1 + np.exp(-np.tanh(x) * 2))
    for key in ("failing_fused_0", "failing_again_fused_0"):
        np.testing.assert_allclose(arrays[key], want, rtol=1e-6)
    np.testing.assert_allclose(arrays["failing_fused_0"], arrays["failing_unfused_0"], rtol=1e-6)


def test_a_library_named_in_the_graph_is_never_loaded(child):
    report, arrays, stderr = child
    case = report["attr_library"]
    assert case["marker"] is False  # the named library's constructor never ran
    name = assert_on_npu(report, "attr_library", runs=2)  # the kernel ran its own program's library
    assert "libevil" not in case["kernels"][name], case
    assert "libevil" not in stderr
    np.testing.assert_allclose(arrays["attr_library_fused_0"], np.sqrt(np.abs(arrays["xf"])), rtol=1e-6)


def test_library_that_does_not_load_is_one_warning_and_the_cpu_kernel(child):
    report, arrays, stderr = child
    assert report["missing_library"]["launches"] == []
    warnings = [line for line in stderr.splitlines() if NOT_LOADED in line]
    assert len(warnings) == 1 and "nonexistent/libnpu.so" in warnings[0], warnings
    np.testing.assert_allclose(arrays["missing_library_fused_0"], np.sqrt(np.abs(arrays["xf"])),
                               rtol=1e-6)
    assert "AutofuseWarning" not in stderr, stderr[-3000:]


# ---- the resolver, in this process ---------------------------------------------------------------

PROGRAM = "in0: f32[?]\n%0 = Abs in0\nout0 = %0\n"
NODE = "autofuse_pointwise_0_Abs"


def fused_graph(program=PROGRAM):
    g = graph_pb2.GraphDef()
    node = g.node.add(name=NODE, op="AutofuseKernel")
    node.attr["program"].s = program.encode()
    return g


class Backend:
    def __init__(self, build):
        self.detected, self.build = 0, build

    def detect(self, environ=None):
        self.detected += 1
        return cann.Cann(Path("/x"), Path("/x/bisheng"), Path("/x/libascendcl.so"), None), ""


@pytest.fixture
def backend():
    cann.reset_for_tests()
    _warn.reset()
    yield
    cann.set_backend_for_tests(None)
    cann.reset_for_tests()


def test_resolve_never_raises_and_warns_once(backend):
    def broken(kernel, found):
        raise OSError("disk on fire")
    cann.set_backend_for_tests(Backend(broken))
    with pytest.warns(_warn.AutofuseWarning, match="disk on fire") as record:
        assert cann.resolve(PROGRAM, NODE) is None
        assert cann.resolve(PROGRAM, NODE) is None
    assert len(record) == 1


def test_resolve_builds_once_per_program_and_reads_only_op_names(backend, tmp_path):
    built = []
    lib = tmp_path / "lib.so"

    def build(kernel, found):
        built.append(kernel)
        return lib
    cann.set_backend_for_tests(Backend(build))
    for _ in range(3):
        assert cann.resolve(PROGRAM, NODE) == lib
    assert len(built) == 1  # generated and built once per process
    assert cann.resolved_libraries() == {NODE: str(lib)}
    # the blacklist attr reaches the generator (op names only: anything else is dropped)
    f16 = "in0: f16[?]\n%0 = Exp in0\nout0 = %0\n"
    cann.resolve(f16, "k16", "Exp,/tmp/libx.so")
    cann.resolve(f16, "k16", "")
    assert [k.half_ops for k in built[1:]] == [("%0 = Exp",), ()]
    # a program the generator refuses is not built
    assert cann.resolve("in0: f64[?]\nin1: f64[?]\n%0 = FloorMod in0, in1\nout0 = %0\n", "k64") is None
    assert len(built) == 3


def test_the_pass_stamps_only_the_blacklist_and_builds_nothing(backend):
    cann.set_backend_for_tests(Backend(lambda kernel, found: pytest.fail("built inside the pass")))
    g = fused_graph()
    assert cann.note_fused_graph(g, frozenset()) == 0 and list(g.node[0].attr) == ["program"]
    assert cann.note_fused_graph(g, {"Exp", "Abs"}) == 1
    assert g.node[0].attr[cann.BLACKLIST_ATTR].s == b"Abs,Exp"
