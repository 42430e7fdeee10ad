"""Craftax behind the Env contract (the `craftax` extra: pip install "fusedrl[craftax]").

    env, params = envs.make("craftax:Craftax-Classic-Symbolic-v1")
    # any field of Craftax's EnvParams:
    env, params = envs.make("craftax:Craftax-Symbolic-v1", max_timesteps=5000)

Ids: Craftax-Symbolic-v1, Craftax-Pixels-v1, Craftax-Classic-Symbolic-v1, Craftax-Classic-Pixels-v1,
through Craftax's own gymnax-style env (`craftax.craftax_env.make_craftax_env_from_name(id,
auto_reset=False)`: its `reset_env` / `step_env`).

  * Episode ends: Craftax's `done` joins its time limit (`timestep >= max_timesteps`) to the ends of
    the game (death, lava, the final boss); here the time limit is *truncation*: `terminated` is
    Craftax's own `is_terminal` with the time limit lifted, and `truncated` is the time limit
    reached without such an end. `terminated | truncated` is Craftax's `done`, and a step equals
    Craftax's own auto-resetting env (`auto_reset=True`) step for step with the same key
    (obs, state, reward).
  * Params are Craftax's `EnvParams` (a subclass adding `max_steps_in_episode = max_timesteps`), so
    `make(..., **overrides)` takes its fields and they stay a pytree.
  * Spaces: Discrete(17) or Discrete(43) actions; observations a Box in [0, 1]: flat for the
    symbolic ids (1345 classic, 8268 full), [H, W, 3] images for the pixel ids.
  * `info` holds Craftax's achievements, score and discount.
  * `render(state, params)` draws the state as Craftax's pixel renderer does (16 pixels a block, no
    display); the first call loads Craftax's textures, which takes a while the first time it ever
    runs.
  * Textures (pixel ids and `render`) load through `load_textures`: one process at a time builds
    Craftax's on-disk texture cache, so parallel processes (test workers, runs started together)
    never read a half-written one, and a cache left truncated is rebuilt.

`state.env_state` is Craftax's `EnvState`.
"""

from __future__ import annotations

import functools
import os
import pickle
from typing import Any

import jax
import numpy as np
from flax import struct

from envs.core import Env, import_extra
from envs.spaces import Box, Discrete

EXTRA = "craftax"
IDS = (
    "Craftax-Symbolic-v1",
    "Craftax-Pixels-v1",
    "Craftax-Classic-Symbolic-v1",
    "Craftax-Classic-Pixels-v1",
)
NO_TIME_LIMIT = np.iinfo(np.int32).max


def ids() -> list[str]:
    """The Craftax ids (ImportError if Craftax is not installed)."""
    import_extra("craftax", EXTRA, "craftax:<id>")
    return list(IDS)


@functools.lru_cache(maxsize=None)
def params_class(env_params_class: type) -> type:
    """Craftax's EnvParams class with `max_steps_in_episode`
    (the Env contract's name for the limit)."""

    @struct.dataclass
    class CraftaxParams(env_params_class):
        @property
        def max_steps_in_episode(self):
            return self.max_timesteps

    CraftaxParams.__name__ = CraftaxParams.__qualname__ = (
        f"Craftax{'Classic' if 'classic' in env_params_class.__module__ else ''}Params"
    )
    return CraftaxParams


@struct.dataclass
class CraftaxState:
    env_state: Any  # Craftax's EnvState

    @property
    def time(self):
        """Steps taken in this episode (Craftax's `timestep`)."""
        return self.env_state.timestep


CORRUPT_CACHE_ERRORS = (EOFError, OSError, pickle.UnpicklingError, KeyError, ValueError, TypeError)


def load_textures(constants) -> None:
    """Craftax's texture atlas, `constants.load_all_textures()` (memoised per process by Craftax),
    loaded under an exclusive lock on `<constants.TEXTURE_CACHE_FILE>.lock`.

    Craftax writes its on-disk cache in place on first use, so without the lock a second process
    can read the file while the first is writing it and fail (EOFError from bz2). Under the lock,
    a cache file that does not load (left truncated by a writer that was killed) is removed and
    rebuilt. Where the lock file cannot be created (a read-only install), the load runs unlocked.
    """
    path = constants.TEXTURE_CACHE_FILE
    try:
        import fcntl

        lock = open(path + ".lock", "a")
    except (ImportError, OSError):
        fcntl, lock = None, None
    try:
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            constants.load_all_textures()
        except CORRUPT_CACHE_ERRORS:
            if not os.path.exists(path):
                raise
            os.remove(path)
            constants.load_all_textures()
    finally:
        if lock is not None:
            lock.close()  # releases the lock


def _craftax_modules(classic: bool, name: str):
    """(renderer, constants) modules of Craftax-Classic or of Craftax."""
    module = "craftax.craftax_classic" if classic else "craftax.craftax"
    return import_extra(f"{module}.renderer", EXTRA, name), import_extra(
        f"{module}.constants", EXTRA, name
    )


def _space(space):
    """Ours for a Craftax (gymnax-style) Discrete or Box space."""
    if hasattr(space, "n"):
        return Discrete(int(space.n))
    return Box(space.low, space.high, tuple(space.shape))


class Craftax(Env):
    """One Craftax env (see the module docstring)."""

    def __init__(self, env_id: str):
        import_extra("craftax", EXTRA, f"craftax:{env_id}")
        from craftax.craftax_env import make_craftax_env_from_name

        if env_id not in IDS:
            raise ValueError(f"unknown Craftax id {env_id!r}; Craftax ids: {', '.join(IDS)}")
        self.name = f"craftax:{env_id}"
        self.classic = "Classic" in env_id
        if "Pixels" in env_id:  # its constructor builds a pixel renderer, which loads the textures
            load_textures(_craftax_modules(self.classic, self.name)[1])
        self._env = make_craftax_env_from_name(env_id, auto_reset=False)
        base_params = self._env.default_params
        self._default_params = params_class(type(base_params))(
            **{f: getattr(base_params, f) for f in base_params.__dataclass_fields__}
        )
        self._obs_space = _space(self._env.observation_space(base_params))
        self._action_space = _space(self._env.action_space(base_params))

    @property
    def craftax_env(self):
        """Craftax's own env object (no auto-reset)."""
        return self._env

    @property
    def default_params(self):
        return self._default_params

    def observation_space(self, params=None) -> Box:
        return self._obs_space

    def action_space(self, params=None) -> Discrete:
        return self._action_space

    def reset_env(self, key, params):
        obs, env_state = self._env.reset_env(key, params)
        return obs, CraftaxState(env_state)

    def step_env(self, key, state: CraftaxState, action, params):
        obs, env_state, reward, _, info = self._env.step_env(key, state.env_state, action, params)
        terminated = self._env.is_terminal(env_state, params.replace(max_timesteps=NO_TIME_LIMIT))
        return obs, CraftaxState(env_state), reward, terminated, info

    @functools.cached_property
    def _render_pixels(self):
        renderer, constants = _craftax_modules(self.classic, self.name)
        load_textures(constants)
        return jax.jit(renderer.make_craftax_pixel_renderer(constants.BLOCK_PIXEL_SIZE_IMG))

    def render(self, state: CraftaxState, params=None) -> np.ndarray:
        """uint8 [H, W, 3]: Craftax's pixel renderer at 16 pixels a block."""
        pixels = np.asarray(self._render_pixels(state.env_state))
        return np.clip(np.rint(pixels), 0, 255).astype(np.uint8)

    def __repr__(self) -> str:
        return f"envs.make({self.name!r})"


def make(env_id: str, **overrides) -> tuple[Craftax, Any]:
    """(env, params) for `envs.make("craftax:<id>", **overrides)`; the overrides are fields of
    Craftax's EnvParams (max_timesteps, day_length, ...)."""
    env = Craftax(env_id)
    return env, env.make_params(**overrides)
