"""Failure handling: a diverging run stops with a message naming the metric and step and keeps its
last good checkpoint; Ctrl-C saves a checkpoint and exits cleanly (and the run resumes exactly);
unwritable or full run directories give one clear line, not a traceback."""

from __future__ import annotations

import shutil
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from run_helpers import final_params, metric_rows, run_cli, run_signalled, trained_run, write_config

import rl.config.registry
from rl.agents.trainer import Trainer, train_from_trainer
from rl.config.parsing import hp
from rl.run.checkpoint import Checkpoints

# ---------------------------------------------------------------- a diverging agent


@dataclass(frozen=True)
class DivergingConfig:
    """Gradient descent on loss(w) = w^2 / 2 with a step size above 2: w <- (1 - lr) w diverges."""

    name: str = "diverging"
    total_steps: int = hp(200, low=1)
    log_interval: int = hp(10, low=1)
    lr: float = hp(3.0, low=0.0, sweep=True)
    emit_loss: bool = hp(True)
    nan_until: int = hp(
        0,
        low=0,
        doc="loss reported as NaN (no value yet) up to this step, like a loss before learning "
        "starts",
    )


class DivergingState(NamedTuple):
    params: Any
    key: jax.Array
    step: jax.Array


def make_trainer(config):
    agent = config.agent

    def init(key, hparams):
        return DivergingState(params={"w": jnp.float32(1.0)}, key=key, step=jnp.int32(0))

    def run(state, hparams, num_log_points):
        def period(state, _):
            def sgd(carry, _):
                w, loss = carry
                return (w - hparams["lr"] * w, 0.5 * w * w), None

            (w, loss), _ = jax.lax.scan(
                sgd, (state.params["w"], jnp.float32(0.0)), None, length=agent.log_interval
            )
            step = state.step + agent.log_interval
            metrics = {
                "step": step,
                "episode_return": jnp.float32(jnp.nan),
                "episode_length": jnp.float32(jnp.nan),
            }
            if agent.emit_loss:
                metrics["loss"] = jnp.where(step <= agent.nan_until, jnp.nan, loss)
            return state._replace(params={"w": w}, step=step), metrics

        return jax.lax.scan(period, state, None, length=num_log_points)

    return Trainer(init, run, agent.total_steps // agent.log_interval)


@pytest.fixture
def diverging_agent(monkeypatch):
    module = types.ModuleType("diverging_agent")
    module.Config = DivergingConfig
    module.make_trainer = make_trainer
    module.make_train = lambda config: train_from_trainer(make_trainer(config), config.agent)
    module.make_policy = lambda config: lambda params, obs, key: jnp.int32(0)
    monkeypatch.setitem(sys.modules, "diverging_agent", module)
    monkeypatch.setitem(rl.config.registry.AGENTS, "diverging", "diverging_agent")


def first_overflow(lr: float, log_interval: int, of_loss: bool) -> int:
    """Env step of the first log point whose last-step loss (or w) is not finite, in float32."""
    w = np.float32(1.0)
    with np.errstate(all="ignore"):
        for step in range(1, 10_000):
            loss = np.float32(0.5) * w * w
            w = w - np.float32(lr) * w
            value = loss if of_loss else w
            if not np.isfinite(value):
                return -(-step // log_interval) * log_interval
    raise AssertionError("no overflow")


@pytest.mark.parametrize("emit_loss", [True, False])
def test_non_finite_loss_or_params_stop_the_run_keeping_the_last_good_checkpoint(
    tmp_path, capsys, diverging_agent, emit_loss
):
    data = {
        "env": {"id": "GridWorld"},
        "agent": {"name": "diverging", "emit_loss": emit_loss},
        "run": {"seeds": 2, "checkpoint_every": 2, "progress": False},
    }
    config = write_config(tmp_path, data)
    capsys.readouterr()
    assert run_cli(["train", config, "--name", "nan"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rl: error: non-finite")
    run_dir = tmp_path / "runs" / "nan"
    steps = Checkpoints(run_dir, read_only=True).steps()
    bad = first_overflow(3.0, 10, of_loss=emit_loss)
    chunk_start = (bad - 1) // 20 * 20
    assert steps[-1] == chunk_start  # the chunk holding the bad step was not checkpointed
    assert f"last good checkpoint: {run_dir / 'checkpoints' / str(chunk_start)}" in err
    if emit_loss:
        assert f"non-finite loss (inf) at step {bad} (setting 0, seed 0)" in err
    else:
        assert (
            f"non-finite params['w'] between step {chunk_start} and step {chunk_start + 20}" in err
        )
    assert not (run_dir / "final_params.msgpack").exists()


def test_a_loss_that_is_nan_until_learning_starts_does_not_stop_the_run(
    tmp_path, capsys, diverging_agent
):
    data = {
        "env": {"id": "GridWorld"},
        "agent": {"name": "diverging", "lr": 0.5, "nan_until": 50},
        "run": {"seeds": 2, "checkpoint_every": 2, "progress": False},
    }
    assert run_cli(["train", write_config(tmp_path, data), "--name", "late"]) == 0
    rows = metric_rows(tmp_path / "runs" / "late")
    assert [r["loss"] is None for r in rows if r["seed"] == 0] == [True] * 5 + [False] * 15


# ---------------------------------------------------------------- Ctrl-C


def test_ctrl_c_saves_a_checkpoint_exits_cleanly_and_resumes_exactly(
    tmp_path, tmp_path_factory, capsys
):
    reference = trained_run(tmp_path_factory)
    config = write_config(tmp_path)
    interrupted = run_signalled(
        ["train", config, "--name", "ctrl-c"], signal_at=13_000, signal_name="SIGINT"
    )
    assert interrupted.returncode == 130, interrupted.stderr[-2000:]
    assert "Traceback" not in interrupted.stderr
    # the log point signalled at, or the one queued behind it, is checkpointed: not the chunk end
    stopped = Checkpoints(tmp_path / "runs" / "ctrl-c", read_only=True).steps()[-1]
    assert stopped in (13_000, 14_000)
    assert (
        f"interrupted at step {stopped}" in interrupted.stderr
        and "rl train --resume" in interrupted.stderr
    )
    run_dir = tmp_path / "runs" / "ctrl-c"
    assert not (run_dir / "final_params.msgpack").exists()
    assert run_cli(["train", "--resume", run_dir]) == 0
    jax.tree.map(np.testing.assert_array_equal, final_params(run_dir), final_params(reference))
    assert metric_rows(run_dir) == metric_rows(reference)


# GNU `timeout -s INT 60 rl train ...` sends SIGINT to the process and then to its process group:
# the one stop request arrives twice, back to back
SIGINT_TWICE_AT_ONCE = """
import os, signal, sys
import numpy as np
from rl.run import logging as rl_logging
from rl.cli.main import main

sent = []

def send(values):
    if not sent and int(np.max(values["step"])) >= 13_000:
        sent.append(True)
        os.kill(os.getpid(), signal.SIGINT)
        os.killpg(os.getpgrp(), signal.SIGINT)  # a group of its own (start_new_session)

with rl_logging.sink(send):
    sys.exit(main(sys.argv[1:]))
"""


def test_two_signals_at_once_count_as_one_and_save_a_checkpoint(tmp_path, tmp_path_factory):
    import subprocess

    from run_helpers import REPO, subprocess_env

    reference = trained_run(tmp_path_factory)
    config = write_config(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", SIGINT_TWICE_AT_ONCE, "train", str(config), "--name", "timeout"],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )
    assert done.returncode == 130, done.stderr[-2000:]
    assert "interrupted without saving" not in done.stderr and "Traceback" not in done.stderr
    run_dir = tmp_path / "runs" / "timeout"
    stopped = Checkpoints(run_dir, read_only=True).steps()[-1]
    assert stopped in (13_000, 14_000) and f"interrupted at step {stopped}" in done.stderr
    assert run_cli(["train", "--resume", run_dir]) == 0
    jax.tree.map(np.testing.assert_array_equal, final_params(run_dir), final_params(reference))


# ------------------------------------------------------------ unwritable and full run directories


def test_run_directory_that_cannot_be_created(tmp_path, capsys):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    config = write_config(tmp_path, output_dir=str(blocker))
    assert run_cli(["train", config]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rl: error: cannot create run directory") and err.count("\n") == 1


@pytest.mark.skipif(
    not Path("/dev/full").exists(), reason="needs /dev/full (Linux) to simulate a full disk"
)
def test_full_disk_is_one_clear_line(tmp_path, tmp_path_factory, capsys, monkeypatch):
    import rl.run.run_files

    run_dir = tmp_path / "copy"
    shutil.copytree(trained_run(tmp_path_factory), run_dir)
    (
        run_dir / "summary.json"
    ).unlink()  # not complete: --resume goes on (a complete run is left alone)
    # metrics.jsonl opened onto /dev/full (every write: ENOSPC); a link to it in the run directory
    # is refused (tests/security)
    opened = rl.run.run_files.open_no_follow
    monkeypatch.setattr(
        rl.run.run_files,
        "open_no_follow",
        lambda path, *args, **kwargs: (
            open("/dev/full", "w")
            if Path(path).name == "metrics.jsonl"
            else opened(path, *args, **kwargs)
        ),
    )
    capsys.readouterr()
    assert run_cli(["train", "--resume", run_dir]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("rl: resuming from checkpoint") and len(lines) == 2
    assert (
        lines[1].startswith("rl: error: cannot write the run directory")
        and "No space left on device" in lines[1]
    )


def test_checkpoint_folder_that_cannot_be_written(tmp_path, tmp_path_factory, capsys):
    run_dir = tmp_path / "copy"
    shutil.copytree(trained_run(tmp_path_factory), run_dir)
    (
        run_dir / "summary.json"
    ).unlink()  # not complete: --resume goes on (a complete run is left alone)
    shutil.rmtree(run_dir / "checkpoints")
    (run_dir / "checkpoints").write_text("in the way")
    capsys.readouterr()
    assert run_cli(["train", "--resume", run_dir]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rl: error: cannot write the run directory") and err.count("\n") == 1
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--resume", "/nonexistent/run"], "does not exist"),
        (
            ["CONFIG", "--resume", "RUN"],
            "continues a run with the config saved in it, so drop the config file ",
        ),
        (
            ["--resume", "RUN", "agent.total_steps=40000"],
            "so drop the override agent.total_steps=40000 (to train with another config, "
            "start a new run: rl train CONFIG ...)",
        ),
        (
            ["--resume", "RUN", "agent.lr=0.1", "--seeds", "3"],
            "so drop the override agent.lr=0.1 and --seeds (",
        ),
        ([], "needs a config file"),
    ],
)
def test_resume_bad_input(tmp_path_factory, capsys, args, message):
    run_dir = trained_run(tmp_path_factory)
    args = [
        str(run_dir / "config.yaml") if a == "CONFIG" else str(run_dir) if a == "RUN" else a
        for a in args
    ]
    assert run_cli(["train", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rl: error:") and message in err and err.count("\n") == 1


DOUBLE_CTRL_C = """
import os, signal, sys, time
import numpy as np
from rl.run import logging as rl_logging
from rl.cli.main import main
from rl.run.interrupts import COALESCE_SECONDS

def send(values):
    step = int(np.max(values["step"]))
    if step in (6000, 7000):  # both inside the chunk of log points 5..8
        os.kill(os.getpid(), signal.SIGINT)
        # past the window in which a second signal is the first one's copy (GNU timeout's)
        time.sleep(COALESCE_SECONDS + 0.2)

with rl_logging.sink(send):
    sys.exit(main(sys.argv[1:]))
"""


def test_second_ctrl_c_stops_at_once_keeping_the_checkpoints_written(tmp_path, tmp_path_factory):
    import subprocess

    from run_helpers import REPO, subprocess_env

    reference = trained_run(tmp_path_factory)
    config = write_config(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", DOUBLE_CTRL_C, "train", str(config), "--name", "twice"],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 130, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    run_dir = tmp_path / "runs" / "twice"
    assert (
        f"interrupted without saving; last checkpoint: {run_dir / 'checkpoints' / '4000'}"
        in done.stderr
    )
    assert Checkpoints(run_dir, read_only=True).steps() == [4000]
    assert run_cli(["train", "--resume", run_dir]) == 0
    jax.tree.map(np.testing.assert_array_equal, final_params(run_dir), final_params(reference))
