"""The kernel every schedule shares, and the hooks by which a schedule says how it walks the data.

An emitter turns a planned ComputePlan (compute.py) into the three sources of a Kernel:

    <name>_tiling.h    the tiling-data struct
    <name>_kernel.cpp  the device kernel: CopyIn (GM -> VECIN queues), Compute (the plan's
                       statements), CopyOut (VECOUT queues -> GM), and the schedule's own row or
                       item functions, inside the standard AIV entry point
    <name>_host.cpp    the host tiling function and the ACL launcher

The subclasses (flat.py, broadcast.py, reduce.py, column.py) give the schedule's parts: where an
input is read from, the tile loop, the tiling function and its call.

Queues keep to the framework's limits (docs/ASCEND.md, "How it is verified"; enforced by the twin):
each queue position (VECIN, VECOUT) has 8 event IDs per event type, and every buffer of a queue
holds one from its FreeTensor to its next AllocTensor, so a position may have at most 8 buffers;
one TPipe manages at most 64 buffers. While they fit, every queued input and every output has its
own double-buffered queue; past 8 buffers in a position, its tiles share one depth-1 queue of two
buffers (TQue<pos, 1> with two buffers is double buffering), one 32-byte-aligned section per
tensor. A kernel that would still need more than 64 buffers is refused with the count.
"""

from __future__ import annotations

from .. import tiling
from ..compute import ComputePlan, Refused
from ..kernel import SIZE, STORAGE, Kernel


MAX_POSITION_BUFFERS = 8  # buffers per queue position: the event IDs of one type (Atlas A2)
MAX_PIPE_BUFFERS = 64  # buffers one TPipe manages, queues and TBufs together


class Emitter:
    # the Compute function's parameters (the tile loop's variables it reads)
    compute_params = "uint32_t n"
    copy_in_params = "uint64_t off, uint32_t n"
    reduced_tile = False  # a reduced output's queue section: a tile (column) or 32 bytes (a row's value)

    def __init__(self, name: str, plan: ComputePlan):
        self.name, self.plan, self.p = name, plan, plan.p
        self.queued_in = [k for k in range(len(plan.in_types)) if plan.queued[k]]
        self.full_out = [k for k in range(len(plan.out_types)) if not plan.out_reduced[k]]
        self.reduced_out = [k for k in range(len(plan.out_types)) if plan.out_reduced[k]]
        self.shared_in = tiling.BUFFER_NUM * len(self.queued_in) > MAX_POSITION_BUFFERS
        self.shared_out = (tiling.BUFFER_NUM * (len(self.full_out) + len(self.reduced_out))
                           > MAX_POSITION_BUFFERS)

    # ---- sections of the shared queues ---------------------------------------------------------
    def _prefix(self, ks, types, k) -> int:
        """Bytes per tile element before tensor k's section."""
        return sum(SIZE[types[j]] for j in ks[:ks.index(k)])

    def in_view(self, k: int, t: str) -> str:
        return f"LocalTensor<{t}> x{k} = xs[tileLength * {self._prefix(self.queued_in, self.plan.in_types, k)}].ReinterpretCast<{t}>();"

    def out_view(self, k: int, t: str) -> str:
        return f"LocalTensor<{t}> y{k} = ys[tileLength * {self._prefix(self.full_out, self.plan.out_types, k)}].ReinterpretCast<{t}>();"

    def reduced_view(self, k: int, t: str) -> str:
        if self.reduced_tile:
            at = f"tileLength * {self._prefix(self.reduced_out, self.plan.out_types, k)}"
        else:
            at = str(32 * self.reduced_out.index(k))
        return f"LocalTensor<{t}> r{k} = rowOut[{at}].ReinterpretCast<{t}>();"

    def _bytes(self, ks, types) -> int:
        return sum(SIZE[types[k]] for k in ks)

    def buffer_count(self) -> int:
        """Buffers the TPipe manages: every queue's, every TBuf."""
        plan = self.plan
        queues = (1 if self.shared_in else len(self.queued_in))
        if self.shared_out:
            queues += bool(self.full_out) + bool(self.reduced_out)
        else:
            queues += len(self.full_out) + len(self.reduced_out)
        tbufs = (plan.slots + len(plan.folds) + bool(plan.shared_tmp[0]) + len(plan.reductions)
                 + self.has_mean + plan.row_bufs)
        return tiling.BUFFER_NUM * queues + tbufs

    # ---- schedule hooks ------------------------------------------------------------------
    def input_global(self, k: int, t: str) -> str:
        """Init: the SetGlobalBuffer of input k."""
        raise NotImplementedError

    def output_global(self, k: int, t: str) -> str:
        """Init: the SetGlobalBuffer of a full (not reduced) output k."""
        raise NotImplementedError

    def reduced_output_global(self, k: int, t: str) -> str:
        """Init: the SetGlobalBuffer of a reduced output (reduce schedules only)."""
        raise Refused("reduced outputs need a reduce schedule")

    def reduced_queue_bytes(self, t: str) -> str:
        """The bytes of one buffer of a reduced output's own queue."""
        return "32"

    def input_offset(self, k: int) -> str:
        """CopyIn: the GM offset of input k's tile."""
        return "off"

    def prelude(self) -> str:
        raise NotImplementedError

    def process(self, ctx) -> str:
        raise NotImplementedError

    def state(self) -> str:
        raise NotImplementedError

    def tail_functions(self, ctx) -> str:
        """Functions after CopyOut (RowEnd, ItemEnd): none by default."""
        return ""

    def describe(self) -> str:
        raise NotImplementedError

    def host_tiling(self, ub) -> tuple:
        """(tiling function source, the launcher's tiling call, its input byte counts)."""
        raise NotImplementedError

    reduced_extent = "outer"  # elements of a reduced output, in the launcher's variables

    # ---- the kernel ------------------------------------------------------------------------
    def kernel(self) -> Kernel:
        plan, p = self.plan, self.p
        in_types, out_types, out_reduced = plan.in_types, plan.out_types, plan.out_reduced
        ub = self.ub_plan()
        sources = {
            f"{self.name}_tiling.h": self.tiling_header(),
            f"{self.name}_kernel.cpp": self.kernel_source(in_types, out_types, ub),
            f"{self.name}_host.cpp": self.host_source(in_types, out_types, ub),
        }
        rank = 0 if plan.split is None else max(len(i.view) for i in p.inputs)
        return Kernel(self.name, p.text, True, "", sources, ub, tuple(in_types), tuple(out_types),
                      tuple(plan.half_ops), plan.split, tuple(plan.patterns) if plan.split is not None else (),
                      rank, tuple(out_reduced), plan.n_passes, plan.split2)

    def ub_plan(self) -> tiling.UbPlan:
        plan = self.plan
        count = self.buffer_count()
        if count > MAX_PIPE_BUFFERS:
            raise Refused(f"needs {count} UB buffers (queues and TBufs), one TPipe manages at most "
                          f"{MAX_PIPE_BUFFERS}")
        names = lambda ks, what: ", ".join(f"{what}{k}" for k in ks)  # noqa: E731
        if self.shared_in:
            buffers = [(f"inputs queue ({names(self.queued_in, 'in')})",
                        self._bytes(self.queued_in, plan.in_types), tiling.BUFFER_NUM)]
        else:
            buffers = [(f"in{k} queue", SIZE[plan.in_types[k]], tiling.BUFFER_NUM) for k in self.queued_in]
        outs = [k for k in range(len(plan.out_types)) if not plan.out_reduced[k] or plan.column]
        if self.shared_out:
            groups = [ks for ks in (self.full_out, self.reduced_out if plan.column else []) if ks]
            buffers += [(f"outputs queue ({names(ks, 'out')})", self._bytes(ks, plan.out_types),
                         tiling.BUFFER_NUM) for ks in groups]
        else:
            buffers += [(f"out{k} queue", SIZE[plan.out_types[k]], tiling.BUFFER_NUM) for k in outs]
        buffers += [(f"scratch{s}", 4, 1) for s in range(plan.slots)]
        buffers += [(f"fold{a}", 4, 1) for a in plan.folds]
        if plan.shared_tmp[0]:
            buffers.append(("sharedTmp (advanced math)", plan.shared_tmp[0], 1))
        fixed = 32 * len(plan.reductions) + (0 if plan.column else 32 * tiling.BUFFER_NUM * sum(plan.out_reduced))
        fixed += plan.shared_tmp[1]
        fixed += 32 if any(op == "Mean" for _, op in plan.reductions) else 0
        fixed += 32 * plan.row_bufs
        ub = tiling.plan_ub(buffers, fixed)
        if ub.max_tile < tiling.ALIGN_ELEMS:
            raise Refused(f"does not fit in UB: {ub.bytes_per_element} bytes per element, "
                          f"{tiling.ALIGN_ELEMS} elements need more than the "
                          f"{tiling.UB_BUDGET}-byte budget")
        return ub

    def tiling_header(self) -> str:
        guard = f"{self.name.upper()}_TILING_H_"
        return (f"// Tiling data of {self.name}: computed on the host, read by the kernel.\n"
                f"#ifndef {guard}\n#define {guard}\n#include <cstdint>\n\n"
                f"{tiling.cpp_struct(self.name + '_TilingData', self.plan.split is not None, self.plan.split2 is not None)}\n"
                f"#endif  // {guard}\n")

    def members(self, in_types, out_types) -> list:
        plan = self.plan
        members = []
        if self.shared_in:
            members.append("  TQue<TPosition::VECIN, 1> inQue;  // the tiles of "
                           + ", ".join(f"in{k}" for k in self.queued_in) + ", a section each")
        for k, t in enumerate(in_types):
            if plan.queued[k] and not self.shared_in:
                members.append(f"  TQue<TPosition::VECIN, BUFFER_NUM> inQue{k};")
            members.append(f"  GlobalTensor<{t}> in{k}Gm;")
        if self.shared_out and self.full_out:
            members.append("  TQue<TPosition::VECOUT, 1> outQue;  // the tiles of "
                           + ", ".join(f"out{k}" for k in self.full_out) + ", a section each")
        if self.shared_out and self.reduced_out:
            members.append("  TQue<TPosition::VECOUT, 1> rowOutQue;  // the reduced values of "
                           + ", ".join(f"out{k}" for k in self.reduced_out) + ", a section each")
        for k, t in enumerate(out_types):
            if not self.shared_out:
                members.append(f"  TQue<TPosition::VECOUT, BUFFER_NUM> outQue{k};")
            members.append(f"  GlobalTensor<{t}> out{k}Gm;")
        members += [f"  TBuf<TPosition::VECCALC> calc{s};" for s in range(plan.slots)]
        members += [f"  TBuf<TPosition::VECCALC> foldBuf{a};  // tile accumulator" for a in plan.folds]
        if plan.shared_tmp[0]:
            members.append("  TBuf<TPosition::VECCALC> sharedTmpBuf;  // advanced math temp buffer")
        members += [f"  TBuf<TPosition::VECCALC> accBuf{a};  // row accumulator of %{op}"
                    for a, op in plan.reductions]
        if self.has_mean:
            members.append("  TBuf<TPosition::VECCALC> rowTmp;")
        members += [f"  TBuf<TPosition::VECCALC> rowBuf{i};  // arithmetic on reduced values"
                    for i in range(plan.row_bufs)]
        return members

    @property
    def has_mean(self) -> bool:
        return any(op == "Mean" for _, op in self.plan.reductions)

    def init(self, in_types, out_types) -> list:
        plan = self.plan
        init = []
        for k, t in enumerate(in_types):
            init.append(self.input_global(k, t))
            if plan.queued[k] and not self.shared_in:
                init.append(f"    pipe.InitBuffer(inQue{k}, BUFFER_NUM, t.tileLength * sizeof({t}));")
        if self.shared_in:
            init.append(f"    pipe.InitBuffer(inQue, BUFFER_NUM, t.tileLength * "
                        f"{self._bytes(self.queued_in, in_types)});")
        for k, t in enumerate(out_types):
            if plan.out_reduced[k]:
                init.append(self.reduced_output_global(k, t))
                if not self.shared_out:
                    init.append(f"    pipe.InitBuffer(outQue{k}, BUFFER_NUM, {self.reduced_queue_bytes(t)});")
                continue
            init.append(self.output_global(k, t))
            if not self.shared_out:
                init.append(f"    pipe.InitBuffer(outQue{k}, BUFFER_NUM, t.tileLength * sizeof({t}));")
        if self.shared_out and self.full_out:
            init.append(f"    pipe.InitBuffer(outQue, BUFFER_NUM, t.tileLength * "
                        f"{self._bytes(self.full_out, out_types)});")
        if self.shared_out and self.reduced_out:
            size = (f"t.tileLength * {self._bytes(self.reduced_out, out_types)}" if self.reduced_tile
                    else str(32 * len(self.reduced_out)))
            init.append(f"    pipe.InitBuffer(rowOutQue, BUFFER_NUM, {size});")
        init += [f"    pipe.InitBuffer(accBuf{a}, 32);" for a, _ in plan.reductions]
        init += [f"    pipe.InitBuffer(foldBuf{a}, t.tileLength * 4);" for a in plan.folds]
        if self.has_mean:
            init.append("    pipe.InitBuffer(rowTmp, 32);")
        init += [f"    pipe.InitBuffer(rowBuf{i}, 32);" for i in range(plan.row_bufs)]
        init += [f"    pipe.InitBuffer(calc{s}, t.tileLength * 4);" for s in range(plan.slots)]
        if plan.shared_tmp[0]:
            init.append(f"    pipe.InitBuffer(sharedTmpBuf, t.tileLength * {plan.shared_tmp[0]} + "
                        f"{plan.shared_tmp[1]});")
        return init

    def copy_ins(self, in_types) -> str:
        body = "".join(self.copy_in(k, t) for k, t in enumerate(in_types))
        if not self.shared_in:
            return body
        return ("    LocalTensor<uint8_t> xs = inQue.AllocTensor<uint8_t>();\n" + body
                + "    inQue.EnQue(xs);\n")

    def copy_outs(self, out_types) -> str:
        body = "".join(self.copy_out(k, t) for k, t in enumerate(out_types))
        if not (self.shared_out and self.full_out):
            return body
        return ("    LocalTensor<uint8_t> ys = outQue.DeQue<uint8_t>();\n" + body
                + "    outQue.FreeTensor(ys);\n")

    def copy_in(self, k: int, t: str) -> str:
        if not self.plan.queued[k]:
            return ""
        off = self.input_offset(k)
        take = (f"    {self.in_view(k, t)}\n" if self.shared_in
                else f"    LocalTensor<{t}> x{k} = inQue{k}.AllocTensor<{t}>();\n")
        give = "" if self.shared_in else f"    inQue{k}.EnQue(x{k});\n"
        return take + f"""\
    if ((n * sizeof({t})) % 32 == 0) {{
      DataCopy(x{k}, in{k}Gm[{off}], n);
    }} else {{
      DataCopyExtParams copy{{1, static_cast<uint32_t>(n * sizeof({t})), 0, 0, 0}};
      DataCopyPadExtParams<{t}> pad{{false, 0, 0, static_cast<{t}>(0)}};
      DataCopyPad(x{k}, in{k}Gm[{off}], copy, pad);
    }}
""" + give

    def copy_out(self, k: int, t: str) -> str:
        if self.plan.out_reduced[k]:
            return ""
        take = (f"    {self.out_view(k, t)}\n" if self.shared_out
                else f"    LocalTensor<{t}> y{k} = outQue{k}.DeQue<{t}>();\n")
        give = "" if self.shared_out else f"    outQue{k}.FreeTensor(y{k});\n"
        return take + f"""\
    if ((n * sizeof({t})) % 32 == 0) {{
      DataCopy(out{k}Gm[off], y{k}, n);
    }} else {{
      DataCopyExtParams copy{{1, static_cast<uint32_t>(n * sizeof({t})), 0, 0, 0}};
      DataCopyPad(out{k}Gm[off], y{k}, copy);
    }}
""" + give

    def accumulator_views(self) -> list:
        plan = self.plan
        lines = [f"    LocalTensor<{plan.acc_type(a)}> acc{a} = accBuf{a}.Get<{plan.acc_type(a)}>();"
                 for a, _ in plan.reductions]
        lines += [f"    LocalTensor<{plan.acc_type(a)}> f{a} = foldBuf{a}.Get<{plan.acc_type(a)}>();"
                  for a in plan.folds]
        return lines

    def compute_lines(self, body, final, in_types, out_types) -> list:
        plan = self.plan
        P = plan.n_passes
        # several passes: the caller DeQues and frees the input tiles (a resident row is read once)
        if self.shared_in:
            lines = ["    LocalTensor<uint8_t> xs = inQue.DeQue<uint8_t>();"] if P == 1 else []
            lines += [f"    {self.in_view(k, in_types[k])}" for k in self.queued_in]
        else:
            lines = [f"    LocalTensor<{t}> x{k} = inQue{k}.DeQue<{t}>();" for k, t in enumerate(in_types)
                     if plan.queued[k] and P == 1]
        if final and self.shared_out and self.full_out:
            lines.append("    LocalTensor<uint8_t> ys = outQue.AllocTensor<uint8_t>();")
            lines += [f"    {self.out_view(k, out_types[k])}" for k in self.full_out]
        elif final:
            lines += [f"    LocalTensor<{t}> y{k} = outQue{k}.AllocTensor<{t}>();"
                      for k, t in enumerate(out_types) if not plan.out_reduced[k]]
        lines += self.accumulator_views()
        if plan.reduce:
            lines.insert(0, "    PipeBarrier<PIPE_V>();  // the accumulators were written by the last tile")
        for (slot, ctype), view in sorted(plan.views.items()):
            lines.append(f"    LocalTensor<{ctype}> {view} = calc{slot}.Get<{ctype}>();")
        if plan.shared_tmp[0]:
            lines.append("    LocalTensor<uint8_t> sharedTmp = sharedTmpBuf.Get<uint8_t>();")
        lines += [f"    {s}" for s in body]
        if final and self.shared_out and self.full_out:
            lines.append("    outQue.EnQue(ys);")
        elif final:
            lines += [f"    outQue{k}.EnQue(y{k});" for k in range(len(out_types)) if not plan.out_reduced[k]]
        if self.shared_in and P == 1:
            lines.append("    inQue.FreeTensor(xs);")
        elif P == 1:
            lines += [f"    inQue{k}.FreeTensor(x{k});" for k in range(len(in_types)) if plan.queued[k]]
        return lines

    def reduced_writes(self, ks, convert, copy) -> list:
        """Lines that write reduced outputs ks through their queues: `convert(k, t)` fills r<k>,
        `copy(k, t)` moves it to GM."""
        types = self.plan.out_types
        if not self.shared_out:
            return [f"""\
    LocalTensor<{types[k]}> r{k} = outQue{k}.AllocTensor<{types[k]}>();
    {convert(k, types[k])}
    outQue{k}.EnQue(r{k});
    r{k} = outQue{k}.DeQue<{types[k]}>();
{copy(k, types[k])}
    outQue{k}.FreeTensor(r{k});""" for k in ks]
        if not ks:
            return []
        lines = ["    LocalTensor<uint8_t> rowOut = rowOutQue.AllocTensor<uint8_t>();"]
        lines += [f"    {{\n      {self.reduced_view(k, types[k])}\n      {convert(k, types[k])}\n    }}" for k in ks]
        lines += ["    rowOutQue.EnQue(rowOut);", "    rowOut = rowOutQue.DeQue<uint8_t>();"]
        lines += [f"    {{\n      {self.reduced_view(k, types[k])}\n"
                  + copy(k, types[k]).replace("\n    ", "\n      ").replace("    ", "      ", 1) + "\n    }"
                  for k in ks]
        lines.append("    rowOutQue.FreeTensor(rowOut);")
        return lines

    def kernel_source(self, in_types, out_types, ub) -> str:
        plan = self.plan
        n = self.name
        nin, nout = len(in_types), len(out_types)
        program = "".join(f"//   {line}\n" for line in self.p.text.splitlines())
        gm_args = ", ".join([f"GM_ADDR in{k}" for k in range(nin)] + [f"GM_ADDR out{k}" for k in range(nout)])
        gm_names = ", ".join([f"in{k}" for k in range(nin)] + [f"out{k}" for k in range(nout)])
        members = self.members(in_types, out_types)
        init = self.init(in_types, out_types)
        P = plan.n_passes
        ctx = _Tiles(in_types, plan, self.shared_in)
        cn_line = ("    const int32_t cn = static_cast<int32_t>((n + ALIGN - 1) / ALIGN * ALIGN);"
                   "  // pad lanes are don't-care\n")
        computes = []
        for q, body in enumerate(plan.bodies):
            name = "Compute" if P == 1 else f"Compute{q}"
            params = self.compute_params if P == 1 else self.compute_params + ctx.tile_params
            computes.append(f"  __aicore__ inline void {name}({params}) {{\n" + cn_line
                            + "\n".join(self.compute_lines(body, q + 1 == P, in_types, out_types)) + "\n  }\n")
        compute_src = "".join(computes)
        tail = self.tail_functions(ctx)
        half_note = ("// Computed in half (--autofuse_enhance_precision_blacklist): "
                     + ", ".join(plan.half_ops) + "\n") if plan.half_ops else ""
        return f"""\
// Generated by tf_autofuse.codegen from the fused program:
{program}// Schedule: {self.describe()}. {ub.describe()}
{half_note}#include "kernel_operator.h"
#include "{n}_tiling.h"

using namespace AscendC;

namespace {n}_impl {{
constexpr int32_t BUFFER_NUM = {tiling.BUFFER_NUM};
constexpr uint32_t ALIGN = {tiling.ALIGN_ELEMS};  // elements; whole 32-byte blocks of every dtype

class Kernel {{
 public:
  __aicore__ inline Kernel() {{}}
  __aicore__ inline void Init({gm_args}, const {n}_TilingData& t) {{
{self.prelude()}
{chr(10).join(init)}
  }}
  __aicore__ inline void Process() {{
{self.process(ctx)}
  }}

 private:
  __aicore__ inline void CopyIn({self.copy_in_params}) {{
{self.copy_ins(in_types)}  }}
{compute_src}  __aicore__ inline void CopyOut(uint64_t off, uint32_t n) {{
{self.copy_outs(out_types)}  }}
{tail}
  TPipe pipe;
{chr(10).join(members)}
{self.state()}
}};

__aicore__ inline void CopyTiling({n}_TilingData* t, GM_ADDR tiling) {{
  uint32_t* dst = reinterpret_cast<uint32_t*>(t);
  __gm__ uint32_t* src = reinterpret_cast<__gm__ uint32_t*>(tiling);
  for (uint32_t i = 0; i < sizeof({n}_TilingData) / sizeof(uint32_t); ++i) dst[i] = src[i];
}}
}}  // namespace {n}_impl

extern "C" __global__ __aicore__ void {n}({gm_args}, GM_ADDR workspace, GM_ADDR tiling) {{
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  {n}_TilingData t;
  {n}_impl::CopyTiling(&t, tiling);
  if (GetBlockIdx() >= t.blockDim) return;
  {n}_impl::Kernel op;
  op.Init({gm_names}, t);
  op.Process();
}}
"""

    def host_source(self, in_types, out_types, ub) -> str:
        n = self.name
        nin, nout = len(in_types), len(out_types)
        in_sizes = ", ".join(str(SIZE[t]) for t in in_types)
        out_sizes = ", ".join(str(SIZE[t]) for t in out_types)
        dev_args = ", ".join([f"static_cast<uint8_t*>(dev[{k}])" for k in range(nin + nout)]
                             + ["nullptr", f"static_cast<uint8_t*>(dev[{nin + nout}])"])
        tiling_fn, tiling_call, in_bytes = self.host_tiling(ub)
        out_red = self.plan.out_reduced
        out_bytes = "\n".join(f"  bytes[{nin + k}] = {self.reduced_extent if out_red[k] else 'a->total'} * {n}_OUT_SIZES[{k}];"
                              for k in range(nout))
        return f"""\
// Host side of {n}: the tiling function and the ACL launch glue.
// Build with AUTOFUSE_WITH_ACL for the launcher (needs acl/acl.h and libascendcl.so).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include "{n}_tiling.h"
#include "autofuse_launch.h"

{tiling_fn}
static const uint32_t {n}_IN_SIZES[{nin}] = {{{in_sizes}}};
static const uint32_t {n}_OUT_SIZES[{nout}] = {{{out_sizes}}};

#ifdef AUTOFUSE_WITH_ACL
#include "acl/acl.h"
#if AUTOFUSE_CANN_ROUTE == 8
#include "aclrtlaunch_{n}.h"  // generated by ascendc_library (CANN 8.0-8.4)
#endif

// Runs the kernel on host buffers: device buffers, copy in, launch with the tiling data,
// synchronise, copy out, free. 0 on success, else an ACL error code (message in a->error).
extern "C" int {n}_launch(const AutofuseLaunchArgs* a) {{
  if (a->abi_version != AUTOFUSE_LAUNCH_ABI || a->num_inputs != {nin} || a->num_outputs != {nout})
    return autofuse_launch_fail(a, -1, "{n}: bad launch arguments (ABI or tensor count)");
  aclrtStream stream = reinterpret_cast<aclrtStream>(a->stream);
  uint32_t core_num = a->core_num;
  aclError rc = autofuse_acl_prepare(a->device_id, &stream, &core_num);
  if (rc != ACL_SUCCESS) return autofuse_acl_fail(a, rc, "device setup failed");
  {n}_TilingData t;
{tiling_call}
  if (t.blockDim == 0) return 0;
  void* dev[{nin + nout + 1}] = {{}};
  uint64_t bytes[{nin + nout + 1}];
{in_bytes}
  for (int k = 0; k < {nin}; ++k)
    if (a->input_elements && a->input_elements[k] * {n}_IN_SIZES[k] != bytes[k])
      return autofuse_launch_fail(a, -1, "{n}: an input does not have the element count its view needs");
{out_bytes}
  bytes[{nin + nout}] = sizeof(t);
{launch_steps(n, nin, nout, nin + nout + 1, dev_args)}"""


class _Tiles:
    """The queued input tiles as the multi-pass loops hand them to Compute<q>: parameters,
    arguments, and the DeQue / FreeTensor lines (`{ind}`: the caller's indentation)."""

    def __init__(self, in_types, plan, shared: bool):
        queued = [(k, t) for k, t in enumerate(in_types) if plan.queued[k]]
        if shared:  # one tensor of the shared queue: Compute<q> takes its sections' views
            self.tile_params, self.tile_args = ", LocalTensor<uint8_t>& xs", ", xs"
            self.deque = "\n{ind}LocalTensor<uint8_t> xs = inQue.DeQue<uint8_t>();"
            self.free = "\n{ind}inQue.FreeTensor(xs);"
            return
        self.tile_params = "".join(f", LocalTensor<{t}>& x{k}" for k, t in queued)
        self.tile_args = "".join(f", x{k}" for k, _ in queued)
        self.deque = "".join(f"\n{{ind}}LocalTensor<{t}> x{k} = inQue{k}.DeQue<{t}>();" for k, t in queued)
        self.free = "".join(f"\n{{ind}}inQue{k}.FreeTensor(x{k});" for k, _ in queued)


def patterns_text(patterns) -> str:
    return ", ".join(f"in{k} {pat}" for k, pat in enumerate(patterns))


def launch_steps(n: str, nin: int, nout: int, total: int, dev_args: str) -> str:
    """The end of a kernel's ACL launcher, once `dev` and `bytes` describe its `total` device
    buffers (the nin inputs, the nout outputs, any buffer of the kernel's own, and last the
    tiling data `t`): allocate them, copy the inputs and the tiling in, launch with `dev_args`,
    synchronise, copy the outputs out, free; then the single-kernel entry points."""
    return f"""\
  const char* what = "aclrtMalloc";
  for (int k = 0; k < {total} && rc == ACL_SUCCESS; ++k)
    rc = aclrtMalloc(&dev[k], bytes[k], ACL_MEM_MALLOC_HUGE_FIRST);
  if (rc == ACL_SUCCESS) {{
    what = "aclrtMemcpy host->device";
    for (int k = 0; k < {nin} && rc == ACL_SUCCESS; ++k)
      rc = aclrtMemcpy(dev[k], bytes[k], a->inputs[k], bytes[k], ACL_MEMCPY_HOST_TO_DEVICE);
    if (rc == ACL_SUCCESS)
      rc = aclrtMemcpy(dev[{total - 1}], sizeof(t), &t, sizeof(t), ACL_MEMCPY_HOST_TO_DEVICE);
  }}
  if (rc == ACL_SUCCESS) {{
    what = "kernel launch";
    rc = AUTOFUSE_LAUNCH_KERNEL({n}, t.blockDim, stream, {dev_args});
  }}
  if (rc == ACL_SUCCESS) {{
    what = "aclrtSynchronizeStream";
    rc = aclrtSynchronizeStream(stream);
  }}
  if (rc == ACL_SUCCESS) {{
    what = "aclrtMemcpy device->host";
    for (int k = 0; k < {nout} && rc == ACL_SUCCESS; ++k)
      rc = aclrtMemcpy(a->outputs[k], bytes[{nin} + k], dev[{nin} + k], bytes[{nin} + k],
                       ACL_MEMCPY_DEVICE_TO_HOST);
  }}
  for (int k = 0; k < {total}; ++k)
    if (dev[k]) aclrtFree(dev[k]);
  if (rc != ACL_SUCCESS) return autofuse_acl_fail(a, rc, what);
  if (a->tiling_out) std::memcpy(a->tiling_out, &t, sizeof(t));
  return 0;
}}

#ifdef AUTOFUSE_SINGLE_KERNEL
extern "C" int autofuse_npu_launch(const AutofuseLaunchArgs* a) {{ return {n}_launch(a); }}
extern "C" const char* autofuse_npu_kernel_name() {{ return "{n}"; }}
#endif
#endif  // AUTOFUSE_WITH_ACL
"""
