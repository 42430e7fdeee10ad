"""Fused PPO minibatch gradient of a categorical actor-critic made of two MLPs.

The actor and the critic are separate MLPs with two hidden layers (activation f = tanh or relu):

    h1 = f(x W1 + b1),   h2 = f(h1 W2 + b2),   out = h2 W3 + b3

the actor's `out` being the logits [M, A] and the critic's the value [M, 1]. For a minibatch of M
rows (observation x, action a, behaviour log-prob lp_old, behaviour value v_old, advantage A,
value target R) this op returns the gradient, with respect to all twelve weight arrays, of PPO's loss

    L = -mean(min(rho A, clip(rho, 1 - eps, 1 + eps) A))                         (policy_loss)
        + vf_coef * 0.5 * mean(max((v - R)^2, (v_old + clip(v - v_old, -eps_v, eps_v) - R)^2))
        - ent_coef * mean(H[pi])                                                (entropy)

(the value term is 0.5 * mean((v - R)^2) when `clip_value_loss` is off), with rho = exp(log pi(a) -
lp_old), plus the statistics (policy_loss, value_loss, entropy, approx_kl = mean(rho - 1 - log rho),
clip_fraction = mean(|rho - 1| > eps)). The advantages are used as given (normalise them first).

Backward, per row, with p = softmax(logits), d = dL/d(log pi(a)) = -(1/M) rho dmin/drho, where
dmin/drho = A when rho is inside the clip range or the unclipped term is the smaller, else 0:

    dlogits = d (onehot(a) - p) + (ent_coef / M) p (log p + H)
    dv      = (vf_coef / M) (v - R)   where the unclipped term wins (or they tie), else
              (vf_coef / M) (v_clipped - R) [|v - v_old| < eps_v]

then the usual backpropagation through the two layers: dW3 = h2^T dout, dz2 = (dout W3^T) f'(h2),
dW2 = h1^T dz2, dz1 = (dz2 W2^T) f'(h1), dW1 = x^T dz1, db = column sums. (At the measure-zero points
where rho or v - v_old sits exactly on a clip boundary, autodiff splits a tie and this op does not.)

Why a kernel: with thousands of seeds vmapped, every weight and activation is a separate small
matrix per seed, and XLA runs the minibatch step as ~60 kernels that each stream [seeds, M, 64]
activations through memory. Here one program per (seed, row chunk) keeps the activations on chip:
it reads the rows and the weights once and writes the gradients once. The actor and the critic are
two launches; a minibatch larger than one program's share is split into row chunks whose partial
gradients are summed afterwards.

Backends: "reference" is `jax.value_and_grad` of the same loss in plain JAX; "triton" and
"interpret" run the kernels. `dot_precision="tf32"` (default: what XLA does by default for float32
matmuls on the GPU) or "ieee" (full float32 products; the reference then uses Precision.HIGHEST).
The op is not itself differentiable (it is the gradient).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from kernels._triton import tl, triton
from kernels.launch import cdiv, check_float_array, chosen_automatically, fold_vmap, launch, next_power_of_2, resolve_backend

__all__ = ["ppo_actor_critic_grads", "ppo_actor_critic_grads_reference", "ppo_objective", "clipped_surrogate_loss", "clipped_value_loss", "LIMITS"]

ACTIVATIONS = ("tanh", "relu")
PRECISIONS = ("tf32", "ieee")
# largest padded sizes one program holds on chip: observation features, hidden widths, actions
LIMITS = {"obs_dim": 64, "hidden": 128, "actions": 64}
# shared memory one program may use on the GPUs measured (H100 and H200: 227 KB); with tf32 products
# not every combination within LIMITS fits (see shared_memory_estimate)
SHARED_MEMORY_BYTES = 232448
BLOCK_M = 32  # rows per inner step (tl.dot needs >= 16)
# with the automatic backend choice, one minibatch (no vmap, or a vmap of size 1) of fewer rows than
# this goes to the reference (XLA): at one seed XLA's unbatched matmuls beat the kernel (measured)
AUTO_TRITON_MIN_ROWS_ONE_SEED = 32768
MIN_PROGRAMS = 528  # split rows into chunks until seeds x chunks reaches this (4 waves of 132 SMs)
NUM_WARPS = 4
AUX_NAMES = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")


# ---------------------------------------------------------------- Triton helpers


@triton.jit
def _load_matrix(ptr, b, R, C, RP: tl.constexpr, CP: tl.constexpr):
    """Batch entry b of a [B, R, C] array, zero-padded to [RP, CP]."""
    r = tl.arange(0, RP)
    c = tl.arange(0, CP)
    mask = (r[:, None] < R) & (c[None, :] < C)
    return tl.load(ptr + b.to(tl.int64) * R * C + r[:, None] * C + c[None, :], mask=mask, other=0.0)


@triton.jit
def _load_vector(ptr, b, C, CP: tl.constexpr):
    c = tl.arange(0, CP)
    return tl.load(ptr + b.to(tl.int64) * C + c, mask=c < C, other=0.0)


@triton.jit
def _store_matrix(ptr, i, R, C, value, RP: tl.constexpr, CP: tl.constexpr):
    r = tl.arange(0, RP)
    c = tl.arange(0, CP)
    mask = (r[:, None] < R) & (c[None, :] < C)
    tl.store(ptr + i.to(tl.int64) * R * C + r[:, None] * C + c[None, :], value, mask=mask)


@triton.jit
def _store_vector(ptr, i, C, value, CP: tl.constexpr):
    c = tl.arange(0, CP)
    tl.store(ptr + i.to(tl.int64) * C + c, value, mask=c < C)


@triton.jit
def _activate(z, RELU: tl.constexpr):
    if RELU:
        return tl.maximum(z, 0.0)
    else:
        return 1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0)  # tanh; saturates to +-1 without overflow trouble


@triton.jit
def _activation_grad(h, RELU: tl.constexpr):
    """f'(z) from h = f(z): relu -> [h > 0], tanh -> 1 - h^2."""
    if RELU:
        return (h > 0.0).to(tl.float32)
    else:
        return 1.0 - h * h


@triton.jit
def _torso(x, w1, b1, w2, b2, RELU: tl.constexpr, PRECISION: tl.constexpr):
    h1 = _activate(tl.dot(x, w1, input_precision=PRECISION) + b1[None, :], RELU)
    h2 = _activate(tl.dot(h1, w2, input_precision=PRECISION) + b2[None, :], RELU)
    return h1, h2


@triton.jit
def _backprop(x, h1, h2, d_out, w2, w3, g_w1, g_b1, g_w2, g_b2, g_w3, g_b3, RELU: tl.constexpr, PRECISION: tl.constexpr):
    """Adds this block's weight gradients, given dL/d(out) for its rows (zero on padded rows).

    w2 and w3 stay as loaded ([in, out]) and are transposed inside each ``tl.dot``: the forward
    pass reads them untransposed, so the row loop holds one on-chip copy of each weight, not two
    (benchmarks/RESULTS.md, "PPO throughput after the rework", times the hoisted-transpose variant)."""
    g_w3 += tl.dot(tl.trans(h2), d_out, input_precision=PRECISION)
    g_b3 += tl.sum(d_out, axis=0)
    d_z2 = tl.dot(d_out, tl.trans(w3), input_precision=PRECISION) * _activation_grad(h2, RELU)
    g_w2 += tl.dot(tl.trans(h1), d_z2, input_precision=PRECISION)
    g_b2 += tl.sum(d_z2, axis=0)
    d_z1 = tl.dot(d_z2, tl.trans(w2), input_precision=PRECISION) * _activation_grad(h1, RELU)
    g_w1 += tl.dot(tl.trans(x), d_z1, input_precision=PRECISION)
    g_b1 += tl.sum(d_z1, axis=0)
    return g_w1, g_b1, g_w2, g_b2, g_w3, g_b3


@triton.jit
def _store_grads(i, D, H1, H2, O, g_w1, g_b1, g_w2, g_b2, g_w3, g_b3,
                 g_w1_ptr, g_b1_ptr, g_w2_ptr, g_b2_ptr, g_w3_ptr, g_b3_ptr,
                 DP: tl.constexpr, H1P: tl.constexpr, H2P: tl.constexpr, OP: tl.constexpr):
    _store_matrix(g_w1_ptr, i, D, H1, g_w1, DP, H1P)
    _store_vector(g_b1_ptr, i, H1, g_b1, H1P)
    _store_matrix(g_w2_ptr, i, H1, H2, g_w2, H1P, H2P)
    _store_vector(g_b2_ptr, i, H2, g_b2, H2P)
    _store_matrix(g_w3_ptr, i, H2, O, g_w3, H2P, OP)
    _store_vector(g_b3_ptr, i, O, g_b3, OP)


# ---------------------------------------------------------------- the two kernels


@triton.jit
def _actor_grads_kernel(
    obs_ptr, action_ptr, old_log_prob_ptr, advantage_ptr,
    w1_ptr, b1_ptr, w2_ptr, b2_ptr, w3_ptr, b3_ptr, clip_ptr, ent_coef_ptr,
    M, inv_m, ROWS, S, D, H1, H2, A,
    g_w1_ptr, g_b1_ptr, g_w2_ptr, g_b2_ptr, g_w3_ptr, g_b3_ptr, aux_ptr,
    DP: tl.constexpr, H1P: tl.constexpr, H2P: tl.constexpr, AP: tl.constexpr,
    BLOCK: tl.constexpr, RELU: tl.constexpr, PRECISION: tl.constexpr,
):
    """Program (b, s): rows [s ROWS, (s + 1) ROWS) of seed b; partial gradients of the policy and
    entropy terms, and sums of policy loss, entropy, approx_kl and clipped rows, at index b S + s."""
    b = tl.program_id(0)
    s = tl.program_id(1)
    w1 = _load_matrix(w1_ptr, b, D, H1, DP, H1P)
    b1 = _load_vector(b1_ptr, b, H1, H1P)
    w2 = _load_matrix(w2_ptr, b, H1, H2, H1P, H2P)
    b2 = _load_vector(b2_ptr, b, H2, H2P)
    w3 = _load_matrix(w3_ptr, b, H2, A, H2P, AP)
    b3 = _load_vector(b3_ptr, b, A, AP)
    clip = tl.load(clip_ptr + b)
    ent_coef = tl.load(ent_coef_ptr + b)
    g_w1 = tl.zeros([DP, H1P], tl.float32)
    g_b1 = tl.zeros([H1P], tl.float32)
    g_w2 = tl.zeros([H1P, H2P], tl.float32)
    g_b2 = tl.zeros([H2P], tl.float32)
    g_w3 = tl.zeros([H2P, AP], tl.float32)
    g_b3 = tl.zeros([AP], tl.float32)
    loss_sum = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    entropy_sum = loss_sum
    kl_sum = loss_sum
    clipped_sum = loss_sum
    d_cols = tl.arange(0, DP)
    a_cols = tl.arange(0, AP)
    a_ok = a_cols < A
    for start in range(s * ROWS, s * ROWS + ROWS, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        ok = rows < M
        row = b.to(tl.int64) * M + rows
        x = tl.load(obs_ptr + row[:, None] * D + d_cols[None, :], mask=ok[:, None] & (d_cols[None, :] < D), other=0.0)
        h1, h2 = _torso(x, w1, b1, w2, b2, RELU, PRECISION)
        logits = tl.dot(h2, w3, input_precision=PRECISION) + b3[None, :]
        logits = tl.where(a_ok[None, :], logits, -float("inf"))
        top = tl.max(logits, axis=1)
        e = tl.exp(logits - top[:, None])
        z = tl.sum(e, axis=1)
        log_p = logits - (top + tl.log(z))[:, None]
        p = e / z[:, None]
        action = tl.load(action_ptr + row, mask=ok, other=0)
        onehot = a_cols[None, :] == action[:, None]
        log_p_a = tl.sum(tl.where(onehot, log_p, 0.0), axis=1)
        p_log_p = p * tl.where(a_ok[None, :], log_p, 0.0)  # padded actions: p = 0, log p = -inf
        entropy = -tl.sum(p_log_p, axis=1)
        log_ratio = log_p_a - tl.load(old_log_prob_ptr + row, mask=ok, other=0.0)
        ratio = tl.exp(log_ratio)
        adv = tl.load(advantage_ptr + row, mask=ok, other=0.0)
        clipped = tl.minimum(tl.maximum(ratio, 1.0 - clip), 1.0 + clip)
        surr1 = ratio * adv
        surr2 = clipped * adv
        d_min = tl.where((clipped == ratio) | (surr1 < surr2), adv, 0.0)
        d_log_p_a = -inv_m * d_min * ratio
        d_logits = d_log_p_a[:, None] * (onehot.to(tl.float32) - p) + (ent_coef * inv_m) * (p_log_p + p * entropy[:, None])
        d_logits = tl.where(ok[:, None] & a_ok[None, :], d_logits, 0.0)
        g_w1, g_b1, g_w2, g_b2, g_w3, g_b3 = _backprop(x, h1, h2, d_logits, w2, w3, g_w1, g_b1, g_w2, g_b2, g_w3, g_b3, RELU, PRECISION)
        loss_sum += tl.sum(tl.where(ok, -tl.minimum(surr1, surr2), 0.0), axis=0)
        entropy_sum += tl.sum(tl.where(ok, entropy, 0.0), axis=0)
        kl_sum += tl.sum(tl.where(ok, (ratio - 1.0) - log_ratio, 0.0), axis=0)
        clipped_sum += tl.sum(tl.where(ok & (tl.abs(ratio - 1.0) > clip), 1.0, 0.0), axis=0)
    i = b * S + s
    _store_grads(i, D, H1, H2, A, g_w1, g_b1, g_w2, g_b2, g_w3, g_b3,
                 g_w1_ptr, g_b1_ptr, g_w2_ptr, g_b2_ptr, g_w3_ptr, g_b3_ptr, DP, H1P, H2P, AP)
    tl.store(aux_ptr + i * 4 + 0, loss_sum)
    tl.store(aux_ptr + i * 4 + 1, entropy_sum)
    tl.store(aux_ptr + i * 4 + 2, kl_sum)
    tl.store(aux_ptr + i * 4 + 3, clipped_sum)


@triton.jit
def _critic_grads_kernel(
    obs_ptr, old_value_ptr, target_ptr,
    w1_ptr, b1_ptr, w2_ptr, b2_ptr, w3_ptr, b3_ptr, vf_clip_ptr, vf_coef_ptr,
    M, inv_m, ROWS, S, D, H1, H2,
    g_w1_ptr, g_b1_ptr, g_w2_ptr, g_b2_ptr, g_w3_ptr, g_b3_ptr, aux_ptr,
    DP: tl.constexpr, H1P: tl.constexpr, H2P: tl.constexpr, OP: tl.constexpr,
    BLOCK: tl.constexpr, RELU: tl.constexpr, PRECISION: tl.constexpr, CLIP_VALUE: tl.constexpr,
):
    """Program (b, s): partial gradients of the value term and the sum of the value loss."""
    b = tl.program_id(0)
    s = tl.program_id(1)
    w1 = _load_matrix(w1_ptr, b, D, H1, DP, H1P)
    b1 = _load_vector(b1_ptr, b, H1, H1P)
    w2 = _load_matrix(w2_ptr, b, H1, H2, H1P, H2P)
    b2 = _load_vector(b2_ptr, b, H2, H2P)
    w3 = _load_matrix(w3_ptr, b, H2, 1, H2P, OP)  # one real column, zero padding
    b3 = _load_vector(b3_ptr, b, 1, OP)
    vf_clip = tl.load(vf_clip_ptr + b)
    vf_coef = tl.load(vf_coef_ptr + b)
    g_w1 = tl.zeros([DP, H1P], tl.float32)
    g_b1 = tl.zeros([H1P], tl.float32)
    g_w2 = tl.zeros([H1P, H2P], tl.float32)
    g_b2 = tl.zeros([H2P], tl.float32)
    g_w3 = tl.zeros([H2P, OP], tl.float32)
    g_b3 = tl.zeros([OP], tl.float32)
    loss_sum = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    d_cols = tl.arange(0, DP)
    o_cols = tl.arange(0, OP)
    for start in range(s * ROWS, s * ROWS + ROWS, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        ok = rows < M
        row = b.to(tl.int64) * M + rows
        x = tl.load(obs_ptr + row[:, None] * D + d_cols[None, :], mask=ok[:, None] & (d_cols[None, :] < D), other=0.0)
        h1, h2 = _torso(x, w1, b1, w2, b2, RELU, PRECISION)
        value = tl.sum(tl.dot(h2, w3, input_precision=PRECISION) + b3[None, :], axis=1)  # padded columns are 0
        target = tl.load(target_ptr + row, mask=ok, other=0.0)
        error = value - target
        unclipped = error * error
        if CLIP_VALUE:
            old_value = tl.load(old_value_ptr + row, mask=ok, other=0.0)
            change = value - old_value
            clipped_change = tl.minimum(tl.maximum(change, -vf_clip), vf_clip)
            clipped_error = old_value + clipped_change - target
            clipped = clipped_error * clipped_error
            d_value = tl.where((clipped_change == change) | (unclipped > clipped), error, 0.0)
            loss = 0.5 * tl.maximum(unclipped, clipped)
        else:
            d_value = error
            loss = 0.5 * unclipped
        d_value = tl.where(ok, (vf_coef * inv_m) * d_value, 0.0)
        d_out = tl.where(o_cols[None, :] == 0, d_value[:, None], 0.0)
        g_w1, g_b1, g_w2, g_b2, g_w3, g_b3 = _backprop(x, h1, h2, d_out, w2, w3, g_w1, g_b1, g_w2, g_b2, g_w3, g_b3, RELU, PRECISION)
        loss_sum += tl.sum(tl.where(ok, loss, 0.0), axis=0)
    i = b * S + s
    _store_grads(i, D, H1, H2, 1, g_w1, g_b1, g_w2, g_b2, g_w3, g_b3,
                 g_w1_ptr, g_b1_ptr, g_w2_ptr, g_b2_ptr, g_w3_ptr, g_b3_ptr, DP, H1P, H2P, OP)
    tl.store(aux_ptr + i, loss_sum)


# ---------------------------------------------------------------- launching


def _padded(n: int) -> int:
    return max(16, next_power_of_2(n))


def _row_chunks(num_seeds: int, m: int) -> tuple[int, int]:
    """(rows per program, chunks): enough programs to fill the GPU, whole BLOCK_M steps per chunk."""
    chunks = min(cdiv(m, BLOCK_M), max(1, cdiv(MIN_PROGRAMS, num_seeds)))
    rows = cdiv(cdiv(m, chunks), BLOCK_M) * BLOCK_M
    return rows, cdiv(m, rows)


def automatic_crossover(name: str, automatic: bool, minibatches: int, rows: int) -> str:
    """The backend that computes `minibatches` (the product of the vmapped axes) gradients of `rows`
    rows each: ``"reference"`` (XLA) in place of an automatically chosen ``"triton"`` for a single
    minibatch of fewer than ``AUTO_TRITON_MIN_ROWS_ONE_SEED`` rows, else ``name``."""
    if name == "triton" and automatic and minibatches == 1 and rows < AUTO_TRITON_MIN_ROWS_ONE_SEED:
        return "reference"
    return name


def _reference_core(obs, actions, rows, actor, critic, scalars, lead_shape, activation, clip_value_loss, dot_precision):
    """The reference on one minibatch whose arrays carry a leading axis of size 1: the kernels' outputs."""
    first = lambda x: x[0]
    g_actor, g_critic, stats = ppo_actor_critic_grads_reference(
        first(obs), first(actions), *map(first, rows), tuple(map(first, actor)), tuple(map(first, critic)), *map(first, scalars),
        activation=activation, clip_value_loss=clip_value_loss, dot_precision=dot_precision)
    restore = lambda x: x.reshape(lead_shape + x.shape)
    return (*map(restore, g_actor), *map(restore, g_critic), *(restore(stats[name]) for name in AUX_NAMES))


def _grads_core(obs, actions, old_log_probs, old_values, advantages, targets, *arrays, lead, backend, automatic, activation, clip_value_loss, dot_precision):
    actor, critic, (clip_eps, vf_clip_eps, ent_coef, vf_coef) = arrays[:6], arrays[6:12], arrays[12:]
    lead_shape = tuple(obs.shape[:lead])
    b = math.prod(lead_shape)
    m, d = obs.shape[lead], obs.shape[lead + 1]
    h1, h2, a = actor[0].shape[-1], actor[2].shape[-1], actor[4].shape[-1]
    flat = lambda x, *shape: x.reshape((b,) + shape)
    obs3 = flat(obs, m, d)
    rows = [flat(x, m) for x in (old_log_probs, old_values, advantages, targets)]
    actions2 = flat(actions, m).astype(jnp.int32)
    scalars = [flat(x.astype(jnp.float32)) for x in (clip_eps, vf_clip_eps, ent_coef, vf_coef)]
    shapes_actor = [(d, h1), (h1,), (h1, h2), (h2,), (h2, a), (a,)]
    shapes_critic = [(d, h1), (h1,), (h1, h2), (h2,), (h2, 1), (1,)]
    actor = [flat(w, *shape) for w, shape in zip(actor, shapes_actor)]
    critic = [flat(w, *shape) for w, shape in zip(critic, shapes_critic)]
    if automatic_crossover(backend, automatic, b, m) == "reference":
        return _reference_core(obs3, actions2, rows, actor, critic, scalars, lead_shape, activation, clip_value_loss, dot_precision)
    chunk_rows, chunks = _row_chunks(b, m)
    f32 = jnp.float32
    common = dict(backend=backend, grid=(b, chunks), num_warps=NUM_WARPS, DP=_padded(d), H1P=_padded(h1), H2P=_padded(h2),
                  BLOCK=BLOCK_M, RELU=activation == "relu", PRECISION=dot_precision)
    out_actor = [jax.ShapeDtypeStruct((b * chunks,) + shape, f32) for shape in shapes_actor] + [jax.ShapeDtypeStruct((b * chunks, 4), f32)]
    *g_actor, aux_actor = launch(_actor_grads_kernel, obs3, actions2, rows[0], rows[2], *actor, scalars[0], scalars[2],
                                 m, np.float32(1.0 / m), chunk_rows, chunks, d, h1, h2, a, out_shape=out_actor, AP=_padded(a), **common)
    out_critic = [jax.ShapeDtypeStruct((b * chunks,) + shape, f32) for shape in shapes_critic] + [jax.ShapeDtypeStruct((b * chunks,), f32)]
    *g_critic, aux_critic = launch(_critic_grads_kernel, obs3, rows[1], rows[3], *critic, scalars[1], scalars[3],
                                   m, np.float32(1.0 / m), chunk_rows, chunks, d, h1, h2, out_shape=out_critic, OP=16, CLIP_VALUE=bool(clip_value_loss), **common)
    total = lambda g: g.reshape((b, chunks) + g.shape[1:]).sum(axis=1)
    restore = lambda g, like: total(g).reshape(lead_shape + like.shape[lead:])
    g_actor = [restore(g, w) for g, w in zip(g_actor, arrays[:6])]
    g_critic = [restore(g, w) for g, w in zip(g_critic, arrays[6:12])]
    sums = total(aux_actor) / m
    value_loss = total(aux_critic) / m
    stats = [sums[:, 0], value_loss, sums[:, 1], sums[:, 2], sums[:, 3]]
    return (*g_actor, *g_critic, *[x.reshape(lead_shape) for x in stats])


@functools.lru_cache(maxsize=None)
def _kernel_op(backend: str, automatic: bool, activation: str, clip_value_loss: bool, dot_precision: str):
    return fold_vmap(functools.partial(_grads_core, backend=backend, automatic=automatic, activation=activation,
                                       clip_value_loss=clip_value_loss, dot_precision=dot_precision))


# ---------------------------------------------------------------- reference


def _mlp(layers, x, activation: str, precision):
    f = jnp.tanh if activation == "tanh" else jax.nn.relu
    w1, b1, w2, b2, w3, b3 = layers
    dot = functools.partial(jnp.dot, precision=precision)
    return dot(f(dot(f(dot(x, w1) + b1), w2) + b2), w3) + b3


def clipped_surrogate_loss(ratio, advantages, clip_eps):
    """PPO's clipped surrogate (Schulman et al. 2017): -mean(min(rho A, clip(rho, 1 - eps, 1 + eps) A))."""
    return -jnp.mean(jnp.minimum(ratio * advantages, jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages))


def clipped_value_loss(values, old_values, targets, clip_eps, clip: bool = True):
    """0.5 mean(max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2)); 0.5 mean((V - R)^2) when not `clip`."""
    unclipped = jnp.square(values - targets)
    if not clip:
        return 0.5 * jnp.mean(unclipped)
    clipped = jnp.square(old_values + jnp.clip(values - old_values, -clip_eps, clip_eps) - targets)
    return 0.5 * jnp.mean(jnp.maximum(unclipped, clipped))


def ppo_objective(log_prob, entropy, values, old_log_probs, old_values, advantages, targets,
                  clip_eps, vf_clip_eps, ent_coef, vf_coef, clip_value_loss: bool = True):
    """(L, stats) of one minibatch, from the per-row log pi(a|s), entropy H and value V of the
    current policy (any action distribution):

        L = clipped_surrogate_loss(rho, A, eps) + vf_coef clipped_value_loss(V, V_old, R, eps_v) - ent_coef mean(H)

    with rho = exp(log pi(a|s) - log pi_old(a|s)); stats: policy_loss, value_loss, entropy,
    approx_kl = mean(rho - 1 - log rho), clip_fraction = mean(|rho - 1| > eps). The fused kernels
    compute the gradient of this function; `rl.losses.ppo_loss` is this function."""
    log_ratio = log_prob - old_log_probs
    ratio = jnp.exp(log_ratio)
    policy_loss = clipped_surrogate_loss(ratio, advantages, clip_eps)
    value_loss = clipped_value_loss(values, old_values, targets, vf_clip_eps, clip_value_loss)
    entropy = jnp.mean(entropy)
    total = policy_loss + vf_coef * value_loss - ent_coef * entropy
    stats = {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "approx_kl": jnp.mean((ratio - 1.0) - log_ratio),
        "clip_fraction": jnp.mean((jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32)),
    }
    return total, stats


def ppo_actor_critic_grads_reference(obs, actions, old_log_probs, old_values, advantages, targets, actor, critic,
                                     clip_eps, vf_clip_eps, ent_coef, vf_coef, *, activation="tanh", clip_value_loss=True, dot_precision="tf32"):
    """Plain JAX: `jax.value_and_grad` of the loss in the module docstring (same signature and outputs)."""
    precision = jax.lax.Precision.HIGHEST if dot_precision == "ieee" else None

    def loss(actor, critic):
        logits = _mlp(actor, obs, activation, precision)
        value = _mlp(critic, obs, activation, precision)[..., 0]
        log_p = jax.nn.log_softmax(logits)
        log_prob = jnp.take_along_axis(log_p, actions[..., None].astype(jnp.int32), axis=-1)[..., 0]
        entropy = -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)
        return ppo_objective(log_prob, entropy, value, old_log_probs, old_values, advantages, targets,
                             clip_eps, vf_clip_eps, ent_coef, vf_coef, clip_value_loss)

    (_, stats), (g_actor, g_critic) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(tuple(actor), tuple(critic))
    return g_actor, g_critic, stats


# ---------------------------------------------------------------- public op


def shared_memory_estimate(obs_dim: int, hidden: tuple[int, int], actions: int) -> int:
    """Bytes of shared memory the actor kernel (the larger of the two) asks for with tf32 products:
    each weight matrix staged for ``tl.dot`` in both orientations and the [BLOCK_M, H] activations
    transposed, with D, H1, H2, A padded as the kernel pads them:

        8 (D H1 + H1 H2 + H2 A) + 4 BLOCK_M (H1 + H2) + 768

    Fitted to Triton's requests on an H100 (benchmarks/RESULTS.md, thirteenth session: 246,528 to
    295,680 bytes at obs 64, hidden 128 x 128 and 16 to 64 actions, exactly as this formula gives;
    fits at obs 16 with 16 actions, at obs 8 with 4, and at 64 x 64 with 64 actions). With ieee
    products the dots run without staging and every size within LIMITS fits."""
    dp, h1p, h2p, ap = (_padded(n) for n in (obs_dim, *hidden, actions))
    return 8 * (dp * h1p + h1p * h2p + h2p * ap) + 4 * BLOCK_M * (h1p + h2p) + 768


def too_big_for_shared_memory(obs_dim: int, hidden: tuple[int, int], actions: int) -> str | None:
    """Why these sizes do not fit one program's shared memory with tf32 products, or None if they do."""
    need = shared_memory_estimate(obs_dim, hidden, actions)
    if need <= SHARED_MEMORY_BYTES:
        return None
    return (f"obs_dim {obs_dim}, hidden {tuple(hidden)} and {actions} actions need about {need:,} bytes of shared memory per program "
            f"with tf32 products, more than the {SHARED_MEMORY_BYTES:,} of the GPUs measured (use dot_precision='ieee' or smaller sizes)")


def _check(obs, actions, rows, actor, critic):
    obs = check_float_array("obs", obs, ndim=2)
    m, d = obs.shape
    if tuple(jnp.shape(actions)) != (m,) or not jnp.issubdtype(jnp.asarray(actions).dtype, jnp.integer):
        raise ValueError(f"actions must be an integer array of shape {(m,)} (one per obs row), got {jnp.asarray(actions).dtype} {tuple(jnp.shape(actions))}")
    for name, x in rows.items():
        x = check_float_array(name, x)
        if tuple(x.shape) != (m,):
            raise ValueError(f"{name} must have shape {(m,)} (one per obs row), got {tuple(x.shape)}")
    for net, layers, out in (("actor", actor, None), ("critic", critic, 1)):
        if len(layers) != 6:
            raise ValueError(f"{net} must be (w1, b1, w2, b2, w3, b3), got {len(layers)} arrays")
        w1, b1, w2, b2, w3, b3 = (check_float_array(f"{net}[{i}]", x) for i, x in enumerate(layers))
        h1, h2 = w1.shape[-1] if w1.ndim == 2 else -1, w2.shape[-1] if w2.ndim == 2 else -1
        o = w3.shape[-1] if w3.ndim == 2 else -1
        want = [(d, h1), (h1,), (h1, h2), (h2,), (h2, out if out else o), (out if out else o,)]
        got = [tuple(x.shape) for x in (w1, b1, w2, b2, w3, b3)]
        for i, (g, w) in enumerate(zip(got, want)):
            if g != w:
                raise ValueError(f"{net}[{i}] must have shape {w} for obs of shape {(m, d)}, got {g} (all shapes: {got})")
        if h1 > LIMITS["hidden"] or h2 > LIMITS["hidden"]:
            raise ValueError(f"{net}: hidden widths ({h1}, {h2}) exceed the fused kernel's limit {LIMITS['hidden']}")
    if d > LIMITS["obs_dim"]:
        raise ValueError(f"obs has {d} features, more than the fused kernel's limit {LIMITS['obs_dim']}")
    if actor[4].shape[-1] > LIMITS["actions"]:
        raise ValueError(f"actor has {actor[4].shape[-1]} actions, more than the fused kernel's limit {LIMITS['actions']}")


def ppo_actor_critic_grads(obs, actions, old_log_probs, old_values, advantages, targets, actor, critic,
                           clip_eps, vf_clip_eps, ent_coef, vf_coef, *, activation: str = "tanh",
                           clip_value_loss: bool = True, dot_precision: str = "tf32", backend: str | None = None):
    """Gradient of PPO's loss for a two-MLP categorical actor-critic on one minibatch (module docstring).

    obs [M, D] float; actions [M] int; old_log_probs, old_values, advantages, targets [M];
    actor = (w1 [D, H1], b1 [H1], w2 [H1, H2], b2 [H2], w3 [H2, A], b3 [A]); critic likewise with
    w3 [H2, 1], b3 [1]; clip_eps, vf_clip_eps, ent_coef, vf_coef scalars (may be traced).
    Returns (actor_grads, critic_grads, stats): two tuples shaped like `actor` and `critic`, and a dict
    of scalars (policy_loss, value_loss, entropy, approx_kl, clip_fraction). Works under jit and any
    nesting of vmap (one launch per network).

    backend: "triton", "reference" or "interpret"; ``None`` or "auto" = the process-wide choice.
    When that choice is the automatic one (none named anywhere) on a GPU, a single minibatch (no
    vmap, or vmaps of total size 1: one seed) of fewer than ``AUTO_TRITON_MIN_ROWS_ONE_SEED`` (32768)
    rows goes to the reference, which is faster there (measured); a named ``"triton"`` always runs
    the kernels.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if dot_precision not in PRECISIONS:
        raise ValueError(f"dot_precision must be one of {PRECISIONS}, got {dot_precision!r}")
    rows = {"old_log_probs": old_log_probs, "old_values": old_values, "advantages": advantages, "targets": targets}
    _check(obs, actions, rows, actor, critic)
    name = resolve_backend(backend)
    if name == "triton" and dot_precision == "tf32":
        reason = too_big_for_shared_memory(obs.shape[-1], (actor[0].shape[-1], actor[2].shape[-1]), actor[4].shape[-1])
        if reason:
            raise ValueError(f"ppo_actor_critic_grads: {reason}")
    scalars = [jnp.asarray(x, jnp.float32) for x in (clip_eps, vf_clip_eps, ent_coef, vf_coef)]
    if name == "reference":
        return ppo_actor_critic_grads_reference(obs, actions, old_log_probs, old_values, advantages, targets, actor, critic, *scalars,
                                                activation=activation, clip_value_loss=clip_value_loss, dot_precision=dot_precision)
    op = _kernel_op(name, chosen_automatically(backend), activation, bool(clip_value_loss), dot_precision)
    out = op(jnp.asarray(obs), jnp.asarray(actions), *(jnp.asarray(x) for x in rows.values()), *actor, *critic, *scalars)
    stats = dict(zip(AUX_NAMES, out[12:]))
    return tuple(out[:6]), tuple(out[6:12]), stats
