"""rl.core.losses, PPO's pieces, against hand computations: clipped surrogate, clipped value loss,
the whole objective and its statistics, truncation-aware GAE coefficients and advantages, the
diagonal Gaussian's log-probability and entropy, normalisation; and losses.ppo_loss against the
kernels' own plain-JAX objective and their fused gradient (kernels/ppo_grads.py)."""

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels
from kernels import ppo_grads
from rl.core import losses

# ---------------------------------------------------------------- surrogate and value losses


def test_clipped_surrogate_by_hand():
    ratio = jnp.array([0.5, 1.0, 1.5, 1.5, 0.7])
    adv = jnp.array([1.0, 2.0, 1.0, -1.0, -2.0])
    # min(r A, clip(r, .8, 1.2) A): .5 -> min(.5, .8)=.5; 2 -> 2; 1.5 -> min(1.5, 1.2)=1.2;
    # A=-1, r=1.5 -> min(-1.5, -1.2) = -1.5; A=-2, r=.7 -> min(-1.4, -1.6) = -1.6
    expected = -np.mean([0.5, 2.0, 1.2, -1.5, -1.6])
    np.testing.assert_allclose(losses.clipped_surrogate_loss(ratio, adv, 0.2), expected, rtol=1e-6)


def test_clipped_value_loss_by_hand():
    values = jnp.array([1.0, 3.0, 0.0])
    old = jnp.array([0.5, 2.0, 0.0])
    targets = jnp.array([2.0, 2.0, 1.0])
    # clipped values (eps .2): 0.7, 2.2, 0.0 -> squared errors clipped 1.69, .04, 1;
    # unclipped 1, 1, 1
    np.testing.assert_allclose(
        losses.clipped_value_loss(values, old, targets, 0.2, True),
        0.5 * np.mean([1.69, 1.0, 1.0]),
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        losses.clipped_value_loss(values, old, targets, 0.2, False),
        0.5 * np.mean([1.0, 1.0, 1.0]),
        rtol=1e-6,
    )


def test_ppo_loss_total_and_stats_by_hand():
    # two rows: ratios e^0.5 (clipped at 1.2 for eps .2) and e^-0.1 (inside)
    log_prob = jnp.array([0.0, -1.1])
    old_log_prob = jnp.array([-0.5, -1.0])
    entropy = jnp.array([0.6, 0.8])
    values = jnp.array([1.0, 0.0])
    old_values = jnp.array([1.0, 0.5])
    advantages = jnp.array([1.0, -2.0])
    targets = jnp.array([2.0, 0.0])
    total, stats = losses.ppo_loss(
        log_prob,
        entropy,
        values,
        old_log_prob,
        old_values,
        advantages,
        targets,
        0.2,
        0.2,
        0.01,
        0.5,
        True,
    )
    r0, r1 = math.exp(0.5), math.exp(-0.1)
    policy_loss = -np.mean([min(r0 * 1.0, 1.2 * 1.0), min(r1 * -2.0, r1 * -2.0)])
    # row 1: V=0, V_old=.5 -> clipped V = .3; max((0-0)^2, (.3-0)^2) = .09; row 0: max(1, 1) = 1
    value_loss = 0.5 * np.mean([1.0, 0.09])
    entropy_mean = 0.7
    np.testing.assert_allclose(stats["policy_loss"], policy_loss, rtol=1e-6)
    np.testing.assert_allclose(stats["value_loss"], value_loss, rtol=1e-6)
    np.testing.assert_allclose(stats["entropy"], entropy_mean, rtol=1e-6)
    np.testing.assert_allclose(stats["approx_kl"], np.mean([r0 - 1 - 0.5, r1 - 1 + 0.1]), rtol=1e-5)
    np.testing.assert_allclose(stats["clip_fraction"], 0.5)  # |e^.5 - 1| > .2, |e^-.1 - 1| < .2
    np.testing.assert_allclose(
        total, policy_loss + 0.5 * value_loss - 0.01 * entropy_mean, rtol=1e-6
    )


def test_normalize():
    x = jnp.array([1.0, 2.0, 3.0, 4.0])
    n = np.asarray(losses.normalize(x))
    np.testing.assert_allclose(n, (np.arange(1, 5) - 2.5) / np.std(np.arange(1, 5)), rtol=1e-5)


# ---------------------------------------------------------------- GAE with truncation

# one env, 5 steps: an episode truncated at t=1 (time limit), a new one terminated at t=3, then
# one step.
REWARDS = np.array([1.0, 2.0, 3.0, 4.0, 5.0], np.float32)
VALUES = np.array([10.0, 11.0, 12.0, 13.0, 14.0], np.float32)
NEXT_VALUES = np.array(
    [11.0, 20.0, 13.0, 99.0, 15.0], np.float32
)  # V(final_obs): 20 after truncation; 99 ignored (terminated)
TERMINATED = np.array([False, False, False, True, False])
TRUNCATED = np.array([False, True, False, False, False])


def test_gae_coefficients_hand_made_trajectory():
    discounts, lambdas = losses.gae_coefficients(
        jnp.asarray(TERMINATED), jnp.asarray(TRUNCATED), 0.9, 0.8
    )
    np.testing.assert_allclose(
        discounts, [0.9, 0.9, 0.9, 0.0, 0.9], rtol=1e-6
    )  # bootstraps through the time limit
    np.testing.assert_allclose(
        lambdas, [0.8, 0.0, 0.8, 0.0, 0.8], rtol=1e-6
    )  # chain cut at both episode ends


def test_gae_hand_made_trajectory_bootstraps_on_truncation_and_cuts_the_chain():
    column = lambda x: jnp.asarray(x)[:, None]
    adv, targets = losses.truncation_aware_gae(
        column(REWARDS),
        column(VALUES),
        column(NEXT_VALUES),
        column(TERMINATED),
        column(TRUNCATED),
        jnp.float32(0.9),
        jnp.float32(0.8),
        backend="reference",
    )
    # by hand, backwards:
    a4 = 5.0 + 0.9 * 15.0 - 14.0  # last step bootstraps from V(final_obs)
    a3 = 4.0 + 0.0 - 13.0  # terminated: no bootstrap, chain cut
    a2 = (3.0 + 0.9 * 13.0 - 12.0) + 0.9 * 0.8 * a3
    a1 = 2.0 + 0.9 * 20.0 - 11.0  # truncated: bootstrap from V(final_obs) = 20, chain cut
    a0 = (1.0 + 0.9 * 11.0 - 10.0) + 0.9 * 0.8 * a1
    expected = np.array([a0, a1, a2, a3, a4])
    np.testing.assert_allclose(np.asarray(adv)[:, 0], expected, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(targets)[:, 0], expected + VALUES, rtol=1e-6)


def test_gae_traced_gamma_and_lambda_under_vmap():
    rewards = jnp.ones((4, 3))
    values = jnp.zeros((4, 3))
    term = jnp.zeros((4, 3), bool)
    f = lambda g, l: losses.truncation_aware_gae(
        rewards, values, values, term, term, g, l, backend="reference"
    )[0]
    out = jax.jit(jax.vmap(f))(jnp.array([0.5, 0.9]), jnp.array([1.0, 0.0]))
    np.testing.assert_allclose(out[0, :, 0], [1.875, 1.75, 1.5, 1.0], rtol=1e-6)  # sum of 0.5^k
    np.testing.assert_allclose(out[1], 1.0, rtol=1e-6)  # lambda 0: one-step TD errors


# ---------------------------------------------------------------- Gaussian policy


def test_gaussian_log_prob_entropy_by_hand():
    mean = jnp.array([[0.0, 1.0]])
    log_std = jnp.array([[0.0, math.log(2.0)]])
    a = jnp.array([[1.0, 0.0]])
    lp, ent = losses.gaussian_log_prob_entropy(mean, log_std, a)
    normal_pdf = lambda x, m, s: math.exp(-0.5 * ((x - m) / s) ** 2) / (s * math.sqrt(2 * math.pi))
    np.testing.assert_allclose(
        lp[0], math.log(normal_pdf(1, 0, 1) * normal_pdf(0, 1, 2)), rtol=1e-6
    )
    np.testing.assert_allclose(
        ent[0], 0.5 * math.log(2 * math.pi * math.e) * 2 + math.log(2.0), rtol=1e-6
    )


# ---------------------------------------------------------------- the objective and its kernels


def ppo_rows(rng, m):
    """Random per-row inputs of the objective: log pi, H, V, log pi_old (ratios inside and outside
    the clip range), V_old, advantages, targets."""
    normal = lambda scale=1.0: jnp.asarray(rng.normal(size=m).astype(np.float32) * scale)
    log_prob = normal(0.5) - 1.0
    old_log_prob = log_prob + normal(0.3)
    return (log_prob, jnp.abs(normal()), normal(), old_log_prob, normal(), normal(), normal())


@settings(max_examples=20, deadline=None)
@given(
    m=st.integers(1, 50),
    coefficients=st.tuples(*(st.floats(0.0, 1.0, width=32) for _ in range(4))),
    clip_value_loss=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_ppo_loss_is_the_kernels_reference_objective(m, coefficients, clip_value_loss, seed):
    """losses.ppo_loss and kernels.ppo_grads.ppo_objective (the objective the fused kernels
    differentiate) agree in value, statistics and gradient with respect to log pi, H and V. (Both
    in one jitted program, the coefficients as float32 arguments: one compile per example instead
    of one per operation and shape, half the time.)"""
    rows = ppo_rows(np.random.default_rng(seed), m)
    coefficients = tuple(np.float32(c) for c in coefficients)
    (want, want_stats, want_grad), (got, got_stats, got_grad) = both_objectives(
        rows, coefficients, clip_value_loss
    )
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    for name in want_stats:
        np.testing.assert_allclose(got_stats[name], want_stats[name], rtol=1e-6, err_msg=name)
    for g, w in zip(got_grad, want_grad):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


@partial(jax.jit, static_argnums=2)
def both_objectives(rows, coefficients, clip_value_loss):
    """(value, statistics, gradient with respect to log pi, H and V) of
    kernels.ppo_grads.ppo_objective and of losses.ppo_loss."""
    args = (*coefficients, clip_value_loss)

    def value_stats_grad(f):
        value, stats = f(*rows, *args)
        grad = jax.grad(lambda *x: f(*x, *rows[3:], *args)[0], argnums=(0, 1, 2))(*rows[:3])
        return value, stats, grad

    return value_stats_grad(ppo_grads.ppo_objective), value_stats_grad(losses.ppo_loss)


def mlp(layers, x, activation):
    f = jnp.tanh if activation == "tanh" else jax.nn.relu
    w1, b1, w2, b2, w3, b3 = layers
    return f(f(x @ w1 + b1) @ w2 + b2) @ w3 + b3


def kernel_backends():
    return ["reference"] + [b for b in ("interpret",) if b in kernels.available_backends()]


@pytest.mark.parametrize("backend", kernel_backends())
@pytest.mark.parametrize("activation, clip_value_loss", [("tanh", True), ("relu", False)])
def test_fused_gradient_is_the_gradient_of_ppo_loss(backend, activation, clip_value_loss):
    """kernels.ppo_actor_critic_grads (the fused kernels through Triton's interpreter, and the
    kernels' reference) = jax.grad of losses.ppo_loss on a categorical actor-critic of two MLPs,
    log pi and H from the log-softmax of the actor's logits: the gradient of every weight array,
    and the statistics."""
    rng = np.random.default_rng(4)
    m, d, h1, h2, a = 37, 5, 16, 8, 3
    arr = lambda *shape, scale=0.5: jnp.asarray(rng.normal(size=shape).astype(np.float32) * scale)
    actor = (arr(d, h1), arr(h1), arr(h1, h2), arr(h2), arr(h2, a), arr(a))
    critic = (arr(d, h1), arr(h1), arr(h1, h2), arr(h2), arr(h2, 1), arr(1))
    obs, actions = arr(m, d, scale=1.0), jnp.asarray(rng.integers(0, a, m), jnp.int32)
    old_log_probs = jnp.full(m, -np.log(a), jnp.float32) + arr(m, scale=0.3)
    rows = (old_log_probs, arr(m), arr(m, scale=1.0), arr(m, scale=1.0))
    coefficients = (0.2, 0.15, 0.05, 0.5)

    def loss(actor, critic):
        log_p = jax.nn.log_softmax(mlp(actor, obs, activation))
        log_prob = jnp.take_along_axis(log_p, actions[:, None], axis=-1)[:, 0]
        entropy = -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)
        values = mlp(critic, obs, activation)[:, 0]
        return losses.ppo_loss(log_prob, entropy, values, *rows, *coefficients, clip_value_loss)

    with jax.default_matmul_precision("highest"):
        (_, want_stats), want = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
            actor, critic
        )
        *got, got_stats = kernels.ppo_actor_critic_grads(
            obs,
            actions,
            *rows,
            actor,
            critic,
            *coefficients,
            activation=activation,
            clip_value_loss=clip_value_loss,
            dot_precision="ieee",
            backend=backend,
        )
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        scale = float(jnp.max(jnp.abs(w))) + 1e-6
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-6 + 2e-4 * scale)
    for name in want_stats:
        np.testing.assert_allclose(got_stats[name], want_stats[name], rtol=2e-4, err_msg=name)
