"""Config loading: every bad input raises ConfigError naming the key; good input round-trips."""

from __future__ import annotations

import re

import jax.numpy as jnp
import pytest
import yaml

from rl.config import build_config, hyperparams, load_config, parse_sweep, sweepable
from rl.config.parsing import ConfigError, parse_override

DEFAULT = "configs/qlearning_gridworld.yaml"


def base():
    return {
        "env": {"id": "GridWorld", "params": {"size": 5}},
        "agent": {"name": "qlearning", "total_steps": 2000, "log_interval": 500},
        "run": {"seeds": 2},
    }


def with_value(dotted: str, value):
    data = base()
    node = data
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return data


def error_of(data) -> str:
    with pytest.raises(ConfigError) as info:
        build_config(data)
    message = str(info.value)
    assert "\n" not in message, "one line"
    return message


def test_default_config_loads_with_expected_values():
    config = load_config(DEFAULT)
    assert config.env.id == "GridWorld" and config.agent.name == "qlearning"
    assert config.agent.lr == 0.1 and config.agent.gamma == 0.99 and config.run.seeds == 30
    assert config.agent.total_steps == 20_000


def test_to_dict_round_trips():
    config = load_config(DEFAULT, ["agent.lr=0.3", "run.seeds=4"])
    again = build_config(yaml.safe_load(yaml.safe_dump(config.to_dict())))
    assert again == config


def test_overrides_set_nested_values_and_parse_yaml_scalars():
    config = load_config(
        DEFAULT,
        [
            "agent.lr=0.05",
            "run.seeds=3",
            "env.params.max_steps_in_episode=50",
            "run.progress=false",
            "agent.gamma=1",
        ],
    )
    assert (
        config.agent.lr == 0.05
        and isinstance(config.agent.gamma, float)
        and config.agent.gamma == 1.0
    )
    assert config.run.seeds == 3 and config.run.progress is False
    assert config.env.params["max_steps_in_episode"] == 50


def test_yaml_exponent_without_dot_is_a_number():
    assert build_config(with_value("agent.lr", "1e-3")).agent.lr == pytest.approx(1e-3)


def test_hyperparams_are_the_sweepable_fields_as_float32():
    config = build_config(base())
    hp = hyperparams(config.agent)
    assert (
        set(hp) == set(sweepable(config.agent)) >= {"lr", "gamma", "epsilon_start", "epsilon_end"}
    )
    assert "total_steps" not in hp and "epsilon_decay_steps" not in hp
    assert all(v.dtype == jnp.float32 and v.shape == () for v in hp.values())
    assert float(hp["lr"]) == pytest.approx(0.1)


@pytest.mark.parametrize(
    "dotted, value, pattern",
    [
        # unknown keys, with the closest known key suggested
        ("agent.lrr", 0.1, r"unknown key 'agent\.lrr' \(did you mean 'agent\.lr'\?\)"),
        ("agent.gama", 0.9, r"unknown key 'agent\.gama' \(did you mean 'agent\.gamma'\?\)"),
        ("run.sed", 1, r"unknown key 'run\.sed' \(did you mean 'run\.seed'\?\)"),
        ("env.idd", "GridWorld", r"unknown key 'env\.idd' \(did you mean 'env\.id'\?\)"),
        ("agent.zzzz", 1, r"unknown key 'agent\.zzzz'; known keys: "),
        # wrong types
        ("agent.lr", "fast", r"agent\.lr: expected a number, got 'fast'"),
        ("agent.lr", True, r"agent\.lr: expected a number"),
        ("agent.lr", [0.1], r"agent\.lr: expected a number"),
        ("agent.lr", float("nan"), r"agent\.lr: expected a number, got NaN"),
        ("agent.gamma", "nan", r"agent\.gamma: expected a number, got NaN"),
        ("agent.lr", float("inf"), r"agent\.lr: inf is out of range"),
        ("agent.total_steps", 1.5, r"agent\.total_steps: expected an integer"),
        ("agent.total_steps", "many", r"agent\.total_steps: expected an integer"),
        ("run.seeds", "3", r"run\.seeds: expected an integer"),
        ("run.progress", "yes", r"run\.progress: expected true or false"),
        ("env.id", 5, r"env\.id: expected a string"),
        ("env.params", [1, 2], r"env\.params: expected a mapping"),
        # out of range
        ("agent.lr", -0.1, r"agent\.lr: -0\.1 is out of range \(must be > 0"),
        ("agent.lr", 0.0, r"agent\.lr: 0\.0 is out of range \(must be > 0"),
        ("agent.gamma", 1.5, r"agent\.gamma: 1\.5 is out of range \(must be <= 1"),
        ("agent.gamma", -0.01, r"agent\.gamma: -0\.01 is out of range \(must be >= 0"),
        ("agent.epsilon_start", 2.0, r"agent\.epsilon_start: 2\.0 is out of range"),
        ("run.seeds", 0, r"run\.seeds: 0 is out of range \(must be >= 1\)"),
        ("run.seeds", -3, r"run\.seeds: -3 is out of range"),
        ("run.seed", -1, r"run\.seed: -1 is out of range"),
        ("run.name", "../../etc", r"run\.name: '\.\./\.\./etc' must be a plain directory name"),
        ("run.name", "a/b", r"run\.name: 'a/b' must be a plain directory name"),
        ("run.name", "..", r"run\.name: '\.\.' must be a plain directory name"),
        ("agent.total_steps", 0, r"agent\.total_steps: 0 is out of range"),
        (
            "agent.log_interval",
            300,
            r"agent\.total_steps \(2000\) must be a multiple of agent\.log_interval \(300\)",
        ),
        (
            "kernels.backend",
            "tritonn",
            r"kernels\.backend: 'tritonn' is not one of .* \(did you mean 'kernels\.triton'\?\)"
            r"|kernels\.backend: 'tritonn' is not one of",
        ),
        # unknown env, env param, agent
        ("env.id", "GridWorl", r"env\.id: unknown env id 'GridWorl'\. Did you mean 'GridWorld'\?"),
        ("env.id", "Nope-v0", r"env\.id: unknown env id 'Nope-v0'"),
        ("env.params", {"colour": "red"}, r"env\.params: .*unknown env param.*colour"),
        ("env.params", {"size": 1}, r"env\.params: .*size must be at least 2"),
        (
            "agent.name",
            "qlearnin",
            r"agent\.name: unknown agent 'qlearnin' \(did you mean 'qlearning'\?\)",
        ),
        (
            "agent.name",
            "alphazero",
            r"agent\.name: unknown agent 'alphazero'.*known agents: .*qlearning",
        ),
    ],
)
def test_bad_values_name_the_key(dotted, value, pattern):
    message = error_of(with_value(dotted, value))
    assert re.search(pattern, message), message


def test_agent_incompatible_with_env_is_named():
    data = base()
    data["env"] = {"id": "CartPole-v1"}
    assert error_of(data).startswith("env.id: qlearning needs discrete")


@pytest.mark.parametrize("missing", ["env", "agent"])
def test_missing_section(missing):
    data = base()
    del data[missing]
    assert error_of(data) == f"missing section '{missing}'"


def test_missing_agent_name():
    data = base()
    del data["agent"]["name"]
    assert error_of(data).startswith("agent.name is required")


def test_unknown_section_with_suggestion():
    data = base()
    data["agnet"] = data.pop("agent")
    assert re.search(r"unknown section 'agnet' \(did you mean 'agent'\?\)", error_of(data))


def test_section_that_is_not_a_mapping():
    data = base()
    data["run"] = [1, 2]
    assert "run: expected a mapping" in error_of(data)


def test_missing_file():
    with pytest.raises(ConfigError, match=r"config file 'nope/missing\.yaml' does not exist"):
        load_config("nope/missing.yaml")


def test_unparsable_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("agent: {name: qlearning\nenv: [\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml' cannot be parsed") as info:
        load_config(path)
    assert "\n" not in str(info.value)


def test_yaml_syntax_error_names_its_line_and_column(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(
        "env:\n  id: GridWorld\nagent:\n  name: qlearning\n lr: 0.1\n"
    )  # line 5 is indented by 1, not 2
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "bad.yaml' cannot be parsed: line 5, column 2: expected <block end>" in str(info.value)
    assert "\n" not in str(info.value)


def test_file_that_is_not_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping of sections, got list"):
        load_config(path)


def test_empty_file_reports_the_missing_section(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    with pytest.raises(ConfigError, match="missing section 'env'"):
        load_config(path)


@pytest.mark.parametrize(
    "override, pattern",
    [
        ("agent.lr", r"override 'agent\.lr' must look like dotted\.key=value"),
        ("=0.1", r"override '=0\.1' has an empty key"),
        ("agent..lr=0.1", r"override 'agent\.\.lr=0\.1' has an empty key"),
        ("agent.lr.x=1", r"override 'agent\.lr\.x=1': agent\.lr is not a section"),
        ("agent.lrr=0.1", r"unknown key 'agent\.lrr' \(did you mean 'agent\.lr'\?\)"),
        ("agent.lr=-1", r"agent\.lr: -1\.0 is out of range"),
        ("agent.gamma=abc", r"agent\.gamma: expected a number, got 'abc'"),
        ("run.seeds=0", r"run\.seeds: 0 is out of range"),
    ],
)
def test_bad_overrides(override, pattern):
    with pytest.raises(ConfigError) as info:
        load_config(DEFAULT, [override])
    assert re.search(pattern, str(info.value)), str(info.value)


def test_parse_override_keeps_strings_and_parses_values():
    assert parse_override("a.b=3") == (["a", "b"], 3)
    assert parse_override("a=x=y") == (["a"], "x=y")
    assert parse_override("a.b=[1, 2]") == (["a", "b"], [1, 2])


def test_sweep_grid_is_the_product_of_values():
    agent = build_config(base()).agent
    grid = parse_sweep(["agent.lr=0.1,0.5", "gamma=0.9,0.95,0.99"], agent)
    assert len(grid) == 6
    assert grid[0] == {"lr": 0.1, "gamma": 0.9} and grid[-1] == {"lr": 0.5, "gamma": 0.99}


@pytest.mark.parametrize(
    "spec, pattern",
    [
        ("agent.lr", r"--sweep 'agent\.lr' must look like agent\.key=v1,v2"),
        (
            "agent.lrr=0.1,0.2",
            r"--sweep: unknown key 'agent\.lrr' \(did you mean 'lr'\?\)"
            r"|--sweep: unknown key 'agent\.lrr'",
        ),
        ("agent.total_steps=100,200", r"--sweep: agent\.total_steps cannot be swept; sweepable: "),
        ("agent.lr=0.1,", r"--sweep 'agent\.lr=0\.1,': empty value"),
        ("agent.lr=0.1,-0.5", r"agent\.lr: -0\.5 is out of range"),
        ("agent.gamma=0.9,high", r"agent\.gamma: expected a number, got 'high'"),
    ],
)
def test_bad_sweep_specs(spec, pattern):
    agent = build_config(base()).agent
    with pytest.raises(ConfigError) as info:
        parse_sweep([spec], agent)
    assert re.search(pattern, str(info.value)), str(info.value)


def test_sweep_key_given_twice():
    agent = build_config(base()).agent
    with pytest.raises(ConfigError, match=r"agent\.lr is given twice"):
        parse_sweep(["agent.lr=0.1", "lr=0.2"], agent)


def test_a_gymnasium_env_under_anakin_warns_naming_the_builtin_env_and_sebulba(capsys):
    """Each step of a gymnasium env inside the compiled program is a host callback: the config
    warns once, naming the built-in JAX env of that id and the actor-learner layout."""
    import warnings

    from rl.cli.output import command_output
    from rl.config import HostEnvWarning

    data = {"env": {"id": "gymnasium:CartPole-v1"}, "agent": {"name": "ppo"}}
    with pytest.warns(HostEnvWarning) as caught:
        build_config(data)
    (message,) = [str(w.message) for w in caught]
    assert "the built-in env.id=CartPole-v1" in message and "arch.name=sebulba" in message
    # no built-in env of that id; an agent the actor threads do not train: the agents they do
    data = {"env": {"id": "gymnasium:FrozenLake-v1"}, "agent": {"name": "qlearning"}}
    with pytest.warns(HostEnvWarning, match=r"use arch.name=sebulba run.seeds=1 \(for dqn, ppo"):
        build_config(data)
    # through an rl command: one line on stderr
    with warnings.catch_warnings(), command_output():
        warnings.simplefilter("always")
        load_config("ppo_sebulba_cartpole", ["arch.name=anakin", "run.seeds=2"])
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("rl: warning: env.id: gymnasium:CartPole-v1 under arch anakin calls")
    assert line.endswith("(e.g. rl train ppo_sebulba_cartpole)")


def test_no_host_env_warning_for_a_jax_env_or_under_sebulba():
    import warnings

    from rl.config import HostEnvWarning

    with warnings.catch_warnings():
        warnings.simplefilter("error", HostEnvWarning)
        build_config({"env": {"id": "CartPole-v1"}, "agent": {"name": "ppo"}})
        load_config("ppo_sebulba_cartpole")


def test_gymnasium_make_refusing_a_keyword_names_env_params():
    data = {"env": {"id": "gymnasium:FrozenLake-v1", "params": {"size": 5}}}
    with pytest.raises(ConfigError, match=r"^env.params: .*unexpected keyword argument 'size'"):
        build_config({**data, "agent": {"name": "qlearning"}})
