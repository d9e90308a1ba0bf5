"""The CPU twin holds kernels to the real Ascend C framework's limits (docs/ASCEND.md, "How it is verified"), and the
generator keeps to them for groups of any size.

Each rule of the twin has a small hand-written kernel that breaks it and one that keeps it (one
g++ run for all of them). Then generated kernels of many inputs and outputs: counted from their
source they keep the limits, they run exact on the twin, and one double-buffered queue per tensor
(the layout that breaks the limits) is rejected by the twin for the same groups."""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest

from tf_autofuse.codegen import build as _build
from tf_autofuse.codegen import generate, twin
from tf_autofuse.codegen.emit import base as emit_base

# ---- the twin's rules, one kernel that breaks each and one that keeps it -------------------------

_PROLOGUE = """\
#include <cstdio>
#include <string>
#include "kernel_operator.h"
using namespace AscendC;
"""

# Every input queue is allocated and enqueued before any is consumed (the shape of CopyIn then
# Compute), over three tiles so that every buffer of a double-buffered queue is freed once.
_QUEUES_OF = """\
static void {name}() {{
  TPipe pipe;
  TQue<TPosition::{pos}, {depth}> q[{queues}];
  for (int i = 0; i < {queues}; ++i) pipe.InitBuffer(q[i], {buffers}, 256);
  for (int tile = 0; tile < 3; ++tile) {{
    LocalTensor<float> t[{queues}];
    for (int i = 0; i < {queues}; ++i) {{ t[i] = q[i].AllocTensor<float>(); {enque} }}
    for (int i = 0; i < {queues}; ++i) {{ {deque} q[i].FreeTensor(t[i]); }}
  }}
}}
"""


def _queues(name, queues, buffers=2, depth=2, pos="VECIN", enqueue=True):
    return _QUEUES_OF.format(name=name, queues=queues, buffers=buffers, depth=depth, pos=pos,
                             enque="q[i].EnQue(t[i]);" if enqueue else "",
                             deque="t[i] = q[i].DeQue<float>();" if enqueue else "")


def _tbufs(name, count):
    return f"""\
static void {name}() {{
  TPipe pipe;
  TBuf<TPosition::VECCALC> b[{count}];
  for (int i = 0; i < {count}; ++i) pipe.InitBuffer(b[i], 32);
}}
"""


def _double_buffered(name, depth, consecutive):
    # TQue<VECIN, depth> with two buffers: `consecutive` EnQue before the first DeQue
    return f"""\
static void {name}() {{
  TPipe pipe;
  TQue<TPosition::VECIN, {depth}> q;
  pipe.InitBuffer(q, 2, 256);
  for (int tile = 0; tile < 4; tile += {consecutive}) {{
    LocalTensor<float> t[2];
    for (int i = 0; i < {consecutive}; ++i) {{ t[i] = q.AllocTensor<float>(); q.EnQue(t[i]); }}
    for (int i = 0; i < {consecutive}; ++i) {{ t[i] = q.DeQue<float>(); q.FreeTensor(t[i]); }}
  }}
}}
"""


def _on_tbufs(name, buffers, op):
    """A kernel on TBufs: buffers = [(tensor, C type, bytes)]; the first is filled with 0.5, then
    (after a barrier) `op` runs."""
    decl = "".join(f"  TBuf<TPosition::VECCALC> {v}Buf;\n  pipe.InitBuffer({v}Buf, {size});\n"
                   f"  LocalTensor<{ctype}> {v} = {v}Buf.Get<{ctype}>();\n" for v, ctype, size in buffers)
    first, ctype = buffers[0][0], buffers[0][1]
    return (f"static void {name}() {{\n  TPipe pipe;\n{decl}"
            f"  Duplicate({first}, static_cast<{ctype}>(0.5f), 128);\n  PipeBarrier<PIPE_V>();\n  {op}\n}}\n")


def _cast_bf16(name, mode):
    return _on_tbufs(name, [("x", "float", 512), ("y", "bfloat16_t", 256)], f"Cast(y, x, RoundMode::{mode}, 128);")


def _advanced(name, api, ctype, factor):
    # `factor` times the operand bytes of temp buffer for 128 elements
    size = {"float": 4, "half": 2}[ctype]
    return _on_tbufs(name, [("x", ctype, 128 * size), ("y", ctype, 128 * size), ("t", "uint8_t", factor * 128 * size)],
                     f"{api}(y, x, t, 128);")


def _aligned(name, offset):
    # Add on views starting `offset` floats into their buffers
    return _on_tbufs(name, [("x", "float", 1024), ("y", "float", 1024)],
                     f"LocalTensor<float> xv = x[{offset}], yv = y[{offset}];\n  Add(yv, xv, xv, 64);")


# (kernel, the twin's error or None when the kernel keeps the rule)
RULES = {
    # event IDs: a freed buffer holds a V->MTE2 ID until its next AllocTensor; 4 double-buffered
    # input queues use IDs 0-7, a 5th runs out in FreeTensor
    "vecin_4_double": (_queues("vecin_4_double", 4), None),
    "vecin_5_double": (_queues("vecin_5_double", 5), "FreeTensor: out of V->MTE2 event IDs"),
    "vecout_4_double": (_queues("vecout_4_double", 4, pos="VECOUT"), None),
    "vecout_5_double": (_queues("vecout_5_double", 5, pos="VECOUT"), "FreeTensor: out of MTE3->V event IDs"),
    # EnQue holds an MTE2->V ID until DeQue: 8 single-buffered queues enqueued at once fit, 9 not
    "vecin_8_enqueued": (_queues("vecin_8_enqueued", 8, buffers=1, depth=1), None),
    "vecin_9_enqueued": (_queues("vecin_9_enqueued", 9, buffers=1, depth=1),
                         "current id is 8, max buffer number in same queue position is 8"),
    # at most 8 tensors allocated and not yet queued per position
    "vecout_8_allocated": (_queues("vecout_8_allocated", 8, buffers=1, pos="VECOUT", enqueue=False), None),
    "vecout_9_allocated": (_queues("vecout_9_allocated", 9, buffers=1, pos="VECOUT", enqueue=False),
                           "9 tensors allocated and not queued in position VECOUT"),
    # at most 64 buffers per TPipe, queue buffers and TBufs together
    "pipe_64_tbufs": (_tbufs("pipe_64_tbufs", 64), None),
    "pipe_65_tbufs": (_tbufs("pipe_65_tbufs", 65), "Total buffer num managed by TPipe is 65"),
    "pipe_64_queue_buffers": (_queues("pipe_64_queue_buffers", 32, buffers=2, enqueue=False)
                              .replace("for (int tile = 0; tile < 3; ++tile)", "for (int tile = 0; tile < 0; ++tile)"),
                              None),
    "pipe_66_queue_buffers": (_queues("pipe_66_queue_buffers", 33, buffers=2, enqueue=False)
                              .replace("for (int tile = 0; tile < 3; ++tile)", "for (int tile = 0; tile < 0; ++tile)"),
                              "Total buffer num managed by TPipe is 66, should be in range \\(0, 64\\]"),
    # the depth counts consecutive EnQue: TQue<VECIN, 1> with two buffers is double buffering
    "depth1_two_buffers": (_double_buffered("depth1_two_buffers", 1, 1), None),
    "depth1_two_enqueued": (_double_buffered("depth1_two_enqueued", 1, 2),
                            "more consecutive EnQue than the queue depth 1"),
    "depth2_two_enqueued": (_double_buffered("depth2_two_enqueued", 2, 2), None),
    # float -> bfloat16_t needs a rounding mode
    "cast_bf16_rint": (_cast_bf16("cast_bf16_rint", "CAST_RINT"), None),
    "cast_bf16_none": (_cast_bf16("cast_bf16_none", "CAST_NONE"), "CAST_NONE is not supported"),
    # advanced math temp buffers: half Erf 8, Atan 12 times the operand bytes; fp32 Tan 3
    "erf_half_8": (_advanced("erf_half_8", "Erf", "half", 8), None),
    "erf_half_7": (_advanced("erf_half_7", "Erf", "half", 7), "Erf: sharedTmpBuffer of"),
    "atan_half_12": (_advanced("atan_half_12", "Atan", "half", 12), None),
    "atan_half_11": (_advanced("atan_half_11", "Atan", "half", 11), "Atan: sharedTmpBuffer of"),
    "tan_float_3": (_advanced("tan_float_3", "Tan", "float", 3), None),
    "tan_float_2": (_advanced("tan_float_2", "Tan", "float", 2), "Tan: sharedTmpBuffer of"),
    # vector operands start on 32-byte boundaries
    "operand_aligned": (_aligned("operand_aligned", 8), None),
    "operand_misaligned": (_aligned("operand_misaligned", 4), "Add: vector operand at UB offset 16 is not 32-byte aligned"),
}


@pytest.fixture(scope="module")
def rules():
    source = _PROLOGUE + "".join(kernel for kernel, _ in RULES.values())
    source += "".join(f"""
extern "C" int run_{name}(char* err, int len) {{
  const std::string e = twin::RunBlocks(1, {name});
  std::snprintf(err, len, "%s", e.c_str());
  return e.empty() ? 0 : 1;
}}
""" for name in RULES)
    command = [_build.cxx(), *twin.CXXFLAGS, f"-I{_build.TWIN_DIR}", "rules.cpp", "-o", "librules.so"]
    key = _build.key_of(_build.support_digest(), source, command)
    path = _build.cached_build("twin", key, {"rules.cpp": source}, [command], "librules.so")
    return ctypes.CDLL(str(path))


@pytest.mark.parametrize("name", sorted(RULES))
def test_twin_enforces_the_frameworks_rule(rules, name):
    _, error = RULES[name]
    err = ctypes.create_string_buffer(1024)
    rc = getattr(rules, f"run_{name}")(err, len(err))
    message = err.value.decode()
    if error is None:
        assert rc == 0, message
    else:
        assert rc == 1 and re.search(error, message), message


# ---- generated kernels of wide groups keep the limits ----------------------------------------------

def _buffers(source: str) -> dict:
    """Buffers per position, counted from the kernel source: every InitBuffer of a queue of that
    position (BUFFER_NUM or a literal count), every TBuf one."""
    buffer_num = int(re.search(r"constexpr int32_t BUFFER_NUM = (\d+);", source).group(1))
    position = {name: pos for pos, name in re.findall(r"TQue<TPosition::(\w+), \w+> (\w+);", source)}
    tbufs = set(re.findall(r"TBuf<TPosition::VECCALC> (\w+);", source))
    counts = {"VECIN": 0, "VECOUT": 0, "VECCALC": 0}
    for name, num in re.findall(r"pipe\.InitBuffer\((\w+), (\w+), ", source):
        counts[position[name]] += buffer_num if num == "BUFFER_NUM" else int(num)
    for name in re.findall(r"pipe\.InitBuffer\((\w+), [^,]+\);", source):
        assert name in tbufs, name
        counts["VECCALC"] += 1
    counts["all"] = counts["VECIN"] + counts["VECOUT"] + counts["VECCALC"]
    return counts


def _wide(n_in: int, n_out: int) -> tuple:
    """A flat group of n_in inputs (every third f16) and n_out outputs (every other f16): program
    text, input dtypes, and its float32 reference in the kernel's order of operations (exact)."""
    dtypes = ["f16" if k % 3 == 2 else "f32" for k in range(n_in)]
    out_dtypes = ["f16" if j % 2 else "f32" for j in range(n_out)]
    lines = [f"in{k}: {d}[?]" for k, d in enumerate(dtypes)]
    count = [0]

    def emit(expr):
        lines.append(f"%{count[0]} = {expr}")
        count[0] += 1
        return f"%{count[0] - 1}"

    def operand(k):
        return emit(f"Cast in{k} to=f32") if dtypes[k] == "f16" else f"in{k}"

    ops = ("Add", "Maximum", "Sub", "Minimum")
    chain = [emit(f"Add {operand(0)}, {operand(1)}")]
    for k in range(2, n_in):
        chain.append(emit(f"{ops[k % 4]} {chain[-1]}, {operand(k)}"))
    picks = [max(len(chain) - 1 - j, 0) for j in range(n_out)]
    outs = []
    for j in range(n_out):
        value = emit(f"Abs {chain[picks[j]]}")
        outs.append(emit(f"Cast {value} to=f16") if out_dtypes[j] == "f16" else value)
    lines += [f"out{j} = {v}" for j, v in enumerate(outs)]

    def reference(xs):
        fns = (np.add, np.maximum, np.subtract, np.minimum)
        values = [xs[0].astype(np.float32) + xs[1].astype(np.float32)]
        for k in range(2, n_in):
            values.append(fns[k % 4](values[-1], xs[k].astype(np.float32)))
        return [np.abs(values[picks[j]]).astype(np.float16 if out_dtypes[j] == "f16" else np.float32)
                for j in range(n_out)]

    return "\n".join(lines) + "\n", dtypes, reference


WIDE = [(5, 1), (8, 2), (16, 5), (2, 5), (5, 8), (8, 6), (16, 8)]


def _generate_wide(n_in, n_out, name):
    text, dtypes, reference = _wide(n_in, n_out)
    return generate(text, name), dtypes, reference


@pytest.fixture(scope="module")
def wide():
    kernels = {}
    for n_in, n_out in WIDE:
        kernel, dtypes, reference = _generate_wide(n_in, n_out, f"wide_{n_in}_{n_out}")
        assert kernel.ok, kernel.reason
        kernels[(n_in, n_out)] = (kernel, dtypes, reference)
    reduce_kernel = generate(REDUCE_WIDE, "wide_reduce")
    assert reduce_kernel.ok, reduce_kernel.reason
    lib = twin.build([k for k, *_ in kernels.values()] + [reduce_kernel])
    return kernels, reduce_kernel, lib


# 6 inputs (one a bias row) and 7 outputs, 4 of them reduced: the reduce schedule's row values
# share their queue too
REDUCE_WIDE = ("in0: f32[?,?]\nin1: f32[?,?]\nin2: f32[?,?]\nin3: f16[?,?]\nin4: f32[?,?]\nin5: f32[?]\n"
               "%0 = Add in0, in1\n%1 = Maximum %0, in2\n%2 = Cast in3 to=f32\n%3 = Sub %1, %2\n"
               "%4 = Minimum %3, in4\n%5 = Add %4, in5\n%6 = Max %5 axes=[1]\n%7 = Min %5 axes=[1]\n"
               "%8 = Max %0 axes=[1]\n%9 = Min %1 axes=[1]\n%10 = Abs %5\n%11 = Cast %3 to=f16\n"
               "out0 = %6\nout1 = %7\nout2 = %8\nout3 = %9\nout4 = %10\nout5 = %11\nout6 = %5\n")


def _inputs(dtypes, count, rng):
    return [rng.uniform(-8, 8, count).astype(np.float16 if d == "f16" else np.float32) for d in dtypes]


@pytest.mark.parametrize("n_in,n_out", WIDE)
def test_wide_groups_keep_the_limits_and_run_exact(wide, n_in, n_out):
    kernels, _, lib = wide
    kernel, dtypes, reference = kernels[(n_in, n_out)]
    counts = _buffers(kernel.sources[f"{kernel.name}_kernel.cpp"])
    assert counts["VECIN"] <= 8 and counts["VECOUT"] <= 8 and counts["all"] <= 64, counts
    rng = np.random.default_rng(n_in * 100 + n_out)
    for count, cores in ((50_003, 3), (1000, 1), (kernel.ub.max_tile * 2 + 17, 8)):
        xs = _inputs(dtypes, count, rng)
        outs, _ = lib.run(kernel.name, xs, cores)
        for j, (got, want) in enumerate(zip(outs, reference(xs))):
            np.testing.assert_array_equal(got, want, err_msg=f"out{j}, {count} elements, {cores} cores")


def test_wide_reduce_group_keeps_the_limits_and_runs_exact(wide):
    _, kernel, lib = wide
    counts = _buffers(kernel.sources[f"{kernel.name}_kernel.cpp"])
    assert counts["VECIN"] <= 8 and counts["VECOUT"] <= 8 and counts["all"] <= 64, counts
    rng = np.random.default_rng(7)
    for rows, cols, cores in ((37, 300, 8), (5, 30_001, 3), (1, 1, 1)):
        f32 = lambda: rng.uniform(-8, 8, (rows, cols)).astype(np.float32)  # noqa: E731
        xs = [f32(), f32(), f32(), rng.uniform(-8, 8, (rows, cols)).astype(np.float16), f32(),
              rng.uniform(-8, 8, cols).astype(np.float32)]
        v0 = xs[0] + xs[1]
        v1 = np.maximum(v0, xs[2])
        v2 = v1 - xs[3].astype(np.float32)
        v4 = np.minimum(v2, xs[4]) + xs[5]
        want = [v4.max(1), v4.min(1), v0.max(1), v1.min(1), np.abs(v4), v2.astype(np.float16), v4]
        outs, _ = lib.run(kernel.name, xs, cores)
        for j, (got, w) in enumerate(zip(outs, want)):
            np.testing.assert_array_equal(got.reshape(w.shape), w, err_msg=f"out{j}, {rows}x{cols}")


def test_the_twin_rejects_one_double_buffered_queue_per_tensor_for_wide_groups(monkeypatch):
    # every tensor its own double-buffered queue, as for small groups
    monkeypatch.setattr(emit_base, "MAX_POSITION_BUFFERS", 1000)
    kernels = {shape: _generate_wide(*shape, f"per_queue_{shape[0]}_{shape[1]}")[:2] for shape in WIDE}
    assert all(k.ok for k, _ in kernels.values())
    reduce_kernel = generate(REDUCE_WIDE, "per_queue_reduce")
    lib = twin.build([k for k, _ in kernels.values()] + [reduce_kernel])
    rng = np.random.default_rng(3)
    for (n_in, n_out), (kernel, dtypes) in kernels.items():
        counts = _buffers(kernel.sources[f"{kernel.name}_kernel.cpp"])
        assert counts["VECIN"] == 2 * n_in and counts["VECOUT"] == 2 * n_out, counts
        with pytest.raises(twin.TwinError, match="max buffer number in same queue position is 8"):
            lib.run(kernel.name, _inputs(dtypes, 50_000, rng), 2)
    xs = [rng.uniform(-1, 1, (4, 300)).astype(np.float16 if k == 3 else np.float32) for k in range(5)]
    with pytest.raises(twin.TwinError, match="max buffer number in same queue position is 8"):
        lib.run(reduce_kernel.name, xs + [np.ones(300, np.float32)], 1)


def test_a_group_needing_more_than_64_buffers_is_refused_with_the_count():
    # 70 f16 inputs, each widened into its own scratch tile and all live at once (a Max over
    # pairs of the widened inputs, summed at the end): more TBufs than one TPipe manages
    n = 70
    lines = [f"in{k}: f16[?]" for k in range(n)]
    lines += [f"%{k} = Abs in{k}" for k in range(n)]
    lines.append(f"%{n} = Add %0, %1")
    for k in range(2, n):
        lines.append(f"%{n + k - 1} = Add %{n + k - 2}, %{k}")
    lines.append(f"out0 = %{2 * n - 2}")
    lines += [f"out{1 + k} = %{k}" for k in range(3)]
    kernel = generate("\n".join(lines) + "\n", "too_many_buffers")
    assert not kernel.ok
    assert re.search(r"needs \d+ UB buffers \(queues and TBufs\), one TPipe manages at most 64", kernel.reason)
