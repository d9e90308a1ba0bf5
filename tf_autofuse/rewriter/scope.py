"""`with tf_autofuse.disable_autofuse():` keeps the ops built inside out of every fusion.

Each node created inside the block (in a tf.Graph, or in the FuncGraph of a tf.function being
traced) carries the attr `_disable_autofuse_scope` = true; the partitioner and the epilogue pass
leave such nodes alone (`disabled`). Attrs starting with '_' are kept by TensorFlow in the GraphDef and the
FunctionDefs that Grappler hands to the pass. In eager code nothing is built, so nothing is marked.
"""

from __future__ import annotations

import contextlib

from tensorflow.core.framework import attr_value_pb2

ATTR = "_disable_autofuse_scope"


def disabled(node) -> bool:
    """Whether a NodeDef was made inside disable_autofuse()."""
    return ATTR in node.attr and node.attr[ATTR].b


@contextlib.contextmanager
def disable_autofuse():
    """Context manager: nodes built inside are never fused."""
    from tensorflow.python.framework import ops

    graph = ops.get_default_graph()
    with graph._attr_scope({ATTR: attr_value_pb2.AttrValue(b=True)}):  # noqa: SLF001
        yield
