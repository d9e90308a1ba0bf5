"""When an Einsum or a BatchMatMulV2 is one matrix multiplication.

Keras' EinsumDense (the projections of MultiHeadAttention) contracts the trailing axes of its
input with the leading axes of its kernel, "abc,cde->abde" or "abcd,cde->abe"; Keras 3 on
TensorFlow writes the same as a BatchMatMulV2 of the input and the kernel reshaped to 2-D, and
Dense on a sequence sometimes as a BatchMatMulV2 with a 2-D right operand. Each is
`[M, K] x [K, N]` in disguise: the left operand read as rows of its contracted axes, the right
one as a matrix, the output as rows of its trailing N axes. Row-major layout makes each of
those a Reshape (a view), so the epilogue pass can hand the product and its bias to
`_FusedMatMul` between Reshapes. An operand shared by several axes (a batch axis, as in the
attention scores "abcd,aecd->acbe") makes it a batch of products: not one MatMul.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from .graph import GraphView, format_shape

OPS = ("Einsum", "BatchMatMulV2")


@dataclasses.dataclass(frozen=True)
class OneMatMul:
    """The operator as `left [M, K] x right [K, N]` (right read as [N, K] when transpose_b).
    rows: the left operand's shape without its contracted axes (sizes may be unknown: < 0);
    k: the contracted size; columns: the output's trailing axes that are the right operand's."""

    rows: tuple
    k: int
    columns: tuple
    transpose_b: bool

    @property
    def n(self) -> int:
        return int(np.prod(self.columns, dtype=np.int64))


def analyse(view: GraphView, name: str):
    """(OneMatMul, None) when operator `name` is one matrix multiplication, else (None, why
    not)."""
    node = view.node(name)
    inputs = view.data_inputs(name)
    if len(inputs) != 2:
        return None, f"{node.op} epilogue: {len(inputs)} operands, not two"
    left, right = (view.tensor_shape(t) for t in inputs)
    if left is None or right is None:
        return None, f"{node.op} epilogue: an operand's rank is not known"
    if node.op == "Einsum":
        found, reason = _einsum(node.attr["equation"].s.decode(), left, right)
    else:
        found, reason = _batch_matmul(node, left, right)
    if found is None:
        return None, f"{node.op} epilogue: {reason}"
    if found.k < 0 or min(found.columns, default=1) < 0:
        return None, (f"{node.op} epilogue: the right operand's shape {format_shape(right)} is not "
                      "static (the product's K and N must be)")
    return found, None


def _batch_matmul(node, left: tuple, right: tuple):
    if node.attr["adj_x"].b:
        return None, "adj_x: the left operand is not read as rows"
    if len(left) < 2 or len(right) < 2:
        return None, "an operand of rank below 2"
    if any(d != 1 for d in right[:-2]):
        return None, (f"the right operand {format_shape(right)} has batch axes: a batch of "
                      "products, not one MatMul")
    transpose_b = bool(node.attr["adj_y"].b)
    k, n = (right[-1], right[-2]) if transpose_b else (right[-2], right[-1])
    if left[-1] >= 0 and k >= 0 and left[-1] != k:
        return None, f"contracted sizes differ ({left[-1]} and {k})"
    return OneMatMul(tuple(left[:-1]), k, (n,), transpose_b), None


def _einsum(equation: str, left: tuple, right: tuple):
    """The labels of "left,right->out" as [rows..., contracted...] x [contracted..., columns...]
    (or [columns..., contracted...]) -> [rows..., columns...], each label once."""
    text = equation.replace(" ", "")
    if "..." in text:
        return None, f"equation {equation!r} has an ellipsis"
    operands, arrow, out = text.partition("->")
    parts = operands.split(",")
    if not arrow or len(parts) != 2:
        return None, f"equation {equation!r} is not of two operands and an output"
    a, b = parts
    if any(len(set(s)) != len(s) for s in (a, b, out)) or not (a + b + out).isalpha():
        return None, f"equation {equation!r} repeats a label (a diagonal)"
    if len(a) != len(left) or len(b) != len(right):
        return None, f"equation {equation!r} does not match the ranks of the operands"
    batch = set(a) & set(b) & set(out)
    if batch:
        return None, (f"equation {equation!r} shares batch axes {''.join(sorted(batch))} "
                      "between the operands: a batch of products, not one MatMul")
    contracted = [c for c in a if c in b]
    if set(out) - set(a) - set(b) or set(a) - set(b) - set(out) or set(b) - set(a) - set(out):
        return None, f"equation {equation!r} sums or broadcasts an axis of one operand alone"
    j = len(contracted)
    if not j:
        return None, f"equation {equation!r} contracts no axis (an outer product)"
    rows = a[:len(a) - j]
    if a[len(a) - j:] != "".join(contracted) or out != rows + "".join(c for c in b
                                                                    if c not in contracted):
        return None, (f"equation {equation!r}: the contracted axes are not the left operand's "
                      "trailing ones, or the output is not its rows then the right's columns")
    if b[:j] == a[len(a) - j:]:
        transpose_b, columns = False, b[j:]
    elif b[len(b) - j:] == a[len(a) - j:]:
        transpose_b, columns = True, b[:len(b) - j]
    else:
        return None, (f"equation {equation!r}: the contracted axes are neither the leading nor "
                      "the trailing axes of the right operand, in the left's order")
    sizes = dict(zip(b, right))
    k = int(np.prod([sizes[c] for c in contracted], dtype=np.int64))
    if any(sizes[c] < 0 for c in contracted):
        k = -1
    for c, d in zip(a, left):
        if c in sizes and d >= 0 and sizes[c] >= 0 and d != sizes[c]:
            return None, f"equation {equation!r}: axis {c} has sizes {d} and {sizes[c]}"
    return OneMatMul(tuple(left[:len(rows)]), k, tuple(sizes[c] for c in columns),
                     transpose_b), None
