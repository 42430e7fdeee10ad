"""Reading and checking config values: YAML files, `dotted.key=value` overrides, the packaged
configs, and the typed building of a frozen dataclass from a mapping, where every key and value is
checked against the field's type and its `hp` metadata (range, choices) and a problem raises one
`ConfigError` naming the key (with the closest known key suggested).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import field
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


def plain(value):
    """Tuples to lists, recursively, so yaml.safe_dump writes plain YAML."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


# What a config may hold: a config is a few hundred lines; aliases (`*name`) are bounded both in
# number and in what they expand to, so a "billion laughs" file fails at once instead of growing
# in memory wherever the config is copied or compared.
MAX_YAML_BYTES = 1 << 20
MAX_YAML_ALIASES = 100
MAX_YAML_NODES = 100_000


class _YamlTooLarge(Exception):
    pass


class BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader that stops at MAX_YAML_ALIASES aliases."""

    def __init__(self, stream):
        super().__init__(stream)
        self.aliases = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_YAML_ALIASES:
                raise _YamlTooLarge(f"more than {MAX_YAML_ALIASES} aliases (*name)")
        return super().compose_node(parent, index)


def _expanded_size(value, memo: dict, active: set) -> int:
    """Nodes of `value` with every alias expanded (shared lists and mappings counted each time they
    appear, computed once); _YamlTooLarge past MAX_YAML_NODES or for a value that holds itself."""
    if not isinstance(value, (dict, list)):
        return 1
    key = id(value)
    if key in memo:
        return memo[key]
    if key in active:
        raise _YamlTooLarge("a value that holds itself (a recursive alias)")
    active.add(key)
    items = value.values() if isinstance(value, dict) else value
    total = 1 + sum(_expanded_size(item, memo, active) for item in items)
    active.discard(key)
    if total > MAX_YAML_NODES:
        raise _YamlTooLarge(f"more than {MAX_YAML_NODES:,} values once its aliases are expanded")
    memo[key] = total
    return total


def load_yaml(text: str, where: str):
    """`text` parsed as YAML (safe: plain values only), or ConfigError naming `where` for a text
    that is not YAML or holds more than the limits above allow."""
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(f"{where} is larger than {MAX_YAML_BYTES:,} bytes: not read")
    try:
        data = yaml.load(text, Loader=BoundedLoader)
        _expanded_size(data, {}, set())
    except _YamlTooLarge as err:
        raise ConfigError(f"{where} cannot be used: it holds {err}") from None
    except RecursionError:
        raise ConfigError(f"{where} cannot be used: it is nested too deeply") from None
    return data


def read_yaml(path: str | Path) -> dict:
    """The mapping in a YAML file; ConfigError if it is missing, unreadable, larger than the limits
    of `load_yaml` or not a mapping."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
        data = load_yaml(raw.decode(), f"config file {str(path)!r}")
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


def quoted_override(key: str, value: str) -> str:
    """`key="value"`: an override that sets `key` to the string `value` as it is (a YAML
    double-quoted scalar), where `key=value` would read `null`, `~`, `#x` or `[1]` as YAML."""
    escaped = "".join(
        c if c.isprintable() and c not in '"\\' else f"\\U{ord(c):08x}" for c in value
    )
    return f'{key}="{escaped}"'


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], value parsed as YAML)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like dotted.key=value")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = load_yaml(raw, f"override {key.strip()}") if raw.strip() else ""
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


def suggest(key: str, known, section: str = "") -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    prefix = f"{section}." if section else ""
    return f" (did you mean '{prefix}{close[0]}'?)" if close else ""


def coerce(value, annotation, where: str):
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
                return coerce(value, arg, where)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{where}: bad value {value!r}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        item_type = args[0] if args else Any
        return tuple(coerce(v, item_type, f"{where}[{i}]") for i, v in enumerate(value))
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


def check_range(value, meta: Mapping, where: str):
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(
            f"{where}: {value!r} is not one of "
            f"{list(choices)}{suggest(str(value), map(str, choices))}"
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
                f"unknown key '{section}.{key}'{suggest(key, fields, section)}; "
                f"known keys: {', '.join(fields)}"
            )
        where = f"{section}.{key}"
        if dataclasses.is_dataclass(hints[key]):
            value = _nested(fields[key], hints[key], value, where)
            values[key] = value
            continue
        value = coerce(value, hints[key], where)
        check_range(value, fields[key].metadata, where)
        values[key] = value
    try:
        instance = cls(**values)
    except TypeError as err:
        raise ConfigError(f"{section}: {err}") from None
    for name, f in fields.items():  # defaults are validated too (catches a bad default early)
        if name not in values and f.metadata and not dataclasses.is_dataclass(hints[name]):
            check_range(getattr(instance, name), f.metadata, f"{section}.{name}")
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
            f"{where}: expected a mapping of "
            f"{', '.join(x.name for x in dataclasses.fields(cls))}, got {value!r}"
        )
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else cls()
    return build_dataclass(cls, {**plain(dataclasses.asdict(default)), **value}, where)


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
        f"config file {str(path)!r} does not exist and is not a packaged config{hint} "
        "(rl configs lists them)"
    )
