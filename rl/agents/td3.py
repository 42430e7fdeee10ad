"""TD3 (Fujimoto et al. 2018, "Addressing Function Approximation Error in Actor-Critic Methods"),
compiled end to end; continuous actions.

The loop is `rl.agent_configs.ReplayActorCriticConfig`'s: `num_envs` envs take one step with the exploration
policy a = clip(mu(s) + N(0, exploration_noise^2), -1, 1) (uniformly random actions for the first
`learning_starts` env steps), the transitions (s, a, r, s' = info["final_obs"], terminated) go to a
uniform replay buffer, and `utd_ratio * num_envs` gradient steps follow. Each gradient step, on a
fresh minibatch:

    target:  a' = clip(mu'(s') + clip(eps, -c, c), -1, 1),  eps ~ N(0, policy_noise^2)   (smoothing)
             y  = r + gamma (1 - terminated) min(Q1', Q2')(s', a')                        (clipped double Q)
    critic:  L_Q = (mean (Q1(s, a) - y)^2 + mean (Q2(s, a) - y)^2) / 2
    every `policy_delay` critic steps (delayed policy updates):
    actor:   L_mu = -mean Q1(s, mu(s))
    targets: theta' <- tau theta + (1 - tau) theta'   (actor and critics)

Truncation is not termination: only `terminated` zeroes the bootstrap, and s' is the observation
reached before any auto-reset. Actions live in [-1, 1]^d; `environment.make_env` maps them onto the env's
bounds. Sweepable: lr, gamma, tau, max_grad_norm, exploration_noise, policy_noise, noise_clip.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rl import agent_configs, buffers, environment, loop, losses, networks, optimizers
from rl.config import hp
from rl.trainer import Trainer, train_from_trainer


@dataclass(frozen=True)
class Config(agent_configs.ReplayActorCriticConfig):
    name: str = "td3"
    exploration_noise: float = hp(
        0.1,
        low=0.0,
        sweep=True,
        doc="std of the Gaussian noise added to acting actions (in [-1, 1] units)",
    )
    policy_noise: float = hp(
        0.2, low=0.0, sweep=True, doc="std of the target policy smoothing noise"
    )
    noise_clip: float = hp(
        0.5, low=0.0, sweep=True, doc="the smoothing noise is clipped to [-noise_clip, noise_clip]"
    )
    policy_delay: int = hp(2, low=1, doc="critic steps per actor and target update")
    network: networks.NetworkConfig = networks.network_config(hidden=(256, 256), activation="relu")


def check_env(config, env, env_params) -> None:
    """TD3 needs Box observations and bounded Box actions."""
    environment.check_bounded_actions(config, env, env_params)


class Setup(NamedTuple):
    """What the loop closes over: the env, the actor mu(s) in [-1, 1]^d, the twin critics, the settings."""

    env: object
    env_params: object
    actor: networks.Network
    critic: networks.Network
    action_shape: tuple
    agent: Config


def make_setup(config) -> Setup:
    env, env_params = environment.make_env(config)
    agent = config.agent
    action_shape = tuple(env.action_space(env_params).shape)
    torso = lambda obs_space=None: networks.make_torso(agent.network, obs_space)
    actor = networks.with_head(
        torso(env.observation_space(env_params)),
        networks.deterministic_policy_head(int(np.prod(action_shape))),
    )
    critic = networks.twin_q(torso())  # reads concat(obs, action)
    build = lambda fn: networks.build(fn, agent.network.backend, agent.network.init)
    return Setup(env, env_params, build(actor), build(critic), action_shape, agent)


def optimiser(hparams):
    return optimizers.clipped_adam(hparams["lr"], hparams["max_grad_norm"])


# ---------------------------------------------------------------- losses of one minibatch


def critic_loss(setup: Setup, critic_params, target_params, batch, key, hparams):
    """(L_Q, mean Q1) with the smoothed, clipped double-Q target (the module docstring)."""
    next_action = losses.smoothed_target_action(
        setup.actor.apply(target_params["actor"], batch["next_obs"]),
        key,
        hparams["policy_noise"],
        hparams["noise_clip"],
    )
    next_value = jnp.minimum(
        *setup.critic.apply(target_params["critic"], batch["next_obs"], next_action)
    )
    target = losses.q_learning_target(
        batch["reward"], losses.episode_discount(hparams["gamma"], batch["terminated"]), next_value
    )
    q1, q2 = setup.critic.apply(critic_params, batch["obs"], batch["action"])
    return losses.twin_q_loss(q1, q2, target), jnp.mean(q1)


def actor_loss(setup: Setup, actor_params, critic_params, batch):
    """-mean Q1(s, mu(s))."""
    q1, _ = setup.critic.apply(
        critic_params, batch["obs"], setup.actor.apply(actor_params, batch["obs"])
    )
    return losses.deterministic_policy_loss(q1)


# ---------------------------------------------------------------- the loop


def init(setup: Setup, key, hparams):
    """Actor, twin critics and their target copies, two optimiser states, an empty buffer, the envs."""
    agent = setup.agent
    key, actor_key, critic_key, reset_key = jax.random.split(key, 4)
    reset, _ = environment.batched(setup.env)
    obs, env_state = reset(jax.random.split(reset_key, agent.num_envs), setup.env_params)
    example_action = jnp.zeros(setup.action_shape, jnp.float32)
    params = {
        "actor": setup.actor.init(actor_key, obs[0]),
        "critic": setup.critic.init(critic_key, obs[0], example_action),
    }
    opt_state = {name: optimiser(hparams).init(p) for name, p in params.items()}
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
        "target_params": params,
        "opt_state": opt_state,
        "buffer": buffer,
        "obs": obs,
        "env_state": env_state,
        "key": key,
        "step": jnp.int32(0),
        "updates": jnp.int32(0),
    }


def act(setup: Setup, hparams, actor_params, obs, key, step):
    """clip(mu(s) + N(0, exploration_noise^2), -1, 1), or uniform in [-1, 1] before learning_starts."""
    noise_key, random_key = jax.random.split(key)
    mean = setup.actor.apply(actor_params, obs)
    action = jnp.clip(
        mean + hparams["exploration_noise"] * jax.random.normal(noise_key, mean.shape), -1.0, 1.0
    )
    random_action = jax.random.uniform(random_key, mean.shape, minval=-1.0, maxval=1.0)
    return jnp.where(step < setup.agent.learning_starts, random_action, action)


def env_step(setup: Setup, hparams, carry, key):
    """All envs take one exploring step; the transitions go to the buffer."""
    state, _ = carry
    act_key, env_key = jax.random.split(key)
    action = act(setup, hparams, state["params"]["actor"], state["obs"], act_key, state["step"])
    return loop.step_and_store(
        setup.env, setup.env_params, setup.agent.num_envs, carry, action, env_key
    )


def delayed_update(setup: Setup, hparams, state, batch):
    """The actor's Adam step against the new critics, then Polyak steps of both targets."""
    params, opt_state = state["params"], state["opt_state"]
    loss, grads = jax.value_and_grad(partial(actor_loss, setup))(
        params["actor"], params["critic"], batch
    )
    updates, actor_opt_state = optimiser(hparams).update(grads, opt_state["actor"], params["actor"])
    params = {**params, "actor": optax.apply_updates(params["actor"], updates)}
    target_params = optimizers.polyak(state["target_params"], params, hparams["tau"])
    return {
        **state,
        "params": params,
        "target_params": target_params,
        "opt_state": {**opt_state, "actor": actor_opt_state},
    }, loss


def gradient_step(setup: Setup, hparams, state, key):
    """A critic step on a uniform minibatch; every `policy_delay`-th step also the delayed update."""
    sample_key, noise_key = jax.random.split(key)
    batch, _ = buffers.uniform_sample(state["buffer"], sample_key, setup.agent.batch_size)
    params, opt_state = state["params"], state["opt_state"]
    (q_loss, q_mean), grads = jax.value_and_grad(partial(critic_loss, setup), has_aux=True)(
        params["critic"], state["target_params"], batch, noise_key, hparams
    )
    updates, critic_opt_state = optimiser(hparams).update(
        grads, opt_state["critic"], params["critic"]
    )
    updates_done = state["updates"] + 1
    state = {
        **state,
        "params": {**params, "critic": optax.apply_updates(params["critic"], updates)},
        "opt_state": {**opt_state, "critic": critic_opt_state},
        "updates": updates_done,
    }
    skip = lambda state, batch: (state, jnp.float32(jnp.nan))
    state, pi_loss = jax.lax.cond(
        updates_done % setup.agent.policy_delay == 0,
        partial(delayed_update, setup, hparams),
        skip,
        state,
        batch,
    )
    return state, {"critic_loss": q_loss, "actor_loss": pi_loss, "q_mean": q_mean}


def greedy_policy(setup: Setup, params):
    """obs -> mu(obs), the actor's deterministic action in [-1, 1]^d."""
    return partial(setup.actor.apply, params["actor"])


def counters(state):
    return {"gradient_steps": state["updates"]}


def make_trainer(config) -> Trainer:
    setup, agent = make_setup(config), config.agent
    return loop.actor_critic_trainer(
        agent,
        setup.env,
        setup.env_params,
        partial(init, setup),
        partial(env_step, setup),
        partial(gradient_step, setup),
        partial(greedy_policy, setup),
        counters,
    )


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config):
    """`policy(params, obs, key) -> action` in the env's own action space: mu(obs) mapped onto the bounds."""
    setup = make_setup(config)
    return lambda params, obs, key: environment.to_env_action(
        setup.env, setup.env_params, greedy_policy(setup, params)(obs)
    )
