"""The README's API example: fuse a graph, read the counts and the report, check the numbers.

    python examples/api/quickstart.py
"""

import numpy as np
import tensorflow as tf

import tf_autofuse

tf1 = tf.compat.v1

graph = tf.Graph()
with graph.as_default():
    x = tf1.placeholder(tf.float32, [None, 256], name="x")
    bias = tf.constant(np.linspace(-1, 1, 256, dtype=np.float32), name="bias")
    z = tf.add(x, bias, name="z")
    y = tf.nn.relu(z * tf.sigmoid(z), name="y")  # bias add, swish, relu: 4 TF kernels

fused = tf_autofuse.fuse(graph, outputs=["y"])  # also: a GraphDef or a concrete function
print(fused.report())
print("kernels:", fused.get_kernel_count(original=True), "->", fused.get_kernel_count(),
      "| operators:", fused.get_operator_count(), "| fused kernels:", fused.get_fusion_count())
for fusion in fused.fusions:  # name, kind, original node names, program
    print(fusion.name, fusion.kind, fusion.nodes)
    print(fusion.program)

feeds = {"x": np.random.default_rng(0).normal(size=(8, 256)).astype(np.float32)}
print("max |fused - original| =", fused.verify(feeds))  # runs both graphs
y_fused = fused.run("y", feeds)  # one fetch: one array; a list of fetches: a list

# A configured Fuser: the reduce pass on, and a cost model.
fuser = tf_autofuse.Fuser(passes="pointwise,reduce", enable_cost_model=True,
                          cost_model="compute_density")
fuser.config.max_fusion_size = 32  # every value is checked: a bad one raises ConfigError
print(fuser.fuse(graph, outputs=["y"]).get_fusion_count())
