"""The plain pieces of the value-based replay agents' loop (DQN, Rainbow:
`rl.config.loops.ReplayLoopConfig`), whose loops live in their agent files: the loop's sizes
(`Loop`), the envs' reset and step, a transition, the epsilon schedule, the state at the start, one
Adam step with the periodic target update, the keys and scan of a log period's phases, the log
point's metrics and the greedy evaluation return.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from rl.config.loops import ReplayLoopConfig
from rl.config.unrolling import unroll_of
from rl.core import environment, episodes, exploration, log_points, optimizers
from rl.core.rollout import greedy_episodes
from rl.core.state import Envs, ReplayState


class Loop(NamedTuple):
    """The sizes of the replay loop and its loop trips. A phase: env_iterations = train_freq //
    num_envs steps of all envs, each storing its transitions, then, once learning_starts env
    steps are stored, gradient_steps gradient steps (their statistics NaN before). A log period:
    num_phases = log_interval // train_freq phases, then the log point's metrics and
    eval_episodes greedy episodes. A run: total_steps // log_interval log periods
    (`rl.core.log_points.scan_log_points`). Loop trips (`rl.config.loops.UNROLL_DOC`): a phase's
    env and gradient loops unroll min(unroll, n) iterations per trip; the loop over phases
    max(1, unroll // max(env_iterations, gradient_steps)), at most num_phases."""

    env_iterations: int  # steps of all envs per phase
    gradient_steps: int  # gradient steps per phase (once learning)
    num_phases: int  # phases per log period
    act_unroll: int
    learn_unroll: int
    phase_unroll: int


def loop_of(agent: ReplayLoopConfig) -> Loop:
    """The `Loop` of `agent`'s settings."""
    env_iterations = agent.train_freq // agent.num_envs
    num_phases = agent.log_interval // agent.train_freq
    phase_unroll = max(1, unroll_of(agent) // max(env_iterations, agent.gradient_steps))
    return Loop(
        env_iterations,
        agent.gradient_steps,
        num_phases,
        min(unroll_of(agent), env_iterations),
        min(unroll_of(agent), agent.gradient_steps),
        min(phase_unroll, num_phases),
    )


def reset_envs(env, env_params, key, num_envs: int, memory=()) -> Envs:
    """`num_envs` fresh envs (keys split from `key`): their first observations and states, and the
    per-env `memory` given."""
    reset, _ = environment.batched(env)
    obs, state = reset(jax.random.split(key, num_envs), env_params)
    return Envs(obs, state, memory)


def step_envs(env, env_params, envs: Envs, action, key):
    """All envs take `action` [num_envs] (one key each, split from `key`): (envs after the step,
    reward, terminated, truncated, info); `info["final_obs"]` is the observation reached before
    any auto-reset. The envs' memory is carried unchanged."""
    return step_envs_with_keys(
        env, env_params, envs, action, jax.random.split(key, action.shape[0])
    )


def step_envs_with_keys(env, env_params, envs: Envs, action, keys):
    """`step_envs` with each env's key given (`keys` [num_envs]: those `step_envs` splits)."""
    _, step = environment.batched(env)
    obs, state, reward, terminated, truncated, info = step(keys, envs.state, action, env_params)
    return envs._replace(obs=obs, state=state), reward, terminated, truncated, info


def transition(obs, action, reward, next_obs, terminated) -> dict:
    """The replay item (s, a, r, s', terminated): a batch of them, or one (the buffer's example)."""
    return {
        "obs": obs,
        "action": action,
        "reward": reward,
        "next_obs": next_obs,
        "terminated": terminated,
    }


def epsilon(agent: ReplayLoopConfig, hparams, step):
    """Epsilon after `step` env steps: linear from epsilon_start to epsilon_end over
    epsilon_decay_steps, then epsilon_end."""
    return exploration.linear_schedule(
        hparams["epsilon_start"], hparams["epsilon_end"], agent.epsilon_decay_steps, step
    )


def optimizer(hparams) -> optax.GradientTransformation:
    """Adam (step size lr) on gradients clipped to global norm max_grad_norm."""
    return optimizers.clipped_adam(hparams["lr"], hparams["max_grad_norm"])


def initial_state(key, params, buffer, envs: Envs, hparams) -> ReplayState:
    """The state at the start: the target a copy of the online params, a fresh optimiser state, no
    env step nor gradient step taken."""
    opt_state = optimizer(hparams).init(params)
    return ReplayState(params, params, opt_state, buffer, envs, key, jnp.int32(0), jnp.int32(0))


def learn(
    state: ReplayState,
    grads,
    hparams,
    target_update_interval: int,
    grad_sq_norm=None,
    backend: str | None = None,
    active=True,
) -> ReplayState:
    """One `optimizer` step of the online params along `grads` (`grad_sq_norm`: ||grads||^2 where
    a fused kernel computed it already, else None); then, every `target_update_interval` gradient
    steps, target <- tau online + (1 - tau) target. With a kernel `backend` (the params being one
    flat vector, a fused Q-network's) both are one `optimizers.flat_clipped_adam_polyak`, which
    skips the step where the traced bool `active` is false (`collection.scan_gated`)."""
    if backend is None and active is not True:
        raise ValueError("replay.learn: `active` gates the kernel step; pass a kernel backend")
    done = state.updates + jnp.asarray(active, jnp.int32)
    sync = (done % target_update_interval == 0) & active
    if backend is not None:
        params, opt_state, target = optimizers.flat_clipped_adam_polyak(
            state.params, state.opt_state, grads, grad_sq_norm, state.target_params,
            hparams["lr"], hparams["max_grad_norm"], hparams["tau"], sync, backend, active,
        )  # fmt: skip
        return state._replace(
            params=params, target_params=target, opt_state=opt_state, updates=done
        )
    extra = {} if grad_sq_norm is None else {"grad_sq_norm": grad_sq_norm}
    updates, opt_state = optax.with_extra_args_support(optimizer(hparams)).update(
        grads, state.opt_state, state.params, **extra
    )
    params = optax.apply_updates(state.params, updates)
    target = optimizers.periodic_polyak(state.target_params, params, hparams["tau"], sync)
    return state._replace(params=params, target_params=target, opt_state=opt_state, updates=done)


def phase_keys(key, loop: Loop):
    """A phase's keys, split once: (one per env iteration, one per gradient step)."""
    keys = jax.random.split(key, loop.env_iterations + loop.gradient_steps)
    return keys[: loop.env_iterations], keys[loop.env_iterations :]


def period_keys(
    key, loop: Loop, num_envs: int, acting_keys: int = 1, learn_keys: int | None = None
) -> dict:
    """A log period's keys, split once for all its phases: the keys that `scan_phases`,
    `phase_keys`, an act step's split of its key into `acting_keys` + 1 (the acting keys, then the
    env step's), `step_envs` and, with `learn_keys`, a gradient step's split of its key into
    `learn_keys` would split one at a time, the same keys:

        {"act": [phases, env_iterations, acting_keys], "env": [phases, env_iterations, num_envs],
         "learn": [phases, gradient_steps] (or [..., learn_keys] with learn_keys)}

    (each a key). On a GPU the phases then split no keys of their own (a few small kernels an env
    step and a gradient step fewer)."""
    split = jax.random.split
    act, learn = jax.vmap(lambda k: phase_keys(k, loop))(split(key, loop.num_phases))
    act_and_env = jax.vmap(jax.vmap(lambda k: split(k, acting_keys + 1)))(act)
    env = jax.vmap(jax.vmap(lambda k: split(k, num_envs)))(act_and_env[:, :, acting_keys])
    if learn_keys is not None:
        learn = jax.vmap(jax.vmap(lambda k: split(k, learn_keys)))(learn)
    return {"act": act_and_env[:, :, :acting_keys], "env": env, "learn": learn}


def scan_phases_with_keys(phase: Callable, state: ReplayState, keys, loop: Loop):
    """`scan_phases` with each phase's keys given (`keys`: a pytree with a leading axis of
    `loop.num_phases`, e.g. `period_keys`'s)."""
    carry = (state, episodes.no_episodes())
    (state, totals), stats = jax.lax.scan(phase, carry, keys, unroll=loop.phase_unroll)
    return state, totals, stats


def scan_phases(phase: Callable, state: ReplayState, key, loop: Loop):
    """`lax.scan` of `phase((state, totals), key) -> ((state, totals), stats)` over a log period's
    `loop.num_phases` phases (keys split from `key`), from no finished episodes. Returns (state,
    `EpisodeTotals` of the episodes that ended, stats [phases, ...])."""
    return scan_phases_with_keys(phase, state, jax.random.split(key, loop.num_phases), loop)


def log_metrics(agent: ReplayLoopConfig, hparams, state: ReplayState, totals, stats) -> dict:
    """A log point's metrics: env steps, the episodes that ended
    (`rl.core.episodes.episode_metrics`), the mean of each gradient-step statistic over the steps
    taken (`nanmean`: NaN before learning), then `log_point_values`."""
    metrics = log_points.log_point_metrics(state.step, totals, stats, jnp.nanmean)
    return {**metrics, **log_point_values(agent, hparams, state)}


def log_point_values(agent: ReplayLoopConfig, hparams, state: ReplayState) -> dict:
    """What a log point reads off the state at its end, not averaged over its period: epsilon
    after `state.step` env steps and the gradient steps taken so far (`state.updates`)."""
    return {"epsilon": epsilon(agent, hparams, state.step), "gradient_steps": state.updates}


def eval_return(env, env_params, policy: Callable, key, num_episodes: int):
    """The mean return of the first episode of each of `num_episodes` fresh envs under the greedy
    `policy(obs[E, ...]) -> actions[E]` (`rl.core.rollout.greedy_episodes`)."""
    returns, _ = greedy_episodes(env, env_params, policy, key, num_episodes)
    return returns.mean()
