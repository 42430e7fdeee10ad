"""`rl train`: a tiny run writes a complete run directory; every bad input exits 2 with one line on
stderr and writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from rl.cli.main import main

TINY = {
    "env": {"id": "GridWorld", "params": {"size": 3, "max_steps_in_episode": 20}},
    "agent": {
        "name": "qlearning",
        "total_steps": 400,
        "log_interval": 100,
        "epsilon_decay_steps": 200,
    },
    "run": {"seed": 7, "seeds": 3, "progress": False},
}


def write_config(tmp_path, data=None, name="tiny.yaml"):
    data = TINY if data is None else data
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def run_cli(argv):
    """(exit status, stdout, stderr) of rl.cli.main.main, whether it returns or exits."""
    try:
        return main([str(a) for a in argv])
    except SystemExit as exit:
        return exit.code


def test_train_writes_a_complete_run_directory(tmp_path, capsys):
    config_path = write_config(tmp_path)
    out = tmp_path / "runs"
    status = run_cli(["train", config_path, "--output-dir", out, "--name", "tiny"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    run_dir = out / "tiny"
    assert run_dir.is_dir()

    # the resolved config: every default filled in, reloadable as the same config
    from rl.config import build_config

    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert (
        saved["agent"]["lr"] == 0.1
        and saved["agent"]["gamma"] == 0.99
        and saved["agent"]["total_steps"] == 400
    )
    assert (
        saved["run"]["seeds"] == 3
        and saved["run"]["output_dir"] == str(out)
        and saved["run"]["name"] == "tiny"
    )
    assert saved["env"] == TINY["env"]
    config = build_config(
        {k: v for k, v in saved.items() if k in ("env", "agent", "run", "kernels")}
    )
    assert config.agent.epsilon_decay_steps == 200

    # metrics: one row per seed and log point, with the required metrics
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * 4
    assert sorted({row["seed"] for row in rows}) == [0, 1, 2]
    for seed in range(3):
        steps = [row["step"] for row in rows if row["seed"] == seed]
        assert steps == [100, 200, 300, 400]
    assert {"step", "episode_return", "episode_length", "greedy_episode_length"} <= set(rows[0])

    # final params: [settings, seeds, states, actions], equal to training the same seeds as a
    # library
    from flax import serialization

    params = np.asarray(
        serialization.msgpack_restore((run_dir / "final_params.msgpack").read_bytes())
    )
    assert params.shape == (1, 3, 9, 4)
    from rl.run.train import train_many

    final_state, metrics = train_many(config)
    np.testing.assert_array_equal(params, np.asarray(final_state.params))
    jsonl_returns = np.array(
        [
            [
                row["episode_return"] if row["episode_return"] is not None else np.nan
                for row in rows
                if row["seed"] == s
            ]
            for s in range(3)
        ]
    )
    np.testing.assert_array_equal(jsonl_returns, np.asarray(metrics["episode_return"])[0])

    # summary: written and printed
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["agent"] == "qlearning" and summary["env"] == "GridWorld"
    assert len(summary["settings"]) == 1 and summary["settings"][0]["seeds"] == 3
    row = summary["settings"][0]
    # the greedy evaluation return where the agent logs one, else the exploratory episode_return
    evaluates = any(r.get("eval_return") is not None for r in rows)
    metric = "eval_return" if evaluates else "episode_return"
    assert summary["metric"] == metric
    assert len(row["per_seed"]) == 3 and row["label"] == ""
    assert "[config]" not in captured.out
    assert summary["compile_seconds"] > 0 and summary["env_steps_per_second"] > 0
    assert f"run directory: {run_dir}" in captured.out
    if not evaluates:
        assert "exploratory" in summary["metric_description"]
        assert row["mean"] == pytest.approx(1.0)  # every episode that ends reaches the goal
        assert (
            row["median"] == pytest.approx(1.0)
            and row["min"] == row["max"] == pytest.approx(1.0)
            and row["std"] == pytest.approx(0.0)
        )
        expected = "final episode_return (return of the training (exploratory) episodes"
        assert expected in captured.out
        assert "  1 +- 0 (median 1, min 1, max 1; 3 seeds)" in captured.out
    else:
        assert "final eval_return, the greedy evaluation return (" in captured.out


def _summary_of(metrics, grid=({},)):
    from rl.config import build_config
    from rl.run.summary import summarise

    config = build_config(TINY)
    return summarise(
        config, list(grid), {k: np.asarray(v, np.float64) for k, v in metrics.items()}, 1.0, 2.0
    )


def test_summary_reports_the_greedy_eval_return_when_the_agent_has_one():
    # [settings=1, seeds=3, log points=3]; eval_return differs from the exploratory episode_return
    episode = [[[1.0, 2.0, 3.0], [1.0, 2.0, 5.0], [1.0, np.nan, np.nan]]]
    evals = [[[10.0, 20.0, 30.0], [10.0, 40.0, np.nan], [np.nan, np.nan, np.nan]]]
    summary = _summary_of(
        {"step": [[[100, 200, 300]] * 3], "episode_return": episode, "eval_return": evals}
    )
    assert summary["metric"] == "eval_return" and "greedy" in summary["metric_description"]
    row = summary["settings"][0]
    assert row["per_seed"] == [30.0, 40.0, None]  # the last finite value per seed; None where none
    assert (
        row["mean"] == 35.0
        and row["median"] == 35.0
        and row["std"] == 5.0
        and row["min"] == 30.0
        and row["max"] == 40.0
    )
    from rl.cli.output import summary_lines

    lines = summary_lines(summary)
    assert lines[1].startswith("final eval_return, the greedy evaluation return (greedy-policy")
    assert lines[2] == "  35 +- 5 (median 35, min 30, max 40; 2 of 3 seeds have a value)"


def test_summary_falls_back_to_episode_return_and_labels_sweep_settings():
    nan = [[[np.nan, np.nan]] * 2] * 2
    episode = [[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]]
    summary = _summary_of(
        {"step": [[[1, 2]] * 2] * 2, "episode_return": episode, "eval_return": nan},
        grid=[{"lr": 0.1}, {"lr": 0.5}],
    )
    assert summary["metric"] == "episode_return"
    assert [row["per_seed"] for row in summary["settings"]] == [[2.0, 4.0], [6.0, 8.0]]
    from rl.cli.output import summary_lines

    assert summary_lines(summary)[3] == "  lr=0.5: 7 +- 1 (median 7, min 6, max 8; 2 seeds)"


def test_overrides_after_options_are_applied(tmp_path, capsys):
    config_path = write_config(tmp_path)
    out = tmp_path / "runs"
    status = run_cli(
        [
            "train",
            config_path,
            "--output-dir",
            out,
            "agent.lr=0.3",
            "--seeds",
            "2",
            "run.name=after",
            "agent.gamma=0.9",
        ]
    )
    assert status == 0, capsys.readouterr().err
    saved = yaml.safe_load((out / "after" / "config.yaml").read_text())
    assert (
        saved["agent"]["lr"] == 0.3
        and saved["agent"]["gamma"] == 0.9
        and saved["run"]["seeds"] == 2
    )
    rows = (out / "after" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 2 * 4


def _bad(tmp_path, **changes):
    """A config file with some top-level sections replaced (None deletes one)."""
    data = {k: dict(v) for k, v in TINY.items()}
    for section, value in changes.items():
        if value is None:
            data.pop(section)
        else:
            data[section] = value
    return write_config(tmp_path, data, "bad.yaml")


BAD_INPUTS = {
    "missing file": (
        lambda p: ["train", p / "nope.yaml"],
        "config file .*nope.yaml' does not exist",
    ),
    "unparsable file": (lambda p: ["train", _text(p, "agent: {name: [\n")], "cannot be parsed"),
    "not a mapping": (lambda p: ["train", _text(p, "- 1\n")], "must hold a mapping"),
    "unknown key": (
        lambda p: ["train", _bad(p, agent={**TINY["agent"], "lrr": 0.1})],
        r"unknown key 'agent\.lrr' \(did you mean 'agent\.lr'\?\)",
    ),
    "unknown key override": (
        lambda p: ["train", write_config(p), "agent.epsilon_stat=0.5"],
        r"unknown key 'agent\.epsilon_stat' \(did you mean 'agent\.epsilon_start'\?\)",
    ),
    "wrong type": (
        lambda p: ["train", write_config(p), "agent.lr=fast"],
        r"agent\.lr: expected a number",
    ),
    "negative lr": (
        lambda p: ["train", write_config(p), "agent.lr=-0.1"],
        r"agent\.lr: -0\.1 is out of range",
    ),
    "gamma above 1": (
        lambda p: ["train", write_config(p), "agent.gamma=1.5"],
        r"agent\.gamma: 1\.5 is out of range",
    ),
    "gamma below 0": (
        lambda p: ["train", _bad(p, agent={**TINY["agent"], "gamma": -0.5})],
        r"agent\.gamma: -0\.5 is out of range",
    ),
    "zero seeds flag": (
        lambda p: ["train", write_config(p), "--seeds", "0"],
        r"run\.seeds: 0 is out of range",
    ),
    "zero seeds override": (
        lambda p: ["train", write_config(p), "run.seeds=0"],
        r"run\.seeds: 0 is out of range",
    ),
    "unknown env": (
        lambda p: ["train", write_config(p), "env.id=GridWorl"],
        r"env\.id: unknown env id 'GridWorl'\. Did you mean 'GridWorld'\?",
    ),
    "unknown env param": (
        lambda p: ["train", write_config(p), "env.params.colour=red"],
        r"env\.params: .*colour",
    ),
    "unknown agent": (
        lambda p: ["train", write_config(p), "agent.name=qlearnin"],
        r"agent\.name: unknown agent 'qlearnin' \(did you mean 'qlearning'\?\)",
    ),
    "missing section": (lambda p: ["train", _bad(p, agent=None)], r"missing section 'agent'"),
    "bad override syntax": (
        lambda p: ["train", write_config(p), "=0.3"],
        r"override '=0\.3' has an empty key",
    ),
    "override into a value": (
        lambda p: ["train", write_config(p), "agent.lr.x=1"],
        r"agent\.lr( is not a section|: expected a number)",
    ),
    "bad sweep spec": (
        lambda p: ["train", write_config(p), "--sweep", "agent.lr"],
        r"--sweep 'agent\.lr' must look like",
    ),
    "unsweepable key": (
        lambda p: ["train", write_config(p), "--sweep", "agent.total_steps=100,200"],
        r"agent\.total_steps cannot be swept",
    ),
    "bad sweep value": (
        lambda p: ["train", write_config(p), "--sweep", "agent.lr=0.1,-2"],
        r"agent\.lr: -2(\.0)? is out of range",
    ),
    "steps not a multiple": (
        lambda p: ["train", write_config(p), "agent.log_interval=300"],
        r"must be a multiple of agent\.log_interval",
    ),
    "run name outside the output dir": (
        lambda p: ["train", write_config(p), "run.name=../escaped"],
        r"run\.name: '\.\./escaped' must be a plain directory name",
    ),
    "unknown option": (
        lambda p: ["train", write_config(p), "--sedes", "3"],
        r"unrecognized arguments: --sedes",
    ),
    "non-integer seeds": (
        lambda p: ["train", write_config(p), "--seeds", "many"],
        r"--seeds: invalid int value",
    ),
}


def _text(tmp_path, text):
    path = tmp_path / "text.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_exits_2_with_one_line_and_writes_nothing(case, tmp_path, capsys):
    make_argv, pattern = BAD_INPUTS[case]
    out = tmp_path / "out"
    argv = make_argv(tmp_path) + ["--output-dir", out]
    if not any(str(arg).startswith("run.name=") for arg in argv):
        argv += ["--name", "run"]
    before = sorted(os.listdir(tmp_path))
    status = run_cli(argv)
    captured = capsys.readouterr()
    assert status == 2, (case, captured)
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("rl: error: ")
    import re

    assert re.search(pattern, lines[0]), lines[0]
    assert captured.out == ""
    assert not out.exists()
    assert sorted(os.listdir(tmp_path)) == before


def test_existing_run_directory_is_refused_and_left_alone(tmp_path, capsys):
    out = tmp_path / "out"
    (out / "run").mkdir(parents=True)
    (out / "run" / "keep.txt").write_text("mine")
    status = run_cli(["train", write_config(tmp_path), "--output-dir", out, "--name", "run"])
    captured = capsys.readouterr()
    assert (
        status == 2
        and "already exists" in captured.err
        and len(captured.err.strip().splitlines()) == 1
    )
    assert os.listdir(out / "run") == ["keep.txt"]


def test_console_script_reports_bad_input(tmp_path):
    """The installed `rl` entry point (or `python -m rl.cli.main` where it is not installed)."""
    out = tmp_path / "out"
    argv = ["train", str(write_config(tmp_path)), "agent.gamma=2", "--output-dir", str(out)]
    command = (
        ["rl", *argv] if _has_console_script() else [sys.executable, "-m", "rl.cli.main", *argv]
    )
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "rl: error: agent.gamma: 2.0 is out of range (must be <= 1.0)"
    ]
    assert not out.exists()


def _has_console_script() -> bool:
    import shutil

    return shutil.which("rl") is not None


def test_train_and_eval_leave_the_kernels_process_wide_backend_alone(tmp_path, capsys):
    """`kernels.backend` in a config reaches the agents as a value; `rl train` and `rl eval` never
    set the kernels' process-wide choice."""
    import kernels

    before = kernels.get_backend()
    out = tmp_path / "runs"
    assert (
        run_cli(
            [
                "train",
                write_config(tmp_path),
                "--output-dir",
                out,
                "--name",
                "interp",
                "kernels.backend=interpret",
            ]
        )
        == 0
    )
    assert yaml.safe_load((out / "interp" / "config.yaml").read_text())["kernels"] == {
        "backend": "interpret",
        "deterministic": False,
        "precision": "float32",
    }
    assert kernels.get_backend() == before
    assert run_cli(["eval", out / "interp", "--episodes", "2"]) == 0
    assert kernels.get_backend() == before


def test_progress_names_the_run_directory_then_the_compile_never_0_steps_per_s(tmp_path, capsys):
    config_path = write_config(tmp_path, {**TINY, "run": {**TINY["run"], "progress": True}})
    assert run_cli(["train", config_path, "--output-dir", tmp_path / "runs", "--name", "bar"]) == 0
    err = capsys.readouterr().err
    # the run directory first, before the wait for the compile (the summary repeats it)
    assert err.splitlines()[0] == f"rl: run directory: {tmp_path / 'runs' / 'bar'}"
    err = err.split("\n", 1)[1]
    # one program initialises, one runs a log point (or both load from the compilation cache)
    assert err.startswith("rl: compiling the training program for 3 seeds (XLA compilation")
    assert err.splitlines()[1].startswith(
        ("rl: compiled in ", "rl: loaded the compiled programs from the cache in ")
    )
    # stderr is not a terminal here: one line per log point, no carriage-return redraws
    assert "\r" not in err
    draws = [line for line in err.splitlines() if line.startswith("qlearning/GridWorld [")]
    assert len(draws) == 4 and "steps/s from the next log point" in draws[0]
    assert draws[-1].startswith("qlearning/GridWorld [" + "#" * 30 + "] 400/400 steps")
    assert " 0 steps/s" not in err


def test_progress_bar_rate_starts_at_the_second_log_point():
    import io

    from rl.run.logging import ProgressBar

    stream = io.StringIO()
    bar = ProgressBar(300, label="t", min_interval=0.0, stream=stream)
    bar({"step": np.array([[100]])})
    first = stream.getvalue()
    assert "100/300 steps  steps/s from the next log point" in first and "0 steps/s" not in first
    bar.first_step_time -= 2.0  # two seconds between the log points
    bar({"step": np.array([[300]])})
    assert "300/300 steps  100 steps/s per seed" in stream.getvalue()[len(first) :]


def test_smoke_seeds_caps_the_seeds_and_names_a_bad_value(monkeypatch):
    from rl.cli.main import build_parser
    from rl.cli.train import resolve_train_config
    from rl.config.parsing import ConfigError

    args = build_parser().parse_args(["train", "configs/qlearning_gridworld.yaml", "--seeds", "16"])
    monkeypatch.setenv("FUSEDRL_SMOKE_SEEDS", "2")
    assert resolve_train_config(args)[0].run.seeds == 2
    monkeypatch.setenv("FUSEDRL_SMOKE_SEEDS", "64")
    assert resolve_train_config(args)[0].run.seeds == 16
    monkeypatch.setenv("FUSEDRL_SMOKE_SEEDS", "two")
    with pytest.raises(
        ConfigError,
        match="environment variable FUSEDRL_SMOKE_SEEDS: expected a positive integer, got 'two'",
    ):
        resolve_train_config(args)


def test_warnings_are_one_clean_line_without_colour_codes(capsys):
    """gymnasium colours its warnings for a terminal (ESC[33m ... ESC[0m); while an `rl` command
    runs, every Python warning is one line, `rl: warning: ...`, without escape sequences."""
    import warnings

    import gymnasium

    from rl.cli.output import command_output

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        with command_output():
            low, high = np.full(2, 0.1), np.full(2, 1.1)  # float64 bounds of a float32 Box
            gymnasium.spaces.Box(low=low, high=high, dtype=np.float32)
            warnings.warn("a warning\nover two lines")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and not any("\x1b" in line for line in lines), lines
    assert lines[0].startswith("rl: warning: Box low's precision lowered by casting to float32")
    assert lines[0].endswith(")") and "gymnasium/spaces/box.py:" in lines[0]
    assert lines[2].startswith("rl: warning: a warning over two lines (UserWarning, test_cli.py:")


@pytest.mark.parametrize(
    "command", [["train", "--resume"], ["eval"], ["plot"], ["compare", "RUN"]], ids=str
)
def test_a_file_given_as_run_directory_is_named_a_file(command, tmp_path, capsys):
    run_dir = tmp_path / "runs" / "tiny"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("{}")
    afile = tmp_path / "afile.txt"
    afile.write_text("")
    for path, hint in (
        (afile, " (rl train writes one per run: runs/<agent>-<env>-<time>/)"),
        (run_dir / "config.yaml", f"; its folder {str(run_dir)!r} is one"),
    ):
        argv = [run_dir if arg == "RUN" else arg for arg in command] + [path]
        assert run_cli(argv) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err == (
            f"rl: error: {str(path)!r} is a file, not a run directory{hint}\n"
        )


def test_counts_of_one_are_singular():
    """'1 seed', '1 episode': rl train's summary and rl eval's lines."""
    from rl.cli.evaluate import evaluation_lines
    from rl.cli.output import summary_lines

    summary = _summary_of({"step": [[[100, 200]]], "episode_return": [[[1.0, 2.0]]]})
    assert summary_lines(summary)[2].endswith("; 1 seed)")
    row = {"label": "", "mean": 2.0, "std": 0.0, "median": 2.0, "min": 2.0, "max": 2.0}
    row.update(seed_mean_std=0.0, episodes=1, seeds=1, length_mean=9.0)
    result = {"agent": "ppo", "env": "CartPole-v1", "params": "final params", "metric": "return"}
    result.update(metric_description="greedy return", settings=[row])
    assert "over 1 episode x 1 seed, mean length 9" in evaluation_lines(result)[2]
