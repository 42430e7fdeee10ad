"""`rl compare` on run directories written here directly (config.yaml and metrics.jsonl, as
`rl train` writes them): the table, grouping by name and by config, --at, --normalize, the
figures, and bad input."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import yaml
from run_helpers import run_cli

from rl.cli import evaluation
from rl.cli.plot import read_metrics

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
STEPS = [1000, 2000, 3000, 4000]


def make_run(folder, name, values, env="CartPole-v1", agent=None, sweep=None, seed=0, **extra):
    """A run directory `folder/name` of `values` [settings, seeds, log points] (or [seeds, log
    points]) of eval_return (NaN: none) at STEPS, plus any `extra` metric {name: same shape}."""
    run_dir = folder / name
    run_dir.mkdir(parents=True)
    values = np.asarray(values, np.float64)
    values = values[None] if values.ndim == 2 else values
    config = {
        "env": {"id": env} if isinstance(env, str) else env,
        "agent": agent or {"name": "dqn", "lr": 0.001},
        "run": {"seed": seed, "seeds": values.shape[1], "name": name},
        "sweep": sweep or [{}],
    }
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    metrics = {"eval_return": values, **{k: np.asarray(v, float) for k, v in extra.items()}}
    with open(run_dir / "metrics.jsonl", "w") as f:
        for (setting, seed_index, point), _ in np.ndenumerate(values):
            row = {"setting": setting, "seed": seed_index, "log_point": point}
            row["step"] = STEPS[point]
            for key, array in metrics.items():
                value = array.reshape(values.shape)[setting, seed_index, point]
                row[key] = None if np.isnan(value) else float(value)
            f.write(json.dumps(row) + "\n")
    return run_dir


def curves_of(final, rng, seeds=16):
    """[seeds, 4] returns rising to `final` [seeds] at the last log point."""
    return np.outer(final, [0.25, 0.5, 0.75, 1.0]) + rng.normal(0, 1, size=(seeds, 4))


@pytest.fixture
def two_runs(tmp_path):
    rng = np.random.default_rng(0)
    good, worse = rng.uniform(300, 500, size=16), rng.uniform(200, 450, size=16)
    a = make_run(tmp_path, "a", curves_of(good, rng))
    b = make_run(tmp_path, "b", curves_of(worse, rng), agent={"name": "dqn", "lr": 0.01})
    return a, b


def final_scores(run_dir, step=4000):
    values = [r["eval_return"] for r in read_metrics(run_dir) if r["step"] == step]
    return np.array([np.nan if v is None else v for v in values])


def test_the_table_of_two_groups(two_runs, capsys):
    a, b = two_runs
    assert run_cli(["compare", a, b, "--reps", "2000"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0] == "eval_return at step 4000 on CartPole-v1"
    assert lines[1] == "95% stratified-bootstrap intervals over runs (2,000 resamples, seed 0)"
    assert "IQM [95% CI]" in lines[2] and "median of runs [95% CI]" in lines[2]
    for line, run_dir in zip(lines[3:5], (a, b)):
        name, runs, iqm, low, high = re.match(
            r"(\w+)\s+(\d+)\s+([\d.]+) \[([\d.]+), ([\d.]+)\]", line
        ).groups()
        scores = final_scores(run_dir)
        assert (name, int(runs)) == (run_dir.name, 16)
        assert float(iqm) == pytest.approx(evaluation.iqm(scores), abs=0.06)
        interval = evaluation.bootstrap_intervals(scores, ["iqm"], reps=2000)["iqm"]
        assert float(low) == pytest.approx(interval.low, abs=0.06)
        assert float(high) == pytest.approx(interval.high, abs=0.06)
    poi = evaluation.probability_of_improvement(final_scores(a), final_scores(b))
    assert f"P(a > b) = {poi:.3f} [" in out
    assert "optimality gap" not in out  # only for normalised scores


def test_at_a_log_point_and_the_nearest_when_there_is_none(two_runs, capsys):
    a, b = two_runs
    assert run_cli(["compare", a, b, "--at", "2000", "--reps", "500"]) == 0
    out = capsys.readouterr().out
    iqm = evaluation.iqm(final_scores(a, step=2000))
    assert out.startswith("eval_return at step 2000") and f"{iqm:.1f} [" in out
    assert run_cli(["compare", a, b, "--at", "2600"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rl: error: --at 2600: ")
    assert f"{a} has no log point at env step 2600; the nearest is 3000" in err


def test_sweep_settings_and_grouping_by_config(tmp_path, capsys):
    rng = np.random.default_rng(1)
    settings = np.stack([curves_of(rng.uniform(0, 100, 4), rng, 4) for _ in range(2)])
    sweep = make_run(tmp_path, "sweep", settings, sweep=[{"lr": 0.001}, {"lr": 0.01}])
    more = make_run(tmp_path, "more", curves_of(rng.uniform(0, 100, 4), rng, 4), seed=10_000)
    assert run_cli(["compare", sweep, more, "--reps", "500"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"sweep \[lr=0.001\]\s+4 ", out) and re.search(r"more\s+4 ", out)
    assert "P(sweep [lr=0.001] > sweep [lr=0.01]) = " in out
    # by config: `more` has agent.lr 0.001 like the first setting, whose runs it joins
    assert run_cli(["compare", sweep, more, "--by", "config", "--reps", "500"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"agent.lr=0.001\s+8 ", out) and re.search(r"agent.lr=0.01\s+4 ", out)
    assert out.count("  P(") == 1


def test_different_envs_need_normalize(tmp_path, capsys):
    rng = np.random.default_rng(2)
    cart = make_run(tmp_path, "cart", curves_of(rng.uniform(100, 500, 8), rng, 8))
    acro = make_run(
        tmp_path, "acro", curves_of(rng.uniform(-200, -60, 8), rng, 8), env="Acrobot-v1"
    )
    assert run_cli(["compare", cart, acro]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{acro} on Acrobot-v1, {cart} on CartPole-v1" in err
    assert "--normalize" in err
    reference = tmp_path / "ref.yaml"
    reference.write_text("CartPole-v1: [0, 500]\nAcrobot-v1: {low: -500, high: 0}\n")
    assert run_cli(["compare", cart, acro, "--normalize", reference, "--reps", "500"]) == 0
    out = capsys.readouterr().out
    assert "normalised eval_return" in out and "optimality gap [95% CI]" in out
    assert "n/a (not on the same envs)" in out  # the two groups share no env
    # --by config with the same agent: one group, two tasks (the median over env means)
    acro_config = acro / "config.yaml"
    acro_config.write_text(acro_config.read_text().replace("lr: 0.01", "lr: 0.001"))
    assert run_cli(["compare", cart, acro, "--by", "config", "--normalize", reference]) == 0
    out = capsys.readouterr().out
    assert "median of env means" in out and re.search(r"dqn\s+16 ", out)
    cart_scores = (final_scores(cart) - 0) / 500
    acro_scores = (final_scores(acro) + 500) / 500
    gap = evaluation.optimality_gap([cart_scores, acro_scores])
    assert f"{gap:.4f} [" in out
    reference.write_text("CartPole-v1: [0, 500]\n")
    assert run_cli(["compare", cart, acro, "--normalize", reference]) == 2
    err = capsys.readouterr().err
    assert "has no entry for env 'Acrobot-v1'" in err and err.count("\n") == 1


def test_normalize_with_two_numbers(two_runs, capsys):
    a, b = two_runs
    assert run_cli(["compare", a, b, "--normalize", "0,500", "--reps", "500"]) == 0
    out = capsys.readouterr().out
    assert f"{evaluation.iqm(final_scores(a) / 500):.4f} [" in out
    for bad in ("0,abc", "5,5", "missing.yaml"):
        assert run_cli(["compare", a, b, "--normalize", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("rl: error: --normalize") and err.count("\n") == 1, err


def test_different_metrics_are_refused_by_name(tmp_path, capsys):
    rng = np.random.default_rng(3)
    values = curves_of(rng.uniform(0, 10, 4), rng, 4)
    evaluated = make_run(tmp_path, "evaluated", values, episode_return=values)
    unevaluated = make_run(tmp_path, "unevaluated", np.full((4, 4), np.nan), episode_return=values)
    assert run_cli(["compare", evaluated, unevaluated]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--metric" in err
    assert f"eval_return in {evaluated}, only episode_return in {unevaluated}" in err
    assert run_cli(["compare", evaluated, unevaluated, "--metric", "episode_return"]) == 0
    capsys.readouterr()
    assert run_cli(["compare", evaluated, "--metric", "nonsense"]) == 2
    err = capsys.readouterr().err
    assert "no metric 'nonsense'" in err and "episode_return" in err


def test_nan_scores_are_left_out_and_counted(two_runs, capsys):
    a, b = two_runs
    rows = [json.loads(line) for line in (a / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        if row["step"] == 4000 and row["seed"] in (3, 7):
            row["eval_return"] = None
    (a / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert run_cli(["compare", a, b, "--reps", "500"]) == 0
    out, err = capsys.readouterr()
    assert err.count("\n") == 1
    assert f"rl: warning: NaN scores left out: {a}: 2 of 16 runs have no eval_return" in err
    assert re.search(r"\na\s+14 ", out)
    iqm = evaluation.iqm(final_scores(a)[np.isfinite(final_scores(a))])
    assert f"{iqm:.1f} [" in out


def test_fewer_than_three_runs_warn_in_one_line(tmp_path, capsys):
    rng = np.random.default_rng(4)
    a = make_run(tmp_path, "a", curves_of(rng.uniform(0, 10, 2), rng, 2))
    b = make_run(tmp_path, "b", curves_of(rng.uniform(0, 10, 5), rng, 5))
    assert run_cli(["compare", a, b, "--reps", "500"]) == 0
    out, err = capsys.readouterr()
    assert err == (
        "rl: warning: fewer than 3 runs per env in a (2): their intervals are not meaningful\n"
    )
    assert "P(a > b)" in out


def test_plot_writes_three_pngs(two_runs, tmp_path, capsys):
    import matplotlib.pyplot as plt

    a, b = two_runs
    folder = tmp_path / "figures"
    assert run_cli(["compare", a, b, "--plot", folder, "--reps", "1000"]) == 0
    assert "wrote" in capsys.readouterr().out
    for name in ("aggregates.png", "profile.png", "iqm_curve.png"):
        data = (folder / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 5000, name
        image = plt.imread(folder / name)
        assert image.shape[0] > 100 and image[..., :3].std() > 0.01, name


def test_bad_run_directories(tmp_path, capsys):
    assert run_cli(["compare", tmp_path / "missing"]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "metrics.jsonl").write_text(
        json.dumps({"setting": 0, "seed": 0, "step": 1, "eval_return": 1.0}) + "\n"
    )
    assert run_cli(["compare", tmp_path / "bare"]) == 2
    err = capsys.readouterr().err
    assert "config.yaml" in err and err.count("\n") == 1
    assert run_cli(["compare", tmp_path / "bare", "--reps", "0"]) == 2
    assert "--reps" in capsys.readouterr().err


def test_the_same_runs_are_not_counted_twice_unnoticed(two_runs, tmp_path, capsys):
    import shutil

    a, b = two_runs
    assert run_cli(["compare", a, b, a]) == 2
    err = capsys.readouterr().err
    assert f"run directory '{a}' is given twice" in err and err.count("\n") == 1
    copy = tmp_path / "copy" / "a"
    shutil.copytree(a, copy)
    assert run_cli(["compare", a, copy, b, "--reps", "500"]) == 0
    out, err = capsys.readouterr()
    assert f"{a} and {copy} ran one config from one run.seed (0)" in err
    assert re.search(r"\na\s+32 ", out)  # one name: the directories pool
