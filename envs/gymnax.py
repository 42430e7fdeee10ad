"""gymnax's envs (MinAtar, bsuite, classic control, misc) under fusedrl's Env contract.

    env, params = envs.make("gymnax:Breakout-MinAtar")  # any id of gymnax.registered_envs
    env, params = envs.make("gymnax:MemoryChain-bsuite", memory_length=10)  # params fields ...
    env, params = envs.make(  # ... or constructor keywords
        "gymnax:Breakout-MinAtar", use_minimal_action_set=False
    )

Needs the `gymnax` extra (`pip install "fusedrl[gymnax]"`); without it `make` raises
`envs.core.MissingExtraError` naming the extra, as does `ids()`. gymnax is imported
on first use, never by `import envs`.

The mapping (gymnax >= 1.0, whose `step` returns `terminated` and `truncated` apart):
  * `reset` and `step` are gymnax's own (`env.reset`, `env.step`: its auto-reset, its key split, its
    per-env step overrides such as DeepSea's), so the same keys give the same numbers as gymnax.
  * `terminated` is gymnax's; `truncated` is gymnax's `truncated and not terminated` (fusedrl's
    rule, envs/core.py: an episode that terminates on its last allowed step is terminated, not
    truncated; gymnax reports both then). Both come back as bool scalars, the reward as float32.
  * `info["final_obs"]` is gymnax's `info["final_observation"]` (the observation the transition
    reached, before any auto-reset); gymnax's duplicate `terminated` / `truncated` /
    `final_observation` entries are dropped, its other entries (`discount`, ...) kept. Observations
    keep gymnax's dtype.
  * `reset_env` / `step_env` are gymnax's (the transition without auto-reset), for code that steps
    an episode by hand (rl.cli.evaluate).
  * params are gymnax's `EnvParams` pytree, passed through unchanged: vmap over any field that
    gymnax reads as an array (`max_steps_in_episode`, MemoryChain's `memory_length`, ...). Keyword
    arguments of `make` are fields of `EnvParams` or, for what fixes shapes (MemoryChain's
    `num_bits`, DeepSea's `size`, MinAtar's `use_minimal_action_set`), keywords of the env's
    constructor.
  * Spaces: gymnax's `Discrete` and `Box` become `envs.spaces.Discrete` / `Box` (same n, bounds,
    shape, dtype). Where gymnax computes a bound with JAX ops, it is traced inside jit (even from
    constant params) and under a vmap over params: the space then falls back to the default params'
    space, converted when the env is made, as fusedrl's own envs fall back to their default bounds.
    Dict/Tuple observation spaces (none of the built-in ids has one) raise ValueError.
  * Rendering: the MinAtar games render (`envs.render`) as gymnax's own MinAtar viewer draws them
    (each cell coloured by its highest set channel, seaborn's cubehelix palette, black background),
    here straight into a NumPy image, `cell_pixels` per cell, with no matplotlib figure. gymnax
    draws its other envs with matplotlib figures or gymnasium's pygame renderer: those ids have no
    `render` method here.
"""

from __future__ import annotations

import difflib
import inspect
from functools import cached_property
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from envs.core import Env, import_extra
from envs.spaces import Box, Discrete, check_action, is_concrete

EXTRA = "gymnax"
PREFIX = "gymnax:"
# gymnax's info entries that fusedrl's step returns as values (or renames to "final_obs").
_DUPLICATE_INFO = ("terminated", "truncated", "final_observation")


def _gymnax():
    return import_extra("gymnax", EXTRA, "gymnax:<id>")


def ids() -> list[str]:
    """gymnax's registered ids (without the "gymnax:" prefix); MissingExtraError without gymnax."""
    return sorted(_gymnax().registered_envs)


def constructor_keywords(cls) -> list[str]:
    """The keyword parameters of `cls.__init__` (self, *args and **kwargs excluded)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return [p.name for p in parameters if p.kind in kinds]


def make(env_id: str, **overrides: Any) -> tuple["GymnaxEnv", Any]:
    """(env, params) for the gymnax id `env_id` (no prefix). Each override is a constructor keyword
    of the gymnax env or a field of its params; ValueError for an unknown id or name."""
    gymnax = _gymnax()
    known = sorted(gymnax.registered_envs)
    if env_id not in known:
        close = difflib.get_close_matches(str(env_id), known, n=1)
        hint = f" Did you mean '{PREFIX}{close[0]}'?" if close else ""
        raise ValueError(f"unknown gymnax id {env_id!r}.{hint} gymnax ids: {', '.join(known)}")
    gymnax_env, _ = gymnax.make(env_id)
    keywords = constructor_keywords(type(gymnax_env))
    construct = {name: value for name, value in overrides.items() if name in keywords}
    if construct:
        gymnax_env, _ = gymnax.make(env_id, **construct)
    env = (GymnaxMinAtarEnv if env_id.endswith("-MinAtar") else GymnaxEnv)(
        env_id, gymnax_env, keywords
    )
    return env, env.make_params(
        **{name: value for name, value in overrides.items() if name not in construct}
    )


def to_space(space, name: str):
    """fusedrl's Discrete / Box for a gymnax Discrete / Box; None if a bound or n is traced."""
    gymnax_spaces = import_extra("gymnax.environments.spaces", EXTRA, "gymnax:<id>")
    if isinstance(space, gymnax_spaces.Discrete):
        return (
            Discrete(int(space.n), dtype=jnp.dtype(space.dtype)) if is_concrete(space.n) else None
        )
    if isinstance(space, gymnax_spaces.Box):
        if not (is_concrete(space.low) and is_concrete(space.high)):
            return None
        return Box(
            low=np.asarray(space.low),
            high=np.asarray(space.high),
            shape=tuple(space.shape),
            dtype=jnp.dtype(space.dtype),
        )
    raise ValueError(
        f"{name}: gymnax space {space!r} has no fusedrl equivalent "
        "(only Discrete and Box are mapped)"
    )


class GymnaxEnv(Env):
    """A gymnax env behind fusedrl's Env contract (see the module docstring)."""

    def __init__(self, env_id: str, gymnax_env, constructor_keywords: list[str] = ()):
        self.env_id = env_id
        self.gymnax_env = gymnax_env
        self.constructor_keywords = list(constructor_keywords)
        self.name = PREFIX + env_id
        # The default params' spaces, converted now, outside any trace (inside jit even constant
        # bounds come out traced): what a space with traced bounds falls back to.
        default = gymnax_env.default_params
        self._default_spaces = {
            "observation": to_space(gymnax_env.observation_space(default), self.name),
            "action": to_space(gymnax_env.action_space(default), self.name),
        }

    @property
    def default_params(self) -> Any:
        return self.gymnax_env.default_params

    def make_params(self, **overrides: Any) -> Any:
        """The default params with some fields replaced; ValueError naming unknown fields (and the
        constructor keywords, which `envs.make` also takes)."""
        try:
            return super().make_params(**overrides)
        except ValueError as err:
            raise ValueError(f"{err}; constructor keywords: {self.constructor_keywords}") from None

    # ---- the contract

    def reset(self, key: jax.Array, params: Any = None):
        params = self.default_params if params is None else params
        return self.gymnax_env.reset(key, params)

    def step(self, key: jax.Array, state: Any, action: Any, params: Any = None):
        params = self.default_params if params is None else params
        action = check_action(self.action_space(params), action, self.name)
        obs, state, reward, terminated, truncated, info = self.gymnax_env.step(
            key, state, action, params
        )
        terminated = jnp.asarray(terminated, jnp.bool_)
        truncated = jnp.logical_and(jnp.asarray(truncated, jnp.bool_), jnp.logical_not(terminated))
        out_info = {k: v for k, v in info.items() if k not in _DUPLICATE_INFO}
        out_info["final_obs"] = info["final_observation"]
        return obs, state, jnp.asarray(reward, jnp.float32), terminated, truncated, out_info

    def reset_env(self, key: jax.Array, params: Any):
        return self.gymnax_env.reset_env(key, params)

    def step_env(self, key: jax.Array, state: Any, action: Any, params: Any):
        obs, state, reward, terminated, info = self.gymnax_env.step_env(key, state, action, params)
        return (
            obs,
            state,
            jnp.asarray(reward, jnp.float32),
            jnp.asarray(terminated, jnp.bool_),
            info,
        )

    # ---- spaces

    def observation_space(self, params: Any):
        space = to_space(self.gymnax_env.observation_space(params), self.name)
        return self._default_spaces["observation"] if space is None else space

    def action_space(self, params: Any):
        space = to_space(self.gymnax_env.action_space(params), self.name)
        return self._default_spaces["action"] if space is None else space

    def __repr__(self) -> str:
        return f"GymnaxEnv({self.env_id!r})"


class GymnaxMinAtarEnv(GymnaxEnv):
    """A MinAtar game of gymnax: a GymnaxEnv that renders."""

    @cached_property
    def _observe(self):
        key = jax.random.key(0)  # MinAtar observations are deterministic in the state
        return jax.jit(lambda state, params: self.gymnax_env.observe(key, state, None, params))

    @cached_property
    def palette(self) -> np.ndarray:
        """uint8 [channels + 1, 3]: black, then gymnax's viewer colours of the channels
        (cubehelix)."""
        import seaborn  # a dependency of gymnax

        channels = self.observation_space(self.default_params).shape[-1]
        colours = np.asarray([(0.0, 0.0, 0.0)] + list(seaborn.color_palette("cubehelix", channels)))
        return np.round(colours * 255).astype(np.uint8)

    def render(self, state: Any, params: Any, cell_pixels: int = 16) -> np.ndarray:
        """uint8 [rows * cell_pixels, cols * cell_pixels, 3]: each cell in the colour of its highest
        set channel (channel c -> palette[c + 1]), black where no channel is set."""
        obs = np.asarray(self._observe(state, params))
        channels = obs.shape[-1]
        index = np.max((obs > 0) * np.arange(1, channels + 1), axis=-1)
        image = self.palette[index]
        return np.repeat(np.repeat(image, cell_pixels, axis=0), cell_pixels, axis=1)

    def __repr__(self) -> str:
        return f"GymnaxMinAtarEnv({self.env_id!r})"
