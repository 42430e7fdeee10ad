"""Replay buffers in pure JAX, uniform and proportional prioritized (`PrioritizedBuffer`):
preallocated, functional, usable inside `jit`, `lax.scan` and `vmap`.

    buffer = uniform_add(uniform_init(example_transition, capacity), transitions)  # [items, ...]
    batch, indices = uniform_sample(buffer, key, batch_size)
    buffer = prioritized_add(prioritized_init(example_transition, capacity), transitions)
    batch, indices, weights = prioritized_sample(buffer, key, batch_size, beta)
    buffer = prioritized_update(buffer, indices, priorities, alpha)
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from kernels.sumtree import child_sums, last_of_runs, sumtree_find_leaves, sumtree_set_leaves
from rl.core.packing import StorageLayout, pack, storage_layout, unpack


class UniformBuffer(NamedTuple):
    """Items of any pytree (the agents store `obs, action, reward, next_obs, terminated`,
    next_obs = info["final_obs"]), written circularly: item k of an add goes to row
    `(position + k) % capacity`. The leaves are packed into a few 2-D blocks (`rl.core.packing`),
    so an add is one scatter and a sample one gather per block, whatever the number of leaves."""

    storage: tuple  # blocks [capacity, width] (`StorageLayout`)
    position: jax.Array  # int32: where the next item goes
    size: jax.Array  # int32: items stored (<= capacity)
    layout: StorageLayout

    @property
    def data(self):
        """The stored items as the transition pytree, every leaf [..., capacity, *leaf shape]."""
        return unpack(self.layout, self.storage)


class PrioritizedBuffer(NamedTuple):
    """A `UniformBuffer`'s storage with proportional PER (Schaul et al. 2016): item i is stored
    with the leaf value q_i = p_i^alpha of a sum-tree and sampled with P(i) = q_i / sum_j q_j; new
    items enter with the largest leaf value so far (1 initially), so each is likely replayed."""

    storage: tuple
    position: jax.Array
    size: jax.Array
    tree: tuple[
        jax.Array, ...
    ]  # float32 levels, root first (`sumtree_layout`); a node's children are one contiguous group
    max_leaf: jax.Array  # float32: largest leaf value (priority^alpha) seen; new items get it
    layout: StorageLayout

    @property
    def data(self):
        """The stored items as the transition pytree, every leaf [..., capacity, *leaf shape]."""
        return unpack(self.layout, self.storage)


def capacity_of(buffer) -> int:
    """The static capacity of a buffer (its storage's leading axis)."""
    return buffer.storage[0].shape[0]


def _check_capacity(capacity) -> int:
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
        raise ValueError(f"capacity must be a positive int, got {capacity!r}")
    return capacity


def _empty_storage(item, capacity: int):
    layout = storage_layout(item)
    return tuple(
        jnp.zeros((capacity, w), d) for d, w in zip(layout.block_dtypes, layout.block_widths)
    ), layout


def _check_items(layout: StorageLayout, items) -> int:
    """Number of items in a batch `items` (leading axis), checking it matches the stored item."""
    batch = jax.tree.structure(items)
    if batch != layout.treedef:
        raise ValueError(f"items have pytree structure {batch}, the buffer stores {layout.treedef}")
    counts = set()
    for (key_path, x), slot in zip(jax.tree_util.tree_leaves_with_path(items), layout.slots):
        name = jax.tree_util.keystr(key_path)
        if jnp.ndim(x) != len(slot.shape) + 1 or tuple(jnp.shape(x)[1:]) != slot.shape:
            raise ValueError(
                f"items{name} has shape {jnp.shape(x)}; expected (num_items,) + {slot.shape}"
            )
        counts.add(jnp.shape(x)[0])
    if len(counts) != 1:
        raise ValueError(
            f"items have different leading sizes {sorted(counts)}; every leaf needs the same "
            "number of items"
        )
    return counts.pop()


def _write_indices(buffer, items, valid):
    """Storage rows for a batch of items, the new position and size. Invalid batches (valid False)
    get out-of-range rows (dropped by the scatter) and leave position and size unchanged."""
    capacity = capacity_of(buffer)
    n = _check_items(buffer.layout, items)
    if n > capacity:
        raise ValueError(f"cannot add {n} items at once to a buffer of capacity {capacity}")
    valid = jnp.asarray(valid, jnp.bool_)
    rows = (buffer.position + jnp.arange(n, dtype=jnp.int32)) % capacity
    added = jnp.where(valid, n, 0).astype(jnp.int32)
    position = (buffer.position + added) % capacity
    size = jnp.minimum(buffer.size + added, capacity)
    return rows, jnp.where(valid, rows, capacity), position, size


def _store(buffer, items, write_rows):
    """The storage with a batch of items written at `write_rows` (out of range: dropped), one
    scatter per block."""
    return tuple(
        b.at[write_rows].set(x, mode="drop")
        for b, x in zip(buffer.storage, pack(buffer.layout, items))
    )


def _gather(buffer, indices):
    """The items at `indices`, one gather per block."""
    return unpack(buffer.layout, tuple(b[indices] for b in buffer.storage))


# ---------------------------------------------------------------- uniform replay


def uniform_init(item, capacity: int) -> UniformBuffer:
    """An empty buffer holding up to `capacity` items shaped like the pytree `item` (one
    transition)."""
    storage, layout = _empty_storage(item, _check_capacity(capacity))
    return UniformBuffer(storage=storage, position=jnp.int32(0), size=jnp.int32(0), layout=layout)


def uniform_add(buffer: UniformBuffer, items, valid=True) -> UniformBuffer:
    """Append a batch of items (every leaf has a leading `num_items` axis), overwriting the oldest.
    With `valid` False (a traced bool is fine) the buffer is returned unchanged."""
    _, write_rows, position, size = _write_indices(buffer, items, valid)
    return buffer._replace(storage=_store(buffer, items, write_rows), position=position, size=size)


def uniform_sample(buffer: UniformBuffer, key, batch_size: int):
    """`batch_size` items drawn uniformly with replacement from the stored ones: (items, indices).
    From an empty buffer it returns row 0 (zeros); agents only sample after `learning_starts`."""
    indices = jax.random.randint(key, (batch_size,), 0, jnp.maximum(buffer.size, 1))
    return _gather(buffer, indices), indices


# ---------------------------------------------------------------- the sum-tree

FANOUT = 16  # children per node below the top level (a descent step over [64, 16] costs ~2.5 us
# on XLA:CPU, [64, 32] ~6 us, [64, 47] ~25 us: prefix sums are O(F^2) per row)
MAX_TOP = 256  # most children of the root (one row shared by every target: its cost is small)


def sumtree_layout(capacity: int) -> tuple[int, ...]:
    """Level sizes (root first) of the sum-tree for `capacity` leaves: (1, T, T F, ..., T F^m).

    F = FANOUT and m >= 0 is the fewest levels of fan-out F for which T = ceil(capacity / F^m) is at
    most MAX_TOP; so the tree is 1 + m levels below the root (4 for capacity 100,000: T = 25,
    102,400 leaves) and the leaves exceed `capacity` by less than a factor T / (T - 1) (none when m
    = 0)."""
    capacity = _check_capacity(capacity)
    m = 0
    while -(-capacity // FANOUT**m) > MAX_TOP:
        m += 1
    top = -(-capacity // FANOUT**m)
    return (1,) + tuple(top * FANOUT**d for d in range(m + 1))


def sumtree_init(capacity: int) -> tuple[jax.Array, ...]:
    """An all-zero sum-tree with at least `capacity` leaves (`sumtree_layout`)."""
    return tuple(jnp.zeros((n,), jnp.float32) for n in sumtree_layout(capacity))


def sumtree_from_leaves(leaves, capacity: int | None = None) -> tuple[jax.Array, ...]:
    """The sum-tree of `capacity` (default len(leaves)) leaves whose first ones are `leaves` (the
    rest 0), built bottom-up: every node is the float32 sum of its children (`child_sums`)."""
    leaves = jnp.asarray(leaves, jnp.float32)
    if capacity is not None and capacity < leaves.shape[0]:
        raise ValueError(
            f"sumtree_from_leaves: capacity {capacity} is less than the {leaves.shape[0]} leaves "
            "given"
        )
    sizes = sumtree_layout(capacity or leaves.shape[0])
    levels = [jnp.zeros((sizes[-1],), jnp.float32).at[: leaves.shape[0]].set(leaves)]
    for parent, child in zip(sizes[-2::-1], sizes[:0:-1]):
        levels.append(child_sums(levels[-1], child // parent))
    return tuple(levels[::-1])


def sumtree_total(tree) -> jax.Array:
    return tree[0][0]


def sumtree_leaves(tree) -> jax.Array:
    return tree[-1]


def sumtree_get(tree, indices) -> jax.Array:
    """Leaf values at `indices` (a gather)."""
    return tree[-1][jnp.asarray(indices, jnp.int32)]


def last_occurrence(indices) -> jax.Array:
    """Bool mask: True where no later entry of `indices` has the same value."""
    order, keep = last_of_runs(jnp.asarray(indices, jnp.int32))
    return jnp.zeros(keep.shape, jnp.bool_).at[order].set(keep)


def sumtree_set(tree, indices, values, *, backend: str | None = None) -> tuple[jax.Array, ...]:
    """Set leaves `indices` to `values` and recompute their ancestors from their children
    (`kernels.sumtree_set_leaves`: one kernel launch on the GPU, gather/sum/scatter per level in
    plain JAX on the CPU).

    Duplicate indices: the last occurrence wins. Internal nodes are recomputed, never incremented
    (no float32 drift).
    """
    return sumtree_set_leaves(
        tree, jnp.asarray(indices, jnp.int32), jnp.asarray(values, jnp.float32), backend=backend
    )[0]


def sumtree_find_with_mass(tree, targets, *, backend: str | None = None):
    """(leaves, their values): for each target mass u in [0, total), the leaf i with
    cumsum_{<i} <= u < cumsum_{<=i} (`sumtree_find`) and its value (what P(i) needs, without a
    second read of the leaves). `backend`: the kernels backend of the descent
    (`kernels.sumtree_find_leaves`: one kernel launch on the GPU, a gather, running sums and a
    select per level in plain JAX on the CPU)."""
    return sumtree_find_leaves(tree, targets, backend=backend)


def sumtree_find(tree, targets, *, backend: str | None = None) -> jax.Array:
    """For each target mass u in [0, total), the leaf i with cumsum_{<i} <= u < cumsum_{<=i}.

    Descends from the root one level at a time: among the node's children (one contiguous group),
    take the first whose running sum exceeds u and subtract the mass before it. A child of zero mass
    is never entered (a rounding overshoot goes to the last non-empty sibling), so with a positive
    total the leaf found for u in [0, total] always has positive mass (`kernels.sumtree_find_leaves`
    says what a target outside that range gives).
    """
    return sumtree_find_with_mass(tree, targets, backend=backend)[0]


# ---------------------------------------------------------------- prioritized replay


def prioritized_init(item, capacity: int) -> PrioritizedBuffer:
    """An empty prioritized buffer (all leaves 0, max leaf 1) for up to `capacity` items like
    `item`."""
    storage, layout = _empty_storage(item, _check_capacity(capacity))
    return PrioritizedBuffer(
        storage=storage,
        position=jnp.int32(0),
        size=jnp.int32(0),
        tree=sumtree_init(capacity),
        max_leaf=jnp.float32(1.0),
        layout=layout,
    )


def prioritized_add(
    buffer: PrioritizedBuffer, items, valid=True, *, backend: str | None = None
) -> PrioritizedBuffer:
    """Append a batch of items at the largest leaf value seen so far (unchanged when `valid` is
    False). `backend`: the kernels backend of the leaf write (`kernels.sumtree_set_leaves`)."""
    rows, write_rows, position, size = _write_indices(buffer, items, valid)
    # invalid: a row past the padded leaves (`write_rows` = capacity would be a padding leaf): not
    # written
    leaf_rows = jnp.where(jnp.asarray(valid, jnp.bool_), rows, buffer.tree[-1].shape[-1])
    tree, _ = sumtree_set_leaves(
        buffer.tree,
        leaf_rows,
        jnp.broadcast_to(buffer.max_leaf, leaf_rows.shape),
        distinct=True,
        backend=backend,
    )  # the rows of one add are distinct
    return buffer._replace(
        storage=_store(buffer, items, write_rows), position=position, size=size, tree=tree
    )


def sampling_probabilities(buffer: PrioritizedBuffer, indices) -> jax.Array:
    """P(i) = leaf_i / total for the given indices."""
    return sumtree_get(buffer.tree, indices) / sumtree_total(buffer.tree)


def importance_weights(probabilities, size, beta) -> jax.Array:
    """w_i = (N P(i))^-beta / max_batch w (in (0, 1]); computed in log space."""
    log_w = -beta * (
        jnp.log(jnp.maximum(size, 1).astype(jnp.float32))
        + jnp.log(jnp.maximum(probabilities, 1e-30))
    )
    return jnp.exp(log_w - log_w.max())


def prioritized_sample(
    buffer: PrioritizedBuffer, key, batch_size: int, beta, *, backend: str | None = None
):
    """A stratified batch: (items, indices, importance weights). Target k is uniform in the k-th of
    `batch_size` equal segments of the total mass. Empty buffer: row 0 and weights 1. The weights
    (`importance_weights`) only scale an update down; agents anneal beta to 1
    (`rl.core.exploration.linear_schedule`).
    `backend`: the kernels backend of the descent (`kernels.sumtree_find_leaves`)."""
    total = sumtree_total(buffer.tree)
    u = (
        jnp.arange(batch_size, dtype=jnp.float32) + jax.random.uniform(key, (batch_size,))
    ) / batch_size
    targets = jnp.minimum(u * total, total)
    found, leaf = sumtree_find_with_mass(buffer.tree, targets, backend=backend)
    indices = jnp.clip(found, 0, jnp.maximum(buffer.size - 1, 0))
    weights = importance_weights(leaf / jnp.where(total > 0, total, 1.0), buffer.size, beta)
    return _gather(buffer, indices), indices, weights


def prioritized_update(
    buffer: PrioritizedBuffer, indices, priorities, alpha, *, backend: str | None = None
) -> PrioritizedBuffer:
    """Set the priorities p >= 0 of sampled items (leaf = p^alpha; the last of duplicate indices
    wins) and raise `max_leaf` to the largest new leaf. Callers add a small epsilon to |TD| so no
    stored item becomes unsampleable. `backend`: the kernels backend of the leaf write."""
    leaves = jnp.power(jnp.maximum(jnp.asarray(priorities, jnp.float32), 0.0), alpha)
    tree, written = sumtree_set_leaves(
        buffer.tree, jnp.asarray(indices, jnp.int32), leaves, backend=backend
    )
    return buffer._replace(
        tree=tree, max_leaf=jnp.maximum(buffer.max_leaf, jnp.max(jnp.where(written, leaves, 0.0)))
    )
