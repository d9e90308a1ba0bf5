"""Optional: every generated kernel of the codegen suite compiled against the real Ascend C headers,
in their CPU-debug mode (docs/ASCEND.md, "CANN versions, and what has been verified"), with g++
and, where installed, clang++.

Skipped unless headers are given. Either a CANN install ($ASCEND_HOME_PATH, with
compiler/tikcpp/tikcfw and tools/tikicpulib/lib/include), or the open sources:

    ASCENDC_HEADERS=<asc-devkit checkout>           include/ and impl/ (and their api folders)
    ASCENDC_CPUDEBUG=<asc-tools>/cpudebug/include   the CPU-debug framework headers
    ASCENDC_EXTRA_INCLUDE=<dir>[:<dir>...]          what the open repositories do not hold: the
                                                    closed intrinsic stubs (stub_fun.h) and the
                                                    generated kernel_tiling/kernel_tiling.h

The headers' licence limits their use to Huawei AI processors: point the test at a copy outside
the repository, never vendor them. docs/ASCEND.md records what was run and its result."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from test_codegen_schedules import suite_kernels

FLAGS = ["-std=c++17", "-D__CCE_AICORE__=220", "-D__DAV_C220__", "-D__CCE_KT_TEST__=1",
         "-DASCENDC_CPU_DEBUG=1", "-DASCENDC_DEBUG=1", "-D_GLIBCXX_USE_CXX11_ABI=0", "-fsyntax-only"]
CLANG_FLAGS = ["-Wno-c++11-narrowing"]  # the headers' own check code narrows in braces


def include_dirs() -> list:
    """The include folders of the real headers, or [] when none are given."""
    dirs = []
    headers = os.environ.get("ASCENDC_HEADERS")
    home = os.environ.get("ASCEND_HOME_PATH")
    if headers:
        root = Path(headers)
        dirs = [root, root / "include", root / "impl"]
        dirs += [root / side / api for side in ("include", "impl") for api in ("basic_api", "adv_api", "utils")]
        if os.environ.get("ASCENDC_CPUDEBUG"):
            dirs.append(Path(os.environ["ASCENDC_CPUDEBUG"]))
    elif home and (Path(home) / "compiler/tikcpp/tikcfw").is_dir():
        tikcfw = Path(home) / "compiler/tikcpp/tikcfw"
        dirs = [tikcfw, tikcfw / "impl", tikcfw / "interface", Path(home) / "tools/tikicpulib/lib/include",
                Path(home) / "include"]
    if dirs:
        dirs += [Path(d) for d in os.environ.get("ASCENDC_EXTRA_INCLUDE", "").split(":") if d]
    return dirs


pytestmark = pytest.mark.skipif(not include_dirs(), reason="no Ascend C headers: set ASCENDC_HEADERS "
                                "(and ASCENDC_CPUDEBUG, ASCENDC_EXTRA_INCLUDE) or ASCEND_HOME_PATH")


@pytest.fixture(scope="module")
def kernels_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("real_headers")
    kernels = suite_kernels("real")
    for kernel in kernels:
        for name, text in kernel.sources.items():
            (out / name).write_text(text)
    # one translation unit: the headers are the expensive part (each kernel has its own namespace)
    (out / "all_kernels.cpp").write_text("".join(f'#include "{k.name}_kernel.cpp"\n' for k in kernels))
    return out, kernels


@pytest.mark.parametrize("compiler", ["g++", "clang++"])
def test_every_generated_kernel_compiles_against_the_real_headers(kernels_dir, compiler):
    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} is not installed")
    out, kernels = kernels_dir
    assert len(kernels) > 150
    command = [compiler, *FLAGS, *(CLANG_FLAGS if "clang" in compiler else []),
               *(f"-I{d}" for d in include_dirs()), f"-I{out}", "-fmax-errors=50" if compiler == "g++" else
               "-ferror-limit=50", str(out / "all_kernels.cpp")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert proc.returncode == 0, "\n".join(errors[:40])


@pytest.mark.parametrize("compiler", ["g++", "clang++"])
def test_matmul_mix_kernels_compile_against_the_real_headers(tmp_path, compiler):
    """The mix kernels of test_codegen_matmul.py (Matmul API, `lib/matmul_intf.h`, TCubeTiling
    from `kernel_tiling/kernel_tiling.h`), -D__NPU_ARCH__=2201 as a dav-2201 build defines it."""
    from test_codegen_matmul import CASES

    from tf_autofuse.codegen import cube

    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} is not installed")
    kernels = [cube.generate_matmul(c.mm, c.program, 0, c.name) for c in CASES.values()]
    for kernel in kernels:
        for name, text in kernel.sources.items():
            (tmp_path / name).write_text(text)
    (tmp_path / "all_kernels.cpp").write_text("".join(f'#include "{k.name}_kernel.cpp"\n' for k in kernels))
    command = [compiler, *FLAGS, "-D__NPU_ARCH__=2201", *(CLANG_FLAGS if "clang" in compiler else []),
               *(f"-I{d}" for d in include_dirs()), f"-I{tmp_path}", str(tmp_path / "all_kernels.cpp")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert proc.returncode == 0, "\n".join(errors[:40])
