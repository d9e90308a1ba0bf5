"""CANN versions: detection reads the toolkit's version, each supported version gets the build and
the API of its generation (cann.ROUTES), and each generation's launcher is built and run against
stand-ins of that generation's headers and runtime (codegen/twin/acl). Another version is one
warning and the CPU path."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from tf_autofuse import _warn
from tf_autofuse.codegen import build as _build
from tf_autofuse.codegen import cann, generate, twin

CHAIN = "in0: f32[?]\n%0 = Abs in0\n%1 = Relu %0\n%2 = Exp %1\nout0 = %2\n"


def toolkit(root: Path, version_file: str = "compiler/version.info", text: str = "Version=8.1.RC1\n") -> Path:
    """A directory that looks like a CANN toolkit: bisheng, libascendcl.so, a version file."""
    for rel in ("compiler/ccec_compiler/bin/bisheng", "lib64/libascendcl.so"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    if version_file:
        (root / version_file).parent.mkdir(parents=True, exist_ok=True)
        (root / version_file).write_text(text)
    return root


@pytest.fixture
def fresh():
    cann.reset_for_tests()
    _warn.reset()
    yield
    cann.reset_for_tests()


@pytest.mark.parametrize("version_file,text,version,route", [
    ("compiler/version.info", "Version=8.0.RC3\n", "8.0.RC3", 8),
    ("compiler/version.info", "Version=8.1.RC1\n", "8.1.RC1", 8),
    ("runtime/version.info", "Version=8.3.0\n", "8.3.0", 8),
    ("compiler/version.info", "Version=8.5.0\n", "8.5.0", 9),
    ("x86_64-linux/ascend_toolkit_install.info", "package_name=Ascend-cann-toolkit\nversion=9.0.0\n", "9.0.0", 9),
])
def test_detect_reads_the_version_and_picks_the_api_generation(fresh, tmp_path, version_file, text, version, route):
    home = toolkit(tmp_path, version_file, text)
    found, why = cann.detect({"ASCEND_HOME_PATH": str(home), "PATH": ""})
    assert found is not None, why
    assert (found.version, found.route) == (version, route)


@pytest.mark.parametrize("version_file,text,why", [
    ("compiler/version.info", "Version=7.0.RC1\n", "version 7.0.RC1 is not supported"),
    ("compiler/version.info", "Version=10.0.0\n", "version 10.0.0 is not supported"),
    (None, "", "its version could not be read"),
])
def test_an_unsupported_version_is_one_warning_and_the_cpu_path(fresh, tmp_path, version_file, text, why):
    home = toolkit(tmp_path, version_file, text)
    environ = {"ASCEND_HOME_PATH": str(home), "PATH": ""}
    with pytest.warns(_warn.AutofuseWarning, match=why) as record:
        for _ in range(3):
            found, reason = cann.detect(environ)
            assert found is None and why in reason
            assert cann.prepare(CHAIN, "autofuse_pointwise_0_Abs_Relu_Exp", environ, blacklist=()) is None
    assert len(record) == 1 and cann.SUPPORTED in str(record[0].message)


def _plan(route, tmp_path):
    kernel = generate(CHAIN, "autofuse_pointwise_0_Abs_Relu_Exp")
    home = tmp_path / "cann"
    found = cann.Cann(home, home / "bisheng", home / "lib64/libascendcl.so", "/usr/bin/cmake",
                      {8: "8.1.RC1", 9: "9.0.0"}[route], route)
    return kernel, found, cann.build_plan(kernel, found, {})


def test_the_cann_8_build_uses_ascendc_library_and_aclrt_launch_kernel(tmp_path):
    kernel, found, (files, commands, product) = _plan(8, tmp_path)
    cmake = files["CMakeLists.txt"]
    assert "include(${ASCENDC_CMAKE_DIR}/ascendc.cmake)" in cmake
    assert f"ascendc_library({kernel.name}_device STATIC {kernel.name}_kernel.cpp)" in cmake
    assert "AUTOFUSE_CANN_ROUTE=8" in cmake and "find_package(ASC" not in cmake and "LANGUAGES ASC" not in cmake
    assert f"{kernel.name}.asc" not in files  # the device code is built apart from the host code
    host = files[f"{kernel.name}_host.cpp"]
    assert f'#include "aclrtlaunch_{kernel.name}.h"' in host
    for command in commands:  # cmake sees the toolkit the detection found
        assert command[:2] == ["env", f"ASCEND_HOME_PATH={found.home}"], command
    assert product == f"lib{kernel.name}.so"


def test_the_cann_9_build_uses_find_package_asc(tmp_path):
    kernel, found, (files, commands, _) = _plan(9, tmp_path)
    cmake = files["CMakeLists.txt"]
    assert "find_package(ASC REQUIRED" in cmake and "LANGUAGES ASC CXX" in cmake
    assert "AUTOFUSE_CANN_ROUTE=9" in cmake and "ascendc_library" not in cmake
    assert f"{kernel.name}.asc" in files
    for command in commands:
        assert command[:2] == ["env", f"ASCEND_HOME_PATH={found.home}"], command


@pytest.mark.parametrize("route,query", [(8, "capability_queries"), (9, "device_info_queries")])
def test_each_generation_launches_against_its_own_stand_in(route, query):
    kernel = generate(CHAIN, f"route{route}_chain")
    lib = twin.build([kernel], acl=True, route=route)
    x = np.random.default_rng(route).uniform(-3, 3, 10_000).astype(np.float32)
    before = twin.stub_stats()
    (y,), t = lib.launch(kernel.name, [x], core_num=0)  # the launcher asks the device
    after = twin.stub_stats()
    np.testing.assert_allclose(y, np.exp(np.abs(x.astype(np.float64))), rtol=1e-6)
    assert after["launches"] == before["launches"] + 1
    other = "device_info_queries" if query == "capability_queries" else "capability_queries"
    assert after[query] > before[query] and after[other] == before[other]


@pytest.mark.parametrize("route,api", [(8, "aclrtGetDeviceInfo(0, ACL_DEV_ATTR_VECTOR_CORE_NUM, &v)"),
                                       (9, "aclGetDeviceCapability(0, ACL_DEVICE_INFO_VECTOR_CORE_NUM, &v)")])
def test_each_stand_in_header_has_only_its_generations_device_query(tmp_path, route, api):
    source = tmp_path / "probe.cpp"
    source.write_text(f'#include "acl/acl.h"\nint main() {{ int64_t v = 0; return {api}; }}\n')
    proc = subprocess.run([_build.cxx(), "-std=c++17", "-fsyntax-only", f"-DAUTOFUSE_CANN_ROUTE={route}",
                           f"-I{_build.TWIN_DIR}", str(source)], capture_output=True, text=True)
    assert proc.returncode != 0 and "was not declared" in proc.stderr, proc.stderr


def test_the_stand_in_backend_of_cann_8_builds_a_library_the_op_kernel_can_load(fresh):
    cann.set_backend_for_tests(twin.StandinBackend(route=8))
    try:
        path = cann.prepare(CHAIN, "autofuse_pointwise_0_Abs_Relu_Exp", blacklist=())
    finally:
        cann.set_backend_for_tests(None)
    assert path is not None and path.is_file()
    kernel = generate(CHAIN, "autofuse_pointwise_0_Abs_Relu_Exp")
    lib = twin.TwinLibrary(path, {kernel.name: kernel})
    x = np.linspace(-2, 2, 3000, dtype=np.float32)
    (y,), _ = lib.launch(kernel.name, [x], core_num=4, symbol="autofuse_npu_launch")
    np.testing.assert_allclose(y, np.exp(np.abs(x.astype(np.float64))), rtol=1e-6)
