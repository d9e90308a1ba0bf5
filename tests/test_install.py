"""Installing: the supported TensorFlow range, finding the TensorFlow of the target environment
from inside pip's build isolation, choosing the installed library for this TensorFlow and CPU,
and, end to end, a package whose library was built at install importing with no compiler.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tf_autofuse import _build

ROOT = Path(__file__).resolve().parents[1]
V4 = _build.level_features("x86-64-v4")
V3 = _build.level_features("x86-64-v3")


@pytest.mark.parametrize("version", ["2.15.0", "2.15.1", "2.17.1", "2.21.0", "2.20.0rc1"])
def test_supported_versions_pass(version):
    _build.check_supported(version)


@pytest.mark.parametrize("version", ["2.14.1", "2.22.0", "3.0.0", "1.15.5", "nightly"])
def test_unsupported_version_is_an_import_error_naming_it_and_the_range(version):
    with pytest.raises(ImportError) as caught:
        _build.check_supported(version)
    assert version in str(caught.value) and "2.15 to 2.21" in str(caught.value)
    assert "tensorflow-cpu>=2.15,<2.22" in str(caught.value)


def test_levels_follow_the_cpu_flags():
    if _build.portable_levels() != list(_build.X86_LEVELS):
        pytest.skip("x86-64 only")
    assert _build.supported_levels(V4) == ["x86-64-v2", "x86-64-v3", "x86-64-v4"]
    assert _build.supported_levels(V3) == ["x86-64-v2", "x86-64-v3"]
    # AVX-512 without the v3 base (a VM hiding FMA, say) is no v4
    assert _build.supported_levels(V4 - {"fma"}) == ["x86-64-v2"]
    assert _build.supported_levels(frozenset({"sse2"})) == []


def test_pip_isolation_is_removed_from_the_probe_environment(monkeypatch):
    keep = "/home/me/extra"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/tmp/pip-build-env-x1/site", keep]))
    monkeypatch.setenv("PYTHONNOUSERSITE", "1")
    env = _build._unisolated_environ()
    assert env["PYTHONPATH"] == keep and "PYTHONNOUSERSITE" not in env
    monkeypatch.setenv("PYTHONPATH", "/tmp/pip-build-env-x1/site")
    assert "PYTHONPATH" not in _build._unisolated_environ()
    # without pip's entries nothing is touched: a user's own setting stays
    monkeypatch.setenv("PYTHONPATH", keep)
    assert _build._unisolated_environ()["PYTHONNOUSERSITE"] == "1"


def test_install_target_is_the_tensorflow_of_the_target_interpreter(monkeypatch):
    monkeypatch.setenv(_build.PYTHON_ENV, sys.executable)
    # what pip's build isolation sets: TensorFlow must still be found
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        ["/tmp/pip-build-env-x1/site", os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PYTHONNOUSERSITE", "1")
    target, why = _build.install_target()
    assert why == "" and target is not None
    assert target.abi() == _build.current_target().abi()


def test_no_tensorflow_in_the_target_means_no_library_and_says_why(tmp_path, monkeypatch):
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)
    monkeypatch.setenv(_build.PYTHON_ENV, str(bare / "bin" / "python"))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    target, why = _build.install_target()
    assert target is None and "cannot import tensorflow" in why
    said = []
    dest = tmp_path / "_lib"
    dest.mkdir()
    (dest / "stale.so").write_text("from an earlier build")
    assert _build.build_for_install(tmp_path, log=said.append) is False
    assert not dest.exists(), "an earlier build's files would ship"
    assert "no kernel library built at install" in said[0] and _build.PYTHON_ENV in said[0]


def _fake_install(tmp_path, monkeypatch, abi=None, sources=None, levels=None, **extra):
    """A _lib/ folder with a manifest (libraries are empty files: never loaded here)."""
    lib = tmp_path / "_lib"
    lib.mkdir()
    levels = levels or _build.portable_levels()
    libraries = {lv: f"lib_{lv}.so" for lv in levels}
    for name in libraries.values():
        (lib / name).write_bytes(b"")
    manifest = {"abi": abi or _build.current_target().abi(),
                "sources": sources or _build.source_digest(), "libraries": libraries, **extra}
    (lib / _build.MANIFEST).write_text(json.dumps(manifest))
    monkeypatch.setattr(_build, "PREBUILT_DIR", lib)
    monkeypatch.delenv(_build.ISA_ENV, raising=False)
    return lib


@pytest.fixture
def x86(monkeypatch):
    if _build.portable_levels() != list(_build.X86_LEVELS):
        pytest.skip("x86-64 only")
    monkeypatch.setattr(_build, "cpu_flags", lambda: V4)


def test_installed_library_takes_the_highest_level_the_cpu_runs(tmp_path, monkeypatch, x86):
    lib = _fake_install(tmp_path, monkeypatch)
    found, why = _build._installed(_build.current_target(), "portable")
    assert why == "" and found.origin == "install" and found.level == "x86-64-v4"
    assert found.path == lib / "lib_x86-64-v4.so"
    monkeypatch.setattr(_build, "cpu_flags", lambda: V3)
    assert _build._installed(_build.current_target(), "portable")[0].level == "x86-64-v3"
    monkeypatch.setenv(_build.ISA_ENV, "x86-64-v2")
    assert _build._installed(_build.current_target(), "portable")[0].level == "x86-64-v2"
    monkeypatch.setenv(_build.ISA_ENV, "x86-64-v4")  # more than this CPU runs
    with pytest.raises(_build.BuildError, match="TF_AUTOFUSE_ISA='x86-64-v4'"):
        _build._installed(_build.current_target(), "portable")


def test_installed_library_for_another_tensorflow_is_not_used(tmp_path, monkeypatch, x86):
    abi = dict(_build.current_target().abi(), tensorflow="2.15.1", git_version="v2.15.0-x")
    _fake_install(tmp_path, monkeypatch, abi=abi)
    found, why = _build._installed(_build.current_target(), "portable")
    assert found is None
    assert "built at install for TensorFlow 2.15.1" in why and "git_version" in why


def test_installed_library_for_another_abi_is_not_used(tmp_path, monkeypatch, x86):
    target = _build.current_target()
    abi = dict(target.abi(), cxx11_abi=1 - target.cxx11_abi)
    _fake_install(tmp_path, monkeypatch, abi=abi)
    found, why = _build._installed(target, "portable")
    assert found is None and "cxx11_abi" in why


def test_installed_library_from_other_sources_is_not_used(tmp_path, monkeypatch, x86):
    _fake_install(tmp_path, monkeypatch, sources="0" * 20)
    assert _build._installed(_build.current_target(), "portable") == (
        None, "the sources changed after it was built")


def test_native_install_is_used_only_on_a_cpu_with_its_flags(tmp_path, monkeypatch, x86):
    _fake_install(tmp_path, monkeypatch, levels=[_build.NATIVE], cpu_flags=sorted(V4))
    assert _build._installed(_build.current_target(), "portable")[0].level == _build.NATIVE
    monkeypatch.setattr(_build, "cpu_flags", lambda: V3)
    found, why = _build._installed(_build.current_target(), "portable")
    assert found is None and "another CPU" in why and "avx512f" in why


def test_native_mode_ignores_a_portable_install(tmp_path, monkeypatch, x86):
    _fake_install(tmp_path, monkeypatch)
    found, why = _build._installed(_build.current_target(), _build.NATIVE)
    assert found is None and "TF_AUTOFUSE_BUILD=native" in why


def test_bad_build_mode_names_the_variable(monkeypatch):
    monkeypatch.setenv(_build.BUILD_ENV, "fast")
    with pytest.raises(_build.BuildError, match="TF_AUTOFUSE_BUILD='fast'"):
        _build.build_mode()


CHILD = r"""
import json, sys
import numpy as np
import tensorflow as tf
import tf_autofuse
from tf_autofuse import _native

tf1 = tf.compat.v1
graph = tf.Graph()
with graph.as_default():
    x = tf1.placeholder(tf.float32, [64, 33], name="x")
    y = tf.exp(tf.nn.relu(tf.abs(x)), name="y")
    values = np.linspace(-3, 3, 64 * 33, dtype=np.float32).reshape(64, 33)
    with tf1.Session(graph=graph) as sess:
        md = tf1.RunMetadata()
        out = sess.run(y, {x: values}, options=tf1.RunOptions(output_partition_graphs=True),
                       run_metadata=md)
library = _native.library()
print(json.dumps({
    "origin": library.origin, "level": library.level, "path": str(library.path),
    "error": float(np.abs(out - np.exp(np.abs(values.astype(np.float64)))).max()),
    "kernels": [n.name for p in md.partition_graphs for n in p.node if n.op == "AutofuseKernel"]}))
"""


def test_library_built_at_install_imports_without_a_compiler(tmp_path):
    """The lowest portable level (no AVX on x86-64) built as the install does, into a copy of the
    package; imported with CXX=false and an empty cache, it loads and fuses."""
    package = tmp_path / "site" / "tf_autofuse"
    shutil.copytree(ROOT / "tf_autofuse", package,
                    ignore=shutil.ignore_patterns("__pycache__", "_lib"))
    level = _build.portable_levels()[0]
    env = {k: v for k, v in os.environ.items() if k not in ("AUTOFUSE_FLAGS", "CXX")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(package.parent), TF_AUTOFUSE_BUILD="")
    # as setup.py does: _build on its own, without importing the package (and TensorFlow)
    source = str(package / "_build.py")
    loader = (f"import importlib.util, sys\n"
              f"spec = importlib.util.spec_from_file_location('b', {source!r})\n"
              f"b = importlib.util.module_from_spec(spec); sys.modules['b'] = b\n"
              f"spec.loader.exec_module(b)\n"
              f"b.portable_levels = lambda: [{level!r}]\n"
              f"assert b.build_for_install(b.PACKAGE_DIR)\n"
              f"assert 'tensorflow' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", loader], env=env, check=True, timeout=1800,
                   cwd=tmp_path, capture_output=True)
    manifest = json.loads((package / "_lib" / _build.MANIFEST).read_text())
    assert list(manifest["libraries"]) == [level] and manifest["mode"] == "portable"
    env.update(CXX="false", AUTOFUSE_FLAGS="--enable_autofuse=true",
               TF_AUTOFUSE_CACHE_DIR=str(tmp_path / "empty-cache"), TF_AUTOFUSE_ISA=level)
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["origin"] == "install" and report["level"] == level, report
    assert Path(report["path"]).parent == package / "_lib"
    assert report["kernels"] and report["error"] < 1e-5, report
    assert not (tmp_path / "empty-cache").exists() or not any((tmp_path / "empty-cache").iterdir())
    # the doctor says so
    doctor = subprocess.run([sys.executable, "-m", "tf_autofuse", "doctor"], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=600)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr[-3000:]
    assert f"built at install, for {level}" in doctor.stdout
    assert "Plugin slot  held by tf_autofuse" in doctor.stdout
