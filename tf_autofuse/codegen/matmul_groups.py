"""The MatMuls of a fused graph that the Ascend side could run with their epilogue as one mix
kernel (cube.py), found where the product decides Ascend code: the debug dump of a session's
kernels and `python -m tf_autofuse codegen` (dump.py).

Two forms reach it:

- a `MatMul` whose output only an AutofuseKernel reads (on a device other than the CPU the
  rewriter's epilogue pass leaves the MatMul alone and its epilogue is an elementwise group; on
  the CPU, chains the pass refuses): that kernel's program is the epilogue, the input reading the
  MatMul its product;
- a `_FusedMatMul` the epilogue pass (or Grappler's remapper) made on the CPU: its BiasAdd and
  activation are written as the epilogue program.

Each is a `MatmulGroup` with the kernel it plans, or the reason the MatMul stays a framework op.
Convolutions (Conv2D, DepthwiseConv2dNative and their _Fused forms) are groups too, refused with
the reason: no img2col feeding the Matmul API is generated.
Running these kernels in a session needs what docs/ASCEND.md lists under "MatMul epilogues"
(not built): the groups are planned and dumped, the session runs the MatMul and the fused
kernel apart.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..rewriter.naming import FUSED_OPS
from . import cube
from .kernel import Kernel

_CONVOLUTIONS = ("Conv2D", "DepthwiseConv2dNative", "_FusedConv2D", "_FusedDepthwiseConv2dNative")
_CONV_REASON = ("the cube + vector kernel is generated for MatMul only (a convolution would need "
                "img2col feeding the Matmul API, not built): the convolution stays a framework op and "
                "its epilogue is a fused kernel of its own")
_DTYPES = {1: "f32", 2: "f64", 3: "i32", 6: "i8", 14: "bf16", 19: "f16"}  # TF DataType -> program dtype
# TensorFlow's fused activations with an IR op of the same meaning (the catalog's names)
_ACTIVATIONS = {"Relu": "Relu", "Relu6": "Relu6", "Elu": "Elu", "LeakyRelu": "LeakyRelu",
                "Tanh": "Tanh", "Sigmoid": "Sigmoid"}


@dataclasses.dataclass(frozen=True)
class MatmulGroup:
    name: str  # the mix kernel's node name (the fused node's, or the _FusedMatMul's)
    matmul: str  # the MatMul node
    program: str  # the epilogue program ("" when there is none to read)
    c_input: int  # the program's input that is the product
    spec: Optional[cube.MatMul]
    reason: str = ""  # why the MatMul stays a framework op, when the plan is not reached

    def generate(self, blacklist=None) -> Kernel:
        if self.spec is None:
            return Kernel(cube.kernel_name(self.name), self.program, False, self.reason)
        return cube.generate_matmul(self.spec, self.program, self.c_input, self.name, blacklist)


def _dims(shape) -> Optional[tuple]:
    return tuple(-1 if d is None else int(d) for d in shape) if shape is not None else None


def _spec(view, name: str, program_mn=None):
    """(cube.MatMul, "") of MatMul node `name`, or (None, why)."""
    node = view.node(name)
    dtype = _DTYPES.get(node.attr["T"].type, f"DataType {node.attr['T'].type}")
    ta, tb = node.attr["transpose_a"].b, node.attr["transpose_b"].b
    (a, ai), (b, bi) = view.data_inputs(name)[:2]
    a_shape, b_shape = _dims(view.output_shape(a, ai)), _dims(view.output_shape(b, bi))
    if b_shape is None or len(b_shape) != 2 or min(b_shape) < 0:
        return None, f"{name}: the shape of its right operand is not known ({b_shape}): K and N are needed"
    k, n = (b_shape[1], b_shape[0]) if tb else b_shape
    m = -1
    if a_shape is not None and len(a_shape) == 2:
        m = a_shape[1] if ta else a_shape[0]
    if program_mn is not None and m < 0 and program_mn[0] >= 0:
        m = program_mn[0]
    return cube.MatMul(dtype, k=k, n=n, m=m, transpose_a=ta, transpose_b=tb), ""


def _fused_program(view, name: str, dtype: str, n: int):
    """The epilogue program of a _FusedMatMul's fused_ops, or (None, why)."""
    node = view.node(name)
    ops = [s.decode() for s in node.attr["fused_ops"].list.s]
    if not ops or ops[0] != "BiasAdd" or len(ops) > 2 or (len(ops) == 2 and ops[1] not in _ACTIVATIONS):
        return None, f"{name}: fused_ops {ops} have no epilogue program here (BiasAdd and one of {sorted(_ACTIVATIONS)})"
    lines = [f"in0: {dtype}[?,{n}]", f"in1: {dtype}[{n}]", "%0 = Add in0, in1"]
    if len(ops) == 2:
        act = _ACTIVATIONS[ops[1]]
        alpha = f" alpha={float(node.attr['leakyrelu_alpha'].f)!r}" if act == "LeakyRelu" else ""
        lines.append(f"%1 = {act} %0{alpha}")
    lines.append(f"out0 = %{len(ops) - 1}")
    return "\n".join(lines) + "\n", ""


def find(graph_def, shapes=None) -> list:
    """The MatmulGroups of a fused graph (GraphDef), in graph order."""
    from ..rewriter import program as _program
    from ..rewriter.graph import GraphView

    view = GraphView(graph_def, shapes)
    groups = []
    for name in view.order:
        node = view.node(name)
        if node.op == "_FusedMatMul":
            spec, why = _spec(view, name)
            program, why2 = (_fused_program(view, name, spec.dtype, spec.n) if spec else (None, why))
            if program is None:
                groups.append(MatmulGroup(f"{name}_FusedMatMul", name, "", 0, None, why2 or why))
                continue
            # the bias is the _FusedMatMul's third input; the kernel reads it as the epilogue's in1
            groups.append(MatmulGroup(f"{name}_FusedMatMul", name, program, 0, spec))
        elif node.op in _CONVOLUTIONS and node.op.startswith("_"):
            groups.append(MatmulGroup(f"{name}_{node.op.lstrip('_')}", name, "", 0, None,
                                      f"{node.op}: {_CONV_REASON}"))
        elif node.op in FUSED_OPS:
            for k, (producer, index) in enumerate(view.data_inputs(name)):
                if producer in view and view.node(producer).op in _CONVOLUTIONS:
                    text = node.attr["program"].s.decode()
                    groups.append(MatmulGroup(f"{name}_{producer}", producer, text, k, None,
                                              f"{view.node(producer).op}: {_CONV_REASON}"))
                    break
                if producer not in view or view.node(producer).op != "MatMul" or index != 0:
                    continue
                text = node.attr["program"].s.decode()
                others = sorted({c for c, _, _ in view.data_consumers(producer)} - {name})
                reads = sum(1 for c, _, _ in view.data_consumers(producer) if c == name)
                group_name = f"{name}_{producer}"
                if others or reads > 1:
                    why = (f"{producer}'s output is also read by {', '.join(others)}" if others
                           else f"{producer}'s output is read as {reads} inputs of {name}")
                    groups.append(MatmulGroup(group_name, producer, text, k, None,
                                              why + ": the MatMul stays a framework op"))
                    break
                try:
                    shape = _program.parse(text).read_shape(k)
                except ValueError:
                    shape = None
                spec, why = _spec(view, producer, shape)
                groups.append(MatmulGroup(group_name, producer, text, k, spec, why))
                break  # one MatMul a fused kernel: the first input that is one
    return groups
