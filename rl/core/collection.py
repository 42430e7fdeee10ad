"""Collecting rollouts: the PRNG keys of a rollout, split up front, a `lax.scan` whose small
per-step outputs are stored as one packed row per step, and the mask of the steps a loss counts."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rl.core import packing


def step_mask(traj):
    """The steps of the rollout `traj` a loss counts: not `traj.reset_step` (the steps that only
    reset an env after an episode's end, rl.sebulba's next-step resets); None where the
    rollout has no reset steps. A reset step's own advantage or target is meaningless, but no other
    step's reads it: it follows an episode end, where GAE's and Q(lambda)'s chains stop."""
    return None if traj.reset_step is None else ~traj.reset_step


def rollout_keys(key, num_steps: int, num_envs: int):
    """Per rollout step: the action key and one env key per env (split up front, outside the
    loop)."""
    pairs = jax.vmap(jax.random.split)(jax.random.split(key, num_steps))
    return pairs[:, 0], jax.vmap(lambda k: jax.random.split(k, num_envs))(pairs[:, 1])


PACKED_OUTPUT_MAX = (
    4096  # most elements per step of an output leaf that `scan_packed_outputs` packs
)


def scan_packed_outputs(step: Callable, carry, xs, *, length: int | None = None, unroll: int = 1):
    """`jax.lax.scan(step, carry, xs, length, unroll=unroll)`, the same (carry, stacked outputs)
    bit for bit, with the per-step output leaves of at most `PACKED_OUTPUT_MAX` elements stored as
    one row of `packing.pack`'s blocks (32-bit leaves and small narrow ones bitcast into one uint32
    row, other dtypes one row each) and unpacked after the loop. Stacking a leaf costs a
    dynamic-update-slice per loop trip; a rollout step's transition (observation, action, log-prob,
    reward, terminated, truncated, final observation) becomes one or two instead of one per leaf.
    Larger leaves (image observations) are stacked as they are, so no large output is copied once
    more after the loop (unpacking slices the small ones out of the stacked rows)."""
    packed_layout = []  # filled while tracing `packed_step`

    def is_small(leaf) -> bool:
        return int(np.prod(jnp.shape(leaf))) <= PACKED_OUTPUT_MAX

    def packed_step(carry, x):
        carry, out = step(carry, x)
        leaves, treedef = jax.tree.flatten(out)
        small = [leaf for leaf in leaves if is_small(leaf)]
        large = [leaf for leaf in leaves if not is_small(leaf)]
        layout = packing.storage_layout(small)
        packed_layout.append((treedef, [is_small(leaf) for leaf in leaves], layout))
        return carry, (packing.pack(layout, small) if small else (), large)

    carry, (blocks, large) = jax.lax.scan(packed_step, carry, xs, length, unroll=unroll)
    treedef, small_flags, layout = packed_layout[-1]
    small = iter(packing.unpack(layout, blocks) if blocks else [])
    large = iter(large)
    return carry, treedef.unflatten([next(small) if flag else next(large) for flag in small_flags])


def scan_when(pred, step: Callable, carry, xs, *, unroll: int = 1, branchless: bool | None = None):
    """`lax.scan(step, carry, xs)` where the traced bool `pred` holds; else `carry` unchanged and
    outputs of the scan's shapes filled with NaN (zeros for non-float dtypes). The training phase of
    a replay agent before `learning_starts`: its per-step statistics read NaN there, which the log
    point's `nanmean` skips.

    One branch runs (`lax.cond`), or, with `branchless`, the scan always runs and `pred` selects
    its results: on the GPU a `lax.cond` copies its predicate to the host and waits for it, once
    per call, which in a launch-bound loop costs more than the step it skips. `branchless=None`
    (the default) is branchless where JAX's default backend is not the CPU, a `lax.cond` on it."""
    if branchless is None:
        branchless = jax.default_backend() != "cpu"

    def run(carry, xs):
        return jax.lax.scan(step, carry, xs, unroll=unroll)

    def skip(carry, xs):
        shapes = jax.eval_shape(run, carry, xs)[1]
        return carry, jax.tree.map(lambda s: jnp.full(s.shape, _missing(s.dtype), s.dtype), shapes)

    if not branchless:
        return jax.lax.cond(pred, run, skip, carry, xs)
    ran, skipped = run(carry, xs), skip(carry, xs)
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), ran, skipped)


def scan_gated(pred, step: Callable, carry, xs, *, unroll: int = 1):
    """`scan_when(pred, ...)` for a step that applies the gate itself: `step(carry, x, pred)`
    returns its carry unchanged where the traced bool `pred` is false (a fused optimiser step that
    skips its update inside its launch, `kernels.adam_step`'s `active`). The scan always runs and
    nothing selects the carry after it; the outputs are NaN (zeros for non-float dtypes) where
    `pred` is false, as `scan_when` gives them."""
    carry, out = jax.lax.scan(lambda c, x: step(c, x, pred), carry, xs, unroll=unroll)
    return carry, jax.tree.map(lambda o: jnp.where(pred, o, _missing(o.dtype)), out)


def cond(pred, true_fn: Callable, false_fn: Callable, *operands, branchless: bool | None = None):
    """`lax.cond(pred, true_fn, false_fn, *operands)`, or, with `branchless`, both run and `pred`
    selects their results (`scan_when`'s rule: `None` is branchless where JAX's default backend is
    not the CPU, where a `lax.cond` would copy its predicate to the host and wait)."""
    if branchless is None:
        branchless = jax.default_backend() != "cpu"
    if not branchless:
        return jax.lax.cond(pred, true_fn, false_fn, *operands)
    taken, other = true_fn(*operands), false_fn(*operands)
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), taken, other)


def _missing(dtype):
    """The fill of an output that was not computed: NaN for floating dtypes, else 0."""
    return jnp.nan if jnp.issubdtype(dtype, jnp.floating) else 0
