"""Fused Q-learning minibatch gradient of an MLP Q-network (DQN, double DQN) on a flat parameter
vector.

The Q-network is an MLP with two hidden layers (activation f = tanh, relu or silu) and one output
per action, Q(s) = f(f(s W1 + b1) W2 + b2) W3 + b3, its six arrays read from one flat vector at the
offsets a `QLayout` gives (`jax.flatten_util.ravel_pytree`'s vector of the network's params). For a
minibatch of M transitions (s, a, r, gamma_t, s'), gamma_t = gamma (1 - terminated) (zero only where
the episode terminated: a truncation still bootstraps), with online params theta and target params
theta':

    a*   = argmax_b Q_theta'(s', b)   (DQN)   or   argmax_b Q_theta(s', b)   (double-Q; first index
           on ties)
    y    = r + gamma_t Q_theta'(s', a*)                          (held fixed: no gradient)
    d    = Q_theta(s, a) - y
    L    = (1/M) sum_rows l(d),   l(d) = d^2 (mse),  or (huber)  0.5 d^2 for |d| <= 1, |d| - 0.5
           beyond

and this op returns dL/dtheta on the flat vector, its squared norm, L and mean Q_theta(s, a). The
backward: dL/dQ_theta(s, b) = (1/M) l'(d) [b = a], l'(d) = 2 d (mse) or clip(d, -1, 1) (huber),
then the usual backpropagation through the three layers (`kernels._mlp_tiles.backprop`).

Why a kernel: DQN's gradient step on small MLPs is launch-bound on the GPU. XLA runs the target, the
selector and the online forward, the loss and the backward as ~25 kernels of ~1.3 us each (split-K
reductions and pad kernels for the 120- and 84-wide layers); here one launch does it all. A seed's
minibatch is spread over several programs (`_block_rows`), each computing its rows' targets and
partial gradient on chip (one program per seed was measured 2x slower: benchmarks/RESULTS.md,
"Tried and did not pay"); the partial gradients are summed afterwards. Each program holds one
network's weights at a time (target, then online), so the shared memory of one MLP bounds the sizes
(`LIMITS`).

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
    reference_mlp,
    store_grads,
    summed_partials,
    torso,
)
from kernels._triton import tl, triton
from kernels.launch import cdiv, check_float_array, fold_vmap, launch, resolve_backend

__all__ = [
    "QLayout",
    "q_layout",
    "q_learning_grads_flat",
    "q_learning_grads_reference",
    "q_learning_loss",
    "LIMITS",
]

ACTIVATIONS = ("tanh", "relu", "silu")
LOSSES = ("huber", "mse")
# largest padded sizes one program holds on chip: observation features, hidden widths, actions
LIMITS = {"obs_dim": 64, "hidden": 128, "actions": 64}
# rows per program: the fewest (at least 16, what tl.dot needs) that keep the grid within
# MAX_PROGRAMS programs, up to MAX_BLOCK_M (`_block_rows`); module settings, so that benchmarks can
# sweep them
MIN_BLOCK_M, MAX_BLOCK_M = 16, 64
# two programs per SM of an H100 / H200 (132 SMs); where one program's registers or shared memory
# leave room for one only (hidden widths padded to 128: 255 registers a thread at 8 warps and
# 139,264 bytes, an sm_90 compile), that grid runs in two waves
MAX_PROGRAMS = 264
# 8 warps: at hidden 128 x 128 an sm_90 compile spills 1264 bytes a thread with 4, 80 with 8
# (benchmarks/kernel_resources.py's compile)
NUM_WARPS = 8
AUX_NAMES = ("loss", "q_mean")


# ---------------------------------------------------------------- the kernel


@triton.jit
def _q_grads_kernel(
    obs_ptr,
    action_ptr,
    reward_ptr,
    discount_ptr,
    next_obs_ptr,
    params_ptr,
    target_ptr,
    M,
    inv_m,
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
    DOUBLE_Q: tl.constexpr,
    HUBER: tl.constexpr,
):
    """Program (b, s): rows [s BLOCK, (s + 1) BLOCK) of seed b (params and target params: row b of
    [B, P]); their partial gradient into row b S + s of grads [B S, P]; the sums of the loss, of
    Q(s, a) and of the squared partial gradient at aux[b S + s]."""
    b = tl.program_id(0)
    s = tl.program_id(1)
    rows = s * BLOCK + tl.arange(0, BLOCK)
    ok = rows < M
    row = b.to(tl.int64) * M + rows
    d_cols = tl.arange(0, DP)
    a_cols = tl.arange(0, AP)
    a_ok = a_cols < A
    x_mask = ok[:, None] & (d_cols[None, :] < D)
    next_x = tl.load(next_obs_ptr + row[:, None] * D + d_cols[None, :], mask=x_mask, other=0.0)
    # the target network on s' (its weights are dead before the online network's are loaded)
    w1, b1, w2, b2, w3, b3 = load_mlp(
        target_ptr + b.to(tl.int64) * P,
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
    _, t_h2 = torso(next_x, w1, b1, w2, b2, ACT, PRECISION)
    q_next_target = matmul(output(t_h2, ACT), w3, PRECISION) + b3[None, :]
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
    if DOUBLE_Q:
        _, o_h2 = torso(next_x, w1, b1, w2, b2, ACT, PRECISION)
        selector = matmul(output(o_h2, ACT), w3, PRECISION) + b3[None, :]
    else:
        selector = q_next_target
    best = tl.argmax(tl.where(a_ok[None, :], selector, -float("inf")), axis=1)
    next_value = tl.sum(tl.where(a_cols[None, :] == best[:, None], q_next_target, 0.0), axis=1)
    reward = tl.load(reward_ptr + row, mask=ok, other=0.0)
    discount = tl.load(discount_ptr + row, mask=ok, other=0.0)
    target = reward + discount * next_value
    # the online network on s, its TD error and the backward
    x = tl.load(obs_ptr + row[:, None] * D + d_cols[None, :], mask=x_mask, other=0.0)
    h1, h2 = torso(x, w1, b1, w2, b2, ACT, PRECISION)
    q = matmul(output(h2, ACT), w3, PRECISION) + b3[None, :]
    action = tl.load(action_ptr + row, mask=ok, other=0)
    taken = a_cols[None, :] == action[:, None]
    q_taken = tl.sum(tl.where(taken, q, 0.0), axis=1)
    td = q_taken - target
    if HUBER:
        small = tl.abs(td) <= 1.0
        loss = tl.where(small, 0.5 * td * td, tl.abs(td) - 0.5)
        d_td = tl.minimum(tl.maximum(td, -1.0), 1.0)
    else:
        loss = td * td
        d_td = 2.0 * td
    d_out = tl.where(taken & ok[:, None], (inv_m * d_td)[:, None], 0.0)
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
        tl.zeros([H2P, AP], tl.float32),
        tl.zeros([AP], tl.float32),
        ACT,
        PRECISION,
    )
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
    tl.store(aux_ptr + i * 3 + 0, tl.sum(tl.where(ok, loss, 0.0), axis=0))
    tl.store(aux_ptr + i * 3 + 1, tl.sum(tl.where(ok, q_taken, 0.0), axis=0))
    tl.store(aux_ptr + i * 3 + 2, sq_sum)


# ---------------------------------------------------------------- the layout


class QLayout(NamedTuple):
    """Where an MLP Q-network's six arrays (w1, b1, w2, b2, w3, b3; weights [in, out], row-major,
    contiguous) lie in one flat parameter vector of `size` floats: obs_dim D, hidden widths
    (H1, H2), one output per action. Static (Python ints): close over it, do not trace it."""

    offsets: tuple[int, int, int, int, int, int]
    obs_dim: int
    hidden: tuple[int, int]
    actions: int
    size: int

    def shapes(self) -> list[tuple[int, ...]]:
        (h1, h2), d, a = self.hidden, self.obs_dim, self.actions
        return [(d, h1), (h1,), (h1, h2), (h2,), (h2, a), (a,)]


def q_layout(obs_dim: int, hidden: tuple[int, int], actions: int) -> QLayout:
    """The layout of the six arrays raveled one after another, in order."""
    layout = QLayout((0,) * 6, int(obs_dim), tuple(int(h) for h in hidden), int(actions), 0)
    offsets = [0, *np.cumsum([math.prod(s) for s in layout.shapes()]).tolist()]
    return layout._replace(offsets=tuple(offsets[:6]), size=offsets[6])


def check_layout(layout: QLayout) -> QLayout:
    """`layout` after checking it (`_mlp_tiles.check_flat_layout`: six arrays)."""
    return check_flat_layout(layout, QLayout, 6, lambda l: [l.obs_dim, *l.hidden, l.actions])


def unflatten(params, layout: QLayout):
    """The six arrays cut out of params [..., size]."""
    lead = params.shape[:-1]
    return tuple(
        params[..., o : o + math.prod(shape)].reshape(lead + shape)
        for o, shape in zip(layout.offsets, layout.shapes())
    )


# ---------------------------------------------------------------- reference


def q_learning_loss(
    params,
    target_params,
    obs,
    actions,
    rewards,
    discounts,
    next_obs,
    layout: QLayout,
    *,
    loss: str = "huber",
    double_q: bool = True,
    activation: str = "relu",
    dot_precision: str = "tf32",
):
    """(L, mean Q(s, a)) of the module docstring, in plain JAX, on flat params [size]."""
    q_fn = lambda p, x: reference_mlp(unflatten(p, layout), x, activation, dot_precision)
    q_next_target = q_fn(target_params, next_obs)
    selector = q_fn(params, next_obs) if double_q else q_next_target
    best = jnp.argmax(selector, axis=-1)
    next_value = jnp.take_along_axis(q_next_target, best[:, None], axis=-1)[:, 0]
    target = jax.lax.stop_gradient(rewards + discounts * next_value)
    q_taken = jnp.take_along_axis(q_fn(params, obs), actions[:, None], axis=-1)[:, 0]
    td = q_taken - target
    if loss == "huber":
        per_row = jnp.where(jnp.abs(td) <= 1.0, 0.5 * td * td, jnp.abs(td) - 0.5)
    else:
        per_row = td * td
    return jnp.mean(per_row), jnp.mean(q_taken)


def q_learning_grads_reference(
    obs, actions, rewards, discounts, next_obs, params, target_params, layout, **options
):
    """(grads [size], ||grads||^2, {"loss", "q_mean"}) by `jax.value_and_grad` of
    `q_learning_loss`."""
    (value, q_mean), grads = jax.value_and_grad(q_learning_loss, has_aux=True)(
        params, target_params, obs, actions, rewards, discounts, next_obs, layout, **options
    )
    return grads, jnp.sum(jnp.square(grads)), {"loss": value, "q_mean": q_mean}


# ---------------------------------------------------------------- launching


def _grads_core(
    obs,
    actions,
    rewards,
    discounts,
    next_obs,
    params,
    target_params,
    *,
    lead,
    layout,
    backend,
    loss,
    double_q,
    activation,
    dot_precision,
):
    lead_shape = tuple(obs.shape[:lead])
    b = math.prod(lead_shape)
    m, d = obs.shape[lead], obs.shape[lead + 1]
    (h1, h2), a, size = layout.hidden, layout.actions, layout.size
    block = _block_rows(b, m)
    chunks = cdiv(m, block)
    f32 = jnp.float32
    grads, aux = launch(
        _q_grads_kernel,
        obs.reshape(b, m, d).astype(f32),
        actions.reshape(b, m).astype(jnp.int32),
        rewards.reshape(b, m).astype(f32),
        discounts.reshape(b, m).astype(f32),
        next_obs.reshape(b, m, d).astype(f32),
        params.reshape(b, size),
        target_params.reshape(b, size),
        m,
        np.float32(1.0 / m),
        chunks,
        size,
        d,
        h1,
        h2,
        a,
        *layout.offsets,
        backend=backend,
        out_shape=[
            jax.ShapeDtypeStruct((b * chunks, size), f32),
            jax.ShapeDtypeStruct((b * chunks, 3), f32),
        ],
        grid=(b, chunks),
        num_warps=NUM_WARPS,
        DP=padded(d),
        H1P=padded(h1),
        H2P=padded(h2),
        AP=padded(a),
        BLOCK=block,
        ACT=ACTIVATION_CODES[activation],
        PRECISION=dot_precision,
        DOUBLE_Q=bool(double_q),
        HUBER=loss == "huber",
    )
    grads, sq_norm, sums = summed_partials(grads, aux, b, chunks)
    restore = lambda x: x.reshape(lead_shape + x.shape[1:])
    return restore(grads), restore(sq_norm), restore(sums[:, 0] / m), restore(sums[:, 1] / m)


def _block_rows(num_seeds: int, m: int, max_block: int | None = None) -> int:
    """Rows per program for `num_seeds` minibatches of m rows: from MIN_BLOCK_M up, doubling while
    the grid has more than MAX_PROGRAMS programs, at most `max_block` (default MAX_BLOCK_M; the
    twin-critic and actor ops pass their own, the fastest measured). One seed's 128 rows: 8
    programs of 16 (its partial gradients summed after); 64 seeds: 4 of 32 each."""
    cap = MAX_BLOCK_M if max_block is None else max_block
    block = MIN_BLOCK_M
    while block < cap and num_seeds * cdiv(m, block) > MAX_PROGRAMS:
        block *= 2
    return block


@functools.lru_cache(maxsize=None)
def _kernel_op(backend, layout, loss, double_q, activation, dot_precision):
    return fold_vmap(
        functools.partial(
            _grads_core,
            layout=layout,
            backend=backend,
            loss=loss,
            double_q=double_q,
            activation=activation,
            dot_precision=dot_precision,
        )
    )


# ---------------------------------------------------------------- checks and the op


def unfit_reason(layout: QLayout) -> str | None:
    """Why the kernel cannot hold this network on chip (sizes beyond `LIMITS`), or None."""
    if (
        max(layout.hidden) > LIMITS["hidden"]
        or layout.obs_dim > LIMITS["obs_dim"]
        or layout.actions > LIMITS["actions"]
    ):
        return (
            f"obs_dim {layout.obs_dim}, hidden {layout.hidden}, {layout.actions} actions: beyond "
            f"the fused Q-learning kernel's limits {LIMITS}"
        )
    return None


def _check(obs, actions, rewards, discounts, next_obs, params, target_params, layout):
    check_float_array("obs", obs)
    check_float_array("next_obs", next_obs)
    if obs.ndim != 2 or obs.shape[1] != layout.obs_dim or next_obs.shape != obs.shape:
        raise ValueError(
            f"obs and next_obs must both be [rows, {layout.obs_dim}] (layout.obs_dim), got "
            f"{obs.shape} and {next_obs.shape}"
        )
    m = obs.shape[0]
    if m < 1:
        raise ValueError("obs must hold at least one row")
    for name, x in (("actions", actions), ("rewards", rewards), ("discounts", discounts)):
        if jnp.shape(x) != (m,):
            raise ValueError(f"{name} must be [{m}] (one per row of obs), got {jnp.shape(x)}")
    if not jnp.issubdtype(jnp.asarray(actions).dtype, jnp.integer):
        raise ValueError(f"actions must be integers, got {jnp.asarray(actions).dtype}")
    for name, x in (("params", params), ("target_params", target_params)):
        check_float_array(name, x)
        if x.shape != (layout.size,):
            raise ValueError(f"{name} must be [{layout.size}] (layout.size), got {x.shape}")


def q_learning_grads_flat(
    obs,
    actions,
    rewards,
    discounts,
    next_obs,
    params,
    target_params,
    layout: QLayout,
    *,
    loss: str = "huber",
    double_q: bool = True,
    activation: str = "relu",
    dot_precision: str = "tf32",
    backend: str | None = None,
):
    """The Q-learning minibatch gradient of the module docstring.

    obs, next_obs [M, D] float; actions [M] int; rewards, discounts [M] (discounts: gamma (1 -
    terminated)); params, target_params [size], laid out as `layout` says. Returns (grads [size],
    ||grads||^2, {"loss": L, "q_mean": mean Q(s, a)}). Batch the seeds with `jax.vmap`: every seed's
    minibatch then goes into one launch."""
    layout = check_layout(layout)
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    check_precision(dot_precision)
    obs, next_obs = jnp.asarray(obs), jnp.asarray(next_obs)
    params, target_params = jnp.asarray(params), jnp.asarray(target_params)
    _check(obs, actions, rewards, discounts, next_obs, params, target_params, layout)
    options = dict(
        loss=loss, double_q=bool(double_q), activation=activation, dot_precision=dot_precision
    )
    name = resolve_backend(backend)
    if name == "reference":
        return q_learning_grads_reference(
            obs, jnp.asarray(actions), rewards, discounts, next_obs, params, target_params,
            layout, **options,
        )  # fmt: skip
    reason = unfit_reason(layout)
    if reason is not None:
        raise ValueError(reason + "; use the reference backend for this network")
    grads, sq_norm, value, q_mean = _kernel_op(name, layout, **options)(
        obs, jnp.asarray(actions), jnp.asarray(rewards), jnp.asarray(discounts), next_obs,
        params, target_params,
    )  # fmt: skip
    return grads, sq_norm, {"loss": value, "q_mean": q_mean}
