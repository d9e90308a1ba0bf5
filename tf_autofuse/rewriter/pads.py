"""Zero padding read by a convolution as the convolution's own explicit padding.

Keras' ZeroPadding2D before a Conv2D with padding "valid" (ResNet's 7x7 stem, the stride-2
blocks of many CNNs) is a `Pad` node that writes a padded copy of the activation, one more
kernel and one more pass over memory, which the convolution then reads. TensorFlow's Conv2D and
its `_FusedConv2D` take the same zeros as `padding="EXPLICIT"` with `explicit_paddings`: the same
bits with Eigen's kernels; oneDNN's choose their algorithm by the padding too, so the sums may
be ordered differently, as accurate either way (tests/test_epilogue.py). So a `Pad` (or a
`PadV2` of constant 0) whose only reader is such a convolution, padding only the spatial axes of
an NHWC input by constant amounts, is dropped and the convolution reads the unpadded input.

Not taken: depthwise convolutions (TensorFlow's `_FusedDepthwiseConv2dNative`, which the
epilogue pass may make of one, has no explicit padding), a Pad or convolution the caller feeds,
fetches or keeps out of fusion (scope.kept_out), a Pad read by anything else, NCHW, padding of
the batch or channel axes. A Pad left alone is not a refusal: nothing was to be fused.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np
from tensorflow.core.framework import graph_pb2, node_def_pb2

from .graph import GraphView, parse_input
from . import scope

CONVOLUTIONS = frozenset({"Conv2D", "_FusedConv2D"})
PADS = frozenset({"Pad", "PadV2"})


def fold_pads(graph_def: graph_pb2.GraphDef, shapes: Optional[Mapping[str, Sequence]], policy):
    """(graph, shapes, [(pad, convolution)]): the inputs themselves when no Pad folds. The
    inputs are never mutated."""
    if not any(node.op in PADS for node in graph_def.node):
        return graph_def, shapes, []
    view = GraphView(graph_def, shapes)
    protected = scope.kept_out(view, policy)
    replaced, removed, folded = {}, set(), []
    for name in view.order:
        node = view.node(name)
        if node.op not in CONVOLUTIONS or name in protected:
            continue
        padded = _foldable_pad(view, name, protected | set(removed))
        if padded is None:
            continue
        pad, amounts = padded
        conv = node_def_pb2.NodeDef()
        conv.CopyFrom(node)
        conv.input[0] = view.node(pad).input[0]
        moved = [t for t in view.node(pad).input if t.startswith("^")]
        conv.input.extend(t for t in moved if t not in conv.input)
        conv.attr["padding"].s = b"EXPLICIT"
        del conv.attr["explicit_paddings"].list.i[:]
        conv.attr["explicit_paddings"].list.i.extend(amounts)
        replaced[name] = conv
        removed.add(pad)
        folded.append((pad, name))
    if not folded:
        return graph_def, shapes, []
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    out.node.extend(replaced.get(node.name, node) for node in graph_def.node
                    if node.name not in removed)
    return out, shapes, folded


def _foldable_pad(view: GraphView, name: str, protected) -> Optional[tuple]:
    """(the Pad `name` reads as its input, the 8 explicit paddings) or None."""
    conv = view.node(name)
    if conv.attr["padding"].s != b"VALID" or conv.attr["data_format"].s not in (b"", b"NHWC"):
        return None
    if not conv.input or conv.input[0].startswith("^"):
        return None
    pad, index, _ = parse_input(conv.input[0])
    if pad not in view or index != 0 or pad in protected:
        return None
    node = view.node(pad)
    if node.op not in PADS or node.device != conv.device:
        return None
    if [c for c, _, _ in view.data_consumers(pad)] != [name] or view.control_consumers(pad):
        return None
    inputs = view.data_inputs(pad)
    if node.op == "PadV2":
        fill = view.const_value(inputs[2]) if len(inputs) > 2 else None
        if fill is None or fill.shape != () or fill != 0:
            return None
    amounts = view.const_value(inputs[1]) if len(inputs) > 1 else None
    if amounts is None or amounts.shape != (4, 2) or np.any(amounts < 0):
        return None
    if np.any(amounts[0] != 0) or np.any(amounts[3] != 0):  # batch and channels
        return None
    return pad, [int(v) for v in amounts.reshape(-1)]
