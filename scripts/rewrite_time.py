"""Time the rewriter on the model graphs `scripts/rewrite_digest.py capture` recorded.

    python scripts/rewrite_digest.py capture DIR   # once (a few minutes)
    python scripts/rewrite_time.py DIR [-n 15] [--config reduce] [--profile resnet50_bridge0]

Each model capture (`resnet50_bridge0`, `efficientnetb0_frozen`, ...: the Grappler bridge's
inputs of a first call, and the model frozen at batch None) is rewritten N times in this one
process under one of rewrite_digest's CONFIGS (default "reduce", the flags the capture ran
with: `--autofuse_enable_pass=reduce`), after one untimed warm-up rewrite of every capture (the
catalog's tables, the interpreter's caches). Prints the fastest and the median wall time of
`tf_autofuse.rewriter.rewrite` per capture, in ms. `--profile NAME` instead runs cProfile over
N rewrites of one capture and prints the top of the cumulative and the own-time tables.
"""

from __future__ import annotations

import argparse
import cProfile
import pickle
import pstats
import statistics
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from rewrite_digest import CONFIGS, MODELS  # noqa: E402


def _load(path: Path):
    from tensorflow.core.framework import graph_pb2

    with open(path, "rb") as handle:
        graph_bytes, preserve, feeds, shapes = pickle.load(handle)
    return graph_pb2.GraphDef.FromString(graph_bytes), preserve, feeds, shapes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("-n", type=int, default=15, help="rewrites per capture")
    parser.add_argument("--config", default="reduce", choices=sorted(CONFIGS))
    parser.add_argument("--profile", metavar="NAME", help="cProfile one capture instead")
    args = parser.parse_args(argv)

    from tf_autofuse import rewriter

    flags = types.SimpleNamespace(**CONFIGS[args.config])
    paths = [p for p in sorted(args.dir.glob("*.pkl")) if p.stem.split("_")[0] in MODELS]
    if args.profile:
        paths = [p for p in paths if p.stem == args.profile]
    if not paths:
        parser.error(f"no model capture in {args.dir}")
    captures = {p.stem: _load(p) for p in paths}

    def run(capture):
        graph_def, preserve, feeds, shapes = capture
        return rewriter.rewrite(graph_def, preserve, flags, shapes, feeds)

    for capture in captures.values():
        run(capture)
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.n):
            run(captures[args.profile])
        profile.disable()
        stats = pstats.Stats(profile)
        stats.sort_stats("cumulative").print_stats(40)
        stats.sort_stats("tottime").print_stats(30)
        return 0
    print(f"config {args.config}, {args.n} rewrites each")
    print("| capture | nodes | fusions | fastest ms | median ms |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, capture in captures.items():
        times = []
        for _ in range(args.n):
            start = time.perf_counter()
            result = run(capture)
            times.append((time.perf_counter() - start) * 1e3)
        print(f"| {name} | {len(capture[0].node)} | {len(result.fusions)} | {min(times):.1f} | "
              f"{statistics.median(times):.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
