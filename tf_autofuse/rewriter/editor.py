"""A GraphDef being rewritten by a pass that runs before the partitioner (epilogue.py,
reshaped_sums.py): the nodes it replaces, removes and adds, with unique names and the static
shapes of what it adds, and the new GraphDef built from them."""

from __future__ import annotations

import numpy as np
from tensorflow.core.framework import graph_pb2, node_def_pb2

from . import catalog
from .graph import GraphView, Tensor, parse_input, tensor_name


class Editor:
    """The new graph: replaced nodes, added nodes and their static shapes."""

    def __init__(self, view: GraphView, shapes):
        self.view = view
        self.shapes = dict(shapes or {})
        self.taken = {node.name for node in view.nodes}
        self.added: list = []
        self.replaced: dict = {}  # name -> the node standing in its place
        self.removed: set = set()

    def shape(self, tensor: Tensor):
        """The static shape of a tensor of the graph or of a node added here (a tuple)."""
        shapes = self.shapes.get(tensor[0]) or ()
        shape = shapes[tensor[1]] if tensor[1] < len(shapes) else None
        if shape is None and tensor[0] in self.view:
            shape = self.view.tensor_shape(tensor)
        return None if shape is None else tuple(shape)

    def unique(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name

    def node(self, base: str, op: str, inputs, device: str, shape, **attrs) -> Tensor:
        node = node_def_pb2.NodeDef(name=self.unique(base), op=op, device=device)
        node.input.extend(tensor_name(t) for t in inputs)
        for key, value in attrs.items():
            if isinstance(value, int) and key.startswith("T"):
                node.attr[key].type = value
            else:
                node.attr[key].CopyFrom(value)
        self.added.append(node)
        self.shapes[node.name] = [shape]
        return (node.name, 0)

    def const(self, base: str, value: np.ndarray, device: str) -> Tensor:
        from tensorflow.python.framework import tensor_util

        node = node_def_pb2.NodeDef(name=self.unique(base), op="Const", device=device)
        proto = tensor_util.make_tensor_proto(value)
        node.attr["dtype"].type = proto.dtype
        node.attr["value"].tensor.CopyFrom(proto)
        self.added.append(node)
        self.shapes[node.name] = [tuple(value.shape)]
        return (node.name, 0)

    def graph(self, source: graph_pb2.GraphDef, protected) -> graph_pb2.GraphDef:
        """The new graph; view nodes that only the replaced nodes read leave it too."""
        nodes = [self.replaced.get(node.name, node) for node in source.node
                 if node.name not in self.removed] + self.added
        while True:
            read = {parse_input(text)[0] for node in nodes for text in node.input}
            dead = {node.name for node in nodes
                    if catalog.is_view(node.op) and node.name not in read
                    and node.name not in protected and self.view.data_consumers(node.name)}
            if not dead:
                break
            nodes = [node for node in nodes if node.name not in dead]
        out = graph_pb2.GraphDef()
        out.versions.CopyFrom(source.versions)
        out.library.CopyFrom(source.library)
        out.node.extend(nodes)
        return out
