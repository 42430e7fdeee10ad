"""JaxMARL environments behind the multi-agent Env contract (`envs/multi_agent.py`; the `jaxmarl`
extra: pip install "fusedrl[jaxmarl]").

    env, params = envs.make("jaxmarl:MPE_simple_spread_v3")
    env, params = envs.make("jaxmarl:SMAX", scenario="3m")

The env is `jaxmarl.make(id, **kwargs)` (SMAX's `scenario` is a map name of
`jaxmarl.environments.smax.map_name_to_scenario`). Agents are stacked in the order of JaxMARL's
`env.agents`; observations, actions, rewards and dones are JaxMARL's, per agent.

  * Episode ends: JaxMARL's per-agent `dones` are split at its time limit `env.max_steps`: a done on
    a step that reaches the limit is *truncated* (it bootstraps), any other done *terminates*.
  * Auto-reset: `step_env` is JaxMARL's transition without its reset; the episode ends when
    `dones["__all__"]` (every agent terminated or truncated) and restarts from `env.reset` with the
    step's reset key; `info["final_obs"]` is what the last step reached.
  * Action masks: `env.get_avail_actions(state)` where JaxMARL has them; all True otherwise.
  * Global state: SMAX's `get_world_state`; MPE's is every agent's observation concatenated (as
    JaxMARL's MAPPO baselines build it).
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs.core import import_extra
from envs.multi_agent import MultiAgentEnv
from envs.spaces import Box, Discrete

EXTRA = "jaxmarl"


def _jaxmarl(user: str = "jaxmarl:<id>"):
    """The `jaxmarl` module (its import prints a line about optional submodules: dropped)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return import_extra("jaxmarl", EXTRA, user)


def ids() -> list[str]:
    """JaxMARL's registered ids (ImportError if JaxMARL is not installed)."""
    return sorted(_jaxmarl().registered_envs)


@struct.dataclass
class JaxMARLParams:
    """JaxMARL envs keep their settings in the env object; the time limit is read from it."""

    max_steps_in_episode: int = struct.field(pytree_node=False, default=0)


def _space(space, what: str):
    """fusedrl's space for a JaxMARL Discrete or Box."""
    if hasattr(space, "n"):
        return Discrete(int(space.n))
    if hasattr(space, "low") and hasattr(space, "shape"):
        low = np.broadcast_to(np.asarray(space.low, np.float32), space.shape)
        high = np.broadcast_to(np.asarray(space.high, np.float32), space.shape)
        return Box(low, high, tuple(space.shape), np.float32)
    raise ValueError(f"{what}: JaxMARL space {space!r} is neither Discrete nor Box")


class JaxMARLEnv(MultiAgentEnv):
    """A JaxMARL `MultiAgentEnv` stacked on an agents axis (module docstring)."""

    def __init__(self, env_id: str, jaxmarl_env):
        self.name = f"jaxmarl:{env_id}"
        self.env_id = env_id
        self.env = jaxmarl_env
        self.agent_ids = tuple(jaxmarl_env.agents)
        first = self.agent_ids[0]
        self._obs_space = _space(jaxmarl_env.observation_space(first), self.name)
        self._action_space = _space(jaxmarl_env.action_space(first), self.name)
        self.has_global_state = hasattr(jaxmarl_env, "get_world_state") or env_id.startswith("MPE")

    @property
    def default_params(self) -> JaxMARLParams:
        return JaxMARLParams(max_steps_in_episode=int(getattr(self.env, "max_steps", 0)))

    def observation_space(self, params) -> Box:
        return self._obs_space

    def action_space(self, params):
        return self._action_space

    def stack(self, values: dict) -> jax.Array:
        """JaxMARL's per-agent dict as one array, agents on axis 0."""
        return jnp.stack([values[agent] for agent in self.agent_ids])

    def unstack(self, values: jax.Array) -> dict:
        return {agent: values[i] for i, agent in enumerate(self.agent_ids)}

    def reset_env(self, key, params):
        obs, state = self.env.reset(key)
        return self.stack(obs), state

    def step_env(self, key, state, action, params):
        obs, state, reward, dones, info = self.env.step_env(key, state, self.unstack(action))
        done = self.stack(dones)
        terminated = done & ~self.time_up(state)
        info = {name: value for name, value in info.items() if name != "world_state"}
        return self.stack(obs), state, self.stack(reward), terminated, info

    def time_up(self, state) -> jax.Array:
        """Whether `state` is at JaxMARL's time limit (`env.max_steps`)."""
        max_steps = getattr(self.env, "max_steps", None)
        if max_steps is None:
            return jnp.bool_(False)
        return state.step >= max_steps

    def truncation(self, state, params):
        return self.time_up(state)

    def action_mask(self, state, params):
        try:
            available = self.env.get_avail_actions(state)
        except NotImplementedError:
            return super().action_mask(state, params)
        return self.stack(available).astype(jnp.bool_)

    def global_state(self, state, params):
        if hasattr(self.env, "get_world_state"):
            return jnp.asarray(self.env.get_world_state(state), jnp.float32)
        if self.env_id.startswith("MPE"):
            obs = self.env.get_obs(state)
            return jnp.concatenate([obs[agent].ravel() for agent in self.agent_ids])
        return super().global_state(state, params)

    def global_state_space(self, params) -> Box:
        if not self.has_global_state:
            return super().global_state_space(params)
        state = jax.eval_shape(lambda: self.reset_env(jax.random.key(0), params)[1])
        shape = jax.eval_shape(lambda s: self.global_state(s, params), state).shape
        return Box(-np.inf, np.inf, tuple(shape), np.float32)


def make(env_id: str, **kwargs: Any):
    """(env, params): JaxMARL's `jaxmarl.make(env_id, **kwargs)` behind the multi-agent contract.
    ValueError for an id JaxMARL does not have (listing its ids); SMAX's `scenario` may be a map
    name ("3m", "2s3z", ...)."""
    jaxmarl = _jaxmarl(f"jaxmarl:{env_id}")
    if env_id not in jaxmarl.registered_envs:
        raise ValueError(
            f"jaxmarl: unknown id {env_id!r}; JaxMARL's ids: {', '.join(sorted(ids()))}"
        )
    if "scenario" in kwargs and isinstance(kwargs["scenario"], str):
        from jaxmarl.environments.smax import map_name_to_scenario

        kwargs["scenario"] = map_name_to_scenario(kwargs["scenario"])
    env = JaxMARLEnv(env_id, jaxmarl.make(env_id, **kwargs))
    return env, env.default_params
