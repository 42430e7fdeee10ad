"""Train many seeds (and a grid of hyperparameter settings) of one config in one compiled program,
and write the run directory.

    from rl.config import load_config
    from rl.train import train_many
    config = load_config("configs/qlearning_gridworld.yaml", ["run.seeds=30"])
    final_state, metrics = train_many(config)       # leading axes: [settings, seeds, ...]

Run directory (`run_training`): `config.yaml` (the resolved config and sweep grid), `metrics.jsonl`
(one row per setting, seed and log point), `final_params.msgpack` (flax serialisation of the final
params, leading axes [settings, seeds]) and `summary.json` (what the CLI prints).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import yaml

from rl.agents import get_agent_module
from rl.config import Config, hyperparams
from rl.logging import ProgressBar, sink


def apply_kernel_backend(config: Config) -> None:
    """Make the config's kernel backend the process default (`auto` leaves the automatic choice)."""
    if config.kernels.backend != "auto":
        import kernels

        kernels.set_backend(config.kernels.backend)


def seed_keys(config: Config) -> jax.Array:
    """PRNGKey(seed + i) for each of the run's seeds: seed i trains exactly as it would alone."""
    return jnp.stack([jax.random.PRNGKey(config.run.seed + i) for i in range(config.run.seeds)])


def stacked_hyperparams(config: Config, grid: list[dict]) -> dict:
    """The sweepable hyperparameters for each setting of the grid, stacked: {name: float32[settings]}."""
    base = hyperparams(config.agent)
    return {name: jnp.asarray([setting.get(name, float(value)) for setting in grid], jnp.float32) for name, value in base.items()}


def build_program(config: Config, grid: list[dict] | None = None):
    """(jitted program, keys, hparams): program(keys, hparams) trains settings x seeds at once."""
    grid = grid or [{}]
    train = get_agent_module(config.agent.name).make_train(config)
    over_seeds = jax.vmap(train, in_axes=(0, None))
    program = jax.jit(jax.vmap(over_seeds, in_axes=(None, 0)))
    return program, seed_keys(config), stacked_hyperparams(config, grid)


def train_many(config: Config, grid: list[dict] | None = None):
    """Train every seed of every setting; outputs have leading axes [settings, seeds]."""
    apply_kernel_backend(config)
    program, keys, hparams = build_program(config, grid)
    return program(keys, hparams)


def final_returns(metrics: dict) -> np.ndarray:
    """Per instance, the last finite `episode_return` over the log points (NaN if none is finite)."""
    returns = np.asarray(metrics["episode_return"], np.float64)
    finite = np.isfinite(returns)
    last = np.where(finite.any(-1), returns.shape[-1] - 1 - np.argmax(finite[..., ::-1], axis=-1), 0)
    picked = np.take_along_axis(returns, last[..., None], axis=-1)[..., 0]
    return np.where(finite.any(-1), picked, np.nan)


def write_metrics_jsonl(path: Path, metrics: dict, grid: list[dict]) -> None:
    """One JSON object per (setting, seed, log point) with every scalar metric."""
    arrays = {k: np.asarray(v) for k, v in metrics.items()}
    num_settings, num_seeds, num_points = arrays["step"].shape[:3]
    with open(path, "w") as f:
        for s in range(num_settings):
            for seed in range(num_seeds):
                for t in range(num_points):
                    row = {"setting": s, "seed": seed}
                    row.update({k: _json_number(v[s, seed, t]) for k, v in arrays.items() if v.ndim == 3})
                    f.write(json.dumps(row) + "\n")


def _json_number(value):
    value = value.item()
    return None if isinstance(value, float) and not math.isfinite(value) else value


def summarise(config: Config, grid: list[dict], metrics: dict, compile_seconds: float, train_seconds: float) -> dict:
    finals = final_returns(metrics)
    total_steps = config.agent.total_steps * config.run.seeds * len(grid)
    settings = []
    for s, setting in enumerate(grid):
        values = finals[s]
        finite = values[np.isfinite(values)]
        settings.append(
            {
                "hyperparams": setting,
                "seeds": int(values.size),
                "final_return_mean": float(finite.mean()) if finite.size else float("nan"),
                "final_return_std": float(finite.std()) if finite.size else float("nan"),
                "final_return_median": float(np.median(finite)) if finite.size else float("nan"),
                "final_returns": [None if not math.isfinite(v) else float(v) for v in values],
            }
        )
    return {
        "agent": config.agent.name,
        "env": config.env.id,
        "compile_seconds": compile_seconds,
        "train_seconds": train_seconds,
        "env_steps_per_second": total_steps / train_seconds if train_seconds > 0 else float("nan"),
        "settings": settings,
    }


def run_training(config: Config, grid: list[dict], run_dir: Path) -> dict:
    """Compile, train and write the run directory (see the module docstring); returns the summary."""
    from flax import serialization

    run_dir = Path(run_dir)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({**config.to_dict(), "sweep": grid}, sort_keys=False))
    apply_kernel_backend(config)
    program, keys, hparams = build_program(config, grid)
    start = time.perf_counter()
    compiled = program.lower(keys, hparams).compile()
    compile_seconds = time.perf_counter() - start
    bar = ProgressBar(config.agent.total_steps, label=f"{config.agent.name}/{config.env.id}") if config.run.progress else None
    start = time.perf_counter()
    if bar is not None:
        with sink(bar):
            final_state, metrics = jax.block_until_ready(compiled(keys, hparams))
        bar.close()
    else:
        final_state, metrics = jax.block_until_ready(compiled(keys, hparams))
    train_seconds = time.perf_counter() - start
    write_metrics_jsonl(run_dir / "metrics.jsonl", metrics, grid)
    (run_dir / "final_params.msgpack").write_bytes(serialization.msgpack_serialize(jax.device_get(final_state["params"])))
    summary = summarise(config, grid, metrics, compile_seconds, train_seconds)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
