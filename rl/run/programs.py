"""A run's compiled programs: every seed of every sweep setting of one config, vmapped into one
program (leading axes [settings, seeds, ...]; seeds keyed `PRNGKey(run.seed + i)`), traced at the
run's matmul precision and placed on a device mesh. `build_program` trains a whole run;
`make_programs` splits it into `init` and chunks of log points (`rl train` calls the chunk of one
log point once per log point), with shardings over the seeds or the envs (rl.run.distributed).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from rl.agents.trainer import vmap_sequentially_on_cpu
from rl.config import Config, hyperparams
from rl.config.parsing import ConfigError
from rl.config.registry import get_agent_module
from rl.core.precision import at_matmul_precision
from rl.core.state import is_envs
from rl.run.distributed import put_replicated, replicated, seed_mesh, seed_sharding, select_devices


def seed_keys(config: Config) -> jax.Array:
    """PRNGKey(seed + i) for each of the run's seeds: seed i trains exactly as it would alone.
    One vmapped call on the seeds as uint32 (rl.config.RunConfig keeps them below 2**32), the
    same keys as a call per seed, in time that does not grow with the seeds."""
    seeds = config.run.seed + np.arange(config.run.seeds, dtype=np.uint64)
    return jax.vmap(jax.random.PRNGKey)(jnp.asarray(seeds.astype(np.uint32)))


def stacked_hyperparams(config: Config, grid: list[dict]) -> dict:
    """The sweepable hyperparameters for each setting of the grid, stacked:
    {name: float32[settings]}."""
    base = hyperparams(config.agent)
    return {
        name: jnp.asarray([setting.get(name, float(value)) for setting in grid], jnp.float32)
        for name, value in base.items()
    }


def vmap_over_settings(fn, in_axes):
    """`jax.vmap(fn, in_axes)` over the settings axis (axis 0 of the arguments whose in_axes is 0).
    With a single setting it calls `fn` on that setting alone and gives every output its settings
    axis back: the same values, one batch axis fewer in every op (XLA then lays out the update's
    batched matmuls without transposes)."""
    batched = jax.vmap(fn, in_axes=in_axes)

    def run(*args):
        sizes = {
            x.shape[0]
            for arg, axis in zip(args, in_axes)
            if axis is not None
            for x in jax.tree.leaves(arg)
        }
        if sizes != {1}:
            return batched(*args)
        alone = [
            arg if axis is None else jax.tree.map(lambda x: x[0], arg)
            for arg, axis in zip(args, in_axes)
        ]
        return jax.tree.map(lambda x: jnp.expand_dims(x, 0), fn(*alone))

    return run


def build_program(config: Config, grid: list[dict] | None = None):
    """(jitted program, keys, hparams): program(keys, hparams) trains settings x seeds at once."""
    grid = grid or [{}]
    train = get_agent_module(config.agent.name).make_train(config)
    over_seeds = jax.vmap(train, in_axes=(0, None))
    program = jax.jit(
        at_matmul_precision(vmap_over_settings(over_seeds, (None, 0)), config.run.matmul_precision)
    )
    return program, seed_keys(config), stacked_hyperparams(config, grid)


def make_programs(config: Config, grid: list[dict], mesh, shard: str = "seeds"):
    """(trainer, init, chunk, keys, hparams) for the settings x seeds of a run, placed on `mesh`.

    `init(keys, hparams) -> state` and `chunk(num_log_points, donate=False)(state, hparams) ->
    (state, metrics)` are jitted with explicit output shardings (`donate=True`: the input state's
    buffers are reused for the output's, and the input state is gone after the call); every
    output has leading axes [settings, seeds].
    `shard="seeds"`: the seed axis is split over the mesh. `shard="envs"` (one large agent): the
    state under the agent's `rl.core.state.Envs` (observations, env states) is split on its env
    axis; params, optimiser state and the rest are replicated, and XLA's SPMD partitioner inserts
    the collectives the update needs (e.g. the mean of a loss over envs).
    """
    trainer = get_agent_module(config.agent.name).make_trainer(config)
    axis = mesh.axis_names[0]
    host_keys = np.asarray(seed_keys(config))
    hparams = {k: put_replicated(v, mesh) for k, v in stacked_hyperparams(config, grid).items()}
    init_one = vmap_sequentially_on_cpu(trainer.init)
    init_many = vmap_over_settings(jax.vmap(init_one, in_axes=(0, None)), (None, 0))
    if shard == "seeds":
        state_sharding = metrics_sharding = seed_sharding(mesh)
        keys = jax.make_array_from_callback(
            host_keys.shape,
            NamedSharding(mesh, PartitionSpec(axis)),
            lambda index: host_keys[index],
        )
    elif shard == "envs":
        keys = put_replicated(host_keys, mesh)
        state_sharding = env_sharding(
            jax.eval_shape(init_many, keys, hparams),
            mesh,
            env_axis_size(config, mesh.size),
        )
        metrics_sharding = replicated(mesh)
    else:
        raise ValueError(f"shard must be 'seeds' or 'envs', got {shard!r}")
    init = jax.jit(
        named(at_matmul_precision(init_many, config.run.matmul_precision), "init"),
        out_shardings=state_sharding,
    )
    chunks = {}

    def chunk(num_log_points: int, donate: bool = False):
        key = (num_log_points, donate)
        if key not in chunks:
            run_one = lambda state, hp: trainer.run(state, hp, num_log_points)
            run_many = vmap_over_settings(jax.vmap(run_one, in_axes=(0, None)), (0, 0))
            chunks[key] = jax.jit(
                named(at_matmul_precision(run_many, config.run.matmul_precision), "log_points"),
                out_shardings=(state_sharding, metrics_sharding),
                donate_argnums=(0,) if donate else (),
            )
        return chunks[key]

    return trainer, init, chunk, keys, hparams


def named(fn, name: str):
    """`fn` under the name `name` (what `jax.jit` calls its program in logs and events)."""

    @functools.wraps(fn)
    def renamed(*args, **kwargs):
        return fn(*args, **kwargs)

    renamed.__name__ = renamed.__qualname__ = name
    return renamed


def env_sharding(abstract_state, mesh, num_envs: int):
    """Shardings of a state with leading axes [settings, seeds]: every leaf under an
    `rl.core.state.Envs` (observations, env states, policy memory) split over the mesh on its env
    axis (axis 2, of size `num_envs`), every other leaf replicated. ConfigError if the state holds
    no `Envs`; ValueError if a per-env leaf has no such axis (the agent broke the contract)."""
    found = [node for node in jax.tree.leaves(abstract_state, is_leaf=is_envs) if is_envs(node)]
    if not found:
        raise ConfigError(
            "--shard envs: the agent's training state has no per-env entries to shard"
        )
    split = NamedSharding(mesh, PartitionSpec(None, None, mesh.axis_names[0]))

    def place_env_leaf(path, leaf):
        if leaf.ndim < 3 or leaf.shape[2] != num_envs:
            raise ValueError(
                f"per-env state{jax.tree_util.keystr(path)} has shape {leaf.shape}: "
                f"expected [settings, seeds, num_envs={num_envs}, ...]"
            )
        return split

    def place(path, node):
        if is_envs(node):
            return jax.tree_util.tree_map_with_path(
                lambda sub, leaf: place_env_leaf(path + sub, leaf), node
            )
        return replicated(mesh)

    return jax.tree_util.tree_map_with_path(place, abstract_state, is_leaf=is_envs)


def env_axis_size(config: Config, num_devices: int) -> int:
    """The agent's `num_envs`, checked to split evenly over `num_devices` (ConfigError
    otherwise)."""
    num_envs = getattr(config.agent, "num_envs", None)
    if not isinstance(num_envs, int):
        raise ConfigError(f"--shard envs: agent {config.agent.name} has no agent.num_envs to shard")
    if num_envs % num_devices:
        raise ConfigError(
            f"--shard envs: agent.num_envs ({num_envs}) must be a multiple of the number of "
            f"devices ({num_devices})"
        )
    return num_envs


def run_mesh(config: Config, devices, shard: str):
    """The one-axis device mesh of a run: over the seeds (which must split evenly) or the envs."""
    devices = devices if devices is not None else 1
    if shard == "envs":
        return seed_mesh(select_devices(devices, None), axis="envs")
    return seed_mesh(select_devices(devices, config.run.seeds))
