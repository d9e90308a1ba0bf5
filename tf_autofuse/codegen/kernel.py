"""The result of generating one fused kernel, and the dtype tables every part of the generator reads.

`Kernel` is either `ok` with its sources (device kernel, tiling header, host tiling + ACL launch
glue) and its UB plan, or not ok with the reason the group stays on the CPU path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from typing import Optional

from . import tiling

CTYPE = {"f16": "half", "bf16": "bfloat16_t", "f32": "float", "i32": "int32_t", "bool": "uint8_t"}
SIZE = {"half": 2, "bfloat16_t": 2, "float": 4, "int32_t": 4, "uint8_t": 1}
# compute type; bool is 1 byte 0/1 in GM and a float 0.0/1.0 tile in UB (opmap.py, docs/ASCEND.md)
STORAGE = {"f16": "float", "bf16": "float", "f32": "float", "i32": "int32_t", "bool": "float"}
BLACKLIST_FLAG = "autofuse_enhance_precision_blacklist"


@dataclasses.dataclass
class Kernel:
    name: str
    program: str
    ok: bool
    reason: str = ""
    sources: dict = dataclasses.field(default_factory=dict)  # file name -> text
    ub: Optional[tiling.UbPlan] = None
    inputs: tuple = ()  # C types of the kernel's inputs
    outputs: tuple = ()  # C types of its outputs
    half_ops: tuple = ()  # instructions computed in half (blacklisted)
    split: Optional[int] = None  # broadcast schedule: iteration axes [0, split) are outer; None: flat
    patterns: tuple = ()  # broadcast schedule: per input "full", "row", "col" or "scalar"
    rank: int = 0  # broadcast schedule: rank of the iteration shape
    out_reduced: tuple = ()  # reduce schedule: per output, True when it is a reduced value
    passes: int = 1  # reduce schedule: passes over each row
    split2: Optional[int] = None  # column schedule: axes [split, split2) reduced, [split2, rank) kept
    cube: Optional[object] = None  # a MatMul and its epilogue: the cube.CubePlan; inputs are then
    #                                the epilogue's GM inputs (A and B apart)

    def column_dims(self, iteration_shape) -> tuple:
        """(outer, mid, inner) of the column schedule."""
        shape = tuple(iteration_shape)
        dims = [1, 1, 1]
        for a, d in enumerate(shape):
            dims[0 if a < self.split else 1 if a < self.split2 else 2] *= d
        return tuple(dims)

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        for key in sorted(self.sources):
            h.update(key.encode() + b"\0" + self.sources[key].encode() + b"\0")
        return h.hexdigest()[:20]

    def tiling(self, total: int, core_num: int) -> tiling.Tiling:
        return tiling.compute(total, core_num, self.ub.max_tile)

    def outer_inner(self, iteration_shape) -> tuple:
        """(outer, inner) element counts of an iteration shape, for the broadcast schedule."""
        shape = tuple(iteration_shape)
        if len(shape) != self.rank:
            raise ValueError(f"{self.name}: iteration shape {shape} is not of rank {self.rank}")
        outer = inner = 1
        for d in shape[:self.split]:
            outer *= d
        for d in shape[self.split:]:
            inner *= d
        return outer, inner


def kernel_name(node_name: str) -> str:
    """`autofuse_pointwise_0_Abs_SquaredDifference` -> `autofuse_pointwise_0_abs_squared_difference`."""
    snake = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", node_name)
    snake = re.sub(r"[^A-Za-z0-9_]", "_", snake).lower()
    snake = re.sub(r"_+", "_", snake).strip("_")
    if not snake or snake[0].isdigit():
        snake = "k_" + snake
    return snake


def precision_blacklist(environ=None) -> frozenset:
    """IR op names of `--autofuse_enhance_precision_blacklist=Op,...` in AUTOFUSE_FLAGS
    (tf_autofuse/flags.py reads and checks it): ops listed compute f16 in f16.

    The pass passes the session's flags explicitly; this is the default of `generate` for the
    offline tools. A flag string that does not parse is one warning and an empty list."""
    from .. import flags
    from .._warn import warn_once

    environ = os.environ if environ is None else environ
    try:
        items = flags.parse_items(environ.get(flags.FLAGS_ENV, ""), flags.FLAGS_ENV)
    except flags.FlagError as err:
        warn_once(f"the precision blacklist is not used: {err}")
        return frozenset()
    return frozenset(items.get(BLACKLIST_FLAG, frozenset()))

