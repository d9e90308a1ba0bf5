"""The model table users quote: kernels, peak memory and latency of Keras models under TensorFlow,
tf_autofuse and XLA, each (model, mode) in a fresh process.

    python benchmarks/model_table.py                       # ResNet50, MobileNetV2, EfficientNetB0, transformer
    python benchmarks/model_table.py --models transformer --steps 50 --json table.json
    python benchmarks/model_table.py --smoke               # tiny transformer, 2 steps (CI)
    python benchmarks/model_table.py --modes tf,autofuse --rounds 6 --steps 3   # first calls

Models (benchmarks/workloads.py, weights=None, seeded, batch --batch): Keras ResNet50,
MobileNetV2 and EfficientNetB0 (224x224x3, logits) and the suite's 2-layer transformer encoder
([128,256]).
`--smoke` runs the transformer at [16,32] only: it checks this script, not the models.

Modes (the environment is set before TensorFlow is imported, so one process per cell):
  tf        TensorFlow's default configuration, tf_autofuse not imported ("no fusion": Grappler's
            own remapper still makes _FusedConv2D / _FusedMatMul)
  autofuse  AUTOFUSE_FLAGS="--enable_autofuse=true;--autofuse_enable_pass=reduce", import tf_autofuse
  xla       TF_XLA_FLAGS="--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit" and
            tf.config.optimizer.set_jit("autoclustering"), Grappler's arithmetic optimizer and
            remapper off (with them on, unary chains become _UnaryOpsComposition, which XLA does
            not cluster; benchmarks/README.md)

Per cell: `model(x, training=False)` in a tf.function on a constant input. The first call is
timed (tracing, Grappler, tf_autofuse's rewrite, XLA may compile on a later call) and records
the executed graph after optimization; then --warmup calls and --steps timed calls, the latency
is their median. Columns:
  compute kernels   nodes of the executed graph that compute (tf_autofuse.profiling.compute_kernels:
                    every op but _Arg, _Retval, Const, NoOp, ReadVariableOp, Identity, Placeholder);
                    an XLA cluster appears as its _XlaCompile and _XlaRun (its body is not a node)
  fused             AutofuseKernel nodes (autofuse) or XLA clusters (_XlaRun nodes) in that graph
  peak RSS          the process's resident-memory high-water mark (getrusage ru_maxrss), and the
                    part above the RSS measured once TensorFlow (and tf_autofuse) were imported
  max rel. diff     max |out - out_tf| / max |out_tf| against the tf mode's output
  max rel. error vs float64   the same against the model run in float64 with the same weights
                    and input (computed by the tf process): fusion's error next to TensorFlow's
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402  (the suite's flags and environment)
from benchmarks import workloads as wl  # noqa: E402

PREFIX = "MODEL_TABLE "
MODELS = ("resnet50", "mobilenetv2", "efficientnetb0", "transformer")
MODES = ("tf", "autofuse", "xla")
LABELS = {"tf": "TensorFlow (no fusion)", "autofuse": "tf_autofuse", "xla": "XLA auto-jit"}
ENV = {"tf": {}, "autofuse": {"AUTOFUSE_FLAGS": harness.AUTOFUSE_FLAGS_WANTED},
       "xla": {"TF_XLA_FLAGS": harness.XLA_FLAGS}}
XLA_RUN_OPS = frozenset({"_XlaRun"})


def _rss_mib() -> float:
    """The current resident set size."""
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def set_up_mode(mode: str) -> float:
    """Make this process run `mode` (its environment was set by child_env); the RSS once
    TensorFlow (and tf_autofuse) are imported."""
    import tensorflow as tf

    if mode == "autofuse":
        import tf_autofuse

        if not tf_autofuse.is_available() or not tf_autofuse.config().enable_autofuse:
            raise RuntimeError("tf_autofuse is not available or not enabled in this process")
    if mode == "xla":
        tf.config.optimizer.set_experimental_options(
            {"arithmetic_optimization": False, "remapping": False})
        tf.config.optimizer.set_jit("autoclustering")
    return _rss_mib()


def timed_calls(step, inputs: tuple, warmup: int, steps: int):
    """(executed graphs, first call ms, timed calls' ms): the first call of the tf.function
    `step` records the graphs TensorFlow ran, then `warmup` and `steps` calls."""
    from tf_autofuse import profiling  # counting only: no pass is registered without the flag

    start = time.perf_counter()
    graphs = profiling.executed_function_graphs(step, *inputs)
    first_ms = (time.perf_counter() - start) * 1e3
    for _ in range(warmup):
        step(*inputs).numpy()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step(*inputs).numpy()
        times.append((time.perf_counter() - start) * 1e3)
    return graphs, first_ms, times


def cell_of_run(model: str, mode: str, batch: int, smoke: bool, graphs, first_ms: float,
                times: list, import_rss: float, out_path: str) -> dict:
    """One cell: kernels and fused kernels (or XLA clusters) of the executed graphs, times,
    memory."""
    import resource

    import tensorflow as tf
    from tf_autofuse import profiling

    kernels = profiling.compute_kernels(graphs)
    nodes = [n for g in graphs for n in g.node]
    fused = (sum(1 for n in nodes if n.op in harness.AUTOFUSE_OPS) if mode != "xla"
             else sum(1 for n in nodes if n.op in XLA_RUN_OPS))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"model": model, "mode": mode, "batch": batch, "smoke": smoke, "pid": os.getpid(),
            "kernels": sum(kernels.values()), "kernels_by_type": dict(kernels.most_common()),
            "fused": fused, "first_ms": first_ms, "median_ms": statistics.median(times),
            "steps": len(times), "peak_rss_mib": peak, "import_rss_mib": import_rss,
            "model_rss_mib": peak - import_rss, "output": out_path,
            "tensorflow": tf.__version__}


def worker(model: str, mode: str, batch: int, steps: int, warmup: int, smoke: bool,
           out_path: str) -> dict:
    import numpy as np
    import tensorflow as tf

    import_rss = set_up_mode(mode)
    workload = wl.get(f"{model}_b{batch}", quick=smoke)
    keras_model = wl.build_model(workload)
    shape = (batch, *wl.model_input_shape(model, smoke))
    x = tf.constant(np.random.default_rng(1).uniform(0, 1, shape).astype(np.float32))

    @tf.function
    def step(t):
        return keras_model(t, training=False)

    graphs, first_ms, times = timed_calls(step, (x,), warmup, steps)
    np.save(out_path, step(x).numpy())
    if mode == "tf":  # the exact reference: the same weights and input in float64
        import keras

        keras.config.set_dtype_policy("float64")
        exact = wl.build_model(workload)
        exact.set_weights([w.astype(np.float64) for w in keras_model.get_weights()])
        np.save(out_path.replace(".npy", ".f64.npy"),
                exact(tf.constant(x.numpy().astype(np.float64)), training=False).numpy())
        keras.config.set_dtype_policy("float32")
    return cell_of_run(model, mode, batch, smoke, graphs, first_ms, times, import_rss, out_path)


def child_env(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in harness.MODE_ENV_KEYS}
    env.update(ENV[mode])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run_cell(model: str, mode: str, args, out_dir: str, tag: str = "", script: str = __file__,
             prefix: str = PREFIX, suffix: str = ".npy") -> dict:
    """Run `script --worker model mode` in a fresh process with the mode's environment; its
    result line (after `prefix`), or the error. The worker writes its output to a `suffix` file."""
    out_path = str(Path(out_dir) / f"{model}_{mode}{tag}{suffix}")
    command = [sys.executable, str(Path(script).resolve()), "--worker", model, mode,
               "--batch", str(args.batch), "--steps", str(args.steps), "--warmup",
               str(args.warmup), "--out", out_path] + (["--smoke"] if args.smoke else [])
    try:
        proc = subprocess.run(command, env=child_env(mode), capture_output=True, text=True,
                              timeout=args.timeout, cwd=out_dir)
    except subprocess.TimeoutExpired:
        return {"model": model, "mode": mode, "error": f"timed out after {args.timeout} s"}
    lines = [l for l in proc.stdout.splitlines() if l.startswith(prefix)]
    if proc.returncode != 0 or not lines:
        return {"model": model, "mode": mode,
                "error": harness.crash_text(proc.returncode, proc.stderr or proc.stdout)}
    return json.loads(lines[-1][len(prefix):])


def compare(cells: list) -> None:
    """Each cell's max |out - ref| / max |ref| against the tf cell of the same model
    (max_rel_diff) and against its float64 run of the same weights (error_f64)."""
    import numpy as np

    tf_cells = {c["model"]: c for c in cells if c["mode"] == "tf" and "error" not in c}
    for cell in cells:
        reference = tf_cells.get(cell["model"])
        cell["max_rel_diff"] = cell["error_f64"] = None
        if "error" in cell or reference is None:
            continue
        out = np.load(cell["output"]).astype(np.float64)
        for key, path in (("max_rel_diff", reference["output"]),
                          ("error_f64", reference["output"].replace(".npy", ".f64.npy"))):
            ref = np.load(path).astype(np.float64)
            scale = float(np.max(np.abs(ref))) or 1.0
            cell[key] = (float(np.max(np.abs(out - ref))) / scale if out.shape == ref.shape
                         else float("inf"))


def merge_rounds(runs: list) -> dict:
    """One cell from the rounds of one (model, mode): medians of the first call and of the
    latency, each round's values kept; the largest output difference of any round."""
    ok = [c for c in runs if "error" not in c]
    if not ok:
        return runs[0]
    cell = dict(ok[0])
    for key in ("first_ms", "median_ms"):
        cell[key + "_rounds"] = [c[key] for c in ok]
        cell[key] = statistics.median(cell[key + "_rounds"])
    for key in ("max_rel_diff", "error_f64"):
        diffs = [c.get(key) for c in ok]
        cell[key] = None if None in diffs else max(diffs)
    cell["rounds"] = len(ok)
    cell["errors"] = [c["error"] for c in runs if "error" in c]
    return cell


def first_call_summary(rounds: list) -> str:
    """Per model: the autofuse process's first call minus the tf process's of the same round."""
    lines = []
    for model in dict.fromkeys(c["model"] for cells in rounds for c in cells):
        deltas = []
        for cells in rounds:
            by_mode = {c["mode"]: c for c in cells if c["model"] == model and "error" not in c}
            if "tf" in by_mode and "autofuse" in by_mode:
                deltas.append(by_mode["autofuse"]["first_ms"] - by_mode["tf"]["first_ms"])
        if deltas:
            lines.append(f"  {wl.MODEL_NAMES.get(model, model)}: median "
                         f"{statistics.median(deltas):+.0f} ms (rounds: "
                         f"{', '.join(f'{d:+.0f}' for d in deltas)})")
    return ("first call, tf_autofuse minus TensorFlow in the same round:\n" + "\n".join(lines)
            if lines else "")


def markdown(cells: list) -> str:
    lines = ["| model | mode | compute kernels | fused kernels / XLA clusters | peak RSS (MiB) | "
             "model RSS (MiB) | latency, median (ms) | first call (ms) | max rel. diff vs TF | "
             "max rel. error vs float64 |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for c in cells:
        name = wl.MODEL_NAMES.get(c["model"], c["model"])
        if "error" in c:
            lines.append(f"| {name} | {LABELS[c['mode']]} | error: {c['error']} | | | | | | | |")
            continue
        diff = "-" if c["mode"] == "tf" or c.get("max_rel_diff") is None \
            else f"{c['max_rel_diff']:.1e}"
        exact = "-" if c.get("error_f64") is None else f"{c['error_f64']:.1e}"
        lines.append(f"| {name} | {LABELS[c['mode']]} | {c['kernels']} | {c['fused']} | "
                     f"{c['peak_rss_mib']:.0f} | {c['model_rss_mib']:.0f} | "
                     f"{c['median_ms']:.2f} | {c['first_ms']:.0f} | {diff} | {exact} |")
    return "\n".join(lines)


def selected(parser, args, all_models) -> tuple:
    """(models, modes) that --models and --modes name, checked against `all_models` and MODES
    (parser.error on an unknown one); --smoke without --models is the transformer alone; tf
    first, since the other modes' cells are compared with its."""
    models = ["transformer"] if args.smoke and args.models == ",".join(all_models) else \
        [m.strip() for m in args.models.split(",") if m.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for name, values, allowed in (("model", models, all_models), ("mode", modes, MODES)):
        bad = [v for v in values if v not in allowed]
        if bad:
            parser.error(f"unknown {name} {bad[0]!r}; accepted: {', '.join(allowed)}")
    if "tf" in modes:
        modes = ["tf"] + [m for m in modes if m != "tf"]
    return models, modes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated, from {', '.join(MODELS)}")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated, from {', '.join(MODES)} (tf is the reference)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=None, help="timed calls (default 20; "
                                                                "--smoke: 2)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls after the first "
                                                                 "(default 3; --smoke: 1)")
    parser.add_argument("--json", default=None, help="also write the cells as JSON")
    parser.add_argument("--smoke", action="store_true",
                        help="the tiny transformer only ([16,32]), 2 steps: checks the script")
    parser.add_argument("--rounds", type=int, default=1,
                        help="fresh processes per (model, mode), the modes' order rotated each "
                             "round; the table shows medians, and the first-call difference "
                             "to TensorFlow is printed per round (default 1)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.steps = args.steps if args.steps is not None else (2 if args.smoke else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 3)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    if args.worker:
        model, mode = args.worker
        result = worker(model, mode, args.batch, args.steps, args.warmup, args.smoke, args.out)
        print(PREFIX + json.dumps(result), flush=True)
        return 0

    models, modes = selected(parser, args, MODELS)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="model_table_") as out_dir:
        for r in range(args.rounds):
            cells = []
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            for model in models:
                for mode in order:
                    print(f"round {r + 1}/{args.rounds}: {model} / {mode} ...", file=sys.stderr,
                          flush=True)
                    cells.append(run_cell(model, mode, args, out_dir, f".r{r}"))
            compare(cells)
            for cell in cells:
                cell.pop("output", None)
            rounds.append(cells)
    cells = [merge_rounds([c for cells_r in rounds for c in cells_r
                           if c["model"] == model and c["mode"] == mode])
             for model in models for mode in modes]
    print(f"batch {args.batch}, {args.steps} timed calls after {args.warmup} warm-up calls, "
          f"each (model, mode) in a fresh process{', SMOKE sizes' if args.smoke else ''}"
          + (f", {args.rounds} rounds (medians)" if args.rounds > 1 else "") + "\n")
    print(markdown(cells))
    summary = first_call_summary(rounds)
    if summary:
        print("\n" + summary)
    if args.json:
        Path(args.json).write_text(json.dumps({"kind": "model_table", **harness.provenance(),
                                               "options": {
            "batch": args.batch, "steps": args.steps, "warmup": args.warmup, "smoke": args.smoke,
            "rounds": args.rounds, "autofuse_flags": harness.AUTOFUSE_FLAGS_WANTED,
            "xla_flags": harness.XLA_FLAGS}, "cells": cells}, indent=1))
    return 1 if any("error" in c for cells_r in rounds for c in cells_r) else 0


if __name__ == "__main__":
    sys.exit(main())
