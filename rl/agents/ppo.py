"""Proximal Policy Optimisation (PPO, clipped objective; Schulman et al. 2017) with truncation-aware
GAE, discrete and continuous actions, compiled end to end (PureJaxRL's make_train is the model).

One update (`update`): num_envs envs step num_steps times under the policy (`rollout`), the
advantages and value targets of `losses.truncation_aware_gae` (`learn_batch`), then num_epochs
passes of num_minibatches Adam steps on `losses.ppo_loss` (`learn`, `ppo_objective`). Variants
(the fused gradient, segment minibatches, decoupled PPO, observation normalisation) are picked
once (`learning_pieces`, rl/agents/ppo_variants.py).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from rl.agents import ppo_variants
from rl.agents.trainer import Trainer, train_from_trainer
from rl.config.loops import PPOLoopConfig
from rl.config.parsing import ConfigError, hp
from rl.config.unrolling import unroll_of
from rl.core import (
    collection,
    environment,
    episodes,
    log_points,
    losses,
    minibatches,
    observation_norm,
    optimizers,
)
from rl.core.rollout import greedy_episodes
from rl.core.state import Envs, OnPolicyState
from rl.nn import layers, networks
from rl.nn.network_config import NetworkConfig, network_config


@dataclass(frozen=True)
class Config(ppo_variants.VariantsConfig, PPOLoopConfig):
    """PPO's settings: PPOLoopConfig's, the variants' (`ppo_variants.VariantsConfig`), and more."""

    name: str = "ppo"
    network: NetworkConfig = network_config(hidden=(64, 64), activation="tanh")
    critic_hidden: typing.Optional[tuple[int, ...]] = hp(
        None,
        doc="hidden widths of the critic's torso when they differ from agent.network.hidden "
        "(separate torsos only)",
    )


def check_env(config, env, env_params) -> None:
    """PPO needs Discrete or bounded Box actions; `agent.critic_hidden` needs separate torsos."""
    environment.check_policy_env(config, env, env_params)
    widths, shared = config.agent.critic_hidden, config.agent.shared_network
    if widths is not None and shared:
        raise ConfigError(
            "agent.critic_hidden: a shared torso (agent.shared_network: true) has no separate "
            "critic widths"
        )
    if widths is not None and (not widths or any(width < 1 for width in widths)):
        raise ConfigError(f"agent.critic_hidden must list positive widths, got {list(widths)}")


# ---------------------------------------------------------------- the network and its policy


def make_network(agent: Config, env, env_params):
    """(network obs -> (policy head output, value), distribution): `agent.network`'s torso (the
    critic's with `agent.critic_hidden` if set), `networks.policy_head` and a value head."""
    space = env.action_space(env_params)
    head, distribution = networks.policy_head(space, agent.continuous_policy, agent.log_std_init)
    obs_space = env.observation_space(env_params)
    critic = None
    if agent.critic_hidden is not None:
        critic_config = dataclasses.replace(agent.network, hidden=tuple(agent.critic_hidden))
        critic = networks.make_torso(critic_config, obs_space)
    torso = networks.make_torso(agent.network, obs_space)
    fn = networks.actor_critic(torso, head, shared=agent.shared_network, critic_torso=critic)
    return layers.build(fn, agent.network.backend, agent.network.init), distribution


def network_params(agent: Config, params):
    """The network's params within the policy's: `{"network": ..., "obs_stats": {"mean", "var",
    "count"}}` with `agent.normalize_obs` (the running statistics of every rollout so far), else
    the params themselves."""
    return params["network"] if agent.normalize_obs else params


def policy_params(agent: Config, net_params, obs_stats):
    """The policy's params from the network's and the observation statistics."""
    return {"network": net_params, "obs_stats": obs_stats} if agent.normalize_obs else net_params


def network_input(agent: Config, params, obs):
    """What the network reads: obs, normalised with `agent.normalize_obs`."""
    if not agent.normalize_obs:
        return obs
    return observation_norm.normalize_observation(obs, params["obs_stats"], agent.obs_clip)


class Setup(NamedTuple):
    """What the compiled program is built from, fixed per make_trainer."""

    agent: Config
    env: Any
    env_params: Any
    reset: Any  # vmapped env.reset
    step: Any  # vmapped env.step
    net: layers.Network
    distribution: type  # networks.Categorical, Gaussian or TanhGaussian, from the head's output
    backend: str  # kernel backend (`environment.kernel_backend`), or "auto"
    deterministic: bool = False  # kernels.deterministic: fixed-order GAE scan
    dot_precision: str = "tf32"  # the fused kernel's matmuls (`environment.kernel_precision`)


def make_setup(config) -> Setup:
    env, env_params = environment.make_env(config)
    net, distribution = make_network(config.agent, env, env_params)
    backend = environment.kernel_backend(config)
    reset, step = environment.batched(env)
    agent, deterministic = config.agent, config.kernels.deterministic
    precision = environment.kernel_precision(config)
    return Setup(
        agent, env, env_params, reset, step, net, distribution, backend, deterministic, precision
    )


def policy(s: Setup, params, obs) -> networks.Distribution:
    """pi(.|obs) under the policy's params, on raw observations (`network_input` reads them)."""
    head, _ = s.net.apply(network_params(s.agent, params), network_input(s.agent, params, obs))
    return s.distribution.from_head(head)


# ---------------------------------------------------------------- init


def init_params(s: Setup, key, hparams, obs):
    """Fresh (params, optimiser state) for one env's observation `obs`."""
    net_params = s.net.init(key, obs)
    stats = observation_norm.initial_observation_stats(obs.shape) if s.agent.normalize_obs else None
    adam = optimizers.annealed_clipped_adam(
        s.agent, hparams["lr"], hparams["max_grad_norm"], eps=s.agent.adam_eps
    )
    return policy_params(s.agent, net_params, stats), adam.init(ravel_pytree(net_params)[0])


def init_state(s: Setup, key, hparams) -> OnPolicyState:
    """`init_params`, `num_envs` reset envs, the PRNG key and the counters."""
    key, net_key, reset_key = jax.random.split(key, 3)
    obs, env_state = s.reset(jax.random.split(reset_key, s.agent.num_envs), s.env_params)
    params, opt_state = init_params(s, net_key, hparams, obs[0])
    return OnPolicyState(params, opt_state, Envs(obs, env_state), key, jnp.int32(0), jnp.int32(0))


# ---------------------------------------------------------------- collect


class Transition(NamedTuple):
    """One rollout step as acting records it (values come afterwards, in one batch). `reset_step`
    is set where the step only reset its env (envs that reset in the step after an episode's end,
    rl.sebulba's envpool actors): the loss leaves those rows out; None where every step is
    the agent's (same-step auto-reset, as fusedrl's own envs)."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_obs: jax.Array
    reset_step: jax.Array | None = None


def rollout(s: Setup, params, envs: Envs, key):
    """num_steps steps of every env under the policy: (envs, Transitions [T, E, ...], the episodes
    that ended as `episodes.EpisodeTotals` per env [E]). log pi(a|s) is plain JAX here (XLA fuses
    it into the policy's last layer; the kernels serve the loss), and each step's Transition is
    one packed row (`collection.scan_packed_outputs`)."""

    def env_step(carry, keys):
        params, obs, env_state, ended = carry
        act_key, env_keys = keys
        pi = policy(s, params, obs)
        action = pi.sample(act_key)
        log_prob, _ = pi.log_prob_entropy(action, backend="reference")
        next_obs, env_state, reward, terminated, truncated, info = s.step(
            env_keys, env_state, pi.env_action(action), s.env_params
        )
        ended = episodes.count_episodes(ended, info)
        trans = Transition(obs, action, log_prob, reward, terminated, truncated, info["final_obs"])
        return (params, next_obs, env_state, ended), trans

    keys = collection.rollout_keys(key, s.agent.num_steps, s.agent.num_envs)
    carry = (params, envs.obs, envs.state, episodes.no_episodes((s.agent.num_envs,)))
    (_, obs, env_state, ended), traj = collection.scan_packed_outputs(
        env_step, carry, keys, unroll=min(unroll_of(s.agent), s.agent.num_steps)
    )
    return Envs(obs, env_state), traj, ended


# ---------------------------------------------------------------- values and advantages


def gae_cuts(agent: Config, truncated):
    """Where GAE's advantage chain stops besides episode ends: `truncated` [T, N], or'd with the
    last step of every `agent.gae_horizon`-step segment when that is set."""
    if not agent.gae_horizon:
        return truncated
    segment_end = (jnp.arange(truncated.shape[0]) + 1) % agent.gae_horizon == 0
    return truncated | segment_end[:, None]


class LearnBatch(NamedTuple):
    """What the loss reads of a step: network input, action, behaviour log-prob and value, the
    mask of the steps that count (None: all; `Transition.reset_step`) and with
    `agent.lag_correction` the log-prob under the network at the update's start (the proximal
    policy; None without)."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    mask: jax.Array | None = None
    proximal_log_prob: jax.Array | None = None


def learn_batch(s: Setup, hparams, net_params, traj: Transition):
    """(LearnBatch, advantages, targets), flattened to [num_envs * num_steps, ...], of a rollout
    whose observations are what the network reads: V(s_t) and V(final_obs_t) in a critic pass
    each, then truncation-aware GAE on the scaled rewards; the mask of the steps the loss counts
    (`collection.step_mask`); with `agent.lag_correction` the proximal log-probs from the same
    pass."""
    head, values = s.net.apply(net_params, traj.obs)
    _, final_values = s.net.apply(net_params, traj.final_obs)
    advantages, targets = losses.truncation_aware_gae(
        traj.reward * hparams["reward_scale"],
        values,
        final_values,
        traj.terminated,
        gae_cuts(s.agent, traj.truncated),
        hparams["gamma"],
        hparams["gae_lambda"],
        backend=s.backend,
        deterministic=s.deterministic,
    )
    proximal = None
    if s.agent.lag_correction:
        proximal = ppo_variants.proximal_log_probs(s, head, traj.action)
    mask = collection.step_mask(traj)
    batch = LearnBatch(traj.obs, traj.action, traj.log_prob, values, mask, proximal)
    data = (batch, advantages, targets)
    return jax.tree.map(lambda x: x.reshape((s.agent.batch_size,) + x.shape[2:]), data)


def keep_proximal(data, first):
    """A recomputed (LearnBatch, advantages, targets) `data` with the proximal log-probs of the
    update's `first` batch: decoupled PPO's proximal policy is the one the update started from,
    for every epoch."""
    batch, advantages, targets = data
    return batch._replace(proximal_log_prob=first[0].proximal_log_prob), advantages, targets


# ---------------------------------------------------------------- the minibatch loss


def ppo_objective(s, hparams, pi, values, batch, advantages, targets, mask=None):
    """(L, stats) = `losses.ppo_loss` of a minibatch from the current policy `pi` and values on it,
    `batch` holding the actions and the behaviour log-probs and values (any batch shape); the
    advantages normalised first with `agent.normalize_advantages`; means over the steps `mask`
    sets (None: all). With the batch's proximal log-probs (`agent.lag_correction`, decoupled PPO)
    the ratio is taken against them and the rows weighted by min(agent.lag_weight_max, pi_prox /
    pi_behaviour) (`losses.truncated_importance_weights`). Recurrent PPO's too."""
    log_prob, entropy = pi.log_prob_entropy(batch.action, s.backend)
    if s.agent.normalize_advantages:
        advantages = losses.normalize(advantages, mask=mask)
    old_log_prob, weights = batch.log_prob, None
    proximal = getattr(batch, "proximal_log_prob", None)
    if proximal is not None:
        old_log_prob = proximal
        weights = losses.truncated_importance_weights(
            proximal, batch.log_prob, s.agent.lag_weight_max
        )
    rows = (log_prob, entropy, values, old_log_prob, batch.value, advantages, targets)
    coefficients = [hparams[name] for name in ("clip_eps", "vf_clip_eps", "ent_coef", "vf_coef")]
    options = dict(mask=mask, weights=weights)
    return losses.ppo_loss(*rows, *coefficients, s.agent.clip_value_loss, **options)


def minibatch_loss(s: Setup, hparams, net_params, minibatch):
    """`ppo_objective` of a minibatch (LearnBatch, advantages, targets) under `net_params`."""
    batch, advantages, targets = minibatch
    head, values = s.net.apply(net_params, batch.obs)
    pi = s.distribution.from_head(head)
    return ppo_objective(s, hparams, pi, values, batch, advantages, targets, batch.mask)


def segment_minibatch_loss(s: Setup, hparams, net_params, minibatch):
    """`ppo_objective` of a minibatch of whole segments (`ppo_variants.segment_outputs`)."""
    outputs = ppo_variants.segment_outputs(s, hparams, net_params, minibatch)
    return ppo_objective(s, hparams, *outputs, minibatch.mask)


def autodiff_grads(loss, hparams, flat_params, unravel, minibatch):
    """(gradient of `loss(hparams, params, minibatch)` on the flat vector, None, stats): jax.grad
    at the params `unravel(flat_params)`, raveled (no squared norm: the clip computes it)."""
    grads, stats = jax.grad(loss, argnums=1, has_aux=True)(hparams, unravel(flat_params), minibatch)
    return ravel_pytree(grads)[0], None, stats


# ---------------------------------------------------------------- one update


def learn(s: Setup, grads_fn, batch_fn, hparams, params, opt_state, traj: Transition, key):
    """(params, opt_state, stats) after learning from the rollout `traj` [T, num_envs] (raw
    observations; rl.sebulba's actors' too): its observations merged into the statistics
    (with `agent.normalize_obs`; a reset step's left out, `collection.step_mask`), the batch
    `batch_fn(hparams, net_params, traj)`, then epochs of minibatch steps along
    `grads_fn(hparams, flat_params, unravel, minibatch) -> (gradient, squared norm or None,
    stats)`."""
    agent = s.agent
    net_params, obs_stats = network_params(agent, params), None
    if agent.normalize_obs:  # statistics of every observation so far, this rollout's included
        obs_stats = observation_norm.update_observation_stats(
            params["obs_stats"], traj.obs, traj.obs.shape[2:], collection.step_mask(traj)
        )
    params = policy_params(agent, net_params, obs_stats)
    observe = partial(network_input, agent, params)
    traj = traj._replace(obs=observe(traj.obs), final_obs=observe(traj.final_obs))
    # values and advantages (or whole segments, whose loss computes them)
    batch = batch_fn(hparams, net_params, traj)
    flat_params, unravel = ravel_pytree(net_params)
    epoch_batch = None
    if agent.recompute_advantages:  # each later epoch's batch from the network at its start
        epoch_batch = lambda carry, first: keep_proximal(
            learn_batch(s, hparams, unravel(carry[0]), traj), first
        )
    adam = optimizers.annealed_clipped_adam(
        agent, hparams["lr"], hparams["max_grad_norm"], eps=agent.adam_eps
    )

    def minibatch_step(carry, minibatch):  # update epochs: a step on the flat parameter vector
        flat_params, opt_state = carry
        grads, sq_norm, stats = grads_fn(hparams, flat_params, unravel, minibatch)
        return optimizers.flat_step(adam, flat_params, opt_state, grads, sq_norm), stats

    epochs = (agent.num_epochs, agent.num_minibatches, unroll_of(agent), epoch_batch)
    (flat_params, opt_state), stats = minibatches.minibatch_epochs(
        minibatch_step, (flat_params, opt_state), batch, key, *epochs
    )
    return policy_params(agent, unravel(flat_params), obs_stats), opt_state, stats


def update(s: Setup, grads_fn, batch_fn, hparams, state: OnPolicyState, totals):
    """One PPO update: collect a rollout, `learn` from it; (state, totals, mean loss stats)."""
    key, rollout_key, learn_key = jax.random.split(state.key, 3)
    envs, traj, ended = rollout(s, state.params, state.envs, rollout_key)
    learner = (state.params, state.opt_state)
    params, opt_state, stats = learn(s, grads_fn, batch_fn, hparams, *learner, traj, learn_key)
    step, updates = state.step + s.agent.batch_size, state.updates + 1
    state = OnPolicyState(params, opt_state, envs, key, step, updates)
    return state, episodes.add_totals(totals, ended), jax.tree.map(jnp.mean, stats)


# ---------------------------------------------------------------- the program


def greedy_action(s: Setup, params, obs):
    """The env action of the greedy policy (argmax, or the (squashed) mean) on raw observations."""
    pi = policy(s, params, obs)
    return pi.env_action(pi.mode())


def learning_pieces(config, s: Setup):
    """(grads_fn, batch_fn) of `learn`: the minibatch gradient and the batch it reads."""
    if ppo_variants.fused_update_fits(config, s.env, s.env_params, s.backend):
        grads_fn = partial(
            ppo_variants.fused_flat_grads,
            agent=s.agent,
            backend=s.backend,
            dot_precision=s.dot_precision,
        )
    else:
        loss = segment_minibatch_loss if s.agent.minibatch_advantages else minibatch_loss
        grads_fn = partial(autodiff_grads, partial(loss, s))
    batch_fn = ppo_variants.segment_batch if s.agent.minibatch_advantages else learn_batch
    return grads_fn, partial(batch_fn, s)


def make_trainer(config) -> Trainer:
    """init, and run = log points of `agent.log_interval` updates each (their episodes and mean
    loss stats, and the greedy return of `agent.eval_envs` fresh envs)."""
    s = make_setup(config)
    agent = s.agent
    grads_fn, batch_fn = learning_pieces(config, s)

    def log_period(hparams, state: OnPolicyState):
        one_update = partial(update, s, grads_fn, batch_fn, hparams)
        state, totals, stats = log_points.scan_updates(one_update, state, agent.log_interval)
        metrics = log_points.log_point_metrics(state.step, totals, stats)
        if agent.eval_envs:
            key, eval_key = jax.random.split(state.key)
            act = partial(greedy_action, s, state.params)
            returns, lengths = greedy_episodes(s.env, s.env_params, act, eval_key, agent.eval_envs)
            metrics.update(eval_return=returns.mean(), eval_length=lengths.mean())
            state = state._replace(key=key)
        return state, metrics

    def run(state, hparams, num_log_points):
        return log_points.scan_log_points(partial(log_period, hparams), state, num_log_points)

    return Trainer(partial(init_state, s), run, agent.num_updates // agent.log_interval)


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config):
    """`policy(params, obs, key) -> action` in the env's own action space: the argmax of the
    logits, or the Gaussian mean (squashed by tanh for the tanh Gaussian), clipped and mapped to
    the Box bounds (the key is unused)."""
    s = make_setup(config)
    return lambda params, obs, key: environment.to_env_action(
        s.env, s.env_params, greedy_action(s, params, obs)
    )
