"""CartPole-v1 against gymnasium 1.x: one-step parity from identical states, time limit,
reset law."""

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs.cartpole import CartPoleState

GYM_ID = "CartPole-v1"


def set_gym_state(gym_env, state):
    gym_env.state = np.array([state.x, state.x_dot, state.theta, state.theta_dot], dtype=np.float64)
    gym_env.steps_beyond_terminated = None


def to_gym_action(action):
    return int(action)


@pytest.fixture(scope="module")
def env_params():
    return envs.make(GYM_ID)


def random_action(key):
    return jax.random.randint(key, (), 0, 2)


def test_parity_with_gymnasium_over_random_steps(env_params, rollout, parity):
    env, params = env_params
    trajectory = rollout(env, params, jax.random.key(0), 5000, random_action)
    num_terminated = parity(
        gymnasium.make(GYM_ID),
        set_gym_state,
        trajectory,
        to_gym_action,
        obs_atol=1e-5,
        reward_atol=0,
    )
    assert num_terminated > 100  # random episodes are short: many terminations and auto-resets


def test_parity_from_random_states(env_params, from_states, parity):
    env, params = env_params
    n = 3000
    rng = np.random.default_rng(0)
    y = rng.uniform([-2.6, -3.0, -0.25, -3.5], [2.6, 3.0, 0.25, 3.5], (n, 4)).astype(np.float32)
    states = CartPoleState(*(jnp.asarray(y[:, i]) for i in range(4)), time=jnp.zeros(n, jnp.int32))
    batch = from_states(env, params, states, jnp.asarray(rng.integers(0, 2, n), jnp.int32))
    num_terminated = parity(
        gymnasium.make(GYM_ID), set_gym_state, batch, to_gym_action, obs_atol=1e-5, reward_atol=0
    )
    assert num_terminated > 300


def test_reward_is_one_on_terminating_step(env_params):
    env, params = env_params
    state = CartPoleState(
        x=jnp.float32(2.39),
        x_dot=jnp.float32(2.0),
        theta=jnp.float32(0.0),
        theta_dot=jnp.float32(0.0),
        time=jnp.int32(5),
    )
    _, new_state, reward, terminated, truncated, info = env.step(
        jax.random.key(0), state, jnp.int32(1), params
    )
    assert bool(terminated) and not bool(truncated) and float(reward) == 1.0
    assert float(info["final_obs"][0]) > 2.4 and int(new_state.time) == 0


def test_truncation_with_a_custom_limit(env_params):
    env, params = env_params
    short = params.replace(max_steps_in_episode=3)
    _, state = env.reset(jax.random.key(0), short)
    for t in range(3):
        _, state, _, terminated, truncated, _ = env.step(
            jax.random.key(t), state, jnp.int32(t % 2), short
        )
        assert not bool(terminated)
        assert bool(truncated) == (t == 2)
    assert int(state.time) == 0


def test_balanced_pole_truncates_at_500_like_gymnasium(env_params):
    """A PD controller balances the pole: both envs run 500 steps and truncate on the same step.

    gymnasium's state is set to ours before every step (the dynamics are chaotic, float32 and
    float64 trajectories drift apart), while its TimeLimit wrapper counts steps on its own.
    """
    env, params = env_params

    def controller(obs):
        return int(obs[2] + 0.5 * obs[3] + 0.01 * obs[0] + 0.1 * obs[1] > 0)

    obs, state = env.reset(jax.random.key(0), params)
    gym_env = gymnasium.make(GYM_ID)
    gym_env.reset(seed=0)
    set_gym_state(gym_env.unwrapped, state)
    step = jax.jit(env.step)
    for t in range(500):
        action = controller(np.asarray(obs))
        set_gym_state(gym_env.unwrapped, state)
        obs, state, _, terminated, truncated, info = step(
            jax.random.key(t), state, jnp.int32(action), params
        )
        gym_obs, _, gym_terminated, gym_truncated, _ = gym_env.step(action)
        np.testing.assert_allclose(info["final_obs"], gym_obs, atol=1e-5)
        assert not bool(terminated) and not gym_terminated
        assert bool(truncated) == gym_truncated == (t == 499)


def test_initial_state_distribution(env_params):
    env, params = env_params
    obs, _ = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(jax.random.key(1), 20000), params
    )
    obs = np.asarray(obs)
    assert obs.min() >= -0.05 and obs.max() <= 0.05
    assert np.all(obs.min(0) < -0.0499) and np.all(obs.max(0) > 0.0499)
    np.testing.assert_allclose(obs.std(0), 0.1 / np.sqrt(12), rtol=0.03)
    gym_env = gymnasium.make(GYM_ID)
    for seed in range(100):
        gym_obs, _ = gym_env.reset(seed=seed)
        assert np.all(np.abs(gym_obs) <= 0.05)


def test_spaces_match_gymnasium(env_params):
    env, params = env_params
    gym_env = gymnasium.make(GYM_ID)
    assert env.observation_space(params).to_gymnasium() == gym_env.observation_space
    assert env.action_space(params).to_gymnasium() == gym_env.action_space
