"""Pendulum-v1 against gymnasium 1.x: one-step parity from identical states, time limit,
reset law."""

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs.pendulum import angle_normalize


def set_gym_state(gym_env, state):
    gym_env.state = np.array([state.theta, state.theta_dot], dtype=np.float64)


def to_gym_action(action):
    return np.asarray(action, np.float32)


@pytest.fixture(scope="module")
def env_params():
    return envs.make("Pendulum-v1")


def test_parity_with_gymnasium_over_random_steps(env_params, rollout, parity):
    env, params = env_params
    # actions beyond the torque bound exercise the clipping both envs apply
    trajectory = rollout(
        env,
        params,
        jax.random.key(0),
        3000,
        lambda k: jax.random.uniform(k, (1,), minval=-3.0, maxval=3.0),
    )
    parity(
        gymnasium.make("Pendulum-v1"),
        set_gym_state,
        trajectory,
        to_gym_action,
        obs_atol=2e-5,
        reward_atol=1e-4,
    )
    states = trajectory[0]
    assert np.abs(states.theta_dot).max() > 7.0  # the speed clip was reached
    assert (np.abs(trajectory[1]) > 2.0).mean() > 0.2  # many actions were clipped


def test_truncation_at_time_limit(env_params, time_limit):
    env, params = env_params
    time_limit(env, params, "Pendulum-v1", set_gym_state, jnp.zeros((1,)), to_gym_action)


def test_initial_state_distribution(env_params):
    env, params = env_params
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(jax.random.key(1), 20000), params
    )
    theta, theta_dot = np.asarray(state.theta), np.asarray(state.theta_dot)
    assert theta.min() >= -np.pi and theta.max() <= np.pi
    assert theta_dot.min() >= -1.0 and theta_dot.max() <= 1.0
    # uniform: the extremes are approached and the spread matches (b - a) / sqrt(12)
    assert theta.min() < -3.1 and theta.max() > 3.1 and abs(theta_dot).max() > 0.99
    np.testing.assert_allclose(
        [theta.std(), theta_dot.std()], [2 * np.pi / np.sqrt(12), 2 / np.sqrt(12)], rtol=0.03
    )
    np.testing.assert_allclose(
        obs, np.stack([np.cos(theta), np.sin(theta), theta_dot], -1), atol=1e-6
    )
    gym_env = gymnasium.make("Pendulum-v1")
    gym_states = []
    for seed in range(200):
        gym_env.reset(seed=seed)
        gym_states.append(gym_env.unwrapped.state)
    assert np.all(np.abs(gym_states) <= [np.pi, 1.0])  # gymnasium's law has the same bounds


def test_spaces_match_gymnasium(env_params):
    env, params = env_params
    gym_env = gymnasium.make("Pendulum-v1")
    assert env.observation_space(params).to_gymnasium() == gym_env.observation_space
    assert env.action_space(params).to_gymnasium() == gym_env.action_space


def test_angle_normalize():
    x = jnp.array([0.0, np.pi / 2, np.pi + 0.1, -np.pi - 0.1, 7.0])
    np.testing.assert_allclose(
        angle_normalize(x), [0.0, np.pi / 2, -np.pi + 0.1, np.pi - 0.1, 7.0 - 2 * np.pi], atol=1e-6
    )


def test_params_change_the_dynamics(env_params):
    env, params = env_params
    _, state = env.reset(jax.random.key(0), params)
    action = jnp.array([1.0])
    obs_default = env.step(jax.random.key(1), state, action, params)[0]
    obs_heavy = env.step(jax.random.key(1), state, action, env.make_params(g=20.0))[0]
    assert not np.allclose(obs_default, obs_heavy)
    assert env.action_space(env.make_params(max_torque=3.0)).to_gymnasium().high[0] == 3.0
