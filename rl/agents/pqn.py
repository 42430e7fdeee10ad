"""PQN (Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning"), compiled end to end:
Q-learning from many parallel envs with Q(lambda) targets (`q_lambda_targets`), no replay buffer
and no target network; LayerNorm in the Q-network keeps the bootstrapped targets stable. One
update (`rl.config.loops.OnPolicyLoopConfig`): num_envs envs step num_steps times epsilon-greedily
(`epsilon`), then num_epochs passes of num_minibatches Adam steps on `q_loss` (`learn`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from rl.agents.trainer import Trainer, train_from_trainer
from rl.config.loops import OnPolicyLoopConfig
from rl.config.parsing import hp
from rl.config.unrolling import unroll_of
from rl.core import environment, episodes, exploration, losses, optimizers
from rl.core.collection import rollout_keys, step_mask
from rl.core.log_points import log_point_metrics, scan_log_points, scan_updates
from rl.core.minibatches import minibatch_epochs
from rl.core.rollout import greedy_episodes
from rl.core.state import Envs, OnPolicyState
from rl.nn import networks
from rl.nn.layers import Network
from rl.nn.network_config import NetworkConfig, network_config


@dataclass(frozen=True)
class Config(OnPolicyLoopConfig):
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
        0.2, low=0.0, high=1.0, low_open=True, doc="share of total_steps epsilon decays over"
    )
    network: NetworkConfig = network_config(hidden=(256, 256), activation="relu", layer_norm=True)


check_env = environment.check_discrete_actions


class Transition(NamedTuple):
    """One rollout step; `reset_step` is set where the step only reset its env (envs that reset
    in the step after an episode's end, rl.sebulba's envpool actors): the loss leaves those
    rows out (None: every step is the agent's)."""

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_obs: jax.Array
    episode: dict  # EpisodeStatistics' info: episode_done, episode_return, episode_length
    reset_step: jax.Array | None = None


def make_q_network(agent: Config, env, env_params) -> Network:
    """`agent.network`'s torso (LayerNorm by default) and one linear Q-value per action."""
    return networks.q_network(
        agent.network, env.observation_space(env_params), env.action_space(env_params).n
    )


def optimizer(agent: Config, hparams):
    return optimizers.annealed_clipped_adam(agent, hparams["lr"], hparams["max_grad_norm"])


def epsilon(agent: Config, hparams, step):
    """Linear decay from epsilon_start to epsilon_end over epsilon_decay_fraction * total_steps env
    steps."""
    return exploration.linear_schedule(
        hparams["epsilon_start"],
        hparams["epsilon_end"],
        agent.epsilon_decay_fraction * agent.total_steps,
        step,
    )


def q_lambda_targets(apply, params, traj: Transition, hparams, backend: str, deterministic=False):
    """G [T, E]: the Q(lambda) targets of the rollout `traj` with the network of the rollout,

        G = truncation_aware_q_lambda(r * reward_scale, max_a Q(final_obs, a), term, trunc)

    (a time-limit end still bootstraps from the observation it reached), through the fused kernel
    `kernels.q_lambda_returns`. `deterministic`: the kernel's fixed-order scan."""
    next_values = apply(params, traj.final_obs).max(axis=-1)
    return losses.truncation_aware_q_lambda(
        traj.reward * hparams["reward_scale"],
        next_values,
        traj.terminated,
        traj.truncated,
        hparams["gamma"],
        hparams["q_lambda"],
        backend=backend,
        deterministic=deterministic,
    )


def q_loss(apply, params, minibatch):
    """(0.5 mean (Q(s, a) - G)^2, mean Q(s, a)) of a minibatch (obs, action, target G held fixed,
    mask), the means over the rows `mask` sets (None: all; `losses.masked_mean`)."""
    obs, action, target, mask = minibatch
    q_taken = losses.action_value(apply(params, obs), action)
    loss = 0.5 * losses.masked_mean(jnp.square(q_taken - target), mask)
    return loss, losses.masked_mean(q_taken, mask)


def learn(agent: Config, hparams, loss, params, opt_state, batch, key):
    """num_epochs passes over `batch` in num_minibatches shuffled minibatches, each an Adam step
    (`optimizer`) on `loss(params, minibatch) -> (L, mean Q)`; Adam keeps moments per parameter
    array (`init_opt_state`: no flat vector to concatenate and cut each step), its clip reducing
    all their norms in one pass. Returns (params, opt_state, stats {"loss", "q_mean"} [epochs,
    minibatches])."""
    tx = optimizer(agent, hparams)
    loss_and_grad = jax.value_and_grad(loss, has_aux=True)

    def minibatch_step(carry, minibatch):
        params, opt_state = carry
        (loss_value, q_mean), grads = loss_and_grad(params, minibatch)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return (params, opt_state), {"loss": loss_value, "q_mean": q_mean}

    epochs = (agent.num_epochs, agent.num_minibatches, unroll_of(agent))  # minibatch_epochs' shape
    (params, opt_state), stats = minibatch_epochs(
        minibatch_step, (params, opt_state), batch, key, *epochs
    )
    return params, opt_state, stats


def init_opt_state(agent: Config, hparams, params):
    """`optimizer`'s state for the Q-network's `params` (one moment array per parameter array)."""
    return optimizer(agent, hparams).init(params)


def learn_rollout(
    agent: Config, apply, hparams, params, opt_state, traj: Transition, key, **kernel
):
    """One update's learning from the rollout `traj` [T, num_envs] (rl.sebulba's actors'
    too): the Q(lambda) targets under `params` (`q_lambda_targets`, `kernel` its backend and
    deterministic), held fixed, then `learn` on the flattened (obs, action, target) batch. Returns
    (params, opt_state, mean stats {"loss", "q_mean"}). A reset step (`Transition.reset_step`)
    counts for nothing; its target is meaningless, but no other step's reads it (it follows an
    episode end, where the Q(lambda) chain stops)."""
    targets = jax.lax.stop_gradient(q_lambda_targets(apply, params, traj, hparams, **kernel))
    flat = lambda x: x.reshape((agent.batch_size,) + x.shape[2:])
    batch = jax.tree.map(flat, (traj.obs, traj.action, targets, step_mask(traj)))
    loss = lambda params, minibatch: q_loss(apply, params, minibatch)
    params, opt_state, stats = learn(agent, hparams, loss, params, opt_state, batch, key)
    return params, opt_state, jax.tree.map(jnp.mean, stats)


def greedy_policy(apply, params):
    """obs -> argmax_a Q(obs, a) (first index on ties)."""
    return lambda obs: jnp.argmax(apply(params, obs), axis=-1).astype(jnp.int32)


def log_period(agent: Config, env, env_params, update, greedy, state):
    """One log period: `agent.log_interval` updates `update(state, totals) -> (state, totals,
    stats)`, then the log point's metrics: env steps, the mean return and length of the episodes
    that ended, the mean of each update statistic (loss, mean Q, epsilon) and (eval_envs > 0) the
    mean return and length of greedy episodes of the policy `greedy(params)`
    (`rl.core.rollout.greedy_episodes`). Returns (state, metrics)."""
    state, totals, stats = scan_updates(update, state, agent.log_interval)
    metrics = log_point_metrics(state.step, totals, stats)
    if agent.eval_envs:
        key, eval_key = jax.random.split(state.key)
        state = state._replace(key=key)
        returns, lengths = greedy_episodes(
            env, env_params, greedy(state.params), eval_key, agent.eval_envs
        )
        metrics["eval_return"], metrics["eval_length"] = returns.mean(), lengths.mean()
    return state, metrics


def make_trainer(config) -> Trainer:
    agent = config.agent
    env, env_params = environment.make_env(config)
    reset_envs, step_envs = environment.batched(env)
    q_network = make_q_network(agent, env, env_params)
    backend, deterministic = environment.kernel_backend(config), config.kernels.deterministic

    # ---------------------------------------------------------------- init

    def init(key, hparams) -> OnPolicyState:
        """Fresh params, optimiser state and envs (`num_envs` resets), the PRNG key, the
        counters."""
        key, net_key, reset_key = jax.random.split(key, 3)
        obs, env_state = reset_envs(jax.random.split(reset_key, agent.num_envs), env_params)
        params = q_network.init(net_key, obs[0])
        opt_state = init_opt_state(agent, hparams, params)
        return OnPolicyState(
            params, opt_state, Envs(obs, env_state), key, jnp.int32(0), jnp.int32(0)
        )

    # ---------------------------------------------------------------- rollout

    def rollout(params, envs: Envs, eps, key):
        """num_steps epsilon-greedy steps of every env; (envs, Transition [T, E, ...])."""

        def env_step(envs: Envs, keys):
            act_key, env_keys = keys
            action = exploration.epsilon_greedy(act_key, q_network.apply(params, envs.obs), eps)
            next_obs, env_state, reward, terminated, truncated, info = step_envs(
                env_keys, envs.state, action, env_params
            )
            episode = {
                name: info[name] for name in ("episode_done", "episode_return", "episode_length")
            }
            return Envs(next_obs, env_state), Transition(
                envs.obs, action, reward, terminated, truncated, info["final_obs"], episode
            )

        keys = rollout_keys(key, agent.num_steps, agent.num_envs)
        return jax.lax.scan(env_step, envs, keys, unroll=min(unroll_of(agent), agent.num_steps))

    # ---------------------------------------------------------------- one update

    def update(hparams, state: OnPolicyState, totals: episodes.EpisodeTotals):
        """Rollout, Q(lambda) targets, learning. Returns (state, totals, mean stats)."""
        key, rollout_key, shuffle_key = jax.random.split(state.key, 3)
        eps = epsilon(agent, hparams, state.step)
        envs, traj = rollout(state.params, state.envs, eps, rollout_key)
        totals = episodes.add_episodes(totals, traj.episode)
        params, opt_state, stats = learn_rollout(
            agent,
            q_network.apply,
            hparams,
            state.params,
            state.opt_state,
            traj,
            shuffle_key,
            backend=backend,
            deterministic=deterministic,
        )
        step, updates = state.step + agent.batch_size, state.updates + 1
        state = OnPolicyState(params, opt_state, envs, key, step, updates)
        return state, totals, {**stats, "epsilon": eps}

    # ---------------------------------------------------------------- log periods

    def run(state, hparams, num_log_points):
        """num_log_points of `log_period` (log_interval updates, their metrics, greedy episodes)."""
        one_update = lambda state, totals: update(hparams, state, totals)
        greedy = lambda params: greedy_policy(q_network.apply, params)
        period = lambda state: log_period(agent, env, env_params, one_update, greedy, state)
        return scan_log_points(period, state, num_log_points)

    return Trainer(init=init, run=run, num_log_points=agent.num_updates // agent.log_interval)


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config):
    """`policy(params, obs, key) -> action`: argmax of the Q-network (first index on ties)."""
    q_network = make_q_network(config.agent, *environment.make_env(config))
    return lambda params, obs, key: greedy_policy(q_network.apply, params)(obs)
