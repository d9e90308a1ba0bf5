"""The flat schedule: every input is read as the iteration shape, each core takes a contiguous
share of the elements and walks it in tiles (the last one a tail)."""

from __future__ import annotations

from .. import tiling
from .base import Emitter


class FlatEmitter(Emitter):
    def input_global(self, k, t):
        return f"    in{k}Gm.SetGlobalBuffer((__gm__ {t}*)in{k} + start, len);"

    def output_global(self, k, t):
        return f"    out{k}Gm.SetGlobalBuffer((__gm__ {t}*)out{k} + start, len);"

    def prelude(self):
        return """\
    const uint64_t block = GetBlockIdx();
    const bool last = block + 1 == t.blockDim;
    const uint64_t start = block * t.blockLength;
    const uint64_t len = last ? t.lastBlockLength : t.blockLength;
    tileLength = t.tileLength;
    tileNum = last ? t.lastTileNum : t.tileNum;
    tailLength = last ? t.lastTailLength : t.tailLength;"""

    def process(self, ctx):
        return """\
    for (uint32_t i = 0; i < tileNum; ++i) {
      const uint32_t n = i + 1 == tileNum ? tailLength : tileLength;
      const uint64_t off = static_cast<uint64_t>(i) * tileLength;
      CopyIn(off, n);
      Compute(n);
      CopyOut(off, n);
    }"""

    def state(self):
        return "  uint32_t tileLength = 0, tileNum = 0, tailLength = 0;"

    def describe(self):
        return "flat"

    def host_tiling(self, ub):
        n = self.name
        tiling_fn = tiling.cpp_function(n, n + "_TilingData", ub.max_tile)
        tiling_call = (f'  if ({n}_tiling(a->total, core_num, 0, &t) != 0) '
                       f'return autofuse_launch_fail(a, -1, "{n}: tiling failed");')
        in_bytes = f"  for (int k = 0; k < {len(self.plan.in_types)}; ++k) bytes[k] = a->total * {n}_IN_SIZES[k];"
        return tiling_fn, tiling_call, in_bytes
