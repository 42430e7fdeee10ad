"""`rl train` of an actor-learner config (`arch.name: sebulba`, rl.sebulba): the run directory that
`rl.run.train.run_training` writes (rl.run.run_dir), for the one seed such a run trains, with
checkpoints of the learner's state (leading axes [settings, seeds] = [1, 1]).

    from rl.config import load_config
    from rl.run.actor_learner import run_training
    summary = run_training(load_config("configs/ppo_sebulba_cartpole.yaml"), [{}], "runs/demo")
"""

from __future__ import annotations

import sys
import time
from contextlib import ExitStack, nullcontext
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rl.config.parsing import ConfigError
from rl.run.checkpoint import Checkpoints, abstract_like
from rl.run.distributed import is_main_process
from rl.run.interrupts import StopSignalGuard, TrainingInterrupted
from rl.run.logging import ProgressBar, RunLogger, publish, sink
from rl.run.run_dir import config_check, run_dir_lock, run_record, write_final, write_run_config
from rl.run.summary import summarise
from rl.run.train import smoke_log_points, wandb_sink
from rl.sebulba.learner import Learner, LearnerState, local_copy
from rl.sebulba.pieces import rollout_sizes


def run_training(config, grid: list[dict], run_dir, *, resume: bool = False) -> dict:
    """Train the sebulba `config` into `run_dir` (from its newest checkpoint with `resume`) and
    return the summary. Raises ConfigError (a sweep, a device that is not there, the run directory
    in use), CheckpointMismatchError and TrainingInterrupted, as `rl.run.train.run_training`
    does. Writes config.yaml, the metrics (`rl.run.logging.RunLogger`), checkpoints every
    `run.checkpoint_every` log points, final_params.msgpack and summary.json. Ctrl-C or SIGTERM
    stops after the update in progress and checkpoints it (a second signal stops at once); a
    resume starts fresh episodes (the envs' state lives in the host envs, outside the checkpoint).
    Several processes write into the same run directory (a shared filesystem), each its part of
    each checkpoint; process 0 alone takes the lock and writes the other files."""
    if len(grid) != 1:
        raise ConfigError(
            f"--sweep: arch sebulba trains one setting per run, got {len(grid)}; start one run per "
            "setting, or use arch.name: anakin"
        )
    learner = Learner(config)
    run_dir, main = Path(run_dir), is_main_process()
    with run_dir_lock(run_dir) if main else nullcontext():
        if main and not resume:
            write_run_config(run_dir, config, grid)
        return _Run(config, grid, run_dir, learner, main).train(resume)


def batched(tree):
    """`tree` with the run's leading [settings, seeds] = [1, 1] axes."""
    return jax.tree.map(lambda x: jnp.asarray(x)[None, None], tree)


class _Run:
    """One sebulba run into its directory: the learner, where it stands, and the sinks."""

    def __init__(self, config, grid, run_dir: Path, learner: Learner, main: bool = True):
        self.config, self.grid, self.run_dir, self.learner = config, grid, run_dir, learner
        self.main = main
        self.sizes = rollout_sizes(config)
        self.total = smoke_log_points(self.sizes.num_updates // self.sizes.log_interval)
        self.checkpoints = Checkpoints(run_dir, keep=config.run.keep_checkpoints)
        self.logger = RunLogger(run_dir, grid, 1) if main else None
        self.guard = StopSignalGuard(
            "stopping after the current update and saving a checkpoint (the same signal again "
            "stops without saving)"
        )
        self.history: dict[str, list] = {}
        self.saved_updates, self.saved_step, self.steps_start, self.train_seconds = 0, None, 0, 0.0

    def train(self, resume: bool) -> dict:
        """Restore or initialise, compile, train with checkpoints; returns the summary."""
        config, learner, sinks = self.config, self.learner, [self.logger]
        state = self.restore(learner.init()) if resume else self.fresh(learner.init())
        if config.run.progress and self.main:
            label = f"{config.agent.name}/{config.env.id}"
            sinks.append(ProgressBar(config.agent.total_steps, label=label))
        wandb = wandb_sink(config, self.grid, self.run_dir, resume) if self.main else None
        sinks = [fn for fn in sinks + [wandb] if fn is not None]  # process 0's (jax.distributed)
        updates = self.total * self.sizes.log_interval
        try:
            with self.guard, ExitStack() as stack:
                for fn in sinks:
                    stack.enter_context(sink(fn))
                self.say("compiling the learner's update ...")
                learner.compile(state)
                self.say(f"compiled in {learner.compile_seconds:.1f} s; training")
                if self.logger is not None:
                    self.logger.mark_start()
                start = time.perf_counter()
                state, _ = learner.run(
                    state, updates, lambda: self.guard.requested, on_log_point=self.log_point
                )
                self.train_seconds = time.perf_counter() - start
            if int(state.updates) > self.saved_updates:
                self.save(state)
            self.checkpoints.wait()
        except KeyboardInterrupt:  # a second signal
            raise TrainingInterrupted(
                f"interrupted without saving; {self.kept()}; continue with: rl train --resume "
                f"{self.run_dir}",
                self.guard.signal_number,
            ) from None
        finally:
            for fn in sinks:
                getattr(fn, "close", lambda: None)()
            self.checkpoints.close()
        if int(state.updates) < updates:  # stopped by Ctrl-C or SIGTERM
            raise TrainingInterrupted(
                f"interrupted at step {int(state.step)}; {self.kept()}; continue with: rl train "
                f"--resume {self.run_dir}",
                self.guard.signal_number,
            )
        return self.finish(state)

    def fresh(self, state: LearnerState) -> LearnerState:
        """A new run's `state`, its metrics files opened."""
        if self.logger is not None:
            self.logger.open()
        return state

    def say(self, message: str) -> None:
        """A progress line on stderr (with run.progress; process 0's)."""
        if self.config.run.progress and self.main:
            print(f"rl: {message}", file=sys.stderr, flush=True)

    def restore(self, fresh: LearnerState) -> LearnerState:
        """The newest good checkpoint's state and metrics history (`fresh` gives the shapes), or
        `fresh` when there is none."""
        restored = self.checkpoints.restore_latest(
            abstract_like(batched(fresh)), check_meta=config_check(self.config, self.grid)
        )
        if restored is None:
            return self.fresh(fresh)
        step, state, history, meta = restored
        self.history = {k: list(v[0, 0]) for k, v in history["seed"].items()}
        self.saved_updates, self.saved_step, self.steps_start = int(meta["updates"]), step, step
        if self.logger is not None:
            self.logger.open(history)
            print(
                f"rl: resuming from checkpoint {self.checkpoints.directory / str(step)}",
                file=sys.stderr,
            )
        return jax.tree.map(
            lambda x: jax.device_put(x[0, 0], self.learner.programs.replicated), state
        )

    def log_point(self, state: LearnerState, row: dict) -> None:
        """After each log point: the row sent to the rl.run.logging sinks, the history, the files
        flushed, a checkpoint when one is due
        (which, with several processes, first learns whether any of them failed: `save`)."""
        failure = None
        try:
            publish({k: np.asarray([v]) for k, v in row.items()})  # a run of one seed
            append_log_point(self.history, row)
            if self.logger is not None:
                self.logger.flush()
        except BaseException as error:  # a full disk, a second Ctrl-C
            failure = error
        every = self.config.run.checkpoint_every
        if every and len(self.history["step"]) % every == 0:
            self.save(state, failure)
        elif failure is not None:
            raise failure

    def save(self, state: LearnerState, failure: BaseException | None = None) -> None:
        """A checkpoint of `state` and the history so far (written in the background). The write
        is collective over the processes of a multi-process run: every process first votes
        (`Learner.settle`) with this process's `failure`, if any, or the previous checkpoint's
        failed write, so that every process raises before the write rather than one waiting in
        it for another."""
        try:
            self.checkpoints.wait()  # the previous write's failure, if it failed
        except BaseException as error:
            failure = failure or error
        self.learner.settle(failure)
        history = {k: np.asarray(v)[None, None] for k, v in self.history.items()}
        meta = {
            "log_points": len(self.history.get("step", ())),
            "updates": int(state.updates),
            "step": int(state.step),
            "total_log_points": self.total,
            "agent": self.config.agent.name,
            "env": self.config.env.id,
            "config": run_record(self.config, self.grid),
        }
        if self.logger is not None:
            host = self.logger.host_history()
        else:  # process 0 writes the host history of a multi-process run
            points = len(self.history.get("step", ()))
            host = {k: np.full(points, np.nan) for k in ("steps_per_second", "wall_time")}
        self.checkpoints.save(
            int(state.step), batched(state), {"seed": history, "host": host}, meta
        )
        self.saved_updates, self.saved_step = int(state.updates), int(state.step)

    def kept(self) -> str:
        """Where the newest checkpoint is, or that there is none."""
        if self.saved_step is None:
            return "no checkpoint was saved"
        return f"checkpoint {self.checkpoints.directory / str(self.saved_step)} kept"

    def finish(self, state: LearnerState) -> dict:
        """final_params.msgpack and summary.json; returns the summary."""
        history = {k: np.asarray(v, np.float64)[None, None] for k, v in self.history.items()}
        summary = summarise(
            self.config,
            self.grid,
            history,
            self.learner.compile_seconds,
            self.train_seconds,
            steps_trained=int(state.step) - self.steps_start,
        )
        if self.main:
            write_final(self.run_dir, batched(local_copy(state.params)), summary)
        return summary


def append_log_point(history: dict[str, list], row: dict) -> None:
    """Adds a log point's `row` {name: value} to `history` {name: [value per log point]}. A name
    the earlier log points lack (a metric the agent logs since a newer version, in a run resumed
    from an older checkpoint) starts with NaN for each of them, so every list keeps one entry per
    log point, as a checkpoint's history must."""
    points = len(history.get("step", ()))
    for name, value in row.items():
        history.setdefault(name, [np.nan] * points).append(value)
