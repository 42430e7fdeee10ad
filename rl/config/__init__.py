"""Typed settings, the lowest layer: every other package of `rl` reads them and this one imports
nothing else from `rl`. `parsing` turns YAML and `key=value` overrides into frozen dataclasses
(`hp` fields, `ConfigError` naming the key); `schema` is the whole run's `Config` and its sections;
`loops` the settings agent families share; `arch`, `limits`, `unrolling` and `promise` the
checks and choices made when a config is built; `registry` maps agent names to their modules.
"""

from rl.config.schema import (
    Config,
    EnvConfig,
    HostEnvWarning,
    KernelsConfig,
    RunConfig,
    WandbConfig,
    build_config,
    build_from_file,
    check_multi_agent,
    check_recurrence,
    default_platform,
    host_env_warning,
    hyperparams,
    load_config,
    parse_sweep,
    sweepable,
)

__all__ = [
    "Config",
    "EnvConfig",
    "HostEnvWarning",
    "KernelsConfig",
    "RunConfig",
    "WandbConfig",
    "build_config",
    "build_from_file",
    "check_multi_agent",
    "check_recurrence",
    "default_platform",
    "host_env_warning",
    "hyperparams",
    "load_config",
    "parse_sweep",
    "sweepable",
]
