"""The tabular family's runs shared by the fault modules (trained once per test process, whichever
module asks first): the Q-learning config, its uninterrupted reference run, a run stopped mid-way,
and the subprocesses' environment with a persistent compilation cache."""

from __future__ import annotations

from pathlib import Path

import pytest
from fault_runs import checkpoint_steps, fault_env, rl, run_injected
from run_helpers import TINY, write_config


@pytest.fixture(scope="session")
def env(tmp_path_factory):
    return fault_env(tmp_path_factory.mktemp("jax-cache"))


@pytest.fixture(scope="session")
def config(tmp_path_factory) -> Path:
    return write_config(tmp_path_factory.mktemp("tabular"), TINY)


@pytest.fixture(scope="session")
def reference(config, env) -> Path:
    done = rl(["train", config, "--name", "reference"], env)
    assert done.returncode == 0, done.stderr
    return config.parent / "runs" / "reference"


@pytest.fixture(scope="session")
def stopped(config, env) -> Path:
    """A run stopped by Ctrl-C at step 13000: checkpoints every 4 log points, and one where it
    stopped (13000, or 14000: the log point queued behind it), each with its files manifest."""
    status, err = run_injected(["train", config, "--name", "stopped"], 13_000, "SIGINT", env)
    assert status == 130, err
    run_dir = config.parent / "runs" / "stopped"
    steps = checkpoint_steps(run_dir)  # the newest 3 are kept
    assert steps[:2] == [8000, 12_000] and steps[2] in (13_000, 14_000), steps
    return run_dir
