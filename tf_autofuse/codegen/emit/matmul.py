"""The mix kernel of a MatMul and its epilogue (cube.py plans it): the sources.

Each vector core (AIV) owns a singleCoreM x singleCoreN region of C. The kernel function registers
the Matmul object (REGIST_MATMUL_OBJ on the kernel's TPipe and the system workspace: expanded in
the kernel function itself, since on the AIC the macro serves the cube and returns from the
function it is in, and on the AIV it declares the client the object uses until End). The vector
core sets its region's A and B (SetTail for a region cut by the matrix's edge) and then, for every
Iterate (the cube computes one baseM x baseN block of C, M first):

    CopyIn   GetTensorC<true> into a VECIN block (float, row stride baseN); [M, N] inputs copied
             in row by row, per-column vectors copied into every row of their block (DataCopyPad)
    Compute  the epilogue program over the whole block (compute.py's statements, count baseM x
             baseN: lanes past a tail block's rows and columns are computed and never written)
    CopyOut  the block's rows to GM (DataCopyPad, the tail's columns only)

and calls End() (every vector core of the launch does, idle ones too: the cube serves both
vector cores of its AI core). Queues have one buffer each: a block is large, and UB holds the C
block beside every input and output block and the scratch.

The host file holds the tiling function (cube.cpp_tiling) and the ACL launcher `NAME_launch`:
A, B, the epilogue's inputs and the outputs on the device, the Matmul API's system workspace, a
launch of blockDim AI cores.
"""

from __future__ import annotations

from .. import cube as _cube
from ..compute import ComputePlan
from ..kernel import SIZE, Kernel
from .base import Emitter, launch_steps


class MatmulEmitter(Emitter):
    def __init__(self, name: str, plan: ComputePlan, cube: "_cube.CubePlan"):
        super().__init__(name, plan)
        self.cube, self.mm, self.block = cube, cube.matmul, cube.block
        self.shared_in = self.shared_out = False  # one single-buffered queue per block (cube.MAX_QUEUES)
        self.in_types = [("float" if r == _cube.C else t) for r, t in zip(cube.roles, plan.in_types)]

    def kernel(self) -> Kernel:
        plan = self.plan
        sources = {
            f"{self.name}_tiling.h": self.tiling_header(),
            f"{self.name}_kernel.cpp": self.kernel_source(self.in_types, plan.out_types, self.cube.ub),
            f"{self.name}_host.cpp": self.host_source(self.in_types, plan.out_types, self.cube.ub),
        }
        gm_inputs = tuple(t for k, t in enumerate(plan.in_types) if k != self.cube.c_input)
        return Kernel(self.name, self.p.text, True, "", sources, self.cube.ub, gm_inputs,
                      tuple(plan.out_types), tuple(plan.half_ops), cube=self.cube)

    def tiling_header(self) -> str:
        guard = f"{self.name.upper()}_TILING_H_"
        return (f"// Tiling data of {self.name}: computed on the host, read by the kernel.\n"
                f"#ifndef {guard}\n#define {guard}\n#include <cstdint>\n\n"
                f"{_cube.cpp_tiling(self.name, self.block, self.mm.n, self.mm.k)}\n#endif  // {guard}\n")

    # ---- the kernel --------------------------------------------------------------------------
    def _extent(self, k: int) -> str:
        return {_cube.FULL: "static_cast<uint64_t>(t.M) * t.N", _cube.ROW: "t.N", _cube.BIAS: "t.N",
                _cube.SCALAR: "1"}[self.cube.roles[k]]

    def _gm_inputs(self) -> list:
        return [k for k in range(len(self.cube.roles)) if k != self.cube.c_input]

    def kernel_source(self, in_types, out_types, ub) -> str:
        plan, cube, mm, blk = self.plan, self.cube, self.mm, self.block
        n, c = self.name, cube.c_input
        ab = _cube.CUBE_TYPES[mm.dtype]
        program = "".join(f"//   {line}\n" for line in self.p.text.splitlines())
        gm_params = (["GM_ADDR a", "GM_ADDR b"] + [f"GM_ADDR in{k}" for k in self._gm_inputs()]
                     + [f"GM_ADDR out{j}" for j in range(len(out_types))])
        gm_names = ", ".join(p.split()[1] for p in gm_params)
        members = [f"  GlobalTensor<{ab}> aGm;", f"  GlobalTensor<{ab}> bGm;"]
        public = ("  TPipe pipe;\n"
                  f"  Matmul<MatmulType<TPosition::GM, CubeFormat::ND, {ab}, {str(mm.transpose_a).lower()}>,\n"
                  f"         MatmulType<TPosition::GM, CubeFormat::ND, {ab}, {str(mm.transpose_b).lower()}>,\n"
                  "         MatmulType<TPosition::VECIN, CubeFormat::ND, float>,\n"
                  f"         MatmulType<TPosition::GM, CubeFormat::ND, {cube.bias_type or 'float'}>> mm;\n"
                  "  TCubeTiling cube;\n")
        init = [f"    aGm.SetGlobalBuffer((__gm__ {ab}*)a, static_cast<uint64_t>(t.M) * t.K);",
                f"    bGm.SetGlobalBuffer((__gm__ {ab}*)b, static_cast<uint64_t>(t.K) * t.N);"]
        for k, role in enumerate(cube.roles):
            t = in_types[k]
            if role not in (_cube.SCALAR, _cube.BIAS):
                members.append(f"  TQue<TPosition::VECIN, 1> inQue{k};  // "
                               + ("the C block" if role == _cube.C else f"in{k}'s block ({role})"))
                init.append(f"    pipe.InitBuffer(inQue{k}, 1, BLOCK * sizeof({t}));")
            if role != _cube.C:
                members.append(f"  GlobalTensor<{t}> in{k}Gm;")
                init.insert(2, f"    in{k}Gm.SetGlobalBuffer((__gm__ {t}*)in{k}, {self._extent(k)});")
        for j, t in enumerate(out_types):
            members += [f"  TQue<TPosition::VECOUT, 1> outQue{j};", f"  GlobalTensor<{t}> out{j}Gm;"]
            init.insert(2, f"    out{j}Gm.SetGlobalBuffer((__gm__ {t}*)out{j}, static_cast<uint64_t>(t.M) * t.N);")
            init.append(f"    pipe.InitBuffer(outQue{j}, 1, BLOCK * sizeof({t}));")
        members += [f"  TBuf<TPosition::VECCALC> calc{s};" for s in range(plan.slots)]
        init += [f"    pipe.InitBuffer(calc{s}, BLOCK * 4);" for s in range(plan.slots)]
        if plan.shared_tmp[0]:
            members.append("  TBuf<TPosition::VECCALC> sharedTmpBuf;  // advanced math temp buffer")
            init.append(f"    pipe.InitBuffer(sharedTmpBuf, BLOCK * {plan.shared_tmp[0]} + {plan.shared_tmp[1]});")
        cube_fields = ["usedCoreNum", "M", "N", "singleCoreM", "singleCoreN", "baseM", "baseN", "baseK",
                       "depthA1", "depthB1", "dbL0A", "dbL0B", "dbL0C", "iterateOrder"]
        set_cube = "\n".join(f"    cube.{f} = static_cast<int32_t>(t.{f});" for f in cube_fields)
        with_bias = " (with the bias)" if cube.bias_add is not None else ""
        copy_in = [f"""\
    LocalTensor<float> x{c} = inQue{c}.AllocTensor<float>();
    mm.template GetTensorC<true>(x{c}, 0, true);  // the [baseM, baseN] block, row stride baseN{with_bias}
    inQue{c}.EnQue(x{c});"""]
        for k, role in enumerate(cube.roles):
            if role in (_cube.FULL, _cube.ROW):
                t = in_types[k]
                src = f"in{k}Gm[(mOff + r) * N + nOff]" if role == _cube.FULL else f"in{k}Gm[nOff]"
                copy_in.append(f"""\
    LocalTensor<{t}> x{k} = inQue{k}.AllocTensor<{t}>();
    for (uint32_t r = 0; r < rows; ++r) {{
      LocalTensor<{t}> row = x{k}[r * BASE_N];
      DataCopyPad(row, {src}, copy{SIZE[t]}, DataCopyPadExtParams<{t}>{{false, 0, 0, static_cast<{t}>(0)}});
    }}
    inQue{k}.EnQue(x{k});""")
        sizes = sorted({SIZE[in_types[k]] for k, r in enumerate(cube.roles) if r in (_cube.FULL, _cube.ROW)}
                       | set(SIZE[t] for t in out_types))
        copy_params = "\n".join(f"    DataCopyExtParams copy{s}{{1, cols * {s}, 0, 0, 0}};" for s in sizes)
        copy_out = "".join(f"""\
    LocalTensor<{t}> y{j} = outQue{j}.DeQue<{t}>();
    for (uint32_t r = 0; r < rows; ++r) DataCopyPad(out{j}Gm[(mOff + r) * N + nOff], y{j}[r * BASE_N], copy{SIZE[t]});
    outQue{j}.FreeTensor(y{j});
""" for j, t in enumerate(out_types))
        compute = "\n".join(self.compute_lines(plan.bodies[0], True, in_types, out_types))
        trans_a = f"{'m0' if mm.transpose_a else 'static_cast<uint64_t>(m0) * t.K'}"
        trans_b = f"{'static_cast<uint64_t>(n0) * t.K' if mm.transpose_b else 'n0'}"
        set_bias = ""
        if cube.bias_add is not None:
            b = cube.roles.index(_cube.BIAS)
            set_bias = (f"\n    mm.SetBias(in{b}Gm[n0]);  // %{cube.bias_add} = Add of the product and in{b}: "
                        "added by the cube")
        half_note = ("// Computed in half (--autofuse_enhance_precision_blacklist): "
                     + ", ".join(plan.half_ops) + "\n") if plan.half_ops else ""
        return f"""\
// Generated by tf_autofuse.codegen: {mm.describe()} on the cube (Matmul API), the epilogue
// program on the vector cores, its in{c} being the product:
{program}// Mix kernel: base block {blk.base_m} x {blk.base_n} x {blk.base_k}. {ub.describe()}
{half_note}#include "kernel_operator.h"
#include "kernel_tiling/kernel_tiling.h"
#include "lib/matmul_intf.h"
#include "{n}_tiling.h"

using namespace AscendC;

namespace {n}_impl {{
constexpr uint32_t BASE_M = {blk.base_m}, BASE_N = {blk.base_n};
constexpr int32_t BLOCK = BASE_M * BASE_N;  // elements of a C block in UB

class Kernel {{
 public:
  __aicore__ inline Kernel() {{}}
  // The Matmul API's tiling, before REGIST_MATMUL_OBJ (which the kernel function expands: on the
  // AIC it serves the cube and returns from there, and its client must outlive Process).
  __aicore__ inline void SetCubeTiling(const {n}_TilingData& t) {{
{set_cube}
    cube.Ka = cube.Kb = cube.singleCoreK = static_cast<int32_t>(t.K);
    cube.stepM = cube.stepN = cube.stepKa = cube.stepKb = 1;
    cube.isBias = {int(cube.bias_add is not None)};
  }}
  __aicore__ inline void Init({", ".join(gm_params)}, const {n}_TilingData& t) {{
{chr(10).join(init)}
    N = t.N;
    const uint32_t block = GetBlockIdx();
    active = block < t.usedCoreNum;
    if (!active) return;
    m0 = block / t.nCores * t.singleCoreM;
    n0 = block % t.nCores * t.singleCoreN;
    tailM = t.M - m0 < t.singleCoreM ? t.M - m0 : t.singleCoreM;
    tailN = t.N - n0 < t.singleCoreN ? t.N - n0 : t.singleCoreN;
    if (tailM < t.singleCoreM || tailN < t.singleCoreN) mm.SetTail(tailM, tailN, t.K);
    mm.SetTensorA(aGm[{trans_a}], {str(mm.transpose_a).lower()});
    mm.SetTensorB(bGm[{trans_b}], {str(mm.transpose_b).lower()});{set_bias}
  }}
  __aicore__ inline void Process() {{
    if (active) {{
      const uint32_t mIters = (tailM + BASE_M - 1) / BASE_M;
      uint32_t i = 0;
      while (mm.template Iterate<true>()) {{  // iterateOrder 0: M first
        const uint32_t mOff = m0 + i % mIters * BASE_M, nOff = n0 + i / mIters * BASE_N;
        const uint32_t rows = m0 + tailM - mOff < BASE_M ? m0 + tailM - mOff : BASE_M;
        const uint32_t cols = n0 + tailN - nOff < BASE_N ? n0 + tailN - nOff : BASE_N;
        CopyIn(mOff, nOff, rows, cols);
        Compute();
        CopyOut(mOff, nOff, rows, cols);
        ++i;
      }}
    }}
    mm.End();
  }}

{public}
 private:
  __aicore__ inline void CopyIn(uint64_t mOff, uint64_t nOff, uint32_t rows, uint32_t cols) {{
{copy_params}
{chr(10).join(copy_in)}
  }}
  __aicore__ inline void Compute() {{
    const int32_t cn = BLOCK;
{compute}
  }}
  __aicore__ inline void CopyOut(uint64_t mOff, uint64_t nOff, uint32_t rows, uint32_t cols) {{
{copy_params}
{copy_out}  }}

{chr(10).join(members)}
  uint64_t N = 0;
  uint32_t m0 = 0, n0 = 0, tailM = 0, tailN = 0;
  bool active = false;
}};

__aicore__ inline void CopyTiling({n}_TilingData* t, GM_ADDR tiling) {{
  uint32_t* dst = reinterpret_cast<uint32_t*>(t);
  __gm__ uint32_t* src = reinterpret_cast<__gm__ uint32_t*>(tiling);
  for (uint32_t i = 0; i < sizeof({n}_TilingData) / sizeof(uint32_t); ++i) dst[i] = src[i];
}}
}}  // namespace {n}_impl

extern "C" __global__ __aicore__ void {n}({", ".join(gm_params)}, GM_ADDR workspace, GM_ADDR tiling) {{
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
  SetSysWorkspace(workspace);
  if (GetSysWorkSpacePtr() == nullptr) return;
  {n}_TilingData t;
  {n}_impl::CopyTiling(&t, tiling);
  {n}_impl::Kernel op;
  op.SetCubeTiling(t);
  // every core registers the Matmul: the AIC serves its two vector cores' requests here and
  // returns; each vector core (idle ones too) calls End()
  REGIST_MATMUL_OBJ(&op.pipe, GetSysWorkSpacePtr(), op.mm, &op.cube);
  op.Init({gm_names}, t);
  op.Process();
}}
"""

    def host_source(self, in_types, out_types, ub) -> str:
        n, cube, mm = self.name, self.cube, self.mm
        ab = SIZE[_cube.CUBE_TYPES[mm.dtype]]
        gm = self._gm_inputs()
        nin, nout = 2 + len(gm), len(out_types)
        extent = {_cube.FULL: "m * N", _cube.ROW: "N", _cube.BIAS: "N", _cube.SCALAR: "1"}
        in_bytes = [f"m * K * {ab}", f"K * N * {ab}"] + [f"{extent[cube.roles[k]]} * {SIZE[in_types[k]]}" for k in gm]
        out_bytes = [f"m * N * {SIZE[t]}" for t in out_types]
        bytes_init = "\n".join(f"  bytes[{i}] = {b};" for i, b in enumerate(in_bytes + out_bytes))
        dev_args = ", ".join(f"static_cast<uint8_t*>(dev[{i}])" for i in range(nin + nout + 2))
        return f"""\
// Host side of {n}: the tiling function and the ACL launch glue of the mix kernel.
// Build with AUTOFUSE_WITH_ACL for the launcher (needs acl/acl.h and libascendcl.so).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include "{n}_tiling.h"
#include "autofuse_launch.h"

#ifdef AUTOFUSE_WITH_ACL
#include "acl/acl.h"
#if AUTOFUSE_CANN_ROUTE == 8
#include "aclrtlaunch_{n}.h"  // generated by ascendc_library (CANN 8.0-8.4)
#endif

// Runs the MatMul and its epilogue on host buffers: inputs A, B, then the epilogue's inputs;
// outputs [M, N]; the iteration shape is the output's, rank 2. Device buffers, the Matmul API's
// system workspace ({_cube.SYS_WORKSPACE_BYTES} bytes), copy in, launch blockDim AI cores (two
// vector cores each), synchronise, copy out, free. 0 on success, else an error code (message in
// a->error).
extern "C" int {n}_launch(const AutofuseLaunchArgs* a) {{
  if (a->abi_version != AUTOFUSE_LAUNCH_ABI || a->num_inputs != {nin} || a->num_outputs != {nout})
    return autofuse_launch_fail(a, -1, "{n}: bad launch arguments (ABI or tensor count)");
  const uint64_t N = {mm.n}, K = {mm.k};
  if (a->rank != 2 || !a->shape || a->shape[0] < 0 || static_cast<uint64_t>(a->shape[1]) != N)
    return autofuse_launch_fail(a, -1, "{n}: the iteration shape must be [M, {mm.n}]");
  const uint64_t m = static_cast<uint64_t>(a->shape[0]);
  aclrtStream stream = reinterpret_cast<aclrtStream>(a->stream);
  uint32_t core_num = a->core_num;
  aclError rc = autofuse_acl_prepare(a->device_id, &stream, &core_num);
  if (rc != ACL_SUCCESS) return autofuse_acl_fail(a, rc, "device setup failed");
  {n}_TilingData t;
  if ({n}_tiling(m, core_num, &t) != 0) return autofuse_launch_fail(a, -1, "{n}: tiling failed");
  if (t.blockDim == 0) return 0;
  void* dev[{nin + nout + 2}] = {{}};  // inputs, outputs, workspace, tiling
  uint64_t bytes[{nin + nout + 2}];
{bytes_init}
  bytes[{nin + nout}] = {_cube.SYS_WORKSPACE_BYTES}u;
  bytes[{nin + nout + 1}] = sizeof(t);
  static const uint32_t in_sizes[{nin}] = {{{", ".join(str(x) for x in [ab, ab] + [SIZE[in_types[k]] for k in gm])}}};
  for (int k = 0; k < {nin}; ++k)
    if (a->input_elements && a->input_elements[k] * in_sizes[k] != bytes[k])
      return autofuse_launch_fail(a, -1, "{n}: an input does not have the element count the MatMul needs");
{launch_steps(n, nin, nout, nin + nout + 2, dev_args)}"""
