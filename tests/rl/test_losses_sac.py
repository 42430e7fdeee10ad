"""SAC's pieces of rl.core.losses on hand-computed cases: the tanh log-det-Jacobian, the
squashed-Gaussian sample and log-density (against a direct change-of-variables computation), the
soft values, the twin-Q, actor and temperature losses (what each holds fixed, and the temperature
gradient's sign)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from run_helpers import XLA_DEFAULT_OPTIMIZATION

from rl.core import losses
from rl.nn import networks


def normal_log_pdf(x, mean, std):
    return -0.5 * ((x - mean) / std) ** 2 - np.log(std) - 0.5 * math.log(2 * math.pi)


# ---------------------------------------------------------------- tanh squashing


def test_tanh_log_det_jacobian_matches_float64_and_is_stable():
    u = np.linspace(-8.0, 8.0, 101)
    np.testing.assert_allclose(
        losses.tanh_log_det_jacobian(jnp.asarray(u, jnp.float32)),
        np.log(1.0 - np.tanh(u) ** 2),
        rtol=1e-5,
        atol=1e-5,
    )
    np.testing.assert_allclose(
        losses.tanh_log_det_jacobian(jnp.array([0.0, 0.5])),
        [0.0, -2 * math.log(math.cosh(0.5))],
        atol=1e-6,
    )
    big = losses.tanh_log_det_jacobian(jnp.array([-60.0, 60.0]))
    np.testing.assert_allclose(
        big, 2 * (math.log(2.0) - 60.0), rtol=1e-6
    )  # log(1 - tanh^2) in float32 would be log 0
    assert np.all(
        np.isfinite(
            jax.grad(lambda x: losses.tanh_log_det_jacobian(x).sum())(jnp.array([-60.0, 0.3, 60.0]))
        )
    )


def test_squashed_log_prob_is_the_change_of_variables_density():
    """p_A(a) = p_U(atanh a) / |d tanh(u)/du|, the derivative by central finite differences
    (float64)."""
    mean, log_std = 0.4, math.log(0.7)
    u = np.array([-2.5, -1.0, 0.0, 0.3, 1.7, 3.0])
    h = 1e-6
    jac = (np.tanh(u + h) - np.tanh(u - h)) / (2 * h)
    expected = normal_log_pdf(u, mean, 0.7) - np.log(jac)
    got = losses.squashed_gaussian_log_prob(
        jnp.full((6, 1), mean), jnp.full((6, 1), log_std), jnp.asarray(u, jnp.float32)[:, None]
    )
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_squashed_sample_is_tanh_of_the_reparameterised_gaussian():
    """a = tanh(mu + sigma eps) with eps the key's standard normals; log pi(a) is the direct
    change-of-variables density summed over the action dimensions; da/dmu = 1 - tanh(u)^2."""
    mean = jnp.array([[0.1, -0.2], [1.5, 0.0]])
    log_std = jnp.array([[0.0, -0.5], [-1.0, 0.3]])
    key = jax.random.PRNGKey(4)
    action, log_prob = losses.squashed_gaussian_sample(mean, log_std, key)
    eps = np.asarray(jax.random.normal(key, mean.shape), np.float64)
    std = np.exp(np.asarray(log_std, np.float64))
    u = np.asarray(mean, np.float64) + std * eps
    np.testing.assert_allclose(action, np.tanh(u), rtol=1e-6, atol=1e-6)
    direct = normal_log_pdf(u, np.asarray(mean, np.float64), std) - np.log(1.0 - np.tanh(u) ** 2)
    np.testing.assert_allclose(log_prob, direct.sum(axis=-1), rtol=1e-5, atol=1e-5)
    grad = jax.grad(lambda m: losses.squashed_gaussian_sample(m, log_std, key)[0].sum())(mean)
    np.testing.assert_allclose(grad, 1.0 - np.tanh(u) ** 2, rtol=1e-5, atol=1e-6)


def test_tanh_gaussian_squashed_sample_is_the_acting_sample_scored():
    """`networks.TanhGaussian.squashed_sample` (SAC's actor loss and critic target) gives the
    action SAC acts with from the same key, env_action(sample(key)), and the log-probability
    `log_prob_entropy` scores that pre-squash sample with."""
    dist = networks.TanhGaussian(
        jnp.array([[0.1, -0.2], [1.5, 0.0]]), jnp.array([[0.0, -0.5], [-1.0, 0.3]])
    )
    key = jax.random.PRNGKey(7)
    action, log_prob = dist.squashed_sample(key)
    u = dist.sample(key)
    np.testing.assert_array_equal(action, dist.env_action(u))
    np.testing.assert_allclose(log_prob, dist.log_prob_entropy(u)[0], rtol=1e-5, atol=1e-5)


def test_squashed_density_integrates_to_one_and_matches_monte_carlo():
    mean, log_std = -0.6, math.log(1.3)
    a = np.linspace(-1 + 1e-6, 1 - 1e-6, 200_001)  # quadrature in action space
    u = np.arctanh(a)
    density = np.exp(
        np.asarray(
            losses.squashed_gaussian_log_prob(
                jnp.full((a.size, 1), mean),
                jnp.full((a.size, 1), log_std),
                jnp.asarray(u, jnp.float32)[:, None],
            ),
            np.float64,
        )
    )
    assert abs(np.trapezoid(density, a) - 1.0) < 2e-3
    # the sample and the log-density of arctanh(action) compiled at XLA's defaults (tests/
    # conftest.py changes two CPU options elsewhere, under which it is 4e-3 off near |a| = 1)
    sample = jax.jit(losses.squashed_gaussian_sample, compiler_options=XLA_DEFAULT_OPTIMIZATION)
    actions, log_probs = sample(
        jnp.full((200_000, 1), mean), jnp.full((200_000, 1), log_std), jax.random.PRNGKey(0)
    )
    actions = np.asarray(actions)[:, 0]
    edges = np.linspace(-1, 1, 11)
    counts = np.histogram(actions, edges)[0] / actions.size
    for lo, hi, frac in zip(edges[:-1], edges[1:], counts):
        inside = (a >= lo) & (a <= hi)
        assert abs(np.trapezoid(density[inside], a[inside]) - frac) < 0.006, (lo, hi)
    u_s = np.arctanh(np.clip(actions.astype(np.float64), -1 + 1e-7, 1 - 1e-7))[:1000]
    log_prob = jax.jit(losses.squashed_gaussian_log_prob, compiler_options=XLA_DEFAULT_OPTIMIZATION)
    ref = log_prob(
        jnp.full((1000, 1), mean),
        jnp.full((1000, 1), log_std),
        jnp.asarray(u_s, jnp.float32)[:, None],
    )
    np.testing.assert_allclose(np.asarray(log_probs)[:1000], ref, rtol=1e-3, atol=2e-3)


def test_log_prob_sums_over_action_dimensions():
    mean, log_std, u = jnp.array([[0.1, -0.2]]), jnp.array([[0.0, -0.5]]), jnp.array([[0.5, 0.2]])
    joint = losses.squashed_gaussian_log_prob(mean, log_std, u)
    parts = sum(
        losses.squashed_gaussian_log_prob(
            mean[:, i : i + 1], log_std[:, i : i + 1], u[:, i : i + 1]
        )
        for i in range(2)
    )
    np.testing.assert_allclose(joint, parts, rtol=1e-6)


# ---------------------------------------------------------------- soft values and the critic target


def test_soft_value_is_the_min_q_minus_alpha_log_prob():
    v = losses.soft_value(jnp.array([1.0, 3.0]), jnp.array([2.0, 0.0]), jnp.array([-1.0, 0.5]), 0.2)
    np.testing.assert_allclose(v, [1.0 + 0.2, 0.0 - 0.1], rtol=1e-6)


def test_soft_value_discrete_is_the_expectation_over_actions():
    pi = np.array([[0.25, 0.75], [0.5, 0.5]])
    q1, q2 = np.array([[2.0, 3.0], [0.0, 1.0]]), np.array([[2.5, 2.0], [1.0, -1.0]])
    alpha = 0.5
    v = losses.soft_value_discrete(
        jnp.log(jnp.asarray(pi, jnp.float32)), jnp.asarray(q1), jnp.asarray(q2), alpha
    )
    # row 0: min Q = [2, 2]; row 1: min Q = [0, -1]
    expected = [
        0.25 * (2 - 0.5 * math.log(0.25)) + 0.75 * (2 - 0.5 * math.log(0.75)),
        0.5 * (0 - 0.5 * math.log(0.5)) + 0.5 * (-1 - 0.5 * math.log(0.5)),
    ]
    np.testing.assert_allclose(v, expected, rtol=1e-6)


def test_soft_critic_target_bootstraps_through_truncation_only():
    """y = r + gamma (1 - terminated) V(s'): a truncated transition (terminated False)
    bootstraps."""
    v = losses.soft_value(
        jnp.array([1.0, 1.0]), jnp.array([2.0, 2.0]), jnp.array([-1.0, -1.0]), 0.1
    )
    y = losses.q_learning_target(
        jnp.array([1.0, 2.0]), losses.episode_discount(0.9, jnp.array([False, True])), v
    )
    np.testing.assert_allclose(y, [1.0 + 0.9 * 1.1, 2.0], rtol=1e-6)


# ---------------------------------------------------------------- losses


def test_twin_q_loss_by_hand_with_the_target_held_fixed():
    q1, q2, y = jnp.array([1.0, 2.0]), jnp.array([0.0, 4.0]), jnp.array([1.5, 3.0])
    loss = losses.twin_q_loss(q1, q2, y)
    np.testing.assert_allclose(loss, 0.5 * ((0.25 + 1.0) / 2 + (2.25 + 1.0) / 2), rtol=1e-6)
    g1, g2, gy = jax.grad(losses.twin_q_loss, argnums=(0, 1, 2))(q1, q2, y)
    np.testing.assert_allclose(g1, (q1 - y) / 2, rtol=1e-6)  # d/dq1 of mean(d^2)/2 over 2 items
    np.testing.assert_allclose(g2, (q2 - y) / 2, rtol=1e-6)
    np.testing.assert_array_equal(gy, 0.0)


def test_sac_actor_loss_by_hand():
    log_prob, q1, q2 = jnp.array([-1.0, 0.5]), jnp.array([1.0, 3.0]), jnp.array([2.0, 0.0])
    loss = losses.sac_actor_loss(log_prob, q1, q2, 0.2)
    np.testing.assert_allclose(loss, ((0.2 * -1.0 - 1.0) + (0.2 * 0.5 - 0.0)) / 2, rtol=1e-6)
    g_lp, g1, g2 = jax.grad(losses.sac_actor_loss, argnums=(0, 1, 2))(log_prob, q1, q2, 0.2)
    np.testing.assert_allclose(g_lp, [0.1, 0.1], rtol=1e-6)
    np.testing.assert_allclose(g1, [-0.5, 0.0])  # the gradient reaches only the smaller Q
    np.testing.assert_allclose(g2, [0.0, -0.5])


def test_sac_actor_loss_discrete_by_hand_with_q_held_fixed():
    pi = np.array([0.25, 0.75])
    log_pi = jnp.log(jnp.asarray(pi, jnp.float32))[None]
    q1, q2 = jnp.array([[1.0, 2.0]]), jnp.array([[1.5, 1.0]])
    alpha = 0.5
    loss = losses.sac_actor_loss_discrete(log_pi, q1, q2, alpha)
    np.testing.assert_allclose(
        loss, np.sum(pi * (alpha * np.log(pi) - np.array([1.0, 1.0]))), rtol=1e-6
    )
    g1, g2 = jax.grad(losses.sac_actor_loss_discrete, argnums=(1, 2))(log_pi, q1, q2, alpha)
    np.testing.assert_array_equal(g1, 0.0)
    np.testing.assert_array_equal(g2, 0.0)
    # d/dlogits of sum pi (alpha log pi - q) through the softmax, against central differences
    logits = jnp.log(jnp.asarray(pi, jnp.float32))
    f = lambda z: float(losses.sac_actor_loss_discrete(jax.nn.log_softmax(z)[None], q1, q2, alpha))
    grad = jax.grad(
        lambda z: losses.sac_actor_loss_discrete(jax.nn.log_softmax(z)[None], q1, q2, alpha)
    )(logits)
    h = 1e-3
    numeric = [(f(logits.at[i].add(h)) - f(logits.at[i].add(-h))) / (2 * h) for i in range(2)]
    np.testing.assert_allclose(grad, numeric, rtol=1e-2, atol=1e-4)


@pytest.mark.parametrize("entropy, target, sign", [(2.0, -1.0, 1.0), (-3.0, -1.0, -1.0)])
def test_temperature_loss_value_and_gradient_sign(entropy, target, sign):
    """L = log_alpha (H - target): above the target entropy the gradient is positive (descent lowers
    alpha), below it negative (alpha grows); no gradient reaches the entropy."""
    log_alpha = jnp.float32(math.log(0.5))
    np.testing.assert_allclose(
        losses.temperature_loss(log_alpha, entropy, target),
        math.log(0.5) * (entropy - target),
        rtol=1e-6,
    )
    g_alpha, g_entropy = jax.grad(losses.temperature_loss, argnums=(0, 1))(
        log_alpha, jnp.float32(entropy), jnp.float32(target)
    )
    assert float(g_alpha) == pytest.approx(entropy - target) and np.sign(float(g_alpha)) == sign
    assert float(g_entropy) == 0.0
