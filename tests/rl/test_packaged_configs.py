"""Configs ship inside the package: `rl train NAME` finds one from any directory, `rl configs` lists
them, a file path still works; and a wheel built from the checkout installs and runs the Quickstart
from an empty directory."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from run_helpers import REPO, run_cli

from rl.config.parsing import ConfigError, find_config, packaged_configs

TINY = ["agent.total_steps=2000", "agent.log_interval=1000", "run.seeds=2", "--no-progress"]


def test_every_config_of_the_checkout_is_packaged():
    assert sorted(packaged_configs()) == sorted(
        path.stem for path in (REPO / "configs").glob("*.yaml")
    )


def test_rl_train_finds_a_packaged_config_by_name_from_any_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_cli(["train", "qlearning_gridworld", "--name", "by_name", *TINY]) == 0, (
        capsys.readouterr().err
    )
    assert (tmp_path / "runs" / "by_name" / "summary.json").is_file()


@pytest.mark.parametrize(
    "given", ["ppo_cartpole", "ppo_cartpole.yaml", "configs/ppo_cartpole.yaml"]
)
def test_names_and_checkout_paths_find_the_packaged_file(given, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ folder here
    assert find_config(given) == packaged_configs()["ppo_cartpole"]


def test_an_existing_file_path_wins_over_a_packaged_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ppo_cartpole").write_text("env: {id: GridWorld}\n")
    assert find_config("ppo_cartpole") == Path("ppo_cartpole")


def test_an_unknown_name_suggests_the_closest_packaged_configs():
    with pytest.raises(
        ConfigError,
        match=r"'ppo_cartpol' does not exist and is not a packaged config; "
        r"did you mean ppo_cartpole",
    ):
        find_config("ppo_cartpol")


def test_rl_configs_lists_every_packaged_config(capsys):
    assert run_cli(["configs"]) == 0
    out = capsys.readouterr().out
    listed = {line.split()[0] for line in out.splitlines()[:-1]}
    assert listed == set(packaged_configs())
    assert any(line.split()[1:] == ["qlearning", "on", "GridWorld"] for line in out.splitlines())


def environment_without_the_checkout() -> dict[str, str]:
    """os.environ with the checkout (and the current directory) dropped from PYTHONPATH: `import rl`
    must find the installed wheel, while other entries (on the offline GPU machine, the folder its
    wheels were unpacked into) still provide the dependencies."""
    env = dict(os.environ)
    entries = [
        entry for entry in env.pop("PYTHONPATH", "").split(os.pathsep) if entry not in ("", ".")
    ]
    kept = [entry for entry in entries if Path(entry).resolve() != REPO.resolve()]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    return env


def see_this_environments_packages(python: Path) -> None:
    """Appends the running interpreter's site-packages to the virtualenv's path (a .pth file), after
    its own: `--system-site-packages` shows only the base interpreter's, and when this test itself
    runs in a virtualenv (the GPU machine's python) the dependencies live in that one."""
    venv_site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    parents = [
        p
        for p in site.getsitepackages()
        if Path(p).is_dir() and Path(p).resolve() != Path(venv_site).resolve()
    ]
    (Path(venv_site) / "parent_environment.pth").write_text("\n".join(parents) + "\n")


def test_a_wheel_installs_and_runs_the_quickstart_from_an_empty_directory(tmp_path):
    """pip wheel (no network: this environment's setuptools), a fresh virtualenv that sees this
    environment's packages for the dependencies, the wheel installed into it (not editable), then
    `rl configs` and a short Quickstart from an empty directory."""
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            wheels,
            REPO,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = wheels.glob("fusedrl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"rl/configs/{path.name}" for path in (REPO / "configs").glob("*.yaml")} <= names
    assert not any(name.startswith(("tests/", "benchmarks/")) for name in names)

    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", venv], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    env = (
        environment_without_the_checkout()
    )  # else pip finds the checkout's egg-info and installs nothing
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", wheel],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    see_this_environments_packages(python)
    empty = tmp_path / "empty"
    empty.mkdir()
    where = subprocess.run(
        [python, "-c", "import rl; print(rl.__file__)"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert where.stdout.startswith(str(venv)), where  # the installed copy, not the checkout
    listing = subprocess.run(
        [venv / "bin" / "rl", "configs"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listing.returncode == 0 and "qlearning_gridworld" in listing.stdout, listing.stderr[
        -2000:
    ]
    train = subprocess.run(
        [venv / "bin" / "rl", "train", "qlearning_gridworld", "--name", "quick", *TINY],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert train.returncode == 0, train.stderr[-3000:]
    assert (empty / "runs" / "quick" / "summary.json").is_file()
    assert "final eval_return" in train.stdout  # the greedy evaluation Q-learning runs
