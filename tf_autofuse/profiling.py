"""Per-kernel profiling into an op summary CSV, the file users open to see what ran.

Usage with a v1 Session:

    summary = tf_autofuse.profiling.OpSummary()
    for _ in range(100):
        metadata = tf.compat.v1.RunMetadata()
        sess.run(fetches, feeds, options=summary.run_options(), run_metadata=metadata)
        summary.add(metadata)
    path = summary.write()   # ./profiling/PROF_<timestamp>_<pid>/mindstudio_profiler_output/op_summary_<timestamp>.csv

Rows come from TensorFlow's step stats: one row per kernel (node) that ran, with its mean
duration over the steps it ran in. Grappler's pseudo-nodes `_SOURCE` and `_SINK` are not
kernels and are left out; everything else TensorFlow executed is listed, bookkeeping
kernels (`_Arg`, `_Retval`, `Identity`) included.

For a `tf.function`, `executed_function_graphs(fn, *args)` returns the graphs TensorFlow ran
after optimization, to check which kernels a function runs.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import re
import time
from pathlib import Path

COLUMNS = ["Op Name", "OP Type", "Task Duration(us)", "Count", "Input Shapes",
           "Input Data Types", "Output Shapes", "Output Data Types", "Device"]
_PSEUDO_NODES = {"_SOURCE", "_SINK"}
_LABEL = re.compile(r"^(?P<name>[^=]+?) = (?P<op>[^(]+)\((?P<inputs>.*)\)$")


def _dtype_name(enum_value: int) -> str:
    from tensorflow.python.framework import dtypes

    try:
        return dtypes.as_dtype(enum_value).name.upper()
    except TypeError:
        return str(enum_value)


def _shape_text(shape_proto) -> str:
    if shape_proto.unknown_rank:
        return "?"
    return ",".join(str(d.size) if d.size >= 0 else "?" for d in shape_proto.dim)


@dataclasses.dataclass
class _Kernel:
    name: str
    op_type: str
    device: str
    inputs: list
    total_ns: int = 0
    count: int = 0
    outputs: dict = dataclasses.field(default_factory=dict)  # slot -> (shape, dtype)


class OpSummary:
    """Accumulates step stats over steps and writes the op summary CSV."""

    def __init__(self, root: str | os.PathLike = "./profiling"):
        self.root = Path(root)
        self._kernels: dict[tuple[str, str], _Kernel] = {}
        self._outputs: dict[str, dict] = {}  # node name -> {slot: (shape, dtype)}

    @staticmethod
    def run_options():
        import tensorflow as tf

        # SOFTWARE_TRACE records every kernel's times and outputs on CPU; HARDWARE and FULL
        # also ask for a device trace, which logs "GPU trace was not collected" on every step.
        return tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.SOFTWARE_TRACE)

    def add(self, run_metadata) -> None:
        """Add one step's RunMetadata (from a Session.run with run_options())."""
        for device_stats in run_metadata.step_stats.dev_stats:
            for stats in device_stats.node_stats:
                if stats.node_name in _PSEUDO_NODES:
                    continue
                match = _LABEL.match(stats.timeline_label)
                op_type = match.group("op").strip() if match else ""
                inputs = ([i.strip() for i in match.group("inputs").split(",") if i.strip()]
                          if match else [])
                key = (device_stats.device, stats.node_name)
                kernel = self._kernels.get(key)
                if kernel is None:
                    kernel = _Kernel(stats.node_name, op_type, device_stats.device, inputs)
                    self._kernels[key] = kernel
                duration = stats.op_end_rel_nanos - stats.op_start_rel_nanos
                if duration <= 0:
                    duration = 1000 * (stats.op_end_rel_micros - stats.op_start_rel_micros)
                kernel.total_ns += max(duration, 0)
                kernel.count += 1
                for out in stats.output:
                    desc = out.tensor_description
                    kernel.outputs[out.slot] = (_shape_text(desc.shape), _dtype_name(desc.dtype))
                self._outputs[stats.node_name] = kernel.outputs

    def _input_descriptions(self, kernel: _Kernel) -> tuple[str, str]:
        shapes, dtypes = [], []
        for ref in kernel.inputs:
            if ref.startswith("^"):
                continue
            node, _, slot = ref.partition(":")
            shape, dtype = self._outputs.get(node, {}).get(int(slot or 0), ("", ""))
            shapes.append(shape)
            dtypes.append(dtype)
        return ";".join(shapes), ";".join(dtypes)

    def rows(self) -> list[dict]:
        """One dict per kernel, keys COLUMNS, in first-seen order."""
        rows = []
        for kernel in self._kernels.values():
            in_shapes, in_dtypes = self._input_descriptions(kernel)
            slots = sorted(kernel.outputs)
            rows.append({
                "Op Name": kernel.name,
                "OP Type": kernel.op_type,
                "Task Duration(us)": f"{kernel.total_ns / max(kernel.count, 1) / 1000:.3f}",
                "Count": kernel.count,
                "Input Shapes": in_shapes,
                "Input Data Types": in_dtypes,
                "Output Shapes": ";".join(kernel.outputs[s][0] for s in slots),
                "Output Data Types": ";".join(kernel.outputs[s][1] for s in slots),
                "Device": kernel.device,
            })
        return rows

    def write(self) -> Path:
        """Write the CSV and return its path."""
        stamp = time.strftime("%Y%m%d%H%M%S")
        out_dir = self.root / f"PROF_{stamp}_{os.getpid()}" / "mindstudio_profiler_output"
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"op_summary_{stamp}.csv"
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(self.rows())
        return path


def executed_function_graphs(fn, *args, **kwargs):
    """Call the tf.function `fn` (first call, traced here) and return the GraphDefs TensorFlow
    ran after Grappler, one per function instantiated during the call."""
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        fn(*args, **kwargs)
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    return [graphs.post_optimization_graph for graphs in metadata.function_graphs]


# Nodes that move or name data but compute nothing: left out of kernel counts. Placeholder and
# PlaceholderWithDefault are a GraphDef's inputs (an executed graph's _Arg), for counts of graphs
# before they run (tf_autofuse.FusedGraph).
BOOKKEEPING_OPS = frozenset({"_Arg", "_Retval", "Const", "NoOp", "ReadVariableOp", "Identity",
                             "Placeholder", "PlaceholderWithDefault"})


def compute_kernels(graphs) -> "collections.Counter[str]":
    """Op type -> how many nodes of the graphs compute something (every op type but
    BOOKKEEPING_OPS). The kernel counts of the model tables (README, docs/PERFORMANCE.md) are
    this sum."""
    import collections

    return collections.Counter(node.op for graph in graphs for node in graph.node
                               if node.op not in BOOKKEEPING_OPS)
