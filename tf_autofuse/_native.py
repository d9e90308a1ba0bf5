"""Load the C++ library once: the AutofuseKernel op, its CPU kernel and the Grappler bridge.

`load()` returns the op module (`tf.load_op_library`), whose `autofuse_kernel` function
runs a fused program eagerly or adds the op to a graph. `register_cpu_plugin()` makes the
bridge TensorFlow's CPU plugin optimizer, so that every graph of the process is fused.
"""

from __future__ import annotations

import ctypes
import os
import threading

from . import _build

_lock = threading.Lock()
_module = None
_cdll = None
_library = None  # the _build.Library loaded


def load():
    """The op module; builds the library on first use when the package holds none for this
    TensorFlow. Raises _build.BuildError, or _build.UnsupportedTensorFlow (an ImportError)."""
    global _module, _cdll, _library
    with _lock:
        if _module is None:
            import tensorflow as tf

            from .rewriter import catalog
            from .rewriter.unfold import FOLDED_OPS

            library = _build.find_library()
            path = library.path
            if _build.sanitize() and "libasan" not in os.environ.get("LD_PRELOAD", ""):
                # loading it would abort the process ("ASan runtime does not come first")
                raise _build.BuildError(
                    f"{_build.SANITIZE_ENV}=1 selects the sanitizer build {path}, which loads "
                    f"only with the sanitizer runtimes preloaded: run it through "
                    f"scripts/sanitize.sh, or unset {_build.SANITIZE_ENV}.")
            try:
                module = tf.load_op_library(str(path))
                cdll = ctypes.CDLL(str(path))
                # The bridge skips graphs holding none of these op types without calling Python.
                names = ",".join(sorted(catalog.candidate_op_types() | FOLDED_OPS))
                cdll.autofuse_set_candidate_ops(names.encode())
                from .codegen import cann

                cann.install_resolver(cdll)  # NPU kernels, when a CANN toolchain is present
            except (tf.errors.OpError, OSError, AttributeError) as err:
                # a truncated or foreign file, a library built for another TensorFlow, a
                # sanitized build without its runtime preloaded: say which file and how to fix it
                if library.origin == "install":
                    fix = ("Reinstall tf_autofuse, or set TF_AUTOFUSE_BUILD=native to build one "
                           "for this machine on import")
                else:
                    fix = (f"Delete it so that it is built again, or point {_build.CACHE_ENV} at "
                           f"an empty writable directory")
                raise _build.BuildError(
                    f"the kernel library {path} does not load ({type(err).__name__}: "
                    f"{str(err).strip()[:300]}). {fix}.") from None
            _module, _cdll, _library = module, cdll, library
        return _module


def loaded_cdll():
    """The op library as a ctypes handle, or None before `load()`."""
    return _cdll


def library():
    """The _build.Library loaded (path, built at install or at import, level), or None."""
    return _library


def set_kernel_profile(path: str) -> None:
    """AUTOFUSE_DFX_FLAGS=--kernel_profile=FILE: kernels built from now on time every step, and
    the CSV is written to `path` when the process exits (cc/kernel_profile.h)."""
    load()
    _cdll.autofuse_set_kernel_profile(os.path.abspath(path).encode())


def set_strip_fusion(on: bool) -> None:
    """AUTOFUSE_DFX_FLAGS=--strip_fusion=false: kernels planned from now on run every step over
    whole tiles (cc/cpu/schedule.h, StripRun)."""
    load()
    _cdll.autofuse_set_strip_fusion(ctypes.c_int(1 if on else 0))


def set_split_reductions(on: bool) -> None:
    """AUTOFUSE_DFX_FLAGS=--split_reductions=false: runs prepared from now on reduce each work
    item on one thread, never in blocks of R (cc/interpreter.cc, split runs)."""
    load()
    _cdll.autofuse_set_split_reductions(ctypes.c_int(1 if on else 0))


def set_output_cache(megabytes: int) -> None:
    """AUTOFUSE_FLAGS=--output_cache_mb=N: the most MiB of idle output blocks the kernels keep
    for reuse; 0 turns the cache off (cc/output_cache.h)."""
    load()
    _cdll.autofuse_set_output_cache(ctypes.c_int64(megabytes << 20))


def output_cache_stats() -> dict:
    """The output cache's counters: outputs that reused an idle block (hits), new blocks
    (misses), and the idle bytes and blocks it holds now."""
    load()
    out = (ctypes.c_int64 * 4)()
    _cdll.autofuse_output_cache_stats(out)
    return {"hits": out[0], "misses": out[1], "idle_bytes": out[2], "idle_blocks": out[3]}


def register_cpu_plugin() -> str:
    """Register the bridge as the CPU plugin optimizer.

    Returns "registered", "already registered" or "taken" (another CPU plugin, e.g. Intel's
    extension, holds the only slot; TensorFlow would abort the process on a second one).
    """
    load()
    code = _cdll.autofuse_register_cpu_plugin()
    return {0: "registered", 1: "already registered", 2: "taken"}[code]


def cpu_plugin_slot() -> str:
    """Who holds TensorFlow's CPU plugin slot, without taking it: "free", "tf_autofuse" or
    "another plugin"."""
    load()
    return {0: "free", 1: "tf_autofuse", 2: "another plugin"}[_cdll.autofuse_cpu_plugin_slot()]
