"""Agents, networks, replay buffers, configs and the `rl` command line."""

from rl.config import Config, ConfigError, load_config
from rl.registry import get_agent_module, registered_agents

__all__ = ["Config", "ConfigError", "load_config", "get_agent_module", "registered_agents"]
