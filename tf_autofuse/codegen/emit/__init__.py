"""One emitter per schedule (schedule.py chooses it): the sources of a planned kernel.

    base.py       the kernel every schedule shares (queues, CopyIn/Compute/CopyOut, the entry
                  point, the host launcher) and the hooks a schedule fills in
    flat.py       flat
    broadcast.py  broadcast ([outer, inner]) and broadcast3 ([outer, mid, inner])
    reduce.py     reduce (rows reduced over the inner axes, several passes when needed)
    column.py     column (reduced axes followed by kept ones)
    matmul.py     the mix kernel of a MatMul and its epilogue (cube.py plans it)
"""

from __future__ import annotations

from .. import schedule
from .base import Emitter
from .broadcast import Broadcast3Emitter, RowsEmitter
from .column import ColumnEmitter
from .flat import FlatEmitter
from .reduce import ReduceEmitter

EMITTERS = {schedule.FLAT: FlatEmitter, schedule.BROADCAST: RowsEmitter, schedule.BROADCAST3: Broadcast3Emitter,
            schedule.REDUCE: ReduceEmitter, schedule.COLUMN: ColumnEmitter}


def emitter_for(kind: str) -> type:
    return EMITTERS[kind]


__all__ = ["Emitter", "emitter_for"]
