"""Issue 68, symbolic links planted in a shared run directory: fusedrl writes none of its files
through one (a file written whole replaces the link, a file streamed refuses it, a run directory
whose entries are links is refused in one line), reads none that leaves the directory, and sets
aside a checkpoint step that is a link or lacks its meta/ item in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from run_helpers import run_cli, trained_run

from rl.config.parsing import ConfigError

SECRET = "the colleague's file, which must stay as it is\n"


@pytest.fixture
def outside(tmp_path) -> Path:
    """A folder outside every run directory, holding files links may point at."""
    folder = tmp_path / "outside"
    folder.mkdir()
    return folder


def plant(link: Path, outside: Path, name: str | None = None) -> Path:
    """A symbolic link `link` to a new file in `outside` holding SECRET; returns the target."""
    target = outside / (name or link.name)
    target.write_text(SECRET)
    if link.exists() or link.is_symlink():
        link.unlink()
    link.symlink_to(target)
    return target


@pytest.fixture
def stopped_run(tmp_path_factory, tmp_path) -> Path:
    """A copy of the session's tiny run as a run stopped before its end (no final files)."""
    run_dir = tmp_path / "stopped"
    shutil.copytree(trained_run(tmp_path_factory), run_dir, symlinks=True)
    (run_dir / "final_params.msgpack").unlink()
    (run_dir / "summary.json").unlink()
    return run_dir


def metrics_only_run(folder: Path) -> Path:
    """A run directory holding only a hand-written metrics.jsonl (what `rl plot` reads)."""
    folder.mkdir()
    rows = [
        {"setting": 0, "seed": seed, "log_point": t, "step": 1000 * (t + 1), "episode_return": t}
        for seed in range(2)
        for t in range(3)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def test_plot_replaces_a_planted_learning_curve_link(tmp_path, outside, capsys):
    run_dir = metrics_only_run(tmp_path / "run")
    target = plant(run_dir / "learning_curve.png", outside)
    assert run_cli(["plot", run_dir]) == 0
    assert target.read_text() == SECRET
    png = run_dir / "learning_curve.png"
    assert not png.is_symlink() and png.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    "name",
    [".rl-train.lock", "metrics.jsonl", "metrics.csv", "summary.json", "final_params.msgpack"],
)
def test_resume_writes_through_no_planted_file_link(stopped_run, outside, name, capsys):
    target = plant(stopped_run / name, outside)
    status = run_cli(["train", "--resume", stopped_run])
    err = capsys.readouterr().err
    assert target.read_text() == SECRET
    assert status == 2 and err.count("\n") == 1 and "symbolic link" in err and name in err


def test_resume_refuses_a_linked_tensorboard_folder(stopped_run, outside, capsys):
    shutil.rmtree(stopped_run / "tensorboard")
    (outside / "tb").mkdir()
    (stopped_run / "tensorboard").symlink_to(outside / "tb")
    assert run_cli(["train", "--resume", stopped_run]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tensorboard" in err and "symbolic link" in err
    assert list((outside / "tb").iterdir()) == []


def test_write_final_and_config_replace_links(tmp_path, outside):
    from rl.config import load_config
    from rl.run.run_dir import write_final, write_run_config

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    targets = [
        plant(run_dir / name, outside)
        for name in ("config.yaml", "final_params.msgpack", "summary.json")
    ]
    write_run_config(run_dir, load_config("qlearning_gridworld"), [{}])
    write_final(run_dir, {"w": __import__("numpy").zeros(2)}, {"metric": "x"})
    assert all(target.read_text() == SECRET for target in targets)
    assert not any((run_dir / t.name).is_symlink() for t in targets)


def test_a_linked_checkpoint_step_is_set_aside_as_the_link(stopped_run, outside, capsys):
    newest = max((stopped_run / "checkpoints").iterdir(), key=lambda p: int(p.name))
    moved = outside / "step"
    shutil.move(newest, moved)
    newest.symlink_to(moved)
    before = sorted(p.relative_to(moved) for p in moved.rglob("*"))
    assert run_cli(["train", "--resume", stopped_run]) == 0
    err = capsys.readouterr().err
    assert err.count("symbolic link") == 1 and "damaged_checkpoints" in err
    assert (stopped_run / "damaged_checkpoints" / newest.name).is_symlink()
    assert sorted(p.relative_to(moved) for p in moved.rglob("*")) == before


def test_eval_skips_a_linked_checkpoint_step_in_one_line(stopped_run, outside, capsys):
    steps = sorted((stopped_run / "checkpoints").iterdir(), key=lambda p: int(p.name))
    shutil.copytree(steps[-1], outside / "step")
    linked = steps[-1].parent / str(int(steps[-1].name) + 1000)
    linked.symlink_to(outside / "step")
    assert run_cli(["eval", stopped_run, "--episodes", "1"]) == 0
    err = capsys.readouterr().err
    assert err.count("symbolic link") == 1 and str(linked) in err


@pytest.mark.parametrize("command", ["resume", "eval"])
def test_a_checkpoint_without_meta_is_set_aside_in_one_line(stopped_run, command, capsys):
    newest = max((stopped_run / "checkpoints").iterdir(), key=lambda p: int(p.name))
    shutil.rmtree(newest / "meta")
    if command == "resume":
        assert run_cli(["train", "--resume", stopped_run]) == 0
        assert (stopped_run / "damaged_checkpoints" / newest.name).is_dir()
    else:
        assert run_cli(["eval", stopped_run, "--episodes", "1"]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "meta/ folder is missing" in line]
    assert len(warnings) == 1 and str(newest) in warnings[0]


def test_reads_refuse_a_config_link_leaving_the_run(tmp_path_factory, tmp_path, outside, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run(tmp_path_factory), run_dir, symlinks=True)
    (outside / "config.yaml").write_text((run_dir / "config.yaml").read_text())
    (run_dir / "config.yaml").unlink()
    (run_dir / "config.yaml").symlink_to(outside / "config.yaml")
    assert run_cli(["eval", run_dir, "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "outside the run directory" in err


def test_a_streamed_file_refuses_a_link(tmp_path, outside):
    from rl.run.logging import RunLogger

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    target = plant(run_dir / "metrics.csv", outside)
    logger = RunLogger(run_dir, [{}], 1)
    with pytest.raises(ConfigError, match="symbolic link"):
        logger.open()
    assert target.read_text() == SECRET
