"""A Keras model trained for a few steps under a tf.distribute strategy; prints JSON: the loss
of every step and the op types of the executed train-step graphs.

Run by tests/test_distribute.py in fresh processes, with and without AUTOFUSE_FLAGS:
    python distributed_step.py mirrored
    python distributed_step.py multiworker      (TF_CONFIG names this worker; two of them)
"""

import json
import sys

import numpy as np
import tensorflow as tf

import tf_autofuse  # noqa: F401 - registers the plugin when AUTOFUSE_FLAGS asks for it
from tf_autofuse import profiling

STEPS = 6
BATCH = 32


def strategy_for(kind):
    if kind == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    return tf.distribute.MultiWorkerMirroredStrategy()


def main(kind):
    strategy = strategy_for(kind)
    import keras

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (STEPS * BATCH, 12)).astype(np.float32)
    y = rng.integers(0, 3, STEPS * BATCH).astype(np.int32)
    with strategy.scope():
        model = keras.Sequential([
            keras.Input(shape=(12,)),
            keras.layers.Dense(24), keras.layers.BatchNormalization(),
            keras.layers.Activation("swish"),
            keras.layers.Dense(16, activation="tanh"),
            keras.layers.Dense(3)])
        optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="sum_over_batch_size")
        optimizer.build(model.trainable_variables)  # its slots before the step is traced

    def replica_step(features, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(features, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(features, labels):
        losses = strategy.run(replica_step, args=(features, labels))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None)

    # one batch, trained on again and again: the loss must fall
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    batch = next(iter(strategy.experimental_distribute_dataset(dataset)))
    graphs = profiling.executed_function_graphs(train_step, *batch)  # the first step
    losses = [float(train_step(*batch)) for _ in range(STEPS)]
    print(json.dumps({"losses": losses,
                      "ops": sorted({n.op for g in graphs for n in g.node})}))


if __name__ == "__main__":
    main(sys.argv[1])
