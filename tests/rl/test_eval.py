"""`rl eval`: the deterministic policy of a trained run's final (or chosen) params, vmapped over
episodes, agrees with the greedy evaluation done during training; a GIF of one episode."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import yaml
from run_helpers import run_cli, trained_run

import envs
from rl.cli.evaluate import evaluate
from rl.run.run_dir import load_params, load_run_config


def last_metric(run_dir, name):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = max(r["log_point"] for r in rows)
    return {r["seed"]: r[name] for r in rows if r["log_point"] == last}


def test_eval_matches_greedy_episode_length_measured_in_training(tmp_path_factory):
    run_dir = trained_run(tmp_path_factory)
    config, grid = load_run_config(run_dir)
    params, source = load_params(run_dir, config, grid)
    assert source.endswith("final_params.msgpack")
    returns, lengths = evaluate(config, params, episodes=5)
    assert returns.shape == lengths.shape == (1, 2, 5)
    max_steps = config.env.params["max_steps_in_episode"]
    for seed, greedy_length in last_metric(run_dir, "greedy_episode_length").items():
        np.testing.assert_array_equal(lengths[0, seed], min(greedy_length, max_steps))
        np.testing.assert_array_equal(returns[0, seed], 1.0 if greedy_length < max_steps else 0.0)


def test_eval_command_prints_return_and_writes_a_gif(tmp_path_factory, tmp_path, capsys):
    from PIL import Image

    run_dir = trained_run(tmp_path_factory)
    gif = tmp_path / "episode.gif"
    capsys.readouterr()
    report = tmp_path / "eval.json"
    assert run_cli(["eval", run_dir, "--episodes", "4", "--render", gif, "--json", report]) == 0
    out = capsys.readouterr().out
    assert "return (undiscounted return of the deterministic (greedy) policy" in out
    assert "4 episodes x 2 seeds" in out and str(gif) in out and "[config]" not in out
    result = json.loads(report.read_text())
    row = result["settings"][0]
    assert result["metric"] == "return" and row["episodes"] == 4 and len(row["per_seed"]) == 2
    assert (
        row["min"] <= row["median"] <= row["max"]
        and row["min"] <= row["mean"] <= row["max"]
        and row["std"] >= 0
    )
    assert row["mean"] == pytest.approx(np.mean(row["per_seed"]))
    config, grid = load_run_config(run_dir)
    params, _ = load_params(run_dir, config, grid)
    _, lengths = evaluate(config, params, episodes=1)
    with Image.open(gif) as image:
        assert image.format == "GIF"
        assert image.n_frames == int(lengths[0, 0, 0]) + 1  # the reset state and one frame per step
        first = np.asarray(image.convert("RGB"))
        image.seek(image.n_frames - 1)
        last = np.asarray(image.convert("RGB"))
    assert first.shape == last.shape and first.ndim == 3
    assert not np.array_equal(first, last)  # the agent moved


def test_eval_of_a_chosen_checkpoint(tmp_path_factory, capsys):
    run_dir = trained_run(tmp_path_factory)
    capsys.readouterr()
    assert run_cli(["eval", run_dir, "--episodes", "2", "--checkpoint", "12000"]) == 0
    assert "checkpoints/12000" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--checkpoint", "1234"], "no such checkpoint"),
        (["--episodes", "0"], "--episodes"),
        (["--render", "x.png"], ".gif"),
    ],
)
def test_eval_bad_input_is_one_line_exit_2(tmp_path_factory, capsys, args, message):
    run_dir = trained_run(tmp_path_factory)
    capsys.readouterr()
    assert run_cli(["eval", run_dir, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rl: error:") and message in err and err.count("\n") == 1


def test_eval_of_params_the_config_no_longer_builds_is_one_error(
    tmp_path_factory, tmp_path, capsys
):
    """config.yaml edited after the run (a larger grid: another Q-table): one line naming the file
    and where the params differ, exit 2."""
    run_dir = shutil.copytree(trained_run(tmp_path_factory), tmp_path / "run")
    data = yaml.safe_load((run_dir / "config.yaml").read_text())
    data["env"]["params"]["size"] = 6
    (run_dir / "config.yaml").write_text(yaml.safe_dump(data))
    capsys.readouterr()
    assert run_cli(["eval", run_dir]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rl: error:") and err.count("\n") == 1, err
    assert "final_params.msgpack: its params differ" in err and "config.yaml?" in err, err


def test_eval_of_a_missing_run_dir(tmp_path, capsys):
    assert run_cli(["eval", tmp_path / "nope"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_gif_writer_checks_frame_shape(tmp_path):
    with pytest.raises(ValueError, match="must be uint8 \\[H, W, 3\\]"):
        envs.save_gif(np.zeros((3, 4, 4)), tmp_path / "x.gif")
