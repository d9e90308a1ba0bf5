"""The column schedule: reduced axes followed by kept ones.

The iteration shape is read as [outer, mid (reduced), inner]; an item is a chunk of inner for
one outer index, accumulated element-wise over mid into tile-sized accumulators; ItemEnd finishes
Mean and writes each reduced output's chunk. Every input is read in full.
"""

from __future__ import annotations

from .broadcast import RowsEmitter


class ColumnEmitter(RowsEmitter):
    compute_params = "uint64_t o, uint64_t j, uint32_t n"
    full_extent = "t.outer * t.mid * t.inner"
    has_mid = True
    reduced_extent = "outer * inner"

    reduced_tile = True

    def reduced_output_global(self, k, t):
        return f"    out{k}Gm.SetGlobalBuffer((__gm__ {t}*)out{k}, t.outer * t.inner);"

    def reduced_queue_bytes(self, t):
        return f"t.tileLength * sizeof({t})"

    def process(self, ctx):
        return """\
    for (uint64_t g = firstTile; g < lastTile; ++g) {
      const uint64_t o = g / tilesPerRow;  // outer index
      const uint64_t col = (g % tilesPerRow) * tileLength;  // inner offset
      const uint32_t n = static_cast<uint32_t>(inner - col < tileLength ? inner - col : tileLength);
      for (uint64_t j = 0; j < mid; ++j) {  // the reduced (mid) axis, accumulated element-wise
        const uint64_t off = (o * mid + j) * inner + col;
        CopyIn(off, col, n);
        Compute(o, j, n);
        CopyOut(off, n);
      }
      ItemEnd(o * inner + col, n);
    }"""

    def describe(self):
        plan = self.plan
        return (f"column reduce: the iteration shape as [outer, mid, inner] = axes [0, {plan.split}), "
                f"[{plan.split}, {plan.split2}) reduced, [{plan.split2}, rank); inputs full")

    def host_tiling(self, ub):
        n = self.name
        tiling_fn, tiling_call = self.mid_host_tiling(ub, rows=False)
        in_bytes = "\n".join(f"  bytes[{k}] = a->total * {n}_IN_SIZES[{k}];" for k in range(len(self.plan.in_types)))
        return tiling_fn, tiling_call, in_bytes

    def tail_functions(self, ctx) -> str:
        """Column schedule: the mid axis is done for the item's inner chunk: finish Mean, write
        each reduced output's chunk."""
        plan = self.plan
        lines = ["    PipeBarrier<PIPE_V>();", "    const int32_t cn = static_cast<int32_t>((n + ALIGN - 1) / ALIGN * ALIGN);"]
        lines += [f"    LocalTensor<{plan.acc_type(a)}> f{a} = foldBuf{a}.Get<{plan.acc_type(a)}>();"
                  for a in plan.folds]
        for a, op in plan.reductions:
            if op == "Mean":  # float only (i32 Mean is refused): one rounding more than a division
                lines += [f"    Muls(f{a}, f{a}, 1.0f / static_cast<float>(mid), cn);", "    PipeBarrier<PIPE_V>();"]

        def convert(k, t):
            a = plan.acc_of[self.p.outputs[k].ref.index]
            at = plan.acc_type(a)
            return (f"Muls(r{k}, f{a}, 1.0f, cn);" if t == at == "float"
                    else f"Adds(r{k}, f{a}, static_cast<int32_t>(0), cn);" if t == at
                    else f"Cast(r{k}, f{a}, RoundMode::CAST_RINT, cn);")

        def copy(k, t):
            return f"""\
    if ((n * sizeof({t})) % 32 == 0) {{
      DataCopy(out{k}Gm[ro], r{k}, n);
    }} else {{
      DataCopyExtParams copy{k}{{1, static_cast<uint32_t>(n * sizeof({t})), 0, 0, 0}};
      DataCopyPad(out{k}Gm[ro], r{k}, copy{k});
    }}"""

        lines += self.reduced_writes(self.reduced_out, convert, copy)
        return ("  // The item's mid axis is done: finish Mean, write each reduced output's chunk at ro.\n"
                "  __aicore__ inline void ItemEnd(uint64_t ro, uint32_t n) {\n" + "\n".join(lines) + "\n  }\n")

