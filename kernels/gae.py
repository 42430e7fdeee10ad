"""Generalised advantage estimation (GAE), time-major, as one fused Triton scan.

    delta_t = r_t + d_t * nv_t - v_t
    A_t     = delta_t + d_t * lambda_t * A_{t+1},   A_T = 0
    targets = A + v

``d`` are the discounts (``gamma * (1 - terminated)``), ``nv`` the values of the next observations
(bootstrap from ``final_obs`` on truncation) and ``lambda_`` a scalar or an array of the rewards'
shape (0 where an episode was truncated: the chain is cut while ``delta`` still bootstraps). With
``nv = values[1:] ++ last_value`` this is PureJaxRL's GAE.

Differentiable in every argument. With ``c = d * lambda`` and ``a`` the adjoint of ``A``
(``g = g_A + g_targets`` scanned forward in time: ``a_t = g_t + c_{t-1} a_{t-1}``):

    dL/dr = a,  dL/dv = g_targets - a,  dL/dnv = a d,  dL/dd = a nv + a A_{t+1} lambda,
    dL/dlambda = a A_{t+1} d   (summed over every element when lambda_ is a scalar).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernels import _chunked_scan as cs
from kernels._triton import tl, triton
from kernels.launch import (
    check_lambda_returns_inputs,
    fold_vmap,
    launch,
    resolve_backend,
    time_major_3d,
)
from kernels.returns import adjoint_scan

# --------------------------------------------------------------------------- Triton kernel


@triton.jit
def _gae_kernel(
    r_ptr,
    v_ptr,
    nv_ptr,
    d_ptr,
    lam_ptr,
    T,
    N,
    n_chunks,
    adv_ptr,
    tgt_ptr,
    counter_ptr,
    flags_ptr,
    LAMBDA_PER_STEP: tl.constexpr,
    CHAINED: tl.constexpr,
    CHUNK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREFIX_LOOKUP: tl.constexpr,
):
    """GAE over [B, T, N]; lam is [B, T, N] when LAMBDA_PER_STEP,
    else one value per batch row [B]."""
    b, pid_n, j0, n_iter = cs.program_coords(counter_ptr, n_chunks, N, CHAINED, BLOCK_N)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    base = b.to(tl.int64) * T * N
    if not LAMBDA_PER_STEP:
        lam_b = tl.load(lam_ptr + b).to(tl.float32)
    carry = tl.zeros([BLOCK_N], dtype=tl.float32)
    for it in range(n_iter):
        j = j0 + it
        t = cs.tile_times(j, T, True, CHUNK_T)
        mask = ((t >= 0) & (t < T))[:, None] & col_mask[None, :]
        offs = base + t[:, None] * N + cols[None, :]
        r = tl.load(r_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        nv = tl.load(nv_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        d = tl.load(d_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if LAMBDA_PER_STEP:
            lam = tl.load(lam_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            c = d * lam
        else:
            c = d * lam_b
        delta = r + d * nv - v
        adv, carry = cs.scan_tile(
            delta,
            c,
            carry,
            flags_ptr,
            b,
            j,
            n_chunks,
            N,
            cols,
            col_mask,
            True,
            CHUNK_T,
            CHAINED,
            PREFIX_LOOKUP,
        )
        tl.store(adv_ptr + offs, adv.to(adv_ptr.dtype.element_ty), mask=mask)
        tl.store(tgt_ptr + offs, (adv + v).to(tgt_ptr.dtype.element_ty), mask=mask)


def _gae_core(
    rewards, values, next_values, discounts, lambda_, *, lead, backend, config, deterministic=False
):
    """Launches the kernel on ``[*lead, T, *batch]`` arrays; ``lambda_`` is ``[*lead]`` or full."""
    r3, restore = time_major_3d(rewards, lead)
    b, t, n = r3.shape
    if r3.size == 0:
        return jnp.zeros(rewards.shape, rewards.dtype), jnp.zeros(rewards.shape, rewards.dtype)
    per_step = lambda_.ndim == rewards.ndim
    lam = time_major_3d(lambda_, lead)[0] if per_step else lambda_.reshape(b)
    cfg = cs.pick_config(config, b, t, n, deterministic)
    grid, n_chunks, counter_size, flag_words = cs.grid_and_scratch(cfg, b, t, n)
    adv, tgt, _, _ = launch(
        _gae_kernel,
        r3,
        time_major_3d(values, lead)[0],
        time_major_3d(next_values, lead)[0],
        time_major_3d(discounts, lead)[0],
        lam,
        t,
        n,
        n_chunks,
        out_shape=[
            jax.ShapeDtypeStruct(r3.shape, r3.dtype),
            jax.ShapeDtypeStruct(r3.shape, r3.dtype),
            jax.ShapeDtypeStruct((counter_size,), jnp.int32),
            jax.ShapeDtypeStruct((2 * flag_words,), jnp.int32),
        ],
        grid=grid,
        backend=backend,
        zeroed_outputs=(2, 3) if cfg.chained else (),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        LAMBDA_PER_STEP=per_step,
        CHAINED=cfg.chained,
        CHUNK_T=cfg.chunk_t,
        BLOCK_N=cfg.block_n,
        PREFIX_LOOKUP=cfg.prefix_lookup,
    )
    return restore(adv), restore(tgt)


# --------------------------------------------------------------------------- reference


def gae_reference(rewards, values, next_values, discounts, lambda_):
    """Plain JAX (lax.scan backwards in time); ``lambda_`` scalar or of the rewards' shape."""
    coefficients = discounts * jnp.broadcast_to(lambda_, rewards.shape)
    deltas = rewards + discounts * next_values - values

    def step(a_next, xs):
        delta, c = xs
        a = delta + c * a_next
        return a, a

    _, advantages = jax.lax.scan(
        step, jnp.zeros_like(rewards[0]), (deltas, coefficients), reverse=True
    )
    return advantages, advantages + values


# --------------------------------------------------------------------------- public op


@functools.lru_cache(maxsize=None)
def _kernel_op(backend: str, config: cs.ScanConfig | None, deterministic: bool = False):
    forward = fold_vmap(
        functools.partial(_gae_core, backend=backend, config=config, deterministic=deterministic),
        batch_axes="trailing",
    )
    adjoint = adjoint_scan(backend, config, deterministic)

    @jax.custom_vjp
    def op(rewards, values, next_values, discounts, lambda_):
        return forward(rewards, values, next_values, discounts, lambda_)

    def op_fwd(rewards, values, next_values, discounts, lambda_):
        advantages, targets = forward(rewards, values, next_values, discounts, lambda_)
        return (advantages, targets), (advantages, next_values, discounts, lambda_)

    def op_bwd(residuals, cotangents):
        advantages, next_values, discounts, lambda_ = residuals
        g_adv, g_targets = cotangents
        lam = jnp.broadcast_to(lambda_, discounts.shape)
        a = adjoint(g_adv + g_targets, discounts * lam)
        next_adv = jnp.concatenate([advantages[1:], jnp.zeros_like(advantages[:1])], axis=0)
        g_c = a * next_adv
        g_lambda = g_c * discounts
        if lambda_.ndim == 0:
            g_lambda = jnp.sum(g_lambda)
        return (
            a,
            g_targets - a,
            a * discounts,
            a * next_values + g_c * lam,
            g_lambda.astype(lambda_.dtype),
        )

    op.defvjp(op_fwd, op_bwd)
    return op


def gae(
    rewards,
    values,
    next_values,
    discounts,
    lambda_,
    *,
    backend: str | None = None,
    config: cs.ScanConfig | None = None,
    deterministic: bool = False,
):
    """Generalised advantage estimates and value targets, time-major.

    Args:
      rewards, values, next_values, discounts: float arrays ``[T, *batch]`` of one shape;
        ``discounts = gamma * (1 - terminated)``, ``next_values`` the value of the next observation.
      lambda_: float scalar or ``[T, *batch]`` array (may be traced, e.g. vmapped in a sweep).
      backend: "triton", "reference" or "interpret"; ``None`` or "auto" = the process-wide choice.
      config: tiling override (:class:`kernels._chunked_scan.ScanConfig`), for tests/benchmarks.
      deterministic: bitwise-reproducible results on the GPU (the chained grid's look-back composes
        in one fixed order instead of taking the first published carry; see ``ScanConfig``).

    Returns ``(advantages, targets)``, both ``[T, *batch]``. Differentiable in every argument.
    Raises ValueError (at trace time) on non-float dtypes, rank 0 or mismatched shapes.
    """
    r, v, nv, d, lambda_ = check_lambda_returns_inputs(
        rewards, lambda_, values=values, next_values=next_values, discounts=discounts
    )
    name = resolve_backend(backend)
    if name == "reference":
        return gae_reference(r, v, nv, d, lambda_)
    return _kernel_op(name, config, deterministic)(r, v, nv, d, lambda_)
