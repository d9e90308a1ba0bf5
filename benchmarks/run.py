"""tf_autofuse benchmark suite: TF (unfused, default), XLA and tf_autofuse, one table.

    python benchmarks/run.py                         # everything: 2 rounds, ~1 s per cell
    python benchmarks/run.py --rounds 3 --json bench.json --plot bench.png
    python benchmarks/run.py --workloads micro       # or examples, models, or names:
    python benchmarks/run.py --workloads gelu,layernorm,transformer_b8 --modes tf-default,xla,autofuse
    python benchmarks/run.py --quick                 # CI sizes: tiny shapes, 1 round, 3 steps
    python benchmarks/run.py --list                  # the workloads

Every (round, workload, mode) cell is a fresh Python process with the mode's environment set
before TensorFlow is imported (see benchmarks/harness.py for the modes and what is measured);
the modes are interleaved, and the table shows the median of the rounds' medians.
Micro workloads also get the copy bound: numpy copying the input bytes once, all cores.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402
from benchmarks import workloads as wl  # noqa: E402

MODE_ALIASES = {"tf-unfused": "unfused"}  # scripts/bench_chain.py's name


def comma_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    lines = __doc__.splitlines()
    parser = argparse.ArgumentParser(description=lines[0], epilog="\n".join(lines[1:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", type=comma_list, default=["all"],
                        help="comma list of workload names or groups (examples, micro, models, "
                             "all; default all); chain@DIMxDIM:DTYPE for any abs->relu->exp")
    parser.add_argument("--modes", type=comma_list, default=list(harness.MODES),
                        help=f"comma list of {', '.join(harness.MODES)} (default all)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds; the table shows the median (default 2, "
                             "--quick 1)")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps per cell (default: ~--seconds worth, at least "
                             f"{harness.MIN_STEPS})")
    parser.add_argument("--seconds", type=float, default=1.0,
                        help="timed seconds per cell when --steps is not given (default 1)")
    parser.add_argument("--quick", action="store_true",
                        help=f"CI smoke form: small shapes and models, 1 round, "
                             f"{harness.QUICK_STEPS} steps per cell")
    parser.add_argument("--no-copy-bound", dest="copy_bound", action="store_false",
                        help="skip the memory-bandwidth bound of the micro workloads")
    parser.add_argument("--share-process", action="store_true",
                        help="run all workloads of a (round, mode) in one process: faster, for "
                             "CI; first steps and timings are then not independent")
    parser.add_argument("--sink", choices=["assign", "target"], default="assign",
                        help="micro workloads: assign the result to a variable (default), or "
                             "run the output op as a bare target (values not checked)")
    parser.add_argument("--autofuse-flags", default=harness.AUTOFUSE_FLAGS_WANTED,
                        help=f"AUTOFUSE_FLAGS of the autofuse mode (default "
                             f"{harness.AUTOFUSE_FLAGS_WANTED!r}; falls back to "
                             f"{harness.AUTOFUSE_FLAGS_FALLBACK!r} if rejected)")
    parser.add_argument("--autofuse-dfx-flags", default="",
                        help="AUTOFUSE_DFX_FLAGS of the autofuse mode (default none), e.g. "
                             "'--strip_fusion=false' to time the kernels without strip fusion")
    parser.add_argument("--kernel-profile", metavar="DIR",
                        help="autofuse processes write AUTOFUSE_DFX_FLAGS=--kernel_profile CSVs "
                             "into DIR, one per process (<workloads>.r<round>.csv): what bounds "
                             "each fused kernel (the timing slows the kernels: not for timings)")
    parser.add_argument("--json", metavar="OUT.json", help="write every cell and the summary")
    parser.add_argument("--plot", metavar="OUT.png",
                        help="bar chart of the speed-ups over TF default (needs matplotlib)")
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    parser.add_argument("--render", metavar="IN.json",
                        help="print the tables of an earlier run's --json (and --plot it); "
                             "runs nothing")
    parser.add_argument("--worker", metavar="MODE", help=argparse.SUPPRESS)
    parser.add_argument("--round", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    args.modes = [MODE_ALIASES.get(m, m) for m in args.modes]
    known = list(harness.MODES) + ([harness.COPY] if args.worker else [])
    unknown = [m for m in args.modes if m not in known]
    if args.worker and args.worker not in known:
        unknown.append(args.worker)
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}; choose from "
                     f"{', '.join(harness.MODES)}")
    if not args.modes:
        parser.error("--modes is empty")
    try:
        args.workloads = wl.resolve(args.workloads)
    except KeyError as err:
        parser.error(err.args[0])
    if args.rounds is None:
        args.rounds = 1 if args.quick else 2
    if args.rounds < 1 or (args.steps is not None and args.steps < 1) or args.seconds <= 0:
        parser.error("--rounds, --steps and --seconds must be positive")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return harness.worker_main(args.worker, args.workloads, args)
    if args.list:
        for name in args.workloads:
            workload = wl.get(name, args.quick)
            print(f"{name:<20} {workload.kind:<6} {workload.title}")
        return 0
    if args.render:
        data = json.loads(Path(args.render).read_text())
    else:
        data = harness.run_suite(args)
    print(harness.header_text(data))
    print()
    print(harness.render(data))
    print(f"\ntotal {data['seconds']:.0f} s, {data['busy_note']}")
    if args.json and not args.render:
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
        print(f"results: {args.json}")
    if args.plot:
        print(harness.plot(data, args.plot))
    failed = [f"{name}/{mode}" for name, row in data["summary"].items()
              for mode, cell in row.items() if not cell.get("verified")]
    if failed:
        print(f"checks failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
