"""A fused train step under tf.distribute: MirroredStrategy over two logical CPU devices, and
MultiWorkerMirroredStrategy with two worker processes over loopback. Each runs in fresh
processes with fusion on and off (AUTOFUSE_FLAGS is read at import); the losses must agree and
the fused run must have run fused kernels."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests/scripts/distributed_step.py"
FLAGS = "--enable_autofuse=true"


def _env(fused: bool, tf_config=None) -> dict:
    env = dict(os.environ)
    env.pop("AUTOFUSE_FLAGS", None)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    if fused:
        env["AUTOFUSE_FLAGS"] = FLAGS
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    return env


def _result(proc) -> dict:
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stdout + stderr
    return json.loads(stdout.strip().splitlines()[-1])


def _mirrored(fused: bool) -> dict:
    return _result(subprocess.Popen([sys.executable, str(SCRIPT), "mirrored"], cwd=ROOT,
                                    env=_env(fused), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True))


def _free_ports(n: int) -> list:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _multiworker(fused: bool) -> dict:
    workers = [f"localhost:{port}" for port in _free_ports(2)]
    procs = [subprocess.Popen(
        [sys.executable, str(SCRIPT), "multiworker"], cwd=ROOT,
        env=_env(fused, {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    results = [_result(p) for p in procs]
    np.testing.assert_allclose(results[0]["losses"], results[1]["losses"], rtol=1e-6)
    return results[0]


def _check(fused: dict, unfused: dict) -> None:
    assert "AutofuseKernel" in fused["ops"] and "AutofuseKernel" not in unfused["ops"]
    assert len(fused["losses"]) == len(unfused["losses"]) >= 5
    np.testing.assert_allclose(fused["losses"], unfused["losses"], rtol=1e-4)
    assert fused["losses"][-1] < fused["losses"][0]  # it trains


def test_mirrored_strategy_on_two_logical_devices():
    _check(_mirrored(True), _mirrored(False))


def test_multi_worker_mirrored_strategy_over_loopback():
    _check(_multiworker(True), _multiworker(False))
