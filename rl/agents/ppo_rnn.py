"""Recurrent PPO: PPO (rl/agents/ppo.py) on a GRU or LSTM torso, so that the policy and the value
read the history of observations, not only the last one (for partially observable envs, e.g.
CartPole with its velocities hidden: `env.observe: positions`, `envs.MaskObservation`).

The network carries a hidden state h (`recurrent.RecurrentTorso`): h_t = cell(h_{t-1}, obs_t), with
h_{t-1} put back to the initial (zero) state first where obs_t begins an episode, i.e. where the
previous step ended one, terminated or truncated (and at the very start). pi(.|h_t) and V(h_t) act
and value step t. One update:

    rollout      num_envs envs step num_steps times under the policy, carrying h; the carry at the
                 start of the rollout, h_{-1}, is kept with it (the initial state of each sequence)
    bootstrap    V(final_obs_t) = V(cell(h_t, final_obs_t)) for every step in one batched pass: the
                 observation the transition reached, read with the pre-reset state h_t (what the
                 agent would have read next had the episode gone on)
    advantages   A, R = truncation_aware_gae(r * reward_scale, V(h_t), V(final_obs_t), terminated, truncated)
    learn        num_epochs passes; each shuffles the envs into num_minibatches groups and keeps
                 their whole sequences in time order; the network re-runs each sequence from its
                 stored initial state, resetting at the same steps, and the minibatch loss is PPO's
                 (`loop.ppo_minibatch_loss`; the module docstring of rl/agents/ppo.py has it)

Discrete actions (categorical) and bounded Box actions (diagonal Gaussian in [-1, 1]^d, as PPO).
Separate actor and critic torsos (two cells, the carry a pair) unless `shared_network`. The greedy
policy (evaluation, `make_policy`, a `rl.trainer.RecurrentPolicy`) starts every episode from the
initial state and takes the argmax / the mean. The sweepable hyperparameters are PPO's.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from rl import agent_configs, collection, environment, episodes, loop, losses, networks
from rl.config_parsing import ConfigError
from rl.rollout import greedy_episodes
from rl.trainer import RecurrentPolicy, Trainer, train_from_trainer

RECURRENT = True  # takes a recurrent torso (rl.config.check_recurrence)
EPISODE_INFO = ("episode_done", "episode_return", "episode_length")


@dataclass(frozen=True)
class Config(agent_configs.PPOLoopConfig):
    name: str = "ppo_rnn"
    network: networks.NetworkConfig = networks.network_config(
        torso="gru", hidden=(128,), recurrent_hidden=128, activation="relu"
    )

    def validate(self):
        if not self.network.recurrent:
            raise ConfigError(
                f"agent.network.torso: ppo_rnn needs a recurrent torso ({' or '.join(networks.RECURRENT_TORSOS)}), "
                f"got {self.network.torso!r}; for a feedforward torso use agent ppo"
            )
        if self.num_envs % self.num_minibatches:
            raise ConfigError(
                f"agent.num_minibatches ({self.num_minibatches}) must divide agent.num_envs ({self.num_envs}): "
                "a minibatch holds the whole sequences of some envs"
            )
        super().validate()


def check_env(config, env, env_params) -> None:
    """Recurrent PPO needs Discrete or bounded Box actions."""
    environment.check_policy_env(config, env, env_params)


def make_network(agent: Config, env, env_params):
    """(network, initial_carry, distribution): `net.apply(params, carry, obs [T, *batch, ...], reset
    [T, *batch]) -> (carry, (policy, value))` (`networks.recurrent_actor_critic` on `agent.network`'s
    torso and `loop.policy_head`), and `initial_carry(batch)` of its state."""
    head, distribution = loop.policy_head(agent, env, env_params)
    fn = networks.recurrent_actor_critic(
        networks.make_torso(agent.network, env.observation_space(env_params)),
        head,
        shared=agent.shared_network,
    )
    return (
        networks.build(fn, agent.network.backend, agent.network.init),
        fn.initial_carry,
        distribution,
    )


def first_step(tree):
    """The only step of a T = 1 output."""
    return jax.tree.map(lambda x: x[0], tree)


# ---------------------------------------------------------------- the training program


class Setup(NamedTuple):
    """What the compiled program is built from, fixed per make_trainer."""

    agent: Config
    env: Any
    env_params: Any
    reset: Any  # vmapped env.reset
    step: Any  # vmapped env.step
    net: networks.Network
    initial_carry: Callable
    distribution: str  # losses.DISTRIBUTIONS
    backend: str  # kernel backend
    deterministic: bool = False  # kernels.deterministic: fixed-order GAE scan


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


class Sequences(NamedTuple):
    """What the loss reads, env-major [E, T, ...]: each env's sequence and its initial state."""

    initial_carry: Any  # [E, ...]: h_{-1}, the carry at the start of the rollout
    obs: jax.Array
    reset: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array


def init_state(s: Setup, key, hparams):
    """Fresh params, optimiser state and envs, the initial carry (every env begins an episode), the
    PRNG key and the counters."""
    key, net_key, reset_key = jax.random.split(key, 3)
    obs, env_state = s.reset(jax.random.split(reset_key, s.agent.num_envs), s.env_params)
    params = s.net.init(net_key, s.initial_carry(), obs[:1], jnp.ones((1,), jnp.bool_))
    return {
        "params": params,
        "opt_state": loop.ppo_optimizer(s.agent, hparams).init(ravel_pytree(params)[0]),
        "obs": obs,
        "done": jnp.ones((s.agent.num_envs,), jnp.bool_),  # obs begins an episode
        "carry": s.initial_carry(s.agent.num_envs),
        "env_state": env_state,
        "key": key,
        "step": jnp.int32(0),
        "update": jnp.int32(0),
    }


def rollout(s: Setup, params, obs, done, carry, env_state, key):
    """num_steps steps of every env under the policy, carrying the hidden state; returns the next
    (obs, done, carry, env_state) and the Transitions [T, E, ...]."""

    def env_step(loop_state, keys):
        obs, done, carry, env_state = loop_state
        act_key, env_keys = keys
        carry, outputs = s.net.apply(params, carry, obs[None], done[None])
        policy, value = first_step(outputs)
        action = loop.sample_action(policy, act_key, s.distribution)
        log_prob, _ = losses.policy_log_prob_entropy(
            policy, action, s.distribution, backend="reference"
        )  # as in ppo.rollout
        next_obs, env_state, reward, terminated, truncated, info = s.step(
            env_keys, env_state, loop.env_action(action, s.distribution), s.env_params
        )
        episode = {name: info[name] for name in EPISODE_INFO}
        trans = Transition(
            obs,
            done,
            action,
            log_prob,
            value,
            reward,
            terminated,
            truncated,
            info["final_obs"],
            carry,
            episode,
        )
        return (next_obs, terminated | truncated, carry, env_state), trans

    keys = collection.rollout_keys(key, s.agent.num_steps, s.agent.num_envs)
    return jax.lax.scan(
        env_step, (obs, done, carry, env_state), keys, unroll=min(s.agent.unroll, s.agent.num_steps)
    )


def bootstrap_values(s: Setup, params, traj: Transition):
    """V(final_obs_t) [T, E], read with the pre-reset state: the cell's one step from carry h_t
    (no reset) on final_obs_t, for all T x E steps in one pass."""
    no_reset = jnp.zeros((1,) + traj.reset.shape, jnp.bool_)
    _, (_, values) = s.net.apply(params, traj.carry, traj.final_obs[None], no_reset)
    return values[0]


def learn_batch(s: Setup, hparams, params, traj: Transition, initial_carry):
    """(Sequences, advantages, targets), env-major [E, T, ...]: truncation-aware GAE on the scaled
    rewards with the rollout's values and `bootstrap_values`."""
    advantages, targets = losses.truncation_aware_gae(
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
    return (
        sequences._replace(initial_carry=initial_carry),
        env_major(advantages),
        env_major(targets),
    )


def minibatch_loss(net, params, batch, hparams, agent: Config, distribution: str, backend: str):
    """(L, stats) = `loop.ppo_minibatch_loss` of a minibatch of whole sequences (Sequences, advantages,
    targets; env-major), the network re-run over each from its initial state."""
    seqs, advantages, targets = batch
    swap = lambda x: jnp.swapaxes(x, 0, 1)
    _, outputs = net.apply(params, seqs.initial_carry, swap(seqs.obs), swap(seqs.reset))
    policy, values = jax.tree.map(swap, outputs)
    return loop.ppo_minibatch_loss(
        policy,
        values,
        seqs.action,
        seqs.log_prob,
        seqs.value,
        advantages,
        targets,
        hparams,
        agent,
        distribution,
        backend,
    )


def update(s: Setup, hparams, state, totals: episodes.EpisodeTotals):
    """One recurrent PPO update: rollout, advantages, epochs over minibatches of env sequences
    (`loop.flat_minibatch_epochs` over the env axis). Returns (state, totals, mean loss stats)."""
    key, rollout_key, shuffle_key = jax.random.split(state["key"], 3)
    params = state["params"]
    (obs, done, carry, env_state), traj = rollout(
        s, params, state["obs"], state["done"], state["carry"], state["env_state"], rollout_key
    )
    totals = episodes.add_episodes(totals, traj.episode)
    batch = learn_batch(s, hparams, params, traj, state["carry"])

    def grads(params, minibatch):
        loss = lambda p: minibatch_loss(
            s.net, p, minibatch, hparams, s.agent, s.distribution, s.backend
        )
        (_, stats), g = jax.value_and_grad(loss, has_aux=True)(params)
        return g, stats

    params, opt_state, stats = loop.flat_minibatch_epochs(
        s.agent,
        loop.ppo_optimizer(s.agent, hparams),
        grads,
        params,
        state["opt_state"],
        batch,
        shuffle_key,
    )
    state = {
        "params": params,
        "opt_state": opt_state,
        "obs": obs,
        "done": done,
        "carry": carry,
        "env_state": env_state,
        "key": key,
        "step": state["step"] + s.agent.batch_size,
        "update": state["update"] + 1,
    }
    return state, totals, jax.tree.map(jnp.mean, stats)


def evaluate(s: Setup, params, key):
    """Mean return and length of the first episode of `eval_envs` fresh envs under the greedy policy,
    each starting from the initial state."""

    def act(carry, obs):
        carry, outputs = s.net.apply(
            params, carry, obs[None], jnp.zeros((1, obs.shape[0]), jnp.bool_)
        )
        policy, _ = first_step(outputs)
        return carry, loop.env_action(loop.greedy_action(policy, s.distribution), s.distribution)

    returns, lengths = greedy_episodes(
        s.env, s.env_params, act, key, s.agent.eval_envs, carry=s.initial_carry(s.agent.eval_envs)
    )
    return returns.mean(), lengths.mean()


def make_setup(config) -> Setup:
    env, env_params = environment.make_env(config)
    net, initial_carry, distribution = make_network(config.agent, env, env_params)
    return Setup(
        config.agent,
        env,
        env_params,
        *environment.batched(env),
        net,
        initial_carry,
        distribution,
        environment.kernel_backend(config),
        config.kernels.deterministic,
    )


def make_trainer(config) -> Trainer:
    s = make_setup(config)
    return loop.on_policy_trainer(
        s.agent,
        partial(init_state, s),
        partial(update, s),
        partial(evaluate, s),
        per_env=("obs", "done", "carry", "env_state"),
    )


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config) -> RecurrentPolicy:
    """The greedy policy with memory in the env's own action space: `initial_carry(batch=())`, and
    `step(params, carry, obs, key) -> (carry, action)` for one observation or a batch of them (the
    argmax of the logits, or the Gaussian mean mapped to the Box bounds; the key is unused)."""
    s = make_setup(config)
    obs_ndim = len(s.env.observation_space(s.env_params).shape)

    def step(params, carry, obs, key):
        no_reset = jnp.zeros((1,) + jnp.shape(obs)[: jnp.ndim(obs) - obs_ndim], jnp.bool_)
        carry, outputs = s.net.apply(params, carry, jnp.asarray(obs)[None], no_reset)
        policy, _ = first_step(outputs)
        return carry, environment.to_env_action(
            s.env,
            s.env_params,
            loop.env_action(loop.greedy_action(policy, s.distribution), s.distribution),
        )

    return RecurrentPolicy(initial_carry=s.initial_carry, step=step)
