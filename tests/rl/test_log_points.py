"""rl.core.log_points: the scan over log points (a program without host callbacks, so JAX's
persistent cache can keep it), the scan over one log period's updates from no finished episodes, and
a log point's metrics."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.core import episodes, log_points
from rl.run import logging as rl_logging


def test_scan_log_points_stacks_metrics_and_holds_no_host_callback():
    def log_period(state):
        state = state + 10
        return state, {"step": state, "half": state / 2}

    program = jax.jit(lambda s: log_points.scan_log_points(log_period, s, 3))
    received = []
    with rl_logging.sink(received.append):
        state, metrics = program(jnp.int32(0))
    assert int(state) == 30
    np.testing.assert_array_equal(metrics["step"], [10, 20, 30])
    np.testing.assert_allclose(metrics["half"], [5.0, 10.0, 15.0])
    assert received == []  # the host loop publishes log points, not the program
    assert "callback" not in program.lower(jnp.int32(0)).as_text()


def test_scan_log_points_needs_step():
    with pytest.raises(ValueError, match="'step'"):
        log_points.scan_log_points(lambda s: (s, {"loss": s}), jnp.float32(0), 2)


def _update(state, totals):
    """A toy update: counts updates in `state`; update u (1, 2, ...) ends one episode of return u
    and length 2u when u is even; its stats are the loss u / 2 and a [2] row (u, -u)."""
    u = state + 1
    info = {
        "episode_done": u % 2 == 0,
        "episode_return": u.astype(jnp.float32),
        "episode_length": 2 * u,
    }
    stats = {"loss": u / 2, "row": jnp.stack([u, -u]).astype(jnp.float32)}
    return u, episodes.add_episodes(totals, info), stats


def test_scan_updates_starts_from_no_episodes_and_stacks_the_stats():
    """Five updates from state 3 (updates 4..8): episodes end at 4, 6 and 8 (returns 18, lengths
    36, 3 episodes); each call starts from no episodes, whatever the previous log period saw."""
    run = jax.jit(lambda state: log_points.scan_updates(_update, state, 5))
    state, totals, stats = run(jnp.int32(3))
    assert int(state) == 8
    assert isinstance(totals, episodes.EpisodeTotals)
    assert (float(totals.returns), int(totals.lengths), int(totals.count)) == (18.0, 36, 3)
    np.testing.assert_allclose(stats["loss"], [2.0, 2.5, 3.0, 3.5, 4.0])
    assert stats["row"].shape == (5, 2)
    np.testing.assert_array_equal(stats["row"][:, 1], [-4, -5, -6, -7, -8])
    # the next log period: updates 9..13, episodes at 10 and 12 only
    state, totals, _ = run(state)
    assert int(state) == 13
    assert (float(totals.returns), int(totals.lengths), int(totals.count)) == (22.0, 44, 2)


def test_log_point_metrics_by_hand():
    """Mean return and length of the episodes that ended, their count, the step as given, and the
    mean of each stat over all its entries."""
    totals = episodes.EpisodeTotals(jnp.float32(6.0), jnp.int32(9), jnp.int32(4))
    stats = {"loss": jnp.array([1.0, 2.0, 6.0]), "row": jnp.array([[1.0, 3.0], [5.0, 7.0]])}
    metrics = log_points.log_point_metrics(jnp.int32(1024), totals, stats)
    assert set(metrics) == {"step", "episode_return", "episode_length", "episodes", "loss", "row"}
    assert int(metrics["step"]) == 1024 and int(metrics["episodes"]) == 4
    assert float(metrics["episode_return"]) == pytest.approx(1.5)
    assert float(metrics["episode_length"]) == pytest.approx(2.25)
    assert float(metrics["loss"]) == pytest.approx(3.0) and float(metrics["row"]) == 4.0
    # no stats: the step and the episodes only
    assert set(log_points.log_point_metrics(0, totals, {})) == {
        "step",
        "episode_return",
        "episode_length",
        "episodes",
    }


def test_log_point_metrics_nan_when_no_episode_ended_and_nanmean_skips_nan_stats():
    """No episode ended: NaN mean return and length, 0 episodes. With `jnp.nanmean` the NaN stats
    of gradient steps skipped before learning do not count; all NaN reads NaN. The plain mean of
    stats with a NaN is NaN."""
    stats = {"loss": jnp.array([jnp.nan, jnp.nan, 2.0, 4.0]), "none": jnp.full(3, jnp.nan)}
    metrics = log_points.log_point_metrics(8, episodes.no_episodes(), stats, jnp.nanmean)
    assert np.isnan(metrics["episode_return"]) and np.isnan(metrics["episode_length"])
    assert int(metrics["episodes"]) == 0
    assert float(metrics["loss"]) == 3.0 and np.isnan(metrics["none"])
    assert np.isnan(log_points.log_point_metrics(8, episodes.no_episodes(), stats)["loss"])


def test_scan_updates_then_log_point_metrics_under_jit():
    def log_period(state):
        state, totals, stats = log_points.scan_updates(_update, state, 4)
        return state, log_points.log_point_metrics(state * 10, totals, stats)

    state, metrics = jax.jit(lambda s: log_points.scan_log_points(log_period, s, 2))(jnp.int32(0))
    assert int(state) == 8
    np.testing.assert_array_equal(metrics["step"], [40, 80])
    # updates 1..4: episodes at 2 and 4 (mean return 3, length 6); 5..8: at 6 and 8 (7, 14)
    np.testing.assert_allclose(metrics["episode_return"], [3.0, 7.0])
    np.testing.assert_allclose(metrics["episode_length"], [6.0, 14.0])
    np.testing.assert_array_equal(metrics["episodes"], [2, 2])
    np.testing.assert_allclose(metrics["loss"], [1.25, 3.25])
    np.testing.assert_allclose(metrics["row"], [0.0, 0.0])
