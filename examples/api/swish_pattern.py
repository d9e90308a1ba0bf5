"""A user Pattern: `x * sigmoid(x)` (swish / SiLU) as one fused kernel of our own naming.

    python examples/api/swish_pattern.py

The pattern runs before tf_autofuse's automatic partitioner and claims the Sigmoid and the Mul
of every swish; they become `autofuse_pattern_<n>_Swish`. The ops around it (here a bias add
before and a Relu after) are left to the partitioner, which fuses what is left. A second
pattern, `KeepOutOfFusion`, shows the other use: forbidding fusion of an op type.
"""

import numpy as np
import tensorflow as tf

import tf_autofuse

tf1 = tf.compat.v1


class SwishPattern(tf_autofuse.Pattern):
    """Matches Mul(x, Sigmoid(x)) (either operand order) where nothing else reads the Sigmoid."""

    name = "Swish"

    def match(self, graph, node):
        if graph.op(node) != "Mul":
            return None
        a, b = graph.inputs(node)
        for gate, x in ((a, b), (b, a)):
            if (gate in graph and graph.op(gate) == "Sigmoid" and graph.inputs(gate) == [x]
                    and graph.consumers(gate) == [node]):
                return [gate, node]
        return None


class KeepOutOfFusion(tf_autofuse.Pattern):
    """Forbids fusion of every node of the given op types (they stay TensorFlow kernels)."""

    def __init__(self, *op_types):
        self.op_types = set(op_types)

    def match(self, graph, node):
        return [node] if graph.op(node) in self.op_types else None

    def fuse(self, graph, nodes):
        return tf_autofuse.Pattern.FORBID


def build_graph():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 64], name="x")
        bias = tf.constant(np.linspace(-1, 1, 64, dtype=np.float32), name="bias")
        z = tf.add(x, bias, name="z")
        swish = tf.multiply(z, tf.sigmoid(z, name="gate"), name="swish")
        tf.nn.relu(tf.abs(swish, name="abs"), name="y")
    return graph


def main():
    fuser = tf_autofuse.Fuser()
    fuser.register_pattern(SwishPattern())
    fused = fuser.fuse(build_graph(), outputs=["y"])
    print(fused.report())
    x = np.random.default_rng(0).uniform(-3, 3, (8, 64)).astype(np.float32)
    print("max |fused - original| =", fused.verify({"x": x}))

    forbid = tf_autofuse.Fuser()
    forbid.register_pattern(KeepOutOfFusion("Sigmoid"))
    print(forbid.fuse(build_graph(), outputs=["y"]).report())


if __name__ == "__main__":
    main()
