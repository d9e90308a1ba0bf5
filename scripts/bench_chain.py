"""Step time of abs -> relu -> exp under TensorFlow, XLA and tf_autofuse, one table.

    python scripts/bench_chain.py                 # 3 shapes x 4 modes, 2 interleaved rounds
    python scripts/bench_chain.py --quick         # smoke run: 1 round, a few steps
    python scripts/bench_chain.py --modes tf-default,autofuse --shapes 4096x4096:float16 \\
        --rounds 3 --json bench.json

A thin wrapper over the benchmark suite (benchmarks/run.py, which has all workloads): each
--shapes item is the suite's `chain@DIMxDIM:DTYPE` workload, `tf-unfused` is the suite's
`unfused` mode, and the autofuse mode runs with AUTOFUSE_FLAGS=--enable_autofuse=true.
Every (round, shape, mode) cell is a fresh process; the table shows medians over the rounds,
the copy bound, first steps, executed kernels and which kernels ran (see benchmarks/harness.py).
The equivalent suite command is printed first.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks import run  # noqa: E402

DEFAULT_SHAPES = ["4096x4096:float32", "4096x4096:float16", "128x192:float16"]
DTYPES = ["float16", "bfloat16", "float32", "float64"]
MODES = ["tf-unfused", "tf-default", "xla", "autofuse"]
QUICK_STEPS = 5


def comma_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def suite_argv(argv=None) -> list[str]:
    """This script's command line translated into benchmarks/run.py's."""
    lines = __doc__.splitlines()
    parser = argparse.ArgumentParser(description=lines[0], epilog="\n".join(lines[1:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2,
                        help="interleaved rounds; the table shows the median (default 2)")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps per cell (default: ~1 s worth, at least 10)")
    parser.add_argument("--shapes", type=comma_list, default=DEFAULT_SHAPES,
                        help=f"comma-separated DIMxDIM:DTYPE (default {','.join(DEFAULT_SHAPES)})")
    parser.add_argument("--modes", type=comma_list, default=MODES,
                        help=f"comma-separated subset of {','.join(MODES)} (default all)")
    parser.add_argument("--sink", choices=["assign", "target"], default="assign",
                        help="assign: the result goes to a variable (default); "
                             "target: run exp's op as a bare target, sess.run(y.op)")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke run: 1 round, {QUICK_STEPS} steps per cell")
    parser.add_argument("--json", metavar="PATH", help="also write the results to PATH")
    parser.add_argument("--plot", metavar="PATH.png", help="bar chart (needs matplotlib)")
    args = parser.parse_args(argv)
    for spec in args.shapes:
        dims, _, dtype = spec.partition(":")
        if dtype not in DTYPES or not re.fullmatch(r"\d+(x\d+)*", dims):
            parser.error(f"{spec!r}: a shape is DIMxDIM...:DTYPE, e.g. 4096x4096:float16 "
                         f"(dtypes: {', '.join(DTYPES)})")
    unknown = [m for m in args.modes if m not in MODES + ["unfused"]]
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    rounds = 1 if args.quick else args.rounds
    steps = args.steps or (QUICK_STEPS if args.quick else None)
    out = ["--workloads", ",".join(f"chain@{s}" for s in args.shapes),
           "--modes", ",".join(args.modes), "--rounds", str(rounds), "--sink", args.sink,
           "--autofuse-flags=--enable_autofuse=true"]
    out += ["--steps", str(steps)] if steps else []
    out += ["--json", args.json] if args.json else []
    out += ["--plot", args.plot] if args.plot else []
    return out


def main(argv=None) -> int:
    translated = suite_argv(argv)
    print("# = python benchmarks/run.py " + shlex.join(translated), flush=True)
    return run.main(translated)


if __name__ == "__main__":
    sys.exit(main())
