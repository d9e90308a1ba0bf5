"""tf_autofuse: automatic fusion of memory-bound operator chains for TensorFlow.

`import tf_autofuse` reads AUTOFUSE_FLAGS and AUTOFUSE_DFX_FLAGS (a bad flag raises
FlagError naming the key), loads the AutofuseKernel op and the Grappler bridge (building
them on first import), and, with `--enable_autofuse=true`, makes the bridge TensorFlow's CPU
plugin optimizer so that every graph of the process is fused. Sessions can also ask for it
by name: RewriterConfig.custom_optimizers "AutofuseOptimizer".

The Python API (fuser.py): `fuse(graph)` / `Fuser(...).fuse(graph)` return a FusedGraph
(counts, report, run, verify); `Pattern` subclasses claim subgraphs before the partitioner,
per Fuser (`fuser.register_pattern`) or for the Grappler path (`register_pattern`).
"""

from __future__ import annotations

from . import _bridge, _native, compat, flags
from ._build import BuildError
from ._warn import AutofuseWarning, warn_once
from .flags import FlagError, Flags
from .fuser import (ConfigError, FusedGraph, Fuser, FuserConfig, fuse, register_pattern,
                    registered_patterns, unregister_pattern)
from .rewriter.errors import AutofuseError
from .rewriter.patterns import Pattern, PatternGraph
from .rewriter.scope import disable_autofuse

__version__ = "0.1.0"
OPTIMIZER_NAME = "AutofuseOptimizer"

__all__ = ["AutofuseError", "AutofuseWarning", "BuildError", "ConfigError", "FlagError", "Flags", "FusedGraph",
           "Fuser", "FuserConfig", "OPTIMIZER_NAME", "Pattern", "PatternGraph", "compat",
           "config", "disable_autofuse", "fuse", "is_available", "ops", "register_pattern",
           "registered_patterns", "unregister_pattern"]


def _initialise() -> bool:
    process_flags = flags.from_env()  # FlagError stops the program here, naming the key
    _bridge.configure(process_flags)
    try:
        _native.load()
    except BuildError as err:
        warn_once(f"the kernel library is not available, nothing will be fused: {err}")
        return False
    _native.set_output_cache(process_flags.output_cache_mb)
    if process_flags.kernel_profile:
        _native.set_kernel_profile(process_flags.kernel_profile)
    if not process_flags.strip_fusion:
        _native.set_strip_fusion(False)
    if not process_flags.split_reductions:
        _native.set_split_reductions(False)
    if process_flags.enable_autofuse:
        if _native.register_cpu_plugin() == "taken":
            warn_once(
                "another CPU plugin optimizer (for example Intel's extension) holds TensorFlow's "
                "only CPU plugin slot, so graphs are not fused automatically. Ask for fusion per "
                "session instead: add a custom optimizer named \"AutofuseOptimizer\" to "
                "ConfigProto.graph_options.rewrite_options.custom_optimizers.")
    return True


_available = _initialise()


def config() -> Flags:
    """The flags in force for this process (read from the environment at import)."""
    return _bridge.process_flags()


def is_available() -> bool:
    """True when the kernel library loaded and graphs can be fused."""
    return _available


def ops():
    """The op module: `ops().autofuse_kernel(inputs=[...], Tout=[...], program=text)`."""
    return _native.load()
