"""benchmarks/sebulba.py, the actor-learner throughput script: its table pairs each agent rate with
the random rate of its own round, its `raw` measure steps envpool's bare pools, its `act` measure
times an act and its parts, and a measure that cannot apply is refused before anything is
measured."""

from __future__ import annotations

import pytest

from benchmarks import sebulba as bench


def _agent(sps: float, envs: int = 256) -> dict:
    return {
        "envs": envs,
        "threads": 2,
        "env_groups": 1,
        "what": "agent",
        "sps": sps,
        "sps_overall": sps / 2,
        "rollout_wait": 0.7,
        "actor_env_wait": 0.7,
        "actor_act_wait": 0.2,
        "param_lag": 1.0,
    }


def _measure(what: str, sps: float, envs: int = 256) -> dict:
    return {"envs": envs, "threads": 2, "what": what, "sps": sps}


def _ratios(table: str) -> list[tuple[str, str]]:
    """(agent / random, agent / raw) of each line of `table` below its header."""
    cells = [line.strip("|").split("|") for line in table.splitlines()[2:]]
    return [(row[7].strip(), row[8].strip()) for row in cells]


def test_each_round_of_a_layout_is_set_against_its_own_random_and_raw_rates():
    rows = [
        _measure("random", 1000.0),
        _measure("raw", 2000.0),
        _agent(900.0),
        _measure("random", 1500.0),
        _agent(1200.0),
        _measure("random", 400.0, envs=8),
        _agent(300.0, envs=8),
    ]
    assert _ratios(bench.table(rows)) == [
        ("0.90", "0.45"),  # round 1: its own random and raw
        ("0.80", "0.60"),  # round 2: its own random, the layout's last raw
        ("0.75", "nan"),  # another layout: its own random, no raw measured
    ]


def test_raw_is_refused_for_gymnasium_ids_before_any_measurement(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--config", "configs/ppo_sebulba_cartpole.yaml", "--measure", "raw,agent"])
    error = capsys.readouterr().err
    assert "--measure raw: envpool ids only" in error and "gymnasium:CartPole-v1" in error


def test_raw_steps_bare_envpool_pools_of_the_layout():
    pytest.importorskip("envpool")
    config = bench.layout_config("configs/ppo_atari_breakout.yaml", 4, 2, [])
    result = bench.raw_throughput(config, 2, 0.5)
    assert result["sps"] > 0


def test_act_times_one_act_and_its_parts_at_a_threads_envs():
    config = bench.layout_config("configs/ppo_sebulba_cartpole.yaml", 8, 2, [])
    result = bench.act_parts(config, 2, repeats=3)
    assert result["obs_mb"] * 2**20 == 4 * 4 * 4  # 4 envs a thread, CartPole's 4 float32 features
    assert all(result[k] > 0 for k in ("send_us", "program_us", "act_us"))
