"""Wrappers: small Envs around an Env, pure and composable, and `vectorize` for N envs in one vmap.

Every wrapper keeps the `reset(key, params)` / `step(key, state, action, params)` contract and the
inner env's params; stateful wrappers carry their own state next to the inner one
(`state.env_state`). Batching follows one rule: the *batch shape* of an observation is its leading
dims beyond the observation space's shape, so a wrapper works on one env, on `vectorize(env, N)`
(batch shape (N,)) and under a further `jax.vmap` (over seeds, say) alike.

A typical stack for an on-policy agent with continuous actions, innermost first:

    env, params = envs.make("Pendulum-v1")
    env = ClipAction(env)                      # the agent may output any real action
    env = vectorize(env, 64)                   # 64 envs, independent keys, one vmap
    env = EpisodeStatistics(env)               # raw returns, before any reward scaling
    env = NormalizeObservation(env)            # statistics over the 64 envs (and time)
    env = NormalizeReward(env, gamma=0.99)

* `EpisodeStatistics` must sit inside (before) `NormalizeReward` to report the env's own returns.
* The normalising wrappers share their statistics over everything they see at once: wrap the
  *vectorised* env to pool the N envs (the statistics then have the observation's shape, computed
  over the batch axis, never over the features; for images, one per channel, over the pixels too).
  `vectorize(NormalizeObservation(env), N)` is also valid but gives every env its own statistics.

Episode statistics scheme (what agents log as training curves): on every step
`info["episode_done"]` is True where an episode ended on this step (terminated or truncated);
`info["episode_return"]` / `info["episode_length"]` hold the undiscounted return and the length of
the most recent episode that *ended* in that env (its own on a step where `episode_done`, the
previous one's otherwise, 0 before the first ends). The mean return of the episodes that ended in a
batch of steps is therefore sum(return * done) / sum(done), with no per-step placeholders.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs.core import Env
from envs.spaces import Box, Discrete, is_concrete


class Wrapper(Env):
    """An Env around `env`: delegates params, spaces and attributes;
    subclasses override reset/step."""

    def __init__(self, env: Env):
        self.env = env

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.env.name

    @property
    def default_params(self) -> Any:
        return self.env.default_params

    def make_params(self, **overrides: Any) -> Any:
        return self.env.make_params(**overrides)

    def observation_space(self, params: Any):
        return self.env.observation_space(params)

    def action_space(self, params: Any):
        return self.env.action_space(params)

    @property
    def num_envs(self) -> int | None:
        """Number of envs batched inside (None for a single env)."""
        return getattr(self.env, "num_envs", None)

    @property
    def unwrapped(self) -> Env:
        """The innermost env."""
        env = self.env
        while isinstance(env, Wrapper):
            env = env.env
        return env

    def inner_state(self, state: Any) -> Any:
        """The inner env's part of this wrapper's state
        (the state itself for stateless wrappers)."""
        return state

    def reset(self, key, params=None):
        return self.env.reset(key, params)

    def step(self, key, state, action, params=None):
        return self.env.step(key, state, action, params)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.env!r})"


def batch_shape(obs: jax.Array, space) -> tuple[int, ...]:
    """Leading dims of `obs` beyond the space's shape: () for one env, (N,) for N envs."""
    return tuple(jnp.shape(obs)[: jnp.ndim(obs) - len(space.shape)])


# --- vectorize -----------------------------------------------------------------------------------


class VectorizedEnv(Wrapper):
    """`num_envs` copies of `env` with independent keys, stepped in one `jax.vmap`; params shared.

    reset(key) splits `key` into `num_envs` keys; step(key, state, actions) splits `key` likewise,
    so each env draws its own randomness (auto-resets included). `actions` has shape
    (num_envs,) + action_space.shape; observations, rewards and flags gain a leading (num_envs,)
    axis. The spaces stay those of one env. For a batch of env *variants*, vmap `env.step` over
    params yourself (`in_axes` for the params pytree).
    """

    def __init__(self, env: Env, num_envs: int):
        super().__init__(env)
        if int(num_envs) < 1:
            raise ValueError(f"vectorize: num_envs must be >= 1, got {num_envs}")
        self._num_envs = int(num_envs)

    @property
    def num_envs(self) -> int:
        return self._num_envs

    def reset(self, key, params=None):
        params = self.default_params if params is None else params
        keys = jax.random.split(key, self.num_envs)
        return jax.vmap(self.env.reset, in_axes=(0, None))(keys, params)

    def step(self, key, state, action, params=None):
        params = self.default_params if params is None else params
        space = self.action_space(params)
        expected = (self.num_envs,) + tuple(space.shape)
        if tuple(jnp.shape(action)) != expected:
            raise ValueError(
                f"{self.name} x {self.num_envs}: actions must have shape {expected} (num_envs, "
                f"*action_shape), got shape {tuple(jnp.shape(action))}"
            )
        if isinstance(space, Discrete) and is_concrete(action):
            values = np.asarray(action)
            if (
                np.issubdtype(values.dtype, np.integer)
                and ((values < 0) | (values >= space.n)).any()
            ):
                bad = values[(values < 0) | (values >= space.n)]
                raise ValueError(
                    f"{self.name} x {self.num_envs}: actions {bad.tolist()[:5]} are outside "
                    f"Discrete({space.n})"
                )
        keys = jax.random.split(key, self.num_envs)
        return jax.vmap(self.env.step, in_axes=(0, 0, 0, None))(keys, state, action, params)

    def __repr__(self) -> str:
        return f"VectorizedEnv({self.env!r}, num_envs={self.num_envs})"


def vectorize(env: Env, num_envs: int) -> VectorizedEnv:
    """`num_envs` copies of `env` with independent keys in one vmap (see `VectorizedEnv`)."""
    return VectorizedEnv(env, num_envs)


# --- episode statistics --------------------------------------------------------------------------


@struct.dataclass
class EpisodeStatisticsState:
    env_state: Any
    episode_return: jax.Array  # running undiscounted return of the current episode
    episode_length: jax.Array  # steps so far in the current episode
    returned_episode_return: jax.Array  # return of the last episode that ended
    returned_episode_length: jax.Array  # length of the last episode that ended


class EpisodeStatistics(Wrapper):
    """Return and length of the episodes that ended, carried across auto-resets (module docstring).

    info["episode_done"]   = terminated | truncated
    info["episode_return"] = sum of the rewards of the last episode that ended (float32)
    info["episode_length"] = its number of steps (int32)
    """

    def inner_state(self, state: EpisodeStatisticsState) -> Any:
        return state.env_state

    def reset(self, key, params=None):
        params = self.default_params if params is None else params
        obs, env_state = self.env.reset(key, params)
        shape = batch_shape(obs, self.observation_space(params))
        zeros_f, zeros_i = jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.int32)
        return obs, EpisodeStatisticsState(env_state, zeros_f, zeros_i, zeros_f, zeros_i)

    def step(self, key, state: EpisodeStatisticsState, action, params=None):
        obs, env_state, reward, terminated, truncated, info = self.env.step(
            key, state.env_state, action, params
        )
        episode_return = state.episode_return + reward
        episode_length = state.episode_length + 1
        done = terminated | truncated
        new_state = EpisodeStatisticsState(
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


# --- running mean and variance -------------------------------------------------------------------


@struct.dataclass
class RunningMeanVar:
    """Mean and (population) variance of everything seen so far, with its count.

    Starts at mean 0, var 1, count 1e-4 (as gymnasium's RunningMeanStd), so the first update is
    almost entirely the first batch.
    """

    mean: jax.Array
    var: jax.Array
    count: jax.Array

    @classmethod
    def create(cls, shape: tuple[int, ...] = ()) -> "RunningMeanVar":
        return cls(
            mean=jnp.zeros(shape, jnp.float32),
            var=jnp.ones(shape, jnp.float32),
            count=jnp.float32(1e-4),
        )

    def update(self, x: jax.Array, num_batch_dims: int) -> "RunningMeanVar":
        """Merge the batch `x` (its first `num_batch_dims` axes are samples) by Chan et al.'s rule:

        n = count + m,  delta = mean_x - mean
        mean' = mean + delta m / n
        var'  = (var count + var_x m + delta^2 count m / n) / n
        """
        axes = tuple(range(num_batch_dims))
        m = float(np.prod(jnp.shape(x)[:num_batch_dims]))  # 1.0 for one sample
        x = jnp.asarray(x, jnp.float32)
        batch_mean = jnp.mean(x, axis=axes)
        batch_var = jnp.var(x, axis=axes)
        total = self.count + m
        delta = batch_mean - self.mean
        mean = self.mean + delta * m / total
        m2 = self.var * self.count + batch_var * m + delta**2 * self.count * m / total
        return RunningMeanVar(mean=mean, var=m2 / total, count=total)


# --- observation normalisation -------------------------------------------------------------------


@struct.dataclass
class NormalizeObservationState:
    env_state: Any
    obs_stats: RunningMeanVar


class NormalizeObservation(Wrapper):
    """obs -> clip((obs - mean) / sqrt(var + epsilon), -clip, clip) with a running mean
    and variance.

    The statistics are taken over the batch shape (every env the wrapper sees) and over time; they
    are updated with each returned observation (the reset one and, after an auto-reset, the new
    episode's first) before normalising it, as gymnasium does. `info["final_obs"]` is normalised
    with the same statistics. `clip=None` disables clipping (SB3's VecNormalize clips at 10). With
    `update=False` the statistics stay as they are in the state (for evaluation: put trained
    statistics into `state.obs_stats`).

    Per feature or per channel: with `per_channel=False` the statistics have the observation's shape
    (one mean and variance per feature, or per pixel and channel). With `per_channel=True` they have
    shape [channels] (the observation's last axis) and are also taken over the other observation
    axes (every pixel of a channel shares one mean and variance), the usual rule for images. The
    default, None, is per channel for image observations (a Box of rank 3, [height, width,
    channels]) and per feature otherwise.
    """

    def __init__(
        self,
        env: Env,
        epsilon: float = 1e-8,
        clip: float | None = 10.0,
        update: bool = True,
        per_channel: bool | None = None,
    ):
        super().__init__(env)
        space = env.observation_space(env.default_params)
        if not isinstance(space, Box):
            raise ValueError(
                f"NormalizeObservation needs a Box observation space, {env.name} has {space}"
            )
        self.per_channel = len(space.shape) == 3 if per_channel is None else bool(per_channel)
        if self.per_channel and len(space.shape) < 2:
            raise ValueError(
                "NormalizeObservation(per_channel=True) "
                f"needs observations of rank >= 2 (channels last), {env.name} has {space}"
            )
        self.epsilon, self.clip, self.update = float(epsilon), clip, bool(update)

    def inner_state(self, state: NormalizeObservationState) -> Any:
        return state.env_state

    def stats_shape(self, params) -> tuple[int, ...]:
        """[channels] per channel, else the observation's shape."""
        shape = tuple(self.observation_space(params).shape)
        return shape[-1:] if self.per_channel else shape

    def _update(self, stats: RunningMeanVar, obs, params) -> RunningMeanVar:
        if not self.update:
            return stats
        if (
            self.per_channel
        ):  # every position of a channel is a sample: [..., H, W, C] -> [samples, C]
            return stats.update(jnp.reshape(obs, (-1, jnp.shape(obs)[-1])), 1)
        return stats.update(obs, len(batch_shape(obs, self.observation_space(params))))

    def normalize(self, obs: jax.Array, stats: RunningMeanVar) -> jax.Array:
        """(obs - mean) / sqrt(var + epsilon), clipped to +-clip when clip is set."""
        out = (obs - stats.mean) / jnp.sqrt(stats.var + self.epsilon)
        if self.clip is not None:
            out = jnp.clip(out, -self.clip, self.clip)
        return out.astype(jnp.float32)

    def reset(self, key, params=None):
        params = self.default_params if params is None else params
        obs, env_state = self.env.reset(key, params)
        stats = self._update(RunningMeanVar.create(self.stats_shape(params)), obs, params)
        return self.normalize(obs, stats), NormalizeObservationState(env_state, stats)

    def step(self, key, state: NormalizeObservationState, action, params=None):
        params = self.default_params if params is None else params
        obs, env_state, reward, terminated, truncated, info = self.env.step(
            key, state.env_state, action, params
        )
        stats = self._update(state.obs_stats, obs, params)
        info = dict(info)
        info["final_obs"] = self.normalize(info["final_obs"], stats)
        return (
            self.normalize(obs, stats),
            NormalizeObservationState(env_state, stats),
            reward,
            terminated,
            truncated,
            info,
        )


# --- reward scaling ------------------------------------------------------------------------------


@struct.dataclass
class NormalizeRewardState:
    env_state: Any
    discounted_return: jax.Array  # G, one per env
    return_stats: RunningMeanVar  # of G, over envs and time


class NormalizeReward(Wrapper):
    """reward -> reward / sqrt(Var[G] + epsilon), G the running discounted return (not centred).

    Per step, as gymnasium's (vector, same-step autoreset) NormalizeReward and the common PPO code:

        G <- gamma G (1 - terminated) + reward      (one G per env)
        update the running variance of G over the batch of envs
        reward_out = reward / sqrt(var + epsilon)
        G <- 0 where the episode ended (terminated or truncated: the env has auto-reset)

    Only the reward changes; episode statistics wrapped inside still see the raw rewards.
    """

    def __init__(self, env: Env, gamma: float = 0.99, epsilon: float = 1e-8, update: bool = True):
        super().__init__(env)
        if not 0.0 <= float(gamma) <= 1.0:
            raise ValueError(f"NormalizeReward: gamma must be in [0, 1], got {gamma}")
        self.gamma, self.epsilon, self.update = float(gamma), float(epsilon), bool(update)

    def inner_state(self, state: NormalizeRewardState) -> Any:
        return state.env_state

    def reset(self, key, params=None):
        params = self.default_params if params is None else params
        obs, env_state = self.env.reset(key, params)
        shape = batch_shape(obs, self.observation_space(params))
        return obs, NormalizeRewardState(
            env_state, jnp.zeros(shape, jnp.float32), RunningMeanVar.create(())
        )

    def step(self, key, state: NormalizeRewardState, action, params=None):
        obs, env_state, reward, terminated, truncated, info = self.env.step(
            key, state.env_state, action, params
        )
        discounted = (
            state.discounted_return * self.gamma * (1.0 - terminated.astype(jnp.float32)) + reward
        )
        stats = (
            state.return_stats.update(discounted, jnp.ndim(discounted))
            if self.update
            else state.return_stats
        )
        scaled = (reward / jnp.sqrt(stats.var + self.epsilon)).astype(jnp.float32)
        discounted = jnp.where(terminated | truncated, 0.0, discounted)
        return (
            obs,
            NormalizeRewardState(env_state, discounted, stats),
            scaled,
            terminated,
            truncated,
            info,
        )


# --- continuous actions --------------------------------------------------------------------------


def _box_action_space(env: Env, wrapper: str) -> Box:
    space = env.action_space(env.default_params)
    if not isinstance(space, Box):
        raise ValueError(f"{wrapper} needs a Box (continuous) action space, {env.name} has {space}")
    return space


class ClipAction(Wrapper):
    """action -> clip(action, low, high) of the inner Box; the wrapper's action space is unbounded.

    For Gaussian policies whose samples leave the bounds. (The classic-control envs clip for the
    dynamics anyway, but MountainCarContinuous charges its action penalty on the unclipped action;
    this wrapper makes the agent pay for the clipped one.)
    """

    def __init__(self, env: Env):
        super().__init__(env)
        _box_action_space(env, "ClipAction")

    def action_space(self, params):
        space = self.env.action_space(params)
        return Box(low=-np.inf, high=np.inf, shape=space.shape)

    def step(self, key, state, action, params=None):
        params = self.default_params if params is None else params
        space = self.env.action_space(params)
        action = jnp.clip(action, jnp.asarray(space._low), jnp.asarray(space._high))
        return self.env.step(key, state, action, params)


class RescaleAction(Wrapper):
    """Agent actions in [low, high] (default [-1, 1]) mapped affinely onto the inner Box [L, H]:

        a_env = L + (clip(a, low, high) - low) (H - L) / (high - low)

    Out-of-range actions are clipped to [low, high] first (traced values cannot raise).
    """

    def __init__(self, env: Env, low: float = -1.0, high: float = 1.0):
        super().__init__(env)
        space = _box_action_space(env, "RescaleAction")
        if not np.all(np.isfinite(space._low) & np.isfinite(space._high)):
            raise ValueError(f"RescaleAction needs a bounded action space, {env.name} has {space}")
        if not float(low) < float(high):
            raise ValueError(f"RescaleAction: need low < high, got low={low}, high={high}")
        self.low, self.high = float(low), float(high)

    def action_space(self, params):
        return Box(low=self.low, high=self.high, shape=self.env.action_space(params).shape)

    def inner_action(self, action, params=None):
        """The inner env's action for an agent action `a`:
        L + (clip(a, low, high) - low) (H - L) / (high - low)."""
        params = self.default_params if params is None else params
        space = self.env.action_space(params)
        env_low, env_high = jnp.asarray(space._low), jnp.asarray(space._high)
        action = jnp.clip(action, self.low, self.high)
        return env_low + (action - self.low) * (env_high - env_low) / (self.high - self.low)

    def step(self, key, state, action, params=None):
        params = self.default_params if params is None else params
        return self.env.step(key, state, self.inner_action(action, params), params)


def unwrap_state(env: Env, state: Any) -> tuple[Env, Any]:
    """The innermost env and its state, peeling wrappers
    (a vectorised state keeps its batch axis)."""
    while isinstance(env, Wrapper):
        state = env.inner_state(state)
        env = env.env
    return env, state


# --- partial observability -----------------------------------------------------------------------

# Which entries of each env's observation are positions
# (what `MaskObservation(env, "positions")` keeps):
#   CartPole-v1                 [x, x_dot, theta, theta_dot]                      -> keep 0, 2
#   Pendulum-v1                 [cos theta, sin theta, theta_dot]                 -> keep 0, 1
#   Acrobot-v1                  [cos t1, sin t1, cos t2, sin t2, t1_dot, t2_dot]  -> keep 0, 1, 2, 3
#   MountainCar(Continuous)-v0  [position, velocity]                              -> keep 0
POSITIONS: dict[str, tuple[int, ...]] = {
    "CartPole-v1": (0, 2),
    "Pendulum-v1": (0, 1),
    "Acrobot-v1": (0, 1, 2, 3),
    "MountainCar-v0": (0,),
    "MountainCarContinuous-v0": (0,),
}


class MaskObservation(Wrapper):
    """obs -> obs[..., keep]: only the chosen entries of a flat Box observation are seen, which
    makes an env partially observable (hide the velocities and a policy must infer them from a
    history).

    `keep` is a list of the indices kept (in that order), or "positions": the env's position
    entries, from `POSITIONS` (CartPole-v1 keeps x and theta, [0, 2]; Pendulum-v1 cos and sin of the
    angle, [0, 1]; the table above `POSITIONS` lists the rest). The observation space is the inner
    Box restricted to those entries; `info["final_obs"]` is masked alike. Stateless, so it composes
    with every other wrapper and with `vectorize`; it masks `reset_env`/`step_env` too (the
    no-auto-reset pair that `rl eval` plays episodes with) and renders as the inner env does.
    """

    def __init__(self, env: Env, keep="positions"):
        super().__init__(env)
        space = env.observation_space(env.default_params)
        if not isinstance(space, Box) or len(space.shape) != 1:
            raise ValueError(
                f"MaskObservation needs a flat Box observation space, {env.name} has {space}"
            )
        if isinstance(keep, str):
            if keep != "positions":
                raise ValueError(
                    f"MaskObservation: keep must be a list of indices or 'positions', got {keep!r}"
                )
            if env.name not in POSITIONS:
                raise ValueError(
                    f"MaskObservation: no 'positions' preset for {env.name} (presets: "
                    f"{', '.join(POSITIONS)}); give the indices to keep"
                )
            keep = POSITIONS[env.name]
        keep = tuple(keep)
        size = space.shape[0]
        if (
            not keep
            or any(
                isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < size
                for i in keep
            )
            or len(set(keep)) != len(keep)
        ):
            raise ValueError(
                f"MaskObservation: keep must list distinct indices in [0, {size}) "
                f"of {env.name}'s observation, got {list(keep)}"
            )
        self.keep = tuple(int(i) for i in keep)

    def mask(self, obs: jax.Array) -> jax.Array:
        """obs[..., keep]."""
        return jnp.take(obs, jnp.asarray(self.keep), axis=-1)

    def observation_space(self, params):
        space = self.env.observation_space(params)
        keep = list(self.keep)
        return Box(
            low=space._low[keep], high=space._high[keep], shape=(len(keep),), dtype=space.dtype
        )

    def reset(self, key, params=None):
        obs, state = self.env.reset(key, params)
        return self.mask(obs), state

    def step(self, key, state, action, params=None):
        obs, state, reward, terminated, truncated, info = self.env.step(key, state, action, params)
        info = {**info, "final_obs": self.mask(info["final_obs"])}
        return self.mask(obs), state, reward, terminated, truncated, info

    def reset_env(self, key, params):
        obs, state = self.env.reset_env(key, params)
        return self.mask(obs), state

    def step_env(self, key, state, action, params):
        obs, state, reward, terminated, info = self.env.step_env(key, state, action, params)
        return self.mask(obs), state, reward, terminated, info

    def render(self, state, params, *args, **kwargs):
        return self.env.render(state, params, *args, **kwargs)

    def __repr__(self) -> str:
        return f"MaskObservation({self.env!r}, keep={list(self.keep)})"
