"""Log points on the host: the sinks that receive them (the run's files, the progress bar,
Weights & Biases) and what feeds them.

The host loops (rl.run.train's, the actor-learner path's) call `publish(metrics)` once per log point
with the metrics of every training instance; every sink registered with `sink(fn)` receives
`{name: np.ndarray}` whose leading axes are the run's batch axes ([settings, seeds], or [seeds]).
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable

import numpy as np

from rl.run.tensorboard_events import EventFile

_SINKS: list[Callable[[dict], None]] = []
_LOCK = threading.Lock()


def publish(values: dict) -> None:
    """Send one log point (`{name: array}`, "step" among them) to every registered sink."""
    values = {k: np.asarray(v) for k, v in values.items()}
    with _LOCK:
        sinks = list(_SINKS)
    for sink in sinks:
        sink(values)


def run_batch(values: dict) -> dict | None:
    """A log point as a run's [settings, seeds, ...] arrays: a [settings, seeds] batch as it is; a
    [seeds] batch (a run of one setting, which `rl.run.programs.vmap_over_settings` traces without
    the settings axis) with a settings axis of 1 put in front; None for any other shape of "step"
    (not a run's batch, e.g. an unbatched train call)."""
    ndim = np.ndim(values["step"])
    if ndim == 2:
        return values
    if ndim == 1:
        return {k: np.asarray(v)[None] for k, v in values.items()}
    return None


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
    """A text progress bar on stderr (or `stream`), fed by log points.

    On a terminal (`stream.isatty()`) the bar redraws in place with a carriage return, at most every
    `min_interval` seconds; anywhere else (a log file, a pipe) it writes one line per log point, so
    a log holds one readable line per log point and no carriage-return updates."""

    def __init__(
        self, total_steps: int, label: str = "train", min_interval: float = 0.5, stream=None
    ):
        self.total = int(total_steps)
        self.label = label
        self.min_interval = min_interval
        self.stream = stream or sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.interactive = bool(isatty and isatty())
        self.start = time.perf_counter()
        self.last_draw = -float("inf")  # the first log point draws
        self.first_step_time = None
        self.first_step = 0
        self.done = 0
        self.width = 0

    def __call__(self, values: dict) -> None:
        step = int(np.max(values["step"]))
        now = time.perf_counter()
        if self.first_step_time is None:  # the rate leaves compilation out: it counts from here
            self.first_step_time, self.first_step = now, step
        self.done = max(self.done, step)
        if (
            not self.interactive
            or now - self.last_draw >= self.min_interval
            or self.done >= self.total
        ):
            self.last_draw = now
            self.draw(now)

    def line(self, now: float) -> str:
        """The bar, the steps done and the rate since the first log point."""
        frac = min(self.done / max(self.total, 1), 1.0)
        bar = "#" * int(30 * frac) + "-" * (30 - int(30 * frac))
        elapsed = now - (self.first_step_time or now)
        rate = (
            (self.done - self.first_step) / elapsed
            if elapsed > 0 and self.done > self.first_step
            else None
        )
        speed = (
            f"{rate:,.0f} steps/s per seed"
            if rate is not None
            else "steps/s from the next log point"
        )
        return f"{self.label} [{bar}] {self.done}/{self.total} steps  {speed}"

    def draw(self, now: float) -> None:
        line = self.line(now)
        if self.interactive:  # padded: a shorter line covers a longer one
            self.stream.write(f"\r{line.ljust(self.width)} ")
            self.width = len(line)
        else:
            self.stream.write(f"{line}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.interactive:  # end the line the bar was redrawn on
            self.stream.write("\n")
            self.stream.flush()


# ---------------------------------------------------------------- run directory writers


NAN_ALLOWED_PREFIXES = ("episode", "eval_")  # returns and lengths are NaN when no episode ended


class RunLogger:
    """A sink writing each log point of a run to `metrics.jsonl`, `metrics.csv` and TensorBoard
    event files (`tensorboard/<setting>/seed_<i>/`, one TensorBoard run per seed), as it arrives.

    Log points carry `{name: [settings, seeds]}` arrays (a run of one setting sends `[seeds]`, read
    as one setting by `run_batch`). Each JSONL/CSV row is one (setting, seed, log point) with every
    metric, plus host-side `steps_per_second` (env steps per second summed over all seeds and
    settings, measured between consecutive log points) and `wall_time` (seconds since the run
    started). Rows are buffered and the files flushed at most every `flush_seconds` (and by
    `flush()`, which the runner calls before each checkpoint), so the host work stays bounded
    however often log points arrive. Event files are written synchronously by
    rl.run.tensorboard_events (no TensorFlow, tensorboardX or protobuf import, no writer threads).
    """

    def __init__(self, run_dir, grid: list[dict], num_seeds: int, flush_seconds: float = 2.0):
        from pathlib import Path

        self.run_dir = Path(run_dir)
        self.grid = grid
        self.num_seeds = num_seeds
        self.flush_seconds = flush_seconds
        self.columns: list[str] | None = None
        self.pending: list[dict] = []
        self.host = {"steps_per_second": [], "wall_time": []}
        # log points received since the start of the run (including restored ones)
        self.received = 0
        self.start = time.perf_counter()
        self.wall_offset = 0.0
        self.last_time = None
        self.last_step = None
        self.last_flush = time.perf_counter()
        self.tb = {}
        self.tb_suffix = ""
        self.purge_step = None
        self._jsonl = self._csv = None
        self.write_error: OSError | None = None

    # ---- starting and resuming

    def open(self, history: dict | None = None) -> None:
        """Create the files, or (resuming) rewrite them from a checkpoint's `history` so they hold
        exactly the restored log points (rows a killed process wrote after its checkpoint go
        away)."""
        from rl.run.run_files import open_no_follow  # a planted link is an error, not a target

        self._jsonl = open_no_follow(self.run_dir / "metrics.jsonl")
        self._csv = open_no_follow(self.run_dir / "metrics.csv")
        if history is None or not history.get("seed"):
            return
        seed_metrics = history["seed"]
        points = next(iter(seed_metrics.values())).shape[-1]
        self.host = {
            k: [float(v) for v in np.asarray(history["host"].get(k, np.full(points, np.nan)))]
            for k in self.host
        }
        self.wall_offset = self.host["wall_time"][-1] if points else 0.0
        for t in range(points):
            values = {k: v[..., t] for k, v in seed_metrics.items()}
            # TensorBoard already holds these (flushed before their checkpoint): files only.
            self._queue_rows(
                values,
                t,
                self.host["steps_per_second"][t],
                self.host["wall_time"][t],
                tensorboard=False,
            )
        self.received = points
        self.last_step = int(np.max(seed_metrics["step"][..., -1])) if points else None
        self.purge_step = self.last_step + 1 if points else None
        self.tb_suffix = f".resumed{points}"
        self.flush()

    # ---- the sink

    def __call__(self, values: dict) -> None:
        now = time.perf_counter()
        values = run_batch(values)
        if values is None:
            return
        step = np.asarray(values["step"])
        newest = int(step.max())
        reference_time = self.last_time if self.last_time is not None else self.start
        reference_step = self.last_step if self.last_step is not None else 0
        elapsed = now - reference_time
        rate = (newest - reference_step) * step.size / elapsed if elapsed > 0 else float("nan")
        wall = self.wall_offset + (now - self.start)
        self.last_time, self.last_step = now, newest
        self.host["steps_per_second"].append(float(rate))
        self.host["wall_time"].append(float(wall))
        self._queue_rows(values, self.received, rate, wall)
        self.received += 1
        if now - self.last_flush >= self.flush_seconds and self.write_error is None:
            try:
                self.flush()
            except OSError as err:  # raised from inside XLA's callback it would lose its type
                self.write_error = err

    def mark_start(self) -> None:
        """Start the clock for steps per second (call just before the compiled program runs)."""
        self.start = self.last_time = time.perf_counter()

    def host_history(self) -> dict:
        return {k: np.asarray(v, np.float64) for k, v in self.host.items()}

    # ---- writing

    def _queue_rows(
        self, values: dict, log_point: int, rate: float, wall: float, tensorboard: bool = True
    ) -> None:
        arrays = {k: np.asarray(v) for k, v in values.items()}
        if self.columns is None:
            self.columns = (
                ["setting", "seed", "log_point"]
                + [k for k in arrays if arrays[k].ndim == 2]
                + ["steps_per_second", "wall_time"]
            )
            self._csv.write(",".join(self.columns) + "\n")
        settings, seeds = arrays["step"].shape
        for s in range(settings):
            for i in range(seeds):
                row = {"setting": s, "seed": i, "log_point": log_point}
                row.update({k: _python_number(v[s, i]) for k, v in arrays.items() if v.ndim == 2})
                row["steps_per_second"] = _python_number(np.float64(rate))
                row["wall_time"] = round(wall, 4)
                self.pending.append((row, tensorboard))

    def flush(self) -> None:
        """Write the buffered rows to every file and flush them. A write that failed while a log
        point arrived is raised here (again, for every later flush)."""
        if self.write_error is not None:
            raise self.write_error
        try:
            self._write_pending()
        except OSError as err:
            self.write_error = err
            raise
        self.last_flush = time.perf_counter()

    def _write_pending(self) -> None:
        import json

        rows, self.pending = self.pending, []
        for row, tensorboard in rows:
            self._jsonl.write(json.dumps(row) + "\n")
            self._csv.write(
                ",".join(
                    ""
                    if row.get(c) is None
                    else repr(row[c])
                    if isinstance(row.get(c), float)
                    else str(row[c])
                    for c in self.columns
                )
                + "\n"
            )
            if tensorboard:
                self._write_event(row)
        self._jsonl.flush()
        self._csv.flush()
        for writer in self.tb.values():
            writer.flush()

    def _event_writer(self, setting: int, seed: int):
        key = (setting, seed)
        if key not in self.tb:
            folder = self.run_dir / "tensorboard" / f"setting_{setting}" / f"seed_{seed}"
            folder.mkdir(parents=True, exist_ok=True)
            writer = EventFile(folder, self.tb_suffix)
            if self.purge_step is not None:  # TensorBoard drops the killed process's later events
                writer.session_start(self.purge_step)
            self.tb[key] = writer
        return self.tb[key]

    def _write_event(self, row: dict) -> None:
        values = {
            k: v
            for k, v in row.items()
            if k not in ("setting", "seed", "log_point", "step", "wall_time") and v is not None
        }
        self._event_writer(row["setting"], row["seed"]).scalars(int(row["step"]), values)

    def close(self) -> None:
        """Flush and close every file; after a failed write (already raised) the files are closed
        without another error."""
        if self._jsonl is None:
            return
        if self.write_error is None:
            self.flush()
        for file in (self._jsonl, self._csv, *self.tb.values()):
            try:
                file.close()
            except OSError:
                if self.write_error is None:
                    raise
        self._jsonl = self._csv = None


def _python_number(value):
    """A NumPy scalar as a JSON-ready Python number (None for NaN and infinities)."""
    import math

    value = np.asarray(value).item()
    return None if isinstance(value, float) and not math.isfinite(value) else value
