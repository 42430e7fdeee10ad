"""Reporting learning results over runs: the protocol of Agarwal et al. (2021), "Deep RL at the
Edge of the Statistical Precipice", in NumPy. Scores are a scalar per run of `M` tasks (envs),
each run by several seeds: `[runs, tasks]`, `[runs]` (one task) or a sequence of `[runs_t]`
(`as_tasks`). The aggregates are rliable's (`mean`, `median`, `iqm`, `optimality_gap`; and
`run_median`), with stratified-bootstrap intervals (`bootstrap_intervals`), performance profiles
and the probability of improvement.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

AGGREGATES = ("iqm", "median", "mean", "optimality_gap")
METRICS = AGGREGATES + ("run_median",)
# Pooled runs per bootstrap chunk: bounds memory (a chunk's counts are [chunk, N] float64) and
# keeps a chunk's bins in cache.
_CHUNK_ELEMENTS = 250_000


class Interval(NamedTuple):
    """A point estimate and its bootstrap confidence interval [low, high]."""

    point: float
    low: float
    high: float


class Profile(NamedTuple):
    """A performance profile: at each threshold `taus[j]`, the fraction of runs scoring above it,
    with its bootstrap confidence band. Arrays of shape [len(taus)]."""

    taus: np.ndarray
    fraction: np.ndarray
    low: np.ndarray
    high: np.ndarray


def as_tasks(scores) -> list[np.ndarray]:
    """`scores` as a list of float64 vectors, one per task: a 2-D array [runs, tasks] gives its
    columns, a 1-D array [runs] (or a list of numbers) one task, a list of 1-D arrays or lists one
    task each. ValueError if a task has no run or a score is not finite."""
    is_tasks = isinstance(scores, (list, tuple)) and any(np.ndim(task) > 0 for task in scores)
    if not is_tasks:
        array = np.asarray(scores, np.float64)
        if array.ndim not in (1, 2):
            raise ValueError(f"scores: expected [runs] or [runs, tasks], got shape {array.shape}")
        tasks = [array] if array.ndim == 1 else list(array.T)
    else:
        tasks = [np.asarray(task, np.float64).ravel() for task in scores]
    if not tasks or any(task.size == 0 for task in tasks):
        raise ValueError("scores: every task needs at least one run")
    bad = sum(int(np.sum(~np.isfinite(task))) for task in tasks)
    if bad:
        raise ValueError(f"scores: {bad} are NaN or infinite; drop those runs first")
    return tasks


def normalize(scores, low, high) -> list[np.ndarray]:
    """Per-task normalisation `(x - low_t) / (high_t - low_t)`: min-max normalisation with the
    task's minimum and maximum as (low, high), reference normalisation with a baseline score (e.g.
    random) and a reference score (e.g. the best known). `low`, `high`: scalars or [tasks].
    Returns one vector per task (`as_tasks`)."""
    tasks = as_tasks(scores)
    low = np.broadcast_to(np.asarray(low, np.float64), (len(tasks),))
    high = np.broadcast_to(np.asarray(high, np.float64), (len(tasks),))
    if np.any(high == low):
        raise ValueError("normalize: high equals low for a task: the scale would be infinite")
    return [(task - lo) / (hi - lo) for task, lo, hi in zip(tasks, low, high)]


def trimmed_count(n: int) -> int:
    """Runs cut at each end by the interquartile mean of `n` runs: floor(n / 4)."""
    return int(0.25 * n)


def iqm(scores) -> float:
    """Interquartile mean of all runs pooled: the mean of the sorted scores with floor(N/4) cut
    at each end (scipy.stats.trim_mean(x, 0.25)): with x_(1) <= ... <= x_(N) and c = floor(N / 4),
    (1 / (N - 2c)) sum_{j=c+1}^{N-c} x_(j). Returns a float."""
    pooled = np.sort(np.concatenate(as_tasks(scores)))
    cut = trimmed_count(pooled.size)
    return float(np.mean(pooled[cut : pooled.size - cut]))


def mean(scores) -> float:
    """The mean over tasks of each task's mean score."""
    return float(np.mean([task.mean() for task in as_tasks(scores)]))


def median(scores) -> float:
    """The median over tasks of each task's mean score (rliable's aggregate median: with one task,
    its mean; `run_median` is the median of the runs)."""
    return float(np.median([task.mean() for task in as_tasks(scores)]))


def run_median(scores) -> float:
    """The median of all runs pooled."""
    return float(np.median(np.concatenate(as_tasks(scores))))


def optimality_gap(scores, gamma: float = 1.0) -> float:
    """`gamma - mean(min(x, gamma))` over all runs pooled: the mean shortfall below `gamma` (the
    reference score: 1 for normalised scores); a run above `gamma` counts as reaching it."""
    pooled = np.concatenate(as_tasks(scores))
    return float(gamma - np.mean(np.minimum(pooled, gamma)))


def aggregates(scores, gamma: float = 1.0) -> dict[str, float]:
    """{name: value} of every metric of METRICS on `scores`."""
    return {
        "iqm": iqm(scores),
        "median": median(scores),
        "mean": mean(scores),
        "optimality_gap": optimality_gap(scores, gamma),
        "run_median": run_median(scores),
    }


class _Pooled:
    """The runs of all tasks pooled and sorted once: `values` [N] ascending, `rank` [N] the sorted
    position of each run in task order, `task` [N] the task of each sorted position, `sizes` [M]."""

    def __init__(self, tasks: list[np.ndarray]):
        flat = np.concatenate(tasks)
        order = np.argsort(flat, kind="stable")
        self.values = flat[order]
        self.sizes = np.array([task.size for task in tasks])
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        self.rank = np.empty(flat.size, np.int64)
        self.rank[order] = np.arange(flat.size)
        self.task = np.repeat(np.arange(len(tasks)), self.sizes)[order]

    @property
    def n(self) -> int:
        return self.values.size

    def weights(self, gamma: float) -> np.ndarray:
        """[N, M + 1]: counts [r, N] times this are each task's sum of its drawn scores, then the
        sum of min(score, gamma) over all runs drawn."""
        weights = np.zeros((self.n, self.sizes.size + 1))
        weights[np.arange(self.n), self.task] = self.values
        weights[:, -1] = np.minimum(self.values, gamma)
        return weights

    def resampled_counts(self, reps: int, seed: int):
        """Yields the stratified bootstrap's resamples in chunks: [r, N] int64 counts, column j how
        often the j-th smallest run was drawn (each task draws its n_t runs uniformly with
        replacement). The chunks of one (reps, seed) are always the same."""
        rng = np.random.default_rng(seed)
        n, sizes = self.n, self.sizes
        chunk = max(1, _CHUNK_ELEMENTS // n)
        draw_type = np.int16 if n < 2**15 else np.int64
        offsets = np.repeat(self.offsets, sizes).astype(draw_type)
        same_size = bool(np.all(sizes == sizes[0]))
        for start in range(0, reps, chunk):
            r = min(chunk, reps - start)
            if same_size:  # one call: the draws of task t are columns [t n_t, (t + 1) n_t)
                draws = rng.integers(0, sizes[0], size=(r, n), dtype=draw_type)
            else:
                draws = np.concatenate(
                    [rng.integers(0, size, size=(r, size), dtype=draw_type) for size in sizes],
                    axis=1,
                )
            draws += offsets  # the run drawn, in task order
            bins = self.rank[draws]  # its sorted position
            bins += (np.arange(r) * n)[:, None]  # one block of N bins per resample
            yield np.bincount(bins.ravel(), minlength=r * n).reshape(r, n)


def _small_products(a: np.ndarray, b: np.ndarray, rows: int = 16) -> np.ndarray:
    """`a @ b` a few rows at a time: products this small run on one thread in OpenBLAS, whose
    threads, on a CPU other processes keep busy, wait for each other longer than they compute."""
    return np.concatenate([a[i : i + rows] @ b for i in range(0, a.shape[0], rows)])


def _statistics(pooled: _Pooled, counts, metrics, gamma, weights, below) -> dict[str, np.ndarray]:
    """Each metric of `metrics` [r] (and "profile" [r, taus], the fraction above each tau, whose
    `below` [taus] counts the runs at or below it) for the resamples `counts` [r, N];
    `weights`: `pooled.weights(gamma)`. No resample is sorted: the means are counts times scores,
    and the IQM's trimmed sum is, with C_j the running count up to the j-th smallest score,
    sum_j (clip(C_j, c, N - c) - c) (x_(j) - x_(j+1)) (x_(N+1) = 0)."""
    n, values = pooled.n, pooled.values
    out = {}
    if {"mean", "median", "optimality_gap"} & set(metrics):
        task_sums = _small_products(counts.astype(np.float64), weights)
        task_means = task_sums[:, :-1] / pooled.sizes
        out["mean"] = task_means.mean(axis=1)
        out["median"] = np.median(task_means, axis=1)
        out["optimality_gap"] = gamma - task_sums[:, -1] / n
    running = np.cumsum(counts, axis=1, out=counts)  # C_j: runs drawn at or below x_(j)
    if below is not None:
        at_or_below = np.where(below > 0, running[:, np.maximum(below - 1, 0)], 0)
        out["profile"] = 1.0 - at_or_below / n
    if "run_median" in metrics:
        below = [np.sum(running <= position, axis=1) for position in ((n - 1) // 2, n // 2)]
        out["run_median"] = (values[below[0]] + values[below[1]]) / 2
    if "iqm" in metrics:
        cut = trimmed_count(n)
        steps = values - np.append(values[1:], 0.0)  # x_(j) - x_(j+1)
        window = np.clip(running, cut, n - cut, out=running).astype(np.float64)
        out["iqm"] = (np.einsum("rj,j->r", window, steps) - cut * values[0]) / (n - 2 * cut)
    return out


def _bootstrap(scores, metrics, reps, seed, gamma, taus=None) -> tuple[_Pooled, dict]:
    """The resampled statistics {metric: [reps]} (and "profile": [reps, taus])."""
    unknown = [name for name in metrics if name not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric {unknown[0]!r}; known: {', '.join(METRICS)}")
    if reps < 1:
        raise ValueError(f"reps: expected a positive number of resamples, got {reps}")
    pooled = _Pooled(as_tasks(scores))
    below = None if taus is None else np.searchsorted(pooled.values, taus, side="right")
    weights = pooled.weights(gamma)
    parts = [
        _statistics(pooled, counts, metrics, gamma, weights, below)
        for counts in pooled.resampled_counts(reps, seed)
    ]
    return pooled, {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def _percentiles(samples: np.ndarray, confidence: float):
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence: expected a value in (0, 1), got {confidence}")
    tail = 100.0 * (1.0 - confidence) / 2.0
    return np.percentile(samples, [tail, 100.0 - tail], axis=0)


def bootstrap_intervals(
    scores,
    metrics: Sequence[str] = AGGREGATES,
    *,
    reps: int = 50_000,
    seed: int = 0,
    confidence: float = 0.95,
    gamma: float = 1.0,
) -> dict[str, Interval]:
    """Stratified-bootstrap confidence intervals of `metrics` (names from METRICS) on `scores`
    ([runs, tasks], [runs] or a sequence of [runs_t]): each resample draws, within each task, n_t
    of its runs with replacement and recomputes the metric; the interval is the (1 - confidence)
    / 2 and (1 + confidence) / 2 percentiles of the `reps` resampled values.

    Args:
      reps: number of bootstrap resamples.
      seed: seed of the resampling (numpy's default_rng): the same seed gives the same interval.
      confidence: the interval's coverage (0.95: the 2.5th to 97.5th percentile).
      gamma: the optimality gap's reference score.

    Returns:
      {metric: Interval(point, low, high)}: the point estimate on the scores themselves and the
      percentile interval over the resamples.
    """
    _, samples = _bootstrap(scores, tuple(metrics), reps, seed, gamma)
    points = aggregates(scores, gamma)
    result = {}
    for name in metrics:
        low, high = _percentiles(samples[name], confidence)
        result[name] = Interval(points[name], float(low), float(high))
    return result


def performance_profile(
    scores, taus, *, reps: int = 10_000, seed: int = 0, confidence: float = 0.95
) -> Profile:
    """The run-score distribution: at each threshold tau, the fraction of all runs pooled whose
    score exceeds it, `(1/N) sum_{t,i} [x_{t,i} > tau]`, with a stratified-bootstrap band.

    Args:
      taus: thresholds [K].
      reps, seed, confidence: as for `bootstrap_intervals`.

    Returns:
      Profile(taus [K], fraction [K], low [K], high [K]).
    """
    taus = np.asarray(taus, np.float64).ravel()
    pooled, samples = _bootstrap(scores, (), reps, seed, 1.0, taus)
    fraction = np.mean(pooled.values[None, :] > taus[:, None], axis=1)
    low, high = _percentiles(samples["profile"], confidence)
    return Profile(taus, fraction, low, high)


def _pairwise_wins(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """[n, m] matrix: 1 where x_i > y_j, 0.5 where x_i == y_j, 0 where x_i < y_j."""
    return (x[:, None] > y[None, :]) + 0.5 * (x[:, None] == y[None, :])


def probability_of_improvement(x, y) -> float:
    """P(X > Y): the probability that a run of algorithm X scores above a run of algorithm Y on the
    same task, ties counting half (the Mann-Whitney U statistic over n * m), averaged over tasks:

        (1/M) sum_t (1 / (n_t m_t)) sum_{i,j} ([x_{t,i} > y_{t,j}] + 0.5 [x_{t,i} = y_{t,j}])

    `x`, `y`: the scores of X and Y on the same tasks (runs per task may differ). 0.5: neither
    improves on the other."""
    tasks_x, tasks_y = as_tasks(x), as_tasks(y)
    if len(tasks_x) != len(tasks_y):
        raise ValueError(f"x has {len(tasks_x)} tasks, y {len(tasks_y)}: they must match")
    return float(np.mean([_pairwise_wins(a, b).mean() for a, b in zip(tasks_x, tasks_y)]))


def _task_counts(rng, size: int, reps: int) -> np.ndarray:
    """[reps, size] float64: how often each of `size` runs is drawn in each of `reps` resamples."""
    draws = rng.integers(0, size, size=(reps, size)) + (np.arange(reps) * size)[:, None]
    return np.bincount(draws.ravel(), minlength=reps * size).reshape(reps, size).astype(float)


def probability_of_improvement_interval(
    x, y, *, reps: int = 10_000, seed: int = 0, confidence: float = 0.95
) -> Interval:
    """`probability_of_improvement(x, y)` with a stratified-bootstrap interval: X's and Y's runs
    resampled independently within each task; a resample's value is
    `(1/M) sum_t a_t^T W_t b_t / (n_t m_t)` with `a_t`, `b_t` the draw counts and `W_t` the
    `_pairwise_wins` matrix. Args as for `bootstrap_intervals`."""
    point = probability_of_improvement(x, y)
    rng = np.random.default_rng(seed)
    total = np.zeros(reps)
    tasks = list(zip(as_tasks(x), as_tasks(y)))
    for a, b in tasks:
        wins = _pairwise_wins(a, b)
        chunk = max(1, _CHUNK_ELEMENTS // max(a.size * b.size, a.size + b.size))
        for start in range(0, reps, chunk):
            r = min(chunk, reps - start)
            counts_a, counts_b = _task_counts(rng, a.size, r), _task_counts(rng, b.size, r)
            total[start : start + r] += np.sum((counts_a @ wins) * counts_b, axis=1) / wins.size
    low, high = _percentiles(total / len(tasks), confidence)
    return Interval(point, float(low), float(high))
