"""Fused kernel names, autofuse_<kind>_<n>_<OpType>_<OpType>..., and the op types of fused nodes.

n counts from 0 per graph in the order names are asked for. When the graph already holds
autofuse_*_<n>_* nodes (the pass ran before), counting starts after the largest n, and a
name already taken is never handed out.
"""

from __future__ import annotations

import re
from typing import Iterable

_EXISTING = re.compile(r"autofuse_[A-Za-z]+_(\d+)(?:_|$)")

# The kind words of kernel names: "pointwise" (no reduction), "reduce" (a reduction).
KINDS = ("pointwise", "reduce")

# The op types of fused nodes (cc/kernel.cc registers both).
FUSED_OP = "AutofuseKernel"
ASSIGN_OP = "AutofuseAssignKernel"  # a fused kernel that also writes variables (assigns.py)
FUSED_OPS = frozenset({FUSED_OP, ASSIGN_OP})


class Namer:
    def __init__(self, existing_names: Iterable[str]):
        self._taken = set(existing_names)
        numbers = [int(m[1]) for m in map(_EXISTING.match, self._taken) if m]
        self._next = max(numbers) + 1 if numbers else 0

    def name(self, kind: str, op_types: Iterable[str]) -> str:
        """A new name; `kind` is a name kind such as "pointwise"."""
        suffix = "_".join(op_types)
        while True:
            candidate = f"autofuse_{kind}_{self._next}_{suffix}"
            self._next += 1
            if candidate not in self._taken:
                self._taken.add(candidate)
                return candidate
