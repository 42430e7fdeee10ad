"""Gymnasium interop, both ways.

`to_gymnasium(env, params, num_envs=1)`: one of our JAX envs as a `gymnasium.Env` (num_envs=1) or a
`gymnasium.vector.VectorEnv` (num_envs > 1), so any gymnasium-consuming library can drive it.
  * Reset and step are jitted; observations come back as NumPy (float32 for Box, int for Discrete).
  * Seeding: `reset(seed=s)` starts a JAX key stream from `jax.random.key(s)`; `reset()` without a
    seed continues from the env's `np_random`, so a seeded run is reproducible.
  * Single env: a step that ends the episode returns the observation it reached (gymnasium's
    convention), and the next call must be `reset`. Our time limit is reported as `truncated`.
  * Vector env: same-step autoreset (`metadata["autoreset_mode"] = AutoresetMode.SAME_STEP`), as our
    envs do: the returned observation of a finished env is the next episode's first one and
    `info["final_obs"]` (an object array, `None` where no episode ended) with its mask
    `info["_final_obs"]` holds the observation the episode ended on.
  * `render_mode="rgb_array"` renders through `envs.render`.

`from_gymnasium(id_or_env)`: any gymnasium env (Python, CPU, not written in JAX) behind our
functional API, through host callbacks (`jax.pure_callback`), so our agents can train on it at
Python speed.
  * The state is a *token*: which host env instance (`handle`), a unique state id (`token`) and the
    episode's `time`. The host instances hold the real state. A state made by `reset` is
    restorable (gymnasium's reset with a seed is deterministic), so it can be stepped any number of
    times: XLA may hoist a reset with a constant key out of a loop, and an unbatched reset may feed
    a batch of steps. Every later state can be stepped once; repeating its transition exactly (same
    action and key) returns the memoised result, because a vmapped `lax.while_loop` (or `lax.cond`)
    runs its body for finished elements and discards the result. Any other reuse (branching from
    an old state, two streams driving one instance) raises a RuntimeError naming the instance,
    instead of silently mixing trajectories.
  * Instances: every `reset` call site (each place `reset` is traced, or each eager call) owns its
    own instances, and under `jax.vmap` (over seeds or envs) each element of the (flattened) batch
    gets its own one: the i-th element of site s uses instance (s, i), for the reset and for the
    first step from it. So a training stream and an evaluation loop that resets the same env
    elsewhere in the program do not collide, and a reset inside a `lax.scan` body reuses its
    instances on every iteration. Instances are created on demand (`gymnasium.make` again for an
    id or a factory; `copy.deepcopy` of a given instance) and live as long as the `from_gymnasium`
    env; each eager `reset` call is a new site, so reset eagerly in a Python loop only a handful of
    times (or jit the reset). A jitted function that resets, called again, reuses its site's
    instances: the stepped states from the earlier call go stale. A batch is stepped in one host
    call, its instances one after the other.
  * Params are fixed at construction (a gymnasium env's configuration is not an array): the params
    pytree has no leaves, so there is nothing to vmap over; passing other params raises ValueError.
    For env variants, make one `from_gymnasium` env per variant.
  * Episode ends follow the wrapped env (its own TimeLimit gives `truncated`); `step` auto-resets on
    the host with a seed drawn from the step's key, and `info["final_obs"]` is the pre-reset
    observation, as for our envs. No gradients, and each step is a host round trip.
"""

from __future__ import annotations

import copy
import functools
import threading
from typing import Any, Callable

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from envs.core import Env
from envs.rendering import render as render_frame
from envs.spaces import Discrete, check_action
from envs.spaces import from_gymnasium as space_from_gymnasium

# --- ours -> gymnasium ---------------------------------------------------------------------------


def _key_from_seed(seed) -> jax.Array:
    return jax.random.key(int(seed) % (2**32))


def _to_numpy_obs(obs, space):
    obs = np.asarray(obs)
    if isinstance(space, gymnasium.spaces.Discrete):
        return obs.astype(np.int64) if obs.ndim else int(obs)
    return obs.astype(space.dtype, copy=False)


def _to_jax_action(action, space):
    if isinstance(space, gymnasium.spaces.Discrete):
        return jnp.asarray(np.asarray(action), jnp.int32)
    return jnp.asarray(np.asarray(action, np.float32))


class GymnasiumEnv(gymnasium.Env):
    """One of our envs as a `gymnasium.Env` (see the module docstring)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, env: Env, params: Any = None, render_mode: str | None = None):
        if render_mode not in (None, "rgb_array"):
            raise ValueError(
                f"to_gymnasium: render_mode must be None or 'rgb_array', got {render_mode!r}"
            )
        self.env = env
        self.params = env.default_params if params is None else params
        self.observation_space = env.observation_space(self.params).to_gymnasium()
        self.action_space = env.action_space(self.params).to_gymnasium()
        self.render_mode = render_mode
        self._reset = jax.jit(env.reset)
        self._step = jax.jit(env.step)
        self._key = None
        self._state = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(2**31))
        self._key, reset_key = jax.random.split(_key_from_seed(seed))
        obs, self._state = self._reset(reset_key, self.params)
        return _to_numpy_obs(obs, self.observation_space), {}

    def step(self, action):
        if self._state is None:
            raise RuntimeError(f"{self.env.name}: call reset() before step()")
        if isinstance(
            self.action_space, gymnasium.spaces.Discrete
        ) and not self.action_space.contains(action):
            raise ValueError(f"{self.env.name}: action {action!r} is outside {self.action_space}")
        self._key, step_key = jax.random.split(self._key)
        _, self._state, reward, terminated, truncated, info = self._step(
            step_key, self._state, _to_jax_action(action, self.action_space), self.params
        )
        obs = _to_numpy_obs(info["final_obs"], self.observation_space)
        return obs, float(reward), bool(terminated), bool(truncated), {}

    def render(self):
        if self.render_mode != "rgb_array" or self._state is None:
            return None
        return render_frame(self.env, self._state, self.params)


class GymnasiumVectorEnv(VectorEnv):
    """`num_envs` of our envs as a `gymnasium.vector.VectorEnv` with same-step autoreset."""

    metadata = {
        "render_modes": ["rgb_array"],
        "render_fps": 30,
        "autoreset_mode": AutoresetMode.SAME_STEP,
    }

    def __init__(
        self, env: Env, params: Any = None, num_envs: int = 2, render_mode: str | None = None
    ):
        if render_mode not in (None, "rgb_array"):
            raise ValueError(
                f"to_gymnasium: render_mode must be None or 'rgb_array', got {render_mode!r}"
            )
        self.env = env
        self.params = env.default_params if params is None else params
        self.num_envs = int(num_envs)
        self.single_observation_space = env.observation_space(self.params).to_gymnasium()
        self.single_action_space = env.action_space(self.params).to_gymnasium()
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.render_mode = render_mode
        self._reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
        self._step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)))
        self._key = None
        self._state = None

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None):
        if isinstance(seed, (list, tuple)):
            if len(seed) != self.num_envs:
                raise ValueError(f"reset: {len(seed)} seeds for {self.num_envs} envs")
            super().reset(seed=int(seed[0]))
            keys = jnp.stack([_key_from_seed(s) for s in seed])
            self._key = jax.random.fold_in(keys[0], 1)
        else:
            super().reset(seed=seed)
            base = _key_from_seed(int(self.np_random.integers(2**31)) if seed is None else seed)
            self._key, reset_key = jax.random.split(base)
            keys = jax.random.split(reset_key, self.num_envs)
        obs, self._state = self._reset(keys, self.params)
        return _to_numpy_obs(obs, self.single_observation_space), {}

    def step(self, actions):
        if self._state is None:
            raise RuntimeError(f"{self.env.name}: call reset() before step()")
        actions = np.asarray(actions)
        if actions.shape[:1] != (self.num_envs,):
            raise ValueError(
                f"{self.env.name} x {self.num_envs}: actions must have a leading axis of "
                f"{self.num_envs}, got shape {actions.shape}"
            )
        if isinstance(
            self.single_action_space, gymnasium.spaces.Discrete
        ) and not self.action_space.contains(actions.astype(np.int64)):
            raise ValueError(
                f"{self.env.name} x {self.num_envs}: actions {actions.tolist()} are outside "
                f"{self.action_space}"
            )
        self._key, step_key = jax.random.split(self._key)
        keys = jax.random.split(step_key, self.num_envs)
        obs, self._state, reward, terminated, truncated, info = self._step(
            keys, self._state, _to_jax_action(actions, self.single_action_space), self.params
        )
        terminated, truncated = np.asarray(terminated), np.asarray(truncated)
        done = terminated | truncated
        infos: dict[str, Any] = {}
        if done.any():
            final_obs = _to_numpy_obs(info["final_obs"], self.single_observation_space)
            infos["final_obs"] = np.full(self.num_envs, None, dtype=object)
            for i in np.flatnonzero(done):
                infos["final_obs"][i] = final_obs[i]
            infos["_final_obs"] = done.copy()
            infos["final_info"] = {}
            infos["_final_info"] = done.copy()
        obs = _to_numpy_obs(obs, self.single_observation_space)
        return obs, np.asarray(reward, np.float64), terminated, truncated, infos

    def render(self):
        if self.render_mode != "rgb_array" or self._state is None:
            return None
        return tuple(
            render_frame(self.env, self._state, self.params, index=i) for i in range(self.num_envs)
        )


def to_gymnasium(env: Env, params: Any = None, num_envs: int = 1, render_mode: str | None = None):
    """Our `env` (with `params`, default its default params) as a gymnasium Env or VectorEnv."""
    if int(num_envs) < 1:
        raise ValueError(f"to_gymnasium: num_envs must be >= 1, got {num_envs}")
    if int(num_envs) == 1:
        return GymnasiumEnv(env, params, render_mode)
    return GymnasiumVectorEnv(env, params, int(num_envs), render_mode)


# --- gymnasium -> ours ---------------------------------------------------------------------------


@struct.dataclass
class FromGymnasiumParams:
    """Fixed at construction; no array leaves (nothing to vmap over)."""

    env_id: str = struct.field(pytree_node=False, default="")
    max_steps_in_episode: int | None = struct.field(pytree_node=False, default=None)


@struct.dataclass
class FromGymnasiumState:
    handle: jax.Array  # int32: which host env instance
    token: (
        jax.Array
    )  # int32: the instance's step counter when this state was made (stale-state check)
    time: jax.Array  # int32: steps in the current episode


class _HostEnvs:
    """The host side: env instances by handle, each with the token of the state it is in.

    Tokens are unique over the whole env (a counter). A handle is allocated per (reset call site,
    batch position) and reused by that pair. `reset_tokens` maps each token a reset produced to
    (site, seed), so such a state can be restored on any instance by resetting it with that seed.
    """

    def __init__(self, factory: Callable[[], gymnasium.Env]):
        self.factory = factory
        self.instances: dict[int, gymnasium.Env] = {}
        self.tokens: dict[int, int] = {}
        self.handles: dict[tuple[int, int], int] = {}
        self.last: dict[int, tuple] = {}  # handle -> (inputs, result) of its last transition
        self.reset_tokens: dict[int, tuple[int, int]] = {}  # token -> (site, seed) of a reset state
        self.num_sites = 0
        self.next_token = 1
        self.lock = threading.Lock()

    def new_site(self) -> int:
        with self.lock:
            self.num_sites += 1
            return self.num_sites - 1

    def handle(self, site: int, position: int) -> int:
        """The instance of batch element `position` of reset site `site`, created on first use."""
        if (site, position) not in self.handles:
            handle = len(self.instances)
            self.instances[handle] = self.factory()
            self.tokens[handle] = 0
            self.handles[(site, position)] = handle
        return self.handles[(site, position)]

    def advance(self, handle: int) -> int:
        """A fresh token for the instance's new state."""
        token = self.next_token
        self.next_token = self.next_token + 1 if self.next_token < 2**31 - 2 else 1
        self.tokens[handle] = token
        self.last.pop(handle, None)
        return token

    def reset(self, handle: int, site: int, seed: int):
        """Reset the instance with `seed`; returns (obs, token) and records the token
        as restorable."""
        obs, _ = self.instances[handle].reset(seed=seed)
        token = self.advance(handle)
        self.reset_tokens[token] = (site, seed)
        if len(self.reset_tokens) > 100_000:  # forget the oldest (dicts keep insertion order)
            self.reset_tokens.pop(next(iter(self.reset_tokens)))
        return obs, token


class FromGymnasium(Env):
    """A gymnasium env behind our functional API through host callbacks (module docstring)."""

    def __init__(self, factory: Callable[[], gymnasium.Env], name: str):
        self.name = name
        try:
            probe = factory()
        except gymnasium.error.Error as error:  # unknown id, missing dependency, ...
            raise ValueError(f"from_gymnasium({name!r}): {error}") from error
        self._host = _HostEnvs(factory)
        self._host.instances[0], self._host.tokens[0] = (
            probe,
            0,
        )  # the first reset site's first element
        self._host.handles[(0, 0)] = 0
        self._host.num_sites = 0
        self._gym_observation_space = probe.observation_space
        self._gym_action_space = probe.action_space
        self._obs_space = space_from_gymnasium(probe.observation_space)
        self._action_space = space_from_gymnasium(probe.action_space)
        spec = getattr(probe, "spec", None)
        self._params = FromGymnasiumParams(
            env_id=name, max_steps_in_episode=getattr(spec, "max_episode_steps", None)
        )
        self._obs_dtype = jnp.int32 if isinstance(self._obs_space, Discrete) else jnp.float32

    @property
    def default_params(self) -> FromGymnasiumParams:
        return self._params

    def observation_space(self, params):
        return self._obs_space

    def action_space(self, params):
        return self._action_space

    def _check_params(self, params):
        if params is not None and params != self._params:
            raise ValueError(
                f"{self.name}: a from_gymnasium env's params are fixed at construction "
                f"({self._params}); got {params}. Make one from_gymnasium env per variant."
            )

    # host callbacks (receive NumPy arrays with any leading batch shape, return the same batch
    # shape)

    def _obs_to_numpy(self, obs) -> np.ndarray:
        return np.asarray(obs, dtype=np.dtype(self._obs_dtype)).reshape(self._obs_space.shape)

    def _host_reset(self, site: int, seeds: np.ndarray):
        batch = seeds.shape
        obs, handles, tokens = [], [], []
        with self._host.lock:
            for position, seed in enumerate(seeds.reshape(-1)):
                handle = self._host.handle(site, position)
                o, token = self._host.reset(handle, site, int(seed))
                obs.append(self._obs_to_numpy(o))
                handles.append(handle)
                tokens.append(token)
        return (
            np.stack(obs).reshape(batch + self._obs_space.shape),
            np.asarray(handles, np.int32).reshape(batch),
            np.asarray(tokens, np.int32).reshape(batch),
        )

    def _host_step(self, handles, tokens, actions, seeds, times):
        batch = handles.shape
        flat_actions = actions.reshape((-1,) + self._action_space.shape)
        results = []
        with self._host.lock:
            for position, (handle, token, action, seed, time) in enumerate(
                zip(
                    handles.reshape(-1),
                    tokens.reshape(-1),
                    flat_actions,
                    seeds.reshape(-1),
                    times.reshape(-1),
                )
            ):
                results.append(
                    self._host_step_one(
                        int(handle), int(token), np.asarray(action), int(seed), int(time), position
                    )
                )
        keys = ("obs", "final_obs", "reward", "terminated", "truncated", "time", "token", "handle")
        out = {k: [r[i] for r in results] for i, k in enumerate(keys)}
        shape = batch + self._obs_space.shape
        return (
            np.stack(out["obs"]).reshape(shape),
            np.stack(out["final_obs"]).reshape(shape),
            np.asarray(out["reward"], np.float32).reshape(batch),
            np.asarray(out["terminated"], bool).reshape(batch),
            np.asarray(out["truncated"], bool).reshape(batch),
            np.asarray(out["time"], np.int32).reshape(batch),
            np.asarray(out["token"], np.int32).reshape(batch),
            np.asarray(out["handle"], np.int32).reshape(batch),
        )

    def _host_step_one(
        self, handle: int, token: int, action: np.ndarray, seed: int, time: int, position: int
    ):
        """One transition from the state (handle, token): step,
        and on an episode end auto-reset with `seed`.

        * A state made by `reset` is restorable: it is stepped on the instance of (its reset site,
          this element's batch position), which is first reset again with the same seed if it has
          moved on. So a reset state can be stepped any number of times (XLA may hoist a reset with
          a constant key out of a loop; an unbatched reset may feed a batch of steps).
        * A later state must be the instance's current one, except that repeating the last
          transition exactly (same token, action, key) returns the memoised result without stepping
          (vmapped `while_loop`s and `cond`s run the body for finished elements and discard the
          result).
        * Anything else is a stale state: RuntimeError.
        """
        host = self._host
        inputs = (token, action.tobytes(), seed, time)
        if token in host.reset_tokens:
            site, reset_seed = host.reset_tokens[token]
            handle = host.handle(site, position)
        last = host.last.get(handle)
        if (
            handle in host.instances
            and host.tokens[handle] != token
            and last is not None
            and last[0] == inputs
        ):
            return last[1]
        if token in host.reset_tokens and host.tokens[handle] != token:
            host.instances[handle].reset(seed=reset_seed)  # restore the reset state
            host.tokens[handle] = token
        if handle not in host.instances or host.tokens[handle] != token:
            raise RuntimeError(
                f"{self.name} (from_gymnasium): stale state for env instance {handle} (state "
                f"token {token}, instance at {host.tokens.get(handle)}): "
                "a host-backed state after a step can be stepped only once (repeating the same "
                "action and key is allowed); only states made by reset can be reused"
            )
        env = host.instances[handle]
        gym_action = (
            int(action)
            if isinstance(self._action_space, Discrete)
            else np.asarray(action, self._gym_action_space.dtype)
        )
        obs, reward, terminated, truncated, _ = env.step(gym_action)
        final_obs = self._obs_to_numpy(obs)
        time += 1
        if terminated or truncated:
            obs, _ = env.reset(seed=seed)
            time = 0
        result = (
            self._obs_to_numpy(obs),
            final_obs,
            np.float32(reward),
            bool(terminated),
            bool(truncated),
            time,
            host.advance(handle),
            handle,
        )
        host.last[handle] = (inputs, result)
        return result

    # the functional API

    def reset(self, key, params=None):
        self._check_params(params)
        seed = jax.random.randint(key, (), 0, 2**31 - 1, dtype=jnp.int32)
        obs_struct = jax.ShapeDtypeStruct(self._obs_space.shape, self._obs_dtype)
        scalar = jax.ShapeDtypeStruct((), jnp.int32)
        site = self._host.new_site()
        host_reset = functools.partial(self._host_reset, site)
        obs, handle, token = jax.pure_callback(
            host_reset, (obs_struct, scalar, scalar), seed, vmap_method="broadcast_all"
        )
        return obs, FromGymnasiumState(handle=handle, token=token, time=jnp.int32(0))

    def step(self, key, state: FromGymnasiumState, action, params=None):
        self._check_params(params)
        action = check_action(self._action_space, action, self.name)
        seed = jax.random.randint(key, (), 0, 2**31 - 1, dtype=jnp.int32)
        obs_struct = jax.ShapeDtypeStruct(self._obs_space.shape, self._obs_dtype)
        scalar_i, scalar_f, scalar_b = (
            jax.ShapeDtypeStruct((), t) for t in (jnp.int32, jnp.float32, jnp.bool_)
        )
        result_shapes = (
            obs_struct,
            obs_struct,
            scalar_f,
            scalar_b,
            scalar_b,
            scalar_i,
            scalar_i,
            scalar_i,
        )
        obs, final_obs, reward, terminated, truncated, time, token, handle = jax.pure_callback(
            self._host_step,
            result_shapes,
            state.handle,
            state.token,
            action,
            seed,
            state.time,
            vmap_method="broadcast_all",
        )
        new_state = FromGymnasiumState(handle=handle, token=token, time=time)
        return obs, new_state, reward, terminated, truncated, {"final_obs": final_obs}

    def reset_env(self, key, params):
        raise NotImplementedError(
            "from_gymnasium envs implement reset/step directly (host callbacks)"
        )

    def step_env(self, key, state, action, params):
        raise NotImplementedError(
            "from_gymnasium envs implement reset/step directly (host callbacks)"
        )

    def __repr__(self) -> str:
        return f"from_gymnasium({self.name!r})"


def check_gymnasium_id(env_id: str) -> str:
    """`env_id`, a gymnasium id, or ValueError for the `module:id` form: gymnasium.make would import
    `module` (any module on sys.path, the current folder's included) before looking up the id, and
    ids come from configs, which are data. To use an env from your own module, import the module
    (registering its ids) in your own code, or pass `from_gymnasium` the env or a factory."""
    if ":" in env_id:
        raise ValueError(
            f"gymnasium id {env_id!r}: the 'module:id' form imports a module named by data, so "
            "fusedrl does not take it; import your module in your own code (registering its "
            "ids) and give the id alone, or pass from_gymnasium an env or a factory"
        )
    return env_id


def from_gymnasium(
    id_or_env: str | gymnasium.Env | Callable[[], gymnasium.Env], **make_kwargs
) -> tuple[FromGymnasium, FromGymnasiumParams]:
    """(env, params): a gymnasium env behind our functional API (module docstring for the limits).

    `id_or_env` is a registered gymnasium id (made with `gymnasium.make(id, **make_kwargs)`, so its
    TimeLimit applies), a zero-argument factory returning a gymnasium env, or an env instance (extra
    instances for a batch are deep copies of it). Only Discrete (starting at 0) and Box observation
    and action spaces are supported.
    """
    if isinstance(id_or_env, str):
        env_id = check_gymnasium_id(id_or_env)

        def factory():
            return gymnasium.make(env_id, **make_kwargs)

        name = env_id
    elif isinstance(id_or_env, gymnasium.Env):
        if make_kwargs:
            raise ValueError(
                f"from_gymnasium: keyword arguments {sorted(make_kwargs)} only apply to an env id"
            )
        instance, used = id_or_env, [False]

        def factory():
            if not used[0]:
                used[0] = True
                return instance
            return copy.deepcopy(instance)

        spec = getattr(id_or_env, "spec", None)
        name = spec.id if spec is not None else type(id_or_env.unwrapped).__name__
    elif callable(id_or_env):
        factory, name = id_or_env, getattr(id_or_env, "__name__", "gymnasium env")
    else:
        raise ValueError(
            f"from_gymnasium: expected a gymnasium id, env or factory, got {id_or_env!r}"
        )
    env = FromGymnasium(factory, name)
    return env, env.default_params
