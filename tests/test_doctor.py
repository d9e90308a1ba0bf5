"""`python -m tf_autofuse doctor`: the facts a user needs when nothing fuses, in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tensorflow as tf

ROOT = Path(__file__).resolve().parents[1]


def doctor(tmp_path, **env_extra):
    env = {k: v for k, v in os.environ.items() if k not in ("AUTOFUSE_FLAGS", "CXX")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT), **env_extra)
    proc = subprocess.run([sys.executable, "-m", "tf_autofuse", "doctor"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    return proc.returncode, proc.stdout


def test_doctor_names_versions_library_cpu_slot_and_cann(tmp_path):
    code, out = doctor(tmp_path, AUTOFUSE_FLAGS="--enable_autofuse=true")
    assert code == 0, out
    assert f"TensorFlow   {tf.__version__} " in out and "supports 2.15 to 2.21" in out
    assert "Keras        tf.keras is Keras " in out
    # the source tree has no library built at install: it was built at import, for this CPU
    assert "Library      built at import, in the cache, for native" in out
    assert "CPU          library compiled for everything this CPU has" in out
    assert "Plugin slot  held by tf_autofuse" in out and "(fusion on)" in out
    assert "CANN         " in out


def test_doctor_without_the_flag_says_the_slot_is_free(tmp_path):
    code, out = doctor(tmp_path)
    assert code == 0, out
    assert "Plugin slot  free: fusion is off" in out and "(fusion off)" in out


def test_doctor_without_a_library_says_why_and_fails(tmp_path):
    code, out = doctor(tmp_path, CXX="false", TF_AUTOFUSE_CACHE_DIR=str(tmp_path / "empty"))
    assert code == 1, out
    assert "Library      NOT LOADED" in out
    assert "Warning      the kernel library is not available" in out and "'false'" in out
