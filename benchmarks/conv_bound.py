"""How much of a CNN's inference step its convolutions take, under TensorFlow as installed: the
bound on what fusing everything else can give.

    python benchmarks/conv_bound.py resnet50_b1 resnet50_b8
    python benchmarks/conv_bound.py mobilenetv2_b1 --quick       # CI sizes (the smoke test)

For a model workload (benchmarks/workloads.py), one process times, in alternating rounds, the
whole model (a tf.function of `model(x, training=False)`) and its convolutions alone: each
Conv2D / DepthwiseConv2D layer applied with its own weights, bias and a ReLU to an input of its
input shape, all in one tf.function (Grappler's remapper makes each one `_FusedConv2D` /
`_FusedDepthwiseConv2dNative`, as it does for the model). If every other op of the model took no
time at all, the model would run `whole / convolutions` times faster: no fusion of the
elementwise work around the convolutions can do better than that.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _median_ms(fn, arg, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(arg).numpy()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def measure(name: str, quick: bool, rounds: int, calls: int) -> dict:
    import keras
    import numpy as np
    import tensorflow as tf

    from benchmarks import workloads as wl

    workload = wl.get(name, quick=quick)
    model = wl.build_model(workload)
    kinds = (keras.layers.Conv2D, keras.layers.DepthwiseConv2D)
    convs = [layer for layer in model.layers if isinstance(layer, kinds)]
    if not convs:
        raise ValueError(f"{name}: the model has no convolution")
    rng = np.random.default_rng(0)
    inputs = [tf.constant(rng.uniform(0, 1, (workload.batch, *layer.input.shape[1:]))
                          .astype(np.float32)) for layer in convs]
    shape = (workload.batch, *wl.model_input_shape(workload.model, quick))
    x = tf.constant(rng.uniform(0, 1, shape).astype(np.float32))

    @tf.function
    def convolutions(xs):
        total = []
        for layer, t in zip(convs, xs):
            strides, padding = (1, *layer.strides, 1), layer.padding.upper()
            y = (tf.nn.depthwise_conv2d(t, layer.kernel, strides, padding)
                 if isinstance(layer, keras.layers.DepthwiseConv2D)
                 else tf.nn.conv2d(t, layer.kernel, strides, padding))
            if getattr(layer, "bias", None) is not None:
                y = tf.nn.bias_add(y, layer.bias)
            total.append(tf.reduce_sum(tf.nn.relu(y)[..., :1]))  # keeps every output alive
        return tf.add_n(total)

    whole = tf.function(lambda t: model(t, training=False))
    for fn, arg in ((convolutions, inputs), (whole, x)):
        for _ in range(3):
            fn(arg)
    conv_ms, whole_ms = [], []
    for _ in range(rounds):
        conv_ms.append(_median_ms(convolutions, inputs, calls))
        whole_ms.append(_median_ms(whole, x, calls))
    c, w = statistics.median(conv_ms), statistics.median(whole_ms)
    return {"workload": name, "convolutions": len(convs), "convolutions_ms": c, "whole_ms": w,
            "share": c / w, "bound": w / c}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workloads", nargs="+", help="model workloads: resnet50_b1, ...")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5, help="timed calls a side and round")
    parser.add_argument("--quick", action="store_true", help="the CI sizes of the models")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.calls < 1:
        parser.error("--rounds and --calls must be at least 1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    print("| workload | convolutions | their time (ms) | whole model (ms) | share | bound on "
          "a fusion's speed-up |\n| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in args.workloads:
        try:
            r = measure(name, args.quick, args.rounds, args.calls)
        except (KeyError, ValueError) as err:
            parser.error(str(err))
        print(f"| {name} | {r['convolutions']} | {r['convolutions_ms']:.1f} | "
              f"{r['whole_ms']:.1f} | {r['share']:.2f} | {r['bound']:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
