"""`rl plot`: a PNG learning curve (median and percentile band over seeds), one line per run or
sweep setting."""

from __future__ import annotations

import numpy as np
from run_helpers import run_cli, trained_run, write_config

from rl.cli.plot import curves, read_metrics

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_plot_writes_a_png(tmp_path_factory, tmp_path, capsys):
    import matplotlib.pyplot as plt

    run_dir = trained_run(tmp_path_factory)
    out = tmp_path / "curve.png"
    assert run_cli(["plot", run_dir, "-o", out]) == 0
    data = out.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 5000
    image = plt.imread(out)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image[..., :3].std() > 0.01  # something is drawn


def test_plot_default_output_and_several_runs_with_a_sweep(tmp_path_factory, tmp_path):
    run_dir = trained_run(tmp_path_factory)
    config = write_config(tmp_path, seeds=2)
    assert (
        run_cli(
            [
                "train",
                config,
                "--name",
                "sweep",
                "--sweep",
                "agent.lr=0.05,0.5",
                "agent.total_steps=4000",
            ]
        )
        == 0
    )
    sweep_dir = tmp_path / "runs" / "sweep"
    assert run_cli(["plot", sweep_dir, run_dir]) == 0
    assert (sweep_dir / "learning_curve.png").read_bytes().startswith(PNG_SIGNATURE)
    by_setting = curves(read_metrics(sweep_dir), "episode_return")
    assert sorted(by_setting) == [0, 1]
    steps, values = by_setting[1]
    np.testing.assert_array_equal(steps, [1000, 2000, 3000, 4000])
    assert values.shape == (2, 4)


def test_plot_bad_input(tmp_path_factory, tmp_path, capsys):
    run_dir = trained_run(tmp_path_factory)
    assert run_cli(["plot", tmp_path / "missing"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert run_cli(["plot", run_dir, "--metric", "nonsense"]) == 2
    err = capsys.readouterr().err
    assert "nonsense" in err and "episode_return" in err
    assert not list(tmp_path.glob("*.png"))


def _handmade_run(folder, eval_returns):
    """A run directory holding only metrics.jsonl: 2 seeds x 3 log points, with `eval_return`
    values (None: the agent logged no finite one there)."""
    import json

    folder.mkdir()
    rows = [
        {
            "setting": 0,
            "seed": seed,
            "log_point": t,
            "step": 100 * (t + 1),
            "episode_return": float(t),
            "eval_return": eval_returns[t],
        }
        for seed in range(2)
        for t in range(3)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def test_plot_defaults_to_the_metric_the_summary_reports(tmp_path, monkeypatch):
    """eval_return (the greedy evaluation) where every run logged one, else episode_return: the
    summary's rule (rl.run.summary.summary_metric)."""
    import rl.cli.plot

    evaluated = _handmade_run(tmp_path / "evaluated", [None, 10.0, 20.0])
    exploring = _handmade_run(tmp_path / "exploring", [None, None, None])
    assert rl.cli.plot.default_metric([read_metrics(evaluated)]) == "eval_return"
    assert rl.cli.plot.default_metric([read_metrics(exploring)]) == "episode_return"
    both = [read_metrics(evaluated), read_metrics(exploring)]
    assert rl.cli.plot.default_metric(both) == "episode_return"

    plotted = []
    original = rl.cli.plot.curves
    monkeypatch.setattr(
        rl.cli.plot, "curves", lambda rows, metric: plotted.append(metric) or original(rows, metric)
    )
    assert run_cli(["plot", evaluated, "-o", tmp_path / "a.png"]) == 0
    assert run_cli(["plot", evaluated, exploring, "-o", tmp_path / "b.png"]) == 0
    assert run_cli(["plot", evaluated, "--metric", "episode_return", "-o", tmp_path / "c.png"]) == 0
    assert plotted == ["eval_return", "episode_return", "episode_return", "episode_return"]
    assert (tmp_path / "a.png").read_bytes().startswith(PNG_SIGNATURE)
