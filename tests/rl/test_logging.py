"""Logs of a run: metrics published by the host loop (one call per log point for all seeds and
settings), written as JSONL, CSV and TensorBoard event files that TensorBoard's own event reader
reads back with the same values."""

from __future__ import annotations

import csv
import io
import json

import jax
import numpy as np
import pytest
from run_helpers import TINY, trained_run

from rl.run.logging import ProgressBar, sink


def tensorboard_scalars(folder, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder))
    accumulator.Reload()
    return {event.step: event.value for event in accumulator.Scalars(tag)}


def jsonl_rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_jsonl_has_one_row_per_setting_seed_and_log_point(tmp_path_factory):
    rows = jsonl_rows(trained_run(tmp_path_factory))
    points = TINY["agent"]["total_steps"] // TINY["agent"]["log_interval"]
    assert len(rows) == TINY["run"]["seeds"] * points
    assert {(r["seed"], r["log_point"]) for r in rows} == {
        (s, t) for s in range(2) for t in range(points)
    }
    for row in rows:
        assert row["step"] == (row["log_point"] + 1) * TINY["agent"]["log_interval"]
        assert {"episode_return", "episode_length", "steps_per_second", "wall_time"} <= set(row)
        assert row["steps_per_second"] is None or row["steps_per_second"] > 0


def test_csv_matches_jsonl(tmp_path_factory):
    run_dir = trained_run(tmp_path_factory)
    with open(run_dir / "metrics.csv") as f:
        table = list(csv.DictReader(f))
    rows = jsonl_rows(run_dir)
    assert len(table) == len(rows)
    for line, row in zip(table, rows):
        for key, value in row.items():
            if value is None:
                assert line[key] == ""
            else:
                assert float(line[key]) == pytest.approx(value, rel=1e-12)


def test_tensorboard_event_reader_reads_the_metrics_back(tmp_path_factory):
    run_dir = trained_run(tmp_path_factory)
    rows = [r for r in jsonl_rows(run_dir) if r["seed"] == 1]
    folder = run_dir / "tensorboard" / "setting_0" / "seed_1"
    returns = tensorboard_scalars(folder, "episode_return")
    expected = {r["step"]: r["episode_return"] for r in rows if r["episode_return"] is not None}
    assert set(returns) == set(expected)
    for step, value in expected.items():
        assert returns[step] == pytest.approx(value, rel=1e-6)
    rates = tensorboard_scalars(folder, "steps_per_second")
    assert len(rates) == len(rows) and all(v > 0 for v in rates.values())


def test_the_runner_publishes_each_log_point_once_for_all_seeds_and_settings(tmp_path):
    from rl.config import build_config
    from rl.run.train import run_training

    config = build_config({**TINY, "run": {"seeds": 3, "progress": False, "checkpoint_every": 3}})
    calls = []
    with sink(lambda values: calls.append({k: np.asarray(v) for k, v in values.items()})):
        (tmp_path / "run").mkdir()
        run_training(config, [{"lr": 0.1}, {"lr": 0.5}], tmp_path / "run")
    assert len(calls) == TINY["agent"]["total_steps"] // TINY["agent"]["log_interval"]
    assert all(call["step"].shape == (2, 3) for call in calls)
    rows = jsonl_rows(tmp_path / "run")
    for row in rows:
        call = calls[row["log_point"]]
        assert row["episode_length"] == pytest.approx(
            float(call["episode_length"][row["setting"], row["seed"]]), nan_ok=True
        )


def test_run_batch_gives_a_batch_of_seeds_its_settings_axis():
    """The actor-learner loop publishes [seeds]; `run_batch` gives it the settings axis back; a
    one-setting run of the one-program path keeps [settings, seeds] in its outputs."""
    from rl.config import build_config
    from rl.run.logging import run_batch
    from rl.run.train import train_many

    config = build_config({**TINY, "run": {"seeds": 3}})
    _, metrics = jax.block_until_ready(train_many(config))
    assert np.asarray(metrics["step"]).shape[:2] == (1, 3)
    batch = run_batch({"step": np.arange(3), "loss": np.ones(3)})
    assert batch["step"].shape == (1, 3) and batch["loss"].shape == (1, 3)
    assert run_batch({"step": np.zeros((2, 3))})["step"].shape == (2, 3)
    assert run_batch({"step": np.int32(5)}) is None


def test_one_setting_alone_equals_the_same_setting_in_a_vmapped_pair():
    from rl.config import build_config
    from rl.run.train import train_many

    config = build_config({**TINY, "run": {"seeds": 2}})
    _, alone = train_many(config, [{"lr": 0.1}])
    _, pair = train_many(config, [{"lr": 0.1}, {"lr": 0.5}])
    np.testing.assert_allclose(
        np.asarray(alone["episode_length"])[0], np.asarray(pair["episode_length"])[0], rtol=1e-5
    )


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_writes_one_line_per_log_point_when_not_a_terminal():
    """A log file or a pipe gets one line per log point (however close together), no `\\r`."""
    stream = io.StringIO()
    bar = ProgressBar(400, label="t", min_interval=3600.0, stream=stream)
    for step in (100, 200, 300, 400):
        bar({"step": np.array([[step, step]])})
    bar.close()
    text = stream.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert [line.split("] ")[1].split(" steps")[0] for line in lines] == [
        "100/400",
        "200/400",
        "300/400",
        "400/400",
    ]
    assert all(line.startswith("t [") for line in lines)


def test_progress_bar_redraws_in_place_on_a_terminal():
    """On a terminal the bar redraws on one line with `\\r`, at most every `min_interval` seconds
    (and at the end), and `close` ends the line."""
    stream = _Terminal()
    bar = ProgressBar(400, label="t", min_interval=3600.0, stream=stream)
    for step in (100, 200, 300, 400):
        bar({"step": np.array([[step]])})
    bar.close()
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    draws = text[:-1].split("\r")[1:]
    assert len(draws) == 2  # the first log point, then the last (the interval had not passed)
    assert "100/400 steps" in draws[0] and "400/400 steps" in draws[1]
