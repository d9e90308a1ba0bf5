"""The codegen debug dump and the offline `python -m tf_autofuse codegen GRAPH -o DIR`.

For each fused kernel, `<dir>/codegen/<kernel>/` receives: program.txt, the generated sources
(<kernel>_kernel.cpp, _tiling.h, _host.cpp, the one-file <kernel>.asc and a CMakeLists.txt that
builds it with CANN (for CANN 8.0-8.4 no .asc: the CMakeLists builds the sources apart),
autofuse_launch.h), ub_plan.txt, tiling.txt (the tiling data for the program's static size, or example sizes, on 1, 8, 40 and 48 cores), build_commands.txt (the twin
g++ command and the CANN commands), twin_build.log (the twin compile of the kernel, which checks
that the source compiles against the emulated API) and, where CANN is installed, cann_build.log.
A kernel that cannot be generated gets refused.txt with the reason. Given the fused graph, each
MatMul with its epilogue (matmul_groups.py) gets a directory too, named after the fused node and
the MatMul: program.txt (the epilogue), matmul.txt, the mix kernel's files as above, with
ub_plan.txt for the block and tiling.txt for example M, or refused.txt with the reason the MatMul
stays a framework op; summary.txt lists every kernel. Nothing here raises: a dump that
fails is a warning.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterable, Mapping, Optional

from .._warn import warn_once
from ..rewriter.naming import FUSED_OPS
from . import build as _build
from . import cann as _cann
from . import cube as _cube
from . import ir, tiling, twin
from . import matmul_groups as _matmul_groups
from .ascendc import Kernel, generate

CORE_NUMS = (1, 8, 40, 48)
EXAMPLE_TOTALS = (1, 1000, 1 << 20)


def _static_total(kernel: Kernel) -> Optional[int]:
    try:
        program = ir.load(kernel.program)
    except ValueError:
        return None
    shape = program.inputs[0].view
    if shape is None or any(d < 0 for d in shape):
        return None
    total = 1
    for d in shape:
        total *= d
    return total


def _split_tiling_text(kernel: Kernel) -> str:
    program = ir.load(kernel.program)
    views = [(1,) * (kernel.rank - len(i.view)) + tuple(i.view) for i in program.inputs]
    shape = None
    if all(d >= 0 for v in views for d in v):
        import numpy as np
        shape = tuple(np.broadcast_shapes(*views))
    if kernel.split2 is not None:  # the column schedule: [outer, mid (reduced), inner]
        what = (f"axes [{kernel.split}, {kernel.split2}) reduced" if program.has_reduction else
                f"3-level broadcast, mid axes [{kernel.split}, {kernel.split2}), inputs {kernel.patterns}")
        lines = [f"# tiling data ({', '.join(n for _, n in tiling.ColumnTiling.fields())}); {what}"]
        dims = [kernel.column_dims(shape)] if shape else [(1, 1000, 64), (8, 300, 60), (1, 64, 30001)]
        if not shape:
            lines.append("# the shape is known at run time; examples of (outer, mid, inner)")
        for outer, mid, inner in dims:
            for cores in CORE_NUMS:
                t = tiling.compute_column(outer, mid, inner, cores, kernel.ub.max_tile,
                                          rows=not program.has_reduction)
                lines.append(f"outer={outer} mid={mid} inner={inner} cores={cores}: {t.as_dict()}")
        return "\n".join(lines) + "\n"
    fields = tiling.BcastTiling.fields()
    lines = [f"# tiling data ({', '.join(n for _, n in fields)}); {kernel.patterns} split at axis {kernel.split}"]
    pairs = [kernel.outer_inner(shape)] if shape else [(1, 1000), (64, 192), (1000, 30001)]
    if not shape:
        lines.append("# the shape is known at run time; examples of (outer, inner)")
    for outer, inner in pairs:
        for cores in CORE_NUMS:
            t = tiling.compute_bcast(outer, inner, cores, kernel.ub.max_tile, program.has_reduction)
            lines.append(f"outer={outer} inner={inner} cores={cores}: {t.as_dict()}")
    return "\n".join(lines) + "\n"


def _tiling_text(kernel: Kernel) -> str:
    if kernel.split is not None:
        return _split_tiling_text(kernel)
    total = _static_total(kernel)
    totals = [total] if total is not None else list(EXAMPLE_TOTALS)
    lines = [f"# tiling data ({', '.join(n for _, n in tiling.Tiling.fields())})",
             f"# {'static size' if total is not None else 'the size is known at run time; examples'}"]
    for t in totals:
        for cores in CORE_NUMS:
            lines.append(f"total={t} cores={cores}: {kernel.tiling(t, cores).as_dict()}")
    return "\n".join(lines) + "\n"


def dump_kernel(root: Path, name: str, program: str, verify: bool = True, environ=None,
                blacklist=None) -> Kernel:
    kernel = generate(program, name, blacklist)
    out = root / "codegen" / kernel.name
    out.mkdir(parents=True, exist_ok=True)
    (out / "program.txt").write_text(program)
    if not kernel.ok:
        (out / "refused.txt").write_text(kernel.reason + "\n")
        return kernel
    (out / "ub_plan.txt").write_text(kernel.ub.describe() + "\n")
    (out / "tiling.txt").write_text(_tiling_text(kernel))
    _write_build(out, kernel, verify, environ)
    return kernel


def _write_build(out: Path, kernel: Kernel, verify: bool, environ) -> None:
    """The sources, what builds them with CANN, the twin compile and, with CANN, its build."""
    for file_name, text in kernel.sources.items():
        (out / file_name).write_text(text)
    shutil.copy(_build.HOST_DIR / "autofuse_launch.h", out / "autofuse_launch.h")
    cann, why = _cann.detect(environ)
    target = cann or _cann.Cann(Path("${ASCEND_HOME_PATH}"), Path("bisheng"),
                                Path("${ASCEND_HOME_PATH}/lib64/libascendcl.so"), "cmake")
    files, cann_commands, _ = _cann.build_plan(kernel, target, environ)
    for file_name in (f"{kernel.name}.asc", "CMakeLists.txt"):
        if file_name in files:  # the .asc: CANN 8.5 / 9.x only
            (out / file_name).write_text(files[file_name])
    _, _, twin_command = twin.plan([kernel])
    commands = ["# CPU twin (g++ against tf_autofuse/codegen/twin/kernel_operator.h)",
                " ".join(twin_command),
                f"# CANN ({'found at ' + str(cann.home) if cann else why})",
                *(" ".join(c).replace("{dir}", str(out)) for c in cann_commands)]
    (out / "build_commands.txt").write_text("\n".join(commands) + "\n")
    if verify:
        try:
            lib = twin.build([kernel])
            shutil.copy(lib.path.parent / "build.log", out / "twin_build.log")
        except _build.CodegenBuildError as err:
            (out / "twin_build.log").write_text(str(err) + "\n")
    if cann:
        try:
            path = _cann.build_npu(kernel, cann)
            shutil.copy(path.parent / "build.log", out / "cann_build.log")
        except _build.CodegenBuildError as err:
            (out / "cann_build.log").write_text(str(err) + "\n")


def _cube_tiling_text(kernel: Kernel) -> str:
    mm = kernel.cube.matmul
    ms = [mm.m] if mm.m > 0 else [1, 1000, 1 << 16]
    lines = [f"# tiling data ({', '.join(n for _, n in _cube.CubeTiling.fields())}); {mm.describe()}",
             "# M is known at run time; examples" if mm.m <= 0 else "# static M"]
    for m in ms:
        for cores in CORE_NUMS:
            t = _cube.compute_tiling(kernel.cube.block, m, mm.n, mm.k, cores)
            lines.append(f"M={m} cores={cores}: {t.as_dict()}")
    return "\n".join(lines) + "\n"


def dump_matmul_group(root: Path, group, verify: bool = True, blacklist=None, environ=None) -> Kernel:
    """One MatMul and its epilogue (matmul_groups.MatmulGroup): the mix kernel's sources, or
    refused.txt with the reason the MatMul stays a framework op."""
    kernel = group.generate(blacklist)
    out = root / "codegen" / kernel.name
    out.mkdir(parents=True, exist_ok=True)
    (out / "program.txt").write_text(group.program)
    what = group.spec.describe() if group.spec else "MatMul"
    (out / "matmul.txt").write_text(f"{group.matmul}: {what}; the product is the epilogue's in{group.c_input}\n")
    if not kernel.ok:
        (out / "refused.txt").write_text(f"{group.matmul} stays a framework op: {kernel.reason}\n")
        return kernel
    (out / "ub_plan.txt").write_text(f"block {kernel.ub.max_tile} elements: {kernel.ub.describe()}\n")
    (out / "tiling.txt").write_text(_cube_tiling_text(kernel))
    _write_build(out, kernel, verify, environ)
    return kernel


def dump_codegen(debug_dir, fusions: Iterable, verify: bool = True, environ=None, graph_def=None,
                 shapes=None) -> list:
    """The hook for tf_autofuse/debug.py: dump every fusion (objects with .name and .program, or
    (name, program) pairs) and, given the fused graph, every MatMul with its epilogue
    (matmul_groups.py). Returns the Kernels; never raises."""
    kernels, groups = [], []
    root = Path(debug_dir)
    for fusion in fusions:
        name, program = (fusion.name, fusion.program) if hasattr(fusion, "program") else fusion
        try:
            kernels.append(dump_kernel(root, name, program, verify, environ))
        except OSError as err:
            warn_once(f"cannot write the codegen dump into {root}: {err}")
            break
    if graph_def is not None:
        try:
            found = _matmul_groups.find(graph_def, shapes)
        except Exception as err:  # noqa: BLE001 - a dump never breaks the pass
            warn_once(f"the MatMul epilogues of this graph are not dumped: {err}")
            found = []
        for group in found:
            try:
                groups.append((group, dump_matmul_group(root, group, verify, environ=environ)))
            except OSError as err:
                warn_once(f"cannot write the codegen dump into {root}: {err}")
                break
            except Exception as err:  # noqa: BLE001 - a dump never breaks the pass: a bug, said once
                warn_once(f"the Ascend dump of {group.matmul} and its epilogue failed (a bug): {err!r}")
    lines = [f"{k.name}: {'generated' if k.ok else 'CPU only: ' + k.reason}" for k in kernels]
    lines += [f"{k.name}: mix kernel of {g.matmul} and its epilogue" if k.ok
              else f"{k.name}: {g.matmul} stays a framework op: {k.reason}" for g, k in groups]
    kernels += [k for _, k in groups]
    if kernels:
        try:
            (root / "codegen" / "summary.txt").write_text("\n".join(lines) + "\n")
        except OSError:
            pass
    return kernels


def dump_if_enabled(fusions: Iterable, environ: Optional[Mapping[str, str]] = None) -> list:
    """dump_codegen into --debug_dir when AUTOFUSE_DFX_FLAGS has --codegen_compile_debug=true."""
    from .. import flags

    environ = os.environ if environ is None else environ
    try:
        values = flags.parse_items(environ.get(flags.DFX_FLAGS_ENV, ""), flags.DFX_FLAGS_ENV)
    except flags.FlagError:
        return []
    if not values.get("codegen_compile_debug"):
        return []
    return dump_codegen(values.get("debug_dir", "autofuse_debug"), fusions, environ=environ)


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m tf_autofuse codegen",
        description="Generate the Ascend C of every fused kernel of a saved graph. A graph that "
                    "holds AutofuseKernel nodes is dumped as is; any other graph is fused first.")
    parser.add_argument("graph", help="GraphDef, text (.pbtxt) or binary (.pb)")
    parser.add_argument("-o", "--output", required=True, help="output directory")
    parser.add_argument("--no-verify", action="store_true", help="skip the CPU twin compile")
    args = parser.parse_args(argv)

    from google.protobuf import text_format
    from tensorflow.core.framework import graph_pb2

    graph_def = graph_pb2.GraphDef()
    data = Path(args.graph).read_bytes()
    try:
        text_format.Parse(data.decode(), graph_def)
    except (UnicodeDecodeError, text_format.ParseError):
        graph_def.ParseFromString(data)
    fusions = [(n.name, n.attr["program"].s.decode()) for n in graph_def.node
               if n.op in FUSED_OPS]
    if not fusions:
        from ..rewriter import rewrite

        result = rewrite(graph_def)
        fusions = [(f.name, f.program) for f in result.fusions]
        graph_def = result.graph_def
    kernels = dump_codegen(args.output, fusions, verify=not args.no_verify, graph_def=graph_def)
    for k in kernels:
        if k.ok and k.cube is not None:
            print(f"{k.name}: mix kernel ({k.cube.matmul.describe()} + epilogue), block "
                  f"{k.cube.block.base_m} x {k.cube.block.base_n} -> {Path(args.output) / 'codegen' / k.name}")
        elif k.ok:
            print(f"{k.name}: generated, {k.ub.bytes_per_element} B of UB per element, "
                  f"tile {k.ub.max_tile} -> {Path(args.output) / 'codegen' / k.name}")
        else:
            print(f"{k.name}: CPU only: {k.reason}")
    if not kernels:
        print("no fused kernels in this graph")
    return 0
