"""Fused acting of Rainbow's network: the MLP torso, the noisy dueling C51 head, each action's
expected return under its softmax over atoms, and the epsilon-greedy choice, in one launch for all
seeds and envs.

The network (the default of `rl.agents.rainbow`): a torso of two hidden layers (activation f = tanh,
relu or silu), h = f(f(s W1 + b1) W2 + b2), then two factorised-noisy linear streams (Fortunato et
al. 2018) over Z atoms, each with its noise vectors given (`rl.nn.layers.noisy_layer_noise`: the
f(e) = sign(e) sqrt(|e|) values):

    noisy(h) = h (W_mu + W_sigma * (e_in e_out^T)) + b_mu + b_sigma * e_out
    V        = noisy_value(h)                        [Z]
    A_a      = noisy_advantage(h)[a Z : (a + 1) Z]   [Z] for each action a (columns by action)
    logits_a = V + A_a - (1/|A|) sum_b A_b           (dueling, Wang et al. 2016)
    Q(s, a)  = sum_k softmax(logits_a)_k z_k         (z: the support)

and per row with two uniforms (u, v) in [0, 1)^2 and a probability epsilon,

    action = min(floor(|A| v), |A| - 1)   if u < epsilon   (a uniformly random action)
             argmax_a Q(s, a)              otherwise         (first index on ties; a NaN Q wins)

which is `rl.core.exploration.epsilon_greedy` given the same uniforms. The kernel forms each
stream's noisy weights on its tiles (no [in, out] noise matrix in memory) and the advantages' mean
from the mean of their weights, (1/|A|) sum_b A_b = h mean_b(W_b) + mean_b(b_b).

Why a kernel: XLA runs this forward as about a dozen kernels an env step (two torso matmuls, two
matmuls and a product a noisy stream, the dueling combination, the softmax, the expectation and the
argmax); Rainbow acts on every env step. Here one program per seed and block of `BLOCK_M` rows.

Backends: "reference" is the plain-JAX formula; "triton" and "interpret" run the kernel.
`dot_precision` "tf32" (default), "ieee" or "bf16" as in `kernels.q_grads`. Not differentiable (its
output is an integer action).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from kernels._mlp_tiles import (
    ACTIVATION_CODES,
    PRECISIONS,  # noqa: F401  (re-exported: the op's dot precisions)
    REFERENCE_ACTIVATIONS,
    check_precision,
    load_matrix,
    load_vector,
    matmul,
    output,
    padded,
    reference_dot,
    torso,
)
from kernels._triton import tl, triton
from kernels.launch import cdiv, check_float_array, fold_vmap, launch, resolve_backend
from kernels.q_grads import ACTIVATIONS

__all__ = [
    "NoisyLinear",
    "rainbow_epsilon_greedy",
    "rainbow_epsilon_greedy_reference",
    "rainbow_q_values",
    "unfit_reason",
    "LIMITS",
    "IEEE_SHARED_BYTES",
]

BLOCK_M = 16  # rows per program (tl.dot needs >= 16)
NUM_WARPS = 4
# largest sizes one program holds: observation features, hidden widths (padded), atoms (padded),
# actions (the kernel unrolls its two loops over the actions, and Triton's compile time grows with
# them: on one H200 a compile at 18 actions, 128 atoms and 128 x 128 ran past two minutes)
LIMITS = {"obs_dim": 64, "hidden": 128, "atoms": 128, "actions": 8}
# with dot_precision "ieee" Triton's float32 FMA dots stage the head's weight tile of every action,
# and one more, in shared memory: (actions + 1) * hidden * atoms * 4 bytes (padded sizes; sm_90
# compiles with Triton 3.6: 197,120 bytes at 2 actions, 128 atoms, 128 hidden, 590,336 at 8, while
# tf32 dots ask at most 102,912 within LIMITS); an H100 / H200 (sm_90) gives one program 232,448
# bytes. The limits are sm_90's: GPUs with less shared memory a program (an A100: about 163 KB) fit
# less
IEEE_SHARED_BYTES = 232_448 - 1024


class NoisyLinear(NamedTuple):
    """A factorised-noisy linear layer [in -> out] with its noise drawn: weights w_mu, w_sigma [in,
    out], biases b_mu, b_sigma [out], noise e_in [in], e_out [out] (the f(e) values)."""

    w_mu: jax.Array
    w_sigma: jax.Array
    b_mu: jax.Array
    b_sigma: jax.Array
    e_in: jax.Array
    e_out: jax.Array


# ---------------------------------------------------------------- the kernel


@triton.jit
def _noisy_tile(
    w_mu_ptr,
    w_sigma_ptr,
    b_mu_ptr,
    b_sigma_ptr,
    e_in,
    e_out_ptr,
    col0,
    H,
    Z,
    stride,
    HP: tl.constexpr,
    ZP: tl.constexpr,
):
    """(W [HP, ZP], b [ZP]): columns [col0, col0 + Z) of a noisy layer of `stride` columns with
    its noise, W = W_mu + W_sigma * (e_in e_out^T), b = b_mu + b_sigma * e_out; zero-padded."""
    r = tl.arange(0, HP)
    c = tl.arange(0, ZP)
    mask = (r[:, None] < H) & (c[None, :] < Z)
    at = r[:, None] * stride + col0 + c[None, :]
    e_out = tl.load(e_out_ptr + col0 + c, mask=c < Z, other=0.0)
    w = tl.load(w_mu_ptr + at, mask=mask, other=0.0) + tl.load(
        w_sigma_ptr + at, mask=mask, other=0.0
    ) * (e_in[:, None] * e_out[None, :])
    b = (
        tl.load(b_mu_ptr + col0 + c, mask=c < Z, other=0.0)
        + tl.load(b_sigma_ptr + col0 + c, mask=c < Z, other=0.0) * e_out
    )
    return w, b


@triton.jit
def _rainbow_act_kernel(
    obs_ptr,
    w1_ptr,
    b1_ptr,
    w2_ptr,
    b2_ptr,
    v_w_mu_ptr,
    v_w_sigma_ptr,
    v_b_mu_ptr,
    v_b_sigma_ptr,
    v_e_in_ptr,
    v_e_out_ptr,
    a_w_mu_ptr,
    a_w_sigma_ptr,
    a_b_mu_ptr,
    a_b_sigma_ptr,
    a_e_in_ptr,
    a_e_out_ptr,
    support_ptr,
    uniforms_ptr,
    epsilon_ptr,
    N,
    D,
    H1,
    H2,
    Z,
    action_ptr,
    DP: tl.constexpr,
    H1P: tl.constexpr,
    H2P: tl.constexpr,
    ZP: tl.constexpr,
    A: tl.constexpr,
    BLOCK: tl.constexpr,
    ACT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Program (b, s): rows [s BLOCK, (s + 1) BLOCK) of seed b (every array: row b of its seed
    axis); their actions into action [B, N]."""
    b = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    rows = s * BLOCK + tl.arange(0, BLOCK)
    ok = rows < N
    row = b * N + rows
    d_cols = tl.arange(0, DP)
    z_cols = tl.arange(0, ZP)
    x = tl.load(
        obs_ptr + row[:, None] * D + d_cols[None, :],
        mask=ok[:, None] & (d_cols[None, :] < D),
        other=0.0,
    )
    w1 = load_matrix(w1_ptr + b * D * H1, D, H1, DP, H1P)
    b1 = load_vector(b1_ptr + b * H1, H1, H1P)
    w2 = load_matrix(w2_ptr + b * H1 * H2, H1, H2, H1P, H2P)
    b2 = load_vector(b2_ptr + b * H2, H2, H2P)
    _, s2 = torso(x, w1, b1, w2, b2, ACT, PRECISION)
    h = output(s2, ACT)
    # the value stream
    v_e_in = load_vector(v_e_in_ptr + b * H2, H2, H2P)
    w, bias = _noisy_tile(
        v_w_mu_ptr + b * H2 * Z,
        v_w_sigma_ptr + b * H2 * Z,
        v_b_mu_ptr + b * Z,
        v_b_sigma_ptr + b * Z,
        v_e_in,
        v_e_out_ptr + b * Z,
        0,
        H2,
        Z,
        Z,
        H2P,
        ZP,
    )
    value = matmul(h, w, PRECISION) + bias[None, :]
    # the advantages' mean, from the mean of their weights
    a_e_in = load_vector(a_e_in_ptr + b * H2, H2, H2P)
    az = A * Z
    a_w_mu_ptr += b * H2 * az  # this seed's advantage stream
    a_w_sigma_ptr += b * H2 * az
    a_b_mu_ptr += b * az
    a_b_sigma_ptr += b * az
    a_e_out_ptr += b * az
    mean_w = tl.zeros((H2P, ZP), tl.float32)
    mean_b = tl.zeros((ZP,), tl.float32)
    for a in tl.static_range(A):
        w, bias = _noisy_tile(
            a_w_mu_ptr, a_w_sigma_ptr, a_b_mu_ptr, a_b_sigma_ptr, a_e_in, a_e_out_ptr, a * Z,
            H2, Z, az, H2P, ZP,
        )  # fmt: skip
        mean_w += w
        mean_b += bias
    base = value - (matmul(h, mean_w, PRECISION) + mean_b[None, :]) / A
    # each action's expected return, the running argmax
    support = tl.load(support_ptr + b * Z + z_cols, mask=z_cols < Z, other=0.0)
    best_q = tl.full((BLOCK,), -float("inf"), tl.float32)
    best_a = tl.zeros((BLOCK,), tl.int32)
    for a in tl.static_range(A):
        w, bias = _noisy_tile(
            a_w_mu_ptr, a_w_sigma_ptr, a_b_mu_ptr, a_b_sigma_ptr, a_e_in, a_e_out_ptr, a * Z,
            H2, Z, az, H2P, ZP,
        )  # fmt: skip
        logits = base + matmul(h, w, PRECISION) + bias[None, :]
        logits = tl.where(z_cols[None, :] < Z, logits, -float("inf"))
        shifted = logits - tl.max(logits, axis=1)[:, None]
        weights = tl.exp(shifted)
        q = tl.sum(weights * support[None, :], axis=1) / tl.sum(weights, axis=1)
        # jnp.argmax's order: the first maximum, a NaN above everything
        better = ((q > best_q) | (q != q)) & (best_q == best_q)
        best_q = tl.where(better, q, best_q)
        best_a = tl.where(better, a, best_a)
    u = tl.load(uniforms_ptr + row * 2, mask=ok, other=1.0)
    v = tl.load(uniforms_ptr + row * 2 + 1, mask=ok, other=0.0)
    random_action = tl.minimum(tl.floor(v * A).to(tl.int32), A - 1)
    epsilon = tl.load(epsilon_ptr + b)
    tl.store(action_ptr + row, tl.where(u < epsilon, random_action, best_a), mask=ok)


# ---------------------------------------------------------------- reference and launch


def _noisy(h, layer: NoisyLinear, dot_precision: str):
    w = layer.w_mu + layer.w_sigma * (layer.e_in[:, None] * layer.e_out[None, :])
    return reference_dot(h, w, dot_precision) + layer.b_mu + layer.b_sigma * layer.e_out


def rainbow_q_values(
    obs,
    torso,
    value: NoisyLinear,
    advantage: NoisyLinear,
    support,
    *,
    activation="relu",
    dot_precision="tf32",
):
    """Q(s, a) [N, A] of the module docstring, in plain JAX."""
    f = REFERENCE_ACTIVATIONS[activation]
    w1, b1, w2, b2 = torso
    dot = functools.partial(reference_dot, dot_precision=dot_precision)
    h = f(dot(f(dot(obs, w1) + b1), w2) + b2)
    z = support.shape[-1]
    v = _noisy(h, value, dot_precision)[:, None, :]
    adv = _noisy(h, advantage, dot_precision).reshape(h.shape[0], -1, z)
    logits = v + adv - adv.mean(axis=1, keepdims=True)
    return jnp.sum(jax.nn.softmax(logits, axis=-1) * support, axis=-1)


def rainbow_epsilon_greedy_reference(
    obs,
    torso,
    value,
    advantage,
    support,
    uniforms,
    epsilon,
    *,
    activation="relu",
    dot_precision="tf32",
):
    """The module docstring's actions [N] int32, in plain JAX."""
    q = rainbow_q_values(
        obs, torso, value, advantage, support, activation=activation, dot_precision=dot_precision
    )
    num_actions = q.shape[-1]
    random_action = jnp.minimum(
        jnp.floor(uniforms[..., 1] * num_actions).astype(jnp.int32), num_actions - 1
    )
    greedy = jnp.argmax(q, axis=-1).astype(jnp.int32)
    return jnp.where(uniforms[..., 0] < epsilon, random_action, greedy).astype(jnp.int32)


def _act_core(*arrays, lead, actions, activation, dot_precision, backend):
    obs = arrays[0]
    lead_shape = tuple(obs.shape[:lead])
    b = math.prod(lead_shape)
    n, d = obs.shape[lead], obs.shape[lead + 1]
    w1, w2, support = arrays[1], arrays[3], arrays[17]
    h1, h2, z = w1.shape[-1], w2.shape[-1], support.shape[-1]
    flat = [x.reshape((b,) + x.shape[lead:]).astype(jnp.float32) for x in arrays]
    out = launch(
        _rainbow_act_kernel,
        *flat,
        n,
        d,
        h1,
        h2,
        z,
        backend=backend,
        out_shape=jax.ShapeDtypeStruct((b, n), jnp.int32),
        grid=(b, cdiv(n, BLOCK_M)),
        num_warps=NUM_WARPS,
        DP=padded(d),
        H1P=padded(h1),
        H2P=padded(h2),
        ZP=padded(z),
        A=actions,
        BLOCK=BLOCK_M,
        ACT=ACTIVATION_CODES[activation],
        PRECISION=dot_precision,
    )
    return out.reshape(lead_shape + (n,))


@functools.lru_cache(maxsize=None)
def _kernel_op(backend, actions, activation, dot_precision):
    return fold_vmap(
        functools.partial(
            _act_core,
            actions=actions,
            activation=activation,
            dot_precision=dot_precision,
            backend=backend,
        )
    )


def unfit_reason(
    obs_dim: int, hidden: tuple, atoms: int, actions: int, dot_precision: str = "tf32"
) -> str | None:
    """Why the kernel cannot hold this network (sizes beyond `LIMITS`; with "ieee" products, a
    head beyond `IEEE_SHARED_BYTES` of shared memory), or None."""
    sizes = {
        "obs_dim": padded(obs_dim),
        "hidden": max(padded(h) for h in hidden),
        "atoms": padded(atoms),
        "actions": actions,
    }
    over = [f"{k} {v} > {LIMITS[k]}" for k, v in sizes.items() if v > LIMITS[k]]
    if over:
        return "kernels.rainbow_epsilon_greedy holds at most " + ", ".join(over) + " (padded)"
    shared = (actions + 1) * padded(hidden[-1]) * sizes["atoms"] * 4
    if dot_precision == "ieee" and shared > IEEE_SHARED_BYTES:
        return (
            f"kernels.rainbow_epsilon_greedy with dot_precision 'ieee' stages (actions + 1) x "
            f"last hidden width x atoms = {actions + 1} x {padded(hidden[-1])} x "
            f"{sizes['atoms']} float32 (padded) in shared memory, {shared} bytes > "
            f"{IEEE_SHARED_BYTES} (an sm_90 GPU's); use 'tf32' or fewer actions or atoms"
        )
    return None


def _check_shapes(obs, torso, value, advantage, support, uniforms, epsilon):
    """ValueError naming the first argument whose shape does not fit the others."""
    if obs.ndim != 2:
        raise ValueError(f"obs must be [rows, features], got shape {obs.shape}")
    n, d = obs.shape
    if len(torso) != 4:
        raise ValueError(f"torso must be (w1, b1, w2, b2), got {len(torso)} arrays")
    w1, b1, w2, b2 = torso
    h1 = w1.shape[-1] if w1.ndim == 2 else None
    h2 = w2.shape[-1] if w2.ndim == 2 else None
    z = support.shape[0] if support.ndim == 1 else None
    if z is None:
        raise ValueError(f"support must be [atoms], got shape {support.shape}")
    az = advantage.w_mu.shape[-1] if advantage.w_mu.ndim == 2 else 0
    if az == 0 or az % z:
        raise ValueError(
            f"advantage.w_mu must be [hidden, actions * atoms] with {z} atoms (the support's), "
            f"got shape {advantage.w_mu.shape}"
        )
    expected = {
        "torso w1": (w1, (d, h1)),
        "torso b1": (b1, (h1,)),
        "torso w2": (w2, (h1, h2)),
        "torso b2": (b2, (h2,)),
        "uniforms": (uniforms, (n, 2)),
        "epsilon": (epsilon, ()),
    }
    for stream, layer, out in (("value", value, z), ("advantage", advantage, az)):
        for field, shape in zip(
            NoisyLinear._fields, ((h2, out), (h2, out), (out,), (out,), (h2,), (out,))
        ):
            expected[f"{stream}.{field}"] = (getattr(layer, field), shape)
    for name, (array, shape) in expected.items():
        if array.shape != shape:
            raise ValueError(f"{name} must have shape {shape}, got {array.shape}")
    return az // z


def rainbow_epsilon_greedy(
    obs,
    torso,
    value: NoisyLinear,
    advantage: NoisyLinear,
    support,
    uniforms,
    epsilon,
    *,
    activation: str = "relu",
    dot_precision: str = "tf32",
    backend: str | None = None,
):
    """Epsilon-greedy actions of the module docstring.

    obs [N, D] float; torso (w1 [D, H1], b1 [H1], w2 [H1, H2], b2 [H2]); value a `NoisyLinear`
    [H2 -> Z], advantage one [H2 -> A Z] (action a's atoms in columns a Z ... a Z + Z - 1); support
    [Z]; uniforms [N, 2] in [0, 1) (u, v per row, e.g. `jax.random.uniform(key, (N, 2))`); epsilon
    a scalar (may be traced). Returns actions [N] int32. Batch the seeds with `jax.vmap`: every
    seed's rows then go into one launch."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    check_precision(dot_precision)
    obs = jnp.asarray(obs)
    torso = tuple(jnp.asarray(x) for x in torso)
    value = NoisyLinear(*(jnp.asarray(x) for x in value))
    advantage = NoisyLinear(*(jnp.asarray(x) for x in advantage))
    support, uniforms = jnp.asarray(support), jnp.asarray(uniforms)
    epsilon = jnp.asarray(epsilon, jnp.float32)
    arrays = {"obs": obs, "support": support, "uniforms": uniforms}
    arrays.update({f"torso[{i}]": x for i, x in enumerate(torso)})
    arrays.update({f"value.{k}": x for k, x in value._asdict().items()})
    arrays.update({f"advantage.{k}": x for k, x in advantage._asdict().items()})
    for name, x in arrays.items():
        check_float_array(name, x)
    actions = _check_shapes(obs, torso, value, advantage, support, uniforms, epsilon)
    options = dict(activation=activation, dot_precision=dot_precision)
    name = resolve_backend(backend)
    if name == "reference":
        return rainbow_epsilon_greedy_reference(
            obs, torso, value, advantage, support, uniforms, epsilon, **options
        )
    reason = unfit_reason(
        obs.shape[1],
        (torso[0].shape[1], torso[2].shape[1]),
        support.shape[0],
        actions,
        dot_precision,
    )
    if reason is not None:
        raise ValueError(reason + "; use the reference backend for this network")
    return _kernel_op(name, actions, activation, dot_precision)(
        obs, *torso, *value, *advantage, support, uniforms, epsilon
    )
