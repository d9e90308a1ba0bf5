"""A MatMul and its epilogue as one mix kernel (tf_autofuse/codegen/cube.py, emit/matmul.py;
docs/ASCEND.md, "MatMul epilogues"), verified on the CPU twin of the Matmul API
(codegen/twin/lib/matmul_intf.h).

Numbers first: generated kernels run on the twin on 1 to 40 vector cores, with M and N that are
not multiples of the base block, and are compared with a float64 evaluation and with TensorFlow's
unfused result (MatMul, then the epilogue's ops, in the graph's dtype): the kernel's error is no
larger than TensorFlow's plus two ulps of the output. Then the plan's refusals with their reasons,
the host tiling against its Python mirror, one mutated kernel the twin rejects per rule of the
Matmul API, and the dump of a graph's MatMul epilogues."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import numpy as np
import pytest

from test_codegen import as_float, from_bf16, store
from tf_autofuse.codegen import build as _build
from tf_autofuse.codegen import cube, dump, generate, matmul_groups, twin

_NP = {"f16": np.float16, "f32": np.float32}


@dataclasses.dataclass(frozen=True)
class Case:
    """A MatMul, its epilogue program (in0: the product) and the epilogue's float64 and
    TensorFlow evaluations: f64(c, inputs) and tf(c, inputs) for the product c."""

    name: str
    mm: cube.MatMul
    program: str
    shapes: tuple  # the epilogue's GM inputs (in1, ...): "row", "full" or "scalar"
    f64: object
    tf: object
    out_dtypes: tuple
    m: int  # rows of the runs


def _gelu64(x):
    from scipy.special import erf  # noqa: PLC0415

    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def _cases():
    import tensorflow as tf

    return [
        # a bias and Relu (Keras Dense), f16, M known at run time; 150 x 200: tails in M and N
        Case("mm_bias_relu_f16", cube.MatMul("f16", k=96, n=200),
             "in0: f16[?,200]\nin1: f16[200]\n%0 = Add in0, in1\n%1 = Relu %0\nout0 = %1\n",
             ("row",), lambda c, b: [np.maximum(c + b, 0)],
             lambda c, b: [tf.nn.relu(tf.nn.bias_add(c, b))], ("f16",), 150),
        # batch norm in inference (scale, shift), Tanh and a residual, f32, B transposed, K = 33
        Case("mm_bn_tanh_res_f32", cube.MatMul("f32", k=33, n=100, m=70, transpose_b=True),
             "in0: f32[70,100]\nin1: f32[100]\nin2: f32[100]\nin3: f32[70,100]\n%0 = Mul in0, in1\n"
             "%1 = Add %0, in2\n%2 = Tanh %1\n%3 = Add %2, in3\nout0 = %3\n",
             ("row", "row", "full"), lambda c, s, t, r: [np.tanh(c * s + t) + r],
             lambda c, s, t, r: [tf.tanh(c * s + t) + r], ("f32",), 70),
        # swish with a scalar, two outputs (the pre-activation too), bf16, A transposed
        Case("mm_swish_bf16", cube.MatMul("bf16", k=130, n=64, transpose_a=True),
             "in0: bf16[?,64]\nin1: bf16[]\n%0 = Mul in0, in1\n%1 = Sigmoid %0\n%2 = Mul %0, %1\n"
             "out0 = %2\nout1 = %0\n",
             ("scalar",), lambda c, s: [c * s / (1 + np.exp(-c * s)), c * s],
             lambda c, s: [c * s * tf.sigmoid(c * s), c * s], ("bf16", "bf16"), 257),
        # a small product with a long K (several baseK steps), N smaller than a block row, a
        # residual and a scalar, f16, M known
        Case("mm_small_f16", cube.MatMul("f16", k=300, n=10, m=5),
             "in0: f16[5,10]\nin1: f16[5,10]\nin2: f16[]\n%0 = Sub in0, in1\n%1 = Maximum %0, in2\nout0 = %1\n",
             ("full", "scalar"), lambda c, r, s: [np.maximum(c - r, s)],
             lambda c, r, s: [tf.maximum(c - r, s)], ("f16",), 5),
        # GELU through Erf (the advanced-math temp buffer in UB beside the block), f32
        Case("mm_gelu_f32", cube.MatMul("f32", k=64, n=300),
             "in0: f32[?,300]\nin1: f32[300]\n%0 = Add in0, in1\n%1 = Mul %0, 0.7071067811865476\n"
             "%2 = Erf %1\n%3 = Add %2, 1.0\n%4 = Mul %0, %3\n%5 = Mul %4, 0.5\nout0 = %5\n",
             ("row",), lambda c, b: [_gelu64(c + b)],
             lambda c, b: [(c + b) * (tf.math.erf((c + b) * 0.7071067811865476) + 1.0) * 0.5],
             ("f32",), 33),
    ]


CASES = {c.name: c for c in _cases()}


@pytest.fixture(scope="module")
def library():
    kernels = []
    for case in CASES.values():
        kernel = cube.generate_matmul(case.mm, case.program, 0, case.name)
        assert kernel.ok, kernel.reason
        kernels.append(kernel)
    return {k.name: k for k in kernels}, twin.build(kernels)


def _operands(case: Case, m: int, rng):
    """(a, b, epilogue inputs) in storage (bf16 as bits) and as float64."""
    mm = case.mm
    a_shape = (mm.k, m) if mm.transpose_a else (m, mm.k)
    b_shape = (mm.n, mm.k) if mm.transpose_b else (mm.k, mm.n)
    a64, b64 = rng.uniform(-1, 1, a_shape), rng.uniform(-1, 1, b_shape)
    shape = {"row": (mm.n,), "full": (m, mm.n), "scalar": ()}
    ins64 = [rng.uniform(0.5, 1.5, shape[s]) for s in case.shapes]
    stored = [store(x, mm.dtype) for x in (a64, b64, *ins64)]
    return stored, [as_float(x, mm.dtype) for x in stored]


def _tf_result(case: Case, stored):
    import tensorflow as tf

    mm = case.mm
    dtype = {"f16": tf.float16, "bf16": tf.bfloat16, "f32": tf.float32}[mm.dtype]
    tensors = [tf.constant(from_bf16(x) if mm.dtype == "bf16" else x, dtype=tf.float32) for x in stored]
    tensors = [tf.cast(t, dtype) for t in tensors]
    c = tf.linalg.matmul(tensors[0], tensors[1], transpose_a=mm.transpose_a, transpose_b=mm.transpose_b)
    return [tf.cast(y, tf.float64).numpy() for y in case.tf(c, *tensors[2:])]


def _ulp(x: float, dtype: str) -> float:
    bits = {"f16": 10, "bf16": 7, "f32": 23}[dtype]
    return 2.0 ** (math.floor(math.log2(max(abs(x), 2.0 ** -14))) - bits)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("cores", [1, 3, 8, 40])
def test_matmul_epilogue_matches_float64_and_tensorflow(library, name, cores):
    kernels, lib = library
    case = CASES[name]
    rng = np.random.default_rng(cores)
    stored, f64 = _operands(case, case.m, rng)
    a64, b64 = (f64[0].T if case.mm.transpose_a else f64[0]), (f64[1].T if case.mm.transpose_b else f64[1])
    want = case.f64(a64 @ b64, *f64[2:])
    outs, t = lib.run_matmul(name, stored[0], stored[1], stored[2:], cores)
    assert t.usedCoreNum == min(cores, t.mCores * t.nCores) and t.usedCoreNum <= cores
    assert t.blockDim == -(-t.usedCoreNum // 2)  # two vector cores an AI core
    cpu = _tf_result(case, stored)
    for j, (got, ref, base, dtype) in enumerate(zip(outs, want, cpu, case.out_dtypes)):
        got = as_float(got, dtype)
        assert got.shape == ref.shape == base.shape
        err, base_err = np.abs(got - ref).max(), np.abs(base - ref).max()
        assert err <= base_err + 2 * _ulp(np.abs(ref).max(), dtype), (name, j, err, base_err)


def test_every_block_of_c_is_written_once_with_tails_in_m_and_n(library):
    """M and N one past, and one short of, whole blocks on 1 and 5 cores: every element of the
    output is the product (a Relu of it), none left at the output's initial bytes."""
    kernels, lib = library
    kernel = kernels["mm_bias_relu_f16"]
    blk = kernel.cube.block
    rng = np.random.default_rng(7)
    for m in (1, blk.base_m - 1, blk.base_m + 1, 3 * blk.base_m):
        stored, f64 = _operands(CASES["mm_bias_relu_f16"], m, rng)
        want = np.maximum(f64[0] @ f64[1] + f64[2], 0)
        for cores in (1, 5):
            (got,), t = lib.run_matmul(kernel.name, *stored[:2], stored[2:], cores)
            assert np.abs(got.astype(np.float64) - want).max() <= 2 * _ulp(want.max(), "f16"), (m, cores)


def test_host_tiling_matches_its_python_mirror(library):
    kernels, lib = library
    for name, kernel in kernels.items():
        mm = kernel.cube.matmul
        case = CASES[name]
        for m in ((mm.m,) if mm.m > 0 else (1, 64, 65, 1000)):
            for cores in (1, 2, 7, 40, 48):
                stored, _ = _operands(case, m, np.random.default_rng(0))
                _, t = lib.run_matmul(name, stored[0], stored[1], stored[2:], cores)
                assert t == cube.compute_tiling(kernel.cube.block, m, mm.n, mm.k, cores), (name, m, cores)


def test_plan_keeps_the_cube_and_ub_limits():
    for case in CASES.values():
        kernel = cube.generate_matmul(case.mm, case.program, 0, case.name)
        blk, size = kernel.cube.block, {"f16": 2, "bf16": 2, "f32": 4}[case.mm.dtype]
        assert blk.base_m % 16 == blk.base_n % 32 == blk.base_k % 16 == 0
        assert blk.base_m * blk.base_k * size * blk.db_l0a <= cube.L0A_BYTES
        assert blk.base_n * blk.base_k * size * blk.db_l0b <= cube.L0B_BYTES
        assert blk.base_m * blk.base_n * 4 * blk.db_l0c <= cube.L0C_BYTES
        assert kernel.ub.ub_bytes(blk.elements) <= cube.tiling.UB_BUDGET
        assert kernel.ub.max_tile == blk.elements


def test_a_bias_the_cube_takes_is_added_by_set_bias_and_others_by_the_epilogue():
    def source(dtype, text):
        kernel = cube.generate_matmul(cube.MatMul(dtype, k=96, n=200), text, 0, "bias_" + dtype)
        assert kernel.ok, kernel.reason
        return kernel, kernel.sources[f"bias_{dtype}_kernel.cpp"]

    kernel, src = source("f16", _BIAS_RELU)  # f16 A with a half bias, C float: in the table
    assert kernel.cube.roles == (cube.C, cube.BIAS) and "mm.SetBias(in1Gm[n0]);" in src
    assert "cube.isBias = 1;" in src and "Add(" not in src and "inQue1" not in src
    kernel, src = source("bf16", _BIAS_RELU.replace("f16", "bf16"))  # no bf16 bias on Atlas A2
    assert kernel.cube.roles == (cube.C, cube.ROW) and "SetBias" not in src and "Add(" in src
    twice = "in0: f16[?,200]\nin1: f16[200]\n%0 = Add in0, in1\n%1 = Mul %0, in1\nout0 = %1\n"
    kernel, src = source("f16", twice)  # the bias also read by the epilogue: added there
    assert kernel.cube.roles == (cube.C, cube.ROW) and "SetBias" not in src


# ---- refusals: the MatMul stays a framework op, with the reason ---------------------------------

_BIAS_RELU = "in0: f16[?,200]\nin1: f16[200]\n%0 = Add in0, in1\n%1 = Relu %0\nout0 = %1\n"


@pytest.mark.parametrize("mm, text, why", [
    (cube.MatMul("f64", k=8, n=200), _BIAS_RELU, "the Atlas A2 cube takes f16, bf16 and f32"),
    (cube.MatMul("i32", k=8, n=200), _BIAS_RELU, "i32 is not generated"),
    (cube.MatMul("f16", k=-1, n=200), _BIAS_RELU, "K and N must be known"),
    (cube.MatMul("f16", k=8, n=100), _BIAS_RELU, "not as the \\[M, 100\\] product"),
    (cube.MatMul("f16", k=8, n=200),
     "in0: f16[?,200]\nin1: f16[?,1]\n%0 = Mul in0, in1\nout0 = %0\n", "a per-row vector"),
    (cube.MatMul("f16", k=8, n=200),
     "in0: f16[?,200]\n%0 = Sum in0 axes=[1]\nout0 = %0\n", "a reduction in the epilogue"),
    (cube.MatMul("f32", k=8, n=200),
     "in0: f32[?,200]\n%0 = Cast in0 to=f64\nout0 = %0\n", "no fp64"),
    (cube.MatMul("f16", k=8, n=200),
     "in0: f16[?,200]\nin1: f16[3,200]\n%0 = Add in0, in1\nout0 = %0\n", "neither"),
    (cube.MatMul("f16", k=8, n=200),
     "in0: f16[?,200]\n" + "".join(f"in{i}: f16[200]\n" for i in range(1, 9))
     + "%0 = Add in0, in1\n" + "".join(f"%{i - 1} = Add %{i - 2}, in{i}\n" for i in range(2, 9))
     + "out0 = %7\n", "a queue position holds at most 8"),
])
def test_refusals_name_the_reason(mm, text, why):
    kernel = cube.generate_matmul(mm, text, 0, "refused")
    assert not kernel.ok
    assert re.search(why, kernel.reason), kernel.reason


def test_an_epilogue_too_large_for_ub_is_refused_with_the_bytes():
    block, why = cube._choose_block(cube.MatMul("f16", k=64, n=256), 400, 0)
    assert block is None and "UB too small" in why and "400 bytes per block element" in why


# ---- the twin holds generated code to the Matmul API's rules --------------------------------------

def _mutant(name: str, old: str, new: str, *more):
    """The bias + Relu kernel with `old` replaced by `new` (and each further (old, new) pair)."""
    case = CASES["mm_bias_relu_f16"]
    kernel = cube.generate_matmul(case.mm, case.program, 0, name)
    src = kernel.sources[f"{name}_kernel.cpp"]
    for o, n in ((old, new), *more):
        assert o in src, o
        src = src.replace(o, n, 1)
    kernel.sources[f"{name}_kernel.cpp"] = src
    return kernel


_GET = "mm.template GetTensorC<true>(x0, 0, true);"
_BIAS = "    cube.isBias = 1;"  # the last field SetCubeTiling sets
_REGIST = "  REGIST_MATMUL_OBJ(&op.pipe, GetSysWorkSpacePtr(), op.mm, &op.cube);\n"
# (name, the text changed, its replacement, the twin's error[, further (text, replacement)])
MUTANTS = [
    ("mut_aiv_only", "KERNEL_TYPE_MIX_AIC_1_2", "KERNEL_TYPE_AIV_ONLY", "declare the kernel"),
    ("mut_regist_in_init", _REGIST, "", "the client REGIST_MATMUL_OBJ declared is gone",
     ("    N = t.N;", "    REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &cube);\n    N = t.N;")),
    ("mut_workspace", "SetSysWorkspace(workspace);", "SetSysWorkspace(tiling);", "no system workspace"),
    ("mut_l0c", _BIAS, _BIAS + "\n    cube.baseM = cube.baseN = 256; cube.baseK = 16;", "exceeds L0C"),
    ("mut_depth", "cube.stepM = cube.stepN", "cube.depthA1 = 3;\n    cube.stepM = cube.stepN",
     "depthA1 must be stepM \\* stepKa"),
    ("mut_cores", _BIAS, _BIAS + "\n    cube.usedCoreNum = 1000;", "usedCoreNum 1000"),
    ("mut_no_get", _GET, "", "not fetched"),
    ("mut_get_twice", _GET, _GET + "\n    " + _GET, "GetTensorC without an Iterate"),
    ("mut_no_end", "mm.End();", "", "missing End\\(\\)"),
    ("mut_c_calc", _GET, _GET.replace("(x0,", "(calc0.Get<float>(),"), "C goes to a VECIN queue tensor"),
    ("mut_c_unaligned", _GET, _GET.replace("(x0,", "(x0[4],"), "is not 32-byte aligned"),
    ("mut_transpose", "mm.SetTensorB(bGm[n0], false);", "mm.SetTensorB(bGm[n0], true);", "needs ISTRANS"),
    ("mut_no_bias", "mm.SetBias(in1Gm[n0]);", "", "isBias is 1 but SetBias was not called"),
    ("mut_bias_table", _BIAS, _BIAS + "\n    cube.baseM = 16; cube.baseN = 1024; cube.baseK = 16;",
     "exceeds the bias table"),
]


@pytest.fixture(scope="module")
def mutants():
    return twin.build([_mutant(name, old, new, *more) for name, old, new, _, *more in MUTANTS])


@pytest.mark.parametrize("name, error", [(m[0], m[3]) for m in MUTANTS])
def test_twin_rejects_a_kernel_that_breaks_a_matmul_rule(mutants, name, error):
    case = CASES["mm_bias_relu_f16"]
    stored, _ = _operands(case, 150, np.random.default_rng(0))
    with pytest.raises(twin.TwinError, match=error):
        mutants.run_matmul(name, stored[0], stored[1], stored[2:], 3)


def test_the_unmutated_kernel_keeps_every_rule(library):
    kernels, lib = library
    case = CASES["mm_bias_relu_f16"]
    stored, _ = _operands(case, 150, np.random.default_rng(0))
    lib.run_matmul("mm_bias_relu_f16", stored[0], stored[1], stored[2:], 3)


def test_twin_rejects_a_dtype_combination_the_api_does_not_take():
    kernel = _mutant("mut_dtype", "MatmulType<TPosition::VECIN, CubeFormat::ND, float>",
                     "MatmulType<TPosition::VECIN, CubeFormat::ND, int32_t>")
    with pytest.raises(_build.CodegenBuildError, match="not in the Atlas A2 Matmul API's table"):
        twin.build([kernel])


# ---- where the product meets it: the dump of a graph's MatMul epilogues -------------------------

def _graph(dtype, consumers=1):
    import tensorflow as tf

    g = tf.Graph()
    tf_dtype = {"f16": tf.float16, "f32": tf.float32}[dtype]
    with g.as_default():
        x = tf.compat.v1.placeholder(tf_dtype, [None, 96], name="x")
        w = tf.constant(np.random.default_rng(0).uniform(-1, 1, (96, 200)), tf_dtype, name="w")
        b = tf.constant(np.random.default_rng(1).uniform(-1, 1, 200), tf_dtype, name="b")
        mm = tf.matmul(x, w, name="dense")
        y = tf.nn.relu(tf.nn.bias_add(mm, b))
        tf.identity(y, name="out")
        if consumers > 1:
            tf.identity(mm, name="also")
    return g.as_graph_def(add_shapes=True)


def test_dump_of_a_graph_shows_the_mix_kernel_and_it_runs(tmp_path):
    from tf_autofuse.rewriter import rewrite

    result = rewrite(_graph("f16"), preserve=["out"])
    groups = matmul_groups.find(result.graph_def)
    assert [(g.matmul, g.spec) for g in groups] == [("dense", cube.MatMul("f16", k=96, n=200))]
    kernels = dump.dump_codegen(tmp_path, result.fusions, verify=False, graph_def=result.graph_def)
    mix = [k for k in kernels if k.cube is not None]
    assert len(mix) == 1 and mix[0].ok
    out = tmp_path / "codegen" / mix[0].name
    assert (out / f"{mix[0].name}_kernel.cpp").read_text() == mix[0].sources[f"{mix[0].name}_kernel.cpp"]
    assert "mix kernel of dense and its epilogue" in (tmp_path / "codegen" / "summary.txt").read_text()
    # the dumped kernel computes the graph's MatMul and epilogue
    import tensorflow as tf

    lib = twin.build(mix)
    x = np.random.default_rng(2).uniform(-1, 1, (77, 96)).astype(np.float16)
    consts = {n.name: tf.make_ndarray(n.attr["value"].tensor) for n in result.graph_def.node if n.op == "Const"}
    fused = next(n for n in result.graph_def.node if n.op == "AutofuseKernel")
    assert [i.split(":")[0] for i in fused.input] == ["dense", "b"] and groups[0].c_input == 0
    (got,), _ = lib.run_matmul(mix[0].name, x, consts["w"], [consts["b"]], 4)
    want = np.maximum(x.astype(np.float64) @ consts["w"].astype(np.float64) + consts["b"].astype(np.float64), 0)
    assert np.abs(got.astype(np.float64) - want).max() <= 2 * _ulp(want.max(), "f16")


def test_dump_says_why_a_matmul_stays_a_framework_op(tmp_path):
    from tf_autofuse.rewriter import rewrite

    result = rewrite(_graph("f16", consumers=2), preserve=["out", "also"])
    kernels = dump.dump_codegen(tmp_path, result.fusions, verify=False, graph_def=result.graph_def)
    refused = [k for k in kernels if not k.ok and "dense" in k.reason]
    assert refused, [k.reason for k in kernels]
    summary = (tmp_path / "codegen" / "summary.txt").read_text()
    assert "dense stays a framework op: dense's output is also read by also" in summary
    assert list(Path(tmp_path / "codegen").glob("*/refused.txt"))


def test_fused_matmul_of_the_cpu_epilogue_pass_is_planned_with_its_bias_and_activation(tmp_path):
    from tf_autofuse.rewriter import rewrite

    result = rewrite(_graph("f32"), preserve=["out"])
    groups = matmul_groups.find(result.graph_def)
    assert len(groups) == 1 and groups[0].spec == cube.MatMul("f32", k=96, n=200)
    assert groups[0].program == "in0: f32[?,200]\nin1: f32[200]\n%0 = Add in0, in1\n%1 = Relu %0\nout0 = %1\n"
    assert groups[0].generate().ok


def test_a_convolution_and_its_epilogue_are_refused_with_the_reason(tmp_path):
    import tensorflow as tf

    from tf_autofuse.rewriter import rewrite

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float16, [2, 8, 8, 3], name="x")
        w = tf.constant(np.ones((3, 3, 3, 4)), tf.float16)
        y = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, w, 1, "SAME", name="conv"), tf.ones(4, tf.float16)))
        tf.identity(y, name="out")
    result = rewrite(g.as_graph_def(add_shapes=True), preserve=["out"])
    groups = matmul_groups.find(result.graph_def)
    assert [(g.matmul, g.spec) for g in groups] == [("conv", None)]
    kernels = dump.dump_codegen(tmp_path, result.fusions, verify=False, graph_def=result.graph_def)
    assert "conv stays a framework op: Conv2D: the cube + vector kernel is generated for MatMul only" in (
        tmp_path / "codegen" / "summary.txt").read_text()
    assert any(not k.ok and "img2col" in k.reason for k in kernels)


def test_a_session_debug_dump_shows_the_matmul_epilogue_kernel(tmp_path):
    """A v1 Session with the named optimizer and --codegen_compile_debug: the session's numbers
    are those without the dump (the MatMul and its epilogue run on the CPU) and the dump holds
    the mix kernel."""
    import tensorflow as tf

    from sessions import config

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float16, [64, 96], name="x")
        w = tf.constant(np.random.default_rng(0).uniform(-1, 1, (96, 200)), tf.float16)
        b = tf.constant(np.random.default_rng(1).uniform(-1, 1, 200), tf.float16)
        y = tf.nn.relu(tf.nn.bias_add(tf.matmul(x, w, name="dense"), b))
    feed = np.random.default_rng(2).uniform(-1, 1, (64, 96)).astype(np.float16)
    params = {"codegen_compile_debug": "true", "debug_dir": str(tmp_path)}
    # Grappler's remapper would make the chain a _FusedMatMul before the pass sees it
    with tf.compat.v1.Session(graph=g, config=config(params=params, remapping=False)) as sess:
        got = sess.run(y, {x: feed})
    with tf.compat.v1.Session(graph=g, config=config(fuse=False, remapping=False)) as sess:
        want = sess.run(y, {x: feed})
    np.testing.assert_array_equal(got, want)
    summary = (tmp_path / "codegen" / "summary.txt").read_text()
    assert "mix kernel of dense and its epilogue" in summary, summary
    kernel = next(p for p in (tmp_path / "codegen").glob("*dense*") if p.is_dir())
    assert "REGIST_MATMUL_OBJ" in next(kernel.glob("*_kernel.cpp")).read_text()


# ---- every elementwise op of the table in the epilogue: the flat schedule's code, bit for bit -----

def _float_ops():
    from tf_autofuse.rewriter import catalog
    from tf_autofuse.rewriter.program import DTYPE_NAMES

    ops = []
    for spec in catalog.OPS:
        if spec.kind not in (catalog.ELEMENTWISE, catalog.BROADCAST) or spec.ir_name == "Cast":
            continue
        roles = spec.operand_roles()
        if any(r == "bool" for r in roles) or "f32" not in {DTYPE_NAMES[d] for d in spec.dtypes}:
            continue
        ops.append(spec)
    return ops


def _op_epilogue(spec, n):
    """The op over the product (and an [M, N] second operand: not a bias the cube would add)."""
    attrs = " alpha=0.2" if spec.ir_name == "LeakyRelu" else ""
    decl = "".join(f"in{k}: f32[?,{n}]\n" for k in range(spec.arity))
    return f"{decl}%0 = {spec.ir_name} {', '.join(f'in{k}' for k in range(spec.arity))}{attrs}\nout0 = %0\n"


def test_every_elementwise_op_in_the_epilogue_is_the_flat_schedules_code_bit_for_bit():
    """Each float op of the op table as the epilogue of an f32 MatMul (64 x 100, K = 40: a tail in
    N) equals, bit for bit, the flat kernel of the same program run on the product the mix kernel
    fetches (read back through an exact epilogue, Mul by 1)."""
    mm = cube.MatMul("f32", k=40, n=100)
    specs = _float_ops()
    assert len(specs) >= 40
    identity = cube.generate_matmul(mm, "in0: f32[?,100]\n%0 = Mul in0, 1.0\nout0 = %0\n", 0, "mm_identity")
    mix = {s.ir_name: cube.generate_matmul(mm, _op_epilogue(s, 100), 0, f"mm_op_{s.ir_name}") for s in specs}
    assert all(k.ok for k in mix.values()), {op: k.reason for op, k in mix.items() if not k.ok}
    flat = {s.ir_name: generate(_op_epilogue(s, 100).replace("[?,100]", "[?]"), f"flat_op_{s.ir_name}")
            for s in specs}
    lib = twin.build([identity, *mix.values(), *flat.values()])
    rng = np.random.default_rng(3)
    a = rng.uniform(-1.5, 1.5, (64, 40)).astype(np.float32)
    b = rng.uniform(-1.5, 1.5, (40, 100)).astype(np.float32)
    second = rng.uniform(0.25, 2.0, (64, 100)).astype(np.float32)
    (product,), _ = lib.run_matmul("mm_identity", a, b, [], 3)
    np.testing.assert_allclose(product, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)
    for spec in specs:
        extra = [second] if spec.arity == 2 else []
        (got,), _ = lib.run_matmul(mix[spec.ir_name].name, a, b, extra, 3)
        (want,), _ = lib.run(flat[spec.ir_name].name, [product.reshape(-1), *(x.reshape(-1) for x in extra)], 4)
        np.testing.assert_array_equal(got.reshape(-1), want, err_msg=spec.ir_name)


# ---- the mix kernel's ACL launcher against the stand-in runtime ----------------------------------

@pytest.mark.parametrize("route", [8, 9])
def test_launch_through_the_stand_in_acl_runtime(route, tmp_path, monkeypatch):
    """The launcher of each CANN generation allocates A, B, the epilogue's inputs, the outputs,
    the Matmul API's system workspace and the tiling on the device, launches blockDim AI cores
    (the stand-in runs two vector blocks each) and copies the [M, N] outputs back: the numbers of
    the twin's own run."""
    log = tmp_path / "acl.log"
    monkeypatch.setenv("TWIN_ACL_LOG", str(log))
    case = CASES["mm_bn_tanh_res_f32"]
    kernel = cube.generate_matmul(case.mm, case.program, 0, f"{case.name}_r{route}")
    lib = twin.build([kernel], acl=True, route=route)
    stored, _ = _operands(case, case.m, np.random.default_rng(5))
    want, t_run = lib.run_matmul(kernel.name, stored[0], stored[1], stored[2:], 8)
    got, t = lib.launch_matmul(kernel.name, stored[0], stored[1], stored[2:], 8)
    assert t == t_run and t.blockDim == -(-t.usedCoreNum // 2)
    np.testing.assert_array_equal(got[0], want[0])
    assert log.read_text().splitlines()[-1] == f"run blockDim={t.blockDim} ok"
    with pytest.raises(twin.TwinError, match="an input does not have the element count"):
        lib.launch_matmul(kernel.name, stored[0][:-1], stored[1], stored[2:], 8)
