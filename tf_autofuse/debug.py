"""The DFX dump (--codegen_compile_debug=true with --debug_dir=DIR).

For every graph the pass sees: `graph_<pid>_<n>_before.pbtxt` and `..._after.pbtxt` (netron
opens both), `..._fusions.txt` (each fused kernel, the nodes it replaced, its program; each
epilogue given to one of TensorFlow's fused kernels) and
`..._refusals.txt` (each node left alone and why; an operator whose epilogue stays apart is
one of them); each fused program also lands in
`<kernel name>.program.txt`. A dump that cannot be written is a warning, never an error.
"""

from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path

from google.protobuf import text_format

from ._warn import warn_once

_counter = itertools.count()
_lock = threading.Lock()


def _fusions_text(result) -> str:
    lines = []
    for fusion in result.fusions:
        lines.append(f"{fusion.name}  ({fusion.kind})")
        lines.append("  replaces: " + ", ".join(fusion.nodes))
        lines.extend("  " + line for line in fusion.program.splitlines())
        lines.append("")
    for done in getattr(result, "epilogues", ()):
        lines.append(f"{done.name}  ({done.op} [{', '.join(done.fused_ops)}], TensorFlow's kernel)")
        lines.append("  replaces: " + ", ".join(done.nodes))
        lines.append("")
    return "\n".join(lines)


def _refusals_text(result) -> str:
    return "".join(f"{node}: {reason}\n" for node, reason in result.refusals)


def dump(debug_dir: str, graph_before, result) -> None:
    with _lock:
        n = next(_counter)
    stem = f"graph_{os.getpid()}_{n}"
    root = Path(debug_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / f"{stem}_before.pbtxt").write_text(text_format.MessageToString(graph_before))
        (root / f"{stem}_after.pbtxt").write_text(text_format.MessageToString(result.graph_def))
        (root / f"{stem}_fusions.txt").write_text(_fusions_text(result))
        (root / f"{stem}_refusals.txt").write_text(_refusals_text(result))
        for fusion in result.fusions:
            (root / f"{fusion.name}.program.txt").write_text(fusion.program)
    except OSError as err:
        warn_once(f"cannot write the debug dump into {root}: {err}")
