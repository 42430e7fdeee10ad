"""Typed, frozen experiment configs loaded from YAML, with `dotted.key=value` overrides
(`load_config`); a file has six sections, of which `env` and `agent` are required:
    env:     {id: GridWorld, params: {size: 5}}      # envs.make(id, **params); `observe` masks
    agent:   {name: qlearning, lr: 0.1, ...}         # fields of rl.agents.<name>.Config
    run:     {seed: 0, seeds: 30, output_dir: runs}  # RunConfig
    kernels: {backend: auto, deterministic: false, precision: float32}   # KernelsConfig
    arch:    {name: sebulba, actor_threads: 2}       # ArchConfig (default: anakin)
    promise: {seeds: 16, at_least: 475, share: 0.8}  # rl.config.promise: validated, not used
"""

from __future__ import annotations

import dataclasses
import itertools
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from rl.config.arch import ArchConfig, check_arch
from rl.config.limits import check_log_points, check_memory, processes
from rl.config.parsing import (
    ConfigError,
    apply_overrides,
    build_dataclass,
    check_range,
    coerce,
    find_config,
    hp,
    plain,
    read_yaml,
    suggest,
)
from rl.config.unrolling import resolve_unroll


@dataclass(frozen=True)
class EnvConfig:
    id: str = hp("GridWorld", doc="an id of envs.make")
    params: Mapping[str, Any] = field(
        default_factory=dict, metadata=dict(doc="overrides of the env's params")
    )
    observe: typing.Optional[typing.Union[str, tuple[int, ...]]] = hp(
        None,
        doc="envs.MaskObservation: the observation entries kept (a list of indices, or "
        "'positions': hide the velocities); default all",
    )

    def make(self):
        """(env, params): `envs.make(id, **params)`, wrapped in `envs.MaskObservation(env, observe)`
        when `observe` is set. ConfigError naming env.id, env.params or env.observe."""
        import envs

        try:
            env, params = envs.make(self.id, **dict(self.params))
        except envs.MissingExtraError as err:
            raise ConfigError(f"env.id: {err}") from None
        except (ValueError, TypeError) as err:  # TypeError: gymnasium.make's unknown keyword
            # (listing the registered ids imports every adapter's library; no gymnasium id is one)
            gymnasium = self.id.startswith("gymnasium:")
            known = self.id in envs.REGISTRY or (not gymnasium and self.id in envs.registered_ids())
            key = "env.params" if known or isinstance(err, TypeError) else "env.id"
            raise ConfigError(f"{key}: {err}") from None
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
                "run.wandb: logging to Weights & Biases needs the wandb package: "
                "pip install 'fusedrl[wandb]'"
            )


# PRNGKey takes 32-bit seeds (a larger one is cut to its low bits: two seeds would be one)
MAX_SEED = 2**32 - 1
# bytes in a file name on Linux, macOS and Windows filesystems
NAME_MAX = 255


@dataclass(frozen=True)
class RunConfig:
    seed: int = hp(0, low=0, high=MAX_SEED, doc="base seed; seed i of a run uses PRNGKey(seed + i)")
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
    compilation_cache: typing.Union[str, bool] = hp(
        "auto",
        doc="where compiled programs are kept for the next run of the same config: auto (the "
        "environment variable FUSEDRL_COMPILATION_CACHE, else ~/.cache/fusedrl/jax), off (YAML's "
        "false), or a directory",
    )
    matmul_precision: str = hp(
        "default",
        choices=("default", "high", "highest"),
        doc="float32 matmul precision of the training program (jax.default_matmul_precision "
        "at trace time): default = the platform's fastest (TF32 on Ampere/Hopper GPUs), "
        "highest = full float32",
    )

    def validate(self):
        """run.name is one directory name inside run.output_dir (no path separators, not . or
        .., no control characters, at most NAME_MAX bytes); run.output_dir holds no control
        characters; the seeds' PRNG seeds fit in 32 bits."""
        if self.name is not None and (
            self.name in ("", ".", "..") or "/" in self.name or "\\" in self.name
        ):
            raise ConfigError(
                f"run.name: {self.name!r} must be a plain directory name (no '/', not '.' or '..')"
            )
        for key, text in (("run.name", self.name), ("run.output_dir", self.output_dir)):
            if text is not None and not all(c.isprintable() or c == " " for c in text):
                raise ConfigError(
                    f"{key}: {text[:80]!r} holds control characters (a newline, NUL, escape ...); "
                    "choose a name of printable characters"
                )
        if self.name is not None and len(self.name.encode(errors="replace")) > NAME_MAX:
            raise ConfigError(
                f"run.name: {len(self.name.encode(errors='replace'))} bytes long, more than the "
                f"{NAME_MAX} a file name can have; choose a shorter name"
            )
        if self.seed + self.seeds - 1 > MAX_SEED:
            raise ConfigError(
                f"run.seed: seeds {self.seed} to {self.seed + self.seeds - 1} go past {MAX_SEED} "
                "(PRNG seeds are 32-bit); lower run.seed or run.seeds"
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
    precision: str = hp(
        "float32",
        choices=("float32", "tf32", "bf16"),
        doc="matmul precision of the fused MLP kernels (DQN, SAC, TD3, PPO gradients; DQN and "
        "Rainbow acting): float32 = float32 operands, products at run.matmul_precision (TF32 on "
        "Ampere/Hopper GPUs at its default, full float32 at highest); tf32 = TF32 products "
        "whatever run.matmul_precision; bf16 = bfloat16 weights and activations in the kernels' "
        "matmuls, float32 accumulation, params and optimiser state float32. XLA's own matmuls "
        "(autodiff paths, the reference backend) keep run.matmul_precision. Never chosen "
        "automatically",
    )


@dataclass(frozen=True)
class Config:
    env: EnvConfig
    agent: Any  # the agent's own frozen Config dataclass; has a `name` field
    run: RunConfig = field(default_factory=RunConfig)
    kernels: KernelsConfig = field(default_factory=KernelsConfig)
    arch: ArchConfig = field(default_factory=ArchConfig)

    def to_dict(self) -> dict:
        """Plain nested dict (YAML-ready) of every resolved value (`arch` only when not the
        default, so the records of earlier runs still match)."""
        arch = self.arch != ArchConfig()
        return {
            "env": {
                "id": self.env.id,
                "params": plain(dict(self.env.params)),
                **({} if self.env.observe is None else {"observe": plain(self.env.observe)}),
            },
            "agent": plain(dataclasses.asdict(self.agent)),
            "run": plain(dataclasses.asdict(self.run)),
            "kernels": plain(dataclasses.asdict(self.kernels)),
            **({"arch": plain(dataclasses.asdict(self.arch))} if arch else {}),
        }


def build_config(data: Mapping) -> Config:
    """A validated Config from a nested mapping (a parsed YAML file with overrides applied). Every
    key and value is checked before anything runs, against the fields' validation metadata
    (`hp(default, low=..., high=..., sweep=True)`): an unknown key is named with the closest known
    key suggested, a wrong type or an out-of-range value with what was expected; all raise
    `ConfigError`."""
    from rl.config.promise import parse_promise
    from rl.config.registry import get_agent_module, registered_agents

    known = ("env", "agent", "run", "kernels", "arch", "promise")
    for key in data:
        if key not in known:
            raise ConfigError(
                f"unknown section '{key}'{suggest(key, known)}; known sections: {', '.join(known)}"
            )
    for required in ("env", "agent"):
        if required not in data:
            raise ConfigError(f"missing section '{required}'")
    if data.get("promise") is not None:  # checked here, used by benchmarks/configs_check.py only
        parse_promise(data["promise"])
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
            f"agent.name: unknown agent {name!r}{suggest(str(name), registered_agents())}; "
            f"known agents: {', '.join(registered_agents())}"
        )
    module = get_agent_module(name)
    agent = build_dataclass(module.Config, agent_data, "agent")
    check_recurrence(agent, module)
    check_multi_agent(agent, module, env.id, env_and_params[0])
    run = build_dataclass(RunConfig, data.get("run") or {}, "run")
    agent = resolve_unroll(agent, name, default_platform(), run.seeds)
    kernels = build_dataclass(KernelsConfig, data.get("kernels") or {}, "kernels")
    arch = data.get("arch") or {}
    arch = build_dataclass(ArchConfig, {"name": arch} if isinstance(arch, str) else arch, "arch")
    config = Config(env=env, agent=agent, run=run, kernels=kernels, arch=arch)
    check_arch(config)
    check_log_points(agent)
    check_memory(config, *env_and_params, processes=processes())
    message = host_env_warning(config)
    if message is not None:
        warnings.warn(message, HostEnvWarning, stacklevel=2)
    check_compatible = getattr(module, "check_env", None)
    if callable(check_compatible):
        check_compatible(config, *env_and_params)
    network = getattr(agent, "network", None)
    if hasattr(
        network, "check_obs_space"
    ):  # rl.nn.network_config.NetworkConfig: can the torso read the observations?
        made_env, env_params = env_and_params
        network.check_obs_space(made_env.observation_space(env_params))
    return config


def default_platform() -> str:
    """The platform of JAX's default device ("cpu", "cuda", ...): what `agent.unroll: auto`
    resolves for."""
    import jax

    return jax.devices()[0].platform


class HostEnvWarning(UserWarning):
    """A gymnasium env inside the one compiled program (`arch: anakin`): every step a host call."""


def host_env_warning(config: Config) -> str | None:
    """What to say when a `gymnasium:<id>` env trains under `arch: anakin`, where every env step is
    a callback from the compiled program to the host (on CartPole about 25x slower than the
    built-in JAX env): the built-in env of the same id where there is one, and the actor-learner
    layout, `arch: sebulba`, whose actor threads step gymnasium's envs. None for any other run."""
    if config.arch.name != "anakin" or not config.env.id.startswith("gymnasium:"):
        return None
    import envs
    from rl.config.arch import SEBULBA_AGENTS

    gym_id = config.env.id.removeprefix("gymnasium:")
    builtin = f"the built-in env.id={gym_id}, or " if gym_id in envs.REGISTRY else ""
    agents = "" if config.agent.name in SEBULBA_AGENTS else f" (for {', '.join(SEBULBA_AGENTS)})"
    return (
        f"env.id: {config.env.id} under arch anakin calls back to the host for every env step "
        f"(on CartPole about 25x slower than a JAX env); use {builtin}arch.name=sebulba "
        f"run.seeds=1{agents}: actor threads step gymnasium's envs (e.g. rl train "
        "ppo_sebulba_cartpole)"
    )


def check_multi_agent(agent, module, env_id: str, env) -> None:
    """ConfigError when a multi-agent env (`envs.multi_agent`) meets an agent whose module does not
    declare `MULTI_AGENT = True`, or a multi-agent agent meets a single-agent env; the message
    names the agents that fit."""
    from envs.multi_agent import is_multi_agent
    from rl.config.registry import get_agent_module, registered_agents

    wants_many = bool(getattr(module, "MULTI_AGENT", False))
    if is_multi_agent(env) == wants_many:
        return
    fitting = [
        name
        for name in registered_agents()
        if bool(getattr(get_agent_module(name), "MULTI_AGENT", False)) != wants_many
    ]
    if wants_many:
        raise ConfigError(
            f"env.id: agent {agent.name!r} trains teams of agents and {env_id!r} is a "
            f"single-agent env; use a multi-agent env ('jaxmarl:<id>') or a single-agent agent "
            f"({', '.join(fitting)})"
        )
    raise ConfigError(
        f"agent.name: {agent.name!r} does not support multi-agent envs and {env_id!r} has "
        f"{env.num_agents} agents; use a multi-agent agent "
        f"({', '.join(fitting) or 'none registered'})"
    )


def check_recurrence(agent, module) -> None:
    """ConfigError if `agent.network` is a recurrent torso (gru, lstm) and the agent's module does
    not declare `RECURRENT = True` (it cannot carry a hidden state from step to step)."""
    network = getattr(agent, "network", None)
    if getattr(network, "recurrent", False) and not getattr(module, "RECURRENT", False):
        from rl.config.registry import get_agent_module, registered_agents

        recurrent = [
            name
            for name in registered_agents()
            if getattr(get_agent_module(name), "RECURRENT", False)
        ]
        raise ConfigError(
            f"agent.network.torso: {network.torso!r} is a recurrent torso and agent "
            f"{agent.name!r} cannot carry a hidden state; use a feedforward torso ('mlp') or a "
            f"recurrent agent ({', '.join(recurrent) or 'none registered'})"
        )


def load_config(path: str | Path, overrides: list[str] = ()) -> Config:
    """Read, override and validate a config file, given by path or by a packaged config's name."""
    found = find_config(path)
    return build_from_file(apply_overrides(read_yaml(found), list(overrides)), found)


def build_from_file(data: Mapping, path) -> Config:
    """`build_config(data)` of a file's mapping, where a value of a type no check expected (a
    crafted file: a list where the env wants a number, ...) is one ConfigError naming the file,
    not a traceback from deep inside an env or agent."""
    try:
        return build_config(data)
    except (TypeError, KeyError, AttributeError, IndexError, ValueError, OverflowError) as err:
        if isinstance(err, ConfigError):
            raise
        detail = str(err).splitlines()[0] if str(err) else ""
        raise ConfigError(
            f"config file {str(path)!r} cannot be used: {type(err).__name__}"
            + (f": {detail[:200]}" if detail else "")
        ) from None


# ---------------------------------------------------------------- sweeps and traced hyperparameters


def sweepable(agent_config) -> list[str]:
    """Names of the agent's fields marked `sweep=True`."""
    return [f.name for f in dataclasses.fields(agent_config) if f.metadata.get("sweep")]


def hyperparams(agent_config) -> dict:
    """The sweepable hyperparameters (fields marked `sweep=True`) as float32 scalars, the pytree an
    agent's `train` takes: traced values, so a grid of settings is one more `vmap`."""
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
            raise ConfigError(f"--sweep: unknown key 'agent.{name}'{suggest(name, fields)}")
        if not fields[name].metadata.get("sweep"):
            raise ConfigError(
                f"--sweep: agent.{name} cannot be swept; "
                f"sweepable: {', '.join(sweepable(agent_config))}"
            )
        if name in names:
            raise ConfigError(f"--sweep: agent.{name} is given twice")
        values = []
        for item in raw.split(","):
            item = item.strip()
            if not item:
                raise ConfigError(f"--sweep {spec!r}: empty value")
            value = coerce(yaml.safe_load(item), hints[name], f"agent.{name}")
            check_range(value, fields[name].metadata, f"agent.{name}")
            values.append(value)
        names.append(name)
        value_lists.append(values)
    return [dict(zip(names, combo)) for combo in itertools.product(*value_lists)]
