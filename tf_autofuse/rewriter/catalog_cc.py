"""The op table (catalog.OPS) as the C++ header the kernel library is built with.

`_build.py` writes `header_text()` as `op_table.inc` next to the objects it compiles (and keys
its cache on it). program.h builds the OpCode enum from it, program.cc the OpInfo table (name,
arity, dtypes, result, costs, CPU refusal), and the CPU interpreter checks at compile time that
every op has a kernel for each dtype the table allows, or a stated refusal (cc/cpu/kernels.h).
"""

from __future__ import annotations

import json
from pathlib import Path

from . import catalog

FILE_NAME = "op_table.inc"

_RESULTS = {"same": "kSame", "bool": "kBool", "to": "kCastTo"}


def _dtype_classes(spec: catalog.OpSpec) -> str:
    """The DTypeClass bits of program.h that an op's data operands may have."""
    dtypes = set(spec.dtypes)
    classes = []
    floats = set(catalog.FLOAT)
    if dtypes & floats:
        if not floats <= dtypes:
            raise ValueError(f"{spec.ir_name}: the C++ table allows all float dtypes or none")
        classes.append("kFloatTypes")
        dtypes -= floats
    for dtype, name in ((catalog.types_pb2.DT_INT32, "kI32Type"),
                        (catalog.types_pb2.DT_BOOL, "kBoolType")):
        if dtype in dtypes:
            classes.append(name)
            dtypes.discard(dtype)
    if dtypes or not classes:
        raise ValueError(f"{spec.ir_name}: dtypes the C++ table cannot express: "
                         f"{sorted(catalog.dtype_name(d) for d in dtypes) or 'none'}")
    return " | ".join(classes)


def _check_order(ops) -> str:
    """The first reduction; the reductions must be the table's last rows (IsReduction)."""
    kinds = [spec.kind == catalog.REDUCE for spec in ops]
    first = kinds.index(True)
    if not all(kinds[first:]):
        raise ValueError("catalog.OPS must list the reductions last")
    return ops[first].ir_name


def _c_string(text) -> str:
    return "nullptr" if text is None else json.dumps(text, ensure_ascii=True)


def _cost(spec: catalog.OpSpec, dtype: int) -> int:
    cost = catalog.element_cost(spec, dtype)
    if not isinstance(cost, int) or cost < 1:
        raise ValueError(f"{spec.ir_name}: a cost is an integer >= 1, got {cost!r}")
    return cost


def header_text(ops=None) -> str:
    ops = catalog.OPS if ops is None else ops
    names = [spec.ir_name for spec in ops]
    if len(set(names)) != len(names) or not all(n.isidentifier() for n in names):
        raise ValueError("catalog.OPS: IR names must be distinct identifiers")
    if len(ops) > 255:
        raise ValueError("catalog.OPS: OpCode is a uint8_t")
    first_reduction = _check_order(ops)
    lines = [
        "// The op table, generated from tf_autofuse/rewriter/catalog.py by catalog_cc.py when the",
        "// kernel library is built. Change the catalog, not this file.",
        "//",
        "// TF_AUTOFUSE_OPS(X) calls X(Name, arity, dtype classes, result kind, cost, f64 cost,",
        "// cpu_refusal) once per op, in the catalog's order (the reductions last): the costs are",
        "// catalog.element_cost's for fp32 (and 16-bit) and for f64.",
        "",
        "#define TF_AUTOFUSE_OPS(X) \\",
    ]
    for spec in ops:
        lines.append(
            f"  X({spec.ir_name}, {spec.arity}, {_dtype_classes(spec)}, {_RESULTS[spec.result]}, "
            f"{_cost(spec, catalog.types_pb2.DT_FLOAT)}, "
            f"{_cost(spec, catalog.types_pb2.DT_DOUBLE)}, "
            f"{_c_string(spec.cpu_refusal)}) \\")
    lines += ["", f"#define TF_AUTOFUSE_FIRST_REDUCTION k{first_reduction}", ""]
    return "\n".join(lines)


def write_header(directory: Path) -> Path:
    """Writes op_table.inc into `directory` (created if needed); returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / FILE_NAME
    path.write_text(header_text())
    return path
