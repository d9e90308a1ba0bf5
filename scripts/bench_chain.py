"""Step time of abs -> relu -> exp under TensorFlow, XLA and tf_autofuse, one table.

    python scripts/bench_chain.py                 # 3 shapes x 4 modes, 2 interleaved rounds
    python scripts/bench_chain.py --quick         # CI smoke run: 1 round, a few steps
    python scripts/bench_chain.py --modes tf-default,autofuse --shapes 4096x4096:float16 \
        --rounds 3 --json bench.json

Every (round, shape, mode) cell runs in a fresh Python process (`--worker`), with the mode's
environment set before TensorFlow is imported, and reports one JSON line back:

  tf-unfused  Grappler's arithmetic optimizer and remapper OFF: Abs, Relu, Exp run as 3 kernels
  tf-default  the default ConfigProto: the arithmetic optimizer makes one _UnaryOpsComposition
  xla         TF_XLA_FLAGS="--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit", with the tf-unfused
              ConfigProto (with the default one, Grappler composes the chain into
              _UnaryOpsComposition first, which XLA cannot compile, and nothing is clustered)
  autofuse    AUTOFUSE_FLAGS=--enable_autofuse=true and `import tf_autofuse` before the graph

Workload (TF1 graph, tf.compat.v1.Session): x is a resource variable holding uniform [-1, 1]
data; one step computes exp(relu(abs(x))) and assigns it to a second resource variable,
run as a target, so nothing is copied to numpy. The assignment is the sink by default
because with a bare target (`--sink target`, i.e. sess.run(y.op)) XLA drops the unused
result and times an empty step, and Grappler keeps the fetched Exp out of the composition.
The first step is timed on its own ("first step": graph rewriting, XLA compilation), then a
few warm-up steps, then N steps (default: about 1 s worth, at least 10), each a call of
Session.make_callable(op) (what sess.run(op) does, with less Python overhead); a cell is the
median step time, and the table shows the median over the rounds. One traced step (FULL_TRACE) per
cell records which op types ran, printed under the table to check each mode's label.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULT_PREFIX = "BENCH_CHAIN_RESULT "
DEFAULT_SHAPES = ["4096x4096:float32", "4096x4096:float16", "128x192:float16"]
DTYPES = ["float16", "bfloat16", "float32", "float64"]
CHILD_TIMEOUT_S = 900  # the first `import tf_autofuse` may build its C++ library (~1 min)
WARMUP_STEPS = 3
TARGET_SECONDS = 1.0
MIN_STEPS = 10
# Largest relative error of the result accepted, per dtype (a few units in the last place).
TOLERANCE = {"float16": 4e-3, "bfloat16": 3e-2, "float32": 1e-5, "float64": 1e-12}
QUICK_STEPS = 5

# Op types that move data around rather than compute the chain; left out of the printed check.
BOOKKEEPING_OPS = {"NoOp", "VarHandleOp", "ReadVariableOp", "AssignVariableOp", "Identity",
                   "Switch", "Merge", "_Arg", "_Retval", "Const", "_Recv", "_Send"}
CHAIN_OPS = {"Abs", "Relu", "Exp"}
FUSED_OPS = {"_UnaryOpsComposition", "_XlaRun", "AutofuseKernel"}

MODES = {
    # name: environment to set, whether Grappler's rewrites are off, the op types that must
    # run (expect) and must not run (the other kernels that compute the chain) in that mode
    "tf-unfused": {"env": {}, "grappler_off": True, "expect": CHAIN_OPS},
    "tf-default": {"env": {}, "grappler_off": False, "expect": {"_UnaryOpsComposition"}},
    "xla": {"env": {"TF_XLA_FLAGS": "--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit"},
            "grappler_off": True, "expect": {"_XlaRun"}},
    "autofuse": {"env": {"AUTOFUSE_FLAGS": "--enable_autofuse=true"}, "grappler_off": False,
                 "expect": {"AutofuseKernel"}},
}
for _mode in MODES.values():
    _mode["forbid"] = (CHAIN_OPS | FUSED_OPS) - _mode["expect"]
MODE_ENV_KEYS = {"TF_XLA_FLAGS", "AUTOFUSE_FLAGS", "AUTOFUSE_DFX_FLAGS"}


# ----------------------------------------------------------------------------- command line

def parse_shape(spec: str) -> tuple[list[int], str]:
    """'4096x4096:float16' -> ([4096, 4096], 'float16')."""
    dims, sep, dtype = spec.partition(":")
    if not sep or dtype not in DTYPES or not re.fullmatch(r"\d+(x\d+)*", dims):
        raise argparse.ArgumentTypeError(
            f"{spec!r}: a shape is DIMxDIM...:DTYPE, e.g. 4096x4096:float16 "
            f"(dtypes: {', '.join(DTYPES)})")
    return [int(d) for d in dims.split("x")], dtype


def shape_label(shape: list[int], dtype: str) -> str:
    return f"[{','.join(map(str, shape))}] {dtype}"


def comma_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]))
    parser.add_argument("--rounds", type=int, default=2,
                        help="interleaved rounds; the table shows the median (default 2)")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"timed steps per cell (default: ~{TARGET_SECONDS:g} s worth, "
                             f"at least {MIN_STEPS})")
    parser.add_argument("--shapes", type=comma_list, default=DEFAULT_SHAPES,
                        help=f"comma-separated DIMxDIM:DTYPE (default {','.join(DEFAULT_SHAPES)})")
    parser.add_argument("--modes", type=comma_list, default=list(MODES),
                        help=f"comma-separated subset of {','.join(MODES)} (default all)")
    parser.add_argument("--sink", choices=["assign", "target"], default="assign",
                        help="assign: the result goes to a variable (default); "
                             "target: run exp's op as a bare target, sess.run(y.op)")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke run: 1 round, {QUICK_STEPS} steps per cell")
    parser.add_argument("--json", metavar="PATH", help="also write the results to PATH")
    parser.add_argument("--worker", metavar="MODE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    unknown = [m for m in args.modes if m not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    try:
        args.shapes = [parse_shape(spec) for spec in args.shapes]
    except argparse.ArgumentTypeError as err:
        parser.error(str(err))
    if args.quick:
        args.rounds = 1
        args.steps = args.steps or QUICK_STEPS
    if args.rounds < 1 or (args.steps is not None and args.steps < 1):
        parser.error("--rounds and --steps must be at least 1")
    return args


# ----------------------------------------------------------------------------- child: one cell

def session_config(tf, grappler_off: bool):
    config = tf.compat.v1.ConfigProto()
    if grappler_off:
        from tensorflow.core.protobuf import rewriter_config_pb2

        rewrite = config.graph_options.rewrite_options
        rewrite.arithmetic_optimization = rewriter_config_pb2.RewriterConfig.OFF
        rewrite.remapping = rewriter_config_pb2.RewriterConfig.OFF
    return config


def build_graph(tf, shape: list[int], dtype: str, sink: str):
    """The chain on a variable. Returns (graph, init ops, the op one step runs, and the
    (input, output) tensors to check the result with, or None for a bare target)."""
    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        data = tf.cast(tf1.random_uniform(shape, -1.0, 1.0, dtype=tf.float32, seed=1), dtype)
        x = tf1.Variable(data, use_resource=True, name="x")
        y = tf.exp(tf.nn.relu(tf.abs(x.read_value())), name="y")
        init_ops, check = [x.initializer], None
        if sink == "assign":
            out = tf1.Variable(tf.zeros(shape, dtype), use_resource=True, name="out")
            init_ops.append(out.initializer)
            step_op = out.assign(y, read_value=False)
            check = (x.read_value(), out.read_value())
        else:
            step_op = y.op
    return graph, init_ops, step_op, check


def time_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def timed_steps(run_step, steps: int | None) -> dict:
    """First step, warm-up steps, then the timed steps."""
    first_ms = time_ms(run_step)
    warmup_ms = [time_ms(run_step) for _ in range(WARMUP_STEPS)]
    if steps is None:
        estimate_s = max(statistics.median(warmup_ms) / 1e3, 1e-6)
        steps = max(MIN_STEPS, math.ceil(TARGET_SECONDS / estimate_s))
    step_ms = [time_ms(run_step) for _ in range(steps)]
    return {"first_ms": first_ms, "warmup_ms": warmup_ms, "steps": steps,
            "median_ms": statistics.median(step_ms), "min_ms": min(step_ms),
            "max_ms": max(step_ms)}


def traced_op_types(tf, run_step) -> list[str]:
    """Op types of the kernels one FULL_TRACE step ran, in order of first appearance."""
    tf1 = tf.compat.v1
    metadata = tf1.RunMetadata()
    run_step(options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE),
             run_metadata=metadata)
    op_types = []
    for device in metadata.step_stats.dev_stats:
        for node in device.node_stats:
            # timeline_label: "[cpu 32.0MB 32.0MB] name = OpType(inputs)"
            match = re.search(r"= ([\w.>]+)\(", node.timeline_label)
            if match and node.node_name not in ("_SOURCE", "_SINK") \
                    and match.group(1) not in op_types:
                op_types.append(match.group(1))
    return op_types


def result_error(sess, check) -> float | None:
    """Max relative error of the output variable against numpy's float64 exp(relu(abs(x)))."""
    if check is None:
        return None
    import numpy as np

    x, out = (value.astype(np.float64) for value in sess.run(check))
    expected = np.exp(np.maximum(np.abs(x), 0.0))
    return float(np.max(np.abs(out - expected) / np.maximum(np.abs(expected), 1.0)))


def check_mode(mode: str, op_types: list[str], error: float | None, dtype: str) -> bool:
    """Did the mode do what its label says, and compute the right values?"""
    values_ok = error is None or error <= TOLERANCE[dtype]  # None: not checked; NaN fails
    return values_ok and _ops_match(mode, op_types)


def _ops_match(mode: str, op_types: list[str]) -> bool:
    ran = set(op_types)
    return MODES[mode]["expect"] <= ran and not ran & MODES[mode]["forbid"]


def import_autofuse() -> str | None:
    """Import tf_autofuse (registers its optimizer). Returns an error text, or None."""
    try:
        import tf_autofuse
    except Exception as err:  # noqa: BLE001 - any failure is this cell's result
        return f"import tf_autofuse failed: {type(err).__name__}: {err}"
    if not tf_autofuse.is_available():
        return "tf_autofuse imported but its kernel library is not available"
    if not tf_autofuse.config().enable_autofuse:
        return "tf_autofuse imported but --enable_autofuse is not on"
    return None


def run_worker(mode: str, shape: list[int], dtype: str, steps: int | None, sink: str) -> dict:
    import warnings

    result = {"mode": mode, "shape": shape, "dtype": dtype, "pid": os.getpid()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import tensorflow as tf

        result["tensorflow"] = tf.__version__
        if mode == "autofuse":
            error = import_autofuse()
            if error:
                return {**result, "error": error}
        graph, init_ops, step_op, check = build_graph(tf, shape, dtype, sink)
        config = session_config(tf, MODES[mode]["grappler_off"])
        with tf.compat.v1.Session(graph=graph, config=config) as sess:
            sess.run(init_ops)
            run_step = sess.make_callable(step_op, accept_options=True)
            result.update(timed_steps(run_step, steps))
            result["op_types"] = traced_op_types(tf, run_step)
            result["max_rel_error"] = result_error(sess, check)
    result["verified"] = check_mode(mode, result["op_types"], result["max_rel_error"], dtype)
    result["warnings"] = sorted({str(w.message) for w in caught
                                 if "autofuse" in str(w.message).lower()})
    return result


def worker_main(args) -> int:
    (shape, dtype), = args.shapes
    try:
        result = run_worker(args.worker, shape, dtype, args.steps, args.sink)
    except Exception as err:  # noqa: BLE001 - reported as this cell's error
        result = {"mode": args.worker, "shape": shape, "dtype": dtype,
                  "error": f"{type(err).__name__}: {err}"}
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


# ----------------------------------------------------------------------------- parent

def machine_description() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        from importlib.metadata import version

        tf_version = version("tensorflow")
    except Exception:  # noqa: BLE001
        tf_version = "?"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"machine: nproc {usable} (of {os.cpu_count()}), CPU {cpu}, "
            f"Python {platform.python_version()}, TensorFlow {tf_version}, load average {load}")


def busy_note(loads: list[float]) -> str:
    """The 1-minute load averages seen before each cell, with a warning when other work
    competed for the cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    note = f"load average {min(loads):.2f} to {max(loads):.2f} on {cores} cores"
    if max(loads) > 0.75 * cores + 1:  # our own child keeps about one core busy
        note += " -- WARNING: the machine was busy, the times are not reliable"
    return note


def child_env(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in MODE_ENV_KEYS}
    env.update(MODES[mode]["env"])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # This tree's tf_autofuse, whichever directory the script is started from.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def crash_text(returncode: int, stderr: str) -> str:
    """Why a child gave no result: its signal or exit code and its last own stderr line."""
    import signal

    how = (f"killed by {signal.Signals(-returncode).name}" if returncode < 0
           else f"exit code {returncode}")
    # Skip TensorFlow's start-up log lines (I0000 ..., W0000 ..., "WARNING: All log ...").
    lines = [line.strip() for line in stderr.splitlines() if line.strip()
             and not re.match(r"[IWE]\d{4} |WARNING: All log messages", line.strip())]
    return f"{how}: {lines[-1]}" if lines else how


def run_cell(mode: str, shape: list[int], dtype: str, args) -> dict:
    """One fresh process measures one (mode, shape); returns its JSON result."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", mode,
               "--shapes", f"{'x'.join(map(str, shape))}:{dtype}", "--sink", args.sink]
    if args.steps is not None:
        command += ["--steps", str(args.steps)]
    failed = {"mode": mode, "shape": shape, "dtype": dtype}
    try:
        proc = subprocess.run(command, env=child_env(mode), capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT_S, cwd=REPO_ROOT)
    except subprocess.TimeoutExpired:
        return {**failed, "error": f"timed out after {CHILD_TIMEOUT_S} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    return {**failed, "error": crash_text(proc.returncode, proc.stderr)}


def summarize(results: list[dict]) -> dict:
    """Median over the rounds of one cell, or its error."""
    good = [r for r in results if "error" not in r]
    if not good:
        return {"error": results[-1]["error"]}
    medians = [r["median_ms"] for r in good]
    return {"median_ms": statistics.median(medians), "round_medians_ms": medians,
            "first_ms": statistics.median(r["first_ms"] for r in good),
            "steps": [r["steps"] for r in good],
            "op_types": good[-1]["op_types"], "verified": all(r["verified"] for r in good),
            "max_rel_error": worst_error([r["max_rel_error"] for r in good]),
            "warnings": sorted({w for r in good for w in r["warnings"]}),
            "errors": [r["error"] for r in results if "error" in r]}


def worst_error(errors: list) -> float | None:
    """The largest of the rounds' errors (NaN wins); None when the values were not checked."""
    if any(e is None for e in errors):
        return None
    return max(errors, key=lambda e: math.inf if math.isnan(e) else e)


def format_ms(ms: float) -> str:
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}"


def cell_text(cell: dict, key: str = "median_ms") -> str:
    if "error" in cell:
        return "error"
    text = format_ms(cell[key])
    rounds = cell["round_medians_ms"]
    if key == "median_ms" and len(rounds) > 1:
        spread = (max(rounds) - min(rounds)) / 2 / cell["median_ms"] * 100
        text += f" ±{spread:.0f}%"
    return text + ("" if cell["verified"] else " *")


def speedup_text(row: dict) -> str:
    """autofuse's ratio vs the fastest other mode: 1.08x means autofuse is 8% faster."""
    fuse = row.get("autofuse")
    others = {m: c["median_ms"] for m, c in row.items() if m != "autofuse" and "error" not in c}
    if fuse is None or not others:
        return "-"
    if "error" in fuse:
        return "error"
    best = min(others, key=others.get)
    return f"{others[best] / fuse['median_ms']:.2f}x vs {best}"


def print_table(title: str, rows: dict, modes: list[str], key: str, with_ratio: bool) -> None:
    header = ["shape / dtype"] + modes + (["autofuse vs best"] if with_ratio else [])
    lines = [[label] + [cell_text(rows[label][m], key) for m in modes]
             + ([speedup_text(rows[label])] if with_ratio else []) for label in rows]
    widths = [max(len(line[i]) for line in [header] + lines) for i in range(len(header))]
    print(title)
    for line in [header] + lines:
        print("  " + "  ".join(text.ljust(w) if i == 0 else text.rjust(w)
                               for i, (text, w) in enumerate(zip(line, widths))))


def print_checks(rows: dict, modes: list[str]) -> None:
    print("what ran (one FULL_TRACE step per cell; compute ops, without variable reads/writes),")
    print("and the result's max relative error vs numpy float64 (per shape, worst round):")
    for mode in modes:
        seen: dict[str, list[str]] = {}  # op list text -> shape labels
        values, round_errors = [], []
        verdict = "ok"
        for label, row in rows.items():
            cell = row[mode]
            round_errors += [f"{label}: {e}" for e in cell.get("errors", [])]
            if "error" in cell:
                seen.setdefault("error -- " + cell["error"], []).append(label)
                verdict = "error"
                continue
            ops = [op for op in cell["op_types"] if op not in BOOKKEEPING_OPS]
            seen.setdefault(", ".join(ops) or "(none)", []).append(label)
            error = cell["max_rel_error"]
            values.append(f"{label} {'not checked' if error is None else f'{error:.1e}'}")
            if not cell["verified"] and verdict == "ok":
                verdict = "MISMATCH"
        expect = ", ".join(sorted(MODES[mode]["expect"]))
        print(f"  {mode:<11} {verdict:<8} (expects {expect})")
        for ops, labels in seen.items():
            where = "" if len(seen) == 1 else f"   [{'; '.join(labels)}]"
            print(f"  {'':<11} {'' if ops.startswith('error') else 'ran: '}{ops}{where}")
        if values:
            print(f"  {'':<11} error: {', '.join(values)}")
        for text in round_errors:
            print(f"  {'':<11} a round failed (left out of the median): {text}")
        for warning in sorted({w for row in rows.values() for w in row[mode].get("warnings", [])}):
            print(f"  {'':<11} warning: {warning}")
    failed = [m for m in modes for row in rows.values() if not row[m].get("verified", True)]
    if failed:
        print("  * = the cell's check failed: other kernels ran than its label claims, "
              "or the result is wrong.")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args)

    command = shlex.join([Path(sys.executable).name, *sys.argv])
    print(f"$ {command}")
    print(machine_description())
    print(f"abs -> relu -> exp, sink {args.sink}, {args.rounds} round(s), steps per cell "
          f"{args.steps or f'~{TARGET_SECONDS:g} s worth (>= {MIN_STEPS})'}, "
          f"each cell in a fresh process", flush=True)

    results: dict[tuple[str, str], list[dict]] = {}
    loads = []
    started = time.monotonic()
    for round_index in range(args.rounds):
        for shape, dtype in args.shapes:
            for mode in args.modes:
                loads.append(os.getloadavg()[0])
                result = run_cell(mode, shape, dtype, args)
                result["round"] = round_index + 1
                results.setdefault((shape_label(shape, dtype), mode), []).append(result)
                status = result.get("error") or f"{format_ms(result['median_ms'])} ms"
                print(f"  round {round_index + 1}  {shape_label(shape, dtype):<22} "
                      f"{mode:<11} {status}", file=sys.stderr, flush=True)

    rows = {shape_label(shape, dtype): {mode: summarize(results[(shape_label(shape, dtype), mode)])
                                        for mode in args.modes}
            for shape, dtype in args.shapes}
    print()
    print_table("median step time, ms (±: half the spread of the round medians):",
                rows, args.modes, "median_ms", with_ratio="autofuse" in args.modes)
    print()
    print_table("first step, ms (graph rewriting, XLA compilation; median over rounds):",
                rows, args.modes, "first_ms", with_ratio=False)
    print()
    print_checks(rows, args.modes)
    loads.append(os.getloadavg()[0])
    print(f"\ntotal {time.monotonic() - started:.0f} s, {busy_note(loads)}")

    if args.json:
        Path(args.json).write_text(json.dumps(
            {"command": command, "machine": machine_description(), "sink": args.sink,
             "rounds": args.rounds, "load_averages": loads, "summary": rows,
             "cells": [r for cell in results.values() for r in cell]}, indent=1) + "\n")
        print(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
