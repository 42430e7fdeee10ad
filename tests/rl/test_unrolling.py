"""`agent.unroll: auto` (rl.config.unrolling): 1 on the CPU and where no rule is measured, the
measured unroll on a GPU once a run is long enough to pay for its compile; numbers pass through;
anything else is one error naming the key."""

from __future__ import annotations

import pytest

from rl.agents import dqn, pqn
from rl.config import load_config, unrolling
from rl.config.parsing import ConfigError


def test_auto_is_one_on_the_cpu_and_without_a_rule(monkeypatch):
    monkeypatch.setattr(unrolling, "BREAK_EVEN", {"dqn": (8, {1: 1_000_000})})
    assert unrolling.auto_unroll("dqn", "cpu", 10**9) == 1
    assert unrolling.auto_unroll("ppo", "cuda", 10**9) == 1


def test_auto_unrolls_on_a_gpu_from_the_break_even(monkeypatch):
    assert unrolling.BREAK_EVEN["dqn"][0] > 1  # the measured rule
    monkeypatch.setattr(unrolling, "BREAK_EVEN", {"dqn": (8, {1: 1_000_000, 64: 2_000_000})})
    assert unrolling.auto_unroll("dqn", "cuda", 999_999) == 1
    assert unrolling.auto_unroll("dqn", "cuda", 1_000_000) == 8
    assert unrolling.auto_unroll("dqn", "cuda", 1_000_000, seeds=2) == 1  # the 64-seed rule
    assert unrolling.auto_unroll("dqn", "cuda", 2_000_000, seeds=64) == 8
    assert unrolling.auto_unroll("dqn", "cuda", 10**9, seeds=65) == 1  # beyond what was measured
    monkeypatch.undo()
    short, long = dqn.Config(total_steps=500_000), dqn.Config(total_steps=4_000_000)
    assert unrolling.resolve_unroll(short, "dqn", "cuda").unroll == 1
    assert unrolling.resolve_unroll(long, "dqn", "cuda").unroll == 8
    assert unrolling.resolve_unroll(long, "dqn", "cpu").unroll == 1
    assert unrolling.resolve_unroll(long, "dqn", "cuda", seeds=16).unroll == 1  # 64-seed rule
    conv = dqn.Config(
        total_steps=5_000_000, network=load_config("dqn_minatar_breakout").agent.network
    )
    assert conv.network.torso != "mlp"
    assert unrolling.resolve_unroll(conv, "dqn", "cuda").unroll == 1  # conv nets stay rolled


def test_numbers_pass_and_other_words_are_one_error():
    assert unrolling.resolve_unroll(pqn.Config(unroll=4), "pqn", "cuda").unroll == 4
    with pytest.raises(ConfigError, match="agent.unroll: expected a positive integer or auto"):
        unrolling.resolve_unroll(pqn.Config(unroll="fast"), "pqn", "cuda")


def test_a_loaded_config_holds_a_number_and_python_configs_resolve_when_read():
    config = load_config("dqn_cartpole")
    assert isinstance(config.agent.unroll, int) and config.agent.unroll >= 1
    assert load_config("pqn_cartpole", ["agent.unroll=3"]).agent.unroll == 3
    with pytest.raises(ConfigError, match="agent.unroll"):
        load_config("pqn_cartpole", ["agent.unroll=fast"])
    assert pqn.Config().unroll == "auto"
    assert unrolling.unroll_of(pqn.Config()) == 1  # no rule measured for PQN: 1 on every device
    assert unrolling.unroll_of(pqn.Config(unroll=5)) == 5
