"""The suite's machinery: one fresh process per cell, interleaved rounds, medians, checks.

A cell is one (round, workload, mode). The parent (`run_suite`) starts a Python process per
cell (`run.py --worker MODE --workloads NAME`) with the mode's environment set before
TensorFlow is imported; the child prints one `BENCH_RESULT {json}` line per workload. Modes:

  unfused     Grappler's arithmetic optimizer and remapper OFF: every op its own kernel
  tf-default  the default configuration (Grappler may compose unary chains, fuse conv+bias...)
  xla         TF_XLA_FLAGS="--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit" with the arithmetic
              optimizer and remapper off (else Grappler composes chains into
              _UnaryOpsComposition first, which XLA cannot compile), and
              tf.config.optimizer.set_jit("autoclustering") for the tf.function workloads
  autofuse    AUTOFUSE_FLAGS="--enable_autofuse=true;--autofuse_enable_pass=reduce" (or
              "--enable_autofuse=true" when this tf_autofuse does not know the reduce-pass
              key; the run says so) and `import tf_autofuse` before the graph is built
  copy        (micro workloads; no TensorFlow) the memory-bandwidth bound: numpy.copyto of the
              workload's input bytes into a preallocated buffer, split over all usable cores
              in threads (numpy releases the GIL while copying), best of that and 1 thread

Per cell: the first step (graph rewriting; XLA compiles on the first or a later step, so the
slowest warm-up step is kept too), warm-up steps, then N timed steps (about --seconds worth,
at least 10); the cell's time is the median step. One traced step lists what ran: for the
Session (micro) workloads the kernels in the step stats, for tf.function (model) workloads
the executed graph after optimization (XLA's cluster bodies are not in it: a cluster is its
_XlaCompile and _XlaRun). The executed compute-kernel count leaves out BOOKKEEPING_OPS.

Across rounds: the table shows the median of the rounds' medians and ± half their spread.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import workloads as wl

REPO_ROOT = Path(__file__).resolve().parents[1]
RUN_PY = Path(__file__).resolve().with_name("run.py")
RESULT_PREFIX = "BENCH_RESULT "
CHILD_TIMEOUT_S = 1800  # the first `import tf_autofuse` may build its C++ library
WARMUP_STEPS = 3
MIN_STEPS = 10
QUICK_STEPS = 3
QUICK_WARMUP = 1

# Nodes that move or name data but compute nothing; left out of the executed kernel count
# (tf_autofuse.profiling.BOOKKEEPING_OPS plus variable handles and writes; Switch and Merge
# are the plumbing of XLA's lazily compiled clusters).
BOOKKEEPING_OPS = frozenset({"_Arg", "_Retval", "Const", "NoOp", "ReadVariableOp", "Identity",
                             "VarHandleOp", "AssignVariableOp", "Switch", "Merge", "_SOURCE",
                             "_SINK", "_Recv", "_Send", "_DeviceArg", "_DeviceRetval"})
AUTOFUSE_OPS = frozenset({"AutofuseKernel", "AutofuseAssignKernel"})
XLA_OPS = frozenset({"_XlaCompile", "_XlaRun"})


def grappler_fused(op: str) -> bool:
    """Op types Grappler's arithmetic optimizer and remapper create."""
    return op == "_UnaryOpsComposition" or (op.startswith("_") and "Fused" in op)


def fused_kind(op: str) -> str | None:
    if op in AUTOFUSE_OPS:
        return "autofuse"
    if op in XLA_OPS:
        return "xla"
    if grappler_fused(op):
        return "grappler"
    return None


AUTOFUSE_FLAGS_WANTED = "--enable_autofuse=true;--autofuse_enable_pass=reduce"
AUTOFUSE_FLAGS_FALLBACK = "--enable_autofuse=true"
XLA_FLAGS = "--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit"


@dataclasses.dataclass(frozen=True)
class Mode:
    name: str
    env: dict
    grappler_off: bool
    forbid: frozenset          # fused-kernel kinds that must not run in this mode
    needs: str | None = None   # the kind this mode exists for ("not fused" when absent)
    help: str = ""


MODES = {
    "unfused": Mode("unfused", {}, True, frozenset({"autofuse", "xla", "grappler"}),
                    help="TF, arithmetic optimizer and remapper off"),
    "tf-default": Mode("tf-default", {}, False, frozenset({"autofuse", "xla"}),
                       help="TF default configuration"),
    "xla": Mode("xla", {"TF_XLA_FLAGS": XLA_FLAGS}, True,
                frozenset({"autofuse", "grappler"}), "xla",
                help="XLA auto-jit (arithmetic optimizer and remapper off)"),
    "autofuse": Mode("autofuse", {"AUTOFUSE_FLAGS": AUTOFUSE_FLAGS_WANTED}, False,
                     frozenset({"xla"}), "autofuse", help="tf_autofuse"),
}
COPY = "copy"
MODE_ENV_KEYS = {"TF_XLA_FLAGS", "AUTOFUSE_FLAGS", "AUTOFUSE_DFX_FLAGS"}


# ============================================================================ child side

def _time_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def timed_steps(run_step, opts) -> dict:
    """First step, warm-up steps, then the timed steps (median, min, max, quartiles)."""
    first_ms = _time_ms(run_step)
    warmup_ms = [_time_ms(run_step) for _ in range(QUICK_WARMUP if opts.quick else WARMUP_STEPS)]
    steps = opts.steps
    if steps is None:
        if opts.quick:
            steps = QUICK_STEPS
        else:
            estimate_s = max(statistics.median(warmup_ms) / 1e3, 1e-6)
            steps = max(MIN_STEPS, math.ceil(opts.seconds / estimate_s))
    step_ms = sorted(_time_ms(run_step) for _ in range(steps))
    quartiles = statistics.quantiles(step_ms, n=4) if len(step_ms) > 1 else step_ms * 3
    return {"first_ms": first_ms, "warmup_ms": warmup_ms, "steps": steps,
            "median_ms": statistics.median(step_ms), "min_ms": step_ms[0],
            "max_ms": step_ms[-1], "q1_ms": quartiles[0], "q3_ms": quartiles[2]}


def _kernel_report(op_by_node: dict[str, str], source: str) -> dict:
    """Counts of what ran: {node name: op type} of the executed nodes."""
    from collections import Counter

    compute = {n: op for n, op in op_by_node.items() if op not in BOOKKEEPING_OPS}
    by_type = Counter(compute.values())
    return {"kernel_source": source, "kernels": len(compute),
            "kernels_by_type": dict(by_type.most_common()),
            "op_types": sorted(by_type),
            "fused": sorted(n.split("/", 1)[-1] if source.startswith("executed tf.function")
                            else n for n, op in compute.items() if op in AUTOFUSE_OPS),
            "fused_by_kind": dict(Counter(k for op in compute.values()
                                          if (k := fused_kind(op))))}


def _session_config(tf, grappler_off: bool):
    config = tf.compat.v1.ConfigProto()
    if grappler_off:
        from tensorflow.core.protobuf import rewriter_config_pb2

        rewrite = config.graph_options.rewrite_options
        rewrite.arithmetic_optimization = rewriter_config_pb2.RewriterConfig.OFF
        rewrite.remapping = rewriter_config_pb2.RewriterConfig.OFF
    return config


def _relative_error(np, out, ref) -> float:
    """max |out - ref| / (|ref| + 1e-3 max|ref|); NaN when out has NaNs the reference lacks."""
    out = out.astype(np.float64)
    if out.shape != ref.shape:
        return math.nan
    scale = 1e-3 * float(np.max(np.abs(ref))) if ref.size else 1.0
    err = np.abs(out - ref) / (np.abs(ref) + max(scale, 1e-30))
    return float(np.max(err)) if err.size else 0.0


def run_micro(tf, mode: Mode, workload: wl.Micro, opts) -> dict:
    """A TF1 graph in a Session: inputs in variables, the result assigned to a variable."""
    import numpy as np

    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        variables = []
        for index, spec in enumerate(workload.inputs):
            data = tf1.random_uniform(spec.shape, spec.low, spec.high, dtype=tf.float32,
                                      seed=index + 1)
            variables.append(tf1.Variable(tf.cast(data, spec.dtype), use_resource=True,
                                          name=spec.name))
        y = workload.fn(tf, *[v.read_value() for v in variables])
        out = tf1.Variable(tf.zeros(y.shape, y.dtype), use_resource=True, name="out")
        step_op = out.assign(y, read_value=False) if opts.sink == "assign" else y.op
        check = ([v.read_value() for v in variables], out.read_value())
        init_ops = [v.initializer for v in variables] + [out.initializer]
    result = {}
    with tf1.Session(graph=graph, config=_session_config(tf, mode.grappler_off)) as sess:
        sess.run(init_ops)
        run_step = sess.make_callable(step_op, accept_options=True)
        result.update(timed_steps(run_step, opts))
        metadata = tf1.RunMetadata()
        run_step(options=tf1.RunOptions(trace_level=tf1.RunOptions.SOFTWARE_TRACE),
                 run_metadata=metadata)
        ops = {}
        for device in metadata.step_stats.dev_stats:
            for node in device.node_stats:
                match = re.search(r"= ([\w.>]+)\(", node.timeline_label)
                if match:
                    ops[node.node_name] = match.group(1)
        result.update(_kernel_report(ops, "step stats of one traced Session step"))
        if opts.sink == "assign":
            inputs, output = sess.run(check)
            expected = workload.reference(np, *(a.astype(np.float64) for a in inputs))
            error = _relative_error(np, output, expected)
            result["max_error"] = error
            result["tolerance"] = wl.TOLERANCE[str(output.dtype)]
            result["values_ok"] = bool(error <= result["tolerance"])  # NaN fails
            result["check"] = "vs numpy float64 reference"
        else:
            result.update(max_error=None, values_ok=None, check="not checked (--sink target)")
    return result


def run_model(tf, mode: Mode, workload: wl.Model, opts) -> dict:
    """A Keras model through tf.function: input in a tf.Variable, output assigned to one."""
    import numpy as np
    from tensorflow.python.eager import context

    model = wl.build_model(workload)
    shape = (workload.batch, *wl.model_input_shape(workload.model, workload.quick))
    x = tf.Variable(np.random.default_rng(1).uniform(0, 1, shape).astype(np.float32), name="x")
    out_shape = (workload.batch, *tuple(model.outputs[0].shape)[1:])
    out = tf.Variable(tf.zeros(out_shape, tf.float32), name="out")

    def step():
        out.assign(model(x, training=False))

    result = timed_steps(tf.function(step), opts)
    # A second instantiation of the same step, run with run metadata on, gives the graph
    # TensorFlow executed after optimization (the timed one is already instantiated).
    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        ctx.export_run_metadata()  # drop what earlier workloads of this process left behind
        tf.function(step)()
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    ops = {f"{i}/{n.name}": n.op for i, g in enumerate(metadata.function_graphs)
           for n in g.post_optimization_graph.node}
    result.update(_kernel_report(ops, "executed tf.function graph after optimization"))
    if opts.out_dir:
        path = Path(opts.out_dir) / f"r{opts.round}_{mode.name}_{workload.name}.npy"
        np.save(path, out.numpy())
        result["output_file"] = str(path)
        result["check"] = "vs the reference mode's output (checked by the parent)"
    return result


def run_copy(workload, opts) -> dict:
    """The memory-bandwidth bound: copy the workload's input bytes once, all cores."""
    import threading

    import numpy as np

    nbytes = workload.input_bytes
    src = np.empty(nbytes, np.uint8)
    src.fill(1)
    # The destination starts half a page after the source modulo 4096: with both at nearly the
    # same page offset, memcpy's loads alias its stores (a 48 KiB copy took 10x longer).
    raw = np.empty(nbytes + 8192, np.uint8)
    offset = (src.ctypes.data + 2048 - raw.ctypes.data) % 4096
    dst = raw[offset:offset + nbytes]
    dst.fill(0)  # touch the pages: no page faults in the timed copies
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    bounds = [nbytes * i // cores for i in range(cores + 1)]
    start_gate, done_gate = threading.Barrier(cores + 1), threading.Barrier(cores + 1)
    stop = []

    def worker(i):
        while True:
            start_gate.wait()
            if stop:
                return
            np.copyto(dst[bounds[i]:bounds[i + 1]], src[bounds[i]:bounds[i + 1]])
            done_gate.wait()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(cores)]
    for thread in threads:
        thread.start()

    def copy_threads():
        start_gate.wait()
        done_gate.wait()

    def copy_one():
        np.copyto(dst, src)

    try:
        threaded = timed_steps(copy_threads, opts)
        single = timed_steps(copy_one, opts)
    finally:
        stop.append(True)
        start_gate.wait()
    best = threaded if threaded["median_ms"] <= single["median_ms"] else single
    ok = bool(np.array_equal(src[:: max(1, nbytes // 4096)], dst[:: max(1, nbytes // 4096)]))
    return {**best, "copy_bytes": nbytes, "threads": cores if best is threaded else 1,
            "threaded_median_ms": threaded["median_ms"], "single_median_ms": single["median_ms"],
            "gb_per_s": nbytes / (best["median_ms"] / 1e3) / 1e9,
            "values_ok": ok, "max_error": None, "kernels": None, "fused": [],
            "check": "numpy.copyto, destination compared with the source"}


def _import_autofuse() -> str | None:
    try:
        import tf_autofuse
    except Exception as err:  # noqa: BLE001 - any failure is this cell's result
        return f"import tf_autofuse failed: {type(err).__name__}: {err}"
    if not tf_autofuse.is_available():
        return "tf_autofuse imported but its kernel library is not available"
    if not tf_autofuse.config().enable_autofuse:
        return "tf_autofuse imported but --enable_autofuse is not on"
    return None


def worker_main(mode_name: str, names: list[str], opts) -> int:
    """Run `names` one after another in this process under one mode; print a result line each."""
    import warnings

    def emit(result):
        print(RESULT_PREFIX + json.dumps(result), flush=True)

    base = {"mode": mode_name, "pid": os.getpid(), "round": opts.round,
            "autofuse_flags": os.environ.get("AUTOFUSE_FLAGS")}
    if mode_name == COPY:
        for name in names:
            try:
                emit({**base, "workload": name, **run_copy(wl.get(name, opts.quick), opts)})
            except Exception as err:  # noqa: BLE001
                emit({**base, "workload": name, "error": f"{type(err).__name__}: {err}"})
        return 0
    mode = MODES[mode_name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import tensorflow as tf

        base["tensorflow"] = tf.__version__
        setup_error = _import_autofuse() if mode_name == "autofuse" else None
        if mode.grappler_off:
            tf.config.optimizer.set_experimental_options(
                {"arithmetic_optimization": False, "remapping": False})
        if mode_name == "xla":
            tf.config.optimizer.set_jit("autoclustering")
        for name in names:
            if setup_error:
                emit({**base, "workload": name, "error": setup_error})
                continue
            workload = wl.get(name, opts.quick)
            try:
                runner = run_micro if workload.kind == "micro" else run_model
                result = {**base, "workload": name, **runner(tf, mode, workload, opts)}
            except Exception as err:  # noqa: BLE001 - reported as this cell's error
                result = {**base, "workload": name, "error": f"{type(err).__name__}: {err}"}
            result["warnings"] = sorted({str(w.message) for w in caught
                                         if "autofuse" in str(w.message).lower()})
            emit(result)
    return 0


# ============================================================================ parent side

def resolve_autofuse_flags(wanted: str = AUTOFUSE_FLAGS_WANTED) -> tuple[str, str | None]:
    """The AUTOFUSE_FLAGS the autofuse mode uses, and a note when it had to fall back.

    tf_autofuse's flag parser rejects unknown keys, so `--autofuse_enable_pass=reduce` fails on
    a tf_autofuse without the reduce pass; then the mode runs with `--enable_autofuse=true`.
    The check parses the text with tf_autofuse/flags.py (standalone, no TensorFlow import), or
    by importing tf_autofuse in a child process if that module cannot be loaded on its own.
    """
    def fallback(reason):
        return AUTOFUSE_FLAGS_FALLBACK, (f"AUTOFUSE_FLAGS={wanted!r} is rejected by this "
                                         f"tf_autofuse ({reason}); the autofuse mode runs with "
                                         f"{AUTOFUSE_FLAGS_FALLBACK!r} (no reduce pass)")

    try:
        spec = importlib.util.spec_from_file_location(
            "_bench_autofuse_flags", REPO_ROOT / "tf_autofuse" / "flags.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        try:
            spec.loader.exec_module(module)
        finally:
            sys.modules.pop(spec.name, None)
    except Exception:  # noqa: BLE001 - flags.py needs its package: ask a real import
        module = None
    if module is not None:
        try:
            module.parse_items(wanted, "AUTOFUSE_FLAGS")
            return wanted, None
        except module.FlagError as err:
            return fallback(str(err)) if wanted != AUTOFUSE_FLAGS_FALLBACK else (wanted, str(err))
    env = child_env("tf-default", REPO_ROOT)
    env["AUTOFUSE_FLAGS"] = wanted
    proc = subprocess.run([sys.executable, "-c", "import tf_autofuse"], env=env,
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=CHILD_TIMEOUT_S)
    if proc.returncode == 0:
        return wanted, None
    return fallback(crash_text(proc.returncode, proc.stderr))


def child_env(mode: str, root: Path = REPO_ROOT, autofuse_flags: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in MODE_ENV_KEYS}
    if mode in MODES:
        env.update(MODES[mode].env)
    if mode == "autofuse" and autofuse_flags:
        env["AUTOFUSE_FLAGS"] = autofuse_flags
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    return env


def crash_text(returncode: int, stderr: str) -> str:
    how = (f"killed by {signal.Signals(-returncode).name}" if returncode < 0
           else f"exit code {returncode}")
    lines = [line.strip() for line in stderr.splitlines() if line.strip()
             and not re.match(r"[IWE]\d{4} |WARNING: All log messages|To enable the following",
                              line.strip())]
    return f"{how}: {lines[-1]}" if lines else how


def run_process(mode: str, names: list[str], round_index: int, opts, out_dir: str,
                autofuse_flags: str) -> list[dict]:
    """One fresh process runs `names` under `mode`; returns one result per name."""
    command = [sys.executable, str(RUN_PY), "--worker", mode, "--workloads", ",".join(names),
               "--round", str(round_index), "--out-dir", out_dir, "--sink", opts.sink,
               "--seconds", str(opts.seconds)]
    if opts.quick:
        command.append("--quick")
    if opts.steps is not None:
        command += ["--steps", str(opts.steps)]
    env = child_env(mode, REPO_ROOT, autofuse_flags)
    dfx = []  # the autofuse mode's AUTOFUSE_DFX_FLAGS items
    if mode == "autofuse" and getattr(opts, "autofuse_dfx_flags", None):
        dfx.append(opts.autofuse_dfx_flags)
    if mode == "autofuse" and getattr(opts, "kernel_profile", None):
        os.makedirs(opts.kernel_profile, exist_ok=True)
        label = names[0] if len(names) == 1 else f"{names[0]}-and-{len(names) - 1}-more"
        path = os.path.join(os.path.abspath(opts.kernel_profile), f"{label}.r{round_index}.csv")
        dfx.append(f"--kernel_profile={path}")
    if dfx:
        env["AUTOFUSE_DFX_FLAGS"] = ";".join(dfx)
    started = time.monotonic()
    try:
        proc = subprocess.run(command, env=env,
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                              cwd=REPO_ROOT)
        stdout, failure = proc.stdout, crash_text(proc.returncode, proc.stderr)
    except subprocess.TimeoutExpired as err:
        stdout = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        failure = f"timed out after {CHILD_TIMEOUT_S} s"
    got = {}
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX):])
            got[result["workload"]] = result
    wall = time.monotonic() - started
    results = []
    for name in names:
        result = got.get(name) or {"mode": mode, "workload": name, "round": round_index,
                                   "error": failure}
        result["process_wall_s"] = wall
        results.append(result)
    return results


def plan(opts, names: list[str]) -> list[tuple[int, str, list[str]]]:
    """(round, mode, workloads) per process, in run order. Each round rotates the mode order
    by one so that no mode always runs first; the copy bound runs with its workload."""
    micro = {n for n in names if wl.get(n, opts.quick).kind == "micro"}
    processes = []
    for round_index in range(1, opts.rounds + 1):
        shift = (round_index - 1) % len(opts.modes)
        modes = opts.modes[shift:] + opts.modes[:shift]
        if opts.share_process:
            for mode in ([COPY] if opts.copy_bound and micro else []) + modes:
                chosen = [n for n in names if mode != COPY or n in micro]
                processes.append((round_index, mode, chosen))
            continue
        for name in names:
            for mode in ([COPY] if opts.copy_bound and name in micro else []) + modes:
                processes.append((round_index, mode, [name]))
    return processes


def check_model_outputs(cells: list[dict], modes: list[str]) -> str | None:
    """Compare every model cell's saved output with the reference mode's, same round."""
    import numpy as np

    reference = next((m for m in ("unfused", "tf-default") if m in modes), None)
    by_key = {(c["round"], c["workload"], c["mode"]): c for c in cells}
    for cell in cells:
        if "output_file" not in cell or "error" in cell:
            continue
        if reference is None:
            cell.update(max_error=None, values_ok=None,
                        check="not checked: needs the unfused or tf-default mode as reference")
            continue
        ref = by_key.get((cell["round"], cell["workload"], reference))
        if not ref or "output_file" not in ref or "error" in ref:
            cell.update(max_error=None, values_ok=None,
                        check=f"not checked: no {reference} output in round {cell['round']}")
            continue
        out, expected = np.load(cell["output_file"]), np.load(ref["output_file"])
        scale = float(np.max(np.abs(expected))) or 1.0
        error = (float(np.max(np.abs(out.astype(np.float64) - expected))) / scale
                 if out.shape == expected.shape else math.nan)
        cell.update(max_error=error, tolerance=wl.MODEL_TOLERANCE,
                    values_ok=bool(error <= wl.MODEL_TOLERANCE),
                    check=f"max |out - {reference}| / max |{reference}|")
    return reference


def verdict(cell: dict) -> str:
    """ok; 'not fused' / 'not clustered' (autofuse or XLA ran without its kernels: honest, but
    nothing was fused); WRONG VALUES; WRONG KERNELS (a kernel of another mode ran); error."""
    if "error" in cell:
        return "error"
    if cell.get("values_ok") is False:
        return "WRONG VALUES"
    if cell["mode"] == COPY:
        return "ok"
    mode = MODES[cell["mode"]]
    kinds = set(cell.get("fused_by_kind", {}))
    wrong = kinds & mode.forbid
    if wrong:
        return "WRONG KERNELS (" + ", ".join(sorted(wrong)) + ")"
    if mode.needs and mode.needs not in kinds:
        return "not clustered" if mode.needs == "xla" else "not fused"
    return "ok"


VERIFIED = ("ok", "not fused", "not clustered")


def summarize(results: list[dict]) -> dict:
    """One (workload, mode) over its rounds."""
    for result in results:
        result["verdict"] = verdict(result)
    good = [r for r in results if "error" not in r]
    if not good:
        return {"error": results[-1]["error"], "verdict": "error",
                "errors": [r["error"] for r in results]}
    medians = [r["median_ms"] for r in good]
    median = statistics.median(medians)
    errors = [r.get("max_error") for r in good]
    last = good[-1]
    verdicts = [r["verdict"] for r in good]
    worst = next((v for v in verdicts if v not in VERIFIED), verdicts[-1])
    return {
        "median_ms": median, "round_medians_ms": medians,
        "spread_pct": (max(medians) - min(medians)) / 2 / median * 100 if median else 0.0,
        "first_ms": statistics.median(r["first_ms"] for r in good),
        "warmup_max_ms": statistics.median(max(r["warmup_ms"] or [0]) for r in good),
        "steps": [r["steps"] for r in good],
        "kernels": last.get("kernels"), "kernels_by_type": last.get("kernels_by_type"),
        "fused": last.get("fused", []), "fused_by_kind": last.get("fused_by_kind", {}),
        "kernel_source": last.get("kernel_source"),
        "max_error": None if any(e is None for e in errors)
        else max(errors, key=lambda e: math.inf if math.isnan(e) else e),
        "values_ok": None if any(r.get("values_ok") is None for r in good)
        else all(r["values_ok"] for r in good),
        "check": last.get("check"), "verdict": worst,
        "verified": worst in VERIFIED,
        "warnings": sorted({w for r in good for w in r.get("warnings", [])}),
        "errors": [r["error"] for r in results if "error" in r],
        **({"copy_bytes": last["copy_bytes"], "threads": last["threads"],
            "gb_per_s": last["gb_per_s"]} if "copy_bytes" in last else {}),
    }


# ----------------------------------------------------------------------------- output

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
    return (f"nproc {usable} (of {os.cpu_count()}), {cpu}, Python "
            f"{platform.python_version()}, TensorFlow {tf_version}")


def format_ms(ms: float) -> str:
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.1f}"


def _table(title: str, header: list[str], lines: list[list[str]]) -> str:
    widths = [max(len(line[i]) for line in [header] + lines) for i in range(len(header))]
    out = [title]
    for line in [header] + lines:
        out.append("  " + "  ".join(t.ljust(w) if i == 0 else t.rjust(w)
                                    for i, (t, w) in enumerate(zip(line, widths))))
    return "\n".join(out)


def _mark(cell: dict) -> str:
    return "" if cell.get("verified") else " *"


def time_cell(cell: dict | None) -> str:
    if not cell:
        return "-"
    if "error" in cell:
        return "error"
    text = format_ms(cell["median_ms"])
    if len(cell["round_medians_ms"]) > 1:
        text += f" ±{cell['spread_pct']:.0f}%"
    return text + _mark(cell)


def versus_best(row: dict, modes: list[str]) -> str:
    """autofuse against the fastest other mode: '1.20x vs xla' = autofuse takes 1/1.2 the time."""
    fuse = row.get("autofuse")
    others = {m: row[m]["median_ms"] for m in modes
              if m != "autofuse" and "median_ms" in row.get(m, {})}
    if not fuse or not others:
        return "-"
    if "median_ms" not in fuse:
        return "error"
    best = min(others, key=others.get)
    text = f"{others[best] / fuse['median_ms']:.2f}x vs {best}"
    return text + (f" ({fuse['verdict']})" if fuse.get("verdict") not in (None, "ok") else "")


def render(data: dict) -> str:
    """All the tables and the verification lines of a suite run (its JSON data)."""
    modes, summary, info = data["modes"], data["summary"], data["workloads"]
    names = list(summary)
    micro = [n for n in names if info[n]["kind"] == "micro"]
    with_copy = data["options"]["copy_bound"] and micro
    parts = []

    header = ["workload"] + modes + (["copy bound"] if with_copy else [])
    if "autofuse" in modes and len(modes) > 1:
        header += ["autofuse vs best other"]
    if with_copy and "autofuse" in modes:
        header += ["autofuse / copy"]
    lines = []
    for name in names:
        row = summary[name]
        line = [name] + [time_cell(row.get(m)) for m in modes]
        if with_copy:
            line.append(time_cell(row.get(COPY)) if name in micro else "")
        if "autofuse" in modes and len(modes) > 1:
            line.append(versus_best(row, modes))
        if with_copy and "autofuse" in modes:
            copy, fuse = row.get(COPY, {}), row.get("autofuse", {})
            line.append(f"{fuse['median_ms'] / copy['median_ms']:.2f}x"
                        if "median_ms" in copy and "median_ms" in fuse else "")
        lines.append(line)
    parts.append(_table("median step time, ms (± half the spread of the round medians; "
                        "* = the cell's check failed, see below):", header, lines))

    if with_copy:
        lines = []
        for name in micro:
            row, copy = summary[name], summary[name].get(COPY, {})
            line = [name]
            for mode in modes:
                cell = row.get(mode, {})
                line.append(f"{cell['median_ms'] / copy['median_ms']:.2f}x"
                            if "median_ms" in cell and "median_ms" in copy else "-")
            line += [format_ms(copy["median_ms"]) if "median_ms" in copy else "-",
                     f"{copy['copy_bytes'] / 2**20:.1f} MiB @ {copy['gb_per_s']:.1f} GB/s, "
                     f"{copy['threads']} thread(s)" if "median_ms" in copy else ""]
            lines.append(line)
        parts.append(_table(
            "step time / copy bound (the time numpy.copyto takes to copy the workload's input "
            "bytes once, all cores, measured in the same run; 1.00x = memory-bound optimum):",
            ["workload"] + modes + ["copy ms", "copied"], lines))

    lines = []
    delta = "autofuse" in modes and "tf-default" in modes
    for name in names:
        line = [name]
        for mode in modes:
            cell = summary[name].get(mode)
            line.append("-" if not cell else "error" if "error" in cell else
                        f"{format_ms(cell['first_ms'])} ({format_ms(cell['warmup_max_ms'])})")
        if delta:
            fuse, default = summary[name].get("autofuse", {}), summary[name].get("tf-default", {})
            line.append(f"{fuse['first_ms'] - default['first_ms']:+.1f}"
                        if "first_ms" in fuse and "first_ms" in default else "-")
        lines.append(line)
    parts.append(_table("first step, ms (graph rewriting, XLA compilation, tf.function tracing; "
                        "in brackets the slowest warm-up step, where XLA's lazy compilation "
                        "may land instead):", ["workload"] + modes
                        + (["autofuse - tf-default"] if delta else []), lines))

    lines = []
    for name in names:
        line = [name]
        for mode in modes:
            cell = summary[name].get(mode)
            if not cell or "error" in cell or cell.get("kernels") is None:
                line.append("-" if not cell or "error" not in cell else "error")
                continue
            kinds = cell.get("fused_by_kind", {})
            fused = ", ".join(f"{v} {k}" for k, v in sorted(kinds.items()))
            line.append(f"{cell['kernels']}" + (f" ({fused})" if fused else ""))
        lines.append(line)
    parts.append(_table("executed compute kernels per step (nodes other than "
                        "_Arg/_Retval/Const/NoOp/Identity/variable ops; in brackets the fused "
                        "kernels among them: autofuse = AutofuseKernel, xla = _XlaCompile + "
                        "_XlaRun, grappler = _UnaryOpsComposition/_Fused*):",
                        ["workload"] + modes, lines))

    parts.append(render_checks(data))
    return "\n\n".join(parts)


def render_checks(data: dict) -> str:
    modes, summary, info = data["modes"], data["summary"], data["workloads"]
    out = ["verification (per workload and mode: verdict, values, what ran):"]
    for name, row in summary.items():
        out.append(f"  {name}: {info[name]['title']}"
                   + (f"  [{info[name]['note']}]" if info[name].get("note") else ""))
        for mode in ([COPY] if COPY in row else []) + modes:
            cell = row.get(mode)
            if not cell:
                continue
            if "error" in cell:
                out.append(f"    {mode:<10} error: {cell['error']}")
                continue
            error = cell.get("max_error")
            values = ("values not checked" if error is None and cell.get("verified")
                      else f"error {error:.1e} ({cell.get('check')})" if error is not None
                      else cell.get("check") or "values not checked")
            if mode == COPY:
                out.append(f"    {mode:<10} {cell['verdict']:<13} {cell.get('check')}")
                continue
            ops = cell.get("kernels_by_type") or {}
            if len(ops) <= 8:
                ran = ", ".join(f"{op}" + (f" x{n}" if n > 1 else "") for op, n in ops.items())
            else:
                ran = (", ".join(f"{op} x{n}" for op, n in list(ops.items())[:8])
                       + f", ... ({len(ops)} op types)")
            out.append(f"    {mode:<10} {cell['verdict']:<13} {values}")
            out.append(f"    {'':<10} ran: {ran or '(nothing)'}")
            if cell.get("fused"):
                shown = cell["fused"][:4]
                more = f", ... ({len(cell['fused'])} in all)" if len(cell["fused"]) > 4 else ""
                out.append(f"    {'':<10} fused: {', '.join(shown)}{more}")
            for text in cell.get("errors", []):
                out.append(f"    {'':<10} a round failed (left out of the median): {text}")
            for warning in cell.get("warnings", []):
                out.append(f"    {'':<10} warning: {warning}")
    return "\n".join(out)


def provenance() -> dict:
    """The command and machine of this run, for a JSON that report.py renders."""
    return {"command": shlex.join([Path(sys.executable).name, *sys.argv]),
            "machine": machine_description(), "load_average": os.getloadavg()[0]}


def busy_note(loads: list[float]) -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    note = f"load average {min(loads):.2f} to {max(loads):.2f} on {cores} cores"
    if max(loads) > 0.75 * cores + 1:  # our own child keeps about one core busy
        note += " -- WARNING: the machine was busy, the times are not reliable"
    return note


def plot(data: dict, path: str) -> str:
    """A bar chart of each mode's speed-up over TF default; needs matplotlib (optional)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return (f"--plot {path}: matplotlib is not installed (`pip install matplotlib`); "
                "the tables and JSON are complete without it")
    summary, modes = data["summary"], [m for m in data["modes"] if m != "tf-default"]
    names = [n for n in summary if "median_ms" in summary[n].get("tf-default", {})]
    if not names or not modes:
        return f"--plot {path}: nothing to plot (needs tf-default and another mode)"
    width = 0.8 / len(modes)
    fig, ax = plt.subplots(figsize=(max(8, 0.7 * len(names) * len(modes) / 2 + 3), 5))
    from matplotlib.ticker import FuncFormatter

    for i, mode in enumerate(modes):
        values = [summary[n]["tf-default"]["median_ms"] / summary[n][mode]["median_ms"]
                  if "median_ms" in summary[n].get(mode, {}) else 0.0 for n in names]
        bars = ax.bar([x + (i - (len(modes) - 1) / 2) * width for x in range(len(names))],
                      values, width, label=mode)
        for bar, name in zip(bars, names):  # hatched: the mode's fused kernel did not run
            if summary[name].get(mode, {}).get("verdict") in ("not fused", "not clustered"):
                bar.set_hatch("//")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=45, ha="right")
    ax.set_ylabel("speed-up over TF default (higher is better)")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.yaxis.set_minor_formatter(FuncFormatter(
        lambda v, _: f"{v:g}x" if f"{v:e}"[0] in "235" else ""))
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_title(f"tf_autofuse benchmark suite: TF default step time / mode step time, median "
                 f"of {data['options']['rounds']} round(s)\nhatched: not fused (autofuse) or not "
                 f"clustered (xla); {data.get('machine', '')}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"plot: {path}"


# ----------------------------------------------------------------------------- the run

def run_suite(opts, log=sys.stderr) -> dict:
    """Run every cell, print progress to `log`, return the JSON-able data of the run."""
    names = opts.workloads
    autofuse_flags, flags_note = (resolve_autofuse_flags(opts.autofuse_flags)
                                  if "autofuse" in opts.modes else (None, None))
    if flags_note:
        print(f"note: {flags_note}", file=log, flush=True)
    cells: list[dict] = []
    loads = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tf_autofuse_bench_") as out_dir:
        for round_index, mode, chosen in plan(opts, names):
            loads.append(os.getloadavg()[0])
            for result in run_process(mode, chosen, round_index, opts, out_dir, autofuse_flags):
                cells.append(result)
                status = result.get("error") or f"{format_ms(result['median_ms'])} ms"
                print(f"  round {round_index}  {result['workload']:<20} {mode:<10} {status}",
                      file=log, flush=True)
        reference = check_model_outputs(cells, opts.modes)
        for cell in cells:
            cell.pop("output_file", None)  # in the temporary directory, gone after the run
    loads.append(os.getloadavg()[0])
    summary = {}
    for name in names:
        row = {}
        for mode in ([COPY] if opts.copy_bound else []) + opts.modes:
            results = [c for c in cells if c["workload"] == name and c["mode"] == mode]
            if results:
                row[mode] = summarize(results)
        summary[name] = row
    info = {}
    for name in names:
        workload = wl.get(name, opts.quick)
        info[name] = {"kind": workload.kind, "title": workload.title, "note": workload.note,
                      "input_bytes": workload.input_bytes}
    return {
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "machine": machine_description(),
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(time.time()
                                                                     - (time.monotonic() - started))),
        "seconds": time.monotonic() - started,
        "options": {"rounds": opts.rounds, "quick": opts.quick, "steps": opts.steps,
                    "seconds_per_cell": opts.seconds, "sink": opts.sink,
                    "share_process": opts.share_process, "copy_bound": opts.copy_bound},
        "modes": opts.modes,
        "mode_help": {m: MODES[m].help for m in opts.modes},
        "autofuse_flags": autofuse_flags, "autofuse_flags_note": flags_note,
        "autofuse_dfx_flags": getattr(opts, "autofuse_dfx_flags", "") or None,
        "xla_flags": XLA_FLAGS, "model_reference_mode": reference,
        "load_averages": loads, "busy_note": busy_note(loads),
        "workloads": info, "summary": summary, "cells": cells,
    }


def header_text(data: dict) -> str:
    lines = [f"$ {data['command']}", f"machine: {data['machine']}",
             f"modes: " + "; ".join(f"{m} = {h}" for m, h in data["mode_help"].items())]
    if data["autofuse_flags"]:
        lines.append(f"autofuse: AUTOFUSE_FLAGS={data['autofuse_flags']!r}")
    if data.get("autofuse_dfx_flags"):
        lines.append(f"autofuse: AUTOFUSE_DFX_FLAGS={data['autofuse_dfx_flags']!r}")
    if data["autofuse_flags_note"]:
        lines.append(f"NOTE: {data['autofuse_flags_note']}")
    o = data["options"]
    steps = (o["steps"] or ("quick" if o["quick"] else
                            f"~{o['seconds_per_cell']:g} s worth (>= {MIN_STEPS})"))
    lines.append(f"{o['rounds']} round(s), modes interleaved (order rotated each round), "
                 f"steps per cell {steps}, "
                 + ("ALL WORKLOADS OF A MODE SHARE ONE PROCESS (--share-process: a CI "
                    "smoke form, first steps and times are not independent)"
                    if o["share_process"] else "each cell in a fresh process"))
    return "\n".join(lines)
