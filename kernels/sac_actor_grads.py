"""Fused minibatch gradient of SAC's squashed-Gaussian actor through its twin critics on flat
parameter vectors.

The actor is an MLP with two hidden layers (activation f = tanh, relu or silu) and two linear
heads on its features h: the mean mu = h Wm + bm and the raw log-std r = h Wr + br, bounded
smoothly, log_std = lo + (hi - lo) (tanh(r) + 1) / 2 (`rl.nn.networks.squashed_gaussian_head`); its
eight arrays (w1, b1, w2, b2, Wm, bm, Wr, br) are read from one flat vector at the offsets a
`SacActorLayout` gives. The critics are the twin critics of a `kernels.twin_q_grads.TwinQLayout`
(same activation and widths). For a minibatch of M observations s with standard normal draws eps
[M, A] and the temperature alpha (held fixed):

    u = mu(s) + exp(log_std(s)) eps,   a = tanh(u)                               (reparameterised)
    log pi(a|s) = sum_j [-eps_j^2 / 2 - log_std_j - log(2 pi) / 2 - log(1 - tanh(u_j)^2)]
    L = (1/M) sum_rows (alpha log pi(a|s) - min(Q1, Q2)(s, a))

and this op returns dL/d(actor params) on the actor's flat vector, its squared norm, L and the
entropy estimate H = -(1/M) sum_rows log pi(a|s) (what SAC's temperature step reads). The
backward, per row and action dimension (d log(1 - tanh(u)^2) / du = -2 tanh(u)):

    dL/da   = -(1/M) d min(Q1, Q2) / da    (through the smaller critic; half to each on a tie)
    dL/du   = (alpha / M) 2 a + dL/da (1 - a^2)
    dL/dmu  = dL/du,   dL/dlog_std = -(alpha / M) + dL/du exp(log_std) eps
    dL/dr   = dL/dlog_std (hi - lo) (1 - tanh(r)^2) / 2

then the usual backpropagation through the two heads and the actor's hidden layers.

Why a kernel: SAC's actor step on small MLPs is launch-bound on the GPU (the actor's forward, the
sampling, both critics' forwards and their backward to the action, the actor's backward: dozens of
XLA kernels); here one launch does it. A seed's minibatch is spread over several programs
(`kernels.q_grads._block_rows`' rule) whose partial gradients are summed afterwards; each program
holds one network's weights at a time (reading the actor's and the critics' twice).

Backends: "reference" is `jax.value_and_grad` of the same loss in plain JAX; "triton" and
"interpret" run the kernel. `dot_precision="tf32"` (the default), "ieee" or "bf16" (operands rounded
to bfloat16, products summed in float32: `_mlp_tiles.matmul`); the reference computes its matmuls
the same way (`_mlp_tiles.reference_dot`). The selection of the two heads' columns stays an exact
"ieee" dot. The op is not itself differentiable (it is the gradient).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kernels import q_grads, twin_q_grads
from kernels._mlp_tiles import (
    ACTIVATION_CODES,
    PRECISIONS,  # noqa: F401  (re-exported: the op's dot precisions)
    activate,
    activation_grad,
    backprop,
    check_flat_layout,
    check_precision,
    load_matrix,
    load_vector,
    matmul,
    output,
    padded,
    reference_dot,
    saved,
    store_matrix,
    store_vector,
    summed_partials,
    torso,
)
from kernels._triton import tl, triton
from kernels.deterministic_policy_grads import shape_mismatch
from kernels.launch import cdiv, check_float_array, fold_vmap, launch, resolve_backend
from kernels.twin_q_grads import TwinQLayout

__all__ = [
    "SacActorLayout",
    "sac_actor_layout",
    "sac_actor_grads_flat",
    "sac_actor_grads_reference",
    "sac_actor_loss",
]

ACTIVATIONS = ("tanh", "relu", "silu")
NUM_WARPS = 8
# rows per program at most (`kernels.q_grads._block_rows`' rule otherwise): at rejax's Pendulum
# sizes (64 x 64, 64 seeds x 256 rows) 32 measured fastest on an H200 (benchmarks/RESULTS.md, "The
# fused SAC, TD3 and Q-learning kernels"), where 64 spills (sm_90 compiles); a module setting, so
# that benchmarks can sweep it
MAX_BLOCK_M = 32
OUT_PAD = 16  # a critic's one output column, padded to what tl.dot needs
HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


# ---------------------------------------------------------------- the kernel


@triton.jit
def _load_heads(ptr, off_wm, off_bm, off_wr, off_br, H2, A, H2P: tl.constexpr, OP: tl.constexpr):
    """[Wm | Wr] as one [H2P, OP] tile (columns [0, A) the mean's, [A, 2A) the raw log-std's) and
    [bm | br] as one [OP] vector, zero beyond 2A."""
    r = tl.arange(0, H2P)
    c = tl.arange(0, OP)
    rows_ok = r[:, None] < H2
    mean_cols = c[None, :] < A
    raw_cols = (c[None, :] >= A) & (c[None, :] < 2 * A)
    w = tl.load(ptr + off_wm + r[:, None] * A + c[None, :], mask=rows_ok & mean_cols, other=0.0)
    w += tl.load(
        ptr + off_wr + r[:, None] * A + (c[None, :] - A), mask=rows_ok & raw_cols, other=0.0
    )
    bias = tl.load(ptr + off_bm + c, mask=c < A, other=0.0)
    bias += tl.load(ptr + off_br + (c - A), mask=(c >= A) & (c < 2 * A), other=0.0)
    return w, bias


@triton.jit
def _critic_forward(
    x, a, critic, o_v1, o_c1, o_v2, o_c2, o_v3, o_c3, D, A, H1, H2,
    DP: tl.constexpr, AP: tl.constexpr, H1P: tl.constexpr, H2P: tl.constexpr, OP: tl.constexpr,
    ACT: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """(Q(s, a) [BLOCK], what its backward needs) of the critic at offsets o_* of the vector at
    critic, reading [s, a] with its first layer's weight split into the rows read by s and by a."""
    v1_obs = load_matrix(critic + o_v1, D, H1, DP, H1P)
    v1_act = load_matrix(critic + o_v1 + D * H1, A, H1, AP, H1P)
    c1 = load_vector(critic + o_c1, H1, H1P)
    v2 = load_matrix(critic + o_v2, H1, H2, H1P, H2P)
    c2 = load_vector(critic + o_c2, H2, H2P)
    v3 = load_matrix(critic + o_v3, H2, 1, H2P, OP)
    c3 = load_vector(critic + o_c3, 1, OP)
    z1 = matmul(x, v1_obs, PRECISION) + matmul(a, v1_act, PRECISION) + c1[None, :]
    s1 = saved(z1, ACT)
    s2 = saved(matmul(output(s1, ACT), v2, PRECISION) + c2[None, :], ACT)
    q = tl.sum(matmul(output(s2, ACT), v3, PRECISION) + c3[None, :], axis=1)
    return q, s1, s2, v1_act, v2, v3


@triton.jit
def _critic_action_grad(
    x, a, d_q, critic, o_v1, o_c1, o_v2, o_c2, o_v3, o_c3, D, A, H1, H2,
    DP: tl.constexpr, AP: tl.constexpr, H1P: tl.constexpr, H2P: tl.constexpr, OP: tl.constexpr,
    ACT: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """d_q dQ/da [BLOCK, AP] of the critic at offsets o_* (`_critic_forward`, then back to a)."""
    _, s1, s2, v1_act, v2, v3 = _critic_forward(
        x, a, critic, o_v1, o_c1, o_v2, o_c2, o_v3, o_c3, D, A, H1, H2,
        DP, AP, H1P, H2P, OP, ACT, PRECISION,
    )  # fmt: skip
    out_cols = tl.arange(0, OP)
    d_out = tl.where(out_cols[None, :] == 0, d_q[:, None], 0.0)
    d_z2 = matmul(d_out, tl.trans(v3), PRECISION) * activation_grad(s2, ACT)
    d_z1 = matmul(d_z2, tl.trans(v2), PRECISION) * activation_grad(s1, ACT)
    return matmul(d_z1, tl.trans(v1_act), PRECISION)


@triton.jit
def _sac_actor_kernel(
    obs_ptr,
    eps_ptr,
    alpha_ptr,
    actor_ptr,
    critic_ptr,
    M,
    inv_m,
    S,
    P,
    PC,
    D,
    A,
    H1,
    H2,
    log_std_lo,
    log_std_hi,
    off_w1,
    off_b1,
    off_w2,
    off_b2,
    off_wm,
    off_bm,
    off_wr,
    off_br,
    o1_v1,
    o1_c1,
    o1_v2,
    o1_c2,
    o1_v3,
    o1_c3,
    o2_v1,
    o2_c1,
    o2_v2,
    o2_c2,
    o2_v3,
    o2_c3,
    grads_ptr,
    aux_ptr,
    DP: tl.constexpr,
    AP: tl.constexpr,
    H1P: tl.constexpr,
    H2P: tl.constexpr,
    OP: tl.constexpr,
    BLOCK: tl.constexpr,
    ACT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Program (b, s): rows [s BLOCK, (s + 1) BLOCK) of seed b (actor params: row b of [B, P],
    critics: row b of [B, PC], alpha: entry b); their partial gradient into row b S + s of
    grads [B S, P]; the sums of the loss, of log pi and of the squared partial gradient at
    aux[b S + s]. The heads' tile holds the mean in columns [0, A) and the raw log-std in [A, 2A)
    (OP >= 2A columns); per-action quantities live in the first A columns of [BLOCK, AP] tiles."""
    b = tl.program_id(0)
    s = tl.program_id(1)
    rows = s * BLOCK + tl.arange(0, BLOCK)
    ok = rows < M
    row = b.to(tl.int64) * M + rows
    d_cols = tl.arange(0, DP)
    x = tl.load(
        obs_ptr + row[:, None] * D + d_cols[None, :],
        mask=ok[:, None] & (d_cols[None, :] < D),
        other=0.0,
    )
    a_cols = tl.arange(0, AP)
    a_ok = a_cols[None, :] < A
    eps = tl.load(eps_ptr + row[:, None] * A + a_cols[None, :], mask=ok[:, None] & a_ok, other=0.0)
    alpha = tl.load(alpha_ptr + b)
    actor = actor_ptr + b.to(tl.int64) * P
    critic = critic_ptr + b.to(tl.int64) * PC
    # the actor: features, the two heads (one tile), the sample and its log-probability
    w1 = load_matrix(actor + off_w1, D, H1, DP, H1P)
    b1 = load_vector(actor + off_b1, H1, H1P)
    w2 = load_matrix(actor + off_w2, H1, H2, H1P, H2P)
    b2 = load_vector(actor + off_b2, H2, H2P)
    s1, s2 = torso(x, w1, b1, w2, b2, ACT, PRECISION)
    w_heads, b_heads = _load_heads(actor, off_wm, off_bm, off_wr, off_br, H2, A, H2P, OP)
    heads = matmul(output(s2, ACT), w_heads, PRECISION) + b_heads[None, :]
    # move the heads' columns into per-action tiles: [BLOCK, OP] -> [BLOCK, AP] by a 0/1 matmul
    h_rows = tl.arange(0, OP)
    pick_mean = ((h_rows[:, None] == a_cols[None, :]) & a_ok).to(tl.float32)
    pick_raw = ((h_rows[:, None] == a_cols[None, :] + A) & a_ok).to(tl.float32)
    mean = tl.dot(heads, pick_mean, input_precision="ieee")
    raw = tl.dot(heads, pick_raw, input_precision="ieee")
    tanh_raw = activate(raw, 0)
    log_std = log_std_lo + 0.5 * (log_std_hi - log_std_lo) * (tanh_raw + 1.0)
    std = tl.exp(log_std)
    u = mean + std * eps
    act = activate(u, 0)  # tanh
    # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), softplus(y) = max(y, 0) + log(1 + e^-|y|)
    y = -2.0 * u
    softplus = tl.maximum(y, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(y)))
    log_det = 2.0 * (0.6931471805599453 - u - softplus)
    per_dim = -0.5 * eps * eps - log_std - 0.9189385332046727 - log_det
    log_prob = tl.sum(tl.where(a_ok, per_dim, 0.0), axis=1)
    act = tl.where(a_ok, act, 0.0)
    # both critics on [s, a]; the smaller one's (half each on a tie) gradient to the action
    q1 = _critic_forward(
        x, act, critic, o1_v1, o1_c1, o1_v2, o1_c2, o1_v3, o1_c3, D, A, H1, H2,
        DP, AP, H1P, H2P, OP, ACT, PRECISION,
    )[0]  # fmt: skip
    q2 = _critic_forward(
        x, act, critic, o2_v1, o2_c1, o2_v2, o2_c2, o2_v3, o2_c3, D, A, H1, H2,
        DP, AP, H1P, H2P, OP, ACT, PRECISION,
    )[0]  # fmt: skip
    share1 = tl.where(q1 < q2, 1.0, tl.where(q1 == q2, 0.5, 0.0))
    d_min = tl.where(ok, -inv_m, 0.0)
    d_act1 = _critic_action_grad(
        x, act, d_min * share1, critic, o1_v1, o1_c1, o1_v2, o1_c2, o1_v3, o1_c3, D, A, H1, H2,
        DP, AP, H1P, H2P, OP, ACT, PRECISION,
    )  # fmt: skip
    d_act2 = _critic_action_grad(
        x, act, d_min * (1.0 - share1), critic, o2_v1, o2_c1, o2_v2, o2_c2, o2_v3, o2_c3,
        D, A, H1, H2, DP, AP, H1P, H2P, OP, ACT, PRECISION,
    )  # fmt: skip
    # back through the sample and the log-probability to the heads
    d_logp = tl.where(ok, alpha * inv_m, 0.0)
    d_u = d_logp[:, None] * 2.0 * act + (d_act1 + d_act2) * (1.0 - act * act)
    d_log_std = -d_logp[:, None] + d_u * std * eps
    d_raw = d_log_std * 0.5 * (log_std_hi - log_std_lo) * (1.0 - tanh_raw * tanh_raw)
    d_u = tl.where(ok[:, None] & a_ok, d_u, 0.0)
    d_raw = tl.where(ok[:, None] & a_ok, d_raw, 0.0)
    d_heads = tl.dot(d_u, tl.trans(pick_mean), input_precision="ieee") + tl.dot(
        d_raw, tl.trans(pick_raw), input_precision="ieee"
    )
    # the actor's backward (its weights read again)
    w2 = load_matrix(actor + off_w2, H1, H2, H1P, H2P)
    w_heads, _ = _load_heads(actor, off_wm, off_bm, off_wr, off_br, H2, A, H2P, OP)
    g_w1, g_b1, g_w2, g_b2, g_wh, g_bh = backprop(
        x,
        s1,
        s2,
        d_heads,
        w2,
        w_heads,
        tl.zeros([DP, H1P], tl.float32),
        tl.zeros([H1P], tl.float32),
        tl.zeros([H1P, H2P], tl.float32),
        tl.zeros([H2P], tl.float32),
        tl.zeros([H2P, OP], tl.float32),
        tl.zeros([OP], tl.float32),
        ACT,
        PRECISION,
    )
    i = b * S + s
    grads = grads_ptr + i.to(tl.int64) * P
    store_matrix(grads + off_w1, D, H1, g_w1, DP, H1P)
    store_vector(grads + off_b1, H1, g_b1, H1P)
    store_matrix(grads + off_w2, H1, H2, g_w2, H1P, H2P)
    store_vector(grads + off_b2, H2, g_b2, H2P)
    r = tl.arange(0, H2P)
    c = tl.arange(0, OP)
    rows_ok = r[:, None] < H2
    tl.store(grads + off_wm + r[:, None] * A + c[None, :], g_wh, mask=rows_ok & (c[None, :] < A))
    tl.store(
        grads + off_wr + r[:, None] * A + (c[None, :] - A),
        g_wh,
        mask=rows_ok & (c[None, :] >= A) & (c[None, :] < 2 * A),
    )
    tl.store(grads + off_bm + c, g_bh, mask=c < A)
    tl.store(grads + off_br + (c - A), g_bh, mask=(c >= A) & (c < 2 * A))
    sq_sum = (
        tl.sum(tl.sum(g_w1 * g_w1, axis=1), axis=0)
        + tl.sum(g_b1 * g_b1, axis=0)
        + tl.sum(tl.sum(g_w2 * g_w2, axis=1), axis=0)
        + tl.sum(g_b2 * g_b2, axis=0)
        + tl.sum(tl.sum(g_wh * g_wh, axis=1), axis=0)
        + tl.sum(g_bh * g_bh, axis=0)
    )
    loss = tl.where(ok, alpha * log_prob - tl.minimum(q1, q2), 0.0)
    tl.store(aux_ptr + i * 3 + 0, tl.sum(loss, axis=0))
    tl.store(aux_ptr + i * 3 + 1, tl.sum(tl.where(ok, log_prob, 0.0), axis=0))
    tl.store(aux_ptr + i * 3 + 2, sq_sum)


# ---------------------------------------------------------------- the layout


class SacActorLayout(NamedTuple):
    """Where the actor's eight arrays (w1, b1, w2, b2, then the mean head's Wm, bm and the raw
    log-std head's Wr, br; weights [in, out], row-major) lie in one flat vector of `size` floats:
    observation features D, hidden widths (H1, H2), A actions. Static: close over it."""

    offsets: tuple[int, ...]
    obs_dim: int
    hidden: tuple[int, int]
    actions: int
    size: int

    def shapes(self) -> list[tuple[int, ...]]:
        (h1, h2), d, a = self.hidden, self.obs_dim, self.actions
        return [(d, h1), (h1,), (h1, h2), (h2,), (h2, a), (a,), (h2, a), (a,)]


def sac_actor_layout(obs_dim: int, hidden: tuple[int, int], actions: int) -> SacActorLayout:
    """The layout of the eight arrays raveled one after another, in order."""
    layout = SacActorLayout((0,) * 8, int(obs_dim), tuple(int(h) for h in hidden), int(actions), 0)
    offsets = [0, *np.cumsum([math.prod(s) for s in layout.shapes()]).tolist()]
    return layout._replace(offsets=tuple(offsets[:8]), size=offsets[8])


def check_layout(layout: SacActorLayout) -> SacActorLayout:
    """`layout` after checking it (`_mlp_tiles.check_flat_layout`: eight arrays)."""
    return check_flat_layout(layout, SacActorLayout, 8, lambda l: [l.obs_dim, *l.hidden, l.actions])


def unflatten(params, layout: SacActorLayout):
    """The eight arrays cut out of params [..., size]."""
    lead = params.shape[:-1]
    return tuple(
        params[..., o : o + math.prod(shape)].reshape(lead + shape)
        for o, shape in zip(layout.offsets, layout.shapes())
    )


# ---------------------------------------------------------------- reference


def _activation(name):
    return {"tanh": jnp.tanh, "relu": jax.nn.relu, "silu": jax.nn.silu}[name]


def sac_actor_loss(
    actor_params,
    critic_params,
    obs,
    eps,
    alpha,
    actor_layout: SacActorLayout,
    critic_layout: TwinQLayout,
    *,
    log_std_bounds: tuple[float, float] = (-5.0, 2.0),
    activation: str = "relu",
    dot_precision: str = "tf32",
):
    """(L, H) of the module docstring, in plain JAX, on the flat vectors."""
    dot = functools.partial(reference_dot, dot_precision=dot_precision)
    f = _activation(activation)
    w1, b1, w2, b2, wm, bm, wr, br = unflatten(actor_params, actor_layout)
    h = f(dot(f(dot(obs, w1) + b1), w2) + b2)
    lo, hi = log_std_bounds
    mean, log_std = dot(h, wm) + bm, lo + 0.5 * (hi - lo) * (jnp.tanh(dot(h, wr) + br) + 1.0)
    u = mean + jnp.exp(log_std) * eps
    log_det = 2.0 * (math.log(2.0) - u - jax.nn.softplus(-2.0 * u))
    log_prob = jnp.sum(-0.5 * eps * eps - log_std - HALF_LOG_2PI - log_det, axis=-1)
    x = jnp.concatenate([obs, jnp.tanh(u)], axis=-1)
    q1, q2 = (
        (dot(f(dot(f(dot(x, v1) + c1), v2) + c2), v3) + c3)[..., 0]
        for v1, c1, v2, c2, v3, c3 in twin_q_grads.unflatten(critic_params, critic_layout)
    )
    return jnp.mean(alpha * log_prob - jnp.minimum(q1, q2)), -jnp.mean(log_prob)


def sac_actor_grads_reference(
    obs, eps, alpha, actor_params, critic_params, actor_layout, critic_layout, **options
):
    """(grads [actor size], ||grads||^2, {"loss", "entropy"}) by `jax.value_and_grad` of
    `sac_actor_loss` in the actor params."""
    (value, entropy), grads = jax.value_and_grad(sac_actor_loss, has_aux=True)(
        actor_params, critic_params, obs, eps, alpha, actor_layout, critic_layout, **options
    )
    return grads, jnp.sum(jnp.square(grads)), {"loss": value, "entropy": entropy}


# ---------------------------------------------------------------- launching


def _grads_core(
    obs, eps, alpha, actor_params, critic_params, *, lead, actor_layout, critic_layout, backend,
    log_std_bounds, activation, dot_precision,
):  # fmt: skip
    lead_shape = tuple(obs.shape[:lead])
    b = math.prod(lead_shape)
    m, d = obs.shape[lead], obs.shape[lead + 1]
    (h1, h2), a = actor_layout.hidden, actor_layout.actions
    size, critic_size = actor_layout.size, critic_layout.size
    block = q_grads._block_rows(b, m, MAX_BLOCK_M)
    chunks = cdiv(m, block)
    f32 = jnp.float32
    grads, aux = launch(
        _sac_actor_kernel,
        obs.reshape(b, m, d).astype(f32),
        eps.reshape(b, m, a).astype(f32),
        alpha.reshape(b).astype(f32),
        actor_params.reshape(b, size),
        critic_params.reshape(b, critic_size),
        m,
        np.float32(1.0 / m),
        chunks,
        size,
        critic_size,
        d,
        a,
        h1,
        h2,
        np.float32(log_std_bounds[0]),
        np.float32(log_std_bounds[1]),
        *actor_layout.offsets,
        *critic_layout.offsets,
        backend=backend,
        out_shape=[
            jax.ShapeDtypeStruct((b * chunks, size), f32),
            jax.ShapeDtypeStruct((b * chunks, 3), f32),
        ],
        grid=(b, chunks),
        num_warps=NUM_WARPS,
        DP=padded(d),
        AP=padded(a),
        H1P=padded(h1),
        H2P=padded(h2),
        OP=padded(2 * a),
        BLOCK=block,
        ACT=ACTIVATION_CODES[activation],
        PRECISION=dot_precision,
    )
    grads, sq_norm, sums = summed_partials(grads, aux, b, chunks)
    restore = lambda x: x.reshape(lead_shape + x.shape[1:])
    return restore(grads), restore(sq_norm), restore(sums[:, 0] / m), restore(-sums[:, 1] / m)


@functools.lru_cache(maxsize=None)
def _kernel_op(backend, actor_layout, critic_layout, log_std_bounds, activation, dot_precision):
    return fold_vmap(
        functools.partial(
            _grads_core,
            actor_layout=actor_layout,
            critic_layout=critic_layout,
            backend=backend,
            log_std_bounds=log_std_bounds,
            activation=activation,
            dot_precision=dot_precision,
        )
    )


# ---------------------------------------------------------------- checks and the op


def unfit_reason(actor_layout: SacActorLayout, critic_layout: TwinQLayout) -> str | None:
    """Why the kernel cannot run this actor with these critics (`shape_mismatch`, or sizes beyond
    `kernels.twin_q_grads.LIMITS`), or None."""
    return shape_mismatch(actor_layout, critic_layout) or twin_q_grads.unfit_reason(critic_layout)


def sac_actor_grads_flat(
    obs,
    eps,
    alpha,
    actor_params,
    critic_params,
    actor_layout: SacActorLayout,
    critic_layout: TwinQLayout,
    *,
    log_std_bounds: tuple[float, float] = (-5.0, 2.0),
    activation: str = "relu",
    dot_precision: str = "tf32",
    backend: str | None = None,
):
    """SAC's actor gradient of the module docstring.

    obs [M, D]; eps [M, A] standard normal draws; alpha a scalar (the temperature, held fixed);
    actor_params [actor_layout.size]; critic_params [critic_layout.size] (the twin critics).
    Returns (grads [actor_layout.size], ||grads||^2, {"loss": L, "entropy": H}). Batch the seeds
    with `jax.vmap`: every seed's minibatch then goes into one launch."""
    actor_layout = check_layout(actor_layout)
    critic_layout = twin_q_grads.check_layout(critic_layout)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    check_precision(dot_precision)
    lo, hi = (float(v) for v in log_std_bounds)
    if not lo < hi:
        raise ValueError(
            f"log_std_bounds must be (low, high) with low < high, got {log_std_bounds}"
        )
    obs, eps, alpha = jnp.asarray(obs), jnp.asarray(eps), jnp.asarray(alpha, jnp.float32)
    actor_params, critic_params = jnp.asarray(actor_params), jnp.asarray(critic_params)
    check_float_array("obs", obs)
    check_float_array("eps", eps)
    if obs.ndim != 2 or obs.shape[1] != actor_layout.obs_dim or obs.shape[0] < 1:
        raise ValueError(
            f"obs must be [rows >= 1, {actor_layout.obs_dim}] (actor_layout.obs_dim), "
            f"got {obs.shape}"
        )
    if eps.shape != (obs.shape[0], actor_layout.actions):
        raise ValueError(
            f"eps must be [{obs.shape[0]}, {actor_layout.actions}] (rows of obs, actions), "
            f"got {eps.shape}"
        )
    if alpha.shape != ():
        raise ValueError(f"alpha must be a scalar, got shape {alpha.shape}")
    for name, x, layout in (
        ("actor_params", actor_params, actor_layout),
        ("critic_params", critic_params, critic_layout),
    ):
        check_float_array(name, x)
        if x.shape != (layout.size,):
            raise ValueError(f"{name} must be [{layout.size}] (its layout's size), got {x.shape}")
    mismatch = shape_mismatch(actor_layout, critic_layout)
    if mismatch is not None:
        raise ValueError(mismatch)
    options = dict(log_std_bounds=(lo, hi), activation=activation, dot_precision=dot_precision)
    name = resolve_backend(backend)
    if name == "reference":
        return sac_actor_grads_reference(
            obs, eps, alpha, actor_params, critic_params, actor_layout, critic_layout, **options
        )
    reason = twin_q_grads.unfit_reason(critic_layout)
    if reason is not None:
        raise ValueError(reason + "; use the reference backend for these networks")
    grads, sq_norm, value, entropy = _kernel_op(name, actor_layout, critic_layout, **options)(
        obs, eps, alpha, actor_params, critic_params
    )
    return grads, sq_norm, {"loss": value, "entropy": entropy}
