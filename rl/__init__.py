"""Agents, networks, replay buffers, configs and the `rl` command line."""

from rl.registry import get_agent_module, registered_agents
from rl.config import Config, ConfigError, load_config

__all__ = ["Config", "ConfigError", "load_config", "get_agent_module", "registered_agents"]
