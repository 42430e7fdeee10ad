"""Typed, frozen experiment configs loaded from YAML, with `dotted.key=value` overrides.

A config file has four sections; only `env` and `agent` are required:

    env:     {id: GridWorld, params: {size: 5}}      # envs.make(id, **params); `observe: positions`
                                                     # (or a list of indices) masks the observation
    agent:   {name: qlearning, lr: 0.1, ...}         # fields of rl.agents.<name>.Config
    run:     {seed: 0, seeds: 30, output_dir: runs}  # RunConfig
    kernels: {backend: auto, deterministic: false}   # KernelsConfig

Every agent declares its hyperparameters as a frozen dataclass whose fields carry validation metadata
(`hp(default, low=..., high=..., sweep=True)`). Loading checks every key and value before anything
runs: an unknown key is named (with the closest known key suggested), a wrong type or an
out-of-range value is named with what was expected. All such problems raise `ConfigError`.

Fields marked `sweep=True` are numeric hyperparameters that reach the compiled program as traced
values (`hyperparams(config.agent)`), so a grid of settings is one more `vmap`.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml


class ConfigError(ValueError):
    """A config file, override or value that cannot be used; the message names the key."""


def hp(
    default,
    *,
    low=None,
    high=None,
    low_open: bool = False,
    high_open: bool = False,
    choices=None,
    sweep: bool = False,
    doc: str = "",
):
    """A config field with validation metadata.

    `low`/`high` bound numeric values (inclusive unless `low_open`/`high_open`); `choices` lists the
    allowed values; `sweep=True` marks a numeric hyperparameter that `hyperparams` passes to the
    compiled program as a traced float32 scalar (so it can be vmapped over).
    """
    meta = dict(
        low=low,
        high=high,
        low_open=low_open,
        high_open=high_open,
        choices=choices,
        sweep=sweep,
        doc=doc,
    )
    if isinstance(default, (list, dict)):
        raise TypeError("use a tuple default for sequence fields")
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class EnvConfig:
    id: str = hp("GridWorld", doc="an id of envs.make")
    params: Mapping[str, Any] = field(
        default_factory=dict, metadata=dict(doc="overrides of the env's params")
    )
    observe: typing.Optional[typing.Union[str, tuple[int, ...]]] = hp(
        None,
        doc="envs.MaskObservation: the observation entries kept (a list of indices, or 'positions': hide the velocities); default all",
    )

    def make(self):
        """(env, params): `envs.make(id, **params)`, wrapped in `envs.MaskObservation(env, observe)`
        when `observe` is set. ConfigError naming env.id, env.params or env.observe."""
        import envs

        try:
            env, params = envs.make(self.id, **dict(self.params))
        except envs.MissingExtraError as err:
            raise ConfigError(f"env.id: {err}") from None
        except ValueError as err:
            known = self.id in envs.REGISTRY or self.id in envs.registered_ids()
            raise ConfigError(f"{'env.params' if known else 'env.id'}: {err}") from None
        if self.observe is not None:
            try:
                env = envs.MaskObservation(env, self.observe)
            except ValueError as err:
                raise ConfigError(f"env.observe: {err}") from None
        return env, params


@dataclass(frozen=True)
class WandbConfig:
    project: typing.Optional[str] = hp(None, doc="W&B project; logging to W&B is on when it is set")
    entity: typing.Optional[str] = hp(None, doc="W&B entity (user or team); default: the login's")
    mode: str = hp(
        "online",
        choices=("online", "offline", "disabled"),
        doc="W&B mode (WANDB_MODE overrides it)",
    )

    def validate(self):
        """W&B logging needs the wandb package (the `wandb` extra); checked without importing it."""
        import importlib.util

        if (
            self.project is not None
            and self.mode != "disabled"
            and importlib.util.find_spec("wandb") is None
        ):
            raise ConfigError(
                "run.wandb: logging to Weights & Biases needs the wandb package: pip install 'fusedrl[wandb]'"
            )


@dataclass(frozen=True)
class RunConfig:
    seed: int = hp(0, low=0, doc="base seed; seed i of a run uses PRNGKey(seed + i)")
    seeds: int = hp(1, low=1, doc="independent seeds trained at once (vmapped)")
    output_dir: str = hp("runs", doc="parent folder of run directories")
    name: typing.Optional[str] = hp(None, doc="run directory name (default: <agent>-<env>-<time>)")
    progress: bool = hp(True, doc="show a progress bar")
    checkpoint_every: int = hp(10, low=0, doc="log points between checkpoints (0: only at the end)")
    keep_checkpoints: int = hp(3, low=1, doc="newest checkpoints kept in RUN_DIR/checkpoints")
    wandb: WandbConfig = field(
        default_factory=WandbConfig,
        metadata=dict(doc="Weights & Biases logging: {project, entity, mode}"),
    )
    matmul_precision: str = hp(
        "default",
        choices=("default", "high", "highest"),
        doc="float32 matmul precision of the training program (jax.default_matmul_precision at trace "
        "time): default = the platform's fastest (TF32 on Ampere/Hopper GPUs), highest = full float32",
    )

    def validate(self):
        """run.name is one directory name inside run.output_dir (no path separators, not . or ..)."""
        if self.name is not None and (
            self.name in ("", ".", "..") or "/" in self.name or "\\" in self.name
        ):
            raise ConfigError(
                f"run.name: {self.name!r} must be a plain directory name (no '/', not '.' or '..')"
            )


@dataclass(frozen=True)
class KernelsConfig:
    backend: str = hp(
        "auto", choices=("auto", "triton", "reference", "interpret"), doc="kernel backend"
    )
    deterministic: bool = hp(
        False,
        doc="fixed-order kernels (C51 projection without atomic adds, scan look-back "
        "in one order): bitwise-reproducible runs on the GPU, a little slower",
    )


@dataclass(frozen=True)
class Config:
    env: EnvConfig
    agent: Any  # the agent's own frozen Config dataclass; has a `name` field
    run: RunConfig = field(default_factory=RunConfig)
    kernels: KernelsConfig = field(default_factory=KernelsConfig)

    def to_dict(self) -> dict:
        """Plain nested dict (YAML-ready) of every resolved value."""
        return {
            "env": {
                "id": self.env.id,
                "params": _plain(dict(self.env.params)),
                **({} if self.env.observe is None else {"observe": _plain(self.env.observe)}),
            },
            "agent": _plain(dataclasses.asdict(self.agent)),
            "run": _plain(dataclasses.asdict(self.run)),
            "kernels": _plain(dataclasses.asdict(self.kernels)),
        }


def _plain(value):
    """Tuples to lists, recursively, so yaml.safe_dump writes plain YAML."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# ---------------------------------------------------------------- reading files and overrides


def read_yaml(path: str | Path) -> dict:
    """The mapping in a YAML file; ConfigError if it is missing, unreadable or not a mapping."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(
            f"config file {str(path)!r} cannot be parsed: {yaml_error_text(err)}"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(
            f"config file {str(path)!r} cannot be read: {err}".splitlines()[0]
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {str(path)!r} must hold a mapping of sections, got {type(data).__name__}"
        )
    return data


def yaml_error_text(err: yaml.YAMLError) -> str:
    """One line for a YAML error: `line L, column C: <problem> (<context>)`, 1-based like editors;
    the error's first line when it carries no position."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None)
    if mark is None or problem is None:
        return str(err).splitlines()[0]
    context = getattr(err, "context", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" + (
        f" ({context})" if context else ""
    )


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], value parsed as YAML)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like dotted.key=value")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """A copy of `data` with each `dotted.key=value` set (creating sections as needed)."""
    data = _deep_copy(data)
    for text in overrides:
        parts, value = parse_override(text)
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {'.'.join(parts[: i + 1])} is not a section")
            node = child
        node[parts[-1]] = value
    return data


def _deep_copy(value):
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


# ---------------------------------------------------------------- building typed configs


def _suggest(key: str, known, section: str = "") -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    prefix = f"{section}." if section else ""
    return f" (did you mean '{prefix}{close[0]}'?)" if close else ""


def _coerce(value, annotation, where: str):
    """`value` converted to the annotated type, or ConfigError naming `where`."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{where}: bad value {value!r}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        item_type = args[0] if args else Any
        return tuple(_coerce(v, item_type, f"{where}[{i}]") for i, v in enumerate(value))
    if annotation is Any:
        return value
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if annotation is float:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if isinstance(value, str):  # YAML reads 1e-3 (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                raise ConfigError(f"{where}: expected a number, got {value!r}") from None
        elif isinstance(value, (int, float)):
            number = float(value)
        else:
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if number != number:  # NaN passes every range check (comparisons are False)
            raise ConfigError(f"{where}: expected a number, got NaN")
        return number
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def _check_range(value, meta: Mapping, where: str):
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(
            f"{where}: {value!r} is not one of {list(choices)}{_suggest(str(value), map(str, choices))}"
        )
    low, high = meta.get("low"), meta.get("high")
    if value is None or isinstance(value, (str, bool, tuple)):
        return
    if low is not None and (value < low or (meta.get("low_open") and value == low)):
        bound = ">" if meta.get("low_open") else ">="
        raise ConfigError(f"{where}: {value!r} is out of range (must be {bound} {low})")
    if high is not None and (value > high or (meta.get("high_open") and value == high)):
        bound = "<" if meta.get("high_open") else "<="
        raise ConfigError(f"{where}: {value!r} is out of range (must be {bound} {high})")


def build_dataclass(cls, data: Mapping, section: str, ignore: tuple[str, ...] = ()):
    """An instance of the frozen dataclass `cls` from `data`, validating every key and value."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{section}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for key, value in data.items():
        if key in ignore:
            continue
        if key not in fields:
            raise ConfigError(
                f"unknown key '{section}.{key}'{_suggest(key, fields, section)}; known keys: {', '.join(fields)}"
            )
        where = f"{section}.{key}"
        if dataclasses.is_dataclass(hints[key]):
            value = _nested(fields[key], hints[key], value, where)
            values[key] = value
            continue
        value = _coerce(value, hints[key], where)
        _check_range(value, fields[key].metadata, where)
        values[key] = value
    try:
        instance = cls(**values)
    except TypeError as err:
        raise ConfigError(f"{section}: {err}") from None
    for name, f in fields.items():  # defaults are validated too (catches a bad default early)
        if name not in values and f.metadata and not dataclasses.is_dataclass(hints[name]):
            _check_range(getattr(instance, name), f.metadata, f"{section}.{name}")
    validate = getattr(instance, "validate", None)
    if callable(validate):
        validate()
    return instance


def _nested(f, cls, value, where: str):
    """A nested config section (e.g. `agent.network`): the given keys over the field's defaults."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{where}: expected a mapping of {', '.join(x.name for x in dataclasses.fields(cls))}, got {value!r}"
        )
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else cls()
    return build_dataclass(cls, {**_plain(dataclasses.asdict(default)), **value}, where)


def build_config(data: Mapping) -> Config:
    """A validated Config from a nested mapping (a parsed YAML file with overrides applied)."""
    from rl.registry import get_agent_module, registered_agents

    known = ("env", "agent", "run", "kernels")
    for key in data:
        if key not in known:
            raise ConfigError(
                f"unknown section '{key}'{_suggest(key, known)}; known sections: {', '.join(known)}"
            )
    for required in ("env", "agent"):
        if required not in data:
            raise ConfigError(f"missing section '{required}'")
    env = build_dataclass(EnvConfig, data["env"], "env")
    if not isinstance(env.params, Mapping):
        raise ConfigError(f"env.params: expected a mapping, got {env.params!r}")
    env_and_params = env.make()
    agent_data = data["agent"]
    if not isinstance(agent_data, Mapping) or "name" not in agent_data:
        raise ConfigError("agent.name is required (one of: " + ", ".join(registered_agents()) + ")")
    name = agent_data["name"]
    if name not in registered_agents():
        raise ConfigError(
            f"agent.name: unknown agent {name!r}{_suggest(str(name), registered_agents())}; known agents: {', '.join(registered_agents())}"
        )
    module = get_agent_module(name)
    agent = build_dataclass(module.Config, agent_data, "agent")
    check_recurrence(agent, module)
    run = build_dataclass(RunConfig, data.get("run") or {}, "run")
    kernels = build_dataclass(KernelsConfig, data.get("kernels") or {}, "kernels")
    config = Config(env=env, agent=agent, run=run, kernels=kernels)
    check_compatible = getattr(module, "check_env", None)
    if callable(check_compatible):
        check_compatible(config, *env_and_params)
    network = getattr(agent, "network", None)
    if hasattr(
        network, "check_obs_space"
    ):  # rl.networks.NetworkConfig: can the torso read the observations?
        made_env, env_params = env_and_params
        network.check_obs_space(made_env.observation_space(env_params))
    return config


def check_recurrence(agent, module) -> None:
    """ConfigError if `agent.network` is a recurrent torso (gru, lstm) and the agent's module does not
    declare `RECURRENT = True` (it cannot carry a hidden state from step to step)."""
    network = getattr(agent, "network", None)
    if getattr(network, "recurrent", False) and not getattr(module, "RECURRENT", False):
        from rl.registry import get_agent_module, registered_agents

        recurrent = [
            name
            for name in registered_agents()
            if getattr(get_agent_module(name), "RECURRENT", False)
        ]
        raise ConfigError(
            f"agent.network.torso: {network.torso!r} is a recurrent torso and agent {agent.name!r} cannot carry a hidden state; "
            f"use a feedforward torso ('mlp') or a recurrent agent ({', '.join(recurrent) or 'none registered'})"
        )


def load_config(path: str | Path, overrides: list[str] = ()) -> Config:
    """Read, override and validate a config file, given by path or by a packaged config's name."""
    return build_config(apply_overrides(read_yaml(find_config(path)), list(overrides)))


# ---------------------------------------------------------------- configs shipped with the package


def packaged_configs() -> dict[str, Path]:
    """{name: path} of the configs shipped inside the package (`rl/configs/*.yaml`, the checkout's
    `configs/` folder), sorted by name."""
    from importlib.resources import files

    folder = Path(str(files("rl").joinpath("configs")))
    return {path.stem: path for path in sorted(folder.glob("*.yaml"))} if folder.is_dir() else {}


def find_config(name_or_path: str | Path) -> Path:
    """The config file a command-line argument means: an existing file path as it is, else a
    packaged config by name (`ppo_cartpole`, `ppo_cartpole.yaml` or `configs/ppo_cartpole.yaml`).
    ConfigError naming the closest packaged configs when neither exists."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    packaged = packaged_configs()
    name = path.name.removesuffix(".yaml").removesuffix(".yml")
    if name in packaged and (len(path.parts) == 1 or path.parent.name == "configs"):
        return packaged[name]
    close = difflib.get_close_matches(name, list(packaged), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    raise ConfigError(
        f"config file {str(path)!r} does not exist and is not a packaged config{hint} (rl configs lists them)"
    )


# ---------------------------------------------------------------- sweeps and traced hyperparameters


def sweepable(agent_config) -> list[str]:
    """Names of the agent's fields marked `sweep=True`."""
    return [f.name for f in dataclasses.fields(agent_config) if f.metadata.get("sweep")]


def hyperparams(agent_config) -> dict:
    """The sweepable hyperparameters as float32 scalars, the pytree an agent's `train` takes."""
    import jax.numpy as jnp

    return {name: jnp.float32(getattr(agent_config, name)) for name in sweepable(agent_config)}


def parse_sweep(specs: list[str], agent_config) -> list[dict]:
    """`["agent.lr=1e-3,3e-3", "agent.gamma=0.9,0.99"]` -> the grid as a list of {name: value}.

    Each swept key must be a sweepable agent field; each value is validated like a config value.
    """
    names, value_lists = [], []
    fields = {f.name: f for f in dataclasses.fields(agent_config)}
    hints = typing.get_type_hints(type(agent_config))
    for spec in specs:
        if "=" not in spec:
            raise ConfigError(f"--sweep {spec!r} must look like agent.key=v1,v2,...")
        key, raw = spec.split("=", 1)
        name = key.strip().removeprefix("agent.")
        if name not in fields:
            raise ConfigError(f"--sweep: unknown key 'agent.{name}'{_suggest(name, fields)}")
        if not fields[name].metadata.get("sweep"):
            raise ConfigError(
                f"--sweep: agent.{name} cannot be swept; sweepable: {', '.join(sweepable(agent_config))}"
            )
        if name in names:
            raise ConfigError(f"--sweep: agent.{name} is given twice")
        values = []
        for item in raw.split(","):
            item = item.strip()
            if not item:
                raise ConfigError(f"--sweep {spec!r}: empty value")
            value = _coerce(yaml.safe_load(item), hints[name], f"agent.{name}")
            _check_range(value, fields[name].metadata, f"agent.{name}")
            values.append(value)
        names.append(name)
        value_lists.append(values)
    return [dict(zip(names, combo)) for combo in itertools.product(*value_lists)]
