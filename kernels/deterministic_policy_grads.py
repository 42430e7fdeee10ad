"""Fused minibatch gradient of a deterministic policy through its critic (DDPG's and TD3's actor
step) on flat parameter vectors.

The actor is an MLP with two hidden layers (activation f = tanh, relu or silu) and a tanh output,
mu(s) = tanh(f(f(s W1 + b1) W2 + b2) W3 + b3) in [-1, 1]^A, its six arrays read from one flat vector
at the offsets a `kernels.q_grads.QLayout` gives (obs_dim D, the hidden widths, A outputs). The
critic is the first of the twin critics of a `kernels.twin_q_grads.TwinQLayout` (its six arrays
read from the critics' flat vector), Q1(s, a) = f(f([s, a] V1 + c1) V2 + c2) V3 + c3, with the
same activation. For a minibatch of M observations:

    L = -(1/M) sum_rows Q1(s, mu(s))

and this op returns dL/d(actor params) on the actor's flat vector (the critic is held fixed), its
squared norm and L. The backward: dL/dQ1 = -1/M per row, back through the critic to its action
input, da = (dQ1 / dz1) V1[D:, :]^T, then through the tanh, d(pre) = da (1 - mu^2), and the usual
backpropagation through the actor's three layers (`kernels._mlp_tiles.backprop`).

Why a kernel: the actor step on small MLPs is launch-bound on the GPU (the actor's forward, the
critic's forward and its backward to the action, the actor's backward: dozens of XLA kernels);
here one launch does it. A seed's minibatch is spread over several programs
(`kernels.q_grads._block_rows`' rule) whose partial gradients are summed afterwards; each program
holds one network's weights at a time (the actor's are read again for its backward).

Backends: "reference" is `jax.value_and_grad` of the same loss in plain JAX; "triton" and
"interpret" run the kernel. `dot_precision="tf32"` (the default: what XLA does for float32 matmuls
on the GPU), "ieee" (the reference then uses Precision.HIGHEST) or "bf16" (operands rounded to
bfloat16, products summed in float32: `_mlp_tiles.matmul`); the reference computes its matmuls the
same way (`_mlp_tiles.reference_dot`). The op is not itself differentiable (it is the gradient).
"""

from __future__ import annotations

import functools
import math

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
    check_precision,
    load_matrix,
    load_mlp,
    load_vector,
    matmul,
    output,
    padded,
    reference_mlp,
    saved,
    store_grads,
    summed_partials,
    torso,
)
from kernels._triton import tl, triton
from kernels.launch import cdiv, check_float_array, fold_vmap, launch, resolve_backend
from kernels.q_grads import QLayout
from kernels.twin_q_grads import TwinQLayout

__all__ = [
    "deterministic_policy_grads_flat",
    "deterministic_policy_grads_reference",
    "deterministic_policy_loss",
]

ACTIVATIONS = ("tanh", "relu", "silu")
NUM_WARPS = 8
# rows per program at most (`kernels.q_grads._block_rows`' rule otherwise): at rejax's Pendulum
# sizes (64 x 64, 64 seeds x 256 rows) 32 measured fastest on an H200 (benchmarks/RESULTS.md, "The
# fused SAC, TD3 and Q-learning kernels"), where 64 spills (sm_90 compiles); a module setting, so
# that benchmarks can sweep it
MAX_BLOCK_M = 32
OUT_PAD = 16  # the critic's one output column, padded to what tl.dot needs


# ---------------------------------------------------------------- the kernel


@triton.jit
def _policy_grads_kernel(
    obs_ptr,
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
    off_w1,
    off_b1,
    off_w2,
    off_b2,
    off_w3,
    off_b3,
    off_v1,
    off_c1,
    off_v2,
    off_c2,
    off_v3,
    off_c3,
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
    critic params: row b of [B, PC]); their partial gradient into row b S + s of grads [B S, P];
    the sums of -Q1(s, mu(s)) and of the squared partial gradient at aux[b S + s]."""
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
    actor = actor_ptr + b.to(tl.int64) * P
    critic = critic_ptr + b.to(tl.int64) * PC
    # the actor: mu(s) = tanh(out), zero in the padded action columns
    w1, b1, w2, b2, w3, b3 = load_mlp(
        actor, off_w1, off_b1, off_w2, off_b2, off_w3, off_b3, D, H1, H2, A, DP, H1P, H2P, AP
    )
    s1, s2 = torso(x, w1, b1, w2, b2, ACT, PRECISION)
    mu = activate(matmul(output(s2, ACT), w3, PRECISION) + b3[None, :], 0)  # tanh
    # the critic Q1 on [s, mu(s)]: its first layer's weight split into the rows read by s and by a
    v1_obs = load_matrix(critic + off_v1, D, H1, DP, H1P)
    v1_act = load_matrix(critic + off_v1 + D * H1, A, H1, AP, H1P)
    c1 = load_vector(critic + off_c1, H1, H1P)
    v2 = load_matrix(critic + off_v2, H1, H2, H1P, H2P)
    c2 = load_vector(critic + off_c2, H2, H2P)
    v3 = load_matrix(critic + off_v3, H2, 1, H2P, OP)
    c3 = load_vector(critic + off_c3, 1, OP)
    z1 = matmul(x, v1_obs, PRECISION) + matmul(mu, v1_act, PRECISION) + c1[None, :]
    q_s1 = saved(z1, ACT)
    q_s2 = saved(matmul(output(q_s1, ACT), v2, PRECISION) + c2[None, :], ACT)
    q = tl.sum(matmul(output(q_s2, ACT), v3, PRECISION) + c3[None, :], axis=1)
    # back through the critic to its action input: dL/dQ1 = -1/M on the block's real rows
    out_cols = tl.arange(0, OP)
    d_q = tl.where(ok, -inv_m, 0.0)
    d_out = tl.where(out_cols[None, :] == 0, d_q[:, None], 0.0)
    d_z2 = matmul(d_out, tl.trans(v3), PRECISION) * activation_grad(q_s2, ACT)
    d_z1 = matmul(d_z2, tl.trans(v2), PRECISION) * activation_grad(q_s1, ACT)
    d_mu = matmul(d_z1, tl.trans(v1_act), PRECISION)
    d_pre = d_mu * (1.0 - mu * mu)
    # the actor's backward (its weights read again: the critic's were on chip in between)
    w1, b1, w2, b2, w3, b3 = load_mlp(
        actor, off_w1, off_b1, off_w2, off_b2, off_w3, off_b3, D, H1, H2, A, DP, H1P, H2P, AP
    )
    g_w1, g_b1, g_w2, g_b2, g_w3, g_b3 = backprop(
        x,
        s1,
        s2,
        d_pre,
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
        grads_ptr + i.to(tl.int64) * P, off_w1, off_b1, off_w2, off_b2, off_w3, off_b3,
        D, H1, H2, A, g_w1, g_b1, g_w2, g_b2, g_w3, g_b3, DP, H1P, H2P, AP,
    )  # fmt: skip
    tl.store(aux_ptr + i * 2 + 0, tl.sum(tl.where(ok, -q, 0.0), axis=0))
    tl.store(aux_ptr + i * 2 + 1, sq_sum)


# ---------------------------------------------------------------- reference


def deterministic_policy_loss(
    actor_params,
    critic_params,
    obs,
    actor_layout: QLayout,
    critic_layout: TwinQLayout,
    *,
    activation: str = "relu",
    dot_precision: str = "tf32",
):
    """L = -mean Q1(s, mu(s)) of the module docstring, in plain JAX, on the flat vectors."""
    mu = jnp.tanh(
        reference_mlp(q_grads.unflatten(actor_params, actor_layout), obs, activation, dot_precision)
    )
    critic_1 = twin_q_grads.unflatten(critic_params, critic_layout)[0]
    x = jnp.concatenate([obs, mu], axis=-1)
    return -jnp.mean(reference_mlp(critic_1, x, activation, dot_precision)[..., 0])


def deterministic_policy_grads_reference(
    obs, actor_params, critic_params, actor_layout, critic_layout, **options
):
    """(grads [actor size], ||grads||^2, {"loss"}) by `jax.value_and_grad` of
    `deterministic_policy_loss` in the actor params."""
    value, grads = jax.value_and_grad(deterministic_policy_loss)(
        actor_params, critic_params, obs, actor_layout, critic_layout, **options
    )
    return grads, jnp.sum(jnp.square(grads)), {"loss": value}


# ---------------------------------------------------------------- launching


def _grads_core(
    obs, actor_params, critic_params, *, lead, actor_layout, critic_layout, backend, activation,
    dot_precision,
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
        _policy_grads_kernel,
        obs.reshape(b, m, d).astype(f32),
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
        *actor_layout.offsets,
        *critic_layout.offsets[:6],
        backend=backend,
        out_shape=[
            jax.ShapeDtypeStruct((b * chunks, size), f32),
            jax.ShapeDtypeStruct((b * chunks, 2), f32),
        ],
        grid=(b, chunks),
        num_warps=NUM_WARPS,
        DP=padded(d),
        AP=padded(a),
        H1P=padded(h1),
        H2P=padded(h2),
        OP=OUT_PAD,
        BLOCK=block,
        ACT=ACTIVATION_CODES[activation],
        PRECISION=dot_precision,
    )
    grads, sq_norm, sums = summed_partials(grads, aux, b, chunks)
    restore = lambda x: x.reshape(lead_shape + x.shape[1:])
    return restore(grads), restore(sq_norm), restore(sums[:, 0] / m)


@functools.lru_cache(maxsize=None)
def _kernel_op(backend, actor_layout, critic_layout, activation, dot_precision):
    return fold_vmap(
        functools.partial(
            _grads_core,
            actor_layout=actor_layout,
            critic_layout=critic_layout,
            backend=backend,
            activation=activation,
            dot_precision=dot_precision,
        )
    )


# ---------------------------------------------------------------- checks and the op


def shape_mismatch(actor_layout, critic_layout: TwinQLayout) -> str | None:
    """Why this actor (any layout with obs_dim, hidden and actions: a QLayout, a SacActorLayout)
    and these critics do not go together (observation size, hidden widths or action size differ),
    or None."""
    if (
        actor_layout.obs_dim != critic_layout.obs_dim
        or actor_layout.actions != critic_layout.action_dim
        or actor_layout.hidden != critic_layout.hidden
    ):
        return (
            f"the actor (obs_dim {actor_layout.obs_dim}, hidden {actor_layout.hidden}, "
            f"{actor_layout.actions} actions) and the critics (obs_dim {critic_layout.obs_dim}, "
            f"hidden {critic_layout.hidden}, action_dim {critic_layout.action_dim}) must have "
            "the same observation size, hidden widths and action size"
        )
    return None


def unfit_reason(actor_layout: QLayout, critic_layout: TwinQLayout) -> str | None:
    """Why the kernel cannot run this actor with these critics (`shape_mismatch`, or sizes beyond
    `kernels.twin_q_grads.LIMITS`), or None."""
    return shape_mismatch(actor_layout, critic_layout) or twin_q_grads.unfit_reason(critic_layout)


def deterministic_policy_grads_flat(
    obs,
    actor_params,
    critic_params,
    actor_layout: QLayout,
    critic_layout: TwinQLayout,
    *,
    activation: str = "relu",
    dot_precision: str = "tf32",
    backend: str | None = None,
):
    """The actor's minibatch gradient of the module docstring.

    obs [M, D]; actor_params [actor_layout.size] (a deterministic MLP policy with a tanh output);
    critic_params [critic_layout.size] (the twin critics; the first one is used). Returns
    (grads [actor_layout.size], ||grads||^2, {"loss": L}). Batch the seeds with `jax.vmap`: every
    seed's minibatch then goes into one launch."""
    actor_layout = q_grads.check_layout(actor_layout)
    critic_layout = twin_q_grads.check_layout(critic_layout)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    check_precision(dot_precision)
    obs = jnp.asarray(obs)
    actor_params, critic_params = jnp.asarray(actor_params), jnp.asarray(critic_params)
    check_float_array("obs", obs)
    if obs.ndim != 2 or obs.shape[1] != actor_layout.obs_dim or obs.shape[0] < 1:
        raise ValueError(
            f"obs must be [rows >= 1, {actor_layout.obs_dim}] (actor_layout.obs_dim), "
            f"got {obs.shape}"
        )
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
    options = dict(activation=activation, dot_precision=dot_precision)
    name = resolve_backend(backend)
    if name == "reference":
        return deterministic_policy_grads_reference(
            obs, actor_params, critic_params, actor_layout, critic_layout, **options
        )
    reason = twin_q_grads.unfit_reason(critic_layout)
    if reason is not None:
        raise ValueError(reason + "; use the reference backend for these networks")
    grads, sq_norm, value = _kernel_op(name, actor_layout, critic_layout, **options)(
        obs, actor_params, critic_params
    )
    return grads, sq_norm, {"loss": value}
