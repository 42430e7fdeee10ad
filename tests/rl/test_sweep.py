"""Hyperparameter sweeps are one vmapped program: one result per setting, and setting i equals a
plain run of the config with that value (so every swept value is read from `hparams` inside the
program); a sweep built with the library's functions equals `rl train --sweep`."""

import json

import numpy as np
import pytest

from rl.cli.main import main
from rl.config import build_config, parse_sweep
from rl.run.programs import build_program
from rl.run.train import train_many

PPO_AGENT = dict(
    name="ppo",
    total_steps=256,
    num_envs=2,
    num_steps=32,
    num_epochs=2,
    num_minibatches=2,
    network={"hidden": [8, 8]},
    log_interval=2,
    anneal_lr=True,
)


def ppo_config(**agent):
    return build_config(
        {
            "env": {"id": "CartPole-v1"},
            "agent": {**PPO_AGENT, **agent},
            "run": {"seeds": 2, "progress": False},
        }
    )


# Every sweepable PPO hyperparameter, two values each: setting 1 must equal a plain run with that
# value.
PPO_SWEEPS = {
    "lr": (1e-2, 3e-2),  # large enough that ratios leave the clip range within this short run
    "gamma": (0.99, 0.5),
    "gae_lambda": (0.95, 0.3),
    "clip_eps": (0.2, 0.05),
    "vf_clip_eps": (0.2, 0.01),
    "ent_coef": (0.01, 0.5),
    "vf_coef": (0.5, 2.0),
    "max_grad_norm": (0.5, 0.01),
    "reward_scale": (1.0, 0.1),
}


def plain_runs(make, settings: list[dict]) -> list[dict]:
    """The metrics of a plain run (`train_many`) of `make(**setting)` for each setting, on one
    compile: each setting's program must lower to the same text as the first's (its values reach
    the program only as arguments, none baked in), so the first's compiled program runs them all
    with their own keys and hyperparameters."""
    program, keys, hparams = build_program(make(**settings[0]))
    lowered = program.lower(keys, hparams)
    text, compiled = lowered.as_text(), lowered.compile()
    metrics = []
    for setting in settings:
        program, keys, hparams = build_program(make(**setting))
        assert program.lower(keys, hparams).as_text() == text, (
            f"{setting} is baked into the program"
        )
        metrics.append(compiled(keys, hparams)[1])
    return metrics


def test_every_ppo_sweepable_hyperparameter_changes_the_run():
    """One program over a grid where each setting changes one hyperparameter from the default: each
    setting differs from the default run, and equals a plain run with that value (the [settings,
    seeds] axes in order)."""
    base = {name: values[0] for name, values in PPO_SWEEPS.items()}
    config = ppo_config(**base)
    grid = [{}] + [{name: values[1]} for name, values in PPO_SWEEPS.items()]
    _, swept = train_many(config, grid)
    assert swept["step"].shape[:2] == (len(grid), 2)  # [settings, seeds]
    for i, (name, values) in enumerate(PPO_SWEEPS.items(), start=1):
        changed = any(
            not np.allclose(swept[k][i], swept[k][0])
            for k in ("value_loss", "policy_loss", "approx_kl", "clip_fraction")
        )
        assert changed, f"sweeping {name} changed nothing: is it read from hparams?"
    plain = plain_runs(lambda **changed: ppo_config(**{**base, **changed}), grid)
    for i, setting in enumerate(grid):
        for key in ("episode_return", "value_loss", "policy_loss", "entropy", "clip_fraction"):
            np.testing.assert_allclose(
                swept[key][i], plain[i][key][0], rtol=2e-5, atol=1e-6, err_msg=f"{setting}: {key}"
            )


def test_sac_sweep_one_result_per_setting():
    agent = dict(
        name="sac",
        total_steps=128,
        learning_starts=32,
        batch_size=16,
        buffer_size=500,
        network={"hidden": [8, 8]},
        log_interval=64,
        eval_episodes=1,
    )
    make = lambda **kw: build_config(
        {
            "env": {"id": "Pendulum-v1"},
            "agent": {**agent, **kw},
            "run": {"seeds": 1, "progress": False},
        }
    )
    config = make()
    grid = parse_sweep(["agent.lr=1e-3,1e-2", "agent.tau=0.005,0.5"], config.agent)
    assert len(grid) == 4
    _, swept = train_many(config, grid)
    assert swept["critic_loss"].shape[:2] == (4, 1)
    for i, plain in zip((0, 3), plain_runs(make, [grid[0], grid[3]])):
        np.testing.assert_allclose(
            swept["critic_loss"][i],
            plain["critic_loss"][0],
            rtol=1e-4,
            atol=1e-6,
            err_msg=str(grid[i]),
        )
    assert len({round(float(swept["critic_loss"][i, 0, -1]), 6) for i in range(4)}) == 4


def test_cli_sweep_prints_and_writes_one_row_per_setting(tmp_path, capsys):
    config_path = tmp_path / "ppo.yaml"
    agent_yaml = "\n".join(
        f"  {k}: {list(v) if isinstance(v, list) else str(v).lower() if isinstance(v, bool) else v}"
        for k, v in PPO_AGENT.items()
    )
    config_path.write_text(f"env:\n  id: CartPole-v1\nagent:\n{agent_yaml}\n")
    code = main(
        [
            "train",
            str(config_path),
            "--seeds",
            "2",
            "--sweep",
            "agent.lr=1e-4,3e-4,1e-3",
            "--output-dir",
            str(tmp_path),
            "--name",
            "sweep",
            "--no-progress",
        ]
    )
    assert code == 0
    summary = json.loads((tmp_path / "sweep" / "summary.json").read_text())
    assert [row["hyperparams"] for row in summary["settings"]] == [
        {"lr": 1e-4},
        {"lr": 3e-4},
        {"lr": 1e-3},
    ]
    assert all(row["seeds"] == 2 for row in summary["settings"])
    out = capsys.readouterr().out
    assert "lr=0.0001" in out and "lr=0.001" in out


def test_a_sweep_built_with_the_library_equals_rl_train_sweep(tmp_path):
    """The README's library path (`load_config`, `parse_sweep`, then `rl.run.train.train_many`, or
    an agent's `make_train` vmapped over `rl.run.programs.seed_keys` with one setting of
    `rl.run.programs.stacked_hyperparams`) trains the same runs as `rl train --sweep` with the same
    `run.seed`: seed i of every setting starts from PRNGKey(run.seed + i) on every path."""
    import jax
    from flax import serialization

    from rl.agents import qlearning
    from rl.config import load_config
    from rl.run.programs import seed_keys, stacked_hyperparams

    config_path = tmp_path / "q.yaml"
    config_path.write_text(
        "env: {id: GridWorld, params: {size: 5, max_steps_in_episode: 50}}\n"
        "agent: {name: qlearning, total_steps: 2000, log_interval: 500}\n"
    )
    sweep, overrides = ["agent.lr=0.05,0.5"], ["run.seeds=3", "run.seed=5"]
    argv = ["train", str(config_path), "--sweep", sweep[0], *overrides]
    assert main([*argv, "--output-dir", str(tmp_path), "--name", "cli", "--no-progress"]) == 0
    run_dir = tmp_path / "cli"
    cli_params = np.asarray(
        serialization.msgpack_restore((run_dir / "final_params.msgpack").read_bytes())
    )
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

    config = load_config(str(config_path), overrides)
    grid = parse_sweep(sweep, config.agent)
    state, metrics = train_many(config, grid)
    np.testing.assert_array_equal(cli_params, np.asarray(state.params))
    for row in rows:
        s, seed, t = row["setting"], row["seed"], row["log_point"]
        assert row["step"] == int(metrics["step"][s, seed, t])
        length = float(metrics["episode_length"][s, seed, t])
        assert row["episode_length"] == (None if np.isnan(length) else pytest.approx(length))

    train = jax.jit(jax.vmap(qlearning.make_train(config), in_axes=(0, None)))
    hparams = stacked_hyperparams(config, grid)
    for s in range(len(grid)):
        alone, _ = train(seed_keys(config), {k: v[s] for k, v in hparams.items()})
        np.testing.assert_array_equal(cli_params[s], np.asarray(alone.params))
