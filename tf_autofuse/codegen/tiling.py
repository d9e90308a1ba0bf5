"""Tiling: how a flat kernel splits N elements over cores and UB-sized tiles.

The generator fixes, per kernel, how many bytes of UB one element of a tile costs (every queue
buffer times its buffer count, plus every scratch TBuf) and from that the largest tile that fits
the UB budget. The host tiling function (emitted in C++ by ascendc.py, mirrored by `compute`
here for the debug dump and the tests) then picks, for the run-time element count and core
count, the block count, each core's share, the tile count and the tail.
"""

from __future__ import annotations

import dataclasses

UB_BYTES = 192 * 1024  # UB of one AIV core, Atlas A2/A3
UB_RESERVED_BYTES = 8 * 1024  # kept free for the framework (the twin enforces the same)
UB_BUDGET = UB_BYTES - UB_RESERVED_BYTES
ALIGN_ELEMS = 128  # tile and core shares are multiples of this: 32 B of any dtype, 256 B of f16
BUFFER_NUM = 2  # double buffering of every queue

@dataclasses.dataclass(frozen=True)
class UbPlan:
    """What one tile element costs in UB, and the largest tile that fits."""

    buffers: tuple  # (name, bytes per element, buffer count)
    bytes_per_element: int
    max_tile: int  # elements; 0 when not even ALIGN_ELEMS fit
    fixed: int = 0  # bytes that do not scale with the tile

    def ub_bytes(self, tile: int) -> int:
        return tile * self.bytes_per_element + self.fixed

    def describe(self) -> str:
        parts = [f"{name}: {size} B x {count}" if count else f"{name}: {size} B"
                 for name, size, count in self.buffers]
        return (f"{self.bytes_per_element} B of UB per tile element ({'; '.join(parts)}); "
                f"max tile {self.max_tile} elements = {self.ub_bytes(self.max_tile)} of "
                f"{UB_BUDGET} budget bytes")


def plan_ub(buffers, fixed: int = 0) -> UbPlan:
    """`fixed`: bytes that do not scale with the tile (row accumulators), 32-byte granular."""
    buffers = tuple(buffers)
    if fixed:
        buffers += (("fixed (accumulators)", fixed, 0),)
    per_elem = sum(size * count for _, size, count in buffers)
    tile = ((UB_BUDGET - fixed) // per_elem) // ALIGN_ELEMS * ALIGN_ELEMS if per_elem else 0
    return UbPlan(buffers, per_elem, tile, fixed)


def _u64():
    return dataclasses.field(metadata={"ctype": "uint64_t"})


def _u32():
    return dataclasses.field(metadata={"ctype": "uint32_t"})


class TilingData:
    """A tiling struct as the host fills it and the kernel reads it: its dataclass fields, in
    struct order, each with its C type (`fields`)."""

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def fields(cls) -> tuple:
        """(C type, name) of each field, in struct order."""
        return tuple((f.metadata["ctype"], f.name) for f in dataclasses.fields(cls))


@dataclasses.dataclass(frozen=True)
class Tiling(TilingData):
    """The flat schedule; 48 bytes, no padding."""

    totalLength: int = _u64()
    blockLength: int = _u64()
    lastBlockLength: int = _u64()
    blockDim: int = _u32()
    tileLength: int = _u32()
    tileNum: int = _u32()
    tailLength: int = _u32()
    lastTileNum: int = _u32()
    lastTailLength: int = _u32()


def ceil_div(a: int, b: int) -> int:
    """a / b rounded up (b > 0)."""
    return -(-a // b)


def compute(total: int, core_num: int, max_tile: int) -> Tiling:
    """The host tiling function (same arithmetic as the emitted C++)."""
    if total <= 0 or core_num <= 0:
        return Tiling(max(total, 0), 0, 0, 0, max_tile, 0, 0, 0, 0)
    units = ceil_div(total, ALIGN_ELEMS)
    block_dim = min(core_num, units)
    block_len = ceil_div(units, block_dim) * ALIGN_ELEMS
    block_dim = ceil_div(total, block_len)
    last_len = total - (block_dim - 1) * block_len
    tile = min(max_tile, block_len)

    def split(length):
        num = ceil_div(length, tile)
        return num, length - (num - 1) * tile

    tile_num, tail = split(block_len)
    last_num, last_tail = split(last_len)
    return Tiling(total, block_len, last_len, block_dim, tile, tile_num, tail, last_num, last_tail)


def _row_tiled(name: str, doc: str, dims: tuple):
    """The tiling struct of a schedule whose tiles are chunks of rows: its `dims` (uint64_t),
    then how the tiles are dealt (what _CPP_DEAL fills)."""
    fields = [(dim, int, _u64()) for dim in dims] + [
        ("tilesPerRow", int, _u64()), ("totalTiles", int, _u64()),
        ("tilesPerBlock", int, _u64()), ("blockDim", int, _u32()), ("tileLength", int, _u32())]
    cls = dataclasses.make_dataclass(name, fields, bases=(TilingData,), frozen=True)
    cls.__doc__, cls.__module__ = doc, __name__
    return cls


BcastTiling = _row_tiled(
    "BcastTiling", "The broadcast schedule: tiles are chunks of one row of the [outer, inner] view.",
    ("outer", "inner"))


def compute_bcast(outer: int, inner: int, core_num: int, max_tile: int, rows: bool = False) -> BcastTiling:
    """rows: blocks take whole rows (the reduce schedule)."""
    if outer <= 0 or inner <= 0 or core_num <= 0:
        return BcastTiling(max(outer, 0), max(inner, 0), 0, 0, 0, 0, max_tile)
    tile, per_row = _row_tiles(inner, max_tile)
    total = outer * per_row
    if rows:
        per_block = ceil_div(outer, min(core_num, outer)) * per_row
    else:
        per_block = ceil_div(total, min(core_num, total))
    return BcastTiling(outer, inner, per_row, total, per_block, ceil_div(total, per_block), tile)


def _row_tiles(inner: int, max_tile: int) -> tuple:
    """(tile, tiles a row) when tiles are chunks of rows of `inner` elements: the UB maximum, or
    the row rounded up to ALIGN_ELEMS."""
    tile = min(max_tile, ceil_div(inner, ALIGN_ELEMS) * ALIGN_ELEMS)
    return tile, ceil_div(inner, tile)


def _cpp_constants(kernel: str, max_tile: int) -> str:
    """The alignment and UB tile of a kernel's host tiling function."""
    return (f"static const uint32_t {kernel}_ALIGN = {ALIGN_ELEMS};\n"
            f"static const uint32_t {kernel}_MAX_TILE = {max_tile};  "
            "// from the UB budget, see the kernel header\n")


def _cpp_max_tile(kernel: str) -> str:
    """The first lines of a tiling function: the alignment, and the tile a test may force."""
    return (f"  const uint64_t align = {kernel}_ALIGN;\n"
            f"  uint64_t max_tile = tile_override ? tile_override : {kernel}_MAX_TILE;\n")


# A row-tiled schedule's struct before anything is known (broadcast, column); 1 for no core.
_CPP_NO_TILES = """\
  t->tilesPerRow = t->totalTiles = t->tilesPerBlock = 0;
  t->blockDim = 0;
  t->tileLength = static_cast<uint32_t>(max_tile);
  if (core_num == 0) return 1;
"""
# ... and its end: `total` tiles of `per_row` a row, `per_block` a block.
_CPP_DEAL = """\
  t->tileLength = static_cast<uint32_t>(tile);
  t->tilesPerRow = per_row;
  t->totalTiles = total;
  t->tilesPerBlock = per_block;
  t->blockDim = static_cast<uint32_t>((total + per_block - 1) / per_block);
  return 0;
}
"""


def cpp_bcast_function(kernel: str, struct: str, max_tile: int, rows: bool = False) -> str:
    """`int KERNEL_tiling(outer, inner, core_num, tile_override, out)`."""
    if rows:
        split = ("  uint64_t block_dim = outer < core_num ? outer : core_num;  // whole rows a block\n"
                 "  uint64_t per_block = (outer + block_dim - 1) / block_dim * per_row;")
    else:
        split = ("  uint64_t block_dim = total < core_num ? total : core_num;\n"
                 "  uint64_t per_block = (total + block_dim - 1) / block_dim;")
    return f"""\
{_cpp_constants(kernel, max_tile)}
// Tiles are chunks of one row of the [outer, inner] iteration view (the tile: the UB maximum, or
// the row rounded up to {ALIGN_ELEMS}); the outer x tilesPerRow tiles are dealt to at most core_num
// blocks in equal runs. tile_override != 0 forces the tile (tests).
extern "C" int {kernel}_tiling(uint64_t outer, uint64_t inner, uint32_t core_num,
                               uint32_t tile_override, {struct}* t) {{
{_cpp_max_tile(kernel)}  t->outer = outer;
  t->inner = inner;
{_CPP_NO_TILES}  if (outer == 0) return 0;
  if (inner == 0) return {2 if rows else 0};  // an empty reduction gives identities: the CPU path
  uint64_t row = (inner + align - 1) / align * align;
  uint64_t tile = max_tile < row ? max_tile : row;
  uint64_t per_row = (inner + tile - 1) / tile;
  uint64_t total = outer * per_row;
{split}
{_CPP_DEAL}"""


def cpp_struct(name: str, bcast: bool = False, column: bool = False) -> str:
    fields = "\n".join(f"  {ctype} {field};" for ctype, field in
                       (ColumnTiling if column else BcastTiling if bcast else Tiling).fields())
    return f"struct {name} {{\n{fields}\n}};\n"


def cpp_function(kernel: str, struct: str, max_tile: int) -> str:
    """`int KERNEL_tiling(total, core_num, tile_override, out)`: 0, or 1 for a bad argument."""
    return f"""\
{_cpp_constants(kernel, max_tile)}
// Picks the block count (at most core_num, at least {ALIGN_ELEMS} elements a core), each core's
// share (a multiple of {ALIGN_ELEMS}; the last core takes the rest), the tile (the UB maximum, or
// less for small shares) and the tail tile of each kind of core. tile_override != 0 forces the
// tile (tests).
extern "C" int {kernel}_tiling(uint64_t total, uint32_t core_num, uint32_t tile_override,
                               {struct}* t) {{
{_cpp_max_tile(kernel)}  t->totalLength = total;
  t->blockLength = t->lastBlockLength = 0;
  t->blockDim = t->tileNum = t->tailLength = t->lastTileNum = t->lastTailLength = 0;
  t->tileLength = static_cast<uint32_t>(max_tile);
  if (total == 0 || core_num == 0) return core_num == 0 ? 1 : 0;
  uint64_t units = (total + align - 1) / align;
  uint64_t block_dim = units < core_num ? units : core_num;
  uint64_t block_len = (units + block_dim - 1) / block_dim * align;
  block_dim = (total + block_len - 1) / block_len;
  uint64_t last_len = total - (block_dim - 1) * block_len;
  uint64_t tile = max_tile < block_len ? max_tile : block_len;
  t->blockDim = static_cast<uint32_t>(block_dim);
  t->blockLength = block_len;
  t->lastBlockLength = last_len;
  t->tileLength = static_cast<uint32_t>(tile);
  t->tileNum = static_cast<uint32_t>((block_len + tile - 1) / tile);
  t->tailLength = static_cast<uint32_t>(block_len - (t->tileNum - 1) * tile);
  t->lastTileNum = static_cast<uint32_t>((last_len + tile - 1) / tile);
  t->lastTailLength = static_cast<uint32_t>(last_len - (t->lastTileNum - 1) * tile);
  return 0;
}}
"""


ColumnTiling = _row_tiled(
    "ColumnTiling", "The column schedule: the iteration shape as [outer, mid (reduced), inner].",
    ("outer", "mid", "inner"))


def compute_column(outer: int, mid: int, inner: int, core_num: int, max_tile: int,
                   rows: bool = False) -> ColumnTiling:
    """Work items are (outer index, chunk of the inner axis); each walks the mid (reduced) axis.
    rows (the 3-level broadcast): items are (outer x mid row, chunk), nothing is walked."""
    if outer <= 0 or inner <= 0 or mid <= 0 or core_num <= 0:
        return ColumnTiling(max(outer, 0), max(mid, 0), max(inner, 0), 0, 0, 0, 0, max_tile)
    if rows:
        tile, per_row = _row_tiles(inner, max_tile)
        total = outer * mid * per_row
    else:
        want = ceil_div(core_num, outer)  # chunks a row so that every core gets an item, when it can
        tile = min(max_tile, ceil_div(ceil_div(inner, want), ALIGN_ELEMS) * ALIGN_ELEMS)
        per_row = ceil_div(inner, tile)
        total = outer * per_row
    per_block = ceil_div(total, min(core_num, total))
    return ColumnTiling(outer, mid, inner, per_row, total, per_block, ceil_div(total, per_block), tile)


def cpp_column_function(kernel: str, struct: str, max_tile: int, rows: bool = False) -> str:
    """`int KERNEL_tiling(outer, mid, inner, core_num, tile_override, out)`. rows: the 3-level
    broadcast (items are chunks of the outer x mid rows of length inner)."""
    if rows:
        comment = f"""\
// The iteration shape as [outer, mid, inner]; tiles are chunks of one of the outer x mid rows (the
// tile: the UB maximum, or the row rounded up to {ALIGN_ELEMS}), dealt to at most core_num blocks in
// equal runs. tile_override != 0 forces the tile (tests).
"""
        split = """\
  if (outer == 0 || mid == 0 || inner == 0) return 0;
  uint64_t row = (inner + align - 1) / align * align;
  uint64_t tile = max_tile < row ? max_tile : row;
  uint64_t per_row = (inner + tile - 1) / tile;
  uint64_t total = outer * mid * per_row;
"""
    else:
        comment = f"""\
// The iteration shape as [outer, mid, inner], mid reduced. Work items are {ALIGN_ELEMS}-aligned
// chunks of the inner axis (at most the UB tile, smaller when that gives every core an item), per
// outer index; each walks the mid axis accumulating element-wise. The outer x tilesPerRow items are dealt to at most core_num blocks in equal runs.
// Returns 2 (the CPU path) for an empty reduction, 0 otherwise; tile_override != 0 forces the tile.
"""
        split = """\
  if (outer == 0 || inner == 0) return 0;
  if (mid == 0) return 2;  // an empty reduction gives identities: the CPU path
  uint64_t want = (core_num + outer - 1) / outer;  // chunks a row so that every core gets an item
  uint64_t chunk = ((inner + want - 1) / want + align - 1) / align * align;
  uint64_t tile = max_tile < chunk ? max_tile : chunk;
  uint64_t per_row = (inner + tile - 1) / tile;
  uint64_t total = outer * per_row;
"""
    return f"""\
{_cpp_constants(kernel, max_tile)}
{comment}extern "C" int {kernel}_tiling(uint64_t outer, uint64_t mid, uint64_t inner, uint32_t core_num,
                               uint32_t tile_override, {struct}* t) {{
{_cpp_max_tile(kernel)}  t->outer = outer;
  t->mid = mid;
  t->inner = inner;
{_CPP_NO_TILES}{split}  uint64_t block_dim = total < core_num ? total : core_num;
  uint64_t per_block = (total + block_dim - 1) / block_dim;
{_CPP_DEAL}"""
