"""Agent names -> agent modules. `rl.config` looks agents up here; agent modules import nothing
from it."""

from __future__ import annotations

import importlib

AGENTS: dict[str, str] = {
    "qlearning": "rl.agents.qlearning",
    "dqn": "rl.agents.dqn",
    "rainbow": "rl.agents.rainbow",
    "ppo": "rl.agents.ppo",
    "ppo_rnn": "rl.agents.ppo_rnn",
    "sac": "rl.agents.sac",
    "td3": "rl.agents.td3",
    "pqn": "rl.agents.pqn",
    "ippo": "rl.agents.ippo",
    "mappo": "rl.agents.mappo",
    "ippo_rnn": "rl.agents.ippo_rnn",
    "mappo_rnn": "rl.agents.mappo_rnn",
    "pqn_vdn": "rl.agents.pqn_vdn",
}


def registered_agents() -> list[str]:
    """The agent names, sorted."""
    return sorted(AGENTS)


def get_agent_module(name: str):
    """The agent's module (with `Config`, `make_trainer`, `make_train`, `make_policy`); ValueError
    for an unknown name."""
    if name not in AGENTS:
        raise ValueError(f"unknown agent {name!r}; known agents: {', '.join(registered_agents())}")
    return importlib.import_module(AGENTS[name])
