"""Fused categorical policy head: log-probability of the taken action and entropy.

For one row of logits x (A actions) and an action a, with lse = log sum_k exp x_k,
log p = x - lse and p = exp(log p):

    log_prob = x_a - lse
    entropy  = -sum_k p_k log p_k = lse - sum_k p_k x_k

and the backward, for cotangents g_lp and g_ent of the two outputs:

    d x_k = g_lp * (onehot(a)_k - p_k) - g_ent * p_k * (log p_k + entropy)

The forward is one pass over the logits that writes three numbers per row
(log_prob, entropy and lse, the residual); the backward is one pass that
recomputes p from the logits and the saved lse. The probabilities never reach
memory. Entries with p_k == 0 (logits of -inf, e.g. masked actions) add 0 to
the entropy and its gradient. An action outside [0, A) gives a log_prob of NaN
(and a zero one-hot); concrete actions are checked and raise instead.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernels._triton import tl, triton
from kernels.launch import cdiv, check_float_array, fold_vmap, launch, resolve_backend, rows_2d
from kernels.softmax import MAX_TILE_COLUMNS, concrete_value, row_tiling

__all__ = ["categorical_log_prob_entropy", "categorical_log_prob_entropy_reference"]

# Tiling (module settings so that benchmarks can sweep them; see softmax.row_tiling).
TILE_ELEMENTS = 2048
MIN_PROGRAMS = 528
NUM_WARPS = None


def _tiling(n_rows: int, n_actions: int):
    return row_tiling(
        n_rows,
        n_actions,
        tile_elements=TILE_ELEMENTS,
        min_programs=MIN_PROGRAMS,
        num_warps=NUM_WARPS,
    )


@triton.jit
def _policy_head_fwd_kernel(
    logits_ptr,
    actions_ptr,
    n_rows,
    log_prob_ptr,
    entropy_ptr,
    lse_ptr,
    A: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_A: tl.constexpr,
):
    """BLOCK_R rows per program: one read of the logits, three floats out per row."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_A)
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols[None, :] < A)
    offs = rows[:, None].to(tl.int64) * A + cols[None, :]
    x = tl.load(logits_ptr + offs, mask=mask, other=-float("inf"))
    action = tl.load(actions_ptr + rows, mask=row_ok, other=0)
    row_max = tl.max(x, axis=1)
    row_max = tl.where(row_ok, row_max, 0.0)
    shifted = x - row_max[:, None]
    e = tl.exp(shifted)
    denom = tl.sum(e, axis=1)
    log_denom = tl.log(denom)
    # sum_k p_k * shifted_k, with 0 * (-inf) read as 0.
    weighted = tl.sum(e * tl.where(e > 0.0, shifted, 0.0), axis=1) / denom
    picked = tl.sum(tl.where(cols[None, :] == action[:, None], shifted, 0.0), axis=1)
    valid = (action >= 0) & (action < A)
    log_prob = tl.where(valid, picked - log_denom, float("nan"))
    tl.store(log_prob_ptr + rows, log_prob, mask=row_ok)
    tl.store(entropy_ptr + rows, log_denom - weighted, mask=row_ok)
    tl.store(lse_ptr + rows, row_max + log_denom, mask=row_ok)


@triton.jit
def _policy_head_bwd_kernel(
    logits_ptr,
    actions_ptr,
    lse_ptr,
    entropy_ptr,
    g_lp_ptr,
    g_ent_ptr,
    n_rows,
    dlogits_ptr,
    A: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_A: tl.constexpr,
):
    """d x = g_lp * (onehot(a) - p) - g_ent * p * (log p + H), p recomputed from lse."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_A)
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols[None, :] < A)
    offs = rows[:, None].to(tl.int64) * A + cols[None, :]
    x = tl.load(logits_ptr + offs, mask=mask, other=-float("inf"))
    action = tl.load(actions_ptr + rows, mask=row_ok, other=0)
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    entropy = tl.load(entropy_ptr + rows, mask=row_ok, other=0.0)
    g_lp = tl.load(g_lp_ptr + rows, mask=row_ok, other=0.0)
    g_ent = tl.load(g_ent_ptr + rows, mask=row_ok, other=0.0)
    log_p = x - lse[:, None]
    p = tl.exp(log_p)
    onehot = tl.where(cols[None, :] == action[:, None], 1.0, 0.0)
    ent_term = p * tl.where(p > 0.0, log_p + entropy[:, None], 0.0)
    dx = g_lp[:, None] * (onehot - p) - g_ent[:, None] * ent_term
    tl.store(dlogits_ptr + offs, dx, mask=mask)


# ----------------------------------------------------------------------------
# Kernel paths: logits [*lead, *batch, A], actions [*lead, *batch]; one launch each.
# ----------------------------------------------------------------------------
def _flatten(logits, actions, lead):
    logits2, _ = rows_2d(logits, lead)
    return logits2, actions.reshape(-1).astype(jnp.int32)


def _forward_core(logits, actions, *, lead, backend):
    logits2, actions1 = _flatten(logits, actions, lead)
    n_rows, n_actions = logits2.shape
    if n_rows == 0:
        empty = jnp.zeros(actions.shape, jnp.float32)
        return empty, empty, empty
    block_r, block_a, num_warps, _ = _tiling(n_rows, n_actions)
    row = jax.ShapeDtypeStruct((n_rows,), jnp.float32)
    log_prob, entropy, lse = launch(
        _policy_head_fwd_kernel,
        logits2,
        actions1,
        n_rows,
        out_shape=[row, row, row],
        grid=(cdiv(n_rows, block_r),),
        backend=backend,
        num_warps=num_warps,
        A=n_actions,
        BLOCK_R=block_r,
        BLOCK_A=block_a,
    )
    shape = actions.shape
    return log_prob.reshape(shape), entropy.reshape(shape), lse.reshape(shape)


def _backward_core(logits, actions, lse, entropy, g_log_prob, g_entropy, *, lead, backend):
    logits2, actions1 = _flatten(logits, actions, lead)
    n_rows, n_actions = logits2.shape
    if n_rows == 0:
        return jnp.zeros(logits.shape, jnp.float32)
    block_r, block_a, num_warps, _ = _tiling(n_rows, n_actions)
    dlogits = launch(
        _policy_head_bwd_kernel,
        logits2,
        actions1,
        lse.reshape(-1),
        entropy.reshape(-1),
        g_log_prob.reshape(-1),
        g_entropy.reshape(-1),
        n_rows,
        out_shape=jax.ShapeDtypeStruct(logits2.shape, jnp.float32),
        grid=(cdiv(n_rows, block_r),),
        backend=backend,
        num_warps=num_warps,
        A=n_actions,
        BLOCK_R=block_r,
        BLOCK_A=block_a,
    )
    return dlogits.reshape(logits.shape)


@functools.lru_cache(maxsize=None)
def _kernel_op(backend: str):
    """(float32 logits, int32 actions) -> (log_prob, entropy), differentiable in the logits."""
    forward = fold_vmap(functools.partial(_forward_core, backend=backend), batch_axes="leading")
    backward = fold_vmap(functools.partial(_backward_core, backend=backend), batch_axes="leading")

    @jax.custom_vjp
    def op(logits, actions):
        log_prob, entropy, _ = forward(logits, actions)
        return log_prob, entropy

    def op_fwd(logits, actions):
        log_prob, entropy, lse = forward(logits, actions)
        return (log_prob, entropy), (logits, actions, lse, entropy)

    def op_bwd(residuals, cotangents):
        logits, actions, lse, entropy = residuals
        g_log_prob, g_entropy = cotangents
        return backward(logits, actions, lse, entropy, g_log_prob, g_entropy), None

    op.defvjp(op_fwd, op_bwd)
    return op


# ----------------------------------------------------------------------------
# Reference and public function.
# ----------------------------------------------------------------------------
def categorical_log_prob_entropy_reference(logits, actions):
    """Plain JAX (the XLA path): log_softmax, gather the taken action, entropy.

    An out-of-range action gives a NaN log_prob; terms with p == 0 add 0 to the entropy.
    """
    log_p = jax.nn.log_softmax(logits, axis=-1)
    n_actions = logits.shape[-1]
    valid = (actions >= 0) & (actions < n_actions)
    index = jnp.clip(actions, 0, n_actions - 1).astype(jnp.int32)[..., None]
    log_prob = jnp.where(valid, jnp.take_along_axis(log_p, index, axis=-1)[..., 0], jnp.nan)
    p = jnp.exp(log_p)
    entropy = -jnp.sum(jnp.where(p > 0, p * log_p, 0.0), axis=-1)
    return log_prob, entropy


def _check_actions(actions, logits):
    if not hasattr(actions, "shape") or not hasattr(actions, "dtype"):
        actions = jnp.asarray(actions)
    if not jnp.issubdtype(actions.dtype, jnp.integer):
        raise ValueError(
            f"actions must be an integer array, got dtype {actions.dtype} with shape "
            f"{tuple(actions.shape)}"
        )
    if tuple(actions.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            "actions must have the shape of logits without its last axis "
            f"{tuple(logits.shape[:-1])} (logits {tuple(logits.shape)}), "
            f"got {tuple(actions.shape)}"
        )
    n_actions = logits.shape[-1]
    concrete = concrete_value(actions)
    if concrete is not None and concrete.size:
        low, high = concrete.min(), concrete.max()
        if low < 0 or high >= n_actions:
            raise ValueError(
                f"actions must lie in [0, {n_actions}) for logits of shape {tuple(logits.shape)}, "
                f"got values in [{low}, {high}] (actions shape {tuple(actions.shape)})"
            )
    return jnp.asarray(actions)


def categorical_log_prob_entropy(logits, actions, *, backend: str | None = None):
    """Log-probability of the taken actions and entropy of a categorical policy.

        log_prob = logits[a] - logsumexp(logits),   entropy = -sum_k p_k log p_k

    Args:
      logits: floating-point array ``[*batch, A]`` (A >= 1; kernels compute in float32).
      actions: integer array ``[*batch]``, each in [0, A). Concrete (non-traced)
        actions are range-checked; a traced out-of-range action yields a NaN log_prob.
      backend: "triton", "reference" or "interpret"; ``None`` or "auto" = the process-wide choice.

    Returns ``(log_prob, entropy)``, both ``[*batch]`` in ``logits``' dtype.
    Differentiable in ``logits``: one fused backward kernel,
    d logits = g_lp (onehot(a) - p) - g_ent p (log p + entropy).
    Raises ValueError at trace time for bad dtypes, ranks or shapes (naming them).
    """
    logits = check_float_array("logits", logits, min_ndim=1)
    if logits.shape[-1] == 0:
        raise ValueError(f"logits must have at least one action, got shape {tuple(logits.shape)}")
    actions = _check_actions(actions, logits)
    name = resolve_backend(backend)
    if name == "reference":
        return categorical_log_prob_entropy_reference(logits, actions)
    if logits.shape[-1] > MAX_TILE_COLUMNS:
        raise ValueError(
            f"the {name!r} kernel handles up to {MAX_TILE_COLUMNS} actions, got logits of shape "
            f"{tuple(logits.shape)}; use backend='reference'"
        )
    log_prob, entropy = _kernel_op(name)(logits.astype(jnp.float32), actions.astype(jnp.int32))
    return log_prob.astype(logits.dtype), entropy.astype(logits.dtype)
