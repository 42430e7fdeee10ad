"""MuJoCo Playground's tasks behind the Env contract
(the `playground` extra: pip install "fusedrl[playground]").

    env, params = envs.make("playground:CartpoleBalance")  # any name of Playground's registry
    env, params = envs.make("playground:CheetahRun", episode_length=500, action_repeat=2)
    env, params = envs.make(  # any top-level key of the task's config, or dotted keys
        "playground:Go1JoystickFlatTerrain", Kp=40.0, config_overrides={"noise_config.level": 0.0}
    )

The env is Playground's own task object (`mujoco_playground.registry.load(name, config_overrides=
...)`), without its training wrappers; this adapter does their work under the Env contract:

  * Time limit and action repeat, from the task's config (`episode_length`, `action_repeat`; a
    keyword of `make` replaces either, in the params and in the task's config alike): a step applies
    the action `action_repeat` times and returns the summed reward, as the `EpisodeWrapper` that
    Playground's `wrap_for_brax_training` puts around a task. It *terminates* when the task's own
    `done` is set after the last repeat, and is *truncated* (not terminated) when
    `action_repeat * steps >= episode_length` and it did not terminate: that wrapper's
    `info["truncation"]`. `state.time` counts agent steps, so `params.max_steps_in_episode` is
    ceil(episode_length / action_repeat). Two tasks (PandaPickCubeCartesian, AlohaHandOver) also
    end themselves at their config's `episode_length`, counting `info["_steps"]`, through `done`:
    that end is truncated here too (where a real termination falls on the same step, Playground
    has merged the two and it reads as truncated). `params.episode_length` may be traced (vmapped);
    those two tasks' own count keeps the value given to `make`.
  * Auto-reset: every episode starts from the task's `reset` with the step's reset key, as every
    fusedrl env does (Playground's training wrapper instead restarts from the first episode's
    state by default). `info["final_obs"]` holds the observation the step reached, and `info` the
    task's metrics (`state.metrics`: its reward terms).
  * Observations: a Box of the task's observation size (unbounded). Where a task's observation is a
    dict (the locomotion and manipulation tasks with privileged critic inputs), the policy
    observation `obs["state"]` is used and the other entries are dropped; a dict with no "state"
    entry (the pixel observations of `vision=True`) raises ValueError at `make`.
  * Actions: Box(-1, 1) of the task's `action_size`, Playground's convention (its tasks scale
    [-1, 1] to their actuators: the DM Control suite's control range is [-1, 1], the locomotion
    tasks add `action * action_scale` to a default pose). Actions are clipped into it.
  * MJX implementation: `impl="jax"` (MJX's pure-JAX one, which compiles into one XLA program on any
    backend and vmaps) unless `impl=` says otherwise; Playground's configs mostly default to "warp"
    (NVIDIA Warp kernels).
  * Assets: the locomotion and manipulation tasks read robot models from MuJoCo Menagerie at
    `mujoco_playground._src.mjx_env.MENAGERIE_PATH` (inside the installed package), which Playground
    clones from GitHub on first use. This adapter never clones: without that folder (or with robot
    files missing from it) `make` raises `MissingAssetsError` naming the path and the commit
    Playground expects. The DM Control suite's models ship inside the package.
  * `render(state, params)` draws one state with MuJoCo's off-screen renderer (see envs/brax.py for
    how MUJOCO_GL is chosen without a display).

`state.env_state` is Playground's `State`, so it can be handed to Playground code (and back).
"""

from __future__ import annotations

import contextlib
import difflib
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

EXTRA = "playground"
PREFIX = "playground:"
# Keywords of `make` that set the params (and the task's config entries of the same name).
PARAM_FIELDS = ("episode_length", "action_repeat")
DEFAULT_IMPL = "jax"
# The task-side step counter of the tasks that end themselves at their episode_length.
OWN_STEP_COUNTER = "_steps"


class MissingAssetsError(ValueError):
    """A Playground task's model files (MuJoCo Menagerie's robots) are not on this machine; the
    message names the path Playground reads them from and how to put them there."""


def _registry(user: str = "playground:<name>"):
    """`mujoco_playground.registry`, imported (MissingExtraError naming the extra without it).

    MUJOCO_GL is set first where there is no display, as envs/brax.py does; what the import prints
    on stdout (MJX's notes on its optional Warp backend) is dropped.
    """
    if "MUJOCO_GL" not in os.environ and not os.environ.get("DISPLAY"):
        from envs.brax import headless_mujoco_gl

        os.environ["MUJOCO_GL"] = headless_mujoco_gl()
    if "mujoco_playground._src.registry" in sys.modules:
        return sys.modules["mujoco_playground._src.registry"]
    with contextlib.redirect_stdout(io.StringIO()):
        import_extra("mujoco_playground", EXTRA, user)
        return import_extra("mujoco_playground._src.registry", EXTRA, user)


def ids() -> list[str]:
    """Playground's task names (MissingExtraError without the extra)."""
    return sorted(_registry().ALL_ENVS)


def needs_menagerie(name: str) -> bool:
    """Whether Playground loads task `name` from MuJoCo Menagerie (its locomotion and manipulation
    tasks do; the DM Control suite's models ship in the package)."""
    registry = _registry()
    return name in registry.locomotion.ALL_ENVS or name in registry.manipulation.ALL_ENVS


def menagerie_error(name: str, problem: str) -> MissingAssetsError:
    """The error for task `name` whose Menagerie files are unusable (`problem` says how): the path
    and commit Playground expects, and how to put them there."""
    mjx_env = sys.modules["mujoco_playground._src.mjx_env"]
    path, commit = mjx_env.MENAGERIE_PATH, mjx_env.MENAGERIE_COMMIT_SHA
    return MissingAssetsError(
        f"{PREFIX}{name} needs MuJoCo Menagerie's robot models (commit {commit}) at {path}: "
        f"{problem}. Playground clones them there from GitHub on first use; this adapter never "
        f"downloads. With network access: git clone "
        f"https://github.com/google-deepmind/mujoco_menagerie {path} && git -C {path} checkout "
        f"{commit} (or link that path to such a clone). The DM Control suite's tasks "
        "(CartpoleBalance, CheetahRun, ...) ship with Playground"
    )


def check_assets(name: str) -> None:
    """MissingAssetsError if task `name` needs the Menagerie and its folder is absent."""
    if not needs_menagerie(name):
        return
    mjx_env = sys.modules["mujoco_playground._src.mjx_env"]
    if not os.path.isdir(str(mjx_env.MENAGERIE_PATH)):
        raise menagerie_error(name, "the folder does not exist")


def load(name: str, config_overrides: dict[str, Any]):
    """Playground's task `name` with `config_overrides` (dotted keys of its config): clear errors
    for an unknown name (ValueError with the closest name), an unknown config key (ValueError
    listing the task's keys) and missing Menagerie files (MissingAssetsError)."""
    registry = _registry(f"{PREFIX}{name}")
    known = sorted(registry.ALL_ENVS)
    if name not in known:
        close = difflib.get_close_matches(str(name), known, n=1)
        hint = f" Did you mean '{PREFIX}{close[0]}'?" if close else ""
        raise ValueError(
            f"unknown Playground task {name!r}.{hint} Playground's tasks: {', '.join(known)}"
        )
    config = registry.get_default_config(name)
    unknown = sorted(key for key in config_overrides if not has_key(config, key))
    if unknown:
        raise ValueError(
            f"{PREFIX}{name}: unknown keyword(s) {unknown}: neither a param "
            f"({', '.join(PARAM_FIELDS)}) nor a key of the task's config "
            f"({', '.join(sorted(config.keys()))}; dotted keys through config_overrides=)"
        )
    check_assets(name)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return registry.load(name, config_overrides=config_overrides or None)
    except TypeError as error:  # a config value of the wrong type (ml_collections checks them)
        raise ValueError(f"{PREFIX}{name}: {error}") from None
    except (OSError, ValueError) as error:  # MuJoCo's "could not open file" is a ValueError
        if needs_menagerie(name) and "file" in str(error).lower():
            raise menagerie_error(
                name, f"a file is missing there ({' '.join(str(error).split())})"
            ) from error
        raise


def has_key(config, dotted: str) -> bool:
    """Whether the ml_collections ConfigDict `config` has the (dotted) key `dotted`."""
    for part in dotted.split("."):
        if not hasattr(config, "keys") or part not in config.keys():
            return False
        config = config[part]
    return True


def policy_observation(obs, name: str):
    """The array a policy sees: `obs` itself, or `obs["state"]` where the task's observation is a
    dict (ValueError naming the entries when it has no "state")."""
    if isinstance(obs, dict) or hasattr(obs, "keys"):
        if "state" not in obs:
            raise ValueError(
                f"{name}: the task's observation is a dict without a 'state' entry "
                f"({sorted(obs.keys())}); only array observations or a dict's 'state' are "
                "supported (pixel observations, vision=True, are not)"
            )
        return obs["state"]
    return obs


def own_time_limit(info: dict, config) -> jax.Array:
    """Whether a task that counts its own steps (`info["_steps"]`, before the step) ends the
    episode at its config's `episode_length` with the coming step (False for the other tasks)."""
    if OWN_STEP_COUNTER not in info:
        return jnp.bool_(False)
    return info[OWN_STEP_COUNTER] + config.action_repeat >= config.episode_length


@struct.dataclass
class PlaygroundParams:
    episode_length: int = 1000
    action_repeat: int = struct.field(pytree_node=False, default=1)

    @property
    def max_steps_in_episode(self):
        """Agent steps per episode at most: ceil(episode_length / action_repeat)."""
        return -(-self.episode_length // self.action_repeat)


@struct.dataclass
class PlaygroundState:
    env_state: Any  # mujoco_playground.State
    time: jax.Array  # agent steps taken in this episode
    cut: jax.Array  # bool: the task ended the episode at its own time limit (see own_time_limit)


class Playground(Env):
    """One Playground task (see the module docstring)."""

    def __init__(self, name: str, playground_env, params: PlaygroundParams):
        self.name = PREFIX + name
        self.task = name
        self._env = playground_env
        self._default_params = params
        obs = jax.eval_shape(playground_env.reset, jax.random.key(0)).obs
        obs = policy_observation(obs, self.name)
        if len(obs.shape) != 1:
            raise ValueError(f"{self.name}: only flat observations are supported, got {obs.shape}")
        self._obs_space = Box(-np.inf, np.inf, tuple(obs.shape))
        self._action_space = Box(-1.0, 1.0, (int(playground_env.action_size),))

    @property
    def playground_env(self):
        """Playground's own task object (no training wrappers)."""
        return self._env

    @property
    def default_params(self) -> PlaygroundParams:
        return self._default_params

    def make_params(self, **overrides) -> PlaygroundParams:
        params = super().make_params(**overrides)
        repeat, length = params.action_repeat, params.episode_length
        if isinstance(repeat, bool) or not isinstance(repeat, (int, np.integer)) or repeat < 1:
            raise ValueError(f"{self.name}: action_repeat must be an integer >= 1, got {repeat!r}")
        if is_concrete(length) and (
            np.ndim(length) or not np.issubdtype(np.asarray(length).dtype, np.integer) or length < 1
        ):
            raise ValueError(f"{self.name}: episode_length must be an integer >= 1, got {length!r}")
        return params

    def observation_space(self, params=None) -> Box:
        return self._obs_space

    def action_space(self, params=None) -> Box:
        return self._action_space

    def reset_env(self, key, params):
        env_state = self._env.reset(key)
        state = PlaygroundState(env_state=env_state, time=jnp.int32(0), cut=jnp.bool_(False))
        return policy_observation(env_state.obs, self.name), state

    def step_env(self, key, state: PlaygroundState, action, params):
        action = jnp.clip(action, self._action_space._low, self._action_space._high)
        config = self._env._config

        def repeat(env_state, _):
            cut = own_time_limit(env_state.info, config)
            env_state = self._env.step(env_state, action)
            return env_state, (env_state.reward, cut)

        env_state, (rewards, cuts) = jax.lax.scan(
            repeat, state.env_state, None, length=params.action_repeat
        )
        env_state = env_state.replace(reward=jnp.sum(rewards, axis=0))
        cut = cuts[-1]
        terminated = (env_state.done > 0) & ~cut
        next_state = state.replace(env_state=env_state, time=state.time + 1, cut=cut)
        obs = policy_observation(env_state.obs, self.name)
        return obs, next_state, env_state.reward, terminated, dict(env_state.metrics)

    def truncation(self, state: PlaygroundState, params) -> jax.Array:
        """The time limit (`time >= max_steps_in_episode`) or the task's own (`state.cut`)."""
        return (state.time >= params.max_steps_in_episode) | state.cut

    def render(
        self,
        state: PlaygroundState,
        params=None,
        height: int = 240,
        width: int = 320,
        camera: str | None = None,
    ) -> np.ndarray:
        """uint8 [height, width, 3]: MuJoCo's off-screen renderer on one (unbatched) state."""
        from mujoco_playground._src.mjx_env import render_array

        try:
            import triton  # noqa: F401  (loaded before Mesa's LLVM, as envs/brax.py explains)
        except ImportError:
            pass
        try:
            frame = render_array(self._env.mj_model, state.env_state, height, width, camera)
        except Exception as error:  # no OpenGL platform: mujoco raises several kinds
            raise RuntimeError(
                f"{self.name}: rendering needs an OpenGL context for MuJoCo and none could be "
                f"made (MUJOCO_GL={os.environ.get('MUJOCO_GL', '')!r}; set MUJOCO_GL=egl or "
                "osmesa before importing mujoco, with libEGL or libOSMesa installed): "
                f"{error}"
            ) from error
        return np.asarray(frame, np.uint8)

    def __repr__(self) -> str:
        return f"envs.make({self.name!r})"


def make(name: str, **kwargs) -> tuple[Playground, PlaygroundParams]:
    """(env, params) for `envs.make("playground:<name>", **kwargs)`.

    `episode_length` and `action_repeat` set the params and the task's config entries;
    `config_overrides` (a dict of dotted keys) and every other keyword (a top-level key of the
    task's config: `impl`, `ctrl_dt`, ...) go to the task's config. `impl` defaults to "jax".
    """
    overrides = dict(kwargs.pop("config_overrides", None) or {})
    overrides.update(kwargs)
    if overrides.get("vision"):
        raise ValueError(
            f"{PREFIX}{name}: vision=True (pixel observations, rendered by MuJoCo Warp) is not "
            "supported: the adapter takes array observations or a dict's 'state'"
        )
    registry = _registry(f"{PREFIX}{name}")
    if name in registry.ALL_ENVS and has_key(registry.get_default_config(name), "impl"):
        overrides.setdefault("impl", DEFAULT_IMPL)
    playground_env = load(name, overrides)
    config = playground_env._config
    params = PlaygroundParams(
        episode_length=int(config.episode_length), action_repeat=int(config.action_repeat)
    )
    env = Playground(name, playground_env, params)
    return env, env.make_params()
