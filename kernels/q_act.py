"""Fused epsilon-greedy acting of an MLP Q-network: the network's forward pass and the action choice
in one launch for all seeds and envs.

The Q-network is the one `kernels.q_grads` differentiates (two hidden layers, tanh, relu or silu,
one output per action, its six arrays in a flat vector at the offsets of a `QLayout`). Per row of
observations s with two uniforms (u, v) in [0, 1)^2 and a probability epsilon:

    Q(s)   = f(f(s W1 + b1) W2 + b2) W3 + b3
    action = min(floor(A v), A - 1)   if u < epsilon   (a uniformly random action)
             argmax_a Q(s, a)          otherwise         (first index on ties)

which is `rl.core.exploration.epsilon_greedy` given the same uniforms, so an agent acting through
this op draws the same random stream as one acting through XLA. Epsilon 0 is the greedy policy.

Why a kernel: acting is three small matmuls, the argmax and the select, ~6 XLA kernels of ~1.3 us
each at DQN's sizes on the GPU, on every env step; here one launch, one program per seed and block
of `BLOCK_M` rows holding the weights on chip.

Backends: "reference" is the plain-JAX forward and select; "triton" and "interpret" run the kernel.
`dot_precision` as in `kernels.q_grads` ("tf32" default, "ieee" or "bf16"). Not differentiable (its
output is an integer action).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from kernels._mlp_tiles import (
    ACTIVATION_CODES,
    check_precision,
    load_mlp,
    matmul,
    output,
    padded,
    reference_mlp,
    torso,
)
from kernels._triton import tl, triton
from kernels.launch import cdiv, check_float_array, fold_vmap, launch, resolve_backend
from kernels.q_grads import (
    ACTIVATIONS,
    PRECISIONS,  # noqa: F401  (re-exported: the op's dot precisions)
    QLayout,
    check_layout,
    unfit_reason,
    unflatten,
)

__all__ = ["q_epsilon_greedy", "q_epsilon_greedy_reference"]

BLOCK_M = 16  # rows per program (tl.dot needs >= 16)
NUM_WARPS = 4


@triton.jit
def _q_act_kernel(
    obs_ptr,
    params_ptr,
    uniforms_ptr,
    epsilon_ptr,
    N,
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
    action_ptr,
    DP: tl.constexpr,
    H1P: tl.constexpr,
    H2P: tl.constexpr,
    AP: tl.constexpr,
    BLOCK: tl.constexpr,
    ACT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Program (b, s): rows [s BLOCK, (s + 1) BLOCK) of seed b (params: row b of [B, P]; uniforms
    [B, N, 2]; epsilon [B]); their actions into action [B, N]."""
    b = tl.program_id(0)
    s = tl.program_id(1)
    rows = s * BLOCK + tl.arange(0, BLOCK)
    ok = rows < N
    row = b.to(tl.int64) * N + rows
    d_cols = tl.arange(0, DP)
    a_cols = tl.arange(0, AP)
    x = tl.load(
        obs_ptr + row[:, None] * D + d_cols[None, :],
        mask=ok[:, None] & (d_cols[None, :] < D),
        other=0.0,
    )
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
    _, h2 = torso(x, w1, b1, w2, b2, ACT, PRECISION)
    q = matmul(output(h2, ACT), w3, PRECISION) + b3[None, :]
    greedy = tl.argmax(tl.where(a_cols[None, :] < A, q, -float("inf")), axis=1)
    u = tl.load(uniforms_ptr + row * 2, mask=ok, other=1.0)
    v = tl.load(uniforms_ptr + row * 2 + 1, mask=ok, other=0.0)
    random_action = tl.minimum(tl.floor(v * A).to(tl.int32), A - 1)
    epsilon = tl.load(epsilon_ptr + b)
    tl.store(action_ptr + row, tl.where(u < epsilon, random_action, greedy.to(tl.int32)), mask=ok)


def q_epsilon_greedy_reference(
    obs, params, uniforms, epsilon, layout: QLayout, *, activation="relu", dot_precision="tf32"
):
    """The module docstring's actions [N] int32, in plain JAX."""
    q = reference_mlp(unflatten(params, layout), obs, activation, dot_precision)
    random_action = jnp.minimum(
        jnp.floor(uniforms[..., 1] * layout.actions).astype(jnp.int32), layout.actions - 1
    )
    greedy = jnp.argmax(q, axis=-1).astype(jnp.int32)
    return jnp.where(uniforms[..., 0] < epsilon, random_action, greedy).astype(jnp.int32)


def _act_core(obs, params, uniforms, epsilon, *, lead, layout, backend, activation, dot_precision):
    lead_shape = tuple(obs.shape[:lead])
    b = math.prod(lead_shape)
    n, d = obs.shape[lead], obs.shape[lead + 1]
    (h1, h2), a, size = layout.hidden, layout.actions, layout.size
    actions = launch(
        _q_act_kernel,
        obs.reshape(b, n, d).astype(jnp.float32),
        params.reshape(b, size),
        uniforms.reshape(b, n, 2).astype(jnp.float32),
        epsilon.reshape(b).astype(jnp.float32),
        n,
        size,
        d,
        h1,
        h2,
        a,
        *layout.offsets,
        backend=backend,
        out_shape=jax.ShapeDtypeStruct((b, n), jnp.int32),
        grid=(b, cdiv(n, BLOCK_M)),
        num_warps=NUM_WARPS,
        DP=padded(d),
        H1P=padded(h1),
        H2P=padded(h2),
        AP=padded(a),
        BLOCK=BLOCK_M,
        ACT=ACTIVATION_CODES[activation],
        PRECISION=dot_precision,
    )
    return actions.reshape(lead_shape + (n,))


@functools.lru_cache(maxsize=None)
def _kernel_op(backend, layout, activation, dot_precision):
    return fold_vmap(
        functools.partial(
            _act_core,
            layout=layout,
            backend=backend,
            activation=activation,
            dot_precision=dot_precision,
        )
    )


def q_epsilon_greedy(
    obs,
    params,
    uniforms,
    epsilon,
    layout: QLayout,
    *,
    activation: str = "relu",
    dot_precision: str = "tf32",
    backend: str | None = None,
):
    """Epsilon-greedy actions of the module docstring.

    obs [N, D] float; params [size] laid out as `layout` says; uniforms [N, 2] in [0, 1) (u, v per
    row, e.g. `jax.random.uniform(key, (N, 2))`); epsilon a scalar (may be traced). Returns actions
    [N] int32. Batch the seeds with `jax.vmap`: every seed's rows then go into one launch."""
    layout = check_layout(layout)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    check_precision(dot_precision)
    obs, params = jnp.asarray(obs), jnp.asarray(params)
    uniforms, epsilon = jnp.asarray(uniforms), jnp.asarray(epsilon, jnp.float32)
    check_float_array("obs", obs)
    check_float_array("params", params)
    if obs.ndim != 2 or obs.shape[1] != layout.obs_dim:
        raise ValueError(f"obs must be [rows, {layout.obs_dim}] (layout.obs_dim), got {obs.shape}")
    if params.shape != (layout.size,):
        raise ValueError(f"params must be [{layout.size}] (layout.size), got {params.shape}")
    if uniforms.shape != (obs.shape[0], 2):
        raise ValueError(f"uniforms must be [{obs.shape[0]}, 2], got {uniforms.shape}")
    if epsilon.shape != ():
        raise ValueError(f"epsilon must be a scalar, got shape {epsilon.shape}")
    options = dict(activation=activation, dot_precision=dot_precision)
    name = resolve_backend(backend)
    if name == "reference":
        return q_epsilon_greedy_reference(obs, params, uniforms, epsilon, layout, **options)
    reason = unfit_reason(layout)
    if reason is not None:
        raise ValueError(reason + "; use the reference backend for this network")
    return _kernel_op(name, layout, **options)(obs, params, uniforms, epsilon)
