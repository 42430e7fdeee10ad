"""Tabular Q-learning with epsilon-greedy exploration, compiled end to end.

For a transition (s, a, r, s', terminated) with s' = info["final_obs"] (the state reached, before any
auto-reset, so a time-limit truncation still bootstraps):

    Q(s, a) <- Q(s, a) + lr * (r + gamma * (1 - terminated) * max_a' Q(s', a') - Q(s, a))

Actions are epsilon-greedy, epsilon decaying linearly from `epsilon_start` to `epsilon_end` over
`epsilon_decay_steps`; the greedy action breaks ties uniformly at random among the maximal Q-values
(`exploration.epsilon_greedy_random_ties`: with argmax's first-index ties an agent on an all-zero table
would always pick action 0).

The run is one `lax.scan` over log points, each a `lax.scan` over `log_interval` env steps, so
`jax.vmap(train)(keys)` trains many agents in one compiled program. Observations must be discrete.
Each env step draws two uniforms, drawn for the whole log period at once; the greedy evaluation at
each log point stops as soon as its episode ends (a `while_loop`).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from envs.spaces import Discrete
from rl import environment, episodes, exploration, log_points
from rl.config import ConfigError, hp
from rl.trainer import Trainer, train_from_trainer


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

    def validate(self):
        if self.total_steps % self.log_interval:
            raise ConfigError(
                f"agent.total_steps ({self.total_steps}) must be a multiple of agent.log_interval ({self.log_interval})"
            )


def check_env(config, env, env_params) -> None:
    """Tabular Q-learning needs discrete observations and actions."""
    observations, actions = env.observation_space(env_params), env.action_space(env_params)
    if not isinstance(observations, Discrete) or not isinstance(actions, Discrete):
        raise ConfigError(
            f"env.id: qlearning needs discrete observations and actions; {config.env.id} has observations {observations}, actions {actions}"
        )


def q_update(q, obs, action, reward, next_obs, terminated, lr, gamma):
    """One TD(0) update of the table:
    Q(s, a) += lr * (r + gamma * (1 - terminated) * max_a' Q(s', a') - Q(s, a)).

    Written so that a vmapped and an unbatched program round identically (seed i of a batch equals
    seed i alone): XLA:CPU contracts `x + y * z` into a fused multiply-add in some fusions and not
    others, and one ulp flips exact ties between Q-values, hence (random tie-breaking) whole
    trajectories. A select between each product and its sum keeps both programs unfused.
    """
    target = reward + jnp.where(terminated, 0.0, gamma * q[next_obs].max())
    row = q[obs]
    is_action = jnp.arange(row.shape[0]) == action
    return q.at[obs].set(row + jnp.where(is_action, lr * (target - row), 0.0))


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
            key, state, jnp.argmax(q[obs]).astype(jnp.int32), params
        )
        return obs, state, terminated | truncated, length + 1

    _, _, _, length = jax.lax.while_loop(
        not_ended, step, (obs, state, jnp.bool_(False), jnp.int32(0))
    )
    return length


def make_trainer(config) -> Trainer:
    agent = config.agent
    env, env_params = environment.make_env(config)
    num_states = env.observation_space(env_params).n
    num_actions = env.action_space(env_params).n
    eval_steps = int(env_params.max_steps_in_episode)

    def init(key, hparams):
        key, reset_key = jax.random.split(key)
        obs, env_state = env.reset(reset_key, env_params)
        q = jnp.zeros((num_states, num_actions), jnp.float32)
        return {"params": q, "obs": obs, "env_state": env_state, "key": key, "step": jnp.int32(0)}

    def run(state, hparams, num_log_points):
        def env_step(carry, noise):
            (q, obs, env_state, step), totals = carry
            step_key, (explore_u, choice_u) = noise
            epsilon = exploration.linear_schedule(
                hparams["epsilon_start"], hparams["epsilon_end"], agent.epsilon_decay_steps, step
            )
            action = exploration.epsilon_greedy_random_ties(q[obs], epsilon, explore_u, choice_u)
            next_obs, env_state, reward, terminated, _, info = env.step(
                step_key, env_state, action, env_params
            )
            q = q_update(
                q,
                obs,
                action,
                reward,
                info["final_obs"],
                terminated,
                hparams["lr"],
                hparams["gamma"],
            )
            return ((q, next_obs, env_state, step + 1), episodes.add_episodes(totals, info)), None

        def log_period(state):
            key, env_keys_key, uniforms_key = jax.random.split(state["key"], 3)
            n = agent.log_interval
            noise = (jax.random.split(env_keys_key, n), jax.random.uniform(uniforms_key, (n, 2)))
            carry = (
                (state["params"], state["obs"], state["env_state"], state["step"]),
                episodes.no_episodes(),
            )
            ((q, obs, env_state, step), totals), _ = jax.lax.scan(env_step, carry, noise)
            metrics = {
                "step": step,
                **episodes.episode_metrics(totals),
                "greedy_episode_length": greedy_episode_length(q, env, env_params, eval_steps),
            }
            return {
                "params": q,
                "obs": obs,
                "env_state": env_state,
                "key": key,
                "step": step,
            }, metrics

        return log_points.scan_log_points(log_period, state, num_log_points)

    return Trainer(
        init=init, run=run, num_log_points=agent.total_steps // agent.log_interval, per_env=()
    )


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config):
    """`policy(params, obs, key) -> action`: the greedy action of the Q-table (first index on ties)."""

    def policy(q, obs, key):
        return jnp.argmax(q[obs]).astype(jnp.int32)

    return policy
