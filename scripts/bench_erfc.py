"""Time the fp32 GELU-erf chain and Erfc alone through AutofuseKernel (the tf_autofuse imported).

    python scripts/bench_erfc.py            # prints one JSON line: median seconds a call

GELU as TensorFlow writes it, gelu(x) = 0.5 x erfc(-x / sqrt 2), on N(0, 1) inputs of
[128, 1024] and [8192, 3072]; Abs alone shows the per-call floor. Each entry is the median of 9
timed loops (400 calls at the small shape, 6 at the large one) of a tf.function. To compare two
checkouts (the older one need not have this script), run it against each in turn, a fresh
process a run, several rounds interleaved, and take medians:

    for r in 1 2 3 4 5; do for d in $BEFORE $AFTER; do
      PYTHONPATH=$d TF_AUTOFUSE_CACHE_DIR=$d/.cache/tf_autofuse python $AFTER/scripts/bench_erfc.py
    done; done
"""

import json
import time

import numpy as np
import tensorflow as tf

from tf_autofuse import _native

GELU = ["Mul in0, -0.70710677", "Erfc %0", "Mul in0, %1", "Mul %2, 0.5"]


def program(shape, lines):
    text = [f"in0: f32[{','.join(map(str, shape))}]"]
    text += [f"%{i} = {line}" for i, line in enumerate(lines)]
    return "\n".join(text + [f"out0 = %{len(lines) - 1}"])


def main():
    ops = _native.load()
    result = {}
    for shape, calls in (((128, 1024), 400), ((8192, 3072), 6)):
        x = tf.constant(np.random.default_rng(0).standard_normal(shape).astype(np.float32))
        for name, lines in (("gelu", GELU), ("erfc", ["Erfc in0"]), ("abs", ["Abs in0"])):
            text = program(shape, lines)
            run = tf.function(lambda t, text=text: ops.autofuse_kernel(
                inputs=[t], Tout=[tf.float32], program=text)[0])
            run(x).numpy()
            times = []
            for _ in range(9):
                start = time.perf_counter()
                for _ in range(calls):
                    y = run(x)
                y.numpy()
                times.append((time.perf_counter() - start) / calls)
            result[f"{name}{list(shape)}"] = float(np.median(times))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
