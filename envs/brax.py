"""Brax environments behind the Env contract (the `brax` extra: pip install "fusedrl[brax]").

    env, params = envs.make("brax:ant", backend="mjx")  # any name of brax.envs, any backend
    env, params = envs.make(
        "brax:halfcheetah", backend="positional", episode_length=500, action_repeat=2
    )

The env is Brax's own (`brax.envs.get_environment(name, backend=..., **kwargs)`: every env Brax
registers, on every backend it offers: mjx, generalized, positional, spring), without Brax's
training wrappers; this adapter does their work under the Env contract:

  * `action_repeat` (params, static) and `episode_length` (params) as Brax's `EpisodeWrapper`: a
    step applies the action `action_repeat` times and returns the summed reward; it *terminates*
    when the env's own `done` is set after the last repeat, and is *truncated* (not terminated) when
    `action_repeat * steps >= episode_length` and it did not terminate. `state.time` counts agent
    steps, so `params.max_steps_in_episode` is ceil(episode_length / action_repeat).
  * Auto-reset (`auto_reset`, a keyword of `make`): "fresh" (the default) starts every episode from
    `env.reset` with the step's reset key, as every fusedrl env does; "first" is Brax's
    `AutoResetWrapper`: an env restarts from the state its first episode began in (no new
    randomness, one reset less per step; what `brax.training` does). Either way `info["final_obs"]`
    holds the observation the step reached, and `info` holds the env's metrics (`state.metrics`).
  * Spaces: observations a Box of the env's observation size (unbounded); actions a Box from the
    actuators' control range (unbounded where an actuator is not control-limited). Actions are
    clipped into it (Brax's backends clip the control there anyway; rewards then see the clipped
    action).
  * `render(state, params)` draws the state with MuJoCo's renderer, off screen: without a display
    (and with MUJOCO_GL unset) this module sets MUJOCO_GL before it imports Brax: "egl" where libEGL
    is installed (Mesa's software EGL will do), else "osmesa" where libOSMesa is, else "disable"
    (MuJoCo would otherwise fail at import on the missing library, training included). Where no
    OpenGL context can be made, `render` raises a RuntimeError saying so.

`state.env_state` is Brax's `State`, so it can be handed to Brax code (and back).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes.util
import io
import os
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs.core import Env, import_extra
from envs.spaces import Box, is_concrete

EXTRA = "brax"
AUTO_RESETS = ("fresh", "first")


def headless_mujoco_gl(find_library=ctypes.util.find_library) -> str:
    """The MUJOCO_GL for a machine without a display: "egl" if libEGL can be loaded, else "osmesa"
    if libOSMesa can, else "disable" (no off-screen rendering; MuJoCo then imports without
    either)."""
    if find_library("EGL"):
        return "egl"
    if find_library("OSMesa"):
        return "osmesa"
    return "disable"


def _brax_envs(user: str = "brax:<name>"):
    """`brax.envs`, imported (MissingExtraError naming the extra when it is not installed).

    What the import prints is dropped: `mujoco.mjx` prints "Failed to import warp" (and
    "... mujoco_warp") on stdout whenever its optional Warp backend is absent, which is not an
    error (Brax runs on the JAX backend), and stdout and stderr belong to the caller (`rl` prints
    results on one and one-line errors on the other). A failed import still raises.
    """
    if "MUJOCO_GL" not in os.environ and not os.environ.get("DISPLAY"):
        os.environ["MUJOCO_GL"] = (
            headless_mujoco_gl()
        )  # MuJoCo picks its OpenGL platform when it is imported
    if "brax.envs" in sys.modules:
        return sys.modules["brax.envs"]
    with contextlib.redirect_stdout(io.StringIO()):
        return import_extra("brax.envs", EXTRA, user)


def ids() -> list[str]:
    """The names Brax registers (ImportError if Brax is not installed)."""
    return sorted(_brax_envs()._envs)


@struct.dataclass
class BraxParams:
    episode_length: int = 1000
    action_repeat: int = struct.field(pytree_node=False, default=1)

    @property
    def max_steps_in_episode(self):
        """Agent steps per episode at most: ceil(episode_length / action_repeat)."""
        return -(-self.episode_length // self.action_repeat)


@struct.dataclass
class BraxState:
    env_state: Any  # brax.envs.State
    time: jax.Array  # agent steps taken in this episode
    first: Any = None  # auto_reset="first": the env_state the first episode began in


class Brax(Env):
    """One Brax env (see the module docstring)."""

    def __init__(
        self, name: str, backend: str | None = None, auto_reset: str = "fresh", **env_kwargs
    ):
        benvs = _brax_envs(f"brax:{name}")
        if name not in benvs._envs:
            raise ValueError(
                f"unknown Brax env {name!r}; Brax has: {', '.join(sorted(benvs._envs))}"
            )
        if auto_reset not in AUTO_RESETS:
            raise ValueError(
                f"brax:{name}: auto_reset must be one of {list(AUTO_RESETS)}, got {auto_reset!r}"
            )
        kwargs = dict(env_kwargs, **({} if backend is None else {"backend": backend}))
        try:
            self._env = benvs.get_environment(name, **kwargs)
        except TypeError as error:  # an argument the env's constructor does not take
            raise ValueError(f"brax:{name}: {error}") from None
        self.name = f"brax:{name}"
        self.auto_reset_mode = auto_reset
        self.backend = self._env.backend
        obs = jax.eval_shape(self._env.reset, jax.random.key(0)).obs
        if not isinstance(obs, jax.ShapeDtypeStruct) or len(obs.shape) != 1:
            raise ValueError(f"{self.name}: only flat array observations are supported, got {obs}")
        self._obs_space = Box(-np.inf, np.inf, obs.shape)
        sys = self._env.sys
        ctrl_range = np.asarray(sys.actuator.ctrl_range, np.float32).reshape(-1, 2)
        limited = np.asarray(getattr(sys, "actuator_ctrllimited", np.ones(len(ctrl_range))), bool)
        low = np.where(limited, ctrl_range[:, 0], -np.inf).astype(np.float32)
        high = np.where(limited, ctrl_range[:, 1], np.inf).astype(np.float32)
        self._action_space = Box(low, high, (self._env.action_size,))
        self._renderer = None

    @property
    def default_params(self) -> BraxParams:
        return BraxParams()

    def make_params(self, **overrides) -> BraxParams:
        params = super().make_params(**overrides)
        repeat, length = params.action_repeat, params.episode_length
        if isinstance(repeat, bool) or not isinstance(repeat, (int, np.integer)) or repeat < 1:
            raise ValueError(f"{self.name}: action_repeat must be an integer >= 1, got {repeat!r}")
        if is_concrete(length) and (
            np.ndim(length) or not np.issubdtype(np.asarray(length).dtype, np.integer) or length < 1
        ):
            raise ValueError(f"{self.name}: episode_length must be an integer >= 1, got {length!r}")
        return params

    @property
    def brax_env(self):
        """Brax's own env object (no training wrappers)."""
        return self._env

    def observation_space(self, params=None) -> Box:
        return self._obs_space

    def action_space(self, params=None) -> Box:
        return self._action_space

    def reset_env(self, key, params):
        env_state = self._env.reset(key)
        first = env_state if self.auto_reset_mode == "first" else None
        return env_state.obs, BraxState(env_state=env_state, time=jnp.int32(0), first=first)

    def step_env(self, key, state: BraxState, action, params):
        action = jnp.clip(action, self._action_space._low, self._action_space._high)

        def repeat(env_state, _):
            env_state = self._env.step(env_state, action)
            return env_state, env_state.reward

        env_state, rewards = jax.lax.scan(
            repeat, state.env_state, None, length=params.action_repeat
        )
        env_state = env_state.replace(reward=jnp.sum(rewards, axis=0))
        terminated = env_state.done > 0
        next_state = state.replace(env_state=env_state, time=state.time + 1)
        return env_state.obs, next_state, env_state.reward, terminated, dict(env_state.metrics)

    def auto_reset(self, key, final_state: BraxState, params):
        if self.auto_reset_mode == "fresh":
            return self.reset_env(key, params)
        return final_state.first.obs, final_state.replace(
            env_state=final_state.first, time=jnp.zeros_like(final_state.time)
        )

    def render(
        self,
        state: BraxState,
        params=None,
        height: int = 240,
        width: int = 320,
        camera: int | str = -1,
    ) -> np.ndarray:
        """uint8 [height, width, 3]: MuJoCo's off-screen renderer on one (unbatched) state."""
        import mujoco

        model = self._env.sys.mj_model
        if self._renderer is None or (self._renderer.height, self._renderer.width) != (
            height,
            width,
        ):
            # Triton's LLVM must be loaded before Mesa's (software OpenGL):
            # the other order crashes the process
            try:
                import triton  # noqa: F401
            except ImportError:
                pass
            try:
                self._renderer = mujoco.Renderer(model, height=height, width=width)
                atexit.register(
                    self._renderer.close
                )  # before interpreter teardown, which its __del__ trips over
            except Exception as error:  # no OpenGL platform: mujoco raises several kinds
                raise RuntimeError(
                    f"{self.name}: rendering needs an OpenGL context for MuJoCo and none could "
                    f"be made (MUJOCO_GL={os.environ.get('MUJOCO_GL', '')!r}; "
                    "set MUJOCO_GL=egl or osmesa before importing brax or mujoco, "
                    f"with libEGL or libOSMesa installed): {error}"
                ) from error
        pipeline_state = state.env_state.pipeline_state
        data = mujoco.MjData(model)
        data.qpos, data.qvel = np.asarray(pipeline_state.q), np.asarray(pipeline_state.qd)
        mujoco.mj_forward(model, data)
        self._renderer.update_scene(data, camera=camera)
        return np.asarray(self._renderer.render(), np.uint8)

    def __repr__(self) -> str:
        return (
            f"envs.make({self.name!r}, backend={self.backend!r}, "
            f"auto_reset={self.auto_reset_mode!r})"
        )


def make(name: str, **kwargs) -> tuple[Brax, BraxParams]:
    """(env, params) for `envs.make("brax:<name>", **kwargs)`: `episode_length` and `action_repeat`
    go to the params, `backend`, `auto_reset` and every other keyword to the env
    (Brax's constructor)."""
    fields = ("episode_length", "action_repeat")
    env = Brax(name, **{k: v for k, v in kwargs.items() if k not in fields})
    return env, env.make_params(**{k: v for k, v in kwargs.items() if k in fields})
