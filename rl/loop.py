"""The loop drivers the agents still hand their functions to: the act-then-train phase, state, log
period and Trainer of the off-policy agents, and PPO's policy sampling, minibatch loss, flat-vector
epochs, log period and Trainer.

Every function is pure and traceable; none holds state between calls.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from envs.spaces import Box
from rl import buffers, heads, losses
from rl.agent_configs import (
    OnPolicyLoopConfig,
    PPOLoopConfig,
    ReplayActorCriticConfig,
    ReplayLoopConfig,
)
from rl.environment import batched
from rl.episodes import add_episodes, episode_metrics, no_episodes
from rl.exploration import linear_schedule
from rl.log_points import scan_log_points
from rl.minibatches import minibatch_epochs
from rl.optimizers import annealed_clipped_adam
from rl.rollout import greedy_episodes
from rl.trainer import Trainer

# ---------------------------------------------------------------- the replay loop's settings


# ---------------------------------------------------------------- the env an agent trains on


# ---------------------------------------------------------------- schedules and exploration


# ---------------------------------------------------------------- rollouts and minibatches


# ---------------------------------------------------------------- target networks


# ---------------------------------------------------------------- episode statistics


# ---------------------------------------------------------------- off-policy phase and log points


def act_then_train(
    env_step: Callable,
    gradient_step: Callable,
    env_iterations: int,
    gradient_steps: int,
    learning_starts: int,
    unroll: int = 1,
) -> Callable:
    """`phase((state, totals), key) -> ((state, totals), aux)`: `env_iterations` calls of
    `env_step((state, totals), key) -> ((state, totals), None)`, then, once
    state["step"] >= learning_starts, `gradient_steps` calls of `gradient_step(state, key) ->
    (state, aux)`; aux is stacked over the gradient steps ([gradient_steps, ...], NaN before learning).
    Each of the two loops runs up to `unroll` calls per loop trip (the same computation)."""

    def train(state, keys):
        return jax.lax.scan(gradient_step, state, keys, unroll=min(unroll, gradient_steps))

    def skip(state, keys):
        shapes = jax.eval_shape(train, state, keys)[1]
        return state, jax.tree.map(lambda s: jnp.full(s.shape, jnp.nan, s.dtype), shapes)

    def phase(carry, key):
        keys = jax.random.split(
            key, env_iterations + gradient_steps
        )  # one split for the whole phase
        (state, totals), _ = jax.lax.scan(
            env_step, carry, keys[:env_iterations], unroll=min(unroll, env_iterations)
        )
        state, aux = jax.lax.cond(
            state["step"] >= learning_starts, train, skip, state, keys[env_iterations:]
        )
        return (state, totals), aux

    return phase


def phase_unroll(unroll: int, env_iterations: int, gradient_steps: int) -> int:
    """Phases per loop trip for a budget of `unroll` iterations per trip: the phases' own loops take
    up to `unroll` iterations each, so the loop over phases unrolls what is left,
    max(1, unroll // max(env_iterations, gradient_steps))."""
    return max(1, unroll // max(env_iterations, gradient_steps))


def replay_state(key, params, opt_state, buffer, obs, env_state, **extra) -> dict:
    """A replay agent's training state: online and target params (equal at the start), optimiser
    state, replay buffer, the envs' observations and states, the PRNG key, and the env-step and
    gradient-step counters, plus any `extra` entries."""
    return {
        "params": params,
        "target_params": params,
        "opt_state": opt_state,
        "buffer": buffer,
        **extra,
        "obs": obs,
        "env_state": env_state,
        "key": key,
        "step": jnp.int32(0),
        "updates": jnp.int32(0),
    }


def step_and_store(env, env_params, num_envs: int, carry, action, key):
    """All envs take `action`; each transition (s, a, r, s' = info["final_obs"], terminated) goes to
    the uniform replay buffer `state["buffer"]`, the step counter advances by `num_envs`, and the
    episodes that ended are added to the totals. `carry` = (state, totals); returns ((state, totals), None)."""
    state, totals = carry
    _, step = batched(env)
    obs, env_state, reward, terminated, _, info = step(
        jax.random.split(key, num_envs), state["env_state"], action, env_params
    )
    transition = {
        "obs": state["obs"],
        "action": action,
        "reward": reward,
        "next_obs": info["final_obs"],
        "terminated": terminated,
    }
    state = {
        **state,
        "buffer": buffers.uniform_add(state["buffer"], transition),
        "obs": obs,
        "env_state": env_state,
        "step": state["step"] + num_envs,
    }
    return (state, add_episodes(totals, info)), None


def replay_epsilon(agent: ReplayLoopConfig, hparams, step):
    """Epsilon after `step` env steps: linear from epsilon_start to epsilon_end over epsilon_decay_steps."""
    return linear_schedule(
        hparams["epsilon_start"], hparams["epsilon_end"], agent.epsilon_decay_steps, step
    )


def off_policy_log_period(
    env,
    env_params,
    num_phases: int,
    eval_episodes: int,
    greedy_policy: Callable,
    extra_metrics: Callable,
    phase: Callable,
    state,
    unroll: int = 1,
):
    """One log period of an off-policy agent: `num_phases` act-then-train phases (`unroll` per loop
    trip), then the period's episode statistics, `extra_metrics(state)`, the mean of each
    gradient-step aux (NaN before learning), and the mean return of `eval_episodes` episodes of
    `greedy_policy(params) -> (obs -> action)` on fresh envs (none if 0)."""
    key, phase_key, eval_key = jax.random.split(state["key"], 3)
    (state, totals), aux = jax.lax.scan(
        phase,
        ({**state, "key": key}, no_episodes()),
        jax.random.split(phase_key, num_phases),
        unroll=min(unroll, num_phases),
    )
    metrics = {"step": state["step"], **episode_metrics(totals), **extra_metrics(state)}
    metrics.update({name: jnp.nanmean(value) for name, value in aux.items()})
    if eval_episodes:
        metrics["eval_return"] = greedy_episodes(
            env, env_params, greedy_policy(state["params"]), eval_key, eval_episodes
        )[0].mean()
    return state, metrics


def off_policy_trainer(
    agent,
    env,
    env_params,
    init: Callable,
    env_step: Callable,
    gradient_step: Callable,
    greedy_policy: Callable,
    extra_metrics: Callable,
    env_iterations: int,
    phases_per_log: int,
) -> Trainer:
    """The Trainer of an off-policy agent: `init(key, hparams) -> state`; each log point is
    `off_policy_log_period` over `phases_per_log` `act_then_train` phases of `env_iterations` calls of
    `env_step(hparams, (state, totals), key)` and `agent.gradient_steps` calls of
    `gradient_step(hparams, state, key) -> (state, aux dict)`; `extra_metrics(hparams, state)`.
    `agent.unroll` iterations per loop trip: the phases' loops first, then the loop over phases
    (`phase_unroll`)."""

    def run(state, hparams, num_log_points):
        phase = act_then_train(
            partial(env_step, hparams),
            partial(gradient_step, hparams),
            env_iterations,
            agent.gradient_steps,
            agent.learning_starts,
            agent.unroll,
        )
        log_period = partial(
            off_policy_log_period,
            env,
            env_params,
            phases_per_log,
            agent.eval_episodes,
            greedy_policy,
            partial(extra_metrics, hparams),
            phase,
            unroll=phase_unroll(agent.unroll, env_iterations, agent.gradient_steps),
        )
        return scan_log_points(log_period, state, num_log_points)

    return Trainer(init=init, run=run, num_log_points=agent.total_steps // agent.log_interval)


def replay_trainer(
    agent: ReplayLoopConfig,
    env,
    env_params,
    init: Callable,
    env_step: Callable,
    gradient_step: Callable,
    greedy_policy: Callable,
) -> Trainer:
    """`off_policy_trainer` with the replay loop's shape: phases of `train_freq // num_envs` env
    iterations, `log_interval // train_freq` phases per log point, epsilon and the gradient-step count logged."""
    extra = lambda hparams, state: {
        "epsilon": replay_epsilon(agent, hparams, state["step"]),
        "gradient_steps": state["updates"],
    }
    return off_policy_trainer(
        agent,
        env,
        env_params,
        init,
        env_step,
        gradient_step,
        greedy_policy,
        extra,
        agent.train_freq // agent.num_envs,
        agent.log_interval // agent.train_freq,
    )


def actor_critic_trainer(
    agent: ReplayActorCriticConfig,
    env,
    env_params,
    init: Callable,
    env_step: Callable,
    gradient_step: Callable,
    greedy_policy: Callable,
    extra_metrics: Callable,
) -> Trainer:
    """`off_policy_trainer` with the actor-critic loop's shape: one env iteration per phase,
    `log_interval // num_envs` phases per log point; `extra_metrics(state)`."""
    return off_policy_trainer(
        agent,
        env,
        env_params,
        init,
        env_step,
        gradient_step,
        greedy_policy,
        lambda hparams, state: extra_metrics(state),
        1,
        agent.log_interval // agent.num_envs,
    )


# ---------------------------------------------------------------- PPO's loop (PPO, recurrent PPO)


def policy_head(agent: PPOLoopConfig, env, env_params) -> tuple[Callable, str]:
    """(head, distribution) for the env's actions: for Box actions a diagonal Gaussian head
    (initial log-std `agent.log_std_init`) or, with `agent.continuous_policy: tanh_gaussian`, a
    tanh-squashed one with a state-dependent scale; else a categorical one. The distribution is
    one of `losses.DISTRIBUTIONS`."""
    space = env.action_space(env_params)
    if not isinstance(space, Box):
        return heads.categorical_policy_head(int(space.n)), "categorical"
    action_dim = int(np.prod(space.shape))
    if agent.continuous_policy == "tanh_gaussian":
        return heads.tanh_gaussian_policy_head(action_dim), "tanh_gaussian"
    return heads.gaussian_policy_head(action_dim, agent.log_std_init), "gaussian"


def sample_action(policy, key, distribution: str):
    """A sample of the policy: mean + sigma N(0, I) (for the tanh Gaussian the pre-squash sample u,
    which is what is stored and scored), or a categorical index (int32)."""
    if distribution == "categorical":
        return jax.random.categorical(key, policy).astype(jnp.int32)
    mean, log_std = policy
    return mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)


def env_action(action, distribution: str):
    """What the env is sent for a sampled or greedy action: tanh(u) for the tanh Gaussian (in
    [-1, 1]^d), else the action itself (`make_env`'s RescaleAction clips a Gaussian's)."""
    return jnp.tanh(action) if distribution == "tanh_gaussian" else action


def greedy_action(policy, distribution: str):
    """The argmax of the logits, or the Gaussian's mean (the pre-squash mean for the tanh Gaussian:
    `env_action` squashes it)."""
    if distribution == "categorical":
        return jnp.argmax(policy, axis=-1).astype(jnp.int32)
    return policy[0]


def ppo_optimizer(agent: PPOLoopConfig, hparams):
    """`annealed_clipped_adam` with the swept lr and max_grad_norm, Adam's eps `agent.adam_eps`."""
    return annealed_clipped_adam(agent, hparams["lr"], hparams["max_grad_norm"], eps=agent.adam_eps)


def ppo_minibatch_loss(
    policy,
    values,
    actions,
    old_log_probs,
    old_values,
    advantages,
    targets,
    hparams,
    agent: PPOLoopConfig,
    distribution: str,
    backend: str,
):
    """(L, stats) = `losses.ppo_loss` of a minibatch from the current network's outputs on it (`policy`,
    `values`), advantages normalised first if `agent.normalize_advantages`. Any batch shape."""
    log_prob, entropy = losses.policy_log_prob_entropy(policy, actions, distribution, backend)
    if agent.normalize_advantages:
        advantages = losses.normalize(advantages)
    return losses.ppo_loss(
        log_prob,
        entropy,
        values,
        old_log_probs,
        old_values,
        advantages,
        targets,
        hparams["clip_eps"],
        hparams["vf_clip_eps"],
        hparams["ent_coef"],
        hparams["vf_coef"],
        agent.clip_value_loss,
    )


def flat_minibatch_epochs(
    agent: OnPolicyLoopConfig,
    optimizer,
    grads: Callable,
    params,
    opt_state,
    batch,
    key,
    refresh: Callable | None = None,
    flat_grads: Callable | None = None,
):
    """`minibatch_epochs` of optimiser steps along `grads(params, minibatch) -> (gradient, stats)`,
    the optimiser on one flat parameter vector (one fused update instead of one per array; `opt_state`
    is `optimizer.init(ravel_pytree(params)[0])`). The batch's leading axis is what minibatches split:
    transitions, or whole env sequences. `refresh(params, batch) -> batch` (optional): each epoch after
    the first learns from it, at that epoch's params. `flat_grads(flat_params, minibatch) -> (flat
    gradient, ||gradient||^2, stats)` (optional) replaces `grads`: a gradient computed on the flat
    vector itself, with its squared norm for the clip (`clip_by_global_norm`'s `grad_sq_norm`, passed
    to `optimizer.update` as an optax extra argument: the optimiser must start with that clip, as
    `clipped_adam` does; one that takes no extra arguments ignores it), so the step neither cuts the
    vector into arrays nor concatenates the gradient nor re-reads it for the norm. Returns (params,
    opt_state, stats [epochs, minibatches])."""
    flat_params, unravel = ravel_pytree(params)
    optimizer = optax.with_extra_args_support(optimizer)

    def minibatch_step(carry, minibatch):
        flat_params, opt_state = carry
        if flat_grads is None:
            g, stats = grads(unravel(flat_params), minibatch)
            updates, opt_state = optimizer.update(ravel_pytree(g)[0], opt_state, flat_params)
        else:
            g, sq_norm, stats = flat_grads(flat_params, minibatch)
            updates, opt_state = optimizer.update(g, opt_state, flat_params, grad_sq_norm=sq_norm)
        return (optax.apply_updates(flat_params, updates), opt_state), stats

    epoch_batch = (
        None if refresh is None else (lambda carry, batch: refresh(unravel(carry[0]), batch))
    )
    (flat_params, opt_state), stats = minibatch_epochs(
        minibatch_step,
        (flat_params, opt_state),
        batch,
        key,
        agent.num_epochs,
        agent.num_minibatches,
        agent.unroll,
        epoch_batch,
    )
    return unravel(flat_params), opt_state, stats


def on_policy_log_period(agent: OnPolicyLoopConfig, update: Callable, evaluate: Callable, state):
    """`agent.log_interval` calls of `update(state, totals) -> (state, totals, stats)`, then the log
    point's metrics: env steps, the mean return and length of the episodes that ended, the mean
    stats, and (eval_envs > 0) `evaluate(params, key) -> (mean return, mean length)` of greedy episodes."""

    def one_update(carry, _):
        state, totals, stats = update(*carry)
        return (state, totals), stats

    (state, totals), stats = jax.lax.scan(
        one_update, (state, no_episodes()), None, length=agent.log_interval
    )
    metrics = {"step": state["step"], **episode_metrics(totals), **jax.tree.map(jnp.mean, stats)}
    if agent.eval_envs:
        key, eval_key = jax.random.split(state["key"])
        state = {**state, "key": key}
        metrics["eval_return"], metrics["eval_length"] = evaluate(state["params"], eval_key)
    return state, metrics


def on_policy_trainer(
    agent: OnPolicyLoopConfig,
    init: Callable,
    update: Callable,
    evaluate: Callable,
    per_env=("obs", "env_state"),
) -> Trainer:
    """The Trainer of an on-policy agent: `init(key, hparams) -> state`; each log point is
    `on_policy_log_period` over `update(hparams, state, totals)` and `evaluate(params, key)`."""

    def run(state, hparams, num_log_points):
        return scan_log_points(
            partial(on_policy_log_period, agent, partial(update, hparams), evaluate),
            state,
            num_log_points,
        )

    return Trainer(
        init=init,
        run=run,
        num_log_points=agent.num_updates // agent.log_interval,
        per_env=tuple(per_env),
    )
