"""The actor-learner architecture's (rl.sebulba) devices and compiled programs: the
learner's state, which local devices act and learn (`check_devices`), the learner's mesh over every
process (`learner_mesh_devices`), a process's copy of replicated params (`local_copy`), and the
jitted `init`, `policy` and `learn` of a learning setup, made once per process (`programs`).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rl.config.arch import REPLAY_AGENTS, autoreset_mode
from rl.config.parsing import ConfigError
from rl.core import environment
from rl.core.precision import at_matmul_precision
from rl.sebulba.pieces import Pieces, make_pieces

__all__ = [
    "LearnerState",
    "Programs",
    "check_devices",
    "learner_mesh_devices",
    "local_copy",
    "programs",
]


class LearnerState(NamedTuple):
    """The learner's training state (`rl.core.state`'s names): params, optimiser state, a replay
    agent's replay state (its buffer, target networks, critics and counters,
    `rl.sebulba.pieces.replay_state`; None for PPO and PQN), the PRNG key of the next update, env
    steps and updates so far. The envs live in the actor threads."""

    params: Any
    opt_state: Any
    replay: Any
    key: jax.Array
    step: jax.Array
    updates: jax.Array


def check_devices(config) -> tuple[list, list]:
    """(actor devices, learner devices) of this process: `config.arch`'s indices into
    jax.local_devices() (every device on one host). ConfigError naming the key for an index that
    is not a device, and, with several processes (jax.distributed), for agent.num_envs that does
    not split over the processes' actor threads and learner devices."""
    devices, processes = jax.local_devices(), jax.process_count()
    for key in ("actor_devices", "learner_devices"):
        missing = [i for i in getattr(config.arch, key) if i >= len(devices)]
        if missing:
            raise ConfigError(
                f"arch.{key}: there is no device {missing[0]}; jax.local_devices() has "
                f"{len(devices)}: " + ", ".join(map(str, devices))
            )
    if processes > 1 and config.agent.name in REPLAY_AGENTS:
        raise ConfigError(
            f"{config.agent.name} learns in one process, which holds its replay buffer; this run "
            f"has {processes} (jax.distributed): run it without --coordinator"
        )
    if processes > 1:
        arch, envs = config.arch, config.agent.num_envs
        splits = (
            ("actor_threads", arch.actor_threads, "actor threads"),
            ("learner_devices", len(arch.learner_devices), "learner devices"),
            ("env_groups", arch.actor_threads * arch.env_groups, "env groups"),
        )
        for key, parts, what in splits:
            if envs % (processes * parts):
                raise ConfigError(
                    f"arch.{key}: agent.num_envs ({envs}) must split evenly over {processes} "
                    f"processes x {parts} {what} (agent.num_envs is the run's total over all "
                    "processes)"
                )
    return [devices[i] for i in config.arch.actor_devices], [
        devices[i] for i in config.arch.learner_devices
    ]


def learner_mesh_devices(config) -> list:
    """The learner's devices over every process (jax.distributed), process by process: each
    process's `arch.learner_devices`. The learner's batch is split on its env axis in this order,
    so process p's envs are the p-th block of the env axis."""
    return [
        jax.local_devices(process_index=p)[i]
        for p in range(jax.process_count())
        for i in config.arch.learner_devices
    ]


def local_copy(tree):
    """Each leaf of a replicated (possibly multi-process) tree as its copy on this process's first
    learner device: what actors and evaluation read, without a cross-process transfer."""
    return jax.tree.map(lambda x: x.addressable_data(0) if isinstance(x, jax.Array) else x, tree)


class Programs(NamedTuple):
    """A learning setup's jitted programs (`programs`): the agent's pieces (rl.sebulba.pieces),
    `policy(hparams, params, obs, key, step)` (its `act`), `init(key, hparams) -> LearnerState`,
    `learn(hparams, params, opt_state, replay, traj, key) -> (params, opt_state, replay, mean loss
    stats)` (a replay agent's optimiser and replay state, which holds its buffer, donated: the
    ones passed in are gone after),
    compiled once (`compiled`), and the shardings of the learner devices' mesh: params replicated,
    rollouts split on the env axis."""

    pieces: Pieces
    policy: Callable
    init: Callable
    learn: Callable
    compiled: dict
    replicated: NamedSharding
    split: NamedSharding


_PROGRAMS: dict = {}  # the programs of each learning setup: seeds of one config compile once


def programs(config, learner_devices) -> Programs:
    """The jitted programs of `config`'s learning setup (its agent, env, kernels, precision,
    learner devices and reset mode), made once per process and shared by every `Learner` of that
    setup."""
    env = repr(sorted(config.to_dict()["env"].items()))
    ids = tuple(device.id for device in learner_devices)
    # the kernel backend as resolved: "auto" or FUSEDRL_KERNEL_BACKEND may name another one later
    backend = environment.kernel_backend(config)
    key = (config.agent, env, config.kernels, backend, config.run.matmul_precision, ids)
    key += (autoreset_mode(config),)  # the rollout's columns and the gradient path depend on it
    key += (config.arch.rollout_steps,)  # a replay agent's gradient steps an update
    if key in _PROGRAMS:
        return _PROGRAMS[key]
    pieces, precision = make_pieces(config), config.run.matmul_precision

    def init(key, hparams):
        key, net_key = jax.random.split(key)
        obs = np.zeros(pieces.obs_space.shape, pieces.obs_dtype)
        params, opt_state, replay = pieces.init(net_key, hparams, obs)
        return LearnerState(params, opt_state, replay, key, np.int32(0), np.int32(0))

    mesh = Mesh(np.array(learner_devices), ("envs",))
    replicated = NamedSharding(mesh, PartitionSpec())
    jitted = lambda fn, **kw: jax.jit(at_matmul_precision(fn, precision), **kw)
    # a replay agent's replay state holds its buffer: updated in place, not copied each update
    donated = (2, 3) if config.agent.name in REPLAY_AGENTS else ()
    _PROGRAMS[key] = Programs(
        pieces,
        jitted(pieces.act),
        jitted(init, out_shardings=replicated),
        jitted(pieces.learn, out_shardings=replicated, donate_argnums=donated),
        {},
        replicated,
        NamedSharding(mesh, PartitionSpec(None, "envs")),
    )
    return _PROGRAMS[key]
