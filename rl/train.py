"""Train many seeds (and a grid of hyperparameter settings) of one config in one compiled program,
and write the run directory.

    from rl.config import load_config
    from rl.train import train_many
    config = load_config("configs/qlearning_gridworld.yaml", ["run.seeds=30"])
    final_state, metrics = train_many(config)       # leading axes: [settings, seeds, ...]

`run_training` (what `rl train` runs) compiles the agent's Trainer as two programs, `init` and
`run` over a chunk of `run.checkpoint_every` log points, and loops over chunks on the host: after
each chunk it checks that the metrics and params are finite, flushes the logs and saves a
checkpoint (rl.checkpoint). Chunked runs equal one long run exactly (the Trainer contract), so a run
resumed from a checkpoint ends with the same params as one that was never stopped.

Run directory: `config.yaml` (the resolved config and sweep grid), `metrics.jsonl` and
`metrics.csv` (one row per setting, seed and log point, streamed while training),
`tensorboard/setting_<s>/seed_<i>/` (event files), `checkpoints/<step>/` (orbax),
`final_params.msgpack` (flax serialisation of the final params, leading axes [settings, seeds]) and
`summary.json` (what the CLI prints).
"""

from __future__ import annotations

import functools
import json
import math
import signal
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import yaml

from rl.config import Config, hyperparams
from rl.logging import ProgressBar, sink
from rl.registry import get_agent_module
from rl.trainer import vmap_sequentially_on_cpu


def seed_keys(config: Config) -> jax.Array:
    """PRNGKey(seed + i) for each of the run's seeds: seed i trains exactly as it would alone."""
    return jnp.stack([jax.random.PRNGKey(config.run.seed + i) for i in range(config.run.seeds)])


def stacked_hyperparams(config: Config, grid: list[dict]) -> dict:
    """The sweepable hyperparameters for each setting of the grid, stacked: {name: float32[settings]}."""
    base = hyperparams(config.agent)
    return {
        name: jnp.asarray([setting.get(name, float(value)) for setting in grid], jnp.float32)
        for name, value in base.items()
    }


def at_matmul_precision(fn, precision: str):
    """`fn` traced under `jax.default_matmul_precision(precision)` (`run.matmul_precision`): every
    float32 dot it traces without an explicit precision gets that one; "default" leaves `fn` as it
    is (the platform's choice: TF32 on Ampere/Hopper GPUs, a 10-bit mantissa; full float32 on the
    CPU, where the setting changes nothing). A context manager entered while tracing, so the
    precision is part of the compiled program and no process-wide setting changes."""
    if precision == "default":
        return fn

    @functools.wraps(fn)
    def traced_at_precision(*args, **kwargs):
        with jax.default_matmul_precision(precision):
            return fn(*args, **kwargs)

    return traced_at_precision


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


def train_many(config: Config, grid: list[dict] | None = None):
    """Train every seed of every setting; outputs have leading axes [settings, seeds]."""
    program, keys, hparams = build_program(config, grid)
    return program(keys, hparams)


# What the end-of-run summary reports, best first: the greedy evaluation return where the agent
# measures one, else the return of the (exploratory) training episodes.
SUMMARY_METRICS = {
    "eval_return": "greedy-policy return on separate eval episodes, at the last log point that has one",
    "episode_return": "return of the training (exploratory) episodes that ended, at the last log point that has one",
}


def summary_metric(metrics: dict) -> str:
    """`eval_return` when the agent logged a finite one, else `episode_return`."""
    evals = metrics.get("eval_return")
    if evals is not None and np.isfinite(np.asarray(evals, np.float64)).any():
        return "eval_return"
    return "episode_return"


def final_values(metrics: dict, name: str) -> np.ndarray:
    """Per instance, the last finite value of metric `name` over the log points (NaN if none is finite)."""
    values = np.asarray(metrics[name], np.float64)
    finite = np.isfinite(values)
    last = np.where(finite.any(-1), values.shape[-1] - 1 - np.argmax(finite[..., ::-1], axis=-1), 0)
    picked = np.take_along_axis(values, last[..., None], axis=-1)[..., 0]
    return np.where(finite.any(-1), picked, np.nan)


def spread(values) -> dict:
    """mean, median, std, min and max of the finite entries of `values` (None where there are none),
    and `per_seed`: every value in order (None for a seed without one)."""
    values = np.asarray(values, np.float64).ravel()
    finite = values[np.isfinite(values)]
    stats = {"mean": np.mean, "median": np.median, "std": np.std, "min": np.min, "max": np.max}
    summary = {name: float(fn(finite)) if finite.size else None for name, fn in stats.items()}
    summary["per_seed"] = [float(v) if math.isfinite(v) else None for v in values]
    return summary


def write_metrics_jsonl(path: Path, metrics: dict, grid: list[dict]) -> None:
    """One JSON object per (setting, seed, log point) with every scalar metric."""
    arrays = {k: np.asarray(v) for k, v in metrics.items()}
    num_settings, num_seeds, num_points = arrays["step"].shape[:3]
    with open(path, "w") as f:
        for s in range(num_settings):
            for seed in range(num_seeds):
                for t in range(num_points):
                    row = {"setting": s, "seed": seed}
                    row.update(
                        {k: _json_number(v[s, seed, t]) for k, v in arrays.items() if v.ndim == 3}
                    )
                    f.write(json.dumps(row) + "\n")


def _json_number(value):
    value = value.item()
    return None if isinstance(value, float) and not math.isfinite(value) else value


def setting_label(setting: dict) -> str:
    """`lr=0.001, gamma=0.99` for a sweep setting; "" for a run without a sweep."""
    return ", ".join(f"{k}={v}" for k, v in setting.items())


def summarise(
    config: Config,
    grid: list[dict],
    metrics: dict,
    compile_seconds: float,
    train_seconds: float,
    steps_trained: int | None = None,
) -> dict:
    """The run's summary (summary.json): per setting, the final value of `metric` (see
    SUMMARY_METRICS) across seeds, with its spread and per-seed values.

    `steps_trained`: env steps per seed trained in this process (default: the whole run); when it
    is 0 (a resumed run that was already complete) the speed is None."""
    metric = summary_metric(metrics)
    finals = final_values(metrics, metric)
    steps = config.agent.total_steps if steps_trained is None else steps_trained
    total_steps = steps * config.run.seeds * len(grid)
    settings = [
        {
            "hyperparams": setting,
            "label": setting_label(setting),
            "seeds": int(finals[s].size),
            **spread(finals[s]),
        }
        for s, setting in enumerate(grid)
    ]
    return {
        "agent": config.agent.name,
        "env": config.env.id,
        "metric": metric,
        "metric_description": SUMMARY_METRICS[metric],
        "compile_seconds": compile_seconds,
        "train_seconds": train_seconds,
        "env_steps_trained": int(steps),
        "env_steps_per_second": total_steps / train_seconds
        if train_seconds > 0 and steps > 0
        else None,
        "settings": settings,
    }


# ---------------------------------------------------------------- the chunked, checkpointed runner


class NonFiniteError(RuntimeError):
    """Training produced a NaN or infinity in a loss or the params; the message names where."""


class TrainingInterrupted(Exception):
    """Ctrl-C: the run stopped after saving a checkpoint (or, on a second Ctrl-C, without one: then
    `immediate` is True and the abandoned chunk may still be computing in a daemon thread)."""

    immediate = False


def load_run_config(run_dir) -> tuple[Config, list[dict]]:
    """The resolved config and sweep grid a run directory was trained with (ConfigError if missing)."""
    from rl.config import ConfigError, build_config, read_yaml

    path = Path(run_dir) / "config.yaml"
    if not Path(run_dir).is_dir():
        raise ConfigError(f"run directory {str(run_dir)!r} does not exist")
    if not path.is_file():
        raise ConfigError(f"{str(path)!r} does not exist: is {str(run_dir)!r} a run directory?")
    data = read_yaml(path)
    grid = data.pop("sweep", None) or [{}]
    return build_config(data), [dict(setting) for setting in grid]


def make_programs(config: Config, grid: list[dict], mesh, shard: str = "seeds"):
    """(trainer, init, chunk, keys, hparams) for the settings x seeds of a run, placed on `mesh`.

    `init(keys, hparams) -> state` and `chunk(num_log_points)(state, hparams) -> (state, metrics)` are
    jitted with explicit output shardings; every output has leading axes [settings, seeds].
    `shard="seeds"`: the seed axis is split over the mesh. `shard="envs"` (one large agent): the
    state entries the Trainer names `per_env` (env states, observations) are split on their env
    axis; params, optimiser state and the rest are replicated, and XLA's SPMD partitioner inserts the
    collectives the update needs (e.g. the mean of a loss over envs).
    """
    from jax.sharding import NamedSharding, PartitionSpec

    from rl.distributed import put_replicated, replicated, seed_sharding

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
            trainer,
            jax.eval_shape(init_many, keys, hparams),
            mesh,
            env_axis_size(config, mesh.size),
        )
        metrics_sharding = replicated(mesh)
    else:
        raise ValueError(f"shard must be 'seeds' or 'envs', got {shard!r}")
    init = jax.jit(
        at_matmul_precision(init_many, config.run.matmul_precision), out_shardings=state_sharding
    )
    chunks = {}

    def chunk(num_log_points: int):
        if num_log_points not in chunks:
            run_one = lambda state, hp: trainer.run(state, hp, num_log_points)
            run_many = vmap_over_settings(jax.vmap(run_one, in_axes=(0, None)), (0, 0))
            chunks[num_log_points] = jax.jit(
                at_matmul_precision(run_many, config.run.matmul_precision),
                out_shardings=(state_sharding, metrics_sharding),
            )
        return chunks[num_log_points]

    return trainer, init, chunk, keys, hparams


def env_sharding(trainer, abstract_state: dict, mesh, num_envs: int):
    """Shardings of a state with leading axes [settings, seeds]: every leaf of the entries in
    `trainer.per_env` split over the mesh on its env axis (axis 2, of size `num_envs`), every other
    leaf replicated. ValueError if a per-env leaf has no such axis (the agent broke the contract)."""
    from jax.sharding import NamedSharding, PartitionSpec

    from rl.config import ConfigError
    from rl.distributed import replicated

    per_env = set(trainer.per_env)
    if not per_env:
        raise ConfigError(
            "--shard envs: the agent's training state has no per-env entries to shard"
        )
    unknown = per_env - set(abstract_state)
    if unknown:
        raise ValueError(
            f"Trainer.per_env names {sorted(unknown)}, which the state does not have (its entries: {sorted(abstract_state)})"
        )
    split = NamedSharding(mesh, PartitionSpec(None, None, mesh.axis_names[0]))

    def place(path, leaf):
        if path[0].key not in per_env:
            return replicated(mesh)
        if leaf.ndim < 3 or leaf.shape[2] != num_envs:
            raise ValueError(
                f"per-env state{jax.tree_util.keystr(path)} has shape {leaf.shape}: expected [settings, seeds, num_envs={num_envs}, ...]"
            )
        return split

    return jax.tree_util.tree_map_with_path(place, abstract_state)


def env_axis_size(config: Config, num_devices: int) -> int:
    """The agent's `num_envs`, checked to split evenly over `num_devices` (ConfigError otherwise)."""
    from rl.config import ConfigError

    num_envs = getattr(config.agent, "num_envs", None)
    if not isinstance(num_envs, int):
        raise ConfigError(f"--shard envs: agent {config.agent.name} has no agent.num_envs to shard")
    if num_envs % num_devices:
        raise ConfigError(
            f"--shard envs: agent.num_envs ({num_envs}) must be a multiple of the number of devices ({num_devices})"
        )
    return num_envs


def find_non_finite(
    metrics: dict, finite_params: dict, step_range: tuple[int, int], history: dict | None = None
) -> str | None:
    """A message naming the first diverged metric (its value, step, setting and seed) or params leaf
    in a chunk, or None.

    A metric has diverged at a log point where it is infinite, or NaN after having been finite
    earlier in the run (`history` holds the earlier log points): a metric that is NaN from the start
    means "no value yet" (a loss before learning starts). Metrics named `episode_*` or `eval_*` may
    be NaN at any time (no episode ended since the last log point); they stop the run only when
    infinite. Params must be finite."""
    from rl.logging import NAN_ALLOWED_PREFIXES

    first = None
    for name, values in metrics.items():
        values = np.asarray(values)
        if name == "step" or not np.issubdtype(values.dtype, np.floating) or values.ndim < 3:
            continue
        earlier = np.asarray(history[name]) if history and name in history else values[:, :, :0]
        full = np.concatenate([earlier, values], axis=2)
        flat = full.reshape(*full.shape[:3], -1)  # [settings, seeds, log points, any extra axes]
        bad = np.isinf(flat).any(-1)
        if not name.startswith(NAN_ALLOWED_PREFIXES):
            finite_before = (
                np.cumsum(np.isfinite(flat).all(-1), axis=2) - np.isfinite(flat).all(-1) > 0
            )
            bad |= np.isnan(flat).any(-1) & finite_before
        bad = np.argwhere(bad[:, :, earlier.shape[2] :])
        if bad.size:
            s, i, t = min(bad.tolist(), key=lambda index: index[2])
            point = flat[s, i, earlier.shape[2] + t]
            value = point[~np.isfinite(point)][0]
            if first is None or t < first[0]:
                first = (
                    t,
                    f"non-finite {name} ({value}) at step {int(np.asarray(metrics['step'])[s, i, t])} (setting {s}, seed {i})",
                )
    if first is not None:
        return first[1]
    for path, finite in jax.tree_util.tree_leaves_with_path(finite_params):
        bad = np.argwhere(~np.asarray(finite))
        if bad.size:
            s, i = bad[0].tolist()
            return f"non-finite params{jax.tree_util.keystr(path)} between step {step_range[0]} and step {step_range[1]} (setting {s}, seed {i})"
    return None


@jax.jit
def _finite_per_instance(tree):
    """Per leaf, bool[settings, seeds]: whether that instance's values are all finite."""

    def check(x):
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            return jnp.ones(x.shape[:2], bool)
        return jnp.isfinite(x).reshape(x.shape[0], x.shape[1], -1).all(-1)

    return jax.tree.map(check, tree)


def _call_interruptibly(fn, *args, block: bool = True):
    """`jax.block_until_ready(fn(*args))`, run in a worker thread while the main thread waits in short
    joins, so that Python signal handlers (Ctrl-C) run at once: a compiled program with host
    callbacks can otherwise hold the main thread inside XLA until the whole chunk is done."""
    wait = jax.block_until_ready if block else (lambda x: x)
    if threading.current_thread() is not threading.main_thread():
        return wait(fn(*args))
    result = {}

    def target():
        try:
            result["value"] = wait(fn(*args))
        except BaseException as err:  # re-raised in the main thread
            result["error"] = err

    worker = threading.Thread(target=target, name="rl-train-chunk", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.05)
    if "error" in result:
        raise result["error"]
    return result["value"]


class _SigintGuard:
    """First Ctrl-C asks the runner to stop after the chunk in progress (saving a checkpoint); a second
    one stops at once, keeping the checkpoints already written."""

    def __init__(self, message: str):
        self.requested = False
        self.message = message
        self.previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print(f"\nrl: {self.message}", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        return False


def _concat_history(history: dict | None, metrics: dict) -> dict:
    metrics = {k: np.asarray(v) for k, v in metrics.items() if np.ndim(v) == 3}
    if not history:
        return metrics
    return {k: np.concatenate([history[k], v], axis=-1) for k, v in metrics.items()}


def run_training(
    config: Config,
    grid: list[dict],
    run_dir: Path,
    *,
    resume: bool = False,
    devices=None,
    shard: str = "seeds",
) -> dict:
    """Compile, train chunk by chunk with checkpoints, write the run directory; returns the summary.

    `resume=True` continues the run in `run_dir` from its newest good checkpoint (from scratch if it
    has none). `devices`: None (the default device), a count or "all" to shard the seed axis (or, with
    `shard="envs"`, the env axis: see `make_programs`).
    Raises NonFiniteError (training diverged: the bad chunk is not checkpointed), TrainingInterrupted
    (Ctrl-C) and OSError (the run directory cannot be written).
    """
    from rl.distributed import is_main_process

    run_dir = Path(run_dir)
    main = is_main_process()
    if main and not resume:
        (run_dir / "config.yaml").write_text(
            yaml.safe_dump({**config.to_dict(), "sweep": grid}, sort_keys=False)
        )
    programs = make_programs(config, grid, run_mesh(config, devices, shard), shard)
    run = _ChunkedRun(config, grid, run_dir, programs, main)
    run.train(resume)
    return run.finish()


def run_mesh(config: Config, devices, shard: str):
    """The one-axis device mesh of a run: over the seeds (which must split evenly) or the envs."""
    from rl.distributed import seed_mesh, select_devices

    devices = devices if devices is not None else 1
    if shard == "envs":
        return seed_mesh(select_devices(devices, None), axis="envs")
    return seed_mesh(select_devices(devices, config.run.seeds))


SMOKE_ENV_VAR = "FUSEDRL_SMOKE_LOG_POINTS"
SMOKE_SEEDS_ENV_VAR = "FUSEDRL_SMOKE_SEEDS"


def smoke_cap(name: str) -> int | None:
    """The positive integer in environment variable `name`, or None when it is unset or empty;
    ConfigError naming the variable if it is anything else."""
    import os

    from rl.config import ConfigError

    raw = os.environ.get(name)
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"environment variable {name}: expected a positive integer, got {raw!r}")
    return int(raw)


def smoke_log_points(num_log_points: int) -> int:
    """The log points `rl train` runs: all of them, or at most N when the environment variable
    FUSEDRL_SMOKE_LOG_POINTS=N is set (a quick check that a command runs end to end; the README test
    uses it). ConfigError if it is not a positive integer."""
    cap = smoke_cap(SMOKE_ENV_VAR)
    return num_log_points if cap is None else min(num_log_points, cap)


def smoke_seeds(seeds: int) -> int:
    """The seeds `rl train` trains: `seeds`, or at most N when FUSEDRL_SMOKE_SEEDS=N is set (with
    FUSEDRL_SMOKE_LOG_POINTS, a quick end-to-end check of a command; the README test uses both)."""
    cap = smoke_cap(SMOKE_SEEDS_ENV_VAR)
    return seeds if cap is None else min(seeds, cap)


def wandb_sink(config: Config, grid: list[dict], run_dir: Path, resume: bool):
    """A rl.wandb_logger.WandbLogger when `run.wandb.project` is set and its mode is not disabled, else None."""
    settings = config.run.wandb
    if settings.project is None or settings.mode == "disabled":
        return None
    from rl.wandb_logger import WandbLogger

    return WandbLogger(settings, run_dir, config.to_dict(), grid, resume=resume)


def chunk_sizes(done: int, total: int, every: int) -> set[int]:
    """The distinct chunk lengths (in log points) of a run from log point `done` to `total` in chunks
    of `every`: each is one compiled program."""
    return {min(every, total - start) for start in range(done, total, every)}


def compiling_message(programs: int, seeds: int, settings: int) -> str:
    """The line printed before the first compile, so that the wait is not mistaken for a hang."""
    instances = f"{seeds} seed{'s' if seeds != 1 else ''}" + (
        f" x {settings} settings" if settings > 1 else ""
    )
    return f"compiling {programs} programs for {instances} (the first wait is XLA compilation; progress starts once steps run) ..."


class _ChunkedRun:
    """The host loop of `run_training` and where it stands: `state` after `done` of `total` log
    points, `history` (per-seed metrics so far, [settings, seeds, log points]), `last_step` (env steps
    per seed so far) and the newest checkpoint written or restored (`checkpoint_step`)."""

    def __init__(self, config: Config, grid: list[dict], run_dir: Path, programs, main: bool):
        from rl.checkpoint import Checkpoints
        from rl.logging import RunLogger

        self.config, self.grid, self.run_dir, self.main = config, grid, run_dir, main
        trainer, self.init, self.chunk, self.keys, self.hparams = programs
        self.total = smoke_log_points(trainer.num_log_points)
        self.every = config.run.checkpoint_every or self.total
        self.checkpoints = Checkpoints(run_dir, keep=config.run.keep_checkpoints)
        self.logger = RunLogger(run_dir, grid, config.run.seeds) if main else None
        self.wandb = (
            None  # a WandbLogger when run.wandb.project is set (made in train: it knows `resume`)
        )
        self.guard = _SigintGuard(
            "stopping after the current chunk and saving a checkpoint (Ctrl-C again to stop without saving)"
        )
        self.compiled_chunks: dict = {}
        self.state, self.done, self.history, self.checkpoint_step = None, 0, None, None
        self.compile_seconds = self.train_seconds = 0.0
        self.steps_start = self.last_step = 0

    def train(self, resume: bool) -> None:
        """Every remaining chunk, each checkpointed; Ctrl-C and divergence raise (see run_training)."""
        bar = None
        try:
            with self.guard:
                self.start(resume)
                if self.config.run.progress and self.main:
                    bar = ProgressBar(
                        self.config.agent.total_steps,
                        label=f"{self.config.agent.name}/{self.config.env.id}",
                    )
                self.wandb = (
                    wandb_sink(self.config, self.grid, self.run_dir, resume) if self.main else None
                )
                with _sinks([s for s in (self.logger, bar, self.wandb) if s is not None]):
                    while self.done < self.total:
                        self.advance()
                self.checkpoints.wait()
        except KeyboardInterrupt:
            error = TrainingInterrupted(
                f"interrupted without saving; {self.kept('last checkpoint', 'no checkpoint was saved')}; continue with: rl train --resume {self.run_dir}"
            )
            error.immediate = True  # the chunk is still computing in a worker thread
            raise error from None
        finally:
            if bar is not None:
                bar.close()
            if self.logger is not None:
                self.logger.close()
            if self.wandb is not None:
                self.wandb.close()
            self.checkpoints.close()

    def say(self, message: str) -> None:
        """One progress line on stderr from the main process, when `run.progress` is on (with it off,
        stderr holds only errors and the resume line)."""
        if self.main and self.config.run.progress:
            print(f"rl: {message}", file=sys.stderr, flush=True)

    def start(self, resume: bool) -> None:
        """Compile `init`; then restore the newest good checkpoint (`resume`) or initialise."""
        self.say(
            compiling_message(
                len(chunk_sizes(0, self.total, self.every)) + 1,
                self.config.run.seeds,
                len(self.grid),
            )
        )
        start = time.perf_counter()
        compiled_init = _call_interruptibly(
            lambda: self.init.lower(self.keys, self.hparams).compile(), block=False
        )
        self.compile_seconds += time.perf_counter() - start
        shapes = jax.eval_shape(self.init, self.keys, self.hparams)
        abstract_state = jax.tree.map(
            lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
            shapes,
            compiled_init.output_shardings,
        )
        restored = self.checkpoints.restore_latest(abstract_state) if resume else None
        history = None
        if restored is not None:
            self.checkpoint_step, self.state, history, meta = restored
            self.done, self.history = int(meta["log_points"]), history["seed"]
            print(
                f"rl: resuming from checkpoint {self.checkpoints.directory / str(self.checkpoint_step)} ({self.done}/{self.total} log points)",
                file=sys.stderr,
            )
        else:
            self.state = _call_interruptibly(compiled_init, self.keys, self.hparams)
        if self.logger is not None:
            self.logger.open(history)
        self.steps_start = self.last_step = (
            int(np.max(self.history["step"][..., -1])) if self.history else 0
        )

    def advance(self) -> None:
        """One turn of the host loop: stop if Ctrl-C was pressed, else compile the next chunk's
        program (then come back, to check for Ctrl-C during the compile), else run and save it."""
        if self.guard.requested:
            where = (
                f"checkpoint {self.checkpoints.directory / str(self.checkpoint_step)} kept"
                if self.checkpoint_step is not None
                else "no checkpoint yet"
            )
            raise TrainingInterrupted(
                f"interrupted before step {self.last_step + 1} ({self.done}/{self.total} log points, {where}); continue with: rl train --resume {self.run_dir}"
            )
        size = min(self.every, self.total - self.done)
        if size not in self.compiled_chunks:
            start = time.perf_counter()
            self.compiled_chunks[size] = _call_interruptibly(
                lambda: self.chunk(size).lower(self.state, self.hparams).compile(), block=False
            )
            self.compile_seconds += time.perf_counter() - start
            if len(self.compiled_chunks) == 1:
                self.say(f"compiled in {self.compile_seconds:.1f} s; training")
            return
        state, metrics = self.run_chunk(size)
        step = self.check_finite(state, metrics)
        self.save(state, metrics, size, step)
        if self.guard.requested and self.done < self.total:
            self.checkpoints.wait()
            raise TrainingInterrupted(
                f"interrupted at step {step} ({self.done}/{self.total} log points); checkpoint saved in {self.checkpoints.directory / str(step)}; continue with: rl train --resume {self.run_dir}"
            )

    def run_chunk(self, size: int):
        """(state, host metrics) after the next `size` log points; logs every log point."""
        from rl.distributed import to_host

        if self.logger is not None:
            self.logger.mark_start()
        start = time.perf_counter()
        state, metrics = _call_interruptibly(self.compiled_chunks[size], self.state, self.hparams)
        self.train_seconds += time.perf_counter() - start
        metrics = to_host(metrics)
        if (
            self.logger is not None and self.logger.received < self.done + size
        ):  # the agent did not stream every log point
            for t in range(self.logger.received - self.done, size):
                self.logger({k: np.asarray(v)[..., t] for k, v in metrics.items()})
        return state, metrics

    def check_finite(self, state, metrics: dict) -> int:
        """The env step reached by the chunk; NonFiniteError if its metrics or params diverged."""
        from rl.distributed import to_host

        step = int(np.max(np.asarray(metrics["step"])[..., -1]))
        problem = find_non_finite(
            metrics,
            to_host(_finite_per_instance(state["params"])),
            (self.last_step, step),
            self.history,
        )
        if self.logger is not None:
            self.logger.flush()
        if problem is not None:
            self.checkpoints.wait()
            raise NonFiniteError(
                f"{problem}; training stopped, {self.kept('last good checkpoint', 'no checkpoint was saved before it')}"
            )
        return step

    def save(self, state, metrics: dict, size: int, step: int) -> None:
        """Accept a finished chunk and checkpoint it (written in the background)."""
        self.state, self.done, self.last_step = state, self.done + size, step
        self.history = _concat_history(self.history, metrics)
        if self.logger is not None:
            host_history = self.logger.host_history()
        else:
            host_history = {
                "steps_per_second": np.full(self.done, np.nan),
                "wall_time": np.full(self.done, np.nan),
            }
        meta = {
            "log_points": self.done,
            "step": step,
            "total_log_points": self.total,
            "agent": self.config.agent.name,
            "env": self.config.env.id,
        }
        self.checkpoints.save(step, state, {"seed": self.history, "host": host_history}, meta)
        self.checkpoint_step = step

    def kept(self, label: str, none: str) -> str:
        """Where the newest checkpoint is ("<label>: <dir>"), or `none`."""
        return (
            f"{label}: {self.checkpoints.directory / str(self.checkpoint_step)}"
            if self.checkpoint_step is not None
            else none
        )

    def finish(self) -> dict:
        """Write final_params.msgpack and summary.json (main process); returns the summary."""
        from flax import serialization

        from rl.distributed import to_host

        params = to_host(self.state["params"])
        summary = summarise(
            self.config,
            self.grid,
            self.history,
            self.compile_seconds,
            self.train_seconds,
            steps_trained=self.last_step - self.steps_start,
        )
        if self.main:
            (self.run_dir / "final_params.msgpack").write_bytes(
                serialization.msgpack_serialize(params)
            )
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary


class _sinks:
    """Register several rl.logging sinks at once."""

    def __init__(self, fns):
        from contextlib import ExitStack

        self.fns, self.stack = fns, ExitStack()

    def __enter__(self):
        for fn in self.fns:
            self.stack.enter_context(sink(fn))
        return self

    def __exit__(self, *exc):
        return self.stack.__exit__(*exc)
