"""Run a tf.function and a small Keras model; save outputs and the executed op types.

Run by tests/test_plugin.py in a fresh process, once with AUTOFUSE_FLAGS enabling fusion
and once without, so that the CPU plugin path (no config edit) is what is tested.
Usage: python function_and_keras.py OUT.npz
"""

import json
import sys

import numpy as np
import tensorflow as tf

import tf_autofuse
from tf_autofuse import profiling


@tf.function
def chain(x):
    return tf.exp(tf.nn.relu(tf.abs(x)))


def keras_model():
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input(shape=(16,))
    a = keras.layers.Dense(32)(inputs)
    gated = keras.layers.Multiply()([a, keras.layers.Activation("sigmoid")(a)])
    hidden = keras.layers.Activation("tanh")(gated)
    return keras.Model(inputs, keras.layers.Dense(4)(hidden))


def op_types(graphs):
    return sorted({node.op for graph in graphs for node in graph.node})


def main(out_path):
    x = np.random.default_rng(0).uniform(-2, 2, (64, 48)).astype(np.float32)
    fn_graphs = profiling.executed_function_graphs(chain, tf.constant(x))
    fn_out = chain(tf.constant(x)).numpy()

    model = keras_model()
    batch = np.random.default_rng(1).uniform(-1, 1, (8, 16)).astype(np.float32)
    serve = tf.function(lambda t: model(t, training=False))
    # Only the graphs that compute the model: Keras may also run variable/seed set-up graphs.
    keras_graphs = [g for g in profiling.executed_function_graphs(serve, tf.constant(batch))
                    if any("MatMul" in n.op for n in g.node)]
    keras_out = serve(tf.constant(batch)).numpy()
    predict_out = model.predict(batch, verbose=0)

    np.savez(out_path, fn=fn_out, x=x, keras=keras_out, predict=predict_out)
    print(json.dumps({
        "fused": tf_autofuse.config().enable_autofuse,
        "fn_ops": op_types(fn_graphs),
        "fn_kernels": sorted(n.name for g in fn_graphs for n in g.node if n.op == "AutofuseKernel"),
        "keras_ops": op_types(keras_graphs),
        "keras_kernels": sorted(n.name for g in keras_graphs for n in g.node
                                if n.op == "AutofuseKernel"),
    }))


if __name__ == "__main__":
    main(sys.argv[1])
