"""Agents. Each module exposes `Config` (a frozen dataclass of hyperparameters) and
`make_train(config) -> train(key, hparams=None) -> (final_state, metrics)`.

`train` is pure: `jax.jit(jax.vmap(train))(keys)` trains many seeds in one program, and
`jax.vmap(train, in_axes=(None, 0))(key, grid)` sweeps the sweepable hyperparameters (a dict of
float32 scalars, see `rl.config.hyperparams`). `metrics` is a dict of arrays whose leading axis is
the log point; it always has "step" (env steps so far), "episode_return" and "episode_length" (means
over the episodes that ended since the previous log point, NaN where none ended).
"""

from __future__ import annotations

import importlib

# name -> module. Add new agents here once their module imports cleanly.
AGENTS: dict[str, str] = {
    "qlearning": "rl.agents.qlearning",
}


def registered_agents() -> list[str]:
    return sorted(AGENTS)


def get_agent_module(name: str):
    """The agent's module (with `Config` and `make_train`); ValueError for an unknown name."""
    if name not in AGENTS:
        raise ValueError(f"unknown agent {name!r}; known agents: {', '.join(registered_agents())}")
    return importlib.import_module(AGENTS[name])
