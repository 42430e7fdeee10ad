"""A run's summary (`summary.json`, what `rl train` prints at the end): per sweep setting, the
final value of one metric across seeds, with its spread and per-seed values.

The metric is the greedy evaluation return where the agent measures one, else the return of the
(exploratory) training episodes (`SUMMARY_METRICS`). A seed's final value is the metric at the
last log point where it is finite.
"""

from __future__ import annotations

import math
import os

import numpy as np

from rl.config import Config
from rl.core.environment import kernel_precision

# What the end-of-run summary reports, best first.
SUMMARY_METRICS = {
    "eval_return": (
        "greedy-policy return on separate eval episodes, at the last log point that has one"
    ),
    "episode_return": (
        "return of the training (exploratory) episodes that ended, at the last log point that "
        "has one"
    ),
}


def summary_metric(metrics: dict) -> str:
    """`eval_return` when the agent logged a finite one, else `episode_return`."""
    evals = metrics.get("eval_return")
    if evals is not None and np.isfinite(np.asarray(evals, np.float64)).any():
        return "eval_return"
    return "episode_return"


def final_values(metrics: dict, name: str) -> np.ndarray:
    """Per instance, the last finite value of metric `name` over the log points (NaN if none is
    finite)."""
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


def setting_label(setting: dict) -> str:
    """`lr=0.001, gamma=0.99` for a sweep setting; "" for a run without a sweep."""
    return ", ".join(f"{k}={v}" for k, v in setting.items())


def process_seconds() -> float | None:
    """Seconds since this process started (Linux: /proc/self/stat and /proc/uptime), or None where
    that cannot be read."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            # the fields after the command name (which may hold spaces) in parentheses
            fields = stat.read().rsplit(")", 1)[1].split()
            started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
            return float(uptime.read().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return None


def summarise(
    config: Config,
    grid: list[dict],
    metrics: dict,
    compile_seconds: float,
    train_seconds: float,
    steps_trained: int | None = None,
    programs_from_cache: bool = False,
    process_start: float | None = None,
) -> dict:
    """The run's summary (summary.json): per setting, the final value of `metric` (see
    SUMMARY_METRICS) across seeds, with its spread and per-seed values, and the times: the
    process's so far (`process_seconds`, from `process_start`, its age when the run began to
    compile), of the compile (or of loading the programs from the compilation cache, when
    `programs_from_cache`) and of training.

    `steps_trained`: env steps per seed trained in this process (default: the whole run); when it
    is 0 (a resumed run that was already complete) the speed is None. `kernels_precision` is the
    run's `kernels.precision` and `kernels_dot_precision` the matmul precision it gives the fused
    MLP kernels ("ieee", "tf32" or "bf16": `rl.core.environment.kernel_precision`), where the agent
    runs them."""
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
        "process_seconds": process_seconds(),
        "startup_seconds": process_start,
        "compile_seconds": compile_seconds,
        "programs_from_cache": programs_from_cache,
        "train_seconds": train_seconds,
        "env_steps_trained": int(steps),
        "env_steps_per_second": total_steps / train_seconds
        if train_seconds > 0 and steps > 0
        else None,
        "kernels_precision": config.kernels.precision,
        "kernels_dot_precision": kernel_precision(config),
        "settings": settings,
    }
