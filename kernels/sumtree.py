"""Sum-tree leaf writes with their ancestors recomputed, and the descent that samples a leaf.

A sum-tree is a tuple of float32 levels L_0 (the root, one node), L_1, ..., L_D (the leaves), each
size a multiple of the one above; node j of level d-1 is the sum of its F_d = |L_d| / |L_{d-1}|
children L_d[j F_d : (j + 1) F_d]. For leaf indices i_b and values v_b (b = 1..B),
`sumtree_set_leaves` returns the tree with

    L_D[i_b] = v_b             for each b whose index is in [0, |L_D|) and appears at no later b'
    L_{d-1}[a] = sum_k L_d[a F_d + k]   for every ancestor a of a written leaf, d = D, ..., 1

(the last occurrence of a duplicate index wins; an index outside [0, |L_D|) writes nothing), and
the mask of the b that were written. Internal nodes are recomputed from their children, never
incremented, so no float32 drift accumulates.

Why a kernel: in XLA each level is a gather of the children's groups, a sum and a scatter, and the
duplicates need a sort, each a separate kernel launch; at one seed on the GPU those launches cost
more than the replay's useful work (measured, benchmarks/RESULTS.md). Here one program per
tree writes the leaves and then walks up the levels, a barrier between levels, the levels updated in
place (input-output aliases). Duplicates are found by comparing each index with the later ones
(O(B^2) compares on chip, no sort; skipped with `distinct=True`).

`sumtree_find_leaves(tree, targets)` descends from the root for each target mass u in [0, total):
at each level, among the node's children m_0..m_{F-1} with running sums c_k = m_0 + ... + m_k
(c_{-1} = 0), it takes the child k with c_{k-1} <= u < c_k (clamped to the last child of positive
mass, so a rounding overshoot never enters an empty child) and goes on with u - c_{k-1}; it returns
the leaf reached and its mass m (what P(i) = m / total needs without a second read of the leaves).
The kernel gives each program a block of targets of one tree and walks all levels in registers: one
launch, where XLA runs a gather, a prefix sum and a compare-and-select per level.

Backends: "reference" is plain JAX (a gather/sum/scatter per level with a stable sort for the
duplicates; the descent's running sums as a matmul with a triangle of ones); "triton" and
"interpret" run the kernels. Sums may round differently between the two (children are added in
another order); with values that add exactly (e.g. small integers) they agree bit for bit, and so do
the leaves found.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from kernels._triton import tl, triton
from kernels.launch import fold_vmap, launch, next_power_of_2, resolve_backend

__all__ = [
    "sumtree_set_leaves",
    "sumtree_set_leaves_reference",
    "sumtree_find_leaves",
    "sumtree_find_leaves_reference",
    "child_sums",
    "last_of_runs",
    "recompute_ancestors",
    "MAX_LEVELS",
]

MAX_LEVELS = (
    7  # root and at most 6 levels below it (capacity up to 256 * 16**5 leaves at fan-out 16)
)
MAX_TOP = 1024  # most children of the root the kernel sums in one row
BLOCK_B = 128  # batch entries per inner step
DUP_BLOCK = 16  # later entries compared per step when looking for duplicates
NUM_WARPS = 4
FIND_BLOCK = 64  # targets per program of the descent
MAX_GRID_Y = 65535  # CUDA's bound on a grid's second axis (the descent's target blocks)


# ---------------------------------------------------------------- reference


def child_sums(level, fanout: int, nodes=None) -> jax.Array:
    """Sums of consecutive groups of `fanout` entries of `level`
    (those of group `nodes` if given)."""
    groups = level.reshape(-1, fanout)
    return (groups if nodes is None else groups[nodes]).sum(axis=-1)


def last_of_runs(indices):
    """(order, keep): the permutation that sorts `indices` stably, and, in that order, True at the
    last entry of each run of equal values (the last occurrence in the batch). A sort:
    O(B log B)."""
    n = indices.shape[0]
    sorted_indices, order = jax.lax.sort((indices, jnp.arange(n, dtype=jnp.int32)), num_keys=2)
    keep = jnp.concatenate([sorted_indices[1:] != sorted_indices[:-1], jnp.ones((1,), jnp.bool_)])
    return order, keep


def recompute_ancestors(tree, leaf_indices) -> tuple[jax.Array, ...]:
    """Each ancestor of the given leaves set to the sum of its children, level by level upwards (one
    gather of the children's groups and one scatter per level; a shared ancestor is written several
    times with the same value; an index outside the leaves refreshes nothing)."""
    levels = list(tree)
    nodes = jnp.where(
        (leaf_indices >= 0) & (leaf_indices < levels[-1].shape[-1]),
        leaf_indices,
        levels[-1].shape[-1],
    )
    for d in range(len(levels) - 1, 0, -1):
        fanout = levels[d].shape[-1] // levels[d - 1].shape[-1]
        nodes = nodes // fanout
        levels[d - 1] = (
            levels[d - 1]
            .at[nodes]
            .set(
                child_sums(levels[d], fanout, jnp.minimum(nodes, levels[d - 1].shape[-1] - 1)),
                mode="drop",
            )
        )
    return tuple(levels)


def sumtree_set_leaves_reference(tree, indices, values, distinct: bool = False):
    """Plain JAX: (tree, written) as `sumtree_set_leaves` (module docstring)."""
    tree = tuple(tree)
    n = tree[-1].shape[-1]
    indices = jnp.asarray(indices, jnp.int32)
    values = jnp.asarray(values, jnp.float32)
    in_range = (indices >= 0) & (indices < n)
    if distinct:
        rows, vals, keep = indices, values, in_range
    else:
        order, keep = last_of_runs(indices)
        rows, vals, keep = indices[order], values[order], keep & in_range[order]
    leaves = tree[-1].at[jnp.where(keep, rows, n)].set(vals, mode="drop")
    written = keep if distinct else jnp.zeros(keep.shape, jnp.bool_).at[order].set(keep)
    return recompute_ancestors(tree[:-1] + (leaves,), rows), written


def prefix_sums(rows) -> jax.Array:
    """Inclusive running sums along the last axis: c_k = sum_{j <= k} rows_j (a float32 matmul with
    an upper-triangular matrix of ones, at full precision whatever the default matmul precision)."""
    k = rows.shape[-1]
    return jnp.matmul(
        rows, jnp.triu(jnp.ones((k, k), jnp.float32)), precision=jax.lax.Precision.HIGHEST
    )


def pick_child(masses, prefix, u):
    """In each row of children `masses` [..., F] (running sums `prefix`), the child k with
    c_{k-1} <= u < c_k, clamped to the last child of positive mass (a rounding overshoot
    u >= c_{F-1} lands there; a zero child is never chosen while its row has mass; a row without
    mass gives its last child). Returns (k, u - c_{k-1}, m_k)."""
    count = jnp.sum(prefix <= u[..., None], axis=-1)
    last_positive = masses.shape[-1] - 1 - jnp.argmax((masses > 0)[..., ::-1], axis=-1)
    k = jnp.minimum(count, last_positive).astype(jnp.int32)
    mass = jnp.take_along_axis(masses, k[..., None], axis=-1)[..., 0]
    before = jnp.take_along_axis(prefix, jnp.maximum(k - 1, 0)[..., None], axis=-1)[..., 0]
    return k, u - jnp.where(k > 0, before, 0.0), mass


def sumtree_find_leaves_reference(tree, targets):
    """Plain JAX: (leaves, masses) as `sumtree_find_leaves` (module docstring),
    one level at a time."""
    u = jnp.asarray(targets, jnp.float32)
    top = tree[1]  # the root's children: one row shared by every target
    nodes, u, mass = pick_child(
        jnp.broadcast_to(top, u.shape + top.shape),
        jnp.broadcast_to(prefix_sums(top), u.shape + top.shape),
        u,
    )
    for parent, level in zip(tree[1:-1], tree[2:]):
        fanout = level.shape[-1] // parent.shape[-1]
        masses = level.reshape(-1, fanout)[nodes]
        k, u, mass = pick_child(masses, prefix_sums(masses), u)
        nodes = nodes * fanout + k
    return nodes, mass


# ---------------------------------------------------------------- kernel


@triton.jit
def _write_leaves(
    leaf_ptr,
    idx_ptr,
    val_ptr,
    written_ptr,
    tree,
    B,
    N_LEAVES: tl.constexpr,
    DISTINCT: tl.constexpr,
    BLOCK: tl.constexpr,
    DUP: tl.constexpr,
):
    """Leaves idx[b] = val[b] for in-range indices with no later duplicate;
    written[b] says which."""
    for start in range(0, B, BLOCK):
        b = start + tl.arange(0, BLOCK)
        in_batch = b < B
        idx = tl.load(idx_ptr + tree * B + b, mask=in_batch, other=-1)
        val = tl.load(val_ptr + tree * B + b, mask=in_batch, other=0.0)
        ok = in_batch & (idx >= 0) & (idx < N_LEAVES)
        if not DISTINCT:
            later = tl.zeros([BLOCK], dtype=tl.int32)
            for j0 in range(start, B, DUP):
                j = j0 + tl.arange(0, DUP)
                other = tl.load(idx_ptr + tree * B + j, mask=j < B, other=-1)
                hit = (
                    (idx[:, None] == other[None, :]) & (j[None, :] > b[:, None]) & (j[None, :] < B)
                )
                later = tl.maximum(later, tl.max(hit.to(tl.int32), axis=1))
            ok = ok & (later == 0)
        tl.store(leaf_ptr + tree * N_LEAVES + idx, val, mask=ok)
        tl.store(written_ptr + tree * B + b, ok.to(tl.int32), mask=in_batch)
    tl.debug_barrier()


@triton.jit
def _refresh_level(
    child_ptr,
    parent_ptr,
    idx_ptr,
    tree,
    B,
    N_LEAVES: tl.constexpr,
    N_CHILD: tl.constexpr,
    N_PARENT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Every parent-level ancestor of the batch's in-range leaves set to the sum of its children."""
    F: tl.constexpr = N_CHILD // N_PARENT
    LEAVES_PER_PARENT: tl.constexpr = N_LEAVES // N_PARENT
    k = tl.arange(0, F)
    for start in range(0, B, BLOCK):
        b = start + tl.arange(0, BLOCK)
        idx = tl.load(idx_ptr + tree * B + b, mask=b < B, other=-1)
        ok = (b < B) & (idx >= 0) & (idx < N_LEAVES)
        parent = tl.where(ok, idx, 0) // LEAVES_PER_PARENT
        children = tl.load(
            child_ptr + tree * N_CHILD + parent[:, None] * F + k[None, :],
            mask=ok[:, None],
            other=0.0,
        )
        tl.store(parent_ptr + tree * N_PARENT + parent, tl.sum(children, axis=1), mask=ok)
    tl.debug_barrier()


@triton.jit
def _sumtree_set_kernel(
    idx_ptr,
    val_ptr,
    B,
    in0,
    in1,
    in2,
    in3,
    in4,
    in5,
    in6,  # the levels as given (aliased to o0..o6; unused)
    o0,
    o1,
    o2,
    o3,
    o4,
    o5,
    o6,
    written_ptr,
    DEPTH: tl.constexpr,
    N1: tl.constexpr,
    N2: tl.constexpr,
    N3: tl.constexpr,
    N4: tl.constexpr,
    N5: tl.constexpr,
    N6: tl.constexpr,
    N_LEAVES: tl.constexpr,
    TOP: tl.constexpr,
    DISTINCT: tl.constexpr,
    BLOCK: tl.constexpr,
    DUP: tl.constexpr,
):
    """One program per tree: the leaf writes,
    then each level from the leaves' parents up to the root."""
    tree = tl.program_id(0).to(tl.int64)
    if DEPTH == 1:
        _write_leaves(o1, idx_ptr, val_ptr, written_ptr, tree, B, N_LEAVES, DISTINCT, BLOCK, DUP)
    if DEPTH == 2:
        _write_leaves(o2, idx_ptr, val_ptr, written_ptr, tree, B, N_LEAVES, DISTINCT, BLOCK, DUP)
    if DEPTH == 3:
        _write_leaves(o3, idx_ptr, val_ptr, written_ptr, tree, B, N_LEAVES, DISTINCT, BLOCK, DUP)
    if DEPTH == 4:
        _write_leaves(o4, idx_ptr, val_ptr, written_ptr, tree, B, N_LEAVES, DISTINCT, BLOCK, DUP)
    if DEPTH == 5:
        _write_leaves(o5, idx_ptr, val_ptr, written_ptr, tree, B, N_LEAVES, DISTINCT, BLOCK, DUP)
    if DEPTH == 6:
        _write_leaves(o6, idx_ptr, val_ptr, written_ptr, tree, B, N_LEAVES, DISTINCT, BLOCK, DUP)
    if DEPTH >= 6:
        _refresh_level(o6, o5, idx_ptr, tree, B, N_LEAVES, N6, N5, BLOCK)
    if DEPTH >= 5:
        _refresh_level(o5, o4, idx_ptr, tree, B, N_LEAVES, N5, N4, BLOCK)
    if DEPTH >= 4:
        _refresh_level(o4, o3, idx_ptr, tree, B, N_LEAVES, N4, N3, BLOCK)
    if DEPTH >= 3:
        _refresh_level(o3, o2, idx_ptr, tree, B, N_LEAVES, N3, N2, BLOCK)
    if DEPTH >= 2:
        _refresh_level(o2, o1, idx_ptr, tree, B, N_LEAVES, N2, N1, BLOCK)
    k = tl.arange(0, TOP)
    top = tl.load(o1 + tree * N1 + k, mask=k < N1, other=0.0)
    tl.store(o0 + tree, tl.sum(top, axis=0))


def _set_core(indices, values, *levels, lead, backend, distinct):
    lead_shape = tuple(indices.shape[:lead])
    trees = math.prod(lead_shape)
    b = indices.shape[lead]
    sizes = [level.shape[-1] for level in levels]
    depth = len(levels) - 1
    flat = [level.reshape(trees, n) for level, n in zip(levels, sizes)]
    unused = jnp.zeros((1,), jnp.float32)
    inputs = flat + [unused] * (MAX_LEVELS - len(flat))
    out_shape = [jax.ShapeDtypeStruct((trees, n), jnp.float32) for n in sizes]
    out_shape += [jax.ShapeDtypeStruct((1,), jnp.float32)] * (MAX_LEVELS - len(sizes))
    out_shape += [jax.ShapeDtypeStruct((trees, b), jnp.int32)]
    padded_sizes = sizes[1:] + [1] * (MAX_LEVELS - len(sizes))
    out = launch(
        _sumtree_set_kernel,
        indices.reshape(trees, b).astype(jnp.int32),
        values.reshape(trees, b).astype(jnp.float32),
        b,
        *inputs,
        out_shape=out_shape,
        grid=(trees,),
        backend=backend,
        num_warps=NUM_WARPS,
        input_output_aliases={2 + d: d for d in range(len(sizes))},
        DEPTH=depth,
        N1=padded_sizes[0],
        N2=padded_sizes[1],
        N3=padded_sizes[2],
        N4=padded_sizes[3],
        N5=padded_sizes[4],
        N6=padded_sizes[5],
        N_LEAVES=sizes[-1],
        TOP=max(16, next_power_of_2(sizes[1])),
        DISTINCT=bool(distinct),
        BLOCK=min(BLOCK_B, max(16, next_power_of_2(b))),
        DUP=DUP_BLOCK,
    )
    new_levels = [o.reshape(lead_shape + (n,)) for o, n in zip(out[: len(sizes)], sizes)]
    written = out[-1].reshape(lead_shape + (b,)) != 0
    return (*new_levels, written)


@functools.lru_cache(maxsize=None)
def _kernel_op(backend: str, distinct: bool):
    return fold_vmap(functools.partial(_set_core, backend=backend, distinct=distinct))


@triton.jit
def _pick_child(masses, prefix, u, k, n_valid):
    """In each row [BLOCK, F] of children (running sums `prefix`, +inf past the `n_valid` real
    ones): the child c_{k-1} <= u < c_k clamped to the last child of positive mass (`pick_child`),
    and (child, u - c_{k-1}, its mass)."""
    count = tl.sum((prefix <= u[:, None]).to(tl.int32), axis=1)
    last_positive = tl.max(tl.where(masses > 0, k[None, :], -1), axis=1)
    last_positive = tl.where(last_positive < 0, n_valid - 1, last_positive)
    child = tl.minimum(count, last_positive)
    mass = tl.sum(tl.where(k[None, :] == child[:, None], masses, 0.0), axis=1)
    before = tl.sum(tl.where(k[None, :] == child[:, None] - 1, prefix, 0.0), axis=1)
    return child, u - before, mass


@triton.jit
def _descend(level_ptr, tree, node, u, N_LEVEL: tl.constexpr, N_PARENT: tl.constexpr):
    """One level down: the children of `node` (one contiguous group of F)
    and the child `u` falls in."""
    F: tl.constexpr = N_LEVEL // N_PARENT
    if F == 1:  # the only child: u unchanged (no scan over a one-wide axis)
        return node, u, tl.load(level_ptr + tree * N_LEVEL + node)
    k = tl.arange(0, F)
    masses = tl.load(level_ptr + tree * N_LEVEL + node[:, None] * F + k[None, :])
    child, u, mass = _pick_child(masses, tl.cumsum(masses, axis=1), u, k, F)
    return node * F + child, u, mass


@triton.jit
def _sumtree_find_kernel(
    target_ptr,
    B,
    l1,
    l2,
    l3,
    l4,
    l5,
    l6,
    leaf_ptr,
    mass_ptr,
    DEPTH: tl.constexpr,
    N1: tl.constexpr,
    N2: tl.constexpr,
    N3: tl.constexpr,
    N4: tl.constexpr,
    N5: tl.constexpr,
    N6: tl.constexpr,
    TOP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Program (tree, block): its targets' descent from the root's children to the leaves."""
    tree = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_batch = b < B
    u = tl.load(target_ptr + tree * B + b, mask=in_batch, other=0.0)
    k = tl.arange(0, TOP)
    top = tl.load(l1 + tree * N1 + k, mask=k < N1, other=0.0)
    prefix = tl.where(k < N1, tl.cumsum(top, axis=0), float("inf"))
    node, u, mass = _pick_child(top[None, :], prefix[None, :], u, k, N1)
    if DEPTH >= 2:
        node, u, mass = _descend(l2, tree, node, u, N2, N1)
    if DEPTH >= 3:
        node, u, mass = _descend(l3, tree, node, u, N3, N2)
    if DEPTH >= 4:
        node, u, mass = _descend(l4, tree, node, u, N4, N3)
    if DEPTH >= 5:
        node, u, mass = _descend(l5, tree, node, u, N5, N4)
    if DEPTH >= 6:
        node, u, mass = _descend(l6, tree, node, u, N6, N5)
    tl.store(leaf_ptr + tree * B + b, node, mask=in_batch)
    tl.store(mass_ptr + tree * B + b, mass, mask=in_batch)


def _find_core(targets, *levels, lead, backend):
    lead_shape = tuple(targets.shape[:lead])
    trees = math.prod(lead_shape)
    op_shape = tuple(targets.shape[lead:])
    b = math.prod(op_shape)
    sizes = [level.shape[-1] for level in levels]
    if b == 0:
        return jnp.zeros(targets.shape, jnp.int32), jnp.zeros(targets.shape, jnp.float32)
    block = min(FIND_BLOCK, max(16, next_power_of_2(b)))
    if -(-b // block) > MAX_GRID_Y:
        raise ValueError(
            f"sumtree_find_leaves: {b} targets per tree, "
            f"more than the kernel's {MAX_GRID_Y * FIND_BLOCK}"
        )
    flat = [level.reshape(trees, n) for level, n in zip(levels[1:], sizes[1:])]
    unused = jnp.zeros((1,), jnp.float32)
    padded_sizes = sizes[1:] + [1] * (MAX_LEVELS - len(sizes))
    leaves, masses = launch(
        _sumtree_find_kernel,
        targets.reshape(trees, b).astype(jnp.float32),
        b,
        *flat,
        *[unused] * (MAX_LEVELS - 1 - len(flat)),
        out_shape=[
            jax.ShapeDtypeStruct((trees, b), jnp.int32),
            jax.ShapeDtypeStruct((trees, b), jnp.float32),
        ],
        grid=(trees, -(-b // block)),
        backend=backend,
        num_warps=NUM_WARPS,  # trees on axis 0: no 65,535 bound
        DEPTH=len(sizes) - 1,
        N1=padded_sizes[0],
        N2=padded_sizes[1],
        N3=padded_sizes[2],
        N4=padded_sizes[3],
        N5=padded_sizes[4],
        N6=padded_sizes[5],
        TOP=max(16, next_power_of_2(sizes[1])),
        BLOCK=block,
    )
    return leaves.reshape(targets.shape), masses.reshape(targets.shape)


@functools.lru_cache(maxsize=None)
def _find_op(backend: str):
    return fold_vmap(functools.partial(_find_core, backend=backend))


# ---------------------------------------------------------------- public op


def _check_tree(tree) -> None:
    if not isinstance(tree, (tuple, list)) or len(tree) < 2:
        raise ValueError(
            "tree must be a tuple of at least 2 levels (root first), "
            f"got {type(tree).__name__} of length "
            f"{len(tree) if isinstance(tree, (tuple, list)) else '-'}"
        )
    shapes = [tuple(jnp.shape(level)) for level in tree]
    if any(len(s) != 1 for s in shapes) or shapes[0] != (1,):
        raise ValueError(f"tree levels must be 1-D with a root of shape (1,), got shapes {shapes}")
    if any(s[0] == 0 for s in shapes):
        raise ValueError(f"tree levels must not be empty, got sizes {[s[0] for s in shapes]}")
    for parent, child in zip(shapes[:-1], shapes[1:]):
        if child[0] % parent[0]:
            raise ValueError(
                "each level's size must be a multiple of the one above, "
                f"got sizes {[s[0] for s in shapes]}"
            )
    if len(tree) > MAX_LEVELS:
        raise ValueError(f"tree has {len(tree)} levels, more than the kernel's {MAX_LEVELS}")
    fanouts = [child[0] // parent[0] for parent, child in zip(shapes[1:-1], shapes[2:])]
    if any(f & (f - 1) for f in fanouts):
        raise ValueError(
            "below the root's children every fan-out must be a power of 2, "
            f"got {fanouts} (sizes {[s[0] for s in shapes]})"
        )
    if shapes[1][0] > MAX_TOP:
        raise ValueError(f"the root has {shapes[1][0]} children, more than the kernel's {MAX_TOP}")


def _check(tree, indices, values) -> None:
    _check_tree(tree)
    if (
        jnp.ndim(indices) != 1
        or jnp.shape(values) != jnp.shape(indices)
        or jnp.shape(indices)[0] == 0
    ):
        raise ValueError(
            "indices and values must be 1-D of the same non-zero length, "
            f"got shapes {jnp.shape(indices)} and {jnp.shape(values)}"
        )
    if not jnp.issubdtype(jnp.result_type(indices), jnp.integer):
        raise ValueError(f"indices must be integers, got {jnp.result_type(indices)}")


def sumtree_set_leaves(
    tree, indices, values, *, distinct: bool = False, backend: str | None = None
):
    """(tree, written): leaves `indices` [B] set to `values` [B] and their ancestors recomputed
    (module docstring); `written` [B] bool marks the entries written
    (in range, last of their index).

    tree: tuple of 1-D float32 levels, root (shape (1,)) first, each size a multiple of the one
    above (at most MAX_LEVELS levels and MAX_TOP children of the root for the kernel backends).
    distinct=True promises that the in-range indices are distinct (no duplicate search).
    Works under jit and any nesting of vmap (one launch for all trees).
    """
    _check(tree, indices, values)
    name = resolve_backend(backend)
    if name == "reference":
        return sumtree_set_leaves_reference(tree, indices, values, distinct)
    out = _kernel_op(name, bool(distinct))(
        jnp.asarray(indices, jnp.int32),
        jnp.asarray(values, jnp.float32),
        *(jnp.asarray(level, jnp.float32) for level in tree),
    )
    return tuple(out[:-1]), out[-1]


def sumtree_find_leaves(tree, targets, *, backend: str | None = None):
    """(leaves, masses): for each target mass u (`targets`, any shape, real numbers) the leaf i with
    cumsum_{<i} <= u < cumsum_{<=i} and its value, by descent from the root (module docstring);
    int32 and float32 arrays of the targets' shape.

    A child of zero mass is never entered by a target in [0, total), so with a positive total every
    leaf found has positive mass. A target at or past the total goes to the last leaf of positive
    mass (the last leaf when the total is 0); a negative or NaN target goes to the first leaf,
    whatever its mass (callers draw targets in [0, total]).

    tree: as `sumtree_set_leaves`. Works under jit and any nesting of vmap
    (one launch for all trees).
    """
    _check_tree(tree)
    targets = jnp.asarray(targets)
    if not (
        jnp.issubdtype(targets.dtype, jnp.floating) or jnp.issubdtype(targets.dtype, jnp.integer)
    ):
        raise ValueError(
            f"targets must be real numbers (masses in [0, total)), got dtype {targets.dtype}"
        )
    targets = targets.astype(jnp.float32)
    levels = tuple(jnp.asarray(level, jnp.float32) for level in tree)
    name = resolve_backend(backend)
    if name == "reference":
        return sumtree_find_leaves_reference(levels, targets)
    return _find_op(name)(targets, *levels)
