"""A run directory: the files `rl train` writes into it, and reading them back (`rl eval`,
`rl train --resume`).

    config.yaml             the resolved config and the sweep grid (`sweep`: a list of settings)
    metrics.jsonl           one row per setting, seed and log point (and metrics.csv; both
                            streamed while training by rl.logging.RunLogger)
    tensorboard/setting_<s>/seed_<i>/    event files
    checkpoints/<step>/     the whole training state every `run.checkpoint_every` log points
                            (rl.checkpoint)
    final_params.msgpack    flax serialisation of the final params, leading axes [settings, seeds]
    summary.json            what the CLI prints at the end (rl.summary)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import numpy as np
import yaml
from flax import serialization

from rl.checkpoint import Checkpoints, abstract_like
from rl.config import Config, build_config
from rl.config_parsing import ConfigError, read_yaml
from rl.distributed import seed_mesh
from rl.programs import make_programs

CONFIG_FILE = "config.yaml"
FINAL_PARAMS_FILE = "final_params.msgpack"
SUMMARY_FILE = "summary.json"


def write_run_config(run_dir: Path, config: Config, grid: list[dict]) -> None:
    """`config.yaml`: the resolved config with the sweep grid under `sweep`."""
    (Path(run_dir) / CONFIG_FILE).write_text(
        yaml.safe_dump({**config.to_dict(), "sweep": grid}, sort_keys=False)
    )


def load_run_config(run_dir) -> tuple[Config, list[dict]]:
    """The resolved config and sweep grid a run directory was trained with (ConfigError if
    missing)."""
    path = Path(run_dir) / CONFIG_FILE
    if not Path(run_dir).is_dir():
        raise ConfigError(f"run directory {str(run_dir)!r} does not exist")
    if not path.is_file():
        raise ConfigError(f"{str(path)!r} does not exist: is {str(run_dir)!r} a run directory?")
    data = read_yaml(path)
    grid = data.pop("sweep", None) or [{}]
    return build_config(data), [dict(setting) for setting in grid]


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


def write_final(run_dir: Path, params, summary: dict) -> None:
    """`final_params.msgpack` (the host params, leading axes [settings, seeds]) and
    `summary.json`."""
    run_dir = Path(run_dir)
    (run_dir / FINAL_PARAMS_FILE).write_bytes(serialization.msgpack_serialize(params))
    (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))


def load_params(run_dir, config: Config, grid: list[dict], checkpoint: int | None = None):
    """(params with leading axes [settings, seeds], description of where they came from): from
    `final_params.msgpack`, or from the checkpoint at env step `checkpoint`, or (a run that was
    stopped before the end) from the newest checkpoint. ConfigError when there are none."""
    run_dir = Path(run_dir)
    mesh = seed_mesh(jax.devices()[:1])
    _, init, _, keys, hparams = make_programs(config, grid, mesh)
    abstract_state = abstract_like(
        jax.eval_shape(init, keys, hparams), jax.sharding.SingleDeviceSharding(jax.devices()[0])
    )
    final = run_dir / FINAL_PARAMS_FILE
    if checkpoint is None and final.is_file():
        target = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), abstract_state.params)
        return serialization.from_bytes(target, final.read_bytes()), str(final)
    checkpoints = Checkpoints(run_dir, read_only=True)
    steps = checkpoints.steps()
    if checkpoint is None:
        restored = checkpoints.restore_latest(abstract_state, with_history=False)
        if restored is None:
            raise ConfigError(f"{str(run_dir)!r} has neither final_params.msgpack nor a checkpoint")
        step, state, _, _ = restored
    else:
        if checkpoint not in steps:
            raise ConfigError(
                f"--checkpoint {checkpoint}: no such checkpoint in "
                f"{str(checkpoints.directory)!r}; available steps: "
                f"{', '.join(map(str, steps)) or 'none'}"
            )
        step = checkpoint
        state, _, _ = checkpoints.restore(step, abstract_state, with_history=False)
    return state.params, str(checkpoints.directory / str(step))
