"""The partitioner's cost models: is a merge or a recomputation worth making?

The partitioner (partition.py) proposes; with `Policy.cost_model` other than "none" it asks
this module before each merge of two groups and before each recomputation, and records the
answer "no" as a refusal with its reason. The limits (max_fusion_size, max_input_nums_after_fuse,
recomputation_threshold, passes) are checked first and always hold.

Every kernel (a fused group, or a TF op left alone) is estimated from static shapes:

  bytes      each distinct input read once plus each output written once (elements x dtype size)
  work       sum over its ops of their cost (catalog.tf_op_cost: the op table's cost column, in
             cheap ops, for the node's dtype, as the CPU kernel's estimate reads it) x the elements
             the op is evaluated at. A fused kernel evaluates every op over its whole iteration
             space (a [C] value used in an [N,C] kernel is computed N*C times), except values after
             a reduction, computed on the reduced shape. Unfused TensorFlow evaluates each op on
             its own output.
  expensive  the number of element evaluations of transcendental ops (the table's fact)
  time       kernels x LAUNCH_NS + bytes x NS_PER_BYTE + work x NS_PER_OP (one CPU core)

An unknown size counts as UNKNOWN_SIZE elements, a tensor of unknown rank as UNKNOWN_ELEMENTS.

The models, one rule each:

  memory_bandwidth  compute is free, memory traffic is the cost: a merge or recomputation is made
                    when it lowers the total bytes. Merges always do (the producer's result is no
                    longer read back), so groups grow as without a model; a recomputation is made
                    only when it removes more bytes (an extra output no longer written) than it
                    adds (the producer's inputs read instead of its result).
  compute_density   an expensive (transcendental) op is never evaluated more often than unfused
                    TensorFlow evaluates it: no recomputation of a producer that holds one, and no
                    merge that would evaluate one over a larger iteration space (broadcast);
                    everything else is fused as far as the limits allow (fewer, larger kernels).
  latency           the estimated time above is minimised: a merge saves a kernel launch, so on
                    small tensors groups merge even when that repeats work, while on large tensors a
                    merge or recomputation that repeats more work than it saves (launch + bytes)
                    is declined.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Optional

from tensorflow.core.framework import types_pb2

from . import catalog
from .graph import GraphView
from .lower import Lowered, compute_dtype, compute_ops

NONE = "none"
MODELS = ("memory_bandwidth", "compute_density", "latency")

UNKNOWN_SIZE = 64
UNKNOWN_ELEMENTS = 4096
LAUNCH_NS = 2000.0  # fixed cost of running one kernel (TF executor overhead and scheduling)
NS_PER_BYTE = 0.1  # 10 GB/s of memory traffic
NS_PER_OP = 0.1  # one cheap op (cost 1 in the op table) on one element, vectorised

_DTYPE_BYTES = {types_pb2.DT_HALF: 2, types_pb2.DT_BFLOAT16: 2, types_pb2.DT_FLOAT: 4,
                types_pb2.DT_DOUBLE: 8, types_pb2.DT_INT32: 4, types_pb2.DT_INT64: 8,
                types_pb2.DT_BOOL: 1}


def check_model(name: str) -> str:
    """`name` when it is a cost model or "none"; else ValueError naming the accepted values."""
    if name != NONE and name not in MODELS:
        raise ValueError(f"unknown cost model {name!r}; accepted: {', '.join((NONE,) + MODELS)}")
    return name


@dataclasses.dataclass(frozen=True)
class Estimate:
    bytes: float = 0.0
    work: float = 0.0
    expensive: float = 0.0
    kernels: int = 0

    def __add__(self, other: "Estimate") -> "Estimate":
        return Estimate(self.bytes + other.bytes, self.work + other.work,
                        self.expensive + other.expensive, self.kernels + other.kernels)

    @property
    def time_ns(self) -> float:
        return self.kernels * LAUNCH_NS + self.bytes * NS_PER_BYTE + self.work * NS_PER_OP


def elements(shape) -> float:
    if shape is None:
        return float(UNKNOWN_ELEMENTS)
    return float(math.prod(d if d >= 0 else UNKNOWN_SIZE for d in shape))


def estimate(view: GraphView, members: Iterable[str], lowered: Lowered) -> Estimate:
    """The estimate of one kernel computing `members` (topological order) as `lowered`."""
    members = sorted(members, key=view.position.get)
    member_set = set(members)
    total_bytes, sizes, seen = 0.0, [], set()
    for tensor, dtype in zip(lowered.inputs, lowered.in_dtypes):
        size = elements(view.tensor_shape(tensor))
        sizes.append(size)
        if tensor not in seen:
            seen.add(tensor)
            total_bytes += size * _DTYPE_BYTES.get(dtype, 4)
    for name, dtype in zip(lowered.outputs, lowered.out_dtypes):
        total_bytes += elements(view.output_shape(name)) * _DTYPE_BYTES.get(dtype, 4)
    own = {m: elements(view.output_shape(m)) for m in members}
    iteration = max(sizes + list(own.values()))
    after_reduce: set = set()
    for m in members:
        for producer, _ in view.data_inputs(m):
            if producer not in member_set:
                continue
            entry = catalog.tf_op(view.node(producer).op)
            if producer in after_reduce or (entry is not None and entry.kind == catalog.REDUCE):
                after_reduce.add(m)
    work = expensive = 0.0
    for m in members:
        count = own[m] if m in after_reduce and own[m] < iteration else iteration
        dtype = compute_dtype(view, m)
        for op in compute_ops(view, m):
            work += catalog.tf_op_cost(op, dtype) * count
            if catalog.is_transcendental(op):
                expensive += count
    return Estimate(total_bytes, work, expensive, 1)


def _saves(new: float, old: float) -> bool:
    """Whether `new` is below `old` by more than the rounding of their sums: estimates that
    differ only there are a tie, which saves nothing (else float noise would decide it)."""
    return new < old and not math.isclose(new, old, rel_tol=1e-9)


def _us(ns: float) -> str:
    return f"{ns / 1000:.1f} us"


def merge_refusal(model: str, fused: Estimate, apart: Estimate) -> Optional[str]:
    """Why the cost model declines to make one kernel of two (`apart` is their sum), or None."""
    if model == "memory_bandwidth" and not _saves(fused.bytes, apart.bytes):
        return (f"cost model memory_bandwidth: fusing saves no memory traffic "
                f"({fused.bytes:.0f} bytes fused, {apart.bytes:.0f} apart)")
    if model == "compute_density" and fused.expensive > apart.expensive:
        return (f"cost model compute_density: the fused kernel would evaluate transcendental ops "
                f"{fused.expensive:.0f} times instead of {apart.expensive:.0f} (broadcast into a "
                f"larger iteration space)")
    if model == "latency" and not _saves(fused.time_ns, apart.time_ns):
        return (f"cost model latency: estimated {_us(fused.time_ns)} fused, "
                f"{_us(apart.time_ns)} apart")
    return None


def recompute_refusal(model: str, copies: Iterable[str], view: GraphView, before: Estimate,
                      after: Estimate) -> Optional[str]:
    """Why the cost model declines a recomputation of `copies`, or None. `before` and `after`
    estimate the recomputing group and the group owning the copies, without and with it."""
    if model == "memory_bandwidth" and not _saves(after.bytes, before.bytes):
        return (f"cost model memory_bandwidth: recomputing saves no memory traffic "
                f"({after.bytes:.0f} bytes with, {before.bytes:.0f} without)")
    if model == "compute_density":
        expensive = sorted({op for c in copies for op in compute_ops(view, c)
                            if catalog.is_transcendental(op)})
        if expensive:
            return (f"cost model compute_density: recomputing would evaluate "
                    f"{', '.join(expensive)} twice")
    if model == "latency" and not _saves(after.time_ns, before.time_ns):
        return (f"cost model latency: estimated {_us(after.time_ns)} recomputing, "
                f"{_us(before.time_ns)} reading the other kernel's output")
    return None
