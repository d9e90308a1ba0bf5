"""A MatMul and the epilogue group over its output as one mix kernel (docs/ASCEND.md, "MatMul
epilogues"): the AIC runs the matrix product through the Ascend C Matmul API, each AIV applies
the epilogue program to every baseM x baseN block of C in UB and writes it out.

`generate_matmul(matmul, epilogue_text, c_input, name)` -> Kernel: `matmul` is the MatMul (its
input dtype, K, N, M when known, the transpose flags), `epilogue_text` the fused program whose
input `c_input` is the MatMul's [M, N] output. The plan decides, with the reason for every "no":

- the cube's dtypes: f16, bf16 and f32 inputs with f32 accumulation (the Atlas A2 rows of the
  Matmul API's dtype table; C is fetched into UB as float, so the epilogue reads the product
  unrounded);
- the epilogue's inputs, each read as the block: the product, [M, N] inputs (a residual) copied
  row by row, per-column vectors ([N] or [1, N]: a bias, a batch norm's scale and shift) copied
  into every row of the block, scalars broadcast; no reductions, no per-row vectors. An Add of
  the product and a per-column vector that nothing else reads is the cube's bias (SetBias) where
  the Atlas A2 table takes its type (f16, f32);
- the base tile: baseM x baseN x baseK within L0A, L0B, L0C and L1 of Atlas A2, and baseM x
  baseN within UB beside the epilogue's buffers (the C block, every input block, every output
  block, the scratch of compute.py);
- the core split (`compute_tiling`, mirrored by the emitted host function).

The epilogue's vector code is compute.py's, the same as every other schedule's; the emitter is
emit/matmul.py.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from . import ir, schedule, tiling
from .compute import ComputePlan, Refused
from .kernel import CTYPE, SIZE, Kernel, kernel_name, precision_blacklist

# Atlas A2 (dav-2201) capacities, asc-devkit impl/basic_api/utils/kernel_utils_constants.h; the
# twin (twin/lib/matmul_intf.h) holds kernels to the same numbers
L0A_BYTES = 64 * 1024
L0B_BYTES = 64 * 1024
L0C_BYTES = 128 * 1024
L1_BYTES = 512 * 1024 - 128
SYS_WORKSPACE_BYTES = 16 * 1024 * 1024  # system workspace on Atlas A2 (RESERVED_WORKSPACE, same file)
CUBE_TYPES = {"f16": "half", "bf16": "bfloat16_t", "f32": "float"}  # A and B; C is float
MAX_QUEUES = 8  # one buffer a queue: the 8 event IDs of a queue position
BASE_N = (256, 128, 64, 32)  # multiples of 32 elements: every row of a block 32-byte aligned
BASE_M = (128, 64, 32, 16)
BASE_K = (256, 128, 64, 32, 16)
DB_L0 = 2  # L0A and L0B double-buffered; L0C single

BIAS_TABLE_BYTES = 1024
BIAS_TYPES = {"f16": "half", "f32": "float"}  # a bias the cube adds (SetBias): Atlas A2 rows with C float

C, FULL, ROW, SCALAR, BIAS = "c", "full", "row", "scalar", "bias"


@dataclasses.dataclass(frozen=True)
class MatMul:
    """C[M, N] = A[M, K] x B[K, N]; A is [K, M] when transpose_a, B [N, K] when transpose_b."""

    dtype: str  # of A and B
    k: int
    n: int
    m: int = -1  # -1: known at run time
    transpose_a: bool = False
    transpose_b: bool = False

    def describe(self) -> str:
        m = "M" if self.m < 0 else str(self.m)
        return (f"MatMul {self.dtype} [{m}, {self.k}] x [{self.k}, {self.n}]"
                f"{' transpose_a' if self.transpose_a else ''}{' transpose_b' if self.transpose_b else ''}")


@dataclasses.dataclass(frozen=True)
class Block:
    """The Matmul API's base tile and L1/L0 buffering (the TCubeTiling fields the plan fixes)."""

    base_m: int
    base_n: int
    base_k: int
    depth_a1: int = 1
    depth_b1: int = 1
    db_l0a: int = DB_L0
    db_l0b: int = DB_L0
    db_l0c: int = 1

    @property
    def elements(self) -> int:
        return self.base_m * self.base_n


@dataclasses.dataclass(frozen=True)
class CubePlan:
    """What the emitter and the twin harness read."""

    matmul: MatMul
    block: Block
    c_input: int
    roles: tuple  # per epilogue input: C, FULL, ROW, SCALAR or BIAS (added by the cube)
    ub: tiling.UbPlan  # bytes per block element, with the block's element count as the tile
    bias_add: Optional[int] = None  # the epilogue's Add of C and the BIAS input, done by the cube

    @property
    def bias_type(self) -> Optional[str]:
        return BIAS_TYPES[self.matmul.dtype] if self.bias_add is not None else None


def _u32():
    return dataclasses.field(metadata={"ctype": "uint32_t"})


@dataclasses.dataclass(frozen=True)
class CubeTiling(tiling.TilingData):
    """The host's tiling of one run: the matrix, the core grid (mCores x nCores vector cores,
    each a singleCoreM x singleCoreN region of C), the launch's AI core count (two vector cores
    each) and the TCubeTiling fields the kernel hands the Matmul API."""

    M: int = _u32()
    N: int = _u32()
    K: int = _u32()
    usedCoreNum: int = _u32()
    blockDim: int = _u32()
    mCores: int = _u32()
    nCores: int = _u32()
    singleCoreM: int = _u32()
    singleCoreN: int = _u32()
    baseM: int = _u32()
    baseN: int = _u32()
    baseK: int = _u32()
    depthA1: int = _u32()
    depthB1: int = _u32()
    dbL0A: int = _u32()
    dbL0B: int = _u32()
    dbL0C: int = _u32()
    iterateOrder: int = _u32()


def compute_tiling(block: Block, m: int, n: int, k: int, core_num: int) -> CubeTiling:
    """The host tiling function (the emitted C++ does the same): the base blocks of C dealt to a
    grid of at most core_num vector cores, N first; each core's region whole base blocks."""
    fixed = dict(N=n, K=k, baseM=block.base_m, baseN=block.base_n, baseK=block.base_k,
                 depthA1=block.depth_a1, depthB1=block.depth_b1, dbL0A=block.db_l0a,
                 dbL0B=block.db_l0b, dbL0C=block.db_l0c, iterateOrder=0)
    if m <= 0 or core_num <= 0:
        return CubeTiling(M=max(m, 0), usedCoreNum=0, blockDim=0, mCores=0, nCores=0,
                          singleCoreM=0, singleCoreN=0, **fixed)
    m_blocks, n_blocks = tiling.ceil_div(m, block.base_m), tiling.ceil_div(n, block.base_n)
    n_cores = min(n_blocks, core_num)
    m_cores = min(m_blocks, max(1, core_num // n_cores))
    per_n = tiling.ceil_div(n_blocks, n_cores)
    n_cores = tiling.ceil_div(n_blocks, per_n)
    per_m = tiling.ceil_div(m_blocks, m_cores)
    m_cores = tiling.ceil_div(m_blocks, per_m)
    used = m_cores * n_cores
    return CubeTiling(M=m, usedCoreNum=used, blockDim=tiling.ceil_div(used, 2), mCores=m_cores,
                      nCores=n_cores, singleCoreM=min(per_m * block.base_m, m),
                      singleCoreN=min(per_n * block.base_n, n), **fixed)


def cpp_tiling(name: str, block: Block, n: int, k: int) -> str:
    """The struct of CubeTiling and `int NAME_tiling(M, core_num, out)`: 0, or 1 for a bad argument."""
    fields = "\n".join(f"  {ctype} {field};" for ctype, field in CubeTiling.fields())
    return f"""\
struct {name}_TilingData {{
{fields}
}};

// The base blocks of C dealt to a grid of at most core_num vector cores (N first), each core a
// region of whole blocks; the launch takes one AI core (one cube, two vector cores) per two.
static inline int {name}_tiling(uint64_t m, uint32_t core_num, {name}_TilingData* t) {{
  const uint32_t base_m = {block.base_m}, base_n = {block.base_n};
  t->M = static_cast<uint32_t>(m);
  t->N = {n};
  t->K = {k};
  t->baseM = base_m;
  t->baseN = base_n;
  t->baseK = {block.base_k};
  t->depthA1 = {block.depth_a1};
  t->depthB1 = {block.depth_b1};
  t->dbL0A = {block.db_l0a};
  t->dbL0B = {block.db_l0b};
  t->dbL0C = {block.db_l0c};
  t->iterateOrder = 0;
  t->usedCoreNum = t->blockDim = t->mCores = t->nCores = t->singleCoreM = t->singleCoreN = 0;
  if (core_num == 0 || m > 0x7fffffffu) return 1;
  if (m == 0) return 0;
  const uint64_t m_blocks = (m + base_m - 1) / base_m, n_blocks = ({n} + base_n - 1) / base_n;
  uint64_t n_cores = n_blocks < core_num ? n_blocks : core_num;
  uint64_t m_cores = core_num / n_cores > 1 ? core_num / n_cores : 1;
  if (m_cores > m_blocks) m_cores = m_blocks;
  const uint64_t per_n = (n_blocks + n_cores - 1) / n_cores, per_m = (m_blocks + m_cores - 1) / m_cores;
  n_cores = (n_blocks + per_n - 1) / per_n;
  m_cores = (m_blocks + per_m - 1) / per_m;
  t->mCores = static_cast<uint32_t>(m_cores);
  t->nCores = static_cast<uint32_t>(n_cores);
  t->usedCoreNum = static_cast<uint32_t>(m_cores * n_cores);
  t->blockDim = (t->usedCoreNum + 1) / 2;
  t->singleCoreM = static_cast<uint32_t>(per_m * base_m < m ? per_m * base_m : m);
  t->singleCoreN = static_cast<uint32_t>(per_n * base_n < {n} ? per_n * base_n : {n});
  return 0;
}}
"""


# ---- the plan ---------------------------------------------------------------------------------

def _roles(program: ir.Program, c_input: int, mm: MatMul):
    """Per input, how the block reads it; (roles, "") or (None, reason)."""
    if not 0 <= c_input < len(program.inputs):
        return None, f"the epilogue has no input {c_input} for the MatMul's output"
    c = program.inputs[c_input]
    if c.dtype != mm.dtype:
        return None, f"in{c_input} (the MatMul's output) is {c.dtype}, the MatMul's inputs {mm.dtype}"
    if c.view is None or len(c.view) != 2 or c.view[1] != mm.n or (mm.m >= 0 and c.view[0] not in (mm.m, -1)):
        return None, (f"in{c_input} (the MatMul's output) is read as {c.view}, not as the [M, {mm.n}] "
                      "product")
    roles = []
    for k, inp in enumerate(program.inputs):
        view = tuple(inp.view) if inp.view is not None else None
        if k == c_input:
            roles.append(C)
        elif view is None:
            return None, f"in{k}: unknown rank (the epilogue's inputs must be [M, N], [N] or scalars)"
        elif all(d == 1 for d in view):
            roles.append(SCALAR)
        elif view in ((mm.n,), (1, mm.n)):
            roles.append(ROW)
        elif len(view) == 2 and view[1] == mm.n and view[0] in (c.view[0], -1) and view[0] != 1:
            roles.append(FULL)
        elif len(view) == 2 and view[1] == 1:
            return None, (f"in{k} {list(view)}: a per-row vector over the product is not generated "
                          "(per-column vectors [N] and [M, N] inputs are)")
        else:
            return None, f"in{k} {list(view)} is neither [M, {mm.n}], [{mm.n}] nor a scalar"
    return tuple(roles), ""


def _uses(program: ir.Program, ref: ir.Ref) -> list:
    """Instructions reading `ref` (once an operand), and -1 for each output that is it."""
    uses = [k for k, inst in enumerate(program.insts) for o in inst.operands if o == ref]
    return uses + [-1 for out in program.outputs if out.ref == ref]


def _bias_add(program: ir.Program, roles, c_input: int, mm: MatMul):
    """(the Add instruction, its per-column input) when the epilogue adds a per-column vector to
    the product and nothing else reads either: the cube adds it (SetBias, in L0C), where the
    Atlas A2 table takes the bias type; else None."""
    if mm.dtype not in BIAS_TYPES:
        return None
    uses = _uses(program, ir.Ref("in", c_input))
    if len(uses) != 1 or uses[0] < 0 or program.insts[uses[0]].op != "Add":
        return None
    k = uses[0]
    others = [o for o in program.insts[k].operands if o != ir.Ref("in", c_input)]
    if len(others) != 1 or not isinstance(others[0], ir.Ref) or others[0].kind != "in":
        return None
    bias = others[0].index
    if roles[bias] != ROW or len(_uses(program, others[0])) != 1:
        return None
    return k, bias


def _epilogue_refusal(program: ir.Program) -> str:
    for k, inst in enumerate(program.insts):
        if inst.op in ir.REDUCTIONS:
            return (f"%{k} = {inst.op}: a reduction in the epilogue (the vector side applies "
                    "elementwise programs to each block of C)")
    for j, out in enumerate(program.outputs):
        if out.shape is not None and len(out.shape) != 2:
            return f"out{j} is written as {list(out.shape)}: the kernel writes [M, N] blocks"
    return ""


def _choose_block(mm: MatMul, per_elem: int, fixed: int, bias: int = 0):
    """The largest baseM x baseN (then baseK) that fits UB beside the epilogue and the cube's
    buffers (`bias`: bytes of a bias element the cube adds, 0 without); (Block, "") or (None,
    reason)."""
    size = SIZE[CUBE_TYPES[mm.dtype]]
    n_cap = tiling.ceil_div(mm.n, 32) * 32
    m_cap = tiling.ceil_div(mm.m, 16) * 16 if mm.m > 0 else BASE_M[0]
    best = None
    for base_n in BASE_N:
        for base_m in BASE_M:
            if base_n > max(n_cap, BASE_N[-1]) or base_m > max(m_cap, BASE_M[-1]):
                continue
            if base_m * base_n * 4 > L0C_BYTES or base_n * bias > BIAS_TABLE_BYTES:
                continue
            if base_m * base_n * per_elem + fixed > tiling.UB_BUDGET:
                continue
            if best is None or base_m * base_n > best[0] * best[1]:
                best = (base_m, base_n)
    if best is None:
        smallest = BASE_M[-1] * BASE_N[-1]
        return None, (f"UB too small: the C block and the epilogue's buffers need {per_elem} bytes per "
                      f"block element, even a {BASE_M[-1]} x {BASE_N[-1]} block needs "
                      f"{smallest * per_elem + fixed} of the {tiling.UB_BUDGET}-byte budget")
    base_m, base_n = best
    k_cap = max(tiling.ceil_div(mm.k, 16) * 16, BASE_K[-1])
    for base_k in BASE_K:
        if base_k > k_cap:
            continue
        if (base_m * base_k * size * DB_L0 <= L0A_BYTES and base_n * base_k * size * DB_L0 <= L0B_BYTES
                and (base_m + base_n) * base_k * size + base_n * bias <= L1_BYTES):
            return Block(base_m, base_n, base_k), ""
    return None, f"no baseK fits L0A/L0B for a {base_m} x {base_n} block of {mm.dtype}"


def plan(mm: MatMul, text: str, c_input: int, blacklist=frozenset()):
    """(CubePlan, ComputePlan, "") or (None, None, the reason the MatMul stays a framework op)."""
    if mm.dtype not in CUBE_TYPES:
        return None, None, (f"{mm.describe()}: the Atlas A2 cube takes f16, bf16 and f32 inputs "
                            f"(f32 accumulation); {mm.dtype} is not generated")
    if mm.k <= 0 or mm.n <= 0:
        return None, None, (f"{mm.describe()}: K and N must be known and positive when the kernel is "
                            "generated")
    try:
        program = ir.load(text)
    except ValueError as err:
        return None, None, f"the epilogue does not parse: {err}"
    why = schedule.dtype_refusal(program)
    if why:
        return None, None, why
    roles, why = _roles(program, c_input, mm)
    if roles is None:
        return None, None, why
    why = _epilogue_refusal(program)
    if why:
        return None, None, why
    queued_in = sum(r not in (SCALAR, BIAS) for r in roles)
    if queued_in > MAX_QUEUES or len(program.outputs) > MAX_QUEUES:
        return None, None, (f"{queued_in} input and {len(program.outputs)} output blocks: a queue "
                            f"position holds at most {MAX_QUEUES} one-buffer queues")
    bias_add = _bias_add(program, roles, c_input, mm)
    given = {}
    if bias_add is not None:
        roles = tuple(BIAS if k == bias_add[1] else r for k, r in enumerate(roles))
        given = {bias_add[0]: f"x{c_input}"}  # C + bias: the block GetTensorC fetches
    # read as the block ("full") or not queued: scalars, and the bias the cube reads from GM
    patterns = tuple("scalar" if r in (SCALAR, BIAS) else "full" for r in roles)
    sched = schedule.Schedule(schedule.FLAT, patterns=patterns)
    try:
        compute = ComputePlan(program, frozenset(blacklist), sched, wide_inputs={c_input},
                              given=given).plan()
    except Refused as refused:
        return None, None, f"the epilogue cannot run on the vector side: {refused}"
    in_types = [("float" if r == C else CTYPE[program.inputs[k].dtype]) for k, r in enumerate(roles)]
    buffers = [(f"in{k} block ({'C' if r == C else r})", SIZE[in_types[k]], 1)
               for k, r in enumerate(roles) if r not in (SCALAR, BIAS)]
    buffers += [(f"out{j} block", SIZE[t], 1) for j, t in enumerate(compute.out_types)]
    buffers += [(f"scratch{s}", 4, 1) for s in range(compute.slots)]
    if compute.shared_tmp[0]:
        buffers.append(("sharedTmp (advanced math)", compute.shared_tmp[0], 1))
    count = len(buffers)
    if count > 64:
        return None, None, f"needs {count} UB buffers, one TPipe manages at most 64"
    per_elem = sum(size * n for _, size, n in buffers)
    bias_bytes = SIZE[BIAS_TYPES[mm.dtype]] if bias_add is not None else 0
    block, why = _choose_block(mm, per_elem, compute.shared_tmp[1], bias_bytes)
    if block is None:
        return None, None, why
    ub = tiling.UbPlan(tuple(buffers) + ((("fixed (advanced math)", compute.shared_tmp[1], 0),)
                                         if compute.shared_tmp[1] else ()),
                       per_elem, block.elements, compute.shared_tmp[1])
    return CubePlan(mm, block, c_input, roles, ub, bias_add[0] if bias_add else None), compute, ""


def generate_matmul(mm: MatMul, text: str, c_input: int, name: str = "autofuse_matmul_0",
                    blacklist=None) -> Kernel:
    """The mix kernel of a MatMul and its epilogue, or a Kernel that is not ok with the reason."""
    from .emit.matmul import MatmulEmitter

    name = kernel_name(name)
    blacklist = precision_blacklist() if blacklist is None else frozenset(blacklist)
    cube, compute, why = plan(mm, text, c_input, blacklist)
    if cube is None:
        return Kernel(name, text, False, why)
    return MatmulEmitter(name, compute, cube).kernel()
