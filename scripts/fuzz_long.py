#!/usr/bin/env python3
"""The long equivalence fuzz: random graphs, fused vs unfused vs float64 (docs/CORRECTNESS.md).

    python scripts/fuzz_long.py --graphs 10000 --seed 1 [--minutes 20] [--broadcast]

Draws graphs with the generator of tests/test_random_graphs.py from a seeded numpy RNG (graph i
of seed S is always the same graph), checks each with `check_spec` (structure, NaN/Inf places,
error no larger than unfused plus a few ulps) and prints a summary line. A failing graph is
printed in full with its index; `--only I` re-runs graph I alone. Exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import test_random_graphs as rg  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=0, help="stop after this long (0: never)")
    parser.add_argument("--only", type=int, default=None, help="run graph I of the seed only")
    parser.add_argument("--broadcast", action="store_true", help="add broadcast operands")
    parser.add_argument("--max-failures", type=int, default=20)
    args = parser.parse_args()
    features = rg.Features(broadcast=args.broadcast)
    started = time.monotonic()
    done = fused = elements = unstable = 0
    failures = []
    for i in range(args.graphs):
        if args.only is not None and i != args.only:
            continue
        if args.minutes and time.monotonic() - started > args.minutes * 60:
            break
        # one RNG per graph: graph i does not depend on how far the others got
        spec = rg.generate(rg.RandomChooser(np.random.default_rng([args.seed, i])), features)
        try:
            outcome = rg.check_spec(spec)
        except Exception as err:  # noqa: BLE001 - report every kind of failure
            failures.append(i)
            print(f"--- graph {i} (seed {args.seed}) FAILED: {type(err).__name__}\n{err}\n",
                  flush=True)
            if len(failures) >= args.max_failures:
                break
        else:
            fused += bool(outcome.fused_kernels)
            elements += outcome.elements
            unstable += outcome.unstable
        done += 1
        if done % 500 == 0:
            print(f"... {done} graphs, {len(failures)} failed, "
                  f"{time.monotonic() - started:.0f} s", flush=True)
    elapsed = time.monotonic() - started
    print(f"fuzz_long: seed {args.seed}: {done} graphs ({fused} with fused kernels), "
          f"{elements} elements compared ({unstable} unstable, not compared), "
          f"{len(failures)} failed {failures[:20]}, {elapsed:.0f} s"
          f"{', broadcast operands' if args.broadcast else ''}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
