"""PQN (Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning"): Q-learning from many
parallel envs with Q(lambda) targets, no replay buffer and no target network; LayerNorm in the
Q-network keeps the bootstrapped targets stable. Compiled end to end.

One update (`rl.agent_configs.OnPolicyLoopConfig`):

    rollout   num_envs envs step num_steps times, epsilon-greedy on Q (epsilon decays linearly from
              epsilon_start to epsilon_end over the first epsilon_decay_fraction of the run)
    targets   G = truncation_aware_q_lambda(r * reward_scale, max_a Q(final_obs, a), terminated, truncated):

        G_t = r_t + d_t [(1 - lambda_t) max_a Q(final_obs_t, a) + lambda_t G_{t+1}],
        d_t = gamma (1 - terminated_t),   lambda_t = q_lambda (1 - (terminated_t | truncated_t)),

              through the fused kernel `kernels.q_lambda_returns`, with the network of the rollout
              (a time-limit end still bootstraps from the observation it reached)
    learn     num_epochs passes over the batch in num_minibatches shuffled minibatches, each an Adam
              step (gradients clipped to max_grad_norm, step size annealed to 0 if anneal_lr) on

        L = 0.5 mean_batch (Q(s_t, a_t) - G_t)^2,   G held fixed.

Greedy evaluation (`eval_envs` > 0) takes argmax_a Q. The sweepable hyperparameters (lr, gamma,
q_lambda, reward_scale, max_grad_norm, epsilon_start, epsilon_end) are read from `hparams` inside
the compiled program.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from rl import (
    agent_configs,
    collection,
    environment,
    episodes,
    exploration,
    log_points,
    losses,
    minibatches,
    networks,
    optimizers,
)
from rl.config import hp
from rl.rollout import greedy_episodes
from rl.trainer import Trainer, train_from_trainer


@dataclass(frozen=True)
class Config(agent_configs.OnPolicyLoopConfig):
    name: str = "pqn"
    lr: float = hp(
        1e-4, low=0.0, low_open=True, sweep=True, doc="Adam step size (annealed to 0 if anneal_lr)"
    )
    max_grad_norm: float = hp(
        10.0, low=0.0, low_open=True, sweep=True, doc="global gradient-norm clip"
    )
    gamma: float = hp(0.99, low=0.0, high=1.0, sweep=True, doc="discount")
    q_lambda: float = hp(0.95, low=0.0, high=1.0, sweep=True, doc="lambda of the Q(lambda) targets")
    reward_scale: float = hp(
        0.1, low=0.0, low_open=True, sweep=True, doc="rewards are multiplied by this for learning"
    )
    epsilon_start: float = hp(1.0, low=0.0, high=1.0, sweep=True)
    epsilon_end: float = hp(0.05, low=0.0, high=1.0, sweep=True)
    epsilon_decay_fraction: float = hp(
        0.2,
        low=0.0,
        high=1.0,
        low_open=True,
        doc="fraction of total_steps over which epsilon decays",
    )
    network: networks.NetworkConfig = networks.network_config(
        hidden=(256, 256), activation="relu", layer_norm=True
    )


check_env = environment.check_discrete_actions


class Setup(NamedTuple):
    """What the compiled program is built from, fixed per make_trainer."""

    agent: Config
    env: Any
    env_params: Any
    reset: Any  # vmapped env.reset
    step: Any  # vmapped env.step
    q_network: networks.Network
    backend: str  # kernel backend
    deterministic: bool = False  # kernels.deterministic: fixed-order Q(lambda) scan


class Transition(NamedTuple):
    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_obs: jax.Array
    episode: dict  # EpisodeStatistics' info: episode_done, episode_return, episode_length


def make_q_network(agent: Config, env, env_params) -> networks.Network:
    """`agent.network`'s torso (LayerNorm by default) and one linear Q-value per action."""
    return networks.q_network(
        agent.network, env.observation_space(env_params), env.action_space(env_params).n
    )


def optimizer(agent: Config, hparams):
    return optimizers.annealed_clipped_adam(agent, hparams["lr"], hparams["max_grad_norm"])


def epsilon(agent: Config, hparams, step):
    """Linear decay from epsilon_start to epsilon_end over epsilon_decay_fraction * total_steps env steps."""
    return exploration.linear_schedule(
        hparams["epsilon_start"],
        hparams["epsilon_end"],
        agent.epsilon_decay_fraction * agent.total_steps,
        step,
    )


# ---------------------------------------------------------------- the loop


def init_state(s: Setup, key, hparams):
    """Fresh params, optimiser state and envs (`num_envs` resets), the PRNG key and the counters."""
    key, net_key, reset_key = jax.random.split(key, 3)
    obs, env_state = s.reset(jax.random.split(reset_key, s.agent.num_envs), s.env_params)
    params = s.q_network.init(net_key, obs[0])
    return {
        "params": params,
        "opt_state": optimizer(s.agent, hparams).init(ravel_pytree(params)[0]),
        "obs": obs,
        "env_state": env_state,
        "key": key,
        "step": jnp.int32(0),
        "update": jnp.int32(0),
    }


def rollout(s: Setup, params, obs, env_state, eps, key):
    """num_steps epsilon-greedy steps of every env; (obs, env_state, Transition [T, E, ...])."""

    def env_step(carry, keys):
        obs, env_state = carry
        act_key, env_keys = keys
        action = exploration.epsilon_greedy(act_key, s.q_network.apply(params, obs), eps)
        next_obs, env_state, reward, terminated, truncated, info = s.step(
            env_keys, env_state, action, s.env_params
        )
        episode = {
            name: info[name] for name in ("episode_done", "episode_return", "episode_length")
        }
        return (next_obs, env_state), Transition(
            obs, action, reward, terminated, truncated, info["final_obs"], episode
        )

    keys = collection.rollout_keys(key, s.agent.num_steps, s.agent.num_envs)
    (obs, env_state), traj = jax.lax.scan(
        env_step, (obs, env_state), keys, unroll=min(s.agent.unroll, s.agent.num_steps)
    )
    return obs, env_state, traj


def q_lambda_targets(s: Setup, hparams, params, traj: Transition):
    """G [T, E]: the Q(lambda) targets of the rollout (the module docstring), bootstrapped from
    max_a Q(final_obs, a) under `params`."""
    next_values = s.q_network.apply(params, traj.final_obs).max(axis=-1)
    return losses.truncation_aware_q_lambda(
        traj.reward * hparams["reward_scale"],
        next_values,
        traj.terminated,
        traj.truncated,
        hparams["gamma"],
        hparams["q_lambda"],
        backend=s.backend,
        deterministic=s.deterministic,
    )


def q_loss(apply, params, minibatch):
    """(0.5 mean (Q(s, a) - G)^2, mean Q(s, a)) of a minibatch (obs, action, target)."""
    obs, action, target = minibatch
    q_taken = losses.action_value(apply(params, obs), action)
    return 0.5 * jnp.mean(jnp.square(q_taken - target)), q_taken.mean()


def learn(s: Setup, hparams, params, opt_state, batch, key):
    """num_epochs passes of shuffled minibatch Adam steps on `q_loss`; Adam sees one flat parameter
    vector (one fused update instead of one per array). Returns (params, opt_state, stats)."""
    tx = optimizer(s.agent, hparams)
    flat_params, unravel = ravel_pytree(params)
    loss = lambda flat, minibatch: q_loss(s.q_network.apply, unravel(flat), minibatch)

    def minibatch_step(carry, minibatch):
        flat_params, opt_state = carry
        (loss_value, q_mean), grads = jax.value_and_grad(loss, has_aux=True)(flat_params, minibatch)
        updates, opt_state = tx.update(grads, opt_state, flat_params)
        return (optax.apply_updates(flat_params, updates), opt_state), {
            "loss": loss_value,
            "q_mean": q_mean,
        }

    (flat_params, opt_state), stats = minibatches.minibatch_epochs(
        minibatch_step,
        (flat_params, opt_state),
        batch,
        key,
        s.agent.num_epochs,
        s.agent.num_minibatches,
        s.agent.unroll,
    )
    return unravel(flat_params), opt_state, stats


def update(s: Setup, hparams, state, totals: episodes.EpisodeTotals):
    """One PQN update: rollout, Q(lambda) targets, learning. Returns (state, totals, mean stats)."""
    key, rollout_key, shuffle_key = jax.random.split(state["key"], 3)
    params = state["params"]
    eps = epsilon(s.agent, hparams, state["step"])
    obs, env_state, traj = rollout(s, params, state["obs"], state["env_state"], eps, rollout_key)
    totals = episodes.add_episodes(totals, traj.episode)
    targets = jax.lax.stop_gradient(q_lambda_targets(s, hparams, params, traj))
    flat = lambda x: x.reshape((s.agent.batch_size,) + x.shape[2:])
    batch = (flat(traj.obs), flat(traj.action), flat(targets))
    params, opt_state, stats = learn(s, hparams, params, state["opt_state"], batch, shuffle_key)
    state = {
        **state,
        "params": params,
        "opt_state": opt_state,
        "obs": obs,
        "env_state": env_state,
        "key": key,
        "step": state["step"] + s.agent.batch_size,
        "update": state["update"] + 1,
    }
    return state, totals, {**jax.tree.map(jnp.mean, stats), "epsilon": eps}


def log_period(s: Setup, hparams, state):
    """log_interval updates, then the log point's metrics: env steps, the mean return and length of
    the episodes that ended, loss, mean Q, epsilon and (eval_envs > 0) greedy evaluation."""

    def one_update(carry, _):
        state, totals, stats = update(s, hparams, *carry)
        return (state, totals), stats

    (state, totals), stats = jax.lax.scan(
        one_update, (state, episodes.no_episodes()), None, length=s.agent.log_interval
    )
    metrics = {
        "step": state["step"],
        **episodes.episode_metrics(totals),
        **jax.tree.map(jnp.mean, stats),
    }
    if s.agent.eval_envs:
        key, eval_key = jax.random.split(state["key"])
        state = {**state, "key": key}
        returns, lengths = greedy_episodes(
            s.env, s.env_params, greedy_policy(s, state["params"]), eval_key, s.agent.eval_envs
        )
        metrics["eval_return"], metrics["eval_length"] = returns.mean(), lengths.mean()
    return state, metrics


def greedy_policy(s: Setup, params):
    """obs -> argmax_a Q(obs, a) (first index on ties)."""
    return lambda obs: jnp.argmax(s.q_network.apply(params, obs), axis=-1).astype(jnp.int32)


def make_setup(config) -> Setup:
    env, env_params = environment.make_env(config)
    agent = config.agent
    return Setup(
        agent,
        env,
        env_params,
        *environment.batched(env),
        make_q_network(agent, env, env_params),
        environment.kernel_backend(config),
        config.kernels.deterministic,
    )


def make_trainer(config) -> Trainer:
    s = make_setup(config)

    def run(state, hparams, num_log_points):
        return log_points.scan_log_points(
            lambda state: log_period(s, hparams, state), state, num_log_points
        )

    return Trainer(
        init=lambda key, hparams: init_state(s, key, hparams),
        run=run,
        num_log_points=s.agent.num_updates // s.agent.log_interval,
    )


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config):
    """`policy(params, obs, key) -> action`: argmax of the Q-network (first index on ties)."""
    s = make_setup(config)
    return lambda params, obs, key: greedy_policy(s, params)(obs)
