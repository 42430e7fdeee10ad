"""DQN (Mnih et al. 2015) with optional double-Q (van Hasselt et al. 2016), compiled end to end.

For a sampled transition (s, a, r, s', terminated), s' = info["final_obs"] (the state actually
reached, before any auto-reset: a time-limit truncation still bootstraps, only termination stops it):

    y    = r + gamma (1 - terminated) Q_target(s', a*),
    a*   = argmax_a Q_target(s', a)      (DQN)   or   argmax_a Q_online(s', a)   (double-Q),
    loss = mean_batch huber(Q_online(s, a) - y)   (or the squared error),

minimised by Adam on gradients clipped to a global norm. The loop (`rl.agent_configs.ReplayLoopConfig`):
`num_envs` envs step together with epsilon-greedy actions (epsilon decays linearly over
`epsilon_decay_steps` env steps) into a uniform replay buffer; every `train_freq` env steps come
`gradient_steps` gradient steps once `learning_starts` steps are stored; the target network follows
the online one every `target_update_interval` gradient steps. At each log point `eval_episodes`
greedy episodes run on separate eval envs inside the compiled program ("eval_return"; none if 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from rl import agent_configs, buffers, environment, exploration, loop, losses, networks, optimizers
from rl.config import hp
from rl.trainer import Trainer, train_from_trainer


@dataclass(frozen=True)
class Config(agent_configs.ReplayLoopConfig):
    name: str = "dqn"
    loss: str = hp("huber", choices=("huber", "mse"))
    double_q: bool = hp(True, doc="select the bootstrap action with the online network")
    network: networks.NetworkConfig = networks.network_config(hidden=(128, 128), activation="relu")


check_env = environment.check_discrete_actions


class Setup(NamedTuple):
    """What the loop closes over: the env, the Q-network and the agent's settings."""

    env: object
    env_params: object
    q_network: networks.Network
    agent: Config


def make_q_network(config, env, env_params) -> networks.Network:
    """Torso from `agent.network`, then a linear head of one Q-value per action."""
    return networks.q_network(
        config.agent.network, env.observation_space(env_params), env.action_space(env_params).n
    )


def q_loss(apply, params, target_params, batch, gamma, double_q: bool, kind: str):
    """(mean TD loss, (TD errors, Q(s, a))) of a batch of transitions (the module docstring)."""
    q_taken = losses.action_value(apply(params, batch["obs"]), batch["action"])
    q_next_target = apply(target_params, batch["next_obs"])
    q_next_selector = apply(params, batch["next_obs"]) if double_q else q_next_target
    next_value = losses.bootstrap_value(q_next_target, q_next_selector)
    target = losses.q_learning_target(
        batch["reward"], losses.episode_discount(gamma, batch["terminated"]), next_value
    )
    td = q_taken - target
    return losses.td_loss(td, kind).mean(), (td, q_taken)


def optimiser(hparams):
    return optimizers.clipped_adam(hparams["lr"], hparams["max_grad_norm"])


# ---------------------------------------------------------------- the loop


def init(setup: Setup, key, hparams):
    key, net_key, reset_key = jax.random.split(key, 3)
    reset, _ = environment.batched(setup.env)
    obs, env_state = reset(jax.random.split(reset_key, setup.agent.num_envs), setup.env_params)
    params = setup.q_network.init(net_key, obs[0])
    example = {
        "obs": obs[0],
        "action": jnp.int32(0),
        "reward": jnp.float32(0.0),
        "next_obs": obs[0],
        "terminated": jnp.bool_(False),
    }
    buffer = buffers.uniform_init(example, setup.agent.buffer_size)
    return loop.replay_state(key, params, optimiser(hparams).init(params), buffer, obs, env_state)


def env_step(setup: Setup, hparams, carry, key):
    """All envs take one epsilon-greedy step; the transitions go to the buffer."""
    state, _ = carry
    k_act, k_env = jax.random.split(key)
    q_values = setup.q_network.apply(state["params"], state["obs"])
    action = exploration.epsilon_greedy(
        k_act, q_values, loop.replay_epsilon(setup.agent, hparams, state["step"])
    )
    return loop.step_and_store(
        setup.env, setup.env_params, setup.agent.num_envs, carry, action, k_env
    )


def gradient_step(setup: Setup, hparams, state, key):
    """One Adam step on a uniform batch; the target follows every `target_update_interval` steps."""
    agent = setup.agent
    batch, _ = buffers.uniform_sample(state["buffer"], key, agent.batch_size)
    loss_fn = partial(
        q_loss,
        setup.q_network.apply,
        target_params=state["target_params"],
        batch=batch,
        gamma=hparams["gamma"],
        double_q=agent.double_q,
        kind=agent.loss,
    )
    (loss, (_, q_taken)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
    updates, opt_state = optimiser(hparams).update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    updates_done = state["updates"] + 1
    target = optimizers.periodic_polyak(
        state["target_params"],
        params,
        hparams["tau"],
        updates_done % agent.target_update_interval == 0,
    )
    state = {
        **state,
        "params": params,
        "target_params": target,
        "opt_state": opt_state,
        "updates": updates_done,
    }
    return state, {"loss": loss, "q_mean": q_taken.mean()}


def greedy_policy(setup: Setup, params):
    """obs -> argmax_a Q(obs, a) (first index on ties)."""
    return lambda obs: jnp.argmax(setup.q_network.apply(params, obs), axis=-1).astype(jnp.int32)


def make_trainer(config) -> Trainer:
    env, env_params = environment.make_env(config)
    agent = config.agent
    setup = Setup(env, env_params, make_q_network(config, env, env_params), agent)
    return loop.replay_trainer(
        agent,
        env,
        env_params,
        partial(init, setup),
        partial(env_step, setup),
        partial(gradient_step, setup),
        partial(greedy_policy, setup),
    )


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config):
    """`policy(params, obs, key) -> action`: argmax of the online Q-network (first index on ties)."""
    env, env_params = environment.make_env(config)
    setup = Setup(env, env_params, make_q_network(config, env, env_params), config.agent)
    return lambda params, obs, key: greedy_policy(setup, params)(obs)
