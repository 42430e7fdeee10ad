"""Evaluate a trained run: the agent's deterministic policy on fresh episodes, and a GIF of one.

    rl eval RUN_DIR [--episodes 100] [--checkpoint STEP] [--render episode.gif]

Every (setting, seed) plays `episodes` episodes of the raw env (no training wrappers) in one
compiled program (`evaluate`); an actor-learner run plays on its host envs (`evaluate_on_host`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

import envs
from envs.multi_agent import is_multi_agent
from rl.agents.trainer import as_recurrent
from rl.config import Config
from rl.config.parsing import ConfigError
from rl.config.registry import get_agent_module
from rl.core.precision import at_matmul_precision
from rl.run.run_dir import load_params, load_run_config
from rl.run.summary import setting_label, spread


def make_env(config: Config):
    """The env an agent is evaluated on: the raw env of the config (its observation masked if
    `env.observe` is set), without training wrappers."""
    return config.env.make()


def rollout(env, env_params, policy, params, key, max_steps: int):
    """One deterministic-policy episode: (return, length, states [max_steps + 1],
    done [max_steps + 1]).

    states[t] is the state after t steps, frozen once the episode has ended; done[t] says whether it
    had ended by then. reward_t counts only while the episode runs. A `RecurrentPolicy` starts from
    its initial carry and carries it from step to step. On a multi-agent env the policy also reads
    the env's action masks (`policy(params, obs, key, mask)`, a `RecurrentPolicy`'s step with the
    mask last), the reward is the mean over agents, and the episode ends when every agent has
    terminated or is truncated."""
    team = is_multi_agent(env)
    policy = as_recurrent(policy)
    reset_key, key = jax.random.split(key)
    obs, state = env.reset(reset_key, env_params)

    def step(carry, _):
        obs, state, memory, key, total, length, done = carry
        key, policy_key, step_key = jax.random.split(key, 3)
        masks = (env.action_mask(state, env_params),) if team else ()
        memory, action = policy.step(params, memory, obs, policy_key, *masks)
        next_obs, next_state, reward, terminated, _ = env.step_env(
            step_key, state, action, env_params
        )
        reward = jnp.asarray(reward, jnp.float32)
        ended = jnp.asarray(terminated, bool) | env.truncation(next_state, env_params)
        if team:  # the team's reward and episode end
            reward, ended = jnp.mean(reward), jnp.all(ended)
        total = total + jnp.where(done, 0.0, reward)
        length = length + jnp.where(done, 0, 1)
        keep = lambda old, new: jnp.where(done, old, new)
        state = jax.tree.map(keep, state, next_state)
        done = done | ended
        return (keep(obs, next_obs), state, memory, key, total, length, done), (state, done)

    totals = (jnp.float32(0.0), jnp.int32(0), jnp.bool_(False))
    init = (obs, state, policy.initial_carry(), key, *totals)
    (*_, total, length, _), (states, dones) = jax.lax.scan(step, init, None, length=max_steps)
    states = jax.tree.map(lambda first, rest: jnp.concatenate([first[None], rest]), state, states)
    dones = jnp.concatenate([jnp.zeros((1,), bool), dones])
    return total, length, states, dones


def evaluate(config: Config, params, episodes: int, seed: int = 0):
    """Returns and lengths, each [settings, seeds, episodes], of the deterministic policy, vmapped
    over settings, seeds and episodes in one compiled program: each episode runs the env's own
    `step_env` from `reset` until it terminates or is truncated (`env.truncation`:
    `max_steps_in_episode` unless the env says otherwise; no auto-reset)."""
    if config.arch.name == "sebulba":
        return evaluate_on_host(config, params, episodes, seed)
    env, env_params = make_env(config)
    policy = get_agent_module(config.agent.name).make_policy(config)
    max_steps = int(env_params.max_steps_in_episode)

    def one(params, key):
        total, length, _, _ = rollout(env, env_params, policy, params, key, max_steps)
        return total, length

    over_episodes = jax.vmap(one, in_axes=(None, 0))
    over_seeds = jax.vmap(over_episodes, in_axes=(0, None))
    over_settings = jax.jit(
        at_matmul_precision(jax.vmap(over_seeds, in_axes=(0, None)), config.run.matmul_precision)
    )
    keys = jax.random.split(jax.random.PRNGKey(seed), episodes)
    returns, lengths = over_settings(params, keys)
    return np.asarray(returns), np.asarray(lengths)


def evaluate_on_host(config: Config, params, episodes: int, seed: int = 0):
    """`evaluate` of an actor-learner run (arch sebulba: one setting, one seed): the first episode
    of each of `episodes` host envs (a gymnasium sync vector env or envpool's, seeded from `seed`;
    for envpool's Atari the game's score over all its lives, `rl.sebulba.host_envs.Scores`), acting
    with the agent's `make_policy`."""
    from rl.sebulba.host_envs import greedy_episodes, make_vector_env, obs_dtype

    env, env_params = make_env(config)
    dtype = obs_dtype(env.observation_space(env_params))
    policy = jax.jit(get_agent_module(config.agent.name).make_policy(config))
    one = jax.tree.map(lambda x: x[0, 0], params)
    seeds = [seed * episodes + i for i in range(episodes)]
    vector, obs = make_vector_env(config, seeds, "sync")
    try:
        act = lambda obs: policy(one, obs, None)
        returns, lengths = greedy_episodes(vector, obs, act, dtype)
    finally:
        vector.close()
    return returns[None, None], lengths[None, None]


def render_episode(config: Config, params_one, path, seed: int = 0, fps: int = 10) -> int:
    """Write a GIF of one episode of the policy with `params_one` (one seed's params); returns the
    number of frames. Every state of the episode (the reset state, then the state after each step,
    the terminal one included) goes through the env's host-side `env.render(state, params) ->
    uint8[H, W, 3]`, written with Pillow."""
    if config.arch.name == "sebulba":
        raise ConfigError(
            f"--render: not for arch sebulba runs ({config.env.id} steps outside JAX); evaluate "
            "without --render"
        )
    env, env_params = make_env(config)
    if not hasattr(env, "render"):
        raise ConfigError(f"--render: env {config.env.id} cannot render (it has no render method)")
    policy = get_agent_module(config.agent.name).make_policy(config)
    max_steps = int(env_params.max_steps_in_episode)
    _, length, states, _ = jax.jit(lambda p, k: rollout(env, env_params, policy, p, k, max_steps))(
        params_one, jax.random.PRNGKey(seed)
    )
    count = int(length) + 1  # the reset state and the state after every step
    states = jax.tree.map(lambda x: x[:count], states)
    states = jax.device_get(states)
    frames = np.stack(
        [
            np.asarray(env.render(jax.tree.map(lambda x: x[t], states), env_params))
            for t in range(count)
        ]
    )
    envs.save_gif(list(frames), path, fps=fps)
    return count


METRIC_DESCRIPTION = "undiscounted return of the deterministic (greedy) policy on fresh episodes"


def setting_summary(setting: dict, returns: np.ndarray, lengths: np.ndarray) -> dict:
    """One setting's evaluation from its returns and lengths [seeds, episodes]: mean, median, std,
    min and max over every episode, and `per_seed` (each seed's mean return)."""
    per_seed = spread(returns.mean(axis=-1))
    over_episodes = spread(returns)
    del over_episodes["per_seed"]
    return {
        "hyperparams": setting,
        "label": setting_label(setting),
        "seeds": int(returns.shape[0]),
        "episodes": int(returns.shape[1]),
        **over_episodes,
        "per_seed": per_seed["per_seed"],
        "seed_mean_std": per_seed["std"],
        "length_mean": float(lengths.mean()),
    }


def learner_state_shapes(config: Config):
    """An actor-learner run's training state (`rl.sebulba.programs.LearnerState`: params,
    optimiser state, key, counters) as ShapeDtypeStructs with its leading [settings, seeds] =
    [1, 1] axes, from its learner's init on this process's first device: what its final params
    and checkpoints are read into, without making its envs (envpool's cannot reset in JAX) and
    whatever devices it trained on."""
    from rl.config import hyperparams
    from rl.sebulba.programs import programs

    init = programs(config, jax.devices()[:1]).init
    shapes = jax.eval_shape(init, jax.random.PRNGKey(config.run.seed), hyperparams(config.agent))
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct((1, 1, *x.shape), x.dtype), shapes)


def evaluate_run(
    run_dir,
    episodes: int = 100,
    checkpoint: int | None = None,
    render=None,
    seed: int = 0,
    fps: int = 10,
) -> dict:
    """Evaluate a run directory; returns a result dict for printing. The config comes from the
    run directory, the params from `final_params.msgpack`, or the checkpoint at env step
    `checkpoint`, or (a run stopped before the end) the newest checkpoint, as the files hold them
    (fused-kernel params evaluate where the kernels do not run: `rl.run.run_dir.load_params`).
    The policy is the agent's `make_policy(config)` (a recurrent agent's carry starts fresh each
    episode), on the raw env's observations and action space; its return is the undiscounted
    sum of rewards (a team's: the sum over steps of the mean over agents). `render`: a GIF of
    setting 0, seed 0's first episode (`render_episode`; not for actor-learner runs)."""
    config, grid = load_run_config(run_dir)
    shapes = learner_state_shapes(config) if config.arch.name == "sebulba" else None
    params, source = load_params(run_dir, config, grid, checkpoint, shapes)
    returns, lengths = evaluate(config, params, episodes, seed)
    settings = [setting_summary(setting, returns[s], lengths[s]) for s, setting in enumerate(grid)]
    result = {
        "run_dir": str(run_dir),
        "params": source,
        "agent": config.agent.name,
        "env": config.env.id,
        "metric": "return",
        "metric_description": METRIC_DESCRIPTION,
        "settings": settings,
    }
    if render is not None:
        one = jax.tree.map(lambda x: x[0, 0], params)
        result["render"] = {
            "path": str(render),
            "frames": render_episode(config, one, render, seed, fps),
        }
    return result


def _fmt(value) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.4g}"


def evaluation_lines(result: dict) -> list[str]:
    """What `rl eval` prints: where the params came from, the metric, then one line per setting."""
    lines = [
        f"{result['agent']} on {result['env']}, params from {result['params']}",
        f"{result['metric']} ({result['metric_description']}):",
    ]
    for row in result["settings"]:
        where = f"{row['label']}: " if row["label"] else ""
        episodes, seeds = row["episodes"], row["seeds"]
        lines.append(
            f"  {where}{_fmt(row['mean'])} +- {_fmt(row['std'])} "
            f"(median {_fmt(row['median'])}, min {_fmt(row['min'])}, max {_fmt(row['max'])}; "
            f"std of the seed means {_fmt(row['seed_mean_std'])}) "
            f"over {episodes} episode{'s' if episodes != 1 else ''} x "
            f"{seeds} seed{'s' if seeds != 1 else ''}, "
            f"mean length {_fmt(row['length_mean'])}"
        )
    if "render" in result:
        lines.append(f"wrote {result['render']['path']} ({result['render']['frames']} frames)")
    return lines


def print_evaluation(result: dict) -> None:
    print("\n".join(evaluation_lines(result)))
