"""Train many seeds (and a grid of hyperparameter settings) of one config in one compiled program,
and write the run directory (`run_training`, what `rl train` runs).

    from rl.config import load_config
    from rl.run.train import train_many
    config = load_config("configs/qlearning_gridworld.yaml", ["run.seeds=30"])
    final_state, metrics = train_many(config)       # leading axes: [settings, seeds, ...]
"""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, nullcontext
from pathlib import Path

import jax
import numpy as np

from kernels.launch import compile_without_torch
from rl.config import Config
from rl.config.limits import check_device_memory
from rl.config.parsing import ConfigError
from rl.run import program_cache
from rl.run.checkpoint import Checkpoints
from rl.run.compile_cache import compilation_cache
from rl.run.distributed import is_main_process, to_host
from rl.run.divergence import NonFiniteError, find_non_finite, finite_per_instance
from rl.run.interrupts import StopSignalGuard, TrainingInterrupted, call_interruptibly
from rl.run.logging import ProgressBar, RunLogger, publish, sink
from rl.run.programs import build_program, make_programs, run_mesh
from rl.run.run_dir import (
    config_check,
    run_dir_lock,
    run_record,
    write_final,
    write_run_config,
)
from rl.run.summary import process_seconds, summarise


def train_many(config: Config, grid: list[dict] | None = None):
    """Train every seed of every setting; outputs have leading axes [settings, seeds]."""
    if config.arch.name != "anakin":
        raise ConfigError(
            f"arch.name: {config.arch.name!r} runs are trained by rl.sebulba.learner.train"
        )
    program, keys, hparams = build_program(config, grid)
    return program(keys, hparams)


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

    The agent's Trainer compiles as two programs, `init` and one log point of `run`
    (rl.run.programs), through the compilation caches; the log point's program, the same whatever
    total_steps, log_interval and checkpoint_every, is called once per log point, the next call
    queued before the metrics are read. Every `run.checkpoint_every` log points the metrics and
    params are checked finite (rl.run.divergence) and a checkpoint is saved; chunked runs equal one
    long run exactly (the Trainer contract), so a resumed run ends with the same params.

    `resume=True` continues the run in `run_dir` from its newest good checkpoint (from scratch if
    it has none). `devices`: None (the default device), a count or "all" to shard the seed axis
    (or, with `shard="envs"`, the env axis: see `rl.run.programs.make_programs`).
    Raises RunDirInUseError (another process trains into `run_dir`), CheckpointMismatchError
    (`resume` of a checkpoint written with another config), NonFiniteError (training diverged: the
    bad chunk is not checkpointed),
    TrainingInterrupted (Ctrl-C or SIGTERM) and OSError (the run directory cannot be written).
    """
    if config.arch.name != "anakin":
        raise ConfigError(
            f"arch.name: {config.arch.name!r} runs are trained by rl.run.actor_learner.run_training"
        )
    run_dir = Path(run_dir)
    main = is_main_process()
    with run_dir_lock(run_dir) if main else nullcontext():
        if main and not resume:
            write_run_config(run_dir, config, grid)
        mesh = run_mesh(config, devices, shard)
        check_device_memory(config, len(grid), list(mesh.devices.flat), shard)
        programs = make_programs(config, grid, mesh, shard)
        run = _ChunkedRun(config, grid, run_dir, programs, main, (list(mesh.devices.flat), shard))
        run.train(resume)
        return run.finish()


# a wait on the host longer than this is announced on stderr, so that it is not taken for a hang
STALL_SECONDS = 2.0

SMOKE_ENV_VAR = "FUSEDRL_SMOKE_LOG_POINTS"
SMOKE_SEEDS_ENV_VAR = "FUSEDRL_SMOKE_SEEDS"


def smoke_cap(name: str) -> int | None:
    """The positive integer in environment variable `name`, or None when it is unset or empty;
    ConfigError naming the variable if it is anything else."""
    raw = os.environ.get(name)
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"environment variable {name}: expected a positive integer, got {raw!r}")
    return int(raw)


def smoke_log_points(num_log_points: int) -> int:
    """The log points `rl train` runs: all of them, or at most N when the environment variable
    FUSEDRL_SMOKE_LOG_POINTS=N is set (a quick check that a command runs end to end; the README
    test uses it). ConfigError if it is not a positive integer."""
    cap = smoke_cap(SMOKE_ENV_VAR)
    return num_log_points if cap is None else min(num_log_points, cap)


def smoke_seeds(seeds: int) -> int:
    """The seeds `rl train` trains: `seeds`, or at most N when FUSEDRL_SMOKE_SEEDS=N is set (with
    FUSEDRL_SMOKE_LOG_POINTS, a quick end-to-end check of a command; the README test uses both)."""
    cap = smoke_cap(SMOKE_SEEDS_ENV_VAR)
    return seeds if cap is None else min(seeds, cap)


def wandb_sink(config: Config, grid: list[dict], run_dir: Path, resume: bool):
    """A rl.run.wandb_logger.WandbLogger when `run.wandb.project` is set and its mode is not
    disabled, else None."""
    settings = config.run.wandb
    if settings.project is None or settings.mode == "disabled":
        return None
    from rl.run.wandb_logger import WandbLogger

    return WandbLogger(settings, run_dir, config.to_dict(), grid, resume=resume)


def compiling_message(seeds: int, settings: int, cache) -> str:
    """The line printed before the programs compile, so that the wait is not mistaken for a
    hang."""
    instances = f"{seeds} seed{'s' if seeds != 1 else ''}" + (
        f" x {settings} settings" if settings > 1 else ""
    )
    where = (
        f"; compiled programs are kept in {cache.directory}" if cache.directory is not None else ""
    )
    return (
        f"compiling the training program for {instances} (XLA compilation; progress starts "
        f"once steps run{where}) ..."
    )


def compiled_message(seconds: float, cache) -> str:
    """What the compile turned out to be: a compile, or programs loaded from the cache."""
    if cache.hits and not cache.misses:
        return f"loaded the compiled programs from the cache in {seconds:.1f} s; training"
    return f"compiled in {seconds:.1f} s; training"


def compile_together(lowered: list):
    """The compiled executables of `lowered` (jax `Lowered` programs), compiled in threads of
    their own at once (XLA releases the GIL while it compiles); a compile's error is raised."""
    with ThreadPoolExecutor(max_workers=len(lowered), thread_name_prefix="rl-compile") as pool:
        return list(pool.map(lambda program: program.compile(), lowered))


class _ChunkedRun:
    """The host loop of `run_training` and where it stands: `state` after `done` of `total` log
    points, `history` (per-seed metrics so far, [settings, seeds, log points]), `last_step` (env
    steps per seed so far) and the newest checkpoint written or restored (`checkpoint_step`)."""

    def __init__(
        self, config: Config, grid: list[dict], run_dir: Path, programs, main: bool, placement
    ):
        self.config, self.grid, self.run_dir, self.main = config, grid, run_dir, main
        self.devices, self.shard = placement  # the mesh's devices, and the axis split over them
        trainer, self.init, chunk, self.keys, self.hparams = programs
        self.total = smoke_log_points(trainer.num_log_points)
        self.every = config.run.checkpoint_every or self.total
        # the one training program: a log point, its input state donated to its output
        self.log_point = chunk(1, donate=True)
        self.checkpoints = Checkpoints(run_dir, keep=config.run.keep_checkpoints)
        self.logger = RunLogger(run_dir, grid, config.run.seeds) if main else None
        # a WandbLogger when run.wandb.project is set (made in train: it knows `resume`)
        self.wandb = None
        self.guard = StopSignalGuard(
            "stopping after the current log point and saving a checkpoint "
            "(the same signal again, a second or more later, stops without saving)"
        )
        self.compiled_init = self.compiled_log_point = self.abstract_state = None
        self.storing = None  # the thread that keeps the compiled programs (rl.run.program_cache)
        # what became of the whole compiled programs: loaded, stored, or why not (None: no cache)
        self.whole_programs = None
        self.cache, self.startup_seconds = None, None
        self.state, self.done, self.history, self.checkpoint_step = None, 0, None, None
        self.compile_seconds = self.train_seconds = 0.0
        self.steps_start = self.last_step = 0

    def train(self, resume: bool) -> None:
        """Every remaining log point, checkpointed every `run.checkpoint_every`; Ctrl-C, SIGTERM
        and divergence raise (see run_training)."""
        bar, immediate = None, False
        try:
            with self.guard, compilation_cache(self.config.run.compilation_cache) as self.cache:
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
                if not self.checkpoints.written_within(STALL_SECONDS):
                    self.say("writing the last checkpoint ...")
                self.checkpoints.wait()
        except KeyboardInterrupt:
            kept = self.kept("last checkpoint", "no checkpoint was saved")
            error = TrainingInterrupted(
                f"interrupted without saving; {kept}; "
                f"continue with: rl train --resume {self.run_dir}",
                self.guard.signal_number,
            )
            error.immediate = immediate = True  # a log point still computes on the device
            raise error from None
        finally:
            if bar is not None:
                bar.close()
            if self.logger is not None:
                self.logger.close()
            if self.storing is not None and not immediate:
                self.storing.join()
            if not immediate:  # a second signal: leave without waiting for W&B or a write
                if self.wandb is not None:
                    self.wandb.close()
                self.checkpoints.close()

    def say(self, message: str) -> None:
        """One progress line on stderr from the main process, when `run.progress` is on (with it
        off, stderr holds only errors, warnings and the resume line)."""
        if self.main and self.config.run.progress:
            print(f"rl: {message}", file=sys.stderr, flush=True)

    def compile(self) -> None:
        """Trace, lower and compile `init` and the log point's program (or load them from the
        compilation cache), the two compiles at once."""
        self.say(compiling_message(self.config.run.seeds, len(self.grid), self.cache))
        self.startup_seconds = process_seconds()
        start = time.perf_counter()

        files = self.cache.files if program_cache.kept_on(self.devices[0]) else None
        if self.cache.files is not None and files is None:
            self.whole_programs = f"not kept on {self.devices[0].platform}"
        key = (
            program_cache.program_key(run_record(self.config, self.grid), self.devices, self.shard)
            if files is not None
            else None
        )

        def lower_and_compile():
            loaded = program_cache.load(files, key) if files is not None else None
            if loaded is not None:
                self.whole_programs = "loaded"
                return loaded
            with compile_without_torch(jax.devices()[0]):
                init = self.init.trace(self.keys, self.hparams).lower()
                log_point = self.log_point.trace(init.out_info, self.hparams).lower()
            compiled = compile_together([init, log_point])
            if files is not None:

                def store():
                    self.whole_programs = program_cache.store(
                        files, key, [init, log_point], compiled
                    )

                self.storing = threading.Thread(target=store, name="rl-store")
                self.storing.start()
            return compiled

        compiled = call_interruptibly(lower_and_compile, block=False)
        self.compiled_init, self.compiled_log_point = compiled
        # shapes, dtypes and shardings of the state
        self.abstract_state = self.compiled_init.out_info
        self.compile_seconds += time.perf_counter() - start
        self.say(compiled_message(self.compile_seconds, self.cache))

    def start(self, resume: bool) -> None:
        """Compile; then restore the newest good checkpoint (`resume`) or initialise."""
        self.compile()
        restored = (
            self.checkpoints.restore_latest(
                self.abstract_state, check_meta=config_check(self.config, self.grid)
            )
            if resume
            else None
        )
        history = None
        if restored is not None:
            self.checkpoint_step, self.state, history, meta = restored
            self.done, self.history = int(meta["log_points"]), history["seed"]
            print(
                f"rl: resuming from checkpoint "
                f"{self.checkpoints.directory / str(self.checkpoint_step)} "
                f"({self.done}/{self.total} log points)",
                file=sys.stderr,
            )
        else:
            self.state = call_interruptibly(self.compiled_init, self.keys, self.hparams)
        if self.logger is not None:
            self.logger.open(history)
        self.steps_start = self.last_step = (
            int(np.max(self.history["step"][..., -1])) if self.history else 0
        )

    def advance(self) -> None:
        """One turn of the host loop: stop if Ctrl-C or SIGTERM came, else run the log points up
        to the next checkpoint (fewer if a signal comes) and save them."""
        if self.guard.requested:
            where = (
                f"checkpoint {self.checkpoints.directory / str(self.checkpoint_step)} kept"
                if self.checkpoint_step is not None
                else "no checkpoint yet"
            )
            raise TrainingInterrupted(
                f"interrupted before step {self.last_step + 1} "
                f"({self.done}/{self.total} log points, {where}); "
                f"continue with: rl train --resume {self.run_dir}",
                self.guard.signal_number,
            )
        state, metrics = self.run_chunk(min(self.every, self.total - self.done))
        size = np.asarray(metrics["step"]).shape[2]
        step = self.check_finite(state, metrics)
        self.save(state, metrics, size, step)
        if self.guard.requested and self.done < self.total:
            self.checkpoints.wait()
            raise TrainingInterrupted(
                f"interrupted at step {step} ({self.done}/{self.total} log points); "
                f"checkpoint saved in {self.checkpoints.directory / str(step)}; "
                f"continue with: rl train --resume {self.run_dir}",
                self.guard.signal_number,
            )

    def run_chunk(self, size: int):
        """(state, host metrics [settings, seeds, log points]) after at most `size` log points,
        each published to the sinks as it arrives; fewer when Ctrl-C or SIGTERM comes (the log
        point in flight finishes). The next log point is queued before the last one's metrics
        are read, so the device keeps working while the host logs."""
        if self.logger is not None:
            self.logger.mark_start()
        start = time.perf_counter()
        program, hparams = self.compiled_log_point, self.hparams
        state, metrics = program(self.state, hparams)
        queued, points = 1, []
        while True:
            following = None
            if queued < size and not self.guard.requested:
                following = program(state, hparams)  # `state` is donated to it
                queued += 1
            values = call_interruptibly(to_host, metrics)  # [settings, seeds, 1, ...]
            points.append({name: np.asarray(value)[:, :, 0] for name, value in values.items()})
            publish(points[-1])
            if following is None:
                break
            state, metrics = following
        self.train_seconds += time.perf_counter() - start
        return state, {k: np.stack([p[k] for p in points], axis=2) for k in points[0]}

    def check_finite(self, state, metrics: dict) -> int:
        """The env step reached by the chunk; NonFiniteError if its metrics or params diverged."""
        step = int(np.max(np.asarray(metrics["step"])[..., -1]))
        problem = find_non_finite(
            metrics,
            to_host(finite_per_instance(state.params)),
            (self.last_step, step),
            self.history,
        )
        if self.logger is not None:
            self.logger.flush()
        if problem is not None:
            self.checkpoints.wait()
            kept = self.kept("last good checkpoint", "no checkpoint was saved before it")
            raise NonFiniteError(f"{problem}; training stopped, {kept}")
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
            "config": run_record(self.config, self.grid),
        }
        if not self.checkpoints.written_within(STALL_SECONDS):  # the one before is still writing
            self.say(f"writing checkpoint {self.checkpoint_step} before the next one ...")
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
        params = to_host(self.state.params)
        summary = summarise(
            self.config,
            self.grid,
            self.history,
            self.compile_seconds,
            self.train_seconds,
            steps_trained=self.last_step - self.steps_start,
            programs_from_cache=bool(self.cache.hits and not self.cache.misses),
            process_start=self.startup_seconds,
        )
        summary["whole_programs"] = self.whole_programs
        if self.main:
            write_final(self.run_dir, params, summary)
        return summary


class _sinks:
    """Register several rl.run.logging sinks at once."""

    def __init__(self, fns):
        self.fns, self.stack = fns, ExitStack()

    def __enter__(self):
        for fn in self.fns:
            self.stack.enter_context(sink(fn))
        return self

    def __exit__(self, *exc):
        return self.stack.__exit__(*exc)


def _concat_history(history: dict | None, metrics: dict) -> dict:
    metrics = {k: np.asarray(v) for k, v in metrics.items() if np.ndim(v) == 3}
    if not history:
        return metrics
    return {k: np.concatenate([history[k], v], axis=-1) for k, v in metrics.items()}
