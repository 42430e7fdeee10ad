"""Discounted returns: G_t = r_t + d_t * G_{t+1}, G_T = bootstrap (time-major).

``discounted_returns(rewards [T, ...], discounts [T, ...], bootstrap [...])`` with any trailing
batch shape. Differentiable in all three arguments. With ``a`` the adjoint of ``G`` (the cotangent
``g`` scanned forward in time, ``a_t = g_t + d_{t-1} a_{t-1}``, the same recurrence run the other
way):

    dL/dr_t = a_t,    dL/dd_t = a_t * G_{t+1},    dL/dbootstrap = d_{T-1} * a_{T-1}.

The Triton kernel here is the general linear recurrence of ``_chunked_scan`` (both directions);
gae.py reuses its forward-in-time form for its own backward pass.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernels import _chunked_scan as cs
from kernels._triton import tl, triton
from kernels.launch import (
    check_float_array,
    fold_vmap,
    launch,
    resolve_backend,
    time_major_3d,
)

# --------------------------------------------------------------------------- Triton kernel


@triton.jit
def _linear_scan_kernel(
    x_ptr,
    c_ptr,
    init_ptr,
    T,
    N,
    n_chunks,
    y_ptr,
    counter_ptr,
    flags_ptr,
    REVERSE: tl.constexpr,
    HAS_INIT: tl.constexpr,
    CHAINED: tl.constexpr,
    CHUNK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREFIX_LOOKUP: tl.constexpr,
):
    """y = the linear recurrence of ``_chunked_scan`` over [B, T, N]; init [B, N] when HAS_INIT."""
    b, pid_n, j0, n_iter = cs.program_coords(counter_ptr, n_chunks, N, CHAINED, BLOCK_N)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    base = b.to(tl.int64) * T * N
    if HAS_INIT:
        carry = tl.load(init_ptr + b.to(tl.int64) * N + cols, mask=col_mask, other=0.0).to(
            tl.float32
        )
    else:
        carry = tl.zeros([BLOCK_N], dtype=tl.float32)
    for it in range(n_iter):
        j = j0 + it
        t = cs.tile_times(j, T, REVERSE, CHUNK_T)
        mask = ((t >= 0) & (t < T))[:, None] & col_mask[None, :]
        offs = base + t[:, None] * N + cols[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if REVERSE:
            m = tl.load(c_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        else:  # the coefficient entering step t is c_{t-1}
            m = tl.load(c_ptr + offs - N, mask=mask & (t >= 1)[:, None], other=0.0).to(tl.float32)
        y, carry = cs.scan_tile(
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
            REVERSE,
            CHUNK_T,
            CHAINED,
            PREFIX_LOOKUP,
        )
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _linear_scan_core(x, c, *init, lead, reverse, backend, config, deterministic=False):
    """Launches the kernel on ``[*lead, T, *batch]`` arrays (init: ``[*lead, *batch]``)."""
    x3, restore = time_major_3d(x, lead)
    c3, _ = time_major_3d(c, lead)
    b, t, n = x3.shape
    if x3.size == 0:
        return jnp.zeros(x.shape, x.dtype)
    cfg = cs.pick_config(config, b, t, n, deterministic)
    grid, n_chunks, counter_size, flag_words = cs.grid_and_scratch(cfg, b, t, n)
    init2 = init[0].reshape(b, n) if init else x3[:, 0, :1]  # placeholder pointer when no init
    y, _, _ = launch(
        _linear_scan_kernel,
        x3,
        c3,
        init2,
        t,
        n,
        n_chunks,
        out_shape=[
            jax.ShapeDtypeStruct(x3.shape, x3.dtype),
            jax.ShapeDtypeStruct((counter_size,), jnp.int32),
            jax.ShapeDtypeStruct((2 * flag_words,), jnp.int32),
        ],
        grid=grid,
        backend=backend,
        zeroed_outputs=(1, 2) if cfg.chained else (),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        REVERSE=reverse,
        HAS_INIT=bool(init),
        CHAINED=cfg.chained,
        CHUNK_T=cfg.chunk_t,
        BLOCK_N=cfg.block_n,
        PREFIX_LOOKUP=cfg.prefix_lookup,
    )
    return restore(y)


def adjoint_scan(backend: str, config: cs.ScanConfig | None = None, deterministic: bool = False):
    """``(g, c) -> a`` with ``a_t = g_t + c_{t-1} a_{t-1}``, ``a_0 = g_0``:
    the VJP of a reverse scan.

    A vmap-folding kernel function for ``backend`` ("triton" or "interpret"), used by the backward
    passes of discounted_returns and gae.
    """
    return fold_vmap(
        functools.partial(
            _linear_scan_core,
            reverse=False,
            backend=backend,
            config=config,
            deterministic=deterministic,
        ),
        batch_axes="trailing",
    )


# --------------------------------------------------------------------------- reference


def discounted_returns_reference(rewards, discounts, bootstrap):
    """Plain JAX (lax.scan backwards in time): G_t = r_t + d_t G_{t+1}, G_T = bootstrap."""

    def step(g_next, rd):
        r, d = rd
        g = r + d * g_next
        return g, g

    _, returns = jax.lax.scan(step, bootstrap, (rewards, discounts), reverse=True)
    return returns


# --------------------------------------------------------------------------- public op


@functools.lru_cache(maxsize=None)
def _kernel_op(backend: str, config: cs.ScanConfig | None, deterministic: bool = False):
    forward = fold_vmap(
        functools.partial(
            _linear_scan_core,
            reverse=True,
            backend=backend,
            config=config,
            deterministic=deterministic,
        ),
        batch_axes="trailing",
    )
    adjoint = adjoint_scan(backend, config, deterministic)

    @jax.custom_vjp
    def op(rewards, discounts, bootstrap):
        return forward(rewards, discounts, bootstrap)

    def op_fwd(rewards, discounts, bootstrap):
        returns = forward(rewards, discounts, bootstrap)
        return returns, (returns, discounts, bootstrap)

    def op_bwd(residuals, g):
        returns, discounts, bootstrap = residuals
        a = adjoint(g, discounts)
        next_returns = jnp.concatenate([returns[1:], bootstrap[None]], axis=0)
        return a, a * next_returns, discounts[-1] * a[-1]

    op.defvjp(op_fwd, op_bwd)
    return op


def discounted_returns(
    rewards,
    discounts,
    bootstrap,
    *,
    backend: str | None = None,
    config: cs.ScanConfig | None = None,
    deterministic: bool = False,
):
    """Discounted returns, time-major: G_t = r_t + d_t * G_{t+1}, with G_T = bootstrap.

    Args:
      rewards: float array ``[T, *batch]``.
      discounts: float array ``[T, *batch]``, e.g. ``gamma * (1 - terminated)`` (may be traced).
      bootstrap: float array ``[*batch]``, the value after the last step.
      backend: "triton", "reference" or "interpret"; ``None`` or "auto" = the process-wide choice.
      config: tiling override (:class:`kernels._chunked_scan.ScanConfig`), for tests/benchmarks.
      deterministic: bitwise-reproducible results on the GPU (the chained grid's look-back composes
        in one fixed order instead of taking the first published carry; see ``ScanConfig``).

    Returns ``[T, *batch]`` returns in the promoted float dtype. Differentiable in every argument.
    Raises ValueError (at trace time) on non-float dtypes, rank 0 or mismatched shapes.
    """
    rewards = check_float_array("rewards", rewards, min_ndim=1)
    discounts = check_float_array("discounts", discounts, min_ndim=1)
    bootstrap = check_float_array("bootstrap", bootstrap)
    if discounts.shape != rewards.shape:
        raise ValueError(
            f"discounts must have the shape of rewards {tuple(rewards.shape)}, "
            f"got {tuple(discounts.shape)}"
        )
    if bootstrap.shape != rewards.shape[1:]:
        raise ValueError(
            f"bootstrap must have the shape of one time step of rewards {tuple(rewards.shape[1:])} "
            f"(rewards {tuple(rewards.shape)}), got {tuple(bootstrap.shape)}"
        )
    dtype = jnp.result_type(rewards, discounts, bootstrap)
    rewards, discounts, bootstrap = (a.astype(dtype) for a in (rewards, discounts, bootstrap))
    name = resolve_backend(backend)
    if name == "reference":
        return discounted_returns_reference(rewards, discounts, bootstrap)
    return _kernel_op(name, config, deterministic)(rewards, discounts, bootstrap)
