"""rl.core.environment: the training env (`make_env`: Box actions rescaled to [-1, 1], episode
statistics), its batched reset and step, `to_env_action`, and the kernel backend as a value."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
import kernels
from envs.spaces import Box, Discrete
from envs.wrappers import EpisodeStatistics, RescaleAction
from rl.agents import ppo
from rl.config import EnvConfig, KernelsConfig, build_config
from rl.core import environment


def env_config(env_id, **params):
    """The part of a Config that make_env reads (no agent needed)."""
    return SimpleNamespace(env=EnvConfig(id=env_id, params=params))


# ---------------------------------------------------------------- make_env and batched


def test_make_env_rescales_box_actions_and_adds_episode_statistics():
    config = env_config("Pendulum-v1", max_steps_in_episode=3)
    env, params = environment.make_env(config)
    assert isinstance(env, EpisodeStatistics) and isinstance(env.env, RescaleAction)
    assert int(params.max_steps_in_episode) == 3  # env.params reach the env
    space = env.action_space(params)
    assert isinstance(space, Box) and float(space.low) == -1.0 and float(space.high) == 1.0
    raw, raw_params = envs.make("Pendulum-v1", max_steps_in_episode=3)
    key = jax.random.PRNGKey(0)
    obs, state = env.reset(key, params)
    raw_obs, raw_state = raw.reset(key, raw_params)
    np.testing.assert_array_equal(obs, raw_obs)
    # the agent's [-1, 1] maps affinely onto the env's [-2, 2]: 0.5 -> 1.0, and 3 is clipped to
    # 1 -> 2.0
    for agent_action, env_action in ((0.5, 1.0), (-1.0, -2.0), (3.0, 2.0)):
        wrapped = env.step(key, state, jnp.array([agent_action]), params)
        direct = raw.step(key, raw_state, jnp.array([env_action]), raw_params)
        np.testing.assert_array_equal(wrapped[0], direct[0])
        assert float(wrapped[2]) == float(direct[2])
    # episode statistics in info: an episode of 3 steps ends on the third
    returns, infos = 0.0, []
    for _ in range(3):
        obs, state, reward, terminated, truncated, info = env.step(
            key, state, jnp.array([0.0]), params
        )
        returns += float(reward)
        infos.append(info)
    assert [bool(i["episode_done"]) for i in infos] == [False, False, True]
    assert float(infos[-1]["episode_return"]) == pytest.approx(returns, rel=1e-5)
    assert int(infos[-1]["episode_length"]) == 3


def test_make_env_keeps_discrete_actions_and_always_adds_episode_statistics():
    config = env_config("CartPole-v1")
    env, params = environment.make_env(config)
    assert isinstance(env, EpisodeStatistics) and not isinstance(env.env, RescaleAction)
    assert isinstance(env.action_space(params), Discrete)
    obs, state = env.reset(jax.random.PRNGKey(0), params)
    info = env.step(jax.random.PRNGKey(1), state, jnp.int32(0), params)[-1]
    assert {"episode_done", "episode_return", "episode_length", "final_obs"} <= set(info)


def test_batched_steps_every_env_with_its_own_key():
    config = env_config("CartPole-v1")
    env, params = environment.make_env(config)
    reset, step = environment.batched(env)
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    obs, states = reset(keys, params)
    assert obs.shape == (3, 4)
    for i in range(3):
        np.testing.assert_array_equal(obs[i], env.reset(keys[i], params)[0])
    next_obs, _, reward, *_ = step(keys, states, jnp.array([0, 1, 0], jnp.int32), params)
    assert next_obs.shape == (3, 4) and reward.shape == (3,)
    np.testing.assert_array_equal(
        next_obs[1],
        env.step(keys[1], jax.tree.map(lambda x: x[1], states), jnp.int32(1), params)[0],
    )


def test_to_env_action_is_what_the_training_env_sends():
    """environment.to_env_action(u) (what make_policy returns) equals what make_env's env does with
    u: stepping the raw Pendulum with it and the training env with u gives the same next state."""
    config = build_config({"env": {"id": "Pendulum-v1"}, "agent": {"name": "ppo"}})
    env, params = environment.make_env(config)
    raw, raw_params = envs.make("Pendulum-v1")
    u = jnp.array([[-3.0], [-0.5], [0.25], [1.5]])
    np.testing.assert_allclose(
        environment.to_env_action(env, params, u)[:, 0], [-2.0, -1.0, 0.5, 2.0]
    )
    key = jax.random.PRNGKey(0)
    _, state = env.reset(key, params)
    _, raw_state = raw.reset(key, raw_params)
    for action in u:
        wrapped_obs = env.step(key, state, action, params)[0]
        raw_obs = raw.step(
            key, raw_state, environment.to_env_action(env, params, action), raw_params
        )[0]
        np.testing.assert_array_equal(np.asarray(wrapped_obs), np.asarray(raw_obs))
    cartpole, cartpole_params = environment.make_env(
        build_config({"env": {"id": "CartPole-v1"}, "agent": {"name": "ppo"}})
    )
    assert int(environment.to_env_action(cartpole, cartpole_params, jnp.int32(1))) == 1


# ---------------------------------------------------------------- the kernel backend as a value


def test_kernel_backend_is_the_configs_choice_and_sets_nothing_process_wide(monkeypatch):
    monkeypatch.delenv(kernels.launch.ENV_VAR, raising=False)
    before = kernels.resolve_backend(None)
    assert (
        environment.kernel_backend(SimpleNamespace(kernels=KernelsConfig(backend="interpret")))
        == "interpret"
    )
    assert kernels.resolve_backend(None) == before
    # the automatic choice reaches the ops as "auto", so that their measured small-shape
    # crossovers apply
    assert environment.kernel_backend(SimpleNamespace(kernels=KernelsConfig())) == "auto"
    assert kernels.resolve_backend("auto") == before
    # a choice made outside the config is fixed by name when the agent is built
    monkeypatch.setenv(kernels.launch.ENV_VAR, "reference")
    assert environment.kernel_backend(SimpleNamespace(kernels=KernelsConfig())) == "reference"
    with kernels.use_backend("interpret"):
        assert environment.kernel_backend(SimpleNamespace(kernels=KernelsConfig())) == "interpret"


@pytest.mark.skipif(
    kernels.launch.triton_unavailable_reason() is None, reason="triton can run on this machine"
)
def test_an_agent_with_a_backend_that_cannot_run_fails_when_it_is_built():
    config = build_config(
        {
            "env": {"id": "CartPole-v1"},
            "agent": {"name": "ppo", "total_steps": 1024, "log_interval": 1},
            "kernels": {"backend": "triton"},
        }
    )
    with pytest.raises(kernels.BackendUnavailableError, match="'triton' cannot run here"):
        ppo.make_train(config)
