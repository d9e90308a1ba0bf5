"""Build the C++ library (op, CPU kernel, Grappler bridge) against a TensorFlow, and find the
library this process loads.

A built library lives in one of two places:

- The package's `_lib/` folder, filled when the package is installed (`pip install .`,
  `pip wheel .`: setup.py calls `build_for_install`). On x86-64 it holds one library per
  instruction-set level (x86-64-v2, v3 with AVX2/FMA/F16C, v4 with AVX-512), none built for the
  build machine alone; on other machines one library with the compiler's defaults. A manifest
  records the TensorFlow (version, git version, C++ ABI, compile and link flags), the Python and
  the sources they were built from. At import the highest level this CPU runs is loaded, when the
  manifest matches the running TensorFlow: no compiler, no pause.
- A cache (`$TF_AUTOFUSE_CACHE_DIR`, else ~/.cache/tf_autofuse), filled on first import when the
  package holds no library for the running TensorFlow (an editable install, a TensorFlow changed
  after the install, an install that could not see TensorFlow). Built with -march=native, under a
  key covering everything it depends on: sources, TensorFlow flags, compiler, Python, the CPU's
  instruction-set flags. Builds are serialised by a file lock and land atomically.

TF_AUTOFUSE_BUILD chooses: `portable` (default), `native` (install builds one -march=native
library; import loads a native build, building it in the cache if needed), `none` (install builds
nothing). TF_AUTOFUSE_ISA=x86-64-v2|x86-64-v3|x86-64-v4 loads a lower installed level than the CPU
allows. setup.py loads this file on its own, so it imports nothing from the package.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_DIR = PACKAGE_DIR / "cc"
# The NPU dispatch headers the op kernel includes (npu_dispatch.h loads a generated kernel
# library with dlopen; autofuse_launch.h is the ABI shared with the generated launchers).
HOST_SUBDIR = Path("codegen") / "host"
HOST_DIR = PACKAGE_DIR / HOST_SUBDIR
PREBUILT_DIR = PACKAGE_DIR / "_lib"
MANIFEST = "build.json"
CACHE_ENV = "TF_AUTOFUSE_CACHE_DIR"
BUILD_ENV = "TF_AUTOFUSE_BUILD"
ISA_ENV = "TF_AUTOFUSE_ISA"
PYTHON_ENV = "TF_AUTOFUSE_PYTHON"

# The TensorFlow releases the sources build against (cc/tf_compat.h holds their differences).
SUPPORTED = ((2, 15), (2, 21))

_COMMON_FLAGS = ["-O3", "-fPIC", "-fvisibility-inlines-hidden",
                 "-Wno-deprecated-declarations", "-Wno-ignored-attributes"]
# x86-64 levels of the psABI, lowest first: each is built at install, and the highest one whose
# /proc/cpuinfo flags this CPU has is loaded. TensorFlow's own wheels need AVX, so v2 is a floor
# no TensorFlow machine is below.
X86_LEVELS = {
    "x86-64-v2": ("cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"),
    "x86-64-v3": ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"),
    "x86-64-v4": ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
}
GENERIC = "generic"  # a non-x86 machine: the compiler's default target
NATIVE = "native"

# TF_AUTOFUSE_SANITIZE=1 builds (and caches under its own key and name) a library instrumented
# with AddressSanitizer and UndefinedBehaviorSanitizer; scripts/sanitize.sh runs the tests
# against it with libasan/libubsan preloaded. Not for production: it is several times slower.
SANITIZE_ENV = "TF_AUTOFUSE_SANITIZE"
# null / nonnull-attribute checks are left out: with them g++ 12 rejects absl's constexpr
# function-pointer comparisons in TensorFlow's headers ("is not a constant expression").
_SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                   "-fno-sanitize=null,nonnull-attribute,returns-nonnull-attribute",
                   "-fno-sanitize-recover=undefined", "-g"]
# The Grappler bridge is left uninstrumented: with ASan on, absl's swiss tables change their
# layout (generation counters), and the bridge shares GraphProperties' absl maps with the
# uninstrumented TensorFlow, which then crashes in InferStatically. The kernel, interpreter and
# program parser only pass TensorFlow plain tensors and strings.
_UNSANITIZED_SOURCES = frozenset({"optimizer.cc"})


class BuildError(RuntimeError):
    """The kernel library could not be built; the message says what to install or fix."""


class UnsupportedTensorFlow(ImportError):
    """The installed TensorFlow is outside SUPPORTED: tf_autofuse does not install or import."""


def sanitize() -> bool:
    return os.environ.get(SANITIZE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def build_mode() -> str:
    mode = os.environ.get(BUILD_ENV, "").strip().lower() or "portable"
    if mode not in ("portable", NATIVE, "none"):
        raise BuildError(f"{BUILD_ENV}={os.environ[BUILD_ENV]!r} is not one of portable, native, "
                         f"none")
    return mode


# ---------------------------------------------------------------------------------------------
# The TensorFlow a library is built against

def supported_range() -> str:
    (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED
    return f"{lo_major}.{lo_minor} to {hi_major}.{hi_minor}"


def check_supported(version: str) -> None:
    """Raise UnsupportedTensorFlow naming `version` when it is outside SUPPORTED."""
    try:
        major_minor = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        major_minor = None
    if major_minor is None or not SUPPORTED[0] <= major_minor <= SUPPORTED[1]:
        raise UnsupportedTensorFlow(
            f"tf_autofuse supports TensorFlow {supported_range()}, but TensorFlow {version} is "
            f"installed. Install a supported release (e.g. `pip install "
            f"'tensorflow-cpu>={SUPPORTED[0][0]}.{SUPPORTED[0][1]},<{SUPPORTED[1][0]}."
            f"{SUPPORTED[1][1] + 1}'`) or a tf_autofuse release that supports {version}.")


@dataclasses.dataclass(frozen=True)
class Target:
    """A TensorFlow installation and the Python it runs in: what a library is compiled for."""

    version: str
    git_version: str
    cxx11_abi: int
    compile_flags: tuple
    link_flags: tuple
    python_include: str
    python_version: str

    def abi(self) -> dict:
        """What a built library depends on, without the paths that differ between machines."""
        return {"tensorflow": self.version, "git_version": self.git_version,
                "cxx11_abi": self.cxx11_abi, "python": self.python_version,
                "compile_flags": [f for f in self.compile_flags if not f.startswith("-I")],
                "link_flags": [f for f in self.link_flags if not f.startswith("-L")]}


# Run in the target interpreter: its TensorFlow and its Python headers, as JSON on the last line.
_PROBE = """
import json, sys, sysconfig
import tensorflow as tf
print(json.dumps({"version": tf.__version__, "git_version": tf.version.GIT_VERSION,
                  "cxx11_abi": int(tf.sysconfig.CXX11_ABI_FLAG),
                  "compile_flags": tf.sysconfig.get_compile_flags(),
                  "link_flags": tf.sysconfig.get_link_flags(),
                  "python_include": sysconfig.get_paths()["include"],
                  "python_version": "%d.%d" % sys.version_info[:2]}))
"""


def current_target() -> Target:
    """The TensorFlow of this process."""
    import tensorflow as tf

    return Target(tf.__version__, tf.version.GIT_VERSION, int(tf.sysconfig.CXX11_ABI_FLAG),
                  tuple(tf.sysconfig.get_compile_flags()), tuple(tf.sysconfig.get_link_flags()),
                  sysconfig.get_paths()["include"], "%d.%d" % sys.version_info[:2])


def _unisolated_environ() -> dict:
    """This environment without pip's build isolation: pip runs a build backend with the target
    interpreter, hiding its site-packages behind a PYTHONPATH entry of its own (pip-build-env-*)
    and PYTHONNOUSERSITE; without them the same interpreter sees the user's packages."""
    env = dict(os.environ)
    entries = env.get("PYTHONPATH", "").split(os.pathsep)
    kept = [e for e in entries if e and "pip-build-env" not in e]
    if len(kept) != len([e for e in entries if e]):
        env.pop("PYTHONNOUSERSITE", None)
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        env.pop("PYTHONPATH", None)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def install_target() -> tuple[Optional[Target], str]:
    """The TensorFlow the package is being installed next to, asked of the target interpreter
    ($TF_AUTOFUSE_PYTHON, else the one running the build) outside any build isolation.
    Returns (target, "") or (None, why none was found)."""
    python = os.environ.get(PYTHON_ENV) or sys.executable
    try:
        with tempfile.TemporaryDirectory() as cwd:  # nothing of the source tree on sys.path
            proc = subprocess.run([python, "-c", _PROBE], cwd=cwd, env=_unisolated_environ(),
                                  capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"{python} did not run: {err}"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"{python} cannot import tensorflow ({last})"
    try:
        fields = json.loads(proc.stdout.strip().splitlines()[-1])
        fields["compile_flags"] = tuple(fields["compile_flags"])
        fields["link_flags"] = tuple(fields["link_flags"])
        return Target(**fields), ""
    except (ValueError, IndexError, KeyError, TypeError) as err:
        return None, f"{python} gave no TensorFlow description ({err})"


# ---------------------------------------------------------------------------------------------
# Sources, compiler, instruction sets

def sources(package: Path = PACKAGE_DIR) -> list[Path]:
    """The translation units: every .cc under cc/, subfolders included."""
    return sorted((package / "cc").rglob("*.cc"))


def _inputs(package: Path) -> list[Path]:
    """Everything the library is compiled from: sources, headers, the NPU host headers, and the
    op table (rewriter/catalog.py) with its C++ writer, which generate op_table.inc."""
    return sorted(p for p in [*(package / "cc").rglob("*"),
                              *(package / HOST_SUBDIR).glob("*.h"),
                              *(package / "rewriter" / name for name in OP_TABLE_SOURCES)]
                  if p.suffix in (".cc", ".h", ".py") and p.is_file())


# The op table as C++ (rewriter/catalog_cc.py), written in the target interpreter: the catalog
# reads TensorFlow's dtype enums, which a build environment may not have. The two modules are
# loaded from `package` under a package name of their own, so that tf_autofuse's __init__ (which
# loads the kernel library) does not run.
OP_TABLE_SOURCES = ("catalog.py", "catalog_cc.py")
_OP_TABLE_WRITER = """
import importlib, sys, types
package = types.ModuleType("tf_autofuse_op_table")
package.__path__ = [sys.argv[1]]
sys.modules[package.__name__] = package
sys.stdout.write(importlib.import_module(package.__name__ + ".catalog_cc").header_text())
"""


def op_table_text(package: Path = PACKAGE_DIR) -> str:
    """op_table.inc for the package at `package` (generated from its rewriter/catalog.py)."""
    python = os.environ.get(PYTHON_ENV) or sys.executable
    try:
        with tempfile.TemporaryDirectory() as cwd:
            # absolute: the writer runs in a folder of its own, the build's paths may be relative
            proc = subprocess.run([python, "-c", _OP_TABLE_WRITER,
                                   str((package / "rewriter").resolve())],
                                  cwd=cwd, env=_unisolated_environ(), capture_output=True,
                                  text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as err:
        raise BuildError(f"writing the op table with {python} failed: {err}") from None
    if proc.returncode != 0 or not proc.stdout.strip():
        raise BuildError(f"writing the op table from {package / 'rewriter' / 'catalog.py'} with "
                         f"{python} failed:\n{proc.stderr.strip()[-2000:]}")
    return proc.stdout


def source_digest(package: Path = PACKAGE_DIR) -> str:
    """A digest of the sources of the package at `package` (an installed one, or one being
    built: the install compiles the copy that ships and digests that same copy)."""
    digest = hashlib.sha256()
    for path in _inputs(package):
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx or not shutil.which(cxx):
        raise BuildError(
            "tf_autofuse builds its kernel library when it has none for the installed "
            "TensorFlow, and needs a C++17 compiler for that, but none was found (looked for "
            "$CXX, g++, c++). Install one, e.g. `apt-get install g++`, or set CXX to its path.")
    return cxx


def _compiler_version(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True,
                              check=True).stdout.splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError) as err:
        raise BuildError(f"the C++ compiler {cxx!r} does not run: {err}") from None


def cpu_flags() -> frozenset:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def portable_levels() -> list[str]:
    """The libraries a portable build makes for this machine's architecture, lowest first."""
    return list(X86_LEVELS) if platform.machine() in ("x86_64", "AMD64") else [GENERIC]


def level_features(level: str) -> frozenset:
    """The /proc/cpuinfo flags a level needs (each level includes the ones below it)."""
    if level not in X86_LEVELS:
        return frozenset()
    names = list(X86_LEVELS)
    return frozenset(f for lower in names[:names.index(level) + 1] for f in X86_LEVELS[lower])


def supported_levels(flags: Optional[frozenset] = None) -> list[str]:
    """The portable levels this CPU runs, lowest first."""
    flags = cpu_flags() if flags is None else flags
    return [level for level in portable_levels() if level_features(level) <= flags]


def _native_exclusions(cxx: str) -> list[str]:
    """Instruction sets -march=native would enable that TensorFlow's bundled Eigen cannot build.

    Eigen's AVX512-FP16 packet header, included whenever the compiler defines __AVX512FP16__
    (Sapphire Rapids and later with g++ >= 12), does not compile in TensorFlow 2.21's copy
    ("expected initializer before '<'" in PacketMathFP16.h). The kernels convert half with F16C
    and compute in float, so they lose nothing without it. Asked of the compiler rather than read
    from /proc/cpuinfo: a compiler that does not know the extension neither enables it nor
    accepts the flag that turns it off.
    """
    probe = subprocess.run([cxx, "-march=native", "-dM", "-E", "-x", "c++", os.devnull],
                           capture_output=True, text=True)
    if probe.returncode == 0 and "__AVX512FP16__" in probe.stdout:
        return ["-mno-avx512fp16"]
    return []


# On x86 the assembler pads so that no jump crosses or ends on a 32-byte boundary. Intel cores
# cache decoded micro-ops by 32-byte window, and a tight loop whose compare-and-branch straddles
# a boundary runs from the legacy decoders instead (the JCC erratum microcode update of the
# Skylake family made it so there; AVX-512 Xeons after it still showed it on our loops). Where a
# loop lands depends on how the rest of the library happens to be laid out, so any edit
# anywhere could slow an unrelated kernel (the streaming store loop of abs->relu->exp did).
# Padding makes loop speed independent of layout, for a few bytes of code.
_X86_BRANCH_ALIGN = ["-Wa,-mbranches-within-32B-boundaries"]


def level_flags(level: str, cxx: str) -> list[str]:
    if level == NATIVE:
        x86 = platform.machine().lower() in ("x86_64", "amd64")
        return ["-march=native", *_native_exclusions(cxx), *(_X86_BRANCH_ALIGN if x86 else [])]
    if level == GENERIC:
        return []
    return [f"-march={level}", "-mtune=generic", *_X86_BRANCH_ALIGN]


def _opt_flags(source: str = "") -> list[str]:
    if not sanitize():
        return list(_COMMON_FLAGS)
    # -O1 keeps the reports' stack traces readable and still inlines Eigen
    flags = ["-O1" if f == "-O3" else f for f in _COMMON_FLAGS]
    return flags if source in _UNSANITIZED_SOURCES else flags + _SANITIZE_FLAGS


# ---------------------------------------------------------------------------------------------
# Compiling

def _run_jobs(jobs: list, cxx: str, where: Path) -> None:
    """Run (what, cmd) compiler jobs, at most one per core at once, each writing its messages to a
    log file in `where` (a pipe could fill and stall it); the first failure raises."""
    running = []
    try:
        for n, (what, cmd) in enumerate(jobs):
            while sum(p.poll() is None for *_, p in running) >= (os.cpu_count() or 1):
                time.sleep(0.05)
            _raise_on_failure(running, cxx, where)  # a failure already seen stops the rest
            log = where / f"job{n}.log"
            with open(log, "w") as handle:
                proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT)
            running.append((what, cmd, log, proc))
        for *_, proc in running:
            proc.wait()
        _raise_on_failure(running, cxx, where)
    finally:
        # On a failure the other compilers may still be writing into the build directory, whose
        # removal would then fail and hide this error behind its own: stop them first.
        for *_, proc in running:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _raise_on_failure(running: list, cxx: str, where: Path) -> None:
    for what, cmd, log, proc in running:
        if proc.poll() not in (None, 0):
            try:
                output = log.read_text(errors="replace")[-20000:]
            except OSError as err:
                output = f"(its messages are lost: {err})"
            raise BuildError(f"{what} failed. Check that {cxx} is a working C++17 compiler (or "
                             f"set CXX to another) and that {where} has free space:\n  "
                             f"{' '.join(cmd)}\n{output}")


def compile_libraries(cxx: str, target: Target, outputs: dict, workdir: Path,
                      package: Path = PACKAGE_DIR) -> None:
    """Build one library per level from the sources of the package at `package`: outputs maps a
    level (see level_flags) to its .so path. Object files go to workdir; all levels' sources
    compile in one pool of jobs."""
    check_supported(target.version)
    generated = workdir / "generated"
    generated.mkdir(parents=True, exist_ok=True)
    (generated / "op_table.inc").write_text(op_table_text(package))
    source_dir = package / "cc"
    units = sources(package)
    include = [f"-I{target.python_include}",
               f"-I{package / HOST_SUBDIR}", f"-I{source_dir}", f"-I{generated}"]
    compiles, links = [], []
    for level, out in outputs.items():
        objdir = workdir / level
        objdir.mkdir(parents=True, exist_ok=True)
        arch = level_flags(level, cxx)
        objects = []
        for src in units:
            obj = objdir / (src.relative_to(source_dir).as_posix().replace("/", "__")[:-3] + ".o")
            objects.append(str(obj))
            what = f"compiling {src.name}" + (f" for {level}" if len(outputs) > 1 else "")
            compiles.append((what,
                             [cxx, *target.compile_flags, *_opt_flags(src.name), *arch, *include,
                              "-c", str(src), "-o", str(obj)]))
        sanitizers = _SANITIZE_FLAGS[:1] if sanitize() else []
        links.append((f"linking the kernel library {Path(out).name}",
                      [cxx, "-shared", *sanitizers, *objects, "-o", str(out),
                       *target.link_flags, "-ldl"]))
    _run_jobs(compiles, cxx, workdir)
    _run_jobs(links, cxx, workdir)


# ---------------------------------------------------------------------------------------------
# Built at install

def build_for_install(package: Path, log: Callable[[str], None] = print) -> bool:
    """Compile the libraries of the package copy at `package` (the one the wheel ships) into its
    _lib/, for the TensorFlow of the target environment, with a manifest. Returns False, having
    said why, when there is nothing to build against (no TensorFlow visible,
    TF_AUTOFUSE_BUILD=none): the package then builds on first import. A TensorFlow outside the
    supported range raises UnsupportedTensorFlow."""
    dest = package / PREBUILT_DIR.name
    shutil.rmtree(dest, ignore_errors=True)  # what an earlier build left must not ship
    mode = build_mode()
    if mode == "none":
        log(f"tf_autofuse: {BUILD_ENV}=none: no kernel library built now; the first import "
            f"builds one (needs a C++17 compiler)")
        return False
    target, why = install_target()
    if target is None:
        log(f"tf_autofuse: no kernel library built at install: {why}. The first import builds "
            f"one for the TensorFlow it finds (needs a C++17 compiler); to build now, install "
            f"TensorFlow first or set {PYTHON_ENV} to the Python that has it.")
        return False
    check_supported(target.version)
    cxx = _compiler()
    levels = [NATIVE] if mode == NATIVE else portable_levels()
    log(f"tf_autofuse: building the kernel library for TensorFlow {target.version} "
        f"({', '.join(levels)}) ...")
    started = time.monotonic()
    dest.mkdir(parents=True, exist_ok=True)
    libraries = {level: f"libtf_autofuse_{level.replace('-', '_')}.so" for level in levels}
    with tempfile.TemporaryDirectory() as work:
        compile_libraries(cxx, target, {lv: dest / name for lv, name in libraries.items()},
                          Path(work), package)
    manifest = {"abi": target.abi(), "sources": source_digest(package), "libraries": libraries,
                "compiler": _compiler_version(cxx), "mode": mode}
    if mode == NATIVE:
        manifest["cpu_flags"] = sorted(cpu_flags())
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    log(f"tf_autofuse: built in {time.monotonic() - started:.0f} s")
    return True


@dataclasses.dataclass(frozen=True)
class Library:
    """The library this process loads, and how it came to be."""

    path: Path
    origin: str            # "install" (the package's _lib/) or "import" (the cache)
    level: str             # x86-64-v2/v3/v4, generic, native
    note: str = ""         # why an installed library was not used, when it was not


def _installed(target: Target, mode: str) -> tuple[Optional[Library], str]:
    """The installed library for this TensorFlow and CPU, or (None, why not)."""
    path = PREBUILT_DIR / MANIFEST
    if not path.exists():
        return None, ""
    try:
        manifest = json.loads(path.read_text())
        libraries, built_abi = manifest["libraries"], manifest["abi"]
    except (OSError, ValueError, KeyError) as err:
        return None, f"its manifest {path} is unreadable ({err})"
    if built_abi != target.abi():
        differ = [k for k in target.abi() if built_abi.get(k) != target.abi()[k]]
        return None, (f"it was built at install for TensorFlow {built_abi.get('tensorflow')} "
                      f"(Python {built_abi.get('python')}); this is TensorFlow {target.version} "
                      f"(Python {target.python_version}): {', '.join(differ)} differ")
    if manifest.get("sources") != source_digest():
        return None, "the sources changed after it was built"
    flags = cpu_flags()
    if NATIVE in libraries:
        missing = set(manifest.get("cpu_flags", ())) - flags
        if missing:
            return None, (f"it was built for another CPU (-march=native), and this one lacks "
                          f"{', '.join(sorted(missing)[:6])}")
        return Library(PREBUILT_DIR / libraries[NATIVE], "install", NATIVE), ""
    if mode == NATIVE:
        return None, f"{BUILD_ENV}=native asks for a library built for this CPU"
    runnable = [lv for lv in supported_levels(flags) if lv in libraries]
    wanted = os.environ.get(ISA_ENV, "").strip()
    if wanted:
        if wanted not in runnable:
            raise BuildError(f"{ISA_ENV}={wanted!r}: the installed levels this CPU runs are "
                             f"{', '.join(runnable) or 'none'}")
        runnable = runnable[:runnable.index(wanted) + 1]
    if not runnable:
        return None, f"this CPU runs none of its levels ({', '.join(libraries)})"
    return Library(PREBUILT_DIR / libraries[runnable[-1]], "install", runnable[-1]), ""


# ---------------------------------------------------------------------------------------------
# Built at import

def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "tf_autofuse"


def build_key(cxx: str, target: Target) -> str:
    digest = hashlib.sha256()
    unsanitized = " ".join(sorted(_UNSANITIZED_SOURCES))
    for part in (target.version, sys.version, _compiler_version(cxx),
                 " ".join(target.compile_flags), " ".join(target.link_flags),
                 " ".join(_opt_flags() + level_flags(NATIVE, cxx)), " ".join(sorted(cpu_flags())),
                 *([f"unsanitized: {unsanitized}"] if sanitize() else []), source_digest()):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:20]


def cached_library_path(target: Target, verbose: bool = True, note: str = "") -> Path:
    """The -march=native library in the cache, built first when the cache has none for this key."""
    cxx = _compiler()
    key = build_key(cxx, target)
    root = cache_dir()
    out = root / f"libtf_autofuse_{'asan_' if sanitize() else ''}{key}.so"
    if out.exists():
        return out
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / f"build_{key}.lock", "w")
    except OSError as err:
        raise BuildError(
            f"cannot write the kernel cache directory {root}: {err}. "
            f"Set {CACHE_ENV} to a writable directory.") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.exists():  # another process built it while we waited
            return out
        if verbose:
            why = f" (the installed one is not used: {note})" if note else ""
            print(f"tf_autofuse: building the kernel library for TensorFlow {target.version}"
                  f"{why} (about a minute) into {root} ...", file=sys.stderr, flush=True)
        started = time.monotonic()
        try:
            with tempfile.TemporaryDirectory(dir=root) as tmp:
                staged = Path(tmp) / out.name
                compile_libraries(cxx, target, {NATIVE: staged}, Path(tmp))
                os.replace(staged, out)
        except OSError as err:  # a full disk, a cache directory that turned read-only
            raise BuildError(
                f"cannot build the kernel library in the cache directory {root}: {err}. Free "
                f"space there or set {CACHE_ENV} to a writable directory with room "
                f"(about 20 MB).") from None
        if verbose:
            print(f"tf_autofuse: built in {time.monotonic() - started:.0f} s", file=sys.stderr,
                  flush=True)
    return out


def find_library(verbose: bool = True) -> Library:
    """The library for this process: the installed one when it matches the running TensorFlow
    and CPU, else one built in the cache (the sanitizer build always comes from the cache)."""
    target = current_target()
    check_supported(target.version)
    mode = build_mode()
    note = ""
    if not sanitize():
        found, note = _installed(target, mode)
        if found is not None:
            return found
    return Library(cached_library_path(target, verbose, note), "import", NATIVE, note)


def library_path(verbose: bool = True) -> Path:
    """Path of the library this process loads (see find_library)."""
    return find_library(verbose).path


if __name__ == "__main__":
    print(library_path())
