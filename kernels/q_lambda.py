"""Peng's Q(lambda) / TD(lambda) returns, time-major, as one fused Triton scan.

    G_t = r_t + d_t [(1 - lambda_t) nv_t + lambda_t G_{t+1}],     lambda_{T-1} := 0,

so the last step bootstraps from ``nv_{T-1}`` alone. ``d`` are the discounts
(``gamma * (1 - terminated)``), ``nv_t`` the value of the observation step t reached (for Q(lambda)
``max_a Q(s_{t+1}, a)``, from ``final_obs`` where the episode ended) and ``lambda_`` a scalar or an
array of the rewards' shape (0 where an episode ended, terminated or truncated: the chain is cut
there while ``nv`` still bootstraps). This is rlax's ``lambda_returns`` and the target of PQN
(Gallici et al. 2024).

As a linear recurrence ``G_t = x_t + c_t G_{t+1}`` (``G_T = 0``) with
``x_t = r_t + d_t (1 - l_t) nv_t`` and ``c_t = d_t l_t`` (``l`` = lambda with ``l_{T-1} = 0``).
Differentiable in every argument: with ``a`` the adjoint of ``G`` (``a_t = g_t + c_{t-1} a_{t-1}``,
the recurrence run forward in time),

    dL/dr = a,   dL/dnv = a d (1 - l),   dL/dd = a [(1 - l) nv + l G_{t+1}],
    dL/dlambda_t = a_t d_t (G_{t+1} - nv_t)   (0 at t = T-1; summed when lambda_ is a scalar).
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
def _q_lambda_kernel(
    r_ptr,
    nv_ptr,
    d_ptr,
    lam_ptr,
    T,
    N,
    n_chunks,
    g_ptr,
    counter_ptr,
    flags_ptr,
    CHAINED: tl.constexpr,
    CHUNK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREFIX_LOOKUP: tl.constexpr,
):
    """Q(lambda) returns over [B, T, N] (all four inputs [B, T, N])."""
    b, pid_n, j0, n_iter = cs.program_coords(counter_ptr, n_chunks, N, CHAINED, BLOCK_N)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    base = b.to(tl.int64) * T * N
    carry = tl.zeros([BLOCK_N], dtype=tl.float32)
    for it in range(n_iter):
        j = j0 + it
        t = cs.tile_times(j, T, True, CHUNK_T)
        mask = ((t >= 0) & (t < T))[:, None] & col_mask[None, :]
        offs = base + t[:, None] * N + cols[None, :]
        r = tl.load(r_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        nv = tl.load(nv_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        d = tl.load(d_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        lam = tl.load(lam_ptr + offs, mask=mask & (t < T - 1)[:, None], other=0.0).to(tl.float32)
        g, carry = cs.scan_tile(
            r + d * (1.0 - lam) * nv,
            d * lam,
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
        tl.store(g_ptr + offs, g.to(g_ptr.dtype.element_ty), mask=mask)


def _q_lambda_core(
    rewards, next_values, discounts, lambdas, *, lead, backend, config, deterministic=False
):
    """Launches the kernel on ``[*lead, T, *batch]`` arrays."""
    r3, restore = time_major_3d(rewards, lead)
    b, t, n = r3.shape
    if r3.size == 0:
        return jnp.zeros(rewards.shape, rewards.dtype)
    cfg = cs.pick_config(config, b, t, n, deterministic)
    grid, n_chunks, counter_size, flag_words = cs.grid_and_scratch(cfg, b, t, n)
    returns, _, _ = launch(
        _q_lambda_kernel,
        r3,
        *(time_major_3d(x, lead)[0] for x in (next_values, discounts, lambdas)),
        t,
        n,
        n_chunks,
        out_shape=[
            jax.ShapeDtypeStruct(r3.shape, r3.dtype),
            jax.ShapeDtypeStruct((counter_size,), jnp.int32),
            jax.ShapeDtypeStruct((2 * flag_words,), jnp.int32),
        ],
        grid=grid,
        backend=backend,
        zeroed_outputs=(1, 2) if cfg.chained else (),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        CHAINED=cfg.chained,
        CHUNK_T=cfg.chunk_t,
        BLOCK_N=cfg.block_n,
        PREFIX_LOOKUP=cfg.prefix_lookup,
    )
    return restore(returns)


# --------------------------------------------------------------------------- reference


def cut_at_last_step(lambdas):
    """``lambda`` with ``lambda_{T-1} = 0``: the last step bootstraps from its next value alone."""
    return lambdas.at[-1].set(0)


def q_lambda_returns_reference(rewards, next_values, discounts, lambdas):
    """Plain JAX (lax.scan backwards in time); ``lambdas`` of the rewards' shape."""
    lambdas = cut_at_last_step(lambdas)

    def step(g_next, xs):
        r, nv, d, lam = xs
        g = r + d * ((1 - lam) * nv + lam * g_next)
        return g, g

    _, returns = jax.lax.scan(
        step, jnp.zeros_like(rewards[0]), (rewards, next_values, discounts, lambdas), reverse=True
    )
    return returns


# --------------------------------------------------------------------------- public op


@functools.lru_cache(maxsize=None)
def _kernel_op(backend: str, config: cs.ScanConfig | None, deterministic: bool = False):
    forward = fold_vmap(
        functools.partial(
            _q_lambda_core, backend=backend, config=config, deterministic=deterministic
        ),
        batch_axes="trailing",
    )
    adjoint = adjoint_scan(backend, config, deterministic)

    @jax.custom_vjp
    def op(rewards, next_values, discounts, lambdas):
        return forward(rewards, next_values, discounts, lambdas)

    def op_fwd(rewards, next_values, discounts, lambdas):
        returns = forward(rewards, next_values, discounts, lambdas)
        return returns, (returns, next_values, discounts, lambdas)

    def op_bwd(residuals, g):
        returns, next_values, discounts, lambdas = residuals
        lam = cut_at_last_step(lambdas)
        a = adjoint(g, discounts * lam)
        next_returns = jnp.concatenate([returns[1:], jnp.zeros_like(returns[:1])], axis=0)
        g_lambda = (a * discounts * (next_returns - next_values)).at[-1].set(0)
        g_discounts = a * ((1 - lam) * next_values + lam * next_returns)
        return a, a * discounts * (1 - lam), g_discounts, g_lambda

    op.defvjp(op_fwd, op_bwd)
    return op


def q_lambda_returns(
    rewards,
    next_values,
    discounts,
    lambda_,
    *,
    backend: str | None = None,
    config: cs.ScanConfig | None = None,
    deterministic: bool = False,
):
    """Peng's Q(lambda) / TD(lambda) returns, time-major (the module docstring's recurrence).

    Args:
      rewards, next_values, discounts: float arrays ``[T, *batch]`` of one shape;
        ``discounts = gamma * (1 - terminated)``, ``next_values`` the value of the observation each
        step reached (``max_a Q(s_{t+1}, a)`` for Q(lambda), from ``final_obs`` at episode ends).
      lambda_: float scalar or ``[T, *batch]`` array (may be traced); pass ``lambda (1 - done)`` so
        no return chains across an episode end. The last step never chains (``lambda_{T-1} := 0``).
      backend: "triton", "reference" or "interpret"; ``None`` or "auto" = the process-wide choice.
      config: tiling override (:class:`kernels._chunked_scan.ScanConfig`), for tests/benchmarks.
      deterministic: bitwise-reproducible results on the GPU (the chained grid's look-back composes
        in one fixed order instead of taking the first published carry; see ``ScanConfig``).

    Returns ``[T, *batch]`` returns. Differentiable in every argument.
    Raises ValueError (at trace time) on non-float dtypes, rank 0 or mismatched shapes.
    """
    r, nv, d, lambda_ = check_lambda_returns_inputs(
        rewards, lambda_, next_values=next_values, discounts=discounts
    )
    lambdas = jnp.broadcast_to(lambda_, r.shape)
    name = resolve_backend(backend)
    if name == "reference":
        return q_lambda_returns_reference(r, nv, d, lambdas)
    return _kernel_op(name, config, deterministic)(r, nv, d, lambdas)
