"""C51 categorical (L2) projection onto a fixed support, as a Triton kernel.

Given a source distribution with atoms z_i and masses p_i (i < K_src) and a
sorted target support s_0 < s_1 < ... < s_{K-1}, each atom is clipped to
[s_0, s_{K-1}], placed in its bracket s_l <= z_i <= s_{l+1}, and its mass is
split linearly between the two ends:

    w_i   = (z_i - s_l) / (s_{l+1} - s_l)
    out_l     += p_i * (1 - w_i)
    out_{l+1} += p_i * w_i

This is rlax's ``categorical_l2_project`` (the sum over i of a triangular hat
function centred on each target atom), computed without the [B, K, K_src]
tensor in memory. For each source atom the kernel finds its bracket (a guess by
interpolation, exact for an evenly spaced support, else a binary search over the
sorted support), then, by default, adds the two shares into the output row with
atomic adds (O(K_src) work per row; the output starts at zero). A second forward
kernel (``ProjectionConfig(method="dense")``) spreads the masses over a
[rows, K] register accumulator as a rows x targets x sources tile instead
(O(K * K_src) per row, fixed summation order); ``deterministic=True`` picks it, for results
that are bitwise equal from run to run on the GPU.

The projection is linear in ``probs``; the backward is a gather:

    d p_i = (1 - w_i) g_l + w_i g_{l+1}
    d z_i = p_i (g_{l+1} - g_l) / (s_{l+1} - s_l)   if s_0 < z_i < s_{K-1}, else 0

(at an atom lying exactly on an interior support point the right-hand
derivative is used). No gradient flows into ``target_support``.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from kernels._triton import tl, triton
from kernels.launch import (
    cdiv,
    check_float_array,
    fold_vmap,
    launch,
    next_power_of_2,
    resolve_backend,
    rows_2d,
)
from kernels.softmax import concrete_value, row_tiling

__all__ = ["categorical_projection", "categorical_projection_reference"]


@triton.jit
def _bracket(z, support_row, K: tl.constexpr, SEARCH_STEPS: tl.constexpr):
    """Largest l in [0, K-2] with support_row[l] <= z (z already clipped to the range).

    Binary search, SEARCH_STEPS = ceil(log2(K - 1)) halvings of [lo, hi); support_row is a
    pointer (or a tensor of pointers shaped like z, or broadcasting to it).
    """
    lo = tl.zeros(z.shape, tl.int32)
    hi = tl.full(z.shape, K - 1, tl.int32)
    for _ in tl.static_range(SEARCH_STEPS):
        mid = (lo + hi) // 2
        go_right = tl.load(support_row + mid) <= z
        lo = tl.where(go_right, mid, lo)
        hi = tl.where(go_right, hi, mid)
    return lo


@triton.jit
def _find_bracket(z, support_row, v_min, v_max, K: tl.constexpr, SEARCH_STEPS: tl.constexpr):
    """(l, s_l, s_{l+1}) with l the largest index in [0, K-2] where s_l <= z (z clipped).

    Guesses l by linear interpolation between v_min and v_max (right for an evenly spaced
    support, where it costs one pair of loads), checks s_l <= z < s_{l+1} (or l = K-2), and
    runs the binary search for the whole program if any guess in it is wrong (uneven
    supports, rounding at the support points).
    """
    span = v_max - v_min
    t = tl.where(span > 0.0, (z - v_min) / span, 0.0) * (K - 1)
    lo = tl.minimum(tl.maximum(t.to(tl.int32), 0), K - 2)
    s_lo = tl.load(support_row + lo)
    s_hi = tl.load(support_row + lo + 1)
    good = (s_lo <= z) & ((z < s_hi) | (lo == K - 2))
    if tl.sum(tl.where(good, 0, 1)) > 0:
        lo = _bracket(z, support_row, K, SEARCH_STEPS)
        s_lo = tl.load(support_row + lo)
        s_hi = tl.load(support_row + lo + 1)
    return lo, s_lo, s_hi


@triton.jit
def _projection_fwd_kernel(
    atoms_ptr,
    probs_ptr,
    support_ptr,
    n_rows,
    rows_per_support,
    out_ptr,
    K_SRC: tl.constexpr,
    K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_S: tl.constexpr,
    SEARCH_STEPS: tl.constexpr,
):
    """BLOCK_R rows per program, BLOCK_S source atoms at a time, all in registers.

    Each source atom i gets its fractional position in the support, l_i + w_i; target j
    then receives p_i * max(0, 1 - |(j - l_i) - w_i|), which is p_i (1 - w_i) at j = l_i,
    p_i w_i at j = l_i + 1 and 0 elsewhere: the bracket split, summed over i as a
    [BLOCK_R, BLOCK_K, BLOCK_S] register tile. Row r uses support row r // rows_per_support
    (a vmapped support has one per batch element).
    """
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < n_rows
    cols = tl.arange(0, BLOCK_K)
    cols_f = cols.to(tl.float32)
    srcs = tl.arange(0, BLOCK_S)
    support_row = (
        support_ptr + (tl.minimum(rows, n_rows - 1) // rows_per_support).to(tl.int64)[:, None] * K
    )
    v_min = tl.load(support_row)
    v_max = tl.load(support_row + (K - 1))
    acc = tl.zeros([BLOCK_R, BLOCK_K], tl.float32)
    for start in range(0, K_SRC, BLOCK_S):
        s = start + srcs
        mask = row_ok[:, None] & (s[None, :] < K_SRC)
        offs = rows[:, None].to(tl.int64) * K_SRC + s[None, :]
        z = tl.load(atoms_ptr + offs, mask=mask, other=0.0)
        p = tl.load(probs_ptr + offs, mask=mask, other=0.0)
        z = tl.minimum(tl.maximum(z, v_min), v_max)
        lo, s_lo, s_hi = _find_bracket(z, support_row, v_min, v_max, K, SEARCH_STEPS)
        gap = s_hi - s_lo
        w = tl.where(gap > 0.0, (z - s_lo) / gap, 0.0)
        # (j - l_i) is exact in float32; subtracting w_i last keeps the weights exact to 1 ulp.
        offset = (cols_f[None, :, None] - lo.to(tl.float32)[:, None, :]) - w[:, None, :]
        hat = tl.maximum(1.0 - tl.abs(offset), 0.0)
        acc += tl.sum(hat * p[:, None, :], axis=2)
    out_offs = rows[:, None].to(tl.int64) * K + cols[None, :]
    tl.store(out_ptr + out_offs, acc, mask=row_ok[:, None] & (cols[None, :] < K))


@triton.jit
def _projection_scatter_kernel(
    atoms_ptr,
    probs_ptr,
    support_ptr,
    n_rows,
    rows_per_support,
    out_ptr,
    K_SRC: tl.constexpr,
    K: tl.constexpr,
    BLOCK: tl.constexpr,
    SEARCH_STEPS: tl.constexpr,
):
    """O(K) per row: BLOCK consecutive (row, source atom) pairs of the flattened [n_rows, K_SRC]
    input per program; each atom's two bracket shares are added into its row of the output
    (zeroed before the launch) with relaxed atomic adds: out[l] += p (1 - w), out[l+1] += p w.

    Loads are contiguous (no padding of K_SRC to a power of two); rows are independent, so two
    adds meet at one address only when atoms of one row share a bracket end (few, and nearby in
    the same program). The sum order of those few adds is not fixed on the GPU: results can
    differ between runs in the last bit.
    """
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = e < n_rows * K_SRC
    row = tl.minimum(e // K_SRC, n_rows - 1)
    z = tl.load(atoms_ptr + e, mask=ok, other=0.0)
    p = tl.load(probs_ptr + e, mask=ok, other=0.0)
    support_row = support_ptr + (row // rows_per_support) * K
    v_min = tl.load(support_row)
    v_max = tl.load(support_row + (K - 1))
    z = tl.minimum(tl.maximum(z, v_min), v_max)
    lo, s_lo, s_hi = _find_bracket(z, support_row, v_min, v_max, K, SEARCH_STEPS)
    gap = s_hi - s_lo
    w = tl.where(gap > 0.0, (z - s_lo) / gap, 0.0)
    target = out_ptr + row * K + lo
    tl.atomic_add(target, p * (1.0 - w), mask=ok, sem="relaxed")
    tl.atomic_add(target + 1, p * w, mask=ok, sem="relaxed")


@triton.jit
def _projection_bwd_kernel(
    atoms_ptr,
    probs_ptr,
    support_ptr,
    g_ptr,
    n_rows,
    rows_per_support,
    d_probs_ptr,
    d_atoms_ptr,
    K_SRC: tl.constexpr,
    K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,
    SEARCH_STEPS: tl.constexpr,
):
    """Per source atom: find the bracket again and gather the two cotangents."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < n_rows
    srcs = tl.arange(0, BLOCK_S)
    support_row = (
        support_ptr + (tl.minimum(rows, n_rows - 1) // rows_per_support).to(tl.int64)[:, None] * K
    )
    v_min = tl.load(support_row)
    v_max = tl.load(support_row + (K - 1))
    for start in range(0, K_SRC, BLOCK_S):
        s = start + srcs
        mask = row_ok[:, None] & (s[None, :] < K_SRC)
        offs = rows[:, None].to(tl.int64) * K_SRC + s[None, :]
        raw = tl.load(atoms_ptr + offs, mask=mask, other=0.0)
        p = tl.load(probs_ptr + offs, mask=mask, other=0.0)
        z = tl.minimum(tl.maximum(raw, v_min), v_max)
        lo, s_lo, s_hi = _find_bracket(z, support_row, v_min, v_max, K, SEARCH_STEPS)
        gap = s_hi - s_lo
        inv_gap = tl.where(gap > 0.0, 1.0 / gap, 0.0)
        w = (z - s_lo) * inv_gap
        g_base = rows[:, None].to(tl.int64) * K
        g_lo = tl.load(g_ptr + g_base + lo, mask=mask, other=0.0)
        g_hi = tl.load(g_ptr + g_base + lo + 1, mask=mask, other=0.0)
        inside = (raw > v_min) & (raw < v_max)
        tl.store(d_probs_ptr + offs, g_lo * (1.0 - w) + g_hi * w, mask=mask)
        tl.store(d_atoms_ptr + offs, tl.where(inside, p * (g_hi - g_lo) * inv_gap, 0.0), mask=mask)


# ----------------------------------------------------------------------------
# Kernel paths: atoms/probs [*lead, *batch, K_src], support [*lead, K]; one launch each.
# ----------------------------------------------------------------------------
# Tiling of the dense forward kernel (module settings so that benchmarks can sweep them):
# (row, target, source) triples per program and step, source atoms per step, warps, and the
# fewest programs to keep in flight.
TRIPLES_PER_PROGRAM = 8192
BLOCK_SRC = 64
NUM_WARPS = 4
MIN_PROGRAMS = 528


SCATTER_BLOCK = 1024  # (row, source atom) pairs per program of the scatter kernel
SCATTER_WARPS = 4


@dataclasses.dataclass(frozen=True)
class ProjectionConfig:
    """Forward kernel and its tiling.

    ``method="scatter"`` (the default): O(K) per row, ``block`` (row, source) pairs per program,
    atomic adds into a zeroed output. ``method="dense"``: a register tile of ``block_rows`` rows x
    targets x ``block_src`` sources reduced over sources (O(K * K_src) per row; the summation
    order is fixed, so results are bitwise reproducible on the GPU).
    """

    block_rows: int = 2
    block_src: int = 64
    num_warps: int = 4
    method: str = "scatter"
    block: int = 1024

    def __post_init__(self):
        if self.method not in ("scatter", "dense"):
            raise ValueError(
                f"ProjectionConfig.method must be 'scatter' or 'dense', got {self.method!r}"
            )
        if self.block < 1 or self.block & (self.block - 1):
            raise ValueError(f"ProjectionConfig.block must be a power of two, got {self.block}")


def choose_config(n_rows: int, k_src: int, k: int, method: str = "scatter") -> ProjectionConfig:
    """Scatter: SCATTER_BLOCK pairs per program. Dense: about TRIPLES_PER_PROGRAM (row, target,
    source) triples per program and step, fewer rows per program while that leaves under
    MIN_PROGRAMS programs."""
    if method == "scatter":
        return ProjectionConfig(num_warps=SCATTER_WARPS, method="scatter", block=SCATTER_BLOCK)
    block_k = next_power_of_2(k)
    block_src = min(BLOCK_SRC, next_power_of_2(k_src))
    block_rows = max(1, TRIPLES_PER_PROGRAM // (block_k * block_src))
    while block_rows > 1 and cdiv(n_rows, block_rows) < MIN_PROGRAMS:
        block_rows //= 2
    return ProjectionConfig(block_rows, block_src, NUM_WARPS, method="dense")


def _search_steps(k: int) -> int:
    """ceil(log2(k - 1)): halvings that shrink [0, k - 1) to one bracket."""
    return (k - 2).bit_length()


def _layout(atoms, probs, support, lead):
    atoms2, _ = rows_2d(atoms, lead)
    probs2, _ = rows_2d(probs, lead)
    support2 = support.reshape(-1, support.shape[-1])
    n_rows = atoms2.shape[0]
    rows_per_support = max(1, n_rows // support2.shape[0])
    return atoms2, probs2, support2, n_rows, rows_per_support


def _forward_core(atoms, probs, support, *, lead, backend, config, deterministic=False):
    atoms2, probs2, support2, n_rows, rows_per_support = _layout(atoms, probs, support, lead)
    k_src, k = atoms2.shape[1], support2.shape[1]
    out_shape = atoms.shape[:-1] + (k,)
    if n_rows == 0:
        return jnp.zeros(out_shape, jnp.float32)
    cfg = config or choose_config(n_rows, k_src, k, method="dense" if deterministic else "scatter")
    if cfg.method == "scatter":
        out = launch(
            _projection_scatter_kernel,
            atoms2,
            probs2,
            support2,
            n_rows,
            rows_per_support,
            out_shape=jax.ShapeDtypeStruct((n_rows, k), jnp.float32),
            grid=(cdiv(n_rows * k_src, cfg.block),),
            backend=backend,
            zeroed_outputs=(0,),
            num_warps=cfg.num_warps,
            K_SRC=k_src,
            K=k,
            BLOCK=cfg.block,
            SEARCH_STEPS=_search_steps(k),
        )
        return out.reshape(out_shape)
    out = launch(
        _projection_fwd_kernel,
        atoms2,
        probs2,
        support2,
        n_rows,
        rows_per_support,
        out_shape=jax.ShapeDtypeStruct((n_rows, k), jnp.float32),
        grid=(cdiv(n_rows, cfg.block_rows),),
        backend=backend,
        num_warps=cfg.num_warps,
        K_SRC=k_src,
        K=k,
        BLOCK_R=cfg.block_rows,
        BLOCK_K=next_power_of_2(k),
        BLOCK_S=min(cfg.block_src, next_power_of_2(k_src)),
        SEARCH_STEPS=_search_steps(k),
    )
    return out.reshape(out_shape)


def _backward_core(atoms, probs, support, g, *, lead, backend):
    atoms2, probs2, support2, n_rows, rows_per_support = _layout(atoms, probs, support, lead)
    k_src, k = atoms2.shape[1], support2.shape[1]
    if n_rows == 0:
        zeros = jnp.zeros(atoms.shape, jnp.float32)
        return zeros, zeros
    block_r, block_s, num_warps, _ = row_tiling(n_rows, k_src, max_tile_columns=1024)
    src = jax.ShapeDtypeStruct(atoms2.shape, jnp.float32)
    d_probs, d_atoms = launch(
        _projection_bwd_kernel,
        atoms2,
        probs2,
        support2,
        g.reshape(n_rows, k),
        n_rows,
        rows_per_support,
        out_shape=[src, src],
        grid=(cdiv(n_rows, block_r),),
        backend=backend,
        num_warps=num_warps,
        K_SRC=k_src,
        K=k,
        BLOCK_R=block_r,
        BLOCK_S=block_s,
        SEARCH_STEPS=_search_steps(k),
    )
    return d_probs.reshape(atoms.shape), d_atoms.reshape(atoms.shape)


@functools.lru_cache(maxsize=None)
def _kernel_op(backend: str, config: ProjectionConfig | None, deterministic: bool = False):
    """(atoms, probs, support) -> projected probs; VJP in atoms and probs (support: zero).
    ``deterministic``: the dense forward kernel (the backward is a gather either way)."""
    forward = fold_vmap(
        functools.partial(
            _forward_core, backend=backend, config=config, deterministic=deterministic
        )
    )
    backward = fold_vmap(functools.partial(_backward_core, backend=backend))

    @jax.custom_vjp
    def op(atoms, probs, support):
        return forward(atoms, probs, support)

    def op_fwd(atoms, probs, support):
        return forward(atoms, probs, support), (atoms, probs, support)

    def op_bwd(residuals, g):
        atoms, probs, support = residuals
        d_probs, d_atoms = backward(atoms, probs, support, g)
        return d_atoms, d_probs, jnp.zeros_like(support)

    op.defvjp(op_fwd, op_bwd)
    return op


# ----------------------------------------------------------------------------
# Reference and public function.
# ----------------------------------------------------------------------------
def categorical_projection_reference(atoms, probs, target_support):
    """Plain JAX, the XLA formulation: a [..., K, K_src] tensor of hat-function weights.

    For target atom s_j and clipped source atom z_i, with d = z_i - s_j:
    weight_ji = clip(1 - d / (s_{j+1} - s_j), 0, 1) if d >= 0 else
                clip(1 + d / (s_j - s_{j-1}), 0, 1)   (a missing neighbour: 1/gap = 0);
    out_j = sum_i weight_ji p_i.
    """
    support = target_support
    z = jnp.clip(atoms, support[0], support[-1])[..., None, :]  # [..., 1, K_src]
    gaps = support[1:] - support[:-1]
    zero = jnp.zeros((1,), support.dtype)
    gap_up = jnp.concatenate([gaps, zero])[:, None]  # s_{j+1} - s_j
    gap_down = jnp.concatenate([zero, gaps])[:, None]  # s_j - s_{j-1}
    inv_up = jnp.where(gap_up > 0, 1.0 / jnp.where(gap_up > 0, gap_up, 1.0), 0.0)
    inv_down = jnp.where(gap_down > 0, 1.0 / jnp.where(gap_down > 0, gap_down, 1.0), 0.0)
    d = z - support[:, None]  # [..., K, K_src]
    distance = jnp.where(d >= 0, d * inv_up, -d * inv_down)
    weights = jnp.clip(1.0 - distance, 0.0, 1.0)
    return jnp.sum(weights * probs[..., None, :], axis=-1)


def _check_support(target_support):
    support = check_float_array("target_support", target_support, ndim=1)
    if support.shape[0] < 2:
        raise ValueError(f"target_support needs at least 2 atoms, got shape {tuple(support.shape)}")
    values = concrete_value(target_support)  # None under jit/vmap (traced)
    if values is not None:
        if not np.all(np.diff(values) > 0):
            raise ValueError(
                f"target_support must be strictly increasing, got {values.tolist()} "
                f"(shape {tuple(support.shape)})"
            )
    return support


def categorical_projection(
    atoms,
    probs,
    target_support,
    *,
    backend: str | None = None,
    config: ProjectionConfig | None = None,
    deterministic: bool = False,
):
    """Projects the distribution (atoms, probs) onto ``target_support`` (C51's L2 projection).

    Semantics of rlax's ``categorical_l2_project``: atoms are clipped to
    [target_support[0], target_support[-1]] and each atom's mass is split linearly
    between the two support points around it.

    Args:
      atoms: float array ``[*batch, K_src]`` (e.g. r + gamma * z).
      probs: float array ``[*batch, K_src]``, the masses of ``atoms``.
      target_support: float array ``[K]``, K >= 2, strictly increasing (evenly
        spaced or not; checked when concrete).
      backend: "triton", "reference" or "interpret"; ``None`` or "auto" = the process-wide choice.
      config: tiling override of the forward kernel (:class:`ProjectionConfig`), for
        tests and benchmarks; ``None`` = :func:`choose_config`.
      deterministic: ``True`` = the fixed-order dense kernel (bitwise reproducible on the GPU,
        O(K * K_src) per row) instead of the atomic-add scatter, whose sum order at a shared
        target atom follows thread timing (last-bit differences between GPU runs).

    Returns ``[*batch, K]``. Differentiable in ``probs`` (the projection is linear in
    them) and in ``atoms`` (piecewise linear); ``target_support`` gets no gradient.
    Raises ValueError at trace time for bad dtypes, ranks or shapes (naming them).
    """
    atoms = check_float_array("atoms", atoms, min_ndim=1)
    probs = check_float_array("probs", probs, min_ndim=1)
    if tuple(probs.shape) != tuple(atoms.shape):
        raise ValueError(
            f"probs must have the shape of atoms {tuple(atoms.shape)}, got {tuple(probs.shape)}"
        )
    if atoms.shape[-1] == 0:
        raise ValueError(f"atoms must have at least one atom, got shape {tuple(atoms.shape)}")
    support = jax.lax.stop_gradient(_check_support(target_support))
    dtype = jnp.result_type(atoms, probs)
    name = resolve_backend(backend)
    if name == "reference":
        return categorical_projection_reference(
            atoms.astype(dtype), probs.astype(dtype), support.astype(dtype)
        )
    f32 = jnp.float32
    if deterministic and config is not None and config.method != "dense":
        raise ValueError(
            "categorical_projection(deterministic=True) needs the fixed-order kernel, "
            f"ProjectionConfig(method='dense'); got method={config.method!r}"
        )
    out = _kernel_op(name, config, deterministic)(
        atoms.astype(f32), probs.astype(f32), support.astype(f32)
    )
    return out.astype(dtype)
