"""Smoke tests of benchmarks/model_table.py and benchmarks/ab_models.py: the harness, not the timings.

`--smoke` runs the tiny transformer ([16,32]) under each mode in its own process: the table and
the JSON must hold one cell per mode with kernel counts, peak memory and latency, each mode must
have run what its label says (tf: no fused kernels; tf_autofuse: AutofuseKernel nodes and fewer
compute kernels; XLA: a cluster), and the outputs must agree with the tf mode's.
"""

import json
import os
import subprocess
import sys

from test_plugin import ROOT


def _clean_env() -> dict:
    """This process's environment without any mode's flags: the scripts set each mode's own."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("AUTOFUSE_FLAGS", "AUTOFUSE_DFX_FLAGS", "TF_XLA_FLAGS")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def _smoke(script: str, tmp_path) -> tuple:
    """(the JSON, the printed table) of `benchmarks/<script> --smoke`, run in a clean
    environment; it must exit 0."""
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--smoke",
                           "--json", str(out)], cwd=tmp_path, env=_clean_env(),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def test_model_table_smoke(tmp_path):
    data, printed = _smoke("model_table.py", tmp_path)
    assert data["options"]["smoke"] and data["options"]["steps"] == 2
    cells = {c["mode"]: c for c in data["cells"]}
    assert list(cells) == ["tf", "autofuse", "xla"]
    assert all(c["model"] == "transformer" for c in data["cells"])
    assert len({c["pid"] for c in data["cells"]}) == 3  # a fresh process per mode
    for cell in cells.values():
        assert "error" not in cell, cell
        assert cell["median_ms"] > 0 and cell["first_ms"] > 0
        assert cell["peak_rss_mib"] >= cell["import_rss_mib"] > 0
        assert cell["kernels"] == sum(cell["kernels_by_type"].values()) > 0
    assert cells["tf"]["fused"] == 0 and "AutofuseKernel" not in cells["tf"]["kernels_by_type"]
    assert cells["autofuse"]["fused"] == cells["autofuse"]["kernels_by_type"]["AutofuseKernel"] > 0
    assert cells["autofuse"]["kernels"] < cells["tf"]["kernels"]
    assert cells["xla"]["fused"] >= 1 and "AutofuseKernel" not in cells["xla"]["kernels_by_type"]
    for mode in ("autofuse", "xla"):
        assert cells[mode]["max_rel_diff"] <= 1e-4, (mode, cells[mode]["max_rel_diff"])
    # float32 against the float64 run of the same weights: close, not equal
    assert all(0 < c["error_f64"] <= 1e-4 for c in cells.values())
    lines = printed.splitlines()
    assert any(l.startswith("| model | mode | compute kernels |") for l in lines)
    for label in ("TensorFlow (no fusion)", "tf_autofuse", "XLA auto-jit"):
        assert sum(f"| {label} |" in l for l in lines) == 1, label


def test_ab_models_smoke(tmp_path):
    """benchmarks/ab_models.py: both sides in one process, the tf side unfused, the other fused,
    the outputs equal, one block per round a side."""
    env = _clean_env()
    out = tmp_path / "ab.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/ab_models.py"), "transformer_b1",
                           "--quick", "--rounds", "2", "--calls", "2", "--json", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    tf_side, af_side = data["sides"]["tf"], data["sides"]["tf_autofuse"]
    assert tf_side["fused"] == 0 and af_side["fused"] > 0
    assert af_side["kernels"] < tf_side["kernels"]
    assert len(tf_side["blocks_ms"]) == len(af_side["blocks_ms"]) == 2
    assert data["max_rel_diff"] <= 1e-4
    assert data["tf_over_autofuse"] == tf_side["median_ms"] / af_side["median_ms"]
    assert "TF / tf_autofuse = " in proc.stdout


def test_ab_models_refuses_a_micro_workload(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/ab_models.py"), "gelu"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "'gelu' is not a model workload" in proc.stderr


def test_model_table_rounds_give_medians_and_first_call_differences(tmp_path):
    """--rounds: each (model, mode) once per round in its own process, the modes' order rotated;
    the cell holds every round's first call and latency and their medians."""
    env = _clean_env()
    out = tmp_path / "rounds.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/model_table.py"), "--smoke",
                           "--modes", "tf,autofuse", "--rounds", "2", "--json", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "round 1/2: transformer / tf" in proc.stderr
    assert proc.stderr.index("round 2/2: transformer / autofuse") < \
        proc.stderr.index("round 2/2: transformer / tf")  # rotated
    data = json.loads(out.read_text())
    assert data["options"]["rounds"] == 2
    cells = {c["mode"]: c for c in data["cells"]}
    assert list(cells) == ["tf", "autofuse"]
    for cell in cells.values():
        assert cell["rounds"] == 2 and cell["errors"] == []
        assert len(cell["first_ms_rounds"]) == len(cell["median_ms_rounds"]) == 2
        low, high = sorted(cell["first_ms_rounds"])
        assert cell["first_ms"] == (low + high) / 2
    assert cells["autofuse"]["fused"] > 0 and cells["autofuse"]["max_rel_diff"] <= 1e-4
    deltas = [a - t for a, t in zip(cells["autofuse"]["first_ms_rounds"],
                                    cells["tf"]["first_ms_rounds"])]
    line = next(l for l in proc.stdout.splitlines() if "2-layer transformer encoder: median" in l)
    assert line.endswith("(rounds: " + ", ".join(f"{d:+.0f}" for d in deltas) + ")")


def test_train_table_smoke(tmp_path):
    """benchmarks/train_table.py: a training step per mode in a fresh process; the gradient
    error of each mode against the tf process's float64 gradients."""
    data, printed = _smoke("train_table.py", tmp_path)
    cells = {c["mode"]: c for c in data["cells"]}
    assert list(cells) == ["tf", "autofuse", "xla"]
    for cell in cells.values():
        assert "error" not in cell, cell
        assert cell["median_ms"] > 0 and cell["kernels"] > 0
        # float32 gradients of one step are close to the float64 ones, but not equal to them
        assert 0 < cell["grad_error"] < 1e-4, cell["grad_error"]
    assert cells["tf"]["fused"] == 0 and cells["autofuse"]["fused"] > 0
    assert cells["autofuse"]["kernels"] < cells["tf"]["kernels"]
    assert "| model | mode | compute kernels |" in printed


def test_train_table_rounds_report_the_median_of_their_cells():
    """--rounds N: one cell per (model, mode), its times and memory the median over the rounds,
    each round's step time kept; a round that failed does not count."""
    from benchmarks import train_table

    rounds = [{"model": "m", "mode": "autofuse", "kernels": 7, "median_ms": ms,
               "first_ms": 100.0 + ms, "peak_rss_mib": 500.0 + ms, "model_rss_mib": 50.0,
               "grad_error": 0.1}
              for ms in (31.0, 29.0, 36.0)] + [{"model": "m", "mode": "autofuse", "error": "x"}]
    merged = train_table.merged_rounds(rounds)
    assert merged["median_ms"] == 31.0 and merged["first_ms"] == 131.0
    assert merged["peak_rss_mib"] == 531.0 and merged["kernels"] == 7
    assert merged["round_median_ms"] == [31.0, 29.0, 36.0]
    assert train_table.merged_rounds([{"model": "m", "error": "x"}]) == {"model": "m", "error": "x"}


def test_conv_bound_smoke():
    """benchmarks/conv_bound.py: the convolutions' time and the whole model's, in one process,
    and the bound they give (whole / convolutions)."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "conv_bound.py"),
                           "mobilenetv2_b1", "--quick", "--rounds", "1", "--calls", "1"],
                          cwd=ROOT, env=_clean_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    row = proc.stdout.strip().splitlines()[-1].split("|")
    assert row[1].strip() == "mobilenetv2_b1" and int(row[2]) > 10  # MobileNetV2: 52 convolutions
    conv_ms, whole_ms, share = float(row[3]), float(row[4]), float(row[5])
    assert conv_ms > 0 and whole_ms > 0 and abs(share - conv_ms / whole_ms) < 0.06
