"""What the `rl` commands print: their exit statuses, the one-line error, and the end-of-run
summary of `rl train` (from the run's summary.json, written by `rl.summary.summarise`)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1  # training diverged or the run directory could not be written
EXIT_INTERRUPTED = 130  # Ctrl-C (a checkpoint was saved)

# How the summary names its metric, after the metric's key (none for the others).
METRIC_LABELS = {"eval_return": ", the greedy evaluation return"}


def error(message: str, status: int) -> int:
    """Print `rl: error: message` on stderr; returns `status`."""
    print(f"rl: error: {message}", file=sys.stderr)
    return status


def _fmt(value) -> str:
    return (
        "n/a"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else f"{value:.4g}"
    )


def summary_lines(summary: dict) -> list[str]:
    """The end-of-run summary as printed: timing, then per setting the final value of the metric it
    names (summary["metric"]: the greedy evaluation return `eval_return` where the agent evaluates,
    else the training episodes' `episode_return`) across seeds: mean +- std, median, min and max."""
    rate = summary["env_steps_per_second"]
    speed = (
        f"{rate:,.0f} env steps/s over all seeds"
        if rate is not None
        else "no env steps trained in this process"
    )
    lines = [
        f"compile {summary['compile_seconds']:.2f} s, train {summary['train_seconds']:.2f} s, "
        f"{speed}"
    ]
    metric = summary["metric"]
    label = METRIC_LABELS.get(metric, "")
    lines.append(f"final {metric}{label} ({summary['metric_description']}):")
    for row in summary["settings"]:
        finished = sum(v is not None for v in row["per_seed"])
        seeds = (
            f"{row['seeds']} seeds"
            if finished == row["seeds"]
            else f"{finished} of {row['seeds']} seeds have a value"
        )
        where = f"{row['label']}: " if row["label"] else ""
        lines.append(
            f"  {where}{_fmt(row['mean'])} +- {_fmt(row['std'])} (median {_fmt(row['median'])}, "
            f"min {_fmt(row['min'])}, max {_fmt(row['max'])}; {seeds})"
        )
    return lines


def completed_summary(run_dir: Path) -> dict | None:
    """The saved summary of a run that finished (it wrote final_params.msgpack and summary.json),
    or None."""
    path = Path(run_dir) / "summary.json"
    if not (path.is_file() and (Path(run_dir) / "final_params.msgpack").is_file()):
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def print_complete(summary: dict, run_dir: Path) -> None:
    """What `rl train --resume` prints for a run that is already complete."""
    print(
        f"run {run_dir} is already complete: nothing to resume "
        f"(evaluate it with: rl eval {run_dir})"
    )
    if "metric" in summary:  # summaries written before the metric was named are not repeated
        for line in summary_lines(summary)[1:]:
            print(line)


def print_summary(summary: dict, run_dir: Path) -> None:
    print(f"run directory: {run_dir}")
    for line in summary_lines(summary):
        print(line)
