"""rl.core.rollout.greedy_episodes against a step-by-step loop over the same keys."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from rl.core.rollout import greedy_episodes


def lean_policy(obs):
    """Push the cart the way the pole leans (CartPole: action 1 pushes right)."""
    return (obs[..., 2] > 0).astype(jnp.int32)


def step_by_step(env, params, act, key, num_episodes):
    """The obvious loop with greedy_episodes' key schedule: each env's reward until its first
    episode end."""
    reset_key, key = jax.random.split(key)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(reset_key, num_episodes), params
    )
    step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)))
    returns, lengths = np.zeros(num_episodes), np.zeros(num_episodes)
    done = np.zeros(num_episodes, bool)
    for _ in range(params.max_steps_in_episode):
        if done.all():
            break
        key, step_key = jax.random.split(key)
        obs, state, reward, terminated, truncated, _ = step(
            jax.random.split(step_key, num_episodes), state, act(obs), params
        )
        returns += np.where(done, 0.0, np.asarray(reward))
        lengths += np.where(done, 0, 1)
        done |= np.asarray(terminated | truncated)
    return returns, lengths


@pytest.mark.parametrize("max_steps", [500, 12])
def test_matches_the_step_by_step_loop(max_steps):
    env, params = envs.make("CartPole-v1", max_steps_in_episode=max_steps)
    key = jax.random.PRNGKey(4)
    returns, lengths = jax.jit(lambda key: greedy_episodes(env, params, lean_policy, key, 5))(key)
    want_returns, want_lengths = step_by_step(env, params, lean_policy, key, 5)
    np.testing.assert_array_equal(np.asarray(lengths), want_lengths)
    np.testing.assert_allclose(np.asarray(returns), want_returns)
    assert returns.dtype == jnp.float32 and lengths.dtype == jnp.float32
    assert np.all(np.asarray(lengths) <= max_steps)
    if max_steps == 12:  # the lean policy outlasts 12 steps: every episode is cut by the time limit
        np.testing.assert_array_equal(np.asarray(lengths), 12)


def test_episodes_differ_per_env_and_run_under_vmap():
    env, params = envs.make("CartPole-v1")
    always_left = lambda obs: jnp.zeros(obs.shape[:-1], jnp.int32)
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    returns, lengths = jax.jit(
        jax.vmap(lambda key: greedy_episodes(env, params, always_left, key, 4))
    )(keys)
    assert returns.shape == (3, 4)
    np.testing.assert_array_equal(
        np.asarray(returns), np.asarray(lengths)
    )  # CartPole pays 1 per step
    assert (
        np.all(np.asarray(lengths) < 20) and len(np.unique(np.asarray(lengths))) > 1
    )  # falls fast, from different starts
