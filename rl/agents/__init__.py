"""The agents, one module each (the names are in `rl.registry.AGENTS`).

Each reads top to bottom as its training loop, built from plain pieces (`rl.losses`,
`rl.networks` (torsos, heads, action distributions), `rl.buffers`, `rl.collection`,
`rl.log_points`, ...); the contract they meet is in `rl.trainer`, the name lookup in `rl.registry`.
"""

from rl.registry import get_agent_module, registered_agents
from rl.trainer import Trainer, train_from_trainer, vmap_sequentially_on_cpu

__all__ = [
    "Trainer",
    "get_agent_module",
    "registered_agents",
    "train_from_trainer",
    "vmap_sequentially_on_cpu",
]
