"""The runner every example shares: mode dispatch, session, 100 steps, op summary.

An example supplies `build(tf1) -> (feeds, fetch)` that builds its graph with the TF1 graph
API (`tf1` is `tf.compat.v1`) and `reference(feed_values) -> numpy array`, the float64
result the fetch should approximate. The runner runs it in the chosen mode:

  --mode tf1         the TF1 graph API on TensorFlow 2 (tf.compat.v1 placeholder, Session)
  --mode tf2-compat  tf_autofuse.compat.enable_v1() first, then the same

Fusion follows AUTOFUSE_FLAGS as it always does (`--enable_autofuse=true` turns it on).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np


def _parse_args(description: str, argv):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--mode", choices=["tf1", "tf2-compat"], default="tf1",
                        help="tf1: TF1 graph API on TF2; tf2-compat: TF2 switched to v1 behaviour")
    parser.add_argument("--steps", type=int, default=100, help="session steps to run (default 100)")
    parser.add_argument("--seed", type=int, default=0,
                        help="numpy seed of the random inputs (default 0: runs are comparable)")
    parser.add_argument("--save", metavar="FILE.npy", help="also save the last step's result")
    parser.add_argument("--profile-dir", default="./profiling",
                        help="where the op summary is written (default ./profiling)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    return args


def main(build, reference, description: str, argv=None) -> int:
    args = _parse_args(description, argv)
    import tensorflow as tf

    import tf_autofuse
    from tf_autofuse import profiling

    if args.mode == "tf2-compat":
        tf_autofuse.compat.enable_v1()
    tf1 = tf.compat.v1
    fused = tf_autofuse.config().enable_autofuse
    print(f"mode {args.mode}, TensorFlow {tf.__version__}, "
          f"fusion {'on' if fused else 'off'} (AUTOFUSE_FLAGS={os.environ.get('AUTOFUSE_FLAGS', '')!r})")

    np.random.seed(args.seed)
    graph = tf.Graph()
    with graph.as_default():
        feeds, fetch = build(tf1)
        summary = profiling.OpSummary(args.profile_dir)
        with tf1.Session(graph=graph) as sess:
            for _ in range(args.steps):
                metadata = tf1.RunMetadata()
                result = sess.run(fetch, feeds, options=summary.run_options(),
                                  run_metadata=metadata)
                summary.add(metadata)
    path = summary.write()
    if args.save:
        np.save(args.save, result)

    expected = reference({placeholder.name.split(":")[0]: value
                          for placeholder, value in feeds.items()})
    error = float(np.max(np.abs(result.astype(np.float64) - expected))) if result.size else 0.0
    print(f"result {result.dtype}{list(result.shape)}, max |result - float64 reference| = {error:.3g}")
    print("kernels run (mean over steps):")
    for row in summary.rows():
        print(f"  {row['OP Type']:<24} {row['Op Name']:<44} {row['Task Duration(us)']:>10} us")
    print(f"op summary: {path.resolve()}")
    return 0


def run(build, reference, description: str) -> None:
    sys.exit(main(build, reference, description))
