"""The seed of the fuzz that changes with every commit, so that CI draws new graphs each time.

`TF_AUTOFUSE_FUZZ_SEED` overrides it (to reproduce a CI failure on another checkout); outside a
git checkout it is a fixed seed. Every run says which seed it used and how to rerun a graph:
`python scripts/fuzz_long.py --seed SEED --only I`.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ENV = "TF_AUTOFUSE_FUZZ_SEED"
FALLBACK = 20261205
ROOT = Path(__file__).resolve().parents[1]


def commit_seed() -> tuple[int, str]:
    """(seed, where it comes from): the first 32 bits of HEAD's hash, or the override."""
    override = os.environ.get(ENV, "").strip()
    if override:
        try:
            return int(override), ENV
        except ValueError:
            raise SystemExit(f"{ENV}={override!r} is not an integer seed") from None
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=30, check=True).stdout.strip()
        return int(head[:8], 16), f"commit {head[:12]}"
    except (OSError, subprocess.SubprocessError, ValueError):
        return FALLBACK, "no git checkout: the fixed seed"
