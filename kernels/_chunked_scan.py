"""Pieces shared by the time-axis scan kernels (returns.py, gae.py).

Both ops are first-order linear recurrences over time on a ``[B, T, N]`` array (B = folded vmap
axes, N = flattened batch columns):

    reverse (anti-causal):  y_t = x_t + c_t * y_{t+1},      y_T given (the carry-in)
    forward (causal):       y_t = x_t + c_{t-1} * y_{t-1},  y_{-1} = 0   (the adjoint of reverse)

A program owns ``BLOCK_N`` columns and walks the time axis in tiles of ``CHUNK_T`` rows. Inside a
tile the recurrence is an associative scan over the affine maps ``y -> x + m * y`` (``m`` the
coefficient that multiplies the neighbour), giving ``(X_t, M_t)`` with ``y_t = X_t + M_t * carry``;
the tile's boundary row is the carry for the next tile. Loading a whole tile at once keeps many
loads in flight, unlike a row-at-a-time loop.

Two ways to cover the grid (:class:`ScanConfig`):
  * loop (``chained=False``): grid ``(column blocks, B)``; each program loops over all tiles of its
    columns, the carry stays in registers. Good when there are many column blocks (large N).
  * chained (``chained=True``): one tile per program, grid ``(tiles * B * column blocks,)``, so
    small N still fills the GPU. A program scans its tile, then finds the carry into it by decoupled
    look-back (as in single-pass GPU prefix scans): it publishes its own composed map (aggregate) at
    once, then walks back over earlier tiles, composing their aggregates until it meets a published
    carry; then it publishes its own carry and writes its outputs.
    Values travel through a scratch buffer of 64-bit words (float bits | ready flag), so value and
    flag arrive together. Tiles are handed out in scan order by an atomic
    ticket counter, so a program only waits on a program that already started: no deadlock, also
    in the interpreter, which runs programs one after another.
    Values are order-dependent in the last bit: the carry a tile meets first decides how many
    aggregates it composes, and so the rounding. ``deterministic=True`` on the ops (``pick_config``)
    composes in one fixed order instead; the ticket counter only assigns tiles, never values.
"""

from __future__ import annotations

import dataclasses

from kernels._triton import tl, triton
from kernels.launch import cdiv, next_power_of_2

READY = 1 << 32  # high word of a published carry: the ready flag


@dataclasses.dataclass(frozen=True)
class ScanConfig:
    """Tiling of a time-axis scan: ``chunk_t`` x ``block_n`` tiles, loop or chained grid."""

    chunk_t: int
    block_n: int
    chained: bool
    num_warps: int = 4
    num_stages: int | None = None
    # chained grid: True = the look-back stops at the first published carry it meets (the fastest);
    # which one that is depends on the order programs ran, and the carry's float rounding with it
    # (last-bit differences between GPU runs). False = it ignores published carries except tile 0's
    # and composes every earlier tile's aggregate, always in the order j-1, j-2, ..., 1: one fixed
    # sum order, bitwise reproducible (the kernels' deterministic mode; also how tests run the
    # aggregate-composing path under the interpreter, which runs programs in order).
    prefix_lookup: bool = True

    def __post_init__(self):
        for name in ("chunk_t", "block_n"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"ScanConfig.{name} must be a power of two, got {v}")


def choose_config(b: int, t: int, n: int) -> ScanConfig:
    """Picks the tiling from the shape (thresholds from ``benchmarks/kernels.py --sweep``; the
    sweep's figures, machine and command are in benchmarks/RESULTS.md, "Scans").

    * many columns (``b * n / 64 >= 512``) or short time axes: the loop grid with 32 x 64 tiles;
    * else, while narrow column blocks still give >= 256 programs: the loop grid with tall,
      narrow tiles (128 x 8: one 32-byte sector per row, 512 programs at N=4096, each streaming
      its columns' whole time axis, 3 tiles in flight);
    * else (few columns, long time axis): the chained grid with 64 x 32 tiles and look-back.
    """
    if b * cdiv(n, 64) >= 512 or t <= 32:
        return ScanConfig(
            chunk_t=min(next_power_of_2(t), 32), block_n=min(next_power_of_2(n), 64), chained=False
        )
    if b * cdiv(n, 8) >= 256:
        return ScanConfig(
            chunk_t=min(next_power_of_2(t), 128),
            block_n=min(next_power_of_2(n), 8),
            chained=False,
            num_warps=4,
            num_stages=3,
        )
    return ScanConfig(
        chunk_t=min(next_power_of_2(t), 64), block_n=min(next_power_of_2(n), 32), chained=True
    )


def pick_config(
    config: ScanConfig | None, b: int, t: int, n: int, deterministic: bool
) -> ScanConfig:
    """The tiling of a ``[b, t, n]`` scan: ``config`` or :func:`choose_config`'s; with
    ``deterministic`` a chained grid looks back in its fixed order (``prefix_lookup=False``), so
    every tile's carry is the same float expression on every run. (The loop grid is already
    order-free: each program walks its own columns' tiles in sequence.)"""
    cfg = config or choose_config(b, t, n)
    if deterministic and cfg.chained and cfg.prefix_lookup:
        cfg = dataclasses.replace(cfg, prefix_lookup=False)
    return cfg


def grid_and_scratch(config: ScanConfig, b: int, t: int, n: int):
    """Returns ``(grid, n_chunks, counter_size, flag_words)`` for a ``[b, t, n]`` scan.

    Chained scratch: ``[b, n_chunks, 3, n]`` words (carry, aggregate x, aggregate m per column)."""
    n_chunks = cdiv(t, config.chunk_t)
    col_blocks = cdiv(n, config.block_n)
    if config.chained:
        return (n_chunks * b * col_blocks,), n_chunks, 1, 3 * b * n_chunks * n
    return (col_blocks, b), n_chunks, 1, 1


@triton.jit
def affine_combine(x_a, m_a, x_b, m_b):
    """Composes ``y -> x_a + m_a y`` (nearer the carry) into ``y -> x_b + m_b y``
    (the next step)."""
    return x_b + m_b * x_a, m_b * m_a


@triton.jit
def program_coords(counter_ptr, n_chunks, N, CHAINED: tl.constexpr, BLOCK_N: tl.constexpr):
    """(batch row b, column block, first tile index in scan order, number of tiles)
    of this program."""
    if CHAINED:
        col_blocks = tl.cdiv(N, BLOCK_N)
        ticket = tl.atomic_add(counter_ptr, 1)
        per_tile = tl.num_programs(0) // n_chunks
        j = ticket // per_tile
        rem = ticket % per_tile
        b = rem // col_blocks
        pid_n = rem % col_blocks
        n_iter = 1
    else:
        pid_n = tl.program_id(0)
        b = tl.program_id(1)
        j = 0
        n_iter = n_chunks
    return b, pid_n, j, n_iter


@triton.jit
def tile_times(j, T, REVERSE: tl.constexpr, CHUNK_T: tl.constexpr):
    """Times of the rows of tile ``j``, in scan order: row 0 is the row nearest the carry-in.

    REVERSE (an anti-causal scan, from the end): descending times, so the scan along the rows is
    always a forward ``tl.associative_scan`` (no flip of the tile) and the carry-out is always
    the last row.
    """
    rows = tl.arange(0, CHUNK_T)
    if REVERSE:
        t = T - 1 - (j * CHUNK_T + rows)
    else:
        t = j * CHUNK_T + rows
    return t


@triton.jit
def boundary_row(y, REVERSE: tl.constexpr, CHUNK_T: tl.constexpr):
    """The row of a scanned tile that carries into the next tile: the last row in scan order
    (``tile_times`` puts rows in scan order in both directions; REVERSE is kept for symmetry)."""
    rows = tl.arange(0, CHUNK_T)
    pick = rows == CHUNK_T - 1
    return tl.sum(tl.where(pick[:, None], y, 0.0), axis=0)


@triton.jit
def scan_tile(
    x,
    m,
    carry,
    flags_ptr,
    b,
    j,
    n_chunks,
    N,
    cols,
    col_mask,
    REVERSE: tl.constexpr,
    CHUNK_T: tl.constexpr,
    CHAINED: tl.constexpr,
    PREFIX_LOOKUP: tl.constexpr,
):
    """One ``[CHUNK_T, BLOCK_N]`` tile of ``y_t = x_t + m_t * y_(t-1)`` (rows in scan order), given
    ``carry``, the value entering the tile (sequential grid) or the previous look-back's result
    (chained grid). Returns ``(y, carry)`` with the carry for the next tile: the tile's boundary row
    (sequential), or the carry into this tile found by the look-back, after publishing this tile's
    composed map and its outgoing carry for later tiles (chained)."""
    xs, ms = tl.associative_scan((x, m), 0, affine_combine)
    if CHAINED:
        x0 = boundary_row(xs, REVERSE, CHUNK_T)
        m0 = boundary_row(ms, REVERSE, CHUNK_T)
        publish_aggregate(flags_ptr, x0, m0, b, j, n_chunks, N, cols, col_mask)
        carry = lookback_carry(flags_ptr, carry, b, j, n_chunks, N, cols, col_mask, PREFIX_LOOKUP)
        publish_carry(flags_ptr, x0 + m0 * carry, b, j, n_chunks, N, cols, col_mask)
    y = xs + ms * carry[None, :]
    if not CHAINED:
        carry = boundary_row(y, REVERSE, CHUNK_T)
    return y, carry


@triton.jit
def _word_value(w):
    return (w & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True)


@triton.jit
def _all_ready(w):
    return tl.min((w >> 32).to(tl.int32), axis=0) != 0


@triton.jit
def _publish(words, value, col_mask):
    tl.atomic_xchg(
        words, value.to(tl.uint32, bitcast=True).to(tl.int64) | 4294967296, mask=col_mask
    )


@triton.jit
def publish_aggregate(flags_ptr, x0, m0, b, j, n_chunks, N, cols, col_mask):
    """Chained grid: tile ``j``'s own composed map ``carry -> x0 + m0 * carry`` (slots 1, 2)."""
    if (j > 0) & (j < n_chunks - 1):
        words = (
            flags_ptr.to(tl.pointer_type(tl.int64))
            + ((b.to(tl.int64) * n_chunks + j) * 3) * N
            + cols
        )
        _publish(words + N, x0, col_mask)
        _publish(words + 2 * N, m0, col_mask)


@triton.jit
def publish_carry(flags_ptr, carry, b, j, n_chunks, N, cols, col_mask):
    """Chained grid: tile ``j``'s outgoing carry (slot 0), which later tiles wait for."""
    if j < n_chunks - 1:
        words = (
            flags_ptr.to(tl.pointer_type(tl.int64))
            + ((b.to(tl.int64) * n_chunks + j) * 3) * N
            + cols
        )
        _publish(words, carry, col_mask)


@triton.jit
def lookback_carry(
    flags_ptr, init_carry, b, j, n_chunks, N, cols, col_mask, PREFIX_LOOKUP: tl.constexpr
):
    """Chained grid: the carry into tile ``j`` (decoupled look-back).

    Walks back over earlier tiles k = j-1, j-2, ...: a published carry of tile k ends the walk;
    otherwise tile k's published aggregate map is composed in and the walk goes on; k < 0 means the
    scan's own ``init_carry``. Readiness is decided CTA-wide (a reduction over the flags), and the
    words are read again after that decision, because threads that hold replicated copies of a
    column may have loaded theirs just before it was published.
    """
    words = flags_ptr.to(tl.pointer_type(tl.int64)) + b.to(tl.int64) * n_chunks * 3 * N + cols
    acc_x = tl.zeros_like(init_carry)
    acc_m = tl.zeros_like(init_carry) + 1.0
    carry = init_carry
    k = j - 1
    while k >= 0:
        prefix_ptrs = words + (k * 3) * N
        w = tl.load(prefix_ptrs, mask=col_mask, other=4294967296, volatile=True)
        if not PREFIX_LOOKUP:
            w = tl.where(k == 0, w, 0)
        if _all_ready(w):
            w = tl.load(prefix_ptrs, mask=col_mask, other=4294967296, volatile=True)
            carry = acc_x + acc_m * _word_value(w)
            k = -2
        else:
            wx = tl.load(prefix_ptrs + N, mask=col_mask, other=4294967296, volatile=True)
            wm = tl.load(prefix_ptrs + 2 * N, mask=col_mask, other=4294967296, volatile=True)
            if _all_ready(wx) & _all_ready(wm):
                wx = tl.load(prefix_ptrs + N, mask=col_mask, other=4294967296, volatile=True)
                wm = tl.load(prefix_ptrs + 2 * N, mask=col_mask, other=4294967296, volatile=True)
                acc_x = acc_x + acc_m * _word_value(wx)
                acc_m = acc_m * _word_value(wm)
                k = k - 1
                if k < 0:
                    carry = acc_x + acc_m * init_carry
    return carry
