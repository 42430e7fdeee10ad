"""A config's `promise:` section (rl.config.promise): parsed and validated with errors naming the
key, accepted by the config loader without changing the training, stated by every packaged config,
and judged against per-seed results with returns higher-is-better."""

from __future__ import annotations

import math

import pytest

from rl.config import build_config, load_config
from rl.config.parsing import ConfigError, packaged_configs, read_yaml
from rl.config.promise import (
    Promise,
    expected_seconds,
    judge,
    parse_promise,
    promise_text,
    read_promise,
)

SHARE = {"seeds": 4, "at_least": 475, "share": 0.75}
MEDIAN = {"seeds": 4, "median": -150, "spread": 50}
TINY = {
    "env": {"id": "GridWorld"},
    "agent": {"name": "qlearning", "total_steps": 2000, "log_interval": 1000},
    "run": {"seeds": 2},
}


def test_a_promise_parses_into_typed_fields():
    promise = parse_promise({**SHARE, "median": 500, "spread": 25, "cpu_seconds": 40})
    assert promise == Promise(
        seeds=4, at_least=475.0, share=0.75, median=500.0, spread=25.0, cpu_seconds=40.0
    )
    assert promise.metric == "eval_return" and promise.gpu_seconds is None


@pytest.mark.parametrize(
    "data, message",
    [
        ({"at_least": 475, "share": 0.8}, r"promise\.seeds is required"),
        ({"seeds": 4, "at_least": 475}, r"promise\.share: required with promise\.at_least"),
        ({"seeds": 4, "spread": 10}, r"promise\.median: required with promise\.spread"),
        ({"seeds": 4, "cpu_seconds": 3}, r"promise: states no result"),
        ({**SHARE, "share": 1.5}, r"promise\.share: 1\.5 is out of range"),
        ({**SHARE, "share": 0}, r"promise\.share: 0\.0 is out of range"),
        ({**SHARE, "seeds": 0}, r"promise\.seeds: 0 is out of range"),
        ({**MEDIAN, "spread": -1}, r"promise\.spread: -1\.0 is out of range"),
        ({**SHARE, "metric": "eval_retrun"}, r"promise\.metric: 'eval_retrun' is not one of"),
        ({**SHARE, "gpu_second": 3}, r"unknown key 'promise\.gpu_second'.*gpu_seconds"),
        ({**SHARE, "at_least": "high"}, r"promise\.at_least: expected a number"),
        ([475, 0.8], r"promise: expected a mapping"),
    ],
)
def test_a_bad_promise_is_one_error_naming_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        parse_promise(data)


def test_the_config_loader_validates_the_promise_and_trains_without_it():
    with_promise = build_config({**TINY, "promise": SHARE})
    assert with_promise == build_config(TINY)
    assert "promise" not in with_promise.to_dict()
    with pytest.raises(ConfigError, match=r"promise\.share: required"):
        build_config({**TINY, "promise": {"seeds": 4, "at_least": 1}})


def test_a_promise_can_be_overridden_on_the_command_line():
    config = load_config("ppo_cartpole", ["promise.share=0.5"])
    assert config.agent.name == "ppo"
    with pytest.raises(ConfigError, match=r"promise\.share: 2\.0 is out of range"):
        load_config("ppo_cartpole", ["promise.share=2"])


def test_every_packaged_config_states_a_valid_promise():
    missing = [
        name for name, path in packaged_configs().items() if read_promise(read_yaml(path)) is None
    ]
    assert missing == []


def test_the_promise_comes_before_the_settings_in_the_file():
    """The header states it: the promise is the first section after the leading comments."""
    for name, path in packaged_configs().items():
        lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
        assert lines[0].startswith("promise:"), name


def test_a_share_promise_holds_at_its_boundary_and_breaks_below_it():
    promise = parse_promise(SHARE)  # >= 475 in >= 75% of seeds
    kept = judge(promise, [500, 475, 480, 100])
    assert kept.kept and kept.share == 0.75 and kept.broken == ()
    missed = judge(promise, [500, 474.9, 480, 100])
    assert not missed.kept and missed.share == 0.5
    assert missed.broken == ("50% of seeds >= 475, promised 75%",)


def test_a_median_promise_allows_its_spread_below_and_anything_above():
    promise = parse_promise(MEDIAN)  # median -150, spread 50: a check's median >= -200 keeps it
    assert judge(promise, [-210, -200, -190, -100]).kept  # median -195
    assert judge(promise, [-20, -10, -5, -1]).kept  # far better than promised
    missed = judge(promise, [-300, -250, -205, -100])  # median -227.5
    assert not missed.kept and missed.median == -227.5
    assert "median -227.5 < -200" in missed.broken[0]


def test_a_seed_without_a_result_counts_below_every_threshold_and_breaks_the_promise():
    verdict = judge(parse_promise(SHARE), [500, 500, 500, math.nan])
    assert verdict.share == 0.75 and verdict.median == 500
    assert verdict.broken == ("1 seed(s) without a result",) and not verdict.kept
    nothing = judge(parse_promise(MEDIAN), [math.nan, math.nan])
    assert not nothing.kept and math.isnan(nothing.median)


def test_both_parts_must_hold():
    promise = parse_promise({**SHARE, "median": 500, "spread": 10})
    verdict = judge(promise, [480, 480, 480, 480])  # every seed >= 475, median 480 < 490
    assert verdict.share == 1.0 and not verdict.kept and len(verdict.broken) == 1


def test_the_promise_in_words():
    assert promise_text(parse_promise(SHARE)) == ">= 475 in >= 75% of 4 seeds"
    both = parse_promise({**MEDIAN, "at_least": -250, "share": 0.8})
    assert promise_text(both) == ">= -250 in >= 80% of 4 seeds; median -150 (-50) over 4 seeds"


def test_expected_seconds_per_device():
    promise = parse_promise({**SHARE, "cpu_seconds": 30, "gpu_seconds": 20})
    assert expected_seconds(promise, "cpu", 8) == 240  # about linear in the seeds on a CPU
    assert expected_seconds(promise, "gpu", 2) == 20  # vmapped: the promise's seeds in one program
    assert expected_seconds(promise, "gpu", 8) == 40
    assert expected_seconds(parse_promise(SHARE), "cpu", 8) is None
    with pytest.raises(ValueError, match="device"):
        expected_seconds(promise, "tpu", 1)
