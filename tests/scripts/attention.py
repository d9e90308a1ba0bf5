"""Keras MultiHeadAttention (and a Dense on its output) through tf.function, unfused and fused
in one process, and the same model in float64 with the same weights.

Run by tests/test_epilogue_einsum.py in a fresh process with AUTOFUSE_FLAGS enabling the CPU
plugin (read at import); each side turns the pass on or off in the flags while its function is
optimized, as benchmarks/ab_models.py does.
Usage: python attention.py OUT.npz
Prints one JSON line: per side {"kernels": {op: count}, "fused_matmuls": [[name, fused_ops]],
"executed": [op type of each compute kernel of the partition graphs]}.
"""

import dataclasses
import json
import sys

import numpy as np
import tensorflow as tf

import tf_autofuse  # noqa: F401  (registers the pass when AUTOFUSE_FLAGS enables it)
from tf_autofuse import _bridge, profiling

SEQ, WIDTH, HEADS = 6, 16, 2


def build(keras, dtype):
    inputs = keras.Input(shape=(SEQ, WIDTH), dtype=dtype)
    attention = keras.layers.MultiHeadAttention(num_heads=HEADS, key_dim=WIDTH // HEADS,
                                                dtype=dtype)(inputs, inputs)
    out = keras.layers.Dense(WIDTH, activation="relu", dtype=dtype)(attention)
    return keras.Model(inputs, out)


def executed(function, x):
    """The post-Grappler graphs, and the op type of each kernel TensorFlow instantiated: its
    partition graphs, after the graph passes that follow Grappler (oneDNN's layout pass names
    its kernels _Mkl...)."""
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        function(x)
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    ran = [n.op for g in metadata.function_graphs for p in g.partition_graphs for n in p.node
           if n.op not in profiling.BOOKKEEPING_OPS]
    return [g.post_optimization_graph for g in metadata.function_graphs], ran


def main():
    import keras

    keras.utils.set_random_seed(0)
    model = build(keras, "float32")
    exact = build(keras, "float64")
    exact.set_weights([w.astype(np.float64) for w in model.get_weights()])
    x = np.random.default_rng(1).uniform(-1, 1, (2, SEQ, WIDTH))
    outputs = {"f64": exact(x.astype(np.float64), training=False).numpy()}
    flags, report = _bridge.process_flags(), {}
    try:
        for side, side_flags in (("unfused", dataclasses.replace(flags, enable_autofuse=False)),
                                 ("fused", flags)):
            _bridge.configure(side_flags)
            function = tf.function(lambda t: model(t, training=False))
            graphs, ran = executed(function, tf.constant(x, tf.float32))
            outputs[side] = function(tf.constant(x, tf.float32)).numpy()
            report[side] = {
                "kernels": dict(profiling.compute_kernels(graphs)),
                "fused_matmuls": [[n.name, [s.decode() for s in n.attr["fused_ops"].list.s]]
                                  for g in graphs for n in g.node if n.op == "_FusedMatMul"],
                "executed": ran,
            }
    finally:
        _bridge.configure(flags)
    np.savez(sys.argv[1], **outputs)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
