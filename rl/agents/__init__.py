"""The agents, one module each (the names are in `rl.config.registry.AGENTS`).

Each reads top to bottom as its training loop, built from plain pieces (`rl.core.losses`,
`rl.nn.networks` (torsos, heads, action distributions), `rl.replay.buffers`, `rl.core.collection`,
`rl.core.log_points`, ...); the contract they meet is in `rl.agents.trainer`, the name lookup in
`rl.config.registry`.
"""

from rl.agents.trainer import Trainer, train_from_trainer, vmap_sequentially_on_cpu
from rl.config.registry import get_agent_module, registered_agents

__all__ = [
    "Trainer",
    "get_agent_module",
    "registered_agents",
    "train_from_trainer",
    "vmap_sequentially_on_cpu",
]
