"""Jumanji environments behind the Env contract
(the `jumanji` extra: pip install "fusedrl[jumanji]").

    env, params = envs.make("jumanji:Snake-v1")  # any id of jumanji.registered_environments()
    env, params = envs.make("jumanji:Snake-v1", num_rows=8, num_cols=8, max_steps_in_episode=500)

The env is `jumanji.make(id, **kwargs)` (keywords other than `max_steps_in_episode` go to Jumanji's
constructor). Single-agent envs only: the reward must be a scalar.

  * Episode ends, from Jumanji's `TimeStep`: a step whose `step_type` is LAST *terminates* when its
    `discount` is 0 and is *truncated* otherwise. Jumanji decides which: most of its envs (Snake
    among them) end at their own `time_limit` with discount 0, so that end is a termination here as
    it is there. `params.max_steps_in_episode` (default: the env's `time_limit`, else 10000) also
    truncates (a termination on the same step wins), so every episode ends and evaluation loops are
    bounded; for a time limit that bootstraps, set it below the env's `time_limit`.
  * Observations, flattened by one rule: the leaves of Jumanji's observation pytree, in pytree order
    (the fields of its NamedTuple or dataclass in declaration order; dict keys sorted), each raveled
    in C order and cast to float32 (booleans to 0/1), concatenated. The space is a Box over that
    vector with the specs' bounds (BoundedArray: its minimum and maximum; DiscreteArray: [0, n - 1];
    booleans: [0, 1]; other arrays unbounded). `env.unflatten_observation(obs)` rebuilds the pytree
    (float32 leaves) for a torso that wants the structure (Snake's [12, 12, 5] grid, its action
    mask).
  * Actions: a DiscreteArray(n) is Discrete(n); a MultiDiscreteArray with num_values (n_1, ..., n_k)
    is Discrete(n_1 * ... * n_k) (at most 65536 joint actions), action a meaning
    `np.unravel_index(a, (n_1, ..., n_k))` (C order); a BoundedArray of floats is a Box. Other
    action specs raise ValueError at `make`.
  * Auto-reset: the next episode starts from `jumanji_env.reset` with the step's reset key;
    `info["final_obs"]` is the observation the last step reached.
  * `render(state, params)` draws the state with the env's matplotlib viewer into an array (no
    display needed); an env without such a viewer raises ValueError.

`state.env_state` is Jumanji's state.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs.core import Env, import_extra
from envs.spaces import Box, Discrete

EXTRA = "jumanji"
DEFAULT_MAX_STEPS = 10_000
MAX_JOINT_ACTIONS = 65_536


def _jumanji(user: str = "jumanji:<id>"):
    return import_extra("jumanji", EXTRA, user)


def ids() -> list[str]:
    """Jumanji's registered ids (ImportError if Jumanji is not installed)."""
    return sorted(_jumanji().registered_environments())


@struct.dataclass
class JumanjiParams:
    max_steps_in_episode: int = DEFAULT_MAX_STEPS


@struct.dataclass
class JumanjiState:
    env_state: Any  # Jumanji's state
    time: jax.Array  # steps taken in this episode
    cut: jax.Array  # bool: the step that reached this state ended the episode with discount != 0


def _spec_at(spec, path):
    """The leaf spec of an observation leaf, found by the leaf's path (attribute names or keys)."""
    for entry in path:
        name = getattr(entry, "name", getattr(entry, "key", None))
        spec = getattr(spec, str(name)) if hasattr(spec, str(name)) else spec[name]
    return spec


def _bounds(spec, shape) -> tuple[np.ndarray, np.ndarray]:
    """Flat (low, high) of an observation leaf from its spec (the module docstring's rule)."""
    from jumanji import specs

    if np.dtype(spec.dtype) == np.bool_:
        low, high = 0.0, 1.0
    elif isinstance(spec, specs.BoundedArray):
        low, high = np.asarray(spec.minimum, np.float32), np.asarray(spec.maximum, np.float32)
    else:
        low, high = -np.inf, np.inf
    return np.broadcast_to(low, shape).ravel(), np.broadcast_to(high, shape).ravel()


class Jumanji(Env):
    """One Jumanji env (see the module docstring)."""

    def __init__(self, env: str | Any, **env_kwargs):
        """`env`: a Jumanji id (made with `jumanji.make(env, **env_kwargs)`) or a Jumanji env object
        (a wrapped one, say)."""
        jumanji = _jumanji(f"jumanji:{env}" if isinstance(env, str) else "envs.jumanji.Jumanji")
        from jumanji import specs

        if isinstance(env, str):
            if env not in jumanji.registered_environments():
                raise ValueError(
                    f"unknown Jumanji id {env!r}; Jumanji ids: "
                    f"{', '.join(sorted(jumanji.registered_environments()))}"
                )
            try:
                self._env = jumanji.make(env, **env_kwargs)
            except TypeError as error:  # a keyword the env's constructor does not take
                raise ValueError(f"jumanji:{env}: {error}") from None
            self.name = f"jumanji:{env}"
        else:
            if env_kwargs:
                raise ValueError(
                    f"Jumanji: keyword arguments {sorted(env_kwargs)} only apply to an id"
                )
            self._env, self.name = env, f"jumanji:{type(env.unwrapped).__name__}"
        if tuple(self._env.reward_spec.shape) != ():
            raise ValueError(
                f"{self.name}: only single-agent envs (scalar rewards) are supported; "
                f"its reward has shape {self._env.reward_spec.shape}"
            )
        self._default_params = JumanjiParams(
            int(getattr(self._env, "time_limit", None) or DEFAULT_MAX_STEPS)
        )

        # observations: the flattening rule of the module docstring
        _, timestep = jax.eval_shape(self._env.reset, jax.random.key(0))
        leaves, self._obs_treedef = jax.tree_util.tree_flatten_with_path(timestep.observation)
        self._obs_shapes = [tuple(leaf.shape) for _, leaf in leaves]
        obs_spec = self._env.observation_spec
        bounds = [_bounds(_spec_at(obs_spec, path), leaf.shape) for path, leaf in leaves]
        size = sum(math.prod(shape) for shape in self._obs_shapes)
        self._obs_space = Box(
            np.concatenate([b[0] for b in bounds]), np.concatenate([b[1] for b in bounds]), (size,)
        )

        # actions
        spec = self._env.action_spec
        self._action_dims = None
        if isinstance(spec, specs.DiscreteArray):
            self._action_space = Discrete(int(spec.num_values))
        elif isinstance(spec, specs.MultiDiscreteArray):
            self._action_dims = tuple(int(n) for n in np.asarray(spec.num_values).ravel())
            self._action_shape = tuple(np.shape(spec.num_values))
            joint = math.prod(self._action_dims)
            if joint > MAX_JOINT_ACTIONS:
                raise ValueError(
                    f"{self.name}: its MultiDiscrete actions {self._action_dims} have {joint} "
                    f"joint values (at most {MAX_JOINT_ACTIONS} are supported)"
                )
            self._action_space = Discrete(joint)
        elif isinstance(spec, specs.BoundedArray) and np.issubdtype(
            np.dtype(spec.dtype), np.floating
        ):
            low, high = (
                np.broadcast_to(np.asarray(b, np.float32), spec.shape)
                for b in (spec.minimum, spec.maximum)
            )
            self._action_space = Box(low, high, tuple(spec.shape))
        else:
            raise ValueError(
                f"{self.name}: unsupported action spec {spec!r} (supported: DiscreteArray, "
                "MultiDiscreteArray, float BoundedArray)"
            )

    @property
    def jumanji_env(self):
        """Jumanji's own env object."""
        return self._env

    @property
    def default_params(self) -> JumanjiParams:
        return self._default_params

    def observation_space(self, params=None) -> Box:
        return self._obs_space

    def action_space(self, params=None):
        return self._action_space

    def flatten_observation(self, observation) -> jax.Array:
        """Jumanji's observation pytree as our flat float32 vector (the module docstring's rule)."""
        return jnp.concatenate(
            [jnp.ravel(jnp.asarray(leaf, jnp.float32)) for leaf in jax.tree.leaves(observation)]
        )

    def unflatten_observation(self, obs) -> Any:
        """The observation pytree (float32 leaves) of flat observations [..., D]
        (any batch shape)."""
        obs = jnp.asarray(obs)
        batch, leaves, start = obs.shape[:-1], [], 0
        for shape in self._obs_shapes:
            size = math.prod(shape)
            leaves.append(obs[..., start : start + size].reshape(batch + shape))
            start += size
        return jax.tree_util.tree_unflatten(self._obs_treedef, leaves)

    def jumanji_action(self, action) -> jax.Array:
        """Jumanji's action for one of ours (the unravelled index for MultiDiscrete actions)."""
        if self._action_dims is None:
            return action
        return (
            jnp.stack(jnp.unravel_index(action, self._action_dims))
            .astype(jnp.int32)
            .reshape(self._action_shape)
        )

    def reset_env(self, key, params):
        env_state, timestep = self._env.reset(key)
        return self.flatten_observation(timestep.observation), JumanjiState(
            env_state, jnp.int32(0), jnp.bool_(False)
        )

    def step_env(self, key, state: JumanjiState, action, params):
        env_state, timestep = self._env.step(state.env_state, self.jumanji_action(action))
        last = timestep.last()
        terminated = last & (timestep.discount == 0)
        next_state = JumanjiState(env_state, state.time + 1, last & ~terminated)
        return (
            self.flatten_observation(timestep.observation),
            next_state,
            timestep.reward,
            terminated,
            {},
        )

    def truncation(self, state: JumanjiState, params) -> jax.Array:
        return state.cut | (state.time >= params.max_steps_in_episode)

    def render(self, state: JumanjiState, params=None) -> np.ndarray:
        """uint8 [H, W, 3]: the env's matplotlib viewer drawn into an array."""
        from jumanji.viewer import MatplotlibViewer

        viewer = getattr(self._env, "_viewer", None) or getattr(self._env, "_env_viewer", None)
        if not isinstance(viewer, MatplotlibViewer):
            raise ValueError(
                f"{self.name} cannot render to an array (its viewer {type(viewer).__name__} is "
                "not a matplotlib viewer)"
            )
        display = viewer._display
        viewer._display = (
            viewer._display_rgb_array
        )  # draw into an array, whatever render_mode it was made with
        try:
            frame = viewer.render(state.env_state)
        finally:
            viewer._display = display
        return np.asarray(frame)[..., :3].astype(np.uint8)

    def __repr__(self) -> str:
        return f"envs.make({self.name!r})"


def make(env_id: str, **kwargs) -> tuple[Jumanji, JumanjiParams]:
    """(env, params) for `envs.make("jumanji:<id>", **kwargs)`: `max_steps_in_episode` goes to the
    params, every other keyword to Jumanji's constructor."""
    limit = {k: kwargs.pop(k) for k in ("max_steps_in_episode",) if k in kwargs}
    env = Jumanji(env_id, **kwargs)
    return env, env.make_params(**limit)
