"""rl.core.exploration: linear schedules and epsilon-greedy action choice, with first-index and with
uniformly random tie-breaking."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.core import exploration

# ---------------------------------------------------------------- linear schedules


@settings(max_examples=30, deadline=None)
@given(
    start=st.floats(0, 1),
    end=st.floats(0, 1),
    duration=st.integers(1, 10_000),
    step=st.integers(0, 30_000),
)
def test_linear_schedule(start, end, duration, step):
    value = float(
        exploration.linear_schedule(jnp.float32(start), jnp.float32(end), duration, jnp.int32(step))
    )
    expected = start + (end - start) * min(step / duration, 1.0)
    assert value == pytest.approx(expected, abs=1e-6)
    assert min(start, end) - 1e-6 <= value <= max(start, end) + 1e-6


def test_linear_schedule_hand_computed():
    values = [float(exploration.linear_schedule(1.0, 0.1, 100, s)) for s in (0, 50, 100, 1000)]
    np.testing.assert_allclose(values, [1.0, 0.55, 0.1, 0.1], rtol=1e-6)


# ---------------------------------------------------------------- epsilon-greedy, first-index ties


def test_epsilon_greedy_is_greedy_with_first_index_ties_at_epsilon_zero():
    q = jnp.array([[0.0, 2.0, 2.0], [5.0, -1.0, 5.0], [0.0, 0.0, 0.0]])
    actions = exploration.epsilon_greedy(jax.random.PRNGKey(0), q, 0.0)
    assert actions.dtype == jnp.int32 and actions.shape == (3,)
    np.testing.assert_array_equal(actions, [1, 0, 0])


def test_epsilon_greedy_explores_uniformly_with_probability_epsilon():
    q = jnp.tile(jnp.array([0.0, 2.0, 1.0, 0.5]), (20000, 1))
    actions = np.asarray(exploration.epsilon_greedy(jax.random.PRNGKey(2), q, 0.4))
    # greedy with prob 1 - eps + eps / 4, each other action eps / 4
    freq = np.bincount(actions, minlength=4) / actions.size
    np.testing.assert_allclose(freq, [0.1, 0.7, 0.1, 0.1], atol=0.015)
    # epsilon 1: uniform
    actions = np.asarray(exploration.epsilon_greedy(jax.random.PRNGKey(3), q, 1.0))
    freq = np.bincount(actions, minlength=4) / q.shape[0]
    np.testing.assert_allclose(freq, 0.25, atol=0.015)


# ---------------------------------------------------------------- epsilon-greedy, random ties


def _noise(key):
    explore_u, choice_u = jax.random.uniform(key, (2,))
    return explore_u, choice_u


def _draws(q, epsilon, seed, n):
    draw = jax.jit(
        jax.vmap(lambda key: exploration.epsilon_greedy_random_ties(q, epsilon, *_noise(key)))
    )
    return np.asarray(draw(jax.random.split(jax.random.PRNGKey(seed), n)))


def test_random_tie_breaking_from_a_zero_table_picks_every_action():
    counts = np.bincount(_draws(jnp.zeros(4), 0.0, 0, 400), minlength=4)
    assert (counts > 60).all(), counts  # ~100 each


def test_random_ties_are_broken_only_among_maximal_values():
    actions = _draws(jnp.array([1.0, 0.0, 1.0, -3.0]), 0.0, 1, 400)
    assert set(actions.tolist()) == {0, 2}


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.integers(-2, 2), min_size=4, max_size=4),
    epsilon=st.floats(0, 1),
    explore_u=st.floats(0, 0.999),
)
def test_random_ties_pick_each_candidate_for_an_equal_share_of_choice_u(values, epsilon, explore_u):
    """Over an even grid of choice_u, each candidate (every action when exploring, else each
    maximiser) is picked equally often, and nothing else is ever picked."""
    q = jnp.asarray(values, jnp.float32)
    # compared in float32, as the function does
    explore = np.float32(explore_u) < np.float32(epsilon)
    candidates = set(range(4)) if explore else {i for i, v in enumerate(values) if v == max(values)}
    grid = (jnp.arange(120) + 0.5) / 120  # 120 is divisible by 1, 2, 3 and 4 candidates
    pick = jax.jit(
        jax.vmap(
            lambda u: exploration.epsilon_greedy_random_ties(
                q, jnp.float32(epsilon), jnp.float32(explore_u), u
            )
        )
    )
    counts = np.bincount(np.asarray(pick(grid)), minlength=4)
    expected = [120 // len(candidates) if a in candidates else 0 for a in range(4)]
    np.testing.assert_array_equal(counts, expected)


def test_random_ties_explore_with_probability_epsilon():
    actions = _draws(jnp.array([0.0, 2.0, 1.0, 0.5]), 0.4, 2, 20000)
    freq = np.bincount(actions, minlength=4) / actions.size
    np.testing.assert_allclose(freq, [0.1, 0.7, 0.1, 0.1], atol=0.015)
