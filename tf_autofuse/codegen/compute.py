"""What one tile computes: the per-tile vector instructions of a fused program, for any schedule.

`ComputePlan(program, blacklist, schedule).plan()` walks the program once per pass over a row and
fills in, for the emitters (emit/), the Compute statements of each pass (`bodies`), the scratch
slots and their typed views, the row accumulators and fold buffers of reductions, RowEnd's
arithmetic on reduced values (`row_bodies`, one lane, on 32-byte row buffers) and the advanced-math
temp buffer. 16-bit inputs are Cast up to fp32 on first use (bool: uint8 0/1 -> fp32 0/1 tiles),
values are written straight into their output tile where they can be, and blacklisted f16 ops
compute in half. An op that cannot be lowered raises Refused with the reason.
"""

from __future__ import annotations

from . import ir, opmap, schedule as _schedule
from .kernel import CTYPE, STORAGE


class Refused(Exception):
    """The program cannot be generated; the message says why."""


class ComputePlan:
    def __init__(self, program: ir.Program, blacklist: frozenset, sched: _schedule.Schedule,
                 wide_inputs=frozenset(), given=None):
        self.p, self.blacklist, self.schedule = program, blacklist, sched
        # inputs whose tile arrives in UB already in their compute type (a MatMul's float C block)
        self.wide_inputs = frozenset(wide_inputs)
        # instructions whose value arrives in UB computed (instruction -> its float tensor: a
        # MatMul's C block with the bias the cube added): not emitted
        self.given = dict(given or {})
        self.split = sched.split
        self.split2 = sched.split2
        self.column = sched.kind == _schedule.COLUMN  # [outer, mid (reduced), inner]: items walk mid
        self.patterns = sched.patterns
        # 3-level broadcast patterns: "f"/"b" (full / broadcast) for outer, mid, inner
        self.bcast3 = sched.kind == _schedule.BROADCAST3
        self.queued = [pat in ("full", "row") or (len(pat) == 3 and pat[2] == "f") for pat in self.patterns]
        self.reduce = program.has_reduction
        self.reductions: list = []  # (accumulator index, op)
        self.acc_of: dict = {}  # instruction index -> accumulator index
        self.folds: list = []  # accumulators of fold reductions (FOLD_OP): tile-sized foldBuf<a>
        # arithmetic on reduced values, done once a row in RowEnd on 32-byte buffers (rowBuf<i>)
        self.row_bodies: list = []  # per pass: RowEnd statements
        self.row_pass = 0  # the pass whose RowEnd _row_vec appends to
        self.row_bufs = 0
        self.row_loc: dict = {}  # instruction index -> the rowBuf view holding its value
        self.free: list = []
        self.slots = 0
        self.views: dict = {}  # (slot, ctype) -> C++ name of the view
        self.body: list = []  # statements of Compute (the pass being emitted)
        self.bodies: list = []  # per pass: statements of Compute<pass>
        # passes over each row (reduce schedule): a value over the full shape that reads a reduced
        # value is computed in a pass after the one finishing that value; the row is re-read from
        # GM in every pass
        self.n_passes = 1
        self.pass_of: dict = {}  # reduced instruction -> the pass at whose row end it is known
        self.scalars: set = set()  # reduced values read over the full shape: rs<k> scalars
        self.half_ops: list = []
        self.shared_tmp = (0, 0)  # advanced math: (bytes per tile element, extra bytes) of sharedTmp


    # ---- scratch slots (TBufs of tile * 4 bytes) ------------------------------------------
    def _alloc(self) -> int:
        if self.free:
            return self.free.pop()
        self.slots += 1
        return self.slots - 1

    def _release(self, slot: int):
        self.free.append(slot)
        self.free.sort(reverse=True)

    def _view(self, slot: int, ctype: str) -> str:
        key = (slot, ctype)
        if key not in self.views:
            suffix = {"float": "", "int32_t": "i", "half": "h", "bfloat16_t": "b", "uint8_t": "u"}[ctype]
            self.views[key] = f"c{slot}{suffix}"
        return self.views[key]

    def _vec(self, *statements):
        for s in statements:
            if self.body and self.body[-1] != "PipeBarrier<PIPE_V>();":
                self.body.append("PipeBarrier<PIPE_V>();")
            self.body.append(s)

    # ---- planning ------------------------------------------------------------------------
    def plan(self) -> "ComputePlan":
        p = self.p
        output_refs = [o.ref for o in p.outputs]
        self.in_types = [CTYPE[i.dtype] for i in p.inputs]
        out_types = self.out_types = [CTYPE[p.ref_dtype(r)] for r in output_refs]
        out_reduced = [r.kind == "%" and p.insts[r.index].reduced for r in output_refs]
        self.out_reduced = out_reduced
        self._plan_passes(output_refs)
        for k, inst in enumerate(p.insts):  # arithmetic on reduced values: once a row, in RowEnd
            if self.reduce and inst.reduced and inst.op not in ir.REDUCTIONS:
                self._row_end_inst(k, inst)
        for q in range(self.n_passes):
            final = q + 1 == self.n_passes
            keep = output_refs if final else []
            needed = self._cone(q, keep)
            last_use = {}
            for k in needed:
                for o in p.insts[k].operands:
                    if isinstance(o, ir.Ref):
                        last_use[o] = k
            # where each value lives: (C++ tensor expression, ctype, slot or None)
            loc: dict = {}
            for k, inp in enumerate(p.inputs):
                if k in self.wide_inputs and self.queued[k]:
                    loc[ir.Ref("in", k)] = (f"x{k}", STORAGE[inp.dtype], None)
                elif STORAGE[inp.dtype] == CTYPE[inp.dtype] and self.queued[k]:
                    loc[ir.Ref("in", k)] = (f"x{k}", CTYPE[inp.dtype], None)
            for k, expr in self.given.items():
                loc[ir.Ref("%", k)] = (expr, STORAGE[p.insts[k].dtype], None)
            # values written straight into their output tensor (the final pass writes the outputs)
            direct = {}
            for j, ref in enumerate(keep):
                if (ref.kind == "%" and ref.index not in self.given and output_refs.count(ref) == 1
                        and not p.insts[ref.index].reduced
                        and STORAGE[p.insts[ref.index].dtype] == out_types[j]):
                    direct[ref] = j
            self.free = sorted(range(self.slots), reverse=True)  # every pass reuses the scratch slots
            self.body = []
            for k in needed:
                if k not in self.given:
                    self._emit(k, p.insts[k], loc, direct, last_use, keep)
            if final:
                self._write_outputs(loc, direct, output_refs, out_types, out_reduced)
            self.bodies.append(self.body)
        return self

    def _plan_passes(self, output_refs):
        """Accumulators, and the pass of every reduced value: a reduction whose operand reads
        reduced values of pass q is accumulated in pass q + 1 (variance after mean; softmax's
        sum after max); the full outputs are written in the last pass."""
        p = self.p
        need = {}  # full value -> the first pass that can compute it

        def need_of(o):
            if o.kind == "in":
                return 0
            return self.pass_of[o.index] + 1 if p.insts[o.index].reduced else need[o.index]

        for k, inst in enumerate(p.insts):
            refs = [o for o in inst.operands if isinstance(o, ir.Ref)]
            if inst.op in ir.REDUCTIONS:
                self.acc_of[k] = len(self.reductions)
                if opmap.is_fold(inst) or self.column:
                    self.folds.append(len(self.reductions))
                self.reductions.append((len(self.reductions), inst.op))
                self.pass_of[k] = need_of(refs[0])
            elif self.reduce and inst.reduced:
                self.pass_of[k] = max(self.pass_of[o.index] for o in refs)
            else:
                need[k] = max([need_of(o) for o in refs], default=0)
        last = [self.pass_of[k] + 1 for k, inst in enumerate(p.insts) if inst.op in ir.REDUCTIONS]
        last += [need_of(r) + 1 for r in output_refs if not (r.kind == "%" and p.insts[r.index].reduced)]
        self.n_passes = max(last + [1])
        self.row_bodies = [[] for _ in range(self.n_passes)]

    def _cone(self, q, output_refs):
        """Instructions Compute<q> evaluates per tile, in order: the reductions of pass q, the
        full outputs (the last pass) and the full values they read."""
        p = self.p
        stack = [k for k, inst in enumerate(p.insts) if inst.op in ir.REDUCTIONS and self.pass_of[k] == q]
        stack += [r.index for r in output_refs if r.kind == "%" and not p.insts[r.index].reduced]
        needed = set()
        while stack:
            k = stack.pop()
            if k in needed:
                continue
            needed.add(k)
            stack += [o.index for o in p.insts[k].operands
                      if isinstance(o, ir.Ref) and o.kind == "%" and not p.insts[o.index].reduced]
        return sorted(needed)

    def _emit(self, k, inst, loc, direct, last_use, output_refs):
        """Compute statements of %k for one tile (the current pass)."""
        ctype = STORAGE[inst.operand_dtype]
        if inst.op in ir.REDUCTIONS:
            self._reduce(k, inst, ctype, loc)
            o = inst.operands[0]
            if last_use.get(o) == k and o not in output_refs:
                self._drop(o, loc)
            return
        if self.reduce and inst.reduced:
            return  # arithmetic on reduced values: RowEnd
        mapping = opmap.lookup(inst.op)
        why = opmap.refusal(inst.op, ctype)
        if why:
            raise Refused(f"%{k} = {why}")
        exec_type = ctype
        if inst.op in self.blacklist and inst.operand_dtype == "f16" and "half" in mapping.types:
            exec_type = "half"
            self.half_ops.append(f"%{k} = {inst.op}")
        if mapping.shared_tmp:
            self.shared_tmp = tuple(max(a, b) for a, b in zip(self.shared_tmp, mapping.shared_tmp))
        srcs, scratch = [], []
        for pos, o in enumerate(inst.operands):
            if isinstance(o, ir.Ref):
                srcs.append(self._operand(o, loc))
            else:
                # an immediate: Select's condition is a bool (float 0/1 tile), others exec_type
                imm_type = STORAGE["bool"] if inst.op == "Select" and pos == 0 else exec_type
                slot = self._alloc()
                scratch.append(slot)
                view = self._view(slot, imm_type)
                self._vec(f"Duplicate({view}, {opmap.lit(imm_type, o)}, cn);")
                srcs.append((view, imm_type))
        # operands in the execution type
        args = []
        for pos, (expr, t) in enumerate(srcs):
            if t == exec_type or (inst.op == "Select" and pos == 0):
                args.append(expr)
            else:  # float -> half for a blacklisted op
                slot = self._alloc()
                scratch.append(slot)
                view = self._view(slot, exec_type)
                self._vec(f"Cast({view}, {expr}, RoundMode::CAST_RINT, cn);")
                args.append(view)
        temps = []
        for _ in range(opmap.temps_for(mapping, exec_type)):
            slot = self._alloc()
            scratch.append(slot)
            temps.append(self._view(slot, exec_type))
        ref = ir.Ref("%", k)
        vtype = STORAGE[inst.dtype]  # the value's compute type (bool: float 0/1)
        if ref in direct:
            dst, dst_slot = f"y{direct[ref]}", None
        else:
            dst_slot = self._alloc()
            dst = self._view(dst_slot, vtype)
        extra = {"alpha": opmap.alpha_of(inst.attrs)} if inst.op == "LeakyRelu" else {}
        if inst.op == "Cast":
            extra = {"to": inst.attrs.get("to")}
        if exec_type == ctype:
            self._vec(*mapping.emit(exec_type, dst, args, "cn", temps, **extra))
        else:
            hslot = self._alloc()
            scratch.append(hslot)
            hdst = self._view(hslot, exec_type)
            self._vec(*mapping.emit(exec_type, hdst, args, "cn", temps, **extra))
            self._vec(f"Cast({dst}, {hdst}, RoundMode::CAST_NONE, cn);")
        loc[ref] = (dst, vtype, dst_slot)
        for slot in scratch:
            self._release(slot)
        for o in set(x for x in inst.operands if isinstance(x, ir.Ref)):
            if last_use.get(o) == k and o not in output_refs:
                self._drop(o, loc)

    def _reduce(self, k, inst, ctype, loc):
        """This tile's part of reduction %k, into its accumulator."""
        acc = self.acc_of[k]
        src, _ = self._operand(inst.operands[0], loc)
        if self.column:  # element-wise over the mid axis (j: its index)
            first = (f"Muls(f{acc}, {src}, 1.0f, cn);" if ctype == "float"
                     else f"Adds(f{acc}, {src}, static_cast<int32_t>(0), cn);")
            self._vec(f"if (j == 0) {{ {first} }} else {{ {opmap.FOLD_OP[inst.op]}(f{acc}, f{acc}, {src}, cn); }}")
            loc[ir.Ref("%", k)] = (f"f{acc}", ctype, None)
        elif opmap.is_fold(inst):  # element-wise into the tile accumulator (identity lanes past the row)
            self._vec(f"if (j == 0) {{ Duplicate(f{acc}, {opmap.FOLD_IDENTITY[(inst.op, ctype)]}, "
                      "static_cast<int32_t>(tileLength)); PipeBarrier<PIPE_V>(); }")
            self._vec(f"{opmap.FOLD_OP[inst.op]}(f{acc}, f{acc}, {src}, static_cast<int32_t>(n));")
            loc[ir.Ref("%", k)] = (f"acc{acc}", ctype, None)
        else:  # a vector reduce of the tile, folded into the row accumulator
            part, tmp = self._alloc(), self._alloc()
            pv, tv = self._view(part, "float"), self._view(tmp, "float")
            self._vec(f"{opmap.REDUCE_API[inst.op]}({pv}, {src}, {tv}, static_cast<int32_t>(n));")
            self._vec(f"if (j == 0) {{ Muls(acc{acc}, {pv}, 1.0f, 1); }} "
                      f"else {{ {opmap.ACCUMULATE[inst.op]}(acc{acc}, acc{acc}, {pv}, 1); }}")
            self._release(part)
            self._release(tmp)
            loc[ir.Ref("%", k)] = (f"acc{acc}", "float", None)

    def _write_outputs(self, loc, direct, output_refs, out_types, out_reduced):
        p = self.p
        # outputs not written in place
        for j, ref in enumerate(output_refs):
            if out_reduced[j]:
                continue  # written once a row, in RowEnd
            if ref in direct and loc[ref][0] == f"y{j}":
                continue
            if (ref.kind == "in" and self.queued[ref.index]
                    and CTYPE[p.inputs[ref.index].dtype] == out_types[j]):
                expr, t = f"x{ref.index}", out_types[j]
            else:
                expr, t = self._operand(ref, loc)
            if t == out_types[j]:
                self._vec(f"DataCopy(y{j}, {expr}, cn);")
            elif out_types[j] == "uint8_t":  # bool: float 0/1 -> half -> uint8 0/1 (exact)
                slot = self._alloc()
                view = self._view(slot, "half")
                self._vec(f"Cast({view}, {expr}, RoundMode::CAST_RINT, cn);",
                          f"Cast(y{j}, {view}, RoundMode::CAST_RINT, cn);")
                self._release(slot)
            else:
                self._vec(f"Cast(y{j}, {expr}, RoundMode::CAST_RINT, cn);")

    def _operand(self, ref, loc):
        """The tensor holding `ref` in its compute type; 16-bit inputs are Cast up on first use."""
        if ref not in loc and ref.kind == "in" and not self.queued[ref.index]:
            # a broadcast column / scalar: one GM element for the whole tile
            ctype = STORAGE[self.p.inputs[ref.index].dtype]
            slot = self._alloc()
            view = self._view(slot, ctype)
            index = ("o" if self.patterns[ref.index] == "col" else
                     _schedule.row_of(self.patterns, ref.index) if self.bcast3 else "0")
            self._vec(f"Duplicate({view}, static_cast<{ctype}>(in{ref.index}Gm.GetValue({index})), cn);")
            loc[ref] = (view, ctype, slot)
        if ref not in loc and ref.kind == "%":
            # a reduced value read over the full shape (a later pass): the row's scalar
            rtype = STORAGE[self.p.insts[ref.index].dtype]
            slot = self._alloc()
            view = self._view(slot, rtype)
            self._vec(f"Duplicate({view}, rs{ref.index}, cn);")
            self.scalars.add(ref.index)
            loc[ref] = (view, rtype, slot)
        if ref not in loc and ref.kind == "in" and self.p.inputs[ref.index].dtype == "bool":
            # uint8 0/1 -> half -> float 0/1 (the vector Cast has no uint8 -> float)
            tmp, slot = self._alloc(), self._alloc()
            view, hview = self._view(slot, "float"), self._view(tmp, "half")
            self._vec(f"Cast({hview}, x{ref.index}, RoundMode::CAST_NONE, cn);",
                      f"Cast({view}, {hview}, RoundMode::CAST_NONE, cn);")
            self._release(tmp)
            loc[ref] = (view, "float", slot)
        if ref not in loc:  # a 16-bit input: widen it into a scratch slot
            slot = self._alloc()
            view = self._view(slot, "float")
            self._vec(f"Cast({view}, x{ref.index}, RoundMode::CAST_NONE, cn);")
            loc[ref] = (view, "float", slot)
        expr, t, _ = loc[ref]
        return expr, t

    def _row_buf(self) -> str:
        self.row_bufs += 1
        return f"rv{self.row_bufs - 1}"

    def _row_vec(self, *statements):
        body = self.row_bodies[self.row_pass]
        for s in statements:
            if body:
                body.append("PipeBarrier<PIPE_V>();")
            body.append(s)


    # ---- what the emitters read ---------------------------------------------------------
    def acc_type(self, acc: int) -> str:
        return STORAGE[self.p.insts[self.acc_inst(acc)].operand_dtype]

    def acc_inst(self, acc: int) -> int:
        return next(k for k, a in self.acc_of.items() if a == acc)

    def reduced_value(self, index: int) -> str:
        """The tensor holding reduced value %index at the row's end (lane 0)."""
        return f"acc{self.acc_of[index]}" if index in self.acc_of else self.row_loc[index]

    def _row_end_inst(self, k: int, inst):
        """%k computed from reduced values and immediates only: once a row, in float, on one lane."""
        mapping = opmap.lookup(inst.op)
        why = opmap.refusal(inst.op, "float")
        if why:
            raise Refused(f"%{k} = {why}")
        if mapping.tile_only or inst.dtype == "bool":
            raise Refused(f"%{k} = {inst.op} on reduced values: it needs whole 256-byte repeats "
                          "(Compare) or a tile-sized temp buffer, not the one lane of RowEnd (on a "
                          "full-shape value reading a reduced one, in a later pass, it is generated)")
        self.row_pass = self.pass_of[k]
        args = []
        for o in inst.operands:
            if isinstance(o, ir.Ref):
                args.append(self.reduced_value(o.index))
            else:
                view = self._row_buf()
                self._row_vec(f"Duplicate({view}, {opmap.lit('float', o)}, 1);")
                args.append(view)
        temps = [self._row_buf() for _ in range(opmap.temps_for(mapping, "float"))]
        dst = self._row_buf()
        extra = {"alpha": opmap.alpha_of(inst.attrs)} if inst.op == "LeakyRelu" else {}
        self._row_vec(*mapping.emit("float", dst, args, "1", temps, **extra))
        self.row_loc[k] = dst

    def _drop(self, ref, loc):
        expr, t, slot = loc.get(ref, (None, None, None))
        if slot is not None:
            self._release(slot)
            del loc[ref]

