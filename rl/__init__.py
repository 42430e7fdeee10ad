"""Agents, networks, replay buffers, configs and the `rl` command line."""

from rl.config import Config, load_config
from rl.config_parsing import ConfigError
from rl.registry import get_agent_module, registered_agents

__all__ = ["Config", "ConfigError", "load_config", "get_agent_module", "registered_agents"]
