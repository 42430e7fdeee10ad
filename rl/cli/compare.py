"""`rl compare`: runs compared the way the field reports learning (Agarwal et al., 2021): the
interquartile mean, the median and the optimality gap of each group of runs with 95%
stratified-bootstrap intervals (rl.cli.evaluation), and the probability that one group's run beats
another's.

    rl compare RUN_DIR [RUN_DIR ...] [--by name|config] [--metric eval_return] [--at STEPS]
               [--normalize LOW,HIGH|REF.yaml] [--plot DIR] [--reps 50000] [--seed 0]
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rl.cli import evaluation
from rl.cli.plot import curves, default_metric, read_metrics
from rl.config.parsing import ConfigError

MIN_RUNS = 3


@dataclass
class Unit:
    """One sweep setting of one run directory: its seeds' values of the metric at each log point."""

    run_dir: Path
    label: str  # the setting's hyperparameters, "" without a sweep
    env: str  # env id, with its params where they differ between the units compared
    env_key: str  # the whole env section (JSON): the task
    config_key: str  # config without run and env sections, the setting merged in (JSON)
    seed: object  # run.seed: the first seed's PRNG seed
    steps: np.ndarray  # [log points]
    values: np.ndarray  # [seeds, log points]


@dataclass
class Group:
    """Runs compared as one: per task (env label), the scores of its runs."""

    label: str
    units: list[Unit]
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)  # where each task's scores were read

    @property
    def runs(self) -> int:
        return sum(s.size for s in self.scores.values())


def _saved_config(run_dir: Path) -> dict:
    import yaml

    path = run_dir / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{str(path)!r} does not exist: is {str(run_dir)!r} a run directory?")
    try:
        return yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{str(path)!r} cannot be read: {err}") from None


def _flat(tree, prefix: str = "") -> dict:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def read_units(run_dirs, metric: str | None, warn) -> tuple[str, list[Unit]]:
    """(the metric compared, one Unit per sweep setting of each run directory)."""
    run_dirs = [Path(d) for d in run_dirs]
    if len({d.resolve() for d in run_dirs}) < len(run_dirs):
        twice = [str(d) for d in run_dirs if sum(e.resolve() == d.resolve() for e in run_dirs) > 1]
        raise ConfigError(f"run directory {twice[0]!r} is given twice: its runs would count twice")
    rows = [read_metrics(d, warn) for d in run_dirs]
    if metric is None:
        chosen = {d: default_metric([r]) for d, r in zip(run_dirs, rows)}
        if len(set(chosen.values())) > 1:
            with_eval = [str(d) for d, m in chosen.items() if m == "eval_return"]
            without = [str(d) for d, m in chosen.items() if m != "eval_return"]
            raise ConfigError(
                f"the runs report different metrics: eval_return in {', '.join(with_eval)}, "
                f"only episode_return in {', '.join(without)}: give --metric"
            )
        metric = default_metric(rows)
    units = []
    for run_dir, run_rows in zip(run_dirs, rows):
        if run_rows and metric not in run_rows[0]:
            known = sorted(k for k in run_rows[0] if k not in ("setting", "seed", "log_point"))
            raise ConfigError(
                f"--metric: {str(run_dir)!r} has no metric {metric!r}; it has {', '.join(known)}"
            )
        saved = _saved_config(run_dir)
        grid = saved.get("sweep") or [{}]
        base = {k: v for k, v in saved.items() if k not in ("run", "env", "sweep")}
        for setting, (steps, values) in curves(run_rows, metric).items():
            hyper = grid[setting] if setting < len(grid) else {}
            config = {**_flat(base), **{f"agent.{k}": v for k, v in hyper.items()}}
            units.append(
                Unit(
                    run_dir=run_dir,
                    label=", ".join(f"{k}={v}" for k, v in hyper.items()),
                    env=str((saved.get("env") or {}).get("id", "?")),
                    env_key=json.dumps(saved.get("env"), sort_keys=True),
                    seed=(saved.get("run") or {}).get("seed"),
                    config_key=json.dumps(config, sort_keys=True, default=str),
                    steps=steps,
                    values=values,
                )
            )
    _label_envs(units)
    return metric, units


def _label_envs(units: list[Unit]) -> None:
    """Env labels that tell tasks apart: the id, with the params that differ between tasks of
    that id."""
    for env_id in {u.env for u in units}:
        same = [u for u in units if u.env == env_id]
        if len({u.env_key for u in same}) > 1:
            params = [_flat(json.loads(u.env_key).get("params") or {}) for u in same]
            differ = sorted(
                {k for a, b in itertools.combinations(params, 2) for k in a if a.get(k) != b.get(k)}
            )
            for unit, p in zip(same, params):
                unit.env = f"{env_id} ({', '.join(f'{k}={p.get(k)}' for k in differ)})"


def group_units(units: list[Unit], by: str) -> list[Group]:
    """Units grouped `by` "name" (run directory name and setting) or "config" (`compare`), in
    the order first seen."""
    groups: dict[str, Group] = {}
    if by == "config":
        configs = [json.loads(u.config_key) for u in units]
        keys = sorted({k for c in configs for k in c})
        differ = [k for k in keys if len({json.dumps(c.get(k), default=str) for c in configs}) > 1]
        for unit, config in zip(units, configs):
            label = ", ".join(f"{k}={config.get(k)}" for k in differ) or str(
                config.get("agent.name", "runs")
            )
            groups.setdefault(unit.config_key, Group(label, [])).units.append(unit)
    else:
        for unit in units:
            label = unit.run_dir.name + (f" [{unit.label}]" if unit.label else "")
            groups.setdefault(label, Group(label, [])).units.append(unit)
    return list(groups.values())


def point_index(unit: Unit, at: int | None) -> int:
    """The log point of env step `at` in `unit` (the last one when None); ConfigError naming the
    nearest when there is none."""
    if at is None:
        return len(unit.steps) - 1
    hits = np.flatnonzero(unit.steps == at)
    if hits.size:
        return int(hits[0])
    nearest = int(unit.steps[np.argmin(np.abs(unit.steps - at))])
    where = f"{unit.run_dir}" + (f" [{unit.label}]" if unit.label else "")
    raise ConfigError(
        f"--at {at}: {where} has no log point at env step {at}; the nearest is {nearest} "
        f"(its log points run from {int(unit.steps[0])} to {int(unit.steps[-1])})"
    )


def read_normalization(spec: str, envs: list[str]) -> dict[str, tuple[float, float]]:
    """{env label: (low, high)} from `LOW,HIGH` (every env) or a YAML file {env id: [low, high]}."""
    parts = spec.split(",")
    if len(parts) == 2 and not spec.lower().endswith((".yaml", ".yml")):
        try:
            low, high = float(parts[0]), float(parts[1])
        except ValueError:
            raise ConfigError(
                f"--normalize {spec!r}: expected LOW,HIGH (two numbers) or a YAML file"
            ) from None
        bounds = {env: (low, high) for env in envs}
    else:
        import yaml

        try:
            table = yaml.safe_load(Path(spec).read_text()) or {}
        except OSError as err:
            raise ConfigError(f"--normalize {spec!r} cannot be read: {err.strerror}") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"--normalize {spec!r} is not YAML: {err}") from None
        if not isinstance(table, dict):
            raise ConfigError(f"--normalize {spec!r}: expected a mapping {{env id: [low, high]}}")
        bounds = {}
        for env in envs:
            entry = table.get(env, table.get(env.split(" (")[0]))
            if entry is None:
                raise ConfigError(
                    f"--normalize {spec!r} has no entry for env {env!r} (it has: "
                    f"{', '.join(map(str, table)) or 'none'})"
                )
            if isinstance(entry, dict):
                entry = [entry.get("low"), entry.get("high")]
            try:
                low, high = (float(v) for v in entry)
            except (TypeError, ValueError):
                raise ConfigError(
                    f"--normalize {spec!r}: {env}: expected [low, high], got {entry!r}"
                ) from None
            bounds[env] = (low, high)
    for env, (low, high) in bounds.items():
        if not (math.isfinite(low) and math.isfinite(high)) or low == high:
            raise ConfigError(f"--normalize: {env}: low {low} and high {high} must differ")
    return bounds


@dataclass
class Comparison:
    metric: str
    groups: list[Group]
    bounds: dict[str, tuple[float, float]] | None
    intervals: dict[str, dict[str, evaluation.Interval]]
    improvements: list[tuple[str, str, evaluation.Interval | None]]
    excluded: list[str]


def compare(
    run_dirs, by="name", metric=None, at=None, normalize=None, reps=50_000, seed=0, warn=None
):
    """Read, group and score the runs; returns a Comparison.

    A run is one seed of one sweep setting of a run directory (its `metrics.jsonl`). Its score is
    `metric` (default: the one its end-of-run summary reports, `eval_return` where every run has
    one, else `episode_return`) at the log point of env step `at` (default: each run directory's
    last). Groups: `by` "name" (the run directory's name and the sweep setting; directories of
    one name in different folders pool their runs, their envs being the tasks) or "config" (the
    resolved config without `run` and `env`, with the sweep setting). Each env is a task, its runs
    resampled within it. Runs of several envs (or metrics) are refused unless `normalize` gives
    each env (low, high): scores become (x - low) / (high - low) and the optimality gap is shown.
    NaN scores (no episode ended by then) are left out and counted; groups of fewer than 3 runs
    get a warning."""
    warn = warn or (lambda message: None)
    metric, units = read_units(run_dirs, metric, warn)
    envs = sorted({u.env for u in units})
    if len(envs) > 1 and normalize is None:
        first = {env: next(u.run_dir for u in units if u.env == env) for env in envs}
        raise ConfigError(
            "the runs are on different envs ("
            + ", ".join(f"{first[env]} on {env}" for env in envs)
            + "): their returns are not on one scale; give --normalize LOW,HIGH or "
            "--normalize REF.yaml with a low and high score per env"
        )
    bounds = read_normalization(normalize, envs) if normalize is not None else None
    groups, excluded = group_units(units, by), []
    for group in groups:
        for unit in group.units:
            j = point_index(unit, at)
            values = unit.values[:, j]
            if bounds is not None:
                low, high = bounds[unit.env]
                values = (values - low) / (high - low)
            missing = int(np.sum(~np.isfinite(values)))
            if missing:
                excluded.append(
                    f"{unit.run_dir}{f' [{unit.label}]' if unit.label else ''}: {missing} of "
                    f"{values.size} run{'s' if values.size != 1 else ''} "
                    f"{'has' if missing == 1 else 'have'} no {metric} at step {int(unit.steps[j])}"
                )
            previous = group.scores.get(unit.env, np.zeros(0))
            group.scores[unit.env] = np.concatenate([previous, values[np.isfinite(values)]])
            group.steps[unit.env] = int(unit.steps[j])
    for group in groups:
        seen: dict = {}
        for unit in group.units:
            other = seen.setdefault((unit.env_key, unit.config_key, json.dumps(unit.seed)), unit)
            if other is not unit:
                warn(
                    f"{other.run_dir} and {unit.run_dir} ran one config from one run.seed "
                    f"({unit.seed}): their runs are likely the same ones, counted twice"
                )
    if excluded:
        warn(f"NaN scores left out: {'; '.join(excluded)}")
    few = [
        f"{g.label} ({min(s.size for s in g.scores.values())})"
        for g in groups
        if any(s.size < MIN_RUNS for s in g.scores.values())
    ]
    if few:
        warn(
            f"fewer than {MIN_RUNS} runs per env in {', '.join(few)}: "
            "their intervals are not meaningful"
        )
    one_env = len(envs) == 1
    names = ("iqm", "run_median" if one_env else "median", "mean")
    names += ("optimality_gap",) if bounds is not None else ()
    intervals = {}
    for group in groups:
        tasks = [s for s in group.scores.values() if s.size]
        if len(tasks) == len(group.scores):
            intervals[group.label] = evaluation.bootstrap_intervals(
                tasks, names, reps=reps, seed=seed
            )
    improvements = []
    for a, b in itertools.combinations(groups, 2):
        same_envs = sorted(a.scores) == sorted(b.scores)
        ok = same_envs and a.label in intervals and b.label in intervals
        poi = None
        if ok:
            poi = evaluation.probability_of_improvement_interval(
                [a.scores[e] for e in sorted(a.scores)],
                [b.scores[e] for e in sorted(b.scores)],
                reps=reps,
                seed=seed,
            )
        improvements.append((a.label, b.label, poi))
    return Comparison(metric, groups, bounds, intervals, improvements, excluded)


def _decimals(values) -> int:
    """Decimals that show 4 significant digits of the largest of `values`."""
    largest = max([abs(v) for v in values if math.isfinite(v)] + [1e-12])
    return min(6, max(0, 3 - math.floor(math.log10(largest))))


def _cell(interval: evaluation.Interval | None, decimals: int) -> str:
    if interval is None:
        return "n/a"
    point, low, high = (f"{v:.{decimals}f}" for v in interval)
    return f"{point} [{low}, {high}]"


def comparison_lines(result: Comparison, reps: int, seed: int) -> list[str]:
    """The table `rl compare` prints: a line saying what is compared, a row per group (runs, IQM,
    median, with --normalize the optimality gap, each with its interval), the probability of
    improvement of each pair of groups."""
    envs = sorted({env for g in result.groups for env in g.scores})
    steps = sorted({s for g in result.groups for s in g.steps.values()})
    where = f"step {steps[0]}" if len(steps) == 1 else f"steps {', '.join(map(str, steps))}"
    scale = "normalised " if result.bounds else ""
    lines = [
        f"{scale}{result.metric} at {where} on {', '.join(envs)}",
        f"95% stratified-bootstrap intervals over runs ({reps:,} resamples, seed {seed})",
    ]
    found = [list(result.intervals.get(g.label, {}).values()) for g in result.groups]
    decimals = _decimals([v for cells in found for cell in cells for v in cell])
    cells = [[_cell(c, decimals) for c in row] if row else ["n/a"] * 4 for row in found]
    median = "median of runs" if len(envs) == 1 else "median of env means"
    width = max([len(c) for row in cells for c in row] + [len(median) + 9])
    label_width = max([len("group")] + [len(g.label) for g in result.groups])
    header = f"{'group':<{label_width}}  {'runs':>4}  {'IQM [95% CI]':<{width}}  "
    header += f"{median + ' [95% CI]':<{width}}"
    lines.append(header + ("  optimality gap [95% CI]" if result.bounds else ""))
    for group, row in zip(result.groups, cells):
        line = (
            f"{group.label:<{label_width}}  {group.runs:>4}  {row[0]:<{width}}  {row[1]:<{width}}"
        )
        lines.append((line + (f"  {row[3]}" if result.bounds else "")).rstrip())
    if result.bounds:
        spans = ", ".join(f"{env} {lo:g}..{hi:g}" for env, (lo, hi) in result.bounds.items())
        lines.append(f"scores normalised per env, (x - low) / (high - low): {spans}")
        lines.append("optimality gap: the mean shortfall of min(normalised score, 1) below 1")
    if result.improvements:
        lines.append("probability of improvement, P(a run of A beats a run of B) [95% CI]:")
        for a, b, poi in result.improvements:
            text = _cell(poi, 3) if poi is not None else "n/a (not on the same envs)"
            lines.append(f"  P({a} > {b}) = {text}")
    return lines


def compare_command(args) -> int:
    """`rl compare` (rl.cli.main): print the table, write the figures with --plot."""
    from rl.cli.output import EXIT_BAD_INPUT, EXIT_FAILED, error

    def warn(message):
        print(f"rl: warning: {message}", file=sys.stderr)

    try:
        if args.reps < 1:
            raise ConfigError(f"--reps: expected a positive integer, got {args.reps}")
        result = compare(
            args.run_dirs, args.by, args.metric, args.at, args.normalize, args.reps, args.seed, warn
        )
        print("\n".join(comparison_lines(result, args.reps, args.seed)))
        if args.plot is not None:
            from rl.cli.plot import comparison_figures

            written = comparison_figures(result, args.plot, args.reps, args.seed)
            print(f"wrote {', '.join(map(str, written))}")
    except ConfigError as err:
        return error(str(err), EXIT_BAD_INPUT)
    except OSError as err:
        return error(
            f"cannot write {err.filename or args.plot}: {err.strerror or err}", EXIT_FAILED
        )
    return 0
