"""Softmax over one axis as a Triton kernel, with a Triton backward.

    p_i  = exp(x_i - max_j x_j) / sum_k exp(x_k - max_j x_j)
    dx_i = p_i * (g_i - sum_k g_k p_k)            (the vector-Jacobian product)

Every row is independent, so the work is a 2-D tile of rows x columns:
narrow rows (policy heads, 2..51 columns) put many rows in one program, a row
of up to ``MAX_TILE_COLUMNS`` columns is held in registers whole, and wider
rows are streamed in chunks (an online max/sum pass, then a write pass).
The backward reads the saved probabilities ``p`` and the cotangent ``g``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from kernels._triton import tl, triton
from kernels.launch import (
    cdiv,
    check_float_array,
    chosen_automatically,
    fold_vmap,
    launch,
    next_power_of_2,
    resolve_backend,
    rows_2d,
)

__all__ = ["softmax", "softmax_reference"]

# With the automatic backend choice, rows narrower than this go to XLA: forward + backward over
# 65536 rows (benchmarks/RESULTS.md, "Every op on one H200" and "Row ops under `auto`"), at 2 / 6
# columns XLA 8.3 / 10.2 us against Triton 12.2 / 15.3 us on an H200 (two launches' cost against
# XLA's fused kernels); at 18 columns Triton 1.3x faster on an H200 but 0.8x, 0.8x and 0.9x on an
# H100 (three runs, two leases); from 51 columns on Triton is faster on both (1.2x to 1.5x).
AUTO_TRITON_MIN_COLUMNS = 32
# Rows up to this many columns are held in registers whole; wider rows loop.
MAX_TILE_COLUMNS = 8192
# Tiling of the row kernels (module settings so that benchmarks can sweep them):
# elements one program of the narrow-row kernels works on, the fewest programs to keep
# in flight when splitting rows across them, and warps per program (None: by tile size).
TILE_ELEMENTS = 2048
MIN_PROGRAMS = 528
NUM_WARPS = None


# ----------------------------------------------------------------------------
# Triton kernels (row-major [n_rows, N] float32).
# ----------------------------------------------------------------------------
@triton.jit
def _softmax_fwd_tile_kernel(
    x_ptr,
    n_rows,
    p_ptr,
    N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One program: BLOCK_R whole rows, each held in registers."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < N)
    offs = rows[:, None].to(tl.int64) * N + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=-float("inf"))
    row_max = tl.max(x, axis=1)
    # Padding rows are all -inf; shift them by 0 so they stay NaN-free.
    row_max = tl.where(rows < n_rows, row_max, 0.0)
    e = tl.exp(x - row_max[:, None])
    denom = tl.sum(e, axis=1)
    tl.store(p_ptr + offs, e / denom[:, None], mask=mask)


@triton.jit
def _softmax_fwd_loop_kernel(
    x_ptr,
    p_ptr,
    N: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One program per row, streamed in BLOCK_N chunks (rows wider than a tile).

    Pass 1 keeps a running max m and a running sum s of exp(x - m) per lane,
    rescaling s whenever m grows; pass 2 writes exp(x - M) / S.
    """
    base = tl.program_id(0).to(tl.int64) * N
    cols = tl.arange(0, BLOCK_N)
    run_max = tl.full([BLOCK_N], -float("inf"), tl.float32)
    run_sum = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, N, BLOCK_N):
        c = start + cols
        x = tl.load(x_ptr + base + c, mask=c < N, other=-float("inf"))
        new_max = tl.maximum(run_max, x)
        safe_max = tl.where(new_max == -float("inf"), 0.0, new_max)
        run_sum = run_sum * tl.exp(run_max - safe_max) + tl.exp(x - safe_max)
        run_max = new_max
    row_max = tl.max(run_max, axis=0)
    lane_scale = tl.where(run_max == -float("inf"), 0.0, tl.exp(run_max - row_max))
    denom = tl.sum(run_sum * lane_scale, axis=0)
    for start in range(0, N, BLOCK_N):
        c = start + cols
        x = tl.load(x_ptr + base + c, mask=c < N, other=-float("inf"))
        tl.store(p_ptr + base + c, tl.exp(x - row_max) / denom, mask=c < N)


@triton.jit
def _softmax_bwd_tile_kernel(
    p_ptr,
    g_ptr,
    n_rows,
    dx_ptr,
    N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """dx = p * (g - sum(g * p)) for BLOCK_R whole rows."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < N)
    offs = rows[:, None].to(tl.int64) * N + cols[None, :]
    p = tl.load(p_ptr + offs, mask=mask, other=0.0)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    dot = tl.sum(g * p, axis=1)
    tl.store(dx_ptr + offs, p * (g - dot[:, None]), mask=mask)


@triton.jit
def _softmax_bwd_loop_kernel(
    p_ptr,
    g_ptr,
    dx_ptr,
    N: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """dx = p * (g - sum(g * p)) for one wide row, in BLOCK_N chunks."""
    base = tl.program_id(0).to(tl.int64) * N
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, N, BLOCK_N):
        c = start + cols
        p = tl.load(p_ptr + base + c, mask=c < N, other=0.0)
        g = tl.load(g_ptr + base + c, mask=c < N, other=0.0)
        acc += g * p
    dot = tl.sum(acc, axis=0)
    for start in range(0, N, BLOCK_N):
        c = start + cols
        p = tl.load(p_ptr + base + c, mask=c < N, other=0.0)
        g = tl.load(g_ptr + base + c, mask=c < N, other=0.0)
        tl.store(dx_ptr + base + c, p * (g - dot), mask=c < N)


# ----------------------------------------------------------------------------
# Tiling: how many rows and columns one program handles.
# ----------------------------------------------------------------------------
def row_tiling(
    n_rows: int,
    n_cols: int,
    *,
    max_tile_columns: int | None = None,
    tile_elements: int | None = None,
    min_programs: int | None = None,
    num_warps: int | None = None,
):
    """(BLOCK_R, BLOCK_N, num_warps, looped) for a row-wise kernel over [n_rows, n_cols].

    BLOCK_N is n_cols rounded up to a power of two; narrow rows share a program
    (BLOCK_R * BLOCK_N ~ tile_elements) while at least min_programs programs
    remain; rows wider than ``max_tile_columns`` are streamed (``looped``).
    Unset arguments take this module's MAX_TILE_COLUMNS, TILE_ELEMENTS, MIN_PROGRAMS, NUM_WARPS.
    """
    limit = MAX_TILE_COLUMNS if max_tile_columns is None else max_tile_columns
    tile_elements = TILE_ELEMENTS if tile_elements is None else tile_elements
    min_programs = MIN_PROGRAMS if min_programs is None else min_programs
    num_warps = NUM_WARPS if num_warps is None else num_warps
    block_n = next_power_of_2(n_cols)
    if block_n > limit:
        return 1, limit, num_warps or 8, True
    block_r = max(1, tile_elements // block_n)
    while block_r > 1 and cdiv(n_rows, block_r) < min_programs:
        block_r //= 2
    elements = block_r * block_n
    if num_warps is None:
        num_warps = 4 if elements <= 2048 else (8 if elements <= 4096 else 16)
    return block_r, block_n, num_warps, False


# ----------------------------------------------------------------------------
# Kernel paths: [*lead, *batch, N] -> rows x N, one launch each.
# ----------------------------------------------------------------------------
def _forward_core(x, *, lead, backend):
    x2, restore = rows_2d(x, lead)
    n_rows, n = x2.shape
    if x2.size == 0:
        return x
    block_r, block_n, num_warps, looped = row_tiling(n_rows, n)
    out = jax.ShapeDtypeStruct(x2.shape, jnp.float32)
    if looped:
        p = launch(
            _softmax_fwd_loop_kernel,
            x2,
            out_shape=out,
            grid=(n_rows,),
            backend=backend,
            num_warps=num_warps,
            N=n,
            BLOCK_N=block_n,
        )
    else:
        p = launch(
            _softmax_fwd_tile_kernel,
            x2,
            n_rows,
            out_shape=out,
            grid=(cdiv(n_rows, block_r),),
            backend=backend,
            num_warps=num_warps,
            N=n,
            BLOCK_R=block_r,
            BLOCK_N=block_n,
        )
    return restore(p)


def _backward_core(p, g, *, lead, backend):
    p2, restore = rows_2d(p, lead)
    g2, _ = rows_2d(g, lead)
    n_rows, n = p2.shape
    if p2.size == 0:
        return g
    block_r, block_n, num_warps, looped = row_tiling(n_rows, n)
    out = jax.ShapeDtypeStruct(p2.shape, jnp.float32)
    if looped:
        dx = launch(
            _softmax_bwd_loop_kernel,
            p2,
            g2,
            out_shape=out,
            grid=(n_rows,),
            backend=backend,
            num_warps=num_warps,
            N=n,
            BLOCK_N=block_n,
        )
    else:
        dx = launch(
            _softmax_bwd_tile_kernel,
            p2,
            g2,
            n_rows,
            out_shape=out,
            grid=(cdiv(n_rows, block_r),),
            backend=backend,
            num_warps=num_warps,
            N=n,
            BLOCK_R=block_r,
            BLOCK_N=block_n,
        )
    return restore(dx)


@functools.lru_cache(maxsize=None)
def _kernel_op(backend: str):
    """softmax over the last axis of a float32 array, differentiable, for one backend."""
    forward = fold_vmap(functools.partial(_forward_core, backend=backend), batch_axes="leading")
    backward = fold_vmap(functools.partial(_backward_core, backend=backend), batch_axes="leading")

    @jax.custom_vjp
    def op(x):
        return forward(x)

    def op_fwd(x):
        p = forward(x)
        return p, p

    def op_bwd(p, g):
        return (backward(p, g),)

    op.defvjp(op_fwd, op_bwd)
    return op


# ----------------------------------------------------------------------------
# Reference and public function.
# ----------------------------------------------------------------------------
def softmax_reference(x, axis: int = -1):
    """Plain JAX: exp(x - max) / sum(exp(x - max)) along ``axis`` (XLA's jax.nn.softmax)."""
    return jax.nn.softmax(x, axis=axis)


def concrete_value(x):
    """``x`` as a NumPy array when its value is known at trace time, else ``None`` (a tracer)."""
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def _check_axis(axis, x) -> int:
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise ValueError(f"axis must be an int, got {axis!r} for x of shape {tuple(x.shape)}")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(
            f"axis {axis} is out of range for x of shape {tuple(x.shape)} (rank {x.ndim})"
        )
    return int(axis) % x.ndim


def automatic_crossover(name: str, automatic: bool, columns: int) -> str:
    """The backend that runs a softmax over rows of ``columns`` entries: ``"reference"`` (XLA) in
    place of an automatically chosen ``"triton"`` below ``AUTO_TRITON_MIN_COLUMNS``,
    else ``name``."""
    if name == "triton" and automatic and columns < AUTO_TRITON_MIN_COLUMNS:
        return "reference"
    return name


def softmax(x, axis: int = -1, *, backend: str | None = None):
    """Softmax of ``x`` along ``axis``: p = exp(x - max(x)) / sum(exp(x - max(x))).

    Args:
      x: floating-point array of rank >= 1 (any leading batch shape). Kernel
        backends compute in float32 and return ``x``'s dtype.
      axis: the axis to normalise over (an int; default the last).
      backend: "triton", "reference" or "interpret"; ``None`` or "auto" = the process-wide choice.
        When that choice is the automatic one (none named anywhere) on a GPU, rows of fewer than
        ``AUTO_TRITON_MIN_COLUMNS`` (32) entries go to XLA, which is faster there (measured); a
        named ``"triton"`` always runs the kernel.

    Differentiable: the backward is dx = p * (g - sum(g * p)) (a second kernel).
    Raises ValueError at trace time for non-float dtypes, rank 0 or a bad axis.
    """
    x = check_float_array("x", x, min_ndim=1)
    axis = _check_axis(axis, x)
    name = automatic_crossover(
        resolve_backend(backend), chosen_automatically(backend), x.shape[axis]
    )
    if name == "reference":
        return softmax_reference(x, axis)
    moved = jnp.moveaxis(x, axis, -1).astype(jnp.float32)
    p = _kernel_op(name)(moved)
    return jnp.moveaxis(p, -1, axis).astype(x.dtype)
