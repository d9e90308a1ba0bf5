"""CANN detection, the toolchain build of generated kernels, and the NPU dispatch decision.

    detect()           the CANN install: $ASCEND_HOME_PATH / $ASCEND_TOOLKIT_HOME (or the usual
                       /usr/local/Ascend/ascend-toolkit/latest) holding bisheng and libascendcl.so,
                       and its version (SUPPORTED); another version is one warning and the CPU path
    build_npu(kernel)  builds one kernel library with CANN's CMake support for that version, cached
                       by content hash under <cache>/npu/<key>/; exports autofuse_npu_launch

Two generations of the CANN API are generated (ROUTES): CANN 8.0-8.4 build kernels with the
ascendc.cmake module (`ascendc_library`), launch them through the generated
`ACLRT_LAUNCH_KERNEL` and ask the device with `aclGetDeviceCapability`; CANN 8.5 and 9.x with
`find_package(ASC)` and the ASC language, `<<<...>>>` and `aclrtGetDeviceInfo`. cmake runs with
ASCEND_HOME_PATH set to the detected toolkit (asc-config.cmake reads it).
    prepare(...)       program -> library path, or None: the CPU path. Without CANN one info line
                       says so; a kernel that cannot be generated stays on the CPU (debug log line
                       with the reason); a build error is one warning. Remembered per process
    install_resolver() registers `resolve` with the C++ op kernel (cc/kernel.cc,
                       host/npu_dispatch.h) when a toolchain is found: each AutofuseKernel, when it
                       is constructed, asks it for the library of its own program. No library path
                       is ever read from a graph; the build never runs inside Grappler's pass
    note_fused_graph(graph_def, blacklist)
                       the bridge hook (after a rewrite): the session's
                       --autofuse_enhance_precision_blacklist as op names on the fused nodes, and,
                       without CANN, one info line per process saying the kernels run on the CPU
    set_backend_for_tests(backend)
                       TEST ONLY: twin.StandinBackend stands in for CANN (kernels built for the CPU
                       twin, linked against the stand-in libascendcl.so), so the whole path runs in CI

A library is found by the hash of the program's generated sources, the toolchain and the build
commands, under $TF_AUTOFUSE_CACHE_DIR/npu/<key>/; `python -m tf_autofuse codegen` builds the same
entries ahead of time. The real-hardware path is untested here (no CANN on these machines); the
stand-in runtime in twin/ exercises the launcher and its argument passing in CI.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Mapping, Optional

from .._warn import warn_once
from ..rewriter.naming import FUSED_OPS
from . import build as _build
from .ascendc import Kernel, generate, precision_blacklist

LOG = logging.getLogger("tf_autofuse")
BLACKLIST_ATTR = "_autofuse_precision_blacklist"  # IR op names, comma-separated
DEFAULT_HOME = "/usr/local/Ascend/ascend-toolkit/latest"
ARCH_ENV = "AUTOFUSE_NPU_ARCH"  # --npu-arch, default dav-2201 (Atlas A2)
_BISHENG = ("compiler/ccec_compiler/bin/bisheng", "ccec_compiler/bin/bisheng",
            "tools/bisheng_compiler/bin/bisheng", "compiler/bin/bisheng", "bin/bisheng")
_ACL = ("lib64/libascendcl.so", "runtime/lib64/libascendcl.so", "acllib/lib64/libascendcl.so",
        "aarch64-linux/lib64/libascendcl.so", "x86_64-linux/lib64/libascendcl.so")

_lock = threading.Lock()
_said_no_cann = False
_failed: dict = {}  # build key -> error (a failed build is not retried in this process)


SUPPORTED = "CANN 8.0 to 9.x"
# The CANN API generation a version is built for: 8 = ascendc_library + ACLRT_LAUNCH_KERNEL +
# aclGetDeviceCapability (CANN 8.0-8.4); 9 = find_package(ASC) + aclrtGetDeviceInfo (8.5, 9.x).
ROUTES = {8: "CANN 8.0-8.4 (ascendc_library, ACLRT_LAUNCH_KERNEL, aclGetDeviceCapability)",
          9: "CANN 8.5 / 9.x (find_package(ASC), <<<...>>>, aclrtGetDeviceInfo)"}
_VERSION_FILES = ("compiler/version.info", "runtime/version.info", "version.info", "version.cfg",
                  "x86_64-linux/ascend_toolkit_install.info", "aarch64-linux/ascend_toolkit_install.info")


@dataclasses.dataclass(frozen=True)
class Cann:
    home: Path
    bisheng: Path
    libascendcl: Path
    cmake: Optional[str]
    version: str = "9.0.0"
    route: int = 9  # ROUTES


def toolkit_version(home: Path) -> Optional[str]:
    """The toolkit's version string ("8.1.RC1", "9.0.0"), from its version files; None if none."""
    for name in _VERSION_FILES:
        try:
            text = (Path(home) / name).read_text(errors="replace")
        except OSError:
            continue
        match = re.search(r"^\s*(?:Version|version)\s*=\s*([0-9][\w.\-]*)", text, re.M)
        if match:
            return match.group(1)
    return None


def route_of(version: Optional[str]):
    """(the API generation of `version`, "") or (None, why it is not supported)."""
    match = re.match(r"(\d+)\.(\d+)", version or "")
    if not match:
        return None, f"its version could not be read{f' ({version!r})' if version else ''}"
    major, minor = int(match.group(1)), int(match.group(2))
    if major == 8 and minor < 5:
        return 8, ""
    if (major == 8 and minor >= 5) or major == 9:
        return 9, ""
    return None, f"version {version} is not supported"


def detect(environ: Optional[Mapping[str, str]] = None):
    """(Cann, "") when a usable install is found, else (None, what was missing)."""
    environ = os.environ if environ is None else environ
    candidates = [environ.get("ASCEND_HOME_PATH"), environ.get("ASCEND_TOOLKIT_HOME"), DEFAULT_HOME]
    tried = []
    for home in filter(None, candidates):
        root = Path(home)
        if not root.is_dir():
            tried.append(f"{home} (no such directory)")
            continue
        bisheng = next((root / p for p in _BISHENG if (root / p).is_file()), None)
        if bisheng is None:
            found = shutil.which("bisheng", path=environ.get("PATH"))
            bisheng = Path(found) if found else None
        acl = next((root / p for p in _ACL if (root / p).is_file()), None)
        if bisheng is None or acl is None:
            missing = " and ".join(w for w, v in (("bisheng", bisheng), ("libascendcl.so", acl)) if v is None)
            tried.append(f"{home} (no {missing})")
            continue
        version = toolkit_version(root)
        route, why = route_of(version)
        if route is None:
            warn_once(f"the CANN toolkit at {home}: {why} (supported: {SUPPORTED}); fused kernels run "
                      "on the CPU")
            return None, f"the CANN toolkit at {home}: {why}"
        return Cann(root, bisheng, acl, shutil.which("cmake", path=environ.get("PATH")), version, route), ""
    return None, "no CANN toolkit: looked in " + ", ".join(tried or ["nothing"])


def cmake_lists(kernel: Kernel, cann: Cann, arch: str) -> str:
    if cann.route == 8:
        return _cmake_lists_8(kernel, cann, arch)
    return f"""\
# Generated by tf_autofuse.codegen: builds lib{kernel.name}.so with CANN's ASC language support.
cmake_minimum_required(VERSION 3.16)
find_package(ASC REQUIRED HINTS {cann.home}/lib64/cmake $ENV{{ASCEND_HOME_PATH}}/lib64/cmake)
project({kernel.name} LANGUAGES ASC CXX)
add_library({kernel.name} SHARED {kernel.name}.asc)
target_compile_definitions({kernel.name} PRIVATE AUTOFUSE_WITH_ACL AUTOFUSE_SINGLE_KERNEL AUTOFUSE_CANN_ROUTE=9)
target_compile_options({kernel.name} PRIVATE $<$<COMPILE_LANGUAGE:ASC>:--npu-arch={arch}>)
target_include_directories({kernel.name} PRIVATE ${{CMAKE_CURRENT_SOURCE_DIR}} {_build.HOST_DIR}
                           {cann.home}/include)
target_link_directories({kernel.name} PRIVATE {cann.libascendcl.parent})
target_link_libraries({kernel.name} PRIVATE ascendcl)
set_target_properties({kernel.name} PROPERTIES OUTPUT_NAME {kernel.name} LIBRARY_OUTPUT_DIRECTORY ${{CMAKE_CURRENT_SOURCE_DIR}})
"""


_SOC = {"dav-2201": "Ascend910B1", "dav-2002": "Ascend310P1"}  # --npu-arch -> ascendc.cmake's SOC_VERSION


def _cmake_lists_8(kernel: Kernel, cann: Cann, arch: str) -> str:
    n = kernel.name
    return f"""\
# Generated by tf_autofuse.codegen: builds lib{n}.so with CANN 8.0-8.4's ascendc.cmake module.
cmake_minimum_required(VERSION 3.16)
project({n} LANGUAGES C CXX)
set(SOC_VERSION "{_SOC.get(arch, arch)}" CACHE STRING "the Ascend SoC")
set(ASCEND_CANN_PACKAGE_PATH "{cann.home}" CACHE PATH "the CANN toolkit")
set(RUN_MODE "npu")
foreach(dir tools/tikcpp/ascendc_kernel_cmake compiler/tikcpp/ascendc_kernel_cmake ascendc_devkit/tikcpp/samples/cmake)
  if(NOT ASCENDC_CMAKE_DIR AND EXISTS ${{ASCEND_CANN_PACKAGE_PATH}}/${{dir}}/ascendc.cmake)
    set(ASCENDC_CMAKE_DIR ${{ASCEND_CANN_PACKAGE_PATH}}/${{dir}})
  endif()
endforeach()
if(NOT ASCENDC_CMAKE_DIR)
  message(FATAL_ERROR "ascendc.cmake not found under ${{ASCEND_CANN_PACKAGE_PATH}}")
endif()
include(${{ASCENDC_CMAKE_DIR}}/ascendc.cmake)
# the device kernel; the module generates aclrtlaunch_{n}.h (ACLRT_LAUNCH_KERNEL({n}))
ascendc_library({n}_device STATIC {n}_kernel.cpp)
add_library({n} SHARED {n}_host.cpp)
target_compile_definitions({n} PRIVATE AUTOFUSE_WITH_ACL AUTOFUSE_SINGLE_KERNEL AUTOFUSE_CANN_ROUTE=8)
target_include_directories({n} PRIVATE ${{CMAKE_CURRENT_SOURCE_DIR}} {_build.HOST_DIR} {cann.home}/include)
target_link_directories({n} PRIVATE {cann.libascendcl.parent})
target_link_libraries({n} PRIVATE {n}_device ascendcl)
set_target_properties({n} PROPERTIES OUTPUT_NAME {n} LIBRARY_OUTPUT_DIRECTORY ${{CMAKE_CURRENT_SOURCE_DIR}})
"""


def build_plan(kernel: Kernel, cann: Cann, environ=None):
    """(files, commands, product) of the CANN build of one kernel."""
    environ = os.environ if environ is None else environ
    arch = environ.get(ARCH_ENV, "dav-2201")
    files = dict(kernel.sources)
    if cann.route == 9:
        files[f"{kernel.name}.asc"] = (f'// One translation unit: device kernel + host tiling + ACL launcher.\n'
                                       f'#include "{kernel.name}_kernel.cpp"\n#include "{kernel.name}_host.cpp"\n')
    files["CMakeLists.txt"] = cmake_lists(kernel, cann, arch)
    cmake = cann.cmake or "cmake"
    env = ["env", f"ASCEND_HOME_PATH={cann.home}"]  # asc-config.cmake reads it from the environment
    commands = [[*env, cmake, "-S", "{dir}", "-B", "{dir}/build", "-DCMAKE_BUILD_TYPE=Release"],
                [*env, cmake, "--build", "{dir}/build", "-j", "2"]]
    return files, commands, f"lib{kernel.name}.so"


def build_npu(kernel: Kernel, cann: Cann) -> Path:
    """The kernel's NPU library, built (or found in the cache). Raises CodegenBuildError."""
    files, commands, product = build_plan(kernel, cann)
    key = _build.key_of(_build.support_digest(), str(cann.home), str(cann.bisheng), commands,
                        *(f"{n}\0{t}" for n, t in sorted(files.items())))
    with _lock:
        if key in _failed:
            raise _failed[key]
    try:
        return _build.cached_build("npu", key, files, commands, product)
    except _build.CodegenBuildError as err:
        with _lock:
            _failed[key] = err
        raise


# Tests only: a stand-in for the CANN toolchain (twin.StandinBackend builds kernels for the CPU twin
# and its stand-in ACL runtime). Set by an explicit call, never from the environment, so users
# cannot reach it by accident.
_backend = None
_libraries: dict = {}  # (program, name, blacklist, toolkit) -> library path or None, per process


def set_backend_for_tests(backend) -> None:
    """TEST ONLY. `backend.detect(environ)` -> (Cann or None, why) and `backend.build(kernel, cann)`
    -> library path replace `detect` and `build_npu`; None restores them."""
    global _backend
    with _lock:
        _backend = backend
        _libraries.clear()
    install_resolver()


def _detect(environ):
    backend = _backend
    return backend.detect(environ) if backend is not None else detect(environ)


def _say_no_cann(why: str) -> None:
    global _said_no_cann
    with _lock:
        first, _said_no_cann = not _said_no_cann, True
    if first:
        LOG.info("tf_autofuse: %s; fused kernels run on the CPU", why)


def _library(program: str, name: str, found: Cann, blacklist: frozenset) -> Optional[Path]:
    key = (program, name, blacklist, found)
    with _lock:
        if key in _libraries:
            return _libraries[key]
    kernel = generate(program, name, blacklist)
    if not kernel.ok:
        LOG.debug("tf_autofuse: %s stays on the CPU: %s", kernel.name, kernel.reason)
        path = None
    else:
        backend = _backend
        try:
            path = backend.build(kernel, found) if backend is not None else build_npu(kernel, found)
        except _build.CodegenBuildError as err:
            warn_once(f"{kernel.name}: the NPU build failed, the kernel runs on the CPU: {err}")
            return None  # not memoised here: build_npu remembers the failure itself
    with _lock:
        if len(_libraries) > 4096:
            _libraries.clear()
        _libraries[key] = path
    return path


def prepare(program: str, name: str, environ=None, blacklist=None) -> Optional[Path]:
    """The NPU library for this fused kernel, or None: run it on the CPU.

    blacklist: IR op names computed in half (--autofuse_enhance_precision_blacklist); None reads
    AUTOFUSE_FLAGS."""
    found, why = _detect(environ)
    if found is None:
        _say_no_cann(why)
        return None
    if blacklist is None:
        blacklist = precision_blacklist(environ)
    return _library(program, name, found, frozenset(blacklist))


def note_fused_graph(graph_def, blacklist, environ=None) -> int:
    """Put the session's precision blacklist (IR op names) on every AutofuseKernel node, for the
    NPU build at kernel construction (nothing when it is empty); without a toolchain, say once
    that fused kernels run on the CPU. Returns the nodes stamped; never raises, builds nothing."""
    count = 0
    try:
        nodes = [n for n in graph_def.node if n.op in FUSED_OPS]
        found, why = _detect(environ) if nodes else (None, "")
        if nodes and found is None:
            _say_no_cann(why)
        text = ",".join(sorted(blacklist)).encode()
        for node in nodes if blacklist else ():
            node.attr[BLACKLIST_ATTR].s = text
            count += 1
    except Exception as err:  # noqa: BLE001 - never break the pass: the CPU kernel runs
        warn_once(f"fused kernels run on the CPU: {type(err).__name__}: {err}")
    return count


_resolved: dict = {}  # node name -> the library the resolver gave it (or None), this process


def _blacklist_of(text: str) -> frozenset:
    """The op names of a blacklist attr; names that are no catalog op are dropped."""
    from ..rewriter import catalog

    names = {n.strip() for n in text.split(",") if n.strip()}
    return frozenset(n for n in names if catalog.for_ir_name(n) is not None)


def resolve(program: str, node: str, blacklist: str = "") -> Optional[Path]:
    """The NPU library of a fused program (generated and built, or found in the cache), or None:
    the CPU path. Called by the op kernel at construction through the registered resolver; never
    raises (a failure is one warning)."""
    try:
        path = prepare(program, node, blacklist=_blacklist_of(blacklist))
    except Exception as err:  # noqa: BLE001 - a kernel must construct: the CPU path runs
        warn_once(f"{node}: no NPU kernel, the CPU kernel runs: {type(err).__name__}: {err}")
        path = None
    with _lock:
        if len(_resolved) > 4096:
            _resolved.clear()
        _resolved[node] = path
    return path


def resolved_libraries(clear: bool = False) -> dict:
    """{node name: library path or None} of the kernels constructed in this process (since the
    last call with clear=True)."""
    with _lock:
        out = {name: (str(path) if path else None) for name, path in _resolved.items()}
        if clear:
            _resolved.clear()
        return out


_RESOLVER_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                  ctypes.c_void_p, ctypes.c_int)


def _resolver(program, node, blacklist, out, out_len) -> int:
    try:
        path = resolve(program.decode(), node.decode(), (blacklist or b"").decode())
        data = str(path).encode() if path else b""
        if not data or len(data) >= out_len:
            return 0
        ctypes.memmove(out, data + b"\0", len(data) + 1)
        return 1
    except Exception:  # noqa: BLE001 - never unwind into the C++ caller
        return 0


_resolver_fn = _RESOLVER_TYPE(_resolver)  # kept alive for the life of the process


def install_resolver(cdll=None, environ=None) -> bool:
    """Register `resolve` with the loaded op library when a toolchain is found (or a test backend
    is set), else unregister it; True when registered. `cdll`: the op library (ctypes), default
    the one tf_autofuse loaded (nothing when it is not loaded yet)."""
    if cdll is None:
        from .. import _native

        cdll = _native.loaded_cdll()
        if cdll is None:
            return False
    found, _ = _detect(environ)
    cdll.autofuse_set_npu_resolver(_resolver_fn if found is not None else None)
    return found is not None


def reset_for_tests() -> None:
    global _said_no_cann
    with _lock:
        _said_no_cann = False
        _failed.clear()
        _libraries.clear()
        _resolved.clear()
