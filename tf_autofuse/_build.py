"""Build the C++ library (op, CPU kernel, Grappler bridge) against the installed TensorFlow.

The library is compiled on first import with the flags `tf.sysconfig` gives, and cached
under a key that covers everything it depends on: the sources, the TensorFlow version and
flags, the compiler, the Python version and the CPU's instruction-set flags (the kernel is
built with -march=native). A later import with the same key loads it in milliseconds; a new
TensorFlow, compiler or source edit builds it again. Builds are serialised by a file lock
and land atomically, so concurrent imports are safe.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent / "cc"
# The NPU dispatch headers the op kernel includes (npu_dispatch.h loads a generated kernel
# library with dlopen; autofuse_launch.h is the ABI shared with the generated launchers).
HOST_DIR = Path(__file__).resolve().parent / "codegen" / "host"
CACHE_ENV = "TF_AUTOFUSE_CACHE_DIR"
_OPT_FLAGS = ["-O3", "-march=native", "-fPIC", "-fvisibility-inlines-hidden",
              "-Wno-deprecated-declarations", "-Wno-ignored-attributes"]
# TF_AUTOFUSE_SANITIZE=1 builds (and caches under its own key and name) a library instrumented
# with AddressSanitizer and UndefinedBehaviorSanitizer; scripts/sanitize.sh runs the tests
# against it with libasan/libubsan preloaded. Not for production: it is several times slower.
SANITIZE_ENV = "TF_AUTOFUSE_SANITIZE"
# null / nonnull-attribute checks are left out: with them g++ 12 rejects absl's constexpr
# function-pointer comparisons in TensorFlow's headers ("is not a constant expression").
_SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                   "-fno-sanitize=null,nonnull-attribute,returns-nonnull-attribute",
                   "-fno-sanitize-recover=undefined", "-g"]


def sanitize() -> bool:
    return os.environ.get(SANITIZE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


# The Grappler bridge is left uninstrumented: with ASan on, absl's swiss tables change their
# layout (generation counters), and the bridge shares GraphProperties' absl maps with the
# uninstrumented TensorFlow, which then crashes in InferStatically. The kernel, interpreter and
# program parser only pass TensorFlow plain tensors and strings.
_UNSANITIZED_SOURCES = frozenset({"optimizer.cc"})


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


def _opt_flags(source: str = "") -> list[str]:
    if not sanitize():
        return list(_OPT_FLAGS)
    # -O1 keeps the reports' stack traces readable and still inlines Eigen
    flags = ["-O1" if f == "-O3" else f for f in _OPT_FLAGS]
    return flags if source in _UNSANITIZED_SOURCES else flags + _SANITIZE_FLAGS


class BuildError(RuntimeError):
    """The kernel library could not be built; the message says what to install or fix."""


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "tf_autofuse"


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx or not shutil.which(cxx):
        raise BuildError(
            "tf_autofuse builds its kernel library on first import and needs a C++17 compiler, "
            "but none was found (looked for $CXX, g++, c++). Install one, e.g. "
            "`apt-get install g++`, or set CXX to its path.")
    return cxx


def _compiler_version(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True,
                              check=True).stdout.splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError) as err:
        raise BuildError(f"the C++ compiler {cxx!r} does not run: {err}") from None


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _sources() -> list[Path]:
    """The C++ sources: cc/*.cc (each compiled) and every header under cc/ (cc/cpu/ holds the
    parts of the interpreter's translation unit)."""
    return sorted(p for p in SOURCE_DIR.rglob("*") if p.suffix in (".cc", ".h"))


def _headers() -> list[Path]:
    """Headers from outside cc/ that the sources include (part of the cache key)."""
    return sorted(p for p in HOST_DIR.iterdir() if p.suffix == ".h")


def _op_table() -> str:
    """The generated op table header (rewriter/catalog_cc.py) the sources include."""
    from .rewriter import catalog_cc

    return catalog_cc.header_text()


def _tf_flags() -> tuple[list[str], list[str], str]:
    import tensorflow as tf

    return (list(tf.sysconfig.get_compile_flags()), list(tf.sysconfig.get_link_flags()),
            tf.__version__)


def build_key(cxx: str, compile_flags: list[str], link_flags: list[str], tf_version: str) -> str:
    digest = hashlib.sha256()
    for part in (tf_version, sys.version, _compiler_version(cxx), " ".join(compile_flags),
                 " ".join(link_flags), " ".join(_opt_flags()), _cpu_flags(),
                 *(["unsanitized: " + " ".join(sorted(_UNSANITIZED_SOURCES))] if sanitize() else [])):
        digest.update(part.encode())
        digest.update(b"\0")
    digest.update(_op_table().encode())
    for path in _sources() + _headers():
        digest.update(str(path.relative_to(path.parent.parent)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


def _compile(cxx: str, compile_flags: list[str], link_flags: list[str], out: Path) -> None:
    include = sysconfig.get_paths()["include"]
    sources = [p for p in _sources() if p.suffix == ".cc" and p.parent == SOURCE_DIR]
    objects = []
    jobs = []
    exclusions = _native_exclusions(cxx)
    generated = out.parent / "generated"
    generated.mkdir(exist_ok=True)
    (generated / "op_table.inc").write_text(_op_table())
    for src in sources:
        obj = out.with_name(src.stem + ".o")
        objects.append(obj)
        cmd = [cxx, *compile_flags, *_opt_flags(src.name), *exclusions, f"-I{include}",
               f"-I{HOST_DIR}", f"-I{generated}", "-c",
               str(src), "-o", str(obj)]
        jobs.append((src, cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT, text=True)))
        # at most os.cpu_count() compilers at once
        while sum(p.poll() is None for _, _, p in jobs) >= (os.cpu_count() or 1):
            time.sleep(0.05)
    try:
        for src, cmd, proc in jobs:
            log, _ = proc.communicate()
            if proc.returncode != 0:
                raise BuildError(f"compiling {src.name} failed. Check that {cxx} is a working "
                                 f"C++17 compiler (or set CXX to one) and that {out.parent} has "
                                 f"free space:\n  {' '.join(cmd)}\n{log}")
    finally:
        # On a failure the other compilers may still be writing into the build directory, whose
        # removal would then fail and hide this error behind its own: stop them first.
        for _, _, proc in jobs:
            if proc.returncode is None:  # not waited for yet
                proc.kill()
                proc.communicate()
    sanitizers = _SANITIZE_FLAGS[:1] if sanitize() else []
    cmd = [cxx, "-shared", *sanitizers, *map(str, objects), "-o", str(out), *link_flags, "-ldl"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise BuildError(f"linking the kernel library failed. Check that {cxx} can link "
                         f"shared libraries (or set CXX to another compiler) and that "
                         f"{out.parent} has free space:\n  {' '.join(cmd)}\n{proc.stdout}")


def library_path(verbose: bool = True) -> Path:
    """Path of the built library, building it first when the cache has none for this key."""
    cxx = _compiler()
    compile_flags, link_flags, tf_version = _tf_flags()
    key = build_key(cxx, compile_flags, link_flags, tf_version)
    root = cache_dir()
    target = root / f"libtf_autofuse_{'asan_' if sanitize() else ''}{key}.so"
    if target.exists():
        return target
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / f"build_{key}.lock", "w")
    except OSError as err:
        raise BuildError(
            f"cannot write the kernel cache directory {root}: {err}. "
            f"Set {CACHE_ENV} to a writable directory.") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():  # another process built it while we waited
            return target
        if verbose:
            print(f"tf_autofuse: building the kernel library for TensorFlow {tf_version} "
                  f"(first import, about a minute) into {root} ...", file=sys.stderr, flush=True)
        started = time.monotonic()
        try:
            with tempfile.TemporaryDirectory(dir=root) as tmp:
                staged = Path(tmp) / target.name
                _compile(cxx, compile_flags, link_flags, staged)
                os.replace(staged, target)
        except OSError as err:  # a full disk, a cache directory that turned read-only
            raise BuildError(
                f"cannot build the kernel library in the cache directory {root}: {err}. Free "
                f"space there or set {CACHE_ENV} to a writable directory with room "
                f"(about 20 MB).") from None
        if verbose:
            print(f"tf_autofuse: built in {time.monotonic() - started:.0f} s", file=sys.stderr,
                  flush=True)
    return target


if __name__ == "__main__":
    print(library_path())
