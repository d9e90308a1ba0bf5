"""Elementwise epilogues of convolutions and matrix multiplications, run by TensorFlow's own
fused kernels.

A Conv2D, DepthwiseConv2dNative or MatMul whose output goes, through nodes that nothing else
reads, into a per-output-channel affine map and an activation

    y = act(((op(x, W) [+ b]) - m) * s + t)        m, s, t: one value per output channel

becomes one `_FusedConv2D` / `_FusedDepthwiseConv2dNative` / `_FusedMatMul` node, which applies
the map and the activation to each output tile while it is in cache: the operator's output is
written once and never read back by an elementwise kernel. Keras 3's BatchNormalization in
inference is such a map on variables (s = gamma * rsqrt(var + eps), t = beta - mean * s),
which TensorFlow's remapper does not see; a BiasAdd or Add of a channel vector is the form
without s and t, Sub of one the form with m alone.

How the map reaches the fused kernel:
  folded scale    the filter W * s and the bias c * s + t (or t - m * s), computed each step by
                  graph nodes, then BiasAdd: only where the filter has fewer elements than the
                  output, so that scaling it costs less than the pass over the output it saves,
                  and not for a map without an activation whose output goes into elementwise
                  nodes only (a residual Add): their kernel takes the map at no pass of its own.
  BiasAdd         no scale: the bias c (or -m).

A scale is taken when the policy asks (pass epilogue_scale, on by default): the folded filter
keeps the error of the graph (each W * s is rounded once, without a sign of its own); it is one
more kernel a step than the map fused with what computes s and t, and saves a pass over the
output, which pays where the output is larger than the filter. TensorFlow's own form for
convolutions, the FusedBatchNorm epilogue, is not used: its kernels multiply by their own fp32
rsqrt(variance + epsilon) of the arguments, and TensorFlow's vectorised rsqrt errs low
(rsqrt(1) is 2 ulps below 1), so every batch norm of a deep model would scale its output down
by the same fraction.

A fused operator left as it is reads its bias from the [C] vector behind view nodes (Keras
reshapes a convolution's bias to [1, 1, 1, C], TensorFlow's remapper squeezes it back): two
kernels a step less, the same bits.

The activation is recognised by its values (`ACTIVATIONS`): the elementwise nodes after the map
are evaluated with the op table's references on probe values, so a GELU through Erf, Erfc or
Tanh and `x * sigmoid(x)` are found however the graph writes them. A Reshape that keeps the
channels last may sit between a MatMul and its map (a Dense layer on [batch, sequence,
features]): the fused node computes in the MatMul's shape and a Reshape follows it. An Einsum
or BatchMatMulV2 that is one matrix multiplication (einsum.py: Keras EinsumDense) is read as a
MatMul between Reshapes; its channels are its output's trailing axes that come from the right
operand ([H, D] of a [B, T, H, D] projection), its bias one value per such column.

What the fused kernels accept depends on TensorFlow's CPU build: with oneDNN (TensorFlow's
default on x86 Linux) more activations, and a depthwise kernel, than with Eigen alone. `_ONEDNN`
and `_EIGEN` list both, as TensorFlow 2.21's CPU kernels define them; a chain they do not
accept stays as it is, with its reason. Only float32 is rewritten: the fused kernels' 16-bit
support differs between the two builds and within oneDNN by CPU.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
from typing import Mapping, Optional, Sequence

import numpy as np
from tensorflow.core.framework import graph_pb2, node_def_pb2, types_pb2

from . import catalog, einsum
from .editor import Editor
from .graph import GraphView, Tensor, format_shape, tensor_name
from .partition import Refusal
from . import scope

PASS = "epilogue"

# operator type -> (fused op type, family); a fused op is taken only when it adds a BiasAdd alone
_FAMILY = {
    "Conv2D": ("_FusedConv2D", "conv"),
    "_FusedConv2D": ("_FusedConv2D", "conv"),
    "DepthwiseConv2dNative": ("_FusedDepthwiseConv2dNative", "depthwise"),
    "_FusedDepthwiseConv2dNative": ("_FusedDepthwiseConv2dNative", "depthwise"),
    "MatMul": ("_FusedMatMul", "matmul"),
    "_FusedMatMul": ("_FusedMatMul", "matmul"),
    # one matrix multiplication in another form (einsum.py): read as a MatMul between Reshapes
    **{op: ("_FusedMatMul", "matmul") for op in einsum.OPS},
}
OPERATORS = frozenset(_FAMILY)  # the op types whose epilogues this pass takes
SWISH = "_MklSwish"
_PLAIN_ACTIVATIONS = ("Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid")

# family -> activations its fused kernel applies after a BiasAdd; "" is none.
_EIGEN = {
    "conv": frozenset({"", "Relu", "Relu6", "Elu", "LeakyRelu"}),
    "depthwise": frozenset(),  # no CPU kernel without oneDNN
    "matmul": frozenset({"", "Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid"}),
}
_ONEDNN = {
    "conv": frozenset({"", "Relu", "Relu6", "Elu", "LeakyRelu", SWISH}),
    "depthwise": frozenset({"", "Relu", "Relu6", "Elu"}),
    "matmul": frozenset({"", "Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid",
                         "GeluExact", "GeluApproximate"}),
}


@functools.lru_cache(maxsize=None)
def onednn() -> bool:
    """Whether this process's TensorFlow runs its CPU kernels through oneDNN (which reads
    TF_ENABLE_ONEDNN_OPTS once, at its first use)."""
    try:
        from tensorflow.python.util import _pywrap_util_port

        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):
        return False


def accepts(family: str) -> frozenset:
    return (_ONEDNN if onednn() else _EIGEN)[family]


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """One operator that took its epilogue: the fused node (named as the chain's last node, or
    as the operator when a Reshape follows it), the operators it stands for, and the fused ops
    TensorFlow's kernel applies."""

    name: str
    op: str
    nodes: tuple
    fused_ops: tuple


@dataclasses.dataclass
class _Chain:
    """What follows an operator: y = act(((v + add) - sub) * scale + shift)."""

    op: str  # the operator node
    family: str
    channels: int
    # the trailing axes of the value that are its channels (their product is `channels`): the
    # last axis, or an Einsum's axes of its right operand ([H, D] of a [B, T, H, D] projection)
    columns: tuple
    nodes: list  # the epilogue's nodes, in order (the last one is replaced)
    add: Optional[Tensor] = None  # a channel vector added (the operator's own bias included)
    sub: Optional[Tensor] = None  # a channel vector subtracted
    scale: Optional[Tensor] = None
    shift: Optional[Tensor] = None
    activation: str = ""
    alpha: Optional[float] = None  # LeakyRelu's
    # a Reshape between the operator and the map that keeps the channels last (a Dense layer on
    # a [batch, sequence, features] tensor is a MatMul of the rows between two Reshapes)
    reshape: Optional[str] = None
    product: Optional[einsum.OneMatMul] = None  # an Einsum or BatchMatMulV2 read as a MatMul


class _Editor(Editor):
    """The pass's Editor, which also shares one rows Reshape among an operand's products."""

    def __init__(self, view: GraphView, shapes):
        super().__init__(view, shapes)
        self.rows: dict = {}  # (tensor, K, device) -> its [M, K] Reshape, for its products


def fuse_epilogues(graph_def: graph_pb2.GraphDef, shapes: Optional[Mapping[str, Sequence]],
                   policy):
    """(graph, shapes, [Epilogue], [Refusal]): the inputs themselves when no operator takes an
    epilogue. The inputs are never mutated. Nodes the policy keeps out of fusion (preserved,
    fed, skipped, in a disable_autofuse() scope) are neither operators nor epilogue nodes."""
    if not any(node.op in _FAMILY for node in graph_def.node):
        return graph_def, shapes, [], []
    view = GraphView(graph_def, shapes)
    editor = _Editor(view, shapes)
    protected = scope.kept_out(view, policy)
    done, refusals, rewired = [], [], False
    for name in view.order:
        if view.node(name).op not in _FAMILY or name in editor.removed or name in protected:
            continue
        chain, reason = _chain(view, name, protected)
        if chain is not None:
            reason = _rewrite(view, editor, chain, policy.epilogue_scale, protected)
        if chain is None or reason:
            if reason:
                refusals.append(Refusal(name, reason))
            rewired |= _bias_through_views(view, editor, name, protected)
        else:
            fused = editor.replaced[name if chain.reshape or chain.product
                                    else chain.nodes[-1]]
            replaced = [name, *(n for n in chain.nodes if n != chain.reshape)]
            done.append(Epilogue(fused.name, fused.op, tuple(replaced),
                                 tuple(s.decode() for s in fused.attr["fused_ops"].list.s)))
    if not done and not rewired:
        return graph_def, shapes, [], refusals
    return editor.graph(graph_def, protected), editor.shapes, done, refusals


def _bias_through_views(view: GraphView, editor: _Editor, name: str, protected) -> bool:
    """Whether TensorFlow's fused operator `name`, left as it is, now reads its bias from the
    [C] vector view nodes reshaped into it: Keras reshapes a convolution's [C] bias to
    [1, 1, 1, C] and TensorFlow's remapper squeezes it back to [C] for its fused kernel, two
    kernels a step that copy [C] values. The values are the same bits."""
    node = view.node(name)
    if (not node.op.startswith("_") or not node.attr["fused_ops"].list.s
            or node.attr["fused_ops"].list.s[0] != b"BiasAdd"
            or len(view.data_inputs(name)) < 3):
        return False
    bias = view.data_inputs(name)[2]
    shape = view.tensor_shape(bias)
    if shape is None or len(shape) != 1 or shape[0] < 0:
        return False
    vector = _through_views(view, bias, tuple(shape), protected)
    if (vector == bias or editor.shape(vector) != tuple(shape)
            or view.node(vector[0]).device != node.device):
        return False
    rewired = node_def_pb2.NodeDef()
    rewired.CopyFrom(node)
    data = [k for k, text in enumerate(rewired.input) if not text.startswith("^")]
    rewired.input[data[2]] = tensor_name(vector)
    editor.replaced[name] = rewired
    return True


# --- matching ---------------------------------------------------------------------------------


def _only_consumer(view: GraphView, name: str, protected: frozenset) -> Optional[str]:
    """The one node reading `name`'s value, when `name` may disappear: else None."""
    consumers = view.data_consumers(name)
    if (name in protected or len(consumers) != 1 or consumers[0][2] != 0
            or view.control_consumers(name)):
        return None
    return consumers[0][0]


def _joinable(view: GraphView, name: str, device: str, dtype: int) -> bool:
    node = view.node(name)
    return (node.device == device and not view.control_inputs(name) and "_class" not in node.attr
            and view.dtype(name) == dtype)


def _over(shape, columns: tuple) -> bool:
    """Whether a tensor of `shape` holds one value per channel: `columns` itself, with leading
    1s or without ([C] or [1,...,1,C]; [H, D] or [1, 1, H, D])."""
    def strip(dims):
        dims = tuple(dims)
        while dims and dims[0] == 1:
            dims = dims[1:]
        return dims
    return shape is not None and strip(shape) == strip(columns)


def _channel_operand(view: GraphView, name: str, value: Tensor, columns: tuple, protected):
    """The operand of binary node `name` that is not `value`, when it holds one value per
    channel (_over) in no higher rank than the value."""
    node = view.node(name)
    inputs = view.data_inputs(name)
    if len(inputs) != 2 or value not in inputs or inputs[0] == inputs[1]:
        return None
    if node.op == "BiasAdd":
        fmt = node.attr["data_format"].s.decode() if "data_format" in node.attr else "NHWC"
        if inputs[0] != value or fmt != "NHWC":
            return None
    other = inputs[1] if inputs[0] == value else inputs[0]
    shape, value_shape = view.tensor_shape(other), view.tensor_shape(value)
    if shape is None or value_shape is None or len(shape) > len(value_shape) or not shape:
        return None
    if not _over(shape, columns):
        return None
    return _through_views(view, other, columns, protected)


def _through_views(view: GraphView, tensor: Tensor, columns: tuple, protected) -> Tensor:
    """The tensor a chain of view nodes reshaped into `tensor` (a channel vector), read in its
    stead when it is a channel vector itself: Keras reshapes a layer's [C] bias to
    [1,1,1,C] and TensorFlow's remapper squeezes it back for its fused kernel."""
    best = tensor
    while (tensor[1] == 0 and catalog.is_view(view.node(tensor[0]).op)
           and tensor[0] not in protected and not view.control_inputs(tensor[0])
           and not view.control_consumers(tensor[0])):
        tensor = view.data_inputs(tensor[0])[0]
        if not _over(view.tensor_shape(tensor), columns):
            break
        best = tensor
    return best


def _chain(view: GraphView, name: str, protected: frozenset):
    """(the epilogue after operator `name`, None), or (None, why not: "" when nothing follows
    that an epilogue could take)."""
    node = view.node(name)
    fused_op, family = _FAMILY[node.op]
    has_bias = False
    if node.op.startswith("_"):
        ops = [s.decode() for s in node.attr["fused_ops"].list.s]
        if ops != ["BiasAdd"]:
            return None, ""
        has_bias = True
    if view.device_type(name) != "CPU":
        return None, (f"{node.op} epilogue: TensorFlow's fused kernels are used on CPUs only; on "
                      f"{view.device_type(name)} the epilogue is fused as a kernel of its own")
    shape = view.output_shape(name)
    columns = (shape[-1] if shape else -1,)
    product, not_one = (einsum.analyse(view, name) if node.op in einsum.OPS
                        else (None, None))
    if product is not None:
        columns = product.columns
    chain = _Chain(name, family, int(np.prod(columns)), columns, [], product=product)
    if has_bias:
        chain.add = _through_views(view, view.data_inputs(name)[2], columns, protected)
    value, device, dtype = (name, 0), node.device, view.dtype(name)
    # the stages in their order: each takes the node reading the value, or leaves it
    stage = "centre" if not has_bias else "scale"
    off = ""  # why the first map node met is not a per-channel one, when it is broadcast
    while True:
        reader = _only_consumer(view, value[0], protected)
        if reader is None or not _joinable(view, reader, device, dtype):
            break
        op = view.node(reader).op
        if stage == "centre" and op in ("BiasAdd", "Add", "AddV2", "Sub"):
            vector = _channel_operand(view, reader, value, chain.columns, protected)
            if vector is None or (op == "Sub" and view.data_inputs(reader)[0] != value):
                off = _off_columns(view, reader, value, chain.columns)
                break
            if op == "Sub":
                chain.sub = vector
            else:
                chain.add = vector
            stage = "scale"
        elif stage in ("centre", "scale") and op == "Mul":
            vector = _channel_operand(view, reader, value, chain.columns, protected)
            if vector is None:
                break
            chain.scale, stage = vector, "shift"
        elif stage == "shift" and op in ("BiasAdd", "Add", "AddV2"):
            vector = _channel_operand(view, reader, value, chain.columns, protected)
            if vector is None:
                break
            chain.shift, stage = vector, "activation"
        elif op == "Reshape" and not chain.nodes:
            # rows of channels stay rows of channels when the trailing axes hold them all
            columns = _trailing(view.output_shape(reader), chain.channels)
            if columns is None:
                break
            chain.reshape, chain.columns = reader, columns
        else:
            break
        chain.nodes.append(reader)
        value = (reader, 0)
    _activation(view, chain, value, protected, device, dtype)
    if chain.nodes and chain.nodes[-1] == chain.reshape:  # nothing after it: not an epilogue
        chain.nodes.pop()
        chain.reshape = None
    if not chain.nodes:
        return None, f"{node.op} epilogue: {off}" if off and not not_one else ""
    if not_one:
        return None, not_one
    if dtype != types_pb2.DT_FLOAT:
        return None, f"{node.op} epilogue: only float32 operators take one"
    if chain.channels <= 0:
        return None, f"{node.op} epilogue: the number of output channels is not known"
    if family == "conv" and node.attr["data_format"].s not in (b"", b"NHWC"):
        return None, f"{node.op} epilogue: data_format {node.attr['data_format'].s.decode()}"
    return chain, None


def _off_columns(view: GraphView, name: str, value: Tensor, columns: tuple) -> str:
    """Why binary node `name` does not add a bias to `value` when its other operand is a
    smaller tensor broadcast over it (one value per row, or per part of a channel); "" when it
    is not (a tensor of the value's size, a scalar, an unknown shape)."""
    inputs = view.data_inputs(name)
    other = inputs[1] if len(inputs) == 2 and inputs[0] == value else inputs[0]
    shape, value_shape = view.tensor_shape(other), view.tensor_shape(value)
    if (len(inputs) != 2 or not shape or value_shape is None
            or min(*shape, *value_shape) < 0 or np.prod(shape) >= np.prod(value_shape)):
        return ""
    return (f"the {view.node(name).op} of a {format_shape(shape)} operand to its "
            f"{format_shape(value_shape)} output is not one value per output channel "
            f"{format_shape(columns)}: not a bias of the fused kernel")


def _trailing(shape, channels: int) -> Optional[tuple]:
    """The fewest trailing axes of `shape` whose sizes multiply to `channels`, or None."""
    if not shape or channels <= 0:
        return None
    size = 1
    for k in range(len(shape) - 1, -1, -1):
        if shape[k] < 0:
            return None
        size *= shape[k]
        if size == channels:
            return tuple(shape[k:])
        if size > channels:
            return None
    return None


def _activation(view: GraphView, chain: _Chain, value: Tensor, protected, device,
                dtype) -> None:
    """Take the activation reading `value`, if any: one of _PLAIN_ACTIVATIONS, or a group of
    elementwise nodes that computes one of ACTIVATIONS (recognised by its values)."""
    consumers = view.data_consumers(value[0])
    if value[0] in protected or view.control_consumers(value[0]) or not consumers:
        return
    if len(consumers) == 1:
        reader = consumers[0][0]
        node = view.node(reader)
        if node.op in _PLAIN_ACTIVATIONS and _joinable(view, reader, device, dtype):
            chain.activation = node.op
            if node.op == "LeakyRelu":
                chain.alpha = float(node.attr["alpha"].f) if "alpha" in node.attr else 0.2
            chain.nodes.append(reader)
            return
    found = _activation_by_value(view, value, protected, device, dtype)
    if found is not None:
        chain.activation, nodes = found
        chain.nodes.extend(nodes)


# where activations differ: around 0, in their curved part, and far out (a clamp at 1000 is not
# a Relu)
_PROBE = np.concatenate([np.linspace(-9.0, 9.0, 181), [-0.0, 1e-4, -1e-4, 0.03, -0.03, 40.0],
                         [sign * 10.0 ** e for e in (3, 6, 30) for sign in (1, -1)]])


def _gelu_exact(x):
    return 0.5 * x * (1.0 + catalog.for_ir_name("Erf").reference(x / np.sqrt(2.0)))


# activation of TensorFlow's fused kernels -> its float64 reference
ACTIVATIONS = {
    SWISH: lambda x: x / (1.0 + np.exp(-x)),
    "GeluExact": _gelu_exact,
    "GeluApproximate": lambda x: 0.5 * x * (1.0 + np.tanh(
        np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3))),
    # the activations that are ops of the table: its references
    **{op: catalog.for_ir_name(op).reference
       for op in ("Relu", "Relu6", "Elu", "Tanh", "Sigmoid")},
}
_MOST_NODES = 12


def _activation_by_value(view: GraphView, value: Tensor, protected, device, dtype):
    """(activation, its nodes with the last one last) when the elementwise nodes reading
    `value` compute one of ACTIVATIONS however the graph writes it (x * sigmoid(x), a GELU
    through Erf or Erfc or Tanh...), judged by evaluating them with the op table's references
    on probe values; else None."""
    region, values = [], {value: _PROBE}
    # the readers of the values so far, visited in topological order (a node's operands from the
    # region are evaluated before it)
    frontier = [(view.position[c], c) for c in {c for c, _, _ in view.data_consumers(value[0])}]
    heapq.heapify(frontier)
    seen = {name for _, name in frontier}
    while frontier and len(region) < _MOST_NODES:
        _, name = heapq.heappop(frontier)
        inputs = view.data_inputs(name)
        spec = catalog.for_tf_op(view.node(name).op)
        if (spec is None or spec.kind not in (catalog.ELEMENTWISE, catalog.BROADCAST)
                or spec.attrs or spec.result != "same" or name in protected
                or not _joinable(view, name, device, dtype)):
            continue
        operands = [values.get(t, _scalar(view, t)) for t in inputs]
        if any(o is None for o in operands):
            continue
        with np.errstate(all="ignore"):
            values[(name, 0)] = np.asarray(spec.reference(*operands), np.float64)
        region.append(name)
        for reader in {c for c, _, _ in view.data_consumers(name)} - seen:
            seen.add(reader)
            heapq.heappush(frontier, (view.position[reader], reader))
    best = None
    for k, sink in enumerate(region):
        nodes = _closed_region(view, value, region[:k + 1], sink)
        if nodes is None:
            continue
        for activation, reference in ACTIVATIONS.items():
            with np.errstate(all="ignore"):
                expected = reference(_PROBE)
            got = values[(sink, 0)]
            close = np.abs(got - expected) <= 1e-6 * np.maximum(1.0, np.abs(expected))
            if got.shape == expected.shape and np.all(close | (got == expected)):
                best = (activation, nodes)
                break
    return best


def _closed_region(view: GraphView, value: Tensor, candidates: list, sink: str):
    """The candidates `sink` depends on, when `value` and they are read by nothing outside
    them but through `sink`: in order, `sink` last; else None."""
    needed, stack = {sink}, [sink]
    members = set(candidates)
    while stack:
        for tensor in view.data_inputs(stack.pop()):
            if tensor[0] in members and tensor[0] not in needed:
                needed.add(tensor[0])
                stack.append(tensor[0])
    for name in [value[0], *needed]:
        if name != sink and any(c not in needed for c, _, _ in view.data_consumers(name)):
            return None
        if name != sink and view.control_consumers(name):
            return None
    return [n for n in candidates if n in needed]


def _scalar(view: GraphView, tensor: Tensor):
    constant = view.const_value(tensor)
    if constant is None or np.size(constant) != 1:
        return None
    return float(np.asarray(constant).reshape(-1)[0])


# --- rewriting --------------------------------------------------------------------------------


def _rewrite(view: GraphView, editor: _Editor, chain: _Chain, scale: bool,
             protected: frozenset) -> Optional[str]:
    """Replace the chain by one fused node, or say why not (the graph is then unchanged).
    scale: whether a per-channel scale may be taken (pass epilogue_scale); protected: the nodes
    whose values must be read as they are (fed ones among them)."""
    node = view.node(chain.op)
    fused_op, family = _FAMILY[node.op]
    if chain.scale is not None and not scale:
        return (f"{node.op} epilogue with a per-channel scale: pass epilogue_scale is "
                "disabled")
    if chain.activation not in accepts(family):
        build = "oneDNN" if onednn() else "Eigen (oneDNN off)"
        act = chain.activation or "no activation"
        return (f"{node.op} epilogue with {act}: TensorFlow's {fused_op} ({build}) does not "
                "apply it")
    if chain.scale is not None and not _fold_pays(view, chain):
        return (f"{node.op} epilogue: scaling the filter each step would cost more than the "
                "pass over the output it saves")
    if chain.scale is not None and not chain.activation and _read_by_elementwise(
            view, chain.nodes[-1], protected):
        return (f"{node.op} epilogue: its map without an activation joins the elementwise "
                "kernel reading its output (a residual Add) at no pass of its own; scaling the "
                "filter would add a kernel and save nothing")
    last = chain.nodes[-1]
    base = f"{last}/epilogue"
    device = node.device
    inputs = view.data_inputs(chain.op)[:2]
    if chain.product is not None:
        target = _output_target(view, chain)
        if isinstance(target, str):
            return target
        inputs = _matrices(view, editor, chain, base, inputs, protected)
    vec = functools.partial(_vector, editor, base, device, chain.channels)
    if chain.scale is None:
        fused_ops = ["BiasAdd"]
        bias = (vec(chain.add, "bias") if chain.add is not None
                else _negated(view, editor, base, device, vec(chain.sub, "bias"), chain.channels)
                if chain.sub is not None else editor.const(f"{base}/zeros",
                                                           np.zeros(chain.channels, np.float32),
                                                           device))
        args = [bias]
    else:
        fused_ops = ["BiasAdd"]
        inputs = [inputs[0], _folded_filter(view, editor, chain, base, inputs[1])]
        args = [vec(_folded_bias(view, editor, chain, base), "bias")]
    if chain.activation:
        fused_ops.append(chain.activation)
    if chain.reshape is None and chain.product is None:
        editor.replaced[last] = _fused_node(node, fused_op, last, inputs + args, fused_ops,
                                            chain)
        editor.removed.update([chain.op, *chain.nodes[:-1]])
        return None
    # the fused node computes in the operator's shape (a product's: [M, N]), under its name; the
    # last node's name reshapes it as the Reshape did (a product's: to the operator's shape)
    editor.replaced[chain.op] = _fused_node(node, fused_op, chain.op, inputs + args, fused_ops,
                                            chain)
    reshape = node_def_pb2.NodeDef(name=last, op="Reshape", device=device)
    reshape.attr["T"].type = types_pb2.DT_FLOAT
    if chain.reshape is not None:
        shape_input = view.data_inputs(chain.reshape)[1]
        reshape.attr["Tshape"].CopyFrom(view.node(chain.reshape).attr["Tshape"])
    else:
        shape_input = editor.const(f"{base}/shape", np.array(target, np.int32), device)
        reshape.attr["Tshape"].type = types_pb2.DT_INT32
    reshape.input.extend([chain.op, tensor_name(shape_input)])
    if chain.product is not None:
        rows = chain.product.rows
        editor.shapes[chain.op] = [(int(np.prod(rows)) if min(rows, default=0) >= 0 else -1,
                                    chain.channels)]
    editor.replaced[last] = reshape
    editor.removed.update(chain.nodes[:-1])
    return None


def _output_target(view: GraphView, chain: _Chain):
    """The shape an Einsum's or BatchMatMulV2's [M, N] product is reshaped to (the operator's
    own, -1 for its one unknown size), or why there is none."""
    node = view.node(chain.op)
    if chain.reshape is not None:  # the graph's own Reshape says it
        return ()
    shape = view.output_shape(chain.op)
    if shape is None or sum(d < 0 for d in shape) > 1:
        shown = "unknown" if shape is None else format_shape(shape)
        return (f"{node.op} epilogue: its output shape {shown} is not static but for one size "
                "(the Reshape after the fused MatMul needs it)")
    return tuple(d if d >= 0 else -1 for d in shape)


def _matrices(view: GraphView, editor: _Editor, chain: _Chain, base: str, inputs,
              protected: frozenset) -> list:
    """An Einsum's or BatchMatMulV2's operands as [M, K] and [K, N] ([N, K] when transposed),
    each as it is when it is a matrix already; else the left one as a Reshape (of what a
    Reshape reshaped, since both are views of the same rows; one a tensor and device, shared
    by the products reading it), the right one as a Reshape."""
    product, device = chain.product, view.node(chain.op).device
    left, right = inputs
    shape = editor.shape(left)
    if shape is None or len(shape) != 2 or shape[1] != product.k:
        source = view.node(left[0])
        while (left[1] == 0 and source.op == "Reshape" and left[0] not in protected
               and not view.control_inputs(left[0]) and source.device == device):
            left = view.data_inputs(left[0])[0]
            source = view.node(left[0])
        key = (left, product.k, device)
        if key not in editor.rows:
            target = editor.const(f"{base}/rows_shape", np.array([-1, product.k], np.int32),
                                  device)
            rows = int(np.prod(product.rows)) if min(product.rows, default=0) >= 0 else -1
            editor.rows[key] = editor.node(
                f"{base}/rows", "Reshape", [left, target], device, (rows, product.k),
                T=types_pb2.DT_FLOAT, Tshape=types_pb2.DT_INT32)
        left = editor.rows[key]
    matrix = ((chain.channels, product.k) if product.transpose_b
              else (product.k, chain.channels))
    if editor.shape(right) != matrix:
        target = editor.const(f"{base}/matrix_shape", np.array(matrix, np.int32), device)
        right = editor.node(f"{base}/matrix", "Reshape", [right, target], device, matrix,
                            T=types_pb2.DT_FLOAT, Tshape=types_pb2.DT_INT32)
    return [left, right]


def _read_by_elementwise(view: GraphView, name: str, protected: frozenset) -> bool:
    """Whether every reader of `name`'s value is an elementwise node the partitioner may fuse
    it with (same device), so that a map computed by `name`'s chain would ride in their kernel
    instead of making a pass of its own."""
    consumers = view.data_consumers(name)
    if name in protected or not consumers or view.control_consumers(name):
        return False
    device = view.node(name).device
    for reader, _, _ in consumers:
        entry = catalog.tf_op(view.node(reader).op)
        if (entry is None or entry.kind not in (catalog.ELEMENTWISE, catalog.BROADCAST)
                or view.node(reader).device != device):
            return False
    return True


def _fold_pays(view: GraphView, chain: _Chain) -> bool:
    filter_shape = view.tensor_shape(view.data_inputs(chain.op)[1])
    out_shape = view.output_shape(chain.op)
    if not filter_shape or not out_shape or min(*filter_shape, *out_shape) < 0:
        return False
    return int(np.prod(filter_shape)) < int(np.prod(out_shape))


def _vector(editor: _Editor, base: str, device: str, channels: int, tensor: Tensor,
            role: str) -> Tensor:
    """`tensor` as a [C] vector: itself, the [C] tensor a view node reshaped, or a Reshape."""
    if editor.shape(tensor) == (channels,):
        return tensor
    source = editor.view.node(tensor[0]) if tensor[0] in editor.view else None
    if source is not None and source.op in ("Reshape", "ExpandDims") and tensor[1] == 0:
        inner = editor.view.data_inputs(tensor[0])[0]
        if editor.shape(inner) == (channels,):
            return inner
    target = editor.const(f"{base}/{role}_shape", np.array([channels], np.int32), device)
    node = editor.node(f"{base}/{role}", "Reshape", [tensor, target], device, (channels,),
                       T=types_pb2.DT_FLOAT, Tshape=types_pb2.DT_INT32)
    return node


def _binary(view: GraphView, editor: _Editor, base: str, op: str, a: Tensor, b: Tensor,
            device: str) -> Tensor:
    """A float32 node `op(a, b)`, with the broadcast of its operands' shapes."""
    shapes = [editor.shape(a), editor.shape(b)]
    return editor.node(base, op, [a, b], device, catalog.broadcast_shapes(shapes),
                       T=types_pb2.DT_FLOAT)


def _negated(view: GraphView, editor: _Editor, base: str, device: str, tensor: Tensor,
             channels: int) -> Tensor:
    value = view.const_value(tensor) if tensor[0] in view else None
    if value is not None:
        return editor.const(f"{base}/negated", -np.asarray(value, np.float32).reshape(-1), device)
    return editor.node(f"{base}/negated", "Neg", [tensor], device, (channels,),
                       T=types_pb2.DT_FLOAT)


def _folded_filter(view: GraphView, editor: _Editor, chain: _Chain, base: str,
                   weights: Tensor) -> Tensor:
    """W * s, with s laid out along W's output-channel positions."""
    node = view.node(chain.op)
    w_shape = tuple(editor.shape(weights))
    transpose_b = (chain.product.transpose_b if chain.product is not None
                   else node.attr["transpose_b"].b)
    if chain.family == "depthwise":  # [H, W, in, multiplier]: channel in * multiplier + k
        layout = (1, 1, w_shape[2], w_shape[3])
    elif transpose_b:  # [N, K]
        layout = (chain.channels, 1)
    else:  # [H, W, in, C] or [K, C]: s broadcasts along the last axis as it is
        layout = (1,) * (len(w_shape) - 1) + (chain.channels,)
        shape = editor.shape(chain.scale)
        if shape is not None and len(shape) <= len(w_shape) and _over(shape, layout[-1:]):
            # no Reshape between the kernel computing s and this Mul: the partitioner fuses
            # them, and W * s is one more output of that kernel
            return editor.node(f"{base}/filter", "Mul", [weights, chain.scale], node.device,
                               w_shape, T=types_pb2.DT_FLOAT)
    target = editor.const(f"{base}/scale_layout", np.array(layout, np.int32), node.device)
    scale = editor.node(f"{base}/filter_scale", "Reshape", [chain.scale, target], node.device,
                        layout, T=types_pb2.DT_FLOAT, Tshape=types_pb2.DT_INT32)
    return editor.node(f"{base}/filter", "Mul", [weights, scale], node.device, w_shape,
                       T=types_pb2.DT_FLOAT)


def _folded_bias(view: GraphView, editor: _Editor, chain: _Chain, base: str) -> Tensor:
    """(c - m) * s + t as graph nodes (the terms that are there), in the shapes the graph gives
    them (the partitioner fuses them with what computes s and t)."""
    device = view.node(chain.op).device
    shift = chain.shift
    if chain.add is None and chain.sub is None:
        return shift if shift is not None else editor.const(
            f"{base}/zeros", np.zeros(chain.channels, np.float32), device)
    centre = chain.add if chain.add is not None else chain.sub
    term = _binary(view, editor, f"{base}/centre_scaled", "Mul", centre, chain.scale, device)
    if chain.add is not None:
        return term if shift is None else _binary(view, editor, f"{base}/bias", "AddV2", term,
                                                  shift, device)
    if shift is None:
        return _negated(view, editor, base, device, term, chain.channels)
    return _binary(view, editor, f"{base}/bias", "Sub", shift, term, device)


_OPERATOR_ATTRS = {
    "conv": ("T", "strides", "padding", "explicit_paddings", "data_format", "dilations",
             "use_cudnn_on_gpu"),
    "depthwise": ("T", "strides", "padding", "explicit_paddings", "data_format", "dilations"),
    "matmul": ("T", "transpose_a", "transpose_b"),
}


def _fused_node(node, fused_op: str, name: str, inputs, fused_ops, chain: _Chain):
    fused = node_def_pb2.NodeDef(name=name, op=fused_op, device=node.device)
    fused.input.extend(tensor_name(t) for t in inputs)
    for key in _OPERATOR_ATTRS[chain.family]:
        if key in node.attr:
            fused.attr[key].CopyFrom(node.attr[key])
    n_args = len(inputs) - 2
    fused.attr["num_args"].i = n_args
    fused.attr["TArgs"].list.type.extend([types_pb2.DT_FLOAT] * n_args)
    fused.attr["fused_ops"].list.s.extend(op.encode() for op in fused_ops)
    fused.attr["epsilon"].f = 0.0
    if chain.product is not None:
        fused.attr["transpose_a"].b = False
        fused.attr["transpose_b"].b = chain.product.transpose_b
    if chain.alpha is not None:
        fused.attr["leakyrelu_alpha"].f = chain.alpha
    return fused
