"""Log points: a run is `num_log_points` log periods, each ending in a log point's metrics; an
on-policy log period is a scan over updates; a log point's metrics are the env steps, the episodes
that ended and the mean of each update statistic. The programs hold no host callback (so JAX's
persistent compilation cache can keep them): the runner (rl.run.train) calls one log point at a time
and sends its metrics to the host sinks (`rl.run.logging.publish`)."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from rl.core.episodes import EpisodeTotals, episode_metrics, no_episodes


def scan_log_points(log_period: Callable, state, num_log_points: int):
    """`lax.scan` of `log_period(state) -> (state, metrics)` over `num_log_points` log points
    (`metrics` must hold "step"). Returns (state, metrics stacked over the log points)."""

    def body(state, _):
        state, metrics = log_period(state)
        if "step" not in metrics:
            raise ValueError(f"log point metrics must include 'step', got {sorted(metrics)}")
        return state, {name: jnp.asarray(value) for name, value in metrics.items()}

    return jax.lax.scan(body, state, None, length=num_log_points)


def scan_updates(update: Callable, state, num_updates: int):
    """`lax.scan` of `update(state, totals) -> (state, totals, stats)` over `num_updates` updates
    from no finished episodes: the updates of one log period. Returns (state, `EpisodeTotals` of
    the episodes that ended, stats stacked over the updates)."""

    def body(carry, _):
        state, totals, stats = update(*carry)
        return (state, totals), stats

    (state, totals), stats = jax.lax.scan(body, (state, no_episodes()), None, length=num_updates)
    return state, totals, stats


def log_point_metrics(step, totals: EpisodeTotals, stats, reduce: Callable = jnp.mean) -> dict:
    """A log point's metrics: "step" (env steps so far), the mean return and length of the episodes
    in `totals` and their count (`episode_metrics`), and `reduce` (mean; nanmean where stats are NaN
    before learning) of each entry of the dict `stats`."""
    return {
        "step": step,
        **episode_metrics(totals),
        **{name: reduce(value) for name, value in stats.items()},
    }
