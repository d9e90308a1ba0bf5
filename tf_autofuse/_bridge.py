"""What the C++ Grappler bridge calls for every graph that may hold a fusion.

`optimize` gets the serialized GraphDef, the nodes Grappler must preserve, the fed nodes,
statically inferred shapes and the session's parameter_map, and returns the rewritten
GraphDef's bytes, or None for "leave the graph as it is". It never raises: any failure
becomes one AutofuseWarning and the graph runs unfused (docs/DESIGN.md, invariant 3).
The rewrite is the Python API's: `Fuser.from_flags(flags)`, with the patterns registered by
tf_autofuse.register_pattern.
"""

from __future__ import annotations

import contextlib
import gc
import threading

from tensorflow.core.framework import graph_pb2

from . import debug
from ._warn import warn_once
from .codegen import cann
from .flags import Flags
from .fuser import Fuser
from .rewriter import errors
from .rewriter.errors import AutofuseError

_process_flags = Flags()


def configure(flags: Flags) -> None:
    """Set the flags read from the environment at import."""
    global _process_flags
    _process_flags = flags


def process_flags() -> Flags:
    return _process_flags


def effective_flags(params: dict, source: str) -> Flags:
    """Process flags, then the session's parameter_map on top.

    A session that names AutofuseOptimizer in its custom_optimizers asks for fusion, so there
    enable_autofuse defaults to true; the CPU plugin runs only when the flags enabled it.
    """
    flags = _process_flags
    if source == "custom_optimizer":
        params = {"enable_autofuse": "true", **params}
    return flags.with_overrides(params, source="AutofuseOptimizer parameter_map")


_gc_lock = threading.Lock()
_gc_depth = 0  # bridge calls running (Grappler may optimize graphs on several threads)
_gc_was_enabled = False


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off for the rewrite.

    The rewrite allocates a few hundred thousand short-lived objects (shapes, operand tuples,
    trial programs), all freed by reference counting when it returns. With the collector on,
    those that live through two young collections are promoted to the oldest generation and
    soon trigger a full collection, which in a process holding TensorFlow and a Keras model
    traces millions of objects: ~300 ms inside a first call of ResNet50 or the transformer,
    for nothing collectable. Paused, they die young and the full collection comes when the
    program's own objects call for it. The previous state is restored; nested or concurrent
    calls restore it once, when the last one returns.
    """
    global _gc_depth, _gc_was_enabled
    with _gc_lock:
        if _gc_depth == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_depth += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_depth -= 1
            if _gc_depth == 0 and _gc_was_enabled:
                # The objects the rewrite leaves (the rewritten graph, caches) are young: collect
                # the young generation now, so that re-enabling does not start an automatic
                # collection at the next allocation, which, in a process whose tracing left a
                # full collection due, became that full collection inside the first call.
                gc.collect(0)
                gc.enable()


def optimize(graph_bytes: bytes, preserve, feeds, shapes, params, source: str):
    with _collector_paused():
        return _optimize(graph_bytes, preserve, feeds, shapes, params, source)


def _optimize(graph_bytes: bytes, preserve, feeds, shapes, params, source: str):
    try:
        flags = effective_flags(dict(params), source)
        if not flags.enable_autofuse or flags.max_fusion_size == 0:
            return None
        graph_def = graph_pb2.GraphDef.FromString(graph_bytes)
        result = Fuser.from_flags(flags).rewrite(graph_def, preserve, shapes, feeds)
        if flags.codegen_compile_debug:
            debug.dump(flags.debug_dir, graph_def, result)
            # the Ascend C of each fused kernel and of each MatMul with its epilogue (never raises)
            from .codegen import dump as codegen_dump

            codegen_dump.dump_codegen(flags.debug_dir, result.fusions, verify=False,
                                      graph_def=result.graph_def, shapes=shapes)
        if not result.fusions and not result.epilogues:  # an epilogue alone is a rewrite too
            return None
        cann.note_fused_graph(result.graph_def, flags.autofuse_enhance_precision_blacklist)
        return result.graph_def.SerializeToString(deterministic=True)
    except AutofuseError as err:  # names the phase, node and line itself
        warn_once(f"the fusion pass failed and this graph runs unfused: {err}")
        return None
    except Exception as err:  # noqa: BLE001 - the pass must never break a session
        warn_once(f"the fusion pass failed and this graph runs unfused: {errors.describe(err)}")
        return None
