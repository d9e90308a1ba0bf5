"""Ascend C generation, verified on the CPU twin (tf_autofuse/codegen, docs/ASCEND.md): every op
and dtype, tiling, precision, refusals, what the twin catches, the ACL launcher, CANN detection,
the debug dump and the broadcast schedule (the other schedules: test_codegen_schedules.py).

Generated kernels are compiled with g++ against the twin header (batched: one compiler run per
library, cached by content) and run block by block; results are compared with numpy."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tf_autofuse.codegen import ascendc, generate, opmap, tiling, twin
from tf_autofuse.rewriter import catalog
from tf_autofuse.rewriter.program import DTYPE_NAMES

ROOT = Path(__file__).resolve().parents[1]
CHAIN = "in0: f32[?]\n%0 = Abs in0\n%1 = Relu %0\n%2 = Exp %1\nout0 = %2\n"


# ---- helpers ----------------------------------------------------------------------------------

def to_bf16(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


def as_float(x: np.ndarray, dtype: str) -> np.ndarray:
    return from_bf16(x).astype(np.float64) if dtype == "bf16" else x.astype(np.float64)


def store(x64: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values rounded into the dtype's storage (bf16 as uint16 bits)."""
    if dtype == "bf16":
        return to_bf16(x64.astype(np.float32))
    return x64.astype({"f16": np.float16, "f32": np.float32, "i32": np.int32}[dtype])


_POSITIVE = {"Log", "Sqrt", "Rsqrt", "Log1p"}
_NONZERO = {"Reciprocal", "Div"}


def sample(op: str, dtype: str, count: int, rng, operand: int = 0) -> np.ndarray:
    if dtype == "bool":
        return rng.random(count) < 0.5
    if dtype == "i32":
        return rng.integers(-1000, 1000, count).astype(np.int32)
    if op in _POSITIVE:
        x = rng.uniform(0.1, 4.0, count)
    elif op in _NONZERO and (op == "Reciprocal" or operand == 1):
        x = rng.uniform(0.5, 3.0, count) * rng.choice([-1.0, 1.0], count)
    elif op in ("Sinh", "Cosh", "Exp", "Expm1", "Selu", "Elu"):
        x = rng.uniform(-4.0, 4.0, count)
    else:
        x = rng.uniform(-6.0, 6.0, count)
    return store(x, dtype)


TOL = {"f16": (2e-3, 2e-3), "bf16": (1.6e-2, 1e-2), "f32": (2e-5, 2e-6), "i32": (0, 0)}


def check(got, want64, dtype, what):
    got64 = as_float(got, dtype)
    want64 = as_float(store(want64, dtype), dtype)  # the reference rounded like the output
    rtol, atol = TOL[dtype]
    bad = ~np.isclose(got64, want64, rtol=rtol, atol=atol, equal_nan=True)
    assert not bad.any(), (f"{what}: {bad.sum()} of {bad.size} differ, first at "
                           f"{np.flatnonzero(bad)[0]}: {got64[bad][:4]} vs {want64[bad][:4]}")


def operand_dtypes(spec, dtype):
    """Per operand: Select's condition is bool, the others `dtype`."""
    return [("bool" if role == "bool" else dtype) for role in spec.operand_roles()]


def unary_or_binary(op, arity, dtype):
    spec = catalog.for_ir_name(op)
    dtypes = operand_dtypes(spec, dtype) if spec else [dtype] * arity
    decl = "".join(f"in{k}: {dtypes[k]}[?]\n" for k in range(arity))
    operands = ", ".join(f"in{k}" for k in range(arity))
    attrs = " alpha=0.2" if op == "LeakyRelu" else ""
    return f"{decl}%0 = {op} {operands}{attrs}\nout0 = %0\n"


# One-instruction programs of every elementwise op (reductions need axes and views: they have
# their own tests below; Cast needs its to=: test_cast_between_float_dtypes).
OP_CASES = [(spec, DTYPE_NAMES[d]) for spec in catalog.OPS for d in sorted(spec.dtypes)
            if spec.kind in (catalog.ELEMENTWISE, catalog.BROADCAST) and spec.ir_name != "Cast"]


def generate_all(programs, prefix: str = "") -> dict:
    """{name: Kernel} of `programs` ({name: text}), each generated as `prefix + name`; every one
    must generate (else the reasons)."""
    kernels = {name: generate(text, prefix + name) for name, text in programs.items()}
    assert all(k.ok for k in kernels.values()), {n: k.reason for n, k in kernels.items()}
    return kernels


@pytest.fixture(scope="module")
def op_kernels():
    kernels = {}
    for spec, dtype in OP_CASES:
        kernels[(spec.ir_name, dtype)] = generate(
            unary_or_binary(spec.ir_name, spec.arity, dtype), f"op_{spec.ir_name}_{dtype}")
    ok = [k for k in kernels.values() if k.ok]
    return kernels, twin.build(ok)


# ---- every op of the table, every dtype --------------------------------------------------------

def test_every_op_and_dtype_is_generated_or_refused_with_a_reason(op_kernels):
    kernels, _ = op_kernels
    refused = {key: k.reason for key, k in kernels.items() if not k.ok}
    for (op, dtype), reason in refused.items():
        assert reason, (op, dtype)
    # f64 has no vector type on the AI core (the reason says so); everything else refused is
    # refused by opmap, for the op or for its compute type, with the same reason
    for (op, dtype), reason in refused.items():
        if dtype == "f64":
            assert "f64 has no Ascend vector type" in reason, reason
        else:
            assert opmap.refusal(op, ascendc.STORAGE[dtype]) in reason, (op, dtype, reason)
    assert {op for op, d in refused if d != "f64"} == set()  # FloorMod was the last one
    generated = {key for key, k in kernels.items() if k.ok}
    assert len(generated) >= 140, sorted(refused)


def test_every_catalog_op_is_lowered_or_refused_with_a_reason():
    elementwise = {s.ir_name for s in catalog.OPS if s.kind in (catalog.ELEMENTWISE, catalog.BROADCAST)}
    assert elementwise <= set(opmap.mapped_ops()) | set(opmap.refused_ops())
    reductions = {s.ir_name for s in catalog.OPS if s.kind == catalog.REDUCE}
    assert reductions == set(ascendc.FOLD_OP)  # Prod: a fold reduction (no vector reduce API)
    assert reductions == set(ascendc.REDUCE_API) | {"Prod"}
    assert set(opmap.refused_ops()) == set()  # every catalog op has a lowering
    for op, reason in opmap.refused_ops().items():
        assert len(reason) > 40, (op, reason)
    for op in ("Greater", "GreaterEqual", "Less", "LessEqual", "Equal", "NotEqual", "Select"):
        assert opmap.refusal(op, "int32_t") is None
    # opmap is the one Ascend table: the APIs it names are the ones its lowering emits
    assert opmap.apis("Erf") == ("Erf",)
    assert "Rsqrt" not in opmap.apis("Rsqrt") and "Div" in opmap.apis("Rsqrt")  # a true division
    assert "ReduceSum" in opmap.apis("Sum")


def test_a_catalog_op_without_a_lowering_or_refusal_is_an_import_error(monkeypatch):
    toy = dataclasses.replace(catalog.for_ir_name("Abs"), ir_name="ToyOp", tf_ops=("ToyOp",))
    monkeypatch.setattr(catalog, "OPS", catalog.OPS + (toy,))
    with pytest.raises(ImportError, match="ToyOp.*neither an Ascend C lowering nor a stated refusal"):
        opmap._check_complete()
    monkeypatch.setitem(opmap._REFUSED, "ToyOp", "a toy op the vector unit has no instruction for")
    opmap._check_complete()  # a stated refusal is enough
    assert opmap.refusal("ToyOp", "float") == "ToyOp: a toy op the vector unit has no instruction for"


@pytest.mark.parametrize("spec,dtype", OP_CASES, ids=[f"{s.ir_name}-{d}" for s, d in OP_CASES])
def test_op_matches_numpy_on_the_twin(op_kernels, spec, dtype):
    kernels, lib = op_kernels
    kernel = kernels[(spec.ir_name, dtype)]
    if not kernel.ok:
        pytest.skip(kernel.reason)
    rng = np.random.default_rng(7)
    count = 3 * 1280 + 37  # 8 cores, the last one with a tail that is not 32-byte aligned
    dtypes = operand_dtypes(spec, dtype)
    xs = [sample(spec.ir_name, d, count, rng, k) for k, d in enumerate(dtypes)]
    if spec.ir_name in ("Equal", "NotEqual"):  # ties, or every comparison is false
        xs[1] = np.where(rng.random(count) < 0.5, xs[0], xs[1])
    (got,), t = lib.run(kernel.name, xs, core_num=8)
    assert t.blockDim == 4 or t.blockDim <= 8
    attrs = {"alpha": 0.2} if spec.ir_name == "LeakyRelu" else {}  # the IR's default alpha
    want = spec.reference(*[x if d == "bool" else as_float(x, d) if d != "i32" else x.astype(np.int64)
                            for x, d in zip(xs, dtypes)], **attrs)
    if spec.result == "bool" or dtype == "bool":
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(got, np.asarray(want).astype(bool))
    elif dtype == "i32":
        want = np.asarray(want).astype(np.int64).astype(np.int32)
        np.testing.assert_array_equal(got, want)
    else:
        check(got, np.asarray(want, dtype=np.float64), dtype, f"{spec.ir_name} {dtype}")


# ---- tiling, tails, multi-core ---------------------------------------------------------------

@pytest.fixture(scope="module")
def chain():
    kernel = generate(CHAIN, "autofuse_pointwise_0_Abs_Relu_Exp")
    assert kernel.ok, kernel.reason
    assert kernel.name == "autofuse_pointwise_0_abs_relu_exp"
    return kernel, twin.build([kernel])


@pytest.mark.parametrize("cores", [1, 8, 40])
@pytest.mark.parametrize("extra", [0, 1, 127, 4099])
def test_chain_over_cores_and_tails(chain, cores, extra):
    kernel, lib = chain
    total = cores * 2 * kernel.ub.max_tile + extra  # two full tiles a core, then odd sizes
    x = np.random.default_rng(cores + extra).uniform(-5, 5, total).astype(np.float32)
    (y,), t = lib.run(kernel.name, [x], core_num=cores)
    np.testing.assert_allclose(y, np.exp(np.maximum(np.abs(x), 0)), rtol=1e-6)
    assert t == kernel.tiling(total, cores)  # the C++ tiling function == the Python mirror
    assert t.blockDim <= cores and (t.blockDim == cores or total < cores * tiling.ALIGN_ELEMS * 2)
    assert t.blockLength * (t.blockDim - 1) + t.lastBlockLength == total
    assert t.tileLength % tiling.ALIGN_ELEMS == 0
    assert kernel.ub.ub_bytes(t.tileLength) <= tiling.UB_BUDGET


@pytest.mark.parametrize("total", [0, 1, 31, 128, 129])
def test_small_sizes(chain, total):
    kernel, lib = chain
    x = np.linspace(-2, 2, total).astype(np.float32)
    (y,), t = lib.run(kernel.name, [x], core_num=40)
    np.testing.assert_allclose(y, np.exp(np.abs(x)), rtol=1e-6)
    assert t.blockDim == -(-total // tiling.ALIGN_ELEMS)


def test_tiling_mirror_matches_on_many_shapes(chain):
    kernel, lib = chain
    rng = np.random.default_rng(0)
    for total in list(rng.integers(1, 2_000_000, 25)) + [tiling.ALIGN_ELEMS * 40, 11776 * 40 + 1]:
        cores = int(rng.choice([1, 2, 8, 40, 48]))
        t = kernel.tiling(int(total), cores)
        assert t.blockLength * (t.blockDim - 1) + t.lastBlockLength == total
        assert 0 < t.lastBlockLength <= t.blockLength
        assert (t.tileNum - 1) * t.tileLength + t.tailLength == t.blockLength
        assert (t.lastTileNum - 1) * t.tileLength + t.lastTailLength == t.lastBlockLength


def wide_add(n_inputs: int) -> str:
    decl = "".join(f"in{k}: f32[?]\n" for k in range(n_inputs))
    body = "%0 = Add in0, in1\n" + "".join(f"%{k - 1} = Add %{k - 2}, in{k}\n" for k in range(2, n_inputs))
    return decl + body + f"out0 = %{n_inputs - 2}\n"


def test_group_that_just_fits_in_ub():
    fits = generate(wide_add(100), "wide_100")
    assert fits.ok, fits.reason
    assert fits.ub.max_tile == tiling.ALIGN_ELEMS  # the smallest tile: one more buffer would not fit
    assert fits.ub.ub_bytes(fits.ub.max_tile) <= tiling.UB_BUDGET
    lib = twin.build([fits])
    rng = np.random.default_rng(3)
    xs = [rng.uniform(-1, 1, 5000).astype(np.float32) for _ in range(100)]
    (y,), t = lib.run(fits.name, xs, core_num=8)
    np.testing.assert_allclose(y, np.sum(np.stack(xs).astype(np.float64), axis=0), rtol=1e-4, atol=1e-5)
    too_big = generate(wide_add(200), "wide_200")
    assert not too_big.ok and "does not fit in UB" in too_big.reason


def test_twin_ub_capacity_matches_the_generator_budget():
    header = (ROOT / "tf_autofuse/codegen/twin/kernel_operator.h").read_text()
    ub = int(re.search(r"#define AUTOFUSE_UB_BYTES \((\d+) \* 1024\)", header)[1]) * 1024
    reserved = int(re.search(r"#define AUTOFUSE_UB_RESERVED_BYTES \((\d+) \* 1024\)", header)[1]) * 1024
    assert (ub, reserved) == (tiling.UB_BYTES, tiling.UB_RESERVED_BYTES)


# ---- precision: 16-bit in fp32, unless blacklisted ------------------------------------------

def test_f16_computes_in_fp32_and_rounds_once():
    text = "in0: f16[?]\n%0 = Exp in0\n%1 = Mul %0, %0\n%2 = Sqrt %1\nout0 = %2\n"
    wide = generate(text, "prec_wide", blacklist=())
    narrow = generate(text, "prec_narrow", blacklist={"Exp", "Mul", "Sqrt"})
    assert wide.ok and narrow.ok
    assert "Computed in half" not in wide.sources[f"{wide.name}_kernel.cpp"]
    assert narrow.half_ops == ("%0 = Exp", "%1 = Mul", "%2 = Sqrt")
    lib = twin.build([wide, narrow])
    x = np.random.default_rng(1).uniform(-3, 3, 2000).astype(np.float16)
    (y_wide,), _ = lib.run(wide.name, [x], 8)
    (y_narrow,), _ = lib.run(narrow.name, [x], 8)
    e = np.exp(x.astype(np.float32))
    np.testing.assert_array_equal(y_wide, np.sqrt(e * e).astype(np.float16))  # rounded once
    e16 = np.exp(x)  # numpy: f16 per op
    np.testing.assert_array_equal(y_narrow, np.sqrt(e16 * e16))


def test_blacklist_is_read_from_autofuse_flags():
    env = {"AUTOFUSE_FLAGS": "--enable_autofuse=true;--autofuse_enhance_precision_blacklist=Exp,Add"}
    assert ascendc.precision_blacklist(env) == {"Exp", "Add"}
    assert ascendc.precision_blacklist({}) == frozenset()


# ---- what the generator refuses ---------------------------------------------------------------

@pytest.mark.parametrize("text,why", [
    ("in0: f64[?]\n%0 = Abs in0\nout0 = %0\n", "f64"),
    ("in0: f64[?]\n%0 = Erf in0\nout0 = %0\n", "f64"),
    ("in0: f64[?]\nin1: f64[?]\n%0 = FloorMod in0, in1\nout0 = %0\n", "f64"),
    ("in0: f32[4,1,6,1]\nin1: f32[4,5,6,7]\n%0 = Add in0, in1\nout0 = %0\n", "[outer, mid, inner]"),
    ("in0: f32[4,10]\nin1: f32[10]\n%0 = Mul in0, in1\n%1 = Sum %0 axes=[0]\nout0 = %1\n", "column schedule reads every input in full"),
    ("in0: i32[4,10]\n%0 = Prod in0 axes=[1]\nout0 = %0\n", "Prod of i32"),
    # the reduce generator's gaps: each one refused with its reason, never generated wrong
    ("in0: f32[?,10]\nin1: f32[?,1]\n%0 = Sum in0 axes=[1]\n%1 = Mul %0, in1\nout0 = %1\n",
     "mixes reduced values with inputs read as reduced"),
    ("in0: f32[?,10]\n%0 = Sum in0 axes=[1]\n%1 = Erf %0\nout0 = %1\n", "tile-sized temp buffer"),
    ("in0: f32[?,10]\n%0 = Max in0 axes=[1]\n%1 = Greater %0, 0.0\nout0 = %1\n", "one lane of RowEnd"),
    # the same on a reduced value of a later pass, and on an i32 fold's result
    ("in0: f32[?,10]\n%0 = Max in0 axes=[1]\n%1 = Sub in0, %0\n%2 = Sum %1 axes=[1]\n%3 = Floor %2\n"
     "out0 = %3\n", "one lane of RowEnd"),
    ("in0: i32[?,10]\n%0 = Min in0 axes=[1]\n%1 = Equal %0, 0\nout0 = %1\n", "one lane of RowEnd"),
    ("in0: i32[4,6,8]\n%0 = Mean in0 axes=[0,1]\nout0 = %0\n", "truncating division"),
    ("in0: f32[4,6,8]\n%0 = Max in0 axes=[1]\n%1 = Sub in0, %0\nout0 = %1\n", "several passes over columns"),
    ("in0: f32[4,6,8]\n%0 = Max in0 axes=[1]\n%1 = Mul %0, 2.0\nout0 = %1\n", "arithmetic on reduced values over the non-trailing"),
    ("in0: i32[4,10]\n%0 = Max in0 axes=[1]\n%1 = Add %0, 1\nout0 = %1\n", "arithmetic on i32 reduced"),
    ("in0: f32[?,?]\nin1: f32[?,1]\n%0 = Sum in0 axes=[1]\n%1 = Add in1, 1.0\nout0 = %0\nout1 = %1\n",
     "no reduction computes it"),  # a reduced-shape output from inputs only
    ("in0: f32[?,?]\nin1: f32[?,1]\n%0 = Sum in0 axes=[1]\nout0 = %0\nout1 = in1\n",
     "no reduction computes it"),
    ("in0: f32[?]\n%0 = Abs in0\nout0 = %1\n", "does not parse"),
    ("in0: f64[?]\nin1: f64[?]\n%0 = Greater in0, in1\nout0 = %0\n", "f64"),
])
def test_refusals_keep_the_group_on_the_cpu_path(text, why):
    kernel = generate(text, "refused")
    assert not kernel.ok and not kernel.sources
    assert why in kernel.reason, kernel.reason


def test_kernel_names_are_snake_case():
    assert ascendc.kernel_name("autofuse_pointwise_0_Abs_Relu_Exp") == "autofuse_pointwise_0_abs_relu_exp"
    assert ascendc.kernel_name("autofuse_pointwise_3_SquaredDifference_AddV2") == \
        "autofuse_pointwise_3_squared_difference_add_v2"


def test_generated_kernel_has_the_ascend_shape(chain):
    kernel, _ = chain
    src = kernel.sources[f"{kernel.name}_kernel.cpp"]
    for needle in ('extern "C" __global__ __aicore__ void autofuse_pointwise_0_abs_relu_exp(',
                   "KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY)", "GetBlockIdx()", "TPipe pipe;",
                   "TQue<TPosition::VECIN, BUFFER_NUM>", "TQue<TPosition::VECOUT, BUFFER_NUM>",
                   "TBuf<TPosition::VECCALC>", "DataCopyPad(", "PipeBarrier<PIPE_V>()"):
        assert needle in src, needle


def test_programs_sharing_ops_reuse_scratch_buffers():
    text = ("in0: f32[?]\n" + "".join(f"%{k} = Exp {'in0' if k == 0 else f'%{k - 1}'}\n" for k in range(30))
            + "out0 = %29\n")
    kernel = generate(text, "long_chain")
    assert kernel.ok
    assert len([b for b in kernel.ub.buffers if b[0].startswith("scratch")]) <= 2


def test_immediates_multiple_outputs_and_passthrough():
    text = ("in0: f16[?]\nin1: i32[?]\n%0 = Add in0, 0.5\n%1 = Mul %0, %0\n%2 = Maximum in1, 3\n"
            "out0 = %1\nout1 = %0\nout2 = %2\nout3 = in0\nout4 = %1\n")
    kernel = generate(text, "mixed_outputs")
    assert kernel.ok, kernel.reason
    lib = twin.build([kernel])
    rng = np.random.default_rng(5)
    x = rng.uniform(-2, 2, 3001).astype(np.float16)
    i = rng.integers(-10, 10, 3001).astype(np.int32)
    outs, _ = lib.run(kernel.name, [x, i], 8)
    a = x.astype(np.float32) + 0.5
    np.testing.assert_array_equal(outs[0], (a * a).astype(np.float16))
    np.testing.assert_array_equal(outs[1], a.astype(np.float16))
    np.testing.assert_array_equal(outs[2], np.maximum(i, 3))
    np.testing.assert_array_equal(outs[3], x)
    np.testing.assert_array_equal(outs[4], outs[0])


# ---- the twin catches broken kernels -----------------------------------------------------------

def mutant(name: str, old: str, new: str, count: int = 1):
    kernel = generate(CHAIN, name)
    src = kernel.sources[f"{name}_kernel.cpp"]
    assert src.count(old) >= 1, old
    kernel.sources[f"{name}_kernel.cpp"] = src.replace(old, new, count)
    return kernel


@pytest.fixture(scope="module")
def mutants():
    kernels = [
        mutant("mut_align", "if ((n * sizeof(float)) % 32 == 0) {", "if (true) {"),
        mutant("mut_free", "inQue0.FreeTensor(x0);", ""),
        mutant("mut_barrier", "PipeBarrier<PIPE_V>();", "", count=-1),
        mutant("mut_order", "Compute(n);\n      CopyOut(off, n);", "CopyOut(off, n);\n      Compute(n);"),
    ]
    return twin.build(kernels)


def test_twin_catches_a_misaligned_copy(mutants):
    x = np.ones(1000 + 3, np.float32)
    with pytest.raises(twin.TwinError, match="not a multiple of 32 bytes"):
        mutants.run("mut_align", [x], 1)
    mutants.run("mut_align", [np.ones(1024, np.float32)], 1)  # aligned sizes still pass


def test_twin_catches_a_ub_overflow(chain):
    kernel, lib = chain
    x = np.ones(4 * kernel.ub.max_tile, np.float32)
    lib.run(kernel.name, [x], 1)
    with pytest.raises(twin.TwinError, match="UB overflow"):
        lib.run(kernel.name, [x], 1, tile_override=kernel.ub.max_tile + tiling.ALIGN_ELEMS)


def test_twin_catches_a_missing_free_tensor(mutants):
    with pytest.raises(twin.TwinError, match="FreeTensor"):
        mutants.run("mut_free", [np.ones(128, np.float32)], 1)  # one tile: caught at block end
    with pytest.raises(twin.TwinError, match="FreeTensor"):
        mutants.run("mut_free", [np.ones(100_000, np.float32)], 1)  # many: AllocTensor fails


def test_twin_catches_a_missing_pipe_barrier(mutants):
    with pytest.raises(twin.TwinError, match="PipeBarrier"):
        mutants.run("mut_barrier", [np.ones(256, np.float32)], 1)


def test_twin_catches_dequeue_out_of_order(mutants):
    with pytest.raises(twin.TwinError, match="DeQue on an empty"):
        mutants.run("mut_order", [np.ones(256, np.float32)], 1)


# ---- the ACL launcher against the stand-in runtime ------------------------------------------

@pytest.fixture(scope="module")
def launcher():
    kernel = generate(CHAIN, "autofuse_pointwise_0_Abs_Relu_Exp")
    return kernel, twin.build([kernel], acl=True, single=True)


def test_launch_through_the_stand_in_acl_runtime(launcher):
    kernel, lib = launcher
    x = np.random.default_rng(2).uniform(-3, 3, 100_003).astype(np.float32)
    before = twin.stub_stats()
    (y,), t = lib.launch(kernel.name, [x], core_num=8)
    np.testing.assert_allclose(y, np.exp(np.abs(x)), rtol=1e-6)
    after = twin.stub_stats()
    assert after["launches"] == before["launches"] + 1
    assert after["last_block_dim"] == t.blockDim == 8
    assert after["h2d_bytes"] - before["h2d_bytes"] == x.nbytes + 48  # inputs + tiling data
    assert after["d2h_bytes"] - before["d2h_bytes"] == y.nbytes
    assert after["mallocs"] - before["mallocs"] == after["frees"] - before["frees"] == 3


def test_launcher_asks_the_device_for_its_core_count(launcher, monkeypatch):
    kernel, lib = launcher
    monkeypatch.setenv("TWIN_ACL_VECTOR_CORES", "48")
    x = np.ones(48 * 1024, np.float32)
    (y,), t = lib.launch(kernel.name, [x], core_num=0, symbol="autofuse_npu_launch")
    assert t.blockDim == 48
    np.testing.assert_allclose(y, np.e, rtol=1e-6)


def test_launches_from_other_threads_make_the_context_current(launcher):
    # ACL contexts are per thread and TensorFlow runs a kernel on any thread of its pool
    import ctypes
    import threading

    kernel, lib = launcher
    x = np.linspace(-3, 3, 5000, dtype=np.float32)
    lib.launch(kernel.name, [x], core_num=8)
    stub = ctypes.CDLL(str(twin.stub_library()))
    results = []

    def other_thread():
        try:
            ptr = ctypes.c_void_p()
            results.append(stub.aclrtMalloc(ctypes.byref(ptr), ctypes.c_size_t(64), 0))
            stub.aclGetRecentErrMsg.restype = ctypes.c_char_p
            results.append(stub.aclGetRecentErrMsg().decode())
            results.append(lib.launch(kernel.name, [x], core_num=8))
        except Exception as err:  # noqa: BLE001 - reported below
            results.append(err)
    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert results[0] != 0 and "without a current context" in results[1], results
    assert not isinstance(results[2], Exception), results[2]
    (y,), _ = results[2]
    np.testing.assert_allclose(y, np.exp(np.abs(x)), rtol=1e-6)


def test_stand_in_runtime_catches_a_launcher_without_synchronisation():
    kernel = generate(CHAIN, "mut_nosync")
    host = f"{kernel.name}_host.cpp"
    kernel.sources[host] = kernel.sources[host].replace("rc = aclrtSynchronizeStream(stream);", "")
    lib = twin.build([kernel], acl=True)
    with pytest.raises(twin.TwinError, match="not yet synchronised"):
        lib.launch(kernel.name, [np.ones(1000, np.float32)], core_num=4)


DISPATCH_TEST = r"""
#include <cstdio>
#include <vector>
#include "npu_dispatch.h"
int main(int argc, char** argv) {
  std::string why;
  auto npu = tf_autofuse::npu::Launcher::Open(argv[1], &why);
  if (!npu) { std::printf("open failed: %s\n", why.c_str()); return 1; }
  std::vector<float> x(5000), y(5000, 0.f);
  for (int i = 0; i < 5000; ++i) x[i] = (i % 7) - 3.0f;
  std::string error;
  if (!npu->Run({x.data()}, {y.data()}, x.size(), &error, 40)) { std::printf("run failed: %s\n", error.c_str()); return 1; }
  std::vector<float> z(5000);
  bool wrong_count = npu->Run({x.data(), x.data()}, {z.data()}, x.size(), &error, 40);
  std::string error2;
  bool wrong_size = npu->Run({x.data()}, {z.data()}, x.size(), &error2, 40, 0, nullptr, {}, {4999});
  std::printf("%s %s %s |", npu->kernel_name().c_str(), wrong_count ? "accepted" : error.c_str(),
              wrong_size ? "accepted" : "size-refused");
  for (int i = 0; i < 5000; i += 1000) std::printf(" %.6f", y[i]);
  std::printf("\n");
  auto missing = tf_autofuse::npu::Launcher::Open("/nonexistent/lib.so", &why);
  return missing ? 1 : 0;
}
"""


def test_cpp_npu_dispatch_runs_a_kernel_library(launcher, tmp_path):
    kernel, lib = launcher
    src = tmp_path / "dispatch_test.cpp"
    src.write_text(DISPATCH_TEST)
    host = ROOT / "tf_autofuse/codegen/host"
    exe = tmp_path / "dispatch_test"
    subprocess.run(["g++", "-std=c++17", "-O1", f"-I{host}", str(src), "-o", str(exe), "-ldl"], check=True)
    out = subprocess.run([str(exe), str(lib.path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    words = out.stdout.split()
    assert words[0] == kernel.name
    assert "bad launch arguments" in out.stdout and "size-refused" in out.stdout
    x = np.array([(i % 7) - 3.0 for i in range(0, 5000, 1000)], np.float32)
    np.testing.assert_allclose([float(w) for w in words[-5:]], np.exp(np.abs(x)), rtol=1e-5)


# ---- CANN detection and the dispatch decision ------------------------------------------------

from tf_autofuse.codegen import cann, dump  # noqa: E402


def fake_cann(root: Path, cmake_exit: int = 1) -> dict:
    (root / "compiler/ccec_compiler/bin").mkdir(parents=True)
    (root / "compiler/ccec_compiler/bin/bisheng").write_text("#!/bin/sh\nexit 1\n")
    (root / "lib64").mkdir()
    (root / "lib64/libascendcl.so").write_bytes(b"")
    (root / "compiler/version.info").write_text("Version=9.0.0\n")
    tools = root / "tools"
    tools.mkdir()
    (tools / "cmake").write_text(f"#!/bin/sh\necho fake cmake: no ASC here\nexit {cmake_exit}\n")
    (tools / "cmake").chmod(0o755)
    return {"ASCEND_HOME_PATH": str(root), "PATH": str(tools)}


def test_detect_finds_cann_from_the_environment(tmp_path):
    env = fake_cann(tmp_path / "ascend")
    found, why = cann.detect(env)
    assert found and why == ""
    assert found.bisheng.name == "bisheng" and found.libascendcl.name == "libascendcl.so"
    assert found.cmake == str(tmp_path / "ascend/tools/cmake")
    assert (found.version, found.route) == ("9.0.0", 9)
    toolkit = {"ASCEND_TOOLKIT_HOME": env["ASCEND_HOME_PATH"], "PATH": env["PATH"]}
    assert cann.detect(toolkit)[0].home == found.home
    missing, why = cann.detect({"ASCEND_HOME_PATH": str(tmp_path / "nowhere"), "PATH": ""})
    assert missing is None and "nowhere" in why


def test_without_cann_one_info_line_and_the_cpu_path(caplog, tmp_path):
    cann.reset_for_tests()
    env = {"ASCEND_HOME_PATH": str(tmp_path / "none"), "PATH": ""}
    with caplog.at_level("INFO", logger="tf_autofuse"):
        assert cann.prepare(CHAIN, "k0", env) is None
        assert cann.prepare(CHAIN, "k1", env) is None
    lines = [r for r in caplog.records if "fused kernels run on the CPU" in r.getMessage()]
    assert len(lines) == 1


def test_a_failed_npu_build_warns_once_and_keeps_the_cpu_path(tmp_path):
    from tf_autofuse import _warn
    cann.reset_for_tests()
    _warn.reset()
    env = fake_cann(tmp_path / "ascend")
    with pytest.warns(Warning, match="NPU build failed") as record:
        assert cann.prepare(CHAIN, "autofuse_pointwise_7_Abs", env) is None
        assert cann.prepare(CHAIN, "autofuse_pointwise_7_Abs", env) is None
    assert len([w for w in record if "NPU build failed" in str(w.message)]) == 1
    assert "fake cmake" in str(record[0].message)


def test_unmappable_group_is_not_built(tmp_path):
    cann.reset_for_tests()
    env = fake_cann(tmp_path / "ascend")
    assert cann.prepare("in0: f64[?]\nin1: f64[?]\n%0 = FloorMod in0, in1\nout0 = %0\n", "floormod_only", env) is None


def test_without_cann_no_resolver_is_registered_and_the_cpu_path_runs(tmp_path):
    class FakeLibrary:  # the op library's registration entry point
        def __init__(self):
            self.calls = []

        def autofuse_set_npu_resolver(self, fn):
            self.calls.append(fn)

    lib = FakeLibrary()
    no_cann = {"ASCEND_HOME_PATH": str(tmp_path), "PATH": ""}
    assert cann.install_resolver(lib, no_cann) is False and lib.calls == [None]
    assert cann.prepare(CHAIN, "autofuse_pointwise_0_Abs", no_cann, blacklist=()) is None

def test_cmake_build_plan_names_the_toolchain(tmp_path):
    env = fake_cann(tmp_path / "ascend")
    found, _ = cann.detect(env)
    kernel = generate(CHAIN, "autofuse_pointwise_0_Abs_Relu_Exp")
    files, commands, product = cann.build_plan(kernel, found, {cann.ARCH_ENV: "dav-2201"})
    assert product == "libautofuse_pointwise_0_abs_relu_exp.so"
    assert "find_package(ASC REQUIRED" in files["CMakeLists.txt"]
    assert "--npu-arch=dav-2201" in files["CMakeLists.txt"]
    assert "AUTOFUSE_SINGLE_KERNEL" in files["CMakeLists.txt"]
    assert commands[0][:3] == ["env", f"ASCEND_HOME_PATH={found.home}", found.cmake]


# ---- debug dump and the offline CLI ----------------------------------------------------------

def test_debug_dump_hook_writes_sources_tiling_commands_and_logs(tmp_path):
    env = {"AUTOFUSE_DFX_FLAGS": f"--codegen_compile_debug=true;--debug_dir={tmp_path}"}
    fusions = [("autofuse_pointwise_0_Abs_Relu_Exp", CHAIN.replace("[?]", "[64,100]")),
               ("autofuse_pointwise_1_FloorMod", "in0: f64[?]\nin1: f64[?]\n%0 = FloorMod in0, in1\nout0 = %0\n")]
    kernels = dump.dump_if_enabled(fusions, environ=env)
    assert [k.ok for k in kernels] == [True, False]
    out = tmp_path / "codegen/autofuse_pointwise_0_abs_relu_exp"
    for name in ("program.txt", "autofuse_pointwise_0_abs_relu_exp_kernel.cpp",
                 "autofuse_pointwise_0_abs_relu_exp_tiling.h", "autofuse_pointwise_0_abs_relu_exp_host.cpp",
                 "autofuse_pointwise_0_abs_relu_exp.asc", "CMakeLists.txt", "autofuse_launch.h",
                 "ub_plan.txt", "tiling.txt", "build_commands.txt", "twin_build.log"):
        assert (out / name).is_file(), name
    assert "total=6400 cores=40" in (out / "tiling.txt").read_text()
    assert "g++" in (out / "build_commands.txt").read_text()
    assert "cmake" in (out / "build_commands.txt").read_text()
    assert "f64" in (tmp_path / "codegen/autofuse_pointwise_1_floor_mod/refused.txt").read_text()
    assert dump.dump_if_enabled(fusions, environ={}) == []


def test_cli_generates_for_a_saved_graph(tmp_path):
    from google.protobuf import text_format
    from tensorflow.core.framework import graph_pb2

    g = graph_pb2.GraphDef()
    x = g.node.add(name="x", op="Placeholder")
    x.attr["dtype"].type = 1
    prev = "x"
    for op in ("Abs", "Relu", "Exp"):
        n = g.node.add(name=op.lower(), op=op, input=[prev])
        n.attr["T"].type = 1
        prev = n.name
    g.node.add(name="out", op="Identity", input=[prev]).attr["T"].type = 1
    path = tmp_path / "graph.pbtxt"
    path.write_text(text_format.MessageToString(g))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "tf_autofuse", "codegen", str(path), "-o",
                          str(tmp_path / "dump")], capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "generated" in out.stdout, out.stdout
    assert list((tmp_path / "dump/codegen").glob("*/*_kernel.cpp"))


# ---- broadcast inputs ---------------------------------------------------------------------------

BCAST = {
    "bias_f16": ("in0: f16[?,?]\nin1: f16[?]\n%0 = Abs in0\n%1 = Add %0, in1\n%2 = Relu %1\nout0 = %2\n",
                 ("full", "row"), lambda x, b: np.maximum(np.abs(x) + b, 0)),
    "rowmax_f32": ("in0: f32[?,?]\nin1: f32[?,1]\n%0 = Sub in0, in1\n%1 = Exp %0\nout0 = %1\n",
                   ("full", "col"), lambda x, m: np.exp(x - m)),
    "scalar_i32": ("in0: i32[?,?]\nin1: i32[]\nin2: i32[?]\n%0 = Mul in0, in1\n%1 = Add %0, in2\nout0 = %1\n",
                   ("full", "scalar", "row"), lambda x, s, r: x * s + r),
    "bf16_view": ("in0: bf16[4,?]\nin1: bf16[3] -> [1,3,1]\n%0 = Maximum in0, in1\nout0 = %0\n",
                  None, None),
}


@pytest.fixture(scope="module")
def bcast_kernels():
    kernels = {name: generate(text, name) for name, (text, _, _) in BCAST.items()}
    return kernels, twin.build([k for k in kernels.values() if k.ok])


def test_broadcast_patterns(bcast_kernels):
    kernels, _ = bcast_kernels
    for name, (_, patterns, _) in BCAST.items():
        if patterns is None:
            assert not kernels[name].ok
        else:
            assert kernels[name].ok, kernels[name].reason
            assert kernels[name].patterns == patterns and kernels[name].split == 1


@pytest.mark.parametrize("cores", [1, 8, 40])
@pytest.mark.parametrize("rows,cols", [(1, 1), (37, 10), (64, 192), (3, 30_001)])
def test_broadcast_matches_numpy(bcast_kernels, cores, rows, cols):
    kernels, lib = bcast_kernels
    rng = np.random.default_rng(rows * cols + cores)
    x16 = rng.uniform(-3, 3, (rows, cols)).astype(np.float16)
    b16 = rng.uniform(-1, 1, cols).astype(np.float16)
    (y,), t = lib.run("bias_f16", [x16, b16], cores)
    want = np.maximum(np.abs(x16.astype(np.float32)) + b16.astype(np.float32), 0).astype(np.float16)
    np.testing.assert_array_equal(y, want)
    assert t == tiling.compute_bcast(rows, cols, cores, kernels["bias_f16"].ub.max_tile)
    assert t.blockDim <= cores
    x = rng.uniform(-3, 3, (rows, cols)).astype(np.float32)
    m = x.max(axis=1, keepdims=True)
    (y,), _ = lib.run("rowmax_f32", [x, m], cores)
    np.testing.assert_allclose(y, np.exp(x - m), rtol=1e-6)
    xi = rng.integers(-100, 100, (rows, cols)).astype(np.int32)
    si = np.array(7, np.int32)
    ri = rng.integers(-100, 100, cols).astype(np.int32)
    (y,), _ = lib.run("scalar_i32", [xi, si, ri], cores)
    np.testing.assert_array_equal(y, xi * 7 + ri)


def test_broadcast_kernel_through_the_launcher():
    kernel = generate(BCAST["bias_f16"][0], "bias_launch")
    lib = twin.build([kernel], acl=True)
    x = np.random.default_rng(4).uniform(-3, 3, (50, 300)).astype(np.float16)
    b = np.linspace(-1, 1, 300).astype(np.float16)
    (y,), t = lib.launch(kernel.name, [x, b], core_num=8)
    np.testing.assert_array_equal(
        y, np.maximum(np.abs(x.astype(np.float32)) + b.astype(np.float32), 0).astype(np.float16))
    assert t.blockDim == 8 and t.outer == 50 and t.inner == 300
