"""Agents. Each module exposes `Config` (a frozen dataclass of hyperparameters),
`make_trainer(config) -> Trainer` and `make_train(config) -> train(key, hparams=None) -> (final_state, metrics)`.

A `Trainer` splits a run so it can be checkpointed and resumed between compiled chunks:
`init(key, hparams) -> state` (the whole training state: params, optimiser state, env states,
buffers, PRNG key, counters) and `run(state, hparams, num_log_points) -> (state, metrics)`, a
`lax.scan` over log points. `train(key) = run(init(key), all log points)`.

`train` is pure: `jax.jit(jax.vmap(train))(keys)` trains many seeds in one program, and
`jax.vmap(train, in_axes=(None, 0))(key, grid)` sweeps the sweepable hyperparameters (a dict of
float32 scalars, see `rl.config.hyperparams`). `metrics` is a dict of arrays whose leading axis is
the log point; it always has "step" (env steps so far), "episode_return" and "episode_length" (means
over the episodes that ended since the previous log point, NaN where none ended).
"""

from __future__ import annotations

import importlib
import os

# XLA's CPU "concurrency optimized" scheduler (jaxlib 0.10.2) can hang forever (every thread idle) on
# some vmapped training programs, e.g. SAC's under the sweep x seed vmap of rl.train. Turned off
# before the CPU backend starts; an XLA_FLAGS that already sets it wins.
_CPU_SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler"
if _CPU_SCHEDULER_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_CPU_SCHEDULER_FLAG}=false".strip()
from typing import Callable, NamedTuple


class Trainer(NamedTuple):
    init: Callable  # (key, hparams) -> state; state is a dict with at least "params"
    run: Callable  # (state, hparams, num_log_points) -> (state, metrics); num_log_points is static
    num_log_points: int  # log points in a whole run


def train_from_trainer(trainer: Trainer, agent_config) -> Callable:
    """`train(key, hparams=None) -> (final_state, metrics)` running every log point of `trainer`."""
    from rl.config import hyperparams

    def train(key, hparams=None):
        hparams = hyperparams(agent_config) if hparams is None else hparams
        return trainer.run(trainer.init(key, hparams), hparams, trainer.num_log_points)

    return train

# name -> module. Add new agents here once their module imports cleanly.
AGENTS: dict[str, str] = {
    "qlearning": "rl.agents.qlearning",
    "dqn": "rl.agents.dqn",
    "rainbow": "rl.agents.rainbow",
    "ppo": "rl.agents.ppo",
    "sac": "rl.agents.sac",
}


def registered_agents() -> list[str]:
    return sorted(AGENTS)


def get_agent_module(name: str):
    """The agent's module (with `Config` and `make_train`); ValueError for an unknown name."""
    if name not in AGENTS:
        raise ValueError(f"unknown agent {name!r}; known agents: {', '.join(registered_agents())}")
    return importlib.import_module(AGENTS[name])
