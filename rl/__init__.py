"""Agents, networks, replay buffers, configs and the `rl` command line, in packages by layer
(`rl.config`, `rl.core`, `rl.nn`, `rl.replay`, `rl.fused`, `rl.agents`, `rl.sebulba`, `rl.run`,
`rl.cli`). The building blocks an agent is written from are also reachable here by their short
names, imported on first use: `from rl import losses, networks, buffers`.
"""

import importlib

from rl.config import Config, load_config
from rl.config.parsing import ConfigError
from rl.config.registry import get_agent_module, registered_agents

BUILDING_BLOCKS = {
    **{
        name: f"rl.core.{name}"
        for name in (
            "collection",
            "environment",
            "episodes",
            "exploration",
            "log_points",
            "losses",
            "minibatches",
            "observation_norm",
            "optimizers",
            "packing",
            "rollout",
            "state",
        )
    },
    **{
        name: f"rl.nn.{name}"
        for name in (
            "batch_renorm",
            "cnn",
            "layers",
            "mixers",
            "multi_agent",
            "networks",
            "param_layout",
            "recurrent",
            "simbav2",
        )
    },
    "buffers": "rl.replay.buffers",
    "evaluation": "rl.cli.evaluation",
    "trainer": "rl.agents.trainer",
}

__all__ = ["Config", "ConfigError", "load_config", "get_agent_module", "registered_agents"]


def __getattr__(name: str):
    """A building block by its short name (`rl.losses` is `rl.core.losses`), imported on first
    use so that `import rl` stays light."""
    if name in BUILDING_BLOCKS:
        return importlib.import_module(BUILDING_BLOCKS[name])
    raise AttributeError(f"module 'rl' has no attribute {name!r}")
