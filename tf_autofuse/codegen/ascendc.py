"""Ascend C generation for one fused program: `generate(text, name)` -> Kernel.

The generated kernel is the standard vector (AIV) shape:

    CopyIn   GM -> UB   DataCopy (whole 32-byte blocks) / DataCopyPad (tail) into VECIN queues
    Compute  UB -> UB   16-bit inputs Cast to fp32 (bool: uint8 0/1 -> fp32 0/1 tiles), the
                        program's ops (opmap.py), Cast back
    CopyOut  UB -> GM   from VECOUT queues

with the work split over GetBlockNum() cores by the host tiling function (tiling.py). Three steps:
schedule.py chooses how the iteration space is walked (flat, broadcast, broadcast3, reduce,
column), compute.py plans what one tile computes (the same for every schedule), and the emitter
of the schedule (emit/) writes the sources. Anything that cannot be generated is refused with
the reason, and the group stays on the CPU path.
"""

from __future__ import annotations

from . import ir, schedule
from .compute import ComputePlan, Refused
from .emit import emitter_for
from .kernel import CTYPE, SIZE, STORAGE, Kernel, kernel_name, precision_blacklist
from .opmap import ACCUMULATE, FOLD_OP, REDUCE_API

__all__ = ["ACCUMULATE", "CTYPE", "FOLD_OP", "REDUCE_API", "SIZE", "STORAGE", "Kernel", "generate",
           "kernel_name", "precision_blacklist"]


def generate(text: str, name: str = "autofuse_pointwise_0", blacklist=None) -> Kernel:
    name = kernel_name(name)
    blacklist = precision_blacklist() if blacklist is None else frozenset(blacklist)
    try:
        program = ir.load(text)
    except ValueError as err:
        return Kernel(name, text, False, f"the program does not parse: {err}")
    sched, reason = schedule.choose(program)
    if sched is None:
        return Kernel(name, text, False, reason)
    try:
        plan = ComputePlan(program, blacklist, sched).plan()
        return emitter_for(sched.kind)(name, plan).kernel()
    except Refused as refused:
        return Kernel(name, text, False, str(refused))
