"""Weights & Biases logging (run.wandb), offline: one W&B run per setting and seed, grouped by the
run directory's name; without the wandb package, one clear error naming the extra."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from run_helpers import REPO, TINY, run_cli, subprocess_env, write_config

pytest.importorskip("wandb")


def test_offline_wandb_logs_one_run_per_setting_and_seed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))  # W&B's own settings and caches stay in tmp
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    data = {
        **TINY,
        "agent": {**TINY["agent"], "total_steps": 4_000},
        "run": {**TINY["run"], "wandb": {"project": "fusedrl-ci", "mode": "online"}},
    }
    config = write_config(tmp_path, data)
    status = run_cli(["train", config, "--name", "wb", "--sweep", "agent.lr=0.1,0.5"])
    assert status == 0, capsys.readouterr().err
    folders = sorted(
        (tmp_path / "runs" / "wb" / "wandb").glob("offline-run-*")
    )  # WANDB_MODE beats mode: online
    ids = sorted(folder.name.split("-", 3)[-1] for folder in folders)
    assert ids == [f"wb-setting{s}-seed{i}" for s in range(2) for i in range(2)]
    for folder in folders:
        (record,) = folder.glob("run-*.wandb")
        data = record.read_bytes()
        assert b"episode_return" in data and b"fusedrl-ci" in data and b"wb/setting_" in data


def test_scalar_row_keeps_finite_scalars_of_one_instance():
    from rl.run.wandb_logger import scalar_row, wandb_run_id

    values = {
        "step": np.array([[10, 10]]),
        "loss": np.array([[0.5, np.nan]]),
        "hist": np.zeros((1, 2, 3)),
    }
    assert scalar_row(values, 0, 0) == {"loss": 0.5}
    assert scalar_row(values, 0, 1) == {}
    assert wandb_run_id("ppo-CartPole v1", 1, 2) == "ppo-CartPole-v1-setting1-seed2"


# `rl train` as on a machine without wandb: find_spec (what the config check asks) finds no wandb.
WITHOUT_WANDB = """
import importlib.util
import sys


real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a, **k: None if name == "wandb" else real(name, *a, **k)
from rl.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_wandb_without_the_package_is_one_error_naming_the_extra(tmp_path):
    config = write_config(tmp_path, {**TINY, "run": {**TINY["run"], "wandb": {"project": "p"}}})
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_WANDB, "train", str(config), "--name", "nowb"],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    message = (
        "rl: error: run.wandb: logging to Weights & Biases needs the wandb package: "
        "pip install 'fusedrl[wandb]'\n"
    )
    assert done.stderr == message
    assert not (tmp_path / "runs" / "nowb").exists()
