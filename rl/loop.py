"""The pieces of a training loop that the agents share: the env they train on, exploration and
step-size schedules, target-network updates, the act-then-train phase of off-policy agents,
episode statistics and the scan over log points; the settings, state, log period and Trainer
of the two replay loops (`ReplayLoopConfig`: DQN, Rainbow; `ReplayActorCriticConfig`: SAC, TD3);
and those of the on-policy loops (`OnPolicyLoopConfig`; `PPOLoopConfig`: PPO, recurrent PPO): policy
sampling, the PPO minibatch loss on network outputs, epochs of shuffled minibatches on a flat
parameter vector, the log period and Trainer.

    env, env_params = loop.make_env(config)            # episode statistics; Box actions in [-1, 1]
    phase = loop.act_then_train(env_step, gradient_step, env_iterations, gradient_steps, learning_starts)
    state, metrics = loop.scan_log_points(log_period, state, num_log_points)

Every function is pure and traceable; none holds state between calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

import kernels
from envs.spaces import Box, Discrete
from envs.wrappers import EpisodeStatistics, RescaleAction, Wrapper
from rl import buffers, losses, networks
from rl.config import ConfigError, hp
from rl.logging import emit
from rl.rollout import greedy_episodes
from rl.trainer import Trainer

# ---------------------------------------------------------------- the replay loop's settings


UNROLL_DOC = (
    "loop trips (speed only, the same computation): a phase's env and gradient loops unroll min(unroll, n); "
    "the loop over phases max(1, unroll // max(env_iterations, gradient_steps))"
)


@dataclass(frozen=True)
class ReplayLoopConfig:
    """Settings of the act-then-train loop of value-based replay agents (DQN, Rainbow), which
    extend it: `num_envs` envs step together with epsilon-greedy actions; after every `train_freq`
    env steps (all envs counted) come `gradient_steps` gradient steps on batches of `batch_size`, once
    `learning_starts` env steps are stored; the target network follows the online one every
    `target_update_interval` gradient steps (target <- tau online + (1 - tau) target)."""

    total_steps: int = hp(102_400, low=1, doc="env steps per seed (all envs counted)")
    num_envs: int = hp(1, low=1, doc="envs stepped together")
    buffer_size: int = hp(100_000, low=1, doc="replay capacity (transitions)")
    learning_starts: int = hp(1_000, low=0, doc="env steps before the first gradient step")
    batch_size: int = hp(64, low=1)
    train_freq: int = hp(256, low=1, doc="env steps between training phases (multiple of num_envs)")
    gradient_steps: int = hp(128, low=1, doc="gradient steps per training phase")
    lr: float = hp(5e-4, low=0.0, low_open=True, sweep=True, doc="Adam step size")
    gamma: float = hp(0.99, low=0.0, high=1.0, sweep=True, doc="discount")
    max_grad_norm: float = hp(
        10.0, low=0.0, low_open=True, sweep=True, doc="global-norm gradient clipping"
    )
    target_update_interval: int = hp(256, low=1, doc="gradient steps between target updates")
    tau: float = hp(
        1.0,
        low=0.0,
        high=1.0,
        low_open=True,
        sweep=True,
        doc="target <- tau * online + (1 - tau) * target",
    )
    epsilon_start: float = hp(1.0, low=0.0, high=1.0, sweep=True)
    epsilon_end: float = hp(0.04, low=0.0, high=1.0, sweep=True)
    epsilon_decay_steps: int = hp(8_000, low=1, doc="env steps of the linear epsilon decay")
    log_interval: int = hp(
        2_560, low=1, doc="env steps between log points (multiple of train_freq)"
    )
    eval_episodes: int = hp(
        10,
        low=0,
        doc="greedy episodes per log point, on separate eval envs (0: none, no eval_return)",
    )
    unroll: int = hp(1, low=1, doc=UNROLL_DOC)

    def validate(self):
        """The step counts nest: num_envs | train_freq | log_interval | total_steps; one step fits the buffer."""
        if self.train_freq % self.num_envs:
            raise ConfigError(
                f"agent.train_freq ({self.train_freq}) must be a multiple of agent.num_envs ({self.num_envs})"
            )
        if self.log_interval % self.train_freq:
            raise ConfigError(
                f"agent.log_interval ({self.log_interval}) must be a multiple of agent.train_freq ({self.train_freq})"
            )
        if self.total_steps % self.log_interval:
            raise ConfigError(
                f"agent.total_steps ({self.total_steps}) must be a multiple of agent.log_interval ({self.log_interval})"
            )
        if self.num_envs > self.buffer_size:
            raise ConfigError(
                f"agent.buffer_size ({self.buffer_size}) must hold at least one step of agent.num_envs ({self.num_envs}) envs"
            )


@dataclass(frozen=True)
class ReplayActorCriticConfig:
    """Settings of the loop of replay actor-critics with continuous control (SAC, TD3), which extend
    it: `num_envs` envs take one step, the transitions go to a uniform replay buffer, then
    `utd_ratio * num_envs` gradient steps follow on batches of `batch_size`, once `learning_starts`
    env steps (of uniformly random actions) are stored."""

    total_steps: int = hp(20_000, low=1, doc="env steps per seed (all envs counted)")
    num_envs: int = hp(1, low=1, doc="envs stepped together")
    utd_ratio: float = hp(
        1.0,
        low=0.0,
        low_open=True,
        doc="gradient steps per env step (utd_ratio * num_envs must be a whole number)",
    )
    buffer_size: int = hp(100_000, low=1, doc="replay capacity (transitions)")
    learning_starts: int = hp(
        1_000, low=0, doc="env steps of uniformly random actions before learning"
    )
    batch_size: int = hp(256, low=1)
    lr: float = hp(
        1e-3, low=0.0, low_open=True, sweep=True, doc="Adam step size of actor and critics"
    )
    gamma: float = hp(0.99, low=0.0, high=1.0, sweep=True, doc="discount")
    tau: float = hp(
        0.005,
        low=0.0,
        high=1.0,
        low_open=True,
        sweep=True,
        doc="Polyak step of the target networks",
    )
    max_grad_norm: float = hp(
        1e6,
        low=0.0,
        low_open=True,
        sweep=True,
        doc="global gradient-norm clip of actor and critics (large: off)",
    )
    log_interval: int = hp(1_000, low=1, doc="env steps between log points (multiple of num_envs)")
    eval_episodes: int = hp(
        8, low=0, doc="deterministic evaluation episodes per log point (0: none)"
    )
    unroll: int = hp(1, low=1, doc=UNROLL_DOC)

    @property
    def gradient_steps(self) -> int:
        """Gradient steps after each vectorised env step."""
        return int(round(self.utd_ratio * self.num_envs))

    def validate(self):
        if (
            abs(self.utd_ratio * self.num_envs - self.gradient_steps) > 1e-9
            or self.gradient_steps < 1
        ):
            raise ConfigError(
                f"agent.utd_ratio ({self.utd_ratio}) * agent.num_envs ({self.num_envs}) must be a whole number >= 1"
            )
        if self.log_interval % self.num_envs:
            raise ConfigError(
                f"agent.log_interval ({self.log_interval}) must be a multiple of agent.num_envs ({self.num_envs})"
            )
        if self.total_steps % self.log_interval:
            raise ConfigError(
                f"agent.total_steps ({self.total_steps}) must be a multiple of agent.log_interval ({self.log_interval})"
            )


@dataclass(frozen=True)
class OnPolicyLoopConfig:
    """Settings of the rollout-then-learn loop of on-policy agents (PQN), which extend it: each update
    `num_envs` envs step `num_steps` times with the current network, then `num_epochs` passes over
    that batch in `num_minibatches` shuffled minibatches, one Adam step each."""

    total_steps: int = hp(
        500_000, low=1, doc="env steps per seed (all envs counted), rounded down to whole updates"
    )
    num_envs: int = hp(32, low=1, doc="parallel envs")
    num_steps: int = hp(64, low=1, doc="rollout length per env per update")
    num_epochs: int = hp(4, low=1, doc="passes over each rollout")
    num_minibatches: int = hp(16, low=1, doc="minibatches per pass")
    anneal_lr: bool = hp(True, doc="linear learning-rate decay to 0 over the run")
    log_interval: int = hp(8, low=1, doc="updates between log points")
    eval_envs: int = hp(
        0, low=0, doc="greedy evaluation episodes at each log point (0: no evaluation)"
    )
    unroll: int = hp(
        1,
        low=1,
        doc="iterations per loop trip of the rollout and minibatch scans (speed only: fewer loop trips on the GPU)",
    )

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_updates(self) -> int:
        return self.total_steps // self.batch_size

    def validate(self):
        if self.batch_size % self.num_minibatches:
            raise ConfigError(
                f"agent.num_minibatches ({self.num_minibatches}) must divide agent.num_envs * agent.num_steps ({self.batch_size})"
            )
        if self.num_updates < 1:
            raise ConfigError(
                f"agent.total_steps ({self.total_steps}) must be at least agent.num_envs * agent.num_steps ({self.batch_size})"
            )
        if self.num_updates % self.log_interval:
            lower = self.num_updates // self.log_interval * self.log_interval * self.batch_size
            raise ConfigError(
                f"agent.log_interval ({self.log_interval} updates) must divide the number of updates "
                f"agent.total_steps // (agent.num_envs * agent.num_steps) = {self.num_updates}; "
                f"e.g. agent.total_steps={max(lower, self.log_interval * self.batch_size)} or "
                f"{lower + self.log_interval * self.batch_size}"
            )


def check_bounded_actions(config, env, env_params, discrete_ok: bool = False) -> None:
    """ConfigError unless observations are a flat Box (read by an mlp torso) and actions a bounded
    Box (or Discrete, if `discrete_ok`)."""
    action_space, obs_space = env.action_space(env_params), env.observation_space(env_params)
    name = config.agent.name
    if not isinstance(obs_space, Box) or len(obs_space.shape) != 1:
        raise ConfigError(
            f"env.id: {name} needs vector (Box) observations; {config.env.id} has {obs_space}"
        )
    if config.agent.network.torso != "mlp":
        raise ConfigError(
            f"agent.network.torso: {name} supports only the mlp torso (its critics read concat(obs, action)); got {config.agent.network.torso!r}"
        )
    if isinstance(action_space, Discrete) and discrete_ok:
        return
    if not isinstance(action_space, Box):
        wanted = "bounded Box or Discrete" if discrete_ok else "continuous (Box)"
        raise ConfigError(
            f"env.id: {name} needs {wanted} actions; {config.env.id} has {action_space}"
        )
    if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
        raise ConfigError(
            f"env.id: {name} needs bounded Box actions; {config.env.id} has {action_space}"
        )


def check_discrete_actions(config, env, env_params) -> None:
    """ConfigError unless the env's actions are Discrete (Q-learning with a network needs them)."""
    space = env.action_space(env_params)
    if not isinstance(space, Discrete):
        raise ConfigError(
            f"env.id: {config.agent.name} needs discrete actions; {config.env.id} has {space}"
        )


# ---------------------------------------------------------------- the env an agent trains on


def make_env(config):
    """(env, env_params) for `config.env` (`EnvConfig.make`: its observation masked if `env.observe`
    is set), wrapped for training:

    - Box actions are rescaled: the agent acts in [-1, 1]^d, the env receives
      L + (clip(a, -1, 1) + 1) (H - L) / 2 (`envs.wrappers.RescaleAction`; needs finite bounds);
    - `envs.wrappers.EpisodeStatistics` reports each episode's undiscounted return and length in
      `info` when it ends (terminated or truncated).
    """
    env, env_params = config.env.make()
    space = env.action_space(env_params)
    if (
        isinstance(space, Box)
        and np.all(np.isfinite(space.low))
        and np.all(np.isfinite(space.high))
    ):
        env = RescaleAction(env)
    return EpisodeStatistics(env), env_params


def to_env_action(env, env_params, action):
    """The unwrapped env's action for an agent action, through the action wrappers of `env`'s
    stack (`RescaleAction` from `make_env`); the identity for discrete actions."""
    while isinstance(env, Wrapper):
        if isinstance(env, RescaleAction):
            action = env.inner_action(action, env_params)
        env = env.env
    return action


def batched(env):
    """(reset, step) of `env` vmapped over a leading env axis: `reset(keys[E], params)`,
    `step(keys[E], states, actions[E], params)`; params are shared."""
    return jax.vmap(env.reset, in_axes=(0, None)), jax.vmap(env.step, in_axes=(0, 0, 0, None))


# ---------------------------------------------------------------- schedules and exploration


def linear_schedule(start, end, duration, step):
    """start + (end - start) min(step / duration, 1): epsilon decay, PER's beta annealing to 1."""
    return start + (end - start) * jnp.minimum(step / duration, 1.0)


def epsilon_greedy(key, q_values, epsilon):
    """Per row of `q_values` [..., A]: a uniformly random action with probability epsilon, else
    argmax_a Q (first index on ties). int32 [...].

    Both choices come from one draw of two uniforms per row, (u, v) in [0, 1)^2: explore if
    u < epsilon, and the random action is floor(A v), uniform up to float32's 2^-23 grid of v
    (exactly uniform when A is a power of two)."""
    u = jax.random.uniform(key, q_values.shape[:-1] + (2,))
    num_actions = q_values.shape[-1]
    random_action = jnp.minimum(
        jnp.floor(u[..., 1] * num_actions).astype(jnp.int32), num_actions - 1
    )
    return jnp.where(u[..., 0] < epsilon, random_action, jnp.argmax(q_values, axis=-1)).astype(
        jnp.int32
    )


def epsilon_greedy_random_ties(q_values, epsilon, explore_u, choice_u):
    """Epsilon-greedy over one row `q_values` [A] with uniformly random tie-breaking, from two
    uniforms in [0, 1).

    The candidates are every action if explore_u < epsilon, else the maximisers of Q; the action is
    candidate floor(choice_u * #candidates), so P(a) = epsilon / A + (1 - epsilon) [a maximal] / #maximal.
    """
    candidates = jnp.where(explore_u < epsilon, True, q_values == q_values.max())
    count = candidates.sum()
    pick = jnp.minimum(jnp.floor(choice_u * count).astype(jnp.int32), count - 1)
    rank = jnp.cumsum(candidates) - 1
    return jnp.argmax(candidates & (rank == pick)).astype(jnp.int32)


def global_norm(tree) -> jax.Array:
    """||g|| = sqrt(sum over every element of every leaf of g^2), as one reduction over the leaves
    concatenated (XLA fuses the concatenation into it: one kernel, not one per leaf)."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return jnp.float32(0.0)
    return jnp.sqrt(
        jnp.sum(jnp.concatenate([jnp.square(jnp.ravel(g).astype(jnp.float32)) for g in leaves]))
    )


def clip_by_global_norm(max_norm) -> optax.GradientTransformationExtraArgs:
    """g <- g where ||g|| < max_norm, else g max_norm / ||g|| (`global_norm`); stateless. The same
    rule as `optax.clip_by_global_norm`, whose norm reduces each leaf apart. The extra argument
    `grad_sq_norm` (optional, passed through `optax.chain`) is ||g||^2 of the updates this transform
    receives, computed already: no norm pass. So the clip must come first in a chain given it."""

    def update(updates, state, params=None, *, grad_sq_norm=None, **extra_args):
        norm = global_norm(updates) if grad_sq_norm is None else jnp.sqrt(grad_sq_norm)
        return jax.tree.map(
            lambda g: jnp.where(norm < max_norm, g, g / norm.astype(g.dtype) * max_norm), updates
        ), state

    return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update)


def clipped_adam(learning_rate, max_grad_norm, eps: float = 1e-8):
    """Adam (step size `learning_rate`: a value or a schedule of the update count) on gradients
    clipped to global norm `max_grad_norm`: g <- g min(1, max_grad_norm / ||g||)."""
    return optax.chain(clip_by_global_norm(max_grad_norm), optax.adam(learning_rate, eps=eps))


def annealed_clipped_adam(agent: OnPolicyLoopConfig, lr, max_grad_norm, eps: float = 1e-5):
    """`clipped_adam` whose step size, with `agent.anneal_lr`, decays linearly to 0 over the run:
    lr (1 - update / num_updates), one update being num_epochs * num_minibatches Adam steps."""
    steps_per_update = agent.num_epochs * agent.num_minibatches

    def learning_rate(count):
        if not agent.anneal_lr:
            return lr
        return lr * (1.0 - (count // steps_per_update) / agent.num_updates)

    return clipped_adam(learning_rate, max_grad_norm, eps=eps)


# ---------------------------------------------------------------- rollouts and minibatches


def rollout_keys(key, num_steps: int, num_envs: int):
    """Per rollout step: the action key and one env key per env (split up front, outside the loop)."""
    pairs = jax.vmap(jax.random.split)(jax.random.split(key, num_steps))
    return pairs[:, 0], jax.vmap(lambda k: jax.random.split(k, num_envs))(pairs[:, 1])


PACKED_OUTPUT_MAX = (
    4096  # most elements per step of an output leaf that `scan_packed_outputs` packs
)


def scan_packed_outputs(step: Callable, carry, xs, *, length: int | None = None, unroll: int = 1):
    """`jax.lax.scan(step, carry, xs, length, unroll=unroll)`, the same (carry, stacked outputs) bit for bit,
    with the per-step output leaves of at most `PACKED_OUTPUT_MAX` elements stored as one row of
    `buffers.pack`'s blocks (32-bit leaves and small narrow ones bitcast into one uint32 row, other
    dtypes one row each) and unpacked after the loop. Stacking a leaf costs a dynamic-update-slice
    per loop trip; a rollout step's transition (observation, action, log-prob, reward, terminated,
    truncated, final observation) becomes one or two instead of one per leaf. Larger leaves (image
    observations) are stacked as they are, so no large output is copied once more after the loop
    (unpacking slices the small ones out of the stacked rows)."""
    packed_layout = []  # filled while tracing `packed_step`

    def is_small(leaf) -> bool:
        return int(np.prod(jnp.shape(leaf))) <= PACKED_OUTPUT_MAX

    def packed_step(carry, x):
        carry, out = step(carry, x)
        leaves, treedef = jax.tree.flatten(out)
        small = [leaf for leaf in leaves if is_small(leaf)]
        large = [leaf for leaf in leaves if not is_small(leaf)]
        layout = buffers.storage_layout(small)
        packed_layout.append((treedef, [is_small(leaf) for leaf in leaves], layout))
        return carry, (buffers.pack(layout, small) if small else (), large)

    carry, (blocks, large) = jax.lax.scan(packed_step, carry, xs, length, unroll=unroll)
    treedef, small_flags, layout = packed_layout[-1]
    small = iter(buffers.unpack(layout, blocks) if blocks else [])
    large = iter(large)
    return carry, treedef.unflatten([next(small) if flag else next(large) for flag in small_flags])


def minibatch_epochs(
    minibatch_step: Callable,
    carry,
    batch,
    key,
    num_epochs: int,
    num_minibatches: int,
    unroll: int = 1,
    refresh: Callable | None = None,
):
    """`num_epochs` passes over `batch` (a pytree of arrays with a leading batch axis), each a
    `lax.scan` of `minibatch_step(carry, minibatch) -> (carry, stats)` over `num_minibatches`
    minibatches of a fresh random permutation (`unroll` steps per loop trip). With `refresh`, every
    epoch after the first passes over `refresh(carry, batch)` from the carry at its start instead.
    Returns (carry, stats [num_epochs, num_minibatches])."""
    size = jax.tree.leaves(batch)[0].shape[0]
    shape = (num_minibatches, size // num_minibatches)

    def epoch(carry, key, batch=batch):
        order = jax.random.permutation(key, size)
        minibatches = jax.tree.map(
            lambda x: jnp.take(x, order, axis=0).reshape(shape + x.shape[1:]), batch
        )
        return jax.lax.scan(minibatch_step, carry, minibatches, unroll=min(unroll, num_minibatches))

    keys = jax.random.split(key, num_epochs)
    if refresh is None or num_epochs == 1:
        return jax.lax.scan(epoch, carry, keys)
    carry, first = epoch(carry, keys[0])
    carry, rest = jax.lax.scan(
        lambda carry, key: epoch(carry, key, refresh(carry, batch)), carry, keys[1:]
    )
    return carry, jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), first, rest)


# ---------------------------------------------------------------- target networks


def polyak(target, online, tau):
    """tau * online + (1 - tau) * target, leaf by leaf (tau = 1: a copy)."""
    return jax.tree.map(lambda t, o: tau * o + (1.0 - tau) * t, target, online)


def periodic_polyak(target, online, tau, do_update):
    """`polyak(target, online, tau)` where `do_update` (a traced bool), else `target` unchanged."""
    return jax.tree.map(
        lambda t, o: jnp.where(do_update, tau * o + (1.0 - tau) * t, t), target, online
    )


# ---------------------------------------------------------------- episode statistics


class EpisodeTotals(NamedTuple):
    """Sums over the episodes that ended in a period: return, length and how many ended."""

    returns: jax.Array
    lengths: jax.Array
    count: jax.Array


def no_episodes(shape: tuple[int, ...] = ()) -> EpisodeTotals:
    """Zero totals: one set, or one per element of `shape` (e.g. per env, for `count_episodes`)."""
    return EpisodeTotals(
        jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.int32), jnp.zeros(shape, jnp.int32)
    )


def add_episodes(totals: EpisodeTotals, info: dict) -> EpisodeTotals:
    """`totals` plus the episodes that end in `info` (from `EpisodeStatistics`, any batch shape):
    sum(done * episode_return), sum(done * episode_length), sum(done)."""
    return add_totals(totals, count_episodes(no_episodes(jnp.shape(info["episode_done"])), info))


def count_episodes(totals: EpisodeTotals, info: dict) -> EpisodeTotals:
    """`add_episodes` element by element, with no sum (`totals` has the shape of `info`'s batch, e.g.
    one set per env): totals + (done * episode_return, done * episode_length, done). A rollout that
    carries these per env writes no per-step episode arrays; `add_totals` sums them once after it."""
    done = info["episode_done"]
    return EpisodeTotals(
        totals.returns + jnp.where(done, info["episode_return"], 0.0),
        totals.lengths + jnp.where(done, info["episode_length"], 0),
        totals.count + done.astype(jnp.int32),
    )


def add_totals(totals: EpisodeTotals, more: EpisodeTotals) -> EpisodeTotals:
    """`totals` plus every element of `more` (per-env totals from `count_episodes`), summed."""
    return EpisodeTotals(
        totals.returns + jnp.sum(more.returns),
        totals.lengths + jnp.sum(more.lengths),
        totals.count + jnp.sum(more.count),
    )


def episode_metrics(totals: EpisodeTotals) -> dict:
    """Mean return and length of the episodes in `totals` (NaN if none ended) and their number."""
    some = totals.count > 0
    count = jnp.maximum(totals.count, 1)
    return {
        "episode_return": jnp.where(some, totals.returns / count, jnp.nan),
        "episode_length": jnp.where(some, totals.lengths / count, jnp.nan),
        "episodes": totals.count,
    }


# ---------------------------------------------------------------- off-policy phase and log points


def act_then_train(
    env_step: Callable,
    gradient_step: Callable,
    env_iterations: int,
    gradient_steps: int,
    learning_starts: int,
    unroll: int = 1,
) -> Callable:
    """`phase((state, totals), key) -> ((state, totals), aux)`: `env_iterations` calls of
    `env_step((state, totals), key) -> ((state, totals), None)`, then, once
    state["step"] >= learning_starts, `gradient_steps` calls of `gradient_step(state, key) ->
    (state, aux)`; aux is stacked over the gradient steps ([gradient_steps, ...], NaN before learning).
    Each of the two loops runs up to `unroll` calls per loop trip (the same computation)."""

    def train(state, keys):
        return jax.lax.scan(gradient_step, state, keys, unroll=min(unroll, gradient_steps))

    def skip(state, keys):
        shapes = jax.eval_shape(train, state, keys)[1]
        return state, jax.tree.map(lambda s: jnp.full(s.shape, jnp.nan, s.dtype), shapes)

    def phase(carry, key):
        keys = jax.random.split(
            key, env_iterations + gradient_steps
        )  # one split for the whole phase
        (state, totals), _ = jax.lax.scan(
            env_step, carry, keys[:env_iterations], unroll=min(unroll, env_iterations)
        )
        state, aux = jax.lax.cond(
            state["step"] >= learning_starts, train, skip, state, keys[env_iterations:]
        )
        return (state, totals), aux

    return phase


def phase_unroll(unroll: int, env_iterations: int, gradient_steps: int) -> int:
    """Phases per loop trip for a budget of `unroll` iterations per trip: the phases' own loops take
    up to `unroll` iterations each, so the loop over phases unrolls what is left,
    max(1, unroll // max(env_iterations, gradient_steps))."""
    return max(1, unroll // max(env_iterations, gradient_steps))


def scan_log_points(log_period: Callable, state, num_log_points: int):
    """`lax.scan` of `log_period(state) -> (state, metrics)` over `num_log_points` log points, each
    log point's metrics sent to the host sinks (`rl.logging.emit`). Returns (state, stacked metrics)."""

    def body(state, _):
        state, metrics = log_period(state)
        return state, emit(metrics)

    return jax.lax.scan(body, state, None, length=num_log_points)


def replay_state(key, params, opt_state, buffer, obs, env_state, **extra) -> dict:
    """A replay agent's training state: online and target params (equal at the start), optimiser
    state, replay buffer, the envs' observations and states, the PRNG key, and the env-step and
    gradient-step counters, plus any `extra` entries."""
    return {
        "params": params,
        "target_params": params,
        "opt_state": opt_state,
        "buffer": buffer,
        **extra,
        "obs": obs,
        "env_state": env_state,
        "key": key,
        "step": jnp.int32(0),
        "updates": jnp.int32(0),
    }


def step_and_store(env, env_params, num_envs: int, carry, action, key):
    """All envs take `action`; each transition (s, a, r, s' = info["final_obs"], terminated) goes to
    the uniform replay buffer `state["buffer"]`, the step counter advances by `num_envs`, and the
    episodes that ended are added to the totals. `carry` = (state, totals); returns ((state, totals), None)."""
    state, totals = carry
    _, step = batched(env)
    obs, env_state, reward, terminated, _, info = step(
        jax.random.split(key, num_envs), state["env_state"], action, env_params
    )
    transition = {
        "obs": state["obs"],
        "action": action,
        "reward": reward,
        "next_obs": info["final_obs"],
        "terminated": terminated,
    }
    state = {
        **state,
        "buffer": buffers.uniform_add(state["buffer"], transition),
        "obs": obs,
        "env_state": env_state,
        "step": state["step"] + num_envs,
    }
    return (state, add_episodes(totals, info)), None


def replay_epsilon(agent: ReplayLoopConfig, hparams, step):
    """Epsilon after `step` env steps: linear from epsilon_start to epsilon_end over epsilon_decay_steps."""
    return linear_schedule(
        hparams["epsilon_start"], hparams["epsilon_end"], agent.epsilon_decay_steps, step
    )


def off_policy_log_period(
    env,
    env_params,
    num_phases: int,
    eval_episodes: int,
    greedy_policy: Callable,
    extra_metrics: Callable,
    phase: Callable,
    state,
    unroll: int = 1,
):
    """One log period of an off-policy agent: `num_phases` act-then-train phases (`unroll` per loop
    trip), then the period's episode statistics, `extra_metrics(state)`, the mean of each
    gradient-step aux (NaN before learning), and the mean return of `eval_episodes` episodes of
    `greedy_policy(params) -> (obs -> action)` on fresh envs (none if 0)."""
    key, phase_key, eval_key = jax.random.split(state["key"], 3)
    (state, totals), aux = jax.lax.scan(
        phase,
        ({**state, "key": key}, no_episodes()),
        jax.random.split(phase_key, num_phases),
        unroll=min(unroll, num_phases),
    )
    metrics = {"step": state["step"], **episode_metrics(totals), **extra_metrics(state)}
    metrics.update({name: jnp.nanmean(value) for name, value in aux.items()})
    if eval_episodes:
        metrics["eval_return"] = greedy_episodes(
            env, env_params, greedy_policy(state["params"]), eval_key, eval_episodes
        )[0].mean()
    return state, metrics


def off_policy_trainer(
    agent,
    env,
    env_params,
    init: Callable,
    env_step: Callable,
    gradient_step: Callable,
    greedy_policy: Callable,
    extra_metrics: Callable,
    env_iterations: int,
    phases_per_log: int,
) -> Trainer:
    """The Trainer of an off-policy agent: `init(key, hparams) -> state`; each log point is
    `off_policy_log_period` over `phases_per_log` `act_then_train` phases of `env_iterations` calls of
    `env_step(hparams, (state, totals), key)` and `agent.gradient_steps` calls of
    `gradient_step(hparams, state, key) -> (state, aux dict)`; `extra_metrics(hparams, state)`.
    `agent.unroll` iterations per loop trip: the phases' loops first, then the loop over phases
    (`phase_unroll`)."""

    def run(state, hparams, num_log_points):
        phase = act_then_train(
            partial(env_step, hparams),
            partial(gradient_step, hparams),
            env_iterations,
            agent.gradient_steps,
            agent.learning_starts,
            agent.unroll,
        )
        log_period = partial(
            off_policy_log_period,
            env,
            env_params,
            phases_per_log,
            agent.eval_episodes,
            greedy_policy,
            partial(extra_metrics, hparams),
            phase,
            unroll=phase_unroll(agent.unroll, env_iterations, agent.gradient_steps),
        )
        return scan_log_points(log_period, state, num_log_points)

    return Trainer(init=init, run=run, num_log_points=agent.total_steps // agent.log_interval)


def replay_trainer(
    agent: ReplayLoopConfig,
    env,
    env_params,
    init: Callable,
    env_step: Callable,
    gradient_step: Callable,
    greedy_policy: Callable,
) -> Trainer:
    """`off_policy_trainer` with the replay loop's shape: phases of `train_freq // num_envs` env
    iterations, `log_interval // train_freq` phases per log point, epsilon and the gradient-step count logged."""
    extra = lambda hparams, state: {
        "epsilon": replay_epsilon(agent, hparams, state["step"]),
        "gradient_steps": state["updates"],
    }
    return off_policy_trainer(
        agent,
        env,
        env_params,
        init,
        env_step,
        gradient_step,
        greedy_policy,
        extra,
        agent.train_freq // agent.num_envs,
        agent.log_interval // agent.train_freq,
    )


def actor_critic_trainer(
    agent: ReplayActorCriticConfig,
    env,
    env_params,
    init: Callable,
    env_step: Callable,
    gradient_step: Callable,
    greedy_policy: Callable,
    extra_metrics: Callable,
) -> Trainer:
    """`off_policy_trainer` with the actor-critic loop's shape: one env iteration per phase,
    `log_interval // num_envs` phases per log point; `extra_metrics(state)`."""
    return off_policy_trainer(
        agent,
        env,
        env_params,
        init,
        env_step,
        gradient_step,
        greedy_policy,
        lambda hparams, state: extra_metrics(state),
        1,
        agent.log_interval // agent.num_envs,
    )


def kernel_backend(config) -> str:
    """The kernel backend the agent passes to every kernels op, fixed when the agent is built:
    `config.kernels.backend` resolved by `kernels.resolve_backend` (a named backend that cannot run
    raises `kernels.BackendUnavailableError` here). Where that is the automatic choice ("auto" with
    no process-wide setting and no FUSEDRL_KERNEL_BACKEND), "auto" itself, so that each op picks by
    the device and, where it measured XLA faster at small shapes, by its own shape."""
    name = kernels.resolve_backend(config.kernels.backend)
    return "auto" if kernels.launch.chosen_automatically(config.kernels.backend) else name


# ---------------------------------------------------------------- PPO's loop (PPO, recurrent PPO)


@dataclass(frozen=True)
class PPOLoopConfig(OnPolicyLoopConfig):
    """Settings of PPO's loop, which PPO and recurrent PPO extend: `OnPolicyLoopConfig`'s rollouts and
    epochs of shuffled minibatches (PPO's defaults: 4 envs x 128 steps, 4 minibatches), each minibatch
    an Adam step on PPO's clipped loss (`ppo_minibatch_loss`), advantages from truncation-aware GAE."""

    num_envs: int = hp(4, low=1, doc="parallel envs")
    num_steps: int = hp(128, low=1, doc="rollout length per env per update")
    num_minibatches: int = hp(4, low=1, doc="minibatches per pass")
    lr: float = hp(
        2.5e-4,
        low=0.0,
        low_open=True,
        sweep=True,
        doc="Adam step size (annealed to 0 if anneal_lr)",
    )
    gamma: float = hp(0.99, low=0.0, high=1.0, sweep=True, doc="discount")
    gae_lambda: float = hp(0.95, low=0.0, high=1.0, sweep=True, doc="GAE lambda")
    clip_eps: float = hp(0.2, low=0.0, sweep=True, doc="surrogate clip range")
    clip_value_loss: bool = hp(True, doc="clip the value update around the old values")
    vf_clip_eps: float = hp(0.2, low=0.0, sweep=True, doc="value clip range (if clip_value_loss)")
    ent_coef: float = hp(0.01, low=0.0, sweep=True, doc="entropy bonus coefficient")
    vf_coef: float = hp(0.5, low=0.0, sweep=True, doc="value loss coefficient")
    max_grad_norm: float = hp(
        0.5, low=0.0, low_open=True, sweep=True, doc="global gradient-norm clip"
    )
    adam_eps: float = hp(
        1e-5,
        low=0.0,
        low_open=True,
        doc="Adam's epsilon (1e-5: the PPO implementations' usual; 1e-8: optax's and Brax's)",
    )
    normalize_advantages: bool = hp(True, doc="normalise advantages per minibatch")
    reward_scale: float = hp(
        1.0, low=0.0, low_open=True, sweep=True, doc="rewards are multiplied by this for learning"
    )
    shared_network: bool = hp(False, doc="one torso for actor and critic")
    continuous_policy: str = hp(
        "gaussian",
        choices=("gaussian", "tanh_gaussian"),
        doc="policy for Box actions: a Gaussian with a learned state-independent log-std, its samples clipped to the bounds; or a tanh-squashed Gaussian with a state-dependent scale softplus(x) + 0.001 (Brax's PPO)",
    )
    log_std_init: float = hp(
        0.0, doc="initial log-std of the gaussian policy (continuous_policy: gaussian)"
    )

    def validate(self):
        if self.batch_size % self.num_minibatches:
            raise ConfigError(
                f"agent.num_minibatches ({self.num_minibatches}) must divide agent.num_envs * agent.num_steps ({self.batch_size})"
            )
        if self.num_updates < 1 or self.num_updates % self.log_interval:
            raise ConfigError(
                total_steps_problem(self.total_steps, self.batch_size, self.log_interval)
            )


def total_steps_problem(total_steps: int, batch_size: int, log_interval: int) -> str:
    """The message for a total_steps whose whole updates (total_steps // batch_size) are not a positive
    multiple of log_interval, with the nearest values that work: the multiples of batch_size * log_interval."""
    unit = batch_size * log_interval
    below = total_steps // unit * unit
    valid = [value for value in (below, below + unit) if value > 0]
    updates = total_steps // batch_size
    return (
        f"agent.total_steps ({total_steps}) gives {updates} updates of agent.num_envs * agent.num_steps = {batch_size} steps, "
        f"which must be a positive multiple of agent.log_interval ({log_interval}); nearest valid: "
        + " or ".join(f"agent.total_steps={value}" for value in valid)
        + f" (multiples of {batch_size} * {log_interval} = {unit})"
    )


def check_policy_env(config, env, env_params) -> None:
    """ConfigError unless the env's actions are Discrete or a bounded Box (a policy-gradient agent's
    categorical or Gaussian policy)."""
    space, name = env.action_space(env_params), config.agent.name
    if isinstance(space, Box) and not (
        np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))
    ):
        raise ConfigError(f"env.id: {name} needs bounded Box actions; {config.env.id} has {space}")
    if not isinstance(space, (Box, Discrete)):
        raise ConfigError(
            f"env.id: {name} needs Discrete or Box actions; {config.env.id} has {space}"
        )


def policy_head(agent: PPOLoopConfig, env, env_params) -> tuple[Callable, str]:
    """(head, distribution) for the env's actions: for Box actions a diagonal Gaussian head
    (initial log-std `agent.log_std_init`) or, with `agent.continuous_policy: tanh_gaussian`, a
    tanh-squashed one with a state-dependent scale; else a categorical one. The distribution is
    one of `losses.DISTRIBUTIONS`."""
    space = env.action_space(env_params)
    if not isinstance(space, Box):
        return networks.categorical_policy_head(int(space.n)), "categorical"
    action_dim = int(np.prod(space.shape))
    if agent.continuous_policy == "tanh_gaussian":
        return networks.tanh_gaussian_policy_head(action_dim), "tanh_gaussian"
    return networks.gaussian_policy_head(action_dim, agent.log_std_init), "gaussian"


def sample_action(policy, key, distribution: str):
    """A sample of the policy: mean + sigma N(0, I) (for the tanh Gaussian the pre-squash sample u,
    which is what is stored and scored), or a categorical index (int32)."""
    if distribution == "categorical":
        return jax.random.categorical(key, policy).astype(jnp.int32)
    mean, log_std = policy
    return mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)


def env_action(action, distribution: str):
    """What the env is sent for a sampled or greedy action: tanh(u) for the tanh Gaussian (in
    [-1, 1]^d), else the action itself (`make_env`'s RescaleAction clips a Gaussian's)."""
    return jnp.tanh(action) if distribution == "tanh_gaussian" else action


def greedy_action(policy, distribution: str):
    """The argmax of the logits, or the Gaussian's mean (the pre-squash mean for the tanh Gaussian:
    `env_action` squashes it)."""
    if distribution == "categorical":
        return jnp.argmax(policy, axis=-1).astype(jnp.int32)
    return policy[0]


def ppo_optimizer(agent: PPOLoopConfig, hparams):
    """`annealed_clipped_adam` with the swept lr and max_grad_norm, Adam's eps `agent.adam_eps`."""
    return annealed_clipped_adam(agent, hparams["lr"], hparams["max_grad_norm"], eps=agent.adam_eps)


def ppo_minibatch_loss(
    policy,
    values,
    actions,
    old_log_probs,
    old_values,
    advantages,
    targets,
    hparams,
    agent: PPOLoopConfig,
    distribution: str,
    backend: str,
):
    """(L, stats) = `losses.ppo_loss` of a minibatch from the current network's outputs on it (`policy`,
    `values`), advantages normalised first if `agent.normalize_advantages`. Any batch shape."""
    log_prob, entropy = losses.policy_log_prob_entropy(policy, actions, distribution, backend)
    if agent.normalize_advantages:
        advantages = losses.normalize(advantages)
    return losses.ppo_loss(
        log_prob,
        entropy,
        values,
        old_log_probs,
        old_values,
        advantages,
        targets,
        hparams["clip_eps"],
        hparams["vf_clip_eps"],
        hparams["ent_coef"],
        hparams["vf_coef"],
        agent.clip_value_loss,
    )


def flat_minibatch_epochs(
    agent: OnPolicyLoopConfig,
    optimizer,
    grads: Callable,
    params,
    opt_state,
    batch,
    key,
    refresh: Callable | None = None,
    flat_grads: Callable | None = None,
):
    """`minibatch_epochs` of optimiser steps along `grads(params, minibatch) -> (gradient, stats)`,
    the optimiser on one flat parameter vector (one fused update instead of one per array; `opt_state`
    is `optimizer.init(ravel_pytree(params)[0])`). The batch's leading axis is what minibatches split:
    transitions, or whole env sequences. `refresh(params, batch) -> batch` (optional): each epoch after
    the first learns from it, at that epoch's params. `flat_grads(flat_params, minibatch) -> (flat
    gradient, ||gradient||^2, stats)` (optional) replaces `grads`: a gradient computed on the flat
    vector itself, with its squared norm for the clip (`clip_by_global_norm`'s `grad_sq_norm`, passed
    to `optimizer.update` as an optax extra argument: the optimiser must start with that clip, as
    `clipped_adam` does; one that takes no extra arguments ignores it), so the step neither cuts the
    vector into arrays nor concatenates the gradient nor re-reads it for the norm. Returns (params,
    opt_state, stats [epochs, minibatches])."""
    flat_params, unravel = ravel_pytree(params)
    optimizer = optax.with_extra_args_support(optimizer)

    def minibatch_step(carry, minibatch):
        flat_params, opt_state = carry
        if flat_grads is None:
            g, stats = grads(unravel(flat_params), minibatch)
            updates, opt_state = optimizer.update(ravel_pytree(g)[0], opt_state, flat_params)
        else:
            g, sq_norm, stats = flat_grads(flat_params, minibatch)
            updates, opt_state = optimizer.update(g, opt_state, flat_params, grad_sq_norm=sq_norm)
        return (optax.apply_updates(flat_params, updates), opt_state), stats

    epoch_batch = (
        None if refresh is None else (lambda carry, batch: refresh(unravel(carry[0]), batch))
    )
    (flat_params, opt_state), stats = minibatch_epochs(
        minibatch_step,
        (flat_params, opt_state),
        batch,
        key,
        agent.num_epochs,
        agent.num_minibatches,
        agent.unroll,
        epoch_batch,
    )
    return unravel(flat_params), opt_state, stats


def on_policy_log_period(agent: OnPolicyLoopConfig, update: Callable, evaluate: Callable, state):
    """`agent.log_interval` calls of `update(state, totals) -> (state, totals, stats)`, then the log
    point's metrics: env steps, the mean return and length of the episodes that ended, the mean
    stats, and (eval_envs > 0) `evaluate(params, key) -> (mean return, mean length)` of greedy episodes."""

    def one_update(carry, _):
        state, totals, stats = update(*carry)
        return (state, totals), stats

    (state, totals), stats = jax.lax.scan(
        one_update, (state, no_episodes()), None, length=agent.log_interval
    )
    metrics = {"step": state["step"], **episode_metrics(totals), **jax.tree.map(jnp.mean, stats)}
    if agent.eval_envs:
        key, eval_key = jax.random.split(state["key"])
        state = {**state, "key": key}
        metrics["eval_return"], metrics["eval_length"] = evaluate(state["params"], eval_key)
    return state, metrics


def on_policy_trainer(
    agent: OnPolicyLoopConfig,
    init: Callable,
    update: Callable,
    evaluate: Callable,
    per_env=("obs", "env_state"),
) -> Trainer:
    """The Trainer of an on-policy agent: `init(key, hparams) -> state`; each log point is
    `on_policy_log_period` over `update(hparams, state, totals)` and `evaluate(params, key)`."""

    def run(state, hparams, num_log_points):
        return scan_log_points(
            partial(on_policy_log_period, agent, partial(update, hparams), evaluate),
            state,
            num_log_points,
        )

    return Trainer(
        init=init,
        run=run,
        num_log_points=agent.num_updates // agent.log_interval,
        per_env=tuple(per_env),
    )
