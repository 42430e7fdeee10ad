"""The multi-agent env contract: the Env contract with an agents axis.

    env, params = envs.make("jaxmarl:MPE_simple_spread_v3")
    obs, state = env.reset(key, params)                                    # obs [A, *obs_shape]
    obs, state, reward, terminated, truncated, info = env.step(key, state, actions, params)
    mask = env.action_mask(state, params)                                  # bool [A, n]
    world = env.global_state(state, params)                                # [*state_shape]

Conventions (every multi-agent env follows them; `MultiAgentEnv.step` enforces the shapes):
  * Agents are stacked on axis 0 in the order of `env.agent_ids` (A = `env.num_agents`): `obs`
    [A, *obs_shape], `actions` [A] (or [A, d] for Box actions), `reward`, `terminated` and
    `truncated` [A]. `observation_space(params)` and `action_space(params)` describe one agent's
    (every agent has the same shapes; an env whose agents differ pads, as JaxMARL does, and its
    action mask rules out the padding actions).
  * An agent that is out of the episode (a dead unit in SMAX) is `terminated` from the step it
    leaves on, and the env goes on stepping it (its actions masked to the no-op). The episode ends
    when every agent is terminated or truncated (`info["episode_end"]`, a bool scalar), and only
    then does `step` auto-reset: the returned `obs` and `state` are a fresh episode's and
    `info["final_obs"]` holds the observations the transition reached ([A, ...]; equal to `obs`
    when the episode goes on), so agents bootstrap per agent from it unconditionally:
    target_i = r_i + gamma * (1 - terminated_i) * V(final_obs_i). A time limit is truncation,
    never termination.
  * Action masks (Discrete actions): `action_mask(state, params)` is True where an agent may take
    an action (all True for an env without masks); `info["action_mask"]` is the mask of the
    returned `obs` and `info["final_action_mask"]` that of `info["final_obs"]` (for
    max_a Q(final_obs, a)). An env with Box actions has neither.
  * Global state, for centralised critics and mixers (`has_global_state`): `global_state(state,
    params)` [*global_state_space(params).shape] float32; `info["global_state"]` and
    `info["final_global_state"]` as for observations. An env without one raises ValueError naming
    it.

A subclass implements `agent_ids`, `default_params`, `reset_env(key, params) -> (obs, state)`,
`step_env(key, state, actions, params) -> (obs, state, reward, terminated, info)`,
`truncation(state, params)` (bool [A] or scalar), the spaces, and where it has them
`action_mask` and `global_state`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from envs.core import Env
from envs.spaces import Box, Discrete
from envs.wrappers import Wrapper


class MultiAgentEnv(Env):
    """Base of every multi-agent env: `reset` and the auto-resetting, per-agent `step` around the
    env's own `reset_env`/`step_env` (see the module docstring)."""

    name: str = "MultiAgentEnv"
    agent_ids: tuple[str, ...] = ()
    has_global_state: bool = False

    @property
    def num_agents(self) -> int:
        return len(self.agent_ids)

    def step(self, key: jax.Array, state: Any, action: Any, params: Any = None):
        """One joint transition with per-agent episode ends and auto-reset.

        Returns (obs [A, ...], state, reward [A] float32, terminated [A], truncated [A], info) with
        info["final_obs"], ["episode_end"], ["action_mask"] and ["final_action_mask"] (Discrete
        actions) and, with a global state, ["global_state"] and ["final_global_state"].
        """
        params = self.default_params if params is None else params
        action = self.check_actions(action, params)
        key_step, key_reset = jax.random.split(key)
        next_obs, next_state, reward, terminated, info = self.step_env(
            key_step, state, action, params
        )
        agents = (self.num_agents,)
        terminated = jnp.broadcast_to(jnp.asarray(terminated, jnp.bool_), agents)
        cut = jnp.broadcast_to(jnp.asarray(self.truncation(next_state, params), jnp.bool_), agents)
        truncated = cut & ~terminated
        episode_end = jnp.all(terminated | truncated)
        reset_obs, reset_state = self.auto_reset(key_reset, next_state, params)
        state = jax.tree.map(lambda r, s: jnp.where(episode_end, r, s), reset_state, next_state)
        obs = jnp.where(episode_end, reset_obs, next_obs)
        info = dict(info)
        info["final_obs"] = next_obs
        info["episode_end"] = episode_end
        if isinstance(self.action_space(params), Discrete):
            info["final_action_mask"] = self.action_mask(next_state, params)
            info["action_mask"] = self.action_mask(state, params)
        if self.has_global_state:
            info["final_global_state"] = self.global_state(next_state, params)
            info["global_state"] = self.global_state(state, params)
        reward = jnp.broadcast_to(jnp.asarray(reward, jnp.float32), agents)
        return obs, state, reward, terminated, truncated, info

    def check_actions(self, action, params) -> jax.Array:
        """`action` as an array of the action space's dtype, [A] (Discrete) or [A, *shape] (Box);
        ValueError naming the env and the shapes otherwise."""
        space = self.action_space(params)
        expected = (self.num_agents, *space.shape)
        if tuple(jnp.shape(action)) != expected:
            raise ValueError(
                f"{self.name}.step: actions must have shape {expected} (one per agent, in the "
                f"order {list(self.agent_ids)}), got {tuple(jnp.shape(action))}"
            )
        dtype = jnp.result_type(action)
        if isinstance(space, Discrete) and not jnp.issubdtype(dtype, jnp.integer):
            raise ValueError(
                f"{self.name}.step: discrete actions must be integers in [0, {space.n}), "
                f"got dtype {dtype}"
            )
        if isinstance(space, Box) and not jnp.issubdtype(dtype, jnp.floating):
            raise ValueError(
                f"{self.name}.step: continuous actions must be floats, got dtype {dtype}"
            )
        return jnp.asarray(action, space.dtype)

    def action_mask(self, state: Any, params: Any) -> jax.Array:
        """bool [A, n]: which actions each agent may take in `state` (all, unless overridden)."""
        space = self.action_space(params)
        if not isinstance(space, Discrete):
            raise ValueError(f"{self.name}: action masks need Discrete actions, not {space}")
        return jnp.ones((self.num_agents, space.n), jnp.bool_)

    def global_state(self, state: Any, params: Any) -> jax.Array:
        """The global state a centralised critic reads; ValueError for an env without one."""
        raise ValueError(f"{self.name} has no global state (has_global_state is False)")

    def global_state_space(self, params: Any) -> Box:
        """The Box of `global_state`; ValueError for an env without one."""
        raise ValueError(f"{self.name} has no global state (has_global_state is False)")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, agents={list(self.agent_ids)})"


def is_multi_agent(env: Env) -> bool:
    """Whether `env` (wrappers and all) follows the multi-agent contract."""
    while isinstance(env, Wrapper) and not isinstance(env, MultiAgentWrapper):
        env = env.env
    return isinstance(env, (MultiAgentEnv, MultiAgentWrapper))


class MultiAgentWrapper(Wrapper):
    """A Wrapper around a multi-agent env: also delegates the agents, the masks and the global
    state (to `inner_state(state)`)."""

    @property
    def agent_ids(self) -> tuple[str, ...]:
        return self.env.agent_ids

    @property
    def num_agents(self) -> int:
        return self.env.num_agents

    @property
    def has_global_state(self) -> bool:
        return self.env.has_global_state

    def action_mask(self, state, params):
        return self.env.action_mask(self.inner_state(state), params)

    def global_state(self, state, params):
        return self.env.global_state(self.inner_state(state), params)

    def global_state_space(self, params):
        return self.env.global_state_space(params)


@struct.dataclass
class TeamEpisodeState:
    env_state: Any
    episode_return: jax.Array  # running team return of the current episode
    episode_length: jax.Array
    returned_episode_return: jax.Array  # of the last episode that ended
    returned_episode_length: jax.Array


class TeamEpisodeStatistics(MultiAgentWrapper):
    """`envs.wrappers.EpisodeStatistics` for a multi-agent env: the team's return and length of
    the episodes that ended, with the team's reward on a step the mean over agents, mean_i r_i (the
    return JaxMARL's baselines log: every agent's undiscounted return, averaged over agents).

    info["episode_done"]   = info["episode_end"] (every agent terminated or truncated)
    info["episode_return"] = sum_t mean_i r_{t,i} of the last episode that ended (float32)
    info["episode_length"] = its number of steps (int32)
    """

    def inner_state(self, state: TeamEpisodeState) -> Any:
        return state.env_state

    def reset(self, key, params=None):
        params = self.default_params if params is None else params
        obs, env_state = self.env.reset(key, params)
        zero_f, zero_i = jnp.float32(0.0), jnp.int32(0)
        return obs, TeamEpisodeState(env_state, zero_f, zero_i, zero_f, zero_i)

    def step(self, key, state: TeamEpisodeState, action, params=None):
        obs, env_state, reward, terminated, truncated, info = self.env.step(
            key, state.env_state, action, params
        )
        episode_return = state.episode_return + jnp.mean(reward)
        episode_length = state.episode_length + 1
        done = info["episode_end"]
        new_state = TeamEpisodeState(
            env_state=env_state,
            episode_return=jnp.where(done, 0.0, episode_return),
            episode_length=jnp.where(done, 0, episode_length),
            returned_episode_return=jnp.where(done, episode_return, state.returned_episode_return),
            returned_episode_length=jnp.where(done, episode_length, state.returned_episode_length),
        )
        info = dict(info)
        info["episode_done"] = done
        info["episode_return"] = new_state.returned_episode_return
        info["episode_length"] = new_state.returned_episode_length
        return obs, new_state, reward, terminated, truncated, info
