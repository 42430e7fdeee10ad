"""Recurrent PPO: PPO (rl/agents/ppo.py) on a GRU or LSTM torso, so that the policy and the value
read the history of observations (for partially observable envs, e.g. CartPole with its
velocities hidden: `env.observe: positions`). The carry h_t = cell(h_{t-1}, obs_t) is put back to
the initial (zero) state where obs_t begins an episode (`Memory`); separate actor and critic
torsos unless `shared_network`. Minibatches are whole env sequences (`update`); the greedy policy
(`make_policy`, a `rl.agents.trainer.RecurrentPolicy`) starts every episode from the initial state.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from rl.agents import ppo
from rl.agents.trainer import RecurrentPolicy, Trainer, train_from_trainer
from rl.config.loops import PPOLoopConfig
from rl.config.parsing import ConfigError
from rl.config.unrolling import unroll_of
from rl.core import collection, environment, episodes, log_points, minibatches, optimizers
from rl.core.losses import truncation_aware_gae
from rl.core.rollout import greedy_episodes
from rl.core.state import Envs, OnPolicyState
from rl.nn import layers, networks
from rl.nn.network_config import RECURRENT_TORSOS, NetworkConfig, network_config

RECURRENT = True  # takes a recurrent torso (rl.config.check_recurrence)
EPISODE_INFO = ("episode_done", "episode_return", "episode_length")


@dataclass(frozen=True)
class Config(PPOLoopConfig):
    name: str = "ppo_rnn"
    network: NetworkConfig = network_config(
        torso="gru", hidden=(128,), recurrent_hidden=128, activation="relu"
    )

    def validate(self):
        if not self.network.recurrent:
            raise ConfigError(
                f"agent.network.torso: {self.name} needs a recurrent torso "
                f"({' or '.join(RECURRENT_TORSOS)}), got {self.network.torso!r}; "
                f"for a feedforward torso use agent {self.name.removesuffix('_rnn')}"
            )
        if self.num_envs % self.num_minibatches:
            raise ConfigError(
                f"agent.num_minibatches ({self.num_minibatches}) must divide agent.num_envs "
                f"({self.num_envs}): a minibatch holds the whole sequences of some envs"
            )
        super().validate()


def check_env(config, env, env_params) -> None:
    """Recurrent PPO needs Discrete or bounded Box actions."""
    environment.check_policy_env(config, env, env_params)


# ---------------------------------------------------------------- the network


def make_network(agent: Config, env, env_params):
    """(network, initial_carry, distribution): `net.apply(params, carry, obs [T, *batch, ...], reset
    [T, *batch]) -> (carry, (policy head output, value))` (`networks.recurrent_actor_critic` on
    `agent.network`'s torso and `ppo.policy_head`), and `initial_carry(batch)` of its state."""
    space = env.action_space(env_params)
    head, distribution = networks.policy_head(space, agent.continuous_policy, agent.log_std_init)
    torso = networks.make_torso(agent.network, env.observation_space(env_params))
    fn = networks.recurrent_actor_critic(torso, head, shared=agent.shared_network)
    net = layers.build(fn, agent.network.backend, agent.network.init)
    return net, fn.initial_carry, distribution


def first_step(tree):
    """The only step of a T = 1 output."""
    return jax.tree.map(lambda x: x[0], tree)


class Setup(NamedTuple):
    """What the compiled program is built from, fixed per make_trainer: the network, its initial
    carry and policy distribution, the env (and its vmapped reset and step), the kernel backend."""

    agent: Config
    net: layers.Network
    initial_carry: Callable  # initial_carry(batch=()) -> the carry of a fresh episode
    distribution: type  # networks.Categorical, Gaussian or TanhGaussian, from the head's output
    env: Any
    env_params: Any
    reset: Any
    step: Any
    backend: str
    deterministic: bool = False  # kernels.deterministic: fixed-order GAE scan


def make_setup(config) -> Setup:
    env, env_params = environment.make_env(config)
    net, initial_carry, distribution = make_network(config.agent, env, env_params)
    reset, step = environment.batched(env)
    backend, deterministic = environment.kernel_backend(config), config.kernels.deterministic
    policy = (config.agent, net, initial_carry, distribution)
    return Setup(*policy, env, env_params, reset, step, backend, deterministic)


class Memory(NamedTuple):
    """The policy's memory of each env (`Envs.memory`): the carry h after the last observation read,
    and whether the env's observation begins an episode (the carry is reset before reading it)."""

    carry: Any
    reset: jax.Array


# ---------------------------------------------------------------- init


def init_state(s: Setup, key, hparams) -> OnPolicyState:
    """Fresh params, optimiser state and envs, the initial carry (every env begins an episode), the
    PRNG key and the counters."""
    key, net_key, reset_key = jax.random.split(key, 3)
    obs, env_state = s.reset(jax.random.split(reset_key, s.agent.num_envs), s.env_params)
    params = s.net.init(net_key, s.initial_carry(), obs[:1], jnp.ones((1,), jnp.bool_))
    adam = optimizers.annealed_clipped_adam(
        s.agent, hparams["lr"], hparams["max_grad_norm"], eps=s.agent.adam_eps
    )
    memory = Memory(s.initial_carry(s.agent.num_envs), jnp.ones((s.agent.num_envs,), jnp.bool_))
    envs = Envs(obs, env_state, memory)
    zero = jnp.int32(0)
    return OnPolicyState(params, adam.init(ravel_pytree(params)[0]), envs, key, zero, zero)


# ---------------------------------------------------------------- collect


class Transition(NamedTuple):
    """One rollout step, time-major [T, E, ...] when stacked."""

    obs: jax.Array
    reset: jax.Array  # obs begins an episode: the carry was reset before the cell read it
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array  # V(h_t)
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_obs: jax.Array
    carry: Any  # h_t, the state after reading obs (the pre-reset state for final_obs)
    episode: dict  # EpisodeStatistics' info: episode_done, episode_return, episode_length


def rollout(s: Setup, params, envs: Envs, key):
    """num_steps steps of every env under the policy, carrying the hidden state; returns the next
    envs and the Transitions [T, E, ...]."""

    def env_step(loop_state, keys):
        obs, done, carry, env_state = loop_state
        act_key, env_keys = keys
        carry, outputs = s.net.apply(params, carry, obs[None], done[None])
        head, value = first_step(outputs)
        pi = s.distribution.from_head(head)
        action = pi.sample(act_key)
        log_prob, _ = pi.log_prob_entropy(action, backend="reference")  # as in ppo.rollout
        next_obs, env_state, reward, terminated, truncated, info = s.step(
            env_keys, env_state, pi.env_action(action), s.env_params
        )
        episode = {name: info[name] for name in EPISODE_INFO}
        final_obs = info["final_obs"]
        trans = Transition(
            obs,
            done,
            action,
            log_prob,
            value,
            reward,
            terminated,
            truncated,
            final_obs,
            carry,
            episode,
        )
        return (next_obs, terminated | truncated, carry, env_state), trans

    keys = collection.rollout_keys(key, s.agent.num_steps, s.agent.num_envs)
    loop_state = (envs.obs, envs.memory.reset, envs.memory.carry, envs.state)
    unroll = min(unroll_of(s.agent), s.agent.num_steps)
    (obs, done, carry, env_state), traj = jax.lax.scan(env_step, loop_state, keys, unroll=unroll)
    return Envs(obs, env_state, Memory(carry, done)), traj


# ---------------------------------------------------------------- values and advantages


def bootstrap_values(s: Setup, params, traj: Transition):
    """V(final_obs_t) [T, E], read with the pre-reset state: the cell's one step from carry h_t
    (no reset) on final_obs_t, for all T x E steps in one pass."""
    no_reset = jnp.zeros((1,) + traj.reset.shape, jnp.bool_)
    _, (_, values) = s.net.apply(params, traj.carry, traj.final_obs[None], no_reset)
    return values[0]


class Sequences(NamedTuple):
    """What the loss reads, env-major [E, T, ...]: each env's sequence and its initial state."""

    initial_carry: Any  # [E, ...]: h_{-1}, the carry at the start of the rollout
    obs: jax.Array
    reset: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array


def learn_batch(s: Setup, hparams, params, traj: Transition, initial_carry):
    """(Sequences, advantages, targets), env-major [E, T, ...]: truncation-aware GAE on the scaled
    rewards with the rollout's values and `bootstrap_values`."""
    advantages, targets = truncation_aware_gae(
        traj.reward * hparams["reward_scale"],
        traj.value,
        bootstrap_values(s, params, traj),
        traj.terminated,
        traj.truncated,
        hparams["gamma"],
        hparams["gae_lambda"],
        backend=s.backend,
        deterministic=s.deterministic,
    )
    env_major = lambda x: jnp.swapaxes(x, 0, 1)
    sequences = jax.tree.map(
        env_major, Sequences(None, traj.obs, traj.reset, traj.action, traj.log_prob, traj.value)
    )
    sequences = sequences._replace(initial_carry=initial_carry)
    return sequences, env_major(advantages), env_major(targets)


# ---------------------------------------------------------------- the minibatch loss


def minibatch_loss(s: Setup, hparams, params, minibatch):
    """`ppo.ppo_objective` of a minibatch of whole sequences (Sequences, advantages, targets;
    env-major), the network re-run over each from its initial state."""
    seqs, advantages, targets = minibatch
    swap = lambda x: jnp.swapaxes(x, 0, 1)
    _, outputs = s.net.apply(params, seqs.initial_carry, swap(seqs.obs), swap(seqs.reset))
    head, values = jax.tree.map(swap, outputs)
    pi = s.distribution.from_head(head)
    return ppo.ppo_objective(s, hparams, pi, values, seqs, advantages, targets)


# ---------------------------------------------------------------- one update


def update(s: Setup, hparams, state: OnPolicyState, totals: episodes.EpisodeTotals):
    """One recurrent PPO update: the rollout, carrying h (its carry at the start, h_{-1}, kept as
    each sequence's initial state); V(final_obs_t) read with the pre-reset state h_t
    (`bootstrap_values`); A, R = truncation_aware_gae(r * reward_scale, V(h_t), V(final_obs_t),
    terminated, truncated); then num_epochs passes, each shuffling the envs into num_minibatches
    groups of whole sequences in time order, the network re-run from each stored initial state
    with the same resets, one Adam step per minibatch on the flat parameter vector along
    `ppo.ppo_objective`. Returns (state, totals, mean loss stats)."""
    agent = s.agent
    key, rollout_key, shuffle_key = jax.random.split(state.key, 3)
    # collect
    envs, traj = rollout(s, state.params, state.envs, rollout_key)
    totals = episodes.add_episodes(totals, traj.episode)
    # values and advantages
    batch = learn_batch(s, hparams, state.params, traj, state.envs.memory.carry)
    # update epochs: minibatches of whole env sequences, Adam steps on the flat parameter vector
    loss = partial(minibatch_loss, s, hparams)
    params, opt_state, stats = minibatches.adam_epochs(
        agent, hparams, loss, state.params, state.opt_state, batch, shuffle_key
    )
    step, updates = state.step + agent.batch_size, state.updates + 1
    state = OnPolicyState(params, opt_state, envs, key, step, updates)
    return state, totals, jax.tree.map(jnp.mean, stats)


# ---------------------------------------------------------------- the program


def greedy_step(s: Setup, params, carry, obs):
    """One step of the greedy policy with memory on observations [*batch, ...] (no reset):
    (carry, env action)."""
    obs_ndim = len(s.env.observation_space(s.env_params).shape)
    no_reset = jnp.zeros((1,) + jnp.shape(obs)[: jnp.ndim(obs) - obs_ndim], jnp.bool_)
    carry, outputs = s.net.apply(params, carry, jnp.asarray(obs)[None], no_reset)
    pi = s.distribution.from_head(first_step(outputs)[0])
    return carry, pi.env_action(pi.mode())


def make_trainer(config) -> Trainer:
    """init, and run = log points of `agent.log_interval` updates each (their episodes and mean
    loss stats, and the greedy return of `agent.eval_envs` fresh envs, each from the initial
    carry)."""
    s = make_setup(config)
    agent = s.agent

    def log_period(hparams, state: OnPolicyState):
        one_update = partial(update, s, hparams)
        state, totals, stats = log_points.scan_updates(one_update, state, agent.log_interval)
        metrics = log_points.log_point_metrics(state.step, totals, stats)
        if not agent.eval_envs:
            return state, metrics
        key, eval_key = jax.random.split(state.key)
        act, carry = partial(greedy_step, s, state.params), s.initial_carry(agent.eval_envs)
        returns, lengths = greedy_episodes(
            s.env, s.env_params, act, eval_key, agent.eval_envs, carry=carry
        )
        metrics = {**metrics, "eval_return": returns.mean(), "eval_length": lengths.mean()}
        return state._replace(key=key), metrics

    def run(state, hparams, num_log_points):
        return log_points.scan_log_points(partial(log_period, hparams), state, num_log_points)

    return Trainer(partial(init_state, s), run, agent.num_updates // agent.log_interval)


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config) -> RecurrentPolicy:
    """The greedy policy with memory in the env's own action space: `initial_carry(batch=())`, and
    `step(params, carry, obs, key) -> (carry, action)` for one observation or a batch of them (the
    argmax of the logits, or the Gaussian mean mapped to the Box bounds; the key is unused)."""
    s = make_setup(config)

    def step(params, carry, obs, key):
        carry, action = greedy_step(s, params, carry, obs)
        return carry, environment.to_env_action(s.env, s.env_params, action)

    return RecurrentPolicy(initial_carry=s.initial_carry, step=step)
