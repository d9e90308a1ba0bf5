"""Same-process A/B of a Keras model with and without fusion: the "never slower" check.

    python benchmarks/ab_models.py transformer_b1              # 20 rounds of 30 calls a side
    python benchmarks/ab_models.py resnet50_b1 --rounds 10 --calls 10

Fresh processes per mode (benchmarks/run.py, model_table.py) are what users see, but on a shared
VM two processes of the same graph differ by ±10-20 %, more than fusion changes a model whose
time is mostly MatMul or convolution. Here one process builds the model once and traces two
tf.functions of it: one while tf_autofuse's flags have fusion off, one with it on (the flags are
read each time Grappler optimizes a function). Their calls alternate in blocks (`--calls` each)
for `--rounds` rounds, so drift of the machine hits both sides alike. Printed: each side's
median of block medians, the ratio TF / tf_autofuse (> 1: fusion faster), the rounds fusion
won, each side's executed compute kernels (fused ones apart) and the largest output difference.
The first call is timed while TensorFlow traces it (to read the executed graph), and the tf side
goes first, paying the process's one-time costs (Keras' first call, TensorFlow's caches): the
first-call figures are for reading the kernel counts' context, not for comparing the sides
(benchmarks/model_table.py times first calls in fresh processes).

The script sets AUTOFUSE_FLAGS="--enable_autofuse=true;--autofuse_enable_pass=reduce" itself,
as the suite's autofuse mode does. Both
functions share the model's weights, the intra-op pool and the allocator: what differs is the
executed graph.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def fused(kernels) -> int:
    """How many of the counted kernels (op type -> count) are tf_autofuse's."""
    from benchmarks import harness

    return sum(kernels.get(op, 0) for op in harness.AUTOFUSE_OPS)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", help="a model workload: resnet50_b1, transformer_b8, ... "
                                         "(benchmarks/run.py --list)")
    parser.add_argument("--rounds", type=int, default=20, help="alternating blocks a side")
    parser.add_argument("--calls", type=int, default=30, help="timed calls a block")
    parser.add_argument("--quick", action="store_true", help="the CI sizes of the model")
    parser.add_argument("--json", metavar="OUT.json", help="also write the results here")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.calls < 1:
        parser.error("--rounds and --calls must be at least 1")

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from benchmarks import harness
    from benchmarks import workloads as wl

    try:
        workload = wl.get(args.workload, quick=args.quick)
    except (KeyError, ValueError) as err:
        parser.error(f"{args.workload!r}: {err}")
    if not isinstance(workload, wl.Model):
        parser.error(f"{args.workload!r} is not a model workload (resnet50_b1, transformer_b8, ...)")

    # fusion on in the process (the CPU plugin is registered at import only then); the tf side
    # turns it off in the flags while its function is optimized
    os.environ["AUTOFUSE_FLAGS"] = harness.AUTOFUSE_FLAGS_WANTED
    import numpy as np
    import tensorflow as tf

    import tf_autofuse
    from tf_autofuse import _bridge, profiling

    if not tf_autofuse.is_available():
        print("tf_autofuse's kernel library is not available: nothing to compare", file=sys.stderr)
        return 1
    previous = fused_flags = _bridge.process_flags()
    model = wl.build_model(workload)
    shape = (workload.batch, *wl.model_input_shape(workload.model, workload.quick))
    x = tf.constant(np.random.default_rng(1).uniform(0, 1, shape).astype(np.float32))

    sides, outputs, first, kernels = {}, {}, {}, {}
    try:
        for side, side_flags in (("tf", dataclasses.replace(fused_flags, enable_autofuse=False)),
                                 ("tf_autofuse", fused_flags)):
            _bridge.configure(side_flags)
            function = tf.function(lambda t: model(t, training=False))
            start = time.perf_counter()
            graphs = profiling.executed_function_graphs(function, x)  # the first call
            first[side] = (time.perf_counter() - start) * 1e3
            kernels[side] = profiling.compute_kernels(graphs)
            outputs[side] = function(x).numpy()
            sides[side] = function
    finally:
        _bridge.configure(previous)

    for function in sides.values():
        for _ in range(5):
            function(x).numpy()
    blocks = {side: [] for side in sides}
    for round_index in range(args.rounds):
        for side, function in sides.items():
            times = []
            for _ in range(args.calls):
                start = time.perf_counter()
                function(x).numpy()
                times.append(time.perf_counter() - start)
            blocks[side].append(statistics.median(times) * 1e3)
        print(f"\rround {round_index + 1}/{args.rounds}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)

    reference = outputs["tf"]
    difference = float(np.max(np.abs(outputs["tf_autofuse"] - reference))
                       / max(float(np.max(np.abs(reference))), 1e-30))
    tf_ms = statistics.median(blocks["tf"])
    af_ms = statistics.median(blocks["tf_autofuse"])
    won = sum(a < t for a, t in zip(blocks["tf_autofuse"], blocks["tf"]))
    print(f"{args.workload}: {args.rounds} rounds x {args.calls} calls a side, one process")
    for side in sides:
        print(f"  {side:12s} median {statistics.median(blocks[side]):8.3f} ms   first call "
              f"{first[side]:7.0f} ms (traced)   compute kernels {sum(kernels[side].values())} "
              f"({fused(kernels[side])} fused)")
        print(f"  {'':12s} blocks {' '.join(f'{b:.2f}' for b in blocks[side])}")
    print(f"  TF / tf_autofuse = {tf_ms / af_ms:.3f} (> 1: fusion faster); fusion won "
          f"{won} of {args.rounds} rounds; max rel. output difference {difference:.1e}")
    if args.json:
        result = {
            "kind": "ab_models", **harness.provenance(),
            "workload": args.workload, "quick": args.quick, "rounds": args.rounds,
            "calls": args.calls, "tf_over_autofuse": tf_ms / af_ms, "autofuse_won_rounds": won,
            "max_rel_diff": difference,
            "sides": {side: {"median_ms": statistics.median(blocks[side]), "blocks_ms": blocks[side],
                             "first_call_ms": first[side], "kernels": sum(kernels[side].values()),
                             "fused": fused(kernels[side])}
                      for side in sides}}
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
