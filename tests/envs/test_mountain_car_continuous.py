"""MountainCarContinuous-v0 against gymnasium 1.x: one-step parity, time limit, reset law."""

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs.mountain_car_continuous import MountainCarContinuousState

GYM_ID = "MountainCarContinuous-v0"


def set_gym_state(gym_env, state):
    gym_env.state = np.array([state.position, state.velocity], dtype=np.float64)


def to_gym_action(action):
    return np.asarray(action, np.float32)


@pytest.fixture(scope="module")
def env_params():
    return envs.make(GYM_ID)


def random_action(key):
    # beyond [-1, 1] too: the dynamics clip it, the penalty uses it unclipped (both as gymnasium)
    return jax.random.uniform(key, (1,), minval=-2.0, maxval=2.0)


def test_parity_with_gymnasium_over_random_steps(env_params, rollout, parity):
    env, params = env_params
    trajectory = rollout(env, params, jax.random.key(0), 3000, random_action)
    parity(
        gymnasium.make(GYM_ID),
        set_gym_state,
        trajectory,
        to_gym_action,
        obs_atol=1e-6,
        reward_atol=1e-5,
    )
    assert trajectory[5].sum() >= 2  # crossed truncations and auto-resets


def test_parity_from_random_states_covers_goal_and_wall(env_params, from_states, parity):
    env, params = env_params
    n = 3000
    rng = np.random.default_rng(0)
    states = MountainCarContinuousState(
        position=jnp.asarray(rng.uniform(-1.2, 0.6, n), jnp.float32),
        velocity=jnp.asarray(rng.uniform(-0.07, 0.07, n), jnp.float32),
        time=jnp.zeros(n, jnp.int32),
    )
    actions = jnp.asarray(rng.uniform(-2.0, 2.0, (n, 1)), jnp.float32)
    batch = from_states(env, params, states, actions)
    num_terminated = parity(
        gymnasium.make(GYM_ID), set_gym_state, batch, to_gym_action, obs_atol=1e-6, reward_atol=1e-5
    )
    assert num_terminated > 50
    final_obs, rewards = batch[2], batch[3]
    assert (
        (final_obs[:, 0] == np.float32(-1.2)) & (final_obs[:, 1] == 0)
    ).sum() > 10  # hit the left wall
    assert rewards.max() > 99.0


def test_action_penalty_uses_the_unclipped_action(env_params):
    env, params = env_params
    _, state = env.reset(jax.random.key(0), params)
    obs3, _, reward3, *_ = env.step(jax.random.key(1), state, jnp.array([3.0]), params)
    obs1, _, reward1, *_ = env.step(jax.random.key(1), state, jnp.array([1.0]), params)
    np.testing.assert_array_equal(obs3, obs1)
    np.testing.assert_allclose([reward3, reward1], [-0.9, -0.1], rtol=1e-6)


def test_truncation_at_time_limit(env_params, time_limit):
    env, params = env_params
    time_limit(env, params, GYM_ID, set_gym_state, jnp.zeros((1,)), to_gym_action)


def test_initial_state_distribution(env_params):
    env, params = env_params
    _, state = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(jax.random.key(1), 20000), params
    )
    position = np.asarray(state.position)
    assert position.min() >= -0.6 and position.max() <= -0.4
    assert position.min() < -0.599 and position.max() > -0.401
    np.testing.assert_allclose(position.std(), 0.2 / np.sqrt(12), rtol=0.03)
    assert np.all(np.asarray(state.velocity) == 0)


def test_spaces_match_gymnasium(env_params):
    env, params = env_params
    gym_env = gymnasium.make(GYM_ID)
    assert env.observation_space(params).to_gymnasium() == gym_env.observation_space
    assert env.action_space(params).to_gymnasium() == gym_env.action_space
