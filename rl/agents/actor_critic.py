"""The plain pieces of the replay actor-critics with continuous control (SAC, TD3), whose loops live
in their agent files: the actor and twin critics, the envs and the uniform replay buffer, uniformly
random actions, one optimiser step, the scan over a log period's act-then-train phases and the
deterministic evaluation.

A phase is one step of all `num_envs` envs (the transitions (s, a, r, s' = info["final_obs"],
terminated) go to the buffer), then `gradient_steps = utd_ratio * num_envs` gradient steps once
`learning_starts` env steps are stored; a log period is `log_interval // num_envs` phases
(`rl.config.loops.ReplayActorCriticConfig`). Actions live in [-1, 1]^d for a Box
(`rl.core.environment.make_env` rescales them onto the env's bounds).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from envs.spaces import Box
from rl.config.loops import ReplayActorCriticConfig
from rl.config.unrolling import unroll_of
from rl.core import environment, episodes
from rl.core.rollout import greedy_episodes
from rl.core.state import Envs
from rl.nn import batch_renorm, layers, networks
from rl.nn.network_config import ActorCriticNetworkConfig
from rl.replay import buffers


def actor_and_twin_critic(
    config: ActorCriticNetworkConfig, obs_space, policy_head, num_actions=None
):
    """(actor, critic) networks on `config`'s backend: actor(params, obs) = `policy_head` on a torso
    of the observations (`config.actor`); critic the twin Q-networks (`networks.twin_q`,
    `config.critic`), each torso reading concat(obs, action) (`num_actions` None) or the
    observations with one Q per action. With `config.batch_renorm` the critic is a
    `rl.nn.batch_renorm.StatefulNetwork` (its running statistics beside its params)."""
    build = lambda fn: layers.build(fn, config.backend, config.init)
    actor = networks.with_head(networks.make_torso(config.actor, obs_space), policy_head)
    return build(actor), twin_critic(config, num_actions)


def twin_critic(config: ActorCriticNetworkConfig, num_actions=None):
    """The twin critics of `actor_and_twin_critic`: a `Network`, or with `config.batch_renorm` a
    `StatefulNetwork`."""
    fn = networks.twin_q(networks.make_torso(config.critic), num_actions=num_actions)
    if config.batch_renorm:
        return batch_renorm.build(fn, config.backend, config.init)
    return layers.build(fn, config.backend, config.init)


def joint_twin_critic(config: ActorCriticNetworkConfig) -> batch_renorm.StatefulNetwork:
    """The twin critics reading concat(obs, action) as a `StatefulNetwork` whatever
    `config.batch_renorm` (without it, no statistics: {}), for `joint_q_values`."""
    fn = networks.twin_q(networks.make_torso(config.critic))
    return batch_renorm.build(fn, config.backend, config.init)


def joint_q_values(critic, params, stats, batch, next_action):
    """CrossQ's joint pass: the twin critics (a `StatefulNetwork`) in training mode on the
    concatenated batch [(s, a); (s', a')], so their batch statistics are those of the mixture of
    both. Returns ((q1, q2) at (s, a), (q1', q2') at (s', a') held fixed, the updated statistics).
    """
    obs = jnp.concatenate([batch["obs"], batch["next_obs"]])
    action = jnp.concatenate([batch["action"], next_action.astype(batch["action"].dtype)])
    (q1, q2), stats = critic.apply(params, stats, obs, action, training=True)
    size = batch["obs"].shape[0]
    next_q = jax.lax.stop_gradient((q1[size:], q2[size:]))
    return (q1[:size], q2[:size]), next_q, stats


def eval_q_values(critic, params, stats, obs, action):
    """(q1, q2) of a `StatefulNetwork`'s twin critics by their running statistics."""
    return critic.apply(params, stats, obs, action)[0]


def reset_envs(env, env_params, key, num_envs: int) -> Envs:
    """`num_envs` fresh envs: their first observations and states."""
    reset, _ = environment.batched(env)
    return Envs(*reset(jax.random.split(key, num_envs), env_params))


def empty_buffer(obs, action, capacity: int) -> buffers.UniformBuffer:
    """A uniform replay buffer of `capacity` transitions (s, a, r, s', terminated) shaped like one
    observation `obs` and one action `action`."""
    example = {
        "obs": obs,
        "action": action,
        "reward": jnp.float32(0.0),
        "next_obs": obs,
        "terminated": jnp.bool_(False),
    }
    return buffers.uniform_init(example, capacity)


def random_actions(space, key, num_envs: int):
    """Uniformly random actions of `num_envs` envs: in [-1, 1]^d for a Box (the agent's action
    space), else uniform int32 indices."""
    if isinstance(space, Box):
        return jax.random.uniform(key, (num_envs, *space.shape), minval=-1.0, maxval=1.0)
    return jax.random.randint(key, (num_envs,), 0, space.n, jnp.int32)


def step_and_store(env, env_params, state, totals: episodes.EpisodeTotals, action, key):
    """All envs of `state.envs` take `action`; each transition (s, a, r, s' = info["final_obs"],
    terminated) goes to the uniform buffer `state.buffer`, `state.step` advances by the number of
    envs and the episodes that ended are added to `totals`. Returns (state, totals)."""
    _, step = environment.batched(env)
    num_envs = action.shape[0]
    obs, env_state, reward, terminated, _, info = step(
        jax.random.split(key, num_envs), state.envs.state, action, env_params
    )
    transition = {
        "obs": state.envs.obs,
        "action": action,
        "reward": reward,
        "next_obs": info["final_obs"],
        "terminated": terminated,
    }
    state = state._replace(
        envs=Envs(obs, env_state),
        buffer=buffers.uniform_add(state.buffer, transition),
        step=state.step + num_envs,
    )
    return state, episodes.add_episodes(totals, info)


def optimizer_step(
    optimizer: optax.GradientTransformation, grads, opt_state, params, grad_sq_norm=None
):
    """One step of `optimizer` along `grads`: (params, opt_state). `grad_sq_norm`: ||grads||^2
    where a fused kernel computed it already (passed to the clip), else None."""
    if grad_sq_norm is not None:
        updates, opt_state = optax.with_extra_args_support(optimizer).update(
            grads, opt_state, params, grad_sq_norm=grad_sq_norm
        )
        return optax.apply_updates(params, updates), opt_state
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def phase_keys(key, gradient_steps: int):
    """A phase's keys, split once: (the env step's key, one key per gradient step)."""
    keys = jax.random.split(key, 1 + gradient_steps)
    return keys[0], keys[1:]


def scan_phases(phase: Callable, state, key, agent: ReplayActorCriticConfig):
    """`lax.scan` of `phase((state, totals), key) -> ((state, totals), stats)` over the
    `log_interval // num_envs` phases of a log period, from no finished episodes. A loop trip runs
    max(1, unroll // gradient_steps) phases (a phase's gradient scan unrolls min(unroll,
    gradient_steps) steps): the same computation. Returns (state, totals, stats [phases, ...])."""
    num_phases = agent.log_interval // agent.num_envs
    unroll = min(max(1, unroll_of(agent) // agent.gradient_steps), num_phases)
    (state, totals), stats = jax.lax.scan(
        phase, (state, episodes.no_episodes()), jax.random.split(key, num_phases), unroll=unroll
    )
    return state, totals, stats


def eval_return(env, env_params, policy: Callable, key, num_episodes: int):
    """The mean return of the first episode of each of `num_episodes` fresh envs under the
    deterministic `policy(obs[E, ...]) -> actions[E, ...]` (`rl.core.rollout.greedy_episodes`)."""
    returns, _ = greedy_episodes(env, env_params, policy, key, num_episodes)
    return returns.mean()
