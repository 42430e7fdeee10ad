"""The multi-agent contract (envs/multi_agent.py) on a tiny hand-written env whose every step is
worked out by hand: per-agent termination, truncation at the time limit (termination wins on the
same step), auto-reset only when every agent is done, final_obs, action masks and global state in
info, TeamEpisodeStatistics' team returns, the one ValueError for bad actions, and
`is_multi_agent` through wrappers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import envs
from envs.multi_agent import MultiAgentEnv, TeamEpisodeStatistics, is_multi_agent
from envs.spaces import Box, Discrete
from envs.wrappers import EpisodeStatistics, vectorize


@struct.dataclass
class CountersState:
    count: jax.Array  # int32 [A]
    time: jax.Array  # int32


@struct.dataclass
class CountersParams:
    max_steps_in_episode: int = 5


class Counters(MultiAgentEnv):
    """Three agents a, b, c. Agent i adds its action a_i in {0, 1, 2} to its counter and is
    rewarded a_i; once its counter reaches targets[i] it is terminated and its actions count as 0.
    obs_i = [count_i, time]; masks: action 0 always, actions 1 and 2 while in the episode, action 2
    only while the counter is even; global state: the counters."""

    name = "Counters"
    agent_ids = ("a", "b", "c")

    def __init__(self, targets=(2, 4, 100), global_state: bool = True):
        self.targets = jnp.asarray(targets, jnp.int32)
        self.has_global_state = global_state

    @property
    def default_params(self):
        return CountersParams()

    def observation_space(self, params):
        return Box(-np.inf, np.inf, (2,))

    def action_space(self, params):
        return Discrete(3)

    def observe(self, state):
        time = jnp.broadcast_to(state.time, (3,))
        return jnp.stack([state.count, time], axis=1).astype(jnp.float32)

    def reset_env(self, key, params):
        state = CountersState(jnp.zeros(3, jnp.int32), jnp.int32(0))
        return self.observe(state), state

    def step_env(self, key, state, action, params):
        action = jnp.where(state.count >= self.targets, 0, action)
        next_state = CountersState(state.count + action, state.time + 1)
        terminated = next_state.count >= self.targets
        return self.observe(next_state), next_state, action.astype(jnp.float32), terminated, {}

    def action_mask(self, state, params):
        playing = state.count < self.targets
        even = state.count % 2 == 0
        return jnp.stack([jnp.ones(3, bool), playing, playing & even], axis=1)

    def global_state(self, state, params):
        if not self.has_global_state:
            return super().global_state(state, params)
        return state.count.astype(jnp.float32)

    def global_state_space(self, params):
        if not self.has_global_state:
            return super().global_state_space(params)
        return Box(-np.inf, np.inf, (3,))


def play(env, actions, params=None):
    """`env.step` through `actions` [T, A] in one jitted scan from `env.reset`: the outputs of every
    step, stacked, as NumPy arrays."""
    params = env.default_params if params is None else params

    @jax.jit
    def run(actions):
        _, state = env.reset(jax.random.key(0), params)

        def body(state, action):
            obs, state, reward, terminated, truncated, info = env.step(
                jax.random.key(1), state, action, params
            )
            return state, (obs, state, reward, terminated, truncated, info)

        return jax.lax.scan(body, state, actions)[1]

    return jax.tree.map(np.asarray, run(jnp.asarray(actions, jnp.int32)))


# a reaches 2 on step 1, b 4 on step 2; c (target 100) plays on to the time limit at step 5
ACTIONS = [[2, 2, 1], [0, 2, 1], [0, 0, 1], [0, 0, 1], [0, 0, 1]]
T, F = True, False


def test_agents_leave_one_by_one_and_the_episode_ends_when_all_are_done():
    obs, state, reward, terminated, truncated, info = play(Counters(), ACTIONS * 2)
    np.testing.assert_array_equal(
        reward[:5], [[2, 2, 1], [0, 2, 1], [0, 0, 1], [0, 0, 1], [0, 0, 1]]
    )
    np.testing.assert_array_equal(
        terminated[:5], [[T, F, F], [T, T, F], [T, T, F], [T, T, F], [T, T, F]]
    )
    # the time limit truncates only the agent still in the episode
    np.testing.assert_array_equal(truncated[:5], [[F, F, F]] * 4 + [[F, F, T]])
    np.testing.assert_array_equal(info["episode_end"], [F, F, F, F, T] * 2)
    # no reset before every agent is done; then a fresh episode, final_obs what step 5 reached
    np.testing.assert_array_equal(state.time, [1, 2, 3, 4, 0] * 2)
    np.testing.assert_array_equal(state.count[3], [2, 4, 4])
    np.testing.assert_array_equal(obs[4], np.zeros((3, 2)))
    np.testing.assert_array_equal(info["final_obs"][4], [[2, 5], [4, 5], [5, 5]])
    running = ~info["episode_end"]
    np.testing.assert_array_equal(info["final_obs"][running], obs[running])
    # the second episode repeats the first
    for values in (reward, terminated, truncated, obs, info["final_obs"]):
        np.testing.assert_array_equal(values[5:], values[:5])
    assert reward.dtype == np.float32 and terminated.dtype == truncated.dtype == np.bool_


def test_termination_ends_the_episode_and_wins_over_the_time_limit():
    _, state, _, terminated, truncated, info = play(Counters(targets=(2, 2, 2)), [[2, 2, 2]] * 2)
    np.testing.assert_array_equal(terminated, [[T, T, T]] * 2)  # every episode one step long
    assert not truncated.any() and info["episode_end"].all() and (state.time == 0).all()
    # c reaches its target 5 on step 5, the time limit: terminated, not truncated
    _, _, _, terminated, truncated, info = play(Counters(targets=(2, 4, 5)), ACTIONS)
    np.testing.assert_array_equal(terminated[4], [T, T, T])
    assert not truncated.any() and info["episode_end"][4]


def test_masks_and_global_state_of_the_returned_and_the_final_observations():
    _, _, _, _, _, info = play(Counters(), ACTIONS)
    mask, final_mask = info["action_mask"], info["final_action_mask"]
    assert mask.dtype == np.bool_ and mask.shape == (5, 3, 3)
    # after step 1 the counters are [2, 2, 1]: a is out (only 0), b even (all), c odd (no 2)
    np.testing.assert_array_equal(mask[0], [[T, F, F], [T, T, T], [T, T, F]])
    np.testing.assert_array_equal(final_mask[:4], mask[:4])  # the episode goes on
    # step 5 ends it: the final mask is of counters [2, 4, 5], the returned one of the fresh state
    np.testing.assert_array_equal(final_mask[4], [[T, F, F], [T, F, F], [T, T, F]])
    np.testing.assert_array_equal(mask[4], np.ones((3, 3), bool))
    np.testing.assert_array_equal(
        info["global_state"][:4], [[2, 2, 1], [2, 4, 2], [2, 4, 3], [2, 4, 4]]
    )
    np.testing.assert_array_equal(info["final_global_state"][4], [2, 4, 5])
    np.testing.assert_array_equal(info["global_state"][4], [0, 0, 0])
    assert info["global_state"].dtype == np.float32

    env = Counters(global_state=False)
    _, _, _, _, _, info = play(env, ACTIONS)
    assert "global_state" not in info and "final_global_state" not in info
    _, state = env.reset(jax.random.key(0))
    with pytest.raises(ValueError, match="Counters has no global state"):
        env.global_state(state, env.default_params)
    with pytest.raises(ValueError, match="Counters has no global state"):
        env.global_state_space(env.default_params)


def test_team_episode_statistics_sum_the_mean_reward_over_agents():
    env = TeamEpisodeStatistics(Counters())
    *_, info = play(env, ACTIONS * 2 + ACTIONS[:2])
    # per step mean_i r_i: 5/3, 1, 1/3, 1/3, 1/3 -> 11/3 over 5 steps
    team_return = 5 / 3 + 1 + 3 * (1 / 3)
    np.testing.assert_array_equal(info["episode_done"], ([F] * 4 + [T]) * 2 + [F, F])
    np.testing.assert_allclose(
        info["episode_return"], [0] * 4 + [team_return] * 8, rtol=1e-6
    )  # held until the next episode ends
    np.testing.assert_array_equal(info["episode_length"], [0] * 4 + [5] * 8)
    assert info["episode_return"].dtype == np.float32 and info["episode_length"].dtype == np.int32


def test_bad_actions_raise_one_error_naming_the_shapes_and_dtypes():
    env = Counters()
    params = env.default_params
    _, state = env.reset(jax.random.key(0), params)
    key = jax.random.key(1)
    for bad in (jnp.zeros(2, jnp.int32), jnp.zeros((3, 1), jnp.int32), jnp.int32(0)):
        with pytest.raises(ValueError, match=r"Counters.step: actions must have shape \(3,\)"):
            env.step(key, state, bad, params)
    with pytest.raises(ValueError, match="discrete actions must be integers in \\[0, 3\\)"):
        env.step(key, state, jnp.zeros(3, jnp.float32), params)
    with pytest.raises(ValueError, match="discrete actions must be integers"):
        env.step(key, state, jnp.zeros(3, bool), params)
    with pytest.raises(ValueError, match="actions must have shape"):  # through a wrapper too
        TeamEpisodeStatistics(env).step(key, TeamEpisodeStatistics(env).reset(key)[1], [0, 1])

    class Pushers(Counters):  # Box actions [A, 2]: no masks
        def action_space(self, params):
            return Box(-1.0, 1.0, (2,))

        def step_env(self, key, state, action, params):
            return super().step_env(key, state, (action[:, 0] > 0).astype(jnp.int32), params)

    env = Pushers()
    obs, _, _, _, _, info = env.step(key, state, jnp.ones((3, 2)), params)
    assert obs.shape == (3, 2) and "action_mask" not in info and "final_action_mask" not in info
    with pytest.raises(ValueError, match=r"actions must have shape \(3, 2\)"):
        env.step(key, state, jnp.ones(3), params)
    with pytest.raises(ValueError, match="continuous actions must be floats"):
        env.step(key, state, jnp.ones((3, 2), jnp.int32), params)


def test_is_multi_agent_through_wrappers_and_what_the_wrappers_forward():
    env = Counters()
    wrapped = TeamEpisodeStatistics(env)
    for candidate in (env, wrapped, vectorize(env, 2), vectorize(wrapped, 2)):
        assert is_multi_agent(candidate)
    cartpole, _ = envs.make("CartPole-v1")
    for candidate in (cartpole, EpisodeStatistics(vectorize(cartpole, 2))):
        assert not is_multi_agent(candidate)
    params = env.default_params
    _, state = wrapped.reset(jax.random.key(0), params)
    assert wrapped.agent_ids == ("a", "b", "c") and wrapped.num_agents == 3
    assert wrapped.has_global_state and wrapped.global_state_space(params).shape == (3,)
    _, state, *_ = wrapped.step(jax.random.key(1), state, jnp.array([1, 0, 0]), params)
    np.testing.assert_array_equal(wrapped.global_state(state, params), [1, 0, 0])
    np.testing.assert_array_equal(
        wrapped.action_mask(state, params), [[T, T, F], [T, T, T], [T, T, T]]
    )
    assert "agents=['a', 'b', 'c']" in repr(env)
