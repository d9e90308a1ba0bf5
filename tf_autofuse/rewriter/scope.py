"""`with tf_autofuse.disable_autofuse():` keeps the ops built inside out of every fusion.

Each node created inside the block (in a tf.Graph, or in the FuncGraph of a tf.function being
traced) carries the attr `_disable_autofuse_scope` = true; the partitioner refuses such nodes
(partition.DISABLE_ATTR). Attrs starting with '_' are kept by TensorFlow in the GraphDef and the
FunctionDefs that Grappler hands to the pass. In eager code nothing is built, so nothing is marked.

Grappler's arithmetic optimizer runs before the pass and replaces a chain of unary ops by one
`_UnaryOpsComposition` named `<last op of the chain>/unary_ops_composition`, without the attr.
So the block also records the names of the nodes it built, and a composition named after one
of them is refused too (`composed_inside_scope`). The record is by name, for the process: a
composition in another graph whose last op has the same name is left unfused as well, which
costs speed, never correctness.
"""

from __future__ import annotations

import contextlib
import threading

from tensorflow.core.framework import attr_value_pb2

ATTR = "_disable_autofuse_scope"
COMPOSITION_SUFFIX = "/unary_ops_composition"  # Grappler's name for a composed chain

_lock = threading.Lock()
_scoped_names: set = set()


@contextlib.contextmanager
def disable_autofuse():
    """Context manager: nodes built inside are never fused."""
    from tensorflow.python.framework import ops

    graph = ops.get_default_graph()
    before = set(graph._nodes_by_name) if hasattr(graph, "_nodes_by_name") else None  # noqa: SLF001
    try:
        with graph._attr_scope({ATTR: attr_value_pb2.AttrValue(b=True)}):  # noqa: SLF001
            yield
    finally:
        if before is not None:
            built = set(graph._nodes_by_name) - before  # noqa: SLF001
            with _lock:
                _scoped_names.update(built)


def composed_inside_scope(name: str) -> bool:
    """Is `name` Grappler's `_UnaryOpsComposition` of a chain built inside disable_autofuse()?"""
    if not name.endswith(COMPOSITION_SUFFIX):
        return False
    with _lock:
        return name[: -len(COMPOSITION_SUFFIX)] in _scoped_names
