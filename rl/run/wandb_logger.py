"""Weights & Biases logging, an optional sink beside the run directory's files and TensorBoard
(`WandbLogger`; needs the `wandb` extra).

    run: {wandb: {project: my-project, entity: my-team, mode: online}}   # or offline, disabled
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np

from rl.run.logging import run_batch


def wandb_run_id(group: str, setting: int, seed: int) -> str:
    """A W&B run id for one setting and seed of a run (W&B ids allow letters, digits, - and _)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", f"{group}-setting{setting}-seed{seed}")


def scalar_row(values: dict, setting: int, seed: int) -> dict:
    """The finite scalar metrics of one instance of a log point ([settings, seeds] arrays), as
    floats."""
    row = {}
    for name, array in values.items():
        array = np.asarray(array)
        if name == "step" or array.ndim != 2:
            continue
        value = float(array[setting, seed])
        if math.isfinite(value):
            row[name] = value
    return row


class WandbLogger:
    """A sink (see rl.run.logging) logging each log point to one W&B run per (setting, seed), all
    in the W&B group named after the run directory, each carrying the resolved config, the
    setting's hyperparameters and the seed. Runs are created at the first log point and log every
    scalar metric at its env step; their ids derive from the run directory, so a resumed run
    continues them. Files go to `RUN_DIR/wandb/`; WANDB_MODE, when set, overrides `mode`. The
    `wandb` extra is checked when the config is loaded (`rl.config.WandbConfig.validate`)."""

    def __init__(
        self, wandb_config, run_dir, config_dict: dict, grid: list[dict], resume: bool = False
    ):
        self.settings = wandb_config
        self.run_dir = Path(run_dir)
        self.group = self.run_dir.name
        self.config_dict = config_dict
        self.grid = grid
        self.resume = resume
        self.runs: dict = {}

    def _run(self, setting: int, seed: int):
        key = (setting, seed)
        if key not in self.runs:
            import wandb

            folder = self.run_dir / "wandb"
            folder.mkdir(exist_ok=True)
            self.runs[key] = wandb.init(
                project=self.settings.project,
                entity=self.settings.entity,
                mode=os.environ.get("WANDB_MODE") or self.settings.mode,
                group=self.group,
                job_type=f"setting_{setting}",
                name=f"{self.group}/setting_{setting}/seed_{seed}",
                id=wandb_run_id(self.group, setting, seed),
                resume="allow" if self.resume else None,
                dir=str(self.run_dir),
                config={
                    **self.config_dict,
                    "setting": setting,
                    "hyperparams": self.grid[setting],
                    "seed": seed,
                },
                reinit="create_new",
            )
        return self.runs[key]

    def __call__(self, values: dict) -> None:
        values = run_batch(values)
        if values is None:  # not a run's batch
            return
        step = np.asarray(values["step"])
        for setting in range(step.shape[0]):
            for seed in range(step.shape[1]):
                self._run(setting, seed).log(
                    scalar_row(values, setting, seed), step=int(step[setting, seed])
                )

    def close(self) -> None:
        for run in self.runs.values():
            run.finish()
        self.runs = {}
