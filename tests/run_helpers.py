"""Helpers shared by the run-directory tests (checkpoint, logging, eval, plot, failures, sharding):
a tiny Q-learning config, `rl` invoked in-process or in a subprocess, a run stopped by Ctrl-C,
resumed and evaluated, and comparisons of runs."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

# tests of gymnasium's MuJoCo envs (the brax extra brings MuJoCo too) skip without it
needs_mujoco = pytest.mark.skipif(
    importlib.util.find_spec("mujoco") is None,
    reason='needs MuJoCo: pip install "gymnasium[mujoco]"',
)

# XLA's own defaults of the options tests/conftest.py changes, as a jit's compiler_options: the
# suite compiles at level 0 (on a CPU-only machine also without the CPU fusion emitters); a test
# whose two programs must agree in the last bit compiles both with this (at level 0 two loop shapes
# of one computation may round differently). FUSION_EMITTERS alone: the CPU fusion emitters where
# tests/conftest.py turned them off (they compute one expression to the same bits in every fusion,
# the older emitters may not), else nothing (a jaxlib that does not know the option rejects it).
FUSION_EMITTERS = (
    {"xla_cpu_use_fusion_emitters": True}
    if "--xla_cpu_use_fusion_emitters=false" in os.environ.get("XLA_FLAGS", "")
    else {}
)
XLA_DEFAULT_OPTIMIZATION = {"xla_backend_optimization_level": 3, **FUSION_EMITTERS}

# 20 log points of 1000 steps; checkpoints every 4 log points (at steps 4000, 8000, ...).
TINY = {
    "env": {"id": "GridWorld", "params": {"size": 5, "max_steps_in_episode": 50}},
    "agent": {
        "name": "qlearning",
        "total_steps": 20_000,
        "log_interval": 1_000,
        "epsilon_decay_steps": 10_000,
    },
    "run": {"seed": 0, "seeds": 2, "checkpoint_every": 4, "progress": False},
}


# Tiny configs of the neural agents (replay buffers, optimiser states, target networks,
# normalisers).
NEURAL = {
    "dqn": {
        "env": {"id": "CartPole-v1"},
        "agent": {
            "name": "dqn",
            "total_steps": 1024,
            "log_interval": 256,
            "learning_starts": 256,
            "buffer_size": 1000,
            "train_freq": 64,
            "gradient_steps": 4,
            "batch_size": 16,
            "network": {"hidden": [16]},
            "eval_episodes": 2,
        },
    },
    "rainbow": {
        "env": {"id": "CartPole-v1"},
        "agent": {
            "name": "rainbow",
            "total_steps": 1024,
            "log_interval": 256,
            "learning_starts": 256,
            "buffer_size": 1000,
            "train_freq": 64,
            "gradient_steps": 4,
            "batch_size": 16,
            "network": {"hidden": [16]},
            "eval_episodes": 2,
            "num_atoms": 11,
        },
    },
    "ppo": {
        "env": {"id": "CartPole-v1"},
        "agent": {
            "name": "ppo",
            "total_steps": 1024,
            "num_envs": 2,
            "num_steps": 64,
            "num_epochs": 2,
            "num_minibatches": 2,
            "network": {"hidden": [16]},
            "log_interval": 2,
        },
    },
    "sac": {
        "env": {"id": "Pendulum-v1"},
        "agent": {
            "name": "sac",
            "total_steps": 600,
            "log_interval": 200,
            "learning_starts": 200,
            "buffer_size": 1000,
            "batch_size": 16,
            "network": {"hidden": [16]},
            "eval_episodes": 1,
        },
    },
}


def write_config(folder: Path, data: dict | None = None, **run) -> Path:
    """`folder / "config.yaml"` holding `data` (default TINY) with `run` set in its run section
    (output_dir `folder / "runs"` unless given)."""
    data = json.loads(json.dumps(data or TINY))
    data["run"].update(run)
    data["run"].setdefault("output_dir", str(folder / "runs"))
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_here(folder: Path) -> dict:
    """`write_config`'s run keys for a run directory `folder / "run"`."""
    return {"output_dir": str(folder), "name": "run"}


def trained_on(tmp_path: Path, monkeypatch, data: dict, backend: str, then: str) -> Path:
    """The run directory of `data` trained (a checkpoint every log point) in `tmp_path / "run"`
    with FUSEDRL_KERNEL_BACKEND=`backend`, which is `then` afterwards (for the evaluation)."""
    path = write_config(tmp_path, data, checkpoint_every=1, progress=False, **run_here(tmp_path))
    monkeypatch.setenv("FUSEDRL_KERNEL_BACKEND", backend)
    assert run_cli(["train", path]) == 0
    monkeypatch.setenv("FUSEDRL_KERNEL_BACKEND", then)
    return tmp_path / "run"


def printed_returns(out: str) -> list[str]:
    """The mean returns `rl eval` printed, one per setting and call, as printed."""
    return [line.split(" +- ")[0] for line in out.splitlines() if " +- " in line]


def run_cli(args: list[str], capsys=None) -> int:
    """`rl ARGS` in this process (the interface `rl.cli.main.main` keeps for tests)."""
    from rl.cli.main import main

    return main([str(a) for a in args])


def subprocess_env(**extra) -> dict:
    """This process's environment with the repo on the path and `extra` set. An XLA_FLAGS of
    `extra` adds to the inherited flags (the tests' own, tests/conftest.py), so a subprocess
    compiles as the tests do."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    # Triton 3.9 warns on stderr at import while this is unset; tests that read a subprocess's
    # stderr line by line want only the run's own lines (1: Triton's current default)
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    if "XLA_FLAGS" in extra:
        extra["XLA_FLAGS"] = " ".join(
            f for f in (env.get("XLA_FLAGS", ""), extra["XLA_FLAGS"]) if f
        )
    env.update(extra)
    return env


def interrupted_resumed_and_evaluated(folder: Path, data: dict, capsys) -> tuple[list, dict]:
    """`rl train` of the config `data` as run `folder`/demo, stopped by a SIGINT (Ctrl-C) once its
    second log point is written (exit 130, naming --resume), resumed to its end with `rl train
    --resume`, then `rl eval --episodes 2` of it: (the run's metrics.jsonl rows, eval's setting)."""
    data = json.loads(json.dumps(data))
    data["run"].update(output_dir=str(folder), name="demo", progress=False, checkpoint_every=100)
    path, run_dir = folder / "config.yaml", folder / "demo"
    path.write_text(yaml.safe_dump(data))

    def interrupt_at_the_second_log_point():
        metrics = run_dir / "metrics.jsonl"
        while not metrics.is_file() or len(metrics.read_text().splitlines()) < 2:
            time.sleep(0.02)
        signal.raise_signal(signal.SIGINT)

    threading.Thread(target=interrupt_at_the_second_log_point, daemon=True).start()
    assert run_cli(["train", path]) == 130
    assert "--resume" in capsys.readouterr().err
    assert run_cli(["train", "--resume", run_dir]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    out = folder / "eval.json"
    assert run_cli(["eval", run_dir, "--episodes", "2", "--json", out]) == 0
    (setting,) = json.loads(out.read_text())["settings"]
    return rows, setting


# A subprocess running `rl` that signals itself when a log point reaches step `signal_at` (once):
# deterministic "Ctrl-C / kill -9 in the middle of a chunk".
SIGNAL_SELF = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    from rl.run import logging as rl_logging
    from rl.cli.main import main

    signal_at, signal_name, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    sent = []

    def send(values):
        if not sent and int(np.max(values["step"])) >= signal_at:
            sent.append(True)
            os.kill(os.getpid(), getattr(signal, signal_name))

    with rl_logging.sink(send):
        code = main(args)
    sys.exit(code)
    """
)


def run_signalled(
    args: list[str], signal_at: int, signal_name: str, timeout: float = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", SIGNAL_SELF, str(signal_at), signal_name, *map(str, args)],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def metric_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl rows without the host timing columns (which differ between runs)."""
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in row.items() if k not in ("steps_per_second", "wall_time")} for row in rows
    ]


def assert_runs_close(
    a: Path, b: Path, *, rtol: float, params_atol: float, metric_atol: float
) -> None:
    """Two run directories: final parameters to (rtol, params_atol); per log point, integer metrics
    (steps, episode counts) identical and float metrics to (rtol, metric_atol)."""
    import jax
    import numpy as np
    import pytest

    jax.tree.map(
        lambda x, y: np.testing.assert_allclose(x, y, rtol=rtol, atol=params_atol),
        final_params(a),
        final_params(b),
    )
    rows_a, rows_b = metric_rows(a), metric_rows(b)
    assert len(rows_a) == len(rows_b)
    for row_a, row_b in zip(rows_a, rows_b):
        assert row_a.keys() == row_b.keys()
        for key, value in row_a.items():
            if isinstance(value, float):
                assert value == pytest.approx(row_b[key], rel=rtol, abs=metric_atol), key
            else:
                assert value == row_b[key], key


def final_params(run_dir: Path):
    from flax import serialization

    return serialization.msgpack_restore((Path(run_dir) / "final_params.msgpack").read_bytes())


_TRAINED: dict = {}


def trained_run(tmp_path_factory) -> Path:
    """One finished tiny run per test session (shared by the logging, eval and plot tests)."""
    if "run" not in _TRAINED:
        folder = tmp_path_factory.mktemp("trained")
        assert run_cli(["train", write_config(folder), "--name", "tiny"]) == 0
        _TRAINED["run"] = folder / "runs" / "tiny"
    return _TRAINED["run"]


def central_differences(f, args, eps: float = 1e-6) -> list:
    """The gradient of the scalar `f(*args)` with respect to each of `args`, by float64 central
    differences: an oracle for an op's gradient that shares nothing with JAX's autodiff or with the
    op's own backward pass (`f` a float64 NumPy function; cost 2 calls of `f` per element)."""
    import numpy as np

    args = [np.array(a, np.float64) for a in args]
    grads = []
    for i, arg in enumerate(args):
        grad = np.zeros_like(arg)
        for index in np.ndindex(arg.shape):
            for sign in (1.0, -1.0):
                shifted = list(args)
                shifted[i] = arg.copy()
                shifted[i][index] += sign * eps
                grad[index] += sign * f(*shifted) / (2 * eps)
        grads.append(grad)
    return grads
