"""What each agent the actor-learner architecture (rl.sebulba) trains brings to it, built from the
agent's own module: how an actor acts, what a rollout step records, and the learner's update, which
is the agent's own learning step (PPO's `ppo.learn`, PQN's `pqn.learn_rollout`).

    pieces = make_pieces(config)
    key, record, env_action = pieces.act(hparams, params, obs, key, step)   # an actor's step
    traj = pieces.transition(obs, *record, reward, terminated, truncated, final_obs,
                             reset_step=None)                             # [T, E, ...]
    params, opt_state, stats = pieces.learn(hparams, params, opt_state, traj, key)

* PPO: a sample of the policy, recording (action, log pi(action|obs)); Box actions mapped to the
  env's bounds.
* PQN: epsilon-greedy on Q, epsilon of the env steps before the rollout (`pqn.epsilon` at
  `step`, as the one-program PQN at the update's start), recording the action; the Q(lambda)
  targets come from the learner's params when it learns.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from rl import environment, exploration
from rl.agents import ppo, pqn
from rl.arch_config import SEBULBA_AGENTS
from rl.sebulba_envs import obs_dtype


class Pieces(NamedTuple):
    """An agent's pieces of the actor-learner loop (module docstring); functions of values,
    jitted by the caller. `obs_space` is the env's observation space, `obs_dtype` the dtype the
    network reads, `stats` the learner's statistics besides the loss ones (PQN: epsilon)."""

    obs_space: Any
    obs_dtype: Any
    init: Callable  # (key, hparams, obs) -> (params, opt_state)
    act: Callable  # (hparams, params, obs, key, step) -> (key, record, env_action)
    # (obs, *record, reward, terminated, truncated, final_obs, reset_step=None) -> Transition
    transition: Callable
    learn: Callable  # (hparams, params, opt_state, traj, key) -> (params, opt_state, mean stats)
    greedy: Callable  # (params, obs) -> the env's action, for evaluation


def make_pieces(config) -> Pieces:
    """The pieces of `config.agent` (one of `SEBULBA_AGENTS`)."""
    assert config.agent.name in SEBULBA_AGENTS, config.agent.name  # rl.arch_config.check_arch
    return {"ppo": ppo_pieces, "pqn": pqn_pieces}[config.agent.name](config)


def ppo_pieces(config) -> Pieces:
    s = ppo.make_setup(config)
    grads_fn, batch_fn = ppo.learning_pieces(config, s)

    def act(hparams, params, obs, key, step):
        key, sample_key = jax.random.split(key)
        pi = ppo.policy(s, params, obs)
        action = pi.sample(sample_key)
        log_prob, _ = pi.log_prob_entropy(action, backend="reference")
        env_action = environment.to_env_action(s.env, s.env_params, pi.env_action(action))
        return key, (action, log_prob), env_action

    def learn(hparams, params, opt_state, traj, key):
        learned = ppo.learn(s, grads_fn, batch_fn, hparams, params, opt_state, traj, key)
        return *learned[:2], jax.tree.map(jnp.mean, learned[2])

    def greedy(params, obs):
        return environment.to_env_action(s.env, s.env_params, ppo.greedy_action(s, params, obs))

    space = s.env.observation_space(s.env_params)
    return Pieces(
        space,
        obs_dtype(space),
        lambda key, hparams, obs: ppo.init_params(s, key, hparams, obs),
        act,
        ppo.Transition,
        learn,
        greedy,
    )


def pqn_pieces(config) -> Pieces:
    agent = config.agent
    env, env_params = environment.make_env(config)
    apply = pqn.make_q_network(agent, env, env_params).apply
    kernel = dict(
        backend=environment.kernel_backend(config), deterministic=config.kernels.deterministic
    )

    def init(key, hparams, obs):
        params = pqn.make_q_network(agent, env, env_params).init(key, obs)
        return params, pqn.init_opt_state(agent, hparams, params)

    def act(hparams, params, obs, key, step):
        key, act_key = jax.random.split(key)
        eps = pqn.epsilon(agent, hparams, step)
        action = exploration.epsilon_greedy(act_key, apply(params, obs), eps)
        return key, (action,), action

    def learn(hparams, params, opt_state, traj, key):
        return pqn.learn_rollout(agent, apply, hparams, params, opt_state, traj, key, **kernel)

    space = env.observation_space(env_params)
    return Pieces(
        space,
        obs_dtype(space),
        init,
        act,
        lambda *columns, reset_step=None: pqn.Transition(
            *columns, episode={}, reset_step=reset_step
        ),
        learn,
        lambda params, obs: pqn.greedy_policy(apply, params)(obs),
    )
