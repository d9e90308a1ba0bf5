"""The broadcast schedules: the iteration shape read as rows.

RowsEmitter: [outer, inner] (axes [0, split) and [split, rank)); every input is read in full,
as a row (inner only, e.g. a bias), a column (outer only, one GM element per row) or a scalar.
Tiles are chunks of one row; the cores share the tiles of all rows. The reduce and column
schedules (reduce.py, column.py) walk the same rows.

Broadcast3Emitter: [outer, mid, inner] when no [outer, inner] cut fits: every input is full or
broadcast on each of the three parts; a tile is a chunk of one (outer, mid) row.
"""

from __future__ import annotations

from .. import schedule, tiling
from ..kernel import STORAGE
from .base import Emitter, patterns_text

ROWS_PRELUDE = """\
    const uint64_t first = GetBlockIdx() * t.tilesPerBlock;
    firstTile = first;
    lastTile = first + t.tilesPerBlock < t.totalTiles ? first + t.tilesPerBlock : t.totalTiles;
    inner = t.inner;
    tilesPerRow = t.tilesPerRow;
    tileLength = t.tileLength;"""

ROWS_PROCESS = """\
    for (uint64_t g = firstTile; g < lastTile; ++g) {
      const uint64_t o = g / tilesPerRow;  // outer index: the row
      const uint64_t col = (g % tilesPerRow) * tileLength;  // inner offset in the row
      const uint64_t off = o * inner + col;
      const uint32_t n = static_cast<uint32_t>(inner - col < tileLength ? inner - col : tileLength);
      CopyIn(off, col, n);
      Compute(o, n);
      CopyOut(off, n);
    }"""

ROWS_STATE = "  uint64_t firstTile = 0, lastTile = 0, inner = 0, tilesPerRow = 0;\n  uint32_t tileLength = 0;"


class RowsEmitter(Emitter):
    compute_params = "uint64_t o, uint32_t n"
    copy_in_params = "uint64_t off, uint64_t col, uint32_t n"
    full_extent = "t.outer * t.inner"  # elements of a full input or output
    has_mid = False  # [outer, mid, inner]: the tiling data and the kernel state carry `mid`

    def extent(self, pattern: str) -> str:
        return {"full": self.full_extent, "row": "t.inner", "col": "t.outer", "scalar": "1"}[pattern]

    def input_global(self, k, t):
        return f"    in{k}Gm.SetGlobalBuffer((__gm__ {t}*)in{k}, {self.extent(self.plan.patterns[k])});"

    def output_global(self, k, t):
        return f"    out{k}Gm.SetGlobalBuffer((__gm__ {t}*)out{k}, {self.full_extent});"

    def input_offset(self, k):
        return "col" if self.plan.patterns[k] == "row" else "off"

    def prelude(self):
        if self.has_mid:
            return ROWS_PRELUDE.replace("    inner = t.inner;", "    inner = t.inner;\n    mid = t.mid;")
        return ROWS_PRELUDE

    def process(self, ctx):
        return ROWS_PROCESS

    def state(self):
        plan = self.plan
        state = ROWS_STATE
        if self.has_mid:
            state += "\n  uint64_t mid = 0;"
        state += "".join(f"\n  {STORAGE[plan.p.insts[k].dtype]} rs{k} = 0;  // %{k} of the current row, "
                         "broadcast over it" for k in sorted(plan.scalars))
        return state

    def describe(self):
        return f"broadcast, outer axes [0, {self.plan.split}), inputs {patterns_text(self.plan.patterns)}"

    def host_tiling(self, ub):
        n, plan = self.name, self.plan
        rank = max(len(i.view) for i in self.p.inputs)
        tiling_fn = tiling.cpp_bcast_function(n, n + "_TilingData", ub.max_tile, plan.reduce)
        tiling_call = f"""\
  if (a->rank != {rank} || (a->rank && !a->shape))
    return autofuse_launch_fail(a, -1, "{n}: the iteration shape must have rank {rank}");
  uint64_t outer = 1, inner = 1;
  for (uint32_t d = 0; d < a->rank; ++d) (d < {plan.split} ? outer : inner) *= static_cast<uint64_t>(a->shape[d]);
  if (outer * inner != a->total) return autofuse_launch_fail(a, -1, "{n}: total != product of the shape");
  if ({n}_tiling(outer, inner, core_num, 0, &t) != 0) return autofuse_launch_fail(a, -1, "{n}: tiling failed");"""
        extent = {"full": "outer * inner", "row": "inner", "col": "outer", "scalar": "1"}
        in_bytes = "\n".join(f"  bytes[{k}] = ({extent.get(pat, '0')}) * {n}_IN_SIZES[{k}];"
                             for k, pat in enumerate(plan.patterns))
        return tiling_fn, tiling_call, in_bytes

    def mid_host_tiling(self, ub, rows: bool):
        """The launcher's tiling of an [outer, mid, inner] schedule (broadcast3, column)."""
        n, plan = self.name, self.plan
        rank = max(len(i.view) for i in self.p.inputs)
        tiling_fn = tiling.cpp_column_function(n, n + "_TilingData", ub.max_tile, rows=rows)
        tiling_call = f"""\
  if (a->rank != {rank} || (a->rank && !a->shape))
    return autofuse_launch_fail(a, -1, "{n}: the iteration shape must have rank {rank}");
  uint64_t dims[3] = {{1, 1, 1}};
  for (uint32_t d = 0; d < a->rank; ++d)
    dims[d < {plan.split} ? 0 : d < {plan.split2} ? 1 : 2] *= static_cast<uint64_t>(a->shape[d]);
  const uint64_t outer = dims[0], inner = dims[2];
  if (dims[0] * dims[1] * dims[2] != a->total) return autofuse_launch_fail(a, -1, "{n}: total != product of the shape");
  if ({n}_tiling(dims[0], dims[1], dims[2], core_num, 0, &t) != 0) return autofuse_launch_fail(a, -1, "{n}: tiling failed");"""
        return tiling_fn, tiling_call


class Broadcast3Emitter(RowsEmitter):
    compute_params = "uint64_t o, uint64_t m, uint32_t n"
    copy_in_params = RowsEmitter.copy_in_params + ", uint64_t o, uint64_t m"
    full_extent = "t.outer * t.mid * t.inner"
    has_mid = True

    def extent3(self, k: int, outer="t.outer", mid="t.mid", inner="t.inner") -> str:
        return " * ".join(d for d, p in zip((outer, mid, inner), self.plan.patterns[k]) if p == "f") or "1"

    def input_global(self, k, t):
        return f"    in{k}Gm.SetGlobalBuffer((__gm__ {t}*)in{k}, {self.extent3(k)});"

    def input_offset(self, k):
        inner = "inner" if self.plan.patterns[k][2] == "f" else "1"
        return f"{schedule.row_of(self.plan.patterns, k)} * {inner} + col"

    def process(self, ctx):
        return """\
    for (uint64_t g = firstTile; g < lastTile; ++g) {
      const uint64_t row = g / tilesPerRow;  // the row of [outer * mid, inner]
      const uint64_t o = row / mid, m = row % mid;  // its outer and mid indices
      const uint64_t col = (g % tilesPerRow) * tileLength;  // inner offset in the row
      const uint64_t off = row * inner + col;
      const uint32_t n = static_cast<uint32_t>(inner - col < tileLength ? inner - col : tileLength);
      CopyIn(off, col, n, o, m);
      Compute(o, m, n);
      CopyOut(off, n);
    }"""

    def describe(self):
        plan = self.plan
        return (f"broadcast over [outer, mid, inner] = axes [0, {plan.split}), [{plan.split}, "
                f"{plan.split2}), [{plan.split2}, rank); per input full (f) or broadcast (b) on each: "
                + patterns_text(plan.patterns))

    def host_tiling(self, ub):
        n = self.name
        tiling_fn, tiling_call = self.mid_host_tiling(ub, rows=True)
        in_bytes = "\n".join(f"  bytes[{k}] = ({self.extent3(k, 'dims[0]', 'dims[1]', 'dims[2]')}) * "
                             f"{n}_IN_SIZES[{k}];" for k in range(len(self.plan.in_types)))
        return tiling_fn, tiling_call, in_bytes

