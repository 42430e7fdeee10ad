"""Fused PPO minibatch gradient of a categorical actor-critic made of two MLPs.

The actor and the critic are separate MLPs with two hidden layers (activation f = tanh or relu):

    h1 = f(x W1 + b1),   h2 = f(h1 W2 + b2),   out = h2 W3 + b3

the actor's `out` being the logits [M, A] and the critic's the value [M, 1]. For a minibatch of M
rows (observation x, action a, behaviour log-prob lp_old, behaviour value v_old, advantage A,
value target R) this op returns the gradient, with respect to all twelve weight arrays, of
PPO's loss

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
dW2 = h1^T dz2, dz1 = (dz2 W2^T) f'(h1), dW1 = x^T dz1, db = column sums. (At the measure-zero
points where rho or v - v_old sits exactly on a clip boundary, autodiff splits a tie and this op
does not.)

Why a kernel: with thousands of seeds vmapped, every weight and activation is a separate small
matrix per seed, and XLA runs the minibatch step as ~60 kernels that each stream [seeds, M, 64]
activations through memory. Here one program per (seed, row chunk) keeps the activations on chip:
it reads the rows and the weights once and writes the gradients once. The actor and the critic are
two launches; a minibatch larger than one program's share is split into row chunks whose partial
gradients are summed afterwards. The kernels read the weights from one flat parameter vector and
write the gradient into one, at offsets a `FlatLayout` gives (`ppo_actor_critic_grads_flat`), along
with each program's sum of squared gradients: an optimiser on the flat vector then needs no slicing,
no concatenation and no norm pass over the gradient (benchmarks/RESULTS.md, "The fused PPO
gradient").

Backends: "reference" is `jax.value_and_grad` of the same loss in plain JAX; "triton" and
"interpret" run the kernels. `dot_precision="tf32"` (default: what XLA does by default for float32
matmuls on the GPU), "ieee" (full float32 products; the reference then uses Precision.HIGHEST) or
"bf16" (operands rounded to bfloat16, products summed in float32: `_mlp_tiles.matmul`); the
reference computes its matmuls the same way (`_mlp_tiles.reference_dot`). The op is not itself
differentiable (it is the gradient).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kernels._mlp_tiles import (
    ACTIVATION_CODES,
    PRECISIONS,  # noqa: F401  (re-exported: the op's dot precisions)
    backprop,
    check_precision,
    load_mlp,
    matmul,
    output,
    padded,
    reference_mlp,
    store_grads,
    torso,
)
from kernels._triton import tl, triton
from kernels.launch import (
    cdiv,
    check_float_array,
    chosen_automatically,
    fold_vmap,
    launch,
    resolve_backend,
)

__all__ = [
    "ppo_actor_critic_grads",
    "ppo_actor_critic_grads_flat",
    "FlatLayout",
    "concatenated_layout",
    "flatten",
    "unflatten",
    "ppo_actor_critic_grads_reference",
    "ppo_objective",
    "clipped_surrogate_loss",
    "clipped_value_loss",
    "LIMITS",
]

# f(0) = 0 for each: padded hidden units then stay 0 and their gradients are exactly 0, which the
# kernels' unmasked sums of squared gradients rely on
ACTIVATIONS = ("tanh", "relu")
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


# ---------------------------------------------------------------- the two kernels


@triton.jit
def _actor_grads_kernel(
    obs_ptr,
    action_ptr,
    old_log_prob_ptr,
    advantage_ptr,
    params_ptr,
    clip_ptr,
    ent_coef_ptr,
    M,
    inv_m,
    ROWS,
    S,
    P,
    D,
    H1,
    H2,
    A,
    off_w1,
    off_b1,
    off_w2,
    off_b2,
    off_w3,
    off_b3,
    grads_ptr,
    aux_ptr,
    DP: tl.constexpr,
    H1P: tl.constexpr,
    H2P: tl.constexpr,
    AP: tl.constexpr,
    BLOCK: tl.constexpr,
    ACT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Program (b, s): rows [s ROWS, (s + 1) ROWS) of seed b, whose P parameters are row b of
    params [B, P]; partial gradients of the policy and entropy terms into row b S + s of grads
    [B S, P] at the actor's offsets, and sums of policy loss, entropy, approx_kl, clipped rows and
    the squared gradients at aux[b S + s]."""
    b = tl.program_id(0)
    s = tl.program_id(1)
    w1, b1, w2, b2, w3, b3 = load_mlp(
        params_ptr + b.to(tl.int64) * P,
        off_w1,
        off_b1,
        off_w2,
        off_b2,
        off_w3,
        off_b3,
        D,
        H1,
        H2,
        A,
        DP,
        H1P,
        H2P,
        AP,
    )
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
        x = tl.load(
            obs_ptr + row[:, None] * D + d_cols[None, :],
            mask=ok[:, None] & (d_cols[None, :] < D),
            other=0.0,
        )
        h1, h2 = torso(x, w1, b1, w2, b2, ACT, PRECISION)
        logits = matmul(output(h2, ACT), w3, PRECISION) + b3[None, :]
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
        d_logits = d_log_p_a[:, None] * (onehot.to(tl.float32) - p) + (ent_coef * inv_m) * (
            p_log_p + p * entropy[:, None]
        )
        d_logits = tl.where(ok[:, None] & a_ok[None, :], d_logits, 0.0)
        g_w1, g_b1, g_w2, g_b2, g_w3, g_b3 = backprop(
            x, h1, h2, d_logits, w2, w3, g_w1, g_b1, g_w2, g_b2, g_w3, g_b3, ACT, PRECISION
        )
        loss_sum += tl.sum(tl.where(ok, -tl.minimum(surr1, surr2), 0.0), axis=0)
        entropy_sum += tl.sum(tl.where(ok, entropy, 0.0), axis=0)
        kl_sum += tl.sum(tl.where(ok, (ratio - 1.0) - log_ratio, 0.0), axis=0)
        clipped_sum += tl.sum(tl.where(ok & (tl.abs(ratio - 1.0) > clip), 1.0, 0.0), axis=0)
    i = b * S + s
    sq_sum = store_grads(
        grads_ptr + i.to(tl.int64) * P,
        off_w1,
        off_b1,
        off_w2,
        off_b2,
        off_w3,
        off_b3,
        D,
        H1,
        H2,
        A,
        g_w1,
        g_b1,
        g_w2,
        g_b2,
        g_w3,
        g_b3,
        DP,
        H1P,
        H2P,
        AP,
    )
    tl.store(aux_ptr + i * 5 + 0, loss_sum)
    tl.store(aux_ptr + i * 5 + 1, entropy_sum)
    tl.store(aux_ptr + i * 5 + 2, kl_sum)
    tl.store(aux_ptr + i * 5 + 3, clipped_sum)
    tl.store(aux_ptr + i * 5 + 4, sq_sum)


@triton.jit
def _critic_grads_kernel(
    obs_ptr,
    old_value_ptr,
    target_ptr,
    params_ptr,
    vf_clip_ptr,
    vf_coef_ptr,
    grads_in_ptr,
    M,
    inv_m,
    ROWS,
    S,
    P,
    D,
    H1,
    H2,
    off_w1,
    off_b1,
    off_w2,
    off_b2,
    off_w3,
    off_b3,
    grads_ptr,
    aux_ptr,
    DP: tl.constexpr,
    H1P: tl.constexpr,
    H2P: tl.constexpr,
    OP: tl.constexpr,
    BLOCK: tl.constexpr,
    ACT: tl.constexpr,
    PRECISION: tl.constexpr,
    CLIP_VALUE: tl.constexpr,
):
    """Program (b, s): partial gradients of the value term into row b S + s of grads (the actor
    kernel's output, updated in place: on the GPU grads_in_ptr is the same buffer, under the
    interpreter a copy the output starts from) at the critic's offsets; the
    sums of the value loss and of the squared gradients at aux[b S + s]."""
    b = tl.program_id(0)
    s = tl.program_id(1)
    w1, b1, w2, b2, w3, b3 = load_mlp(
        params_ptr + b.to(tl.int64) * P,
        off_w1,
        off_b1,
        off_w2,
        off_b2,
        off_w3,
        off_b3,
        D,
        H1,
        H2,
        1,
        DP,
        H1P,
        H2P,
        OP,
    )  # one real output column, zero padding
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
        x = tl.load(
            obs_ptr + row[:, None] * D + d_cols[None, :],
            mask=ok[:, None] & (d_cols[None, :] < D),
            other=0.0,
        )
        h1, h2 = torso(x, w1, b1, w2, b2, ACT, PRECISION)
        value = tl.sum(
            matmul(output(h2, ACT), w3, PRECISION) + b3[None, :], axis=1
        )  # padded columns are 0
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
        g_w1, g_b1, g_w2, g_b2, g_w3, g_b3 = backprop(
            x, h1, h2, d_out, w2, w3, g_w1, g_b1, g_w2, g_b2, g_w3, g_b3, ACT, PRECISION
        )
        loss_sum += tl.sum(tl.where(ok, loss, 0.0), axis=0)
    i = b * S + s
    sq_sum = store_grads(
        grads_ptr + i.to(tl.int64) * P,
        off_w1,
        off_b1,
        off_w2,
        off_b2,
        off_w3,
        off_b3,
        D,
        H1,
        H2,
        1,
        g_w1,
        g_b1,
        g_w2,
        g_b2,
        g_w3,
        g_b3,
        DP,
        H1P,
        H2P,
        OP,
    )
    tl.store(aux_ptr + i * 2 + 0, loss_sum)
    tl.store(aux_ptr + i * 2 + 1, sq_sum)


# ---------------------------------------------------------------- launching


def _row_chunks(num_seeds: int, m: int) -> tuple[int, int]:
    """(rows per program, chunks): enough programs to fill the GPU,
    whole BLOCK_M steps per chunk."""
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


class FlatLayout(NamedTuple):
    """Where a two-MLP actor-critic's twelve arrays lie in one flat parameter vector of `size`
    floats: `actor` and `critic` hold the offsets of (w1, b1, w2, b2, w3, b3), each array row-major
    (weights [in, out]) and contiguous, with obs_dim D, hidden widths (H1, H2) and A actions; the
    critic's head has one output. `jax.flatten_util.ravel_pytree`'s vector of the network's params
    is such a vector (`rl.nn.param_layout.leaf_offsets` gives the offsets). A layout is static
    (Python ints, fixed at trace time): close over it, do not pass it through `jit` or `vmap` as an
    argument."""

    actor: tuple[int, int, int, int, int, int]
    critic: tuple[int, int, int, int, int, int]
    obs_dim: int
    hidden: tuple[int, int]
    actions: int
    size: int

    def shapes(self) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
        """The shapes of the actor's and the critic's six arrays."""
        (h1, h2), d = self.hidden, self.obs_dim
        body = [(d, h1), (h1,), (h1, h2), (h2,)]
        return body + [(h2, self.actions), (self.actions,)], body + [(h2, 1), (1,)]


def concatenated_layout(obs_dim: int, hidden: tuple[int, int], actions: int) -> FlatLayout:
    """The layout of the actor's six arrays followed by the critic's, each raveled, in order."""
    layout = FlatLayout(
        (0,) * 6, (0,) * 6, int(obs_dim), tuple(int(h) for h in hidden), int(actions), 0
    )
    offsets, at = [], 0
    for shape in sum(layout.shapes(), []):
        offsets.append(at)
        at += math.prod(shape)
    return layout._replace(actor=tuple(offsets[:6]), critic=tuple(offsets[6:]), size=at)


def _static_int(name: str, value) -> int:
    if isinstance(value, (bool, jax.Array)) or not isinstance(value, (int, np.integer)):
        raise ValueError(
            f"layout.{name} must be a Python int (a layout is static: close over it, "
            f"do not trace it), got {value!r}"
        )
    return int(value)


def check_layout(layout: FlatLayout) -> FlatLayout:
    """`layout` with plain-int tuples, after checking it: six offsets per network, two hidden
    widths, positive sizes, and the twelve arrays covering [0, layout.size) exactly once (the
    kernels write every gradient entry and nothing else, so a gap would be left undefined).
    ValueError naming the problem otherwise."""
    if not isinstance(layout, FlatLayout):
        raise ValueError(
            f"layout must be a kernels.ppo_grads.FlatLayout, got {type(layout).__name__}"
        )
    for net in ("actor", "critic"):
        if len(getattr(layout, net)) != 6:
            raise ValueError(
                f"layout.{net} must hold 6 offsets (w1, b1, w2, b2, w3, b3), "
                f"got {getattr(layout, net)!r}"
            )
    if len(layout.hidden) != 2:
        raise ValueError(f"layout.hidden must be two widths (H1, H2), got {layout.hidden!r}")
    layout = FlatLayout(
        tuple(_static_int(f"actor[{i}]", x) for i, x in enumerate(layout.actor)),
        tuple(_static_int(f"critic[{i}]", x) for i, x in enumerate(layout.critic)),
        _static_int("obs_dim", layout.obs_dim),
        tuple(_static_int("hidden", h) for h in layout.hidden),
        _static_int("actions", layout.actions),
        _static_int("size", layout.size),
    )
    if min(layout.obs_dim, *layout.hidden, layout.actions) < 1:
        raise ValueError(
            f"layout: obs_dim, hidden widths and actions must be positive (layout {layout})"
        )
    spans = sorted(
        (off, off + math.prod(shape), f"{net}[{i}]")
        for net, offsets, shapes in zip(
            ("actor", "critic"), (layout.actor, layout.critic), layout.shapes()
        )
        for i, (off, shape) in enumerate(zip(offsets, shapes))
    )
    at = 0
    for start, end, name in spans:
        if start != at:
            raise ValueError(
                f"layout: {name} starts at {start}, but the arrays before it end at {at}: "
                f"the twelve arrays must cover the flat vector's {layout.size} entries exactly "
                f"once, with no gap or overlap (layout {layout})"
            )
        at = end
    if at != layout.size:
        raise ValueError(
            f"layout: the twelve arrays cover {at} entries, "
            f"the flat vector has {layout.size} (layout {layout})"
        )
    return layout


def unflatten(params, layout: FlatLayout):
    """(actor, critic): the six arrays of each network cut out of params [..., size]."""
    lead = params.shape[:-1]
    cut = lambda off, shape: params[..., off : off + math.prod(shape)].reshape(lead + shape)
    shapes_actor, shapes_critic = layout.shapes()
    return (
        tuple(cut(o, sh) for o, sh in zip(layout.actor, shapes_actor)),
        tuple(cut(o, sh) for o, sh in zip(layout.critic, shapes_critic)),
    )


def flatten(actor, critic, layout: FlatLayout):
    """The inverse of `unflatten`: the twelve arrays (with the same leading axes)
    in one vector [..., size]."""
    layout = check_layout(layout)
    lead = actor[0].shape[: actor[0].ndim - 2]
    placed = sorted(zip(layout.actor + layout.critic, range(12), tuple(actor) + tuple(critic)))
    return jnp.concatenate([x.reshape(lead + (-1,)) for _, _, x in placed], axis=-1)


def _reference_flat(
    obs, actions, rows, params, scalars, layout, activation, clip_value_loss, dot_precision
):
    """(grads [size], squared norm, stats) of one minibatch from the plain-JAX reference."""
    actor, critic = unflatten(params, layout)
    g_actor, g_critic, stats = ppo_actor_critic_grads_reference(
        obs,
        actions,
        *rows,
        actor,
        critic,
        *scalars,
        activation=activation,
        clip_value_loss=clip_value_loss,
        dot_precision=dot_precision,
    )
    grads = flatten(g_actor, g_critic, layout)
    return grads, jnp.sum(jnp.square(grads)), stats


def _flat_grads_core(
    obs,
    actions,
    old_log_probs,
    old_values,
    advantages,
    targets,
    params,
    clip_eps,
    vf_clip_eps,
    ent_coef,
    vf_coef,
    *,
    lead,
    layout,
    backend,
    automatic,
    activation,
    clip_value_loss,
    dot_precision,
):
    lead_shape = tuple(obs.shape[:lead])
    b = math.prod(lead_shape)
    m, d = obs.shape[lead], obs.shape[lead + 1]
    (h1, h2), a, size = layout.hidden, layout.actions, layout.size
    flat = lambda x, *shape: x.reshape((b,) + shape)
    obs3 = flat(obs, m, d)
    rows = [flat(x, m) for x in (old_log_probs, old_values, advantages, targets)]
    actions2 = flat(actions, m).astype(jnp.int32)
    scalars = [flat(x.astype(jnp.float32)) for x in (clip_eps, vf_clip_eps, ent_coef, vf_coef)]
    params2 = flat(params, size)
    restore = lambda x: x.reshape(lead_shape + x.shape[1:])
    if automatic_crossover(backend, automatic, b, m) == "reference":
        grads, sq_norm, stats = _reference_flat(
            obs3[0],
            actions2[0],
            [x[0] for x in rows],
            params2[0],
            [x[0] for x in scalars],
            layout,
            activation,
            clip_value_loss,
            dot_precision,
        )
        return (
            grads.reshape(lead_shape + grads.shape),
            sq_norm.reshape(lead_shape),
            *(stats[n].reshape(lead_shape) for n in AUX_NAMES),
        )
    chunk_rows, chunks = _row_chunks(b, m)
    f32 = jnp.float32
    common = dict(
        backend=backend,
        grid=(b, chunks),
        num_warps=NUM_WARPS,
        DP=padded(d),
        H1P=padded(h1),
        H2P=padded(h2),
        BLOCK=BLOCK_M,
        ACT=ACTIVATION_CODES[activation],
        PRECISION=dot_precision,
    )
    grads_shape = jax.ShapeDtypeStruct((b * chunks, size), f32)
    grads, aux_actor = launch(
        _actor_grads_kernel,
        obs3,
        actions2,
        rows[0],
        rows[2],
        params2,
        scalars[0],
        scalars[2],
        m,
        np.float32(1.0 / m),
        chunk_rows,
        chunks,
        size,
        d,
        h1,
        h2,
        a,
        *layout.actor,
        out_shape=[grads_shape, jax.ShapeDtypeStruct((b * chunks, 5), f32)],
        AP=padded(a),
        **common,
    )
    grads, aux_critic = launch(
        _critic_grads_kernel,
        obs3,
        rows[1],
        rows[3],
        params2,
        scalars[1],
        scalars[3],
        grads,
        m,
        np.float32(1.0 / m),
        chunk_rows,
        chunks,
        size,
        d,
        h1,
        h2,
        *layout.critic,
        out_shape=[grads_shape, jax.ShapeDtypeStruct((b * chunks, 2), f32)],
        input_output_aliases={6: 0},
        OP=16,
        CLIP_VALUE=bool(clip_value_loss),
        **common,
    )
    total = lambda x: x.reshape((b, chunks) + x.shape[1:]).sum(axis=1)
    if chunks == 1:  # each program's sum of squares covers its network's whole gradient
        sq_norm = aux_actor[:, 4] + aux_critic[:, 1]
    else:  # partial gradients are summed first; the squares of the sum are not the programs' sums
        grads = total(grads)
        sq_norm = jnp.sum(jnp.square(grads), axis=1)
    sums = total(aux_actor) / m
    stats = [sums[:, 0], total(aux_critic)[:, 0] / m, sums[:, 1], sums[:, 2], sums[:, 3]]
    return (restore(grads), restore(sq_norm), *map(restore, stats))


@functools.lru_cache(maxsize=None)
def _kernel_op(
    backend: str,
    automatic: bool,
    layout: FlatLayout,
    activation: str,
    clip_value_loss: bool,
    dot_precision: str,
):
    return fold_vmap(
        functools.partial(
            _flat_grads_core,
            layout=layout,
            backend=backend,
            automatic=automatic,
            activation=activation,
            clip_value_loss=clip_value_loss,
            dot_precision=dot_precision,
        )
    )


# ---------------------------------------------------------------- reference


def clipped_surrogate_loss(ratio, advantages, clip_eps):
    """PPO's clipped surrogate (Schulman et al. 2017):
    -mean(min(rho A, clip(rho, 1 - eps, 1 + eps) A))."""
    return -jnp.mean(
        jnp.minimum(
            ratio * advantages, jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
        )
    )


def clipped_value_loss(values, old_values, targets, clip_eps, clip: bool = True):
    """0.5 mean(max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2));
    0.5 mean((V - R)^2) when not `clip`."""
    unclipped = jnp.square(values - targets)
    if not clip:
        return 0.5 * jnp.mean(unclipped)
    clipped = jnp.square(old_values + jnp.clip(values - old_values, -clip_eps, clip_eps) - targets)
    return 0.5 * jnp.mean(jnp.maximum(unclipped, clipped))


def ppo_objective(
    log_prob,
    entropy,
    values,
    old_log_probs,
    old_values,
    advantages,
    targets,
    clip_eps,
    vf_clip_eps,
    ent_coef,
    vf_coef,
    clip_value_loss: bool = True,
):
    """(L, stats) of one minibatch, from the per-row log pi(a|s), entropy H and value V of the
    current policy (any action distribution):

        L = clipped_surrogate_loss(rho, A, eps) + vf_coef clipped_value_loss(V, V_old, R, eps_v)
            - ent_coef mean(H)

    with rho = exp(log pi(a|s) - log pi_old(a|s)); stats: policy_loss, value_loss, entropy,
    approx_kl = mean(rho - 1 - log rho), clip_fraction = mean(|rho - 1| > eps). The fused kernels
    compute the gradient of this function: the kernels' own plain-JAX statement of the objective
    `rl.core.losses.ppo_loss` defines (kernels import nothing from rl; tests/rl/test_losses_ppo.py
    ties the two)."""
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


def ppo_actor_critic_grads_reference(
    obs,
    actions,
    old_log_probs,
    old_values,
    advantages,
    targets,
    actor,
    critic,
    clip_eps,
    vf_clip_eps,
    ent_coef,
    vf_coef,
    *,
    activation="tanh",
    clip_value_loss=True,
    dot_precision="tf32",
):
    """Plain JAX: `jax.value_and_grad` of the loss in the module docstring
    (same signature and outputs)."""

    def loss(actor, critic):
        logits = reference_mlp(actor, obs, activation, dot_precision)
        value = reference_mlp(critic, obs, activation, dot_precision)[..., 0]
        log_p = jax.nn.log_softmax(logits)
        log_prob = jnp.take_along_axis(log_p, actions[..., None].astype(jnp.int32), axis=-1)[..., 0]
        entropy = -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)
        return ppo_objective(
            log_prob,
            entropy,
            value,
            old_log_probs,
            old_values,
            advantages,
            targets,
            clip_eps,
            vf_clip_eps,
            ent_coef,
            vf_coef,
            clip_value_loss,
        )

    (_, stats), (g_actor, g_critic) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
        tuple(actor), tuple(critic)
    )
    return g_actor, g_critic, stats


# ---------------------------------------------------------------- public op


def shared_memory_estimate(obs_dim: int, hidden: tuple[int, int], actions: int) -> int:
    """Bytes of shared memory the actor kernel (the larger of the two) asks for with tf32 products:
    each weight matrix staged for ``tl.dot`` in both orientations and the [BLOCK_M, H] activations
    transposed, with D, H1, H2, A padded as the kernel pads them:

        8 (D H1 + H1 H2 + H2 A) + 4 BLOCK_M (H1 + H2) + 768

    Fitted to Triton's requests on an H100 (benchmarks/RESULTS.md, "The fused PPO gradient":
    246,528 to 295,680 bytes at obs 64, hidden 128 x 128 and 16 to 64 actions, exactly as this
    formula gives; fits at obs 16 with 16 actions, at obs 8 with 4, and at 64 x 64 with 64
    actions). With ieee products the dots run without staging and every size within LIMITS fits."""
    dp, h1p, h2p, ap = (padded(n) for n in (obs_dim, *hidden, actions))
    return 8 * (dp * h1p + h1p * h2p + h2p * ap) + 4 * BLOCK_M * (h1p + h2p) + 768


def too_big_for_shared_memory(obs_dim: int, hidden: tuple[int, int], actions: int) -> str | None:
    """Why these sizes do not fit one program's shared memory with tf32 products,
    or None if they do."""
    need = shared_memory_estimate(obs_dim, hidden, actions)
    if need <= SHARED_MEMORY_BYTES:
        return None
    return (
        f"obs_dim {obs_dim}, hidden {tuple(hidden)} and {actions} actions need about {need:,} "
        "bytes of shared memory per program with tf32 products, "
        f"more than the {SHARED_MEMORY_BYTES:,} of the GPUs measured "
        "(use dot_precision='ieee' or smaller sizes)"
    )


def _check(obs, actions, rows, actor, critic):
    obs = check_float_array("obs", obs, ndim=2)
    m, d = obs.shape
    if tuple(jnp.shape(actions)) != (m,) or not jnp.issubdtype(
        jnp.asarray(actions).dtype, jnp.integer
    ):
        raise ValueError(
            f"actions must be an integer array of shape {(m,)} (one per obs row), "
            f"got {jnp.asarray(actions).dtype} {tuple(jnp.shape(actions))}"
        )
    for name, x in rows.items():
        x = check_float_array(name, x)
        if tuple(x.shape) != (m,):
            raise ValueError(
                f"{name} must have shape {(m,)} (one per obs row), got {tuple(x.shape)}"
            )
    for net, layers, out in (("actor", actor, None), ("critic", critic, 1)):
        if len(layers) != 6:
            raise ValueError(f"{net} must be (w1, b1, w2, b2, w3, b3), got {len(layers)} arrays")
        got = [_float_shape(f"{net}[{i}]", x) for i, x in enumerate(layers)]
        h1, h2, o = (shape[-1] if len(shape) == 2 else -1 for shape in (got[0], got[2], got[4]))
        want = [(d, h1), (h1,), (h1, h2), (h2,), (h2, out if out else o), (out if out else o,)]
        for i, (g, w) in enumerate(zip(got, want)):
            if g != w:
                raise ValueError(
                    f"{net}[{i}] must have shape {w} for obs of shape {(m, d)}, "
                    f"got {g} (all shapes: {got})"
                )
        if h1 > LIMITS["hidden"] or h2 > LIMITS["hidden"]:
            raise ValueError(
                f"{net}: hidden widths ({h1}, {h2}) exceed the fused kernel's limit "
                f"{LIMITS['hidden']}"
            )
    if d > LIMITS["obs_dim"]:
        raise ValueError(
            f"obs has {d} features, more than the fused kernel's limit {LIMITS['obs_dim']}"
        )
    if jnp.shape(actor[4])[-1] > LIMITS["actions"]:
        raise ValueError(
            f"actor has {jnp.shape(actor[4])[-1]} actions, "
            f"more than the fused kernel's limit {LIMITS['actions']}"
        )


def _float_shape(name: str, x) -> tuple[int, ...]:
    """The shape of a floating-point array (or of a `jax.ShapeDtypeStruct` standing for one)."""
    dtype = x.dtype if hasattr(x, "dtype") else jnp.asarray(x).dtype
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(
            f"{name} must be a floating-point array, got dtype {dtype} with shape "
            f"{tuple(jnp.shape(x))}"
        )
    return tuple(jnp.shape(x))


def _check_options(activation: str, dot_precision: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    check_precision(dot_precision)


def _check_fits(name: str, dot_precision: str, layout: FlatLayout, op: str) -> None:
    if name == "triton" and dot_precision == "tf32":
        reason = too_big_for_shared_memory(layout.obs_dim, layout.hidden, layout.actions)
        if reason:
            raise ValueError(f"{op}: {reason}")


def ppo_actor_critic_grads_flat(
    obs,
    actions,
    old_log_probs,
    old_values,
    advantages,
    targets,
    params,
    layout: FlatLayout,
    clip_eps,
    vf_clip_eps,
    ent_coef,
    vf_coef,
    *,
    activation: str = "tanh",
    clip_value_loss: bool = True,
    dot_precision: str = "tf32",
    backend: str | None = None,
):
    """`ppo_actor_critic_grads` on a flat parameter vector: params [size] holds the actor's and the
    critic's arrays where `layout` says (a `FlatLayout` whose arrays cover the vector exactly once).
    Returns (grads [size] laid out like params, ||grads||^2, stats). The kernels read the weights
    from the vector and write the gradient into one in place, and their programs' sums of squares
    give the squared norm (when one program covers a seed's minibatch), so that an optimiser on the
    flat vector (`rl.core.optimizers.flat_step`) needs no slicing, concatenation or norm pass."""
    _check_options(activation, dot_precision)
    layout = check_layout(layout)
    params = check_float_array("params", params, ndim=1)
    if params.shape != (layout.size,):
        raise ValueError(
            f"params must have shape {(layout.size,)} (the layout's size), "
            f"got {tuple(params.shape)}"
        )
    rows = {
        "old_log_probs": old_log_probs,
        "old_values": old_values,
        "advantages": advantages,
        "targets": targets,
    }
    if jnp.ndim(obs) != 2 or jnp.shape(obs)[-1] != layout.obs_dim:
        raise ValueError(
            f"obs must have shape (M, {layout.obs_dim}) (the layout's obs_dim), "
            f"got {tuple(jnp.shape(obs))}"
        )
    shapes_actor, shapes_critic = layout.shapes()
    like = lambda shapes: [jax.ShapeDtypeStruct(shape, params.dtype) for shape in shapes]
    _check(obs, actions, rows, like(shapes_actor), like(shapes_critic))
    name = resolve_backend(backend)
    _check_fits(name, dot_precision, layout, "ppo_actor_critic_grads_flat")
    scalars = [jnp.asarray(x, jnp.float32) for x in (clip_eps, vf_clip_eps, ent_coef, vf_coef)]
    if name == "reference":
        return _reference_flat(
            obs,
            actions,
            list(rows.values()),
            params,
            scalars,
            layout,
            activation,
            clip_value_loss,
            dot_precision,
        )
    op = _kernel_op(
        name,
        chosen_automatically(backend),
        layout,
        activation,
        bool(clip_value_loss),
        dot_precision,
    )
    grads, sq_norm, *stats = op(
        jnp.asarray(obs),
        jnp.asarray(actions),
        *(jnp.asarray(x) for x in rows.values()),
        params,
        *scalars,
    )
    return grads, sq_norm, dict(zip(AUX_NAMES, stats))


def ppo_actor_critic_grads(
    obs,
    actions,
    old_log_probs,
    old_values,
    advantages,
    targets,
    actor,
    critic,
    clip_eps,
    vf_clip_eps,
    ent_coef,
    vf_coef,
    *,
    activation: str = "tanh",
    clip_value_loss: bool = True,
    dot_precision: str = "tf32",
    backend: str | None = None,
):
    """Gradient of PPO's loss for a two-MLP categorical actor-critic on one minibatch
    (module docstring).

    obs [M, D] float; actions [M] int; old_log_probs, old_values, advantages, targets [M];
    actor = (w1 [D, H1], b1 [H1], w2 [H1, H2], b2 [H2], w3 [H2, A], b3 [A]); critic likewise with
    w3 [H2, 1], b3 [1]; clip_eps, vf_clip_eps, ent_coef, vf_coef scalars (may be traced).
    Returns (actor_grads, critic_grads, stats): two tuples shaped like `actor` and `critic`, and a
    dict of scalars (policy_loss, value_loss, entropy, approx_kl, clip_fraction). Works under jit
    and any nesting of vmap (one launch per network). On the kernel backends the twelve arrays are
    concatenated into one vector for `ppo_actor_critic_grads_flat` (which an optimiser on a flat
    vector should call directly).

    backend: "triton", "reference" or "interpret"; ``None`` or "auto" = the process-wide choice.
    When that choice is the automatic one (none named anywhere) on a GPU, a single minibatch (no
    vmap, or vmaps of total size 1: one seed) of fewer than ``AUTO_TRITON_MIN_ROWS_ONE_SEED``
    (32768) rows goes to the reference, which is faster there (measured); a named ``"triton"``
    always runs the kernels.
    """
    _check_options(activation, dot_precision)
    rows = {
        "old_log_probs": old_log_probs,
        "old_values": old_values,
        "advantages": advantages,
        "targets": targets,
    }
    _check(obs, actions, rows, actor, critic)
    layout = concatenated_layout(
        obs.shape[-1], (actor[0].shape[-1], actor[2].shape[-1]), actor[4].shape[-1]
    )
    name = resolve_backend(backend)
    _check_fits(name, dot_precision, layout, "ppo_actor_critic_grads")
    scalars = [jnp.asarray(x, jnp.float32) for x in (clip_eps, vf_clip_eps, ent_coef, vf_coef)]
    if name == "reference":
        return ppo_actor_critic_grads_reference(
            obs,
            actions,
            old_log_probs,
            old_values,
            advantages,
            targets,
            actor,
            critic,
            *scalars,
            activation=activation,
            clip_value_loss=clip_value_loss,
            dot_precision=dot_precision,
        )
    op = _kernel_op(
        name,
        chosen_automatically(backend),
        layout,
        activation,
        bool(clip_value_loss),
        dot_precision,
    )
    params = flatten(tuple(map(jnp.asarray, actor)), tuple(map(jnp.asarray, critic)), layout)
    grads, _, *stats = op(
        jnp.asarray(obs),
        jnp.asarray(actions),
        *(jnp.asarray(x) for x in rows.values()),
        params,
        *scalars,
    )
    g_actor, g_critic = unflatten(grads, layout)
    return g_actor, g_critic, dict(zip(AUX_NAMES, stats))
