"""The op table (rewriter/catalog.py) drives the C++ side, and adding an op takes a row plus its
kernel body.

- The generated header (rewriter/catalog_cc.py) holds every op of the table, reductions last,
  with the dtype classes, result kinds, costs and CPU refusals the C++ side reads.
- The CPU interpreter's completeness check (cc/cpu/kernels.h): an op of the table without a
  kernel for a dtype it allows, and without a stated refusal, does not compile, and the error
  names the op; a stated refusal compiles.
- A toy op (Asinh) added to a copy of the package by a catalog row, its kernel body and its
  stated Ascend refusal is fused by the rewriter, runs on the CPU with the reference's numbers,
  and is refused by the Ascend generator with that reason.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import types_pb2

import tf_autofuse
from rewriter_graphs import graph as rewriter_graph
from rewriter_graphs import node, placeholder
from tf_autofuse import rewriter
from tf_autofuse.rewriter import catalog, catalog_cc

PACKAGE = Path(tf_autofuse.__file__).resolve().parent


def _rows(text):
    return [line.strip() for line in text.splitlines() if line.strip().startswith("X(")]


def test_generated_header_has_every_op_of_the_table_in_order():
    rows = _rows(catalog_cc.header_text())
    assert [r[2:r.index(",")] for r in rows] == [s.ir_name for s in catalog.OPS]
    by_name = {r[2:r.index(",")]: [f.strip() for f in r[2:-3].split(",")] for r in rows}
    assert by_name["Abs"] == ["Abs", "1", "kFloatTypes | kI32Type", "kSame", "1", "2", "nullptr"]
    assert by_name["IsNan"][3] == "kBool" and by_name["Cast"][3] == "kCastTo"
    assert by_name["LogicalAnd"][2] == "kBoolType"
    assert by_name["ZerosLike"][2] == "kFloatTypes | kI32Type | kBoolType"
    for spec in catalog.OPS:
        fields = by_name[spec.ir_name]
        assert fields[1] == str(spec.arity) and fields[4] == str(spec.cost)
        assert fields[5] == str(catalog.element_cost(spec, types_pb2.DT_DOUBLE))
    first = next(s.ir_name for s in catalog.OPS if s.kind == catalog.REDUCE)
    assert f"#define TF_AUTOFUSE_FIRST_REDUCTION k{first}" in catalog_cc.header_text()


def test_generated_header_refuses_a_table_it_cannot_express():
    half_only = catalog.OpSpec(("Toy",), "Toy", catalog.ELEMENTWISE, 1,
                               frozenset({types_pb2.DT_HALF}), np.abs)
    with pytest.raises(ValueError, match=r"Toy: the C\+\+ table allows all float dtypes or none"):
        catalog_cc.header_text((half_only,) + catalog.OPS)
    late = catalog.OpSpec(("Toy",), "Toy", catalog.ELEMENTWISE, 1, catalog.FLOAT, np.abs)
    with pytest.raises(ValueError, match="reductions last"):
        catalog_cc.header_text(catalog.OPS + (late,))


def test_cost_models_read_the_table():
    """One cost per op, the table's: the rewriter's cost models and the CPU kernel's estimate
    (op_table.inc) read it through element_cost, whose f64 rule is the only one."""
    f32, f64 = types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE
    for spec in catalog.OPS:
        assert catalog.element_cost(spec, f32) == spec.cost
        assert catalog.element_cost(spec, types_pb2.DT_HALF) == spec.cost  # computed in fp32
        assert catalog.element_cost(spec, f64) == (
            max(2 * spec.cost, catalog.F64_SCALAR_COST) if spec.transcendental else 2 * spec.cost)
        for tf_op in spec.tf_ops:
            entry = catalog.tf_op(tf_op)
            if entry is None or entry.ir_ops != (spec.ir_name,):
                continue
            assert catalog.is_transcendental(tf_op) == spec.transcendental
            assert catalog.tf_op_cost(tf_op, f32) == spec.cost
    cost = {name: catalog.for_ir_name(name).cost for name in ("Maximum", "Minimum", "Less",
                                                              "Select")}
    assert catalog.tf_op_cost("ClipByValue", f32) == sum(cost.values())  # the ops it may emit
    assert not catalog.is_transcendental("ClipByValue")


def _documented_ops():
    """IR op -> (arity, dtypes, result) from the op table of docs/PROGRAM.md."""
    text = (PACKAGE.parent / "docs" / "PROGRAM.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) != 4 or not cells[1].isdigit():
            continue
        names, arity, dtypes, _ = cells
        operands, _, result = dtypes.partition(" -> ")
        if "(T " in result:  # Select: "bool, T, T -> T (T float, i32)"
            operands, result = result[result.index("(T ") + 3:-1], "same"
        allowed = set()
        for word, group in (("float", catalog.FLOAT), ("i32", {types_pb2.DT_INT32}),
                            ("bool", catalog.BOOL)):
            if word in operands.split(", "):
                allowed |= set(group)
        result = "bool" if result == "bool" else "to" if result == "float" else "same"
        for name in names.split(", "):
            rows[name] = (int(arity), frozenset(allowed), result)
    return rows


def test_program_md_documents_every_op_of_the_table():
    documented = _documented_ops()
    for spec in catalog.OPS:
        assert spec.ir_name in documented, f"{spec.ir_name} is not in docs/PROGRAM.md's op table"
        assert documented[spec.ir_name] == (spec.arity, spec.dtypes, spec.result), spec.ir_name
    assert set(documented) == {spec.ir_name for spec in catalog.OPS}


def test_a_stated_cpu_refusal_is_the_partitioners_reason(monkeypatch):
    spec = dataclasses.replace(catalog.for_ir_name("Tanh"), cpu_refusal="not written yet")
    monkeypatch.setitem(catalog._BY_IR_NAME, "Tanh", spec)
    monkeypatch.setitem(catalog._BY_TF_OP, "Tanh", spec)
    monkeypatch.setattr(catalog, "TF_OPS", catalog._build_tf_ops())
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 16], name="x")
        tf.exp(tf.tanh(tf.abs(x), name="tanh"), name="y")
    fused = tf_autofuse.fuse(graph, outputs=["y"])
    assert not fused.fusions
    # the node refused is tanh, or the _UnaryOpsComposition Grappler may have folded it into
    assert "Tanh has no CPU kernel: not written yet" in {r.reason for r in fused.refusals}
    # the same op in a chain Grappler folded into a _UnaryOpsComposition
    composed = node("c", catalog.COMPOSITION_OP, ["x"], op_names=["Abs", "Tanh"])
    result = rewriter.rewrite(rewriter_graph(placeholder("x"), composed, node("e", "Exp", ["c"])))
    assert not result.fusions
    assert ("c", "Tanh has no CPU kernel: not written yet") in result.refusals


# --- the interpreter's completeness check ---------------------------------------------------


def _with_op(ir_name: str, dtypes=catalog.FLOAT, cpu_refusal=None) -> str:
    """The generated header with an elementwise op `ir_name` added before the reductions."""
    toy = catalog.OpSpec((ir_name,), ir_name, catalog.ELEMENTWISE, 1, dtypes, np.arcsinh,
                         cpu_refusal=cpu_refusal)
    first = next(i for i, s in enumerate(catalog.OPS) if s.kind == catalog.REDUCE)
    return catalog_cc.header_text(catalog.OPS[:first] + (toy,) + catalog.OPS[first:])


def _compile_kernels_check(tmp_path: Path, header: str) -> subprocess.CompletedProcess:
    generated = tmp_path / "generated"
    generated.mkdir()
    (generated / catalog_cc.FILE_NAME).write_text(header)
    source = tmp_path / "check.cc"
    source.write_text('#include "cpu/kernels.h"\n')
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    cmd = [cxx, *tf.sysconfig.get_compile_flags(), "-fsyntax-only", f"-I{PACKAGE / 'cc'}",
           f"-I{generated}", str(source)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_an_op_without_a_cpu_kernel_does_not_compile_and_the_error_names_it(tmp_path):
    (tmp_path / "ok").mkdir()
    ok = _compile_kernels_check(tmp_path / "ok", catalog_cc.header_text())
    assert ok.returncode == 0, ok.stderr
    (tmp_path / "missing").mkdir()
    missing = _compile_kernels_check(tmp_path / "missing", _with_op("Asinh"))
    assert missing.returncode != 0
    assert "the CPU interpreter has no kernel for op Asinh" in missing.stderr
    # an i32 variant of a float-only kernel family is missing too
    (tmp_path / "ints").mkdir()
    ints = _compile_kernels_check(tmp_path / "ints", _with_op("Tanh2", catalog.FLOAT_I32))
    assert ints.returncode != 0 and "op Tanh2" in ints.stderr
    (tmp_path / "refused").mkdir()
    refused = _compile_kernels_check(
        tmp_path / "refused", _with_op("Asinh", cpu_refusal="no kernel written yet"))
    assert refused.returncode == 0, refused.stderr


# --- a toy op, end to end ---------------------------------------------------------------------

_ROW = ('    _spec("Asinh", "Asinh", 1, FLOAT, np.arcsinh, cost=20, transcendental=True),\n')
_BODY = "    case OpCode::kAsinh: out = x.unaryExpr([](T v) { return std::asinh(v); }); break;\n"
_FAMILY = "    case OpCode::kAsinh:\n"
_ASCEND_REFUSAL = '\n_refuse("Asinh", "toy op of tests/test_op_table.py: no Ascend C mapping")\n'


def _insert_before(path: Path, anchor: str, text: str) -> None:
    source = path.read_text()
    assert source.count(anchor) == 1, f"{path.name}: the anchor {anchor!r} moved"
    path.write_text(source.replace(anchor, text + anchor))


def _insert_after(path: Path, anchor: str, text: str) -> None:
    source = path.read_text()
    assert source.count(anchor) == 1, f"{path.name}: the anchor {anchor!r} moved"
    path.write_text(source.replace(anchor, anchor + text))


_SCRIPT = textwrap.dedent('''
    import json
    import numpy as np
    import tensorflow as tf
    import tf_autofuse
    from tf_autofuse.codegen import generate, opmap
    from tf_autofuse.rewriter import catalog

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 33], name="x")
        tf.exp(tf.math.asinh(tf.abs(x)), name="y")
    fused = tf_autofuse.fuse(graph, outputs=["y"])
    v = np.random.default_rng(0).normal(0, 3, (64, 33)).astype(np.float32)
    v[0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    got = fused.run("y", {"x": v})
    unfused = fused.run("y", {"x": v}, original=True)
    spec = catalog.for_ir_name("Asinh")
    ref = np.exp(spec.reference(np.abs(v.astype(np.float64))))
    (fusion,) = fused.fusions
    kernel = generate(fusion.program, fusion.name)
    print(json.dumps({
        "names": [f.name for f in fused.fusions], "program": fusion.program,
        "got": got.tolist(), "unfused": unfused.tolist(), "ref": ref.tolist(),
        "ascend_ok": kernel.ok, "ascend_reason": kernel.reason,
        "opmap_refusal": opmap.refusal("Asinh", "float"),
    }))
''')


@pytest.fixture(scope="module")
def toy_package(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy_op")
    package = root / "tf_autofuse"
    shutil.copytree(PACKAGE, package,
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.o", ".cache"))
    first_reduction = next(s for s in catalog.OPS if s.kind == catalog.REDUCE)
    _insert_before(package / "rewriter" / "catalog.py", f'    _spec("{first_reduction.ir_name}",',
                   _ROW)
    _insert_after(package / "cc" / "cpu" / "ops.h",
                  "    case OpCode::kCosh: out = x.unaryExpr([](T v) { return std::cosh(v); }); "
                  "break;\n", _BODY)
    _insert_after(package / "cc" / "cpu" / "kernels.h",
                  "    case OpCode::kTan: case OpCode::kAtan: case OpCode::kSinh: "
                  "case OpCode::kCosh:\n", _FAMILY)
    opmap = package / "codegen" / "opmap.py"
    text = opmap.read_text()
    anchor = "\n_check_complete()\n"  # the refusal is stated before opmap checks completeness
    assert text.count(anchor) == 1, "opmap.py no longer ends with its completeness check"
    opmap.write_text(text.replace(anchor, _ASCEND_REFUSAL + anchor))
    return root


def test_a_toy_op_added_by_a_row_and_its_body_is_fused_run_and_refused_on_ascend(toy_package):
    env = dict(os.environ, PYTHONPATH=str(toy_package), TF_CPP_MIN_LOG_LEVEL="2",
               TF_AUTOFUSE_CACHE_DIR=str(toy_package / "cache"))
    env.pop("TF_AUTOFUSE_TEST_LIBRARY", None)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                          env=env, cwd=toy_package, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["names"] == ["autofuse_pointwise_0_Abs_Asinh_Exp"]
    assert "%1 = Asinh %0\n" in result["program"]
    got, unfused, ref = (np.array(result[k], np.float64) for k in ("got", "unfused", "ref"))
    # the f32 kernel (the C library's asinhf, then our exp) against TensorFlow and float64
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    finite = np.isfinite(ref)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(ref)], ref[~finite & ~np.isnan(ref)])
    np.testing.assert_allclose(got[finite], ref[finite], rtol=4e-7)
    np.testing.assert_allclose(got[finite], unfused[finite], rtol=4e-7)
    assert not result["ascend_ok"]
    assert "Asinh: toy op of tests/test_op_table.py: no Ascend C mapping" in result["ascend_reason"]
    assert result["opmap_refusal"] == "Asinh: toy op of tests/test_op_table.py: no Ascend C mapping"
