"""Measure the op table's `cost` column: each op's cost per fp32 element in cheap ops.

    python scripts/op_costs.py [--calls 100] [--ops Exp,Tanh,Pow]

For each op with an fp32 result (rewriter/catalog.py, elementwise and broadcast rows), the CPU
kernel runs, eagerly on one thread over an L2-sized [128,1024] input, a program of one copy of
the op and one of five copies summed by Adds; the difference is four evaluations of the op and
four Adds, per element. The Add is then subtracted and the rest divided by Abs's figure (a
cheap op, cost 1). Each figure is the fastest of --calls runs, so that the others on the
machine disturb it least. The table shows the column's value next to the measured one: within
~2x is all the cost models need (cost.py and the kernel's thread-pool estimate, which its own
timing refines).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tf_autofuse.rewriter import catalog  # noqa: E402

SHAPE = (128, 1024)


def program(spec: catalog.OpSpec, copies: int) -> str:
    operands = ", ".join(["in0"] * spec.arity)
    lines, total = [f"in0: f32[{SHAPE[0]},{SHAPE[1]}]"], None
    for _ in range(copies):
        lines.append(f"%{len(lines) - 1} = {spec.ir_name} {operands}")
        if total is not None:
            lines.append(f"%{len(lines) - 1} = Add %{total}, %{len(lines) - 2}")
        total = len(lines) - 2
    return "\n".join(lines + [f"out0 = %{total}"]) + "\n"


def fastest(ops, text: str, x, calls: int) -> float:
    for _ in range(10):
        ops.autofuse_kernel(inputs=[x], Tout=[x.dtype], program=text)
    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        ops.autofuse_kernel(inputs=[x], Tout=[x.dtype], program=text)
        best = min(best, time.perf_counter() - start)
    return best


def per_element(ops, spec, x, calls: int) -> float:
    """ns per element of one copy of the op and one Add."""
    one, five = (fastest(ops, program(spec, n), x, calls) for n in (1, 5))
    return (five - one) / 4 / x.shape.num_elements() * 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--ops", default="", help="comma-separated IR names (default: all)")
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import tf_autofuse

    ops = tf_autofuse.ops()
    wanted = set(filter(None, args.ops.split(",")))
    specs = [s for s in catalog.OPS
             if s.kind in (catalog.ELEMENTWISE, catalog.BROADCAST) and s.result == "same"
             and not s.attrs and s.cpu_refusal is None and catalog.FLOAT <= s.dtypes
             and s.roles == () and (not wanted or s.ir_name in wanted)]
    x = tf.constant(np.random.RandomState(0).uniform(0.1, 2.5, SHAPE).astype(np.float32))
    add = per_element(ops, catalog.for_ir_name("Add"), x, args.calls) / 2  # Add + Add
    cheap = per_element(ops, catalog.for_ir_name("Abs"), x, args.calls) - add
    print(f"one cheap op: {cheap:.3f} ns per element")
    print(f"{'op':18} {'table':>6} {'measured':>9}")
    for spec in specs:
        measured = (per_element(ops, spec, x, args.calls) - add) / cheap
        print(f"{spec.ir_name:18} {spec.cost:6} {measured:9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
