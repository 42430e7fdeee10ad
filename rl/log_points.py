"""The scan over log points: a run is `num_log_points` log periods, each of whose metrics reach
the host sinks (`rl.logging.emit`) as it ends."""

from __future__ import annotations

from typing import Callable

import jax

from rl.logging import emit


def scan_log_points(log_period: Callable, state, num_log_points: int):
    """`lax.scan` of `log_period(state) -> (state, metrics)` over `num_log_points` log points, each
    log point's metrics sent to the host sinks (`rl.logging.emit`). Returns (state, stacked metrics)."""

    def body(state, _):
        state, metrics = log_period(state)
        return state, emit(metrics)

    return jax.lax.scan(body, state, None, length=num_log_points)
