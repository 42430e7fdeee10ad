"""Tabular Q-learning with epsilon-greedy exploration, compiled end to end: one env on discrete
observations, one TD(0) update of the table per env step (`q_update`), the run a `lax.scan` over
log points, so `jax.vmap(train)(keys)` trains many agents in one compiled program.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from envs.spaces import Discrete
from rl.agents.trainer import Trainer, train_from_trainer
from rl.config.parsing import ConfigError, hp
from rl.core import environment, episodes, exploration, log_points
from rl.core.rollout import greedy_episodes
from rl.core.state import Envs


@dataclass(frozen=True)
class Config:
    name: str = "qlearning"
    total_steps: int = hp(20_000, low=1, doc="env steps per seed")
    lr: float = hp(
        0.1, low=0.0, high=1.0, low_open=True, sweep=True, doc="step size of the TD update"
    )
    gamma: float = hp(0.99, low=0.0, high=1.0, sweep=True, doc="discount")
    epsilon_start: float = hp(1.0, low=0.0, high=1.0, sweep=True)
    epsilon_end: float = hp(0.05, low=0.0, high=1.0, sweep=True)
    epsilon_decay_steps: int = hp(10_000, low=1, doc="steps of the linear epsilon decay")
    log_interval: int = hp(1_000, low=1, doc="env steps between log points")
    eval_episodes: int = hp(
        10,
        low=0,
        doc="greedy episodes per log point, on fresh envs (0: none, no eval_return)",
    )

    def validate(self):
        if self.total_steps % self.log_interval:
            raise ConfigError(
                f"agent.total_steps ({self.total_steps}) must be a multiple of "
                f"agent.log_interval ({self.log_interval})"
            )


def check_env(config, env, env_params) -> None:
    """Tabular Q-learning needs discrete observations and actions."""
    observations, actions = env.observation_space(env_params), env.action_space(env_params)
    if not isinstance(observations, Discrete) or not isinstance(actions, Discrete):
        raise ConfigError(
            f"env.id: qlearning needs discrete observations and actions; {config.env.id} has "
            f"observations {observations}, actions {actions}"
        )


class QLearningState(NamedTuple):
    """The training state, with `rl.core.state`'s field names: the table and the one training env
    (its leaves have no env axis: one env steps, and `--shard envs` has no num_envs to split)."""

    params: jax.Array  # the Q-table [num_states, num_actions]
    envs: Envs  # the training env's observation and state
    key: jax.Array  # the PRNG key the next log period splits
    step: jax.Array  # env steps so far (one TD update each)


def q_update(q, obs, action, reward, next_obs, terminated, lr, gamma):
    """One TD(0) update of the table:
    Q(s, a) += lr * (r + gamma * (1 - terminated) * max_a' Q(s', a') - Q(s, a)),
    s' = `next_obs` = info["final_obs"] (before any auto-reset: a time limit still bootstraps).

    Written so that a vmapped and an unbatched program round identically (seed i of a batch equals
    seed i alone): XLA:CPU contracts `x + y * z` into a fused multiply-add in some fusions and not
    others, and one ulp flips exact ties between Q-values, hence (random tie-breaking) whole
    trajectories. A select between each product and its sum keeps both programs unfused.
    """
    target = reward + jnp.where(terminated, 0.0, gamma * q[next_obs].max())
    row = q[obs]
    is_action = jnp.arange(row.shape[0]) == action
    return q.at[obs].set(row + jnp.where(is_action, lr * (target - row), 0.0))


def greedy_action(q, obs):
    """argmax_a Q(obs, a), first index on ties (obs: one state index or a batch of them)."""
    return jnp.argmax(q[obs], axis=-1).astype(jnp.int32)


def make_policy(config):
    """`policy(params, obs, key) -> action`: the greedy action of the Q-table (first index on
    ties)."""
    return lambda q, obs, key: greedy_action(q, obs)


def greedy_episode_length(q, env, params, max_steps):
    """Steps the greedy policy (argmax, first index on ties) takes to end an episode from reset,
    or `max_steps` if it has not ended by then. Uses a fixed key: the greedy policy is evaluated
    on the env's PRNGKey(0) episode (GridWorld ignores keys)."""
    key = jax.random.PRNGKey(0)
    obs, state = env.reset(key, params)

    def not_ended(carry):
        _, _, ended, length = carry
        return jnp.logical_not(ended) & (length < max_steps)

    def step(carry):
        obs, state, _, length = carry
        obs, state, _, terminated, truncated, _ = env.step(
            key, state, greedy_action(q, obs), params
        )
        return obs, state, terminated | truncated, length + 1

    _, _, _, length = jax.lax.while_loop(
        not_ended, step, (obs, state, jnp.bool_(False), jnp.int32(0))
    )
    return length


def make_trainer(config) -> Trainer:
    """Q-learning's Trainer: each log point a `lax.scan` over `log_interval` env steps, acting
    epsilon-greedily with ties broken uniformly at random (`exploration.epsilon_greedy_random_ties`:
    with argmax's first-index ties an agent on an all-zero table would always pick action 0), the
    log period's uniforms (two per step) drawn at once. At each log point the greedy policy plays
    `eval_episodes` episodes on fresh envs (`eval_return`, `eval_length`) and the episode from the
    env's PRNGKey(0) reset (`greedy_episode_length`), each stopping when its episodes end."""
    agent = config.agent
    env, env_params = environment.make_env(config)
    num_states = env.observation_space(env_params).n
    num_actions = env.action_space(env_params).n
    max_steps = int(env_params.max_steps_in_episode)

    # ---------------------------------------------------------------- init

    def init(key, hparams) -> QLearningState:
        """A zero table, the env reset, the PRNG key and the step counter."""
        key, reset_key = jax.random.split(key)
        obs, env_state = env.reset(reset_key, env_params)
        q = jnp.zeros((num_states, num_actions), jnp.float32)
        return QLearningState(q, Envs(obs, env_state), key, jnp.int32(0))

    # ---------------------------------------------------------------- act and learn

    def env_step(hparams, carry, noise):
        """One epsilon-greedy step of the env, then one TD update of the table."""
        (q, envs, step), totals = carry
        step_key, (explore_u, choice_u) = noise
        epsilon = exploration.linear_schedule(
            hparams["epsilon_start"], hparams["epsilon_end"], agent.epsilon_decay_steps, step
        )
        action = exploration.epsilon_greedy_random_ties(q[envs.obs], epsilon, explore_u, choice_u)
        next_obs, env_state, reward, terminated, _, info = env.step(
            step_key, envs.state, action, env_params
        )
        final_obs = info["final_obs"]
        q = q_update(
            q, envs.obs, action, reward, final_obs, terminated, hparams["lr"], hparams["gamma"]
        )
        carry = (q, Envs(next_obs, env_state), step + 1), episodes.add_episodes(totals, info)
        return carry, None

    # ---------------------------------------------------------------- log period

    def log_period(hparams, state: QLearningState):
        """log_interval env steps, then the log point's metrics: env steps, the mean return and
        length of the episodes that ended, and the greedy policy's evaluation. The fourth key of
        the split goes to the evaluation (with jax's default partitionable threefry, split(k, 4)[:3]
        is split(k, 3): the training keys do not depend on whether the agent evaluates)."""
        key, env_keys_key, uniforms_key, eval_key = jax.random.split(state.key, 4)
        n = agent.log_interval
        noise = (jax.random.split(env_keys_key, n), jax.random.uniform(uniforms_key, (n, 2)))
        carry = (state.params, state.envs, state.step), episodes.no_episodes()
        ((q, envs, step), totals), _ = jax.lax.scan(
            lambda carry, noise: env_step(hparams, carry, noise), carry, noise
        )
        metrics = log_points.log_point_metrics(step, totals, {})
        metrics["greedy_episode_length"] = greedy_episode_length(q, env, env_params, max_steps)
        if agent.eval_episodes:
            policy = lambda obs: greedy_action(q, obs)
            returns, lengths = greedy_episodes(
                env, env_params, policy, eval_key, agent.eval_episodes
            )
            metrics["eval_return"], metrics["eval_length"] = returns.mean(), lengths.mean()
        return QLearningState(q, envs, key, step), metrics

    # ---------------------------------------------------------------- run

    def run(state, hparams, num_log_points):
        return log_points.scan_log_points(partial(log_period, hparams), state, num_log_points)

    return Trainer(init=init, run=run, num_log_points=agent.total_steps // agent.log_interval)


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)
