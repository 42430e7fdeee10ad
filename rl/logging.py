"""Streaming log points from inside compiled training loops to the host.

Agents call `emit(metrics)` once per log point inside their `lax.scan`. The call reaches the host
through `jax.pure_callback` with `vmap_method="broadcast_all"`, so under `vmap` (seeds, sweep
settings) it is ONE host call per log point carrying the whole batch, not one call per seed. On the
host every registered sink receives `{name: np.ndarray}` whose leading axes are the vmapped axes.

`emit` returns the metrics with "step" routed through the host call; return those metrics from the
scan (as every agent does): the data dependency keeps XLA from dropping the callback.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

_SINKS: list[Callable[[dict], None]] = []
_LOCK = threading.Lock()


def emit(metrics: dict) -> dict:
    """Send one log point (a dict of scalars per training instance, must include "step") to the host
    sinks; returns `metrics` with its "step" now depending on the host call."""
    if "step" not in metrics:
        raise ValueError(f"emit: metrics must include 'step', got keys {sorted(metrics)}")
    metrics = {k: jnp.asarray(v) for k, v in metrics.items()}

    def deliver(values):
        values = {k: np.asarray(v) for k, v in values.items()}
        with _LOCK:
            sinks = list(_SINKS)
        for sink in sinks:
            sink(values)
        return values["step"]

    step_spec = jax.ShapeDtypeStruct(metrics["step"].shape, metrics["step"].dtype)
    step = jax.pure_callback(deliver, step_spec, metrics, vmap_method="broadcast_all")
    return {**metrics, "step": step}


@contextmanager
def sink(fn: Callable[[dict], None]):
    """Register `fn` to receive every log point emitted while the context is open."""
    with _LOCK:
        _SINKS.append(fn)
    try:
        yield fn
    finally:
        with _LOCK:
            _SINKS.remove(fn)


class ProgressBar:
    """A text progress bar on stderr, fed by log points; redraws at most every `min_interval` s."""

    def __init__(self, total_steps: int, label: str = "train", min_interval: float = 0.5, stream=None):
        self.total = int(total_steps)
        self.label = label
        self.min_interval = min_interval
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        self.last_draw = 0.0
        self.first_step_time = None
        self.first_step = 0
        self.done = 0

    def __call__(self, values: dict) -> None:
        step = int(np.max(values["step"]))
        now = time.perf_counter()
        if self.first_step_time is None:  # rate excludes compilation: count from the first log point
            self.first_step_time, self.first_step = now, step
        self.done = max(self.done, step)
        if now - self.last_draw >= self.min_interval or self.done >= self.total:
            self.last_draw = now
            self.draw(now)

    def draw(self, now: float) -> None:
        frac = min(self.done / max(self.total, 1), 1.0)
        bar = "#" * int(30 * frac) + "-" * (30 - int(30 * frac))
        elapsed = now - (self.first_step_time or now)
        rate = (self.done - self.first_step) / elapsed if elapsed > 0 else 0.0
        self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total} steps  {rate:,.0f} steps/s per seed ")
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()
