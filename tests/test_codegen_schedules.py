"""Ascend C generation on the CPU twin, the schedules beyond flat and broadcast
(tf_autofuse/codegen, docs/ASCEND.md): reductions over the inner axes, arithmetic on reduced
values, several passes over a row, fold reductions, the column and 3-level schedules, the op
coverage extensions (bool values, Cast, FloorDiv, advanced math) across them, and a scan of
every generated kernel of both codegen test files for names the Ascend C dialect reserves.
Helpers and the first programs are test_codegen.py's."""

from __future__ import annotations

import re

import numpy as np
import pytest

from test_codegen import (BCAST, CHAIN, OP_CASES, as_float, check, from_bf16, generate_all, store,
                          to_bf16, unary_or_binary)
from tf_autofuse.codegen import generate, tiling, twin


# ---- reductions over the inner axes ----------------------------------------------------------

REDUCE = ("in0: f32[?,?]\nin1: f32[?]\n%0 = Mul in0, in1\n%1 = Sum %0 axes=[1]\n%2 = Max in0 axes=[1]\n"
          "%3 = Min %0 axes=[1]\n%4 = Mean in0 axes=[1]\nout0 = %1 -> [?]\nout1 = %2\nout2 = %3\n"
          "out3 = %4\nout4 = %0\n")
REDUCE_F16_3D = "in0: f16[?,?,?]\n%0 = Square in0\n%1 = Sum %0 axes=[1,2]\nout0 = %1\n"


@pytest.fixture(scope="module")
def reduce_kernels():
    kernels = [generate(REDUCE, "reduce_rows"), generate(REDUCE_F16_3D, "reduce_f16_3d")]
    for k in kernels:
        assert k.ok, k.reason
    return twin.build(kernels)


@pytest.mark.parametrize("cores", [1, 8, 40])
@pytest.mark.parametrize("rows,cols", [(1, 1), (37, 10), (5, 30_001), (64, 256)])
def test_reductions_match_numpy(reduce_kernels, cores, rows, cols):
    lib = reduce_kernels
    rng = np.random.default_rng(rows + cols + cores)
    x = rng.uniform(-2, 2, (rows, cols)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, cols).astype(np.float32)
    (s, mx, mn, mean, prod), t = lib.run("reduce_rows", [x, w], cores)
    xw = x.astype(np.float64) * w
    assert s.shape == (rows, 1) and prod.shape == (rows, cols)
    np.testing.assert_allclose(s[:, 0], xw.sum(1), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(mx[:, 0], x.max(1))
    np.testing.assert_array_equal(mn[:, 0], (x * w).min(1))
    np.testing.assert_allclose(mean[:, 0], x.astype(np.float64).mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(prod, x * w)
    per_block = -(-rows // min(cores, rows))  # whole rows, equal runs
    assert t.blockDim == -(-rows // per_block) <= cores and t.tilesPerBlock == per_block * t.tilesPerRow
    x3 = rng.uniform(-1, 1, (rows, 3, cols)).astype(np.float16)  # sums stay below f16 max
    (sq,), _ = lib.run("reduce_f16_3d", [x3], cores)
    want = (x3.astype(np.float32) ** 2).astype(np.float64).sum(axis=(1, 2))
    np.testing.assert_allclose(sq.reshape(-1).astype(np.float64), want, rtol=2e-3)


def test_reductions_reading_inputs_of_the_reduced_shape():
    # [N,1] inputs: broadcast over the row in full values, and a reduction of one is x * R (Sum)
    # or x (Max), as the CPU kernel computes it
    texts = {"col_full": "in0: f32[?,?]\nin1: f32[?,1]\n%0 = Mul in1, 2.0\n%1 = Sub in0, %0\n"
                         "%2 = Sum %1 axes=[1]\nout0 = %2\n",
             "of_reduced": "in0: f32[?,?]\nin1: f32[?,1]\n%0 = Sum in1 axes=[1]\n%1 = Max in1 axes=[1]\n"
                           "%2 = Min in0 axes=[1]\nout0 = %0\nout1 = %1\nout2 = %2\n"}
    kernels = list(generate_all(texts).values())
    assert kernels[1].out_reduced == (True, True, True)
    lib = twin.build(kernels)
    rng = np.random.default_rng(11)
    x = rng.uniform(-2, 2, (9, 700)).astype(np.float32)
    m = rng.uniform(-1, 1, (9, 1)).astype(np.float32)
    (s,), _ = lib.run("col_full", [x, m], 8)
    np.testing.assert_allclose(s, (x - 2 * m).astype(np.float64).sum(1, keepdims=True), rtol=1e-5, atol=1e-4)
    (s, mx, mn), _ = lib.run("of_reduced", [x, m], 8)
    np.testing.assert_allclose(s, m * 700, rtol=1e-5)
    np.testing.assert_array_equal(mx, m)
    np.testing.assert_array_equal(mn, x.min(1, keepdims=True))


REDUCED_ARITHMETIC = {
    "half_sum": "in0: f32[?,?]\n%0 = Sum in0 axes=[1]\n%1 = Mul %0, 0.5\nout0 = %1\n",
    "rms": "in0: f16[?,?]\n%0 = Square in0\n%1 = Mean %0 axes=[1]\n%2 = Add %1, 1e-05\n%3 = Rsqrt %2\n"
           "out0 = %3\nout1 = %1\n",
    "range": "in0: f32[?,?,?]\n%0 = Max in0 axes=[1,2]\n%1 = Min in0 axes=[1,2]\n%2 = Sub %0, %1\n"
             "%3 = LeakyRelu %2 alpha=0.5\nout0 = %3 -> [?]\n",
}


@pytest.fixture(scope="module")
def reduced_arithmetic():
    return twin.build(generate_all(REDUCED_ARITHMETIC).values())


@pytest.mark.parametrize("cores", [1, 8, 40])
@pytest.mark.parametrize("rows,cols", [(1, 1), (37, 10), (5, 30_001)])
def test_arithmetic_on_reduced_values_once_a_row(reduced_arithmetic, cores, rows, cols):
    lib = reduced_arithmetic
    rng = np.random.default_rng(rows * cols + cores)
    x = rng.uniform(-2, 2, (rows, cols)).astype(np.float32)
    (y,), _ = lib.run("half_sum", [x], cores)
    np.testing.assert_allclose(y[:, 0], x.astype(np.float64).sum(1) * 0.5, rtol=1e-5, atol=1e-4)
    h = rng.uniform(-2, 2, (rows, cols)).astype(np.float16)
    (r, m), _ = lib.run("rms", [h], cores)
    mean_sq = (h.astype(np.float32) ** 2).astype(np.float64).mean(1)
    np.testing.assert_allclose(m[:, 0].astype(np.float64), mean_sq, rtol=2e-3)
    np.testing.assert_allclose(r[:, 0].astype(np.float64), 1 / np.sqrt(mean_sq + 1e-5), rtol=2e-3)
    x3 = rng.uniform(-2, 2, (rows, 3, cols)).astype(np.float32)
    (g,), _ = lib.run("range", [x3], cores)
    np.testing.assert_array_equal(g.reshape(-1), x3.max((1, 2)) - x3.min((1, 2)))  # >= 0: LeakyRelu is x


def test_reduction_through_the_launcher():
    kernel = generate(REDUCE_F16_3D, "reduce_launch")
    lib = twin.build([kernel], acl=True)
    x = np.random.default_rng(8).uniform(-1, 1, (20, 4, 333)).astype(np.float16)
    (sq,), t = lib.launch(kernel.name, [x], core_num=8)
    want = (x.astype(np.float32) ** 2).astype(np.float64).sum(axis=(1, 2))
    np.testing.assert_allclose(sq.reshape(-1).astype(np.float64), want, rtol=2e-3)
    assert t.blockDim == 7 and t.outer == 20 and t.inner == 4 * 333  # 3 rows a block


def test_rounding_ops_on_edge_values():
    kernels = [generate(f"in0: f32[?]\n%0 = {op} in0\nout0 = %0\n", f"edge_{op}") for op in ("Floor", "Ceil", "Round")]
    lib = twin.build(kernels)
    x = np.array([2.5, -2.5, 0.5, -0.5, 1.5, -0.3, 0.3, -0.0, 3e9, -3e9, 1e30, 8388609.0, -8388609.5,
                  np.inf, -np.inf, np.nan] * 20, np.float32)
    for kernel, ref in zip(kernels, (np.floor, np.ceil, np.round)):
        (y,), _ = lib.run(kernel.name, [x], 8)
        np.testing.assert_array_equal(y, ref(x))
        np.testing.assert_array_equal(np.signbit(y), np.signbit(ref(x)))  # -0.0 stays -0.0


# ---- bool values, Cast, FloorDiv, advanced math (issue 6: op coverage) -------------------------

SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 0.5, -0.3, 1e-30, -1e-30, 3e9, -3e9, 1e30, -1e30,
                    65504.0, 65520.0, 70000.0, 3e38, -3e38, 1e-8, np.inf, -np.inf, np.nan, -np.nan])


def special(dtype: str, count: int, rng) -> np.ndarray:
    """`count` values mixing the special ones above with random ones, in the dtype's storage."""
    x = np.where(rng.random(count) < 0.6, rng.choice(SPECIAL, count), rng.uniform(-8, 8, count))
    with np.errstate(over="ignore"):
        return store(x, dtype)


def _floordiv_ref(x, y):
    with np.errstate(all="ignore"):
        return np.floor(x / y)


COVERAGE = {
    **{f"tests_{d}": f"in0: {d}[?]\n%0 = IsNan in0\n%1 = IsInf in0\n%2 = IsFinite in0\n"
                     "out0 = %0\nout1 = %1\nout2 = %2\n" for d in ("f32", "f16", "bf16")},
    **{f"cmp_{d}": f"in0: {d}[?]\nin1: {d}[?]\n%0 = Greater in0, in1\n%1 = GreaterEqual in0, in1\n"
                   "%2 = Less in0, in1\n%3 = LessEqual in0, in1\n%4 = Equal in0, in1\n%5 = NotEqual in0, in1\n"
                   "out0 = %0\nout1 = %1\nout2 = %2\nout3 = %3\nout4 = %4\nout5 = %5\n"
       for d in ("f32", "f16", "bf16")},
    "cmp_i32": "in0: i32[?]\nin1: i32[?]\n%0 = Equal in0, in1\n%1 = NotEqual in0, in1\n%2 = Equal in0, 7\n"
               "%3 = Greater in0, in1\n%4 = GreaterEqual in0, in1\n%5 = Less in0, in1\n%6 = LessEqual in0, in1\n"
               "out0 = %0\nout1 = %1\nout2 = %2\nout3 = %3\nout4 = %4\nout5 = %5\nout6 = %6\n",
    "select_f32": "in0: bool[?]\nin1: f32[?]\nin2: f32[?]\n%0 = Select in0, in1, in2\n"
                  "%1 = Select in0, in1, -0.0\n%2 = Select true, in2, in1\nout0 = %0\nout1 = %1\nout2 = %2\n",
    "select_i32": "in0: bool[?]\nin1: i32[?]\nin2: i32[?]\n%0 = Select in0, in1, in2\n"
                  "%1 = Select false, in1, in2\n%2 = Select in0, 2147483647, in2\nout0 = %0\nout1 = %1\nout2 = %2\n",
    "logic": "in0: bool[?]\nin1: bool[?]\n%0 = LogicalAnd in0, in1\n%1 = LogicalOr in0, in1\n"
             "%2 = LogicalNot %0\n%3 = ZerosLike in0\n%4 = OnesLike in1\n%5 = LogicalOr in0, true\n"
             "out0 = %0\nout1 = %1\nout2 = %2\nout3 = %3\nout4 = %4\nout5 = in0\nout6 = %5\n",
    # a mask computed and used in one kernel, f16 values: max without NaN propagation, and x > y
    "mixed": "in0: f16[?]\nin1: f16[?]\n%0 = Greater in0, in1\n%1 = Select %0, in0, in1\n"
             "%2 = IsNan in0\n%3 = LogicalAnd %0, %2\n%4 = ZerosLike in0\n%5 = OnesLike in1\n"
             "out0 = %1\nout1 = %0\nout2 = %3\nout3 = %4\nout4 = %5\n",
    "cast_f32_f16": "in0: f32[?]\n%0 = Cast in0 to=f16\nout0 = %0\n",
    "cast_f32_bf16": "in0: f32[?]\n%0 = Cast in0 to=bf16\nout0 = %0\n",
    "cast_f16_f32": "in0: f16[?]\n%0 = Cast in0 to=f32\nout0 = %0\n",
    "cast_bf16_f16": "in0: bf16[?]\n%0 = Cast in0 to=f16\nout0 = %0\n",
    "cast_f16_bf16": "in0: f16[?]\n%0 = Cast in0 to=bf16\nout0 = %0\n",
    # the intermediate rounding happens inside the kernel: f32 -> f16 -> f32 is not the identity
    "cast_roundtrip": "in0: f32[?]\n%0 = Cast in0 to=f16\n%1 = Cast %0 to=f32\n%2 = Cast %1 to=bf16\n"
                      "%3 = Cast %2 to=f32\nout0 = %1\nout1 = %3\n",
    **{f"floordiv_{d}": f"in0: {d}[?]\nin1: {d}[?]\n%0 = FloorDiv in0, in1\nout0 = %0\n"
       for d in ("f32", "f16", "bf16")},
    **{f"floormod_{d}": f"in0: {d}[?]\nin1: {d}[?]\n%0 = FloorMod in0, in1\nout0 = %0\n"
       for d in ("f32", "f16", "bf16")},
    "adv_chain": "in0: f32[?]\nin1: f32[?]\n%0 = Erf in0\n%1 = Sin %0\n%2 = Pow in1, %1\n%3 = Atan %2\n"
                 "%4 = Erfc in1\n%5 = Add %3, %4\nout0 = %5\n",
}


@pytest.fixture(scope="module")
def coverage():
    kernels = generate_all(COVERAGE, "cov_")
    return kernels, twin.build(kernels.values())


def _run(coverage, name, inputs, cores):
    kernels, lib = coverage
    outs, _ = lib.run(kernels[name].name, inputs, cores)
    return outs


COUNTS = [(1, 37), (8, 3 * 1280 + 37), (40, 40 * 128 * 3 + 5)]


@pytest.mark.parametrize("cores,count", COUNTS)
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_isnan_isinf_isfinite_on_special_values(coverage, dtype, cores, count):
    x = special(dtype, count, np.random.default_rng(cores))
    v = as_float(x, dtype)
    nan, inf, fin = _run(coverage, f"tests_{dtype}", [x], cores)
    assert nan.dtype == np.bool_
    np.testing.assert_array_equal(nan, np.isnan(v))
    np.testing.assert_array_equal(inf, np.isinf(v))
    np.testing.assert_array_equal(fin, np.isfinite(v))


@pytest.mark.parametrize("cores,count", COUNTS)
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "i32"])
def test_comparisons_on_special_values(coverage, dtype, cores, count):
    rng = np.random.default_rng(cores + 1)
    if dtype == "i32":
        x = rng.choice(np.array([0, 1, -1, 7, 2**31 - 1, -2**31, 2**24 + 1, 2**24], np.int64), count).astype(np.int32)
        y = np.where(rng.random(count) < 0.5, x, rng.integers(-2**31, 2**31 - 1, count)).astype(np.int32)
        y[:8] = x[:8] + np.int32(1)  # 2^24 + 1 vs 2^24: equal through fp32, not here
        eq, ne, eq7, gt, ge, lt, le = _run(coverage, "cmp_i32", [x, y], cores)
        np.testing.assert_array_equal(eq, x == y)
        np.testing.assert_array_equal(ne, x != y)
        np.testing.assert_array_equal(eq7, x == 7)
        for got, want in zip((gt, ge, lt, le), (x > y, x >= y, x < y, x <= y)):
            np.testing.assert_array_equal(got, want)  # exact at 2^24 + 1 vs 2^24 and at the extremes
        return
    x = special(dtype, count, rng)
    y = np.where(rng.random(count) < 0.4, x, special(dtype, count, rng))  # ties, -0.0 vs 0.0, NaN vs NaN
    a, b = as_float(x, dtype), as_float(y, dtype)
    outs = _run(coverage, f"cmp_{dtype}", [x, y], cores)
    with np.errstate(invalid="ignore"):
        for got, want in zip(outs, (a > b, a >= b, a < b, a <= b, a == b, a != b)):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("cores,count", COUNTS)
def test_select_float_and_int32(coverage, cores, count):
    rng = np.random.default_rng(cores + 2)
    c = rng.random(count) < 0.5
    x, y = special("f32", count, rng), special("f32", count, rng)
    s0, s1, s2 = _run(coverage, "select_f32", [c, x, y], cores)
    np.testing.assert_array_equal(s0, np.where(c, x, y))  # NaN and inf pass through untouched
    np.testing.assert_array_equal(s1, np.where(c, x, np.float32(-0.0)))
    assert np.signbit(s1[~c]).all()
    np.testing.assert_array_equal(s2, y)
    i = rng.integers(-2**31, 2**31 - 1, count).astype(np.int32)
    j = rng.integers(-2**31, 2**31 - 1, count).astype(np.int32)
    t0, t1, t2 = _run(coverage, "select_i32", [c, i, j], cores)
    np.testing.assert_array_equal(t0, np.where(c, i, j))
    np.testing.assert_array_equal(t1, j)
    np.testing.assert_array_equal(t2, np.where(c, np.int32(2**31 - 1), j))


@pytest.mark.parametrize("cores,count", COUNTS)
def test_logical_ops_fills_and_bool_passthrough(coverage, cores, count):
    rng = np.random.default_rng(cores + 3)
    a, b = rng.random(count) < 0.5, rng.random(count) < 0.5
    outs = _run(coverage, "logic", [a, b], cores)
    for got in outs:
        assert got.dtype == np.bool_ and got.view(np.uint8).max(initial=0) <= 1  # 0/1 bytes
    want = (a & b, a | b, ~(a & b), np.zeros(count, bool), np.ones(count, bool), a, np.ones(count, bool))
    for got, w in zip(outs, want):
        np.testing.assert_array_equal(got, w)


@pytest.mark.parametrize("cores,count", COUNTS)
def test_mask_and_values_in_one_kernel(coverage, cores, count):
    rng = np.random.default_rng(cores + 4)
    x, y = special("f16", count, rng), special("f16", count, rng)
    sel, gt, both, zeros, ones = _run(coverage, "mixed", [x, y], cores)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(sel, np.where(x > y, x, y))
        np.testing.assert_array_equal(gt, x > y)
    np.testing.assert_array_equal(both, (x > y) & np.isnan(x))  # always false
    np.testing.assert_array_equal(zeros, np.zeros(count, np.float16))
    np.testing.assert_array_equal(ones, np.ones(count, np.float16))


def _bits_equal(got, want):
    got, want = np.asarray(got), np.asarray(want)
    nan = np.isnan(want.astype(np.float64)) if want.dtype != np.uint16 else np.isnan(from_bf16(want))
    gnan = np.isnan(got.astype(np.float64)) if got.dtype != np.uint16 else np.isnan(from_bf16(got))
    np.testing.assert_array_equal(gnan, nan)
    np.testing.assert_array_equal(got[~nan], want[~nan])  # bit patterns: -0.0 stays -0.0


@pytest.mark.parametrize("cores,count", COUNTS)
def test_cast_between_float_dtypes(coverage, cores, count):
    rng = np.random.default_rng(cores + 5)
    x = special("f32", count, rng)
    x[:6] = [1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 65519.0, 2.0 ** -25]  # ties
    with np.errstate(over="ignore"):
        f16 = x.astype(np.float16)
    (got,) = _run(coverage, "cast_f32_f16", [x], cores)
    _bits_equal(got.view(np.uint16), f16.view(np.uint16))
    (got,) = _run(coverage, "cast_f32_bf16", [x], cores)
    _bits_equal(got, to_bf16(x))
    (got,) = _run(coverage, "cast_f16_f32", [f16], cores)
    _bits_equal(got.view(np.uint32), f16.astype(np.float32).view(np.uint32))
    b = to_bf16(x)
    with np.errstate(over="ignore"):
        want = from_bf16(b).astype(np.float16)
    (got,) = _run(coverage, "cast_bf16_f16", [b], cores)
    _bits_equal(got.view(np.uint16), want.view(np.uint16))
    (got,) = _run(coverage, "cast_f16_bf16", [f16], cores)
    _bits_equal(got, to_bf16(f16.astype(np.float32)))
    r16, rbf = _run(coverage, "cast_roundtrip", [x], cores)
    _bits_equal(r16.view(np.uint32), f16.astype(np.float32).view(np.uint32))
    _bits_equal(rbf.view(np.uint32), from_bf16(to_bf16(f16.astype(np.float32))).view(np.uint32))


@pytest.mark.parametrize("cores,count", COUNTS)
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_floordiv_on_special_values(coverage, dtype, cores, count):
    rng = np.random.default_rng(cores + 6)
    x, y = special(dtype, count, rng), special(dtype, count, rng)
    y[:4] = store(np.array([0.0, -0.0, 3.0, -3.0]), dtype)
    x[:4] = store(np.array([1.0, 1.0, -1.0, 1.0]), dtype)
    (got,) = _run(coverage, f"floordiv_{dtype}", [x, y], cores)
    want = _floordiv_ref(as_float(x, dtype).astype(np.float32), as_float(y, dtype).astype(np.float32))
    want = store(want.astype(np.float64), dtype)
    if dtype == "bf16":
        got, want = from_bf16(got), from_bf16(want)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))  # floor(-0.0 / 5) = -0.0


_F32_MAX, _F32_TINY = float(np.finfo(np.float32).max), 2.0 ** -149
# (x, y): signs of exact multiples, y = +-inf, y = +-0, x = inf/NaN, the longest fp32 division
# (FLT_MAX by the smallest subnormal), x - y rounding to y, subnormal operands and remainders
FLOORMOD_EDGES = [(5, 3), (-5, 3), (5, -3), (-5, -3), (-4, 2), (4, -2), (0.0, 3), (-0.0, 3), (0.0, -3),
                  (-0.0, -3), (1, np.inf), (-1, np.inf), (1, -np.inf), (-1, -np.inf), (0.0, np.inf),
                  (-0.0, -np.inf), (1, 0.0), (-1, -0.0), (0.0, 0.0), (np.inf, 3), (-np.inf, 3),
                  (np.inf, np.inf), (np.nan, 3), (3, np.nan), (np.nan, 0.0), (_F32_MAX, _F32_TINY),
                  (-_F32_MAX, _F32_TINY), (_F32_MAX, -3 * _F32_TINY), (-1e-30, 1e30), (1e-30, -1e30),
                  (_F32_TINY, 1e-30), (-_F32_TINY, 1e30), (3 * _F32_TINY, 2 * _F32_TINY),
                  (-7 * _F32_TINY, 2 * _F32_TINY), (2.0 ** 60 + 2.0 ** 37, 3.0), (-(2.0 ** 60), 3.0),
                  (65504.0, 2.0 ** -24), (-65504.0, 3 * 2.0 ** -24), (1.0, 2.0 ** -24), (-1.0, 2.0 ** -133),
                  # around 2^-126 (TF's CPU kernels flush fp32 subnormals: DAZ and FTZ)
                  (-1.5 * 2.0 ** -126, 2.0 ** -126), (1.5 * 2.0 ** -126, -(2.0 ** -126)), (-(2.0 ** -126), 3.0),
                  (-1.25 * 2.0 ** -126, 1.5 * 2.0 ** -126), (1.25 * 2.0 ** -126, -1.5 * 2.0 ** -126),
                  (-2.0 ** -100, 2.0 ** -126), (-3 * 2.0 ** -126, 2.0 ** -125 + 2.0 ** -148)]
_EXP_RANGE = {"f32": (-149, 128), "f16": (-24, 16), "bf16": (-133, 128)}


def _floormod_inputs(dtype, count, rng):
    """x, y (storage): a quarter each of special values, magnitudes over the whole exponent range
    (subnormals and infinities included), |x / y| up to 2^60, and tiny y; random signs; the edge
    pairs first, and random bit patterns on an eighth of the lanes."""
    lo, hi = _EXP_RANGE[dtype]
    sign = lambda: rng.choice([-1.0, 1.0], count)
    wide = lambda: sign() * 2.0 ** rng.uniform(lo, hi, count)
    y = np.select([rng.random(count) < p for p in (0.25, 0.5, 0.75)],
                  [rng.choice(SPECIAL, count), wide(), wide()],
                  sign() * 2.0 ** rng.uniform(lo, lo + 40, count))  # tiny y
    ratio = sign() * 2.0 ** rng.uniform(0, 60, count) * rng.uniform(1, 2, count)
    x = np.where(rng.random(count) < 0.5, y * ratio, np.where(rng.random(count) < 0.5, wide(),
                                                              rng.choice(SPECIAL, count)))
    x[np.isnan(x)] = 1.5  # NaN * ratio and inf * ratio come from SPECIAL; keep some finite lanes
    edges = np.array(FLOORMOD_EDGES, np.float64)
    k = min(len(edges), count)
    x[:k], y[:k] = edges[:k, 0], edges[:k, 1]
    with np.errstate(over="ignore", invalid="ignore"):
        x, y = store(x, dtype), store(y, dtype)
    bits = np.uint32 if dtype == "f32" else np.uint16  # and an eighth of random bit patterns
    for v in (x, y):
        pick = np.flatnonzero(rng.random(count) < 0.125)
        pick = pick[pick >= k]
        v.view(bits)[pick] = rng.integers(0, np.iinfo(bits).max, pick.size, dtype=np.uint64).astype(bits)
    return x, y


def _tf_floormod(x, y, dtype):
    import tensorflow as tf
    if dtype == "bf16":  # bf16 storage is uint16 bits
        a, b = (tf.bitcast(tf.constant(v), tf.bfloat16) for v in (x, y))
        return tf.bitcast(tf.math.floormod(a, b), tf.uint16).numpy()
    return tf.math.floormod(x, y).numpy()


@pytest.mark.parametrize("cores,count", COUNTS)
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_floormod_matches_tensorflow_bit_for_bit(coverage, dtype, cores, count):
    x, y = _floormod_inputs(dtype, count, np.random.default_rng(cores + 8))
    (got,) = _run(coverage, f"floormod_{dtype}", [x, y], cores)
    want = _tf_floormod(x, y, dtype)
    assert got.dtype == want.dtype
    with np.errstate(invalid="ignore"):  # signalling NaNs among the random bit patterns
        g, w = as_float(got, dtype), as_float(want, dtype)
        a, b = as_float(x, dtype), as_float(y, dtype)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w))  # NaN payloads are not compared
    bits = np.uint32 if dtype == "f32" else np.uint16
    finite = ~np.isnan(w)
    bad = np.flatnonzero(got.view(bits)[finite] != want.view(bits)[finite])
    assert not bad.size, (f"{bad.size} differ: x={a[finite][bad[:4]]} y={b[finite][bad[:4]]} "
                          f"got={g[finite][bad[:4]]} want={w[finite][bad[:4]]}")
    if dtype == "f32":  # the inputs reach the edges they are meant to
        with np.errstate(all="ignore"):
            q = np.abs(a / b)
        assert (q[np.isfinite(q)] >= 2.0 ** 59).any() and (np.abs(b) < 2.0 ** -126).any()
        assert (w == 0).any() and (np.signbit(w) & (w == 0)).any() and np.isinf(w).any()


def test_floormod_bounds_its_loop_by_the_tile():
    kernel = generate("in0: f32[?]\nin1: f32[?]\n%0 = FloorMod in0, in1\nout0 = %0\n", "fm_src")
    assert kernel.ok, kernel.reason
    src = kernel.sources[f"{kernel.name}_kernel.cpp"]
    assert "ReduceMax(" in src and "WaitFlag<HardEvent::V_S>(EVENT_ID0);" in src
    assert "fmSteps < 278" in src and "CMPMODE::GE" in src


@pytest.mark.parametrize("cores,count", COUNTS)
def test_advanced_math_chain(coverage, cores, count):
    rng = np.random.default_rng(cores + 7)
    x = rng.uniform(-3, 3, count).astype(np.float32)
    y = rng.uniform(0.1, 3, count).astype(np.float32)
    (got,) = _run(coverage, "adv_chain", [x, y], cores)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    erf = np.vectorize(__import__("math").erf)
    erfc = np.vectorize(__import__("math").erfc)
    want = np.arctan(y64 ** np.sin(erf(x64))) + erfc(y64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_advanced_math_reserves_its_shared_temp_buffer_in_the_ub_plan():
    plain = generate("in0: f32[?]\n%0 = Abs in0\nout0 = %0\n", "plain_abs")
    kernels = {op: generate(f"in0: f32[?]\n%0 = {op} in0\nout0 = %0\n", f"adv_{op}")
               for op in ("Erf", "Erfc", "Sin", "Cos", "Tan", "Atan")}
    nodes = {"Erf": 3, "Erfc": 7, "Sin": 3, "Cos": 3, "Tan": 4, "Atan": 5}
    for op, k in kernels.items():
        assert k.ok, k.reason
        assert ("sharedTmp (advanced math)", 4 * nodes[op], 1) in k.ub.buffers
        assert k.ub.max_tile < plain.ub.max_tile
        src = k.sources[f"{k.name}_kernel.cpp"]
        assert f"pipe.InitBuffer(sharedTmpBuf, t.tileLength * {4 * nodes[op]} + 0);" in src
        assert f"{op}(y0, x0, sharedTmp, cn);" in src
    pw = generate("in0: f32[?]\nin1: f32[?]\n%0 = Pow in0, in1\nout0 = %0\n", "adv_pow")
    assert pw.ub.fixed == 256 and ("sharedTmp (advanced math)", 16, 1) in pw.ub.buffers
    # two advanced ops share one buffer, sized for the larger
    both = generate("in0: f32[?]\n%0 = Erf in0\n%1 = Erfc %0\nout0 = %1\n", "adv_both")
    assert [b for b in both.ub.buffers if b[0].startswith("sharedTmp")] == [("sharedTmp (advanced math)", 28, 1)]


def _mutated(text, name, old, new):
    kernel = generate(text, name)
    src = kernel.sources[f"{name}_kernel.cpp"]
    assert old in src, old
    kernel.sources[f"{name}_kernel.cpp"] = src.replace(old, new)
    return kernel


def test_twin_enforces_the_rules_the_new_ops_rely_on():
    kernels = [
        _mutated("in0: f32[?]\n%0 = Erf in0\nout0 = %0\n", "mut_tmp", "t.tileLength * 12 + 0", "t.tileLength * 4 + 0"),
        _mutated("in0: f32[?]\nin1: f32[?]\n%0 = Greater in0, in1\nout0 = %0\n", "mut_cmp",
                 "CMPMODE::GT, cn)", "CMPMODE::GT, n)"),
        _mutated("in0: i32[?]\nin1: i32[?]\n%0 = Equal in0, in1\nout0 = %0\n", "mut_i32", "CMPMODE::EQ", "CMPMODE::GT"),
    ]
    lib = twin.build(kernels)
    x = np.ones(1000, np.float32)
    with pytest.raises(twin.TwinError, match="sharedTmpBuffer of"):
        lib.run("mut_tmp", [x], 1)
    with pytest.raises(twin.TwinError, match="multiple of 256 bytes"):
        lib.run("mut_cmp", [x, x], 1)  # a 1000-element tile: 4000 bytes
    with pytest.raises(twin.TwinError, match="CMPMODE::EQ only"):
        lib.run("mut_i32", [np.ones(1000, np.int32)] * 2, 1)


def test_bool_values_in_broadcast_and_reduce_schedules():
    progs = {
        # a [N,1] condition, a bias row, a bool output of the broadcast schedule
        "bsel": "in0: bool[?,1]\nin1: f32[?,?]\nin2: f32[?]\n%0 = Select in0, in1, in2\n"
                "%1 = Greater in1, in2\n%2 = LogicalAnd %1, in0\nout0 = %0\nout1 = %2\n",
        # full bool and advanced-math outputs alongside a reduction
        "red": "in0: f16[?,?]\n%0 = Sum in0 axes=[1]\n%1 = Greater in0, 0.0\n%2 = Erf in0\n"
               "out0 = %0\nout1 = %1\nout2 = %2\n",
        # a scalar bool condition read from GM, passed through
        "bscalar": "in0: bool[]\nin1: i32[?,?]\n%0 = Select in0, in1, 5\nout0 = %0\nout1 = in0\n",
    }
    kernels = {n: generate(t, f"bc_{n}") for n, t in progs.items()}
    for n, k in kernels.items():
        assert k.ok, (n, k.reason)
    lib = twin.build(kernels.values())
    rng = np.random.default_rng(11)
    for cores in (1, 8, 40):
        for rows, cols in ((3, 5), (37, 1000), (5, 20000)):
            c = rng.random((rows, 1)) < 0.5
            a = rng.normal(size=(rows, cols)).astype(np.float32)
            b = rng.normal(size=cols).astype(np.float32)
            (y0, y1), _ = lib.run("bc_bsel", [c, a, b], cores)
            np.testing.assert_array_equal(y0, np.where(c, a, b))
            np.testing.assert_array_equal(y1, (a > b) & c)
            x = rng.normal(size=(rows, cols)).astype(np.float16)
            (s, g, e), _ = lib.run("bc_red", [x], cores)
            np.testing.assert_array_equal(g, x > 0)
            np.testing.assert_allclose(s.reshape(-1).astype(np.float64), x.astype(np.float64).sum(1),
                                       rtol=2e-3, atol=2e-2)
            check(e, np.vectorize(__import__("math").erf)(x.astype(np.float64)), "f16", "Erf in reduce")
            i = rng.integers(-9, 9, (rows, cols)).astype(np.int32)
            for cv in (True, False):
                (o, p), _ = lib.run("bc_bscalar", [np.array(cv), i], cores)
                np.testing.assert_array_equal(o, i if cv else np.full_like(i, 5))
                assert p.dtype == np.bool_
                np.testing.assert_array_equal(p, np.broadcast_to(np.array(cv), p.shape))


# ---- several passes over a row: full values reading reduced values (softmax, layer norm) -------

SOFTMAX = ("in0: {d}[?,?]\n%0 = Max in0 axes=[1]\n%1 = Sub in0, %0\n%2 = Exp %1\n%3 = Sum %2 axes=[1]\n"
           "%4 = Div %2, %3\nout0 = %4\n")
MULTIPASS = {
    **{f"softmax_{d}": SOFTMAX.format(d=d) for d in ("f32", "f16", "bf16")},
    # mean, variance (a reduction of a value reading the mean: pass 1), scale and shift (pass 2)
    "layer_norm": ("in0: {d}[?,?]\nin1: {d}[?]\nin2: {d}[?]\n%0 = Mean in0 axes=[1]\n%1 = Sub in0, %0\n"
                   "%2 = Square %1\n%3 = Mean %2 axes=[1]\n%4 = Add %3, 1e-05\n%5 = Rsqrt %4\n"
                   "%6 = Mul %1, %5\n%7 = Mul %6, in1\n%8 = Add %7, in2\nout0 = %8\nout1 = %0 -> [?]\n"
                   "out2 = %3\n").format(d="f32"),
    "layer_norm_f16": ("in0: f16[?,?]\nin1: f16[?]\nin2: f16[?]\n%0 = Mean in0 axes=[1]\n%1 = Sub in0, %0\n"
                       "%2 = Square %1\n%3 = Mean %2 axes=[1]\n%4 = Add %3, 1e-05\n%5 = Rsqrt %4\n"
                       "%6 = Mul %1, %5\n%7 = Mul %6, in1\n%8 = Add %7, in2\nout0 = %8\n"),
    # 3-D, two reduced axes; a full output of pass 0 next to the last pass's
    "log_softmax_3d": ("in0: bf16[?,?,?]\n%0 = Max in0 axes=[1,2]\n%1 = Sub in0, %0\n%2 = Exp %1\n"
                       "%3 = Sum %2 axes=[1,2]\n%4 = Log %3\n%5 = Sub %1, %4\n%6 = Abs in0\nout0 = %5\n"
                       "out1 = %6\n"),
    # a [N,1] input next to the broadcast reduced value
    "center_scale": ("in0: f32[?,?]\nin1: f32[?,1]\n%0 = Mean in0 axes=[1]\n%1 = Sub in0, %0\n"
                     "%2 = Mul %1, in1\nout0 = %2\n"),
}


def rounded(x, dtype):
    """x rounded to the dtype, as float64."""
    return as_float(store(np.asarray(x, np.float64), dtype), dtype)


def softmax64(x, axes=(1,)):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axes, keepdims=True))
    return e / e.sum(axis=axes, keepdims=True)


def layer_norm64(x, g, b):
    x, g, b = (a.astype(np.float64) for a in (x, g, b))
    mean = x.mean(1, keepdims=True)
    var = ((x - mean) ** 2).mean(1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * g + b, mean, var


@pytest.fixture(scope="module")
def multipass():
    kernels = generate_all(MULTIPASS)
    return kernels, twin.build(kernels.values())


def test_multipass_plans():
    kernels = generate_all(MULTIPASS)
    assert {n: k.passes for n, k in kernels.items()} == {
        "softmax_f32": 3, "softmax_f16": 3, "softmax_bf16": 3, "layer_norm": 3, "layer_norm_f16": 3,
        "log_softmax_3d": 3, "center_scale": 2}
    assert kernels["layer_norm"].out_reduced == (False, True, True)
    src = kernels["softmax_f32"].sources["softmax_f32_kernel.cpp"]
    assert "3 passes over each row" in src and "WaitFlag<HardEvent::V_S>" in src
    assert "if (tilesPerRow == 1)" in src  # a row of one tile stays resident in UB
    # single-pass reductions keep the one-pass schedule
    assert generate(REDUCE, "one_pass").passes == 1


@pytest.mark.parametrize("cores", [1, 8, 40])
@pytest.mark.parametrize("rows,cols", [(1, 1), (37, 10), (5, 30_001), (64, 256)])
def test_multipass_matches_numpy(multipass, cores, rows, cols):
    kernels, lib = multipass
    rng = np.random.default_rng(rows * 7 + cols + cores)
    x = rng.uniform(-4, 4, (rows, cols)).astype(np.float32)
    (y,), t = lib.run("softmax_f32", [x], cores)
    np.testing.assert_allclose(y, softmax64(x), rtol=2e-5, atol=1e-9)
    assert t.blockDim <= cores
    for d, tol in (("f16", 2e-3), ("bf16", 1.6e-2)):
        xh = rounded(x, d)
        (y,), _ = lib.run(f"softmax_{d}", [store(xh, d)], cores)
        np.testing.assert_allclose(as_float(y, d), softmax64(xh), rtol=tol, atol=tol * 1e-3)
    g = rng.uniform(0.5, 1.5, cols).astype(np.float32)
    b = rng.uniform(-1, 1, cols).astype(np.float32)
    (y, m, v), _ = lib.run("layer_norm", [x, g, b], cores)
    want, mean, var = layer_norm64(x, g, b)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(m.reshape(-1), mean.reshape(-1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(v, var, rtol=1e-4, atol=1e-5)
    xh, gh, bh = (rounded(a, "f16") for a in (x, g, b))
    (y,), _ = lib.run("layer_norm_f16", [store(xh, "f16"), store(gh, "f16"), store(bh, "f16")], cores)
    np.testing.assert_allclose(as_float(y, "f16"), layer_norm64(xh, gh, bh)[0], rtol=4e-3, atol=4e-3)
    s = rng.uniform(-2, 2, (rows, 1)).astype(np.float32)
    (y,), _ = lib.run("center_scale", [x, s], cores)
    np.testing.assert_allclose(y, (x - x.astype(np.float64).mean(1, keepdims=True)) * s, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cores", [1, 8, 40])
@pytest.mark.parametrize("rows,cols", [(1, 1), (13, 50), (3, 9000)])
def test_multipass_3d_with_a_pass0_output(multipass, cores, rows, cols):
    _, lib = multipass
    rng = np.random.default_rng(rows + cols * 3 + cores)
    x = rounded(rng.uniform(-3, 3, (rows, 2, cols)), "bf16")
    (y, a), _ = lib.run("log_softmax_3d", [store(x, "bf16")], cores)
    x64 = x.astype(np.float64)
    z = x64 - x64.max(axis=(1, 2), keepdims=True)
    want = z - np.log(np.exp(z).sum(axis=(1, 2), keepdims=True))
    np.testing.assert_allclose(as_float(y, "bf16"), want, rtol=1.6e-2, atol=3e-2)
    np.testing.assert_array_equal(as_float(a, "bf16"), np.abs(x))


def test_multipass_rows_that_just_fit_and_just_do_not_fit_in_ub(multipass):
    """A row of max_tile elements is one tile (read once, resident in UB over the three passes);
    one more element makes two tiles (every pass re-reads the row from GM)."""
    kernels, lib = multipass
    tile = kernels["softmax_f32"].ub.max_tile
    assert kernels["softmax_f32"].ub.ub_bytes(tile) <= tiling.UB_BUDGET
    rng = np.random.default_rng(21)
    for cols, per_row in ((tile, 1), (tile + 1, 2)):
        x = rng.uniform(-4, 4, (3, cols)).astype(np.float32)
        (y,), t = lib.run("softmax_f32", [x], 8)
        assert t.tilesPerRow == per_row and t.tileLength == tile
        np.testing.assert_allclose(y, softmax64(x), rtol=2e-5, atol=1e-9)
    with pytest.raises(twin.TwinError, match="UB overflow"):  # the tile is the UB's limit
        lib.run("softmax_f32", [x], 8, tile_override=tile + tiling.ALIGN_ELEMS)
    # a smaller forced tile: the same numbers through the re-reading path
    (y, _, _), t = lib.run("layer_norm", [x, np.ones(x.shape[1], np.float32), np.zeros(x.shape[1], np.float32)],
                      8, tile_override=1024)
    assert t.tilesPerRow == -(-x.shape[1] // 1024)
    np.testing.assert_allclose(y, layer_norm64(x, np.ones(x.shape[1]), np.zeros(x.shape[1]))[0],
                               rtol=1e-4, atol=1e-4)


def test_twin_catches_a_scalar_read_without_v_s_sync():
    kernel = generate(MULTIPASS["softmax_f32"], "mut_vs")
    name = "mut_vs_kernel.cpp"
    assert "    WaitFlag<HardEvent::V_S>(EVENT_ID0);\n" in kernel.sources[name]
    kernel.sources[name] = kernel.sources[name].replace("    WaitFlag<HardEvent::V_S>(EVENT_ID0);\n", "")
    lib = twin.build([kernel])
    with pytest.raises(twin.TwinError, match="GetValue.*V_S"):
        lib.run("mut_vs", [np.ones((2, 300), np.float32)], 1)


def test_softmax_and_norm_from_the_rewriter():
    """The programs the reduce pass makes of a TF softmax and a layer norm (no gamma/beta): all
    generated; the softmax kernel's numbers against unfused TensorFlow."""
    import tensorflow as tf
    import tf_autofuse

    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 100], name="x")
        e = tf.exp(x - tf.reduce_max(x, axis=1, keepdims=True))
        tf.identity(e / tf.reduce_sum(e, axis=1, keepdims=True), name="softmax")
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        tf.identity((x - mean) * tf.math.rsqrt(variance + 1e-3), name="norm")
    fused = tf_autofuse.fuse(graph, outputs=["softmax", "norm"], passes=["pointwise", "reduce"])
    kernels = generate_all({f.name: f.program for f in fused.fusions})
    (softmax,) = [k for n, k in kernels.items() if "Max_Sub_Exp_Sum" in n]
    assert softmax.passes == 3
    assert any(k.passes == 2 for k in kernels.values())  # the norm's mean, read back by x - mean
    lib = twin.build([softmax])
    x = np.random.default_rng(5).uniform(-10, 10, (64, 100)).astype(np.float32)
    (y,), _ = lib.run(softmax.name, [x], 8)
    want = fused.run(["softmax"], {"x": x}, original=True)[0]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(y, softmax64(x), rtol=2e-5, atol=1e-9)


# ---- fold reductions: Prod, and Sum/Mean/Max/Min of i32 (no vector reduce API for them) ----------

FOLDS = {
    "fold_i32": ("in0: i32[?,?]\n%0 = Sum in0 axes=[1]\n%1 = Max in0 axes=[1]\n%2 = Min in0 axes=[1]\n"
                 "%3 = Mean in0 axes=[1]\n%4 = Sub in0, %1\nout0 = %0 -> [?]\nout1 = %1\nout2 = %2\n"
                 "out3 = %3\nout4 = %4\n"),
    **{f"prod_{d}": (f"in0: {d}[?,?]\n%0 = Prod in0 axes=[1]\n%1 = Mul %0, 2.0\n%2 = Div in0, %0\n"
                     "out0 = %0\nout1 = %1\nout2 = %2\n") for d in ("f32", "f16", "bf16")},
    "prod_3d": "in0: f32[?,?,?]\n%0 = Abs in0\n%1 = Prod %0 axes=[1,2]\n%2 = Sum in0 axes=[1,2]\nout0 = %1\nout1 = %2\n",
}


@pytest.fixture(scope="module")
def folds():
    kernels = generate_all(FOLDS)
    assert kernels["fold_i32"].passes == 2 and kernels["prod_f32"].passes == 2 and kernels["prod_3d"].passes == 1
    return kernels, twin.build(kernels.values())


@pytest.mark.parametrize("cores", [1, 8, 40])
@pytest.mark.parametrize("rows,cols", [(1, 1), (37, 10), (5, 30_001), (64, 256)])
def test_fold_reductions_match_numpy(folds, cores, rows, cols):
    kernels, lib = folds
    rng = np.random.default_rng(rows * 3 + cols + cores)
    x = rng.integers(-1000, 1000, (rows, cols)).astype(np.int32)
    (s, mx, mn, mean, d), t = lib.run("fold_i32", [x], cores)
    assert t.blockDim <= cores
    np.testing.assert_array_equal(s.reshape(-1), x.sum(1))
    np.testing.assert_array_equal(mx, x.max(1, keepdims=True))
    np.testing.assert_array_equal(mn, x.min(1, keepdims=True))
    np.testing.assert_array_equal(mean, np.trunc(x.sum(1, keepdims=True) / cols).astype(np.int32))
    np.testing.assert_array_equal(d, x - x.max(1, keepdims=True))
    big = rng.integers(-2**30, 2**30, (rows, cols)).astype(np.int32)  # sums wrap, as TensorFlow's do
    (s, _, _, _, _), _ = lib.run("fold_i32", [big], cores)
    np.testing.assert_array_equal(s.reshape(-1), big.sum(1, dtype=np.int32))
    # products of values near 1 (and some negative) stay in range over 30001 factors
    sign = np.where(rng.uniform(size=(rows, cols)) < 0.01, -1.0, 1.0)
    f = sign * rng.uniform(0.995, 1.005, (rows, cols))
    for dtype, tol in (("f32", 2e-4), ("f16", 2e-2), ("bf16", 8e-2)):
        xs = rounded(f, dtype)
        (p, p2, q), _ = lib.run(f"prod_{dtype}", [store(xs, dtype)], cores)
        want = xs.prod(1, keepdims=True)
        np.testing.assert_allclose(as_float(p, dtype), want, rtol=tol)
        np.testing.assert_allclose(as_float(p2, dtype), 2 * want, rtol=tol)
        np.testing.assert_allclose(as_float(q, dtype), xs / want, rtol=tol)
    x3 = rng.uniform(0.99, 1.01, (rows, 2, cols)).astype(np.float32)
    (p, s), _ = lib.run("prod_3d", [x3], cores)
    np.testing.assert_allclose(p.reshape(-1), x3.astype(np.float64).prod((1, 2)), rtol=2e-4)
    np.testing.assert_allclose(s.reshape(-1), x3.astype(np.float64).sum((1, 2)), rtol=1e-5)


def test_fold_rows_just_fit_and_forced_tiles(folds):
    kernels, lib = folds
    tile = kernels["fold_i32"].ub.max_tile
    rng = np.random.default_rng(2)
    for cols, override in ((tile, 0), (tile + 1, 0), (3000, 128), (3000, 640)):  # 640: not a power of 2
        x = rng.integers(-1000, 1000, (3, cols)).astype(np.int32)
        (s, mx, mn, _, _), t = lib.run("fold_i32", [x], 8, override)
        assert t.tilesPerRow == -(-cols // (override or tile))
        np.testing.assert_array_equal(s.reshape(-1), x.sum(1))
        np.testing.assert_array_equal(mx.reshape(-1), x.max(1))
        np.testing.assert_array_equal(mn.reshape(-1), x.min(1))


def test_twin_catches_a_vector_read_of_a_scalar_write_without_s_v_sync():
    kernel = generate(FOLDS["prod_f32"], "mut_sv")
    name = "mut_sv_kernel.cpp"
    line = "      WaitFlag<HardEvent::S_V>(EVENT_ID0);\n"
    assert line in kernel.sources[name]
    kernel.sources[name] = kernel.sources[name].replace(line, "")
    lib = twin.build([kernel])
    with pytest.raises(twin.TwinError, match="SetValue without"):
        lib.run("mut_sv", [np.ones((2, 300), np.float32)], 1)


# ---- reductions over non-trailing axes: the column schedule ------------------------------------

COLUMNS = {
    "col_2d": ("in0: f32[?,?]\n%0 = Abs in0\n%1 = Sum %0 axes=[0]\n%2 = Max in0 axes=[0]\n%3 = Mean in0 axes=[0]\n"
               "%4 = Prod in0 axes=[0]\nout0 = %1\nout1 = %2 -> [?]\nout2 = %3\nout3 = %4\nout4 = %0\n"),
    "col_f16_mid": "in0: f16[?,?,?]\n%0 = Sum in0 axes=[1]\n%1 = Min in0 axes=[1]\nout0 = %0\nout1 = %1\n",
    "col_bf16": "in0: bf16[?,?]\n%0 = Square in0\n%1 = Mean %0 axes=[0]\nout0 = %1\n",
    "col_i32_4d": "in0: i32[?,?,?,?]\n%0 = Sum in0 axes=[1,2]\n%1 = Max in0 axes=[1,2]\n%2 = Min in0 axes=[1,2]\n"
                  "out0 = %0\nout1 = %1\nout2 = %2\n",
}


@pytest.fixture(scope="module")
def columns():
    kernels = generate_all(COLUMNS)
    assert kernels["col_2d"].split == 0 and kernels["col_2d"].split2 == 1
    assert kernels["col_i32_4d"].split == 1 and kernels["col_i32_4d"].split2 == 3
    return kernels, twin.build(kernels.values())


@pytest.mark.parametrize("cores", [1, 8, 40])
@pytest.mark.parametrize("rows,cols", [(1, 1), (37, 10), (5, 30_001), (300, 256)])
def test_column_reductions_match_numpy(columns, cores, rows, cols):
    kernels, lib = columns
    rng = np.random.default_rng(rows + cols * 5 + cores)
    x = rng.uniform(0.99, 1.01, (rows, cols)) * np.where(rng.uniform(size=(rows, cols)) < 0.5, -1, 1)
    x = x.astype(np.float32)
    (s, mx, mean, prod, a), t = lib.run("col_2d", [x], cores)
    x64 = x.astype(np.float64)
    assert s.shape == (1, cols) and a.shape == (rows, cols)
    assert t == tiling.compute_column(1, rows, cols, cores, kernels["col_2d"].ub.max_tile)
    assert t.blockDim <= cores and t.blockDim == -(-t.totalTiles // t.tilesPerBlock)
    np.testing.assert_allclose(s, np.abs(x64).sum(0, keepdims=True), rtol=1e-5)
    np.testing.assert_array_equal(mx.reshape(-1), x.max(0))
    np.testing.assert_allclose(mean, x64.mean(0, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(prod, x64.prod(0, keepdims=True), rtol=1e-4)
    np.testing.assert_array_equal(a, np.abs(x))
    h = rng.uniform(-1, 1, (3, rows, cols)).astype(np.float16)
    (s, mn), _ = lib.run("col_f16_mid", [h], cores)
    assert s.shape == (3, 1, cols)
    np.testing.assert_allclose(s.astype(np.float64), h.astype(np.float64).sum(1, keepdims=True),
                               rtol=2e-3, atol=2e-3 * max(1, rows) ** 0.5)
    np.testing.assert_array_equal(mn, h.min(1, keepdims=True))
    b = rounded(rng.uniform(-2, 2, (rows, cols)), "bf16")
    (m,), _ = lib.run("col_bf16", [store(b, "bf16")], cores)
    want = (b.astype(np.float32) ** 2).astype(np.float64).mean(0, keepdims=True)
    np.testing.assert_allclose(as_float(m, "bf16"), want, rtol=1e-2)
    xi = rng.integers(-2**30, 2**30, (2, rows, 3, cols)).astype(np.int32)  # sums wrap
    (s, mx, mn), _ = lib.run("col_i32_4d", [xi], cores)
    np.testing.assert_array_equal(s, xi.sum((1, 2), keepdims=True, dtype=np.int32))
    np.testing.assert_array_equal(mx, xi.max((1, 2), keepdims=True))
    np.testing.assert_array_equal(mn, xi.min((1, 2), keepdims=True))


def test_column_tiles_that_just_fit_and_forced_tiles(columns):
    kernels, lib = columns
    tile = kernels["col_2d"].ub.max_tile
    assert kernels["col_2d"].ub.ub_bytes(tile) <= tiling.UB_BUDGET
    rng = np.random.default_rng(9)
    for cols, override, per_row in ((tile, 0, 1), (tile + 1, 0, 2), (1000, 128, 8)):
        x = rng.uniform(-1, 1, (4, cols)).astype(np.float32)
        (s, mx, _, _, _), t = lib.run("col_2d", [x], 1, override)
        assert t.tilesPerRow == per_row
        np.testing.assert_allclose(s, np.abs(x.astype(np.float64)).sum(0, keepdims=True), rtol=1e-5)
        np.testing.assert_array_equal(mx.reshape(-1), x.max(0))
    with pytest.raises(twin.TwinError, match="UB overflow"):
        lib.run("col_2d", [np.ones((2, 2 * tile), np.float32)], 1, tile_override=tile + tiling.ALIGN_ELEMS)


def test_column_reduction_through_the_launcher():
    kernel = generate(COLUMNS["col_i32_4d"], "col_launch")
    lib = twin.build([kernel], acl=True)
    x = np.random.default_rng(3).integers(-50, 50, (3, 7, 5, 333)).astype(np.int32)
    (s, mx, mn), t = lib.launch(kernel.name, [x], core_num=8)
    np.testing.assert_array_equal(s, x.sum((1, 2), keepdims=True))
    np.testing.assert_array_equal(mx, x.max((1, 2), keepdims=True))
    np.testing.assert_array_equal(mn, x.min((1, 2), keepdims=True))
    assert (t.outer, t.mid, t.inner) == (3, 35, 333)
    assert t == tiling.compute_column(3, 35, 333, 8, kernel.ub.max_tile)  # the C++ tiling = its mirror
    assert (t.tilesPerRow, t.blockDim) == (3, 5)  # 3 chunks of 128 a row; 9 items, 2 a block


# ---- broadcasts that need a 3-level [outer, mid, inner] cut ------------------------------------

BCAST3 = {
    "b3_mid": ("in0: f32[?,1,?]\nin1: f32[?,?,?]\n%0 = Add in0, in1\n%1 = Exp %0\nout0 = %1\n", ("fbf", "fff")),
    "b3_f16": ("in0: f16[1,?,1]\nin1: f16[?,?,?]\n%0 = Mul in0, in1\n%1 = Abs %0\nout0 = %1\n", ("bfb", "fff")),
    "b3_bf16": ("in0: bf16[?,?,?]\nin1: bf16[?,1,?]\n%0 = Sub in0, in1\nout0 = %0\n", ("fff", "fbf")),
    "b3_i32": ("in0: i32[?,1,?]\nin1: i32[1,?,1]\nin2: i32[?,?,?]\n%0 = Add in0, in1\n%1 = Mul %0, in2\n"
               "out0 = %1\n", ("fbf", "bfb", "fff")),
    "b3_nchw": ("in0: f32[?,16,32,32]\nin1: f32[16] -> [16,1,1]\n%0 = Add in0, in1\n%1 = Relu6 %0\nout0 = %1\n",
                ("fff", "bfb")),
}


@pytest.fixture(scope="module")
def bcast3():
    kernels = {name: generate(text, name) for name, (text, _) in BCAST3.items()}
    for name, (_, patterns) in BCAST3.items():
        assert kernels[name].ok, kernels[name].reason
        assert kernels[name].patterns == patterns, (name, kernels[name].patterns)
    assert (kernels["b3_nchw"].split, kernels["b3_nchw"].split2) == (1, 2)
    return kernels, twin.build(kernels.values())


@pytest.mark.parametrize("cores", [1, 8, 40])
@pytest.mark.parametrize("a,b,c", [(1, 1, 1), (3, 5, 10), (4, 3, 1000), (2, 3, 30_001)])
def test_three_level_broadcast_matches_numpy(bcast3, cores, a, b, c):
    kernels, lib = bcast3
    rng = np.random.default_rng(a * b + c + cores)
    x = rng.uniform(-2, 2, (a, 1, c)).astype(np.float32)
    y = rng.uniform(-2, 2, (a, b, c)).astype(np.float32)
    (z,), t = lib.run("b3_mid", [x, y], cores)
    np.testing.assert_allclose(z, np.exp(x.astype(np.float64) + y), rtol=2e-6)
    assert t == tiling.compute_column(a, b, c, cores, kernels["b3_mid"].ub.max_tile, rows=True)
    assert t.blockDim <= cores
    h = rng.uniform(-2, 2, (1, b, 1)).astype(np.float16)
    g = rng.uniform(-2, 2, (a, b, c)).astype(np.float16)
    (z,), _ = lib.run("b3_f16", [h, g], cores)
    np.testing.assert_array_equal(z, np.abs(h.astype(np.float32) * g.astype(np.float32)).astype(np.float16))
    p, q = rounded(rng.uniform(-2, 2, (a, b, c)), "bf16"), rounded(rng.uniform(-2, 2, (a, 1, c)), "bf16")
    (z,), _ = lib.run("b3_bf16", [store(p, "bf16"), store(q, "bf16")], cores)
    np.testing.assert_array_equal(z, store(p - q, "bf16"))
    i0 = rng.integers(-100, 100, (a, 1, c)).astype(np.int32)
    i1 = rng.integers(-100, 100, (1, b, 1)).astype(np.int32)
    i2 = rng.integers(-100, 100, (a, b, c)).astype(np.int32)
    (z,), _ = lib.run("b3_i32", [i0, i1, i2], cores)
    np.testing.assert_array_equal(z, (i0 + i1) * i2)


def test_three_level_broadcast_nchw_bias_and_launcher(bcast3):
    kernels, lib = bcast3
    rng = np.random.default_rng(12)
    x = rng.uniform(-8, 8, (8, 16, 32, 32)).astype(np.float32)
    bias = rng.uniform(-1, 1, (16, 1, 1)).astype(np.float32)
    (z,), t = lib.run("b3_nchw", [x, bias], 40)
    np.testing.assert_array_equal(z, np.clip(x + bias, 0, 6))
    assert (t.outer, t.mid, t.inner, t.blockDim) == (8, 16, 1024, 32)  # 128 rows, 4 a block
    tile = kernels["b3_mid"].ub.max_tile  # rows of exactly the UB tile, and a tile one step larger
    ones = [np.ones((1, 1, tile), np.float32), np.ones((1, 2, tile), np.float32)]
    (z,), t = lib.run("b3_mid", ones, 1)
    assert t.tileLength == tile and t.tilesPerRow == 1
    np.testing.assert_allclose(z, np.exp(2.0), rtol=1e-6)
    with pytest.raises(twin.TwinError, match="UB overflow"):
        lib.run("b3_mid", [np.ones((1, 1, 2 * tile), np.float32), np.ones((1, 2, 2 * tile), np.float32)], 1,
                tile_override=tile + tiling.ALIGN_ELEMS)
    kernel = generate(BCAST3["b3_i32"][0], "b3_launch")
    acl = twin.build([kernel], acl=True)
    i0 = rng.integers(-100, 100, (5, 1, 300)).astype(np.int32)
    i1 = rng.integers(-100, 100, (1, 4, 1)).astype(np.int32)
    i2 = rng.integers(-100, 100, (5, 4, 300)).astype(np.int32)
    (z,), t = acl.launch(kernel.name, [i0, i1, i2], core_num=8)
    np.testing.assert_array_equal(z, (i0 + i1) * i2)
    assert (t.outer, t.mid, t.inner) == (5, 4, 300) and t.blockDim == 7  # 20 rows, 3 a block


def test_fold_and_passes_together():
    """A Prod of a value reading a Max (pass 1), next to a Sum (pass 0); an output reading both."""
    text = ("in0: f32[?,?]\n%0 = Max in0 axes=[1]\n%1 = Div in0, %0\n%2 = Prod %1 axes=[1]\n"
            "%3 = Sum in0 axes=[1]\n%4 = Mul %1, %2\n%5 = Sub %4, %3\nout0 = %5\nout1 = %2\n")
    kernel = generate(text, "fold_passes")
    assert kernel.ok and kernel.passes == 3, kernel.reason
    lib = twin.build([kernel])
    rng = np.random.default_rng(1)
    for shape, cores, tile in (((7, 3000), 8, 0), ((7, 3000), 40, 256), ((1, 1), 1, 0)):
        x = rng.uniform(0.99, 1.01, shape).astype(np.float32)
        (y, p), _ = lib.run("fold_passes", [x], cores, tile)
        x64 = x.astype(np.float64)
        r = x64 / x64.max(1, keepdims=True)
        want_p = r.prod(1, keepdims=True)
        np.testing.assert_allclose(p, want_p, rtol=2e-5)
        np.testing.assert_allclose(y, r * want_p - x64.sum(1, keepdims=True), rtol=1e-6, atol=1e-3)


# ---- the two extensions together: bool values, compares, Select and advanced math (issue 6) ----
# ---- inside the several-pass, fold, column and 3-level schedules --------------------------------

COMBINED = {
    # pass 0: max; pass 1: x == max (a compare against the broadcast reduced value), Select, Erf
    # (sharedTmp), their Sum; pass 2: the division, the mask as a bool output
    "mp_mask": ("in0: f32[?,?]\n%0 = Max in0 axes=[1]\n%1 = Equal in0, %0\n%2 = Select %1, in0, 0.0\n"
                "%3 = Erf %2\n%4 = Sum %3 axes=[1]\n%5 = Div %3, %4\nout0 = %1\nout1 = %5\nout2 = %4\n"),
    # i32: a fold Min, an int32 compare against it, Select, a fold Sum of that (pass 1, with the
    # full output)
    "mp_i32": ("in0: i32[?,?]\n%0 = Min in0 axes=[1]\n%1 = Greater in0, %0\n%2 = Select %1, in0, 0\n"
               "%3 = Sum %2 axes=[1]\nout0 = %3\nout1 = %1\n"),
    # f16: centred values, a compare, Cos (sharedTmp) and a Select in the second pass
    "mp_f16": ("in0: f16[?,?]\n%0 = Mean in0 axes=[1]\n%1 = Sub in0, %0\n%2 = Greater %1, 0.0\n"
               "%3 = Cos %1\n%4 = Select %2, %3, %1\nout0 = %4\n"),
    # a fold Prod of a Select on a bool input
    "fold_sel": "in0: bool[?,?]\nin1: f32[?,?]\n%0 = Select in0, in1, 1.0\n%1 = Prod %0 axes=[1]\nout0 = %1\n",
    # the column schedule: a Sum over the leading axis of Erf(Select(bool, x, 0)), and that value
    "col_bool": ("in0: bool[?,?]\nin1: f32[?,?]\n%0 = Select in0, in1, 0.0\n%1 = Erf %0\n"
                 "%2 = Sum %1 axes=[0]\n%3 = IsFinite %1\nout0 = %2\nout1 = %3\n"),
    # 3-level broadcast: a bool [A,1,C] condition (inner full: queued uint8 tiles) and a
    # [1,B,1] bool (broadcast inner: one GetValue a tile), Pow (sharedTmp)
    "b3_bool": ("in0: bool[?,1,?]\nin1: bool[1,?,1]\nin2: f32[?,?,?]\n%0 = LogicalAnd in0, in1\n"
                "%1 = Pow in2, 2.0\n%2 = Select %0, %1, in2\nout0 = %2\nout1 = %0\n"),
}


@pytest.fixture(scope="module")
def combined():
    kernels = generate_all(COMBINED)
    assert {n: k.passes for n, k in kernels.items()} == {
        "mp_mask": 3, "mp_i32": 2, "mp_f16": 2, "fold_sel": 1, "col_bool": 1, "b3_bool": 1}
    assert kernels["col_bool"].split2 is not None and kernels["b3_bool"].split2 is not None
    for name in ("mp_mask", "col_bool", "b3_bool", "mp_f16"):
        src = kernels[name].sources[f"{name}_kernel.cpp"]
        assert "sharedTmpBuf" in src and "sharedTmp (advanced math)" in src, name
        # every Compute<q> that calls the advanced math declares the shared buffer
        for body in re.findall(r"void Compute\d*\(.*?\n  \}\n", src, re.S):
            if "sharedTmp," in body:
                assert "LocalTensor<uint8_t> sharedTmp = sharedTmpBuf.Get<uint8_t>();" in body
    return kernels, twin.build(kernels.values())


def _erf64(x):
    return np.vectorize(__import__("math").erf)(np.asarray(x, np.float64))


@pytest.mark.parametrize("cores", [1, 8])
@pytest.mark.parametrize("rows,cols", [(1, 1), (9, 300), (3, 30_001)])
def test_bool_compare_and_advanced_math_inside_the_new_schedules(combined, cores, rows, cols):
    kernels, lib = combined
    rng = np.random.default_rng(rows + cols + cores)
    x = rng.uniform(-3, 3, (rows, cols)).astype(np.float32)
    x[:, :1] = x.max(1, keepdims=True)  # a tie for the maximum
    (m, y, s), _ = lib.run("mp_mask", [x], cores)
    want_m = x == x.max(1, keepdims=True)
    assert m.dtype == np.bool_
    np.testing.assert_array_equal(m, want_m)
    e = _erf64(np.where(want_m, x, 0.0))
    np.testing.assert_allclose(s, e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)

    i = rng.integers(-50, 50, (rows, cols)).astype(np.int32)
    (si, gi), _ = lib.run("mp_i32", [i], cores)
    g = i > i.min(1, keepdims=True)
    np.testing.assert_array_equal(gi, g)
    np.testing.assert_array_equal(si, np.where(g, i, 0).sum(1, keepdims=True).astype(np.int32))

    h = rounded(x, "f16")
    (z,), _ = lib.run("mp_f16", [store(h, "f16")], cores)
    c = h - rounded(h.mean(1, keepdims=True), "f16")
    want = np.where(c > 0, np.cos(c), c)
    np.testing.assert_allclose(as_float(z, "f16"), want, rtol=4e-3, atol=4e-3)

    b = rng.random((rows, cols)) < 0.3
    v = rng.uniform(0.999, 1.001, (rows, cols)).astype(np.float32)
    (p,), _ = lib.run("fold_sel", [b, v], cores)
    np.testing.assert_allclose(p, np.where(b, v, 1.0).astype(np.float64).prod(1, keepdims=True), rtol=2e-5)

    (cs, fin), _ = lib.run("col_bool", [b, x], cores)
    ce = _erf64(np.where(b, x, 0.0))
    assert cs.shape == (1, cols) and fin.dtype == np.bool_ and fin.all()
    np.testing.assert_allclose(cs, ce.sum(0, keepdims=True), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cores", [1, 8])
@pytest.mark.parametrize("a,bb,c", [(2, 3, 5), (4, 5, 3000)])
def test_bool_inputs_and_pow_in_the_3_level_broadcast(combined, cores, a, bb, c):
    kernels, lib = combined
    rng = np.random.default_rng(a * bb * c + cores)
    c0 = rng.random((a, 1, c)) < 0.5
    c1 = rng.random((1, bb, 1)) < 0.5
    x = rng.uniform(-3, 3, (a, bb, c)).astype(np.float32)
    (y, m), _ = lib.run("b3_bool", [c0, c1, x], cores)
    want_m = c0 & c1
    np.testing.assert_array_equal(m, want_m)
    np.testing.assert_allclose(y, np.where(want_m, x.astype(np.float64) ** 2, x), rtol=1e-6)


# ---- no variable named after a type of the bisheng dialect ----------------------------------------

# built-in types of the Ascend C dialect (bisheng): using one as a variable name does not compile
DIALECT_TYPES = ("half", "bfloat16_t", "int4b_t", "hifloat8_t", "fp8_e4m3fn_t", "fp8_e5m2_t", "fp4x2_e2m1_t")
_DECLARED = re.compile(r"\b(?:u?int(?:8|16|32|64)_t|float|double|bool|auto|half|bfloat16_t|LocalTensor<\w+>)"
                       r"\s+(\w+)\s*[=;(\[{]")
_MORE_DECLARED = re.compile(r",\s*(\w+)\s*=\s*[^=]")  # `int a = 0, b = 1;`


def declared_names(source: str) -> set:
    names = set(_DECLARED.findall(source))
    for line in source.splitlines():
        if _DECLARED.search(line) and not line.lstrip().startswith("//"):
            names.update(_MORE_DECLARED.findall(line.split("(", 1)[0] if "for (" not in line else line))
    return names


def suite_kernels(prefix: str) -> list:
    """The generated kernels of this suite's programs (every op and dtype, every schedule)."""
    programs = [text for table in (REDUCED_ARITHMETIC, COVERAGE, MULTIPASS, FOLDS, COLUMNS, BCAST3, COMBINED, BCAST)
                for text in (v if isinstance(v, str) else v[0] for v in table.values())]
    programs += [unary_or_binary(spec.ir_name, spec.arity, dtype) for spec, dtype in OP_CASES]
    programs += [REDUCE, REDUCE_F16_3D, CHAIN]
    kernels = [generate(text.replace("{d}", "f16"), f"{prefix}_{k}") for k, text in enumerate(programs)]
    return [k for k in kernels if k.ok]


def test_no_generated_variable_is_named_after_a_dialect_type():
    assert "half" in declared_names("      uint32_t len = tileLength, half = 8;")  # the scan sees it
    scanned = 0
    for kernel in suite_kernels("scan"):
        for name, source in kernel.sources.items():
            bad = declared_names(source) & set(DIALECT_TYPES)
            assert not bad, (name, bad)
        scanned += 1
    assert scanned > 150
