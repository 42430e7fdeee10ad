"""Spreading the seed axis of a run over devices (and hosts) with `jax.sharding`: with `--devices N`
(or `all`) every array [settings, seeds, ...] is placed with `NamedSharding(mesh, P(None,
"seeds"))` over a one-axis mesh "seeds" (`seed_mesh`, `seed_sharding`), so each device holds
`seeds / N` seeds and XLA splits the unchanged program with no collective in the training step;
`--shard envs` splits the env axis instead (`rl.run.programs.env_sharding`). Several hosts:

    rl train CONFIG --devices all --coordinator HOST0:PORT --num-processes P --process-id I
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rl.config.parsing import ConfigError

SEED_AXIS = "seeds"


def parse_devices(spec) -> int | None:
    """`"all"` -> None (every device), a positive integer (or its string) -> that count."""
    if spec is None or spec == "all":
        return None
    try:
        count = int(spec)
    except (TypeError, ValueError):
        raise ConfigError(
            f"--devices: expected a positive integer or 'all', got {spec!r}"
        ) from None
    if count < 1:
        raise ConfigError(f"--devices: expected a positive integer or 'all', got {spec!r}")
    return count


def select_devices(spec, num_seeds: int | None) -> list:
    """The devices the seed axis is spread over (all processes' devices for multi-host runs).

    ConfigError if more devices are asked for than exist, or if the seeds do not split evenly.
    """
    available = jax.devices()
    count = parse_devices(spec)
    if count is None:
        count = len(available)
    if count > len(available):
        raise ConfigError(
            f"--devices {count}: only {len(available)} {available[0].platform} device(s) "
            "are visible"
        )
    if num_seeds is not None and num_seeds % count:
        raise ConfigError(
            f"run.seeds ({num_seeds}) must be a multiple of the number of devices ({count}) "
            "to shard the seed axis"
        )
    return available[:count]


def seed_mesh(devices, axis: str = SEED_AXIS) -> Mesh:
    """A one-axis mesh over `devices`, named "seeds" (or `axis`)."""
    return Mesh(np.asarray(devices), (axis,))


def seed_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding of an array with leading axes [settings, seeds, ...]: seeds split over the mesh."""
    return NamedSharding(mesh, PartitionSpec(None, mesh.axis_names[0]))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def put_seed_sharded(array, mesh: Mesh):
    """A host array [settings, seeds, ...] (the same on every process) as a global seed-sharded
    array."""
    array = np.asarray(array)
    sharding = seed_sharding(mesh)
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def put_replicated(array, mesh: Mesh):
    array = np.asarray(array)
    return jax.make_array_from_callback(array.shape, replicated(mesh), lambda index: array[index])


def to_host(tree):
    """Every leaf as a full NumPy array on this process (gathered across processes when needed)."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    return jax.tree.map(
        lambda x: (
            np.asarray(multihost_utils.process_allgather(x, tiled=True))
            if isinstance(x, jax.Array)
            else x
        ),
        tree,
    )


def is_main_process() -> bool:
    return jax.process_index() == 0


def bind_address(coordinator: str) -> str:
    """Where process 0's coordinator service listens for `--coordinator HOST:PORT`: HOST:PORT
    itself, `localhost` as 127.0.0.1 (JAX's own default, `[::]:PORT`, is every interface of the
    machine, and the service has no authentication). ConfigError unless it reads HOST:PORT."""
    host, colon, port = coordinator.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--coordinator: expected HOST:PORT or 'auto', got {coordinator!r}")
    if host.lower() == "localhost":
        host = "127.0.0.1"
    return f"{host}:{port}"


def initialize(
    coordinator: str | None,
    num_processes: int | None,
    process_id: int | None,
    bind: str | None = None,
) -> None:
    """`jax.distributed.initialize` for a multi-process run (before any other JAX call).

    `coordinator="auto"` lets JAX detect the cluster (SLURM, TPU pods, MPI); otherwise all three
    arguments are required. CPU processes use gloo for their collectives. Process 0's coordinator
    listens on `bind` (`--coordinator-bind HOST:PORT`), by default on the coordinator's own address
    (`bind_address`), not on every interface. The mesh then spans every device of every process;
    process 0 writes metrics, logs and final params, and every process writes its shards of each
    checkpoint into the same run directory, which must be on a shared filesystem.
    """
    if coordinator is None:
        if num_processes is not None or process_id is not None or bind is not None:
            raise ConfigError(
                "--num-processes, --process-id and --coordinator-bind need --coordinator HOST:PORT"
            )
        return
    if bind is not None:
        bind_address(bind)  # checked like the coordinator's address
    if coordinator != "auto":
        bind_address(coordinator)
    if coordinator != "auto" and (num_processes is None or process_id is None):
        raise ConfigError("--coordinator HOST:PORT needs --num-processes and --process-id")
    if num_processes is not None and num_processes < 1:
        raise ConfigError(f"--num-processes: expected a positive integer, got {num_processes}")
    if process_id is not None and num_processes is not None and not 0 <= process_id < num_processes:
        raise ConfigError(f"--process-id: expected 0 <= id < {num_processes}, got {process_id}")
    try:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except Exception:  # older jaxlib without gloo: single-host CPU still works
        pass
    if coordinator == "auto":
        jax.distributed.initialize(coordinator_bind_address=bind)
    else:
        jax.distributed.initialize(
            coordinator,
            num_processes=num_processes,
            process_id=process_id,
            coordinator_bind_address=bind or bind_address(coordinator),
        )
