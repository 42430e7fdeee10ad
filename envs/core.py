"""The environment contract: pure functions over explicit state, with auto-reset.

    env, params = envs.make("CartPole-v1")
    obs, state = env.reset(key, params)
    obs, state, reward, terminated, truncated, info = env.step(key, state, action, params)

An env implements four things and inherits `reset`/`step` from `Env`:

    default_params                      -> params pytree (flax.struct dataclass)
    reset_env(key, params)              -> (obs, state)
    step_env(key, state, action, params) -> (obs, state, reward, terminated, info)
    observation_space(params), action_space(params)

Conventions every env follows:
  * `state` has an integer field `time` (steps taken in the current episode) and `params` a field
    `max_steps_in_episode`; `Env.step` sets
    `truncated = time >= max_steps_in_episode and not terminated` (gymnasium's TimeLimit), so
    truncation is never reported as termination. An env whose episodes can be cut for other reasons
    (an adapter whose library reports truncation itself) overrides `truncation(state, params)`, the
    test before the `not terminated`.
  * `Env.step` auto-resets: when `terminated | truncated`, the returned `obs` and `state` are those
    of a fresh episode, and `info["final_obs"]` holds the observation the transition actually
    reached. `info["final_obs"]` is present on every step (it equals `obs` when the episode goes
    on), so agents bootstrap from it unconditionally:
    target = r + gamma * (1 - terminated) * V(info["final_obs"]).
  * Everything is pure and jit/vmap-able; `params` is a pytree, so env variants can be vmapped too.
    Fields that fix array shapes (a grid's size) are static (`pytree_node=False`).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import jax
import jax.numpy as jnp

from envs.spaces import check_action, is_concrete


class Env:
    """Base of every env: `reset` and auto-resetting `step` around the env's own
    `reset_env`/`step_env`.

    Subclasses define `name`, `default_params`, `reset_env`, `step_env`, `observation_space` and
    `action_space` (see the module docstring).
    """

    name: str = "Env"

    def reset(self, key: jax.Array, params: Any = None) -> tuple[jax.Array, Any]:
        """Start an episode: (obs, state)."""
        params = self.default_params if params is None else params
        return self.reset_env(key, params)

    def step(self, key: jax.Array, state: Any, action: Any, params: Any = None):
        """One transition with gymnasium's episode-end split and auto-reset.

        Returns (obs, state, reward, terminated, truncated, info) where reward is float32,
        terminated/truncated are bool scalars and info["final_obs"] is the pre-reset observation.
        """
        params = self.default_params if params is None else params
        action = check_action(self.action_space(params), action, self.name)
        key_step, key_reset = jax.random.split(key)
        next_obs, next_state, reward, terminated, info = self.step_env(
            key_step, state, action, params
        )
        terminated = jnp.asarray(terminated, jnp.bool_)
        truncated = jnp.logical_and(
            self.truncation(next_state, params), jnp.logical_not(terminated)
        )
        done = jnp.logical_or(terminated, truncated)
        reset_obs, reset_state = self.auto_reset(key_reset, next_state, params)
        state = jax.tree.map(lambda r, s: jnp.where(done, r, s), reset_state, next_state)
        obs = jnp.where(done, reset_obs, next_obs)
        info = dict(info)
        info["final_obs"] = next_obs
        return obs, state, jnp.asarray(reward, jnp.float32), terminated, truncated, info

    def auto_reset(self, key: jax.Array, final_state: Any, params: Any) -> tuple[jax.Array, Any]:
        """(obs, state) that `step` continues from when `final_state` ends an episode: a fresh
        `reset_env(key, params)` (an adapter may restart from a state it kept instead)."""
        return self.reset_env(key, params)

    def truncation(self, state: Any, params: Any) -> jax.Array:
        """Whether the step that reached `state` cuts the episode short (when it does not
        terminate): the time limit, `state.time >= params.max_steps_in_episode`."""
        return state.time >= params.max_steps_in_episode

    def make_params(self, **overrides: Any) -> Any:
        """The default params with some fields replaced;
        an unknown field raises ValueError naming it."""
        params = self.default_params
        known = [f.name for f in dataclasses.fields(params)]
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            raise ValueError(f"{self.name}: unknown env param(s) {unknown}; known params: {known}")
        return params.replace(**overrides)

    @property
    def num_actions(self) -> int:
        """Number of discrete actions (only for discrete action spaces)."""
        space = self.action_space(self.default_params)
        if not hasattr(space, "n"):
            raise ValueError(
                f"{self.name} has a continuous action space {space}; num_actions is undefined"
            )
        return int(space.n)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def concrete_or(value: Any, default: float) -> float:
    """`value` as a Python float when it is concrete, else `default`.

    Spaces need concrete bounds; when a param that sets a bound is traced (under a vmap over
    params), the space falls back to the default param's bound (the dynamics still use the traced
    value).
    """
    if not is_concrete(value):
        return float(default)
    return float(value)


class MissingExtraError(ImportError):
    """An optional env library (a pip extra of fusedrl) is not installed or does not import; the
    message names the extra that installs it."""


def import_extra(module: str, extra: str, user: str):
    """`import module`, or MissingExtraError for `user` (an env id) naming the pip extra
    that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingExtraError(
            f"{user} needs the {module!r} package, which does not import: "
            f'pip install -e ".[{extra}]" in the fusedrl clone ({error})'
        ) from error
