"""MountainCar-v0 against gymnasium 1.x: one-step parity from identical states, time limit,
reset law."""

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs.mountain_car import MountainCarState


def set_gym_state(gym_env, state):
    gym_env.state = np.array([state.position, state.velocity], dtype=np.float64)


def to_gym_action(action):
    return int(action)


@pytest.fixture(scope="module")
def env_params():
    return envs.make("MountainCar-v0")


def random_action(key):
    return jax.random.randint(key, (), 0, 3)


def test_parity_with_gymnasium_over_random_steps(env_params, rollout, parity):
    env, params = env_params
    trajectory = rollout(env, params, jax.random.key(0), 3000, random_action)
    parity(
        gymnasium.make("MountainCar-v0"),
        set_gym_state,
        trajectory,
        to_gym_action,
        obs_atol=1e-6,
        reward_atol=0,
    )
    assert trajectory[5].sum() >= 10  # crossed several truncations and auto-resets


def test_parity_from_random_states_covers_goal_and_wall(env_params, from_states, parity):
    env, params = env_params
    n = 3000
    rng = np.random.default_rng(0)
    states = MountainCarState(
        position=jnp.asarray(rng.uniform(-1.2, 0.6, n), jnp.float32),
        velocity=jnp.asarray(rng.uniform(-0.07, 0.07, n), jnp.float32),
        time=jnp.zeros(n, jnp.int32),
    )
    actions = jnp.asarray(rng.integers(0, 3, n), jnp.int32)
    batch = from_states(env, params, states, actions)
    num_terminated = parity(
        gymnasium.make("MountainCar-v0"),
        set_gym_state,
        batch,
        to_gym_action,
        obs_atol=1e-6,
        reward_atol=0,
    )
    assert num_terminated > 50
    final_obs = batch[2]
    assert (
        (final_obs[:, 0] == np.float32(-1.2)) & (final_obs[:, 1] == 0)
    ).sum() > 10  # hit the left wall


def test_truncation_at_time_limit(env_params, time_limit):
    env, params = env_params
    time_limit(env, params, "MountainCar-v0", set_gym_state, jnp.int32(1), to_gym_action)


def test_initial_state_distribution(env_params):
    env, params = env_params
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(jax.random.key(1), 20000), params
    )
    position = np.asarray(state.position)
    assert position.min() >= -0.6 and position.max() <= -0.4
    assert position.min() < -0.599 and position.max() > -0.401
    np.testing.assert_allclose(position.std(), 0.2 / np.sqrt(12), rtol=0.03)
    assert np.all(np.asarray(state.velocity) == 0)
    np.testing.assert_array_equal(obs, np.stack([position, np.zeros_like(position)], -1))
    gym_env = gymnasium.make("MountainCar-v0")
    for seed in range(100):
        gym_obs, _ = gym_env.reset(seed=seed)
        assert -0.6 <= gym_obs[0] <= -0.4 and gym_obs[1] == 0


def test_spaces_match_gymnasium(env_params):
    env, params = env_params
    gym_env = gymnasium.make("MountainCar-v0")
    assert env.observation_space(params).to_gymnasium() == gym_env.observation_space
    assert env.action_space(params).to_gymnasium() == gym_env.action_space


def test_traced_out_of_range_actions_are_clipped(env_params):
    env, params = env_params
    _, state = env.reset(jax.random.key(0), params)
    step = jax.jit(env.step)
    obs_big = step(jax.random.key(1), state, jnp.int32(7), params)[0]
    obs_two = step(jax.random.key(1), state, jnp.int32(2), params)[0]
    np.testing.assert_array_equal(obs_big, obs_two)
