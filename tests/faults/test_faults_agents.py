"""The fault suite on the neural families: replay-based (DQN: replay buffer, target network),
on-policy (PPO: rollout, minibatch epochs) and recurrent (recurrent PPO: GRU memory in the state).
Each trains 4 log points of 256 env steps with a checkpoint after every log point; a signal at a
seeded point, then one family-specific fault. The invariant is that of
test_faults_tabular_signals.py: identical after resume, or stopped in one line with what was written
intact."""

from __future__ import annotations

from pathlib import Path

import pytest
from fault_runs import (
    EXIT_STATUS,
    checkpoint_steps,
    copy_run,
    identical,
    inject,
    injection_steps,
    intact,
    largest_file,
    record,
    resume_identical,
    rl,
    run_injected,
)
from run_helpers import NEURAL, write_config

LOG_POINTS = [256, 512, 768, 1024]
RUN = {"seeds": 2, "checkpoint_every": 1, "progress": False}
FAMILIES = {
    "replay-based": {**NEURAL["dqn"], "run": RUN},
    "on-policy": {**NEURAL["ppo"], "run": RUN},
    "recurrent": {
        "env": {"id": "CartPole-v1", "observe": "positions"},
        "agent": {
            "name": "ppo_rnn",
            "total_steps": 1024,
            "num_envs": 2,
            "num_steps": 64,
            "num_epochs": 2,
            "num_minibatches": 1,
            "network": {"torso": "gru", "hidden": [16], "recurrent_hidden": 16},
            "log_interval": 2,
        },
        "run": RUN,
    },
}


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("agents")
    configs = {}
    for family, data in FAMILIES.items():
        (folder / family).mkdir()
        configs[family] = write_config(folder / family, data)
    return configs


@pytest.fixture(scope="module")
def references(configs, env) -> dict[str, Path]:
    """Each family's uninterrupted run, trained once."""
    runs = {}
    for family, config in configs.items():
        done = rl(["train", config, "--name", "reference"], env)
        assert done.returncode == 0, done.stderr
        runs[family] = config.parent / "runs" / "reference"
    return runs


def stop(config: Path, name: str, fault: str, at_step: int, env) -> Path:
    """The run directory of `rl train CONFIG --name NAME` stopped by FAULT at AT_STEP (exit status
    checked: the signal's, else 1)."""
    status, err = run_injected(["train", config, "--name", name], at_step, fault, env)
    assert status == EXIT_STATUS.get(fault, 1), err
    return config.parent / "runs" / name


@pytest.mark.parametrize("family,fault", [("on-policy", "SIGTERM"), ("recurrent", "SIGKILL")])
def test_signal_then_resume_is_identical(family, fault, configs, references, env):
    """The optimiser state, rollout state and recurrent memory all come back from the checkpoint:
    the resumed run ends bit-identical. (One signal per family, to keep the suite short: kill -9
    loses the chunk in flight, SIGTERM and Ctrl-C save it; the tabular family has all three.)"""
    (at_step,) = injection_steps(f"{family}-{fault}", LOG_POINTS, 1)
    run_dir = stop(configs[family], fault, fault, at_step, env)
    if fault != "SIGKILL":
        assert checkpoint_steps(run_dir)[-1] >= at_step
    intact(run_dir, killed=fault == "SIGKILL")
    resume_identical(run_dir, references[family], env)
    record(fault, family, "identical")


def test_ctrl_c_and_a_truncated_replay_checkpoint(configs, references, env, tmp_path):
    """DQN stopped by Ctrl-C resumes identical (replay buffer, target network and optimiser state
    restored); a copy whose newest checkpoint's largest file (the replay buffer) is cut short
    resumes from the checkpoint before it after one warning line, and ends identical too."""
    family = "replay-based"
    (at_step,) = injection_steps(f"{family}-SIGINT", LOG_POINTS, 1)
    stopped = stop(configs[family], "stopped", "SIGINT", at_step, env)
    assert checkpoint_steps(stopped)[-1] >= at_step
    intact(stopped)
    damaged = copy_run(stopped, tmp_path / "run")
    resume_identical(stopped, references[family], env)
    record("SIGINT", family, "identical")

    *_, previous, newest = checkpoint_steps(damaged)
    target = largest_file(damaged / "checkpoints" / str(newest))
    target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    warning, resuming = resume_identical(damaged, references[family], env).strip().splitlines()
    assert f"checkpoints/{newest} is damaged" in warning
    assert resuming.startswith(f"rl: resuming from checkpoint {damaged}/checkpoints/{previous}")
    record("checkpoint truncated", family, "identical")


@pytest.mark.slow  # the same injection as the tabular family's NaN case, the default one
def test_nan_params_stop_on_policy_run_in_one_line(configs, env):
    family = "on-policy"
    (at_step,) = injection_steps(f"{family}-nan", LOG_POINTS, 1)
    run_dir = stop(configs[family], "nan", "nan_params", at_step, env)
    assert all(step < at_step for step in checkpoint_steps(run_dir))
    intact(run_dir)
    record("NaN in the params mid-run", family, "stopped cleanly")


def test_closed_output_pipes_do_not_stop_a_recurrent_run(configs, references, env):
    family = "recurrent"
    process = inject(
        ["train", configs[family], "--name", "piped", "run.progress=true"], 10**9, "none", env
    )
    process.stdout.close()
    process.stderr.close()
    assert process.wait(timeout=300) == 0
    identical(configs[family].parent / "runs" / "piped", references[family])
    record("SIGPIPE (output pipe closed)", family, "identical")
