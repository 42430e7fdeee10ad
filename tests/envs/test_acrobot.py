"""Acrobot-v1 against gymnasium 1.x: one-step parity (RK4, book equations), time limit,
reset law."""

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs.acrobot import AcrobotState, wrap

GYM_ID = "Acrobot-v1"


def set_gym_state(gym_env, state):
    gym_env.state = np.array(
        [state.theta1, state.theta2, state.dtheta1, state.dtheta2], dtype=np.float64
    )


def to_gym_action(action):
    return int(action)


@pytest.fixture(scope="module")
def env_params():
    return envs.make(GYM_ID)


def random_action(key):
    return jax.random.randint(key, (), 0, 3)


def test_parity_with_gymnasium_over_random_steps(env_params, rollout, parity):
    env, params = env_params
    trajectory = rollout(env, params, jax.random.key(0), 3000, random_action)
    parity(
        gymnasium.make(GYM_ID),
        set_gym_state,
        trajectory,
        to_gym_action,
        obs_atol=1e-4,
        reward_atol=0,
        obs_rtol=1e-4,
    )
    states = trajectory[0]
    assert states.theta1.dtype == np.float32 and states.time.dtype == np.int32


def test_parity_from_random_states_covers_wrap_clip_and_goal(env_params, from_states, parity):
    """Random states over the whole observation box, stepped in float64:
    the equations match exactly.

    (In float32 a single RK4 step from the fastest states differs from gymnasium's float64 one by up
    to ~1e-3 in dtheta1, round-off amplified by the dtheta2^2 ~ 800 terms; in float64 it agrees to
    the float32 cast of the observation.)
    """
    env, params = env_params
    n = 3000
    rng = np.random.default_rng(0)
    high = np.array([np.pi, np.pi, 4 * np.pi, 9 * np.pi])
    y = rng.uniform(-high, high, (n, 4))
    actions = rng.integers(0, 3, n)
    with jax.enable_x64(True):
        states = AcrobotState(
            *(jnp.asarray(y[:, i], jnp.float64) for i in range(4)), time=jnp.zeros(n, jnp.int32)
        )
        batch = from_states(env, params, states, jnp.asarray(actions, jnp.int32))
    num_terminated = parity(
        gymnasium.make(GYM_ID), set_gym_state, batch, to_gym_action, obs_atol=1e-6, reward_atol=0
    )
    assert num_terminated > 100
    final_obs = batch[2]
    assert (
        np.abs(final_obs[:, 5]) == np.float32(9 * np.pi)
    ).sum() > 10  # the velocity bound was hit
    # the angles left [-pi, pi] during the step and were wrapped back (big velocities)
    assert (np.abs(y[:, 0] + 0.2 * y[:, 2]) > np.pi).sum() > 100


def test_nips_variant_matches_gymnasium(from_states, parity):
    env, params = envs.make(GYM_ID, book_or_nips="nips")
    n = 500
    rng = np.random.default_rng(1)
    high = np.array([np.pi, np.pi, 4 * np.pi, 9 * np.pi])
    y = rng.uniform(-high, high, (n, 4))
    actions = rng.integers(0, 3, n)
    with jax.enable_x64(True):
        states = AcrobotState(
            *(jnp.asarray(y[:, i], jnp.float64) for i in range(4)), time=jnp.zeros(n, jnp.int32)
        )
        batch = from_states(env, params, states, jnp.asarray(actions, jnp.int32))
    gym_env = gymnasium.make(GYM_ID)
    gym_env.unwrapped.book_or_nips = "nips"
    parity(gym_env, set_gym_state, batch, to_gym_action, obs_atol=1e-6, reward_atol=0)
    _, state = env.reset(jax.random.key(0), params)
    with pytest.raises(ValueError, match="book_or_nips"):
        jax.jit(env.step)(
            jax.random.key(0), state, jnp.int32(0), params.replace(book_or_nips="bad")
        )


def test_wrap_matches_gymnasium_loop():
    from gymnasium.envs.classic_control.acrobot import wrap as gym_wrap

    xs = np.array(
        [-10.0, -4.0, -3.14, -1.0, 0.0, 2.0, 3.1, 3.2, 7.0, 12.0, -20.0, 30.0], np.float32
    )
    expected = [gym_wrap(float(x), -np.pi, np.pi) for x in xs]
    np.testing.assert_allclose(wrap(jnp.asarray(xs), -jnp.pi, jnp.pi), expected, atol=2e-6)


def test_truncation_at_time_limit(env_params, time_limit):
    env, params = env_params
    # no torque from near rest: the acrobot swings gently and never terminates
    time_limit(env, params, GYM_ID, set_gym_state, jnp.int32(1), to_gym_action)


def test_initial_state_distribution(env_params):
    env, params = env_params
    _, state = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(jax.random.key(1), 20000), params
    )
    y = np.stack([state.theta1, state.theta2, state.dtheta1, state.dtheta2], -1)
    assert y.min() >= -0.1 and y.max() <= 0.1
    assert np.all(y.min(0) < -0.099) and np.all(y.max(0) > 0.099)
    np.testing.assert_allclose(y.std(0), 0.2 / np.sqrt(12), rtol=0.03)
    gym_env = gymnasium.make(GYM_ID)
    for seed in range(100):
        gym_env.reset(seed=seed)
        assert np.all(np.abs(gym_env.unwrapped.state) <= 0.1)


def test_spaces_match_gymnasium(env_params):
    env, params = env_params
    gym_env = gymnasium.make(GYM_ID)
    assert env.observation_space(params).to_gymnasium() == gym_env.observation_space
    assert env.action_space(params).to_gymnasium() == gym_env.action_space


def test_torque_noise_param_changes_the_step(env_params):
    env, params = env_params
    _, state = env.reset(jax.random.key(0), params)
    quiet = env.step(jax.random.key(1), state, jnp.int32(1), params)[0]
    noisy = env.step(jax.random.key(1), state, jnp.int32(1), env.make_params(torque_noise_max=0.5))[
        0
    ]
    assert not np.allclose(quiet, noisy)
