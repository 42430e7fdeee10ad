"""benchmarks/configs_check.py, the check of each packaged config against its promise: it reads a
seed's final result from its run, refuses the tuning seeds, trains anakin seeds in one program and
sebulba seeds one process each, judges pass or fail, and rewrites only its own table in
RESULTS.md. One real check trains a tiny config end to end."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from benchmarks import configs_check as check
from benchmarks import configs_tables as tables
from rl.config.parsing import ConfigError
from rl.config.promise import parse_promise


def test_a_seeds_final_result_is_its_last_finite_value():
    rows = [
        {"setting": 0, "seed": 0, "log_point": 0, "eval_return": 10.0},
        {"setting": 0, "seed": 0, "log_point": 1, "eval_return": 30.0},
        {"setting": 0, "seed": 1, "log_point": 0, "eval_return": 20.0},
        {"setting": 0, "seed": 1, "log_point": 1, "eval_return": float("nan")},
        {"setting": 0, "seed": 2, "log_point": 0},
        {"setting": 1, "seed": 0, "log_point": 1, "eval_return": 99.0},
    ]
    finals = check.final_per_seed(rows, "eval_return")
    assert finals[:2].tolist() == [30.0, 20.0] and math.isnan(finals[2])


def test_checks_refuse_the_tuning_seeds():
    assert check.check_seed_start(10_000) == 10_000
    with pytest.raises(ConfigError, match="--seed-start: 9999 is in the tuning range"):
        check.check_seed_start(9_999)
    assert check.main(["--configs", "qlearning_gridworld", "--seed-start", "0", "--dry-run"]) == 2


def test_merging_a_records_file_that_is_not_there_is_an_error(tmp_path, capsys):
    assert check.main(["--merge", str(tmp_path / "none.json")]) == 2
    assert "--merge: " in capsys.readouterr().err


def test_anakin_seeds_train_in_one_program_and_sebulba_seeds_one_process_each(tmp_path):
    promises = check.load_promises(["ppo_cartpole", "ppo_sebulba_cartpole"])
    (one,) = check.train_commands("ppo_cartpole", promises["ppo_cartpole"][0], 8, 10_000, tmp_path)
    assert one[one.index("--seeds") + 1] == "8" and "run.seed=10000" in one
    each = check.train_commands(
        "ppo_sebulba_cartpole", promises["ppo_sebulba_cartpole"][0], 3, 10_000, tmp_path
    )
    assert [c[c.index("--seeds") + 1] for c in each] == ["1", "1", "1"]
    assert [c[-1] for c in each] == ["run.seed=10000", "run.seed=10001", "run.seed=10002"]
    assert len({c[c.index("--name") + 1] for c in each}) == 3


def test_the_cpu_subset_holds_the_promises_whose_cpu_check_fits():
    promises = {
        "quick": ({}, parse_promise({"seeds": 4, "median": 1, "spread": 0, "cpu_seconds": 10})),
        "slow": ({}, parse_promise({"seeds": 4, "median": 1, "spread": 0, "cpu_seconds": 1000})),
        "gpu": ({}, parse_promise({"seeds": 4, "median": 1, "spread": 0})),
        "none": ({}, None),
    }
    assert check.select("cpu", promises, None) == ["quick"]
    assert check.select("all", promises, None) == ["quick", "slow", "gpu"]
    assert check.select("cpu", promises, 100) == []  # 100 seeds x 10 s is over the limit
    assert check.select("gpu, none", promises, None) == ["gpu", "none"]
    with pytest.raises(ConfigError, match="--configs: 'gpux' is not a packaged config"):
        check.select("gpu,gpux", promises, None)


def test_an_extra_is_named_for_env_libraries():
    assert tables.needed_module("CartPole-v1") is None
    assert tables.needed_module("jaxmarl:MPE_simple_spread_v3") == ("jaxmarl", "jaxmarl")
    assert tables.needed_module("gymnasium:HalfCheetah-v5") == ("mujoco", "gymnasium[mujoco]")
    assert tables.needed_module("gymnasium:CartPole-v1") is None


def test_the_check_reports_the_iqm_interval_and_the_verdict():
    promise = parse_promise({"seeds": 4, "at_least": 475, "share": 0.75})
    kept = check.summarise_check(promise, [500, 500, 480, 100], reps=2000)
    assert kept["kept"] and kept["share"] == 0.75 and kept["iqm"][0] == 490.0
    assert kept["iqm"][1] <= 490.0 <= kept["iqm"][2]
    missed = check.summarise_check(promise, [500, 470, 480, 100], reps=2000)
    assert not missed["kept"] and missed["broken"] == ["50% of seeds >= 475, promised 75%"]


def _record(name, device, date, kept=True):
    return {
        "config": name,
        "device": device,
        "machine": "2-core CPU" if device == "cpu" else "1 x NVIDIA H200",
        "date": date,
        "versions": "jax 0.10.2, commit abc1234",
        "seeds": [10_000, 10_003],
        "metric": "eval_return",
        "seconds": 61.0,
        "iqm": [500.0, 480.0, 500.0],
        "median": 500.0,
        "share": 1.0 if kept else 0.5,
        "at_least": 475.0,
        "kept": kept,
        "broken": [] if kept else ["50% of seeds >= 475, promised 75%"],
        "finals": [500.0, 500.0, 480.0, 490.0] if kept else [500.0, 400.0, 480.0, 100.0],
    }


def test_records_keep_the_latest_check_per_device_and_the_table_shows_both_times():
    records = check.merge({}, [_record("a", "cpu", "2026-12-01")])
    records = check.merge(records, [_record("a", "gpu", "2026-12-02", kept=False)])
    records = check.merge(records, [_record("a", "cpu", "2026-12-02")])
    assert set(records["a"]) == {"cpu", "gpu"} and records["a"]["cpu"]["date"] == "2026-12-02"
    promise = parse_promise({"seeds": 4, "at_least": 475, "share": 0.75, "cpu_seconds": 30})
    row = tables.table_row("a", promise, records["a"], "pending (GPU)")
    assert "**missed**: 50% of seeds >= 475" in row  # the GPU check wins the tie: its result shows
    assert row.count("61 s (4 seeds)") == 2
    assert "pending (GPU)" in tables.table_row("a", promise, {}, "pending (GPU)")


def test_the_table_judges_a_check_against_the_promise_as_it_stands():
    """A promise restated after its check (here: 50% of seeds instead of 75%) shows as kept by
    the same per-seed results, and a stricter one as missed."""
    record = _record("a", "cpu", "2026-12-02", kept=False)  # 2 of 4 seeds >= 475
    lenient = parse_promise({"seeds": 4, "at_least": 475, "share": 0.5})
    assert "| kept |" in tables.table_row("a", lenient, {"cpu": record}, "")
    strict = parse_promise({"seeds": 4, "at_least": 475, "share": 0.5, "median": 500, "spread": 5})
    assert "**missed**: median 440.0 < 495" in tables.table_row("a", strict, {"cpu": record}, "")


def test_only_the_checks_table_is_rewritten():
    text = (
        "# Results\n\n### Other\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
        f"{tables.HEADING}\n\nSome words.\n\n| old |\n|---|\n| row |\n\nAfter.\n\n| keep |\n"
    )
    new = tables.replace_table(text, "| new |\n|---|")
    assert "| old |" not in new and "| row |" not in new and "| new |\n|---|\n\nAfter." in new
    assert "| 1 | 2 |" in new and "| keep |" in new
    with pytest.raises(ValueError, match="no heading"):
        tables.replace_table("# Results\n", "| new |")


def test_a_real_check_trains_on_the_check_seeds_and_judges(tmp_path, monkeypatch):
    """qlearning_gridworld at 4 seeds from 10,000, cut to 2,000 steps through a promise that holds
    and one that cannot."""
    data, _ = check.load_promises(["qlearning_gridworld"])["qlearning_gridworld"]
    env = check.train_env("cpu")
    where = check.probe(env)
    assert where[0] == "cpu" and "core" in where[1]
    monkeypatch.setattr(
        check,
        "train_commands",
        lambda *a: [[*cmd, "agent.total_steps=2000"] for cmd in TRAIN_COMMANDS(*a)],
    )
    easy = parse_promise({"seeds": 4, "median": -1, "spread": 0})
    record = check.run_check("qlearning_gridworld", data, easy, 4, 10_000, tmp_path, where, env)
    assert record["kept"] and record["seeds"] == [10_000, 10_003] and len(record["finals"]) == 4
    config = (tmp_path / "qlearning_gridworld-10000" / "config.yaml").read_text()
    assert "seed: 10000" in config and "seeds: 4" in config
    impossible = parse_promise({"seeds": 4, "at_least": 2, "share": 1.0})
    assert not check.run_check(
        "qlearning_gridworld", data, impossible, 4, 10_000, tmp_path / "b", where, env
    )["kept"]
    with pytest.raises(RuntimeError, match="qlearning_gridworld: stopped after --timeout 0.01 s"):
        check.run_check(
            "qlearning_gridworld", data, easy, 4, 10_000, tmp_path / "c", where, env, 0.01
        )
    json.dumps(record)  # a record is plain JSON


TRAIN_COMMANDS = check.train_commands


def test_the_script_runs_alone():
    done = subprocess.run(
        [sys.executable, str(check.REPO / "benchmarks" / "configs_check.py"), "--help"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and "--seeds" in done.stdout


def test_the_readme_configs_table_states_every_promise_and_is_up_to_date():
    """Every packaged config has a row in the README's configs table stating its promise, and the
    table is what configs_check writes from the promises and the records (rerun
    `python benchmarks/configs_check.py --table` after changing either)."""
    text = tables.README.read_text()
    promises = check.load_promises()
    records = check.load_records(check.RECORDS)
    assert tables.update_readme(text, promises, records) == text
    rows = {}
    for line in text[text.index(tables.README_HEADER) :].split("\n\n")[0].splitlines()[2:]:
        for name in line.split("|")[1].replace("`", "").split(","):
            rows[name.strip()] = line
    assert set(rows) == set(promises)
    for name, (_, promise) in promises.items():
        assert tables.promise_text(promise) in rows[name], name


def test_a_config_missing_from_the_readme_table_gets_a_row():
    text = tables.README.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `sac_cartpole` |"))
    updated = tables.update_readme(
        text.replace(row + "\n", ""), check.load_promises(), check.load_records(check.RECORDS)
    )
    assert "| `sac_cartpole` | sac, CartPole-v1 |" in updated


def test_the_shipped_cpu_time_comes_from_a_check_of_as_many_seeds_or_an_upper_bound():
    promise = parse_promise({"seeds": 4, "median": 1, "spread": 0, "cpu_seconds": 100})
    eight = {"seeds": [10_000, 10_007], "seconds": 300.0}
    assert tables.shipped_cpu_seconds(promise, 8, eight) == 300.0
    assert tables.shipped_cpu_seconds(promise, 16, eight) == 1600.0
    assert tables.shipped_cpu_seconds(promise, 16, None) == 1600.0
    no_time = parse_promise({"seeds": 4, "median": 1, "spread": 0})
    assert tables.shipped_cpu_seconds(no_time, 16, None) is None


def test_importing_the_script_leaves_the_process_alone():
    """Imported (as by this test session), the script changes no environment variable and puts
    no folder ahead of the packages (benchmarks/envs.py would shadow `envs`)."""
    code = (
        "import os; before = dict(os.environ); from benchmarks import configs_check; import envs; "
        "print(dict(os.environ) == before, envs.__file__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=check.REPO, capture_output=True, text=True, check=True
    )
    same, envs_file = done.stdout.split()
    assert same == "True" and envs_file.endswith("envs/__init__.py")
