"""`with tf_autofuse.disable_autofuse():` keeps the ops built inside out of every fusion.

Each node created inside the block (in a tf.Graph, or in the FuncGraph of a tf.function being
traced) carries the attr `_disable_autofuse_scope` = true; the partitioner, the epilogue pass and
the pads pass leave such nodes alone (`disabled`, `kept_out`). Attrs starting with '_' are kept by TensorFlow in the GraphDef and the
FunctionDefs that Grappler hands to the pass. In eager code nothing is built, so nothing is marked.
"""

from __future__ import annotations

import contextlib

from tensorflow.core.framework import attr_value_pb2

ATTR = "_disable_autofuse_scope"


def disabled(node) -> bool:
    """Whether a NodeDef was made inside disable_autofuse()."""
    return ATTR in node.attr and node.attr[ATTR].b


def kept_out(view, policy) -> frozenset:
    """The nodes of a GraphView no pass may rewrite under `policy` (a partition.Policy): preserved,
    fed, skipped by name or op type (--skip_node_names_cfg), or made inside disable_autofuse()."""
    return frozenset(policy.preserve | policy.feeds | policy.skip_names) | {
        node.name for node in view.nodes if node.op in policy.skip_types or disabled(node)}


@contextlib.contextmanager
def disable_autofuse():
    """Context manager: nodes built inside are never fused."""
    from tensorflow.python.framework import ops

    graph = ops.get_default_graph()
    with graph._attr_scope({ATTR: attr_value_pb2.AttrValue(b=True)}):  # noqa: SLF001
        yield
