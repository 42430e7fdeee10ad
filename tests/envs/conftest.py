"""Shared helpers for the env tests: a jitted random rollout and a gymnasium-parity driver."""

from __future__ import annotations

import jax
import numpy as np
import pytest


def random_rollout(env, params, key, num_steps, sample_action):
    """Run `env.step` for `num_steps` random actions in one jitted `lax.scan` (auto-reset included).

    Returns NumPy arrays, one row per step: the state *before* the step, the action, the observation
    the transition reached (`info["final_obs"]`), reward, terminated, truncated,
    and the returned obs.
    """

    @jax.jit
    def run(key):
        reset_key, scan_key = jax.random.split(key)
        _, state = env.reset(reset_key, params)

        def body(state, key):
            action_key, step_key = jax.random.split(key)
            action = sample_action(action_key)
            obs, next_state, reward, terminated, truncated, info = env.step(
                step_key, state, action, params
            )
            return next_state, (
                state,
                action,
                info["final_obs"],
                reward,
                terminated,
                truncated,
                obs,
            )

        _, trajectory = jax.lax.scan(body, state, jax.random.split(scan_key, num_steps))
        return trajectory

    return jax.tree.map(np.asarray, run(key))


def step_from_states(env, params, states, actions, key=None):
    """One `env.step` from each of a batch of states (vmapped),
    in the layout of `random_rollout`."""
    key = jax.random.key(0) if key is None else key
    keys = jax.random.split(key, len(actions))
    step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)))
    obs, _, reward, terminated, truncated, info = step(keys, states, actions, params)
    return jax.tree.map(
        np.asarray, (states, actions, info["final_obs"], reward, terminated, truncated, obs)
    )


def gymnasium_parity(
    gym_env, set_state, trajectory, to_gym_action, obs_atol, reward_atol, obs_rtol=0.0
):
    """Step `gym_env.unwrapped` from each of our pre-step states with our action; compare one step.

    Checks the reached observation, reward and termination of every transition. Returns the number
    of terminations seen (so a test can assert it covered episode ends). Our envs compute in
    float32, gymnasium's in float64: the tolerances are float32 round-off (relative for large
    velocities).
    """
    states, actions, final_obs, rewards, terminated, _, _ = trajectory
    env = gym_env.unwrapped
    num_terminated = 0
    for t in range(len(rewards)):
        set_state(env, jax.tree.map(lambda x: x[t], states))
        gym_obs, gym_reward, gym_terminated, gym_truncated, _ = env.step(to_gym_action(actions[t]))
        np.testing.assert_allclose(
            final_obs[t], gym_obs, rtol=obs_rtol, atol=obs_atol, err_msg=f"obs at step {t}"
        )
        np.testing.assert_allclose(
            rewards[t], gym_reward, rtol=0, atol=reward_atol, err_msg=f"reward at step {t}"
        )
        assert bool(terminated[t]) == bool(gym_terminated), f"terminated at step {t}"
        assert not gym_truncated
        num_terminated += int(gym_terminated)
    return num_terminated


def check_time_limit(env, params, gym_id, set_state, action, to_gym_action):
    """Truncation at gymnasium's limit: same step count as `gymnasium.make(gym_id)`,
    never termination.

    Drives both envs from the same initial state with a constant `action` that never terminates, for
    one step past the limit, and checks that truncation comes exactly at step `max_episode_steps` in
    both, with `terminated` False, and that our env auto-resets (time back to 0) after it.
    """
    import gymnasium

    limit = gymnasium.spec(gym_id).max_episode_steps
    assert int(params.max_steps_in_episode) == limit
    trajectory = random_rollout(env, params, jax.random.key(3), limit + 1, lambda key: action)
    states, _, _, _, terminated, truncated, _ = trajectory
    assert not terminated.any()
    np.testing.assert_array_equal(np.flatnonzero(truncated), [limit - 1])
    np.testing.assert_array_equal(states.time[: limit + 1], np.concatenate([np.arange(limit), [0]]))

    gym_env = gymnasium.make(gym_id)
    gym_env.reset(seed=0)
    set_state(gym_env.unwrapped, jax.tree.map(lambda x: x[0], states))
    gym_truncated = []
    for _ in range(limit):
        _, _, gym_term, gym_trunc, _ = gym_env.step(to_gym_action(np.asarray(action)))
        assert not gym_term
        gym_truncated.append(gym_trunc)
    np.testing.assert_array_equal(np.flatnonzero(gym_truncated), [limit - 1])


@pytest.fixture
def time_limit():
    return check_time_limit


@pytest.fixture
def from_states():
    return step_from_states


@pytest.fixture
def rollout():
    return random_rollout


@pytest.fixture
def parity():
    return gymnasium_parity


@pytest.fixture
def hide_package(monkeypatch):
    """`hide_package(name)` makes `import name` (and its submodules) fail for the rest of the test,
    as if not installed: the loaded modules leave sys.modules and `name` maps to None
    (undone after)."""
    import sys

    def hide(name: str) -> None:
        for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            monkeypatch.delitem(sys.modules, module)
        monkeypatch.setitem(sys.modules, name, None)

    return hide
