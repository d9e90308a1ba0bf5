#!/usr/bin/env python3
"""The long equivalence fuzz: random graphs, fused vs unfused vs float64 (docs/CORRECTNESS.md).

    python scripts/fuzz_long.py --graphs 10000 --seed 1 [--minutes 20] [--features all]
    python scripts/fuzz_long.py --seed commit     # the seed CI draws from HEAD (fuzz_seed.py)

Draws graphs with the generator of tests/test_random_graphs.py from a seeded numpy RNG (graph i
of seed S is always the same graph), checks each with `check_spec` (structure, NaN/Inf places,
error no larger than unfused plus the error model's bound) and prints a summary line. A failing
graph is printed in full with its index; `--only I` re-runs graph I alone. Exit status 1 on any
failure.

--features: `all` (the default: every op of the catalog, broadcast operands and views,
reductions with the reduce pass on), `elementwise` (no broadcast operands, no reductions), or a
comma-separated list of `broadcast`, `reductions`, `flags` (random partition limits) and `views`
(views of the graph's own values between ops; not in `all`, whose seeds keep their graphs).
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

import fuzz_seed  # noqa: E402
import test_random_graphs as rg  # noqa: E402


def features_from(text: str) -> "rg.Features":
    if text == "all":
        return rg.ALL
    if text == "elementwise":
        return rg.Features()
    words = {w.strip() for w in text.split(",") if w.strip()}
    unknown = words - {"broadcast", "reductions", "flags", "views"}
    if unknown:
        raise SystemExit(f"fuzz_long: unknown feature(s) {sorted(unknown)}")
    return rg.Features(broadcast="broadcast" in words, reductions="reductions" in words,
                       flags="flags" in words, value_views="views" in words)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=10000)
    parser.add_argument("--seed", default="1",
                        help="an integer, or 'commit': the seed drawn from HEAD, as CI does")
    parser.add_argument("--minutes", type=float, default=0, help="stop after this long (0: never)")
    parser.add_argument("--only", type=int, default=None, help="run graph I of the seed only")
    parser.add_argument("--features", default="all",
                        help="all (default), elementwise, or broadcast,reductions")
    parser.add_argument("--max-failures", type=int, default=20)
    args = parser.parse_args()
    features = features_from(args.features)
    if args.seed == "commit":
        args.seed, source = fuzz_seed.commit_seed()
        print(f"fuzz_long: seed {args.seed} ({source})", flush=True)
    else:
        try:
            args.seed = int(args.seed)
        except ValueError:
            parser.error(f"--seed takes an integer or 'commit', not {args.seed!r}")
    started = time.monotonic()
    done = fused = reduced = elements = unstable = 0
    failures = []
    stopped = ""
    for i in range(args.graphs):
        if args.only is not None and i != args.only:
            continue
        if args.minutes and time.monotonic() - started > args.minutes * 60:
            stopped = f" (stopped by --minutes {args.minutes:g} after graph {i - 1})"
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
                done += 1
                stopped = f" (stopped after {len(failures)} failures)"
                break
        else:
            fused += bool(outcome.fused_kernels)
            reduced += bool(outcome.reduce_kernels)
            elements += outcome.elements
            unstable += outcome.unstable
        done += 1
        if done % 500 == 0:
            print(f"... {done} graphs, {len(failures)} failed, "
                  f"{time.monotonic() - started:.0f} s", flush=True)
    elapsed = time.monotonic() - started
    print(f"fuzz_long: seed {args.seed}, features {args.features}: {done} graphs ({fused} with "
          f"fused kernels, {reduced} with fused reductions), {elements} elements compared "
          f"({unstable} unstable, not compared), {len(failures)} failed {failures[:20]}, "
          f"{elapsed:.0f} s{stopped}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
