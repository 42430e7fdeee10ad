"""rl.core.losses, value-based pieces, against hand computations: discounts, bootstrap selection
(DQN and double-Q), the TD target and losses, C51's Q-values, projection target and
cross-entropy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.core import losses


def test_episode_discount_zero_only_on_termination():
    np.testing.assert_allclose(losses.episode_discount(0.9, jnp.array([False, True])), [0.9, 0.0])
    steps = jnp.array([1, 3, 3])
    np.testing.assert_allclose(
        losses.n_step_discount(0.5, steps, jnp.array([False, False, True])), [0.5, 0.125, 0.0]
    )


def test_bootstrap_value_dqn_selects_with_target_double_q_with_online():
    q_target = jnp.array([[3.0, 2.0], [0.0, 5.0]])
    q_online = jnp.array([[1.0, 2.0], [4.0, 1.0]])
    np.testing.assert_allclose(
        losses.bootstrap_value(q_target, q_target), [3.0, 5.0]
    )  # max of the target
    np.testing.assert_allclose(
        losses.bootstrap_value(q_target, q_online), [2.0, 0.0]
    )  # target at online's argmax


def test_q_learning_target_is_fixed_and_adds_the_discounted_value():
    y = losses.q_learning_target(
        jnp.array([1.0, 1.0]), jnp.array([0.9, 0.0]), jnp.array([3.0, 3.0])
    )
    np.testing.assert_allclose(y, [1.0 + 0.9 * 3.0, 1.0])
    grad = jax.grad(lambda v: losses.q_learning_target(1.0, 0.9, v))(2.0)
    assert float(grad) == 0.0


@given(st.floats(-5, 5, allow_nan=False))
@settings(max_examples=50, deadline=None)
def test_td_loss_huber_and_mse(d):
    huber = 0.5 * d * d if abs(d) <= 1 else abs(d) - 0.5
    np.testing.assert_allclose(losses.td_loss(jnp.float32(d), "huber"), huber, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(losses.td_loss(jnp.float32(d), "mse"), d * d, rtol=1e-5, atol=1e-6)


def test_td_loss_rejects_an_unknown_kind():
    with pytest.raises(ValueError, match="kind must be 'huber' or 'mse'"):
        losses.td_loss(jnp.zeros(2), "l1")


def test_categorical_q_values_are_the_mean_over_the_support():
    probs = np.array([[0.2, 0.5, 0.3], [1.0, 0.0, 0.0]])
    logits = jnp.log(jnp.asarray(probs) + 1e-12)
    np.testing.assert_allclose(
        losses.categorical_q_values(logits, jnp.array([0.0, 1.0, 2.0])), [1.1, 0.0], atol=1e-5
    )


def test_categorical_cross_entropy_and_kl_by_hand():
    p = np.array([0.2, 0.5, 0.3])
    m = np.array([0.5, 0.5, 0.0])
    ce, kl = losses.categorical_cross_entropy(jnp.log(jnp.asarray(p)), jnp.asarray(m))
    want_ce = -(0.5 * np.log(0.2) + 0.5 * np.log(0.5))
    np.testing.assert_allclose(ce, want_ce, rtol=1e-5)
    np.testing.assert_allclose(kl, want_ce + 2 * 0.5 * np.log(0.5), rtol=1e-5)
    _, kl_self = losses.categorical_cross_entropy(jnp.log(jnp.asarray(p)), jnp.asarray(p))
    np.testing.assert_allclose(kl_self, 0.0, atol=1e-6)


# 12 examples: each shape compiles the ops and both gradients anew
@settings(max_examples=12, deadline=None)
@given(st.integers(1, 6), st.integers(1, 9), st.integers(0, 2**31 - 1))
def test_action_value_equals_indexing_and_so_does_its_gradient(num_actions, batch, seed):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(batch, num_actions)), jnp.float32)
    action = jnp.asarray(rng.integers(0, num_actions, batch), jnp.int32)
    indexed = lambda q: jnp.take_along_axis(q, action[:, None], axis=-1)[:, 0]
    np.testing.assert_array_equal(losses.action_value(q, action), indexed(q))
    weights = jnp.asarray(rng.normal(size=batch), jnp.float32)
    grad = lambda f: jax.grad(lambda q: jnp.sum(weights * f(q)))(q)
    np.testing.assert_array_equal(grad(lambda q: losses.action_value(q, action)), grad(indexed))


def test_action_value_ignores_the_infinite_values_of_other_actions():
    q = jnp.array([[jnp.inf, 2.0, -jnp.inf]])
    np.testing.assert_array_equal(losses.action_value(q, jnp.array([1])), [2.0])
