"""Check that a change to the rewriter leaves its results exactly as they were.

    python scripts/rewrite_digest.py capture DIR          # the graphs to rewrite (a few minutes)
    python scripts/rewrite_digest.py digest DIR -o A.json  # rewrite each under several configs
    ... change the rewriter ...
    python scripts/rewrite_digest.py digest DIR -o B.json
    python scripts/rewrite_digest.py compare A.json B.json # exit 1 on any difference

`capture` records what the rewriter is given, in fresh processes:
  * the Grappler bridge's calls (GraphDef, preserve, feeds, Grappler's shapes) while Keras
    ResNet50, MobileNetV2, EfficientNetB0 and the suite's transformer run a first call at batch 1;
  * the same models frozen at batch None through `tf_autofuse.fuse`'s input path (symbolic
    batch sizes from fuser.static_shapes);
  * the examples' and the benchmark micro workloads' TF1 graphs, the same way.
`digest` rewrites every capture under each config of CONFIGS (the limits, the reduce pass, the
cost models, recomputation) and records, per (capture, config), the rewritten GraphDef's bytes
(deterministic serialization: node names, ops, inputs, attrs, the programs), the fusions and
every refusal with its reason. Decisions and graphs must match byte for byte, so `compare` does
not tolerate anything.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("resnet50", "mobilenetv2", "efficientnetb0", "transformer")
# (name, rewriter flags): attributes rewriter.policy_from_flags reads
CONFIGS = {
    "pointwise": {},
    "reduce": {"autofuse_enable_pass": ("reduce",)},
    "small": {"autofuse_enable_pass": ("reduce",), "max_fusion_size": 4,
              "max_input_nums_after_fuse": 3},
    "bandwidth": {"autofuse_enable_pass": ("reduce",), "cost_model": "memory_bandwidth"},
    "density": {"autofuse_enable_pass": ("reduce",), "cost_model": "compute_density"},
    "latency": {"autofuse_enable_pass": ("reduce",), "cost_model": "latency"},
    "recompute": {"autofuse_enable_pass": ("reduce",), "recomputation_threshold": 3},
    "recompute_latency": {"autofuse_enable_pass": ("reduce",), "recomputation_threshold": 3,
                          "cost_model": "latency"},
}


def _save(directory: Path, name: str, graph_def, preserve, feeds, shapes) -> None:
    with open(directory / f"{name}.pkl", "wb") as handle:
        pickle.dump((graph_def.SerializeToString(deterministic=True), sorted(preserve),
                     sorted(feeds), {k: list(v) for k, v in (shapes or {}).items()}), handle)


def _capture_model(model: str, directory: Path) -> None:
    """In a process of its own (AUTOFUSE_FLAGS set by the parent): the bridge's inputs during
    a first call, then the model frozen at batch None."""
    import numpy as np
    import tensorflow as tf

    import tf_autofuse  # noqa: F401  (registers the pass)
    from tf_autofuse import _bridge, fuser
    from benchmarks import workloads as wl

    calls = []
    original = _bridge.optimize

    def recording(graph_bytes, preserve, feeds, shapes, params, source):
        calls.append((graph_bytes, list(preserve), list(feeds), dict(shapes)))
        return original(graph_bytes, preserve, feeds, shapes, params, source)

    _bridge.optimize = recording
    keras_model = wl.build_model(wl.get(f"{model}_b1"))
    shape = wl.model_input_shape(model, False)
    x = tf.constant(np.random.default_rng(1).uniform(0, 1, (1, *shape)).astype(np.float32))

    @tf.function
    def step(t):
        return keras_model(t, training=False)

    step(x)
    _bridge.optimize = original
    for i, (graph_bytes, preserve, feeds, shapes) in enumerate(calls):
        graph_def = tf.compat.v1.GraphDef.FromString(graph_bytes)
        _save(directory, f"{model}_bridge{i}", graph_def, preserve, feeds, shapes)
    function = tf.function(lambda t: keras_model(t, training=False),
                           input_signature=[tf.TensorSpec((None, *shape), tf.float32)])
    graph_def, inputs, outputs, tf_graph = fuser._as_graph_def(function)
    _save(directory, f"{model}_frozen", graph_def, [o.split(":")[0] for o in outputs],
          [i.split(":")[0] for i in inputs], fuser.static_shapes(graph_def, tf_graph))


def _capture_graphs(directory: Path) -> None:
    """The examples' and the micro workloads' TF1 graphs, as `tf_autofuse.fuse` sees them."""
    import importlib.util

    import tensorflow as tf

    from tf_autofuse import fuser
    from benchmarks import workloads as wl

    tf1 = tf.compat.v1
    sys.path.insert(0, str(ROOT / "examples/tensorflow"))
    for path in sorted((ROOT / "examples/tensorflow").glob("af_tf_*/*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        graph = tf.Graph()
        with graph.as_default():
            _, output = module.build(tf1)
        _store_graph(directory, f"example_{path.stem}", graph, [output.op.name], fuser)
    for name in wl.MICRO:
        workload = wl.get(name)
        graph = tf.Graph()
        with graph.as_default():
            tensors = [tf1.placeholder(getattr(tf, i.dtype), (None,) + tuple(i.shape[1:])
                                       if n == 0 else i.shape, name=i.name)
                       for n, i in enumerate(workload.inputs)]
            output = tf.identity(workload.fn(tf, *tensors), name="output")
        _store_graph(directory, f"micro_{name}", graph, [output.op.name], fuser)


def _store_graph(directory, name, graph, outputs, fuser) -> None:
    graph_def, inputs, _, tf_graph = fuser._as_graph_def(graph)
    _save(directory, name, graph_def, outputs, [i.split(":")[0] for i in inputs],
          fuser.static_shapes(graph_def, tf_graph))


def capture(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, AUTOFUSE_FLAGS="--enable_autofuse=true;--autofuse_enable_pass=reduce",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for what in MODELS + ("graphs",):
        print(f"capturing {what} ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, __file__, "_capture", what, str(directory)], env=env,
                       check=True)


def digest(directory: Path) -> dict:
    from tensorflow.core.framework import graph_pb2

    from tf_autofuse import rewriter

    out = {}
    for path in sorted(directory.glob("*.pkl")):
        with open(path, "rb") as handle:
            graph_bytes, preserve, feeds, shapes = pickle.load(handle)
        graph_def = graph_pb2.GraphDef.FromString(graph_bytes)
        for config, values in CONFIGS.items():
            flags = types.SimpleNamespace(**values)
            result = rewriter.rewrite(graph_def, preserve, flags, shapes, feeds)
            text = result.graph_def.SerializeToString(deterministic=True)
            out[f"{path.stem}/{config}"] = {
                "graph_sha256": hashlib.sha256(text).hexdigest(),
                "fusions": [[f.name, f.kind, list(f.nodes), list(f.op_types), f.program,
                             list(f.absorbed)] for f in result.fusions],
                "refusals": [list(r) for r in result.refusals],
            }
    return out


def compare(first: dict, second: dict) -> int:
    differ = [key for key in sorted(set(first) | set(second)) if first.get(key) != second.get(key)]
    for key in differ[:20]:
        a, b = first.get(key), second.get(key)
        if a is None or b is None:
            print(f"{key}: only in {'the first' if b is None else 'the second'}")
            continue
        for field in a:
            if a[field] != b[field]:
                print(f"{key}: {field} differs")
    fusions = sum(len(v["fusions"]) for v in first.values())
    print(f"{len(first)} rewrites ({fusions} fusions) compared: "
          f"{'identical' if not differ else f'{len(differ)} differ'}")
    return 1 if differ else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("capture").add_argument("dir", type=Path)
    run = commands.add_parser("digest")
    run.add_argument("dir", type=Path)
    run.add_argument("-o", "--out", type=Path, required=True)
    check = commands.add_parser("compare")
    check.add_argument("first", type=Path)
    check.add_argument("second", type=Path)
    internal = commands.add_parser("_capture")
    internal.add_argument("what")
    internal.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    if args.command == "capture":
        capture(args.dir)
    elif args.command == "_capture":
        sys.path.insert(0, str(ROOT))
        if args.what == "graphs":
            _capture_graphs(args.dir)
        else:
            _capture_model(args.what, args.dir)
    elif args.command == "digest":
        args.out.write_text(json.dumps(digest(args.dir), indent=0, sort_keys=True))
    else:
        return compare(json.loads(args.first.read_text()), json.loads(args.second.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
