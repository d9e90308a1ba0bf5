"""The Python API: `Fuser` (a configured fusion pass), `FusedGraph` (what it made of a graph),
`fuse()`, and the process-wide user patterns of the Grappler path.

One implementation: the Grappler bridge (_bridge.optimize) runs `Fuser.from_flags(flags)`,
whose `rewrite` is the same call `Fuser.fuse` makes, so AUTOFUSE_FLAGS, a session's
parameter_map and this API fuse a graph the same way for the same settings.

Counting (the same definition before and after fusion, and the one of profiling.py):
  kernel    a node that computes something: every node whose op type is not in
            profiling.BOOKKEEPING_OPS (_Arg, _Retval, Const, NoOp, ReadVariableOp, Identity,
            Placeholder, PlaceholderWithDefault). An AutofuseKernel is one kernel.
  operator  a TF operation computed: each kernel counts 1, except that a _UnaryOpsComposition
            counts the ops of its op_names and an AutofuseKernel the operators of the nodes it
            replaced (its members and the views it absorbed). Fusion never changes the
            operator count; it lowers the kernel count.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from typing import Iterable, Mapping, Optional, Sequence

import numpy as np
from tensorflow.core.framework import graph_pb2

from . import profiling, rewriter
from .flags import COST_MODELS as _FLAG_COST_MODELS
from .flags import ON_BY_DEFAULT, PASSES
from .rewriter import catalog, cost, unfold
from .rewriter.graph import GraphView, merge_shapes, node_name
from .rewriter.patterns import Pattern

FUSED_OP = rewriter.FUSED_OP
FUSED_OPS = rewriter.FUSED_OPS
assert set(_FLAG_COST_MODELS) == {cost.NONE, *cost.MODELS}


class ConfigError(ValueError):
    """A Fuser config key or value that is not accepted; the message names both."""


# --- config -------------------------------------------------------------------------------------


def _parse_bool(value) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "false", "0"):
        return value.strip().lower() in ("true", "1")
    raise ValueError


def _counter(minimum: int):
    def parse(value) -> int:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, str):
            if not value.strip().isdigit():
                raise ValueError
            value = int(value.strip())
        if not isinstance(value, (int, np.integer)) or value < minimum:
            raise ValueError
        return int(value)
    return parse


def _choice(choices):
    def parse(value) -> str:
        if not isinstance(value, str) or value.strip() not in choices:
            raise ValueError
        return value.strip()
    return parse


def _items(value) -> list:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, Iterable):
        items = list(value)
        if all(isinstance(v, str) for v in items):
            return items
    raise ValueError


def _parse_passes(value) -> tuple:
    items = _items(value)
    if any(p not in PASSES for p in items) or len(set(items)) != len(items):
        raise ValueError
    return tuple(p for p in PASSES if p in items)


def _parse_names(value) -> frozenset:
    return frozenset(_items(value))


_DEFAULTS = rewriter.Policy()  # the limits' defaults are the partitioner's own

# key: (parser, accepted values, default, help)
_OPTIONS = {
    "enable_auto_fusion": (_parse_bool, "true or false", True,
                           "run the automatic partitioner (maximal groups under the limits)"),
    "enable_pattern_matching": (_parse_bool, "true or false", True,
                                "run the registered Patterns before the partitioner"),
    "enable_cost_model": (_parse_bool, "true or false", False,
                          "let `cost_model` decline merges and recomputations"),
    "cost_model": (_choice(cost.MODELS), "one of " + ", ".join(cost.MODELS), "memory_bandwidth",
                   "which cost model, when enable_cost_model is true"),
    "max_fusion_size": (_counter(0), "an integer >= 0", _DEFAULTS.max_fusion_size,
                        "most compute ops in one fused kernel; 0 turns fusion off"),
    "max_input_nums_after_fuse": (_counter(1), "an integer >= 1", _DEFAULTS.max_inputs,
                                  "most distinct inputs of one fused kernel"),
    "recomputation_threshold": (_counter(0), "an integer >= 0",
                                _DEFAULTS.recomputation_threshold,
                                "most compute ops a kernel recomputes instead of reading another "
                                "kernel's output; 0 never recomputes"),
    "passes": (_parse_passes, "a list of pass names from " + ", ".join(PASSES), ON_BY_DEFAULT,
               "the automatic passes; without pointwise no elementwise group is fused"),
    "skip_node_names": (_parse_names, "a list of node names", frozenset(),
                        "nodes never fused"),
    "skip_op_types": (_parse_names, "a list of op types", frozenset(), "op types never fused"),
}


class FuserConfig:
    """The settings of a Fuser. Every assignment is checked: a bad key or value raises
    ConfigError naming the key and the accepted values."""

    __slots__ = ("_values",)

    def __init__(self, **values):
        object.__setattr__(self, "_values", {k: spec[2] for k, spec in _OPTIONS.items()})
        self.update(**values)

    @staticmethod
    def keys() -> tuple:
        return tuple(_OPTIONS)

    @staticmethod
    def describe() -> str:
        """One line per key: accepted values, default, meaning."""
        def shown(value) -> str:
            if isinstance(value, (tuple, frozenset)):
                return ",".join(sorted(value) if isinstance(value, frozenset) else value) or "none"
            return str(value).lower() if isinstance(value, bool) else str(value)

        return "\n".join(f"  {k}: {spec[1]} (default {shown(spec[2])}): {spec[3]}"
                         for k, spec in _OPTIONS.items())

    def update(self, **values) -> "FuserConfig":
        for key, value in values.items():
            setattr(self, key, value)
        return self

    def copy(self) -> "FuserConfig":
        return FuserConfig(**self._values)

    def as_dict(self) -> dict:
        return dict(self._values)

    def __getattr__(self, key):
        values = object.__getattribute__(self, "_values")
        if key in values:
            return values[key]
        raise AttributeError(f"Fuser config has no key {key!r}; keys: {', '.join(_OPTIONS)}")

    def __setattr__(self, key, value) -> None:
        spec = _OPTIONS.get(key)
        if spec is None:
            raise ConfigError(f"Fuser config: unknown key {key!r}; known keys: "
                              f"{', '.join(_OPTIONS)}")
        try:
            parsed = spec[0](value)
        except (ValueError, TypeError):
            raise ConfigError(f"Fuser config: {key}={value!r} is not valid; it accepts "
                              f"{spec[1]}") from None
        self._values[key] = parsed

    def __eq__(self, other) -> bool:
        return isinstance(other, FuserConfig) and self._values == other._values

    def __repr__(self) -> str:
        return "FuserConfig(" + ", ".join(f"{k}={v!r}" for k, v in self._values.items()) + ")"

    def policy(self) -> rewriter.Policy:
        """The settings as the partitioner's Policy (rewriter.rewrite(..., policy=))."""
        values = self._values
        return rewriter.Policy(
            max_fusion_size=values["max_fusion_size"],
            max_inputs=values["max_input_nums_after_fuse"],
            pointwise="pointwise" in values["passes"],
            reduce="reduce" in values["passes"],
            epilogue="epilogue" in values["passes"],
            epilogue_scale="epilogue_scale" in values["passes"],
            assign="assign" in values["passes"],
            recomputation_threshold=values["recomputation_threshold"],
            skip_names=frozenset(values["skip_node_names"]),
            skip_types=frozenset(values["skip_op_types"]),
            cost_model=values["cost_model"] if values["enable_cost_model"] else cost.NONE,
            auto=values["enable_auto_fusion"],
        )


# --- process-wide patterns (the Grappler path) -----------------------------------------------

_patterns_lock = threading.Lock()
_process_patterns: list = []


def _check_pattern(pattern) -> Pattern:
    if not isinstance(pattern, Pattern):
        raise TypeError(f"{pattern!r} is not a tf_autofuse.Pattern (subclass it and implement "
                        f"match)")
    return pattern


def register_pattern(pattern: Pattern) -> Pattern:
    """Register a Pattern for every graph this process fuses through Grappler (AUTOFUSE_FLAGS
    or the AutofuseOptimizer of a session). Returns the pattern."""
    with _patterns_lock:
        if pattern not in _process_patterns:
            _process_patterns.append(_check_pattern(pattern))
    return pattern


def unregister_pattern(pattern: Pattern) -> None:
    with _patterns_lock:
        if pattern in _process_patterns:
            _process_patterns.remove(pattern)


def registered_patterns() -> tuple:
    with _patterns_lock:
        return tuple(_process_patterns)


# --- the fuser ---------------------------------------------------------------------------------


class Fuser:
    """A configured fusion pass: `Fuser(**config)`, `fuser.config.<key> = value`,
    `fuser.register_pattern(p)`, then `fuser.fuse(graph)` (a FusedGraph) or
    `fuser.rewrite(graph_def, ...)` (what the Grappler bridge calls)."""

    def __init__(self, config: Optional[FuserConfig] = None, patterns: Iterable[Pattern] = (),
                 **values):
        self.config = config if config is not None else FuserConfig()
        self._config.update(**values)
        self._patterns = [_check_pattern(p) for p in patterns]

    @property
    def config(self) -> FuserConfig:
        return self._config

    @config.setter
    def config(self, value) -> None:
        """A FuserConfig (copied) or a mapping of config keys."""
        if isinstance(value, FuserConfig):
            self._config = value.copy()
        elif isinstance(value, Mapping):
            self._config = FuserConfig(**value)
        else:
            raise ConfigError(f"Fuser.config takes a FuserConfig or a dict of its keys, not "
                              f"{type(value).__name__}")

    @classmethod
    def from_flags(cls, flags, patterns: Optional[Iterable[Pattern]] = None) -> "Fuser":
        """The Fuser the flags (a tf_autofuse.Flags) ask for; patterns default to the ones
        registered for the process (register_pattern)."""
        skip = flags.skip_node_names_cfg
        config = FuserConfig(
            enable_cost_model=flags.cost_model != cost.NONE,
            max_fusion_size=flags.max_fusion_size,
            max_input_nums_after_fuse=flags.max_input_nums_after_fuse,
            recomputation_threshold=flags.recomputation_threshold,
            passes=tuple(p for p in PASSES if flags.pass_enabled(p)),
            skip_node_names=skip.names if skip is not None else (),
            skip_op_types=skip.types if skip is not None else (),
        )
        if flags.cost_model != cost.NONE:
            config.cost_model = flags.cost_model
        return cls(config, registered_patterns() if patterns is None else patterns)

    @property
    def patterns(self) -> tuple:
        return tuple(self._patterns)

    def register_pattern(self, pattern: Pattern) -> Pattern:
        """Add a Pattern; patterns run in registration order, before the partitioner."""
        if pattern not in self._patterns:
            self._patterns.append(_check_pattern(pattern))
        return pattern

    def unregister_pattern(self, pattern: Pattern) -> None:
        if pattern in self._patterns:
            self._patterns.remove(pattern)

    def rewrite(self, graph_def: graph_pb2.GraphDef, preserve: Iterable[str] = (),
                shapes: Optional[Mapping] = None, feeds: Iterable[str] = ()):
        """rewriter.rewrite with this config and these patterns: a rewriter.Rewrite
        (.graph_def, .fusions, .refusals). `graph_def` is not changed."""
        patterns = self.patterns if self.config.enable_pattern_matching else ()
        return rewriter.rewrite(graph_def, preserve=preserve, policy=self.config.policy(),
                                shapes=shapes, feeds=feeds, patterns=patterns)

    def fuse(self, graph, outputs=None) -> "FusedGraph":
        """Fuse a GraphDef, a tf.Graph or a concrete function (its variables are frozen into
        constants first). `outputs`: tensor or node names to keep (default: the function's
        outputs; for graphs, every node nothing reads)."""
        graph_def, inputs, default_outputs, tf_graph = _as_graph_def(graph)
        if outputs is None:
            outputs = default_outputs
        elif isinstance(outputs, str):
            outputs = [outputs]
        outputs = [_tensor(o) for o in outputs]
        missing = [o for o in outputs if node_name(o) not in {n.name for n in graph_def.node}]
        if missing:
            raise ValueError(f"output {missing[0]!r} is not a node of the graph")
        try:
            shapes = static_shapes(graph_def, tf_graph)
        except Exception as err:  # noqa: BLE001 - a bug in our shape pass, by design
            progress = rewriter.errors.Progress()
            progress.phase = "static shapes"
            raise progress.error(err) from err
        result = self.rewrite(graph_def, preserve=[node_name(o) for o in outputs], shapes=shapes,
                              feeds=[node_name(i) for i in inputs])
        return FusedGraph(graph_def, result.graph_def, result.fusions, result.refusals, inputs,
                          outputs, self.config.copy(), result.epilogues)

    def __repr__(self) -> str:
        return f"Fuser({self.config!r}, patterns={list(self._patterns)!r})"


def fuse(graph, outputs=None, fuser: Optional[Fuser] = None, **config) -> "FusedGraph":
    """`Fuser(**config).fuse(graph, outputs)` (or `fuser.fuse` when a Fuser is given)."""
    if fuser is None:
        fuser = Fuser(**config)
    elif config:
        raise TypeError("give either a Fuser or config keys, not both")
    return fuser.fuse(graph, outputs)


# --- graph inputs -------------------------------------------------------------------------------

_INPUT_OPS = frozenset({"Placeholder", "PlaceholderWithDefault"})


def _tensor(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"{name!r} is not a tensor or node name")
    if name.startswith("^"):
        raise ValueError(f"{name!r} is a control input, not a tensor")
    return name if re.search(r":\d+$", name) else name + ":0"


def _as_graph_def(graph):
    """(graph_def, input tensor names, default output tensor names, tf.Graph or None)."""
    import tensorflow as tf

    if isinstance(graph, graph_pb2.GraphDef):
        return graph, _placeholders(graph), _sinks(graph), None
    if isinstance(graph, tf.Graph):
        graph_def = graph.as_graph_def()
        return graph_def, _placeholders(graph_def), _sinks(graph_def), graph
    if hasattr(graph, "get_concrete_function") and not hasattr(graph, "graph"):
        try:
            graph = graph.get_concrete_function()
        except (TypeError, ValueError) as err:
            raise TypeError(
                "a tf.function without an input_signature has no single graph; pass "
                "f.get_concrete_function(tf.TensorSpec(...)) instead") from err
    if hasattr(graph, "graph") and hasattr(graph, "outputs") and hasattr(graph, "inputs"):
        from tensorflow.python.framework.convert_to_constants import \
            convert_variables_to_constants_v2

        frozen = convert_variables_to_constants_v2(graph)
        graph_def = frozen.graph.as_graph_def()
        inputs = [t.name for t in frozen.inputs]
        outputs = [t.name for t in frozen.outputs]
        return graph_def, inputs, outputs, frozen.graph
    raise TypeError(f"cannot fuse a {type(graph).__name__}: give a GraphDef, a tf.Graph or a "
                    f"concrete function")


def _placeholders(graph_def) -> list:
    return [n.name + ":0" for n in graph_def.node if n.op in _INPUT_OPS]


def _sinks(graph_def) -> list:
    """Output 0 of every node nothing reads that has an output (not NoOp, not an assignment)."""
    from tensorflow.python.framework import op_def_registry

    read = {node_name(i) for n in graph_def.node for i in n.input}
    sinks = []
    for node in graph_def.node:
        if node.name in read or node.op in _INPUT_OPS:
            continue
        op_def = op_def_registry.get(node.op)
        if op_def is not None and op_def.output_arg:
            sinks.append(node.name + ":0")
    return sinks


# --- static shapes for graphs fused outside Grappler ---------------------------------------------

# Output 0 has input 0's shape.
_SAME_SHAPE = frozenset({"Identity", "Snapshot", "StopGradient", "PreventGradient",
                         "CheckNumerics", "Softmax", "LogSoftmax", "FusedBatchNorm",
                         "FusedBatchNormV2", "FusedBatchNormV3", "EnsureShape",
                         "_MklSwish"})
# Output 0's first dimension is input 0's first (the batch of NHWC/NCHW ops); MatMul: rows.
_BATCH_OPS = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative", "MaxPool", "AvgPool",
                        "MaxPool3D", "AvgPool3D", "MatMul", "ResizeBilinear",
                        "ResizeNearestNeighbor", "ResizeBicubic"})


def _tf_static_shapes(graph_def, tf_graph) -> dict:
    """TensorFlow's own static shapes (-1 for unknown sizes), from `tf_graph` or an import."""
    import tensorflow as tf

    if tf_graph is None:
        tf_graph = tf.Graph()
        try:
            with tf_graph.as_default():
                tf.graph_util.import_graph_def(graph_def, name="")
        except Exception:  # noqa: BLE001 - no shapes is fine, fusion is only more cautious
            return {}
    shapes = {}
    for op in tf_graph.get_operations():
        shapes[op.name] = [None if t.shape.rank is None else
                           tuple(-1 if d is None else int(d) for d in t.shape.as_list())
                           for t in op.outputs]
    return shapes


def static_shapes(graph_def, tf_graph=None) -> dict:
    """Node name -> output shapes, with symbolic sizes (<= -2) where TensorFlow's static shapes
    say "unknown": every unknown size of a Placeholder gets its own symbol, carried through the
    catalog's ops, same-shape ops and the batch dimension of convolutions, pools and MatMul, so
    that two tensors computed from the same input are known to have the same shape (the
    Grappler bridge gets such symbols from Grappler's shape inference)."""
    base = _tf_static_shapes(graph_def, tf_graph)
    view = GraphView(graph_def, base)
    symbols = itertools.count(-2, -1)
    shapes: dict = {}

    def shape_of(tensor):
        outputs = shapes.get(tensor[0], ())
        return outputs[tensor[1]] if tensor[1] < len(outputs) else None

    for name in view.order:
        node = view.node(name)
        count = max(1, len(base.get(name, ())))
        known = [view.output_shape(name, i) for i in range(count)]
        inputs = view.data_inputs(name)
        ins = [shape_of(t) for t in inputs]
        new = None
        if node.op in _INPUT_OPS and known[0] is not None:
            new = tuple(next(symbols) if d < 0 else d for d in known[0])
        elif node.op == "IdentityN":
            known = [merge_shapes(i, k) for i, k in zip(ins, known)] + known[len(ins):]
        elif node.op in _SAME_SHAPE and ins:
            new = ins[0]
        elif catalog.tf_op(node.op) is not None or node.op == catalog.COMPOSITION_OP:
            new = catalog.output_shape(node, inputs, ins, view.const_value)
        elif node.op in ("BatchMatMulV2", "BatchMatMulV3") and len(ins) == 2:
            new = _batch_matmul_shape(node, ins[0], ins[1])
        elif node.op == "Transpose" and ins and ins[0] is not None and len(inputs) == 2:
            perm = view.const_value(inputs[1])
            if perm is not None and sorted(int(p) for p in perm.reshape(-1)) == list(
                    range(len(ins[0]))):
                new = tuple(ins[0][int(p)] for p in perm.reshape(-1))
        elif node.op in _BATCH_OPS and ins and ins[0] is not None and known[0]:
            source = ins[0]
            axis = 0
            if node.op == "MatMul" and len(source) == 2:
                axis = 1 if node.attr["transpose_a"].b else 0
            if source and known[0][0] < 0:
                new = (source[axis],) + tuple(known[0][1:])
        if new is not None:
            known[0] = merge_shapes(new, known[0])
        shapes[name] = known
    return shapes


def _batch_matmul_shape(node, x, y):
    if x is None or y is None or len(x) < 2 or len(y) < 2:
        return None
    try:
        batch = catalog.broadcast_shapes([x[:-2], y[:-2]]) if (x[:-2] or y[:-2]) else ()
    except catalog.Unsupported:
        return None
    rows = x[-1] if node.attr["adj_x"].b else x[-2]
    cols = y[-2] if node.attr["adj_y"].b else y[-1]
    return tuple(batch) + (rows, cols)


# --- counting ------------------------------------------------------------------------------------

_AUTO_NAME = re.compile(r"^autofuse_(?:pointwise|reduce)_\d+_(.+)$")


def node_operators(node) -> int:
    """Operators of one non-fused node: a _UnaryOpsComposition counts its op_names, a
    _MklSwish its two."""
    if node.op == catalog.COMPOSITION_OP and "op_names" in node.attr:
        return max(1, len(node.attr["op_names"].list.s))
    return unfold.OPERATORS.get(node.op, 1)


def fused_operators(node, known: Optional[Mapping[str, int]] = None) -> int:
    """Operators an AutofuseKernel node replaced: from `known` (name -> count) when given, else
    from its name (autofuse_<kind>_<n>_<Op>_<Op>...), else its program's instructions."""
    if known and node.name in known:
        return int(known[node.name])
    match = _AUTO_NAME.match(node.name)
    if match:
        return len(match.group(1).split("_"))
    program = node.attr["program"].s.decode() if "program" in node.attr else ""
    return sum(1 for line in program.splitlines() if line.startswith("%"))


def count_kernels(graph_def) -> int:
    """Compute kernels of a graph: nodes whose op is not in profiling.BOOKKEEPING_OPS."""
    return sum(profiling.compute_kernels([graph_def]).values())


def count_operators(graph_def, known: Optional[Mapping[str, int]] = None) -> int:
    """TF operations a graph computes; see the module docstring."""
    total = 0
    for node in graph_def.node:
        if node.op in profiling.BOOKKEEPING_OPS:
            continue
        if node.op in FUSED_OPS:
            total += fused_operators(node, known)
        else:
            total += known[node.name] if known and node.name in known else node_operators(node)
    return total


# --- the result ----------------------------------------------------------------------------------


def _session_config():
    import tensorflow as tf
    from tensorflow.core.protobuf import rewriter_config_pb2

    config = tf.compat.v1.ConfigProto()
    # no plugin pass: with AUTOFUSE_FLAGS on, the original graph would be fused too
    config.graph_options.rewrite_options.use_plugin_optimizers = rewriter_config_pb2.RewriterConfig.OFF
    return config


class FusedGraph:
    """What a Fuser made of a graph: the fused GraphDef, its fusions and refusals, counts,
    a report, and a way to run it (and the original) on feeds."""

    def __init__(self, original, graph_def, fusions, refusals, inputs, outputs, config=None,
                 epilogues=()):
        self.original_graph_def = original
        self.graph_def = graph_def
        self.fusions = list(fusions)
        self.refusals = list(refusals)
        self.epilogues = list(epilogues)
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.config = config
        nodes = {n.name: n for n in original.node}
        self.operators_per_fusion = {
            f.name: sum(node_operators(nodes[n]) for n in f.nodes) + len(f.absorbed)
            for f in self.fusions}
        # an epilogue's fused node stands for the operators it replaced (the per-channel values
        # it reads are computed by nodes of their own, counted as they are)
        self.operators_per_fusion.update((e.name, len(e.nodes)) for e in self.epilogues)

    def get_fusion_count(self) -> int:
        """Fused kernels (AutofuseKernel nodes) made."""
        return len(self.fusions)

    def get_kernel_count(self, original: bool = False) -> int:
        """Compute kernels of the fused graph (original=True: of the graph before fusion)."""
        return count_kernels(self.original_graph_def if original else self.graph_def)

    def get_operator_count(self, original: bool = False) -> int:
        """TF operations computed (the same before and after fusion, by construction)."""
        if original:
            return count_operators(self.original_graph_def)
        return count_operators(self.graph_def, self.operators_per_fusion)

    def fusion_rows(self) -> list:
        """One dict per fused kernel: name, kind, operators, nodes, op_types, program."""
        return [{"name": f.name, "kind": f.kind, "operators": self.operators_per_fusion[f.name],
                 "nodes": list(f.nodes), "absorbed": list(f.absorbed),
                 "op_types": list(f.op_types), "program": f.program} for f in self.fusions]

    def report(self, refusals: int = 10) -> str:
        """A readable table: counts before and after, each fused kernel, the first refusals."""
        lines = [f"tf_autofuse: {self.get_fusion_count()} fused kernel(s)",
                 f"  {'':<10}{'kernels':>9}{'operators':>11}",
                 f"  {'original':<10}{self.get_kernel_count(True):>9}"
                 f"{self.get_operator_count(True):>11}",
                 f"  {'fused':<10}{self.get_kernel_count():>9}{self.get_operator_count():>11}"]
        lines.extend(fusion_table(self.fusion_rows()))
        if self.epilogues:
            lines.append(f"epilogues ({len(self.epilogues)}; node: TensorFlow kernel [fused ops]):")
            for e in self.epilogues:
                lines.append(f"  {e.name}: {e.op} [{', '.join(e.fused_ops)}]")
        if self.refusals and refusals:
            lines.append(f"refusals ({len(self.refusals)}; node: reason):")
            for node, reason in self.refusals[:refusals]:
                lines.append(f"  {node}: {reason}")
            if len(self.refusals) > refusals:
                lines.append(f"  ... {len(self.refusals) - refusals} more (.refusals)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"<FusedGraph: {self.get_fusion_count()} fused kernels, "
                f"{self.get_kernel_count(True)} -> {self.get_kernel_count()} kernels>")

    # --- running -------------------------------------------------------------------------------

    def run(self, fetches=None, feeds: Optional[Mapping] = None, original: bool = False):
        """Run the fused graph (original=True: the graph before fusion) in a fresh
        tf.compat.v1.Session. fetches: a tensor/node name or a list (default: the outputs);
        feeds: {tensor or node name: value}. Returns one array, or a list for a list."""
        import tensorflow as tf

        from . import _native
        from ._build import BuildError

        try:
            _native.load()  # the AutofuseKernel op
        except BuildError as err:
            raise RuntimeError(f"cannot run a fused graph: {err}") from None
        single = isinstance(fetches, str)
        names = self.outputs if fetches is None else ([fetches] if single else list(fetches))
        graph = tf.Graph()
        with graph.as_default():
            tf.graph_util.import_graph_def(
                self.original_graph_def if original else self.graph_def, name="")
        fetch_tensors = [graph.get_tensor_by_name(_tensor(n)) for n in names]
        feed_dict = {graph.get_tensor_by_name(_tensor(k)): v for k, v in (feeds or {}).items()}
        with tf.compat.v1.Session(graph=graph, config=_session_config()) as sess:
            values = sess.run(fetch_tensors, feed_dict)
        return values[0] if single else values

    def verify(self, feeds: Optional[Mapping] = None, fetches=None) -> float:
        """Run the original and the fused graph on `feeds`; the largest absolute difference
        over the fetches (default: the outputs). NaN in the same places counts as equal; NaN
        in one only, or different shapes, give inf."""
        names = self.outputs if fetches is None else (
            [fetches] if isinstance(fetches, str) else list(fetches))
        fused = self.run(names, feeds)
        original = self.run(names, feeds, original=True)
        worst = 0.0
        for a, b in zip(fused, original):
            a, b = np.asarray(a), np.asarray(b)
            if a.shape != b.shape:
                return float("inf")
            if a.dtype == np.bool_ or b.dtype == np.bool_:
                worst = max(worst, float(np.any(a != b)))
                continue
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            nan_a, nan_b = np.isnan(a64), np.isnan(b64)
            if np.any(nan_a != nan_b):
                return float("inf")
            both = ~nan_a
            if np.any(both):
                diff = np.abs(a64[both] - b64[both])
                diff[a64[both] == b64[both]] = 0.0  # inf == inf
                worst = max(worst, float(np.max(diff)))
        return worst


def fusion_table(rows: Sequence[Mapping]) -> list:
    """Lines of the fused-kernel table of report() and `python -m tf_autofuse inspect`."""
    if not rows:
        return ["  (no fused kernels)"]
    width = max(len("fused kernel"), *(len(r["name"]) for r in rows))
    lines = [f"  {'fused kernel':<{width}}  {'kind':<9}  {'ops':>4}  replaces"]
    for row in rows:
        nodes = list(row.get("nodes") or [])
        shown = ", ".join(nodes[:4]) + (f", ... ({len(nodes) - 4} more)" if len(nodes) > 4 else "")
        ops = row.get("operators")
        lines.append(f"  {row['name']:<{width}}  {row['kind']:<9}  "
                     f"{'?' if ops is None else ops:>4}  {shown or '-'}")
    return lines


def sidecar(fused: FusedGraph) -> str:
    """The JSON the offline command writes next to a fused model (read by `inspect`)."""
    return json.dumps({"fusions": fused.fusion_rows(),
                       "kernels": {"original": fused.get_kernel_count(True),
                                   "fused": fused.get_kernel_count()},
                       "operators": {"original": fused.get_operator_count(True),
                                     "fused": fused.get_operator_count()},
                       "refusals": [list(r) for r in fused.refusals],
                       "config": fused.config.as_dict() if fused.config else None},
                      indent=1, default=lambda v: sorted(v) if isinstance(v, frozenset) else str(v))
