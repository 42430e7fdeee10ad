"""Learning curves of run directories as a PNG (`plot_runs`), and the figures of `rl compare`
(`plot_comparison`), drawn with matplotlib's Agg backend (no display needed).

    rl plot RUN_DIR [RUN_DIR ...] [-o curve.png] [--metric eval_return]
"""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path

import numpy as np

from rl.cli import evaluation
from rl.config.parsing import ConfigError
from rl.run.run_files import write_atomic

INTERVAL = (25.0, 75.0)


def default_metric(runs: list[list[dict]]) -> str:
    """The metric the summary of every run in `runs` (each a list of metrics rows) reports:
    `eval_return` (the greedy evaluation return) if each run logged at least one finite value of
    it, else `episode_return` (the training episodes')."""
    has_eval = [any(row.get("eval_return") is not None for row in rows) for rows in runs]
    return "eval_return" if runs and all(has_eval) else "episode_return"


def read_metrics(run_dir, warn=None) -> list[dict]:
    """The rows of `RUN_DIR/metrics.jsonl`. Lines that are not a JSON object (a line cut short by a
    full disk, or edited) are skipped and reported in one `warn` call; ConfigError if the file is
    missing or no line can be read."""
    from rl.run.run_files import check_inside

    path = Path(run_dir) / "metrics.jsonl"
    if not Path(run_dir).is_dir():
        raise ConfigError(f"run directory {str(run_dir)!r} does not exist")
    check_inside(run_dir, path, "the run's metrics")
    if not path.is_file():
        raise ConfigError(f"{str(path)!r} does not exist: is {str(run_dir)!r} a run directory?")
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as err:
        raise ConfigError(f"{str(path)!r} cannot be read: {err.strerror or err}") from None
    rows, bad = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if _is_row(row):
            rows.append(row)
        else:
            bad.append(number)
    if bad and not rows:
        raise ConfigError(f"{str(path)!r} cannot be read: no line is a metrics row")
    if bad and warn is not None:
        warn(
            f"{path}: {len(bad)} line{'s' if len(bad) > 1 else ''} cannot be read and "
            f"{'are' if len(bad) > 1 else 'is'} skipped (line {', '.join(map(str, bad[:5]))}"
            f"{', ...' if len(bad) > 5 else ''})"
        )
    return rows


def _is_row(row) -> bool:
    """Whether a parsed metrics.jsonl line is a row rl train writes: integer `seed` and `setting`,
    a number `step`, and every other value a number or null."""
    if not isinstance(row, dict) or "seed" not in row or "step" not in row:
        return False
    integer = lambda v: isinstance(v, int) and not isinstance(v, bool)
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    return (
        integer(row["seed"])
        and integer(row.get("setting", 0))
        and number(row["step"])
        and all(number(v) or v is None for v in row.values())
    )


def curves(rows: list[dict], metric: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """{setting: (steps [T], values [seeds, T])} from metrics rows (NaN where a value is
    missing)."""
    if rows and metric not in rows[0]:
        known = sorted(k for k in rows[0] if k not in ("setting", "seed", "log_point"))
        raise ConfigError(
            f"--metric: no metric {metric!r} in the run; known metrics: {', '.join(known)}"
        )
    by_setting: dict[int, dict] = {}
    for row in rows:
        point = row.get("log_point")
        point = point if point is not None else row["step"]
        table = by_setting.setdefault(row.get("setting", 0), {})
        table[(row["seed"], point)] = (row["step"], row.get(metric))
    result = {}
    for setting, table in sorted(by_setting.items()):
        seeds = sorted({seed for seed, _ in table})
        points = sorted({point for _, point in table})
        values = np.full((len(seeds), len(points)), np.nan)
        steps = np.zeros(len(points))
        for (seed, point), (step, value) in table.items():
            j = points.index(point)
            steps[j] = max(steps[j], step)
            if value is not None:
                values[seeds.index(seed), j] = value
        result[setting] = (steps, values)
    return result


def _setting_labels(run_dir) -> list[str]:
    """Labels of a run's sweep settings from its config.yaml ("" for a run without a sweep)."""
    from rl.config.parsing import read_yaml
    from rl.run.run_files import check_inside

    try:
        saved = read_yaml(check_inside(run_dir, Path(run_dir) / "config.yaml", "the run's config"))
    except ConfigError:
        return []
    grid = saved.get("sweep") or [{}]
    if not isinstance(grid, list) or not all(isinstance(setting, dict) for setting in grid):
        return []
    return [", ".join(f"{k}={v}" for k, v in setting.items()) for setting in grid]


def _plain_text(label: str) -> str:
    """`label` shown as it is by matplotlib: a `$` would start mathtext (and a stray one stops the
    plot), control characters are dropped."""
    return "".join(c for c in label if c.isprintable()).replace("$", r"\$")


def plot_runs(run_dirs, output=None, metric: str | None = None, warn=None) -> Path:
    """Draw the curves of `metric` (default: `default_metric`) of every run into `output`; returns
    its path. One line per run, or per sweep setting of a run: the median over seeds of `metric`
    against env steps, the band between the 25th and 75th percentiles over seeds shaded; a seed's
    NaN log points (no episode ended) are left out of its statistics. Unreadable metrics lines are
    reported to `warn`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [read_metrics(run_dir, warn) for run_dir in run_dirs]
    metric = metric or default_metric(runs)
    data = [(Path(run_dir), curves(rows, metric)) for run_dir, rows in zip(run_dirs, runs)]
    output = Path(output) if output is not None else Path(run_dirs[0]) / "learning_curve.png"
    if output.suffix.lower() != ".png":
        raise ConfigError(f"-o: expected a .png file name, got {str(output)!r}")
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=110)
    for run_dir, settings in data:
        labels = _setting_labels(run_dir)
        for setting, (steps, values) in settings.items():
            with warnings.catch_warnings():  # all-NaN log points (no episode ended yet) stay NaN
                warnings.simplefilter("ignore", RuntimeWarning)
                median = np.nanmedian(values, axis=0)
                low, high = np.nanpercentile(values, INTERVAL, axis=0)
            label = run_dir.name
            if setting < len(labels) and labels[setting]:
                label += f" [{labels[setting]}]"
            label += f" ({values.shape[0]} seed{'s' if values.shape[0] != 1 else ''})"
            (line,) = axes.plot(steps, median, label=_plain_text(label))
            axes.fill_between(steps, low, high, color=line.get_color(), alpha=0.25, linewidth=0)
    axes.set_xlabel("env steps per seed")
    axes.set_ylabel(_plain_text(metric))
    band = f"{INTERVAL[0]:g}-{INTERVAL[1]:g}th percentile band"
    axes.set_title(f"{_plain_text(metric)}: median over seeds, {band}")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    image = io.BytesIO()
    try:
        figure.savefig(image, format="png")
    finally:
        plt.close(figure)
    # a new file renamed into place: a link planted at the name is replaced, not written through
    write_atomic(output, image.getvalue())
    return output


# ---------------------------------------------------------------- rl compare's figures

CURVE_REPS = 5_000  # resamples of each band point
PROFILE_POINTS = 101

AGGREGATE_TITLES = {
    "iqm": "IQM",
    "median": "median of env means",
    "run_median": "median of runs",
    "mean": "mean",
    "optimality_gap": "optimality gap",
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(figure, path: Path) -> Path:
    import matplotlib.pyplot as plt

    try:
        figure.tight_layout()
        figure.savefig(path, format="png")
    finally:
        plt.close(figure)
    return path


def plot_comparison(
    folder,
    score_label: str,
    intervals: dict,
    profiles: dict,
    iqm_curves: dict,
    reps: int,
    band_reps: int,
) -> list[Path]:
    """`rl compare --plot FOLDER` (rl.cli.compare): three PNGs in `folder` (created if missing).

    `aggregates.png`: per aggregate (a panel each), each group's point estimate and interval, from
    `intervals` {group: {aggregate: rl.cli.evaluation.Interval}}. `profile.png`: each group's
    performance profile (fraction of runs scoring above tau, with its band), from `profiles`
    {group: rl.cli.evaluation.Profile}. `iqm_curve.png`: each group's IQM against env steps with its
    band, from `iqm_curves` {group: (steps, iqm, low, high)}. `score_label` names the score on the
    axes; `reps` and `band_reps`, the resamples of the intervals and of the bands, go in the titles.
    Returns the paths written."""
    plt = _pyplot()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    groups = list(intervals) or list(iqm_curves)
    colors = {g: f"C{i % 10}" for i, g in enumerate(dict.fromkeys(groups + list(iqm_curves)))}
    written = []

    names = list(next(iter(intervals.values()))) if intervals else []
    figure, axes = plt.subplots(
        1,
        max(1, len(names)),
        figsize=(3.2 * max(1, len(names)), 0.6 * len(groups) + 1.8),
        dpi=110,
        squeeze=False,
    )
    for ax, name in zip(axes[0], names):
        for row, group in enumerate(groups):
            interval = intervals[group][name]
            ax.barh(
                row,
                interval.high - interval.low,
                left=interval.low,
                height=0.6,
                color=colors[group],
                alpha=0.45,
                label=group,
            )
            ax.plot([interval.point] * 2, [row - 0.3, row + 0.3], color="black", linewidth=1.5)
        ax.set_yticks(range(len(groups)))
        ax.set_yticklabels(groups if ax is axes[0][0] else [""] * len(groups), fontsize=8)
        ax.invert_yaxis()
        ends = [v for group in groups for v in intervals[group][name]]
        pad = 0.08 * ((max(ends) - min(ends)) or abs(max(ends)) or 1.0)
        ax.set_xlim(min(ends) - pad, max(ends) + pad)  # a zero-width interval stays in view
        ax.set_title(AGGREGATE_TITLES.get(name, name), fontsize=10)
        ax.set_xlabel(score_label, fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="best")
    figure.suptitle(
        f"95% stratified-bootstrap intervals ({reps:,} resamples); bar: interval, line: estimate",
        fontsize=9,
    )
    written.append(_save(figure, folder / "aggregates.png"))

    figure, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for group, profile in profiles.items():
        ax.plot(profile.taus, profile.fraction, color=colors[group], label=group)
        ax.fill_between(
            profile.taus, profile.low, profile.high, color=colors[group], alpha=0.25, linewidth=0
        )
    ax.set_xlabel(f"{score_label} (tau)")
    ax.set_ylabel("fraction of runs with score > tau")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"performance profile with 95% bands ({band_reps:,} resamples)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    written.append(_save(figure, folder / "profile.png"))

    figure, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for group, (steps, iqm, low, high) in iqm_curves.items():
        ax.plot(steps, iqm, color=colors[group], label=group)
        ax.fill_between(steps, low, high, color=colors[group], alpha=0.25, linewidth=0)
    ax.set_xlabel("env steps per run")
    ax.set_ylabel(f"IQM of {score_label}")
    ax.set_title(f"IQM over runs with its 95% band ({band_reps:,} resamples)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    written.append(_save(figure, folder / "iqm_curve.png"))
    return written


def iqm_curves(result, reps: int, seed: int) -> dict:
    """{group: (steps [T], iqm [T], low [T], high [T])} over the log points every unit of the
    group has (normalised like the scores; NaN runs left out at each point)."""
    out = {}
    for group in result.groups:
        steps = sorted(set.intersection(*(set(u.steps.tolist()) for u in group.units)))
        rows = []
        for step in steps:
            tasks: dict[str, list] = {}
            for unit in group.units:
                values = unit.values[:, int(np.flatnonzero(unit.steps == step)[0])]
                if result.bounds is not None:
                    low, high = result.bounds[unit.env]
                    values = (values - low) / (high - low)
                tasks.setdefault(unit.env, []).append(values[np.isfinite(values)])
            scores = [np.concatenate(v) for v in tasks.values()]
            if all(s.size for s in scores):
                found = evaluation.bootstrap_intervals(scores, ["iqm"], reps=reps, seed=seed)
                rows.append((step, *found["iqm"]))
        if rows:
            out[group.label] = tuple(np.array(column) for column in zip(*rows))
    return out


def profiles(result, reps: int, seed: int) -> dict:
    """{group: rl.cli.evaluation.Profile} at PROFILE_POINTS thresholds spanning every score."""
    scored = [g for g in result.groups if g.label in result.intervals]
    every = np.concatenate([s for g in scored for s in g.scores.values()] or [np.zeros(1)])
    taus = np.linspace(every.min(), every.max(), PROFILE_POINTS)
    return {
        g.label: evaluation.performance_profile(list(g.scores.values()), taus, reps=reps, seed=seed)
        for g in scored
    }


def comparison_figures(result, folder, reps: int, seed: int) -> list[Path]:
    """`rl compare --plot FOLDER`: `plot_comparison` of the Comparison `result` (rl.cli.compare),
    the intervals from `reps` resamples, the bands from min(reps, CURVE_REPS); returns the paths."""
    few = min(reps, CURVE_REPS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return plot_comparison(
            folder,
            ("normalised " if result.bounds else "") + result.metric,
            result.intervals,
            profiles(result, few, seed),
            iqm_curves(result, few, seed),
            reps=reps,
            band_reps=few,
        )
