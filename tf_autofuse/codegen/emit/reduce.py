"""The reduce schedule: rows of [outer, inner] reduced over the inner axes.

Each tile's part of a row is reduced (ReduceSum/Max/Min) into a 32-byte row accumulator, or folded
element-wise into a tile accumulator (Prod, i32); at the row's end RowEnd finishes Mean and the
folds, computes the arithmetic on reduced values on one lane and writes each reduced output's
element. Full values that read a reduced value need the row again: then the schedule makes
several passes over each row (Compute<q>, RowEnd<q>), keeping a one-tile row resident in UB.
"""

from __future__ import annotations

from .. import opmap
from .base import patterns_text
from .broadcast import ROWS_PROCESS, RowsEmitter


class ReduceEmitter(RowsEmitter):
    compute_params = "uint64_t o, uint64_t j, uint32_t n"

    def reduced_output_global(self, k, t):
        return f"    out{k}Gm.SetGlobalBuffer((__gm__ {t}*)out{k}, t.outer);"

    def process(self, ctx):
        P = self.plan.n_passes
        if P == 1:
            process = ROWS_PROCESS.replace("      Compute(o, n);", "      const uint64_t j = g % tilesPerRow;\n      Compute(o, j, n);")
            return process.replace("      CopyOut(off, n);\n",
                                   "      CopyOut(off, n);\n      if (j + 1 == tilesPerRow) RowEnd(o);\n")
        # whole rows a block: a row of one tile stays in UB for every pass, a longer row is re-read
        # from GM in every pass
        resident, loops = [], []
        for q in range(P):
            out = "\n          CopyOut(off, n);" if q + 1 == P else ""
            resident.append(f"        Compute{q}(o, 0, n{ctx.tile_args});{out.replace('    ', '  ', 1)}"
                            f"\n        RowEnd{q}(o);")
            loops.append(f"""\
        for (uint64_t j = 0; j < tilesPerRow; ++j) {{
          const uint64_t col = j * tileLength;
          const uint64_t off = o * inner + col;
          const uint32_t n = static_cast<uint32_t>(inner - col < tileLength ? inner - col : tileLength);
          CopyIn(off, col, n);{ctx.deque.replace("{ind}", "          ")}
          Compute{q}(o, j, n{ctx.tile_args});{ctx.free.replace("{ind}", "          ")}{out}
        }}
        RowEnd{q}(o);""")
        return (
            "    for (uint64_t o = firstTile / tilesPerRow; o < lastTile / tilesPerRow; ++o) {\n"
            "      if (tilesPerRow == 1) {  // the row fits in one tile: read once, every pass in UB\n"
            "        const uint64_t off = o * inner;\n"
            "        const uint32_t n = static_cast<uint32_t>(inner);\n"
            "        CopyIn(off, 0, n);" + ctx.deque.replace("{ind}", "        ") + "\n"
            + "\n".join(resident) + ctx.free.replace("{ind}", "        ") + "\n"
            "      } else {  // every pass reads the row's tiles from GM again\n"
            + "\n".join(loops) + "\n      }\n    }")

    def tail_functions(self, ctx):
        return "".join(self.row_end_source(q) for q in range(self.plan.n_passes))

    def describe(self):
        plan = self.plan
        text = f"reduce (inner axes reduced), outer axes [0, {plan.split}), inputs {patterns_text(plan.patterns)}"
        if plan.n_passes > 1:
            text += f"; {plan.n_passes} passes over each row (re-read from GM)"
        return text

    def row_end_source(self, q: int) -> str:
        plan = self.plan
        P = plan.n_passes
        final = q + 1 == P
        lines = ["    PipeBarrier<PIPE_V>();"]
        lines += [f"    LocalTensor<{plan.acc_type(a)}> acc{a} = accBuf{a}.Get<{plan.acc_type(a)}>();"
                  for a, _ in plan.reductions]
        lines += [f"    LocalTensor<{plan.acc_type(a)}> f{a} = foldBuf{a}.Get<{plan.acc_type(a)}>();"
                  for a in plan.folds]
        for a in plan.folds:
            if plan.pass_of[plan.acc_inst(a)] != q:
                continue
            inst = self.p.insts[plan.acc_inst(a)]
            at = plan.acc_type(a)
            mean = ("\n    v = static_cast<int32_t>(static_cast<int64_t>(v) / static_cast<int64_t>(inner));"
                    if inst.op == "Mean" else "")
            lines.append(f"""\
    {{  // finish %{plan.acc_inst(a)} = {inst.op}: halve the tile accumulator to 8 lanes, fold those on the scalar unit
      uint32_t len = tileLength, span = 8;
      while (span * 2 <= len) span *= 2;
      if (len > span) {{
        {opmap.FOLD_OP[inst.op]}(f{a}, f{a}, f{a}[span], static_cast<int32_t>(len - span));
        PipeBarrier<PIPE_V>();
      }}
      for (span /= 2; span >= 8; span /= 2) {{
        {opmap.FOLD_OP[inst.op]}(f{a}, f{a}, f{a}[span], static_cast<int32_t>(span));
        PipeBarrier<PIPE_V>();
      }}
      SetFlag<HardEvent::V_S>(EVENT_ID0);
      WaitFlag<HardEvent::V_S>(EVENT_ID0);
      {at} v = f{a}.GetValue(0);
      for (uint32_t i = 1; i < 8; ++i) {{
        const {at} x = f{a}.GetValue(i);
        {opmap.FOLD_SCALAR[opmap.FOLD_OP[inst.op]]}
      }}{mean}
      acc{a}.SetValue(0, v);
      SetFlag<HardEvent::S_V>(EVENT_ID0);
      WaitFlag<HardEvent::S_V>(EVENT_ID0);
    }}""")
        means = [a for a, op in plan.reductions if op == "Mean" and plan.pass_of[plan.acc_inst(a)] == q
                 and a not in plan.folds]
        if means:
            lines += ["    LocalTensor<float> tmp = rowTmp.Get<float>();",
                      "    Duplicate(tmp, static_cast<float>(inner), 8);", "    PipeBarrier<PIPE_V>();"]
            lines += [f"    Div(acc{a}, acc{a}, tmp, 1);\n    PipeBarrier<PIPE_V>();" for a in means]
        if plan.row_bufs:
            lines += [f"    LocalTensor<float> rv{i} = rowBuf{i}.Get<float>();" for i in range(plan.row_bufs)]
        if plan.row_bodies[q]:
            lines += [f"    {stmt}" for stmt in plan.row_bodies[q]]
            lines.append("    PipeBarrier<PIPE_V>();")
        scalars = sorted(k for k in plan.scalars if plan.pass_of[k] == q)
        if scalars:  # the vector results, read by the scalar unit: V -> S synchronisation
            lines += ["    SetFlag<HardEvent::V_S>(EVENT_ID0);", "    WaitFlag<HardEvent::V_S>(EVENT_ID0);"]
            lines += [f"    rs{k} = {plan.reduced_value(k)}.GetValue(0);" for k in scalars]

        def convert(k, t):
            value = plan.reduced_value(self.p.outputs[k].ref.index)
            return (f"Muls(r{k}, {value}, 1.0f, 8);" if t == "float"
                    else f"Adds(r{k}, {value}, static_cast<int32_t>(0), 8);" if t == "int32_t"
                    else f"Cast(r{k}, {value}, RoundMode::CAST_RINT, 8);")

        def copy(k, t):
            return (f"    DataCopyExtParams copy{k}{{1, static_cast<uint32_t>(sizeof({t})), 0, 0, 0}};\n"
                    f"    DataCopyPad(out{k}Gm[o], r{k}, copy{k});")

        if final:
            lines += self.reduced_writes(self.reduced_out, convert, copy)
        name = "RowEnd" if P == 1 else f"RowEnd{q}"
        what = ("finish Mean, compute on the reduced values, write each reduced output's element"
                if P == 1 else
                f"pass {q} of the row is done: finish its Mean, compute on its reduced values"
                + (", read the ones later passes broadcast" if scalars else "")
                + (", write each reduced output's element" if final else ""))
        return (f"  // {what}.\n"
                f"  __aicore__ inline void {name}(uint64_t o) {{\n" + "\n".join(lines) + "\n  }\n")
