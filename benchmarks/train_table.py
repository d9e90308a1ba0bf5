"""Training steps of Keras models under TensorFlow, tf_autofuse and XLA, each (model, mode) in
a fresh process: step time, executed kernels, peak memory, first step, and the gradient error of
one step against a float64 run of the same weights.

    python benchmarks/train_table.py                      # ResNet50, EfficientNetB0, transformer
    python benchmarks/train_table.py --models transformer --steps 20 --json train.json
    python benchmarks/train_table.py --smoke              # tiny transformer, 2 steps (CI)
    python benchmarks/train_table.py --rounds 3           # each cell 3 times, modes interleaved

Models (weights=None, keras.utils.set_random_seed(0), batch --batch, default 16): ResNet50 and
EfficientNetB0 on 64x64x3 images with 10 classes (sparse cross-entropy on logits), the suite's
2-layer transformer encoder at sequence 64, width 128 (mean squared error to a fixed target).
The step is a tf.function: GradientTape, then SGD with momentum 0.9 applies the gradients.
Modes and their environments are benchmarks/model_table.py's.

Per cell: the first step is timed (tracing, Grappler, tf_autofuse's rewrite; XLA compiles) and
records the executed graphs; then --warmup steps and --steps timed steps (median). Before any
step, the gradients of one batch at the initial weights are saved; the tf process also computes
them in float64 (the same architecture built with float64 weights copied from the float32
ones). Columns:
  compute kernels, fused, peak RSS    as in model_table.py
  grad error        over the trainable tensors, the median of |g - g64| / |g64| (2-norms) of
                    the step's float32 gradients against the float64 ones: the same number for
                    TensorFlow's own gradients says how far float32 is from exact at all
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402
from benchmarks import model_table as table  # noqa: E402
from benchmarks import workloads as wl  # noqa: E402

PREFIX = "TRAIN_TABLE "
MODELS = ("resnet50", "efficientnetb0", "transformer")
IMAGE, CLASSES = (64, 64, 3), 10


def build(model: str, smoke: bool, dtype: str = "float32"):
    """(keras model, inputs, targets, loss) with seeded weights and data."""
    import keras
    import numpy as np

    keras.config.set_floatx(dtype)
    keras.config.set_dtype_policy(dtype)  # layers compute in it, not only create weights
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    if model == "transformer":
        seq, width = (16, 32) if smoke else (64, 128)
        net = (wl.transformer_encoder(keras, seq=seq, width=width, heads=2, ffn=64) if smoke
               else wl.transformer_encoder(keras, seq=seq, width=width, heads=4, ffn=512))
        shape, target = (seq, width), rng.uniform(-1, 1, (seq, width))
        loss = keras.losses.MeanSquaredError()
    else:
        make = {"resnet50": keras.applications.ResNet50,
                "efficientnetb0": keras.applications.EfficientNetB0}[model]
        net = make(weights=None, input_shape=IMAGE, classes=CLASSES, classifier_activation=None)
        shape, target = IMAGE, None
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return net, shape, target, loss


def _batch(shape, target, batch: int, dtype):
    import numpy as np

    rng = np.random.default_rng(2)
    x = rng.uniform(0, 1, (batch, *shape)).astype(dtype)
    if target is None:
        y = rng.integers(0, CLASSES, batch).astype(np.int32)
    else:
        y = np.broadcast_to(target, (batch, *target.shape)).astype(dtype)
    return x, y


def _gradients(net, loss, x, y):
    import tensorflow as tf

    @tf.function
    def grads(features, labels):
        with tf.GradientTape() as tape:
            value = loss(labels, net(features, training=True))
        return tape.gradient(value, net.trainable_variables)

    return [g.numpy() for g in grads(tf.constant(x), tf.constant(y))]


def worker(model: str, mode: str, batch: int, steps: int, warmup: int, smoke: bool,
           out_path: str) -> dict:
    import keras
    import numpy as np
    import tensorflow as tf

    import_rss = table.set_up_mode(mode)
    net, shape, target, loss = build(model, smoke)
    x, y = _batch(shape, target, batch, np.float32)
    saved = {f"g{i}": g for i, g in enumerate(_gradients(net, loss, x, y))}
    if mode == "tf":  # the exact reference: the same weights in float64
        exact, *_ = build(model, smoke, "float64")
        exact.set_weights([w.astype(np.float64) for w in net.get_weights()])
        # the float32 inputs themselves, so that only the arithmetic differs
        x64, y64 = x.astype(np.float64), y if target is None else y.astype(np.float64)
        saved.update({f"x{i}": g for i, g in enumerate(_gradients(exact, loss, x64, y64))})
        if any(g.dtype != np.float64 for k, g in saved.items() if k.startswith("x")):
            raise RuntimeError("the float64 reference did not compute in float64")
        keras.config.set_floatx("float32")
        keras.config.set_dtype_policy("float32")
    np.savez(out_path, **saved)

    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    optimizer.build(net.trainable_variables)

    @tf.function
    def step(features, labels):
        with tf.GradientTape() as tape:
            value = loss(labels, net(features, training=True))
        grads = tape.gradient(value, net.trainable_variables)
        optimizer.apply_gradients(zip(grads, net.trainable_variables))
        return value

    graphs, first_ms, times = table.timed_calls(step, (tf.constant(x), tf.constant(y)), warmup,
                                                steps)
    return table.cell_of_run(model, mode, batch, smoke, graphs, first_ms, times, import_rss,
                             out_path)


def run_cell(model: str, mode: str, args, out_dir: str, tag: str = "") -> dict:
    return table.run_cell(model, mode, args, out_dir, tag=tag, script=__file__, prefix=PREFIX,
                          suffix=".npz")


def merged_rounds(cells: list) -> dict:
    """One cell from the rounds of a (model, mode): the first round's, with the median over
    rounds of its times and memory (each round's step time kept in `round_median_ms`)."""
    done = [c for c in cells if "error" not in c]
    if not done:
        return cells[0]
    merged = dict(done[0])
    for key in ("median_ms", "first_ms", "peak_rss_mib", "model_rss_mib"):
        values = [c[key] for c in done if c.get(key) is not None]
        if values:
            merged[key] = statistics.median(values)
    merged["round_median_ms"] = [c["median_ms"] for c in done]
    return merged


def gradient_errors(cells: list) -> None:
    """Each cell's median relative gradient error against the tf cell's float64 gradients."""
    import numpy as np

    exact = {}
    for cell in cells:
        if cell["mode"] == "tf" and "error" not in cell:
            with np.load(cell["output"]) as data:
                exact[cell["model"]] = [data[k] for k in sorted(
                    (k for k in data.files if k.startswith("x")), key=lambda k: int(k[1:]))]
    for cell in cells:
        reference = exact.get(cell["model"])
        cell["grad_error"] = None
        if "error" in cell or reference is None:
            continue
        with np.load(cell["output"]) as data:
            grads = [data[f"g{i}"] for i in range(len(reference))]
        errors = [float(np.linalg.norm(g.astype(np.float64) - r) / max(np.linalg.norm(r), 1e-300))
                  for g, r in zip(grads, reference)]
        cell["grad_error"] = statistics.median(errors)


def markdown(cells: list) -> str:
    lines = ["| model | mode | compute kernels | fused kernels / XLA clusters | peak RSS (MiB) | "
             "model RSS (MiB) | step, median (ms) | first step (ms) | grad error vs float64 |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for c in cells:
        name = wl.MODEL_NAMES.get(c["model"], c["model"])
        if "error" in c:
            lines.append(f"| {name} | {table.LABELS[c['mode']]} | error: {c['error']} "
                         "| | | | | | |")
            continue
        error = "-" if c.get("grad_error") is None else f"{c['grad_error']:.1e}"
        lines.append(f"| {name} | {table.LABELS[c['mode']]} | {c['kernels']} | {c['fused']} | "
                     f"{c['peak_rss_mib']:.0f} | {c['model_rss_mib']:.0f} | "
                     f"{c['median_ms']:.1f} | {c['first_ms']:.0f} | {error} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated, from {', '.join(MODELS)}")
    parser.add_argument("--modes", default=",".join(table.MODES),
                        help=f"comma-separated, from {', '.join(table.MODES)}")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 10; "
                                                                "--smoke: 2)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps after the "
                                                                 "first (default 3; --smoke: 1)")
    parser.add_argument("--json", default=None, help="also write the cells as JSON")
    parser.add_argument("--smoke", action="store_true",
                        help="the tiny transformer only, 2 steps: checks the script")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run each (model, mode) this many times, the modes interleaved; "
                             "the times are the median over rounds (a fresh process's step "
                             "time varies by 5-10 %% from one process to the next)")
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.steps = args.steps if args.steps is not None else (2 if args.smoke else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 3)

    if args.worker:
        model, mode = args.worker
        result = worker(model, mode, args.batch, args.steps, args.warmup, args.smoke, args.out)
        print(PREFIX + json.dumps(result), flush=True)
        return 0

    models, modes = table.selected(parser, args, MODELS)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    cells = []
    with tempfile.TemporaryDirectory(prefix="train_table_") as out_dir:
        for model in models:
            runs = {mode: [] for mode in modes}
            for r in range(args.rounds):
                for mode in modes:
                    print(f"{model} / {mode} (round {r + 1} of {args.rounds}) ...",
                          file=sys.stderr, flush=True)
                    runs[mode].append(run_cell(model, mode, args, out_dir,
                                               tag=f"_round{r}" if r else ""))
            cells.extend(merged_rounds(runs[mode]) for mode in modes)
        gradient_errors(cells)
        for cell in cells:
            cell.pop("output", None)
    print(f"training steps, batch {args.batch}, {args.steps} timed steps after {args.warmup} "
          f"warm-up steps, each (model, mode) in a fresh process"
          f"{f', median of {args.rounds} rounds' if args.rounds > 1 else ''}"
          f"{', SMOKE sizes' if args.smoke else ''}\n")
    print(markdown(cells))
    if args.json:
        Path(args.json).write_text(json.dumps({"kind": "train_table", **harness.provenance(),
                                               "options": {
            "batch": args.batch, "steps": args.steps, "warmup": args.warmup, "smoke": args.smoke,
            "rounds": args.rounds,
            "autofuse_flags": harness.AUTOFUSE_FLAGS_WANTED, "xla_flags": harness.XLA_FLAGS},
            "cells": cells}, indent=1))
    return 1 if any("error" in c for c in cells) else 0


if __name__ == "__main__":
    sys.exit(main())
