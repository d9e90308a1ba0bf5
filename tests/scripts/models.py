"""Run a Keras model through tf.function; save its output and the kernels it executed.

Run by tests/test_models.py (and benchmarks) in a fresh process, once with fusion on and once
without, since AUTOFUSE_FLAGS is read at import.
Usage: python models.py MODEL OUT.npz [--batch N]     MODEL: resnet50, efficientnetb0, transformer
Prints one JSON line: {"kernels": total, "by_type": {...}, "fused": [names...]}.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

import tf_autofuse  # noqa: F401  (registers the pass when AUTOFUSE_FLAGS enables it)
from tf_autofuse import profiling

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.workloads import transformer_encoder  # noqa: E402  (the suite's encoder)


def build(name):
    import keras

    keras.utils.set_random_seed(0)
    if name == "resnet50":
        return keras.applications.ResNet50(weights=None), (224, 224, 3)
    if name == "efficientnetb0":
        return keras.applications.EfficientNetB0(weights=None), (224, 224, 3)
    if name == "transformer":
        return transformer_encoder(keras), (128, 256)
    raise SystemExit(f"unknown model {name!r}: resnet50, efficientnetb0 or transformer")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()

    model, shape = build(args.model)
    x = np.random.default_rng(1).uniform(0, 1, (args.batch, *shape)).astype(np.float32)
    serve = tf.function(lambda t: model(t, training=False))
    graphs = profiling.executed_function_graphs(serve, tf.constant(x))
    out = serve(tf.constant(x)).numpy()
    np.savez(args.out, out=out)
    kernels = profiling.compute_kernels(graphs)
    print(json.dumps({
        "kernels": sum(kernels.values()),
        "by_type": dict(kernels.most_common()),
        "fused": sorted(n.name for g in graphs for n in g.node if n.op == "AutofuseKernel"),
    }))


if __name__ == "__main__":
    main()
