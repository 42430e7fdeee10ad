"""Tabular Q-learning with epsilon-greedy exploration, compiled end to end.

For a transition (s, a, r, s', terminated) with s' = info["final_obs"] (the state reached, before any
auto-reset, so a time-limit truncation still bootstraps):

    Q(s, a) <- Q(s, a) + lr * (r + gamma * (1 - terminated) * max_a' Q(s', a') - Q(s, a))

Actions are epsilon-greedy, epsilon decaying linearly from `epsilon_start` to `epsilon_end` over
`epsilon_decay_steps`; the greedy action breaks ties uniformly at random among the maximal Q-values
(with argmax's first-index ties an agent on an all-zero table would always pick action 0).

The run is one `lax.scan` over log points, each a `lax.scan` over `log_interval` env steps, so
`jax.vmap(train)(keys)` trains many agents in one compiled program. Observations must be discrete.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

import envs
from envs.spaces import Discrete
from rl.agents import Trainer, train_from_trainer
from rl.config import ConfigError, hp
from rl.logging import emit


@dataclass(frozen=True)
class Config:
    name: str = "qlearning"
    total_steps: int = hp(20_000, low=1, doc="env steps per seed")
    lr: float = hp(0.1, low=0.0, high=1.0, low_open=True, sweep=True, doc="step size of the TD update")
    gamma: float = hp(0.99, low=0.0, high=1.0, sweep=True, doc="discount")
    epsilon_start: float = hp(1.0, low=0.0, high=1.0, sweep=True)
    epsilon_end: float = hp(0.05, low=0.0, high=1.0, sweep=True)
    epsilon_decay_steps: int = hp(10_000, low=1, doc="steps of the linear epsilon decay")
    log_interval: int = hp(1_000, low=1, doc="env steps between log points")

    def validate(self):
        if self.total_steps % self.log_interval:
            raise ConfigError(f"agent.total_steps ({self.total_steps}) must be a multiple of agent.log_interval ({self.log_interval})")


def check_env(config) -> None:
    """Tabular Q-learning needs discrete observations and actions."""
    env, params = envs.make(config.env.id, **dict(config.env.params))
    if not isinstance(env.observation_space(params), Discrete) or not isinstance(env.action_space(params), Discrete):
        raise ConfigError(f"env.id: qlearning needs discrete observations and actions; {config.env.id} has {env.observation_space(params)}")


def linear_schedule(start, end, duration, step):
    """start + (end - start) * min(step / duration, 1)."""
    return start + (end - start) * jnp.minimum(step / duration, 1.0)


def epsilon_greedy(q_values, epsilon, explore_u, random_action, tie_noise):
    """Random action with probability epsilon, else a uniformly random maximiser of `q_values`.

    `explore_u` ~ U[0, 1), `random_action` ~ U{0..A-1} and `tie_noise` ~ U[0, 1)^A are drawn by the caller.
    """
    greedy = jnp.argmax(jnp.where(q_values == q_values.max(), tie_noise, -1.0))
    return jnp.where(explore_u < epsilon, random_action, greedy).astype(jnp.int32)


def q_update(q, obs, action, reward, next_obs, terminated, lr, gamma):
    """One TD(0) update of the table (see the module docstring)."""
    target = reward + gamma * (1.0 - terminated) * q[next_obs].max()
    return q.at[obs, action].add(lr * (target - q[obs, action]))


def greedy_episode_length(q, env, params, max_steps):
    """Steps the greedy policy (argmax, first index on ties) takes to end an episode from reset,
    or `max_steps` if it has not ended by then. GridWorld's reset ignores the key."""
    obs, state = env.reset(jax.random.PRNGKey(0), params)

    def step(carry, _):
        obs, state, ended, length = carry
        obs, state, _, terminated, truncated, _ = env.step(jax.random.PRNGKey(0), state, jnp.argmax(q[obs]).astype(jnp.int32), params)
        length = length + jnp.where(ended, 0, 1)
        return (obs, state, ended | terminated | truncated, length), None

    (_, _, _, length), _ = jax.lax.scan(step, (obs, state, jnp.bool_(False), jnp.int32(0)), None, length=max_steps)
    return length


def make_trainer(config) -> Trainer:
    env, env_params = envs.make(config.env.id, **dict(config.env.params))
    agent = config.agent
    num_states = env.observation_space(env_params).n
    num_actions = env.action_space(env_params).n
    eval_steps = int(env_params.max_steps_in_episode)

    def init(key, hparams):
        key, reset_key = jax.random.split(key)
        obs, env_state = env.reset(reset_key, env_params)
        q = jnp.zeros((num_states, num_actions), jnp.float32)
        return {"params": q, "obs": obs, "env_state": env_state, "key": key, "step": jnp.int32(0), "episode_return": jnp.float32(0.0), "episode_length": jnp.int32(0)}

    def run(state, hparams, num_log_points):
        def env_step(carry, noise):
            q, obs, env_state, step, ep_return, ep_length, stats = carry
            step_key, explore_u, random_action, tie_noise = noise
            epsilon = linear_schedule(hparams["epsilon_start"], hparams["epsilon_end"], agent.epsilon_decay_steps, step)
            action = epsilon_greedy(q[obs], epsilon, explore_u, random_action, tie_noise)
            next_obs, env_state, reward, terminated, truncated, info = env.step(step_key, env_state, action, env_params)
            q = q_update(q, obs, action, reward, info["final_obs"], terminated, hparams["lr"], hparams["gamma"])
            done = terminated | truncated
            ep_return, ep_length = ep_return + reward, ep_length + 1
            ended_return, ended_length, episodes = stats
            stats = (ended_return + jnp.where(done, ep_return, 0.0), ended_length + jnp.where(done, ep_length, 0), episodes + done)
            ep_return, ep_length = jnp.where(done, 0.0, ep_return), jnp.where(done, 0, ep_length)
            return (q, next_obs, env_state, step + 1, ep_return, ep_length, stats), None

        def log_period(state, _):
            key, period_key = jax.random.split(state["key"])
            keys = jax.random.split(period_key, 4)
            n = agent.log_interval
            noise = (  # all randomness of the period drawn at once: cheaper than per-step draws
                jax.random.split(keys[0], n),
                jax.random.uniform(keys[1], (n,)),
                jax.random.randint(keys[2], (n,), 0, num_actions),
                jax.random.uniform(keys[3], (n, num_actions)),
            )
            zero_stats = (jnp.float32(0.0), jnp.int32(0), jnp.int32(0))
            carry = (state["params"], state["obs"], state["env_state"], state["step"], state["episode_return"], state["episode_length"], zero_stats)
            (q, obs, env_state, step, ep_return, ep_length, stats), _ = jax.lax.scan(env_step, carry, noise, unroll=4)
            ended_return, ended_length, episodes = stats
            metrics = {
                "step": step,
                "episode_return": jnp.where(episodes > 0, ended_return / jnp.maximum(episodes, 1), jnp.nan),
                "episode_length": jnp.where(episodes > 0, ended_length / jnp.maximum(episodes, 1), jnp.nan),
                "episodes": episodes,
                "greedy_episode_length": greedy_episode_length(q, env, env_params, eval_steps),
            }
            state = {"params": q, "obs": obs, "env_state": env_state, "key": key, "step": step, "episode_return": ep_return, "episode_length": ep_length}
            return state, emit(metrics)

        return jax.lax.scan(log_period, state, None, length=num_log_points)

    return Trainer(init=init, run=run, num_log_points=agent.total_steps // agent.log_interval)


def make_train(config):
    return train_from_trainer(make_trainer(config), config.agent)


def make_policy(config):
    """`policy(params, obs, key) -> action`: the greedy action of the Q-table (first index on ties)."""

    def policy(q, obs, key):
        return jnp.argmax(q[obs]).astype(jnp.int32)

    return policy
