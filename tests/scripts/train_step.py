"""A few SGD steps of a small dense network, one activation a layer (or of a small conv net with
Keras BatchNormalization, `conv_bn`; or 10 steps of SGD with momentum of a conv net with
BatchNormalization and swish, `conv_swish`); save losses, gradients and the executed op types.

Run by tests/test_grad_ops.py in a fresh process, with AUTOFUSE_FLAGS enabling fusion (and the
reduce pass, for BiasAddGrad) and without, so that the training step's backward ops go through
the CPU plugin path as a user's would.
Usage: python train_step.py OUT.npz [dense|conv_bn|conv_swish]
"""

import json
import sys

import numpy as np
import tensorflow as tf

from tf_autofuse import profiling
from tf_autofuse.rewriter import FUSED_OPS

ACTIVATIONS = ("relu", "sigmoid", "tanh", "elu", "selu", "softplus")
STEPS = 3


def dense_model(keras):
    layers = [keras.layers.Dense(32, activation=name) for name in ACTIVATIONS]
    layers.append(keras.layers.Dense(1))
    return keras.Sequential([keras.Input(shape=(16,)), *layers]), (64, 16)


def conv_bn_model(keras):
    """Two convolutions, each with BatchNormalization (training: batch statistics, moving
    averages) and a ReLU, then global average pooling and a Dense layer."""
    layers = []
    for _ in range(2):
        layers += [keras.layers.Conv2D(16, 3, padding="same", use_bias=False),
                   keras.layers.BatchNormalization(), keras.layers.ReLU()]
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(1)]
    return keras.Sequential([keras.Input(shape=(12, 12, 8)), *layers]), (16, 12, 12, 8)


def conv_swish_model(keras):
    """Three convolutions with bias, each with BatchNormalization and swish, then global average
    pooling and a Dense layer: the issue's "small conv net, BN + swish" at batch 32."""
    layers = []
    for filters in (16, 32, 32):
        layers += [keras.layers.Conv2D(filters, 3, padding="same"),
                   keras.layers.BatchNormalization(), keras.layers.Activation("swish")]
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(1)]
    return keras.Sequential([keras.Input(shape=(16, 16, 3)), *layers]), (32, 16, 16, 3)


MODELS = {"dense": dense_model, "conv_bn": conv_bn_model, "conv_swish": conv_swish_model}


def main(out_path, model_name="dense"):
    import keras

    keras.utils.set_random_seed(0)
    model, shape = MODELS[model_name](keras)
    steps = 10 if model_name == "conv_swish" else STEPS
    optimizer = (keras.optimizers.SGD(learning_rate=0.02, momentum=0.9)
                 if model_name == "conv_swish" else keras.optimizers.SGD(learning_rate=0.05))
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(0, 1, shape).astype(np.float32))
    y = tf.constant(rng.normal(0, 1, (shape[0], 1)).astype(np.float32))

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss, grads

    graphs = [g for g in profiling.executed_function_graphs(train_step, x, y)
              if any(n.op.endswith("Grad") or n.op in FUSED_OPS for n in g.node)]
    losses, gradients = [], []
    for _ in range(steps):
        loss, grads = train_step(x, y)
        losses.append(loss.numpy())
        gradients.append(np.concatenate([g.numpy().ravel() for g in grads]))
    weights = np.concatenate([w.numpy().ravel() for w in model.trainable_variables])
    np.savez(out_path, losses=np.array(losses), gradients=np.array(gradients), weights=weights)
    print(json.dumps({
        "ops": sorted({n.op for g in graphs for n in g.node}),
        "kernels": sorted(n.name for g in graphs for n in g.node if n.op in FUSED_OPS),
    }))


if __name__ == "__main__":
    main(*sys.argv[1:])
