"""The CPU twin: generated kernels built with g++ against twin/kernel_operator.h and run here.

`build(kernels)` compiles any number of kernels into one shared library (one compiler run: batch
them, the header is the expensive part); `TwinLibrary.run(name, inputs, core_num)` runs one
kernel over numpy arrays block by block and returns its outputs and tiling, or raises TwinError
with the rule the kernel broke. `build(kernels, acl=True)` adds each kernel's ACL launcher, linked
against the stand-in runtime (`stub_library()`, a libascendcl.so that executes the twin kernel),
so that the launch glue runs end to end: `TwinLibrary.launch(...)`.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from . import build as _build
from . import tiling as _tiling
from .ascendc import Kernel

NUMPY = {"half": np.float16, "bfloat16_t": np.uint16, "float": np.float32, "int32_t": np.int32,
         "uint8_t": np.uint8}  # uint8_t: bool, 1 byte 0/1 (numpy bool arrays in, bool arrays out)
CXXFLAGS = ["-std=c++17", "-O1", "-fPIC", "-shared", "-Wall", "-Wno-unused-variable",
            "-Wno-unused-but-set-variable"]


class TwinError(RuntimeError):
    """The twin caught generated code breaking a hardware rule (or the launch failed)."""


def _ctypes_struct(tiling_class):
    """The ctypes mirror of a tiling struct (tiling.TilingData), and its reading back."""
    ctypes_of = {"uint64_t": ctypes.c_uint64, "uint32_t": ctypes.c_uint32}

    class Struct(ctypes.Structure):
        _fields_ = [(name, ctypes_of[ctype]) for ctype, name in tiling_class.fields()]

        def as_tiling(self):
            return tiling_class(**{name: getattr(self, name) for name, _ in self._fields_})

    return Struct


_Tiling, _BcastTiling, _ColumnTiling = (_ctypes_struct(c) for c in (
    _tiling.Tiling, _tiling.BcastTiling, _tiling.ColumnTiling))


def _tiling_struct(kernel: Kernel):
    if kernel.split is None:
        return _Tiling()
    return _ColumnTiling() if kernel.split2 is not None else _BcastTiling()


class _LaunchArgs(ctypes.Structure):
    _fields_ = [("abi_version", ctypes.c_uint32), ("device_id", ctypes.c_int32),
                ("stream", ctypes.c_void_p), ("core_num", ctypes.c_uint32),
                ("total", ctypes.c_uint64), ("num_inputs", ctypes.c_uint32),
                ("inputs", ctypes.POINTER(ctypes.c_void_p)), ("num_outputs", ctypes.c_uint32),
                ("outputs", ctypes.POINTER(ctypes.c_void_p)), ("tiling_out", ctypes.c_void_p),
                ("error", ctypes.c_char_p), ("error_len", ctypes.c_uint32),
                ("rank", ctypes.c_uint32), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("input_elements", ctypes.POINTER(ctypes.c_uint64))]


def _harness(k: Kernel) -> str:
    """`NAME_twin_run(ins, outs, outer, inner, core_num, ...)` of a vector kernel."""
    n = k.name
    nin, nout = len(k.inputs), len(k.outputs)
    gm = ", ".join([f"(GM_ADDR)ins[{i}]" for i in range(nin)] + [f"(GM_ADDR)outs[{i}]" for i in range(nout)])
    extent = {"full": "total", "row": "inner", "col": "outer", "scalar": "1"}
    patterns = k.patterns or ("full",) * nin
    def extent_of(pat):  # 3-level broadcast patterns: "f"/"b" for outer, mid (inner / rest), rest
        if pat in extent:  # full / row / col / scalar
            return extent[pat]
        return " * ".join(d for d, p in zip(("outer", "(inner / rest)", "rest"), pat) if p == "f") or "1"

    reg = "".join(f"  twin::Gm().Add(ins[{i}], ({extent_of(patterns[i])}) * sizeof({t}));\n"
                  for i, t in enumerate(k.inputs))
    out_red = k.out_reduced or (False,) * nout
    reduced = "outer * rest" if k.split2 is not None else "outer"
    reg += "".join(f"  twin::Gm().Add(outs[{i}], ({reduced if out_red[i] else 'total'}) * sizeof({t}));\n"
                   for i, t in enumerate(k.outputs))
    unreg = "".join(f"  twin::Gm().Remove(ins[{i}]);\n" for i in range(nin))
    unreg += "".join(f"  twin::Gm().Remove(outs[{i}]);\n" for i in range(nout))
    tiling_call = (f"{n}_tiling(total, core_num, tile_override, &t)" if k.split is None
                   else f"{n}_tiling(outer, rest ? inner / rest : 0, rest, core_num, tile_override, &t)"
                   if k.split2 is not None
                   else f"{n}_tiling(outer, inner, core_num, tile_override, &t)")
    return _run_function(
        n, "uint64_t outer, uint64_t inner,\n"
           "                            uint32_t core_num, uint32_t tile_override, void* tiling_out, char* err,\n"
           "                            uint32_t err_len, uint64_t rest",
        "  const uint64_t total = outer * inner;\n", tiling_call, reg, unreg, gm, mix=False)


def _run_function(n: str, params: str, prelude: str, tiling_call: str, reg: str, unreg: str,
                  gm: str, mix: bool) -> str:
    """`NAME_twin_run(ins, outs, PARAMS)`: the tiling (copied out), the GM buffers registered with
    the twin (`reg`, then the tiling data, and a mix kernel's system workspace), every block of the
    launch run, the buffers unregistered; 0, 1 (tiling failed) or 2 (the twin's error in err)."""
    workspace = "  std::vector<uint8_t> workspace(twin::kSysWorkspaceBytes);\n" if mix else ""
    add_workspace = "  twin::Gm().Add(workspace.data(), workspace.size());\n" if mix else ""
    remove_workspace = "  twin::Gm().Remove(workspace.data());\n" if mix else ""
    run = ("  // mix launch: blockDim AI cores, two vector cores each\n"
           f"  std::string e = twin::RunBlocks(2 * t.blockDim, {n}, {gm}, workspace.data(), "
           "tiling_gm.data());\n" if mix else
           f"  std::string e = twin::RunBlocks(t.blockDim, {n}, {gm}, (GM_ADDR)nullptr, "
           "tiling_gm.data());\n")
    return f"""
extern "C" int {n}_twin_run(void* const* ins, void* const* outs, {params}) {{
  {n}_TilingData t;
{prelude}  if ({tiling_call} != 0) {{
    std::snprintf(err, err_len, "tiling failed");
    return 1;
  }}
  if (tiling_out) std::memcpy(tiling_out, &t, sizeof(t));
  if (t.blockDim == 0) return 0;
  std::vector<uint8_t> tiling_gm(sizeof(t));
  std::memcpy(tiling_gm.data(), &t, sizeof(t));
{workspace}{reg}  twin::Gm().Add(tiling_gm.data(), tiling_gm.size());
{add_workspace}{run}{unreg}  twin::Gm().Remove(tiling_gm.data());
{remove_workspace}  std::snprintf(err, err_len, "%s", e.c_str());
  return e.empty() ? 0 : 2;
}}
"""


def _arg_count(k: Kernel) -> int:
    """The kernel's GM arguments: (A, B,) inputs, outputs, workspace, tiling."""
    return (2 if k.cube is not None else 0) + len(k.inputs) + len(k.outputs) + 2


def _acl_part(k: Kernel) -> str:
    """What the toolchain's launch stub does on hardware: check the arguments, queue the kernel
    (`twin_launch_NAME`), run it at the stream's synchronisation. A mix kernel's launch of
    blockDim AI cores runs 2 x blockDim vector blocks, and its workspace is an argument like the
    others (the Matmul API's system workspace)."""
    n, count = k.name, _arg_count(k)
    workspace = count - 2
    params = ", ".join(f"uint8_t* a{i}" for i in range(count))
    args = ", ".join(f"(GM_ADDR)c->args[{i}]" for i in range(count))
    blocks = "2 * c->block_dim" if k.cube is not None else "c->block_dim"
    skip = "" if k.cube is not None else f"\n    if (i == {workspace}) continue;  // workspace: none"
    return f"""
struct {n}_launch_ctx {{ uint32_t block_dim; uint8_t* args[{count}]; }};
static const char* {n}_run_ctx(void* p) {{
  static thread_local std::string error;
  {n}_launch_ctx* c = static_cast<{n}_launch_ctx*>(p);
  for (uint8_t* a : c->args) if (a) twin::Gm().Add(a, twinAclDeviceSize(a));
  error = twin::RunBlocks({blocks}, {n}, {args});
  for (uint8_t* a : c->args) if (a) twin::Gm().Remove(a);
  delete c;
  return error.c_str();
}}
static aclError twin_launch_{n}(uint32_t block_dim, aclrtStream stream, {params}) {{
  {n}_launch_ctx* c = new {n}_launch_ctx{{block_dim, {{{", ".join(f"a{i}" for i in range(count))}}}}};
  for (int i = 0; i < {count}; ++i) {{{skip}
    if (twinAclDeviceSize(c->args[i]) == 0) {{ delete c; return ACL_ERROR_INVALID_PARAM; }}
  }}
  const void* used[{count}];
  for (int i = 0; i < {count}; ++i) used[i] = c->args[i];
  aclError rc = twinAclEnqueue(stream, {n}_run_ctx, c, block_dim, used, {count});
  if (rc != ACL_SUCCESS) delete c;
  return rc;
}}
"""


def _wrapper(kernels, acl: bool) -> str:
    lines = ["// CPU twin build of generated kernels (tf_autofuse.codegen.twin).",
             "#include <cstdio>", "#include <cstring>", "#include <string>", "#include <vector>",
             '#include "kernel_operator.h"']
    if acl:
        lines.append('#include "acl/acl.h"')
    for k in kernels:
        lines.append(f'#include "{k.name}_kernel.cpp"')
    for k in kernels:
        if acl:  # the twin launch function must precede the launcher that calls it
            lines.append(f'#include "{k.name}_tiling.h"')
            lines.append(_acl_part(k))
        lines.append(f'#include "{k.name}_host.cpp"')
        lines.append(_cube_harness(k) if k.cube is not None else _harness(k))
    return "\n".join(lines) + "\n"


def _cube_harness(k: Kernel) -> str:
    """`NAME_twin_run(ins, outs, m, core_num, ...)` of a mix kernel: ins are A, B and the
    epilogue's GM inputs; the vector blocks of the launch (two per AI core) run one after another."""
    from . import cube as _cube

    n, plan = k.name, k.cube
    ab = _cube.CUBE_TYPES[plan.matmul.dtype]
    extent = {_cube.FULL: "m * t.N", _cube.ROW: "t.N", _cube.BIAS: "t.N", _cube.SCALAR: "1"}
    roles = [r for r in plan.roles if r != _cube.C]
    sizes = [f"m * t.K * sizeof({ab})", f"t.K * t.N * sizeof({ab})"]
    sizes += [f"({extent[r]}) * sizeof({t})" for r, t in zip(roles, k.inputs)]
    nin, nout = len(sizes), len(k.outputs)
    reg = "".join(f"  twin::Gm().Add(ins[{i}], {size});\n" for i, size in enumerate(sizes))
    reg += "".join(f"  twin::Gm().Add(outs[{j}], m * t.N * sizeof({t}));\n" for j, t in enumerate(k.outputs))
    unreg = "".join(f"  twin::Gm().Remove(ins[{i}]);\n" for i in range(nin))
    unreg += "".join(f"  twin::Gm().Remove(outs[{j}]);\n" for j in range(nout))
    gm = ", ".join([f"(GM_ADDR)ins[{i}]" for i in range(nin)] + [f"(GM_ADDR)outs[{j}]" for j in range(nout)])
    return _run_function(n, "uint64_t m, uint32_t core_num,\n"
                            "                            void* tiling_out, char* err, uint32_t err_len",
                         "", f"{n}_tiling(m, core_num, &t)", reg, unreg, gm, mix=True)


def stub_library() -> Path:
    """Build (once) the stand-in libascendcl.so."""
    src = (_build.TWIN_DIR / "acl_stub.cpp").read_text()
    key = _build.key_of(src, (_build.TWIN_DIR / "acl" / "acl.h").read_text(), _build.cxx(), CXXFLAGS)
    command = [_build.cxx(), *CXXFLAGS, f"-I{_build.TWIN_DIR}", "acl_stub.cpp", "-o", "libascendcl.so"]
    return _build.cached_build("twin_acl", key, {"acl_stub.cpp": src}, [command], "libascendcl.so")


def build(kernels, acl: bool = False, single: bool = False, route: int = 9) -> "TwinLibrary":
    """route: the CANN API generation the launchers are built for (cann.ROUTES), against the
    stand-in headers of that generation."""
    kernels = list(kernels)
    key, files, command = plan(kernels, acl, single, route)
    path = _build.cached_build("twin", key, files, [command], "libtwin.so")
    return TwinLibrary(path, {k.name: k for k in kernels})


def _launch_header(k: Kernel) -> str:
    """Stand-in of the aclrtlaunch_<name>.h that CANN 8.x's ascendc_library generates."""
    n = _arg_count(k)
    params = ", ".join(f"void* a{i}" for i in range(n))
    args = ", ".join(f"static_cast<uint8_t*>(a{i})" for i in range(n))
    return (f"// Stand-in of CANN 8.x's generated launch header for {k.name}.\n#pragma once\n"
            "#ifndef ACLRT_LAUNCH_KERNEL\n#define ACLRT_LAUNCH_KERNEL(kernel_func) aclrtlaunch_##kernel_func\n#endif\n"
            f"inline uint32_t aclrtlaunch_{k.name}(uint32_t blockDim, aclrtStream stream, {params}) {{\n"
            f"  return static_cast<uint32_t>(twin_launch_{k.name}(blockDim, stream, {args}));\n}}\n")


def plan(kernels, acl: bool = False, single: bool = False, route: int = 9):
    """(cache key, files, g++ command) of a twin build."""
    for k in kernels:
        if not k.ok:
            raise ValueError(f"{k.name} was not generated: {k.reason}")
    files = {}
    for k in kernels:
        files.update(k.sources)
    files["twin_main.cpp"] = _wrapper(kernels, acl)
    flags = [*CXXFLAGS, f"-I{_build.TWIN_DIR}", f"-I{_build.HOST_DIR}", "-I{dir}"]
    link = []
    if acl:
        flags += ["-DAUTOFUSE_WITH_ACL", "-DAUTOFUSE_TWIN", f"-DAUTOFUSE_CANN_ROUTE={route}"]
        if route == 8:
            files.update({f"aclrtlaunch_{k.name}.h": _launch_header(k) for k in kernels})
        if single:
            flags.append("-DAUTOFUSE_SINGLE_KERNEL")
        stub = stub_library()
        link = [f"-L{stub.parent}", "-lascendcl", f"-Wl,-rpath,{stub.parent}"]
    key = _build.key_of(_build.support_digest(), _build.cxx(), flags, link,
                        *(f"{n}\0{t}" for n, t in sorted(files.items())))
    command = [_build.cxx(), *flags, "twin_main.cpp", "-o", "libtwin.so", *link]
    return key, files, command


class TwinLibrary:
    def __init__(self, path: Path, kernels: dict):
        self.path = path
        self.kernels = kernels
        self.lib = ctypes.CDLL(str(path))

    def _buffers(self, kernel: Kernel, inputs):
        """(flat input arrays, output arrays, outer, inner, iteration shape)."""
        if len(inputs) != len(kernel.inputs):
            raise ValueError(f"{kernel.name} takes {len(kernel.inputs)} inputs")
        arrays = [np.ascontiguousarray(a, dtype=NUMPY[c]) for c, a in zip(kernel.inputs, inputs)]
        if kernel.split is None:
            total = arrays[0].size
            if any(a.size != total for a in arrays):
                raise ValueError("flat kernels take inputs of one element count")
            shape, outer, inner = (total,), 1, total
        else:  # inputs come in their view shapes; the iteration shape is their broadcast
            shape = np.broadcast_shapes(*[a.shape for a in arrays])
            shape = (1,) * (kernel.rank - len(shape)) + tuple(shape)
            outer, inner = kernel.outer_inner(shape)
            total = outer * inner
        red = kernel.out_reduced or (False,) * len(kernel.outputs)
        reduced = outer * kernel.column_dims(shape)[2] if kernel.split2 is not None else outer
        outs = [np.full(reduced if r else total, 0x7B, dtype=NUMPY[c]) for c, r in zip(kernel.outputs, red)]
        return [a.reshape(-1) for a in arrays], outs, outer, inner, shape

    @staticmethod
    def _shaped(kernel: Kernel, outs, shape):
        outs = [o.view(np.bool_) if c == "uint8_t" else o for o, c in zip(outs, kernel.outputs)]
        if kernel.split is None:
            return outs
        red = kernel.out_reduced or (False,) * len(outs)
        end = len(shape) if kernel.split2 is None else kernel.split2
        kept = tuple(shape[:kernel.split]) + (1,) * (end - kernel.split) + tuple(shape[end:])
        return [o.reshape(kept if r else shape) for o, r in zip(outs, red)]

    def _call(self, name: str, inputs):
        """What a run and a launch of kernel `name` pass: (kernel, inputs, outputs, outer, inner,
        shape, input pointers, output pointers, the tiling struct to fill, the error buffer)."""
        kernel = self.kernels[name]
        arrays, outs, outer, inner, shape = self._buffers(kernel, inputs)
        ins_p = (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
        outs_p = (ctypes.c_void_p * max(1, len(outs)))(*[o.ctypes.data for o in outs])
        return (kernel, arrays, outs, outer, inner, shape, ins_p, outs_p, _tiling_struct(kernel),
                ctypes.create_string_buffer(4096))

    def run(self, name: str, inputs, core_num: int, tile_override: int = 0):
        """(outputs, tiling) of one run of kernel `name`; TwinError on a broken rule."""
        kernel, _, outs, outer, inner, shape, ins_p, outs_p, t, err = self._call(name, inputs)
        fn = getattr(self.lib, f"{name}_twin_run")
        fn.restype = ctypes.c_int
        rest = kernel.column_dims(shape)[2] if kernel.split2 is not None else 0
        rc = fn(ins_p, outs_p, ctypes.c_uint64(outer), ctypes.c_uint64(inner), ctypes.c_uint32(core_num),
                ctypes.c_uint32(tile_override), ctypes.byref(t), err, ctypes.c_uint32(len(err)),
                ctypes.c_uint64(rest))
        if rc != 0:
            raise TwinError(err.value.decode(errors="replace"))
        return self._shaped(kernel, outs, shape), t.as_tiling()

    def run_matmul(self, name: str, a, b, inputs, core_num: int):
        """(outputs [M, N], CubeTiling) of one run of mix kernel `name`: A and B as the MatMul
        reads them (transposed when its flags say so), `inputs` the epilogue's GM inputs in
        order; TwinError on a broken rule."""
        from . import cube as _cube

        kernel = self.kernels[name]
        plan = kernel.cube
        ab = NUMPY[_cube.CUBE_TYPES[plan.matmul.dtype]]
        a = np.ascontiguousarray(a, dtype=ab)
        b = np.ascontiguousarray(b, dtype=ab)
        m = a.shape[1] if plan.matmul.transpose_a else a.shape[0]
        arrays = [a.reshape(-1), b.reshape(-1)]
        arrays += [np.ascontiguousarray(x, dtype=NUMPY[c]).reshape(-1) for c, x in zip(kernel.inputs, inputs)]
        n = plan.matmul.n
        outs = [np.full(m * n, 0x7B, dtype=NUMPY[c]) for c in kernel.outputs]
        ins_p = (ctypes.c_void_p * len(arrays))(*[x.ctypes.data for x in arrays])
        outs_p = (ctypes.c_void_p * max(1, len(outs)))(*[o.ctypes.data for o in outs])
        t = _ctypes_struct(_cube.CubeTiling)()
        err = ctypes.create_string_buffer(4096)
        fn = getattr(self.lib, f"{name}_twin_run")
        fn.restype = ctypes.c_int
        rc = fn(ins_p, outs_p, ctypes.c_uint64(m), ctypes.c_uint32(core_num), ctypes.byref(t), err,
                ctypes.c_uint32(len(err)))
        if rc != 0:
            raise TwinError(err.value.decode(errors="replace"))
        outs = [o.view(np.bool_) if c == "uint8_t" else o for o, c in zip(outs, kernel.outputs)]
        return [o.reshape(m, n) for o in outs], t.as_tiling()

    def launch_matmul(self, name: str, a, b, inputs, core_num: int = 0):
        """run_matmul through the mix kernel's ACL launcher and the stand-in runtime."""
        from . import cube as _cube

        kernel = self.kernels[name]
        plan = kernel.cube
        ab = NUMPY[_cube.CUBE_TYPES[plan.matmul.dtype]]
        arrays = [np.ascontiguousarray(a, dtype=ab), np.ascontiguousarray(b, dtype=ab)]
        m = arrays[0].shape[1] if plan.matmul.transpose_a else arrays[0].shape[0]
        arrays += [np.ascontiguousarray(x, dtype=NUMPY[c]) for c, x in zip(kernel.inputs, inputs)]
        n = plan.matmul.n
        outs = [np.full(m * n, 0x7B, dtype=NUMPY[c]) for c in kernel.outputs]
        ins_p = (ctypes.c_void_p * len(arrays))(*[x.ctypes.data for x in arrays])
        outs_p = (ctypes.c_void_p * max(1, len(outs)))(*[o.ctypes.data for o in outs])
        t = _ctypes_struct(_cube.CubeTiling)()
        err = ctypes.create_string_buffer(4096)
        dims = (ctypes.c_int64 * 2)(m, n)
        counts = (ctypes.c_uint64 * len(arrays))(*[x.size for x in arrays])
        args = _LaunchArgs(1, 0, None, core_num, m * n, len(arrays),
                           ctypes.cast(ins_p, ctypes.POINTER(ctypes.c_void_p)), len(outs),
                           ctypes.cast(outs_p, ctypes.POINTER(ctypes.c_void_p)),
                           ctypes.cast(ctypes.byref(t), ctypes.c_void_p), ctypes.cast(err, ctypes.c_char_p),
                           len(err), 2, ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64)),
                           ctypes.cast(counts, ctypes.POINTER(ctypes.c_uint64)))
        fn = getattr(self.lib, f"{name}_launch")
        fn.restype = ctypes.c_int
        if fn(ctypes.byref(args)) != 0:
            stub = ctypes.CDLL(str(stub_library()))
            stub.aclGetRecentErrMsg.restype = ctypes.c_char_p
            raise TwinError(f"{err.value.decode(errors='replace')}: "
                            f"{(stub.aclGetRecentErrMsg() or b'').decode(errors='replace')}")
        outs = [o.view(np.bool_) if c == "uint8_t" else o for o, c in zip(outs, kernel.outputs)]
        return [o.reshape(m, n) for o in outs], t.as_tiling()

    def launch(self, name: str, inputs, core_num: int = 0, symbol: str = None):
        """Run through the ACL launcher and the stand-in runtime: (outputs, tiling)."""
        kernel, arrays, outs, outer, inner, shape, ins_p, outs_p, t, err = self._call(name,
                                                                                        inputs)
        dims = (ctypes.c_int64 * max(1, len(shape)))(*shape)
        counts = (ctypes.c_uint64 * max(1, len(arrays)))(*[a.size for a in arrays])
        args = _LaunchArgs(1, 0, None, core_num, outer * inner, len(arrays),
                           ctypes.cast(ins_p, ctypes.POINTER(ctypes.c_void_p)), len(outs),
                           ctypes.cast(outs_p, ctypes.POINTER(ctypes.c_void_p)),
                           ctypes.cast(ctypes.byref(t), ctypes.c_void_p), ctypes.cast(err, ctypes.c_char_p),
                           len(err), kernel.rank if kernel.split is not None else 0,
                           ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64)),
                           ctypes.cast(counts, ctypes.POINTER(ctypes.c_uint64)))
        fn = getattr(self.lib, symbol or f"{name}_launch")
        fn.restype = ctypes.c_int
        rc = fn(ctypes.byref(args))
        if rc != 0:
            stub = ctypes.CDLL(str(stub_library()))
            stub.aclGetRecentErrMsg.restype = ctypes.c_char_p
            raise TwinError(f"{err.value.decode(errors='replace')}: "
                            f"{(stub.aclGetRecentErrMsg() or b'').decode(errors='replace')}")
        return self._shaped(kernel, outs, shape), t.as_tiling()


def stub_stats() -> dict:
    stub = ctypes.CDLL(str(stub_library()))
    out = (ctypes.c_uint64 * 8)()
    stub.twinAclStats(out)
    return dict(zip(("launches", "last_block_dim", "h2d_bytes", "d2h_bytes", "mallocs", "frees",
                     "device_info_queries", "capability_queries"), out))


class StandinBackend:
    """TEST ONLY: the CPU twin standing in for CANN in `cann` (`cann.set_backend_for_tests`).

    `detect` "finds" a toolkit whose libascendcl.so is the stand-in runtime; `build` compiles a
    kernel and its ACL launcher for the twin into one library per kernel that exports
    `autofuse_npu_launch` (AUTOFUSE_SINGLE_KERNEL), linked against the stand-in runtime. The op
    kernel then loads and launches it exactly as it would a CANN build. Nothing selects this
    from the environment: a test installs it by calling `cann.set_backend_for_tests`."""

    def __init__(self, route: int = 9):
        self.route = route

    def detect(self, environ=None):
        from . import cann

        stub = stub_library()
        version = {8: "8.1.RC1", 9: "9.0.0"}[self.route]
        return cann.Cann(stub.parent, Path(_build.cxx()), stub, None, version, self.route), ""

    def build(self, kernel: Kernel, found=None) -> Path:
        key, files, command = plan([kernel], acl=True, single=True, route=self.route)
        return _build.cached_build("twin", key, files, [command], "libtwin.so")
