"""Fused minibatch gradient of twin Q-networks (clipped double Q: TD3's and SAC's critic step) on a
flat parameter vector.

Each critic i = 1, 2 is an MLP with two hidden layers (activation f = tanh, relu or silu) reading
concat(s, a) and giving one value, Q_i(s, a) = f(f([s, a] W1 + b1) W2 + b2) W3 + b3, its six arrays
read from one flat vector at the offsets a `TwinQLayout` gives (`jax.flatten_util.ravel_pytree`'s
vector of the twin critics' params). For a minibatch of M transitions (s, a, r, gamma_t, s', a', c),
gamma_t = gamma (1 - terminated) (zero only where the episode terminated: a truncation still
bootstraps), a' the next action the caller chose (TD3: the smoothed target action; SAC: a sample of
the policy at s'), c a per-row bonus added to the next value (SAC: -alpha log pi(a'|s'); TD3: 0),
with online params theta and target params theta':

    y   = r + gamma_t (min(Q1_theta'(s', a'), Q2_theta'(s', a')) + c)     (held fixed)
    L   = (1/2) sum_i (1/M) sum_rows (Q_i_theta(s, a) - y)^2

and this op returns dL/dtheta on the flat vector, its squared norm, L and mean Q1_theta(s, a). The
backward: dL/dQ_i(s, a) = (Q_i(s, a) - y) / M, then the usual backpropagation through each
critic's three layers (`kernels._mlp_tiles.backprop`).

Why a kernel: a critic step on small MLPs is launch-bound on the GPU: XLA runs the two target and
the two online forward passes, the loss and the two backward passes as dozens of kernels of about a
microsecond each. Here one launch does it all: a seed's minibatch is spread over several programs
(`kernels.q_grads._block_rows`' rule), each holding one critic's weights at a time, and their
partial gradients are summed afterwards.

Backends: "reference" is `jax.value_and_grad` of the same loss in plain JAX; "triton" and
"interpret" run the kernel. `dot_precision="tf32"` (the default: what XLA does for float32 matmuls
on the GPU), "ieee" (full float32 products; the reference then uses Precision.HIGHEST) or "bf16"
(operands rounded to bfloat16, products summed in float32: `_mlp_tiles.matmul`); the reference
computes its matmuls the same way (`_mlp_tiles.reference_dot`). The op is not itself differentiable
(it is the gradient).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kernels import q_grads
from kernels._mlp_tiles import (
    ACTIVATION_CODES,
    PRECISIONS,  # noqa: F401  (re-exported: the op's dot precisions)
    backprop,
    check_flat_layout,
    check_precision,
    load_mlp,
    matmul,
    output,
    padded,
    reference_dot,
    store_grads,
    summed_partials,
    torso,
)
from kernels._triton import tl, triton
from kernels.launch import cdiv, check_float_array, fold_vmap, launch, resolve_backend

__all__ = [
    "TwinQLayout",
    "twin_q_layout",
    "twin_q_grads_flat",
    "twin_q_grads_reference",
    "twin_q_loss",
    "LIMITS",
]

ACTIVATIONS = ("tanh", "relu", "silu")
# largest padded sizes one program holds on chip: observation + action features, hidden widths
LIMITS = {"input_dim": 64, "hidden": 128}
NUM_WARPS = 8
# rows per program at most (`kernels.q_grads._block_rows`' rule otherwise): at rejax's Pendulum
# sizes (64 x 64, 64 seeds x 256 rows) 32 measured fastest on an H200 (benchmarks/RESULTS.md, "The
# fused SAC, TD3 and Q-learning kernels"), where 64 spills (sm_90 compiles); a module setting, so
# that benchmarks can sweep it
MAX_BLOCK_M = 32
OUT_PAD = 16  # the one output column, padded to what tl.dot needs


# ---------------------------------------------------------------- the kernel


@triton.jit
def _load_input(obs_ptr, action_ptr, row, ok, D, A, DP: tl.constexpr):
    """concat(s, a) of the block's rows as one [BLOCK, DP] tile, zero beyond D + A columns."""
    cols = tl.arange(0, DP)
    s = tl.load(
        obs_ptr + row[:, None] * D + cols[None, :],
        mask=ok[:, None] & (cols[None, :] < D),
        other=0.0,
    )
    a_cols = cols - D
    a = tl.load(
        action_ptr + row[:, None] * A + a_cols[None, :],
        mask=ok[:, None] & (cols[None, :] >= D) & (a_cols[None, :] < A),
        other=0.0,
    )
    return s + a


@triton.jit
def _critic_value(
    x, ptr, o_w1, o_b1, o_w2, o_b2, o_w3, o_b3, IN, H1, H2,
    DP: tl.constexpr, H1P: tl.constexpr, H2P: tl.constexpr, OP: tl.constexpr,
    ACT: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Q(x) [BLOCK] of the critic whose arrays start at offsets o_* of the vector at ptr."""
    w1, b1, w2, b2, w3, b3 = load_mlp(
        ptr, o_w1, o_b1, o_w2, o_b2, o_w3, o_b3, IN, H1, H2, 1, DP, H1P, H2P, OP
    )
    _, h2 = torso(x, w1, b1, w2, b2, ACT, PRECISION)
    return tl.sum(matmul(output(h2, ACT), w3, PRECISION) + b3[None, :], axis=1)


@triton.jit
def _critic_grads(
    x, y, ok, inv_m, params, grads, o_w1, o_b1, o_w2, o_b2, o_w3, o_b3, IN, H1, H2,
    DP: tl.constexpr, H1P: tl.constexpr, H2P: tl.constexpr, OP: tl.constexpr,
    ACT: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One online critic on the block's x = concat(s, a): its gradient of (1/2M) sum (Q - y)^2
    written at its offsets of the vector at grads; returns (sum of the squared gradient entries,
    sum of the rows' losses, sum of the rows' Q)."""
    w1, b1, w2, b2, w3, b3 = load_mlp(
        params, o_w1, o_b1, o_w2, o_b2, o_w3, o_b3, IN, H1, H2, 1, DP, H1P, H2P, OP
    )
    h1, h2 = torso(x, w1, b1, w2, b2, ACT, PRECISION)
    q = tl.sum(matmul(output(h2, ACT), w3, PRECISION) + b3[None, :], axis=1)
    err = tl.where(ok, q - y, 0.0)
    out_cols = tl.arange(0, OP)
    d_out = tl.where(out_cols[None, :] == 0, (inv_m * err)[:, None], 0.0)
    g_w1, g_b1, g_w2, g_b2, g_w3, g_b3 = backprop(
        x,
        h1,
        h2,
        d_out,
        w2,
        w3,
        tl.zeros([DP, H1P], tl.float32),
        tl.zeros([H1P], tl.float32),
        tl.zeros([H1P, H2P], tl.float32),
        tl.zeros([H2P], tl.float32),
        tl.zeros([H2P, OP], tl.float32),
        tl.zeros([OP], tl.float32),
        ACT,
        PRECISION,
    )
    sq = store_grads(
        grads, o_w1, o_b1, o_w2, o_b2, o_w3, o_b3, IN, H1, H2, 1,
        g_w1, g_b1, g_w2, g_b2, g_w3, g_b3, DP, H1P, H2P, OP,
    )  # fmt: skip
    return sq, tl.sum(0.5 * err * err, axis=0), tl.sum(tl.where(ok, q, 0.0), axis=0)


@triton.jit
def _twin_q_grads_kernel(
    obs_ptr,
    action_ptr,
    reward_ptr,
    discount_ptr,
    next_obs_ptr,
    next_action_ptr,
    bonus_ptr,
    params_ptr,
    target_ptr,
    M,
    inv_m,
    S,
    P,
    D,
    A,
    H1,
    H2,
    o1_w1,
    o1_b1,
    o1_w2,
    o1_b2,
    o1_w3,
    o1_b3,
    o2_w1,
    o2_b1,
    o2_w2,
    o2_b2,
    o2_w3,
    o2_b3,
    grads_ptr,
    aux_ptr,
    DP: tl.constexpr,
    H1P: tl.constexpr,
    H2P: tl.constexpr,
    OP: tl.constexpr,
    BLOCK: tl.constexpr,
    ACT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Program (b, s): rows [s BLOCK, (s + 1) BLOCK) of seed b (params and target params: row b of
    [B, P]); their partial gradient into row b S + s of grads [B S, P]; the sums of the loss, of
    Q1(s, a) and of the squared partial gradient at aux[b S + s]."""
    b = tl.program_id(0)
    s = tl.program_id(1)
    rows = s * BLOCK + tl.arange(0, BLOCK)
    ok = rows < M
    row = b.to(tl.int64) * M + rows
    IN = D + A
    params = params_ptr + b.to(tl.int64) * P
    target = target_ptr + b.to(tl.int64) * P
    # the target critics on (s', a'), one critic's weights on chip at a time, then the target y
    next_x = _load_input(next_obs_ptr, next_action_ptr, row, ok, D, A, DP)
    q1_next = _critic_value(
        next_x, target, o1_w1, o1_b1, o1_w2, o1_b2, o1_w3, o1_b3,
        IN, H1, H2, DP, H1P, H2P, OP, ACT, PRECISION,
    )  # fmt: skip
    q2_next = _critic_value(
        next_x, target, o2_w1, o2_b1, o2_w2, o2_b2, o2_w3, o2_b3,
        IN, H1, H2, DP, H1P, H2P, OP, ACT, PRECISION,
    )  # fmt: skip
    reward = tl.load(reward_ptr + row, mask=ok, other=0.0)
    discount = tl.load(discount_ptr + row, mask=ok, other=0.0)
    bonus = tl.load(bonus_ptr + row, mask=ok, other=0.0)
    y = reward + discount * (tl.minimum(q1_next, q2_next) + bonus)
    # each online critic on (s, a): its squared error and its backward
    x = _load_input(obs_ptr, action_ptr, row, ok, D, A, DP)
    i = b * S + s
    grads = grads_ptr + i.to(tl.int64) * P
    sq1, loss1, q1_sum = _critic_grads(
        x, y, ok, inv_m, params, grads, o1_w1, o1_b1, o1_w2, o1_b2, o1_w3, o1_b3,
        IN, H1, H2, DP, H1P, H2P, OP, ACT, PRECISION,
    )  # fmt: skip
    sq2, loss2, _ = _critic_grads(
        x, y, ok, inv_m, params, grads, o2_w1, o2_b1, o2_w2, o2_b2, o2_w3, o2_b3,
        IN, H1, H2, DP, H1P, H2P, OP, ACT, PRECISION,
    )  # fmt: skip
    tl.store(aux_ptr + i * 3 + 0, loss1 + loss2)
    tl.store(aux_ptr + i * 3 + 1, q1_sum)
    tl.store(aux_ptr + i * 3 + 2, sq1 + sq2)


# ---------------------------------------------------------------- the layout


class TwinQLayout(NamedTuple):
    """Where the twin critics' twelve arrays (critic 1's w1, b1, w2, b2, w3, b3, then critic 2's;
    weights [in, out], row-major, contiguous) lie in one flat parameter vector of `size` floats:
    observation features D, action features A (each critic reads concat(s, a), D + A wide), hidden
    widths (H1, H2), one output. Static (Python ints): close over it, do not trace it."""

    offsets: tuple[int, ...]
    obs_dim: int
    action_dim: int
    hidden: tuple[int, int]
    size: int

    def shapes(self) -> list[tuple[int, ...]]:
        (h1, h2), n = self.hidden, self.obs_dim + self.action_dim
        return [(n, h1), (h1,), (h1, h2), (h2,), (h2, 1), (1,)] * 2


def twin_q_layout(obs_dim: int, action_dim: int, hidden: tuple[int, int]) -> TwinQLayout:
    """The layout of the twelve arrays raveled one after another, in order."""
    layout = TwinQLayout((0,) * 12, int(obs_dim), int(action_dim), tuple(int(h) for h in hidden), 0)
    offsets = [0, *np.cumsum([math.prod(s) for s in layout.shapes()]).tolist()]
    return layout._replace(offsets=tuple(offsets[:12]), size=offsets[12])


def check_layout(layout: TwinQLayout) -> TwinQLayout:
    """`layout` after checking it (`_mlp_tiles.check_flat_layout`: twelve arrays)."""
    return check_flat_layout(
        layout, TwinQLayout, 12, lambda l: [l.obs_dim, l.action_dim, *l.hidden]
    )


def unflatten(params, layout: TwinQLayout):
    """((critic 1's six arrays), (critic 2's)) cut out of params [..., size]."""
    lead = params.shape[:-1]
    arrays = tuple(
        params[..., o : o + math.prod(shape)].reshape(lead + shape)
        for o, shape in zip(layout.offsets, layout.shapes())
    )
    return arrays[:6], arrays[6:]


# ---------------------------------------------------------------- reference


def _critic(layers, obs, action, activation: str, dot_precision: str):
    f = {"tanh": jnp.tanh, "relu": jax.nn.relu, "silu": jax.nn.silu}[activation]
    w1, b1, w2, b2, w3, b3 = layers
    dot = functools.partial(reference_dot, dot_precision=dot_precision)
    x = jnp.concatenate([obs, action], axis=-1)
    return (dot(f(dot(f(dot(x, w1) + b1), w2) + b2), w3) + b3)[..., 0]


def twin_q_loss(
    params,
    target_params,
    obs,
    actions,
    rewards,
    discounts,
    next_obs,
    next_actions,
    next_bonus,
    layout: TwinQLayout,
    *,
    activation: str = "relu",
    dot_precision: str = "tf32",
):
    """(L, mean Q1(s, a)) of the module docstring, in plain JAX, on flat params [size]."""
    critics = lambda p, s, a: [
        _critic(c, s, a, activation, dot_precision) for c in unflatten(p, layout)
    ]
    next_value = jnp.minimum(*critics(target_params, next_obs, next_actions)) + next_bonus
    target = jax.lax.stop_gradient(rewards + discounts * next_value)
    q1, q2 = critics(params, obs, actions)
    loss = 0.5 * (jnp.mean(jnp.square(q1 - target)) + jnp.mean(jnp.square(q2 - target)))
    return loss, jnp.mean(q1)


def twin_q_grads_reference(
    obs, actions, rewards, discounts, next_obs, next_actions, next_bonus, params, target_params,
    layout, **options,
):  # fmt: skip
    """(grads [size], ||grads||^2, {"loss", "q_mean"}) by `jax.value_and_grad` of `twin_q_loss`."""
    (value, q_mean), grads = jax.value_and_grad(twin_q_loss, has_aux=True)(
        params, target_params, obs, actions, rewards, discounts, next_obs, next_actions,
        next_bonus, layout, **options,
    )  # fmt: skip
    return grads, jnp.sum(jnp.square(grads)), {"loss": value, "q_mean": q_mean}


# ---------------------------------------------------------------- launching


def _grads_core(
    obs,
    actions,
    rewards,
    discounts,
    next_obs,
    next_actions,
    next_bonus,
    params,
    target_params,
    *,
    lead,
    layout,
    backend,
    activation,
    dot_precision,
):
    lead_shape = tuple(obs.shape[:lead])
    b = math.prod(lead_shape)
    m, d = obs.shape[lead], obs.shape[lead + 1]
    a = layout.action_dim
    (h1, h2), size = layout.hidden, layout.size
    block = q_grads._block_rows(b, m, MAX_BLOCK_M)
    chunks = cdiv(m, block)
    f32 = jnp.float32
    rows = lambda x: x.reshape(b, m).astype(f32)
    grads, aux = launch(
        _twin_q_grads_kernel,
        obs.reshape(b, m, d).astype(f32),
        actions.reshape(b, m, a).astype(f32),
        rows(rewards),
        rows(discounts),
        next_obs.reshape(b, m, d).astype(f32),
        next_actions.reshape(b, m, a).astype(f32),
        rows(next_bonus),
        params.reshape(b, size),
        target_params.reshape(b, size),
        m,
        np.float32(1.0 / m),
        chunks,
        size,
        d,
        a,
        h1,
        h2,
        *layout.offsets,
        backend=backend,
        out_shape=[
            jax.ShapeDtypeStruct((b * chunks, size), f32),
            jax.ShapeDtypeStruct((b * chunks, 3), f32),
        ],
        grid=(b, chunks),
        num_warps=NUM_WARPS,
        DP=padded(d + a),
        H1P=padded(h1),
        H2P=padded(h2),
        OP=OUT_PAD,
        BLOCK=block,
        ACT=ACTIVATION_CODES[activation],
        PRECISION=dot_precision,
    )
    grads, sq_norm, sums = summed_partials(grads, aux, b, chunks)
    restore = lambda x: x.reshape(lead_shape + x.shape[1:])
    return restore(grads), restore(sq_norm), restore(sums[:, 0] / m), restore(sums[:, 1] / m)


@functools.lru_cache(maxsize=None)
def _kernel_op(backend, layout, activation, dot_precision):
    return fold_vmap(
        functools.partial(
            _grads_core,
            layout=layout,
            backend=backend,
            activation=activation,
            dot_precision=dot_precision,
        )
    )


# ---------------------------------------------------------------- checks and the op


def unfit_reason(layout: TwinQLayout) -> str | None:
    """Why the kernel cannot hold these critics on chip (sizes beyond `LIMITS`), or None."""
    if (
        layout.obs_dim + layout.action_dim > LIMITS["input_dim"]
        or max(layout.hidden) > LIMITS["hidden"]
    ):
        return (
            f"obs_dim {layout.obs_dim} + action_dim {layout.action_dim}, hidden {layout.hidden}: "
            f"beyond the fused twin-critic kernel's limits {LIMITS}"
        )
    return None


def _check(obs, actions, rewards, discounts, next_obs, next_actions, bonus, params, target, layout):
    d, a = layout.obs_dim, layout.action_dim
    for name, x in (("obs", obs), ("next_obs", next_obs)):
        check_float_array(name, x)
        if x.ndim != 2 or x.shape[1] != d:
            raise ValueError(f"{name} must be [rows, {d}] (layout.obs_dim), got {x.shape}")
    if next_obs.shape != obs.shape:
        raise ValueError(f"next_obs must have obs's shape {obs.shape}, got {next_obs.shape}")
    m = obs.shape[0]
    if m < 1:
        raise ValueError("obs must hold at least one row")
    for name, x in (("actions", actions), ("next_actions", next_actions)):
        check_float_array(name, x)
        if x.shape != (m, a):
            raise ValueError(
                f"{name} must be [{m}, {a}] (rows of obs, layout.action_dim), got {x.shape}"
            )
    for name, x in (("rewards", rewards), ("discounts", discounts), ("next_bonus", bonus)):
        check_float_array(name, x)
        if x.shape != (m,):
            raise ValueError(f"{name} must be [{m}] (one per row of obs), got {x.shape}")
    for name, x in (("params", params), ("target_params", target)):
        check_float_array(name, x)
        if x.shape != (layout.size,):
            raise ValueError(f"{name} must be [{layout.size}] (layout.size), got {x.shape}")


def twin_q_grads_flat(
    obs,
    actions,
    rewards,
    discounts,
    next_obs,
    next_actions,
    next_bonus,
    params,
    target_params,
    layout: TwinQLayout,
    *,
    activation: str = "relu",
    dot_precision: str = "tf32",
    backend: str | None = None,
):
    """The twin critics' minibatch gradient of the module docstring.

    obs, next_obs [M, D]; actions, next_actions [M, A]; rewards, discounts, next_bonus [M]
    (discounts: gamma (1 - terminated)); params, target_params [size], laid out as `layout` says.
    Returns (grads [size], ||grads||^2, {"loss": L, "q_mean": mean Q1(s, a)}). Batch the seeds
    with `jax.vmap`: every seed's minibatch then goes into one launch."""
    layout = check_layout(layout)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    check_precision(dot_precision)
    arrays = [
        jnp.asarray(x)
        for x in (obs, actions, rewards, discounts, next_obs, next_actions, next_bonus)
    ]
    params, target_params = jnp.asarray(params), jnp.asarray(target_params)
    _check(*arrays, params, target_params, layout)
    options = dict(activation=activation, dot_precision=dot_precision)
    name = resolve_backend(backend)
    if name == "reference":
        return twin_q_grads_reference(*arrays, params, target_params, layout, **options)
    reason = unfit_reason(layout)
    if reason is not None:
        raise ValueError(reason + "; use the reference backend for these critics")
    grads, sq_norm, value, q_mean = _kernel_op(name, layout, **options)(
        *arrays, params, target_params
    )
    return grads, sq_norm, {"loss": value, "q_mean": q_mean}
