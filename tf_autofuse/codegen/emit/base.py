"""The kernel every schedule shares, and the hooks by which a schedule says how it walks the data.

An emitter turns a planned ComputePlan (compute.py) into the three sources of a Kernel:

    <name>_tiling.h    the tiling-data struct
    <name>_kernel.cpp  the device kernel: CopyIn (GM -> VECIN queues), Compute (the plan's
                       statements), CopyOut (VECOUT queues -> GM), and the schedule's own row or
                       item functions, inside the standard AIV entry point
    <name>_host.cpp    the host tiling function and the ACL launcher

The subclasses (flat.py, broadcast.py, reduce.py, column.py) give the schedule's parts: where an
input is read from, the tile loop, the tiling function and its call.
"""

from __future__ import annotations

from .. import tiling
from ..compute import ComputePlan, Refused
from ..kernel import SIZE, STORAGE, Kernel


class Emitter:
    # the Compute function's parameters (the tile loop's variables it reads)
    compute_params = "uint32_t n"
    copy_in_params = "uint64_t off, uint32_t n"

    def __init__(self, name: str, plan: ComputePlan):
        self.name, self.plan, self.p = name, plan, plan.p

    # ---- schedule hooks ------------------------------------------------------------------
    def input_global(self, k: int, t: str) -> str:
        """Init: the SetGlobalBuffer of input k."""
        raise NotImplementedError

    def output_global(self, k: int, t: str) -> str:
        """Init: the SetGlobalBuffer of a full (not reduced) output k."""
        raise NotImplementedError

    def reduced_output_init(self, k: int, t: str) -> list:
        """Init lines of a reduced output (reduce schedules only)."""
        raise Refused("reduced outputs need a reduce schedule")

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
        buffers = [(f"in{k} queue", SIZE[t], tiling.BUFFER_NUM) for k, t in enumerate(plan.in_types)
                   if plan.queued[k]]
        buffers += [(f"out{k} queue", SIZE[t], tiling.BUFFER_NUM) for k, t in enumerate(plan.out_types)
                    if not plan.out_reduced[k] or plan.column]
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
        for k, t in enumerate(in_types):
            if plan.queued[k]:
                members.append(f"  TQue<TPosition::VECIN, BUFFER_NUM> inQue{k};")
            members.append(f"  GlobalTensor<{t}> in{k}Gm;")
        for k, t in enumerate(out_types):
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
            if plan.queued[k]:
                init.append(f"    pipe.InitBuffer(inQue{k}, BUFFER_NUM, t.tileLength * sizeof({t}));")
        for k, t in enumerate(out_types):
            if plan.out_reduced[k]:
                init += self.reduced_output_init(k, t)
                continue
            init.append(self.output_global(k, t))
            init.append(f"    pipe.InitBuffer(outQue{k}, BUFFER_NUM, t.tileLength * sizeof({t}));")
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

    def copy_in(self, k: int, t: str) -> str:
        if not self.plan.queued[k]:
            return ""
        off = self.input_offset(k)
        return f"""\
    LocalTensor<{t}> x{k} = inQue{k}.AllocTensor<{t}>();
    if ((n * sizeof({t})) % 32 == 0) {{
      DataCopy(x{k}, in{k}Gm[{off}], n);
    }} else {{
      DataCopyExtParams copy{{1, static_cast<uint32_t>(n * sizeof({t})), 0, 0, 0}};
      DataCopyPadExtParams<{t}> pad{{false, 0, 0, static_cast<{t}>(0)}};
      DataCopyPad(x{k}, in{k}Gm[{off}], copy, pad);
    }}
    inQue{k}.EnQue(x{k});
"""

    def copy_out(self, k: int, t: str) -> str:
        if self.plan.out_reduced[k]:
            return ""
        return f"""\
    LocalTensor<{t}> y{k} = outQue{k}.DeQue<{t}>();
    if ((n * sizeof({t})) % 32 == 0) {{
      DataCopy(out{k}Gm[off], y{k}, n);
    }} else {{
      DataCopyExtParams copy{{1, static_cast<uint32_t>(n * sizeof({t})), 0, 0, 0}};
      DataCopyPad(out{k}Gm[off], y{k}, copy);
    }}
    outQue{k}.FreeTensor(y{k});
"""

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
        lines = [f"    LocalTensor<{t}> x{k} = inQue{k}.DeQue<{t}>();" for k, t in enumerate(in_types)
                 if plan.queued[k] and P == 1]
        if final:
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
        if final:
            lines += [f"    outQue{k}.EnQue(y{k});" for k in range(len(out_types)) if not plan.out_reduced[k]]
        lines += [f"    inQue{k}.FreeTensor(x{k});" for k in range(len(in_types)) if plan.queued[k] and P == 1]
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
        ctx = _Tiles(in_types, plan)
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
{"".join(self.copy_in(k, t) for k, t in enumerate(in_types))}  }}
{compute_src}  __aicore__ inline void CopyOut(uint64_t off, uint32_t n) {{
{"".join(self.copy_out(k, t) for k, t in enumerate(out_types))}  }}
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
  const char* what = "aclrtMalloc";
  for (int k = 0; k < {nin + nout + 1} && rc == ACL_SUCCESS; ++k)
    rc = aclrtMalloc(&dev[k], bytes[k], ACL_MEM_MALLOC_HUGE_FIRST);
  if (rc == ACL_SUCCESS) {{
    what = "aclrtMemcpy host->device";
    for (int k = 0; k < {nin} && rc == ACL_SUCCESS; ++k)
      rc = aclrtMemcpy(dev[k], bytes[k], a->inputs[k], bytes[k], ACL_MEMCPY_HOST_TO_DEVICE);
    if (rc == ACL_SUCCESS)
      rc = aclrtMemcpy(dev[{nin + nout}], sizeof(t), &t, sizeof(t), ACL_MEMCPY_HOST_TO_DEVICE);
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
  for (int k = 0; k < {nin + nout + 1}; ++k)
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


class _Tiles:
    """The queued input tiles as the multi-pass loops hand them to Compute<q>: parameters,
    arguments, and the DeQue / FreeTensor lines (`{ind}`: the caller's indentation)."""

    def __init__(self, in_types, plan):
        queued = [(k, t) for k, t in enumerate(in_types) if plan.queued[k]]
        self.tile_params = "".join(f", LocalTensor<{t}>& x{k}" for k, t in queued)
        self.tile_args = "".join(f", x{k}" for k, _ in queued)
        self.deque = "".join(f"\n{{ind}}LocalTensor<{t}> x{k} = inQue{k}.DeQue<{t}>();" for k, t in queued)
        self.free = "".join(f"\n{{ind}}inQue{k}.FreeTensor(x{k});" for k, _ in queued)


def patterns_text(patterns) -> str:
    return ", ".join(f"in{k} {pat}" for k, pat in enumerate(patterns))
