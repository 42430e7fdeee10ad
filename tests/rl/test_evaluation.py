"""rl.cli.evaluation: the aggregates against hand-computed values, against rliable.metrics 1.2.0
(numbers it computed, kept here) and against scipy; the stratified bootstrap against a plain NumPy
one; performance profiles and the probability of improvement."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from rl.cli import evaluation as ev

# Score arrays [runs, tasks] with ties, and the aggregates rliable 1.2.0 computed for them:
# `rliable.metrics.aggregate_iqm(A)`, `aggregate_median`, `aggregate_mean`,
# `aggregate_optimality_gap(A, 1.0)` and `(A, 0.5)`, `probability_of_improvement(A, B)` (rliable
# installed with `pip install --no-deps rliable==1.2.0` into a scratch venv over this
# environment's numpy 2.4.6 and scipy 1.17.1; rliable is not a dependency of fusedrl).
A = ((np.arange(21) * 37) % 23).reshape(7, 3) / 10.0 - 0.5
B = ((np.arange(15) * 29) % 19).reshape(5, 3) / 10.0 - 0.4
C = ((np.arange(10) * 7) % 11)[:, None] / 4.0  # one task
RLIABLE = {  # iqm, median, mean, optimality gap (gamma 1), optimality gap (gamma 0.5)
    "A": (A, (0.5636363636363637, 0.6, 0.5761904761904761, 0.5428571428571429, 0.2571428571428572)),
    "B": (
        B,
        (0.38888888888888884, 0.38, 0.39333333333333337, 0.6266666666666667, 0.29333333333333333),
    ),
    "C": (C, (1.2916666666666667, 1.275, 1.275, 0.25, 0.07500000000000001)),
}
RLIABLE_POI = {("A", "B"): 0.5523809523809523, ("B", "A"): 0.44761904761904764}


# ---------------------------------------------------------------- point estimates


def test_aggregates_by_hand():
    runs = np.arange(1.0, 9.0)  # one task of 8 runs: 2 cut at each end
    assert ev.iqm(runs) == pytest.approx((3 + 4 + 5 + 6) / 4)
    assert ev.iqm(np.arange(1.0, 8.0)) == pytest.approx(4.0)  # 7 runs: 1 cut at each end
    scores = np.array([[0.0, 2.0, 10.0], [1.0, 4.0, 20.0]])  # task means 0.5, 3, 15
    assert ev.mean(scores) == pytest.approx((0.5 + 3 + 15) / 3)
    assert ev.median(scores) == pytest.approx(3.0)
    assert ev.run_median(scores) == pytest.approx(3.0)  # of 0, 1, 2, 4, 10, 20
    assert ev.iqm(scores) == pytest.approx((1 + 2 + 4 + 10) / 4)  # 6 runs pooled: 1 cut each end
    assert ev.optimality_gap([0.5, 1.5]) == pytest.approx(1 - (0.5 + 1.0) / 2)
    assert ev.optimality_gap([0.5, 1.5], gamma=2.0) == pytest.approx(2 - 1.0)
    # tasks of different sizes: the mean weighs tasks equally, the IQM pools runs
    ragged = [[0.0, 1.0], [10.0, 10.0, 10.0, 10.0]]
    assert ev.mean(ragged) == pytest.approx((0.5 + 10) / 2)
    assert ev.iqm(ragged) == pytest.approx(np.mean([1.0, 10, 10, 10]))


@pytest.mark.parametrize("name", sorted(RLIABLE))
def test_aggregates_equal_rliable(name):
    scores, (iqm, median, mean, gap, gap_half) = RLIABLE[name]
    assert ev.iqm(scores) == pytest.approx(iqm, abs=1e-12)
    assert ev.median(scores) == pytest.approx(median, abs=1e-12)
    assert ev.mean(scores) == pytest.approx(mean, abs=1e-12)
    assert ev.optimality_gap(scores) == pytest.approx(gap, abs=1e-12)
    assert ev.optimality_gap(scores, gamma=0.5) == pytest.approx(gap_half, abs=1e-12)


def test_probability_of_improvement_equals_rliable_and_by_hand():
    for (x, y), expected in RLIABLE_POI.items():
        value = ev.probability_of_improvement(RLIABLE[x][0], RLIABLE[y][0])
        assert value == pytest.approx(expected, abs=1e-12)
    # (1 vs 1: tie, 1 > 0, 2 > 1, 2 > 0) / 4 pairs
    assert ev.probability_of_improvement([1.0, 2.0], [1.0, 0.0]) == pytest.approx(3.5 / 4)
    assert ev.probability_of_improvement(A, A) == pytest.approx(0.5)


def test_aggregates_equal_scipy_on_random_scores():
    rng = np.random.default_rng(3)
    for runs, tasks in ((5, 1), (16, 4), (33, 7)):
        x = np.round(rng.normal(size=(runs, tasks)), 1)  # rounded: ties
        y = np.round(rng.normal(0.3, 1.0, size=(runs + 3, tasks)), 1)
        assert ev.iqm(x) == pytest.approx(stats.trim_mean(x, 0.25, axis=None), abs=1e-12)
        assert ev.median(x) == pytest.approx(np.median(x.mean(axis=0)), abs=1e-12)
        mann_whitney = [
            stats.mannwhitneyu(x[:, t], y[:, t], alternative="greater").statistic
            / (runs * (runs + 3))
            for t in range(tasks)
        ]
        poi = ev.probability_of_improvement(x, y)
        assert poi == pytest.approx(np.mean(mann_whitney), abs=1e-12)


def test_normalize_per_task():
    scores = np.array([[0.0, 10.0], [5.0, 20.0]])
    low_high = ev.normalize(scores, [0.0, 10.0], [10.0, 30.0])
    np.testing.assert_allclose(np.stack(low_high, axis=1), [[0.0, 0.0], [0.5, 0.5]])
    np.testing.assert_allclose(ev.normalize([1.0, 3.0], 1.0, 5.0)[0], [0.0, 0.5])
    with pytest.raises(ValueError, match="high equals low"):
        ev.normalize(scores, 1.0, 1.0)


def test_bad_scores_are_refused():
    with pytest.raises(ValueError, match="1 are NaN"):
        ev.iqm([1.0, np.nan, 2.0])
    with pytest.raises(ValueError, match="at least one run"):
        ev.mean([[1.0], []])
    with pytest.raises(ValueError, match="unknown metric 'nope'"):
        ev.bootstrap_intervals(A, ["nope"], reps=10)
    with pytest.raises(ValueError, match="tasks"):
        ev.probability_of_improvement(A, C)


# ---------------------------------------------------------------- the bootstrap


def test_each_resample_is_a_stratified_draw_and_its_statistics_are_exact():
    """The counts of every resample draw each task's n_t runs from that task only, and the
    statistics computed from the counts equal the metrics of the resampled scores themselves."""
    tasks = [np.array([3.0, 1.0, 2.0]), np.array([10.0, -1.0, 4.0, 4.0, 7.0])]  # a tie
    pooled = ev._Pooled(tasks)
    weights = pooled.weights(2.5)
    checked = 0
    for counts in pooled.resampled_counts(reps=300, seed=1):
        for task, size in enumerate(pooled.sizes):
            np.testing.assert_array_equal(counts[:, pooled.task == task].sum(axis=1), size)
        computed = ev._statistics(pooled, counts.copy(), ev.METRICS, 2.5, weights, None)
        for row, resampled_counts in enumerate(counts):
            resample = [
                np.repeat(pooled.values[pooled.task == t], resampled_counts[pooled.task == t])
                for t in range(len(tasks))
            ]
            direct = ev.aggregates(resample, gamma=2.5)
            for name in ev.METRICS:
                assert computed[name][row] == pytest.approx(direct[name], abs=1e-12), name
            checked += 1
    assert checked == 300


def plain_stratified_bootstrap(scores, reps, seed, gamma=1.0):
    """A plain NumPy stratified bootstrap (rliable's scheme): per resample, each task's runs drawn
    with replacement from that task; 95% percentile intervals of the four aggregates."""
    rng = np.random.default_rng(seed)
    runs, tasks = scores.shape
    rows = rng.integers(0, runs, size=(reps, runs, tasks))
    resampled = np.take_along_axis(scores[None], rows, axis=1)  # [reps, runs, tasks]
    flat = np.sort(resampled.reshape(reps, -1), axis=1)
    cut = int(0.25 * flat.shape[1])
    values = {
        "iqm": flat[:, cut : flat.shape[1] - cut].mean(axis=1),
        "median": np.median(resampled.mean(axis=1), axis=1),
        "mean": resampled.mean(axis=(1, 2)),
        "optimality_gap": gamma - np.minimum(resampled, gamma).mean(axis=(1, 2)),
    }
    return {name: np.percentile(v, [2.5, 97.5]) for name, v in values.items()}


def test_intervals_agree_with_a_plain_stratified_bootstrap():
    rng = np.random.default_rng(0)
    scores = rng.gamma(2.0, 0.4, size=(20, 5)) * np.array([1.0, 0.5, 2.0, 1.0, 0.8])
    ours = ev.bootstrap_intervals(scores, reps=20_000, seed=7)
    plain = plain_stratified_bootstrap(scores, reps=4_000, seed=11)
    for name in ev.AGGREGATES:
        interval = ours[name]
        width = interval.high - interval.low
        # the endpoints' Monte-Carlo error at 4,000 resamples is about 1.5% of the width
        assert abs(interval.low - plain[name][0]) < 0.1 * width, name
        assert abs(interval.high - plain[name][1]) < 0.1 * width, name
        assert interval.low <= interval.point <= interval.high, name


def test_the_seed_fixes_the_interval():
    first = ev.bootstrap_intervals(A, reps=2_000, seed=3)
    assert first == ev.bootstrap_intervals(A, reps=2_000, seed=3)
    assert first != ev.bootstrap_intervals(A, reps=2_000, seed=4)
    wide = ev.bootstrap_intervals(A, ["iqm"], reps=2_000, seed=3, confidence=0.99)["iqm"]
    assert wide.low <= first["iqm"].low and wide.high >= first["iqm"].high


def test_a_single_run_per_task_has_a_zero_width_interval():
    (interval,) = ev.bootstrap_intervals(np.array([[1.0, 2.0, 3.0]]), ["mean"], reps=100).values()
    assert interval == ev.Interval(2.0, 2.0, 2.0)


def test_performance_profile():
    scores = np.array([[0.1, 0.5], [0.9, 0.5], [0.3, 0.7]])
    profile = ev.performance_profile(scores, [0.0, 0.3, 0.5, 1.0], reps=2_000)
    np.testing.assert_allclose(profile.fraction, [1.0, 4 / 6, 2 / 6, 0.0])
    assert np.all(profile.low <= profile.fraction + 1e-12)
    assert np.all(profile.high >= profile.fraction - 1e-12)
    assert profile.low[0] == profile.high[0] == 1.0 and profile.high[-1] == 0.0
    assert np.all(np.diff(profile.high) <= 0)


def test_probability_of_improvement_interval():
    rng = np.random.default_rng(5)
    x, y = rng.normal(0.5, 1.0, size=(12, 2)), rng.normal(0.0, 1.0, size=(10, 2))
    interval = ev.probability_of_improvement_interval(x, y, reps=4_000, seed=2)
    assert interval.point == pytest.approx(ev.probability_of_improvement(x, y))
    assert interval.low < interval.point < interval.high
    # a plain bootstrap: x's and y's runs resampled independently within each task
    plain = []
    for _ in range(1_000):
        xs = np.take_along_axis(x, rng.integers(0, 12, size=x.shape), axis=0)
        ys = np.take_along_axis(y, rng.integers(0, 10, size=y.shape), axis=0)
        plain.append(ev.probability_of_improvement(xs, ys))
    low, high = np.percentile(plain, [2.5, 97.5])
    width = interval.high - interval.low
    assert abs(interval.low - low) < 0.15 * width and abs(interval.high - high) < 0.15 * width
