"""Limits checked from a config alone, before anything runs: sizes that would otherwise sit in a
loop for minutes or run out of memory after the run directory is made (`check_log_points`,
`check_memory`, `check_device_memory`). The memory estimate is arithmetic on the config and the
env's spaces, a lower bound of what the compiled program holds (it leaves out XLA's temporaries),
meant to stop the absurd (`buffer_size=1e12`, `hidden=[1e8]`), not to plan a run.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from rl.config.parsing import ConfigError

MAX_LOG_POINTS = 1_000_000
# params, two Adam moments and a target network (or a gradient) per parameter
PARAM_COPIES = 4


def check_log_points(agent) -> None:
    """ConfigError naming agent.log_interval where the run would have more than MAX_LOG_POINTS log
    points: total_steps // log_interval, or num_updates // log_interval for the agents that log
    every `log_interval` updates. Each log point is a row per seed in the metrics, a step of the
    host loop and an entry of every checkpoint's history."""
    total, interval = getattr(agent, "total_steps", None), getattr(agent, "log_interval", None)
    if not isinstance(total, int) or not isinstance(interval, int) or interval < 1:
        return
    updates = getattr(agent, "num_updates", None)  # agents that log every `log_interval` updates
    counted = updates if isinstance(updates, int) else total
    points = counted // interval
    if points > MAX_LOG_POINTS:
        per = f"{updates:,} updates of" if isinstance(updates, int) else ""
        raise ConfigError(
            f"agent.log_interval: {interval:,} gives {points:,} log points for {per} "
            f"agent.total_steps {total:,}, more than the {MAX_LOG_POINTS:,} a run can log; raise "
            "agent.log_interval"
        )


def host_memory() -> int | None:
    """This machine's physical memory in bytes, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _space_size(space) -> tuple[int, int]:
    """(elements, bytes per element) of a space's one value; Discrete spaces count one element and
    `n` for the width of a network's output."""
    shape = tuple(getattr(space, "shape", ()) or ())
    dtype = np.dtype(getattr(space, "dtype", np.float32))
    return int(np.prod(shape, dtype=np.float64)), dtype.itemsize


def _widths(agent) -> list[tuple[str, object]]:
    """(dotted key, value) of every field of the agent config (and its nested sections) whose name
    holds "hidden": tuples of layer widths or single widths."""
    found = []

    def walk(node, prefix):
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            key = f"{prefix}.{f.name}"
            if dataclasses.is_dataclass(value):
                walk(value, key)
            elif "hidden" in f.name and value:
                found.append((key, value))

    walk(agent, "agent")
    return found


def state_estimate(config, env, env_params) -> dict[str, float]:
    """{key: bytes per seed and setting} of the parts of the training state the config sizes."""
    agent = config.agent
    obs_elements, obs_item = _space_size(env.observation_space(env_params))
    obs_bytes = max(obs_elements, 1) * obs_item
    action_space = env.action_space(env_params)
    outputs = int(getattr(action_space, "n", 0) or max(_space_size(action_space)[0], 1))
    num_envs = int(getattr(agent, "num_envs", 1) or 1)
    parts = {"agent.num_envs": float(num_envs) * (obs_bytes + 16)}
    if isinstance(getattr(agent, "buffer_size", None), int):
        # observation, next observation, action, reward, flags per transition
        parts["agent.buffer_size"] = float(agent.buffer_size) * (2 * obs_bytes + 16)
    if isinstance(getattr(agent, "num_steps", None), int):
        parts["agent.num_steps"] = float(agent.num_steps) * num_envs * (obs_bytes + 24)
    for key, value in _widths(agent):
        layers = list(value) if isinstance(value, tuple) else [value, value]
        dims = [max(obs_elements, 1)] + [int(w) for w in layers] + [outputs]
        weights = sum(float(a) * b for a, b in zip(dims, dims[1:]))
        parts[key] = PARAM_COPIES * 4 * weights
    return parts


def check_memory(config, env, env_params, memory: int | None = None, processes: int = 1) -> None:
    """ConfigError naming the key that dominates, with the estimate, where `state_estimate` for the
    run's seeds (those of one process of `processes`) exceeds `memory` (default: this machine's):
    seeds x (replay buffer + rollout + envs' observations + network parameters with their
    optimiser copies), which every checkpoint copies to the host."""
    memory = host_memory() if memory is None else memory
    if not memory:
        return
    try:
        parts = state_estimate(config, env, env_params)
    except Exception:  # an env whose spaces do not say their size: nothing to estimate from
        return
    seeds = -(-config.run.seeds // max(processes, 1))
    total = seeds * sum(parts.values())
    if total <= memory:
        return
    per_seed = sum(parts.values())
    # one seed fits: the seeds are what is too many; else the part that dominates one seed
    key = "run.seeds" if per_seed <= memory else max(parts, key=parts.get)
    share = per_seed * seeds if key == "run.seeds" else parts[key]
    raise ConfigError(
        f"{key}: the training state needs about {_bytes(total)} ({seeds} seed"
        f"{'s' if seeds != 1 else ''} x {_bytes(sum(parts.values()))}, {_bytes(share)} of it "
        f"from {key}), more than this machine's memory ({_bytes(memory)}); lower {key}"
        + ("" if key == "run.seeds" else " or run.seeds")
    )


def check_device_memory(config, settings: int, devices, shard: str = "seeds") -> None:
    """ConfigError naming the key that dominates where `state_estimate` for the seeds x `settings`
    one device of `devices` holds (the seeds split over them with `shard="seeds"`, all of them
    with `shard="envs"`) exceeds the memory that device reports (`memory_stats()["bytes_limit"]`;
    nothing is checked where a device reports none, such as the CPU)."""
    try:
        stats = devices[0].memory_stats() or {}
    except Exception:  # a backend without memory statistics
        return
    limit = stats.get("bytes_limit")
    if not limit:
        return
    try:
        parts = state_estimate(config, *config.env.make())
    except Exception:
        return
    seeds = -(-config.run.seeds // len(devices)) if shard == "seeds" else config.run.seeds
    instances = seeds * max(settings, 1)
    total = instances * sum(parts.values())
    if total <= limit:
        return
    key = max(parts, key=parts.get)
    raise ConfigError(
        f"{key}: the training state needs about {_bytes(total)} on each device ({instances} "
        f"seed{'s' if instances != 1 else ''} and settings x {_bytes(sum(parts.values()))}), more "
        f"than the {_bytes(limit)} {devices[0].device_kind} makes available; lower {key} or "
        "run.seeds, or spread the seeds over more devices (--devices)"
    )


def processes() -> int:
    """The processes of a multi-process run this one belongs to (after
    rl.run.distributed.initialize), read without starting JAX's backend (a config is built before
    the first JAX computation); 1 where JAX does not say."""
    try:
        from jax._src import distributed

        return int(distributed.global_state.num_processes or 1)
    except Exception:  # another JAX version keeps it elsewhere: count one process
        return 1


def _bytes(count: float) -> str:
    """`count` bytes in binary units, e.g. "1.5 GiB"."""
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if count < 1024 or unit == "EiB":
            break
        count /= 1024
    return f"{int(count)} B" if unit == "B" else f"{count:,.1f} {unit}"
