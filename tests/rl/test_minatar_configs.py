"""The MinAtar configs (gymnax's Breakout-MinAtar, the cnn_minatar torso) train from `rl train`: one
update each with tiny overrides, env params flowing from `env.params`; `rl eval --render` draws the
trained policy's episode."""

from __future__ import annotations

import json

import pytest
from PIL import Image

pytest.importorskip("gymnax")  # the gymnax extra (the test extra installs it)

from rl.cli.main import main  # noqa: E402
from rl.config import load_config  # noqa: E402

# One update each: PPO and PQN, one rollout of 4 x 16 steps; DQN, one gradient step after the
# second 32 env steps.
TINY = {
    "configs/ppo_minatar_breakout.yaml": [
        "agent.total_steps=64",
        "agent.num_envs=4",
        "agent.num_steps=16",
        "agent.num_minibatches=2",
        "agent.log_interval=1",
    ],
    "configs/dqn_minatar_breakout.yaml": [
        "agent.total_steps=64",
        "agent.num_envs=4",
        "agent.buffer_size=256",
        "agent.learning_starts=64",
        "agent.train_freq=32",
        "agent.gradient_steps=1",
        "agent.log_interval=64",
        "agent.eval_episodes=1",
    ],
    "configs/pqn_minatar_breakout.yaml": [
        "agent.total_steps=64",
        "agent.num_envs=4",
        "agent.num_steps=16",
        "agent.num_minibatches=2",
        "agent.log_interval=1",
        "agent.eval_envs=1",
    ],
}
COMMON = [
    "run.seeds=1",
    "run.progress=false",
    "env.params.max_steps_in_episode=50",
    "kernels.backend=reference",
]


@pytest.mark.parametrize("path", sorted(TINY))
def test_shipped_config_loads_with_the_cnn_torso(path):
    config = load_config(path)
    assert config.env.id == "gymnax:Breakout-MinAtar"
    assert config.agent.network.torso == "cnn_minatar" and config.agent.network.hidden == (128,)


@pytest.mark.parametrize("path", sorted(TINY))
def test_one_update_from_the_config(path, tmp_path, capsys):
    status = main(
        ["train", path, *TINY[path], *COMMON, "--output-dir", str(tmp_path), "--name", "run"]
    )
    captured = capsys.readouterr()
    assert status == 0, captured.err
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert rows[-1]["step"] == 64
    if "dqn" in path:
        assert rows[-1]["gradient_steps"] == 1
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["env"] == "gymnax:Breakout-MinAtar"
    if (
        "ppo" in path
    ):  # the trained policy plays an episode of 10x10 MinAtar frames, drawn 16 pixels a cell
        gif = tmp_path / "episode.gif"
        assert main(["eval", str(tmp_path / "run"), "--episodes", "2", "--render", str(gif)]) == 0
        with Image.open(gif) as image:
            assert image.size == (160, 160) and image.n_frames >= 2
