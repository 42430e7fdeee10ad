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
over the episodes that ended since the previous log point, NaN where none ended). Under vmap on
the CPU, `train` runs its init one instance at a time (`vmap_sequentially_on_cpu`: batched
orthogonal init can hang XLA:CPU); code that vmaps a Trainer's `init` itself should wrap it too.
"""

from __future__ import annotations

import importlib
from typing import Callable, NamedTuple

import jax


class Trainer(NamedTuple):
    init: Callable  # (key, hparams) -> state; state is a dict with at least "params"
    run: Callable  # (state, hparams, num_log_points) -> (state, metrics); num_log_points is static
    num_log_points: int  # log points in a whole run


def vmap_sequentially_on_cpu(init: Callable) -> Callable:
    """`init` (a Trainer's init), unchanged when called, but vmapped on the CPU as a loop over the
    instances (`lax.map`) instead of as one batched program; on other platforms vmap batches as usual.
    The values are the same either way, and so is which outputs come out batched: as under a plain
    vmap, an output that depends on no batched input (a step counter, an empty buffer) stays
    unbatched, so that e.g. a `lax.cond` on the step counter stays a branch instead of becoming a
    select that computes both sides.

    Why: network init draws orthogonal weights with a LAPACK QR. Batched by vmap (seeds, sweep
    settings), XLA:CPU's LAPACK kernel (jaxlib 0.10.2) splits the batch over the intra-op thread pool
    and blocks its worker thread until the pieces are done. When as many such QRs run at once as the
    pool has threads (2 on a 2-core machine; XLA's default, concurrency-optimized scheduler does run
    independent ones at once) every worker waits on pieces that no thread is left to run: the
    program hangs forever with every thread idle. Unbatched, a QR runs inline and cannot block. Init
    runs once per run, so looping over the instances costs next to nothing. `train_from_trainer` and
    rl.train apply it; code that vmaps `trainer.init` itself should too.
    """
    looped = jax.custom_batching.custom_vmap(init)

    @looped.def_vmap
    def rule(axis_size, in_batched, *args):
        flags, arg_tree = jax.tree.flatten(list(in_batched))
        in_axes = tuple(jax.tree.map(lambda batched: 0 if batched else None, list(in_batched)))

        def one_at_a_time(*args):
            leaves = jax.tree.leaves(list(args))
            batched = [x for x, b in zip(leaves, flags) if b]

            def instance(batched):
                batched = iter(batched)
                return looped(*arg_tree.unflatten([next(batched) if b else x for x, b in zip(leaves, flags)]))

            return jax.lax.map(instance, batched)

        out = jax.lax.platform_dependent(*args, cpu=one_at_a_time, default=jax.vmap(init, in_axes=in_axes))
        out_leaves, out_tree = jax.tree.flatten(out)
        out_batched = _depends_on(init, arg_tree, jax.tree.leaves(list(args)), flags)
        out_leaves = [x if b else x[0] for x, b in zip(out_leaves, out_batched)]
        return out_tree.unflatten(out_leaves), out_tree.unflatten(out_batched)

    return looped


def _depends_on(fn, arg_tree, leaves, flags) -> list[bool]:
    """For each output leaf of `fn(*args)`: whether it depends on an argument leaf flagged True (those
    carry a leading batch axis in `leaves`). Read off fn's jaxpr, conservatively: an equation's
    outputs all depend on everything its inputs depend on."""
    from jax.extend.core import Var

    shapes = [jax.ShapeDtypeStruct(x.shape[1:] if b else x.shape, x.dtype) for x, b in zip(leaves, flags)]
    jaxpr = jax.make_jaxpr(lambda *xs: fn(*arg_tree.unflatten(xs)))(*shapes).jaxpr
    tainted = {v for v, b in zip(jaxpr.invars, flags) if b}
    for eqn in jaxpr.eqns:
        if any(isinstance(v, Var) and v in tainted for v in eqn.invars):
            tainted.update(eqn.outvars)
    return [isinstance(v, Var) and v in tainted for v in jaxpr.outvars]


def train_from_trainer(trainer: Trainer, agent_config) -> Callable:
    """`train(key, hparams=None) -> (final_state, metrics)` running every log point of `trainer`
    (its init vmapped sequentially on the CPU: see `vmap_sequentially_on_cpu`)."""
    from rl.config import hyperparams

    init = vmap_sequentially_on_cpu(trainer.init)

    def train(key, hparams=None):
        hparams = hyperparams(agent_config) if hparams is None else hparams
        return trainer.run(init(key, hparams), hparams, trainer.num_log_points)

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
