"""CI smoke test of the benchmark suite (benchmarks/): the harness, not the timings.

One quick run of every micro workload and the small transformer, all modes sharing one
process per mode (--share-process), checks the JSON and the printed tables and that each
mode ran what its label says with correct values; one quick run through
scripts/bench_chain.py checks the wrapper and the fresh-process-per-cell path. The rest are
checks of the verdict, flag fallback and output code on synthetic cells, without processes.
"""

import json
import math
import os
import subprocess
import sys

import pytest

from test_plugin import ROOT

sys.path.insert(0, str(ROOT))
from benchmarks import harness  # noqa: E402
from benchmarks import workloads as wl  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
from bench_chain import suite_argv as bench_chain_argv  # noqa: E402

MODES = ["unfused", "tf-default", "xla", "autofuse"]
CHAINS = ["ex_chain", "chain_f32", "chain_f16"]


def run_script(args, tmp_path, timeout=600):
    env = {k: v for k, v in os.environ.items()
           if k not in ("AUTOFUSE_FLAGS", "AUTOFUSE_DFX_FLAGS", "TF_XLA_FLAGS")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return proc


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "bench.json"
    names = wl.GROUPS["micro"] + ["transformer_b1"]
    proc = run_script([ROOT / "benchmarks/run.py", "--quick", "--share-process", "--workloads",
                       ",".join(names), "--json", out], tmp)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return names, proc.stdout, json.loads(out.read_text())


def test_smoke_json_structure(smoke):
    names, _, data = smoke
    assert data["modes"] == MODES
    assert list(data["summary"]) == names and list(data["workloads"]) == names
    assert data["options"]["quick"] and data["options"]["rounds"] == 1
    assert data["autofuse_flags"] in (harness.AUTOFUSE_FLAGS_WANTED,
                                      harness.AUTOFUSE_FLAGS_FALLBACK)
    # the fallback is always said, never silent
    assert (data["autofuse_flags"] == harness.AUTOFUSE_FLAGS_FALLBACK) == bool(
        data["autofuse_flags_note"])
    for name in names:
        kind = data["workloads"][name]["kind"]
        assert kind == ("model" if name == "transformer_b1" else "micro")
        row = data["summary"][name]
        assert set(row) == set(MODES) | ({"copy"} if kind == "micro" else set())
        for mode, cell in row.items():
            assert "error" not in cell, (name, mode, cell)
            assert cell["median_ms"] > 0 and cell["first_ms"] > 0 and cell["steps"] == [3]
            assert len(cell["round_medians_ms"]) == 1
            if mode != "copy":
                assert isinstance(cell["kernels"], int) and cell["kernels"] >= 1
    # the micro cells of a mode shared one process, one process per mode
    pids = {}
    for cell in data["cells"]:
        pids.setdefault(cell["mode"], set()).add(cell["pid"])
    assert all(len(p) == 1 for p in pids.values()) and len(set().union(*pids.values())) == 5


def test_smoke_each_mode_ran_what_its_label_says(smoke):
    names, _, data = smoke
    for name in names:
        row = data["summary"][name]
        for mode in MODES:
            cell = row[mode]
            assert cell["verified"], (name, mode, cell["verdict"])
            kinds = cell["fused_by_kind"]
            if mode == "unfused":
                assert cell["verdict"] == "ok" and not kinds, (name, kinds)
            if mode == "tf-default":
                assert cell["verdict"] == "ok" and not {"xla", "autofuse"} & set(kinds)
            if mode == "xla":  # every workload here is clustered
                assert cell["verdict"] == "ok" and "xla" in kinds and "autofuse" not in kinds
            if mode == "autofuse":
                assert "xla" not in kinds
                assert cell["verdict"] == ("ok" if cell["fused"] else "not fused")
            if data["workloads"][name]["kind"] == "micro":
                assert cell["values_ok"] is True, (name, mode, cell["max_error"])
            else:
                assert mode == "unfused" or cell["values_ok"], (name, mode, cell["check"])
        if "copy" in row:
            assert row["copy"]["verdict"] == "ok" and row["copy"]["copy_bytes"] == \
                data["workloads"][name]["input_bytes"]
    for name in CHAINS:  # today's tf_autofuse fuses the same-shape chain
        row = data["summary"][name]
        assert row["autofuse"]["fused"] == ["autofuse_pointwise_0_Abs_Relu_Exp"]
        assert row["autofuse"]["kernels"] == 1 and row["unfused"]["kernels"] == 3
        assert row["unfused"]["kernels_by_type"] == {"Abs": 1, "Relu": 1, "Exp": 1}
        assert row["tf-default"]["kernels_by_type"] == {"_UnaryOpsComposition": 1}


def test_smoke_tables(smoke):
    names, stdout, data = smoke
    for title in ("median step time, ms", "step time / copy bound", "first step, ms",
                  "executed compute kernels per step", "verification"):
        assert title in stdout
    header = next(l for l in stdout.splitlines() if l.strip().startswith("workload  "))
    for column in MODES + ["copy bound", "autofuse vs best other", "autofuse / copy"]:
        assert column in header
    lines = stdout.splitlines()
    for name in names:
        rows = 4 if data["workloads"][name]["kind"] == "micro" else 3  # no copy bound
        assert sum(l.strip().startswith(name + " ") for l in lines) >= rows, name
    assert "SHARE ONE PROCESS" in stdout and "checks failed" not in stdout
    assert "autofuse_pointwise_0_Abs_Relu_Exp" in stdout


def test_bench_chain_wrapper_fresh_process_per_cell(tmp_path):
    argv = bench_chain_argv(["--rounds", "3"])  # the README's command
    assert argv[:6] == ["--workloads", "chain@4096x4096:float32,chain@4096x4096:float16,"
                        "chain@128x192:float16", "--modes", "tf-unfused,tf-default,xla,autofuse",
                        "--rounds", "3"]
    assert "--autofuse-flags=--enable_autofuse=true" in argv
    out = tmp_path / "chain.json"
    proc = run_script([ROOT / "scripts/bench_chain.py", "--quick", "--shapes", "128x192:float16",
                       "--modes", "autofuse", "--json", out], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    row = data["summary"]["chain@128x192:float16"]
    assert data["modes"] == ["autofuse"]
    assert data["autofuse_flags"] == "--enable_autofuse=true"
    assert row["autofuse"]["verdict"] == "ok" and row["autofuse"]["values_ok"] is True
    assert row["autofuse"]["fused"] == ["autofuse_pointwise_0_Abs_Relu_Exp"]
    assert row["autofuse"]["steps"] == [5]
    assert len({cell["pid"] for cell in data["cells"]}) == 2  # copy, autofuse
    assert "each cell in a fresh process" in proc.stdout


# ----------------------------------------------------------------------------- no processes

def cell(mode, kinds=(), values_ok=True, **extra):
    return {"mode": mode, "fused_by_kind": {k: 1 for k in kinds}, "values_ok": values_ok,
            **extra}


def test_verdicts():
    assert harness.verdict(cell("unfused")) == "ok"
    assert harness.verdict(cell("unfused", ["grappler"])) == "WRONG KERNELS (grappler)"
    assert harness.verdict(cell("tf-default", ["grappler"])) == "ok"
    assert harness.verdict(cell("tf-default", ["autofuse"])).startswith("WRONG KERNELS")
    assert harness.verdict(cell("xla")) == "not clustered"
    assert harness.verdict(cell("xla", ["xla", "autofuse"])) == "WRONG KERNELS (autofuse)"
    assert harness.verdict(cell("autofuse")) == "not fused"
    assert harness.verdict(cell("autofuse", ["autofuse", "grappler"])) == "ok"
    assert harness.verdict(cell("autofuse", ["autofuse"], values_ok=False)) == "WRONG VALUES"
    assert harness.verdict(cell("autofuse", error="boom")) == "error"
    assert harness.fused_kind("_FusedConv2D") == "grappler"
    assert harness.fused_kind("AutofuseKernel") == "autofuse"
    assert harness.fused_kind("Conv2D") is None


def test_autofuse_flags_fall_back_when_a_key_is_unknown():
    flags, note = harness.resolve_autofuse_flags("--enable_autofuse=true;--no_such_key=1")
    assert flags == harness.AUTOFUSE_FLAGS_FALLBACK and "no_such_key" in note
    assert harness.resolve_autofuse_flags("--enable_autofuse=true") == \
        ("--enable_autofuse=true", None)


def test_summary_render_and_plot_on_synthetic_cells(tmp_path):
    def timed(mode, ms, round_index, **extra):
        return {"mode": mode, "workload": "w", "round": round_index, "median_ms": ms,
                "first_ms": 2 * ms, "warmup_ms": [ms], "steps": 10, "kernels": 3,
                "kernels_by_type": {"Abs": 3}, "fused": [], "fused_by_kind": {},
                "max_error": 0.0, "values_ok": True, **extra}

    rows = {"copy": [timed("copy", 1.0, r, copy_bytes=2**20, threads=2, gb_per_s=1.0)
                     for r in (1, 2, 3)],
            "tf-default": [timed("tf-default", ms, r) for r, ms in ((1, 4.0), (2, 6.0), (3, 5.0))],
            "autofuse": [timed("autofuse", 2.5, r, fused=["f"], fused_by_kind={"autofuse": 1},
                               kernels=1) for r in (1, 2, 3)]}
    summary = {mode: harness.summarize(results) for mode, results in rows.items()}
    assert summary["tf-default"]["median_ms"] == 5.0
    assert math.isclose(summary["tf-default"]["spread_pct"], 20.0)
    assert summary["autofuse"]["verdict"] == "ok" and summary["copy"]["verdict"] == "ok"
    data = {"modes": ["tf-default", "autofuse"], "summary": {"w": summary},
            "workloads": {"w": {"kind": "micro", "title": "t", "note": ""}},
            "options": {"copy_bound": True, "rounds": 3}}
    text = harness.render(data)
    assert "5.00 ±20%" in text and "2.00x vs tf-default" in text and "2.50x" in text
    message = harness.plot(data, str(tmp_path / "p.png"))
    assert message.startswith("plot: ") or "matplotlib is not installed" in message


def test_plot_without_matplotlib_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    message = harness.plot({"summary": {}, "modes": []}, str(tmp_path / "p.png"))
    assert "matplotlib is not installed" in message and "pip install matplotlib" in message
    assert not (tmp_path / "p.png").exists()


def test_report_writes_the_performance_page_from_the_json(smoke, tmp_path):
    """benchmarks/report.py: every workload a row with every mode's time, the ratios of the same
    run (autofuse's time against each other mode's), the command and the machine."""
    from benchmarks import report

    names, _, data = smoke
    (tmp_path / "run.json").write_text(json.dumps(data))
    out = tmp_path / "PERFORMANCE.md"
    assert report.main([str(tmp_path / "run.json"), "-o", str(out)]) == 0
    text = out.read_text()
    assert data["command"] in text and data["machine"] in text
    times = text.split("Median step time", 1)[1].split("First step", 1)[0]
    rows = {line.split(" | ")[0].lstrip("| ").split(" (")[0]: line.split(" | ")
            for line in times.splitlines() if line.startswith("| ")}
    for name in names:
        row = data["summary"][name]
        cells = rows[name]
        for i, mode in enumerate(MODES, start=1):
            assert cells[i].startswith(harness.format_ms(row[mode]["median_ms"])), (name, mode)
        want = row["xla"]["median_ms"] / row["autofuse"]["median_ms"]
        assert f"{want:.2f}x" in cells, (name, cells)


def test_report_renders_the_model_ab_and_training_json(tmp_path):
    """report.py: the A/B runs as one table (ratio, rounds won, kernels), a model or training
    table as its own script renders it, each with its command and machine."""
    from benchmarks import report

    def cell(model, mode, **more):
        return {"model": model, "mode": mode, "kernels": 10, "fused": 2, "peak_rss_mib": 900.0,
                "model_rss_mib": 100.0, "median_ms": 12.5, "first_ms": 800.0, **more}

    ab = {"kind": "ab_models", "command": "python ab_models.py resnet50_b1", "machine": "M1",
          "load_average": 0.5, "workload": "resnet50_b1", "rounds": 8, "autofuse_won_rounds": 7,
          "tf_over_autofuse": 1.25, "max_rel_diff": 9e-7,
          "sides": {"tf": {"median_ms": 50.0, "kernels": 812, "fused": 0},
                    "tf_autofuse": {"median_ms": 40.0, "kernels": 146, "fused": 65}}}
    models = {"kind": "model_table", "command": "python model_table.py --batch 8",
              "machine": "M2", "load_average": 0.4, "options": {"batch": 8},
              "cells": [cell("resnet50", "tf", max_rel_diff=None, error_f64=2e-6),
                        cell("resnet50", "autofuse", max_rel_diff=1e-6, error_f64=1.5e-6)]}
    train = {"kind": "train_table", "command": "python train_table.py", "machine": "M3",
             "load_average": 0.3, "options": {"batch": 16},
             "cells": [cell("transformer", "tf", grad_error=2.5e-7),
                       cell("transformer", "autofuse", grad_error=3.5e-7)]}
    paths = []
    for name, data in (("ab", ab), ("models", models), ("train", train)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(data))
    out = tmp_path / "PERFORMANCE.md"
    assert report.main([*map(str, paths), "-o", str(out)]) == 0
    text = out.read_text()
    for data in (ab, models, train):
        assert data["command"] in text and data["machine"] in text
    assert ("| resnet50_b1 | 50.00 | 40.00 | **1.25x** | 7 of 8 | 812 -> 146 (65 fused) | 9.0e-07 |"
            in text)
    assert "## Keras models, each mode a fresh process, batch 8" in text
    assert "| 1.0e-06 | 1.5e-06 |" in text  # the autofuse row: vs TF, vs float64
    assert "## Training steps, batch 16" in text and "| 3.5e-07 |" in text


def test_report_models_plot(tmp_path):
    """report.py --models-plot: a PNG of the A/B and training speed-ups shown on the page, or,
    without matplotlib (not a dependency), the page without it and the reason on stderr."""
    from benchmarks import report

    ab = {"kind": "ab_models", "command": "c1", "machine": "M", "load_average": 0.5,
          "workload": "resnet50_b1", "rounds": 8, "autofuse_won_rounds": 8,
          "tf_over_autofuse": 1.25, "max_rel_diff": 9e-7,
          "sides": {"tf": {"median_ms": 50.0, "kernels": 812, "fused": 0},
                    "tf_autofuse": {"median_ms": 40.0, "kernels": 146, "fused": 65}}}
    cells = [{"model": "transformer", "mode": mode, "median_ms": ms, "kernels": 1, "fused": 0,
              "peak_rss_mib": 1.0, "model_rss_mib": 1.0, "first_ms": 1.0, "grad_error": None}
             for mode, ms in (("tf", 30.0), ("autofuse", 24.0), ("xla", 25.0))]
    train = {"kind": "train_table", "command": "c2", "machine": "M", "load_average": 0.3,
             "options": {"batch": 16}, "cells": cells}
    paths = []
    for name, data in (("ab", ab), ("train", train)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(data))
    out, png = tmp_path / "PERFORMANCE.md", tmp_path / "models.png"
    assert report.main([*map(str, paths), "--models-plot", str(png), "-o", str(out)]) == 0
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not png.exists() and "models.png" not in out.read_text()
        assert "matplotlib" in report.models_plot([ab, train], str(png))
        return
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "](models.png)" in out.read_text()
