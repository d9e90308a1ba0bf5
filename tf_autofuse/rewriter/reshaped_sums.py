"""A Reshape of a Sum over leading axes read as the Sum of a Reshape.

The gradient of a product with a broadcast operand sums the broadcast axes away and reshapes
the sum back to the operand's shape (`BroadcastGradientArgs`): Keras' EinsumDense kernel
[128,4,32] receives `Reshape(Sum(BatchMatMulV2(...) [16,128,128], [0]), [128,4,32])`. The
Reshape sits between the Sum and the elementwise ops that read it (the optimizer's update), and a
view between fused ops joins a group only when it adds or drops leading 1s: the Sum stayed a
kernel of its own. Summing leading axes commutes with splitting or merging the other ones, so
`Reshape(Sum(x, [0..k-1]), S)` is `Sum(Reshape(x, x.shape[:k] + S), [0..k-1])`: the Reshape of
x is then a view of the kernel's input, which costs nothing.

Taken when the Sum drops leading axes of a static-shaped x and the Reshape is its only reader,
neither waits on or is waited on by anything, and x comes from a node that is not fused (an
operator: BatchMatMulV2, MatMul, a convolution), so that the new Reshape never stands between a
fused producer and the Sum. The Reshape's node becomes the Sum (name and value unchanged); the
new Reshape is `<name>/summed` (a Reshape whose name makes that taken is left alone).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np
from tensorflow.core.framework import graph_pb2, node_def_pb2, types_pb2

from . import catalog, scope
from .editor import Editor
from .graph import GraphView, tensor_name


def reshape_sums(graph_def: graph_pb2.GraphDef, shapes: Optional[Mapping[str, Sequence]],
                 policy):
    """(graph, shapes, [reshape names]): the inputs themselves when none is rewritten. The
    inputs are never mutated."""
    if not any(node.op == "Sum" for node in graph_def.node):
        return graph_def, shapes, []
    view = GraphView(graph_def, shapes)
    protected = scope.kept_out(view, policy)
    editor = Editor(view, shapes)
    for name in view.order:
        found = _reshaped_sum(view, name, protected)
        if found is None:
            continue
        total, x, lead, target = found
        if f"{name}/summed" in view or f"{name}/summed_shape" in view:
            continue
        node, sum_node = view.node(name), view.node(total)
        split = lead + target
        shape = editor.const(f"{name}/summed_shape", np.array(split, np.int32), node.device)
        reshape = editor.node(f"{name}/summed", "Reshape", [x, shape], node.device, split,
                              T=sum_node.attr["T"].type, Tshape=types_pb2.DT_INT32)
        new_sum = node_def_pb2.NodeDef(name=name, op="Sum", device=node.device,
                                       input=[tensor_name(reshape), sum_node.input[1]])
        for key in ("T", "Tidx", "keep_dims"):
            if key in sum_node.attr:
                new_sum.attr[key].CopyFrom(sum_node.attr[key])
        editor.replaced[name] = new_sum
        editor.removed.add(total)
    if not editor.replaced:
        return graph_def, shapes, []
    return editor.graph(graph_def, protected), editor.shapes, sorted(editor.replaced)


def _reshaped_sum(view: GraphView, name: str, protected) -> Optional[tuple]:
    """(the Sum, its input x, x's summed sizes, the Reshape's shape) when Reshape `name` of a Sum
    over leading axes may become the Sum of a Reshape; else None."""
    node = view.node(name)
    if node.op != "Reshape" or name in protected or view.control_inputs(name):
        return None
    inputs = view.data_inputs(name)
    if len(inputs) != 2 or inputs[0][1] != 0:
        return None
    total = inputs[0][0]
    sum_node = view.node(total)
    if sum_node.op != "Sum" or total in protected or sum_node.attr["keep_dims"].b:
        return None
    if (view.control_inputs(total) or view.control_consumers(total)
            or [c for c, _, _ in view.data_consumers(total)] != [name]
            or sum_node.device != node.device):
        return None
    x, axes_tensor = view.data_inputs(total)
    if catalog.tf_op(view.node(x[0]).op) is not None:
        return None  # a fused producer: the new Reshape would stand between it and the Sum
    x_shape, target = view.tensor_shape(x), view.output_shape(name)
    axes = view.const_value(axes_tensor)
    if x_shape is None or target is None or axes is None or min(x_shape + target, default=0) < 0:
        return None
    axes = sorted(int(a) % len(x_shape) for a in np.atleast_1d(axes)) if len(x_shape) else []
    k = len(axes)
    if not k or axes != list(range(k)) or k == len(x_shape):
        return None
    if int(np.prod(x_shape[k:])) != int(np.prod(target)) or tuple(x_shape[k:]) == tuple(target):
        return None
    return total, x, tuple(x_shape[:k]), tuple(target)
