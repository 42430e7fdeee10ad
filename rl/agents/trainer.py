"""The contract between an agent and the runner, and the helpers every agent's `make_train` uses.
An agent module exposes `Config` (a frozen dataclass of hyperparameters), `make_trainer(config)
-> Trainer`, `make_train(config) -> train(key, hparams=None) -> (final_state, metrics)` and
`make_policy(config) -> policy(params, obs, key) -> action` (an agent with memory declares
`RECURRENT = True` and returns a `RecurrentPolicy`).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax

from rl.config import hyperparams


class RecurrentPolicy(NamedTuple):
    """A policy with memory, as `make_policy` returns it for a recurrent agent: every episode starts
    from `initial_carry(batch=())` (the state for one env, or for a batch shape of envs), and each
    step is `step(params, carry, obs, key) -> (carry, action)` (a multi-agent policy's,
    `step(params, carry, obs, key, action_mask) -> (carry, actions)`)."""

    initial_carry: Callable
    step: Callable


def as_recurrent(policy) -> RecurrentPolicy:
    """`policy` if it is a `RecurrentPolicy`, else the memoryless
    `policy(params, obs, key) -> action` (or a team's `policy(params, obs, key, action_mask)`) as
    one with an empty carry: code that plays episodes handles both with one loop."""
    if isinstance(policy, RecurrentPolicy):
        return policy
    return RecurrentPolicy(
        initial_carry=lambda batch=(): (),
        step=lambda params, carry, obs, key, *mask: (carry, policy(params, obs, key, *mask)),
    )


class Trainer(NamedTuple):
    """A run split so it can be checkpointed and resumed between compiled chunks: `init(key,
    hparams) -> state` (the whole training state, typed as `rl.core.state` says) and `run(state,
    hparams, num_log_points) -> (state, metrics)`, a `lax.scan` over log points; `train(key) =
    run(init(key), all log points)`. The runner reads `state.params`, and shards what the state
    holds in an `rl.core.state.Envs` over devices with `--shard envs`."""

    init: Callable  # (key, hparams) -> state: a NamedTuple with `params` (see rl.core.state)
    run: Callable  # (state, hparams, num_log_points) -> (state, metrics); num_log_points is static
    num_log_points: int  # log points in a whole run


def vmap_sequentially_on_cpu(init: Callable) -> Callable:
    """`init` (a Trainer's init), unchanged when called, but vmapped on the CPU as a loop over the
    instances (`lax.map`) instead of as one batched program; on other platforms vmap batches as
    usual. The values are the same either way, and so is which outputs come out batched: as under a
    plain vmap, an output that depends on no batched input (a step counter, an empty buffer) stays
    unbatched, so that e.g. a `lax.cond` on the step counter stays a branch instead of becoming a
    select that computes both sides.

    Network init draws orthogonal weights with a LAPACK QR; a batched QR on XLA:CPU waits on its
    intra-op thread pool and can deadlock it when as many run at once as the pool has threads, while
    an unbatched QR runs inline. `train_from_trainer` and `rl.run.programs` apply this wrapper; code
    that vmaps `trainer.init` itself should too.
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
                return looped(
                    *arg_tree.unflatten([next(batched) if b else x for x, b in zip(leaves, flags)])
                )

            return jax.lax.map(instance, batched)

        out = jax.lax.platform_dependent(
            *args, cpu=one_at_a_time, default=jax.vmap(init, in_axes=in_axes)
        )
        out_leaves, out_tree = jax.tree.flatten(out)
        out_batched = _depends_on(init, arg_tree, jax.tree.leaves(list(args)), flags)
        out_leaves = [x if b else x[0] for x, b in zip(out_leaves, out_batched)]
        return out_tree.unflatten(out_leaves), out_tree.unflatten(out_batched)

    return looped


def _depends_on(fn, arg_tree, leaves, flags) -> list[bool]:
    """For each output leaf of `fn(*args)`: whether it depends on an argument leaf flagged True
    (those carry a leading batch axis in `leaves`). Read off fn's jaxpr, conservatively: an
    equation's outputs all depend on everything its inputs depend on."""
    from jax.extend.core import Var

    shapes = [
        jax.ShapeDtypeStruct(x.shape[1:] if b else x.shape, x.dtype) for x, b in zip(leaves, flags)
    ]
    jaxpr = jax.make_jaxpr(lambda *xs: fn(*arg_tree.unflatten(xs)))(*shapes).jaxpr
    tainted = {v for v, b in zip(jaxpr.invars, flags) if b}
    for eqn in jaxpr.eqns:
        if any(isinstance(v, Var) and v in tainted for v in eqn.invars):
            tainted.update(eqn.outvars)
    return [isinstance(v, Var) and v in tainted for v in jaxpr.outvars]


def train_from_trainer(trainer: Trainer, agent_config) -> Callable:
    """`train(key, hparams=None) -> (final_state, metrics)` running every log point of `trainer`
    (its init vmapped sequentially on the CPU: see `vmap_sequentially_on_cpu`). `train` is pure:
    `jax.jit(jax.vmap(train))(keys)` trains many seeds in one program, and `jax.vmap(train,
    in_axes=(None, 0))(key, grid)` sweeps the sweepable hyperparameters (a dict of float32
    scalars, `rl.config.hyperparams`). `metrics` is a dict of arrays whose leading axis is the log
    point; it always has "step" (env steps so far), "episode_return" and "episode_length" (means
    over the episodes that ended since the previous log point, NaN where none ended)."""
    init = vmap_sequentially_on_cpu(trainer.init)

    def train(key, hparams=None):
        hparams = hyperparams(agent_config) if hparams is None else hparams
        return trainer.run(init(key, hparams), hparams, trainer.num_log_points)

    return train
