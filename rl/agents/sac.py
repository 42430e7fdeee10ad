"""Soft Actor-Critic (SAC; Haarnoja et al. 2018) with twin Q-networks, Polyak targets and automatic
temperature tuning, compiled end to end; continuous (tanh-squashed Gaussian) and discrete
(categorical; Christodoulou 2019) actions.

Every iteration the `num_envs` envs take one step (uniformly random actions for the first
`learning_starts` env steps), the transitions (s, a, r, s' = info["final_obs"], terminated) go to a
uniform replay buffer, and then `utd_ratio * num_envs` gradient steps follow, each on a fresh
minibatch (`loop.act_then_train`). With alpha = exp(log_alpha) and Q = min(Q1, Q2):

    critic:  y = r + gamma (1 - terminated) V(s'),  L_Q = sum_i mean((Q_i(s, a) - y)^2) / 2   (y fixed)
    actor:   L_pi = mean(alpha log pi(a|s) - Q(s, a))
    alpha:   L_alpha = log_alpha (H(pi) - target_entropy)                                  (H fixed)
    targets: theta_targ <- tau theta + (1 - tau) theta_targ

Truncation is not termination: only `terminated` zeroes the bootstrap, and s' is the observation
actually reached (before auto-reset), so a time-limit end still bootstraps.

Continuous: u ~ N(mu(s), sigma(s)^2), a = tanh(u) in (-1, 1)^|A| (the env's `RescaleAction` maps it
affinely onto the bounds), V(s') = Q_targ(s', a') - alpha log pi(a'|s') for a' ~ pi(s'), a in L_pi
a reparameterised sample, H = -log pi(a|s), target entropy -target_entropy_scale |A|
(`losses.squashed_gaussian_sample`, `losses.soft_value`, `losses.sac_actor_loss`).

Discrete: pi = softmax(logits); expectations over actions replace sampling:
V(s') = sum_a' pi(a'|s') (Q_targ(s', a') - alpha log pi(a'|s')),
L_pi = mean(sum_a pi(a|s) (alpha log pi(a|s) - Q(s, a))), H = -sum_a pi log pi, target entropy
target_entropy_scale log|A| (`losses.soft_value_discrete`, `losses.sac_actor_loss_discrete`).

Sweepable hyperparameters (lr, alpha_lr, gamma, tau, init_alpha, target_entropy_scale,
max_grad_norm) are read from `hparams` inside the compiled program.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from envs.spaces import Box
from rl import agent_configs, buffers, environment, loop, losses, networks, optimizers
from rl.config import ConfigError, hp
from rl.trainer import Trainer, train_from_trainer


@dataclass(frozen=True)
class Config(agent_configs.ReplayActorCriticConfig):
    name: str = "sac"
    alpha_lr: float = hp(
        1e-3, low=0.0, low_open=True, sweep=True, doc="Adam step size of log alpha"
    )
    init_alpha: float = hp(
        1.0, low=0.0, low_open=True, sweep=True, doc="initial entropy temperature"
    )
    autotune_alpha: bool = hp(
        True, doc="tune alpha toward the target entropy (else alpha stays init_alpha)"
    )
    target_entropy_scale: float = hp(
        1.0, sweep=True, doc="target entropy = -scale*|A| (continuous) or scale*log|A| (discrete)"
    )
    network: networks.NetworkConfig = networks.network_config(hidden=(256, 256), activation="relu")
    log_std_min: float = hp(-5.0, doc="lower bound of the policy's log-std (continuous)")
    log_std_max: float = hp(2.0, doc="upper bound of the policy's log-std (continuous)")

    def validate(self):
        super().validate()
        if self.log_std_min >= self.log_std_max:
            raise ConfigError(
                f"agent.log_std_min ({self.log_std_min}) must be below agent.log_std_max ({self.log_std_max})"
            )


def check_env(config, env, env_params) -> None:
    """SAC needs Box observations and bounded Box (or Discrete) actions."""
    environment.check_bounded_actions(config, env, env_params, discrete_ok=True)


# ---------------------------------------------------------------- networks and losses


def make_networks(config, env, env_params):
    """(actor, critic, continuous, action_dim) for the env `environment.make_env` built.

    actor(params, obs) -> (mean, log_std) of the pre-tanh Gaussian, or logits;
    critic(params, obs, action) -> (q1, q2), or critic(params, obs) -> (q1, q2) [..., A]."""
    agent = config.agent
    space = env.action_space(env_params)
    continuous = isinstance(space, Box)
    actor_torso = networks.make_torso(agent.network, env.observation_space(env_params))
    critic_torso = networks.make_torso(agent.network)  # reads concat(obs, action) as floats
    if continuous:
        action_dim = int(np.prod(space.shape))
        policy_head = networks.squashed_gaussian_head(
            action_dim, agent.log_std_min, agent.log_std_max
        )
        critic = networks.twin_q(critic_torso)
    else:
        action_dim = int(space.n)
        policy_head = networks.categorical_policy_head(action_dim)
        critic = networks.twin_q(critic_torso, num_actions=action_dim)
    build = lambda fn: networks.build(fn, agent.network.backend, agent.network.init)
    return (
        build(networks.with_head(actor_torso, policy_head)),
        build(critic),
        continuous,
        action_dim,
    )


def continuous_losses(actor, critic):
    """`critic_loss(critic_params, actor_params, target_params, alpha, batch, key, gamma) -> (L_Q, mean Q1)`
    and `actor_loss(actor_params, critic_params, alpha, batch, key) -> (L_pi, H)` for a squashed
    Gaussian policy, H = -mean log pi(a|s) of the sampled actions."""

    def critic_loss(critic_params, actor_params, target_params, alpha, batch, key, gamma):
        next_action, next_log_prob = losses.squashed_gaussian_sample(
            *actor(actor_params, batch["next_obs"]), key
        )
        next_value = losses.soft_value(
            *critic(target_params, batch["next_obs"], next_action), next_log_prob, alpha
        )
        target = losses.q_learning_target(
            batch["reward"], losses.episode_discount(gamma, batch["terminated"]), next_value
        )
        q1, q2 = critic(critic_params, batch["obs"], batch["action"])
        return losses.twin_q_loss(q1, q2, target), jnp.mean(q1)

    def actor_loss(actor_params, critic_params, alpha, batch, key):
        action, log_prob = losses.squashed_gaussian_sample(*actor(actor_params, batch["obs"]), key)
        q1, q2 = critic(critic_params, batch["obs"], action)
        return losses.sac_actor_loss(log_prob, q1, q2, alpha), -jnp.mean(log_prob)

    return critic_loss, actor_loss


def discrete_losses(actor, critic):
    """The same pair for a categorical policy: expectations over actions, no sampling (the keys are
    unused); H = mean over the batch of -sum_a pi(a|s) log pi(a|s)."""

    def critic_loss(critic_params, actor_params, target_params, alpha, batch, key, gamma):
        next_log_pi = jax.nn.log_softmax(actor(actor_params, batch["next_obs"]))
        next_value = losses.soft_value_discrete(
            next_log_pi, *critic(target_params, batch["next_obs"]), alpha
        )
        target = losses.q_learning_target(
            batch["reward"], losses.episode_discount(gamma, batch["terminated"]), next_value
        )
        q1, q2 = (
            losses.action_value(q, batch["action"]) for q in critic(critic_params, batch["obs"])
        )
        return losses.twin_q_loss(q1, q2, target), jnp.mean(q1)

    def actor_loss(actor_params, critic_params, alpha, batch, key):
        log_pi = jax.nn.log_softmax(actor(actor_params, batch["obs"]))
        entropy = -jnp.sum(jnp.exp(log_pi) * log_pi, axis=-1)
        return losses.sac_actor_loss_discrete(
            log_pi, *critic(critic_params, batch["obs"]), alpha
        ), jnp.mean(entropy)

    return critic_loss, actor_loss


def target_entropy(continuous: bool, action_dim: int, scale):
    """-scale |A| for a squashed Gaussian; scale log|A| (a fraction of the uniform policy's entropy) for a categorical policy."""
    return -scale * action_dim if continuous else scale * math.log(action_dim)


def make_optimizers(hparams):
    """(actor, critic, log alpha) optimisers: Adam on clipped gradients for the networks, plain Adam for log alpha."""
    clipped = optimizers.clipped_adam(hparams["lr"], hparams["max_grad_norm"])
    return clipped, clipped, optax.adam(hparams["alpha_lr"])


# ---------------------------------------------------------------- one gradient step


def make_gradient_step(agent, critic_loss_fn, actor_loss_fn, entropy_target, hparams):
    """`gradient_step(state, key) -> (state, aux)` on one uniformly sampled minibatch: the critics,
    then the actor (against the new critics), then log alpha (if autotuned), then the Polyak targets."""
    actor_opt, critic_opt, alpha_opt = make_optimizers(hparams)

    def gradient_step(state, key):
        params, opt_state = state["params"], state["opt_state"]
        sample_key, critic_key, actor_key = jax.random.split(key, 3)
        batch, _ = buffers.uniform_sample(state["buffer"], sample_key, agent.batch_size)
        alpha = jnp.exp(params["log_alpha"])
        critic_args = (
            params["actor"],
            params["target_critic"],
            alpha,
            batch,
            critic_key,
            hparams["gamma"],
        )
        (critic_loss, q_mean), grads = jax.value_and_grad(critic_loss_fn, has_aux=True)(
            params["critic"], *critic_args
        )
        updates, critic_state = critic_opt.update(grads, opt_state["critic"], params["critic"])
        critic_params = optax.apply_updates(params["critic"], updates)
        (actor_loss, entropy), grads = jax.value_and_grad(actor_loss_fn, has_aux=True)(
            params["actor"], critic_params, alpha, batch, actor_key
        )
        updates, actor_state = actor_opt.update(grads, opt_state["actor"], params["actor"])
        actor_params = optax.apply_updates(params["actor"], updates)
        log_alpha, alpha_state = params["log_alpha"], opt_state["log_alpha"]
        if agent.autotune_alpha:
            grad = jax.grad(losses.temperature_loss)(log_alpha, entropy, entropy_target)
            updates, alpha_state = alpha_opt.update(grad, alpha_state, log_alpha)
            log_alpha = optax.apply_updates(log_alpha, updates)
        target_critic = optimizers.polyak(params["target_critic"], critic_params, hparams["tau"])
        params = {
            "actor": actor_params,
            "critic": critic_params,
            "log_alpha": log_alpha,
            "target_critic": target_critic,
        }
        opt_state = {"actor": actor_state, "critic": critic_state, "log_alpha": alpha_state}
        aux = {
            "critic_loss": critic_loss,
            "actor_loss": actor_loss,
            "q_mean": q_mean,
            "entropy": entropy,
        }
        return {**state, "params": params, "opt_state": opt_state}, aux

    return gradient_step


# ---------------------------------------------------------------- the trainer


class Setup(NamedTuple):
    """What the loop closes over: the env, the networks and their losses, and the settings."""

    env: object
    env_params: object
    actor: networks.Network
    critic: networks.Network
    continuous: bool
    action_dim: int
    agent: Config


def make_setup(config) -> Setup:
    env, env_params = environment.make_env(config)
    actor, critic, continuous, action_dim = make_networks(config, env, env_params)
    return Setup(env, env_params, actor, critic, continuous, action_dim, config.agent)


def init(setup: Setup, key, hparams):
    """Actor, twin critics and their target copy, log alpha, three optimiser states, an empty buffer, the envs."""
    agent = setup.agent
    key, actor_key, critic_key, reset_key = jax.random.split(key, 4)
    reset, _ = environment.batched(setup.env)
    obs, env_state = reset(jax.random.split(reset_key, agent.num_envs), setup.env_params)
    example_action = (
        jnp.zeros(setup.env.action_space(setup.env_params).shape, jnp.float32)
        if setup.continuous
        else jnp.int32(0)
    )
    critic_params = setup.critic.init(
        critic_key, *((obs[0], example_action) if setup.continuous else (obs[0],))
    )
    log_alpha = jnp.log(hparams["init_alpha"]).astype(jnp.float32)
    params = {
        "actor": setup.actor.init(actor_key, obs[0]),
        "critic": critic_params,
        "log_alpha": log_alpha,
        "target_critic": critic_params,
    }
    actor_opt, critic_opt, alpha_opt = make_optimizers(hparams)
    opt_state = {
        "actor": actor_opt.init(params["actor"]),
        "critic": critic_opt.init(params["critic"]),
        "log_alpha": alpha_opt.init(params["log_alpha"]),
    }
    example = {
        "obs": obs[0],
        "action": example_action,
        "reward": jnp.float32(0.0),
        "next_obs": obs[0],
        "terminated": jnp.bool_(False),
    }
    buffer = buffers.uniform_init(example, agent.buffer_size)
    return {
        "params": params,
        "opt_state": opt_state,
        "buffer": buffer,
        "obs": obs,
        "env_state": env_state,
        "key": key,
        "step": jnp.int32(0),
    }


def act(setup: Setup, actor_params, obs, key, step):
    """Uniformly random actions before learning_starts, else a sample of the policy (in [-1, 1] for a Box)."""
    policy_key, random_key = jax.random.split(key)
    if setup.continuous:
        action, _ = losses.squashed_gaussian_sample(
            *setup.actor.apply(actor_params, obs), policy_key
        )
        random_action = jax.random.uniform(random_key, action.shape, minval=-1.0, maxval=1.0)
    else:
        action = jax.random.categorical(policy_key, setup.actor.apply(actor_params, obs)).astype(
            jnp.int32
        )
        random_action = jax.random.randint(random_key, action.shape, 0, setup.action_dim, jnp.int32)
    return jnp.where(step < setup.agent.learning_starts, random_action, action)


def greedy(setup: Setup, actor_params, obs):
    """tanh of the Gaussian mean, or the most likely action."""
    if setup.continuous:
        return jnp.tanh(setup.actor.apply(actor_params, obs)[0])
    return jnp.argmax(setup.actor.apply(actor_params, obs), axis=-1).astype(jnp.int32)


def env_step(setup: Setup, carry, key):
    """All envs take one step; the transitions go to the buffer."""
    state, _ = carry
    act_key, env_key = jax.random.split(key)
    action = act(setup, state["params"]["actor"], state["obs"], act_key, state["step"])
    return loop.step_and_store(
        setup.env, setup.env_params, setup.agent.num_envs, carry, action, env_key
    )


def greedy_policy(setup: Setup, params):
    """obs -> the deterministic action of the actor (`greedy`)."""
    return partial(greedy, setup, params["actor"])


def alpha_metric(state):
    return {"alpha": jnp.exp(state["params"]["log_alpha"])}


def make_trainer(config) -> Trainer:
    setup, agent = make_setup(config), config.agent
    loss_fns = (continuous_losses if setup.continuous else discrete_losses)(
        setup.actor.apply, setup.critic.apply
    )

    def gradient_step(hparams, state, key):
        entropy_target = target_entropy(
            setup.continuous, setup.action_dim, hparams["target_entropy_scale"]
        )
        return make_gradient_step(agent, *loss_fns, entropy_target, hparams)(state, key)

    return loop.actor_critic_trainer(
        agent,
        setup.env,
        setup.env_params,
        partial(init, setup),
        lambda hparams, carry, key: env_step(setup, carry, key),
        gradient_step,
        partial(greedy_policy, setup),
        alpha_metric,
    )


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config):
    """`policy(params, obs, key) -> action` in the env's own action space: tanh of the Gaussian mean
    mapped onto the Box bounds, or the argmax of the logits (the key is unused)."""
    setup = make_setup(config)
    return lambda params, obs, key: environment.to_env_action(
        setup.env, setup.env_params, greedy(setup, params["actor"], obs)
    )
