"""Offline fusion of saved models: what `python -m tf_autofuse fuse` and `inspect` run.

MODEL kinds:
  GRAPH.pb / GRAPH.pbtxt   a frozen GraphDef (binary / text); written back in the same format
  a SavedModel directory   the signature (default serving_default) is loaded, its variables
                           frozen into constants (convert_variables_to_constants_v2), the graph
                           fused, and a SavedModel written whose signature of the same name runs
                           the fused graph, with the same input names and output keys
Next to the output goes a JSON record of the fusions (`OUT.fusions.json` for graphs,
`OUT/assets.extra/autofuse_fusions.json` for SavedModels), which `inspect` shows.
The fused model needs `import tf_autofuse` (the AutofuseKernel op) before it is loaded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional, Sequence

from google.protobuf import text_format
from tensorflow.core.framework import graph_pb2

from . import fuser as _fuser

SIDECAR_NAME = "autofuse_fusions.json"
GRAPH_SUFFIXES = (".pb", ".pbtxt")


class ModelError(Exception):
    """A model path that cannot be read or written; the message says why and what is accepted."""


def model_kind(path: str) -> str:
    """"savedmodel", "pb" or "pbtxt"; ModelError for anything else."""
    p = Path(path)
    if not p.exists():
        raise ModelError(f"{path}: no such file or directory")
    if p.is_dir():
        if (p / "saved_model.pb").exists() or (p / "saved_model.pbtxt").exists():
            return "savedmodel"
        raise ModelError(f"{path}: a directory without saved_model.pb; MODEL is a SavedModel "
                         f"directory, a frozen GraphDef .pb or a text GraphDef .pbtxt")
    if p.suffix in GRAPH_SUFFIXES:
        return p.suffix[1:]
    raise ModelError(f"{path}: unknown model kind {p.suffix or '(no suffix)'!r}; MODEL is a "
                     f"SavedModel directory, a frozen GraphDef .pb or a text GraphDef .pbtxt")


def read_graph_def(path: str) -> graph_pb2.GraphDef:
    data = Path(path).read_bytes()
    graph_def = graph_pb2.GraphDef()
    try:
        if path.endswith(".pbtxt"):
            text_format.Parse(data.decode("utf-8"), graph_def)
        else:
            graph_def.ParseFromString(data)
    except Exception as err:  # noqa: BLE001 - any parse failure is the same answer
        kind = "text" if path.endswith(".pbtxt") else "binary"
        raise ModelError(f"{path}: not a {kind} GraphDef ({type(err).__name__}: "
                         f"{str(err)[:200]})") from None
    return graph_def


def write_graph_def(graph_def, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    if path.endswith(".pbtxt"):
        Path(path).write_text(text_format.MessageToString(graph_def))
    else:
        Path(path).write_bytes(graph_def.SerializeToString(deterministic=True))


def _signature(model_dir: str, signature: str):
    import tensorflow as tf

    try:
        loaded = tf.saved_model.load(model_dir)
    except Exception as err:  # noqa: BLE001
        raise ModelError(f"{model_dir}: cannot load the SavedModel ({type(err).__name__}: "
                         f"{str(err)[:300]})") from None
    signatures = dict(loaded.signatures)
    if signature not in signatures:
        raise ModelError(f"{model_dir}: no signature {signature!r}; it has "
                         f"{', '.join(sorted(signatures)) or 'none'}")
    return loaded, signatures[signature]


def fuse_saved_model(model_dir: str, out_dir: str, fuser: "_fuser.Fuser",
                     signature: str = "serving_default") -> "_fuser.FusedGraph":
    """Fuse a SavedModel's signature and save the result as a SavedModel; see the module doc."""
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    _loaded, function = _signature(model_dir, signature)
    try:
        frozen = convert_variables_to_constants_v2(function)
    except Exception as err:  # noqa: BLE001
        raise ModelError(f"{model_dir}: cannot freeze the variables of signature {signature!r} "
                         f"({type(err).__name__}: {str(err)[:300]})") from None
    specs = tf.nest.flatten(function.structured_input_signature)
    if len(specs) != len(frozen.inputs):
        raise ModelError(f"{model_dir}: signature {signature!r} has {len(specs)} inputs but its "
                         f"graph {len(frozen.inputs)}")
    by_name = {t.name.split(":")[0]: t for t in frozen.inputs}
    inputs = [by_name.get(spec.name, t) for spec, t in zip(specs, frozen.inputs)]
    keys = sorted(function.structured_outputs) if isinstance(function.structured_outputs,
                                                            dict) else None
    if keys is None or len(keys) != len(frozen.outputs):
        raise ModelError(f"{model_dir}: signature {signature!r} does not return a dict of "
                         f"tensors")
    outputs = {key: t.name for key, t in zip(keys, frozen.outputs)}
    graph_def = frozen.graph.as_graph_def()
    result = fuser.rewrite(graph_def, preserve=[n.split(":")[0] for n in outputs.values()],
                           shapes=_fuser.static_shapes(graph_def, frozen.graph),
                           feeds=[t.name.split(":")[0] for t in inputs])
    fused = _fuser.FusedGraph(graph_def, result.graph_def, result.fusions, result.refusals,
                              [t.name for t in inputs], list(outputs.values()),
                              fuser.config.copy(), result.epilogues)
    _save_graph_as_saved_model(result.graph_def, out_dir, signature,
                               [(spec.name, t) for spec, t in zip(specs, inputs)], outputs)
    extra = Path(out_dir) / "assets.extra"
    extra.mkdir(parents=True, exist_ok=True)
    (extra / SIDECAR_NAME).write_text(_fuser.sidecar(fused))
    return fused


def _save_graph_as_saved_model(graph_def, out_dir: str, signature: str, inputs, outputs) -> None:
    """A SavedModel whose signature `signature` runs `graph_def`: inputs [(name, tensor)],
    outputs {key: tensor name}."""
    import tensorflow as tf

    def import_graph():
        tf.compat.v1.import_graph_def(graph_def, name="")

    wrapped = tf.compat.v1.wrap_function(import_graph, [])
    pruned = wrapped.prune(
        feeds=[wrapped.graph.get_tensor_by_name(t.name) for _, t in inputs],
        fetches={key: wrapped.graph.get_tensor_by_name(name) for key, name in outputs.items()})
    specs = [tf.TensorSpec(t.shape, t.dtype, name=name) for name, t in inputs]

    module = tf.Module()
    module.fused_graph = pruned

    @tf.function(input_signature=specs)
    def serve(*args):
        return module.fused_graph(*args)

    module.serve = serve
    tf.saved_model.save(module, out_dir, signatures={signature: serve.get_concrete_function()})


def fuse_model(model: str, out: str, fuser: "_fuser.Fuser", outputs: Optional[Sequence] = None,
               signature: str = "serving_default") -> "_fuser.FusedGraph":
    """Fuse MODEL into OUT (same kind); returns the FusedGraph."""
    kind = model_kind(model)
    if kind == "savedmodel":
        if Path(out).suffix in GRAPH_SUFFIXES:
            raise ModelError(f"{out}: MODEL is a SavedModel, so OUT is a directory (the same kind)")
        if outputs:
            raise ModelError("--outputs is for GraphDefs; a SavedModel's signature names them")
        if Path(out).exists() and any(Path(out).iterdir()):
            raise ModelError(f"{out}: the directory exists and is not empty")
        return fuse_saved_model(model, out, fuser, signature)
    if Path(out).suffix != "." + kind:
        raise ModelError(f"{out}: MODEL is a .{kind} GraphDef, so OUT ends with .{kind} "
                         f"(the same kind)")
    fused = fuser.fuse(read_graph_def(model), outputs)
    write_graph_def(fused.graph_def, out)
    Path(out + ".fusions.json").write_text(_fuser.sidecar(fused))
    return fused


# --- inspect ----------------------------------------------------------------------------------


def _sidecar_for(path: str, kind: str) -> Optional[dict]:
    where = (Path(path) / "assets.extra" / SIDECAR_NAME if kind == "savedmodel"
             else Path(path + ".fusions.json"))
    try:
        return json.loads(where.read_text())
    except (OSError, ValueError):
        return None


def _graphs_of_saved_model(path: str) -> list:
    """Every graph body of a SavedModel: the top graph and each library function's nodes."""
    from tensorflow.core.protobuf import saved_model_pb2

    model = saved_model_pb2.SavedModel()
    pb = Path(path) / "saved_model.pb"
    try:
        if pb.exists():
            model.ParseFromString(pb.read_bytes())
        else:
            text_format.Parse((Path(path) / "saved_model.pbtxt").read_text(), model)
    except Exception as err:  # noqa: BLE001
        raise ModelError(f"{path}: not a SavedModel ({type(err).__name__}: {err})") from None
    graphs = []
    for meta in model.meta_graphs:
        graphs.append(meta.graph_def)
        for function in meta.graph_def.library.function:
            body = graph_pb2.GraphDef()
            body.node.extend(function.node_def)
            graphs.append(body)
    return graphs


def inspect_model(path: str) -> str:
    """The fusion table of a fused model (graph or SavedModel)."""
    kind = model_kind(path)
    if kind == "savedmodel":
        graphs = _graphs_of_saved_model(path)
        holding = [g for g in graphs if any(n.op in _fuser.FUSED_OPS for n in g.node)]
        main = max(holding or graphs, key=lambda g: len(g.node))
    else:
        main = read_graph_def(path)
        holding = [main]
    record = _sidecar_for(path, kind)
    known = {row["name"]: row for row in (record or {}).get("fusions", [])}
    rows, seen = [], set()
    for graph in holding:
        for node in graph.node:
            if node.op not in _fuser.FUSED_OPS or node.name in seen:
                continue
            seen.add(node.name)
            row = dict(known.get(node.name) or {})
            kind_word = node.name.split("_")[1] if node.name.count("_") >= 2 else "?"
            rows.append({"name": node.name, "kind": row.get("kind", kind_word),
                         "operators": _fuser.fused_operators(
                             node, {node.name: row["operators"]} if "operators" in row else None),
                         "nodes": row.get("nodes", [])})
    counts = {k: row["operators"] for k, row in known.items()}
    lines = [f"{path}: {len(rows)} fused kernel(s); {_fuser.count_kernels(main)} kernels, "
             f"{_fuser.count_operators(main, counts)} operators"]
    if record:
        lines.append(f"  before fusion: {record['kernels']['original']} kernels, "
                     f"{record['operators']['original']} operators")
    lines.extend(_fuser.fusion_table(rows))
    if record is None and rows:
        lines.append("  (no fusion record next to the model: the replaced nodes are not known)")
    return "\n".join(lines)


def environ_note() -> Optional[str]:
    """A note when AUTOFUSE_FLAGS is set: it does not change what the offline command does."""
    if os.environ.get("AUTOFUSE_FLAGS"):
        return ("note: AUTOFUSE_FLAGS is set; the offline command uses its own options "
                "(--config KEY=VALUE), not the environment")
    return None
