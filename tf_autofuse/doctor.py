"""`python -m tf_autofuse doctor`: what a user needs to know when nothing fuses.

One line per fact: the TensorFlow and Keras in use (and which distribution provides
TensorFlow), the kernel library loaded (built at install or at import, for which instruction
sets, or why none loaded), the CPU's features, who holds TensorFlow's CPU plugin slot, the
flags in force, and whether a CANN toolkit was found for the NPU path.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from . import _build, _warn

# What each library level compiles the kernels for (cc/interpreter.cc picks its vector paths
# from the compiler's macros).
LEVEL_FEATURES = {
    "x86-64-v2": "SSE4.2 (no AVX: 128-bit vectors, half converted in software)",
    "x86-64-v3": "AVX2, FMA, F16C (256-bit vectors)",
    "x86-64-v4": "AVX-512 F/BW/CD/DQ/VL (512-bit vectors), FMA, F16C",
    _build.NATIVE: "everything this CPU has (-march=native, AVX512-FP16 excepted)",
    _build.GENERIC: "the compiler's default target for this machine",
}
_SHOWN_CPU_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                    "avx512_bf16", "avx512_fp16", "amx_tile", "asimd", "sve")


def _tensorflow_line(tf) -> list[str]:
    providers = importlib.metadata.packages_distributions().get("tensorflow", [])
    line = (f"TensorFlow   {tf.__version__} ({tf.version.GIT_VERSION}) from "
            f"{', '.join(sorted(set(providers))) or 'an unknown distribution'}; "
            f"tf_autofuse supports {_build.supported_range()}")
    lines = [line]
    if len(set(providers)) > 1:
        lines.append(f"             WARNING: {len(set(providers))} distributions install the "
                     f"same tensorflow package ({', '.join(sorted(set(providers)))}): uninstall "
                     f"all but one and reinstall it")
    return lines


def _keras_line(tf) -> str:
    try:
        version = tf.keras.__version__
    except Exception:  # noqa: BLE001 - a Keras that does not import is what we report
        try:
            import keras

            version = keras.__version__
        except Exception as err:  # noqa: BLE001
            return f"Keras        not importable ({type(err).__name__}: {err})"
    major = version.split(".")[0]
    return f"Keras        tf.keras is Keras {version} (Keras {major})"


def _library_lines(tf_autofuse) -> list[str]:
    from . import _native

    library = _native.library()
    if library is None:
        return ["Library      NOT LOADED: nothing is fused (the warning below says why)"]
    where = ("built at install" if library.origin == "install"
             else "built at import, in the cache")
    lines = [f"Library      {where}, for {library.level}: {library.path}"]
    if library.note:
        lines.append(f"             the installed library is not used: {library.note}")
    lines.append(f"CPU          library compiled for {LEVEL_FEATURES.get(library.level, '?')}")
    return lines


def _cpu_line() -> str:
    flags = _build.cpu_flags()
    shown = [f for f in _SHOWN_CPU_FLAGS if f in flags]
    levels = _build.supported_levels(flags)
    return (f"             this CPU: {' '.join(shown) or 'none of ' + ' '.join(_SHOWN_CPU_FLAGS)}"
            f"; portable levels it runs: {', '.join(levels) or 'none'}")


def _plugin_lines(tf_autofuse) -> list[str]:
    from . import _native

    flags = tf_autofuse.config()
    enabled = flags.enable_autofuse
    lines = [f"Flags        AUTOFUSE_FLAGS={os.environ.get('AUTOFUSE_FLAGS', '')!r} "
             f"(fusion {'on' if enabled else 'off'})"]
    if not tf_autofuse.is_available():
        return lines
    slot = _native.cpu_plugin_slot()
    if slot == "tf_autofuse":
        text = "held by tf_autofuse: every CPU graph is fused"
    elif slot == "free":
        text = ("free: fusion is off (set AUTOFUSE_FLAGS=--enable_autofuse=true, or name "
                "\"AutofuseOptimizer\" in a session's custom_optimizers)")
    else:
        text = ("held by another CPU plugin (e.g. Intel's extension): graphs are fused only by "
                "sessions that name \"AutofuseOptimizer\" in custom_optimizers")
    lines.append(f"Plugin slot  {text}")
    return lines


def _cann_line() -> str:
    from .codegen import cann

    found, why = cann.detect()
    if found is None:
        return f"CANN         not found ({why}): fused kernels run on the CPU"
    return f"CANN         found at {found.home} (bisheng {found.bisheng}, ACL {found.acl})"


def report() -> tuple[list[str], bool]:
    """The doctor's lines, and whether the kernel library is available."""
    import tensorflow as tf

    import tf_autofuse

    lines = [f"tf_autofuse  {tf_autofuse.__version__} ({os.path.dirname(tf_autofuse.__file__)})",
             f"Python       {sys.version.split()[0]} ({sys.executable})"]
    lines += _tensorflow_line(tf)
    lines.append(_keras_line(tf))
    lines += _library_lines(tf_autofuse)
    lines.append(_cpu_line())
    lines += _plugin_lines(tf_autofuse)
    lines.append(_cann_line())
    lines += [f"Warning      {message}" for message in _warn.said()]
    return lines, tf_autofuse.is_available()


def main() -> int:
    """Print the report; exit status 1 when the kernel library is not available."""
    lines, available = report()
    print("\n".join(lines))
    return 0 if available else 1
